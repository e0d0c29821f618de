"""Training from an image folder gives the same weights at 1, 2 and 3 workers, and a file that cannot
be decoded under on_error='raise' ends the job non-zero with the file named, at any worker count.

Each worker decodes its own rows of every batch; the epoch's order and each
sample's augmentation draws depend on (seed, epoch, the sample's place in
the stream) only, so every worker count trains on the same batches and,
in float64, only the order of the gradient sums differs. Launches its own
jobs (the plain `pytest tests` stage).
"""
import subprocess
import sys

import numpy as np
import pytest

from _images import make_folder
from _jobs import MPIEXEC, job_env, run_python

SCRIPT = """
import sys
import numpy as np
import dmath
import dnn
from dnn import layers as L
dmath.init(device="cpu")
dmath.random.seed(5)
root, out = sys.argv[1], sys.argv[2]
train = dnn.data.ImageFolder(root, image_size=12, crop_scale=(0.3, 1.0))
val = dnn.data.ImageFolder(root, image_size=12, train=False)
model = dnn.Sequential([
    L.Input((3, 12, 12)), L.Conv2D(4, 3, padding="same"), L.BatchNorm(), L.Activation("relu"), L.Pool2D(2),
    L.Flatten(), L.Dense(8, parallel="model"), L.Activation("tanh"), L.Dense(3), L.Output("softmax")],
    dtype="float64", optimizer=dnn.optim.SGD(lr=0.05, momentum=0.9))
hist = model.fit(train, batch_size=12, epochs=3, validation_data=val, verbose=0)
res = {f"w{i}": w for i, w in enumerate(model.get_weights())}
res.update(loss=np.array(hist["loss"]), val=np.array(hist["val_loss"]), acc=np.array(hist["val_accuracy"]),
           pred=model.predict(val), P=np.array(dmath.num_workers()))
np.savez(out, **res)
"""

RAISE = """
import sys
import dmath
import dnn
from dnn import layers as L
dmath.init(device="cpu")
f = dnn.data.ImageFolder(sys.argv[1], image_size=8, on_error="raise")
model = dnn.Sequential([L.Input((3, 8, 8)), L.Flatten(), L.Dense(3), L.Output("softmax")])
model.fit(f, batch_size=6, epochs=1, verbose=0)
print("trained")
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("images"), per_class=12)


def _train(tmp_path, folder, n):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / f"out{n}.npz"
    run_python([script, folder, out], n, tmp_path)
    return np.load(out)


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec found")
def test_same_trained_weights_at_1_2_and_3_workers(tmp_path, folder):
    runs = {n: _train(tmp_path, folder, n) for n in (1, 2, 3)}
    one = runs[1]
    weights = sorted(k for k in one.files if k.startswith("w"))
    assert len(weights) == 10
    for n in (2, 3):
        assert int(runs[n]["P"]) == n
        for k in weights + ["loss", "val", "pred"]:
            np.testing.assert_allclose(runs[n][k], one[k], rtol=1e-10, atol=1e-12, err_msg=f"{k} at {n} workers")
    assert one["loss"][-1] < one["loss"][0] and one["acc"][-1] > 0.6


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec found")
@pytest.mark.parametrize("n", [1, 3])
def test_on_error_raise_ends_the_job_naming_the_file(tmp_path, folder, n):
    bad = tmp_path / "bad"
    make_folder(bad, per_class=4)
    good = (bad / "cow" / "img01.jpg").read_bytes()
    (bad / "cow" / "img01t.jpg").write_bytes(good[:len(good) // 3])        # a truncated JPEG
    script = tmp_path / "raise.py"
    script.write_text(RAISE)
    cmd = [sys.executable, str(script), str(bad)]
    env = job_env()
    if n > 1:
        cmd = [MPIEXEC, "-n", str(n)] + cmd
    p = subprocess.run(cmd, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "trained" not in p.stdout
    assert "img01t.jpg: cannot be decoded" in p.stderr and "DataError" in p.stderr, p.stderr[-3000:]
