"""Communication schedules: which operator runs on which rows after which step.

Every algorithm of both papers is a schedule over the hooks of the training loop: ``start``
(before the first step), ``on_gradients`` (after backward, before the local optimizer step:
where mini-batch SGD averages gradients) and ``after_step`` (after the local step: where models
are averaged or gossiped). ``t`` is the 0-based index of the step being taken.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .compression import sign_compress, sign_decompress
from .optim import SGD
from .topology import Topology


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

    def on_gradients(self, engine, X: torch.Tensor, G: torch.Tensor, t: int) -> None:
        engine.allreduce_mean_(G)

    def after_step(self, engine, X: torch.Tensor, t: int) -> None:
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

    def on_gradients(self, engine, X: torch.Tensor, G: torch.Tensor, t: int) -> None:
        if t < self.switch:
            engine.allreduce_mean_(G)

    def after_step(self, engine, X: torch.Tensor, t: int) -> None:
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
class Gossip:
    """D-SGD (Kong et al.) over W_t.

    ``step-then-mix`` (the paper's form): X ← (X − η ∂F(X)) W_t — local step, then one gossip round.
    ``mix-then-step`` (Lian et al.'s D-PSGD form): X ← X W_t − η ∂F(X), the gradient taken at the
    pre-mixing models. ``extra`` (optimizer state averaged with the parameters) is mixed alike.
    """

    topology: Topology
    form: str = "step-then-mix"
    extra: list[torch.Tensor] = field(default_factory=list)

    def start(self, engine, X: torch.Tensor) -> None:
        pass

    def _mix(self, engine, X: torch.Tensor, t: int) -> None:
        for rows in (X, *self.extra):
            engine.gossip_(rows, self.topology.mixing(t))

    def on_gradients(self, engine, X: torch.Tensor, G: torch.Tensor, t: int) -> None:
        if self.form == "mix-then-step":
            self._mix(engine, X, t)

    def after_step(self, engine, X: torch.Tensor, t: int) -> None:
        if self.form == "step-then-mix":
            self._mix(engine, X, t)


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

    def on_gradients(self, engine, X: torch.Tensor, G: torch.Tensor, t: int) -> None:
        pass

    def after_step(self, engine, X: torch.Tensor, t: int) -> None:
        if (t + 1) % self.local_steps:
            return
        engine.allreduce_mean_(X)
        pseudo_gradient = self.x_outer - X[:1]
        self.outer.step(self.x_outer, pseudo_gradient, self.outer_state, self.outer_lr)
        X.copy_(self.x_outer.expand_as(X))


ALGORITHMS = ("allreduce", "local", "post-local", "hierarchical", "gossip", "diloco")


def build_algorithm(cfg, topology: Topology, numels: list[int], optimizer_state: list[torch.Tensor],
                    switch_step: int):
    """The schedule named by ``cfg.algorithm``. ``optimizer_state`` is averaged with the
    parameters when ``cfg.average_optimizer_state``."""
    extra = optimizer_state if cfg.average_optimizer_state else []
    sync = ModelSync(cfg.compression, numels, extra)
    H = cfg.local_steps
    builders = {
        "allreduce": lambda: AllReduce(),
        "local": lambda: LocalSGD(H, sync),
        "post-local": lambda: LocalSGD(H, sync, switch=switch_step),
        "hierarchical": lambda: LocalSGD(H, sync, block_size=cfg.block_size, block_rounds=cfg.block_rounds),
        "gossip": lambda: Gossip(topology, cfg.gossip_form, extra),
        "diloco": lambda: DiLoCo(H, SGD(cfg.outer_momentum, cfg.outer_momentum > 0), cfg.outer_lr),
    }
    return builders[cfg.algorithm]()
