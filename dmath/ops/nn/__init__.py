"""The neural-network operation families (conv, pool, batch norm, softmax, dropout, labels, batch
movement, fused optimizer steps); their public face is `dmath.nn`. args.py checks a batch's
arguments on the master, rows.py and windows.py are the kernels' shared local helpers."""
