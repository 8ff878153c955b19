"""The installed distribution's version: ``gossamer.__version__`` and ``gossamer --version``, in a
module of its own so that the command line need not import the package's ``__init__`` (which
imports the API, which runs the command line's runner)."""


def package_version() -> str:
    """The version of the installed ``gossamer`` distribution; "unknown" in a source tree that was
    not installed."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("gossamer")
    except PackageNotFoundError:  # a source tree that was not installed
        return "unknown"
