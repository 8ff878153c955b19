"""The ``gossamer`` command and ``python -m gossamer``: :func:`gossamer.cli.main`, imported
inside the Ctrl-C guard (importing torch takes a second or more, and an interrupt then is the same
one line as later)."""

import sys


def main() -> int:
    try:
        from .cli import main as cli_main
    except KeyboardInterrupt:
        print("gossamer: error: interrupted", file=sys.stderr)
        return 130
    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
