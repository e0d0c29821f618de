"""A Jacobi sweep written with slicing/assignment and with roll, against NumPy (and Heat) in the same job.

    mpiexec -n 2 python benchmarks/jacobi_bench.py OUTDIR [--n 2048] [--sweeps 10] [--rounds 5] [--device cpu|gpu]

Times one sweep of examples/jacobi.py's 5-point stencil on an n x n float64
grid (RowBlock rows), three ways for dmath: the slices form and the roll
form replayed from a recorded plan, and the roll form eager; and the same
slices form in NumPy on the master in the same process (on a GPU machine:
CuPy on the master's GPU, the single-device peer). The four take turns,
`sweeps` sweeps each, for `rounds` rounds; ratio = peer seconds / dmath
seconds (above 1: dmath faster), of the best rounds and of the medians. Heat (`heat`, split=0, the same
slices form with its halo-exchanging slicing) is timed in the same job when
it imports; otherwise the JSON says why. Every dmath result is checked
against the peer's. Writes OUTDIR/jacobi_<device>_p<P>.json.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import dmath                                          # noqa: E402
from dmath.ops.base import dispatch                  # noqa: E402
from dmath.runtime import kernel                      # noqa: E402
from common import environment, write_json   # noqa: E402
from jacobi import numpy_sweeps, problem, setup       # noqa: E402


def _dmath_block(hf, form, sweeps, recorded):
    """(run `sweeps` sweeps, the matrix u, sweeps done so far as a list): the form set up on the
    workers, the first sweep recorded when `recorded` (then the runs replay it)."""
    u, sweep = setup(hf, form)
    done = [0]
    step = sweep
    if recorded:
        with dmath.record() as plan:
            sweep()
        step, done[0] = plan.replay, 1

    def block():
        for _ in range(sweeps):
            step()
        dmath.synchronize()
        done[0] += sweeps
    block.sweep = sweep         # a replayed plan needs its inputs (the sweep's matrices) alive
    return block, u, done


def _peer_block(hf, sweeps, xp):
    """The same slices form with array module xp (NumPy, or CuPy on the master's GPU)."""
    u = xp.zeros(hf.shape)
    inner = xp.asarray(hf[1:-1, 1:-1])
    sync = (lambda: xp.cuda.get_current_stream().synchronize()) if xp is not np else (lambda: None)

    def block():
        for _ in range(sweeps):
            u[1:-1, 1:-1] = 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] + inner)
        sync()
    return block


def _interleaved(blocks, rounds):
    """Seconds of every block in each of `rounds` rounds, the blocks taking turns (a warm-up round
    first): on a machine shared with other jobs, a load change hits all of them alike."""
    for b in blocks.values():
        b()
    times = {k: [] for k in blocks}
    for _ in range(rounds):
        for k, b in blocks.items():
            t0 = time.perf_counter()
            b()
            times[k].append(time.perf_counter() - t0)
    return times


@kernel("bench_jacobi_heat")
def _heat(call):
    """Heat's seconds per sweep (split=0, the slices form), run by every worker together (Heat's
    collectives span the job's ranks, which serve dmath commands otherwise), or why it could not."""
    n, sweeps = call.entry.static
    try:
        import heat as ht
    except Exception as exc:            # any failure to import is the answer recorded in the JSON
        call.result = {"error": f"import heat failed: {type(exc).__name__}: {exc}"}
        return []
    hf, _ = problem(n)
    u = ht.zeros(hf.shape, dtype=ht.float64, split=0)
    inner = ht.array(hf[1:-1, 1:-1], split=0)
    u[1:-1, 1:-1] = 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] + inner)   # warm-up
    t0 = time.perf_counter()
    for _ in range(sweeps):
        u[1:-1, 1:-1] = 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] + inner)
    seconds = (time.perf_counter() - t0) / sweeps
    ok = bool(np.allclose(u.numpy(), numpy_sweeps(hf, sweeps + 1), rtol=1e-12, atol=1e-14))
    if call.rank == 0:
        call.result = {"seconds_per_sweep": seconds, "version": ht.__version__, "checked": ok}
    return []


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir")
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--sweeps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
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
    forms = {"slices_replayed": ("slices", True), "roll_replayed": ("roll", True), "roll_eager": ("roll", False)}
    made = {name: _dmath_block(hf, form, args.sweeps, rec) for name, (form, rec) in forms.items()}
    blocks = {"peer": _peer_block(hf, args.sweeps, xp)}
    blocks.update({name: m[0] for name, m in made.items()})
    times = _interleaved(blocks, args.rounds)
    per_sweep = {k: (min(v) / args.sweeps, statistics.median(v) / args.sweeps) for k, v in times.items()}
    peer_best, peer_median = per_sweep["peer"]
    results = {}
    for name, (_, u, done) in made.items():
        ok = bool(np.allclose(u.to_numpy(), numpy_sweeps(hf, done[0]), rtol=1e-12, atol=1e-14))
        best, median = per_sweep[name]
        results[name] = {"seconds_per_sweep_best": best, "seconds_per_sweep_median": median,
                         "ratio_vs_peer_best": peer_best / best, "ratio_vs_peer_median": peer_median / median,
                         "checked": ok}
        print(f"{name:16s} {best * 1e3:8.3f} ms/sweep (best)  peer/dmath = {peer_best / best:5.2f} best, "
              f"{peer_median / median:5.2f} median  checked={ok}")
        if not ok:
            raise SystemExit(f"{name}: the result differs from NumPy's")
    print(f"{peer_name:16s} {peer_best * 1e3:8.3f} ms/sweep (best), {peer_median * 1e3:.3f} median")
    payload = {"benchmark": "jacobi", "n": args.n, "sweeps_per_run": args.sweeps, "rounds": args.rounds,
               "dtype": "float64", "layout": "RowBlock", "peer": peer_name,
               "peer_seconds_per_sweep_best": peer_best, "peer_seconds_per_sweep_median": peer_median,
               "dmath": results,
               "heat": dispatch("bench_jacobi_heat", static=(args.n, args.sweeps))[1],
               "environment": environment(dmath)}
    heat = payload["heat"]
    if "seconds_per_sweep" in heat:
        heat["ratio_vs_dmath_slices_best"] = heat["seconds_per_sweep"] / results["slices_replayed"]["seconds_per_sweep_best"]
    print(f"heat: {heat}")
    write_json(os.path.join(args.outdir, f"jacobi_{dev}_p{P}.json"), payload)


if __name__ == "__main__":
    main()
