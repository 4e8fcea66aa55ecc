"""shardsim: a topology-aware performance simulator for distributed training, with a reference
PyTorch runtime that checks it."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("shardsim")
except PackageNotFoundError:  # a checkout on sys.path, not installed
    __version__ = "0.0.0+unknown"
