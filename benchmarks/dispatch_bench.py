"""The master's dispatch cost per command: first send of a signature versus its cached ID.

    mpiexec -n 4 python benchmarks/dispatch_bench.py [--device gpu] [--out F.json]

"first send": every command has a new signature (a different shape each
time), so the whole signature is pickled, broadcast and registered on every
worker. "cached": the same signature repeated, so only its ID, the handle
numbers and the scalars travel. Both run the same tiny elementwise kernel;
the figures are microseconds of master time per command (the master's share
of the kernel included) and control bytes per command as counted by
dmath.stats().
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dmath                             # noqa: E402
from common import environment, write_json  # noqa: E402
from dmath.comm.control import FRAME       # noqa: E402


def per_command(fn, count):
    dmath.synchronize()
    dmath.reset_stats()
    t0 = time.perf_counter()
    fn(count)
    elapsed = time.perf_counter() - t0
    s = dmath.stats()[0]
    # the stats command's own control frame is not part of the measurement
    return elapsed / count * 1e6, (s["control_bytes"] - FRAME) / count, (s["control_msgs"] - 1) / count


def main():
    ap = argparse.ArgumentParser(description="dispatch cost: first send versus cached ID")
    ap.add_argument("--device", default=None)
    ap.add_argument("--count", type=int, default=400)
    ap.add_argument("--out", default="benchmarks/out/dispatch.json")
    args = ap.parse_args()
    dmath.init(device=args.device)
    P = dmath.num_workers()
    n = args.count
    mats = [dmath.ones((4, 4 + k), layout=dmath.Replicated()) for k in range(n)]
    same = dmath.ones((4, 4), layout=dmath.Replicated())

    def first(count):
        for k in range(count):
            mats[k] * 2.0                 # a new shape each time: a new signature

    def cached(count):
        for _ in range(count):
            same * 2.0                    # the same signature: ID + 2 handles + 1 scalar

    us_first, bytes_first, msgs_first = per_command(first, n)
    cached(10)
    us_cached, bytes_cached, msgs_cached = per_command(cached, n)
    result = {"workers": P, "commands": n,
              "first_send": {"us_per_command": us_first, "control_bytes_per_command": bytes_first,
                             "control_msgs_per_command": msgs_first},
              "cached_id": {"us_per_command": us_cached, "control_bytes_per_command": bytes_cached,
                            "control_msgs_per_command": msgs_cached},
              "speedup_cached_over_first": us_first / us_cached}
    print(f"P={P} first send: {us_first:8.1f} us/command {bytes_first:7.1f} control bytes/command")
    print(f"P={P} cached ID:  {us_cached:8.1f} us/command {bytes_cached:7.1f} control bytes/command")
    write_json(args.out, {"benchmark": "dispatch", "env": environment(dmath), "results": result})


if __name__ == "__main__":
    main()
