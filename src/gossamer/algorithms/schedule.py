"""The communication schedule: its protocol, what a step knows, phases, and the shared step.

Every algorithm is a :class:`Schedule` over the hooks of a training step: ``start`` (from
identical models: the run's start, or the start of a phase entered after a gradient-averaging
one), ``on_gradients`` (after backward, before the local optimizer step: where mini-batch SGD
averages gradients; ``averages_gradients(t)`` says whether it does at step t, and then it does
nothing else, so a gradient all-reduce done elsewhere — DDP's — can stand in for it) and
``after_step`` (after the local step: where models are averaged or gossiped; it returns metrics
for the step's row). ``step.t`` is the 0-based index of the step being taken. Everything a
schedule carries from step to step is in its ``state_dict()`` (tensors with one row per worker
under ``rows``), so a run can be resumed; its cumulative counts (extra gossip rounds, …) are
reported by ``counters()`` for the summary.

:class:`Phases` composes schedules: sub-schedule k runs from its first step on (post-local SGD
is mini-batch SGD, then local SGD; gossip's ``phases`` are all-reduce, gossip or controlled
gossip). :func:`begin_step` is the part of a step that the training loop and the optimizer hooks
of :mod:`gossamer.integrations` share.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import torch

from ..registry import ConfigError, Registry

ALGORITHMS = Registry("algorithm")
GRAD_NORM_EMA = 0.9  # β of the EMA of φ² unless the schedule says otherwise (consensus.ema)


@dataclass
class Step:
    """What a schedule knows about the step being taken: index t, η_t, φ_t² and its EMA, and
    whether this step's metrics are measured (``measure``: else nothing is measured or synced)."""

    t: int
    lr: float = 0.0
    grad_norm_sq: float = 0.0
    grad_norm_sq_ema: float = 0.0
    measure: bool = True


class Schedule:
    """A communication schedule (see the module docstring); the defaults communicate nothing.

    ``grad_norm_ema``: β of the EMA of φ² the rows report; ``tracks_grad_norm``: whether the
    schedule needs φ² at every step, measured or not (the ``gradient`` consensus target)."""

    grad_norm_ema: float = GRAD_NORM_EMA
    tracks_grad_norm: bool = False

    def start(self, engine, X: torch.Tensor) -> None:
        pass

    def averages_gradients(self, t: int) -> bool:
        return False

    def on_gradients(self, engine, X: torch.Tensor, G: torch.Tensor, step: Step) -> None:
        pass

    def after_step(self, engine, X: torch.Tensor, step: Step) -> dict:
        return {}

    def counters(self) -> dict[str, int]:
        """Cumulative counts since the run's start, for the summary."""
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@dataclass
class Context:
    """What a schedule is built from besides its options."""

    X: torch.Tensor  # this engine's rows of the parameters (shape and dtype of the state)
    numels: list[int]  # sizes of the parameter tensors in a row
    optimizer_rows: list[torch.Tensor]  # the local optimizer's per-worker state
    steps_per_epoch: int
    reference: list[float] | None = None  # Ξ_t² by step of the run of a `run:DIR` consensus target
    total_steps: int | None = None  # steps the run takes (None: open-ended, a user's training loop)
    buffer_rows: list[torch.Tensor] = field(default_factory=list)  # buffers averaged with the parameters
    keep_change: bool = False  # gossip: each round's local change also on steps not measured (the hooks' estimate)
    outer_optimizer: object | None = None  # DiLoCo: fragment's columns -> a user's outer optimizer on them


@dataclass
class Phases(Schedule):
    """Sub-schedules switched at steps: ``phases[k]`` runs steps [starts[k−1], starts[k]).

    Entering phase k after step t′ − 1: from a phase that averaged gradients (identical models)
    the new phase ``start``s; from one that did not into one that does, the models and the
    ``optimizer_state`` are averaged once first (else local momenta would pull them apart
    again); between two decentralized phases nothing happens (they share their state, e.g. the
    gossip round counter). Which phase has been entered is state (``phase``), saved and
    restored; rows report it 1-based."""

    phases: list[Schedule]
    starts: list[int]  # the first step of phases 2, 3, ...
    optimizer_state: list[torch.Tensor] = field(default_factory=list)
    grad_norm_ema: float = GRAD_NORM_EMA
    tracks_grad_norm: bool = False
    phase: int = 0  # the phase entered last

    def _of(self, t: int) -> int:
        return bisect.bisect_right(self.starts, t)

    def start(self, engine, X: torch.Tensor) -> None:
        self.phase = self._of(0)
        self.phases[self.phase].start(engine, X)

    def averages_gradients(self, t: int) -> bool:
        return self.phases[self._of(t)].averages_gradients(t)

    def on_gradients(self, engine, X: torch.Tensor, G: torch.Tensor, step: Step) -> None:
        self.phases[self.phase].on_gradients(engine, X, G, step)

    def after_step(self, engine, X: torch.Tensor, step: Step) -> dict:
        k = self.phase
        metrics = {"phase": k + 1, **self.phases[k].after_step(engine, X, step)}
        if k < len(self.starts) and step.t + 1 == self.starts[k]:
            self._enter(engine, X, k + 1, step.t + 1)
        return metrics

    def _enter(self, engine, X: torch.Tensor, k: int, t: int) -> None:
        previous, phase = self.phases[k - 1], self.phases[k]
        if previous.averages_gradients(t - 1):
            phase.start(engine, X)
        elif phase.averages_gradients(t):
            for rows in (X, *self.optimizer_state):
                engine.allreduce_mean_(rows)
            phase.start(engine, X)
        self.phase = k

    def counters(self) -> dict[str, int]:
        return {k: v for phase in self.phases for k, v in phase.counters().items()}

    def state_dict(self) -> dict:
        return {"phase": self.phase, "phases": {str(k): p.state_dict() for k, p in enumerate(self.phases)}}

    def load_state_dict(self, state: dict) -> None:
        self.phase = int(state["phase"])
        for k, p in enumerate(self.phases):
            p.load_state_dict(state["phases"][str(k)])


def phased(phases: list[Schedule], starts: list[int], ctx: Context, **kwargs) -> Phases:
    """:class:`Phases` of ``phases`` starting at ``starts`` (each inside the run, when its length is known)."""
    if ctx.total_steps is not None and any(s >= ctx.total_steps for s in starts):
        raise ConfigError(f"phase_steps must be below the run's {ctx.total_steps} steps, got {starts}")
    return Phases(phases, starts, ctx.optimizer_rows, **kwargs)


def begin_step(schedule: Schedule, engine, X: torch.Tensor, G: torch.Tensor, t: int, lr: float,
               grad_norm_sq_ema: float | None, measure: bool, average: bool = True) -> tuple[Step, float | None]:
    """The gradient stage of step t, after backward: φ_t² = (1/n) Σ_i ‖g_i‖² (before any averaging)
    and its EMA s_t = β s_{t−1} + (1 − β) φ_t² when the step is measured or the schedule tracks it,
    the :class:`Step`, then the schedule's ``on_gradients`` (unless ``average`` is False: a DDP
    all-reduce stands in for it). Returns the step and the new EMA."""
    phi_sq = None
    if measure or schedule.tracks_grad_norm:
        phi_sq = engine.mean_scalar(G.square().sum(1))
        beta = schedule.grad_norm_ema
        grad_norm_sq_ema = phi_sq if grad_norm_sq_ema is None else beta * grad_norm_sq_ema + (1 - beta) * phi_sq
    step = Step(t, lr, phi_sq or 0.0, grad_norm_sq_ema or 0.0, measure)
    if average:
        schedule.on_gradients(engine, X, G, step)
    return step, grad_norm_sq_ema


def shared_rows(cfg, ctx: Context) -> list[torch.Tensor]:
    """The rows communicated with the parameters: optimizer state if averaged, and buffers."""
    return [*(ctx.optimizer_rows if cfg.average_optimizer_state else []), *ctx.buffer_rows]


def build_schedule(cfg, ctx: Context) -> Schedule:
    """The schedule named by ``cfg.algorithm``."""
    return ALGORITHMS[cfg.algorithm].build(cfg, ctx)
