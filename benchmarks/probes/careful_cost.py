"""What careful commands cost: microseconds per operation with careful mode off and on.

    mpiexec -n 2 python benchmarks/probes/careful_cost.py [--repeat 2000] [--n 64] [--runs 7]

Careful commands (dmath/runtime/oom.py) agree before every collective and
make the master wait for every worker at the end of each command. This
times operations with and without collectives on small matrices, where that
latency shows most, on the CPU backend: an all-reduce (`max(axis=0)` of a
RowBlock matrix), an all-to-all (a remap to ColBlock), a scalar reduction
(gathered on the master) and an elementwise operation (no collective: only
the end-of-command message). The best of `--runs` runs of `--repeat` calls
each, the modes taking turns, after a warm-up.
"""
import argparse
import time

import dmath


def timed(fn, repeat):
    """Microseconds per call of `fn` over `repeat` calls (the run ends when every worker is done)."""
    dmath.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    dmath.synchronize()
    return (time.perf_counter() - t0) / repeat * 1e6


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2000, help="calls per timed run")
    ap.add_argument("--n", type=int, default=64, help="the matrices are n x n float32")
    ap.add_argument("--runs", type=int, default=7, help="timed runs per mode (the best one is reported)")
    args = ap.parse_args(argv)
    if args.repeat < 1 or args.n < 1 or args.runs < 1:
        ap.error("--repeat, --n and --runs must be positive")
    dmath.init(device="cpu")
    x = dmath.random.rand((args.n, args.n), "float32", dmath.RowBlock())
    ops = {
        "max(axis=0) (all-reduce)": lambda: x.max(axis=0),
        "remap to ColBlock (all-to-all)": lambda: x.remap(dmath.ColBlock()),
        "sum() (gather to the master)": lambda: x.sum(),
        "x + 1 (no collective)": lambda: x + 1.0,
    }
    modes = ("never", "always")
    print(f"{dmath.num_workers()} workers, {args.n} x {args.n} float32, best of {args.runs} x {args.repeat} calls")
    print(f"{'operation':34s}" + "".join(f"{'careful ' + m:>18s}" for m in modes)
          + "   agreements per call (careful's cost)")
    for name, fn in ops.items():
        best = {m: float("inf") for m in modes}
        agreed = 0
        # runs alternate between the modes, so that a slow spell of the machine hits both
        for run in range(args.runs):
            for mode in modes:
                dmath.memory.set_careful(mode)
                if run == 0:
                    for _ in range(100):
                        fn()
                before = dmath.stats()[0].get("agreements", 0)
                best[mode] = min(best[mode], timed(fn, args.repeat))
                if mode == "always":
                    agreed = (dmath.stats()[0].get("agreements", 0) - before) / args.repeat
        cells = [best[m] for m in modes]
        print(f"{name:34s}" + "".join(f"{c:15.1f} us" for c in cells)
              + f"   {agreed:.0f} ({cells[1] - cells[0]:+.1f} us)", flush=True)


if __name__ == "__main__":
    main()
