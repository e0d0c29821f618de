"""Remap throughput against the raw all-to-all of the same bytes, measured in the same run.

    mpiexec -n 4 python benchmarks/remap_bench.py [--device gpu] [--sizes 4096 8192] [--out F.json]

For RowBlock -> ColBlock and RowBlock -> BlockCyclic, times dmath's remap
(dispatch, plan lookup, packing, exchange, unpacking) and the library's own
all-to-all-v (MPI Alltoallv on the CPU, NCCL grouped send/recv on GPUs) moving
exactly the per-peer byte counts of the remap plan between preallocated
contiguous buffers. ratio = raw time / dmath time (1.0 = as fast as the raw
collective).
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dmath                                    # noqa: E402
from dmath import backend                       # noqa: E402
from dmath.comm.control import gather_objects   # noqa: E402
from dmath.layout import distribution           # noqa: E402
from dmath.remap import localize, plan          # noqa: E402
from dmath.runtime import kernel                # noqa: E402
from common import environment, median_time, write_json  # noqa: E402


@kernel("bench_raw_alltoall")
def _raw_alltoall(call):
    """Time the raw all-to-all-v with this rank's counts from the remap plan (static: layouts, reps)."""
    src_l, dst_l, shape, dtype, reps = call.entry.static
    world = call.world
    P = world.size
    step = plan(distribution(src_l, shape, P), distribution(dst_l, shape, P))[0]
    loc = localize(step, world.rank)
    be = backend.current()
    xp = be.xp
    sc = [0] * P
    rc = [0] * P
    for k, r in enumerate(loc.group):
        sc[r], rc[r] = loc.send_counts[k], loc.recv_counts[k]
    sendbuf = xp.ones(sum(sc), dtype=dtype)
    recvbuf = xp.empty(sum(rc), dtype=dtype)
    isz = np.dtype(dtype).itemsize
    if be.is_gpu:
        from cupy.cuda import nccl
        comm = world.group(tuple(range(P))).nccl
        nd = {"float16": nccl.NCCL_FLOAT16, "float32": nccl.NCCL_FLOAT32, "float64": nccl.NCCL_FLOAT64}[dtype]
        sd, rd = np.cumsum([0] + sc), np.cumsum([0] + rc)
        stream = xp.cuda.get_current_stream()

        def once():
            nccl.groupStart()
            for r in range(P):
                if sc[r] and r != world.rank:
                    comm.send(sendbuf[sd[r]:].data.ptr, sc[r], nd, r, stream.ptr)
                if rc[r] and r != world.rank:
                    comm.recv(recvbuf[rd[r]:].data.ptr, rc[r], nd, r, stream.ptr)
            nccl.groupEnd()
            stream.synchronize()
    else:
        MPI = world.mpi_module
        comm = world.data
        s_b = np.asarray(sc, dtype=np.int64) * isz
        r_b = np.asarray(rc, dtype=np.int64) * isz
        sdis, rdis = np.concatenate([[0], np.cumsum(s_b)[:-1]]), np.concatenate([[0], np.cumsum(r_b)[:-1]])
        sv, rv = sendbuf.view(np.uint8), recvbuf.view(np.uint8)

        def once():
            comm.Alltoallv([sv, (s_b, sdis), MPI.BYTE], [rv, (r_b, rdis), MPI.BYTE])

    def timed():
        if world.is_mpi:
            world.data.Barrier()
        once()
        if world.is_mpi:
            world.data.Barrier()

    seconds = median_time(timed, reps)
    gather_objects(world, None)
    call.result = seconds
    return []


def main():
    ap = argparse.ArgumentParser(description="remap throughput vs the raw all-to-all")
    ap.add_argument("--device", default=None)
    ap.add_argument("--sizes", type=int, nargs="+", default=[2048, 4096])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default="benchmarks/out/remap.json")
    args = ap.parse_args()
    dmath.init(device=args.device)
    P = dmath.num_workers()
    from dmath.ops.base import dispatch
    results = []
    targets = [("ColBlock", dmath.ColBlock()), ("BlockCyclic(64,64)", dmath.BlockCyclic((64, 64)))]
    for n in args.sizes:
        A = dmath.random.rand((n, n), dtype=args.dtype, layout=dmath.RowBlock())
        for name, lay in targets:
            def run_remap():
                A.remap(lay)
                dmath.synchronize()
            t_dmath = median_time(run_remap, args.reps)
            dmath.reset_stats()
            A.remap(lay)
            moved = sum(s["data_bytes_recv"] for s in dmath.stats())
            src_l = dmath.RowBlock().resolved(P)
            t_raw = dispatch("bench_raw_alltoall", [], [], static=(src_l, lay.resolved(P), (n, n), args.dtype,
                                                               args.reps))[1]
            row = {"n": n, "dtype": args.dtype, "target": name, "workers": P, "bytes_moved": moved,
                   "dmath_s": t_dmath, "raw_alltoall_s": t_raw,
                   "dmath_GBps": moved / t_dmath / 1e9 if t_dmath else None,
                   "raw_GBps": moved / t_raw / 1e9 if t_raw else None,
                   "ratio_raw_over_dmath": t_raw / t_dmath if t_dmath else None}
            results.append(row)
            print(f"P={P} n={n} RowBlock->{name:18s} moved {moved / 1e6:9.1f} MB  dmath {t_dmath * 1e3:8.2f} ms  "
                  f"raw {t_raw * 1e3:8.2f} ms  ratio {row['ratio_raw_over_dmath']:.2f}")
    write_json(args.out, {"benchmark": "remap", "env": environment(dmath), "results": results})


if __name__ == "__main__":
    main()
