"""Run under torchrun: for each case, a straight run, a run stopped by SIGTERM on rank 0 alone at
a mid-epoch step (every rank must stop at the same step), and its resume. OUT CASES_JSON STEP."""

import json
import signal
import sys
from pathlib import Path

import torch.distributed as dist

from gossamer import rundir
from gossamer.cli import main

out, cases, at_step = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text()), int(sys.argv[3])
real_row = rundir.RunDir.row


def row(self, r):  # only rank 0 has a run directory: the signal reaches one process
    real_row(self, r)
    if r["step"] == at_step:
        signal.raise_signal(signal.SIGTERM)


dist.init_process_group("gloo")  # one group for every run (the engines join it)
for name, overrides in cases:
    sets = [a for o in ["engine=dist", *overrides] for a in ("--set", o)]
    assert main(["train", "--quiet", "--out", str(out / f"{name}-straight"), *sets]) == 0
    rundir.RunDir.row = row
    code = main(["train", "--quiet", "--out", str(out / f"{name}-stopped"), *sets])
    rundir.RunDir.row = real_row
    assert code == 143, code
    assert main(["train", "--quiet", "--resume", str(out / f"{name}-stopped")]) == 0
dist.destroy_process_group()
