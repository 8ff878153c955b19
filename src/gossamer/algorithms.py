"""Communication schedules: which operator runs on which rows after which step.

Every algorithm of both papers is a :class:`Schedule` over the hooks of the training loop:
``start`` (before the first step), ``on_gradients`` (after backward, before the local optimizer
step: where mini-batch SGD averages gradients; ``averages_gradients(t)`` says whether it does at
step t, and then it does nothing else, so a gradient all-reduce done elsewhere — DDP's — can stand
in for it) and ``after_step`` (after the local step: where
models are averaged or gossiped; it returns metrics for the step's row). ``step.t`` is the 0-based
index of the step being taken. Everything a schedule carries from step to step is in its
``state_dict()`` (tensors with one row per worker under ``rows``), so a run can be resumed.

A new algorithm is one registered builder here, with the dataclass of its options (the config
keys it owns, validated there): ``@ALGORITHMS.register("name", options=...)``.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Protocol

import torch

from .codecs import ERROR_FEEDBACK, Compressor, build_compressor, check_spec
from .consensus import ConsensusConfig, Controller, FrequencyControl, build_target
from .optim import SGD
from .registry import ConfigError, Registry
from .topology import TOPOLOGIES, Mixing, Topology, build_topology, spectral_gap

ALGORITHMS = Registry("algorithm")


@dataclass
class Step:
    """What a schedule knows about the step being taken: index t, η_t, φ_t² and its EMA, and
    whether this step's metrics are measured (``measure``: else nothing is measured or synced)."""

    t: int
    lr: float = 0.0
    grad_norm_sq: float = 0.0
    grad_norm_sq_ema: float = 0.0
    measure: bool = True


class Schedule(Protocol):
    """A communication schedule (see the module docstring)."""

    def start(self, engine, X: torch.Tensor) -> None: ...

    def averages_gradients(self, t: int) -> bool: ...

    def on_gradients(self, engine, X: torch.Tensor, G: torch.Tensor, step: Step) -> None: ...

    def after_step(self, engine, X: torch.Tensor, step: Step) -> dict: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


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


# ---------------------------------------------------------------- model averaging (local SGD family)


@dataclass
class ModelSync:
    """Averages the models of a group (all n workers, or a block), exactly or compressed.

    Exact: x_i ← mean of the group, and the same for each ``shared_state`` tensor (optimizer
    state or buffers, when they are averaged with the parameters; always exactly, also when the
    parameters travel compressed). Compressed (Lin et al.): each worker sends
    C(Δ_i), Δ_i = x_i − x_ref (+ e_i with error feedback, kept by the level's compressor), x_ref
    the group's model at its last sync at that level; then x_i ← x_ref + mean_group C(Δ_j). The
    messages are all-gathered (they cannot be summed on the way). A global sync also resets the
    block reference.
    """

    compression: str = "none"  # none, or a codec spec (sign, ef-top-k:0.01, ...)
    numels: list[int] = field(default_factory=list)
    shared_state: list[torch.Tensor] = field(default_factory=list)
    seed: int = 0  # of random codecs' draws
    ref: dict[str, torch.Tensor] = field(default_factory=dict)
    compressors: dict[str, Compressor] = field(default_factory=dict)

    def start(self, X: torch.Tensor, levels: tuple[str, ...] = ("global",)) -> None:
        """Take X (identical rows) as the reference of every level."""
        if self.compression != "none":
            self.ref = {level: X.clone() for level in levels}
            self.compressors = {level: build_compressor(self.compression, self.numels, X, self.seed)
                                for level in levels}

    def __call__(self, engine, X: torch.Tensor, round: int, block_size: int | None = None) -> None:
        """Average X at step ``round`` (which numbers random codecs' draws)."""
        level = "block" if block_size else "global"
        exact = (X, *self.shared_state) if self.compression == "none" else self.shared_state
        for rows in exact:
            engine.block_mean_(rows, block_size) if block_size else engine.allreduce_mean_(rows)
        if self.compression == "none":
            return
        compressor = self.compressors[level]
        messages = engine.all_gather(compressor.compress(X - self.ref[level], round, engine.rows), block_size)
        X.copy_(self.ref[level].add_(messages.mean(lambda m: compressor.codec.decode(m, round))))
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


@dataclass
class AllReduce:
    """Mini-batch SGD (Lin et al.'s baseline): gradients averaged every step, global batch n·B."""

    def start(self, engine, X: torch.Tensor) -> None:
        pass

    def averages_gradients(self, t: int) -> bool:
        return True

    def on_gradients(self, engine, X: torch.Tensor, G: torch.Tensor, step: Step) -> None:
        engine.allreduce_mean_(G)

    def after_step(self, engine, X: torch.Tensor, step: Step) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
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

    def averages_gradients(self, t: int) -> bool:
        return t < self.switch

    def on_gradients(self, engine, X: torch.Tensor, G: torch.Tensor, step: Step) -> None:
        if self.averages_gradients(step.t):
            engine.allreduce_mean_(G)

    def after_step(self, engine, X: torch.Tensor, step: Step) -> dict:
        t = step.t
        if t < self.switch:
            if t + 1 == self.switch:
                self.sync.start(X, self._levels())
            return {}
        local_steps_done = t + 1 - self.switch
        if local_steps_done % self.local_steps:
            return {}
        sync_round = local_steps_done // self.local_steps
        if self.block_size and sync_round % self.block_rounds:
            self.sync(engine, X, t, self.block_size)
        else:
            self.sync(engine, X, t)
        return {}

    def state_dict(self) -> dict:
        return self.sync.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sync.load_state_dict(state)


# ---------------------------------------------------------------- decentralized (gossip)


@dataclass
class Decentralized:
    """D-SGD (Kong et al.) over W_r, by training phase: all-reduce SGD, gossip, or controlled gossip.

    ``step-then-mix`` (the paper's form): X ← (X − η ∂F(X)) W — local step, then one gossip round.
    ``mix-then-step`` (Lian et al.'s D-PSGD form): X ← X W − η ∂F(X), the gradient taken at the
    pre-mixing models. Local decentralized SGD (Koloskova et al. 2020): with a gossip period
    H = ``local_steps``, only every H-th step of a decentralized stretch gossips (W_t = I at the
    others); H = 1 is D-SGD. In a ``controlled`` phase either the controller adds rounds after a
    step's round until Ξ ≤ target (``consensus.action: rounds``; with ``consensus.measure: estimate``
    until the bound (2/p)Θ ≤ target), or ``frequency`` adapts the period
    H_t (:class:`~gossamer.consensus.FrequencyControl`). Round r uses W_r (time-varying graphs
    advance per round, extra rounds included). Entering an all-reduce phase from a decentralized
    one averages the models and the ``optimizer_state`` once (else the local momenta would pull
    the models apart again). ``shared_state`` (optimizer state communicated with the parameters)
    is mixed alike.

    Quasi-global momentum (Lin, Kong, Stich, Jaggi, ICML 2021; ``momentum_buffer`` set): in a
    decentralized step the local SGD step uses m_i = β m̂_i + g_i, and after the step's
    communication the buffer becomes m̂_i ← μ m̂_i + (1 − μ) (x_i^(t) − x_i^(t+1)) / η_t: the
    model change, gossip included, instead of the local gradients alone (μ = β, as in the
    authors' code: factor 1 − μ = 0.1 at β = 0.9).
    """

    topology: Topology
    form: str = "step-then-mix"
    modes: list[str] = field(default_factory=lambda: ["gossip"])
    phase_starts: list[int] = field(default_factory=list)  # first step of phases 2, 3, ...
    controller: Controller | None = None
    shared_state: list[torch.Tensor] = field(default_factory=list)
    optimizer_state: list[torch.Tensor] = field(default_factory=list)
    local_steps: int = 1  # H: the gossip period when not frequency-controlled
    frequency: FrequencyControl | None = None  # consensus.action frequency: H_t of the controlled phases
    momentum_buffer: torch.Tensor | None = None  # m̂ of quasi-global momentum (None: local momentum)
    momentum: float = 0.0  # μ
    rounds: int = 0
    since_round: int = 0  # local steps since the last gossip round (0 after an all-reduce step)
    keep_change: bool = False  # compute each step's change also when the step is not measured
    change: torch.Tensor | None = None  # per-row ‖(WX)_i − x_i‖² of the step's round (None: no round this step)
    mixing: Mixing | None = None  # W of the step's round
    _before: tuple[torch.Tensor, torch.Tensor] | None = None  # x^(t) and m̂ at the start of the step
    xi_sq_before_round: float | None = None  # frequency control's probe of the step's round

    def start(self, engine, X: torch.Tensor) -> None:
        pass

    def phase(self, t: int) -> int:
        return bisect.bisect_right(self.phase_starts, t)

    def _frequency_controlled(self, k: int) -> bool:
        return self.frequency is not None and self.modes[k] == "controlled"

    def _period(self, k: int) -> int:
        """The gossip period H_t in phase k (a decentralized one)."""
        return self.frequency.period if self._frequency_controlled(k) else self.local_steps

    def _communicates(self, k: int) -> bool:
        """Whether this step (of decentralized phase k) ends its period with a gossip round."""
        return self.since_round + 1 >= self._period(k)

    def _round(self, engine, X: torch.Tensor, measure: bool = False) -> torch.Tensor | None:
        mixing = self.topology.mixing(self.rounds)
        self.rounds += 1
        for rows in self.shared_state:
            engine.gossip_(rows, mixing)
        self.mixing = mixing
        return engine.gossip_(X, mixing, measure=measure)

    def _bounded_round(self, engine, X: torch.Tensor) -> float:
        """One gossip round; the bound (2/p)Θ on Ξ that it gives (one scalar all-reduce)."""
        change = self._round(engine, X, measure=True)
        return local_estimate(engine.mean_scalar(change), self.mixing)["consensus_distance_bound"]

    def _estimating(self, k: int) -> bool:
        """Whether phase k's control decides from the local estimate (so every round measures Θ)."""
        return self.modes[k] == "controlled" and self.controller is not None and self.controller.measure == "estimate"

    def _gossip(self, engine, X: torch.Tensor, step: Step, k: int) -> None:
        """The step's gossip round; under frequency control, Ξ² probed just before it."""
        if self._frequency_controlled(k):
            self.xi_sq_before_round = engine.consensus_distance_sq(X)
        self.change = self._round(engine, X, measure=step.measure or self.keep_change or self._estimating(k))

    def averages_gradients(self, t: int) -> bool:
        return self.modes[self.phase(t)] == "allreduce"

    def on_gradients(self, engine, X: torch.Tensor, G: torch.Tensor, step: Step) -> None:
        k = self.phase(step.t)
        if self.modes[k] == "allreduce":
            engine.allreduce_mean_(G)
            return
        if self.momentum_buffer is not None:
            if self._before is None:
                self._before = (torch.empty_like(X), torch.empty_like(self.momentum_buffer))
            self._before[0].copy_(X)
            self._before[1].copy_(self.momentum_buffer)
        if self.form == "mix-then-step" and self._communicates(k):
            self._gossip(engine, X, step, k)

    def after_step(self, engine, X: torch.Tensor, step: Step) -> dict:
        k = self.phase(step.t)
        metrics = {"phase": k + 1, "extra_gossip_rounds": 0}
        if self.modes[k] == "allreduce":
            self.since_round = 0
            if self.frequency is not None:
                self.frequency.fixed_since = 0
            return metrics
        communicates = self._communicates(k)
        if self._frequency_controlled(k):
            metrics.update(gossip_period=self.frequency.period, consensus_target=self.frequency.target(step))
        if self.frequency is not None:
            metrics["gossip_rounds_saved"] = self.frequency.rounds_saved(communicates, self.modes[k] == "controlled")
        if communicates:
            if self.form == "step-then-mix":
                self._gossip(engine, X, step, k)
            estimating = self._estimating(k)
            estimate = None
            if step.measure or estimating:
                estimate = local_estimate(engine.mean_scalar(self.change), self.mixing)
            if step.measure:
                metrics.update(estimate)
            if self._frequency_controlled(k):
                metrics["consensus_distance_sq_before_round"] = self.xi_sq_before_round
                self.frequency.adapt(self.xi_sq_before_round, metrics["consensus_target"])
            elif self.modes[k] == "controlled":
                bound = estimate["consensus_distance_bound"] if estimating else None
                extra_round = (lambda: self._bounded_round(engine, X)) if estimating else (lambda: self._round(engine, X))
                metrics.update(self.controller.control(engine, X, step, extra_round, bound))
        else:
            self.change = None
        if self.momentum_buffer is not None:
            x_before, buffer_before = self._before
            mu = self.momentum
            self.momentum_buffer.copy_(buffer_before.mul_(mu).add_(x_before.sub_(X), alpha=(1 - mu) / step.lr))
        self.since_round = 0 if communicates else self.since_round + 1
        ends_here = k < len(self.phase_starts) and step.t + 1 == self.phase_starts[k]
        if ends_here and self.modes[k + 1] == "allreduce":
            for rows in (X, *self.optimizer_state):
                engine.allreduce_mean_(rows)
        return metrics

    def state_dict(self) -> dict:
        state = {"rounds": self.rounds, "since_round": self.since_round}
        if self.frequency is not None:
            state["frequency"] = self.frequency.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.rounds, self.since_round = int(state["rounds"]), int(state["since_round"])
        if self.frequency is not None:
            self.frequency.load_state_dict(state["frequency"])


def local_estimate(theta_sq: float, mixing: Mixing) -> dict:
    """Θ² and the bound Ξ ≤ (2/p)Θ with p the mixing quality of the round (None if p = 0)."""
    p = mixing.p
    bound = 2 / p * theta_sq**0.5 if p > 0 else None
    return {"theta_sq": theta_sq, "consensus_distance_bound": bound}


def gossip_together(engine, mixing: Mixing, *parts: torch.Tensor) -> None:
    """One gossip round of several row blocks, each worker sending them as one message (their
    columns side by side): every part ← W part (in place)."""
    joined = torch.cat(parts, dim=1)
    engine.gossip_(joined, mixing)
    for part, mixed in zip(parts, joined.split([p.shape[1] for p in parts], dim=1)):
        part.copy_(mixed)


class PeerSchedule:
    """What CHOCO-SGD, push-sum and gradient tracking share: their own communication every step
    (never a gradient average), a round counter ``rounds`` and per-worker rows (:meth:`rows`)."""

    rounds: int

    def rows(self) -> dict[str, torch.Tensor]:
        """The per-worker tensors carried from step to step (restored in place)."""
        raise NotImplementedError

    def start(self, engine, X: torch.Tensor) -> None:
        pass

    def averages_gradients(self, t: int) -> bool:
        return False

    def state_dict(self) -> dict:
        return {"rounds": self.rounds, "rows": self.rows()}

    def load_state_dict(self, state: dict) -> None:
        self.rounds = int(state["rounds"])
        for name, rows in self.rows().items():
            rows.copy_(state["rows"][name])


@dataclass
class ChocoSGD(PeerSchedule):
    """CHOCO-SGD (Koloskova, Stich, Jaggi, ICML 2019): decentralized SGD with compressed gossip.

    Worker i keeps public copies x̂_j of itself and of every worker j in its slots of W (its
    neighbours; for a time-varying graph the union of a period, so that every copy stays
    current). After the local step x_i^(t+½) = x_i^(t) − η ∂F_i, it sends only
    q_i = C(x_i^(t+½) − x̂_i) to those who copy it, everyone adds the received q_j to their copy,
    x̂_j ← x̂_j + q_j, and then x_i^(t+1) = x_i^(t+½) + γ Σ_j w_ij (x̂_j − x̂_i). The error of C is
    never lost: it stays in x − x̂ and is sent later. The copies start at the common initial
    model, which every worker knows without communication (the paper starts them at 0, i.e.
    it runs on x − x_0). With C the identity and γ = 1 this is D-SGD; random codecs are used in
    their contractive form (see :mod:`gossamer.codecs`).
    """

    topology: Topology
    gamma: float
    compressor: Compressor
    copies: torch.Tensor  # [m, K, d]: local worker i's x̂ of the workers in its slots (slot 0: itself)
    rounds: int = 0

    def rows(self) -> dict[str, torch.Tensor]:
        return {"copies": self.copies}

    def on_gradients(self, engine, X: torch.Tensor, G: torch.Tensor, step: Step) -> None:
        pass

    def after_step(self, engine, X: torch.Tensor, step: Step) -> dict:
        mixing, union, r = self.topology.mixing(self.rounds), self.topology.union, self.rounds
        own = self.copies[:, 0]  # a view: x̂_i after the update below
        codec = self.compressor.codec
        received = engine.exchange(self.compressor.compress(X - own, r, engine.rows), union, codec.nbytes())
        m, K = received.shape[:2]
        self.copies += codec.decode(received.flatten(0, 1), r).view(m, K, -1)
        weight = mixing.plan(("slot weights", union, X.dtype, X.device, engine.rows), lambda: torch.tensor(
            mixing.weights_in(union)[:, engine.rows.start : engine.rows.stop]).to(X).unsqueeze(-1))
        mixed = self.copies[:, 0] * weight[0]
        for k in range(1, K):
            mixed.addcmul_(self.copies[:, k], weight[k])
        X.add_(mixed.sub_(own), alpha=self.gamma)
        self.rounds += 1
        return {}



@dataclass
class PushSum(PeerSchedule):
    """Stochastic Gradient Push (Assran, Loizou, Ballas, Rabbat, ICML 2019): push-sum gossip over
    column-stochastic, directed and time-varying W_t.

    Worker i holds a numerator x_i and a push-sum weight w_i (w_i = 1 at the start); its model is
    the de-biased z_i = x_i / w_i, where gradients are taken and what is evaluated (X holds z
    between steps). A step: x_i ← x_i − η ∂F_i(z_i) (the optimizer's update of z applied to the
    numerator), then x_i ← Σ_j w_ij x_j and w_i ← Σ_j w_ij w_j (one message (x_j, w_j) per
    out-neighbour), z_i = x_i / w_i. Σ_i x_i and Σ_i w_i are preserved, so z_i → x̄ on a strongly
    connected graph whatever the in-degrees. With doubly stochastic W, w stays 1: D-SGD.
    """

    topology: Topology
    weight: torch.Tensor  # w_i [m, 1]
    rounds: int = 0
    _shift: torch.Tensor | None = None  # (w_i − 1) z_i at the start of the step: x_i = z_i + shift

    def rows(self) -> dict[str, torch.Tensor]:
        return {"weight": self.weight}

    def on_gradients(self, engine, X: torch.Tensor, G: torch.Tensor, step: Step) -> None:
        self._shift = torch.mul(X, self.weight - 1, out=self._shift)

    def after_step(self, engine, X: torch.Tensor, step: Step) -> dict:
        X.add_(self._shift)  # the optimizer moved z by −η u: the numerator is x − η u
        gossip_together(engine, self.topology.mixing(self.rounds), X, self.weight)
        self.rounds += 1
        X.div_(self.weight)
        return {}



@dataclass
class GradientTracking(PeerSchedule):
    """Decentralized stochastic gradient tracking, DSGT (Pu & Nedić 2021; Koloskova, Lin, Stich 2021).

    Each worker tracks the average gradient with a gossiped vector y_i:
        x_i^(t+1) = Σ_j w_ij (x_j^(t) − η y_j^(t)),
        y_i^(t+1) = Σ_j w_ij y_j^(t) + g_i^(t+1) − g_i^(t),   y_i^(0) = g_i^(0),
    so the local optimizer steps along y_i instead of g_i; Σ_i y_i = Σ_i g_i at every step, and
    the heterogeneity of the local gradients no longer biases the fixed point. x and y travel in
    one message per peer: 2d values, twice D-SGD's bytes.
    """

    topology: Topology
    tracker: torch.Tensor  # Σ_j w_ij y_j of the last round [m, d] (0 before the first step)
    previous: torch.Tensor  # g_i of the last step [m, d] (0 before the first step)
    rounds: int = 0

    def rows(self) -> dict[str, torch.Tensor]:
        return {"tracker": self.tracker, "previous_gradient": self.previous}

    def on_gradients(self, engine, X: torch.Tensor, G: torch.Tensor, step: Step) -> None:
        self.tracker.add_(G).sub_(self.previous)  # y ← W y + g_new − g_old
        self.previous.copy_(G)
        G.copy_(self.tracker)

    def after_step(self, engine, X: torch.Tensor, step: Step) -> dict:
        gossip_together(engine, self.topology.mixing(self.rounds), X, self.tracker)
        self.rounds += 1
        return {}



# ---------------------------------------------------------------- DiLoCo


class OuterOptimizer(Protocol):
    """DiLoCo's outer optimizer: moves x_outer (a row per local worker) along −Δ, in place."""

    def start(self, x_outer: torch.Tensor) -> None: ...

    def step(self, x_outer: torch.Tensor, pseudo_gradient: torch.Tensor) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@dataclass
class OuterSGD:
    """SGD with Nesterov momentum (none when ``momentum`` is 0) at learning rate ``lr``."""

    lr: float
    momentum: float
    sgd: SGD | None = None

    def start(self, x_outer: torch.Tensor) -> None:
        self.sgd = SGD(x_outer, self.momentum, self.momentum > 0)

    def step(self, x_outer: torch.Tensor, pseudo_gradient: torch.Tensor) -> None:
        self.sgd.step(x_outer, pseudo_gradient, self.lr)

    def state_dict(self) -> dict:
        return self.sgd.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sgd.load_state_dict(state)


@dataclass
class DiLoCo:
    """DiLoCo (Douillard et al. 2023): H inner steps, then an outer step on the pseudo-gradient.

    Δ = x_outer − mean_i x_i (one all-reduce); the outer optimizer (``OuterSGD``: SGD with
    Nesterov momentum, lr ``outer_lr``; in the library API the user's own) moves x_outer along −Δ
    and every worker restarts from x_outer. With outer lr 1 and momentum 0, x_outer ← mean_i x_i:
    exactly local SGD. Every worker keeps its own copy of x_outer and of the outer optimizer's
    state (identical rows, as each DiLoCo replica does), and its inner optimizer's state across
    outer steps, as the DiLoCo paper does (it is never averaged). ``shared_state`` (buffers
    averaged with the parameters) is averaged at each outer step.
    """

    local_steps: int
    outer: OuterOptimizer
    shared_state: list[torch.Tensor] = field(default_factory=list)
    x_outer: torch.Tensor | None = None

    def start(self, engine, X: torch.Tensor) -> None:
        self.x_outer = X.clone()
        self.outer.start(self.x_outer)

    def averages_gradients(self, t: int) -> bool:
        return False

    def on_gradients(self, engine, X: torch.Tensor, G: torch.Tensor, step: Step) -> None:
        pass

    def after_step(self, engine, X: torch.Tensor, step: Step) -> dict:
        if (step.t + 1) % self.local_steps:
            return {}
        for rows in (X, *self.shared_state):
            engine.allreduce_mean_(rows)
        self.outer.step(self.x_outer, self.x_outer - X)
        X.copy_(self.x_outer)
        return {}

    def state_dict(self) -> dict:
        return {"rows": {"x_outer": self.x_outer}, "outer": self.outer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.x_outer.copy_(state["rows"]["x_outer"])
        self.outer.load_state_dict(state["outer"])


# ---------------------------------------------------------------- options and registry


def _positive_int(options, *names: str) -> None:
    for name in names:
        if getattr(options, name) < 1:
            raise ConfigError(f"{name} must be a positive integer, got {getattr(options, name)}")


@dataclass
class LocalOptions:
    local_steps: int = 1  # H: local steps between averages
    compression: str = "none"  # or a codec: sign, ef-sign, ...

    def validate(self, cfg) -> None:
        _positive_int(self, "local_steps")
        if self.compression != "none":
            check_spec(self.compression)
            if cfg.average_optimizer_state:
                raise ConfigError("average_optimizer_state: true needs compression: none")


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
        if (self.switch_epoch or 0) < 0 or (self.switch_step or 0) < 0:
            raise ConfigError("switch_epoch and switch_step must be >= 0")


@dataclass
class HierarchicalOptions(LocalOptions):
    block_size: int = 1  # consecutive workers per block
    block_rounds: int = 1  # H_b: block averages per global average

    def validate(self, cfg) -> None:
        super().validate(cfg)
        _positive_int(self, "block_size", "block_rounds")
        if cfg.workers % self.block_size:
            raise ConfigError(f"block_size must divide workers: {self.block_size} does not divide {cfg.workers}")


GOSSIP_FORMS = ("step-then-mix", "mix-then-step")
PHASE_MODES = ("allreduce", "gossip", "controlled")
MOMENTUM_MODES = ("local", "quasi-global")


@dataclass
class GraphOptions:
    """The communication graph of a decentralized algorithm."""

    topology: str = "ring"
    topology_seed: int | None = None  # None: the run's seed

    def validate(self, cfg) -> None:
        TOPOLOGIES.parse(self.topology)


@dataclass
class GossipOptions(GraphOptions):
    gossip_form: str = "step-then-mix"
    momentum_mode: str = "local"  # or quasi-global (Lin, Kong, Stich, Jaggi 2021)
    local_steps: int = 1  # H: local steps per gossip round (1: D-SGD); H_0 under frequency control
    phases: list[str] = field(default_factory=list)  # a mode per phase: allreduce | gossip | controlled
    phase_epochs: list[float] = field(default_factory=list)  # boundaries; [] = the lr milestones
    phase_steps: list[int] = field(default_factory=list)  # boundaries in steps instead
    consensus: ConsensusConfig = field(default_factory=ConsensusConfig)

    def validate(self, cfg) -> None:
        super().validate(cfg)
        _positive_int(self, "local_steps")
        if self.phase_epochs and self.phase_steps:
            raise ConfigError("give the gossip phase boundaries as phase_epochs or phase_steps, not both")
        if (self.phase_epochs or self.phase_steps) and not self.phases:
            raise ConfigError(f"{'phase_steps' if self.phase_steps else 'phase_epochs'} needs phases "
                              f"(one mode per phase)")
        if self.gossip_form not in GOSSIP_FORMS:
            raise ConfigError(f"unknown gossip_form '{self.gossip_form}'; choose one of: {', '.join(GOSSIP_FORMS)}")
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



@dataclass
class PeerOptions(GraphOptions):
    """Options of an algorithm whose only communication is its own (sgp, gradient-tracking, choco)."""

    def validate(self, cfg) -> None:
        super().validate(cfg)
        if cfg.average_optimizer_state:
            raise ConfigError(f"average_optimizer_state does not apply to algorithm '{cfg.algorithm}': "
                              f"its optimizer state stays local")


@dataclass
class ChocoOptions(PeerOptions):
    compression: str = "none"  # a codec: top-k:F, random-k:F, qsgd:S, sign
    choco_gamma: float = 1.0  # γ, the consensus step size

    def validate(self, cfg) -> None:
        super().validate(cfg)
        if not 0 < self.choco_gamma <= 1:
            raise ConfigError(f"choco_gamma must be in (0, 1], got {self.choco_gamma}")
        if self.compression.startswith(ERROR_FEEDBACK):
            raise ConfigError(f"choco keeps the compression error in its public copies x̂ itself: use compression "
                              f"{self.compression.removeprefix(ERROR_FEEDBACK)[:100]}, without '{ERROR_FEEDBACK}'")
        if self.compression != "none":
            check_spec(self.compression)


@dataclass
class DiLoCoOptions:
    local_steps: int = 1  # H: inner steps per outer step
    outer_lr: float = 0.7
    outer_momentum: float = 0.9  # Nesterov

    def validate(self, cfg) -> None:
        _positive_int(self, "local_steps")
        if cfg.average_optimizer_state:
            raise ConfigError("average_optimizer_state does not apply to algorithm diloco: each worker keeps its "
                              "inner optimizer state across outer steps, as in the DiLoCo paper")
        if not self.outer_lr > 0 or not 0 <= self.outer_momentum < 1:
            raise ConfigError(f"diloco needs outer_lr > 0 and outer_momentum in [0, 1), "
                              f"got {self.outer_lr} and {self.outer_momentum}")


def switch_step(cfg, steps_per_epoch: int) -> int:
    """Post-local SGD's switch step t′: switch_step, switch_epoch, or the first milestone."""
    if cfg.switch_step is not None:
        return cfg.switch_step
    epoch = cfg.switch_epoch if cfg.switch_epoch is not None else (cfg.milestones or [0.0])[0]
    return round(epoch * steps_per_epoch)


def gossip_phases(cfg) -> tuple[list[str], list[float], str]:
    """(one mode per phase, where one phase ends and the next begins, and the unit of those
    boundaries: "steps" or "epochs"). Without ``phases``, gossip is one phase, controlled if a
    consensus target is set."""
    if not cfg.phases:
        return ["controlled" if cfg.consensus.target != "none" else "gossip"], [], "epochs"
    if cfg.phase_steps:
        return list(cfg.phases), list(cfg.phase_steps), "steps"
    return list(cfg.phases), list(cfg.phase_epochs or cfg.milestones), "epochs"


def phase_starts(cfg, ctx: Context) -> list[int]:
    """The first step of phases 2, 3, ... (each must lie inside the run, when its length is known)."""
    _, boundaries, unit = gossip_phases(cfg)
    starts = [int(b) if unit == "steps" else round(b * ctx.steps_per_epoch) for b in boundaries]
    if ctx.total_steps is not None and any(s >= ctx.total_steps for s in starts):
        raise ConfigError(f"phase_steps must be below the run's {ctx.total_steps} steps, got {starts}")
    return starts


def _shared(cfg, ctx: Context) -> list[torch.Tensor]:
    """The rows communicated with the parameters: optimizer state if averaged, and buffers."""
    return [*(ctx.optimizer_rows if cfg.average_optimizer_state else []), *ctx.buffer_rows]


def _sync(cfg, ctx: Context) -> ModelSync:
    return ModelSync(cfg.compression, ctx.numels, _shared(cfg, ctx), cfg.seed)


def _graph(cfg, directed: bool = False) -> Topology:
    """The run's topology; a directed one (column- but not doubly stochastic) only if ``directed``."""
    topology = build_topology(cfg.topology, cfg.workers,
                              seed=cfg.seed if cfg.topology_seed is None else cfg.topology_seed)
    if not directed and not topology.doubly_stochastic:
        raise ConfigError(f"topology '{cfg.topology[:100]}' is directed (its W is column- but not doubly stochastic): "
                          f"algorithm {cfg.algorithm} needs an undirected one; only algorithm sgp (push-sum) runs on it")
    return topology


def _peer_graph(cfg, ctx: Context, directed: bool = False) -> Topology:
    """The topology of sgp, gradient-tracking or choco, which communicate nothing but their own state."""
    if ctx.buffer_rows:
        raise ConfigError(f"algorithm {cfg.algorithm} keeps buffers local; it cannot average them")
    return _graph(cfg, directed)


@ALGORITHMS.register("allreduce", help="mini-batch SGD: gradients averaged every step (Lin et al.'s baseline)")
def _allreduce(cfg, ctx: Context) -> AllReduce:
    return AllReduce()


@ALGORITHMS.register("local", options=LocalOptions,
                     help="local SGD: H local steps, then the exact (or compressed) average (Lin et al.)")
def _local(cfg, ctx: Context) -> LocalSGD:
    return LocalSGD(cfg.local_steps, _sync(cfg, ctx))


@ALGORITHMS.register("post-local", options=PostLocalOptions,
                     help="post-local SGD: mini-batch SGD until t′, then local SGD (Lin et al.)")
def _post_local(cfg, ctx: Context) -> LocalSGD:
    return LocalSGD(cfg.local_steps, _sync(cfg, ctx), switch=switch_step(cfg, ctx.steps_per_epoch))


@ALGORITHMS.register("hierarchical", options=HierarchicalOptions,
                     help="hierarchical local SGD: block averages every H steps, global every H·H_b (Lin et al.)")
def _hierarchical(cfg, ctx: Context) -> LocalSGD:
    return LocalSGD(cfg.local_steps, _sync(cfg, ctx), block_size=cfg.block_size, block_rounds=cfg.block_rounds)


@ALGORITHMS.register("gossip", options=GossipOptions,
                     help="D-SGD over a topology (a gossip round every H steps), by phase, with consensus control "
                          "(Kong et al.)")
def _gossip(cfg, ctx: Context) -> Decentralized:
    topology = _graph(cfg)
    modes = gossip_phases(cfg)[0]
    steps = ctx.total_steps
    if ctx.reference is not None and steps is not None and len(ctx.reference) < steps:
        raise ConfigError(f"consensus.target {cfg.consensus.target[:100]} has {len(ctx.reference)} steps; "
                          f"this run needs {steps}")
    controller = frequency = None
    if cfg.consensus.target != "none":
        if cfg.consensus.measure == "estimate" and any(m.p == 0 for m in topology.mixings):
            raise ConfigError(f"consensus.measure estimate needs every round of the topology to mix (p > 0); "
                              f"'{cfg.topology[:100]}' has rounds with p = 0, where Θ bounds nothing")
        p = 1 - (1 - spectral_gap(topology)) ** 2
        target = build_target(cfg.consensus, p, ctx.reference)
        if cfg.consensus.action == "frequency":
            frequency = FrequencyControl(target, cfg.local_steps, cfg.consensus.max_local_steps)
        else:
            controller = Controller(target, cfg.consensus.max_extra_rounds, cfg.consensus.on_budget,
                                    cfg.consensus.measure)
    buffer = None
    if cfg.momentum_mode == "quasi-global":
        if not ctx.optimizer_rows:
            raise ConfigError("momentum_mode quasi-global needs the trainer's SGD momentum buffer")
        buffer = ctx.optimizer_rows[0]
    return Decentralized(topology, cfg.gossip_form, modes, phase_starts(cfg, ctx), controller, _shared(cfg, ctx),
                         ctx.optimizer_rows, cfg.local_steps, frequency, buffer,
                         cfg.momentum if buffer is not None else 0.0)


@ALGORITHMS.register("choco", options=ChocoOptions,
                     help="CHOCO-SGD: compressed gossip of x − x̂ with public copies x̂, consensus step γ (Koloskova et al.)")
def _choco(cfg, ctx: Context) -> ChocoSGD:
    topology = _peer_graph(cfg, ctx)
    compressor = build_compressor(cfg.compression, ctx.numels, ctx.X, cfg.seed, contractive=True)
    copies = ctx.X.unsqueeze(1).repeat(1, topology.union.index.shape[0], 1)
    return ChocoSGD(topology, cfg.choco_gamma, compressor, copies)


@ALGORITHMS.register("sgp", options=PeerOptions,
                     help="Stochastic Gradient Push: push-sum over directed, time-varying graphs (Assran et al.)")
def _sgp(cfg, ctx: Context) -> PushSum:
    return PushSum(_peer_graph(cfg, ctx, directed=True),
                   torch.ones(ctx.X.shape[0], 1, dtype=ctx.X.dtype, device=ctx.X.device))


@ALGORITHMS.register("gradient-tracking", options=PeerOptions,
                     help="DSGT: gossip of x and of a tracker y of the average gradient (Pu & Nedić)")
def _gradient_tracking(cfg, ctx: Context) -> GradientTracking:
    return GradientTracking(_peer_graph(cfg, ctx), torch.zeros_like(ctx.X), torch.zeros_like(ctx.X))


@ALGORITHMS.register("diloco", options=DiLoCoOptions,
                     help="DiLoCo: H inner steps, then an outer Nesterov step on the pseudo-gradient")
def _diloco(cfg, ctx: Context) -> DiLoCo:
    return DiLoCo(cfg.local_steps, OuterSGD(cfg.outer_lr, cfg.outer_momentum), ctx.buffer_rows)


def build_schedule(cfg, ctx: Context) -> Schedule:
    """The schedule named by ``cfg.algorithm``."""
    return ALGORITHMS[cfg.algorithm].build(cfg, ctx)
