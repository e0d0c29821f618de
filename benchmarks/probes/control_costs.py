"""Master microseconds per control frame over MPI, by the way it is sent (a diagnostic).

    mpiexec -n P python benchmarks/probes/control_costs.py [--frames 20000]

Rank 0 sends `frames` 64-byte frames to every other rank, which receive them
the matching way; each way is timed on rank 0 from its first send to its
last completion, then a barrier. Also the cost of one failure probe (Iprobe
that finds nothing).
"""
import argparse
import time

import numpy as np
from mpi4py import MPI


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=20000)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.rank, comm.size
    buf = np.zeros(64, np.uint8)
    n = args.frames
    rows = {}

    def timed(name, master, worker):
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(n):
            (master if rank == 0 else worker)()
        dt = time.perf_counter() - t0
        comm.Barrier()
        rows[name] = dt / n * 1e6

    timed("Ibcast + Wait", lambda: comm.Ibcast(buf, root=0).Wait(), lambda: comm.Ibcast(buf, root=0).Wait())
    timed("Bcast", lambda: comm.Bcast(buf, root=0), lambda: comm.Bcast(buf, root=0))

    def ibcast_test():
        req = comm.Ibcast(buf, root=0)
        while not req.Test():
            pass
    timed("Ibcast + Test loop", ibcast_test, ibcast_test)
    dests = list(range(1, size))

    def isend_all():
        MPI.Request.Waitall([comm.Isend(buf, dest=d, tag=7) for d in dests])
    timed("Isend to each + Waitall", isend_all, lambda: comm.Recv(buf, source=0, tag=7))
    if rank == 0:
        persistent = [comm.Send_init(buf, dest=d, tag=8) for d in dests]
    else:
        persistent = [comm.Recv_init(buf, source=0, tag=8)]

    def start_wait():
        MPI.Prequest.Startall(persistent)
        MPI.Request.Waitall(persistent)
    timed("persistent Startall + Waitall", start_wait, start_wait)
    timed("Iprobe (nothing there)", lambda: comm.Iprobe(source=MPI.ANY_SOURCE, tag=99), lambda: None)
    if rank == 0:
        print(f"{size} ranks, {MPI.Get_library_version().splitlines()[0]}")
        for k, v in rows.items():
            print(f"{k:34s} {v:7.2f} us")


if __name__ == "__main__":
    main()
