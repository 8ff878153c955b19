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

from ..engines.base import Engine
from ..engines.ledger import CONTROL, METRICS
from ..optim import RowOptimizer
from ..registry import ConfigError, Registry

ALGORITHMS = Registry("algorithm", traits={  # what each means; the one place that reads it
    "faults": "the rejoin modes it runs with under faults.* (faults.REJOIN_MODES), read by faults.py",
    "byzantine": "its Byzantine model: 'allreduce' (aggregated updates) or 'gossip' (exchanged models)",
    "requires": "{key: value or (accepted, ...)}: the values it sets of other config keys (config.py)",
    "requires_why": "why it sets them, for the error that refuses another value",
    "byzantine_group": "the config key of the size of the groups its robust rule aggregates (default: all workers)",
    "server": "how it runs on engine dist, each worker a process of its own, not in the lock-step loop: "
              "'push-pull' (a parameter server: async_processes.py) or 'pairs' (a coordinator grants pairs: "
              "pair_processes.py)",
    "hook": "(the gossamer.integrations synchroniser that runs it in a user's loop, cfg → its keyword options): "
            "testing.hook_of"})
GRAD_NORM_EMA = 0.9  # β of the EMA of φ² unless the schedule says otherwise (consensus.ema)


@dataclass
class Step:
    """What a schedule knows about the step being taken, as its hooks receive it.

    Args:
        t (int): the 0-based index of the step being taken.
        lr (float): η_t, the step's learning rate.
        grad_norm_sq (float): φ_t² = (1/n) Σ_i ‖g_i‖² of the computing workers, when measured (else 0).
        grad_norm_sq_ema (float): its EMA, β = the schedule's ``grad_norm_ema``.
        measure (bool): whether this step's metrics are taken (else nothing is measured or synced).

    Example::

        >>> from gossamer.extend import Step
        >>> step = Step(t=3, lr=0.1)
        >>> step.t + 1, step.measure
        (4, True)
    """

    t: int
    lr: float = 0.0
    grad_norm_sq: float = 0.0
    grad_norm_sq_ema: float = 0.0
    measure: bool = True


class Schedule:
    """A communication schedule: the protocol every algorithm implements; the defaults communicate nothing.

    The training loop calls ``start``, then each step ``computing(t)`` and ``step(io)`` (by default
    :func:`synchronous_step`: ``on_gradients`` before the local optimizer step, ``after_step``
    after it), ``model_row`` at each evaluation, ``counters`` for the summary, and ``state_dict`` /
    ``load_state_dict`` at each checkpoint and resume (everything the schedule carries from step
    to step; tensors with one row per worker under a ``rows`` key). Every hook communicates through
    the :class:`~gossamer.engines.base.Engine` it is handed. Class attributes: ``grad_norm_ema``,
    β of the EMA of φ² the rows report; ``tracks_grad_norm``, whether the schedule needs φ² at
    every step, measured or not (the ``gradient`` consensus target).

    Example::

        >>> import torch, gossamer
        >>> from gossamer.extend import ALGORITHMS, Engine, Schedule, Step
        >>> class EveryOther(Schedule):  # the exact average after every second step
        ...     def __init__(self):
        ...         self.averages = 0
        ...     def after_step(self, engine: Engine, X: torch.Tensor, step: Step) -> dict:
        ...         if step.t % 2 == 1:
        ...             engine.allreduce_mean_(X)
        ...             self.averages += 1
        ...         return {"averages": self.averages}
        ...     def state_dict(self) -> dict:
        ...         return {"averages": self.averages}
        ...     def load_state_dict(self, state: dict) -> None:
        ...         self.averages = state["averages"]
        >>> @ALGORITHMS.register("every-other", help="the exact average after every second step")
        ... def build(cfg, ctx):
        ...     return EveryOther()
        >>> x, y = torch.randn(80, 40), torch.randint(0, 10, (80,))
        >>> data = gossamer.Data(train=(x[:64], y[:64]), test=(x[64:], y[64:]))
        >>> result = gossamer.run({"algorithm": "every-other", "model": "mlp", "workers": 4, "epochs": 1,
        ...                        "batch_size": 8}, data=data)
        >>> [row["averages"] for row in result.rows if "averages" in row]
        [0, 1]
    """

    grad_norm_ema: float = GRAD_NORM_EMA
    tracks_grad_norm: bool = False

    def start(self, engine: Engine, X: torch.Tensor) -> None:
        """The run starts, or a phase is entered after a gradient-averaging one: the models X are identical."""

    def computing(self, t: int) -> np.ndarray | None:
        """The workers that compute at step t (bool [n]); None: all of them."""
        return None

    def step(self, io: StepIO) -> Stepped:
        """Step t of every worker (:func:`synchronous_step`)."""
        return synchronous_step(self, io)

    def averages_gradients(self, t: int) -> bool:
        """Whether ``on_gradients`` only averages the gradients at step t (a DDP all-reduce may stand in for it)."""
        return False

    def model_row(self, engine: Engine, X: torch.Tensor) -> torch.Tensor:
        """The model the run evaluates, a row [d]: x̄, the workers' mean (a server's θ where there is one)."""
        return engine.mean_row(X)

    def on_gradients(self, engine: Engine, X: torch.Tensor, G: torch.Tensor, step: Step) -> None:
        """The gradients are in G, before the local optimizer step: communicate them, or mix before stepping."""

    def after_step(self, engine: Engine, X: torch.Tensor, step: Step) -> dict:
        """After the local optimizer step: communicate the models; returns the step's row metrics."""
        return {}

    def counters(self) -> dict[str, int]:
        """Cumulative counts since the run's start, for the summary."""
        return {}

    def state_dict(self) -> dict:
        """Everything the schedule carries from step to step (tensors with a row per worker under ``rows``)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a :meth:`state_dict`."""


@dataclass
class Context:
    """What a schedule is built from besides its options: an algorithm's builder gets ``(cfg, ctx)``.

    Args:
        X (Tensor): this engine's rows of the parameters [m, d] (the shape and dtype of the state).
        numels (list[int]): the sizes of the parameter tensors in a row.
        optimizer_rows (list[Tensor]): the local optimizer's per-worker state, rows like X.
        steps_per_epoch (int): the loop's steps per epoch.
        reference (list[float] | None): Ξ_t² by step of the run a ``run:DIR`` consensus target
            follows (gossip's consensus control).
        total_steps (int | None): the steps the run takes (None: open-ended, a user's training loop).
        buffer_rows (list[Tensor]): the model's buffers communicated with the parameters (:func:`shared_rows`).
        keep_change (bool): gossip's each round's local change also on steps not measured.
        outer_optimizer (Callable | None): DiLoCo's: a fragment's columns → the user's outer optimizer on them.
        clock (object | None): the run's network clock (with a ``network`` section), event-driven schedules' time.
        shapes (list[tuple[int, ...]]): the parameter tensors' shapes (of ``numels``).
        optimizer (RowOptimizer | None): the local optimizer (its ``reset_`` of a rejoining worker's state).

    ``keep_change`` and ``outer_optimizer`` are set by the optimizer hooks of
    :mod:`gossamer.integrations` for gossamer's own schedules, ``reference`` and ``clock`` by the
    loop for them: a plugin's schedule may ignore all four (provisional: they may change in a minor
    version).

    Example::

        >>> import torch
        >>> from gossamer.extend import Context
        >>> ctx = Context(X=torch.zeros(4, 7), numels=[6, 1], optimizer_rows=[], steps_per_epoch=2,
        ...               shapes=[(2, 3), (1,)])
        >>> ctx.X.shape[0], sum(ctx.numels), ctx.total_steps is None
        (4, 7, True)
    """

    X: torch.Tensor
    numels: list[int]
    optimizer_rows: list[torch.Tensor]
    steps_per_epoch: int
    reference: list[float] | None = None
    total_steps: int | None = None
    buffer_rows: list[torch.Tensor] = field(default_factory=list)
    keep_change: bool = False
    outer_optimizer: Callable[[slice], Any] | None = None
    clock: object | None = None
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    optimizer: RowOptimizer | None = None


# (local rows that compute, None: all; the models to take them at, None: X; each row's batch count;
# the augmentation's draw) → the per-row losses [m], the gradients in G (the other rows undefined)
Gradients = Callable[[np.ndarray | None, torch.Tensor | None, np.ndarray | int, int], torch.Tensor]


@dataclass
class StepIO:
    """What the training loop hands a schedule's :meth:`Schedule.step` for step t.

    Args:
        engine (Engine): the engine, holding the local rows ``engine.rows`` of the n workers.
        X (Tensor): the local rows of the parameters [m, d].
        G (Tensor): the gradients' rows [m, d], filled by ``gradients``.
        t (int): the 0-based step.
        lr (float): η_t.
        measure (bool): whether the step's metrics are taken.
        grad_norm_sq_ema (float | None): the EMA of φ² so far (None: none yet).
        computes (ndarray | None): the workers that take part in computing (bool [n]: the
            schedule's ``computing(t)`` less the gone ones; None: all).
        gradients (Callable): the oracle ``gradients(rows, models, batches, draw)``: for the local
            ``rows`` (None: all) at the ``models`` (None: X), each row's batch count and the
            augmentation's draw, the per-row losses; the gradients in G (other rows undefined).
        update (Callable): the local optimizer's step of the local rows given (None: all).

    Example::

        >>> import numpy as np, torch, gossamer
        >>> from gossamer.extend import ALGORITHMS, Schedule, Step, StepIO, Stepped
        >>> class OneAtATime(Schedule):  # step t: worker t mod n computes and steps, then all average
        ...     def step(self, io: StepIO) -> Stepped:
        ...         turn = np.arange(io.engine.n) == io.t % io.engine.n
        ...         rows = io.local(turn)
        ...         losses = io.gradients(rows, None, io.t, io.t)
        ...         io.engine.comm.compute(np.flatnonzero(turn), io.t)  # the clock charges its compute
        ...         io.update(rows)
        ...         io.engine.allreduce_mean_(io.X)
        ...         return Stepped(losses, np.flatnonzero(turn).tolist(), Step(io.t, io.lr), io.grad_norm_sq_ema, {})
        >>> _ = ALGORITHMS.register("one-at-a-time", help="one worker a step")(lambda cfg, ctx: OneAtATime())
        >>> x, y = torch.randn(96, 40), torch.randint(0, 10, (96,))
        >>> config = {"algorithm": "one-at-a-time", "model": "mlp", "workers": 4, "epochs": 1, "batch_size": 8}
        >>> gossamer.run(config, data=gossamer.Data(train=(x[:64], y[:64]), test=(x[64:], y[64:]))).summary["steps"]
        2
    """

    engine: Engine
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
    """What a schedule's :meth:`Schedule.step` gives the loop.

    Args:
        losses (Tensor): the per-row losses of the workers that computed.
        computed (list[int] | None): those workers (global indices; None: all).
        step (Step): the step taken.
        grad_norm_sq_ema (float | None): the new EMA of φ².
        metrics (dict): the schedule's metrics for the step's row.

    Example::

        >>> import torch
        >>> from gossamer.extend import Step, Stepped
        >>> stepped = Stepped(torch.tensor([2.3, 2.1]), [0, 2], Step(t=0, lr=0.1), None, {"rounds": 1})
        >>> stepped.losses.mean().item() > 2, stepped.computed
        (True, [0, 2])
    """

    losses: torch.Tensor
    computed: list[int] | None
    step: Step
    grad_norm_sq_ema: float | None
    metrics: dict


def synchronous_step(schedule: Schedule, io: StepIO) -> Stepped:
    """The default :meth:`Schedule.step`: gradients, ``on_gradients``, the local step, ``after_step``.

    Every computing worker takes a gradient of its step-t batch at its model (the ledger keeps
    the computation, for the clock), then the gradient stage (:func:`begin_step`: φ² over them,
    ``on_gradients``), their local optimizer step, and ``after_step``.

    Args:
        schedule (Schedule): the schedule whose hooks run.
        io (StepIO): what the loop handed the step.

    Returns:
        Stepped: the losses, the workers that computed, the step, the EMA of φ² and ``after_step``'s metrics.

    Example::

        >>> import torch, gossamer
        >>> from gossamer.extend import ALGORITHMS, Schedule, StepIO, Stepped, synchronous_step
        >>> class WithLr(Schedule):  # the synchronous step, its row also reporting η_t
        ...     def step(self, io: StepIO) -> Stepped:
        ...         stepped = synchronous_step(self, io)
        ...         return stepped._replace(metrics={**stepped.metrics, "step_lr": io.lr})
        >>> _ = ALGORITHMS.register("with-lr", help="its rows report the lr")(lambda cfg, ctx: WithLr())
        >>> x, y = torch.randn(80, 40), torch.randint(0, 10, (80,))
        >>> data = gossamer.Data(train=(x[:64], y[:64]), test=(x[64:], y[64:]))
        >>> rows = gossamer.run({"algorithm": "with-lr", "model": "mlp", "workers": 4, "epochs": 1, "batch_size": 8,
        ...                      "lr": 0.05}, data=data).rows
        >>> [row["step_lr"] for row in rows if "step_lr" in row]
        [0.05, 0.05]
    """
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
    restored; rows report it 1-based.

    Args:
        phases (list[Schedule]): the sub-schedules, in order.
        starts (list[int]): the first step of phases 2, 3, ...
        optimizer_state (list[Tensor]): the optimizer's rows, averaged with the models on entering
            a gradient-averaging phase from one that is not.
        grad_norm_ema (float): β of the EMA of φ² the rows report.
        tracks_grad_norm (bool): whether φ² is needed at every step, measured or not.
        topology (Topology | None): the graph of its decentralized phases.
        phase (int): the phase entered last.

    Example::

        >>> from gossamer.extend import Phases, Schedule
        >>> class Averaging(Schedule):  # mini-batch SGD's phase: it averages the gradients
        ...     def averages_gradients(self, t):
        ...         return True
        >>> phases = Phases([Averaging(), Schedule()], starts=[100])  # from step 100 on, local steps
        >>> phases.averages_gradients(99), phases.averages_gradients(100)
        (True, False)
        >>> phases.state_dict()
        {'phase': 0, 'phases': {'0': {}, '1': {}}}
    """

    phases: list[Schedule]
    starts: list[int]
    optimizer_state: list[torch.Tensor] = field(default_factory=list)
    grad_norm_ema: float = GRAD_NORM_EMA
    tracks_grad_norm: bool = False
    topology: Any = None
    phase: int = 0

    def _of(self, t: int) -> int:
        return bisect.bisect_right(self.starts, t)

    def computing(self, t: int) -> np.ndarray | None:
        return self.phases[self._of(t)].computing(t)

    def start(self, engine: Engine, X: torch.Tensor) -> None:
        self.phase = self._of(0)
        self.phases[self.phase].start(engine, X)

    def averages_gradients(self, t: int) -> bool:
        return self.phases[self._of(t)].averages_gradients(t)

    def on_gradients(self, engine: Engine, X: torch.Tensor, G: torch.Tensor, step: Step) -> None:
        self.phases[self.phase].on_gradients(engine, X, G, step)

    def after_step(self, engine: Engine, X: torch.Tensor, step: Step) -> dict:
        k = self.phase
        metrics = {"phase": k + 1, **self.phases[k].after_step(engine, X, step)}
        if k < len(self.starts) and step.t + 1 == self.starts[k]:
            self._enter(engine, X, k + 1, step.t + 1)
        return metrics

    def _enter(self, engine: Engine, X: torch.Tensor, k: int, t: int) -> None:
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


def begin_step(schedule: Schedule, engine: Engine, X: torch.Tensor, G: torch.Tensor, t: int, lr: float,
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
    """The rows that travel with the parameters: average or gossip them with X.

    Args:
        cfg (Config): the run's config (its ``average_optimizer_state``).
        ctx (Context): what the schedule is built from.

    Returns:
        list[Tensor]: the optimizer's state rows under ``average_optimizer_state``, then the
        model's buffers (BatchNorm's running statistics); each like X, a row per worker.

    Example::

        >>> import torch, gossamer
        >>> from gossamer.extend import ALGORITHMS, Engine, Schedule, shared_rows
        >>> class AverageAll(Schedule):  # the models and what travels with them, averaged every step
        ...     def __init__(self, shared):
        ...         self.shared = shared
        ...     def after_step(self, engine: Engine, X, step):
        ...         for rows in (X, *self.shared):
        ...             engine.allreduce_mean_(rows)
        ...         return {"shared_rows": len(self.shared)}
        >>> @ALGORITHMS.register("average-all", help="the models and their shared rows averaged every step")
        ... def build(cfg, ctx):
        ...     return AverageAll(shared_rows(cfg, ctx))
        >>> x, y = torch.randn(72, 40), torch.randint(0, 10, (72,))
        >>> result = gossamer.run({"algorithm": "average-all", "model": "mlp", "workers": 4, "epochs": 1,
        ...                        "batch_size": 8, "momentum": 0.9, "average_optimizer_state": True},
        ...                       data=gossamer.Data(train=(x[:64], y[:64]), test=(x[64:], y[64:])))
        >>> result.rows[-1]["shared_rows"]  # SGD's momentum buffer
        1
    """
    return [*(ctx.optimizer_rows if cfg.average_optimizer_state else []), *ctx.buffer_rows]


def graph_of(schedule: Schedule):
    """The Topology a schedule communicates on (its ``topology``); None: every worker is every
    other's neighbour (all-reduce, local SGD, DiLoCo)."""
    return getattr(schedule, "topology", None)


def build_schedule(cfg, ctx: Context) -> Schedule:
    """The schedule named by ``cfg.algorithm``."""
    return ALGORITHMS[cfg.algorithm].build(cfg, ctx)
