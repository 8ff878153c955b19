"""Decentralized SGD over a topology (Kong et al., ICML 2021), with consensus control.

``gossip`` is :class:`~gossamer.algorithms.schedule.Phases` of training phases, each an
:class:`~gossamer.algorithms.local.AllReduce` (mini-batch SGD) or a :class:`Gossip` phase —
uncontrolled, or ``controlled`` by a strategy of :mod:`gossamer.consensus`. The gossip phases of a
run share one :class:`GossipState` (the round counter r of W_r, the local steps since the last
round, the control's counts), so a time-varying graph and the gossip period run on across phases.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch

from ..consensus import ConsensusConfig, Controller, FrequencyControl, build_target
from ..engines.ledger import CONTROL, METRICS
from ..faults import REJOIN_MODES
from ..registry import ConfigError, positive_ints
from ..topology import TOPOLOGIES, Mixing, Topology, build_topology, spectral_gap
from .local import AllReduce
from .schedule import ALGORITHMS, Context, Schedule, Step, phased, shared_rows


@dataclass
class GossipState:
    """What the gossip phases of a run share: the graph, its round counter (round r uses W_r;
    extra rounds count too), the local steps since the last round and since the models were last
    identical (the run's start or an all-reduce phase), the last round's W and per-worker change,
    and the control's cumulative counts."""

    topology: Topology
    rounds: int = 0
    since_round: int = 0
    since_sync: int = 0
    extra_rounds: int = 0
    rounds_saved: int = 0
    mixing: Mixing | None = None  # W of the step's round
    change: torch.Tensor | None = None  # per-row ‖(WX)_i − x_i‖² of the step's round (None: no round)

    def state_dict(self) -> dict:
        return {key: getattr(self, key) for key in ("rounds", "since_round", "since_sync", "extra_rounds",
                                                     "rounds_saved")}

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, int(value))


@dataclass
class QuasiGlobalMomentum:
    """Quasi-global momentum (Lin, Kong, Stich, Jaggi, ICML 2021): the local SGD step uses
    m_i = β m̂_i + g_i, and after the step's communication the buffer becomes
    m̂_i ← μ m̂_i + (1 − μ) (x_i^(t) − x_i^(t+1)) / η_t: the model change, gossip included, instead
    of the local gradients alone (μ = β, as in the authors' code: factor 1 − μ = 0.1 at β = 0.9)."""

    buffer: torch.Tensor  # m̂: the optimizer's momentum rows
    mu: float
    _before: tuple[torch.Tensor, torch.Tensor] | None = None  # x^(t) and m̂ at the start of the step

    def before_step(self, X: torch.Tensor) -> None:
        if self._before is None:
            self._before = (torch.empty_like(X), torch.empty_like(self.buffer))
        self._before[0].copy_(X)
        self._before[1].copy_(self.buffer)

    def after_step(self, X: torch.Tensor, lr: float) -> None:
        x_before, buffer_before = self._before
        self.buffer.copy_(buffer_before.mul_(self.mu).add_(x_before.sub_(X), alpha=(1 - self.mu) / lr))


def local_estimate(theta_sq: float, mixing: Mixing) -> dict:
    """Θ² and the bound Ξ ≤ (2/p)Θ with p the mixing quality of the round (None if p = 0)."""
    p = mixing.p
    bound = 2 / p * theta_sq**0.5 if p > 0 else None
    return {"theta_sq": theta_sq, "consensus_distance_bound": bound}


@dataclass
class Gossip(Schedule):
    """D-SGD (Kong et al.) over W_r: a local step, then (every H-th step) one gossip round.

    ``step-then-mix`` (the paper's form): X ← (X − η ∂F(X)) W. ``mix-then-step`` (Lian et al.'s
    D-PSGD form): X ← X W − η ∂F(X), the gradient taken at the pre-mixing models. Local
    decentralized SGD (Koloskova et al. 2020): with a gossip period H = ``local_steps``, only
    every H-th step gossips (W_t = I at the others); H = 1 is D-SGD. ``control`` (a controlled
    phase) is a consensus-control strategy: :class:`~gossamer.consensus.Controller` adds rounds
    after a step's round until Ξ ≤ target (or, with ``measure: estimate``, until the bound
    (2/p)Θ ≤ target); :class:`~gossamer.consensus.FrequencyControl` adapts the period H_t.
    ``momentum``: quasi-global momentum instead of local momentum. ``shared_state`` (optimizer
    state or buffers communicated with the parameters) is mixed alike.
    """

    state: GossipState
    form: str = "step-then-mix"
    local_steps: int = 1
    control: Controller | FrequencyControl | None = None
    frequency: FrequencyControl | None = None  # the run's frequency control (counted also where not in control)
    momentum: QuasiGlobalMomentum | None = None
    shared_state: list[torch.Tensor] = field(default_factory=list)
    keep_change: bool = False  # compute each round's change also when the step is not measured

    @property
    def topology(self) -> Topology:
        return self.state.topology

    def start(self, engine, X: torch.Tensor) -> None:
        self.state.since_round = self.state.since_sync = 0

    def _period(self) -> int:
        """The gossip period H_t."""
        return self.control.period if isinstance(self.control, FrequencyControl) else self.local_steps

    def _communicates(self) -> bool:
        """Whether this step ends its period with a gossip round."""
        return self.state.since_round + 1 >= self._period()

    def _estimating(self) -> bool:
        """Whether control decides from the local estimate (so every round measures Θ)."""
        return isinstance(self.control, Controller) and self.control.measure == "estimate"

    def _round(self, engine, X: torch.Tensor, measure: bool = False) -> torch.Tensor | None:
        g = self.state
        g.mixing = engine.living(g.topology.mixing(g.rounds))  # the round's W (repaired under faults)
        g.rounds += 1
        for rows in self.shared_state:
            engine.gossip_(rows, g.mixing)
        return engine.gossip_(X, g.mixing, measure=measure)

    def _bounded_round(self, engine, X: torch.Tensor) -> float:
        """One gossip round; the bound (2/p)Θ on Ξ that it gives (one scalar all-gather, control's)."""
        change = self._round(engine, X, measure=True)
        return local_estimate(engine.mean_scalar(change, level=CONTROL), self.state.mixing)["consensus_distance_bound"]

    def _gossip(self, engine, X: torch.Tensor, step: Step) -> None:
        """The step's gossip round; under frequency control, Ξ² probed just before it."""
        if isinstance(self.control, FrequencyControl):
            self.control.probe(engine, X)
        self.state.change = self._round(engine, X, measure=step.measure or self.keep_change or self._estimating())

    def on_gradients(self, engine, X: torch.Tensor, G: torch.Tensor, step: Step) -> None:
        if self.momentum is not None:
            self.momentum.before_step(X)
        if self.form == "mix-then-step" and self._communicates():
            self._gossip(engine, X, step)

    def after_step(self, engine, X: torch.Tensor, step: Step) -> dict:
        g = self.state
        metrics = {"extra_gossip_rounds": 0}
        communicates = self._communicates()
        g.since_sync += 1
        if isinstance(self.control, FrequencyControl):
            metrics.update(gossip_period=self.control.period, consensus_target=self.control.target(step))
        if self.frequency is not None:
            saved = self.frequency.rounds_saved(communicates, g.since_sync) if self.control is self.frequency else 0
            g.rounds_saved += saved
            metrics["gossip_rounds_saved"] = saved
        if communicates:
            if self.form == "step-then-mix":
                self._gossip(engine, X, step)
            estimating = self._estimating()
            estimate = None
            if step.measure or estimating:  # control's traffic where it decides from Θ
                estimate = local_estimate(engine.mean_scalar(g.change, level=CONTROL if estimating else METRICS), g.mixing)
            if step.measure:
                metrics.update(estimate)
            if isinstance(self.control, FrequencyControl):
                metrics["consensus_distance_sq_before_round"] = self.control.xi_sq
                self.control.adapt(self.control.xi_sq, metrics["consensus_target"])
            elif self.control is not None:
                bound = estimate["consensus_distance_bound"] if estimating else None
                extra_round = (lambda: self._bounded_round(engine, X)) if estimating else (lambda: self._round(engine, X))
                metrics.update(self.control.control(engine, X, step, extra_round, bound))
                g.extra_rounds += metrics["extra_gossip_rounds"]
        else:
            g.change = None
        if self.momentum is not None:
            self.momentum.after_step(X, step.lr)
        g.since_round = 0 if communicates else g.since_round + 1
        return metrics

    def counters(self) -> dict[str, int]:
        return {"extra_gossip_rounds": self.state.extra_rounds,
                **({"gossip_rounds_saved": self.state.rounds_saved} if self.frequency is not None else {})}

    def state_dict(self) -> dict:
        return {"gossip": self.state.state_dict(),
                **({"frequency": self.frequency.state_dict()} if self.frequency is not None else {})}

    def load_state_dict(self, state: dict) -> None:
        self.state.load_state_dict(state["gossip"])
        if self.frequency is not None:
            self.frequency.load_state_dict(state["frequency"])


def gossip_state(schedule: Schedule) -> GossipState:
    """The state the phases of a ``gossip`` schedule share: where an algorithm built on gossip replaces its graph.

    Args:
        schedule (Schedule): what ``ALGORITHMS["gossip"].build(cfg, ctx)`` returned.

    Returns:
        GossipState: its ``topology`` (the graph every gossip phase reads; a plugin may replace
        it, as examples/plugins/lossy_gossip.py does) and the round counters (internal: read, never set).

    Example::

        >>> import numpy as np, torch, gossamer
        >>> from dataclasses import replace
        >>> from gossamer.extend import ALGORITHMS, GossipOptions, Mixing, gossip_state
        >>> @ALGORITHMS.register("lazy-gossip", options=GossipOptions, help="gossip over (I + W) / 2")
        ... def build(cfg, ctx):
        ...     schedule = ALGORITHMS["gossip"].build(cfg, ctx)
        ...     state = gossip_state(schedule)
        ...     W = state.topology.mixing(0)  # a static graph's W
        ...     lazy = Mixing(W.index, W.weight / 2 + (np.arange(W.K) == 0)[:, None] / 2)
        ...     state.topology = replace(state.topology, mixings=(lazy,))
        ...     return schedule
        >>> x, y = torch.randn(80, 40), torch.randint(0, 10, (80,))
        >>> result = gossamer.run({"algorithm": "lazy-gossip", "topology": "ring", "model": "mlp", "workers": 4,
        ...                        "epochs": 1, "batch_size": 8}, data=gossamer.Data(train=(x[:64], y[:64]),
        ...                                                                          test=(x[64:], y[64:])))
        >>> result.summary["comm_rounds_gossip"]
        2
    """
    return next(p.state for p in schedule.phases if isinstance(p, Gossip))


# ---------------------------------------------------------------- options and builders


GOSSIP_FORMS = ("step-then-mix", "mix-then-step")
PHASE_MODES = ("allreduce", "gossip", "controlled")
MOMENTUM_MODES = ("local", "quasi-global")


@dataclass
class GraphOptions:
    """The config keys of a decentralized algorithm's graph: extend it with an algorithm's own keys.

    Args:
        topology (str): a topology's name (``ring``, ``torus``, ``random-regular:4``, ...).
        topology_seed (int | None): the seed of a random topology's draws (None: the run's seed).

    Example::

        >>> from dataclasses import dataclass, fields
        >>> from gossamer.extend import GraphOptions
        >>> @dataclass
        ... class PairsOptions(GraphOptions):
        ...     pair_rounds: int = 1  # gossip rounds a step
        >>> [f.name for f in fields(PairsOptions)], PairsOptions().topology
        (['topology', 'topology_seed', 'pair_rounds'], 'ring')
    """

    topology: str = "ring"
    topology_seed: int | None = None  # None: the run's seed

    def validate(self, cfg) -> None:
        TOPOLOGIES.parse(self.topology)


def build_graph(cfg, directed: bool = False) -> Topology:
    """The run's graph, from the keys of :class:`GraphOptions`.

    Args:
        cfg (Config): the run's config (``topology``, ``topology_seed``, ``seed``, ``workers``).
        directed (bool): whether a directed graph (column- but not doubly stochastic: push-sum's)
            is accepted; else it is refused in one line.

    Returns:
        Topology: W_t of every round.

    Example::

        >>> import torch, gossamer
        >>> from gossamer.extend import ALGORITHMS, GraphOptions, Schedule, build_graph
        >>> graphs = []
        >>> @ALGORITHMS.register("graph-only", options=GraphOptions, help="builds its graph, communicates nothing")
        ... def build(cfg, ctx):
        ...     graphs.append(build_graph(cfg))
        ...     return Schedule()
        >>> x, y = torch.randn(72, 40), torch.randint(0, 10, (72,))
        >>> _ = gossamer.run({"algorithm": "graph-only", "topology": "ring", "model": "mlp", "workers": 4, "epochs": 1,
        ...                   "batch_size": 8}, data=gossamer.Data(train=(x[:64], y[:64]), test=(x[64:], y[64:])))
        >>> graphs[0].name, graphs[0].n, graphs[0].mixing(0).K
        ('ring', 4, 3)
    """
    topology = build_topology(cfg.topology, cfg.workers,
                              seed=cfg.seed if cfg.topology_seed is None else cfg.topology_seed)
    if not directed and not topology.doubly_stochastic:
        raise ConfigError(f"topology '{cfg.topology[:100]}' is directed (its W is column- but not doubly stochastic): "
                          f"algorithm {cfg.algorithm} needs an undirected one; only algorithm sgp (push-sum) runs on it")
    return topology


@dataclass
class GossipOptions(GraphOptions):
    """The config keys of ``gossip``: an algorithm built on gossip's schedule extends them.

    Args:
        topology, topology_seed: the graph's (:class:`GraphOptions`).
        gossip_form (str): ``step-then-mix`` or ``mix-then-step``.
        momentum_mode (str): ``local`` or ``quasi-global``.
        local_steps (int): H, the local steps per gossip round.
        phases (list[str]): a mode per phase: ``allreduce``, ``gossip`` or ``controlled``.
        phase_epochs (list[float]): the phases' boundaries in epochs ([]: the lr milestones).
        phase_steps (list[int]): or in steps.
        consensus (ConsensusConfig): consensus control's ``consensus.*`` keys.

    Example::

        >>> from dataclasses import dataclass
        >>> from gossamer.extend import GossipOptions
        >>> @dataclass
        ... class LossyOptions(GossipOptions):
        ...     drop_rate: float = 0.1  # the comment is the key's help
        >>> options = LossyOptions(topology="torus", drop_rate=0.3)
        >>> options.local_steps, options.drop_rate
        (1, 0.3)
    """

    gossip_form: str = "step-then-mix"
    momentum_mode: str = "local"  # or quasi-global (Lin, Kong, Stich, Jaggi 2021)
    local_steps: int = 1  # H: local steps per gossip round (1: D-SGD); H_0 under frequency control
    phases: list[str] = field(default_factory=list)  # a mode per phase: allreduce | gossip | controlled
    phase_epochs: list[float] = field(default_factory=list)  # boundaries; [] = the lr milestones
    phase_steps: list[int] = field(default_factory=list)  # boundaries in steps instead
    consensus: ConsensusConfig = field(default_factory=ConsensusConfig)

    def validate(self, cfg) -> None:
        super().validate(cfg)
        positive_ints(self, "local_steps")
        if self.phase_epochs and self.phase_steps:
            raise ConfigError("give the gossip phase boundaries as phase_epochs or phase_steps, not both")
        if (self.phase_epochs or self.phase_steps) and not self.phases:
            raise ConfigError(f"{'phase_steps' if self.phase_steps else 'phase_epochs'} needs phases "
                              f"(one mode per phase)")
        if self.gossip_form not in GOSSIP_FORMS:
            raise ConfigError(f"unknown gossip_form {self.gossip_form[:100]!r}; choose one of: {', '.join(GOSSIP_FORMS)}")
        if self.momentum_mode not in MOMENTUM_MODES:
            raise ConfigError(f"unknown momentum_mode '{self.momentum_mode[:100]}'; choose one of: {', '.join(MOMENTUM_MODES)}")
        if self.momentum_mode == "quasi-global":
            if cfg.optimizer != "sgd" or cfg.momentum == 0:
                raise ConfigError("momentum_mode quasi-global needs optimizer sgd with momentum > 0")
            if cfg.average_optimizer_state:
                raise ConfigError("momentum_mode quasi-global sets the momentum buffer from the model change; "
                                  "it cannot be averaged too: use average_optimizer_state: false")
        self.consensus.validate()
        for mode in self.phases:
            if mode not in PHASE_MODES:
                raise ConfigError(f"unknown phase mode '{mode[:100]}'; choose from: {', '.join(PHASE_MODES)}")
        modes, boundaries, unit = gossip_phases(cfg)
        if self.phases and len(boundaries) != len(self.phases) - 1:
            raise ConfigError(f"phases has {len(self.phases)} modes but {len(boundaries)} boundaries "
                              f"(phase_steps or phase_epochs, or the lr milestones when both are empty)")
        end = cfg.epochs if unit == "epochs" else math.inf
        if boundaries != sorted(set(boundaries)) or any(not 0 < b < end for b in boundaries):
            raise ConfigError(f"phase_steps must be increasing steps > 0, got {boundaries}" if unit == "steps" else
                              f"phase_epochs must be increasing epochs in (0, {cfg.epochs}), got {boundaries}")
        if "controlled" in modes and self.consensus.target == "none":
            raise ConfigError("a controlled phase needs consensus.target (constant, gradient or run:DIR)")
        if self.consensus.target == "gradient" and cfg.metrics_every != 1:
            raise ConfigError("consensus.target gradient follows φ² at every step: it needs metrics_every: 1")
        if self.consensus.action == "frequency" and self.local_steps > self.consensus.max_local_steps:
            raise ConfigError(f"local_steps (the first gossip period, {self.local_steps}) must be at most "
                              f"consensus.max_local_steps ({self.consensus.max_local_steps})")
        if self.consensus.measure == "estimate" and self.gossip_form != "step-then-mix":
            raise ConfigError("consensus.measure estimate bounds Ξ with the round that ends the step: "
                              "it needs gossip_form step-then-mix")
        if cfg.byzantine is not None and "allreduce" in modes:
            raise ConfigError("byzantine: gossip's Byzantine model is for its gossip rounds; an allreduce phase has "
                              "none (use algorithm allreduce or post-local for that, or phases without allreduce)")
        if (cfg.byzantine is not None and "controlled" in modes and self.consensus.action == "rounds"
                and self.consensus.on_budget == "allreduce"):
            raise ConfigError("byzantine: gossip's Byzantine model is for its gossip rounds; consensus control's "
                              "All-Reduce when the extra rounds run out has none: use consensus.on_budget: continue")


def gossip_phases(cfg) -> tuple[list[str], list[float], str]:
    """(one mode per phase, where one phase ends and the next begins, and the unit of those
    boundaries: "steps" or "epochs"). Without ``phases``, gossip is one phase, controlled if a
    consensus target is set."""
    if not cfg.phases:
        return ["controlled" if cfg.consensus.target != "none" else "gossip"], [], "epochs"
    if cfg.phase_steps:
        return list(cfg.phases), list(cfg.phase_steps), "steps"
    return list(cfg.phases), list(cfg.phase_epochs or cfg.milestones), "epochs"


def _control(cfg, ctx: Context, topology: Topology) -> Controller | FrequencyControl | None:
    """The consensus-control strategy of the controlled phases (None without a target)."""
    if cfg.consensus.target == "none":
        return None
    steps = ctx.total_steps
    if ctx.reference is not None and steps is not None and len(ctx.reference) < steps:
        raise ConfigError(f"consensus.target {cfg.consensus.target[:100]} has {len(ctx.reference)} steps; "
                          f"this run needs {steps}")
    if cfg.consensus.measure == "estimate" and (topology.random or any(m.p == 0 for m in topology.mixings)):
        raise ConfigError(f"consensus.measure estimate needs every round of the topology to mix (p > 0); "
                          f"'{cfg.topology[:100]}' has rounds with p = 0, where Θ bounds nothing"
                          + (" (a random topology's rounds are not known in advance)" if topology.random else ""))
    p = 1 - (1 - spectral_gap(topology)) ** 2
    target = build_target(cfg.consensus, p, ctx.reference)
    if cfg.consensus.action == "frequency":
        return FrequencyControl(target, cfg.local_steps, cfg.consensus.max_local_steps)
    return Controller(target, cfg.consensus.max_extra_rounds, cfg.consensus.on_budget, cfg.consensus.measure)


def _gossip_hook(cfg) -> dict:
    """The keyword options of ``gossamer.integrations.Gossip`` that run D-SGD as ``cfg`` does."""
    return {"topology": cfg.topology, "local_steps": cfg.local_steps, "gossip_form": cfg.gossip_form,
            "phases": cfg.phases, "phase_steps": cfg.phase_steps, "consensus": asdict(cfg.consensus)}


@ALGORITHMS.register("gossip", options=GossipOptions,
                     example=("topology=one-peer-exponential", "local_steps=2", "phases=[allreduce,gossip,allreduce]",
                              "phase_steps=[4,8]"), faults=REJOIN_MODES, byzantine="gossip",
                     hook=("Gossip", _gossip_hook),
                     help="D-SGD over a topology (a gossip round every H steps), by phase, with consensus control "
                          "(Kong et al.)")
def _gossip(cfg, ctx: Context) -> Schedule:
    state = GossipState(build_graph(cfg))
    control = _control(cfg, ctx, state.topology)
    momentum = None
    if cfg.momentum_mode == "quasi-global":
        if not ctx.optimizer_rows:
            raise ConfigError("momentum_mode quasi-global needs the trainer's SGD momentum buffer")
        momentum = QuasiGlobalMomentum(ctx.optimizer_rows[0], cfg.momentum)
    frequency = control if isinstance(control, FrequencyControl) else None
    modes, boundaries, unit = gossip_phases(cfg)

    def phase(mode: str) -> Schedule:
        if mode == "allreduce":
            return AllReduce()
        return Gossip(state, form=cfg.gossip_form, local_steps=cfg.local_steps,
                      control=control if mode == "controlled" else None, frequency=frequency, momentum=momentum,
                      shared_state=shared_rows(cfg, ctx), keep_change=ctx.keep_change)
    starts = [int(b) if unit == "steps" else round(b * ctx.steps_per_epoch) for b in boundaries]
    return phased([phase(mode) for mode in modes], starts, ctx, grad_norm_ema=cfg.consensus.ema,
                  tracks_grad_norm=cfg.consensus.target == "gradient", topology=state.topology)
