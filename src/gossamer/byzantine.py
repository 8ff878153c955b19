"""Workers that lie: who they are, what they send, and the robust rules the honest workers use.

A ``byzantine`` section names the Byzantine workers (``workers``: their ids, or ``fraction`` f:
round(f·n) of them drawn once from the seed), their ``attack`` and the honest workers'
``aggregator``. The engine applies both where messages move (:meth:`Engine.allreduce_mean_`,
:meth:`Engine.block_mean_`, :meth:`Engine.gossip_`): every message a Byzantine worker sends is
replaced by what its attack crafts from the honest messages of the round (the omniscient
attacker of the papers), and every worker combines what it received with the aggregator. The
metrics (loss, x̄ and its accuracy, Ξ²) are over the honest workers.

What travels, as in the authors' code:

- the all-reduce family aggregates *updates* (Karimireddy, He & Jaggi 2021,
  epfml/byzantine-robust-optimizer 288417f): ``allreduce`` the gradients; ``local``,
  ``post-local`` and ``hierarchical`` the change since the group's last average,
  Δ_i = x_i − x_ref, then x ← x_ref + AGG(Δ); DiLoCo its outer gradients x_outer − x_i;
  optimizer state averaged with the parameters as it is;
- ``gossip`` exchanges *models* (He, Karimireddy & Jaggi 2022,
  epfml/byzantine-robust-decentralized-optimizer 5387d60): a Byzantine neighbour of worker i
  sends i a model crafted from i's own and i's honest neighbours' models ("the target and its
  good neighbours").

Attacks, from the honest messages h_j the attacker sees (μ, σ: their coordinate-wise mean and
standard deviation, σ with Bessel's correction, 0 for one message):

- ``sign-flip``: −s·μ (s = ``strength``, default 1);
- ``ipm`` (inner-product manipulation, Xie, Koyejo & Gupta 2020): −ε·μ (ε = ``strength``, default
  0.1, the authors' code's): the same rule as sign-flip, small enough to pass a robust rule;
- ``alie`` (A Little Is Enough, Baruch, Baruch & Goldberg 2019): μ − z·σ, z = ``strength`` or,
  by default, the paper's z_max = Φ⁻¹((n − s)/n) with s = ⌊n/2 + 1⌋ − f supporters (n workers,
  f Byzantine; the epfml code writes (n − f − s)/(n − f) instead);
- ``gaussian``: N(0, s²) in every coordinate (s = ``strength``, default 1), one draw per
  Byzantine worker and operator (stream ``byzantine-noise``);
- ``label-flip``: trains honestly on the labels y → C − 1 − y and sends what it gets, like an
  honest worker;
- ``dissensus`` (He et al. 2022; gossip only): to worker i,
  x_i − ε·Σ_{honest j ∈ N(i)} w_ij (x_j − x_i) / Σ_{Byzantine b ∈ N(i)} w_ib (ε = ``strength``,
  default 1): at ε = 1 it cancels i's pull towards its honest neighbours, above 1 it pushes i away.

Aggregators of the all-reduce family, over the g messages m_j of a group (every worker of the
group receives them all: priced as an all-gather, except ``mean``, which can be summed on the way):

- ``mean``; ``median``: coordinate-wise (the mean of the two middle values for even g);
- ``trimmed-mean``: coordinate-wise, the b largest and b smallest dropped (b = ``trim``, default f);
- ``krum`` / ``multi-krum`` (Blanchard et al. 2017; El Mhamdi et al. 2018): score_j = the sum of
  the g − f − 2 smallest ‖m_j − m_k‖², k ≠ j (f = ``krum``, default the Byzantine count); krum
  takes the lowest-scoring message, multi-krum the mean of the g − f lowest;
- ``centered-clip`` (Karimireddy et al. 2021): L = ``clip_iterations`` times
  v ← v + (1/g) Σ_j CLIP(m_j − v, τ), CLIP(u, τ) = u·min(1, τ/‖u‖), τ = ``clip``; v starts from
  the previous aggregate of the same operator (zero at the first), as the authors' code does.

Aggregators of gossip, worker i over its own model x_i and the messages m_j of its neighbours
j ∈ N(i) (W's weights w_ij; the exchange is the gossip round itself):

- ``mean``: Σ_j w_ij m_j (plain gossip);
- ``median``, ``trimmed-mean``: coordinate-wise over {x_i} ∪ {m_j} (unweighted, as the authors'
  decentralized DeCM and DeTM; b is lowered until a value is left);
- ``clipped-gossip`` (He et al. 2022): x_i + Σ_{j ∈ N(i)} w_ij CLIP(m_j − x_i, τ), τ = ``clip``;
- ``self-centered-clip``: the same with τ_i chosen by each worker, the second-largest of
  ‖m_j − x_i‖ over its neighbours (the largest with one neighbour), as the authors' code's
  ``scp`` without a τ.

A Byzantine worker's own row takes no part in the honest metrics; with an attack that crafts its
messages it still receives like the others (the all-reduce family's aggregate; in gossip the
unattacked messages), so that its row stays finite.

Attacks and aggregators are registries (:data:`ATTACKS`, :data:`AGGREGATORS`): an entry's build is
its rule, and its traits say what it needs (σ, a graph, noise draws; the families it applies to,
the keys it takes), so the engine and the training loop ask the :class:`Adversary`, never a name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Callable

import numpy as np
import torch

from .registry import ConfigError, Entry, Registry, short
from .rng import declare, host_stream, row_normals
from .robust import AGGREGATORS, Received, aggregators

# an attack's build is what its Byzantine workers send: build(s, μ, σ) from the honest messages'
# moments, unless a trait says otherwise ("none", the section's default, is no attack: no entry)
ATTACKS = Registry("byzantine.attack", traits={
    "strength": "its s, ε or z unless byzantine.strength gives one: a number, or (n, f) → it (alie's z_max)",
    "sigma": "True: its message needs the honest messages' σ (else build may get σ = None)",
    "noise": "True: it sends noise, build(s, z) from standard normal draws z (s a deviation: > 0)",
    "graph": "True: it needs a receiver's neighbourhood, build(s, x_i, pull_i): gossip only",
    "flips_labels": "True: its workers train on the labels build(y, C) and send what they train, crafting nothing"})
MAX_CLIP_ITERATIONS = 1000  # centered clipping's L: every aggregation runs all of them
NOISE = declare("byzantine-noise", "the gaussian attack's message of a Byzantine worker", ("call",), row="worker")
CHOICE = declare("byzantine-workers", "the Byzantine workers byzantine.fraction draws", ())


@dataclass
class ByzantineConfig:
    """The ``byzantine`` section (see the module docstring)."""

    workers: list[int] = field(default_factory=list)  # the Byzantine workers' ids
    # round(fraction·n) Byzantine workers (halves to even: 0.25 of 14 is 4) drawn once from the seed (instead of workers)
    fraction: float | None = None
    attack: str = "none"  # none, sign-flip, ipm, alie, gaussian, label-flip, dissensus
    strength: float | None = None  # the attack's s / ε / z (None: its default)
    aggregator: str = "mean"  # how honest workers combine what they receive
    clip: float | None = None  # τ of centered-clip and clipped-gossip
    clip_iterations: int = 1  # L: centered-clip's iterations per aggregation
    trim: int | None = None  # b: trimmed-mean's values dropped at each end (None: the Byzantine count)
    krum: int | None = None  # f: the Byzantine count krum and multi-krum assume (None: the actual one)
    # also train the run without this section step for step, and report the honest workers' distance from its x̄
    clean_reference: bool = False

    def validate(self, cfg, algorithms) -> None:
        """Refuse a bad section; ``algorithms`` is the registry of algorithms (their ``byzantine``
        traits), handed in by the config, which sits above both."""
        n, family = cfg.workers, family_of(cfg, algorithms)
        if self.fraction is not None and self.workers:
            raise ConfigError("give byzantine.workers or byzantine.fraction, not both")
        if self.fraction is not None and not 0 <= self.fraction < 1:
            raise ConfigError(f"byzantine.fraction must be in [0, 1), got {self.fraction}")
        bad = [w for w in self.workers if isinstance(w, bool) or not isinstance(w, int) or not 0 <= w < n]
        if bad:
            raise ConfigError(f"byzantine.workers must be worker ids in [0, workers={n}), got {short(bad)}")
        if len(set(self.workers)) != len(self.workers):
            raise ConfigError(f"byzantine.workers lists a worker twice: {short(self.workers)}")
        f = self.count(n)
        if self.fraction and not f:
            raise ConfigError(f"byzantine.fraction {self.fraction:g} of n = {n} workers makes nobody Byzantine "
                              f"(f = round(fraction·n), halves to even): give a larger fraction or byzantine.workers")
        if not f and self.attack != "none":
            raise ConfigError(f"byzantine.attack {short(self.attack)} has no Byzantine worker to run it: give "
                              f"byzantine.workers or byzantine.fraction")
        if f >= n:
            raise ConfigError(f"byzantine: every worker is Byzantine ({f} of {n}); keep at least one honest")
        if self.attack != "none" and self.attack not in ATTACKS.names():
            raise ConfigError(f"unknown byzantine.attack '{short(self.attack)}'; choose one of: none, "
                              f"{', '.join(ATTACKS.names())}")
        if f and self.attack == "none":
            raise ConfigError(f"byzantine: {f} Byzantine worker(s) need an attack; choose one of: "
                              f"{', '.join(ATTACKS.names())} (or none of them Byzantine)")
        if family is None:
            allowed = [e.name for e in algorithms.entries.values() if e.traits.get("byzantine")]
            raise ConfigError(f"byzantine applies to the algorithms {', '.join(allowed)}; algorithm "
                              f"{cfg.algorithm} has no Byzantine model")
        if self.aggregator not in aggregators(family):
            raise ConfigError(f"byzantine.aggregator '{short(self.aggregator)}' does not apply to algorithm "
                              f"{cfg.algorithm}; choose one of: {', '.join(aggregators(family))}")
        if self.attack not in ("none", *attacks(family)):
            raise ConfigError(f"byzantine.attack {self.attack} needs a graph (a worker's neighbours): algorithm "
                              f"{cfg.algorithm} has none; use algorithm gossip")
        grouped = algorithms[cfg.algorithm].traits.get("byzantine_group")  # the smallest set a rule aggregates
        self._validate_parameters(n, f, getattr(cfg, grouped) if grouped else n, grouped)
        if self.clean_reference and (cfg.engine != "sim" or not self.active(n)):
            raise ConfigError("byzantine.clean_reference trains the clean run beside this one in the simulator: it "
                              "needs engine sim and a Byzantine worker or a robust aggregator"
                              if cfg.engine == "sim" else "byzantine.clean_reference applies to engine sim only")

    def _validate_parameters(self, n: int, f: int, group: int, grouped: str | None) -> None:
        if self.strength is not None:
            strong = [e.name for e in ATTACKS.entries.values() if "strength" in e.traits]
            if self.attack not in strong:
                raise ConfigError(f"byzantine.strength applies to the attacks {', '.join(strong)}, not {self.attack}")
            positive = self.declares("noise")
            if not math.isfinite(self.strength) or (positive and self.strength <= 0):
                raise ConfigError(f"byzantine.strength must be a finite number{' > 0' if positive else ''}, "
                                  f"got {self.strength}")
        elif f and self.declares("strength"):
            self.strength_of(n, f)  # a default may refuse n and f (alie's z_max needs supporters)
        rule = AGGREGATORS[self.aggregator].traits
        if rule.get("majority") and 2 * f >= n:
            raise ConfigError(f"byzantine.aggregator {self.aggregator} needs an honest majority: {f} of {n} workers "
                              f"are Byzantine (f < n/2)")
        keys = rule.get("keys", ())
        for key in ("clip", "clip_iterations", "trim", "krum"):
            takers = [e.name for e in AGGREGATORS.entries.values() if key in e.traits.get("keys", ())]
            if getattr(self, key) != getattr(ByzantineConfig, key, None) and key not in keys:
                raise ConfigError(f"byzantine.{key} applies to the aggregator{'s' * (len(takers) > 1)} "
                                  f"{' and '.join(takers)}, not {self.aggregator}")
        if "clip" in keys and not (self.clip is not None and 0 < self.clip < math.inf):  # clip: no default
            raise ConfigError(f"byzantine.aggregator {self.aggregator} needs byzantine.clip τ, a finite number > 0; "
                              f"got {self.clip}")
        if not 1 <= self.clip_iterations <= MAX_CLIP_ITERATIONS:
            raise ConfigError(f"byzantine.clip_iterations must be an integer in [1, {MAX_CLIP_ITERATIONS}] (each "
                              f"aggregation runs them all; Karimireddy et al. use 1 to 3), got {self.clip_iterations}")
        if self.trim is not None and not 0 <= self.trim < (n + 1) // 2:
            raise ConfigError(f"byzantine.trim must be in [0, {(n + 1) // 2}) (b values dropped at each end of n = "
                              f"{n}), got {self.trim}")
        krum_f = f if self.krum is None else self.krum
        if "krum" in keys and not (0 <= krum_f and 2 * krum_f + 2 < group):
            raise ConfigError(f"byzantine.aggregator {self.aggregator} needs 2f + 2 < n (Blanchard et al.) in every "
                              f"group it aggregates: f = {krum_f}{'' if self.krum is None else ' (byzantine.krum)'}, "
                              f"{grouped if group < n else 'n'} = {group}")

    def count(self, n: int) -> int:
        """f: how many workers are Byzantine."""
        return round(self.fraction * n) if self.fraction is not None else len(self.workers)

    def ids(self, n: int, seed: int) -> np.ndarray:
        """The Byzantine workers' ids, sorted: ``workers``, or round(f·n) drawn from the seed."""
        if self.fraction is None:
            return np.array(sorted(self.workers), dtype=np.int64)
        return np.sort(host_stream(CHOICE, seed).permutation(n)[: self.count(n)])

    def active(self, n: int) -> bool:
        """Whether the section changes anything: a Byzantine worker, or a rule other than the mean."""
        return self.count(n) > 0 or not AGGREGATORS[self.aggregator].traits.get("mean")

    def declares(self, trait: str) -> bool:
        """Whether the attack declares ``trait`` (attack none: nothing)."""
        return self.attack != "none" and bool(ATTACKS[self.attack].traits.get(trait))

    def strength_of(self, n: int, f: int) -> float:
        """s, ε or z: ``strength``, else the attack's default for n workers, f of them Byzantine."""
        if self.strength is not None:
            return self.strength
        default = ATTACKS[self.attack].traits["strength"]
        return default(n, f) if callable(default) else default


def byzantine_active(cfg) -> bool:
    """Whether the run has an adversary (:meth:`ByzantineConfig.active`): its schedules then send
    updates whole, for the engine's robust rule."""
    return cfg.byzantine is not None and cfg.byzantine.active(cfg.workers)


def family_of(cfg, algorithms) -> str | None:
    """Which Byzantine model the algorithm has (its registration's ``byzantine`` trait in
    ``algorithms``, the registry): "allreduce" (aggregated updates) or "gossip" (exchanged models);
    None: none."""
    return algorithms[cfg.algorithm].traits.get("byzantine")


def attacks(family: str) -> list[str]:
    """The attacks a Byzantine model takes, in order (one that needs a graph: gossip only)."""
    return [e.name for e in ATTACKS.entries.values() if family == "gossip" or not e.traits.get("graph")]


def alie_z(n: int, f: int) -> float:
    """Baruch et al.'s z_max = Φ⁻¹((n − s)/n), s = ⌊n/2 + 1⌋ − f the supporters the attack needs
    (refused without one)."""
    s = math.floor(n / 2 + 1) - f
    if s < 1:
        raise ConfigError(f"byzantine.attack alie's z_max = Φ⁻¹((n − s)/n) needs s = ⌊n/2 + 1⌋ − f ≥ 1 supporters: "
                          f"f = {f} of n = {n} is too many; give byzantine.strength (z) or fewer Byzantine workers")
    return NormalDist().inv_cdf((n - s) / n)


@ATTACKS.register("sign-flip", strength=1.0, help="−s·μ")
def _sign_flip(s: float, mu: torch.Tensor, sigma: torch.Tensor | None) -> torch.Tensor:
    return -s * mu


ATTACKS.register("ipm", strength=0.1, help="−ε·μ: sign-flip's rule, small enough to pass a robust one")(_sign_flip)


@ATTACKS.register("alie", strength=alie_z, sigma=True, help="μ − z·σ (A Little Is Enough)")
def _alie(s: float, mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    return mu - s * sigma


@ATTACKS.register("gaussian", strength=1.0, noise=True, help="N(0, s²) in every coordinate")
def _gaussian(s: float, z: np.ndarray) -> np.ndarray:
    return s * z


@ATTACKS.register("label-flip", flips_labels=True, help="trains on the labels y → C − 1 − y, sends what it gets")
def _label_flip(y: torch.Tensor, classes: int) -> torch.Tensor:
    return classes - 1 - y


@ATTACKS.register("dissensus", strength=1.0, graph=True, help="to worker i, x_i − ε·pull_i (gossip only)")
def _dissensus(s: float, x: torch.Tensor, pull: torch.Tensor) -> torch.Tensor:
    return x - s * pull


# ---------------------------------------------------------------- what the attacker reads

def _moments(M: torch.Tensor, honest: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """μ and σ [r, d] over the messages ``honest`` [r, K] marks (σ with Bessel's correction, 0 for one)."""
    w = honest.unsqueeze(-1).to(M.dtype)
    c = w.sum(1).clamp(min=1)
    mu = (M * w).sum(1) / c
    var = ((M - mu.unsqueeze(1)).square() * w).sum(1) / (c - 1).clamp(min=1)
    return mu, var.sqrt()


# ---------------------------------------------------------------- the adversary in a run

@dataclass
class Adversary:
    """The run's Byzantine workers (``byzantine`` bool [n]), their attack and the aggregator;
    the engine calls :meth:`aggregate`, :meth:`gossip` and, before a plain mean, :meth:`craft_rows_`;
    the training loop's batches :meth:`flip_labels_`. State: centered clipping's centers
    (one row per worker: its group's) and the count of operators so far (the noise's key)."""

    cfg: ByzantineConfig
    byzantine: np.ndarray  # bool [n]
    seed: int
    calls: int = 0
    centers: dict[str, torch.Tensor] = field(default_factory=dict)  # site → [m, d] rows
    _on: dict = field(default_factory=dict, repr=False)  # derived tensors, by what and device (not state)

    @classmethod
    def build(cls, cfg) -> Adversary | None:
        """The run's adversary, or None where the section changes nothing (the plain run)."""
        section = cfg.byzantine
        if not byzantine_active(cfg):
            return None
        mask = np.zeros(cfg.workers, dtype=bool)
        mask[section.ids(cfg.workers, cfg.seed)] = True
        return cls(section, mask, cfg.seed)

    @property
    def f(self) -> int:
        return int(self.byzantine.sum())

    @property
    def crafts(self) -> bool:
        """Whether the attack replaces the Byzantine workers' messages (all but one that flips labels)."""
        return self.f > 0 and self.cfg.attack != "none" and not self.flips_labels

    @property
    def flips_labels(self) -> bool:
        """Whether the Byzantine workers train on flipped labels (:meth:`flip_labels_`)."""
        return self.cfg.declares("flips_labels")

    @property
    def plain_mean(self) -> bool:
        """Whether the aggregator is the plain mean: the all-reduce family's is the engine's all-reduce."""
        return bool(self.aggregator.traits.get("mean"))

    @property
    def attack(self) -> Entry:
        return ATTACKS[self.cfg.attack]

    @property
    def aggregator(self) -> Entry:
        return AGGREGATORS[self.cfg.aggregator]

    @property
    def honest(self) -> np.ndarray:
        return ~self.byzantine

    def mask(self, device: torch.device) -> torch.Tensor:
        """Which workers are Byzantine, bool [n] on ``device`` (made once)."""
        key = ("mask", device)
        if key not in self._on:
            self._on[key] = torch.from_numpy(self.byzantine).to(device)
        return self._on[key]

    def honest_blocks(self, size: int, device: torch.device) -> list[tuple[int, torch.Tensor]]:
        """Each block of ``size`` consecutive workers that has an honest one: (its index, the ids of
        its honest workers on ``device``), made once."""
        key = ("blocks", size, device)
        if key not in self._on:
            self._on[key] = [(start // size, torch.as_tensor(honest, device=device))
                             for start in range(0, len(self.byzantine), size)
                             if len(honest := np.flatnonzero(~self.byzantine[start : start + size]) + start)]
        return self._on[key]

    def summary(self) -> dict:
        """summary.json's keys: how many workers are Byzantine, and which."""
        return {"byzantine_workers": self.f, "byzantine_ids": np.flatnonzero(self.byzantine).tolist()}

    def _strength(self) -> float:
        return self.cfg.strength_of(len(self.byzantine), self.f)

    def _noise(self, d: int, like: torch.Tensor) -> torch.Tensor:
        """One noise message per worker [n, d] (drawn for the Byzantine ones, zero for the others)."""
        noise, byzantine = np.zeros((len(self.byzantine), d)), np.flatnonzero(self.byzantine)
        noise[byzantine] = self.attack.build(self._strength(), row_normals(NOISE, self.seed, self.calls,
                                                                          rows=byzantine, width=d))
        return torch.from_numpy(noise).to(like)

    def crafted(self, M: torch.Tensor, honest: torch.Tensor, x: torch.Tensor | None = None,
                pull: torch.Tensor | None = None) -> torch.Tensor:
        """The message [r, d] the Byzantine senders of each of r receivers (or groups) send, from
        the honest messages ``honest`` [r, K] marks in M [r, K, d]; an attack that needs a graph
        takes the receivers' models x [r, d] and ``pull`` [r, d] = Σ_honest w_ij (x_j − x_i) /
        Σ_Byzantine w_ib instead."""
        if self.cfg.declares("graph"):
            return self.attack.build(self._strength(), x, pull)
        return self.message(*_moments(M, honest))

    def message(self, mu: torch.Tensor, sigma: torch.Tensor | None) -> torch.Tensor:
        """The attack's message from the honest messages' mean μ and standard deviation σ."""
        return self.attack.build(self._strength(), mu, sigma)

    def craft_rows_(self, X: torch.Tensor, rows: range, size: int,
                    rows_mean: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        """Before the plain mean: the local Byzantine rows of X (``rows``: the local workers' ids) ←
        the attack's message, from the honest rows of their block of ``size``. ``rows_mean(T,
        workers)``: the mean of the given workers' rows of T, the engine's bookkeeping read (μ and,
        for an attack that needs it, σ with Bessel's correction: an omniscient attacker's, not traffic)."""
        self.calls += 1
        byzantine = self.mask(X.device)[rows.start : rows.stop]
        if self.cfg.declares("noise"):
            X[byzantine] = self._noise(X.shape[1], X)[rows.start : rows.stop][byzantine]
            return
        block_of = torch.arange(rows.start, rows.stop, device=X.device) // size
        # a block of Byzantine workers only has nobody to deceive and nothing to imitate: left out
        for block, workers in self.honest_blocks(size, X.device):
            mu = rows_mean(X, workers)
            sigma = None
            if self.cfg.declares("sigma"):
                h = len(workers)
                sigma = (rows_mean((X - mu).square(), workers) * (h / max(h - 1, 1))).sqrt()
            X[byzantine & (block_of == block)] = self.message(mu, sigma)

    def flip_labels_(self, y: torch.Tensor, rows: range, classes: int) -> None:
        """The labels y [m, ...] of the local workers (``rows``: their ids), the Byzantine ones'
        flipped by the attack (C = ``classes``), in place."""
        key = ("flipped", rows.start, rows.stop, y.device)
        if key not in self._on:
            self._on[key] = torch.as_tensor(np.flatnonzero(self.byzantine[rows.start : rows.stop]), device=y.device)
        flipped = self._on[key]
        y[flipped] = self.attack.build(y[flipped], classes)

    # -------------------------------------------------------------- the all-reduce family

    def aggregate(self, M: torch.Tensor, members: torch.Tensor, site: str, rows: torch.Tensor) -> torch.Tensor:
        """The robust aggregate [r, d] of r groups' messages M [r, g, d] (``members`` [r, g]: the
        global ids of their senders); the Byzantine senders' messages replaced first (the mean is
        the engine's all-reduce instead: :meth:`Engine._robust_mean_`). ``site`` names the
        operator (centered clipping's center), ``rows`` [r] a local row of each group."""
        self.calls += 1
        if self.crafts:
            byz = self.mask(M.device)[members]
            if self.cfg.declares("noise"):
                sent = self._noise(M.shape[2], M)[members]
            else:
                sent = self.crafted(M, ~byz).unsqueeze(1).expand_as(M)
            M = torch.where(byz.unsqueeze(-1), sent, M)
        center = None
        if self.aggregator.traits.get("center"):
            center = self.centers[site][rows] if site in self.centers else torch.zeros_like(M[:, 0])
        return self.aggregator.build(self.cfg, self.f, Received(M, center=center))

    def keep_center(self, site: str, rows_like: torch.Tensor, values: torch.Tensor) -> None:
        """An aggregator with a center (centered clipping): remember each local row's group
        aggregate ``values`` [m, d] at ``site``."""
        if self.aggregator.traits.get("center"):
            self.centers.setdefault(site, torch.zeros_like(rows_like)).copy_(values)

    # -------------------------------------------------------------- gossip

    def gossip(self, x: torch.Tensor, M: torch.Tensor, senders: torch.Tensor, weight: torch.Tensor,
               receivers: torch.Tensor) -> torch.Tensor:
        """Each local worker's new model [m, d] from its own x [m, d] and the messages M [m, K, d] of
        the workers in its slots (``senders`` [m, K] global ids, slot 0 itself; ``weight`` [m, K]:
        W's weights, 0 on an unused slot; ``receivers`` [m]: the local workers' global ids)."""
        self.calls += 1
        byz_of = self.mask(x.device)
        me = senders == receivers.unsqueeze(1)
        neighbour = (weight != 0) & ~me
        own = me & (torch.cumsum(me, 1) == 1)  # x_i, once (unused slots point at i too)
        if self.crafts:
            attacked = byz_of[senders] & neighbour & ~byz_of[receivers].unsqueeze(1)  # honest receivers only
            honest = ~byz_of[senders] & (neighbour | own)
            if self.cfg.declares("noise"):
                sent = self._noise(x.shape[1], x)[senders]
            else:
                pull = None
                if self.cfg.declares("graph"):
                    w_honest = torch.where(honest & neighbour, weight, torch.zeros_like(weight)).unsqueeze(-1)
                    w_byz = torch.where(attacked, weight, torch.zeros_like(weight)).sum(1, keepdim=True)
                    pull = (w_honest * (M - x.unsqueeze(1))).sum(1) / torch.where(w_byz != 0, w_byz,
                                                                                  torch.ones_like(w_byz))
                sent = self.crafted(M, honest, x, pull).unsqueeze(1).expand_as(M)
            M = torch.where(attacked.unsqueeze(-1), sent, M)
        return self.aggregator.build(self.cfg, self.f, Received(M, x, weight, neighbour, own))

    # -------------------------------------------------------------- state

    def state_dict(self) -> dict:
        return {"calls": self.calls, "rows": dict(self.centers)}

    def load_state_dict(self, state: dict) -> None:
        self.calls = int(state["calls"])
        self.centers = {site: rows.clone() for site, rows in state["rows"].items()}
