"""concatenate, hstack, vstack, block, pad and roll against NumPy, on every layout; roll's halos."""
import numpy as np
import pytest

import dmath
from dmath.layout import distribution

from _cases import case_names, layout, make, tol, values

P = dmath.num_workers()
NAMES = case_names(P)
DTYPES = ["float16", "float32", "float64"]


def _rot(k, shape, off=0):
    return layout(NAMES[(k + off) % len(NAMES)], shape, P)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("k", range(len(NAMES)))
def test_concatenate_every_layout(k, axis):
    """Three matrices in three layouts and dtypes (promoted as NumPy: float16 + float32 = float32)."""
    shapes = [(3, 5), (4, 5), (1, 5)] if axis == 0 else [(5, 3), (5, 4), (5, 1)]
    xs = [values(s, 20 + i) for i, s in enumerate(shapes)]
    dts = ["float16", "float32", "float16"]
    ms = [make(x, _rot(k, s, 4 * i), d) for i, (x, s, d) in enumerate(zip(xs, shapes, dts))]
    out = dmath.concatenate(ms, axis=axis)
    assert out.dtype == "float32"
    e = np.concatenate([x.astype(d) for x, d in zip(xs, dts)], axis=axis)
    np.testing.assert_allclose(out.to_numpy(), e, **tol("float32"))
    for m, x, d in zip(ms, xs, dts):
        np.testing.assert_allclose(m.to_numpy(), x.astype(d), **tol(d))


def test_concatenate_layout_choice_and_request():
    a, b = values((4, 6), 1), values((2, 6), 2)
    A = make(a, dmath.RowBlock(sizes=(4,) + (0,) * (P - 1)), "float64")
    B = make(b, dmath.Tiles((0, 1, 2), (0, 6), [[0], [P - 1]]), "float64")
    out = dmath.vstack([A, B])
    assert out.layout == dmath.RowBlock().resolved(P)          # the first one's kind, without its sizes
    # Tiles -> RowBlock over the Tiles' workers
    assert dmath.vstack([B, A]).layout == dmath.RowBlock(group=sorted({0, P - 1})).resolved(P)
    np.testing.assert_array_equal(out.to_numpy(), np.vstack([a, b]))
    out = dmath.hstack([A.T, B.T], layout=dmath.BlockCyclic((2, 2)), dtype="float32")
    assert out.layout == dmath.BlockCyclic((2, 2)).resolved(P) and out.dtype == "float32"
    np.testing.assert_allclose(out.to_numpy(), np.hstack([a.T, b.T]), **tol("float32"))
    C = make(values((3, 6), 3), dmath.BlockCyclic((2, 3)), "float64")
    assert dmath.vstack([C, A]).layout == dmath.BlockCyclic((2, 3)).resolved(P)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", range(0, len(NAMES), 2))
def test_block_nested_and_flat(k, dtype):
    a, b, c, d = values((2, 3), 5), values((2, 4), 6), values((5, 3), 7), values((5, 4), 8)
    mats = [make(x, _rot(k, x.shape, i), dtype) for i, x in enumerate((a, b, c, d))]
    out = dmath.block([[mats[0], mats[1]], [mats[2], mats[3]]])
    np.testing.assert_allclose(out.to_numpy(), np.block([[a, b], [c, d]]).astype(dtype), **tol(dtype))
    out = dmath.block([mats[0], mats[1]])
    np.testing.assert_allclose(out.to_numpy(), np.block([a, b]).astype(dtype), **tol(dtype))


BUILD_BAD = {
    "concat_shape": (lambda A, B: dmath.concatenate([A, B], axis=1), dmath.ShapeError),
    "concat_empty": (lambda A, B: dmath.concatenate([]), dmath.ShapeError),
    "concat_item": (lambda A, B: dmath.vstack([A, np.zeros((2, 3))]), dmath.DMathError),
    "concat_not_list": (lambda A, B: dmath.vstack(A), dmath.DMathError),
    "concat_axis": (lambda A, B: dmath.concatenate([A, A], axis=2), dmath.ShapeError),
    "concat_axis_float": (lambda A, B: dmath.concatenate([A, A], axis=0.0), dmath.DMathError),
    "block_heights": (lambda A, B: dmath.block([[A, B]]), dmath.ShapeError),
    "block_widths": (lambda A, B: dmath.block([[A], [B]]), dmath.ShapeError),
    "block_mixed": (lambda A, B: dmath.block([A, [B]]), dmath.ShapeError),
    "block_empty": (lambda A, B: dmath.block([]), dmath.DMathError),
    "pad_negative": (lambda A, B: dmath.pad(A, -1), dmath.ShapeError),
    "pad_float": (lambda A, B: dmath.pad(A, 1.5), dmath.ShapeError),
    "pad_form": (lambda A, B: dmath.pad(A, (1, 2, 3)), dmath.ShapeError),
    "pad_mode": (lambda A, B: dmath.pad(A, 1, mode="mean"), dmath.NotSupportedError),
    "pad_values": (lambda A, B: dmath.pad(A, 1, mode="edge", constant_values=3), dmath.DMathError),
    "pad_empty_edge": (lambda A, B: dmath.pad(dmath.zeros((0, 3)), 1, mode="edge"), dmath.ShapeError),
    "roll_axes": (lambda A, B: dmath.roll(A, (1, 2), axis=0), dmath.ShapeError),
    "roll_axis": (lambda A, B: dmath.roll(A, 1, axis=3), dmath.ShapeError),
    "roll_shift": (lambda A, B: dmath.roll(A, 1.5, axis=0), dmath.DMathError),
    "roll_matrix": (lambda A, B: dmath.roll(np.zeros((2, 2)), 1), dmath.DMathError),
}


@pytest.mark.parametrize("case", sorted(BUILD_BAD))
def test_build_errors_raise_on_the_master(case):
    fn, error = BUILD_BAD[case]
    a, b = values((2, 3), 9), values((3, 4), 10)
    A, B = make(a, dmath.RowBlock(), "float64"), make(b, dmath.ColBlock(), "float64")
    s0 = dmath.stats()
    with pytest.raises(error):
        fn(A, B)
    if case != "pad_empty_edge":
        assert dmath.stats()[0]["control_msgs"] - s0[0]["control_msgs"] == 1
    np.testing.assert_array_equal(A.to_numpy(), a)


PAD_CASES = [(2, "constant", {}), ((1, 3), "constant", {"constant_values": 2.5}),
             (((2, 0), (1, 4)), "constant", {"constant_values": ((1, 2), (3, 4))}),
             (((2, 1), (3, 2)), "edge", {}), (((4, 1), (0, 9)), "wrap", {}),
             (((3, 2), (2, 3)), "reflect", {}), (((3, 12), (8, 1)), "symmetric", {})]


@pytest.mark.parametrize("case", range(len(PAD_CASES)))
@pytest.mark.parametrize("k", range(len(NAMES)))
def test_pad_every_layout(k, case):
    width, mode, kw = PAD_CASES[case]
    dtype = DTYPES[(k + case) % 3]
    xv = values((5, 4), 30 + k)
    m = make(xv, layout(NAMES[k], (5, 4), P), dtype)
    out = dmath.pad(m, width, mode=mode, **kw)
    e = np.pad(xv.astype(dtype), width, mode=mode, **kw)
    assert out.shape == e.shape and out.dtype == dtype
    np.testing.assert_allclose(out.to_numpy(), e, **tol(dtype))


@pytest.mark.parametrize("constants", [((5, 5), (0, 0)), ((5, -0.0), (-0.0, 7)), ((np.nan, np.inf), (-0.0, 7)),
                                       ((-0.0, -0.0), (0, 0)), ((0, 0), (0, 0))])
@pytest.mark.parametrize("name", ["row", "bc23", "rep"])
def test_pad_constants_zero_and_signed_zero_as_numpy(name, constants):
    """A zero column constant over nonzero row constants was skipped (the corners kept the row's
    value, NumPy's are the column's), and a -0.0 constant came out +0.0: bit for bit NumPy's now."""
    xv = values((4, 3), 41)
    m = make(xv, layout(name, (4, 3), P), "float64")
    got = dmath.pad(m, 1, constant_values=constants).to_numpy()
    want = np.pad(xv, 1, constant_values=constants)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_pad_layout_request_and_zero_width():
    xv = values((6, 5), 40)
    m = make(xv, dmath.RowBlock(), "float64")
    out = dmath.pad(m, ((1, 1), (0, 0)), mode="wrap", layout=dmath.BlockCyclic((2, 2)))
    assert out.layout == dmath.BlockCyclic((2, 2)).resolved(P)
    np.testing.assert_array_equal(out.to_numpy(), np.pad(xv, ((1, 1), (0, 0)), mode="wrap"))
    np.testing.assert_array_equal(dmath.pad(m, 0).to_numpy(), xv)


ROLLS = [(3, None), (-17, None), (2, 0), (-1, 0), (11, 0), (3, 1), (-8, 1), ((1, -2), (0, 1)), ((2, 3), (1, 1)),
         (5, (0, -1))]


@pytest.mark.parametrize("case", range(len(ROLLS)))
@pytest.mark.parametrize("k", range(len(NAMES)))
def test_roll_every_layout(k, case):
    shift, axis = ROLLS[case]
    dtype = DTYPES[(k + case) % 3]
    xv = values((7, 6), 50 + k)
    lay = layout(NAMES[k], (7, 6), P)
    m = make(xv, lay, dtype)
    out = dmath.roll(m, shift, axis)
    assert out.layout == m.layout and out.dtype == dtype
    np.testing.assert_allclose(out.to_numpy(), np.roll(xv.astype(dtype), shift, axis), **tol(dtype))


def test_roll_empty_and_whole_turns():
    z = dmath.zeros((0, 4))
    assert dmath.roll(z, 3).shape == (0, 4) and dmath.roll(z, 3, axis=1).shape == (0, 4)
    xv = values((4, 3), 60)
    m = make(xv, dmath.Block2D(), "float64")
    np.testing.assert_array_equal(dmath.roll(m, 12).to_numpy(), xv)
    np.testing.assert_array_equal(dmath.roll(m, (4, 3), axis=(0, 1)).to_numpy(), xv)


@pytest.mark.parametrize("lay_axis", [("row", 0, 1), ("row", 0, -2), ("row", 1, 1), ("col", 1, 1), ("col", 0, 2),
                                      ("b2d", 0, 1), ("b2d", 1, -1)])
def test_roll_exchanges_halos_between_neighbours(lay_axis):
    """A roll by less than a block: each worker sends its boundary strip to one neighbour (and
    nothing else): the bytes are those of the halo, one message per worker at most."""
    name, axis, shift = lay_axis
    shape = (6 * P, 5 * P)
    xv = values(shape, 70)
    m = make(xv, layout(name, shape, P), "float64")
    dist = distribution(m.layout, shape, P)
    dmath.reset_stats()
    out = dmath.roll(m, shift, axis)
    st = dmath.stats()
    for r in range(P):
        mask = dist.owner_mask(r)
        halo = int((mask & ~np.roll(mask, shift, axis)).sum())     # elements arriving from another worker
        assert st[r]["data_bytes_recv"] == 8 * halo
        assert st[r]["data_msgs_sent"] <= 1 and st[r]["data_msgs_recv"] <= 1
    np.testing.assert_array_equal(out.to_numpy(), np.roll(xv, shift, axis))


def test_roll_partial_rolls_addends_without_traffic():
    xv = values((5, 4), 80)
    m = make(xv, dmath.Partial(), "float64")
    dmath.reset_stats()
    out = dmath.roll(m, (1, 2), axis=(0, 1))
    assert sum(s["data_bytes_recv"] for s in dmath.stats()) == 0
    assert out.layout == m.layout
    np.testing.assert_allclose(out.to_numpy(), np.roll(xv, (1, 2), axis=(0, 1)), rtol=1e-12)


def test_roll_and_pad_in_a_recorded_plan():
    xv = values((8, 6), 90)
    m = make(xv, dmath.RowBlock(), "float64")
    with dmath.record() as plan:
        r = dmath.roll(m, 1, axis=0) + dmath.roll(m, -1, axis=1)
        p = dmath.pad(m, 1, mode="edge")
    np.testing.assert_allclose(r.to_numpy(), np.roll(xv, 1, 0) + np.roll(xv, -1, 1), rtol=1e-12)
    yv = values((8, 6), 91)
    m.assign(yv)
    plan.replay()
    np.testing.assert_allclose(r.to_numpy(), np.roll(yv, 1, 0) + np.roll(yv, -1, 1), rtol=1e-12)
    np.testing.assert_array_equal(p.to_numpy(), np.pad(yv, 1, mode="edge"))
