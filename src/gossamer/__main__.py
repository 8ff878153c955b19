"""The ``gossamer`` command and ``python -m gossamer``: :func:`gossamer.cli.main`, imported
inside the Ctrl-C guard (importing torch takes a second or more, and an interrupt then is the same
one line as later). While it imports, SIGINT only records itself: a KeyboardInterrupt raised inside
torch's native initialisation (a Python callback under pybind11) aborts the process instead of
unwinding. Before torch loads, its C++ log level is ERROR unless the environment sets
TORCH_CPP_LOG_LEVEL: a lost peer is one line of ours, not c10d's warnings and stack frames."""

import os
import signal
import sys


def main() -> int:
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    received = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        from .cli import main as cli_main
    except KeyboardInterrupt:
        received.append(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        print("gossamer: error: interrupted", file=sys.stderr)
        return 130
    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
