"""Remapping between layouts: pure plans (plan.py) and their execution (execute.py)."""
from .plan import plan, localize, moved_elements, involved, send_dtype, Exchange, AllReduce, Transfer
from .execute import run, narrows_partial, view, pack, unpack, prepare, finish

__all__ = ["plan", "localize", "moved_elements", "involved", "send_dtype", "Exchange",
           "AllReduce", "Transfer", "run", "narrows_partial", "view", "pack", "unpack", "prepare", "finish"]
