"""Every combination resumes exactly: for each case of tests/cases.py's covering (every registered
algorithm × optimizer, every codec with a compressing algorithm in turn, and the feature
variants), a run stopped at a random step
before every switch or phase boundary, and at one after them, and resumed from its checkpoint
gives the straight run's rows, summary and final state, bit for bit (the simulator, in process;
the dist engine and the hooks have their own resume tests)."""

import io
import random

import pytest
import torch
from cases import FEATURES, SHORT, covering

from conftest import assert_same_state

from gossamer.config import load_config
from gossamer.train import Interrupted, build_run, train

CASES = {**covering(), **FEATURES}
STEPS = 12  # SHORT's 2 epochs of 6 steps; the examples' boundaries lie in steps 4..8


def through_bytes(state: dict) -> dict:
    """A checkpoint as it comes back from disk (copied; loads with weights_only=True)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def untimed(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if not k.endswith("_seconds")}


@pytest.mark.parametrize("name", list(CASES))
def test_a_run_stopped_anywhere_and_resumed_is_the_straight_run(name):
    cfg = load_config(None, [*SHORT, *CASES[name], "checkpoint_every=0.01"])  # a checkpoint after every step
    draw = random.Random(name)
    first, second = draw.randint(1, 3), draw.randint(9, STEPS - 1)
    rows, saved = [], {}

    def keep(state):
        if state["step"] in (first, STEPS):
            saved[state["step"]] = through_bytes(state)
    summary = train(cfg, build_run(cfg), on_row=rows.append, on_checkpoint=keep)
    resumed_rows, state = [], saved[first]
    for stop in (second, STEPS):  # resumed at `first`, stopped at `second`, resumed again: a chain of restarts
        resumed_rows.clear()
        try:
            resumed = train(cfg, build_run(cfg), on_row=resumed_rows.append, resume=state,
                            on_checkpoint=lambda s: saved.update(last=through_bytes(s) if s["step"] in (second, STEPS)
                                                                 else {"step": s["step"]}),
                            stop=lambda: saved.get("last", {}).get("step") == second - 1)
        except Interrupted as interrupted:
            assert interrupted.step == second
        start = state["step"]
        assert resumed_rows == [r for r in rows if start < r["step"] <= stop], start
        state = saved.pop("last")
    assert untimed(resumed) == untimed(summary)
    assert_same_state(state, saved[STEPS])
