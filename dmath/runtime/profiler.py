"""DMATH_CPROFILE=PREFIX: every rank runs Python's profiler from init and writes PREFIX.<rank>.prof
(pstats format) when it ends: where the master's and the workers' dispatch time goes."""
from .. import settings

_profiler = None


def start_profile():
    """Start the Python profiler when DMATH_CPROFILE names a prefix (at init, on every rank)."""
    global _profiler
    if settings.current.cprofile:
        import cProfile
        _profiler = cProfile.Profile()
        _profiler.enable()


def clear_cprofile():
    """Forget what the Python profiler (DMATH_CPROFILE) has seen so far (dmath.reset_stats)."""
    if _profiler is not None:
        _profiler.clear()


def dump_profile(rank):
    """Write this rank's profile, if one runs (at the end of the job)."""
    if _profiler is not None:
        _profiler.disable()
        _profiler.dump_stats(f"{settings.current.cprofile}.{rank}.prof")
