"""The same dnn training program gives the same weights at 1 and at 4 workers.

Data parallelism splits every batch into row blocks and all-reduces the
weight gradients; model parallelism splits a Dense kernel into column blocks;
dropout masks depend on the global element index only; the dataset is resident
on the workers, shuffled by (seed, epoch) and augmented by draws keyed by each
sample's place in the stream, so every worker count takes the same batches.
Only the order of floating-point sums may change with the worker count, so
in float64 the trained weights agree to ~1e-12. Runs in the plain `pytest
tests` stage and launches its own jobs.
"""
import subprocess
import sys

import numpy as np
import pytest

from _jobs import MPIEXEC, job_env, run_python

SCRIPT = """
import sys
import numpy as np
import dmath
import dnn
from dnn import layers as L
dmath.init(device="cpu")
dmath.random.seed(7)
x, y = dnn.data.synthetic_classification(96, (2, 6, 6), classes=3, seed=1, noise=0.5, dtype="float64")
model = dnn.Sequential([
    L.Input((2, 6, 6)), L.Conv2D(3, 3, padding="same"), L.BatchNorm(), L.Activation("relu"), L.Pool2D(2),
    L.Flatten(), L.Dense(12, parallel="model"), L.Activation("tanh"), L.Dropout(0.25), L.Dense(3, parallel="data"),
    L.Output("softmax")], dtype="float64", optimizer=dnn.optim.SGD(lr=0.05, momentum=0.9, weight_decay=1e-3))
data = dnn.data.Dataset(x, y, augment=dnn.data.Augment(shift=1, flip=True), mean=0.1, std=1.5)
hist = model.fit(data, batch_size=20, epochs=2, validation_split=0.2, verbose=0)
out = {f"w{i}": w for i, w in enumerate(model.get_weights())}
out.update(loss=np.array(hist["loss"]), val=np.array(hist["val_loss"]), pred=model.predict(x[:9]),
           P=np.array(dmath.num_workers()))
np.savez(sys.argv[1], **out)
"""


def _run(tmp_path, n):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / f"out{n}.npz"
    run_python([script, out], n, tmp_path)
    return np.load(out)


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec found")
def test_same_trained_weights_at_1_and_4_workers(tmp_path):
    one, four = _run(tmp_path, 1), _run(tmp_path, 4)
    assert int(one["P"]) == 1 and int(four["P"]) == 4
    weights = sorted(k for k in one.files if k.startswith("w"))
    assert len(weights) == 10          # conv kernel, bias; gamma, beta, mean, var; two Dense kernels and biases
    for k in weights + ["loss", "val", "pred"]:
        np.testing.assert_allclose(four[k], one[k], rtol=1e-10, atol=1e-12, err_msg=k)
    assert one["loss"][1] < one["loss"][0]


PROGRESS = """
import dmath, dnn
from dnn import layers as L
dmath.init(device="cpu")
x, y = dnn.data.synthetic_classification(64, (8,), classes=2, seed=3)
model = dnn.Sequential([L.Input(8), L.Dense(4), L.Output("softmax")])
model.fit(x, y, batch_size=16, epochs=2, verbose=1)
"""


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec found")
def test_progress_is_drawn_by_rank_0_through_pipes(tmp_path):
    """Under mpiexec every rank writes to a pipe: the tqdm bar still shows (on stderr), once, and
    stdout keeps one Keras-style line per epoch."""
    script = tmp_path / "progress.py"
    script.write_text(PROGRESS)
    p = subprocess.run([MPIEXEC, "-n", "2", sys.executable, str(script)], cwd=str(tmp_path), env=job_env(),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    lines = p.stdout.splitlines()
    assert [s.split(" - ")[0] for s in lines] == ["epoch 1/2", "epoch 2/2"], p.stdout
    assert all("loss" in s and "samples/s" in s for s in lines)
    for epoch in ("epoch 1/2", "epoch 2/2"):
        assert f"{epoch}:" in p.stderr and "/64" in p.stderr, p.stderr      # tqdm's 'epoch 1/2:  25%|.. 16/64'
