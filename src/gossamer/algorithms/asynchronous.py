"""Asynchronous decentralized SGD, AD-PSGD (Lian, Zhang, Zhang, Liu, ICML 2018), as an
event-driven simulation on the per-worker clocks of :mod:`gossamer.network`.

Every worker i repeats, on its own clock: take the model x̂_i = x_i, compute a stochastic
gradient g_i = ∇F_i(x̂_i; ξ_i) (its k-th batch), then, atomically with one neighbour j drawn
uniformly from i's neighbours in W_k (the topology's round k = i's gradient count), average
x_i, x_j ← (x_i + x_j)/2, and apply x_i ← x_i − η g_i: the gradient of the stale model x̂_i
to the averaged one (the paper's Algorithm 1). j is passive: its own computation runs on.

**Events.** Worker i's k-th gradient takes c·s_i·ε_i(k) (``compute_ms``, ``slow_workers``,
``compute_jitter``); it ends at f_i. Events run in the order of (f_i, i): ties by worker index.
At f_i the pair average and the update happen at once, and i's next gradient starts at
f_i + τ, τ = α + m/β of the link between i and j (the exchange of the two models, full duplex).
Without a network section c = 1 and τ = 0: rounds of n events in worker order. Every draw comes
from the seed, so a run is deterministic and Ξ² is exact at every measurement. A loop step is
n events (n gradient evaluations: an epoch counts the same samples as the synchronous ones);
measurement traffic (``count_metrics``) pauses every worker for its time after the step.

**Batching.** The models x̂ of the gradients not yet computed are fixed when they start, so all
of them are computed in one batched call when the next event needs one: with equal speeds, one
call per n events, as synchronous D-SGD.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ..registry import ConfigError
from ..rng import host_generator
from ..topology import Topology
from .gossip import GraphOptions, build_graph
from .schedule import ALGORITHMS, Context, Schedule

NEIGHBOUR_STREAM = 18  # the key that sets the neighbour draws of (seed, k, i) apart
# (x̂ [n, d], each worker's batch count [n], the call's number, the workers whose gradients are
# needed) → (losses [n], gradients [n, d]; rows of the other workers undefined)
Gradients = Callable[[torch.Tensor, np.ndarray, int, list[int]], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class Timing:
    """What the events cost: c, the factors s_i·ε_i(k), and τ between two workers."""

    compute: float = 1.0
    factor: Callable[[int, int], float] = lambda k, i: 1.0
    message: Callable[[int, int], float] = lambda i, j: 0.0


@dataclass
class ADPSGD(Schedule):
    """AD-PSGD's events (module docstring). State: the time, each worker's end of its current
    gradient f_i and count k_i, the models x̂ its gradients are taken at, the gradients already
    computed, and the batched calls so far."""

    topology: Topology
    seed: int
    now: float = 0.0
    finish: list[float] = field(default_factory=list)  # [] until the first step (then f_i)
    count: list[int] = field(default_factory=list)
    ready: list[bool] = field(default_factory=list)  # whether g_i of the current gradient is computed
    calls: int = 0  # batched gradient calls (each draws its augmentation from it)
    stale: torch.Tensor | None = None  # x̂ [n, d]
    grads: torch.Tensor | None = None  # [n, d]
    losses: torch.Tensor | None = None  # [n]

    def start(self, engine, X: torch.Tensor) -> None:
        self.stale, self.grads = X.clone(), torch.zeros_like(X)
        self.losses = torch.zeros(X.shape[0], dtype=X.dtype, device=X.device)

    def neighbour(self, i: int, k: int) -> int | None:
        """j drawn uniformly from i's neighbours in W_k (None: none in that round)."""
        mixing = self.topology.mixing(k)
        peers = mixing.plan(("neighbours", i), lambda: sorted({int(j) for j, w in zip(mixing.index[:, i],
                                                                                     mixing.weight[:, i])
                                                               if w != 0 and j != i}))
        if not peers:
            return None
        return peers[host_generator(self.seed, NEIGHBOUR_STREAM, k, i).integers(len(peers))]

    def advance(self, engine, X: torch.Tensor, lr: float, update: Callable, gradients: Gradients,
                timing: Timing) -> float:
        """The next n events; ``update(x_i, g_i, lr, rows)`` applies a gradient to a row (the
        optimizer's step on ``rows`` of its state).
        Returns the communication time of the step per worker (mean over workers)."""
        n = X.shape[0]
        if not self.finish:
            self.finish = [timing.compute * timing.factor(0, i) for i in range(n)]
            self.count, self.ready = [0] * n, [False] * n
        comm = 0.0
        for _ in range(n):
            i = min(range(n), key=lambda w: (self.finish[w], w))
            if not self.ready[i]:
                self._compute(X, gradients)
            self.now = self.finish[i]
            j = self.neighbour(i, self.count[i])
            tau = 0.0
            if j is not None:
                pair = X[[i, j]]
                X[[i, j]] = pair.mean(0, keepdim=True).expand_as(pair)
                tau = timing.message(i, j)
            update(X[i : i + 1], self.grads[i : i + 1].clone(), lr, slice(i, i + 1))
            self.count[i] += 1
            self.stale[i] = X[i]
            self.ready[i] = False
            self.finish[i] = self.now + tau + timing.compute * timing.factor(self.count[i], i)
            comm += tau
        engine.comm.pairwise(X.shape[1])
        return comm / n

    def _compute(self, X: torch.Tensor, gradients: Gradients) -> None:
        """Every gradient not yet computed, in one batched call at its x̂."""
        rows = [i for i, r in enumerate(self.ready) if not r]
        waiting = torch.tensor(rows, device=X.device)
        losses, grads = gradients(self.stale, np.array(self.count), self.calls, rows)
        self.calls += 1
        self.grads.index_copy_(0, waiting, grads.index_select(0, waiting))
        self.losses.index_copy_(0, waiting, losses.index_select(0, waiting))
        self.ready = [True] * len(self.ready)

    def pause(self, seconds: float) -> None:
        """Every worker stops for ``seconds`` (measurement traffic)."""
        self.now += seconds
        self.finish = [f + seconds for f in self.finish]

    def state_dict(self) -> dict:
        return {"now": self.now, "finish": list(self.finish), "count": list(self.count), "ready": list(self.ready),
                "calls": self.calls, "rows": {"stale": self.stale, "grads": self.grads, "losses": self.losses}}

    def load_state_dict(self, state: dict) -> None:
        self.now, self.calls = float(state["now"]), int(state["calls"])
        self.finish = [float(f) for f in state["finish"]]
        self.count, self.ready = [int(k) for k in state["count"]], [bool(r) for r in state["ready"]]
        for key, rows in state["rows"].items():
            getattr(self, key).copy_(rows)


@dataclass
class ADPSGDOptions(GraphOptions):
    def validate(self, cfg) -> None:
        super().validate(cfg)
        if cfg.engine != "sim":
            raise ConfigError(f"algorithm ad-psgd runs only on engine sim (an event-driven simulation); engine "
                              f"{cfg.engine} does not run it")
        if cfg.optimizer != "sgd":
            raise ConfigError(f"algorithm ad-psgd applies each gradient on its worker's clock with optimizer sgd; "
                              f"{cfg.optimizer} counts its steps in lock step")
        if cfg.average_optimizer_state:
            raise ConfigError("algorithm ad-psgd averages only the parameters of a pair: use "
                              "average_optimizer_state: false")
        if cfg.network is not None and (cfg.compute_ms is None or cfg.compute_ms == "measured"):
            raise ConfigError("algorithm ad-psgd orders its events by the simulated clock: give compute_ms in "
                              "milliseconds or as flops:TFLOPS, not measured")


@ALGORITHMS.register("ad-psgd", options=ADPSGDOptions, example=("topology=ring",),
                     help="asynchronous decentralized SGD: pairwise averages with one random neighbour on each "
                          "worker's own clock (Lian et al. 2018)")
def _ad_psgd(cfg, ctx: Context) -> ADPSGD:
    return ADPSGD(build_graph(cfg), cfg.seed)
