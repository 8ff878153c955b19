"""Peer algorithms whose only communication is their own state, every step, on a graph:
CHOCO-SGD (compressed gossip), Stochastic Gradient Push (directed graphs), gradient tracking."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..codecs import ERROR_FEEDBACK, Compressor, build_compressor, check_spec
from ..engines.base import combine
from ..registry import ConfigError
from ..topology import Mixing, Topology
from .gossip import GraphOptions, build_graph
from .schedule import ALGORITHMS, Context, Schedule, Step


def gossip_together(engine, mixing: Mixing, *parts: torch.Tensor) -> None:
    """One gossip round of several row blocks, each worker sending them as one message (their
    columns side by side): every part ← W part (in place)."""
    joined = torch.cat(parts, dim=1)
    engine.gossip_(joined, mixing)
    for part, mixed in zip(parts, joined.split([p.shape[1] for p in parts], dim=1)):
        part.copy_(mixed)


class PeerSchedule(Schedule):
    """What CHOCO-SGD, push-sum and gradient tracking share: their own communication every step
    (never a gradient average), a round counter ``rounds`` and per-worker rows (:meth:`rows`)."""

    rounds: int

    def rows(self) -> dict[str, torch.Tensor]:
        """The per-worker tensors carried from step to step (restored in place)."""
        raise NotImplementedError

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

    def after_step(self, engine, X: torch.Tensor, step: Step) -> dict:
        mixing, union, r = self.topology.mixing(self.rounds), self.topology.union, self.rounds
        own = self.copies[:, 0]  # a view: x̂_i after the update below
        codec = self.compressor.codec
        received = engine.exchange(self.compressor.compress(X - own, r, engine.rows), union)
        m, K = received.shape[:2]
        self.copies += codec.decode(received.flatten(0, 1), r).view(m, K, -1)
        weight = mixing.plan(("slot weights", union, X.dtype, X.device, engine.rows), lambda: torch.tensor(
            mixing.weights_in(union)[:, engine.rows.start : engine.rows.stop]).to(X).unsqueeze(-1))
        X.add_(combine(self.copies.unbind(1), weight).sub_(own), alpha=self.gamma)
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


# ---------------------------------------------------------------- options and builders


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


def _peer_graph(cfg, ctx: Context, directed: bool = False) -> Topology:
    """The topology of a peer algorithm, which communicates nothing but its own state."""
    if ctx.buffer_rows:
        raise ConfigError(f"algorithm {cfg.algorithm} keeps buffers local; it cannot average them")
    return build_graph(cfg, directed)


@ALGORITHMS.register("choco", options=ChocoOptions, example=("topology=ring", "choco_gamma=0.5"),
                     help="CHOCO-SGD: compressed gossip of x − x̂ with public copies x̂, consensus step γ (Koloskova et al.)")
def _choco(cfg, ctx: Context) -> ChocoSGD:
    topology = _peer_graph(cfg, ctx)
    compressor = build_compressor(cfg.compression, ctx.numels, ctx.X, cfg.seed, contractive=True,
                                  shapes=ctx.shapes or None)
    copies = ctx.X.unsqueeze(1).repeat(1, topology.union.index.shape[0], 1)
    return ChocoSGD(topology, cfg.choco_gamma, compressor, copies)


@ALGORITHMS.register("sgp", options=PeerOptions, example=("topology=directed-exponential",),
                     help="Stochastic Gradient Push: push-sum over directed, time-varying graphs (Assran et al.)")
def _sgp(cfg, ctx: Context) -> PushSum:
    return PushSum(_peer_graph(cfg, ctx, directed=True),
                   torch.ones(ctx.X.shape[0], 1, dtype=ctx.X.dtype, device=ctx.X.device))


@ALGORITHMS.register("gradient-tracking", options=PeerOptions, example=("topology=ring",),
                     help="DSGT: gossip of x and of a tracker y of the average gradient (Pu & Nedić)")
def _gradient_tracking(cfg, ctx: Context) -> GradientTracking:
    return GradientTracking(_peer_graph(cfg, ctx), torch.zeros_like(ctx.X), torch.zeros_like(ctx.X))
