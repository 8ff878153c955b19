"""DiLoCo (Douillard et al. 2023): H inner steps, then an outer step on the pseudo-gradient."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..optim import SGD
from ..registry import ConfigError, positive_ints
from .schedule import ALGORITHMS, Context, Schedule, Step


class OuterOptimizer(Protocol):
    """DiLoCo's outer optimizer: moves x_outer (a row per local worker) along −Δ, in place."""

    def start(self, x_outer: torch.Tensor) -> None: ...

    def step(self, x_outer: torch.Tensor, pseudo_gradient: torch.Tensor) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@dataclass
class OuterSGD:
    """SGD with Nesterov momentum (none when ``momentum`` is 0) at learning rate ``lr``."""

    lr: float
    momentum: float
    sgd: SGD | None = None

    def start(self, x_outer: torch.Tensor) -> None:
        self.sgd = SGD(x_outer, self.momentum, self.momentum > 0)

    def step(self, x_outer: torch.Tensor, pseudo_gradient: torch.Tensor) -> None:
        self.sgd.step(x_outer, pseudo_gradient, self.lr)

    def state_dict(self) -> dict:
        return self.sgd.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sgd.load_state_dict(state)


@dataclass
class DiLoCo(Schedule):
    """DiLoCo (Douillard et al. 2023): H inner steps, then an outer step on the pseudo-gradient.

    Δ = x_outer − mean_i x_i (one all-reduce); the outer optimizer (``OuterSGD``: SGD with
    Nesterov momentum, lr ``outer_lr``; in the library API the user's own) moves x_outer along −Δ
    and every worker restarts from x_outer. With outer lr 1 and momentum 0, x_outer ← mean_i x_i:
    exactly local SGD. Every worker keeps its own copy of x_outer and of the outer optimizer's
    state (identical rows, as each DiLoCo replica does), and its inner optimizer's state across
    outer steps, as the DiLoCo paper does (it is never averaged). ``shared_state`` (buffers
    averaged with the parameters) is averaged at each outer step.
    """

    local_steps: int
    outer: OuterOptimizer
    shared_state: list[torch.Tensor] = field(default_factory=list)
    x_outer: torch.Tensor | None = None

    def start(self, engine, X: torch.Tensor) -> None:
        self.x_outer = X.clone()
        self.outer.start(self.x_outer)

    def after_step(self, engine, X: torch.Tensor, step: Step) -> dict:
        if (step.t + 1) % self.local_steps:
            return {}
        for rows in (X, *self.shared_state):
            engine.allreduce_mean_(rows)
        self.outer.step(self.x_outer, self.x_outer - X)
        X.copy_(self.x_outer)
        return {}

    def state_dict(self) -> dict:
        return {"rows": {"x_outer": self.x_outer}, "outer": self.outer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.x_outer.copy_(state["rows"]["x_outer"])
        self.outer.load_state_dict(state["outer"])


@dataclass
class DiLoCoOptions:
    local_steps: int = 1  # H: inner steps per outer step
    outer_lr: float = 0.7
    outer_momentum: float = 0.9  # Nesterov

    def validate(self, cfg) -> None:
        positive_ints(self, "local_steps")
        if cfg.average_optimizer_state:
            raise ConfigError("average_optimizer_state does not apply to algorithm diloco: each worker keeps its "
                              "inner optimizer state across outer steps, as in the DiLoCo paper")
        if not self.outer_lr > 0 or not 0 <= self.outer_momentum < 1:
            raise ConfigError(f"diloco needs outer_lr > 0 and outer_momentum in [0, 1), "
                              f"got {self.outer_lr} and {self.outer_momentum}")


@ALGORITHMS.register("diloco", options=DiLoCoOptions, example=("local_steps=3",),
                     help="DiLoCo: H inner steps, then an outer Nesterov step on the pseudo-gradient")
def _diloco(cfg, ctx: Context) -> DiLoCo:
    outer = ctx.outer_optimizer or OuterSGD(cfg.outer_lr, cfg.outer_momentum)
    return DiLoCo(cfg.local_steps, outer, ctx.buffer_rows)
