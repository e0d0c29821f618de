"""dnn's pure parts, without workers: the model file format, the parallel cost model, schedules,
loss targets and initializer specs."""
import json
import os
import stat
import struct
import zlib

import numpy as np
import pytest

from dnn import initializers, losses, parallel, serialization
from dnn.errors import ConfigError, ModelFileError, ShapeError
from dnn.optim import schedules


def _arrays():
    return [("a", np.arange(6, dtype=np.float32).reshape(2, 3)), ("b", np.array(7, dtype=np.int64)),
            ("c", np.linspace(0, 1, 5).astype(np.float16)), ("empty", np.zeros((0, 4)))]


def test_file_round_trip_keeps_dtypes_shapes_and_values(tmp_path):
    path = tmp_path / "f.dnn"
    serialization.write_file(path, {"format": "dnn.model", "extra": [1, 2]}, _arrays())
    header, arrays = serialization.read_file(path)
    assert header["extra"] == [1, 2] and list(arrays) == ["a", "b", "c", "empty"]
    for name, a in _arrays():
        assert arrays[name].dtype == a.dtype and arrays[name].shape == a.shape
        np.testing.assert_array_equal(arrays[name], a)
    blob = path.read_bytes()
    magic, version, hsize, _ = struct.unpack_from("<8sIII", blob)
    assert magic == b"DNNMODEL" and version == 2
    for v, readable in ((1, True), (3, False)):      # version 1 files (no training state) still load
        other = tmp_path / f"v{v}.dnn"
        other.write_bytes(blob[:8] + struct.pack("<I", v) + blob[12:])
        if readable:
            assert list(serialization.read_file(other)[1]) == ["a", "b", "c", "empty"]
        else:
            with pytest.raises(ModelFileError, match="version 3"):
                serialization.read_file(other)
    entries = json.loads(blob[20:20 + hsize])["arrays"]
    start = (20 + hsize + 63) // 64 * 64
    assert all(e["offset"] % 64 == 0 for e in entries)
    a = entries[0]          # the documented layout: raw little-endian C-order bytes at the offset
    np.testing.assert_array_equal(np.frombuffer(blob[start + a["offset"]:start + a["offset"] + a["nbytes"]],
                                                dtype="<f4").reshape(2, 3), _arrays()[0][1])


def _data_start(blob):
    return (20 + struct.unpack_from("<8sIII", blob)[2] + 63) // 64 * 64


def _flip(blob, i):
    return blob[:i] + bytes([blob[i] ^ 0x80]) + blob[i + 1:]


def _rewrite_header(blob, edit):
    _, _, hsize, _ = struct.unpack_from("<8sIII", blob)
    header = json.loads(blob[20:20 + hsize])
    edit(header)
    head = json.dumps(header).encode()
    pad = (20 + len(head) + 63) // 64 * 64 - 20 - len(head)
    old_start = (20 + hsize + 63) // 64 * 64
    return struct.pack("<8sIII", b"DNNMODEL", 1, len(head), zlib.crc32(head)) + head + b"\0" * pad + blob[old_start:]


@pytest.mark.parametrize("name,damage,match", [
    ("empty", lambda b: b"", "not a dnn model file"),
    ("magic", lambda b: b"PK\x03\x04" + b[4:], "magic"),
    ("version", lambda b: b[:8] + struct.pack("<I", 9) + b[12:], "version 9"),
    ("header_crc", lambda b: b[:25] + bytes([b[25] ^ 1]) + b[26:], "header's checksum"),
    ("truncated", lambda b: b[:-1], "truncated"),
    ("header_cut", lambda b: b[:40], "truncated"),
    ("appended", lambda b: b + b"x", "longer than declared"),
    ("data_crc", lambda b: _flip(b, _data_start(b) + 5), "checksum of array"),
    ("json", lambda b: _rewrite_header(b, lambda h: h.update(format="zip")), "does not describe"),
    ("entry", lambda b: _rewrite_header(b, lambda h: h["arrays"][0].update(dtype="object")), "malformed"),
    ("size", lambda b: _rewrite_header(b, lambda h: h["arrays"][0].update(nbytes=8)), "declares"),
    ("bounds", lambda b: _rewrite_header(b, lambda h: h["arrays"][2].update(offset=10 ** 6)), "past the end"),
    # sizes whose int64 product wraps to the declared 0 bytes, or overflows it
    ("wraps", lambda b: _rewrite_header(b, lambda h: h["arrays"][3].update(shape=[2 ** 32, 2 ** 32])), "declares"),
    ("past_int64", lambda b: _rewrite_header(b, lambda h: h["arrays"][3].update(shape=[2 ** 70])), "declares"),
    ("empty_but_huge", lambda b: _rewrite_header(b, lambda h: h["arrays"][3].update(shape=[0, 2 ** 70])),
     "impossible shape"),
    # a second entry of one name replaced the first's array (a weight) without a word
    ("duplicate", lambda b: _rewrite_header(b, lambda h: h["arrays"][1].update(name="a")),
     "two arrays named 'a'"),
    # entries over the same bytes: each became an array of its own, so a small file could ask for any memory
    ("overlap", lambda b: _rewrite_header(b, lambda h: h["arrays"][1].update(offset=h["arrays"][0]["offset"])),
     "'b' overlaps array 'a'"),
])
def test_damaged_files_raise_model_file_errors(tmp_path, name, damage, match):
    path = tmp_path / "f.dnn"
    serialization.write_file(path, {"format": "dnn.model"}, _arrays())
    bad = tmp_path / f"{name}.dnn"
    bad.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ModelFileError, match=match):
        serialization.read_file(bad)


def test_a_huge_sparse_file_is_refused_from_its_header_without_reading_the_rest(tmp_path):
    """read_file read the whole file before checking anything: a sparse 64 GiB file (no disk used)
    raised a raw MemoryError under a memory limit (without one the process was killed). The prefix
    and header are read and checked against the file's size first; the arrays are read only then.
    Run in a child process under a 1.5 GB address-space limit, as a hostile file would meet it."""
    import subprocess
    import sys
    import textwrap
    path = tmp_path / "sparse.dnn"
    with open(path, "wb") as f:
        f.write(struct.pack("<8sIII", b"DNNMODEL", 2, 1 << 16, 0))      # a header of 64 KiB, all zeros
        f.truncate(64 << 30)
    code = textwrap.dedent(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (1500 << 20, 1500 << 20))
        from dnn import serialization
        from dnn.errors import ModelFileError
        try:
            serialization.read_file({str(path)!r})
        except ModelFileError as exc:
            print("refused:", exc)
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root)
    assert out.returncode == 0 and "refused:" in out.stdout and "header's checksum" in out.stdout, out


def test_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "f.dnn"
    serialization.write_file(path, {"format": "dnn.model"}, _arrays())
    before = path.read_bytes()
    with pytest.raises(Exception):
        serialization.write_file(path, {"format": "dnn.model"}, [("x", np.array(["text"]))])
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["f.dnn"]


def test_a_write_keeps_the_mode_of_the_file_it_replaces_and_a_new_file_takes_the_umask(tmp_path):
    """The rename that makes a write atomic replaces the file, so the new one took the mode of a new
    file: a read-only (0o444) or private (0o600) file became 0o644. It keeps the replaced file's
    permission bits, as `cp` over a file does; a new file gets 0o666 less the umask (never
    mkstemp's 0o600). Renaming over a read-only file needs only a writable directory."""
    from dnn.data.files import write_atomically
    umask = os.umask(0o027)                  # not the usual 0o022: the mode comes from the umask
    try:
        write_atomically(tmp_path / "new.bin", [b"new"])
        assert stat.S_IMODE(os.stat(tmp_path / "new.bin").st_mode) == 0o640
    finally:
        os.umask(umask)
    path = tmp_path / "f.dnn"
    for mode in (0o444, 0o600, 0o755, 0o640):
        serialization.write_file(path, {"format": "dnn.model"}, _arrays())
        os.chmod(path, mode)
        serialization.write_file(path, {"format": "dnn.model", "mode": mode}, _arrays())
        assert stat.S_IMODE(os.stat(path).st_mode) == mode
        assert serialization.read_file(path)[0]["mode"] == mode
    link = tmp_path / "link.dnn"                 # through a symlink: the mode of its target
    os.symlink(path, link)
    write_atomically(link, [b"via the link"])
    assert os.path.islink(link) and path.read_bytes() == b"via the link"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.dnn", "link.dnn", "new.bin"]


def test_dense_cost_model():
    # data parallelism all-reduces the weights, model parallelism moves activations
    t = parallel.dense_traffic(784, 528, batch=100, nworkers=4)
    assert t["data"] == pytest.approx(2 * 0.75 * (784 * 528 + 528) * 4)
    assert t["model"] == pytest.approx(2 * 0.75 * 100 * (784 + 528) * 4)
    assert parallel.choose_dense(784, 528, 100, 4) == "model"
    assert parallel.choose_dense(528, 10, 100, 4) == "data"
    assert parallel.choose_dense(784, 528, 100, 1) == "data"           # one worker: nothing moves
    assert parallel.choose_dense(100, 100, 10_000, 8) == "data"        # huge batches favour data parallelism


def test_schedule_configs_round_trip():
    s = schedules.Warmup(10, start_factor=0.1, then=schedules.CosineAnnealing(90, min_lr=1e-4))
    again = schedules.get(s.get_config())
    assert [again(t, 0.1) for t in range(0, 120, 7)] == [s(t, 0.1) for t in range(0, 120, 7)]
    with pytest.raises(ConfigError):
        schedules.get({"name": "Cyclic"})


def test_loss_targets():
    from dnn.data.dataset import _targets
    ce = losses.get("cross_entropy")
    rows, kind, rng = _targets(np.array([2, 0]), 2)
    assert kind == "labels" and rng == (0, 2) and rows.tolist() == [[2], [0]]
    assert ce.one_hot(kind, 1, rng, 3) is True                # labels are one-hot encoded on the workers
    rows, kind, rng = _targets(np.eye(3), 3)
    assert kind == "rows" and ce.one_hot(kind, 3, rng, 3) is False
    with pytest.raises(ShapeError, match="labels must be in"):
        ce.one_hot("labels", 1, _targets(np.array([0, 3]), 2)[2], 3)
    rows, kind, rng = _targets(np.array([0.5, 1.0]), 2)       # not integer labels: one value per sample
    assert kind == "rows"
    with pytest.raises(ShapeError):
        ce.one_hot(kind, rows.shape[1], rng, 3)
    rows, kind, rng = _targets(np.array([0, 1, 1]), 3)
    assert losses.get("binary_cross_entropy").one_hot(kind, rows.shape[1], rng, 1) is False
    with pytest.raises(ShapeError):
        losses.get("mse").one_hot("rows", 2, None, 3)
    with pytest.raises(ShapeError, match="targets for"):
        _targets(np.zeros(4), 5)
    with pytest.raises(ConfigError):
        losses.get("hinge")


def test_initializer_specs():
    assert isinstance(initializers.get("he_normal"), initializers.HeNormal)
    assert initializers.get(0.5).value == 0.5
    u = initializers.get({"name": "uniform", "low": -1, "high": 2})
    assert (u.low, u.high) == (-1.0, 2.0) and initializers.get(u.get_config()).get_config() == u.get_config()
    for bad in ("xavier_magic", {"name": "uniform", "low": 1, "high": 0}, {"name": "normal", "sd": 1}, [1, 2]):
        with pytest.raises(ConfigError):
            initializers.get(bad)


def test_the_activation_table_is_built_from_the_definitions():
    import importlib

    from dnn.graph.function import Function
    activation = importlib.import_module("dnn.ops.activation")   # (dnn.ops.activation is also a function)
    assert set(activation.ACTIVATIONS) == {"sigmoid", "tanh", "relu", "softmax", "log_softmax", "linear"}
    for name, cls in activation.ACTIVATIONS.items():
        assert issubclass(cls, Function) and cls.name == name
        assert type(activation.activation(name)) is cls
    with pytest.raises(ConfigError, match="log_softmax"):
        activation.activation("swish")


@pytest.mark.parametrize("make, attr, bad, good", [
    (lambda L: L.BatchNorm(), "eps", [-1.0, 0.0, float("inf"), "1e-3", True], 1e-3),
    (lambda L: L.BatchNorm(), "momentum", [-0.1, 1.5, float("nan"), None], 0.01),
    (lambda L: L.Dropout(0.2), "p", [1.0, -0.5, "0.1"], 0.3),
    (lambda L: L.Dropout(0.2), "seed", [-1, 2 ** 53, 1.5, True], 7),
    (lambda L: L.Dense(3), "activation", ["nope", ["relu"], 3], "tanh"),
    (lambda L: L.Conv2D(4, 3), "activation", ["Relu", {}], "relu"),
    (lambda L: L.Activation("relu"), "activation", [None, "nope"], "sigmoid"),
])
def test_layer_settings_are_checked_when_assigned_as_when_constructed(make, attr, bad, good):
    """A setting assigned between fits is checked as the constructor checks it (a plain attribute took
    BatchNorm's eps = -1 or Dropout's p = 2 as given); a refused value leaves the old one, a good one
    is what get_config() reports (the recorded steps are keyed on it)."""
    from dnn import layers as L
    layer = make(L)
    before = getattr(layer, attr)
    for value in bad:
        with pytest.raises(ConfigError):
            setattr(layer, attr, value)
        assert getattr(layer, attr) == before
    setattr(layer, attr, good)
    assert getattr(layer, attr) == good and layer.get_config()[attr] == good
