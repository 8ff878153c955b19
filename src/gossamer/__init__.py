"""gossamer: decentralized and communication-efficient training.

``gossamer.run``, ``gossamer.load`` and ``gossamer.Data`` are the Python API (:mod:`gossamer.api`);
plugins write against :mod:`gossamer.extend`."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("gossamer")
except PackageNotFoundError:  # a source tree that was not installed
    __version__ = "unknown"

API = ("Data", "Result", "load", "run")


def __getattr__(name: str):
    """The API's names, imported on first use (``import gossamer`` stays light for the CLI)."""
    if name in API:
        from . import api
        return getattr(api, name)
    raise AttributeError(f"module 'gossamer' has no attribute '{name}'")


__all__ = ["__version__", *API]
