"""Checkpoint-restart at another worker count is the uninterrupted run.

A job at P1 workers trains a reference for 2 epochs (with a ModelCheckpoint
saving every 4 steps, keeping the last 2) and, from the same seed, a model
for 1 epoch that it saves. A new job at P2 workers loads the epoch
checkpoint and fits epochs=2, initial_epoch=1, and does the same from the
step checkpoint saved inside the second epoch (fit resumes at its batch). Shuffling,
augmentation, dropout, a model-parallel Dense and Adam with weight decay and
a warm-up are all in play; in float64 only the order of sums may differ
between worker counts, so the weights agree to 1e-9. Runs in the plain
`pytest tests` stage and launches its own jobs.
"""
import numpy as np
import pytest

from _jobs import MPIEXEC, run_python

COMMON = """
import sys
import numpy as np
import dmath
import dnn
from dnn import layers as L
dmath.init(device="cpu")
x, y = dnn.data.synthetic_classification(96, (1, 6, 6), classes=3, seed=1, noise=0.5, dtype="float64")
data = dnn.data.Dataset(x, y, augment=dnn.data.Augment(shift=1))
out, ckpt = sys.argv[1], sys.argv[2]
"""

SAVE = COMMON + """
def build():
    dmath.random.seed(11)
    return dnn.Sequential([
        L.Input((1, 6, 6)), L.Conv2D(2, 3, padding="same"), L.Activation("relu"), L.Flatten(),
        L.Dense(16, parallel="model"), L.Activation("tanh"), L.Dropout(0.3), L.Dense(3), L.Output("softmax")],
        dtype="float64", optimizer=dnn.optim.Adam(lr=0.01, weight_decay=1e-3,
                                                  schedule=dnn.optim.schedules.Warmup(3)))
ref = build()
keep = dnn.callbacks.ModelCheckpoint(ckpt + "-step{step}.dnn", unit="step", every=4, keep=2)
hist = ref.fit(data, batch_size=16, epochs=2, verbose=0, callbacks=[keep])
part = build()
part.fit(data, batch_size=16, epochs=1, verbose=0)
part.save(ckpt + "-epoch.dnn")
np.savez(out, *ref.get_weights(), loss=np.array(hist["loss"]), written=np.array(keep.written))
"""

RESUME = COMMON + """
res = {}
for name in ("epoch", "step8"):
    model = dnn.load(f"{ckpt}-{name}.dnn")
    hist = model.fit(data, batch_size=16, epochs=2, initial_epoch=1, verbose=0)
    res.update({f"{name}_w{i}": w for i, w in enumerate(model.get_weights())})
    res[f"{name}_loss"] = np.array(hist["loss"])
    res[f"{name}_epochs"] = np.array(hist.epoch)
np.savez(out, **res)
"""


def _job(tmp_path, script, n, out, ckpt):
    path = tmp_path / f"{out}.py"
    path.write_text(script)
    run_python([path, tmp_path / f"{out}.npz", tmp_path / ckpt], n, tmp_path)
    return np.load(tmp_path / f"{out}.npz")


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec found")
@pytest.mark.parametrize("p1,p2", [(1, 3), (3, 2)])
def test_resume_at_another_worker_count_equals_the_uninterrupted_run(tmp_path, p1, p2):
    ref = _job(tmp_path, SAVE, p1, "save", "ck")
    res = _job(tmp_path, RESUME, p2, "resume", "ck")
    weights = [k for k in ref.files if k.startswith("arr_")]
    assert len(weights) == 6
    # 12 steps: files at steps 4, 8, 12; the last two are kept
    assert [f.rsplit("-", 1)[1] for f in ref["written"]] == ["step8.dnn", "step12.dnn"]
    assert not (tmp_path / "ck-step4.dnn").exists() and (tmp_path / "ck-step8.dnn").exists()
    for name in ("epoch", "step8"):
        assert list(res[f"{name}_epochs"]) == [1]
        for i, k in enumerate(weights):
            np.testing.assert_allclose(res[f"{name}_w{i}"], ref[k], rtol=0, atol=1e-9, err_msg=f"{name} {k}")
        # the second epoch's loss: the step checkpoint carried the sums of the epoch's first two batches
        np.testing.assert_allclose(res[f"{name}_loss"][0], ref["loss"][1], rtol=1e-9)
    assert ref["loss"][1] < ref["loss"][0]
