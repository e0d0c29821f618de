"""Jacobi iteration for the Poisson equation, written with slicing, assignment and roll; checked against NumPy.

    mpiexec -n 2 python examples/jacobi.py [--n 48] [--sweeps 3000] [--form slices|roll] [--device cpu|gpu]

Solves -laplace(u) = f on the unit square with u = 0 on the boundary and
f = 2 pi^2 sin(pi x) sin(pi y) (exact solution sin(pi x) sin(pi y)) on an
n x n grid of points (boundary included, h = 1 / (n - 1)). A Jacobi sweep
replaces every interior value by the mean of its four neighbours plus
h^2 f / 4. It is written two ways, as a NumPy user would:

- slices: `u[1:-1, 1:-1] = 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2]
  + u[1:-1, 2:] + hf)`: each shifted slice is a remap that moves only the
  rows crossing a block boundary, and the write moves only what lands on
  another worker;
- roll: `u[:, :] = interior * (0.25 * (roll(u, 1, 0) + roll(u, -1, 0) +
  roll(u, 1, 1) + roll(u, -1, 1) + hf))`: on row blocks a roll along the rows
  sends one halo row to a neighbour and a roll along the columns moves
  nothing; `interior` (ones inside, zeros on the boundary) is `pad`'s.

One sweep is recorded (`dmath.record`) and replayed, so each further sweep
costs the master one message. The result is compared with the same sweeps
in NumPy (float64: equal to rounding) and with the exact solution.
"""
import argparse
import sys

import numpy as np

import dmath


def problem(n):
    """(h^2 f on the grid, exact solution), NumPy arrays of n x n."""
    x = np.linspace(0.0, 1.0, n)
    s = np.sin(np.pi * x)
    exact = np.outer(s, s)
    h = 1.0 / (n - 1)
    return h * h * 2 * np.pi ** 2 * exact, exact


def numpy_sweeps(hf, sweeps):
    """The reference: the same sweeps in NumPy (slices form)."""
    u = np.zeros_like(hf)
    inner = hf[1:-1, 1:-1]
    for _ in range(sweeps):
        u[1:-1, 1:-1] = 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] + inner)
    return u


def slices_sweep(u, inner):
    """One Jacobi sweep of `u` in place, NumPy's slice idiom (`inner`: h^2 f of the interior)."""
    u[1:-1, 1:-1] = 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] + inner)


def roll_sweep(u, hf, interior):
    """One Jacobi sweep of `u` in place with roll: the wrapped-around values fall on the boundary,
    which `interior` (zeros there) keeps at zero."""
    u[:, :] = interior * (0.25 * (dmath.roll(u, 1, 0) + dmath.roll(u, -1, 0) + dmath.roll(u, 1, 1)
                                  + dmath.roll(u, -1, 1) + hf))


def setup(hf_np, form, layout=None, dtype="float64"):
    """(u, the sweep as a function of no arguments) on the workers, for `form` 'slices' or 'roll'."""
    n = hf_np.shape[0]
    layout = layout or dmath.RowBlock()
    u = dmath.zeros((n, n), dtype, layout)
    if form == "slices":
        inner = dmath.from_numpy(hf_np[1:-1, 1:-1], dmath.RowBlock(), dtype=dtype)
        return u, lambda: slices_sweep(u, inner)
    hf = dmath.from_numpy(hf_np, layout, dtype=dtype)
    interior = dmath.pad(dmath.ones((n - 2, n - 2), dtype, layout), 1)
    return u, lambda: roll_sweep(u, hf, interior)


def run(hf_np, form, sweeps, layout=None):
    """u after `sweeps` sweeps: the first recorded, the others replays of it."""
    u, sweep = setup(hf_np, form, layout)
    if sweeps:
        with dmath.record() as plan:
            sweep()
        for _ in range(sweeps - 1):
            plan.replay()
    return u


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=48)
    parser.add_argument("--sweeps", type=int, default=3000)
    parser.add_argument("--form", choices=["slices", "roll"], default="slices")
    parser.add_argument("--device", default=None, help="cpu or gpu (default: gpu if one is visible)")
    args = parser.parse_args()
    dmath.init(device=args.device)
    n, sweeps = args.n, args.sweeps
    print(f"dmath on {dmath.num_workers()} worker(s), {dmath.device()}: Jacobi ({args.form}) on a {n} x {n} grid, "
          f"{sweeps} sweeps")
    hf, exact = problem(n)
    u = run(hf, args.form, sweeps).to_numpy()
    ref = numpy_sweeps(hf, sweeps)
    diff = float(np.abs(u - ref).max())
    err = float(np.abs(u - exact).max())
    print(f"max |dmath - NumPy| = {diff:.2e}; max |u - exact| = {err:.2e} (discretisation and iteration error)")
    ok = diff <= 1e-10 and err < 1e-2
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
