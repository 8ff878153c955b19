"""Consensus distance: targets and the controller that keeps Ξ under them (Kong et al. 2021).

Ξ_t² = (1/n) Σ_i ‖x̄ − x_i‖² is measured by the engine. The controller runs extra gossip rounds
X ← W X after the step's normal gossip until Ξ_t ≤ target_t, at most ``max_extra_rounds``; when
the budget runs out it either falls back to an exact all-reduce (Ξ = 0) or continues training.

The paper's target is "c × φ_t^ema", which reads two ways; both are here:
- ``run:DIR``: c × the consensus distance that *uncontrolled* D-SGD had at the same step of an
  earlier run, smoothed by an EMA — a reference recorded beforehand (its Ξ_t² by step is read
  from the run directory by :func:`gossamer.report.reference_trajectory` and handed in here);
- ``gradient``: c × η_t · sqrt(EMA of φ_t²) / p, with φ_t² = (1/n) Σ_i ‖∇f_i(x_i)‖² — the typical
  distance Ξ² = O((1 − p) η² (φ² + σ²) / p²) scaled to a distance, computable on the fly.
``constant`` keeps Ξ ≤ a fixed value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from .registry import ConfigError

if TYPE_CHECKING:
    from .algorithms import Step

ON_BUDGET = ("allreduce", "continue")


@dataclass
class ConsensusConfig:
    """Consensus control (Kong et al.): keep Ξ ≤ target with extra gossip rounds.

    target: none | constant (Ξ ≤ value) | gradient (factor · η_t · sqrt(EMA φ_t²) / p)
    | run:DIR (factor · EMA of the Ξ_t an earlier uncontrolled run had at the same step).
    """

    target: str = "none"
    value: float = 0.0
    factor: float = 1.0
    max_extra_rounds: int = 100
    on_budget: str = "allreduce"
    ema: float = 0.9

    def validate(self) -> None:
        t = self.target
        if t not in ("none", "constant", "gradient") and not (t.startswith("run:") and len(t) > 4):
            raise ConfigError(f"unknown consensus.target '{t[:100]}'; choose one of: none, constant, gradient, run:DIR")
        if t == "constant" and not self.value > 0:
            raise ConfigError(f"consensus.target constant needs consensus.value > 0, got {self.value}")
        if not self.factor > 0:
            raise ConfigError(f"consensus.factor must be > 0, got {self.factor}")
        if self.max_extra_rounds < 0:
            raise ConfigError(f"consensus.max_extra_rounds must be >= 0, got {self.max_extra_rounds}")
        if self.on_budget not in ON_BUDGET:
            raise ConfigError(f"unknown consensus.on_budget '{self.on_budget}'; choose one of: {', '.join(ON_BUDGET)}")
        if not 0 <= self.ema < 1:
            raise ConfigError(f"consensus.ema must be in [0, 1), got {self.ema}")

    @property
    def reference_run(self) -> str | None:
        """DIR of a ``run:DIR`` target, else None."""
        return self.target.removeprefix("run:") if self.target.startswith("run:") else None


def ema_factor(cfg) -> float:
    """β of the EMA of φ_t² that the metric rows report and the ``gradient`` target follows:
    ``consensus.ema`` where the algorithm has a consensus section, else its default."""
    consensus = getattr(cfg.options["algorithm"], "consensus", None)
    return (consensus or ConsensusConfig()).ema


def ema(values: list[float], beta: float) -> list[float]:
    """Exponential moving average s_t = β s_{t−1} + (1 − β) v_t, started at s_0 = v_0."""
    out, s = [], None
    for v in values:
        s = v if s is None else beta * s + (1 - beta) * v
        out.append(s)
    return out


def build_target(c: ConsensusConfig, p: float, reference: list[float] | None = None) -> Callable[[Step], float]:
    """Target Ξ for a step. ``p``: the topology's mixing quality; ``reference``: for ``run:DIR``,
    the Ξ_t² of that run at steps 1, 2, … (at least as many as this run takes)."""
    if c.target == "constant":
        return lambda step: c.value
    if c.target == "gradient":
        return lambda step: c.factor * step.lr * math.sqrt(step.grad_norm_sq_ema) / p
    if reference is None:
        raise ConfigError(f"consensus.target {c.target[:100]} needs the reference run's Ξ² by step "
                          f"(gossamer.report.reference_trajectory)")
    trajectory = ema([math.sqrt(max(v, 0.0)) for v in reference], c.ema)

    def target(step: Step) -> float:
        if step.t >= len(trajectory):  # an open-ended run (the library API) went past the reference
            raise ConfigError(f"consensus.target {c.target[:100]} has {len(trajectory)} steps; "
                              f"step {step.t + 1} is past its end")
        return c.factor * trajectory[step.t]
    return target


@dataclass
class Controller:
    """Extra gossip rounds until Ξ ≤ target; then an all-reduce or nothing when the budget is spent."""

    target: Callable[[Step], float]
    max_extra_rounds: int
    on_budget: str  # allreduce | continue

    def control(self, engine, X: torch.Tensor, step: Step, gossip_round: Callable[[], None]) -> dict:
        """Run after the step's normal gossip; returns this step's control metrics. Each probe of
        Ξ² is measurement traffic (an all-reduce of d values)."""
        target = self.target(step)
        before = engine.consensus_distance_sq(X)
        xi_sq, rounds = before, 0
        while math.sqrt(xi_sq) > target and rounds < self.max_extra_rounds:
            gossip_round()
            rounds += 1
            xi_sq = engine.consensus_distance_sq(X)
        fallback = math.sqrt(xi_sq) > target and self.on_budget == "allreduce"
        if fallback:
            engine.allreduce_mean_(X)
        return {"consensus_target": target, "consensus_distance_sq_before_control": before,
                "extra_gossip_rounds": rounds, "control_allreduce": fallback}
