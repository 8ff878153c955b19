"""Asynchronous decentralized SGD, AD-PSGD (Lian, Zhang, Zhang, Liu, ICML 2018), as an
event-driven simulation on the per-worker clocks of :mod:`gossamer.network`.

Every worker i repeats, on its own clock: read the model x̂_i = x_i, compute a stochastic
gradient g_i = ∇F_i(x̂_i; ξ_i) (its k-th batch), then, atomically with one neighbour j drawn
uniformly from i's neighbours in W_k (the topology's round k = i's gradient count), average
x_i, x_j ← (x_i + x_j)/2 (symmetric whoever picks whom, so a doubly stochastic directed graph
such as directed-exponential runs too: it only sets which peers i draws from), and apply x_i ← x_i − η g_i: the gradient of the stale model x̂_i
to the averaged one (the paper's Algorithm 1). j is passive: its own computation runs on.

**Events.** Worker i's k-th gradient takes c·s_i·ε_i(k) (``compute_ms``, ``slow_workers``,
``compute_jitter``); it ends at f_i. Events run in the order of (f_i, i): ties by worker index.
At f_i the pair average and the update happen at once, and i's next gradient starts at
f_i + τ, τ = α + m/β of the link between i and j (the exchange of the two models, full duplex):
it reads x_i then, so a passive average that lands on i inside (f_i, f_i + τ) reaches its next
gradient. Reads and events are ordered alike, by (time, worker). Without a network section c = 1
and τ = 0: rounds of n events in worker order. Every draw comes
from the seed, so a run is deterministic and Ξ² is exact at every measurement. A loop step is
n events (n gradient evaluations: an epoch counts the same samples as the synchronous ones).

**Participation.** An event is a step of one worker: the ledger keeps its computation (worker i,
its k-th gradient) and its pair average, a one-sided gossip round of the pair (only i waits for
it and spends τ; j is passive) — none when i has no neighbour that round. The run's clock
(:mod:`gossamer.network`) prices them in order, so the per-worker clocks it keeps are the event
times: a step starts each worker's next event from its clock (measurement traffic, with
``count_metrics``, holds everyone until it ends; a gradient not yet begun reads x_i then).

**Batching.** The models x̂ of the gradients not yet computed are fixed once read, so all the read
ones are computed in one batched call when the next event needs one: with equal speeds, one call
per n events, as synchronous D-SGD. A read is taken when the next moment after it comes (x only
changes at events, so x_i is then what it was at the read).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ..engines.ledger import row_bytes
from ..registry import ConfigError, short
from ..rng import row_uniforms
from ..topology import Mixing, Topology
from .gossip import GraphOptions, build_graph
from .schedule import ALGORITHMS, Context, Schedule, StepIO, Stepped, begin_step

@dataclass
class Timing:
    """What the events cost: c, the factors s_i·ε_i(k), τ between two workers, and the time each
    worker's current gradient started (the clock's; without one, its gradient count)."""

    compute: float = 1.0
    factor: Callable[[int, int], float] = lambda k, i: 1.0
    message: Callable[[int, int], float] = lambda i, j: 0.0
    started: Callable[[list[int]], np.ndarray] = lambda count: np.array(count, dtype=np.float64)

    @classmethod
    def of(cls, clock, nbytes: float) -> Timing:
        """The run's clock's costs (a model of ``nbytes`` per message); unit ones without a clock."""
        if clock is None:
            return cls()
        return cls(clock.step_seconds, clock.speeds.factor, lambda i, j: clock.network.pair_seconds(i, j, nbytes),
                   lambda count: clock.times.copy())


def pair_mixing(n: int, i: int, j: int) -> Mixing:
    """W of the pair average x_i, x_j ← (x_i + x_j)/2, every other worker unchanged."""
    index = np.tile(np.arange(n, dtype=np.int64), (2, 1))
    weight = np.zeros((2, n))
    weight[0] = 1.0
    index[1, [i, j]] = j, i
    weight[:, [i, j]] = 0.5
    return Mixing(index, weight)


@dataclass
class ADPSGD(Schedule):
    """AD-PSGD's events (module docstring). State: each worker's gradient count k_i, the models x̂
    its gradients are taken at, the time of each read still to take, the gradients already computed,
    and the batched calls so far."""

    topology: Topology
    seed: int
    timing: Timing = field(default_factory=Timing)
    count: list[int] = field(default_factory=list)
    ready: list[bool] = field(default_factory=list)  # whether g_i of the current gradient is computed
    reads: list[float | None] = field(default_factory=list)  # when i's next gradient reads x_i (None: it has)
    calls: int = 0  # batched gradient calls (each draws its augmentation from it)
    stale: torch.Tensor | None = None  # x̂ [n, d]
    grads: torch.Tensor | None = None  # [n, d]
    losses: torch.Tensor | None = None  # [n]
    _pairs: dict = field(default_factory=dict, repr=False)  # pair_mixing by pair, kept with their plans

    def start(self, engine, X: torch.Tensor) -> None:
        n = X.shape[0]
        self.stale, self.grads = X.clone(), torch.zeros_like(X)
        self.losses = torch.zeros(n, dtype=X.dtype, device=X.device)
        self.count, self.ready, self.reads = [0] * n, [False] * n, [None] * n

    def neighbour(self, i: int, k: int) -> int | None:
        """j drawn uniformly from i's m neighbours in W_k (None: none in that round): the ⌊m·u⌋-th,
        u worker i's row of row stream ``ad-psgd-neighbour`` (seed, k); a bias below m·2⁻⁵³."""
        mixing = self.topology.mixing(k)
        peers = mixing.plan(("neighbours", i), lambda: sorted({int(j) for j, w in zip(mixing.index[:, i],
                                                                                     mixing.weight[:, i])
                                                               if w != 0 and j != i}))
        if not peers:
            return None
        return peers[int(len(peers) * row_uniforms("ad-psgd-neighbour", self.seed, k, rows=[i], width=1)[0, 0])]

    def step(self, io: StepIO) -> Stepped:
        """The next n events, each a step of one worker (module docstring)."""
        X, n, timing = io.X, io.X.shape[0], self.timing
        started = timing.started(self.count)  # the clock's: later than a read still to take after a hold
        self.reads = [None if at is None else float(started[i]) for i, at in enumerate(self.reads)]
        finish = [started[i] + timing.compute * timing.factor(self.count[i], i) for i in range(n)]
        for _ in range(n):
            i = min(range(n), key=lambda w: (finish[w], w))
            self._read(X, (finish[i], i))
            if not self.ready[i]:
                self._compute(io)
            k = self.count[i]
            io.engine.comm.compute(np.array([i]), np.array([k]))
            j = self.neighbour(i, k)
            tau = 0.0
            if j is not None:
                pair = (min(i, j), max(i, j))
                if pair not in self._pairs:
                    self._pairs[pair] = pair_mixing(n, *pair)
                io.engine.gossip_(X, self._pairs[pair], initiator=i)
                tau = timing.message(i, j)
            io.G[i] = self.grads[i]
            io.update(np.array([i]))
            self.count[i] += 1
            self.ready[i], self.reads[i] = False, float(finish[i] + tau)
            finish[i] = self.reads[i] + timing.compute * timing.factor(self.count[i], i)  # the clock's order of sums
        io.G.copy_(self.grads)  # each worker's latest gradient, for φ²
        step, ema = begin_step(self, io.engine, X, io.G, io.t, io.lr, io.grad_norm_sq_ema, io.measure, average=False)
        return Stepped(self.losses, None, step, ema, {})

    def _read(self, X: torch.Tensor, now: tuple[float, int]) -> None:
        """x̂_w ← x_w for each read still to take at (time, w) up to the moment ``now``."""
        for w, at in enumerate(self.reads):
            if at is not None and (at, w) <= now:
                self.stale[w] = X[w]
                self.reads[w] = None

    def _compute(self, io: StepIO) -> None:
        """Every gradient read but not yet computed, in one batched call at its x̂."""
        rows = [i for i, r in enumerate(self.ready) if not r and self.reads[i] is None]
        waiting = torch.tensor(rows, device=io.X.device)
        losses = io.gradients(np.array(rows), self.stale, np.array(self.count), self.calls)
        self.calls += 1
        self.grads.index_copy_(0, waiting, io.G.index_select(0, waiting))
        self.losses.index_copy_(0, waiting, losses.index_select(0, waiting))
        for i in rows:
            self.ready[i] = True

    def state_dict(self) -> dict:
        return {"count": list(self.count), "ready": list(self.ready), "reads": list(self.reads), "calls": self.calls,
                "rows": {"stale": self.stale, "grads": self.grads, "losses": self.losses}}

    def load_state_dict(self, state: dict) -> None:
        self.calls = int(state["calls"])
        self.count, self.ready = [int(k) for k in state["count"]], [bool(r) for r in state["ready"]]
        self.reads = [None if r is None else float(r) for r in state["reads"]]
        for key, rows in state["rows"].items():
            getattr(self, key).copy_(rows)


def check_engine(cfg, server_rank: int) -> None:
    """The engines an event-driven algorithm runs on: the simulator (:func:`check_event_driven`),
    or real processes with a server or coordinator at ``server_rank`` (engine dist, gloo, a real
    network)."""
    if cfg.engine != "dist":
        check_event_driven(cfg)
        if server_rank != 0:
            raise ConfigError("server_rank applies only to engine dist (the rank of the server or coordinator)")
        return
    if not isinstance(server_rank, int) or isinstance(server_rank, bool) or server_rank < 0:
        raise ConfigError(f"server_rank must be a rank >= 0, got {short(server_rank)}")
    if cfg.network is not None:
        raise ConfigError(f"{cfg.algorithm} on engine dist runs on a real network: drop the network section (its "
                          f"clock is the simulator's)")
    if cfg.dist_backend == "nccl":
        raise ConfigError(f"{cfg.algorithm} on engine dist sends its messages point to point over gloo: use "
                          f"dist_backend gloo or auto")


def check_event_driven(cfg) -> None:
    """What an event-driven simulation needs: engine sim, and with a network, the compute times
    known before the events run."""
    if cfg.engine != "sim":
        raise ConfigError(f"algorithm {cfg.algorithm} runs only on engine sim (an event-driven simulation); engine "
                          f"{cfg.engine} does not run it")
    if cfg.network is not None and (cfg.compute_ms is None or cfg.compute_ms == "measured"):
        raise ConfigError(f"algorithm {cfg.algorithm} orders its events by the simulated clock: give compute_ms in "
                          f"milliseconds or as flops:TFLOPS, not measured")


@dataclass
class ADPSGDOptions(GraphOptions):
    server_rank: int = 0  # engine dist: the rank of the coordinator process (it does not train)

    def validate(self, cfg) -> None:
        super().validate(cfg)
        check_engine(cfg, self.server_rank)
        if cfg.average_optimizer_state:
            raise ConfigError("algorithm ad-psgd averages only the parameters of a pair: use "
                              "average_optimizer_state: false")


@ALGORITHMS.register("ad-psgd", options=ADPSGDOptions, example=("topology=ring",), server="pairs",
                     help="asynchronous decentralized SGD: pairwise averages with one random neighbour on each "
                          "worker's own clock (Lian et al. 2018)")
def _ad_psgd(cfg, ctx: Context) -> ADPSGD:
    return ADPSGD(build_graph(cfg), cfg.seed, Timing.of(ctx.clock, row_bytes(ctx.X)))
