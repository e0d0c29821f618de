"""reduce_all's master-side sum of the workers' (s, e) parts (dmath.ops.reductions._total, pure)."""
import math

import numpy as np

from dmath.ops.reductions import _piece_sum, _total


def test_plain_parts_add_as_before():
    assert _total([(0.0, 0), (1.5, 0), (-0.5, 0)]) == 1.0
    assert math.copysign(1.0, _total([(0.0, 0), (-0.0, 0)])) == 1.0     # 0.0 + -0.0, as the old sum


def test_scaled_parts_add_without_an_overflow_the_total_lacks():
    big = _piece_sum(np, np.array([1e308, 1e308, 1e308]))
    assert big[1] > 0 and math.isfinite(big[0])
    neg = _piece_sum(np, np.array([-1e308, -1e308, -1e308]))
    assert _total([(0.0, 0), big, neg]) == 0.0
    assert _total([(0.0, 0), big, neg, (2.5, 0)]) == 2.5
    assert _total([(0.0, 0), (1e308, 0), (1e308, 0), (-1e308, 0)]) == 1e308      # the running sum overflowed
    assert _total([(0.0, 0), big]) == math.inf and _total([(0.0, 0), neg]) == -math.inf


def test_an_inf_or_nan_in_the_data_gives_the_ieee_sum():
    assert _piece_sum(np, np.array([np.inf, 1e308, 1e308])) == (math.inf, 0)
    assert math.isnan(_total([(0.0, 0), (math.inf, 0), _piece_sum(np, np.array([-1e308, -1e308]))]))
    assert math.isnan(_total([(0.0, 0), (math.nan, 0), (1.0, 0)]))
    assert _total([(0.0, 0), (math.inf, 0), (1e308, 0), (1e308, 0)]) == math.inf


def test_root_sum_squares_of_scaled_parts():
    """The Frobenius norm's parts (_piece_sumsq): plain where the squares stay in float64, scaled by a
    power of two where they under- or overflow; the root is taken before scaling back."""
    import math

    import numpy as np

    from dmath.ops.reductions import _piece_sumsq, _root_sum_squares
    rng = np.random.default_rng(3)
    for scale in (1e-300, 1e-160, 1.0, 1e160, 1e300):
        a = rng.standard_normal((20, 5)) * scale
        parts = [_piece_sumsq(np, a[:7]), _piece_sumsq(np, a[7:]), _piece_sumsq(np, np.zeros((2, 2)))]
        assert math.isclose(_root_sum_squares(parts), np.linalg.norm(a / scale) * scale, rel_tol=1e-14)
        assert all(e % 2 == 0 for _, e in parts)
    assert _piece_sumsq(np, np.ones((2, 2))) == (4.0, 0)                 # the plain sum where it holds
    assert _root_sum_squares([]) == 0.0
    assert _root_sum_squares([_piece_sumsq(np, np.array([[1.5e308, 1.5e308]]))]) == math.inf
    assert math.isnan(_root_sum_squares([_piece_sumsq(np, np.array([[np.nan, 1.0]]))]))
    assert _root_sum_squares([_piece_sumsq(np, np.array([[np.inf, 1e-300]]))]) == math.inf
