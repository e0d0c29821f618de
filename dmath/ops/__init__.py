"""Registered operations: each module holds an op family's master halves and worker kernels.

Every module under this package is imported here (a walk of the package, not a list), so an
operation or a backend's kernel written in a new file registers itself on every rank: the workers
import dmath before they serve, and never see the user's modules.
"""
import importlib
import pkgutil

for _module in pkgutil.walk_packages(__path__, __name__ + "."):
    importlib.import_module(_module.name)
del _module
