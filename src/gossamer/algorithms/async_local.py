"""Asynchronous local SGD (Liu, Chhaparia, Douillard, Kale, Rusu, Shen, Szlam, Ranzato 2024), as an
event-driven simulation on the per-worker clocks of :mod:`gossamer.network`. The rules, their
sources and what is not known: ``shared/specs/asynchronous-outer-steps.md`` §2, of the project's
design notes.

**Server and workers.** A parameter server (not one of the n workers) holds θ and its version v.
Worker w pulls θ (x_w ← θ, θ_w ← θ, v_w ← v), takes H_w inner steps of the local optimizer on
its own shard (its k-th step: its k-th batch), and pushes g_w = θ_w − x_w. The server applies
every push in the order of arrival: τ_w = v − v_w, θ ← OuterOpt(θ, λ(τ_w)·g_w), v ← v + 1,
with the staleness weight λ (``async_weight``): ``unit`` 1, ``constant`` √n/n, ``polynomial``
√n/n·(1 + τ)^−½ (the authors' toy, google-deepmind/asyncdiloco e783a30, ``synchronize``). The
outer optimizer is :mod:`gossamer.outer`'s (default ``delayed-nesterov``, the paper's DN with
N = n; ``nesterov``, ``sgd`` or ``adam``: the paper's "vanilla" one step per arrival). The models
start identical (no first pull), as every algorithm's.

**Grace window** (``grace_window``, γ simulated seconds; the toy's ``max_wait_time``): a push that
arrives when no window is open opens one until its arrival a + γ; every push arriving by then is
applied on arrival, each its own outer step, and its worker waits; at a + γ every waiting worker
pulls the latest θ. γ = 0: a worker pulls at once after its push (pushes that arrive at the same
moment share the window).

**DyLU** (``dylu``, the paper's dynamic local updates): H_w = max(H_min, ⌊(v_w / max v)·H⌋) with
v_w = 1/s_w, the speeds of ``slow_workers`` or ``worker_speeds``, and H_min ``dylu_min_steps``. **Inner state**
(``inner_state``): kept across pulls (``keep``, as HALoS and DiLoCo), or reset at each pull
(``reset``, as the authors' toy builds a fresh AdamW per round).

**Events and time.** Worker w's k-th step takes c·s_w·ε_w(k) on its own clock. A push leaves when
its last step ends, a pull when the window closes; each crosses the link between the worker and
the server, α + b/β (b the model's bytes; the link of another node, ``network.bandwidth`` and
``latency``). The server's link is shared: it carries one message's bytes at a time in each
direction (full duplex), first come first served, ties by worker, so a message waits while the
link carries another's (b/β each; the latency α is the path's, not the link's). Events run in
the order (time, kind, worker), kinds: a step's end, a push's arrival, a window's close. Without a
network section c = 1 and messages take no time. A loop step is n inner steps (n gradient
evaluations, as a synchronous step's) and the events up to the moment of its last.

**Ledger and clock.** A push and a pull are each one message of the model between a worker and
the server, level ``server``, counted on the worker's link (``bytes_per_worker`` =
(pushes + pulls)·b/n); the clock charges each to its worker alone, its wait for the server's link
or the window as idle time. The per-worker clocks are the event times.

**Batching.** A worker's inner steps read nothing but its own model, so the gradients of every
worker in a round whose next step is not yet computed are taken in one call when an event needs
one (with equal speeds, one call per loop step); the local optimizer steps the workers whose
steps ended together, before anything reads their models.

The evaluated model is θ. Rows report ``server_version`` (v), and ``staleness_mean`` and
``staleness_max`` over the pushes applied so far; the summary also ``pushes`` and ``pulls``
(sent: the last pushes may still be in flight).
"""

from __future__ import annotations

import heapq
import math
from functools import partial
from dataclasses import dataclass, field

import numpy as np
import torch

from ..engines.ledger import row_bytes
from ..network import Speeds
from ..outer import OuterOptions, OuterStep, build_outer
from ..registry import ConfigError, positive_ints, short
from .async_server import AsyncServer, ParameterServer
from .asynchronous import check_engine
from .schedule import ALGORITHMS, Context, StepIO, Stepped, begin_step

STEP, ARRIVAL, CLOSE = 0, 1, 2  # event kinds, in the order they run at one moment
WEIGHTS = ("unit", "constant", "polynomial")
INNER_STATES = ("keep", "reset")


@dataclass(frozen=True)
class ServerTiming:
    """What the events cost: c, the factors s_w·ε_w(k), a message to or from the server (α + b/β)
    and the time its bytes hold the server's link (b/β). Unit compute and free messages without a clock."""

    compute: float = 1.0
    factor: object = lambda k, w: 1.0
    message: float = 0.0
    hold: float = 0.0

    @classmethod
    def of(cls, clock, nbytes: float) -> ServerTiming:
        if clock is None:
            return cls()
        link = clock.network.link
        return cls(clock.step_seconds, clock.speeds.factor, link.message(nbytes), nbytes / link.bandwidth)


def staleness_weight(rule: str, n: int, staleness: int) -> float:
    """λ(τ) of ``async_weight`` (module docstring)."""
    if rule == "unit":
        return 1.0
    constant = math.sqrt(n) / n
    return constant if rule == "constant" else constant / math.sqrt(1 + staleness)


def apply_push(rule: str, n: int, outer: OuterStep, theta: torch.Tensor, gradient: torch.Tensor, staleness: int,
               t: int) -> None:
    """The server's step for a push g_w of staleness τ at loop step t: θ ← OuterOpt(θ, λ(τ)·g_w)
    (``gradient`` is left as it was)."""
    gradient = gradient.clone()
    weight = staleness_weight(rule, n, staleness)
    if weight != 1.0:
        gradient.mul_(weight)
    outer.step(theta, gradient, t, staleness)


@dataclass
class AsyncLocalSGD(ParameterServer):
    """The server, the workers' rounds and the event queue (module docstring)."""

    outer: OuterStep
    steps: list[int]  # H_w
    weight: str = "unit"
    grace: float = 0.0  # γ
    reset: bool = False  # inner_state: reset
    optimizer: object = None  # the local optimizer (its reset_ of a worker's state)
    timing: ServerTiming = field(default_factory=ServerTiming)
    left: list[int] = field(default_factory=list)  # inner steps left in w's round (0: pushed, waiting)
    count: list[int] = field(default_factory=list)  # inner steps w has taken
    ready: list[bool] = field(default_factory=list)  # whether w's next step's gradient is computed
    arrived: list[float] = field(default_factory=list)  # when w's last push arrived
    events: list[tuple[float, int, int]] = field(default_factory=list)  # the heap of (time, kind, worker)
    window: float | None = None  # when the open grace window closes
    waiting: list[int] = field(default_factory=list)  # the workers whose pushes it holds, in arrival order
    link_free: list[float] = field(default_factory=lambda: [0.0, 0.0])  # the server's link, in and out
    calls: int = 0  # batched gradient calls (each draws its augmentation from it)
    pushed: torch.Tensor | None = None  # g_w in flight [n, d]
    grads: torch.Tensor | None = None  # [n, d]
    losses: torch.Tensor | None = None  # [n]
    _stepped: list[int] = field(default_factory=list, repr=False)  # steps ended, the optimizer's still to take

    def start(self, engine, X: torch.Tensor) -> None:
        n = X.shape[0]
        self.theta, self.anchor = X[:1].clone(), X.clone()
        self.pushed, self.grads = torch.zeros_like(X), torch.zeros_like(X)
        self.losses = torch.zeros(n, dtype=X.dtype, device=X.device)
        self.outer.start(self.theta)
        self.versions, self.left, self.count = [0] * n, list(self.steps), [0] * n
        self.ready, self.arrived = [False] * n, [0.0] * n
        self.events = [(self._finish(0.0, w), STEP, w) for w in range(n)]
        heapq.heapify(self.events)

    def step(self, io: StepIO) -> Stepped:
        """The next n inner steps, with the pushes, arrivals and pulls among them and up to the
        moment of the last (module docstring)."""
        taken, last = 0, 0.0
        while taken < io.X.shape[0] or self.events[0][1] != STEP and self.events[0][0] <= last:
            now, kind, w = heapq.heappop(self.events)
            if kind == STEP:
                self._inner_step(io, now, w)
                taken, last = taken + 1, now
            elif kind == ARRIVAL:
                self._arrive(io, now, w)
            else:
                self._close(io, now)
        self._flush(io)
        io.G.copy_(self.grads)  # each worker's latest gradient, for φ²
        step, ema = begin_step(self, io.engine, io.X, io.G, io.t, io.lr, io.grad_norm_sq_ema, io.measure, average=False)
        return Stepped(self.losses, None, step, ema, self.metrics())

    def _inner_step(self, io: StepIO, now: float, w: int) -> None:
        """w's step ends: its gradient (computed now with the others' waiting ones, if not yet), the
        local optimizer's step (with the others' ending together), then its next step or its push."""
        if not self.ready[w]:
            self._compute(io)
        io.engine.comm.compute(np.array([w]), np.array([self.count[w]]))
        self._stepped.append(w)
        self.count[w] += 1
        self.left[w] -= 1
        self.ready[w] = False
        if self.left[w]:
            heapq.heappush(self.events, (self._finish(now, w), STEP, w))
            return
        self._flush(io)
        self.pushes += 1
        self.pushed[w] = self.anchor[w] - io.X[w]  # g_w = θ_w − x_w
        leaves = self._queue(0, now)
        io.engine.server_message("push", row_bytes(io.X), w, leaves - now)
        heapq.heappush(self.events, (leaves + self.timing.message, ARRIVAL, w))

    def _finish(self, start: float, w: int) -> float:
        """When w's next inner step, begun at ``start``, ends: start + c·s_w·ε_w(k), k its count."""
        return start + self.timing.compute * self.timing.factor(self.count[w], w)

    def _queue(self, direction: int, ready: float) -> float:
        """When a message ready at ``ready`` starts on the server's link (0: in, 1: out), first come
        first served; the link is then held for its bytes."""
        start = max(ready, self.link_free[direction])
        self.link_free[direction] = start + self.timing.hold
        return start

    def _arrive(self, io: StepIO, now: float, w: int) -> None:
        """w's push arrives: applied at once, its staleness weighed; w waits for the window to close."""
        self.arrived[w] = now
        if self.window is None:
            self.window = now + self.grace
            heapq.heappush(self.events, (self.window, CLOSE, -1))
        staleness = self.version - self.versions[w]
        apply_push(self.weight, len(self.steps), self.outer, self.theta, self.pushed[w : w + 1], staleness, io.t)
        self.applied(staleness)
        self.waiting.append(w)

    def _close(self, io: StepIO, now: float) -> None:
        """The window closes: every waiting worker pulls θ, in arrival order, and starts its next round."""
        for w in self.waiting:
            start = self._queue(1, now)
            io.engine.server_message("pull", row_bytes(io.X), w, start - self.arrived[w])
            self.pulls += 1
            io.X[w] = self.theta[0]
            self.anchor[w] = self.theta[0]
            self.versions[w] = self.version
            if self.reset:
                self.optimizer.reset_(w)
            self.left[w] = self.steps[w]
            heapq.heappush(self.events, (self._finish(start + self.timing.message, w), STEP, w))
        self.window, self.waiting = None, []

    def _compute(self, io: StepIO) -> None:
        """The gradient of every worker in a round whose next step is not computed, in one call."""
        self._flush(io)
        rows = [w for w, left in enumerate(self.left) if left and not self.ready[w]]
        index = torch.tensor(rows, device=io.X.device)
        losses = io.gradients(np.array(rows), None, np.array(self.count), self.calls)
        self.calls += 1
        self.grads.index_copy_(0, index, io.G.index_select(0, index))
        self.losses.index_copy_(0, index, losses.index_select(0, index))
        for w in rows:
            self.ready[w] = True

    def _flush(self, io: StepIO) -> None:
        """The local optimizer's step of the workers whose steps ended since the last flush."""
        if not self._stepped:
            return
        rows = np.array(self._stepped)
        index = torch.as_tensor(rows, device=io.X.device)
        io.G.index_copy_(0, index, self.grads.index_select(0, index))
        io.update(rows)
        self._stepped = []

    def state_dict(self) -> dict:
        return {"version": self.version, "versions": list(self.versions), "left": list(self.left),
                "count": list(self.count), "ready": list(self.ready), "arrived": list(self.arrived),
                "events": [list(e) for e in self.events], "window": self.window, "waiting": list(self.waiting),
                "link_free": list(self.link_free), "calls": self.calls, "pushes": self.pushes, "pulls": self.pulls,
                "staleness_sum": self.staleness_sum, "staleness_max": self.staleness_max,
                "outer": self.outer.state_dict(),
                "rows": {"anchor": self.anchor, "pushed": self.pushed, "grads": self.grads, "losses": self.losses},
                "theta": self.theta}

    def load_state_dict(self, state: dict) -> None:
        for key in ("version", "calls", "pushes", "pulls", "staleness_sum", "staleness_max"):
            setattr(self, key, int(state[key]))
        self.versions, self.left, self.count = ([int(v) for v in state[k]] for k in ("versions", "left", "count"))
        self.ready = [bool(r) for r in state["ready"]]
        self.arrived, self.link_free = [float(a) for a in state["arrived"]], [float(f) for f in state["link_free"]]
        self.events = [(float(at), int(kind), int(w)) for at, kind, w in state["events"]]
        self.window = None if state["window"] is None else float(state["window"])
        self.waiting = [int(w) for w in state["waiting"]]
        self.outer.load_state_dict(state["outer"])
        self.theta.copy_(state["theta"])
        for key, rows in state["rows"].items():
            getattr(self, key).copy_(rows)


@dataclass
class AsyncLocalSGDOptions(OuterOptions):
    outer_optimizer: str = "delayed-nesterov"  # the paper's DN; nesterov, sgd or adam: its "vanilla"
    local_steps: int = 1  # H: inner steps per round (the fastest worker's, with dylu)
    async_weight: str = "unit"  # λ(τ) of a push: unit | constant (√n/n) | polynomial (√n/n·(1+τ)^-1/2)
    grace_window: float = 0.0  # γ: seconds the server waits for more pushes before the pulls (engine dist: wall)
    dylu: bool = False  # H_w from the workers' speeds (slow_workers or worker_speeds)
    dylu_min_steps: int = 1  # H_min of DyLU
    inner_state: str = "keep"  # keep | reset: the local optimizer's state at each pull
    server_rank: int = 0  # engine dist: the rank of the server process (it does not train)

    def validate(self, cfg) -> None:
        positive_ints(self, "local_steps", "dylu_min_steps")
        super().validate(cfg)
        for key, choices in (("async_weight", WEIGHTS), ("inner_state", INNER_STATES)):
            if getattr(self, key) not in choices:
                raise ConfigError(f"unknown {key} '{short(getattr(self, key))}'; choose one of: {', '.join(choices)}")
        check_engine(cfg, self.server_rank)
        if cfg.average_optimizer_state:
            raise ConfigError("algorithm async-local-sgd keeps each worker's optimizer state: use "
                              "average_optimizer_state: false")
        if not (self.grace_window >= 0 and math.isfinite(self.grace_window)):
            raise ConfigError(f"grace_window must be >= 0 seconds, got {self.grace_window}")
        if self.grace_window and cfg.network is None and cfg.engine != "dist":
            raise ConfigError("grace_window is in simulated seconds: it needs a network section (network: PRESET)")
        if cfg.network is not None and cfg.network.count_metrics:
            raise ConfigError("network.count_metrics holds every worker for a measurement; async-local-sgd has no "
                              "such barrier: use count_metrics: false")
        if self.dylu and cfg.slow_workers is None and cfg.worker_speeds is None:
            raise ConfigError("dylu sets each worker's steps from its speed: it needs slow_workers (F@X) or "
                              "worker_speeds")
        if not self.dylu and self.dylu_min_steps != 1:
            raise ConfigError("dylu_min_steps applies only with dylu: true")


def local_steps_of(cfg) -> list[int]:
    """H_w of every worker: H, or DyLU's max(H_min, ⌊(min_j s_j / s_w)·H⌋)."""
    if not cfg.dylu:
        return [cfg.local_steps] * cfg.workers
    slow = Speeds.of(cfg).slow
    return [max(cfg.dylu_min_steps, math.floor(slow.min() / s * cfg.local_steps)) for s in slow]


@ALGORITHMS.register("async-local-sgd", options=AsyncLocalSGDOptions, example=("local_steps=2",), server="push-pull",
                     help="asynchronous local SGD: a server applies each worker's pseudo-gradient as it arrives, "
                          "Delayed Nesterov, DyLU, a grace window (Liu et al. 2024)")
def _async_local_sgd(cfg, ctx: Context) -> AsyncLocalSGD | AsyncServer:
    if cfg.engine == "dist":  # the server of real processes: its events come from the network or a log
        return AsyncServer(build_outer(cfg, ctx.total_steps), local_steps_of(cfg),
                           partial(apply_push, cfg.async_weight, cfg.workers))
    return AsyncLocalSGD(build_outer(cfg, ctx.total_steps), local_steps_of(cfg), cfg.async_weight, cfg.grace_window,
                         cfg.inner_state == "reset", ctx.optimizer, ServerTiming.of(ctx.clock, row_bytes(ctx.X)))
