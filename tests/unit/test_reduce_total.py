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
