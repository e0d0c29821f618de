"""Model.fit's display: a tqdm bar (stderr) and Keras-style epoch lines (stdout)."""
import io

import pytest

from dnn.training import progress


def _run(verbose, interval=0.0):
    out, err, reads = io.StringIO(), io.StringIO(), []

    def read():
        reads.append(1)
        return 0.5, 0.25

    bar = progress.ProgressBar(1, 3, 10, verbose=verbose, stream=out, bar_stream=err, interval=interval)
    bar.update(4, read)
    bar.update(10, read)
    bar.finish({"loss": 0.125, "accuracy": 0.75, "val_loss": None, "samples_per_s": 1234.4})
    return out.getvalue(), err.getvalue(), len(reads)


def test_bar_through_a_pipe_and_one_line_per_epoch():
    out, err, reads = _run(1)
    assert out == "epoch 2/3 - loss 0.1250 - accuracy 0.7500 - 1234 samples/s\n"
    assert progress.tqdm is not None          # the test extra brings tqdm
    assert "epoch 2/3" in err and "10/10" in err and "loss=0.5000" in err and "accuracy=0.2500" in err
    assert reads == 2


def test_metrics_are_read_only_when_the_interval_passed():
    *_, reads = _run(1, interval=3600.0)
    assert reads == 0


@pytest.mark.parametrize("verbose", [0, 2])
def test_quiet_and_lines_only(verbose):
    out, err, reads = _run(verbose)
    assert err == "" and reads == 0
    assert out == ("" if verbose == 0 else "epoch 2/3 - loss 0.1250 - accuracy 0.7500 - 1234 samples/s\n")
