"""NumPy float64 references and gradient checks for the dmath.nn tests.

The references are written the plain way (loops over output pixels) so that
they share nothing with the kernels' im2col and window views.
"""
import numpy as np

import dmath


# ---- batch layouts -------------------------------------------------------------------------
def batch_layouts(p):
    """{name: factory(n_rows) -> layout}: row layouts, a non-row one (remapped by dmath.nn), uneven
    and subset RowBlocks."""
    cases = {
        "row": lambda n: dmath.RowBlock(),
        "rep": lambda n: dmath.Replicated(),
        "col": lambda n: dmath.ColBlock(),
    }
    if p > 1:
        # every sample on the last worker, the others empty; a group of two workers in reverse order
        cases["row_last"] = lambda n: dmath.RowBlock(sizes=(0,) * (p - 1) + (n,))
        cases["row_sub"] = lambda n: dmath.RowBlock(group=[p - 1, 0])
        cases["rep_sub"] = lambda n: dmath.Replicated(group=[p - 1])
    return cases


# ---- forward references ----------------------------------------------------------------------
def log_softmax(x):
    z = x - x.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def softmax(x):
    return np.exp(log_softmax(x))


def cross_entropy(logits, labels):
    return -(labels * log_softmax(logits)).sum() / logits.shape[0]


def conv2d(x, w, b, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    """x (N, C, H, W), w (K, C/groups, kh, kw), b (K,) or None -> (N, K, Ho, Wo), by loops over outputs."""
    n, c, h, wd = x.shape
    k, cg, kh, kw = w.shape
    kg = k // groups
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    xp = np.zeros((n, c, h + 2 * ph, wd + 2 * pw))
    xp[:, :, ph:ph + h, pw:pw + wd] = x
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    y = np.zeros((n, k, ho, wo))
    for i in range(ho):
        for j in range(wo):
            patch = xp[:, :, i * sh:i * sh + dh * (kh - 1) + 1:dh, j * sw:j * sw + dw * (kw - 1) + 1:dw]
            for q in range(groups):
                y[:, q * kg:(q + 1) * kg, i, j] = np.einsum("ncab,kcab->nk", patch[:, q * cg:(q + 1) * cg],
                                                             w[q * kg:(q + 1) * kg])
    if b is not None:
        y += b.reshape(1, k, 1, 1)
    return y


def pool2d(x, kernel, stride, padding, mode):
    """x (N, C, H, W) -> (N, C, Ho, Wo); average counts the padding (count_include_pad)."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    fill = -np.inf if mode == "max" else 0.0
    xp = np.full((n, c, h + 2 * ph, w + 2 * pw), fill)
    xp[:, :, ph:ph + h, pw:pw + w] = x
    ho, wo = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    y = np.zeros((n, c, ho, wo))
    for i in range(ho):
        for j in range(wo):
            win = xp[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw]
            y[:, :, i, j] = win.max(axis=(2, 3)) if mode == "max" else win.sum(axis=(2, 3)) / (kh * kw)
    return y


def batchnorm(x, gamma, beta, channels, eps):
    """x (N, F) with F = channels * S -> (y, mean, biased var) with per-channel statistics."""
    x3 = x.reshape(x.shape[0], channels, -1)
    mean = x3.mean(axis=(0, 2))
    var = x3.var(axis=(0, 2))
    y = (x3 - mean[:, None]) / np.sqrt(var[:, None] + eps) * gamma.reshape(-1, 1) + beta.reshape(-1, 1)
    return y.reshape(x.shape), mean, var


# ---- gradient checks --------------------------------------------------------------------------
def numeric_grad(f, x, eps=1e-6):
    """The gradient of the scalar function f at x by central differences, element by element."""
    g = np.zeros_like(x, dtype=np.float64)
    x = x.astype(np.float64).copy()
    flat, gflat = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        keep = flat[i]
        flat[i] = keep + eps
        up = f(x)
        flat[i] = keep - eps
        down = f(x)
        flat[i] = keep
        gflat[i] = (up - down) / (2 * eps)
    return g


def directional_check(f, x, grad, seed, eps=1e-6, directions=2, rtol=1e-6):
    """Chainer's check: along random directions v, (f(x + eps v) - f(x - eps v)) / (2 eps) must equal
    <grad, v>. `f` takes a numpy array (it may run dmath operations)."""
    rng = np.random.default_rng(seed)
    for _ in range(directions):
        v = rng.standard_normal(x.shape)
        numeric = (f(x + eps * v) - f(x - eps * v)) / (2 * eps)
        analytic = float((grad * v).sum())
        assert abs(numeric - analytic) <= rtol * max(1.0, abs(analytic)), (numeric, analytic)
