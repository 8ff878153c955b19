"""Asynchronous local SGD on real processes (``engine: dist``): the server's side as a schedule,
each worker's side as a :class:`Worker`, both fed by an event source — the network
(:mod:`gossamer.async_processes`) or an event log (:class:`Replay`). The rules are the
simulator's (:mod:`gossamer.algorithms.async_local`); what differs is who orders the events.

**Processes.** n workers and one server: P = n + 1 processes, rank ``server_rank`` the server (it
does not train), the other ranks workers 0 … n−1 in rank order. Worker w repeats: H_w inner steps
of its local optimizer from its last pull (its k-th step: its k-th batch, augmentation draw
k·n + w, and η_k, the learning-rate schedule at its own step count k — each worker's schedule is
its own, as in the authors' toy), then a push of g_w = θ_w − x_w with the loss and ‖∇f‖² of its
last step, then a wait for its pull. A worker of speed s_w > 1 (``slow_workers``,
``worker_speeds``, ``compute_jitter``) sleeps (s_w·ε_w(k) − 1) times each step's compute.

**The server** applies every push in the order it arrives: τ_w = v − v_w, θ ← OuterOpt(θ,
λ(τ_w)·g_w), v ← v + 1 (:func:`~gossamer.algorithms.async_local.apply_push`, the simulator's
rule); a push that arrives while no grace window is open opens one for ``grace_window`` wall
seconds; when it closes, every worker whose push it holds pulls θ (x_w ← θ, θ_w ← θ, v_w ← v), in
arrival order (grace 0: at once after its push).

**Loop steps and rows.** A loop step is n inner steps, as the simulator's: step t ends with the
push that brings the inner steps pushed so far to n(t + 1) or more. The server measures what it
holds: θ (the evaluated model), the model each worker last pushed, x_w = θ_w − g_w (the rows X,
Ξ² over them), the loss and ‖∇f‖² each worker last reported (φ² their mean over the n workers,
0 before a report), v and the staleness. Pushes and pulls are counted in the ledger as the
simulator counts them (one model each, level ``server``). Each event is recorded as it happens
(``record``): ``{"push": w, "read": v_w, "wrote": v}`` and ``{"pull": w, "version": v}``.

**Replay.** :class:`Replay` feeds the recorded events in their order to the same server code and
computes each push with the same :class:`Worker` code, one worker's row at a time as its process
did: the rows equal the processes' bit for bit (float64 and float32 alike, on the same machine
and thread count), and an event that does not follow from the log (a version that differs) stops
the replay naming it.

**A worker that dies** (its process killed: the server's receive or send to it fails) is dropped:
``{"gone": w}`` is recorded where the server learnt it, its round in flight is lost, and the
others go on, and the rows measure the living from then on (the engine's ``alive``); the replay
drops it at the same event. Only when every worker is gone does the run stop.

**A resumed run** (the server died; ``--resume`` restores its checkpoint): every worker rejoins,
``{"rejoin": w, "version": v, "count": k}``: it pulls θ, takes up its step count at the inner steps
of its that were applied (k) and starts a fresh local optimizer; the replay does the same at the
same event.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np
import torch

from ..engines.ledger import row_bytes
from ..network import Speeds
from ..outer import OuterStep
from ..registry import ConfigError
from .schedule import Schedule, Step, StepIO, Stepped

PUSH, PULL, GONE, REJOIN = "push", "pull", "gone", "rejoin"
KINDS = (PUSH, PULL, GONE, REJOIN)  # an event log's lines that are events (not its header, resumes or end)


class Event(NamedTuple):
    """A push's arrival (worker w's g_w [1, d], its last step's loss and ‖∇f‖²), a pull of w, w
    gone (its process died: it is dropped), or w rejoining a resumed run."""

    kind: str
    worker: int
    gradient: torch.Tensor | None = None
    loss: float = 0.0
    grad_norm_sq: float = 0.0


class Events(Protocol):
    """Where the server's events come from and where its pulls go."""

    def next(self) -> Event: ...

    def pull(self, worker: int, theta: torch.Tensor, version: int, rejoin: int | None = None) -> None:
        """θ at version v to ``worker``; ``rejoin``: its step count, where it rejoins a resumed run."""

    def record(self, entry: dict) -> None: ...

    def counters(self) -> dict: ...


@dataclass(kw_only=True)
class ParameterServer(Schedule):
    """What a parameter server keeps, simulated or on processes: θ, its version v, each worker's
    v_w and θ_w, and the counts its rows and summary report."""

    version: int = 0  # v
    versions: list[int] = field(default_factory=list)  # v_w
    pushes: int = 0
    pulls: int = 0
    staleness_sum: int = 0
    staleness_max: int = 0
    theta: torch.Tensor | None = None  # θ [1, d]
    anchor: torch.Tensor | None = None  # θ_w [n, d]

    def model_row(self, engine, X: torch.Tensor) -> torch.Tensor:
        return self.theta[0]

    def applied(self, staleness: int) -> None:
        """A push of staleness τ was applied: v ← v + 1."""
        self.version += 1
        self.staleness_sum += staleness
        self.staleness_max = max(self.staleness_max, staleness)

    def metrics(self) -> dict:
        return {"server_version": self.version, "staleness_mean": self.staleness_sum / max(self.version, 1),
                "staleness_max": self.staleness_max}

    def counters(self) -> dict:
        return {"pushes": self.pushes, "pulls": self.pulls, **self.metrics()}


@dataclass
class AsyncServer(ParameterServer):
    """The server's state and its loop steps (module docstring); ``events`` is set before training."""

    outer: OuterStep
    steps: list[int]  # H_w
    apply: object  # apply_push(outer, θ, g, staleness, t): the simulator's rule
    events: Events | None = None
    pushed_steps: int = 0  # inner steps pushed and applied
    counts: list[int] = field(default_factory=list)  # each worker's inner steps pushed and applied
    recorded: int = 0  # events recorded (the log's lines after its header, resumes aside)
    gone: int = 0  # workers dropped
    losses: torch.Tensor | None = None  # [n]
    grad_norms_sq: torch.Tensor | None = None  # [n]
    reported: list[bool] = field(default_factory=list)

    def start(self, engine, X: torch.Tensor) -> None:
        n = X.shape[0]
        self.theta, self.anchor = X[:1].clone(), X.clone()
        self.losses = torch.zeros(n, dtype=X.dtype, device=X.device)
        self.grad_norms_sq = torch.zeros(n, dtype=torch.float64)
        self.outer.start(self.theta)
        self.versions, self.reported, self.counts = [0] * n, [False] * n, [0] * n

    def step(self, io: StepIO) -> Stepped:
        """The events up to the push that completes loop step t (module docstring)."""
        while self.pushed_steps < len(self.steps) * (io.t + 1):
            event = self.events.next()
            if event.kind == PUSH:
                self._arrive(io, event)
            elif event.kind == PULL:
                self._pull(io, event.worker)
            elif event.kind == REJOIN:
                self._pull(io, event.worker, rejoin=True)
            else:
                self._drop(io, event.worker)
        phi_sq = float(self.grad_norms_sq.mean())
        ema = phi_sq if io.grad_norm_sq_ema is None else \
            self.grad_norm_ema * io.grad_norm_sq_ema + (1 - self.grad_norm_ema) * phi_sq
        computed = [w for w, r in enumerate(self.reported) if r]
        return Stepped(self.losses, computed, Step(io.t, io.lr, phi_sq, ema, io.measure), ema, self.metrics())

    def _arrive(self, io: StepIO, event: Event) -> None:
        w = event.worker
        staleness = self.version - self.versions[w]
        io.X[w] = self.anchor[w] - event.gradient[0]  # the model w pushed
        self.apply(self.outer, self.theta, event.gradient, staleness, io.t)
        self.applied(staleness)
        self.pushes += 1
        self.pushed_steps += self.steps[w]
        self.counts[w] += self.steps[w]
        self.losses[w], self.grad_norms_sq[w], self.reported[w] = event.loss, event.grad_norm_sq, True
        io.engine.server_message("push", row_bytes(io.X), w)
        self._record({PUSH: w, "read": self.versions[w], "wrote": self.version})

    def _record(self, entry: dict) -> None:
        self.recorded += 1
        self.events.record(entry)

    def _drop(self, io: StepIO, w: int) -> None:
        """w is gone: the metrics are over the living from now on."""
        alive = np.ones(len(self.steps), dtype=bool) if io.engine.alive is None else io.engine.alive.copy()
        alive[w] = False
        io.engine.set_alive(alive)
        self.gone += 1
        self._record({GONE: w})

    def _pull(self, io: StepIO, w: int, rejoin: bool = False) -> None:
        """w pulls θ; ``rejoin``: a worker of a resumed run, which also takes its step count (the
        inner steps of its that were applied) and starts a fresh local optimizer."""
        self.anchor[w] = self.theta[0]
        self.versions[w] = self.version
        self.pulls += 1
        io.engine.server_message("pull", row_bytes(io.X), w)
        if rejoin and io.engine.alive is not None:  # alive again, if it had gone
            alive = io.engine.alive.copy()
            alive[w] = True
            io.engine.set_alive(alive)
        self._record({REJOIN: w, "version": self.version, "count": self.counts[w]} if rejoin else
                     {PULL: w, "version": self.version})
        self.events.pull(w, self.theta, self.version, self.counts[w] if rejoin else None)

    def counters(self) -> dict:
        return {**super().counters(), "workers_gone": self.gone, **self.events.counters()}

    def state_dict(self) -> dict:
        return {**{key: getattr(self, key) for key in COUNTERS}, "versions": list(self.versions),
                "counts": list(self.counts), "reported": list(self.reported),
                "grad_norms_sq": self.grad_norms_sq.tolist(), "outer": self.outer.state_dict(),
                "rows": {"anchor": self.anchor, "losses": self.losses}, "theta": self.theta}

    def load_state_dict(self, state: dict) -> None:
        for key in COUNTERS:
            setattr(self, key, int(state[key]))
        self.versions, self.counts = [int(v) for v in state["versions"]], [int(k) for k in state["counts"]]
        self.reported = [bool(r) for r in state["reported"]]
        self.grad_norms_sq = torch.tensor(state["grad_norms_sq"], dtype=torch.float64)
        self.outer.load_state_dict(state["outer"])
        self.theta.copy_(state["theta"])
        for key, rows in state["rows"].items():
            getattr(self, key).copy_(rows)


COUNTERS = ("version", "pushed_steps", "recorded", "pushes", "pulls", "gone", "staleness_sum", "staleness_max")


@dataclass
class Worker:
    """Worker w's side (module docstring): its one-row run (``run``: model, local optimizer and
    batches of worker w alone), θ_w, its step count k, H_w; ``sleeps``: a process that sleeps
    its extra compute (a replay does not)."""

    run: object  # gossamer.train.Run on an engine holding row w
    worker: int
    steps: int  # H_w
    lr: object  # η_k: lr_at(cfg, k, steps_per_epoch)
    batches: object  # gossamer.train.Batches of the run
    speeds: Speeds | None = None
    reset: bool = False  # inner_state: reset
    count: int = 0
    anchor: torch.Tensor | None = None

    def __post_init__(self):
        self.anchor = self.run.workers.X.clone()

    def round(self) -> Event:
        """H_w inner steps from the last pull, then the push: g_w = θ_w − x_w."""
        workers, n = self.run.workers, self.run.cfg.workers
        for _ in range(self.steps):
            began = time.perf_counter()
            x, y = self.batches.of(self.count, self.count * n + self.worker)
            loss = workers.loss_and_grad(x, y)
            grad_norm_sq = float(workers.G.pow(2).sum())
            self.run.optimizer.step(workers.X, workers.G, self.lr(self.count), None)
            if self.speeds is not None:
                extra = self.speeds.factor(self.count, self.worker) - 1
                if extra > 0:
                    time.sleep(extra * (time.perf_counter() - began))
            self.count += 1
        return Event(PUSH, self.worker, self.anchor - workers.X, float(loss[0]), grad_norm_sq)

    def pull(self, theta: torch.Tensor, rejoin: int | None = None) -> None:
        """x_w ← θ, θ_w ← θ (and, with inner_state reset, a fresh local optimizer); ``rejoin``: the
        step count of a worker that rejoins a resumed run (its optimizer starts afresh)."""
        self.run.workers.X.copy_(theta)
        self.anchor.copy_(theta)
        if self.reset or rejoin is not None:
            self.run.optimizer.reset_(0)
        if rejoin is not None:
            self.count = rejoin


class Replay:
    """The events of a log (``entries``, after its header) with the pushes computed by ``workers``
    (module docstring); ``where`` names the log in errors."""

    def __init__(self, entries: list[dict], workers: list[Worker], where: str):
        self.entries, self.workers, self.where, self.taken = entries, workers, where, 0

    def next(self) -> Event:
        if self.taken == len(self.entries):
            raise ConfigError(f"--replay {self.where}: the event log ends after event {self.taken}; the run needs "
                              f"more (it stopped before its last step)")
        entry = self.entries[self.taken]
        self.taken += 1
        if PUSH in entry:
            return self.workers[entry[PUSH]].round()
        kind = next(k for k in KINDS if k in entry)
        return Event(kind, entry[kind])

    def pull(self, worker: int, theta: torch.Tensor, version: int, rejoin: int | None = None) -> None:
        self.workers[worker].pull(theta, rejoin)

    def record(self, entry: dict) -> None:
        logged = {k: v for k, v in self.entries[self.taken - 1].items() if k in entry}
        if logged != entry:
            raise ConfigError(f"--replay {self.where}: event {self.taken} of the log is {logged}, the replay gives "
                              f"{entry}; the log is not this run's")

    def counters(self) -> dict:
        return {}
