"""The master-worker runtime: command protocol, handle table, metadata-ID cache, worker loop."""
from .core import Runtime, runtime, init, finalize, is_initialized, Call
from .registry import kernel, generic, KERNELS
from .shard import Shard, Meta
from .plans import Plan, record

__all__ = ["Runtime", "runtime", "init", "finalize", "is_initialized", "Call", "kernel",
           "generic", "KERNELS", "Shard", "Meta", "Plan", "record"]
