"""The host-batch pipeline's tuner (dmath/planning/host_stages.Tuner) on simulated stage times: it picks
the normalisation place with the shorter step-side time, adds decoding threads while they shorten the
step's wait and stops at the first that does not, drops threads the step never waits for, and keeps
what the user fixed."""
from dmath.planning.host_stages import Tuner


def drive(tuner, stall_of, device_of=lambda place: 0.001, step=0.05, batches=200):
    """Feed the tuner `batches` read-ahead batches whose stall depends on its current threads."""
    for _ in range(batches):
        tuner.record(32, 0.1, stall_of(tuner.threads), device_of(tuner.place), step)
    return tuner


def test_threads_climb_while_the_wait_shrinks_and_stop_at_the_first_that_does_not():
    # the host stage takes 0.4 s of thread time a batch; the step 0.05 s; cores beyond 5 do not help
    t = drive(Tuner(0, ("device",), max_threads=16), lambda k: max(0.4 / min(k, 5) - 0.05, 0.0))
    assert t.threads == 5
    assert any("did not shorten" in d for d in t.log)


def test_threads_drop_while_the_step_never_waits():
    t = drive(Tuner(0, ("device",), max_threads=8), lambda k: 0.0)
    assert t.threads == 1


def test_threads_stop_dropping_where_the_step_starts_waiting():
    # two threads keep up with the step, one does not
    t = drive(Tuner(4, ("device",), max_threads=8), lambda k: 0.0 if k >= 2 else 0.04)
    assert t.threads == 4                               # fixed by the user: never changed
    t = Tuner(0, ("device",), max_threads=8)
    t.threads = 4
    drive(t, lambda k: 0.0 if k >= 2 else 0.04)
    assert t.threads == 2 and any("stalled the step" in d for d in t.log)


def test_auto_placement_keeps_the_faster_place():
    cost = {"device": 0.004, "host": 0.001, "device_resize": 0.002}
    t = drive(Tuner(2, ("device", "host", "device_resize"), max_threads=2), lambda k: 0.0, device_of=cost.get)
    assert t.place == "host" and t.summary()["place"] == "host" and t.summary()["place_tuned"]
    cost = {"device": 0.004, "host": 0.003, "device_resize": 0.002}
    t = drive(Tuner(2, ("device", "host", "device_resize"), max_threads=2), lambda k: 0.0, device_of=cost.get)
    assert t.place == "device_resize"
    t = drive(Tuner(2, ("host",), max_threads=2), lambda k: 0.0, device_of=cost.get)
    assert t.place == "host" and not t.summary()["place_tuned"]


def test_batches_decoded_on_demand_teach_nothing():
    t = Tuner(0, ("device",), max_threads=8)
    for _ in range(50):
        t.record(32, 0.4, 0.4, 0.001, 0.05, ahead=False)
    assert t.threads == 2 and t.summary()["batches"] == 50
