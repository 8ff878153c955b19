"""gossamer: decentralized and communication-efficient training."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("gossamer")
except PackageNotFoundError:  # a source tree that was not installed
    __version__ = "unknown"
