"""Exceptions raised by dmath.

Every error a user can cause is detected on the master, before any command
reaches the workers, and raised as one of these; the runtime stays usable.
Only `WorkerError` reports a failure that happened on a worker.
"""


class DMathError(Exception):
    """Base class of every dmath error."""


class ShapeError(DMathError, ValueError):
    """Operand shapes do not fit the operation."""


class LayoutError(DMathError, ValueError):
    """A layout is malformed or does not fit the matrix or the workers."""


class DTypeError(DMathError, TypeError):
    """A dtype outside float16, float32 and float64 (or a mismatch)."""


class WorkerError(DMathError, RuntimeError):
    """A command failed on a worker.

    Attributes:
        rank: the worker's rank.
        traceback: the worker's formatted traceback (a string).
    """

    def __init__(self, rank, traceback, message=None):
        self.rank = int(rank)
        self.traceback = traceback
        first = message or _last_line(traceback)
        super().__init__(f"worker {self.rank} failed: {first}\n--- worker {self.rank} traceback ---\n{traceback}")


class OutOfMemoryError(DMathError, MemoryError):
    """An allocation would exceed the memory limit (dmath.memory.set_limit)."""


class NotSupportedError(DMathError, TypeError):
    """A Python protocol a Matrix does not offer: pickling, implicit conversion to numpy, iteration,
    in-place writes into a slice or transpose (which are copies)."""


class RuntimeStateError(DMathError, RuntimeError):
    """The runtime is not in a state that allows the call (not initialised, broken)."""


class PlanError(DMathError, RuntimeError):
    """A recorded plan cannot be made or replayed (nested record, data from the master inside
    the block, an input freed before a replay, a discarded or closed plan)."""


def _last_line(text):
    lines = [ln for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "unknown error"


class LinAlgError(DMathError, ValueError):
    """A factorization or solve cannot be completed: the matrix is not positive definite (the
    message names the failing leading minor) or it is singular (the message names the pivot)."""
