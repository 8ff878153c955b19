"""The communication schedule: its protocol, what a step knows, phases, and the shared step.

Every algorithm is a :class:`Schedule`. The training loop hands it each step (:meth:`Schedule.step`,
with a :class:`StepIO`: the engine and rows, a gradient oracle, the local optimizer, the workers
taking part); the default is the synchronous step (:func:`synchronous_step`): the workers that
compute at step t (``computing(t)``: all, or a schedule's choice, e.g. a sporadic worker's coin;
less the gone ones under faults) take a gradient and their local step, and the schedule
communicates through its hooks. An event-driven schedule (AD-PSGD) overrides ``step``. The hooks
of the synchronous step are ``start`` (from
identical models: the run's start, or the start of a phase entered after a gradient-averaging
one), ``on_gradients`` (after backward, before the local optimizer step: where mini-batch SGD
averages gradients; ``averages_gradients(t)`` says whether it does at step t, and then it does
nothing else, so a gradient all-reduce done elsewhere — DDP's — can stand in for it) and
``after_step`` (after the local step: where models are averaged or gossiped; it returns metrics
for the step's row). ``step.t`` is the 0-based index of the step being taken. Everything a
schedule carries from step to step is in its ``state_dict()`` (tensors with one row per worker
under ``rows``), so a run can be resumed; its cumulative counts (extra gossip rounds, …) are
reported by ``counters()`` for the summary. A schedule that communicates on a graph has it as
its ``topology`` (:func:`graph_of`): where a rejoining worker finds its neighbours.

:class:`Phases` composes schedules: sub-schedule k runs from its first step on (post-local SGD
is mini-batch SGD, then local SGD; gossip's ``phases`` are all-reduce, gossip or controlled
gossip). :func:`begin_step` is the part of a step that the training loop and the optimizer hooks
of :mod:`gossamer.integrations` share.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

from ..engines.ledger import CONTROL, METRICS
from ..registry import ConfigError, Registry

ALGORITHMS = Registry("algorithm", traits={  # what each means; the one place that reads it
    "faults": "the rejoin modes it runs with under faults.* (faults.REJOIN_MODES), read by faults.py",
    "byzantine": "its Byzantine model: 'allreduce' (aggregated updates) or 'gossip' (exchanged models)",
    "requires": "{key: value or (accepted, ...)}: the values it sets of other config keys (config.py)",
    "requires_why": "why it sets them, for the error that refuses another value"})
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

    def computing(self, t: int) -> np.ndarray | None:
        """The workers that compute at step t (bool [n]); None: all of them."""
        return None

    def step(self, io: StepIO) -> Stepped:
        """Step t of every worker (:func:`synchronous_step`)."""
        return synchronous_step(self, io)

    def averages_gradients(self, t: int) -> bool:
        return False

    def model_row(self, engine, X: torch.Tensor) -> torch.Tensor:
        """The model the run evaluates, a row [d]: x̄, the workers' mean (a server's θ where there is one)."""
        return engine.mean_row(X)

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
    clock: object | None = None  # the run's network.Clock (with a network section): event-driven schedules' time
    shapes: list[tuple[int, ...]] = field(default_factory=list)  # the parameter tensors' shapes (of numels)
    optimizer: object | None = None  # the local RowOptimizer (its reset_ of a worker's state)


# (local rows that compute, None: all; the models to take them at, None: X; each row's batch count;
# the augmentation's draw) → the per-row losses [m], the gradients in G (the other rows undefined)
Gradients = Callable[[np.ndarray | None, torch.Tensor | None, np.ndarray | int, int], torch.Tensor]


@dataclass
class StepIO:
    """What the training loop hands a schedule's step t: the engine and its rows X and G, η_t,
    whether the step is measured, the EMA of φ² so far, the workers that take part in computing
    (``computes``, bool [n]: the schedule's choice less the gone ones; None: all), the gradient
    oracle and the local optimizer's step (``update(rows)``: the local rows that step, None: all)."""

    engine: Any
    X: torch.Tensor
    G: torch.Tensor
    t: int
    lr: float
    measure: bool
    grad_norm_sq_ema: float | None
    computes: np.ndarray | None
    gradients: Gradients
    update: Callable[[np.ndarray | None], None]

    def local(self, workers: np.ndarray | None) -> np.ndarray | None:
        """The local rows of the workers set in ``workers`` (bool [n]); None: all."""
        if workers is None:
            return None
        return np.flatnonzero(workers[self.engine.rows.start : self.engine.rows.stop])


class Stepped(NamedTuple):
    """What a step gives the loop: the per-row losses of the workers ``computed`` (global
    indices; None: all), the :class:`Step`, the new EMA of φ², the schedule's row metrics."""

    losses: torch.Tensor
    computed: list[int] | None
    step: Step
    grad_norm_sq_ema: float | None
    metrics: dict


def synchronous_step(schedule: Schedule, io: StepIO) -> Stepped:
    """Every computing worker takes a gradient of its step-t batch at its model (the ledger
    keeps the computation, for the clock), then the gradient stage (:func:`begin_step`: φ² over
    them, ``on_gradients``), their local optimizer step, and ``after_step``."""
    rows = io.local(io.computes)
    computed = None if io.computes is None else np.flatnonzero(io.computes).tolist()
    losses = io.gradients(rows, None, io.t, io.t)
    io.engine.comm.compute(None if computed is None else np.asarray(computed), io.t)
    step, ema = begin_step(schedule, io.engine, io.X, io.G, io.t, io.lr, io.grad_norm_sq_ema, io.measure,
                           over=computed)
    io.update(rows)
    return Stepped(losses, computed, step, ema, schedule.after_step(io.engine, io.X, step))


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
    topology: Any = None  # the graph of its decentralized phases
    phase: int = 0  # the phase entered last

    def _of(self, t: int) -> int:
        return bisect.bisect_right(self.starts, t)

    def computing(self, t: int) -> np.ndarray | None:
        return self.phases[self._of(t)].computing(t)

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
               grad_norm_sq_ema: float | None, measure: bool, average: bool = True,
               over: list[int] | None = None) -> tuple[Step, float | None]:
    """The gradient stage of step t, after backward: φ_t² = (1/n) Σ_i ‖g_i‖² (before any averaging;
    over the workers ``over`` that computed, None: all; 0 if none did) and its EMA s_t = β s_{t−1} + (1 − β) φ_t²
    when the step is measured or the schedule tracks it (then its scalar all-gather is the
    schedule's traffic, level ``control``: the gradient consensus target reads it), the
    :class:`Step`, then the schedule's ``on_gradients`` (unless ``average`` is False: a DDP
    all-reduce stands in for it). Returns the step and the new EMA."""
    phi_sq = None
    if measure or schedule.tracks_grad_norm:  # no worker computed: no gradient, φ² = 0
        level = CONTROL if schedule.tracks_grad_norm else METRICS
        phi_sq = engine.mean_scalar(engine.row_norms_sq(G), over=over, level=level) if over != [] else 0.0
        beta = schedule.grad_norm_ema
        grad_norm_sq_ema = phi_sq if grad_norm_sq_ema is None else beta * grad_norm_sq_ema + (1 - beta) * phi_sq
    step = Step(t, lr, phi_sq or 0.0, grad_norm_sq_ema or 0.0, measure)
    if average:
        schedule.on_gradients(engine, X, G, step)
    return step, grad_norm_sq_ema


def shared_rows(cfg, ctx: Context) -> list[torch.Tensor]:
    """The rows communicated with the parameters: optimizer state if averaged, and buffers."""
    return [*(ctx.optimizer_rows if cfg.average_optimizer_state else []), *ctx.buffer_rows]


def graph_of(schedule: Schedule):
    """The Topology a schedule communicates on (its ``topology``); None: every worker is every
    other's neighbour (all-reduce, local SGD, DiLoCo)."""
    return getattr(schedule, "topology", None)


def build_schedule(cfg, ctx: Context) -> Schedule:
    """The schedule named by ``cfg.algorithm``."""
    return ALGORITHMS[cfg.algorithm].build(cfg, ctx)
