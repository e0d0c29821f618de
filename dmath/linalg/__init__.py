"""dmath.linalg: factorizations, solvers, eigenvalues and singular values on distributed matrices.

NumPy/SciPy names and conventions; any input layout (each function remaps
its inputs into the layout its algorithm runs in); float32 and float64
(float16 is refused); everything stays on the workers (matrices in, matrices
out; only small results such as eigenvalues, pivots or a determinant reach
the master as NumPy values). See docs/linalg.md.

    cholesky, solve_triangular, cho_solve, solve, lu, inv, det, slogdet   (decompose.py, factor.py)
    qr, lstsq                                                           (decompose.py, tsqr.py)
    eigh, eigvalsh, svd, svdvals, eigsh, svds, norm                     (spectral.py)
    cg                                                                  (krylov.py)
    diag, triu, tril, trace: the structure ops (dmath/ops/structure.py), named here too as NumPy's
"""
from ..errors import LinAlgError
from .checks import DEFAULT_BLOCK
from .decompose import cho_solve, cholesky, det, inv, lstsq, lu, qr, slogdet, solve, solve_triangular
from .krylov import cg
from .spectral import eigh, eigsh, eigvalsh, norm, svd, svds, svdvals
from ..ops.structure import diag, trace, tril, triu

__all__ = ["LinAlgError", "cholesky", "solve_triangular", "cho_solve", "solve", "lu", "inv", "det", "slogdet",
           "qr", "lstsq", "eigh", "eigvalsh", "svd", "svdvals", "eigsh", "svds", "cg", "norm", "diag", "triu", "tril", "trace",
           "DEFAULT_BLOCK"]
