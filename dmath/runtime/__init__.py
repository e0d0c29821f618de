"""The master-worker runtime: command protocol, handle table, metadata-ID cache, worker loop."""
from .core import Runtime
from .lifecycle import runtime, init, finalize, is_initialized
from .entry import Call
from .registry import OPS, Op, define, kernel, generic
from .shard import Shard, Meta
from .plans import Plan, record

__all__ = ["Runtime", "runtime", "init", "finalize", "is_initialized", "Call", "kernel",
           "generic", "OPS", "Op", "define", "Shard", "Meta", "Plan", "record"]
