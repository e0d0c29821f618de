"""MagmaDNN's graph example: minimize x^2 + c with the op API and an optimizer.

    python examples/graph_minimize.py            (or under mpiexec -n P)

The expression is a graph of nodes over dmath matrices; `eval()` computes it
on the workers and `optimizer.minimize(expr, [x])` takes one gradient step.
"""
import dmath
import dnn
from dnn import graph as G


def main():
    dmath.init()                                     # ranks > 0 serve from here on
    x = G.var("x", (1, 1), init=5.0)                 # MagmaDNN: op::var<float>("x", {1}, {CONSTANT, {5}})
    c = G.constant(3.0)
    expr = G.add(G.pow(x, 2), c)                     # or: x ** 2 + c
    print(f"start: x = {x.value.get((0, 0)):.4f}, x^2 + c = {expr.eval().get((0, 0)):.4f}")
    opt = dnn.optim.SGD(lr=0.1)
    for step in range(1, 51):
        opt.minimize(expr, [x])
        if step % 10 == 0:
            print(f"step {step:3d}: x = {x.value.get((0, 0)):+.6f}, x^2 + c = {expr.eval().get((0, 0)):.6f}")
    assert abs(expr.eval().get((0, 0)) - 3.0) < 1e-6, "x^2 + c should reach its minimum c = 3"


if __name__ == "__main__":
    main()
