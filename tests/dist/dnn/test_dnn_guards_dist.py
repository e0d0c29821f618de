"""fit stops on numerical failure instead of training on NaN (issue 12), at every worker count."""
import numpy as np
import pytest

import dmath
import dnn
from dnn import layers as L
from dnn.callbacks import TerminateOnNaN
from dnn.layers.base import overwrite

RNG = np.random.default_rng(12)
X = RNG.random((96, 4))
Y = np.arange(96) % 3


def model(dtype="float32", lr=0.1, **kw):
    return dnn.Sequential([L.Input(4), L.Dense(3), L.Output("softmax")], dtype=dtype,
                          optimizer=dnn.optim.SGD(lr=lr), **kw)


def test_a_diverging_run_stops_with_a_clear_error():
    m = model(lr=1e38)
    with pytest.raises(dnn.TrainingError, match=r"loss is (nan|inf).*terminate_on_nan=False"):
        m.fit(X, Y, batch_size=4, epochs=3, verbose=0)
    assert m.epochs_trained == 1          # 24 batches (< check_every): found at the first epoch's end


def test_the_check_can_be_switched_off():
    hist = model(lr=1e38).fit(X, Y, batch_size=4, epochs=1, verbose=0, terminate_on_nan=False)
    assert not np.isfinite(hist.history["loss"][0])


def test_non_finite_weights_are_found_at_the_end_of_an_epoch():
    m = model()
    kernel = m.layers[1].weights[0]        # dense_1/kernel
    bad = kernel.numpy()
    bad[1, 2] = np.inf
    # written into the matrix itself, as a diverged step would (set_weights refuses non-finite values)
    overwrite(kernel.value, bad.reshape(kernel.value.shape))
    # a check after every batch would see the loss first; checked only at the epoch's end, the weight is named
    with pytest.raises(dnn.TrainingError, match=r"(weight dense_1/kernel holds NaN or infinity|loss is)"):
        m.fit(X, Y, batch_size=32, epochs=1, verbose=0, callbacks=[TerminateOnNaN(check_every=1000)])


def test_float16_loss_scale_that_skips_every_step_stops():
    # a scale of 1e38 overflows every float16 gradient: the scaler halves it each step and skips
    m = model("float16", loss_scale=dnn.optim.DynamicLossScale(init_scale=1e38))
    with pytest.raises(dnn.TrainingError, match=r"last (\d+) steps were all skipped"):
        m.fit(X, Y, batch_size=2, epochs=1, verbose=0, callbacks=[TerminateOnNaN(check_every=10, max_skipped=8)])


def test_float16_inputs_beyond_its_range_are_refused_before_training():
    m = model("float16")
    before = m.get_weights()
    with pytest.raises(dnn.ConfigError, match=r"needs inputs within \+-65504; the largest magnitude here is 99\d{4}"):
        m.fit(X * 1e6, Y, verbose=0)
    with pytest.raises(dnn.ConfigError, match="float16"):
        m.predict(X * 1e6)
    for a, b in zip(before, m.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_float32_inputs_beyond_its_range_are_refused():
    """float64 samples of 1e39 gave a float32 model NaN predictions and losses, silently."""
    m = model("float32")
    big = X.astype(np.float64) * 0 + 1e39
    for call in (lambda: m.fit(big, Y, verbose=0), lambda: m.evaluate(big, Y), lambda: m.predict(big)):
        with pytest.raises(dnn.ConfigError, match=r"float32 model needs inputs within .*use dtype='float64'"):
            call()
    m.predict(X.astype(np.float64) * 1e30)          # within float32's range: taken
    model("float64").predict(big)                   # a float64 model holds it


@pytest.mark.parametrize("call", ["fit", "evaluate", "predict"])
@pytest.mark.parametrize("case", ["nan", "empty", "strings", "complex"])
def test_bad_inputs_are_refused_by_dnn(call, case):
    m = model()
    x, y = X.copy(), Y
    if case == "nan":
        x[5, 1] = np.nan
    elif case == "empty":
        x, y = X[:0], Y[:0]
    elif case == "strings":
        y = np.array(["a", "b", "c"] * 32)
    else:
        x = X * 1j
    if call == "predict" and case in ("empty", "strings"):
        if case == "empty":               # as Keras: no samples, no outputs
            assert m.predict(x).shape == (0, 3)
        return
    fn = {"fit": lambda: m.fit(x, y, verbose=0), "evaluate": lambda: m.evaluate(x, y),
          "predict": lambda: m.predict(x)}[call]
    with pytest.raises(dnn.DNNError, match={"nan": "NaN or infinity, the first at index 5", "empty": "at least one",
                                            "strings": "must be numbers", "complex": "real numbers"}[case]):
        fn()
    assert dmath.ones((2, 2)).sum() == 4.0


def test_a_weight_that_does_not_reach_the_loss_is_found_by_the_epoch_end_read():
    """A running variance of inf leaves the training loss finite: only the weights' finiteness flag,
    read with the epoch's metrics (TerminateOnNaN.epoch_end_reads), can name it."""
    m = dnn.Sequential([L.Input(4), L.Dense(3), L.BatchNorm(), L.Output("softmax")], optimizer=dnn.optim.SGD(lr=0.1))
    var = next(w for layer in m.layers for w in layer.weights if w.name.endswith("running_var"))
    var.value.set((0, 1), float("inf"))
    with pytest.raises(dnn.TrainingError, match=r"weight batchnorm_\d+/running_var holds NaN or infinity at the end "
                                                r"of epoch 0"):
        m.fit(X, Y, batch_size=32, epochs=2, verbose=0)
    assert m.epochs_trained == 1


class _Reads(dnn.callbacks.Callback):
    """Asks for `count` (1, 1) matrices of known values at every epoch's end and records what it got."""

    def __init__(self, base, count):
        self.base, self.count, self.got, self.seen = base, count, [], []
        self.mats = [dmath.full((1, 1), float(base + i)) for i in range(count)]

    def epoch_end_reads(self):
        return self.mats

    def epoch_end_values(self, values):
        self.got.append(list(values))

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append(len(self.got))          # the values came before on_epoch_end


def test_callbacks_epoch_end_reads_come_with_the_epochs_metrics():
    """Each callback gets its own matrices' values, in order, before on_epoch_end, every epoch; past
    one command's 255 operands the read takes a second command; the epoch's logs are unchanged."""
    first, second, none = _Reads(1000, 3), _Reads(5000, 260), _Reads(0, 0)
    dmath.random.seed(3)
    m = model()
    hist = m.fit(X, Y, batch_size=32, epochs=2, verbose=0, shuffle=False, callbacks=[first, none, second])
    assert first.got == [[1000.0, 1001.0, 1002.0]] * 2 and first.seen == [1, 2]
    assert second.got == [[5000.0 + i for i in range(260)]] * 2 and second.seen == [1, 2]
    assert none.got == [] and none.seen == [0, 0]
    dmath.random.seed(3)
    plain = model().fit(X, Y, batch_size=32, epochs=2, verbose=0, shuffle=False)
    np.testing.assert_allclose(hist.history["loss"], plain.history["loss"], rtol=1e-6)
    np.testing.assert_allclose(hist.history["accuracy"], plain.history["accuracy"])


@pytest.mark.parametrize("returned,what", [(lambda: 5, "must return a list"),
                                           (lambda: [np.zeros((1, 1))], r"must return \(1, 1\) dmath matrices"),
                                           (lambda: [dmath.ones((3, 4))], r"must return \(1, 1\) dmath matrices .*got a \(3, 4\)")])
def test_a_callbacks_bad_epoch_end_reads_are_refused_by_name(returned, what):
    class Bad(dnn.callbacks.Callback):
        def epoch_end_reads(self):
            return returned()
    with pytest.raises(dnn.ConfigError, match=f"Bad.epoch_end_reads {what}"):
        model().fit(X, Y, batch_size=32, epochs=1, verbose=0, callbacks=[Bad()])


def test_asynchronous_fits_read_the_callbacks_epoch_end_values_too():
    reads = _Reads(7, 2)
    dmath.random.seed(3)
    model().fit(X, Y, batch_size=8, epochs=2, verbose=0, asynchronous=True, callbacks=[reads])
    assert reads.got == [[7.0, 8.0]] * 2 and reads.seen == [1, 2]
