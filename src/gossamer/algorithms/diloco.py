"""DiLoCo (Douillard et al. 2023) and its low-communication variants: H inner steps, then an
outer step on the pseudo-gradient Δ = x_outer − x_i.

- compressed outer gradients (SparseLoCo, Sarfi et al. 2025): each worker sends C(Δ_i (+ β e_i)),
  all-gathered; error feedback keeps each worker's residual e_i, decayed by β (``ef_decay``, as
  Templar's SparseLoCo code, tplr-ai/templar c2397ac ``prepare_gradient_dict``);
- Streaming DiLoCo (Douillard et al. 2025): F fragments synchronised at staggered steps, the outer
  update applied τ inner steps after it was sent, mixed with the local fragment by α;
- NoLoCo (Kolehmainen et al. 2025): the outer step averages with the neighbours of an outer
  topology instead of an all-reduce;
- overlapped outer steps (``outer_overlap``), the round's all-reduce in flight through the next
  inner phase: ``delayed`` (the one-step-delayed outer step, as PCCL's async DiLoCo) and
  ``eager`` (Kale, Douillard, Donchev 2025: each replica's own fresh outer gradient with the
  others' one round late). The rules: ``shared/specs/asynchronous-outer-steps.md`` §1, of the
  project's design notes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from ..codecs import ERROR_FEEDBACK, Compressor, build_compressor, check_spec
from ..engines.base import Work
from ..faults import REJOIN_MODES
from ..outer import OuterOptions, OuterSchedule, OuterStep, build_outer
from ..registry import ConfigError, positive_ints, short
from ..topology import TOPOLOGIES, Topology, build_topology
from .peer import gossip_together
from .schedule import ALGORITHMS, Context, Schedule, Step


def fragment_columns(numels: list[int], fragments: int) -> list[slice]:
    """``fragments`` runs of consecutive parameter tensors, the cut after each run at the tensor
    boundary nearest to j·d/F: the column ranges of the fragments."""
    if fragments > len(numels):
        raise ConfigError(f"fragments must be at most the model's {len(numels)} parameter tensors, got {fragments}")
    ends, d, cuts = list(itertools.accumulate(numels)), sum(numels), []
    for j in range(1, fragments):
        first = cuts[-1] + 1 if cuts else 0
        cuts.append(min(range(first, len(numels) - fragments + j), key=lambda k: abs(ends[k] - j * d / fragments)))
    bounds = [0, *(ends[k] for k in cuts), d]
    return [slice(a, b) for a, b in zip(bounds, bounds[1:])]


OVERLAPS = ("none", "delayed", "eager")
EAGER_FIRST = ("own", "sync")  # eager's first round: its own share alone, or one standard DiLoCo step


@dataclass
class DiLoCo(Schedule):
    """DiLoCo: H inner steps, then an outer step on the pseudo-gradient, per fragment.

    Fragment j (columns ``fragments[j]``; one fragment: the whole row) is sent after step t when
    t + 1 − o_j ≥ 0 is a multiple of H, o_j = ⌊jH/F⌋: Δ = x_outer − mean_i x_i (one all-reduce)
    or, ``compressors`` set, mean_i C(x_outer − x_i + e_i) (an all-gather of the messages); the
    outer optimizer of the fragment (:mod:`gossamer.outer`: ``outer_optimizer``, Nesterov SGD at lr
    ``outer_lr`` by default, with its schedule; in the library API the user's own) moves x_outer
    along −Δ. After step t + τ (``delay``) it is applied:
    x_i ← α x_i + (1 − α) x_outer (``alpha``; the worker has taken τ more inner steps; the time
    model lets the send run behind min(τ, ⌊H/F⌋) steps of compute). One
    fragment, τ = 0, α = 0 is DiLoCo: x_i ← x_outer; with outer lr 1 and momentum 0 that is local
    SGD. With an outer ``topology`` (NoLoCo) the round-r outer step of worker i uses its
    neighbours': Δ̄_i = Σ_j w_ij Δ_j, x̄_i = Σ_j w_ij x_outer,j (one gossip round of both), and
    NoLoCo's modified momentum takes the pull towards them into the outer gradient,
    g_i = Δ̄_i + γ (x_outer,i − x̄_i), M_i ← μ M_i + g_i, x_outer,i ← x_outer,i − lr (g_i + μ M_i)
    (the authors' code: the heavy-ball form of this with γ = 1; here DiLoCo's Nesterov, so that
    W = 11ᵀ/n, ``complete``, is DiLoCo). Every worker keeps its own copy of x_outer and of the outer
    optimizer's state, and its inner optimizer's state across outer steps, as the DiLoCo paper
    does. ``shared_state`` (buffers) is averaged at each send of fragment 0 — with an outer
    topology, mixed in the same gossip round (NoLoCo has no all-reduce).

    ``overlap`` (``outer_overlap``): the all-reduce of round r's outer gradients, Δ^(r) = mean_m Δ_m^(r),
    Δ_m^(r) = x_outer,m − x_m, runs behind the next round's compute (the ledger: ⌊H/F⌋ steps) and is
    consumed at the end of that round, r + 1:

    - ``delayed``: x_outer ← OuterOpt(x_outer, Δ^(r−1)); the round just finished enters only as
      Δ^(r), one round later; the first round makes no outer step (the replicas restart from
      x^(0), as PCCL's ``async_diloco.py``, PrimeIntellect-ai/pccl 7815195). Replicas stay identical.
    - ``eager``: replica m steps on Δ̂_m^(r) = Δ_m^(r)/M + (Δ^(r−1) − Δ_m^(r−1)/M): its own fresh
      contribution, the others' one round late (no extra traffic: it subtracts its own stale share);
      the replicas' outer models differ (each keeps its own, and its outer optimizer's state). The
      first round (``eager_first``): ``own``, Δ^(0) = Δ_m^(0) = 0, so Δ̂ = Δ_m/M; or ``sync``, one
      standard DiLoCo step, then eager from zero. With a codec, Δ_m is the replica's decoded
      message: what the others receive of it. M = 1 is DiLoCo bit for bit.

    What is in flight really is: the all-reduce (all-gather) is started with ``async_op`` and
    waited for where it is consumed — τ steps after the send, or at the next round's send with
    ``overlap`` — so on the dist engine it runs during the inner steps between (the simulator
    completes it at once; the numbers are the same). A checkpoint waits for it first.
    """

    local_steps: int
    outers: list[OuterStep]
    shared_state: list[torch.Tensor] = field(default_factory=list)
    fragments: list[slice] = field(default_factory=lambda: [slice(None)])
    compressors: list[Compressor] | None = None
    delay: int = 0  # τ
    alpha: float = 0.0
    topology: Topology | None = None
    gamma: float = 1.0  # NoLoCo's pull towards the neighbours' outer model, in the outer gradient
    overlap: str = "none"
    eager_first: str = "own"
    replicas: int = 1  # M: every worker (eager's share of its own outer gradient)
    x_outer: torch.Tensor | None = None
    pending: list[Work] = field(default_factory=list)  # Δ^(r−1) of each fragment, in flight (its rows)
    own: list[torch.Tensor] = field(default_factory=list)  # eager: each replica's Δ_m^(r−1) (rows)
    landing: dict[int, Work] = field(default_factory=dict)  # fragment → its outer step, its Δ in flight

    def start(self, engine, X: torch.Tensor) -> None:
        self.x_outer = X.clone()
        for outer, cols in zip(self.outers, self.fragments):
            outer.start(self.x_outer[:, cols])
        if self.overlap != "none":
            self.pending = [Work.done(torch.zeros_like(X[:, cols])) for cols in self.fragments]
            self.own = [torch.zeros_like(X[:, cols]) for cols in self.fragments] if self.overlap == "eager" else []

    def sends(self, j: int, t: int) -> bool:
        """Whether fragment j is sent after step t."""
        since = t + 1 - j * self.local_steps // len(self.fragments)
        return t >= 0 and since >= 0 and since % self.local_steps == 0

    def first_send(self, j: int, t: int) -> bool:
        """Whether sending fragment j after step t is its first round."""
        return t + 1 - j * self.local_steps // len(self.fragments) == self.local_steps

    def synced_after(self, t: int) -> bool:
        """Whether every model is x_outer, the same on every worker, after step t: only where the
        whole row is applied unmixed (one fragment, α = 0, no outer topology, not eager: its
        replicas differ), τ steps after a send."""
        return (len(self.fragments) == 1 and self.topology is None and not self.alpha and self.overlap != "eager"
                and self.sends(0, t - self.delay))

    def after_step(self, engine, X: torch.Tensor, step: Step) -> dict:
        for j, cols in enumerate(self.fragments):
            if self.sends(j, step.t):
                self._send(engine, X, j, step.t)
            if self.sends(j, step.t - self.delay):
                self._land(j)
                x, outer = X[:, cols], self.x_outer[:, cols]
                x.mul_(self.alpha).add_(outer, alpha=1 - self.alpha) if self.alpha else x.copy_(outer)
        return {}

    def _land(self, j: int) -> None:
        """Fragment j's outer step, its Δ in flight since the send: waited for, and taken."""
        if j in self.landing:
            self.landing.pop(j).wait()

    def _send(self, engine, X: torch.Tensor, j: int, t: int) -> None:
        cols, outer = self.fragments[j], self.x_outer[:, self.fragments[j]]
        if self.topology is not None:
            self._neighbours_step(engine, X, t)
            return
        if j == 0:
            for i, rows in enumerate(self.shared_state):
                engine.allreduce_mean_(rows, f"state/{i}")
        if self.overlap == "none" or (self.eager_first == "sync" and self.first_send(j, t)):
            self._outer_step(engine, X, j, t)  # eager_first sync: eager's first round is DiLoCo's
        else:
            self._overlapped_step(engine, X, j, t)

    def _outer_step(self, engine, X: torch.Tensor, j: int, t: int) -> None:
        """Fragment j's outer step on this round's Δ (DiLoCo, Streaming DiLoCo, SparseLoCo): its
        all-reduce (all-gather of the messages) started now and taken τ steps later, where the
        outer update is applied (:meth:`_land`; τ = 0: at once)."""
        cols, outer = self.fragments[j], self.x_outer[:, self.fragments[j]]
        # the fragment travels while the next τ steps compute (at most until the next send)
        with engine.comm.overlapping(behind=min(self.delay, self.local_steps // len(self.fragments))):
            if self.compressors is not None:
                codec = self.compressors[j]
                gathered = engine.all_gather(codec.compress(outer - X[:, cols], t, engine.rows), async_op=True)
                gradient = Work(lambda: codec.combine(gathered.wait(), t))
            elif engine.adversary is not None:  # the outer gradients travel, for the robust rule
                robust = outer - X[:, cols]
                engine.allreduce_mean_(robust, f"outer-gradient/{j}")
                gradient = Work.done(robust)
            else:
                mean = engine.allreduce_mean_(X[:, cols].clone(), async_op=True)
                gradient = Work(lambda: outer - mean.wait())
        self.landing[j] = Work(lambda: self.outers[j].step(outer, gradient.wait(), t))

    def _overlapped_step(self, engine, X: torch.Tensor, j: int, t: int) -> None:
        """Fragment j's delayed or eager outer step (class docstring): this round's Δ leaves, to be
        consumed a round later, behind the next round's compute."""
        cols, outer = self.fragments[j], self.x_outer[:, self.fragments[j]]
        own = outer - X[:, cols]  # Δ_m^(r) of each replica
        with engine.comm.overlapping(behind=self.local_steps // len(self.fragments)):
            if self.compressors is not None:
                codec = self.compressors[j]
                messages = codec.compress(own, t, engine.rows)
                gathered = engine.all_gather(messages, async_op=True)
                fresh = Work(lambda: codec.combine(gathered.wait(), t))
                own = codec.codec.decode(messages, t)  # what the others receive of it
            else:
                fresh = engine.allreduce_mean_(own.clone(), async_op=True)
        previous = self.pending[j].wait()  # Δ^(r−1), in flight through this round
        if self.overlap == "delayed":
            if not self.first_send(j, t):  # the first round has no outer gradient in hand: no outer step
                self.outers[j].step(outer, previous, t, staleness=1)
        else:
            share = 1.0 / self.replicas  # own/M + (Δ^(r−1) − own^(r−1)/M): M = 1 is DiLoCo bit for bit
            self.outers[j].step(outer, own.mul(share).add_(previous.sub_(self.own[j], alpha=share)), t)
            self.own[j].copy_(own)
        self.pending[j] = fresh

    def _neighbours_step(self, engine, X: torch.Tensor, t: int) -> None:
        """NoLoCo's outer step: Δ, x_outer and the buffers in one gossip round (no all-reduce)."""
        delta, neighbours = self.x_outer - X, self.x_outer.clone()
        gossip_together(engine, self.topology.mixing((t + 1) // self.local_steps - 1), delta, neighbours,
                        *self.shared_state)
        self.outers[0].step(self.x_outer, delta.add_(self.x_outer - neighbours, alpha=self.gamma), t)

    def state_dict(self) -> dict:
        """The state after every transfer in flight has arrived (the outer steps they feed, in the
        order they were sent, taken): what a run that waited for each at once holds."""
        for j in list(self.landing):
            self._land(j)
        rows = {"x_outer": self.x_outer}
        rows.update({f"residual/{j}": c.residual for j, c in enumerate(self.compressors or [])
                     if c.residual is not None})
        rows.update({f"pending/{j}": work.wait() for j, work in enumerate(self.pending)})
        rows.update({f"own/{j}": T for j, T in enumerate(self.own)})
        first, *others = self.outers
        return {"rows": rows, "outer": first.state_dict(),
                **{f"outer/{j}": o.state_dict() for j, o in enumerate(others, 1)}}

    def load_state_dict(self, state: dict) -> None:
        self.x_outer.copy_(state["rows"]["x_outer"])
        if self.overlap != "none":
            self.pending = [Work.done(state["rows"][f"pending/{j}"].clone()) for j in range(len(self.fragments))]
            for j, own in enumerate(self.own):
                own.copy_(state["rows"][f"own/{j}"])
        for j, c in enumerate(self.compressors or []):
            if c.residual is not None:
                c.residual = state["rows"][f"residual/{j}"].clone()
        for j, o in enumerate(self.outers):
            o.load_state_dict(state[f"outer/{j}" if j else "outer"])


@dataclass
class DiLoCoOptions(OuterOptions):
    local_steps: int = 1  # H: inner steps per outer step
    compression: str = "none"  # the pseudo-gradients' codec (all-gathered): ef-top-k:0.03+quant:2, ...
    ef_decay: float = 1.0  # β: the error-feedback buffer e ← βe + Δ before it is compressed (SparseLoCo; 1: plain)
    fragments: int = 1  # F: Streaming DiLoCo's fragments, synced at staggered steps
    fragment_delay: int = 0  # τ: inner steps between sending a fragment and applying its outer update
    fragment_alpha: float = 0.0  # α: x_i ← α x_i + (1 − α) x_outer when it is applied
    outer_topology: str = "none"  # NoLoCo: the outer step averages with neighbours on this topology
    outer_gamma: float = 1.0  # NoLoCo: γ, the pull towards the neighbours' outer model (1: the authors' code)
    outer_overlap: str = "none"  # none | delayed | eager: the outer all-reduce in flight through the next round
    eager_first: str = "own"  # eager's first round: own (its own share alone) | sync (one standard DiLoCo step)

    def validate(self, cfg) -> None:
        positive_ints(self, "local_steps", "fragments")
        super().validate(cfg)
        if cfg.average_optimizer_state:
            raise ConfigError("average_optimizer_state does not apply to algorithm diloco: each worker keeps its "
                              "inner optimizer state across outer steps, as in the DiLoCo paper")
        if self.compression != "none":
            check_spec(self.compression)
        if self.ef_decay != 1.0 and not self.compression.startswith(ERROR_FEEDBACK):
            raise ConfigError(f"ef_decay applies only with an error-feedback codec (compression: ef-..., e.g. "
                              f"ef-top-k:0.03+quant:2), got compression: {self.compression}")
        if not 0 <= self.ef_decay <= 1:
            raise ConfigError(f"ef_decay must be in [0, 1], got {self.ef_decay}")
        if cfg.faults is not None and (self.fragments > 1 or self.outer_topology != "none" or self.compression != "none"):
            raise ConfigError("faults: diloco drops workers with fragments: 1, outer_topology: none and compression: "
                              "none only")
        if cfg.byzantine is not None and (self.outer_topology != "none" or self.compression != "none"):
            raise ConfigError("byzantine: diloco has a Byzantine model with outer_topology: none and compression: "
                              "none only")
        if self.fragments > self.local_steps:
            raise ConfigError(f"fragments must be at most local_steps={self.local_steps} (each fragment is sent "
                              f"at its own step of the H), got {self.fragments}")
        if not 0 <= self.fragment_delay < self.local_steps:
            raise ConfigError(f"fragment_delay must be in [0, local_steps={self.local_steps}), got {self.fragment_delay}")
        if not 0 <= self.fragment_alpha < 1:
            raise ConfigError(f"fragment_alpha must be in [0, 1), got {self.fragment_alpha}")
        self._check_overlap(cfg)
        if self.outer_topology == "none":
            if self.outer_gamma != 1.0:
                raise ConfigError("outer_gamma applies only with an outer_topology (NoLoCo)")
            return
        TOPOLOGIES.parse(self.outer_topology)
        if self.compression != "none" or self.fragments > 1 or self.fragment_delay or self.fragment_alpha:
            raise ConfigError("outer_topology (NoLoCo) needs compression: none, fragments: 1, fragment_delay: 0 "
                              "and fragment_alpha: 0")
        if not 0 <= self.outer_gamma <= 1:
            raise ConfigError(f"outer_gamma must be in [0, 1], got {self.outer_gamma}")

    def _check_overlap(self, cfg) -> None:
        if self.outer_overlap not in OVERLAPS:
            raise ConfigError(f"unknown outer_overlap '{short(self.outer_overlap)}'; choose one of: {', '.join(OVERLAPS)}")
        if self.eager_first not in EAGER_FIRST:
            raise ConfigError(f"unknown eager_first '{short(self.eager_first)}'; choose one of: {', '.join(EAGER_FIRST)}")
        if self.eager_first != "own" and self.outer_overlap != "eager":
            raise ConfigError("eager_first applies only with outer_overlap: eager")
        if self.outer_overlap == "none":
            return
        if self.fragment_delay:
            raise ConfigError(f"outer_overlap {self.outer_overlap} keeps the outer all-reduce in flight for a whole "
                              f"round, in place of fragment_delay's τ steps: use fragment_delay: 0")
        if self.outer_topology != "none":
            raise ConfigError(f"outer_overlap {self.outer_overlap} overlaps an all-reduce; NoLoCo's outer_topology "
                              f"has none: use outer_overlap: none")
        if cfg.faults is not None:
            raise ConfigError(f"faults: diloco with outer_overlap {self.outer_overlap} does not drop workers (the "
                              f"in-flight outer gradients of a worker that leaves have no rule yet): use outer_overlap: none")
        if cfg.byzantine is not None:
            raise ConfigError(f"byzantine: diloco's Byzantine model is for outer_overlap: none, not "
                              f"{self.outer_overlap}")


def _diloco_hook(cfg) -> dict:
    """The keyword options of ``gossamer.integrations.DiLoCo`` that run DiLoCo as ``cfg`` does."""
    return {key: getattr(cfg, key) for key in ("local_steps", "compression", "fragments", "fragment_delay",
                                               "fragment_alpha", "outer_topology", "outer_gamma", "outer_overlap",
                                               "eager_first")}


@ALGORITHMS.register("diloco", options=DiLoCoOptions, example=("local_steps=3",), faults=REJOIN_MODES,
                     byzantine="allreduce", hook=("DiLoCo", _diloco_hook),
                     help="DiLoCo: H inner steps, then an outer Nesterov step on the pseudo-gradient; compressed "
                          "(SparseLoCo), streaming (fragments) or on an outer topology (NoLoCo)")
def _diloco(cfg, ctx: Context) -> DiLoCo:
    fragments = fragment_columns(ctx.numels, cfg.fragments)
    outers = [OuterStep(ctx.outer_optimizer(cols), OuterSchedule(cfg.outer_lr, cfg.outer_momentum))
              if ctx.outer_optimizer else build_outer(cfg, ctx.total_steps) for cols in fragments]
    shapes = ctx.shapes or [(n,) for n in ctx.numels]
    compressors = None if cfg.compression == "none" else \
        [build_compressor(cfg.compression, ctx.numels[_tensors(ctx.numels, cols)], ctx.X[:, cols], cfg.seed,
                          decay=cfg.ef_decay, shapes=shapes[_tensors(ctx.numels, cols)]) for cols in fragments]
    topology = None if cfg.outer_topology == "none" else build_topology(cfg.outer_topology, cfg.workers, cfg.seed)
    if topology is not None and not topology.doubly_stochastic:  # x̄ would drift
        raise ConfigError(f"outer_topology '{cfg.outer_topology[:100]}' is only column stochastic: NoLoCo needs a "
                          f"doubly stochastic one (undirected, or directed with equal in- and out-degrees)")
    return DiLoCo(cfg.local_steps, outers, ctx.buffer_rows, fragments, compressors, cfg.fragment_delay,
                  cfg.fragment_alpha, topology, cfg.outer_gamma, cfg.outer_overlap, cfg.eager_first, cfg.workers)


def _tensors(numels: list[int], cols: slice) -> slice:
    """The parameter tensors whose columns are ``cols`` (a fragment of whole tensors)."""
    ends = list(itertools.accumulate(numels))
    start = 0 if cols.start in (None, 0) else ends.index(cols.start) + 1
    stop = len(numels) if cols.stop is None else ends.index(cols.stop) + 1
    return slice(start, stop)
