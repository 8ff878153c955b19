"""Moshpit SGD (Ryabinin et al. 2021): the rounds of Moshpit All-Reduce against their closed form —
d rounds reach the exact global mean, each round is the mean of its grid lines — the schedule of
rounds, M = n as local SGD bit for bit, the ring all-reduce bytes of groups of M, and refusals."""

import numpy as np
import pytest
import torch
from cases import SHORT
from test_bad_input import one_line_error, sets

from gossamer.algorithms.moshpit import grid_lines
from gossamer.config import load_config
from gossamer.engines.ledger import allreduce_bytes
from gossamer.engines.sim import SimEngine
from gossamer.train import build_run, train


@pytest.mark.parametrize("n, side", [(8, 2), (27, 3), (16, 4), (5, 5)])
def test_d_rounds_along_the_axes_give_every_worker_the_exact_mean(n, side):
    X = torch.randn(n, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    engine, Y = SimEngine(n), X.clone()
    for groups in grid_lines(n, side):
        engine.groups_mean_(Y, groups)
    torch.testing.assert_close(Y, X.mean(0).expand_as(X), rtol=0, atol=1e-14)


def test_a_round_averages_the_workers_that_share_every_coordinate_but_its_axis():
    n, side = 27, 3
    X = torch.randn(n, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    digits = np.array([[w // side**k % side for k in range(3)] for w in range(n)])  # worker w's cell
    for r, groups in enumerate(grid_lines(n, side)):
        Y = X.clone()
        SimEngine(n).groups_mean_(Y, groups)
        free = 2 - r  # the grid's axis r is the r-th digit from the highest
        for w in range(n):
            line = [v for v in range(n) if all(digits[v, k] == digits[w, k] for k in range(3) if k != free)]
            assert len(line) == side
            torch.testing.assert_close(Y[w], X[line].mean(0), rtol=0, atol=1e-15)


class Recording(SimEngine):
    def __init__(self, n):
        super().__init__(n)
        self.rounds = []

    def groups_mean_(self, X, groups, level="block"):
        self.rounds.append(sorted(sorted(groups.members(r).tolist()) for r in range(groups.count)))
        super().groups_mean_(X, groups, level)


def test_rounds_come_every_h_steps_and_cycle_through_the_axes():
    cfg = load_config(None, [*SHORT, "algorithm=moshpit", "moshpit_group=2", "local_steps=3"])
    engine = Recording(cfg.workers)
    run = build_run(cfg, engine=engine)
    train(cfg, run)
    steps = cfg.epochs * run.steps_per_epoch
    assert len(engine.rounds) == steps // 3
    assert engine.rounds[0] == [[0, 2], [1, 3]] and engine.rounds[1] == [[0, 1], [2, 3]]  # axis 0, then 1
    assert engine.rounds[2] == engine.rounds[0]
    assert run.engine.comm.bytes_by_level["block"] == len(engine.rounds) * allreduce_bytes(run.workers.d, 2, 8)


def test_a_grid_of_one_axis_is_local_sgd_bit_for_bit():
    common = [*SHORT, "momentum=0.9", "local_steps=2"]
    moshpit = load_config(None, [*common, "algorithm=moshpit", "moshpit_group=4"])
    local = load_config(None, [*common, "algorithm=local"])
    runs = [build_run(moshpit), build_run(local)]
    summaries = [train(cfg, run) for cfg, run in zip((moshpit, local), runs)]
    assert torch.equal(runs[0].workers.X, runs[1].workers.X)
    assert summaries[0]["bytes_per_worker"] == summaries[1]["bytes_per_worker"]


def test_a_gone_worker_is_left_out_of_its_line():
    cfg = load_config(None, [*SHORT, "algorithm=moshpit", "moshpit_group=2", "local_steps=1", "faults.events=[1@0-]"])
    run = build_run(cfg)
    start = run.workers.X[1].clone()
    train(cfg, run)
    assert torch.equal(run.workers.X[1], start)  # gone from the start: never averaged, never stepped


@pytest.mark.parametrize("overrides, fragment", [
    (["workers=6", "moshpit_group=2"], "moshpit_group 2: workers (6) must be a power of M"),
    (["moshpit_group=1"], "moshpit_group must be a group size M >= 2"),
    (["local_steps=0"], "local_steps must be a positive integer"),
])
def test_bad_moshpit_options_are_one_line(capsys, tmp_path, overrides, fragment):
    argv = ["train", "--quiet", "--out", str(tmp_path / "never"), *sets(*SHORT, "algorithm=moshpit", *overrides)]
    one_line_error(capsys, argv, fragment)
