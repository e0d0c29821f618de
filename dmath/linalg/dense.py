"""Local dense kernels of the factorizations: one switch between LAPACK (SciPy) and cuSOLVER (CuPy).

Everything in dmath.linalg that factors or solves a block on one worker
calls this module, never `scipy` or `cupy` directly, so that the blocked
algorithms are written once with the backend's array module `xp`.
CPU: `scipy.linalg.lapack` / `scipy.linalg` (SciPy: the `linalg` extra;
a DMathError says so when it is missing). GPU: cuSOLVER through CuPy (`cupy.linalg`,
`cupyx.scipy.linalg`, and `potrf` through CuPy's cuSOLVER bindings, which
report the failing minor in a device integer without a host
synchronisation).
"""
import numpy as np

from .. import backend
from ..errors import DMathError


def _scipy_linalg():
    """scipy.linalg (the CPU path's LAPACK), or a DMathError that says how to get it."""
    try:
        import scipy.linalg
        import scipy.linalg.blas  # noqa: F401
        import scipy.linalg.lapack  # noqa: F401
    except ImportError as exc:
        raise DMathError("dmath.linalg on the CPU needs SciPy (LAPACK): pip install 'dmath[linalg]' "
                         "or pip install scipy") from exc
    return scipy.linalg


def lapack_available():
    """Raise the DMathError of `_scipy_linalg` when the CPU path's SciPy is missing."""
    _scipy_linalg()


def _gpu():
    return backend.current().is_gpu


def potrf_lower(a):
    """Factor the square block `a` in place into its lower Cholesky factor (the strict upper part
    is zeroed); returns the LAPACK info (0, or the order of the first leading minor that is not
    positive definite) as a 0-d array of `a`'s backend, so a GPU caller need not wait for it."""
    if _gpu():
        return _potrf_gpu(a)
    lapack = _scipy_linalg().lapack
    potrf, = lapack.get_lapack_funcs(("potrf",), (a,))
    c, info = potrf(a, lower=1, clean=1, overwrite_a=0)
    a[...] = c
    return np.asarray(info)


def _potrf_gpu(a):
    import cupy
    from cupy_backends.cuda.libs import cublas, cusolver
    n = a.shape[0]
    work = cupy.ascontiguousarray(a)
    handle = cupy.cuda.device.get_cusolver_handle()
    cusolver.setStream(handle, cupy.cuda.get_current_stream().ptr)
    size_fn, fn = ((cusolver.dpotrf_bufferSize, cusolver.dpotrf) if a.dtype == np.float64
                   else (cusolver.spotrf_bufferSize, cusolver.spotrf))
    # a C-ordered array is its transpose in cuSOLVER's column-major view: the factor of the upper
    # triangle there is L in the lower triangle here
    upper = cublas.CUBLAS_FILL_MODE_UPPER
    lwork = size_fn(handle, upper, n, work.data.ptr, n)
    ws = cupy.empty(max(lwork, 1), dtype=a.dtype)
    info = cupy.zeros((), dtype=np.int32)
    fn(handle, upper, n, work.data.ptr, n, ws.data.ptr, lwork, info.data.ptr)
    a[...] = cupy.tril(work)
    return info


def getrf(a):
    """LU with partial pivoting of the (tall) block `a` in place: returns the 0-based LAPACK pivots
    `piv` as a host int array (row i was swapped with row piv[i], in order)."""
    if _gpu():
        from cupyx.scipy.linalg import lu_factor
        lu, piv = lu_factor(a, overwrite_a=False, check_finite=False)
        a[...] = lu
        return backend.current().asnumpy(piv).astype(np.int64)
    lapack = _scipy_linalg().lapack
    fn, = lapack.get_lapack_funcs(("getrf",), (a,))
    lu, piv, info = fn(a, overwrite_a=0)
    a[...] = lu
    return np.asarray(piv, dtype=np.int64)


def trsm_left(t, b, lower, unit=False, trans=False):
    """op(t)^-1 b for the triangular block t (op: transpose when `trans`); a new array.

    BLAS's trsm, which divides by a zero diagonal element (inf/nan) instead
    of raising: a kernel never raises for the data it is given; the master
    finds zero pivots from the diagonals the kernels return."""
    if _gpu():
        from cupyx.scipy.linalg import solve_triangular
        return solve_triangular(t, b, lower=lower, trans=1 if trans else 0, unit_diagonal=unit,
                                check_finite=False)
    fn, = _scipy_linalg().blas.get_blas_funcs(("trsm",), (t, b))
    return fn(1.0, t, b, side=0, lower=int(lower), trans_a=int(trans), diag=int(unit))


def trsm_right_lower_t(l, b):
    """b l^-T for the lower triangular block l (the Cholesky panel's L21 = A21 L11^-T)."""
    return trsm_left(l, b.T, lower=True).T


def householder(a):
    """Householder QR of the block `a` (m x w, m >= 1) in place: R in its upper triangle, the
    reflectors' vectors below it (unit diagonal implied); returns tau (w values)."""
    xp = backend.current().xp
    h, tau = xp.linalg.qr(a, mode="raw")
    # (NumPy and CuPy return the reflectors of LAPACK's geqrf in its column-major order: h is a^T)
    a[...] = h.T
    return tau.astype(a.dtype, copy=False)


def block_reflector(v, tau):
    """T of the compact WY form H_1 ... H_w = I - V T V^T (LAPACK's larft, forward, columnwise)
    for V with unit lower trapezoidal columns `v` (m x w) and `tau`.

    T^-1 = diag(1 / tau) + striu(V^T V) (Puglisi 1992; Joffrain et al. 2006): one product
    and one triangular solve on the device, no host loop. A tau of 0 (a reflector that is the
    identity, e.g. a column already zero below the diagonal) has no inverse there: then the
    recurrence T[:i, i] = -tau_i T[:i, :i] (V^T V)[:i, i] runs on the host instead."""
    be = backend.current()
    xp = be.xp
    gram = v.T @ v
    w = gram.shape[0]
    t_host = be.asnumpy(tau).astype(np.float64)
    if np.all(t_host != 0):
        inv_t = xp.triu(gram, 1)
        inv_t[xp.arange(w), xp.arange(w)] = 1 / xp.asarray(tau, dtype=v.dtype)
        return xp.ascontiguousarray(trsm_left(inv_t, xp.eye(w, dtype=v.dtype), lower=False)).astype(v.dtype)
    g = be.asnumpy(gram).astype(np.float64)
    T = np.zeros((w, w))
    for i in range(w):
        T[i, i] = t_host[i]
        if i:
            T[:i, i] = -t_host[i] * (T[:i, :i] @ g[:i, i])
    return be.asarray(T, dtype=v.dtype)


def qr_reduced(a):
    """(Q, R) of a tall block a (m >= n): Householder, Q with orthonormal columns."""
    return backend.current().xp.linalg.qr(a, mode="reduced")


def _finite(a, xp):
    # LAPACK refuses NaN and inf (SciPy checks); cuSOLVER returns NaN without a word: same refusal
    if not bool(xp.isfinite(a).all()):
        raise np.linalg.LinAlgError("the matrix holds NaN or inf")


def eigh(a, vectors=True):
    """Eigenvalues (ascending) and, when `vectors`, orthonormal eigenvectors of the symmetric block."""
    xp = backend.current().xp
    _finite(a, xp)
    if vectors:
        return xp.linalg.eigh(a)
    return xp.linalg.eigvalsh(a), None


def svd(a, vectors=True, full=False):
    """(U, s, Vh) of the block `a` (s descending), or (None, s, None) without vectors."""
    xp = backend.current().xp
    _finite(a, xp)
    if not vectors:
        return None, xp.linalg.svd(a, compute_uv=False), None
    return xp.linalg.svd(a, full_matrices=full)
