"""gossamer: decentralized and communication-efficient training.

``gossamer.run``, ``gossamer.load``, ``gossamer.Data`` and ``gossamer.Result`` are the Python API
(:mod:`gossamer.api`); :data:`__version__` is the installed package's version string; plugins write
against :mod:`gossamer.extend`, other training loops use :mod:`gossamer.integrations`. Names outside
these three modules are internal (docs/extending.md, "Stability")."""

API = ("Data", "Result", "load", "run")


def __getattr__(name: str):
    """The API's names and ``__version__``, on first use: ``import gossamer`` runs next to nothing,
    so the command's Ctrl-C guard (:mod:`gossamer.__main__`) is in place almost at once."""
    if name in API:
        from . import api
        return getattr(api, name)
    if name == "__version__":
        from .version import package_version
        return package_version()
    raise AttributeError(f"module 'gossamer' has no attribute '{name}'")


__all__ = ["__version__", *API]
