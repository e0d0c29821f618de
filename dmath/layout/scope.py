"""The default group of layouts made without one: all workers, or the group of `dmath.on_group`.

`RowBlock()`, `Replicated()`, ... with group=None take the group in force
when the layout value is made (kept in the value, so it means the same
wherever the value goes later). Outside `dmath.on_group` that is None, which
means every worker. The state lives here, below the layout kinds, so that
the kinds read it without importing the runtime; `dmath.groups` validates
and sets it.
"""
_default = None


def default_group():
    """The group (a tuple of ranks) new layouts without one take, or None (every worker)."""
    return _default


def set_default_group(group):
    """Make `group` (a normalised tuple of ranks, or None) the default; returns the previous one."""
    global _default
    previous, _default = _default, group
    return previous
