"""A tour of the layouts: distributed matrices remapped through every layout, checked against NumPy.

    mpiexec -n 4 python examples/remap_tour.py

Builds a random matrix on the workers, sends it through a chain of layouts
(with precision changes on the way), checks every stage against NumPy on the
master, and prints what each remap moved between the workers.
"""
import argparse
import sys

import numpy as np

import dmath


def moved(stats):
    return sum(s["data_bytes_recv"] for s in stats), sum(s["data_msgs_recv"] for s in stats)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--cols", type=int, default=700)
    parser.add_argument("--device", default=None, help="cpu or gpu (default: gpu if one is visible)")
    args = parser.parse_args()

    dmath.init(device=args.device)
    P = dmath.num_workers()
    m, n = args.rows, args.cols
    print(f"dmath on {P} worker(s), backend {dmath.device()}: a {m} x {n} matrix through every layout")

    dmath.random.seed(2026)
    A = dmath.random.randn((m, n), dtype="float64", layout=dmath.RowBlock())
    ref = A.to_numpy()
    chain = [
        ("ColBlock", dmath.ColBlock(), None),
        ("Block2D", dmath.Block2D(), "float32"),
        ("BlockCyclic 64x64", dmath.BlockCyclic((64, 64)), None),
        ("Tiles (3 x 2, round robin)", dmath.Tiles((0, m // 3, 2 * m // 3, m), (0, n // 2, n),
                                                   [[(i * 2 + j) % P for j in range(2)] for i in range(3)]), None),
        ("RowBlock, uneven sizes", dmath.RowBlock(sizes=[m - (P - 1) * (m // (2 * P))] + [m // (2 * P)] * (P - 1)),
         "float16"),
        ("Replicated", dmath.Replicated(), "float32"),
        ("RowBlock", dmath.RowBlock(), "float64"),
    ]
    tol = {"float16": 2e-3, "float32": 1e-6, "float64": 0.0}
    M, worst = A, "float64"
    print(f"{'to layout':30s} {'dtype':8s} {'bytes moved':>12s} {'messages':>9s} {'max |error|':>12s}")
    for name, layout, dtype in chain:
        dmath.reset_stats()
        M = M.remap(layout, dtype=dtype)
        nbytes, msgs = moved(dmath.stats())
        worst = dtype if dtype and np.dtype(dtype).itemsize < np.dtype(worst).itemsize else worst
        err = float(np.max(np.abs(M.to_numpy().astype(np.float64) - ref)))
        ok = err <= tol[worst] * max(1.0, float(np.max(np.abs(ref))))
        print(f"{name:30s} {str(M.dtype):8s} {nbytes:12d} {msgs:9d} {err:12.3g} {'ok' if ok else 'WRONG'}")
        if not ok:
            sys.exit(f"remap to {name} does not match NumPy")

    # arithmetic across layouts, a Partial sum, and reductions, all against NumPy
    B = dmath.from_numpy(ref, layout=dmath.ColBlock())
    C = A * 2.0 + B.T.T - dmath.exp(A * 0.0)            # ColBlock operand remapped to A's RowBlock
    np.testing.assert_allclose(C.to_numpy(), 3 * ref - 1, rtol=1e-12)
    colsum = A.sum(axis=0)                                # Partial: no communication yet
    np.testing.assert_allclose(colsum.to_numpy(), ref.sum(axis=0, keepdims=True), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(A.norm(), np.linalg.norm(ref), rtol=1e-12)
    np.testing.assert_allclose((A - A.sum(axis=0) / m).mean(axis=0).to_numpy(), 0.0, atol=1e-12)
    s = dmath.stats()
    print(f"arithmetic, broadcasting and reductions match NumPy; control traffic so far: "
          f"{s[0]['control_msgs']} commands, {s[0]['control_bytes']} bytes")
    print("remap tour: OK")


if __name__ == "__main__":
    main()
