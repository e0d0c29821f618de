"""The op unit registry: typed static arguments, kernels by backend, capture hooks (no MPI)."""
from typing import NamedTuple

import pytest

from dmath.runtime import registry


class _Args(NamedTuple):
    axis: int
    mode: str


def _fresh(name):
    registry.OPS.pop(name, None)
    return registry.define(name, _Args)


def test_static_arguments_are_named_and_checked():
    op = _fresh("test_typed")
    args = op.static(axis=1, mode="local")
    assert args.axis == 1 and args.mode == "local"
    assert args == (1, "local") and hash(args) == hash((1, "local"))   # a signature key like a tuple
    with pytest.raises(TypeError, match="axis"):
        op.static(axis="1", mode="local")
    with pytest.raises(TypeError):
        op.static(axis=1)                       # a missing argument


def test_kernels_are_keyed_by_backend():
    op = _fresh("test_backends")
    generic = op.kernel(capturable=True)(lambda call: "generic")
    gpu = op.kernel(backend="gpu")(lambda call: "gpu")
    assert registry.lookup("test_backends", "cpu") == (generic, True)
    assert registry.lookup("test_backends", "gpu") == (gpu, False)
    assert registry.generic("test_backends") is generic
    with pytest.raises(ValueError):
        op.kernel()(lambda call: None)          # a second generic kernel
    with pytest.raises(ValueError):
        registry.define("test_backends")        # defined twice
    with pytest.raises(KeyError):
        registry.lookup("test_no_such_op", "cpu")


def test_a_backend_only_op_has_no_generic_fallback():
    op = _fresh("test_gpu_only")
    op.kernel(backend="gpu")(lambda call: None)
    with pytest.raises(KeyError, match="cpu"):
        op.lookup("cpu")


def test_capture_hooks_run_once_each_in_order(monkeypatch):
    monkeypatch.setattr(registry, "CAPTURE_HOOKS", {})    # not the library hooks (cuBLAS needs a GPU)
    ran = []
    first = registry.capture_hook(lambda lanes: ran.append((1, lanes)))
    registry.capture_hook(first)                 # registering twice runs it once
    registry.capture_hook(lambda lanes: ran.append((2, lanes)))
    registry.prepare_capture()
    registry.prepare_capture(3)                  # each is told the streams of the capture
    assert ran == [(1, 1), (2, 1), (1, 3), (2, 3)]


def test_every_public_elementwise_function_is_one_definition():
    import dmath
    from dmath.ops import elementwise
    for name in elementwise.PUBLIC:
        f = getattr(dmath, name)
        assert f is getattr(elementwise, name) and name in dmath.__all__
        assert f.__doc__ and name in elementwise.FUNCTIONS


def test_the_public_names_come_from_the_definitions():
    import dmath
    from dmath.ops import elementwise
    # the operators' functions are reached through Matrix's operators only, add_n's passes through add_n
    operators = {"add", "sub", "mul", "div", "neg", "add3", "add4"}
    assert set(elementwise.PUBLIC) == set(elementwise.FUNCTIONS) - operators
    assert not operators & set(dmath.__all__) and "add_n" in dmath.__all__
    assert len(dmath.__all__) == len(set(dmath.__all__))
    for name in dmath.__all__:
        assert getattr(dmath, name) is not None, name
    for name in ("init", "Matrix", "gemm", "Tiles", "WorkerError", "record", "random", "memory", "nn"):
        assert name in dmath.__all__, name


def test_every_module_under_dmath_ops_is_imported_with_dmath():
    # kernels are found by walking the package: one in a new file registers without being listed
    import os
    import sys

    import dmath
    root = os.path.dirname(dmath.ops.__file__)
    for base, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(base, name), root)[:-3].replace(os.sep, ".")
                module = "dmath.ops" + ("" if rel == "__init__" else "." + rel.removesuffix(".__init__"))
                assert module in sys.modules, module
