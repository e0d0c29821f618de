"""Shared helpers of the benchmark scripts: timing, JSON output, environment description."""
import argparse
import json
import os
import platform
import statistics
import time


def median_time(fn, reps, warmup=2):
    """Median seconds of fn() over reps runs after warmup runs (fn must synchronise itself)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def device_ms(cp, fn, repeats):
    """Mean milliseconds of fn() on the GPU over `repeats` runs after one warm-up, between two CuPy
    events on the current stream (fn enqueues work and returns; no host synchronisation inside)."""
    fn()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(repeats):
        fn()
    stop.record()
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) / repeats


def environment(dmath):
    return {"workers": dmath.num_workers(), "device": dmath.device(), "python": platform.python_version(),
            "machine": platform.machine(), "node": platform.node(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def write_json(path, payload):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=2)
    os.replace(tmp, path)
    print(f"wrote {path}")


_torch_ready = False


def torch_distributed(call, port):
    """PyTorch's process group over the dmath workers (once per process), on this worker's device.

    Called from inside a benchmark kernel that every worker runs, so that
    PyTorch (a peer to compare against, never a dependency) sees the same
    ranks and devices as dmath: NCCL on the worker's GPU, gloo on the CPU
    backend. Returns (torch, device).
    """
    global _torch_ready
    import torch
    import torch.distributed as tdist
    from dmath import backend
    if backend.current().is_gpu:
        dev = torch.device("cuda", backend.current().device_id)
        torch.cuda.set_device(dev)
        kind, bound = "nccl", {"device_id": dev}
    else:
        dev, kind, bound = torch.device("cpu"), "gloo", {}
    if not _torch_ready:
        tdist.init_process_group(kind, init_method=f"tcp://127.0.0.1:{port}", rank=call.rank,
                                 world_size=call.world.size, **bound)
        _torch_ready = True
    return torch, dev


def positive_int(text):
    """argparse type: an integer >= 1 (a count of steps, batches or images)."""
    return _int_at_least(text, 1)


def at_least_two(text):
    """argparse type: an integer >= 2 (steps of a timed epoch: the resident batches are that many)."""
    return _int_at_least(text, 2)


def _int_at_least(text, low):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {v}")
    return v
