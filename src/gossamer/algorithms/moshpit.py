"""Moshpit SGD (Ryabinin, Gorbunov, Plokhotnyuk, Pekhimenko, NeurIPS 2021): local SGD whose
averaging is one round of Moshpit All-Reduce, exact means within small groups of a grid.

The n = M^d workers sit on a d-dimensional grid of side M, worker w at the base-M digits of w.
Every H local steps one round: round r averages exactly within each line of the grid along axis
r mod d — the M workers that share every coordinate but that one. Rounds along the d axes in turn,
with no local step between, give every worker the exact global mean (tests/test_moshpit.py); a
round costs a ring all-reduce within groups of M, instead of all n. The authors' code (their
averaging experiments, yandex-research/moshpit-sgd 949b60b, and hivemind 0.9.5's key manager)
keeps each worker's cell and averages its line of the round's axis, over the members alive (a
gone worker is left out, with faults); only parameters are averaged (here also what
``average_optimizer_state`` and the buffers add, as local SGD does). With M = n (d = 1) a round is
the global average: local SGD.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..faults import REJOIN_MODES
from ..groups import Groups
from ..registry import ConfigError, positive_ints
from .schedule import ALGORITHMS, Context, Schedule, Step, shared_rows


def grid_lines(n: int, side: int) -> list[Groups]:
    """For each axis of the grid of n = side^d workers, its lines along that axis."""
    dims = 1
    while side**dims < n:
        dims += 1
    grid = np.arange(n).reshape((side,) * dims)
    return [Groups(n, np.moveaxis(grid, axis, -1).ravel(), side) for axis in range(dims)]


@dataclass
class Moshpit(Schedule):
    """Moshpit SGD (module docstring): after every H-th local step (counted from ``start``), one
    round of exact means within the lines of axis r mod d; ``shared_state`` (optimizer state or
    buffers averaged with the parameters) alike. State: the steps since start and the rounds so far."""

    local_steps: int
    lines: list[Groups]  # each axis's groups
    shared_state: list[torch.Tensor] = field(default_factory=list)
    steps: int = 0
    rounds: int = 0

    def start(self, engine, X: torch.Tensor) -> None:
        self.steps = 0

    def after_step(self, engine, X: torch.Tensor, step: Step) -> dict:
        self.steps += 1
        if self.steps % self.local_steps == 0:
            groups = self.lines[self.rounds % len(self.lines)]
            for rows in (X, *self.shared_state):
                engine.groups_mean_(rows, groups)
            self.rounds += 1
        return {}

    def state_dict(self) -> dict:
        return {"steps": self.steps, "rounds": self.rounds}

    def load_state_dict(self, state: dict) -> None:
        self.steps, self.rounds = int(state["steps"]), int(state["rounds"])


@dataclass
class MoshpitOptions:
    moshpit_group: int = 2  # M: the grid's side, the size of a round's groups (n must be M^d)
    local_steps: int = 1  # H: local steps between rounds

    def validate(self, cfg) -> None:
        positive_ints(self, "local_steps")
        side, n = self.moshpit_group, cfg.workers
        if side < 2:
            raise ConfigError(f"moshpit_group must be a group size M >= 2, got {side}")
        power = side
        while power < n:
            power *= side
        if power != n:
            raise ConfigError(f"moshpit_group {side}: workers ({n}) must be a power of M (the grid has M^d cells)")


@ALGORITHMS.register("moshpit", options=MoshpitOptions, example=("moshpit_group=2", "local_steps=2"),
                     faults=REJOIN_MODES,
                     help="Moshpit SGD: H local steps, then exact means within the lines of an M^d grid, one axis "
                          "a round (Ryabinin et al. 2021)")
def _moshpit(cfg, ctx: Context) -> Moshpit:
    return Moshpit(cfg.local_steps, grid_lines(cfg.workers, cfg.moshpit_group), shared_rows(cfg, ctx))
