"""Master-side planning: pure functions of metadata that choose how an operation runs.

`gemm.py`: the GEMM strategies, their cost model and the forms of the
copies a strategy keeps in the replica cache. `conv.py`: the window geometry
of convolution and pooling (normalised, checked, the output shape), shared by
dmath.nn and dnn's layers. What the planners know of the
workers comes from the master's own ledgers (`runtime/ledger.py`: bytes
held; `runtime/replica_ledger.py`: cached copies). Nothing here runs on a
worker or sends a command; the worker kernels are in `dmath/ops/`.
"""
