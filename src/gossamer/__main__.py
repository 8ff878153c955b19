"""The ``gossamer`` command and ``python -m gossamer``: :func:`gossamer.cli.main`, imported
inside the Ctrl-C guard (importing torch takes a second or more, and an interrupt then is the same
one line as later). While it imports, SIGINT only records itself: a KeyboardInterrupt raised inside
torch's native initialisation (a Python callback under pybind11) aborts the process instead of
unwinding. Before torch loads, its C++ log level is ERROR unless the environment sets
TORCH_CPP_LOG_LEVEL: a lost peer is one line of ours, not c10d's warnings and stack frames."""

import _signal  # the C module: ``signal`` imports enum first, a window where Ctrl-C is a traceback
import os
import sys


def main() -> int:
    received = []
    previous = _signal.signal(_signal.SIGINT, lambda signum, frame: received.append(signum))
    if hasattr(_signal, "pthread_sigmask"):  # an interrupt held back until now (a mask the caller set) lands here
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, [_signal.SIGINT])
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    try:
        from .cli import main as cli_main
    except KeyboardInterrupt:
        received.append(_signal.SIGINT)
    finally:
        _signal.signal(_signal.SIGINT, previous)
    if received:
        print("gossamer: error: interrupted", file=sys.stderr)
        return 130
    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
