"""examples/jacobi.py's sweeps (slices and assignment; roll and pad) against the same sweeps in NumPy,
on several layouts of the grid, eager and replayed."""
import os
import sys

import numpy as np
import pytest

import dmath

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples"))
from jacobi import numpy_sweeps, problem, run, setup  # noqa: E402

P = dmath.num_workers()


@pytest.mark.parametrize("form", ["slices", "roll"])
@pytest.mark.parametrize("lay", [dmath.RowBlock(), dmath.Block2D(), dmath.BlockCyclic((3, 2)), dmath.ColBlock()])
def test_jacobi_sweeps_match_numpy(form, lay):
    hf, _ = problem(14)
    u = run(hf, form, 6, layout=lay)
    assert u.layout == lay.resolved(P)
    np.testing.assert_allclose(u.to_numpy(), numpy_sweeps(hf, 6), rtol=1e-13, atol=1e-15)


def test_jacobi_eager_sweeps_and_convergence():
    """Eager sweeps equal replayed ones; many sweeps approach the exact solution."""
    hf, exact = problem(10)
    u, sweep = setup(hf, "roll")
    for _ in range(3):
        sweep()
    np.testing.assert_allclose(u.to_numpy(), numpy_sweeps(hf, 3), rtol=1e-13, atol=1e-15)
    u = run(hf, "slices", 400)
    assert np.abs(u.to_numpy() - exact).max() < 2e-2
