"""Shared test setup: make the repository and the helpers in tests/ importable.

The suite runs twice over: `pytest tests` in one process (P = 1, no MPI), and
`mpiexec -n P python -m pytest tests/dist` for P = 2, 3, 4 (see tests/dist/conftest.py).
"""
import os
import sys

_TESTS = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_TESTS)
for _p in (_ROOT, _TESTS):
    if _p not in sys.path:
        sys.path.insert(0, _p)
