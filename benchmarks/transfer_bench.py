"""Host <-> worker transfers: dmath.from_numpy and to_numpy throughput at P workers.

    python benchmarks/transfer_bench.py [--mb 154] [--out F.json]
    mpiexec -n P python benchmarks/transfer_bench.py ...

Scatters a float32 matrix of about --mb megabytes from the master's memory
(RowBlock: every worker its rows; Replicated: every worker all of it) and
gathers it back, timing each (median of --reps after one warm-up) as GB/s
of the matrix's bytes. There is no peer inside the run: the reference is
a separate run of this script at P = 1 (the master's own copy into its
pool and, on a GPU, to its device), so compare the two JSON files by hand;
the script checks no ratio against it. With Open MPI, whose large messages move
only while MPI is called, a wait that sleeps made the P = 2 scatter 35
times slower than P = 1; dmath's waits poll without sleeping while bytes
are in flight.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dmath                                    # noqa: E402
from common import environment, median_time, write_json  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=154.0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default=None, choices=["cpu", "gpu"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dmath.init(device=args.device)
    cols = 3850
    rows = max(1, int(args.mb * 1e6 / (4 * cols)))
    a = np.random.default_rng(0).random((rows, cols), dtype=np.float32)
    results = []
    for name, layout in (("RowBlock", dmath.RowBlock()), ("Replicated", dmath.Replicated())):
        held = []

        def scatter():
            held[:] = [dmath.from_numpy(a, layout=layout)]
            dmath.synchronize()
        t_scatter = median_time(scatter, args.reps, warmup=1)
        m = held[0]
        t_gather = median_time(m.to_numpy, args.reps, warmup=1)
        assert np.array_equal(m.to_numpy(), a)
        row = {"layout": name, "bytes": a.nbytes, "from_numpy_GBps": a.nbytes / t_scatter / 1e9,
               "to_numpy_GBps": a.nbytes / t_gather / 1e9}
        results.append(row)
        print(f"{dmath.num_workers()} worker(s) {dmath.device()} {name:10s} {a.nbytes / 1e6:.0f} MB: "
              f"from_numpy {row['from_numpy_GBps']:.2f} GB/s, to_numpy {row['to_numpy_GBps']:.2f} GB/s", flush=True)
        del m, held
    if args.out:
        write_json(args.out, {"benchmark": "transfer", "environment": environment(dmath), "results": results})


if __name__ == "__main__":
    main()
