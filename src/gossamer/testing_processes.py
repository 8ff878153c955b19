"""The processes' side of the conformance kit's ``processes`` check
(:func:`gossamer.testing.process_differences`): under torchrun,
``python -m gossamer.testing_processes ROOT`` trains every case of ROOT/cases.json through the command
line, one launch for all.

Apart from :mod:`gossamer.testing` because it runs the command (:func:`gossamer.cli.main`), which
imports the kit for ``gossamer check-plugin``: the kit launches this module and does not import it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

from . import plugins
from .cli import main
from .config import load_config
from .engines import wire
from .registry import ConfigError
from .testing import MNIST1D_SAMPLES, SHORT


def train_on_processes(root: Path) -> None:
    """Under torchrun: every case of ROOT/cases.json with engine dist into ROOT/NAME, its wire
    reports into ROOT/wire-NAME-rank{R}.json; a case whose run fails (alike on every rank: the
    entry raised) leaves its error line in ROOT/failed-NAME.txt, and the next case runs."""
    spec = json.loads((root / "cases.json").read_text())
    plugins.load([spec["plugin"]] if spec["plugin"] else [])
    for name, overrides in spec["cases"].items():
        plugin = ["--plugin", spec["plugin"]] if spec["plugin"] else []
        sets = [a for o in [*SHORT, *_samples(overrides), *overrides, "engine=dist"] for a in ("--set", o)]
        os.environ[wire.ENV] = str(root / f"wire-{name}")
        errors = io.StringIO()
        with contextlib.redirect_stderr(errors):
            code = main(["train", "--quiet", *plugin, "--out", str(root / name), *sets])
        if code and int(os.environ.get("RANK", 0)) == 0:
            lines = errors.getvalue().strip().splitlines()
            (root / f"failed-{name}.txt").write_text(f"exit {code}: {lines[-1] if lines else ''}")


def _samples(overrides: list[str]) -> list[str]:
    try:
        load_config(None, [*SHORT, MNIST1D_SAMPLES, *overrides])
    except ConfigError:
        return []
    return [MNIST1D_SAMPLES]


if __name__ == "__main__":  # under torchrun: python -m gossamer.testing_processes ROOT
    train_on_processes(Path(sys.argv[1]))
