"""Consensus distance: targets and the controller that keeps Ξ under them (Kong et al. 2021).

Ξ_t² = (1/n) Σ_i ‖x̄ − x_i‖² is measured by the engine. The controller runs extra gossip rounds
X ← W X after the step's normal gossip until Ξ_t ≤ target_t, at most ``max_extra_rounds``; when
the budget runs out it either falls back to an exact all-reduce (Ξ = 0) or continues training.

The paper's target is "c × φ_t^ema", which reads two ways; both are here:
- ``run:DIR``: c × the consensus distance that *uncontrolled* D-SGD had at the same step of an
  earlier run, smoothed by an EMA — a reference recorded beforehand (its Ξ_t² by step is read
  from the run directory by :func:`gossamer.rundir.reference_trajectory` and handed in here);
- ``gradient``: c × η_t · sqrt(EMA of φ_t²) / p, with φ_t² = (1/n) Σ_i ‖∇f_i(x_i)‖² — the typical
  distance Ξ² = O((1 − p) η² (φ² + σ²) / p²) scaled to a distance, computable on the fly.
``constant`` keeps Ξ ≤ a fixed value.

Two actions keep Ξ under the target (``consensus.action``): ``rounds`` (:class:`Controller`)
adds gossip rounds after a step's own; ``frequency`` (:class:`FrequencyControl`) changes how
many local steps the workers take between gossip rounds, the period H_t.

What the rounds controller decides from (``measure``): ``exact`` probes Ξ² after every round (an
all-reduce of d values and a scalar all-gather); ``estimate`` uses only the local estimate
Θ² = (1/n) Σ_i ‖Σ_j w_ij x_j − x_i‖² of each round (a scalar all-gather) and the bound
Ξ ≤ (2/p)Θ (Kong et al.), p the round's mixing quality. The bound holds for the distance before
the round, so also after it: control from it never stops short of the target, and may spend
more rounds than the exact rule would have. What control decides from is its traffic (the
ledger's level ``control``: in the algorithm's bytes and rounds, and on the clock); what it only
reports is measurement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch

from .engines.ledger import CONTROL
from .registry import ConfigError, positive_ints

if TYPE_CHECKING:
    from .algorithms.schedule import Step

ON_BUDGET = ("allreduce", "continue")
MEASURES = ("exact", "estimate")
ACTIONS = ("rounds", "frequency")


@dataclass
class ConsensusConfig:
    """Consensus control (Kong et al.): keep Ξ ≤ target with extra gossip rounds.

    target: none | constant (Ξ ≤ value) | gradient (factor · η_t · sqrt(EMA φ_t²) / p)
    | run:DIR (factor · EMA of the Ξ_t an earlier uncontrolled run had at the same step).
    action: rounds (extra gossip rounds, at most max_extra_rounds, then on_budget) | frequency
    (the gossip period H_t adapts within [1, max_local_steps]).
    """

    target: str = "none"
    value: float = 0.0
    factor: float = 1.0
    max_extra_rounds: int = 100
    on_budget: str = "allreduce"
    ema: float = 0.9
    measure: str = "exact"  # or estimate: decide from Θ and Ξ ≤ (2/p)Θ alone
    action: str = "rounds"
    max_local_steps: int = 16  # frequency: the longest gossip period H_t

    def validate(self) -> None:
        t = self.target
        if t not in ("none", "constant", "gradient") and not (t.startswith("run:") and len(t) > 4):
            raise ConfigError(f"unknown consensus.target {t[:100]!r}; choose one of: none, constant, gradient, run:DIR")
        if self.action not in ACTIONS:
            raise ConfigError(f"unknown consensus.action {self.action[:100]!r}; choose one of: {', '.join(ACTIONS)}")
        frequency = self.action == "frequency"
        if t == "constant" and not (self.value > 0 or frequency and self.value == 0):
            raise ConfigError(f"consensus.target constant needs consensus.value > 0 (or 0 with consensus.action "
                              f"frequency), got {self.value}")
        if not self.factor > 0:
            raise ConfigError(f"consensus.factor must be > 0, got {self.factor}")
        if self.max_extra_rounds < 0:
            raise ConfigError(f"consensus.max_extra_rounds must be >= 0, got {self.max_extra_rounds}")
        if self.on_budget not in ON_BUDGET:
            raise ConfigError(f"unknown consensus.on_budget {self.on_budget[:100]!r}; "
                              f"choose one of: {', '.join(ON_BUDGET)}")
        if not 0 <= self.ema < 1:
            raise ConfigError(f"consensus.ema must be in [0, 1), got {self.ema}")
        positive_ints(self, "max_local_steps", prefix="consensus.")
        defaults = ConsensusConfig()
        owned = {"rounds": ("max_extra_rounds", "on_budget"), "frequency": ("max_local_steps",)}
        for action, keys in owned.items():
            for key in keys:
                if action != self.action and getattr(self, key) != getattr(defaults, key):
                    raise ConfigError(f"consensus.{key} applies to consensus.action {action}, not {self.action}")
        if frequency and t == "none":
            raise ConfigError("consensus.action frequency needs consensus.target (constant, gradient or run:DIR)")
        if self.measure not in MEASURES:
            raise ConfigError(f"unknown consensus.measure {self.measure[:100]!r}; choose one of: {', '.join(MEASURES)}")
        if self.measure != "exact" and self.action != "rounds":
            raise ConfigError(f"consensus.measure {self.measure[:100]} applies to consensus.action rounds, not {self.action}")

    @property
    def reference_run(self) -> str | None:
        """DIR of a ``run:DIR`` target, else None."""
        return self.target.removeprefix("run:") if self.target.startswith("run:") else None


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
                          f"(gossamer.rundir.reference_trajectory)")
    trajectory = ema([math.sqrt(max(v, 0.0)) for v in reference], c.ema)

    def target(step: Step) -> float:
        if step.t >= len(trajectory):  # an open-ended run (the library API) went past the reference
            raise ConfigError(f"consensus.target {c.target[:100]} has {len(trajectory)} steps; "
                              f"step {step.t + 1} is past its end")
        return c.factor * trajectory[step.t]
    return target


@dataclass
class Controller:
    """Extra gossip rounds until Ξ ≤ target; then an all-reduce or nothing when the budget is spent.

    ``measure``: ``exact`` decides from Ξ (probed after every round), ``estimate`` from the bound
    (2/p)Θ that each round gives."""

    target: Callable[[Step], float]
    max_extra_rounds: int
    on_budget: str  # allreduce | continue
    measure: str = "exact"

    def control(self, engine, X: torch.Tensor, step: Step, gossip_round: Callable[[], float | None],
                bound: float | None = None) -> dict:
        """Run after the step's normal gossip; returns this step's control metrics.

        ``gossip_round()`` runs one extra round (and, when estimating, returns its bound on Ξ);
        ``bound``: the bound given by the step's own round (estimating). Each probe of Ξ² the
        exact rule decides from is control traffic (an all-reduce of d values and a scalar
        all-gather); estimating probes Ξ² only on measured steps, as measurement, to report how
        many rounds the exact rule would have run from the same state (``extra_gossip_rounds_if_exact``)."""
        if self.measure == "estimate":
            return self._from_estimate(engine, X, step, gossip_round, bound)
        target = self.target(step)
        before = engine.consensus_distance_sq(X, CONTROL)
        xi_sq, rounds = before, 0
        while math.sqrt(xi_sq) > target and rounds < self.max_extra_rounds:
            gossip_round()
            rounds += 1
            xi_sq = engine.consensus_distance_sq(X, CONTROL)
        fallback = math.sqrt(xi_sq) > target and self.on_budget == "allreduce"
        if fallback:
            engine.allreduce_mean_(X)
        return {"consensus_target": target, "consensus_distance_sq_before_control": before,
                "extra_gossip_rounds": rounds, "control_allreduce": fallback}

    def _from_estimate(self, engine, X: torch.Tensor, step: Step, gossip_round, bound: float | None) -> dict:
        target = self.target(step)
        bound = math.inf if bound is None else bound
        metrics: dict = {}
        exact_rounds = None  # the rounds after which Ξ first met the target (measured steps)
        if step.measure:
            metrics["consensus_distance_sq_before_control"] = engine.consensus_distance_sq(X)
            exact_rounds = 0 if math.sqrt(metrics["consensus_distance_sq_before_control"]) <= target else None
        rounds = 0
        while bound > target and rounds < self.max_extra_rounds:
            bound = gossip_round()
            bound = math.inf if bound is None else bound
            rounds += 1
            if step.measure and exact_rounds is None and math.sqrt(engine.consensus_distance_sq(X)) <= target:
                exact_rounds = rounds
        fallback = bound > target and self.on_budget == "allreduce"
        if fallback:
            engine.allreduce_mean_(X)
        metrics.update({"consensus_target": target, "consensus_distance_bound_after_control": bound,
                        "extra_gossip_rounds": rounds, "control_allreduce": fallback})
        if step.measure:
            metrics["extra_gossip_rounds_if_exact"] = rounds if exact_rounds is None else exact_rounds
        return metrics


@dataclass
class FrequencyControl:
    """Consensus control by communication frequency: the gossip period H_t (local steps per gossip
    round) adapts so that Ξ stays under the target, within [1, ``max_local_steps``].

    At every gossip round of a controlled phase, just before the round — when Ξ is at its largest
    of the period, after H_t local steps — Ξ is probed (:meth:`probe`: an all-reduce of d values and
    a scalar all-gather, control traffic) and compared with target_t; the next period is

        H ← max(1, ⌊H / 2⌋)                 if Ξ > target                 (too far apart: halve),
        H ← min(max_local_steps, H + 1)      if Ξ² ≤ target² · H / (H + 1)  (room for one more step),
        H unchanged                          otherwise.

    Additive increase, multiplicative decrease, with a hysteresis band (target·sqrt(H/(H+1)),
    target] in which H holds. The band is where one more local step would likely overshoot: the
    stochastic-gradient drift between rounds adds up in squares, so Ξ² grows about linearly with
    the period, and a period lengthened from Ξ² ≤ target²·H/(H+1) stays under the target
    (heterogeneous data can grow Ξ faster; an overshoot is then halved at the next round). A
    steady target does not make H flip between two values. A target of 0 keeps H = 1 (D-SGD, a
    round every step); an unreachable target lengthens H by one per round up to the maximum.

    Rounds saved are counted against a fixed period H = ``fixed`` (the configured
    ``local_steps``) over the same controlled steps (:meth:`rounds_saved`).
    """

    target: Callable[[Step], float]
    fixed: int
    max_local_steps: int
    period: int = field(init=False)  # H_t, from H_0 = fixed
    xi_sq: float = 0.0  # Ξ² probed just before this step's round

    def __post_init__(self) -> None:
        self.period = self.fixed

    def probe(self, engine, X: torch.Tensor) -> None:
        """Ξ² just before the round."""
        self.xi_sq = engine.consensus_distance_sq(X, CONTROL)

    def adapt(self, xi_sq: float, target: float) -> None:
        """The next period, from Ξ² just before the round and the step's target."""
        if math.sqrt(max(xi_sq, 0.0)) > target:
            self.period = max(1, self.period // 2)
        elif xi_sq * (self.period + 1) <= target**2 * self.period:
            self.period = min(self.max_local_steps, self.period + 1)

    def rounds_saved(self, communicated: bool, steps: int) -> int:
        """The rounds this step saved against the fixed-period schedule (+1: it would have gossiped
        and we did not, −1: the reverse); ``steps``: decentralized steps since the models were
        last identical, this one included (both schedules count from there)."""
        return int(steps % self.fixed == 0) - int(communicated)

    def state_dict(self) -> dict:
        return {"period": self.period}

    def load_state_dict(self, state: dict) -> None:
        self.period = int(state["period"])
