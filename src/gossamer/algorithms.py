"""Communication schedules: which operator runs on which rows after which step.

Every algorithm of both papers is a schedule over the hooks of the training loop: ``start``
(before the first step), ``on_gradients`` (after backward, before the local optimizer step:
where mini-batch SGD averages gradients) and ``after_step`` (after the local step: where models
are averaged or gossiped; it may return metrics for the step's row). ``step.t`` is the 0-based
index of the step being taken.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import torch

from .compression import sign_compress, sign_decompress
from .consensus import Controller, Step
from .optim import SGD
from .topology import Mixing, Topology, round_p


@dataclass
class ModelSync:
    """Averages the models of a group (all n workers, or a block), exactly or sign-compressed.

    Exact: x_i ← mean of the group, and the same for each ``extra`` tensor (optimizer state,
    when it is averaged with the parameters). Compressed (Lin et al.): each worker sends
    C(Δ_i), Δ_i = x_i − x_ref (+ e_i with error feedback), x_ref the group's model at its last
    sync at that level; then x_i ← x_ref + mean_group C(Δ_j) and, with error feedback,
    e_i ← Δ_i − C(Δ_i). A global sync also resets the block reference.
    """

    compression: str = "none"  # none | sign | ef-sign
    numels: list[int] = field(default_factory=list)  # tensor sizes in a row (per-tensor scales)
    extra: list[torch.Tensor] = field(default_factory=list)
    ref: dict[str, torch.Tensor] = field(default_factory=dict)
    error: dict[str, torch.Tensor] = field(default_factory=dict)

    def start(self, X: torch.Tensor, levels: tuple[str, ...] = ("global",)) -> None:
        """Take X (identical rows) as the reference of every level."""
        if self.compression != "none":
            self.ref = {level: X.clone() for level in levels}
            self.error = {level: torch.zeros_like(X) for level in levels} if self.compression == "ef-sign" else {}

    def __call__(self, engine, X: torch.Tensor, block_size: int | None = None) -> None:
        level = "block" if block_size else "global"
        if self.compression == "none":
            for rows in (X, *self.extra):
                engine.block_mean_(rows, block_size) if block_size else engine.allreduce_mean_(rows)
            return
        delta = X - self.ref[level]
        if level in self.error:
            delta += self.error[level]
        message = sign_compress(delta, self.numels)
        mean_change = engine.sign_mean(message, self.numels, block_size)
        if level in self.error:
            self.error[level] = delta - sign_decompress(message, self.numels)
        X.copy_(self.ref[level].add_(mean_change))
        if level == "global":
            for name, ref in self.ref.items():
                if name != "global":
                    ref.copy_(X)


@dataclass
class AllReduce:
    """Mini-batch SGD (Lin et al.'s baseline): gradients averaged every step, global batch n·B."""

    def start(self, engine, X: torch.Tensor) -> None:
        pass

    def on_gradients(self, engine, X: torch.Tensor, G: torch.Tensor, step: Step) -> None:
        engine.allreduce_mean_(G)

    def after_step(self, engine, X: torch.Tensor, step: Step) -> None:
        pass


@dataclass
class LocalSGD:
    """Local SGD (Lin et al.): H local steps, then the group average (one all-reduce per H steps).

    From step ``switch`` on; before it, mini-batch SGD — that is post-local SGD (switch > 0).
    With ``block_size`` it is hierarchical local SGD: every H steps the average inside each block
    of ``block_size`` consecutive workers, and every ``block_rounds``-th time the global average
    instead (intra-block communication every H steps, global every H·H_b steps).
    """

    local_steps: int
    sync: ModelSync
    switch: int = 0
    block_size: int | None = None
    block_rounds: int = 1

    def start(self, engine, X: torch.Tensor) -> None:
        if self.switch == 0:
            self.sync.start(X, self._levels())

    def _levels(self) -> tuple[str, ...]:
        return ("global", "block") if self.block_size else ("global",)

    def on_gradients(self, engine, X: torch.Tensor, G: torch.Tensor, step: Step) -> None:
        if step.t < self.switch:
            engine.allreduce_mean_(G)

    def after_step(self, engine, X: torch.Tensor, step: Step) -> None:
        t = step.t
        if t < self.switch:
            if t + 1 == self.switch:
                self.sync.start(X, self._levels())
            return
        local_steps_done = t + 1 - self.switch
        if local_steps_done % self.local_steps:
            return
        sync_round = local_steps_done // self.local_steps
        if self.block_size and sync_round % self.block_rounds:
            self.sync(engine, X, self.block_size)
        else:
            self.sync(engine, X)


@dataclass
class Decentralized:
    """D-SGD (Kong et al.) over W_r, by training phase: all-reduce SGD, gossip, or controlled gossip.

    ``step-then-mix`` (the paper's form): X ← (X − η ∂F(X)) W — local step, then one gossip round.
    ``mix-then-step`` (Lian et al.'s D-PSGD form): X ← X W − η ∂F(X), the gradient taken at the
    pre-mixing models. In a ``controlled`` phase the controller adds rounds until Ξ ≤ target.
    Round r uses W_r (time-varying graphs advance per round, extra rounds included). Entering an
    all-reduce phase from a decentralized one averages the models and the optimizer ``state``
    once (else the local momenta would pull the models apart again). ``extra`` (optimizer state
    averaged with the parameters) is mixed alike.
    """

    topology: Topology
    form: str = "step-then-mix"
    modes: list[str] = field(default_factory=lambda: ["gossip"])
    phase_starts: list[int] = field(default_factory=list)  # first step of phases 2, 3, ...
    controller: Controller | None = None
    extra: list[torch.Tensor] = field(default_factory=list)
    state: list[torch.Tensor] = field(default_factory=list)
    rounds: int = 0
    _theta_sq: float | None = None
    _mixing: Mixing | None = None

    def start(self, engine, X: torch.Tensor) -> None:
        pass

    def phase(self, t: int) -> int:
        return bisect.bisect_right(self.phase_starts, t)

    def _round(self, engine, X: torch.Tensor, measure: bool = False) -> float | None:
        mixing = self.topology.mixing(self.rounds)
        self.rounds += 1
        for rows in self.extra:
            engine.gossip_(rows, mixing)
        self._mixing = mixing
        return engine.gossip_(X, mixing, measure=measure)

    def on_gradients(self, engine, X: torch.Tensor, G: torch.Tensor, step: Step) -> None:
        mode = self.modes[self.phase(step.t)]
        if mode == "allreduce":
            engine.allreduce_mean_(G)
        elif self.form == "mix-then-step":
            self._theta_sq = self._round(engine, X, measure=True)

    def after_step(self, engine, X: torch.Tensor, step: Step) -> dict:
        k = self.phase(step.t)
        metrics = {"phase": k + 1, "extra_gossip_rounds": 0}
        if self.modes[k] != "allreduce":
            if self.form == "step-then-mix":
                self._theta_sq = self._round(engine, X, measure=True)
            metrics.update(local_estimate(self._theta_sq, self._mixing))
            if self.modes[k] == "controlled":
                metrics.update(self.controller.control(engine, X, step, lambda: self._round(engine, X)))
            ends_here = k < len(self.phase_starts) and step.t + 1 == self.phase_starts[k]
            if ends_here and self.modes[k + 1] == "allreduce":
                for rows in (X, *self.state):
                    engine.allreduce_mean_(rows)
        return metrics


def local_estimate(theta_sq: float, mixing: Mixing) -> dict:
    """Θ² and the bound Ξ ≤ (2/p)Θ with p the mixing quality of the round (None if p = 0)."""
    p = round_p(mixing)
    bound = 2 / p * theta_sq**0.5 if p > 0 else None
    return {"theta_sq": theta_sq, "consensus_distance_bound": bound}


@dataclass
class DiLoCo:
    """DiLoCo (Douillard et al. 2023): H inner steps, then an outer step on the pseudo-gradient.

    Δ = x_outer − mean_i x_i (one all-reduce); the outer optimizer (SGD with Nesterov momentum,
    lr ``outer_lr``) moves x_outer along −Δ and every worker restarts from x_outer. With outer
    lr 1 and momentum 0, x_outer ← mean_i x_i: exactly local SGD.
    """

    local_steps: int
    outer: SGD
    outer_lr: float
    x_outer: torch.Tensor | None = None
    outer_state: dict = field(default_factory=dict)

    def start(self, engine, X: torch.Tensor) -> None:
        self.x_outer = X[:1].clone()
        self.outer_state = self.outer.init(self.x_outer)

    def on_gradients(self, engine, X: torch.Tensor, G: torch.Tensor, step: Step) -> None:
        pass

    def after_step(self, engine, X: torch.Tensor, step: Step) -> None:
        if (step.t + 1) % self.local_steps:
            return
        engine.allreduce_mean_(X)
        pseudo_gradient = self.x_outer - X[:1]
        self.outer.step(self.x_outer, pseudo_gradient, self.outer_state, self.outer_lr)
        X.copy_(self.x_outer.expand_as(X))


ALGORITHMS = ("allreduce", "local", "post-local", "hierarchical", "gossip", "diloco")


def build_algorithm(cfg, topology: Topology, numels: list[int], optimizer_state: list[torch.Tensor],
                    steps_per_epoch: int, controller: Controller | None = None):
    """The schedule named by ``cfg.algorithm``. ``optimizer_state`` is averaged with the
    parameters when ``cfg.average_optimizer_state``."""
    extra = optimizer_state if cfg.average_optimizer_state else []
    sync = ModelSync(cfg.compression, numels, extra)
    H = cfg.local_steps
    builders = {
        "allreduce": lambda: AllReduce(),
        "local": lambda: LocalSGD(H, sync),
        "post-local": lambda: LocalSGD(H, sync, switch=cfg.switch_at(steps_per_epoch)),
        "hierarchical": lambda: LocalSGD(H, sync, block_size=cfg.block_size, block_rounds=cfg.block_rounds),
        "gossip": lambda: Decentralized(topology, cfg.gossip_form, cfg.phase_modes(),
                                        [round(e * steps_per_epoch) for e in cfg.phase_boundaries()],
                                        controller, extra, optimizer_state),
        "diloco": lambda: DiLoCo(H, SGD(cfg.outer_momentum, cfg.outer_momentum > 0), cfg.outer_lr),
    }
    return builders[cfg.algorithm]()
