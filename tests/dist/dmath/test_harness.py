"""The op-case harness itself (tests/dist/_harness.py): cases against NumPy, and backend kernels
checked against the generic kernel of the same command (here through test ops whose backend
kernels are right, and off by one part in a thousand)."""
import numpy as np
import pytest

import dmath

from _cases import case_names, layout, make, values
from _harness import Failures, check_cases, kernels_checked, twice

P = dmath.num_workers()
NAMES = case_names(P)
SHAPE = (7, 5)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("name", NAMES)
def test_a_backend_kernel_that_agrees_with_the_generic_one_passes(name, dtype):
    x = values(SHAPE, 3)
    a = make(x, layout(name, SHAPE, P), dtype)
    check_cases([("twice", lambda: twice(a), 2 * x.astype(dtype)),
                 ("twice, then an elementwise function", lambda: dmath.exp(twice(a) * 0.5), np.exp(x))],
                dtype)


@pytest.mark.parametrize("name", NAMES)
def test_a_backend_kernel_off_by_a_little_is_caught(name):
    # the report names the kernel, the worker and the output (besides the values NumPy disagrees with)
    x = values(SHAPE, 4)
    a = make(x, layout(name, SHAPE, P), "float32")
    with pytest.raises(AssertionError, match=r"twice: test_twice_wrong on worker \d+, output 0"):
        check_cases([("twice", lambda: twice(a, wrong=True), 2 * x.astype("float32"))], "float32")


def test_kernels_are_compared_only_inside_the_block():
    a = make(values(SHAPE, 5), layout("row", SHAPE, P), "float64")
    twice(a, wrong=True)                 # outside: the backend's kernel alone, nothing noted
    failures = Failures()
    with kernels_checked(failures):
        twice(a)
    failures.check()
    with kernels_checked(failures, "wrong"):
        twice(a, wrong=True)
    # every worker holds rows of the 7 x 5 RowBlock matrix, and each one's kernel is off
    assert [line.split(":")[1].strip() for line in sorted(failures.lines)] == \
        [f"test_twice_wrong on worker {r}, output 0 piece 0" for r in range(P)], failures.lines


def test_failures_report_every_failing_case():
    failures = Failures()
    for k in range(3):
        with failures.case(f"case {k}"):
            assert k != 1, "one is wrong"
            if k == 2:
                raise ValueError("two is wrong too")
    with pytest.raises(AssertionError) as info:
        failures.check()
    assert "case 1: AssertionError: one is wrong" in str(info.value)
    assert "case 2: ValueError: two is wrong too" in str(info.value) and "case 0" not in str(info.value)


def test_a_wrong_oracle_value_fails_the_case():
    a = make(values(SHAPE, 6), layout("col", SHAPE, P), "float32")
    with pytest.raises(AssertionError, match="off by one"):
        check_cases([("off by one", lambda: a + 1.0, values(SHAPE, 6))], "float32")
