"""A Jacobi sweep written with slicing/assignment and with roll, against NumPy (and Heat) in the same job.

    mpiexec -n 2 python benchmarks/jacobi_bench.py OUTDIR [--n 2048] [--sweeps 20] [--device cpu|gpu]

Times one sweep of examples/jacobi.py's 5-point stencil on an n x n float64
grid (RowBlock rows), three ways for dmath: the slices form and the roll
form replayed from a recorded plan, and the roll form eager; and the same
slices form in NumPy on the master in the same process (on a GPU machine:
CuPy on the master's GPU, the single-device peer). ratio = peer seconds /
dmath seconds (above 1: dmath faster). Heat (`heat`, split=0, the same
slices form with its halo-exchanging slicing) is timed in the same job when
it imports; otherwise the JSON says why. Every dmath result is checked
against the peer's. Writes OUTDIR/jacobi_<device>_p<P>.json.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import dmath                                          # noqa: E402
from common import environment, median_time, write_json   # noqa: E402
from jacobi import numpy_sweeps, problem, setup       # noqa: E402


def _time_dmath(hf, form, sweeps, recorded):
    """Seconds per sweep (median of 3 runs of `sweeps` sweeps) and the result after warm-up + runs."""
    u, sweep = setup(hf, form)
    if recorded:
        with dmath.record() as plan:
            sweep()
        step = plan.replay
    else:
        step = sweep
    done = [1]

    def block():
        for _ in range(sweeps):
            step()
        dmath.synchronize()
        done[0] += sweeps
    seconds = median_time(block, 3, warmup=1) / sweeps
    return seconds, u.to_numpy(), done[0] - (0 if recorded else 1)


def _time_peer(hf, sweeps, xp):
    """The same slices form with array module xp (NumPy, or CuPy on the master's GPU)."""
    u = xp.zeros(hf.shape)
    inner = xp.asarray(hf[1:-1, 1:-1])
    sync = (lambda: xp.cuda.get_current_stream().synchronize()) if xp is not np else (lambda: None)

    def block():
        for _ in range(sweeps):
            u[1:-1, 1:-1] = 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] + inner)
        sync()
    return median_time(block, 3, warmup=1) / sweeps


def _heat(hf, sweeps):
    """Heat's seconds per sweep (split=0, the slices form), or the reason it could not run."""
    try:
        import heat as ht
    except Exception as exc:            # any failure to import is the answer recorded in the JSON
        return {"error": f"import heat failed: {type(exc).__name__}: {exc}"}
    u = ht.zeros(hf.shape, dtype=ht.float64, split=0)
    inner = ht.array(hf[1:-1, 1:-1], split=0)

    def block():
        for _ in range(sweeps):
            u[1:-1, 1:-1] = 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] + inner)
    t0 = time.perf_counter()
    block()
    return {"seconds_per_sweep": (time.perf_counter() - t0) / sweeps, "version": ht.__version__}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir")
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--sweeps", type=int, default=20)
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    dmath.init(device=args.device)
    P, dev = dmath.num_workers(), dmath.device()
    hf, _ = problem(args.n)
    if dev == "gpu":
        import cupy as xp
        peer_name = "cupy (one GPU)"
    else:
        xp, peer_name = np, "numpy (one process)"
    peer = _time_peer(hf, args.sweeps, xp)
    results = {}
    for name, form, recorded in (("slices_replayed", "slices", True), ("roll_replayed", "roll", True),
                                 ("roll_eager", "roll", False)):
        seconds, u, total = _time_dmath(hf, form, args.sweeps, recorded)
        ok = bool(np.allclose(u, numpy_sweeps(hf, total), rtol=1e-12, atol=1e-14))
        results[name] = {"seconds_per_sweep": seconds, "ratio_vs_peer": peer / seconds, "checked": ok}
        print(f"{name:16s} {seconds * 1e3:8.3f} ms/sweep  peer/dmath = {peer / seconds:6.2f}  checked={ok}")
        if not ok:
            raise SystemExit(f"{name}: the result differs from NumPy's")
    print(f"{peer_name:16s} {peer * 1e3:8.3f} ms/sweep")
    payload = {"benchmark": "jacobi", "n": args.n, "sweeps_per_run": args.sweeps, "dtype": "float64",
               "layout": "RowBlock", "peer": peer_name, "peer_seconds_per_sweep": peer, "dmath": results,
               "heat": _heat(hf, args.sweeps), "environment": environment(dmath)}
    write_json(os.path.join(args.outdir, f"jacobi_{dev}_p{P}.json"), payload)


if __name__ == "__main__":
    main()
