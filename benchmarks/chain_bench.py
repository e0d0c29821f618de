"""Master cost per operation for a chain of small operations: cached IDs, a recorded plan, DTensor.

    mpiexec -n P python benchmarks/chain_bench.py [--n 256] [--groups 25] [--reps 50] [--out F.json]

The chain is `groups` repetitions of y = tanh((y @ W) * s + x), four dmath
operations each (100 by default) on n x n matrices: x and y row-split
(RowBlock), W replicated. Timed per operation, both as the master's time to
issue the chain (what the master pays; the workers run behind it) and until
the workers have completed it, each the median of `reps` runs of one chain
followed by `dmath.synchronize()` (as DTensor's figure is its median run):
- eager: each operation dispatched with its cached signature ID;
- replay: the chain recorded once with `dmath.record()`, then `plan.replay()`
  (one control message for the whole chain);
- DTensor: the same chain through PyTorch DTensor on the same workers
  (Shard(0) for x and y, Replicate for W; NCCL on GPUs, gloo on the CPU),
  where PyTorch is installed (a peer, never a dependency).
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dmath                                    # noqa: E402
from dmath.comm.control import FRAME, gather_objects   # noqa: E402
from dmath.ops.base import dispatch             # noqa: E402
from dmath.runtime import kernel                # noqa: E402
from common import environment, median_time, torch_distributed, write_json  # noqa: E402



@kernel("bench_dtensor_chain")
def _dtensor_chain(call):
    """Every worker runs the chain through DTensor (static: n, groups, reps, port); seconds per op."""
    n, groups, reps, port = call.entry.static
    try:
        torch, dev = torch_distributed(call, port)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Replicate, Shard
        P, rank = call.world.size, call.rank
        mesh = init_device_mesh(dev.type, (P,))
        rows = n // P + (rank < n % P)
        x = DTensor.from_local(torch.rand(rows, n, device=dev), mesh, [Shard(0)], run_check=False)
        w = DTensor.from_local(torch.rand(n, n, device=dev) * 0.01, mesh, [Replicate()], run_check=False)

        def run():
            y = x
            for _ in range(groups):
                y = torch.tanh((y @ w) * 0.5 + x)
            y.to_local()
            if dev.type == "cuda":
                torch.cuda.synchronize()
        result = median_time(run, reps, warmup=2) / (4 * groups)
    except Exception as exc:  # no PyTorch here: say so in the results
        result = f"unavailable: {type(exc).__name__}: {exc}"
    results = gather_objects(call.world, result)
    if call.rank == 0:
        call.result = results[0] if isinstance(results[0], str) else max(results)
    return []


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--groups", type=int, default=25)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--port", type=int, default=29534)
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-dtensor", action="store_true", help="leave out the DTensor peer")
    ap.add_argument("--eager-only", action="store_true",
                    help="time the eager chain only (with DMATH_CPROFILE: profiles of its steady state)")
    args = ap.parse_args()
    dmath.init(device=args.device)
    P, n, groups = dmath.num_workers(), args.n, args.groups
    ops = 4 * groups
    x = dmath.random.rand((n, n), layout=dmath.RowBlock())
    w = dmath.random.rand((n, n), layout=dmath.Replicated()) * 0.01
    y = dmath.zeros((n, n), layout=dmath.RowBlock())

    def chain():
        v = x
        for _ in range(groups):
            v = dmath.tanh((v @ w) * 0.5 + x)
        return v

    def timed(fn):
        """(master seconds per op to issue the chain, seconds per op until the workers finished it):
        medians over `reps` runs of fn then `dmath.synchronize()`, as the DTensor peer's (a median
        of synchronised runs, so that a burst of host noise moves neither figure)."""
        for _ in range(2):
            fn()
        dmath.synchronize()
        dmath.reset_stats()     # (and DMATH_CPROFILE's profiles: the steady state only)
        issued, done = [], []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            fn()
            issued.append(time.perf_counter() - t0)
            dmath.synchronize()
            done.append(time.perf_counter() - t0)
        return statistics.median(issued) / ops, statistics.median(done) / ops

    eager_issue, eager_s = timed(chain)
    if args.eager_only:
        print(f"eager_master_us_per_op: {eager_issue * 1e6:.2f}\neager_us_per_op: {eager_s * 1e6:.2f}")
        return
    with dmath.record() as plan:
        y.assign(chain())
    expect = y.to_numpy()
    dmath.reset_stats()
    plan.replay()
    ctl = dmath.stats()[0]      # the stats command's own frame is not the replay's: subtracted below
    replay_issue, replay_s = timed(plan.replay)
    assert np.allclose(y.to_numpy(), expect, rtol=1e-5, atol=1e-6)
    result = {"workers": P, "n": n, "ops_in_chain": ops,
              "eager_master_us_per_op": eager_issue * 1e6, "eager_us_per_op": eager_s * 1e6,
              "replay_master_us_per_op": replay_issue * 1e6, "replay_us_per_op": replay_s * 1e6,
              "replay_control_msgs": ctl["control_msgs"] - 1, "replay_control_bytes": ctl["control_bytes"] - FRAME}
    if not args.no_dtensor:
        dt = dispatch("bench_dtensor_chain", static=(n, groups, args.reps, args.port))[1]
        result["dtensor_us_per_op"] = dt * 1e6 if isinstance(dt, float) else dt
        if isinstance(dt, float):
            result["dtensor_over_eager"] = dt / eager_s
            result["dtensor_over_replay"] = dt / replay_s
            result["dtensor_over_replay_master"] = dt / replay_issue
    for k, v in result.items():
        print(f"{k}: {v:.2f}" if isinstance(v, float) else f"{k}: {v}")
    if args.out:
        write_json(args.out, {"benchmark": "op_chain", "environment": environment(dmath), "results": result})


if __name__ == "__main__":
    main()
