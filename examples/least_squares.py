"""Least squares and PCA with dmath.linalg, each checked against its known answer and NumPy.

    mpiexec -n 4 python examples/least_squares.py [--rows 200000] [--degree 12] [--device cpu]

1. A curve fit with a known answer: m noisy samples of a function that is a
   Chebyshev series of known coefficients c. The m x (d + 1) design matrix
   lives on the workers in row blocks; `lstsq` solves it by TSQR (one
   reduction of the small R factors). The coefficients must come back within
   the noise's reach of c (and equal NumPy's lstsq to 1e-10); the normal
   equations solved by Cholesky (`cho_solve`) and by conjugate gradients
   (`cg`) must agree with it.
2. PCA of real handwritten digits (the MNIST subset dnn ships a loader for,
   when it is available here): the leading singular values of the centred
   5,000 x 784 data by `svd` (TSQR, then the 784 x 784 R on one worker) and
   by the randomized `svds`, checked against NumPy's SVD.
"""
import argparse
import sys

import numpy as np

import dmath
from dmath import linalg as la


def curve_fit(m, degree, rng):
    t = np.cos(np.pi * (np.arange(m) + 0.5) / m)                 # Chebyshev nodes in [-1, 1]
    c_true = rng.standard_normal(degree + 1) / (1 + np.arange(degree + 1))
    V = np.polynomial.chebyshev.chebvander(t, degree)              # m x (d + 1)
    noise = 1e-3
    y = V @ c_true + noise * rng.standard_normal(m)

    A = dmath.from_numpy(V, dtype="float64", layout=dmath.RowBlock())
    b = dmath.from_numpy(y[:, None], dtype="float64", layout=dmath.RowBlock())
    x, residuals, rank, s = la.lstsq(A, b)
    c = x.to_numpy()[:, 0]
    # the coefficients' standard error is about noise * sqrt(2 / m) per coefficient at Chebyshev nodes
    bound = 10 * noise * np.sqrt(2.0 / m)
    err = np.abs(c - c_true).max()
    print(f"lstsq: rank {rank}, cond {s[0] / s[-1]:.1f}, max |c - c_true| = {err:.2e} (bound {bound:.2e}), "
          f"residual^2 {residuals[0]:.4g} (expected about {m * noise ** 2:.4g})")
    ok = err < bound and rank == degree + 1
    c_np = np.linalg.lstsq(V, y, rcond=None)[0]
    ok &= np.allclose(c, c_np, rtol=1e-10, atol=1e-10)

    # normal equations: (A^T A) c = A^T b, by Cholesky and by CG (A^T A is (d+1) x (d+1))
    G = dmath.gemm(A, A, trans_a=True, layout=dmath.Replicated())
    h = dmath.gemm(A, b, trans_a=True, layout=dmath.Replicated())
    c_chol = la.cho_solve((la.cholesky(G), True), h).to_numpy()[:, 0]
    c_cg, info = la.cg(G, h, tol=1e-13)
    c_cg = c_cg.to_numpy()[:, 0]
    print(f"normal equations: Cholesky differs by {np.abs(c_chol - c).max():.1e}, CG ({info}) by "
          f"{np.abs(c_cg - c).max():.1e}")
    ok &= np.abs(c_chol - c).max() < 1e-8 and info == 0 and np.abs(c_cg - c).max() < 1e-6
    return ok


def pca_digits(k):
    try:
        import dnn
        x, _ = dnn.data.load_mnist_5k()
    except Exception as exc:          # noqa: BLE001  (the data set is optional here)
        print(f"PCA skipped: the MNIST subset is not available ({exc})")
        return True
    X = x.reshape(len(x), -1).astype(np.float64) / 255.0
    Xc = X - X.mean(axis=0)
    D = dmath.from_numpy(Xc, dtype="float64", layout=dmath.RowBlock())
    U, s, Vh = la.svd(D)
    s_np = np.linalg.svd(Xc, compute_uv=False)
    explained = (s[:k] ** 2).sum() / (s ** 2).sum()
    _, s_r, _ = la.svds(D, k=k, n_iter=4)
    print(f"PCA of {X.shape[0]} digits: the first {k} components explain {100 * explained:.1f}% of the variance; "
          f"svd's values differ from NumPy's by {np.abs(s - s_np).max() / s_np[0]:.1e} (relative), "
          f"svds' top {k} by {np.abs(s_r - s_np[:k]).max() / s_np[0]:.1e}")
    return np.allclose(s, s_np, rtol=1e-10, atol=1e-10 * s_np[0]) and np.allclose(s_r, s_np[:k], rtol=1e-3)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200000)
    parser.add_argument("--degree", type=int, default=12)
    parser.add_argument("--components", type=int, default=10)
    parser.add_argument("--device", default=None, help="cpu or gpu (default: gpu if one is visible)")
    args = parser.parse_args()
    dmath.init(device=args.device)
    print(f"{dmath.num_workers()} workers on {dmath.device()}")
    ok = curve_fit(args.rows, args.degree, np.random.default_rng(0))
    ok &= pca_digits(args.components)
    print("all checks passed" if ok else "CHECK FAILED")
    dmath.finalize()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
