"""SPARTA (EXO Gym): after every step the workers average a random fraction p of the coordinates."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..codecs import RandomK
from ..registry import ConfigError
from .schedule import ALGORITHMS, Context, Schedule, Step


@dataclass
class Sparta(Schedule):
    """SPARTA: after step t, x_i[S_t] ← (1/n) Σ_j x_j[S_t] for every worker i, S_t the ⌈p·d_k⌉
    coordinates of each parameter tensor k that every worker draws alike from (seed, t) (stream
    ``sparta``) — the indices are never sent: one all-reduce of |S_t| values a step. ``shared_state`` (buffers) is
    averaged whole at every step."""

    picks: RandomK  # draws S_t (its coordinates; nothing is encoded)
    shared_state: list[torch.Tensor] = field(default_factory=list)

    def after_step(self, engine, X: torch.Tensor, step: Step) -> dict:
        chosen = self.picks.coordinates(step.t, X.device)
        part = X[:, chosen]
        engine.allreduce_mean_(part)
        X[:, chosen] = part
        for rows in self.shared_state:
            engine.allreduce_mean_(rows)
        return {}


@dataclass
class SpartaOptions:
    sparta_fraction: float = 0.005  # p: the fraction of each tensor's coordinates averaged after every step

    def validate(self, cfg) -> None:
        if not 0 < self.sparta_fraction <= 1:
            raise ConfigError(f"sparta_fraction must be in (0, 1], got {self.sparta_fraction}")
        if cfg.average_optimizer_state:
            raise ConfigError("average_optimizer_state does not apply to algorithm sparta: only the chosen "
                              "coordinates of the parameters are averaged")


@ALGORITHMS.register("sparta", options=SpartaOptions, example=("sparta_fraction=0.05",),
                     help="SPARTA: after every step, average a random fraction p of the coordinates (shared seed)")
def _sparta(cfg, ctx: Context) -> Sparta:
    return Sparta(RandomK(ctx.numels, cfg.sparta_fraction, cfg.seed, stream="sparta"), ctx.buffer_rows)
