"""Differentiable elementwise functions of one operand, each derived from its dmath definition.

A dmath elementwise function defined with a gradient (`function(..., grad=...)`
in `dmath/ops/elementwise.py`; the public function carries it, as
`dmath.tanh.grad`) is differentiable here by naming it: a subclass of
`Elementwise` whose `name` is the dmath function's name. The forward pass is
the dmath function and the backward pass its gradient, so the two are
defined in one place.
"""
import dmath

from ..graph.function import Function


class Elementwise(Function):
    """y = f(x), f the dmath elementwise function called `name` (which must have a gradient)."""
    keeps_channels_last = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        f = getattr(dmath, cls.name, None)
        if getattr(f, "grad", None) is None:
            raise TypeError(f"{cls.__name__}: dmath has no elementwise function {cls.name!r} with a gradient")
        cls.f = staticmethod(f)

    def forward(self, x):
        return self.f(x)

    def backward(self, xs, y, gy, needs):
        return (self.f.grad(xs[0], y, gy),)
