"""The local SGD family (Lin et al., ICLR 2020): mini-batch SGD, local SGD, post-local SGD,
hierarchical local SGD, each with exact or compressed averaging.

- ``allreduce`` (:class:`AllReduce`): gradients averaged every step, a global batch of n·B.
- ``local`` (:class:`LocalSGD`): H local steps, then the average of the models.
- ``post-local``: :class:`AllReduce` until the switch step t′, then :class:`LocalSGD` (two
  :class:`~gossamer.algorithms.schedule.Phases`).
- ``hierarchical``: :class:`LocalSGD` with blocks: every H steps the average inside each block
  of consecutive workers (a node), every H_b-th time the global one.
- ``des-loc`` (:class:`DesLoc`, Iacob et al. 2025): local Adam whose parameters and two moments
  are averaged with periods of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..byzantine import byzantine_active
from ..codecs import Compressor, build_compressor, check_spec
from ..faults import REJOIN_MODES
from ..registry import ConfigError, positive_ints
from .schedule import ALGORITHMS, Context, Schedule, Step, phased, shared_rows


@dataclass
class ModelSync:
    """Averages the models of a group (all n workers, or a block), exactly or compressed.

    Exact: x_i ← mean of the group, and the same for each ``shared_state`` tensor (optimizer
    state or buffers, when they are averaged with the parameters; always exactly, also when the
    parameters travel compressed). Compressed (Lin et al.): each worker sends
    C(Δ_i), Δ_i = x_i − x_ref (+ e_i with error feedback, kept by the level's compressor), x_ref
    the group's model at its last sync at that level; then x_i ← x_ref + mean_group C(Δ_j). The
    messages are all-gathered (they cannot be summed on the way). ``robust`` (Byzantine workers,
    :mod:`gossamer.byzantine`): the Δ_i travel whole and x_i ← x_ref + the engine's robust
    aggregate of them. A global sync also resets the block reference. The references are taken
    by :meth:`start` (identical models); they and the residuals are the state.
    """

    compression: str = "none"  # none, or a codec spec (sign, ef-top-k:0.01, ...)
    numels: list[int] = field(default_factory=list)
    shared_state: list[torch.Tensor] = field(default_factory=list)
    seed: int = 0  # of random codecs' draws
    levels: tuple[str, ...] = ("global",)
    like: torch.Tensor | None = None  # rows shaped like the parameters (to build the compressors)
    shapes: list[tuple[int, ...]] | None = None  # the parameter tensors' shapes (for a shaped codec)
    robust: bool = False  # Byzantine workers: the updates Δ_i aggregated by the engine's robust rule
    ref: dict[str, torch.Tensor] = field(default_factory=dict)
    compressors: dict[str, Compressor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.compression != "none":
            self.compressors = {level: build_compressor(self.compression, self.numels, self.like, self.seed,
                                                        shapes=self.shapes)
                                for level in self.levels}

    @property
    def relative(self) -> bool:
        """Whether the models travel as their change since the last sync (compressed or robust)."""
        return self.compression != "none" or self.robust

    def start(self, X: torch.Tensor) -> None:
        """Take X (identical rows) as the reference of every level."""
        if self.relative:
            self.ref = {level: X.clone() for level in self.levels}

    def __call__(self, engine, X: torch.Tensor, round: int, block_size: int | None = None) -> None:
        """Average X at step ``round`` (which numbers random codecs' draws)."""
        level = "block" if block_size else "global"

        def mean_(rows: torch.Tensor, site: str) -> None:
            engine.block_mean_(rows, block_size, site) if block_size else engine.allreduce_mean_(rows, site)
        for site, rows in ([] if self.relative else [("params", X)]) + \
                [(f"state/{i}", rows) for i, rows in enumerate(self.shared_state)]:
            mean_(rows, site)
        if not self.relative:
            return
        if self.robust:
            update = X - self.ref[level]
            mean_(update, "update")
        else:
            compressor = self.compressors[level]
            messages = engine.all_gather(compressor.compress(X - self.ref[level], round, engine.rows), block_size)
            update = compressor.combine(messages, round)
        X.copy_(self.ref[level].add_(update))
        if level == "global":
            for name, ref in self.ref.items():
                if name != "global":
                    ref.copy_(X)

    def state_dict(self) -> dict:
        rows = {f"ref/{level}": ref for level, ref in self.ref.items()}
        rows.update({f"residual/{level}": c.residual for level, c in self.compressors.items()
                     if c.residual is not None})
        return {"rows": rows}

    def load_state_dict(self, state: dict) -> None:
        for key, value in state["rows"].items():
            kind, level = key.split("/")
            if kind == "ref":
                self.ref[level] = value.clone()
            else:
                self.compressors[level].residual = value.clone()


class AllReduce(Schedule):
    """Mini-batch SGD (Lin et al.'s baseline): gradients averaged every step, global batch n·B,
    the all-reduce running behind the backward pass (bucketed, as DDP does it)."""

    def averages_gradients(self, t: int) -> bool:
        return True

    def on_gradients(self, engine, X: torch.Tensor, G: torch.Tensor, step: Step) -> None:
        with engine.comm.overlapping(backward=True):
            engine.allreduce_mean_(G, "gradients")


@dataclass
class LocalSGD(Schedule):
    """Local SGD (Lin et al.): H local steps, then the group average (one all-reduce per H steps).

    Counted from its :meth:`start` (the run's, or post-local's switch t′): after every H-th local
    step the models are averaged. With ``block_size`` it is hierarchical local SGD: the average
    inside each block of ``block_size`` consecutive workers, and every ``block_rounds``-th time
    the global average instead (intra-block communication every H steps, global every H·H_b).
    """

    local_steps: int
    sync: ModelSync
    block_size: int | None = None
    block_rounds: int = 1
    steps: int = 0  # local steps since start

    def start(self, engine, X: torch.Tensor) -> None:
        self.steps = 0
        self.sync.start(X)

    def after_step(self, engine, X: torch.Tensor, step: Step) -> dict:
        self.steps += 1
        if self.steps % self.local_steps:
            return {}
        sync_round = self.steps // self.local_steps
        if self.block_size and sync_round % self.block_rounds:
            self.sync(engine, X, step.t, self.block_size)
        else:
            self.sync(engine, X, step.t)
        return {}

    def state_dict(self) -> dict:
        return {"steps": self.steps, **self.sync.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.steps = int(state["steps"])
        self.sync.load_state_dict(state)


@dataclass
class DesLoc(Schedule):
    """DES-LOC (Iacob et al. 2025, desynced low-communication adaptive optimizers): each worker runs
    Adam; after every K_x-th local step the parameters are averaged (x_i ← mean x, and the
    buffers), after every K_u-th the first moments (m_i ← mean m), after every K_v-th the second
    (v_i ← mean v) — an all-reduce each, in that order when they coincide. With K_x = K_u = K_v = H
    it is local Adam averaging its moments with the parameters (``local`` with
    ``average_optimizer_state``), bit for bit."""

    periods: tuple[int, int, int]  # K_x, K_u, K_v
    moments: list[torch.Tensor]  # m, v: Adam's rows
    buffers: list[torch.Tensor] = field(default_factory=list)
    steps: int = 0  # local steps since start

    def start(self, engine, X: torch.Tensor) -> None:
        self.steps = 0

    def after_step(self, engine, X: torch.Tensor, step: Step) -> dict:
        self.steps += 1
        params, first, second = (self.steps % k == 0 for k in self.periods)
        for rows in ([X] if params else []) + [m for m, due in zip(self.moments, (first, second)) if due] + \
                (self.buffers if params else []):
            engine.allreduce_mean_(rows)
        return {}

    def state_dict(self) -> dict:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.steps = int(state["steps"])


# ---------------------------------------------------------------- options and builders


@dataclass
class LocalOptions:
    local_steps: int = 1  # H: local steps between averages
    compression: str = "none"  # or a codec: sign, ef-sign, ...

    def validate(self, cfg) -> None:
        positive_ints(self, "local_steps")
        if self.compression != "none":
            check_spec(self.compression)
            if cfg.average_optimizer_state:
                raise ConfigError("average_optimizer_state: true needs compression: none")
            if cfg.faults is not None:
                raise ConfigError("faults: compressed averages (compression) do not drop workers; use compression: none")
            if cfg.byzantine is not None:
                raise ConfigError("byzantine: compressed averages (compression) have no Byzantine model; use "
                                  "compression: none")


@dataclass
class PostLocalOptions(LocalOptions):
    switch_epoch: float | None = None  # t′ in epochs; None: the first lr milestone
    switch_step: int | None = None  # t′ in steps instead

    def validate(self, cfg) -> None:
        super().validate(cfg)
        if self.switch_epoch is not None and self.switch_step is not None:
            raise ConfigError("give post-local's switch as switch_epoch or switch_step, not both")
        if self.switch_epoch is None and self.switch_step is None and not cfg.milestones:
            raise ConfigError("post-local needs switch_epoch, switch_step or a learning-rate milestone")
        if not 0 <= (self.switch_epoch or 0) < cfg.epochs:
            raise ConfigError(f"switch_epoch must be in [0, epochs={cfg.epochs}), got {self.switch_epoch}")
        if (self.switch_step or 0) < 0:
            raise ConfigError(f"switch_step must be >= 0, got {self.switch_step}")


@dataclass
class HierarchicalOptions(LocalOptions):
    block_size: int = 1  # consecutive workers per block
    block_rounds: int = 1  # H_b: block averages per global average

    def validate(self, cfg) -> None:
        super().validate(cfg)
        positive_ints(self, "block_size", "block_rounds")
        if cfg.workers % self.block_size:
            raise ConfigError(f"block_size must divide workers: {self.block_size} does not divide {cfg.workers}")


@dataclass
class DesLocOptions:
    local_steps: int = 1  # K_x: local steps between parameter averages
    desloc_m1_steps: int | None = None  # K_u: local steps between averages of Adam's first moments (None: K_x)
    desloc_m2_steps: int | None = None  # K_v: local steps between averages of Adam's second moments (None: K_x)

    def validate(self, cfg) -> None:
        positive_ints(self, "local_steps", *(k for k in ("desloc_m1_steps", "desloc_m2_steps")
                                             if getattr(self, k) is not None))


def switch_step(cfg, steps_per_epoch: int) -> int:
    """Post-local SGD's switch step t′: switch_step, switch_epoch, or the first milestone."""
    if cfg.switch_step is not None:
        return cfg.switch_step
    epoch = cfg.switch_epoch if cfg.switch_epoch is not None else (cfg.milestones or [0.0])[0]
    return round(epoch * steps_per_epoch)


def _local_sgd(cfg, ctx: Context, block_size: int | None = None, block_rounds: int = 1) -> LocalSGD:
    levels = ("global", "block") if block_size else ("global",)
    sync = ModelSync(cfg.compression, ctx.numels, shared_rows(cfg, ctx), cfg.seed, levels, ctx.X,
                     robust=byzantine_active(cfg), shapes=ctx.shapes or None)
    return LocalSGD(cfg.local_steps, sync, block_size, block_rounds)


def _local_hook(cfg) -> dict:
    """The keyword options of ``gossamer.integrations.LocalSGD`` that run local SGD as ``cfg`` does."""
    return {"local_steps": cfg.local_steps, "compression": cfg.compression}


@ALGORITHMS.register("allreduce", faults=REJOIN_MODES, byzantine="allreduce",
                     help="mini-batch SGD: gradients averaged every step (Lin et al.'s baseline)")
def _allreduce(cfg, ctx: Context) -> AllReduce:
    return AllReduce()


@ALGORITHMS.register("local", options=LocalOptions, example=("local_steps=3",), faults=REJOIN_MODES,
                     byzantine="allreduce", hook=("LocalSGD", _local_hook),
                     help="local SGD: H local steps, then the exact (or compressed) average (Lin et al.)")
def _local(cfg, ctx: Context) -> LocalSGD:
    return _local_sgd(cfg, ctx)


@ALGORITHMS.register("post-local", options=PostLocalOptions, example=("switch_step=5", "local_steps=2"),
                     faults=REJOIN_MODES, byzantine="allreduce",
                     hook=("LocalSGD", lambda cfg: {**_local_hook(cfg), "switch_step": cfg.switch_step}),
                     help="post-local SGD: mini-batch SGD until t′, then local SGD (Lin et al.)")
def _post_local(cfg, ctx: Context) -> Schedule:
    switch = switch_step(cfg, ctx.steps_per_epoch)
    if ctx.total_steps is not None and switch >= ctx.total_steps:
        raise ConfigError(f"post-local's switch (switch_step or switch_epoch) must be below the run's "
                          f"{ctx.total_steps} steps, got step {switch}")
    local = _local_sgd(cfg, ctx)
    return phased([AllReduce(), local], [switch], ctx) if switch > 0 else local


@ALGORITHMS.register("hierarchical", options=HierarchicalOptions,
                     example=("block_size=2", "block_rounds=2", "local_steps=2"), faults=REJOIN_MODES,
                     byzantine="allreduce", byzantine_group="block_size",
                     hook=("LocalSGD", lambda cfg: {**_local_hook(cfg), "block_size": cfg.block_size,
                                                    "block_rounds": cfg.block_rounds}),
                     help="hierarchical local SGD: block averages every H steps, global every H·H_b (Lin et al.)")
def _hierarchical(cfg, ctx: Context) -> LocalSGD:
    return _local_sgd(cfg, ctx, cfg.block_size, cfg.block_rounds)


@ALGORITHMS.register("des-loc", options=DesLocOptions,
                     example=("local_steps=2", "desloc_m1_steps=3", "desloc_m2_steps=4"),
                     requires={"optimizer": ("adam", "adamw"), "average_optimizer_state": False},
                     requires_why="it is Adam, and averages the moments with their own periods",
                     help="DES-LOC: local Adam, parameters and the two moments averaged with their own periods "
                          "(Iacob et al. 2025)")
def _des_loc(cfg, ctx: Context) -> DesLoc:
    k_x = cfg.local_steps
    periods = (k_x, cfg.desloc_m1_steps or k_x, cfg.desloc_m2_steps or k_x)
    return DesLoc(periods, list(ctx.optimizer_rows), list(ctx.buffer_rows))
