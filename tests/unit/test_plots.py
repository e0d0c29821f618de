"""Training curves (History.plot, PlotHistory) and the benchmark figures; matplotlib stays optional."""
import glob
import os
import subprocess
import sys

import pytest

from dnn import callbacks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PNG = b"\x89PNG\r\n\x1a\n"


def _history(epochs=3):
    h = callbacks.History()
    for e in range(epochs):
        h.on_epoch_end(e, {"loss": 1.0 / (e + 1), "accuracy": 0.5 + 0.1 * e, "val_loss": 1.2 / (e + 1),
                           "val_accuracy": 0.45 + 0.1 * e, "samples_per_s": 100.0})
    return h


def test_history_iterates_and_maps_its_metric_names():
    """History reads as a mapping of metric names (Keras users write `for k in h.history`; `list(h)`
    had fallen back to h[0], a KeyError)."""
    h = _history(2)
    names = ["loss", "accuracy", "val_loss", "val_accuracy", "samples_per_s"]
    assert list(h) == names and sorted(h) == sorted(names) and len(h) == 5
    assert list(h.keys()) == names and dict(h.items()) == h.history
    assert h["loss"] == [1.0, 0.5] and "val_loss" in h and "nope" not in h
    with pytest.raises(KeyError):
        h["nope"]


def test_history_plot_draws_each_curve(tmp_path):
    fig = _history().plot(tmp_path / "curves.png")
    (loss, acc) = fig.axes
    assert [line.get_label() for line in loss.lines] == ["loss", "val_loss"]
    assert [line.get_label() for line in acc.lines] == ["accuracy", "val_accuracy"]
    assert list(loss.lines[0].get_xdata()) == [1, 2, 3] and list(acc.lines[1].get_ydata()) == [0.45, 0.55, 0.65]
    assert (tmp_path / "curves.png").read_bytes().startswith(PNG)


def test_plot_history_callback_rewrites_the_png_every_epoch(tmp_path):
    path = tmp_path / "live.png"
    cb = callbacks.PlotHistory(str(path))
    cb.on_epoch_end(0, {"loss": 2.0})
    first = path.stat().st_size
    cb.on_epoch_end(1, {"loss": 1.0})
    assert path.read_bytes().startswith(PNG) and cb.history["loss"] == [2.0, 1.0] and first > 0


def test_without_matplotlib_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)     # import fails as if not installed
    with pytest.raises(ImportError, match=r"dmath-dnn\[plot\]"):
        _history().plot()


@pytest.mark.parametrize("kind,pattern", [("gemm", "gemm_h200_p*_2026-11-21.json"), ("cnn", "cnn_h200_p*.json"),
                                          ("mlp", "mnist_mlp_h200_graphs_*.json"), ("remap", "remap_h200_p4_*.json")])
def test_benchmark_figures_from_the_committed_results(tmp_path, kind, pattern):
    files = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "results", pattern)))
    out = tmp_path / f"{kind}.png"
    subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "plots.py"), kind, *files, "--out", str(out)],
                   check=True, capture_output=True, timeout=120)
    assert out.read_bytes().startswith(PNG)


def test_scaling_pairs_one_gpu_with_each_batchnorm_setting():
    """A one-GPU row counts for the 'local' BatchNorm case of the 4-GPU rows (one GPU's statistics are
    the batch's); a 'local' case with no row past one GPU is dropped; settings comparisons are left out."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import plots
    files = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "results", "zoo_h100_p*_b1024_f16*_2026-11-27_s28.json")))
    cases = plots._scaling_rows(files)
    g = cases[("googlenet", 1024, "float16", "local")]
    assert sorted(g) == [1, 4] and set(g[1]) == {"dnn", "torch", "compile"} and set(g[4]) == {"dnn", "torch"}
    assert g[4]["dnn"] > 3 * g[1]["dnn"] * 0.5
    assert not any(k[3] == "sync" and k[0] == "googlenet" for k in cases)


def test_scaling_skips_rows_it_cannot_place_and_rates_that_are_not_rates(tmp_path):
    """A row without a network, batch, dtype or a positive worker count is skipped with a note; a NaN,
    negative or text rate is no point (it made an 'eff. nan' legend); a row with no rate left, none."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import json
    import plots
    good = {"net": "n", "global_batch": 8, "dtype": "float32", "workers": 1, "dnn_images_per_s": 40.0}
    rows = [good, dict(good, workers=4, dnn_images_per_s=float("nan")), dict(good, workers=2, dnn_images_per_s=-3),
            dict(good, workers=3, dnn_images_per_s="9"), dict(good, net=None), dict(good, workers="2"),
            dict(good, workers=0), dict(good, global_batch="8"), dict(good, peers=[1], workers=5, dnn_images_per_s=7.0),
            5, None]
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"results": rows}))
    (tmp_path / "odd.json").write_text(json.dumps({"results": None}))
    cases = plots._scaling_rows([str(path), str(tmp_path / "odd.json")])
    assert {k: dict(v) for k, v in cases.items()} == {("n", 8, "float32", "sync"): {1: {"dnn": 40.0}, 5: {"dnn": 7.0}}}
    plots.scaling([str(path)], str(tmp_path / "new" / "folder" / "s.png"))
    assert (tmp_path / "new" / "folder" / "s.png").read_bytes().startswith(PNG)
