"""Run under torchrun --max-restarts 1: OUT STEP SETS... On the first attempt, a straight run into
OUT/straight, then the same run into OUT/killed whose rank 1 is killed by SIGKILL at STEP; torchrun
restarts both processes, which continue OUT/killed from its last checkpoint (--resume-if-exists)."""

import os
import signal
import sys

from gossamer import train as training
from gossamer.cli import main

out, at_step, sets = sys.argv[1], int(sys.argv[2]), sys.argv[3:]  # the first run creates the process group
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    assert main(["train", "--quiet", "--out", f"{out}/straight", *sets]) == 0
    real_step = training.train_step

    def step(run, progress, x, y, t, *args):
        if t == at_step and run.engine.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return real_step(run, progress, x, y, t, *args)
    training.train_step = step
sys.exit(main(["train", "--quiet", "--out", f"{out}/killed", "--resume-if-exists", *sets]))
