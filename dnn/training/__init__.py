"""What `Sequential.fit` runs: the fit loop (fit.py), the recorded training and evaluation steps
(programs.py), asynchronous SGD (asgd.py), callbacks (callbacks.py, public as `dnn.callbacks`) and
the progress bar (progress.py)."""
