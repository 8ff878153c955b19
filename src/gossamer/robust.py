"""The robust aggregators of the ``byzantine`` section (each defined in :mod:`gossamer.byzantine`'s
docstring): their rules on [r, K, d] messages and the registry :data:`AGGREGATORS`.

An entry's build is its rule, ``build(cfg, f, received)``: the aggregate [r, d] of r receivers (the
all-reduce family's groups) from what they received (:class:`Received`), with ``cfg`` the
``byzantine`` section (its clip, clip_iterations, trim and krum) and f the Byzantine count; its
traits say which Byzantine models it applies to and what it needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .registry import Registry

AGGREGATORS = Registry("byzantine.aggregator", traits={
    "families": "the Byzantine models it applies to: 'allreduce' (a group's updates), 'gossip' (neighbours' models)",
    "mean": "True: the plain mean (the all-reduce family's is the engine's all-reduce); alone it changes nothing",
    "majority": "True: its guarantee needs an honest majority, f < n/2",
    "keys": "the byzantine.* keys it takes of clip, clip_iterations, trim and krum (refused for the others)",
    "center": "True: it starts from the previous aggregate of the same operator (kept per site, checkpointed)"})


def aggregators(family: str) -> list[str]:
    """The aggregators a Byzantine model ("allreduce" or "gossip") takes, in order."""
    return [e.name for e in AGGREGATORS.entries.values() if family in e.traits["families"]]


def _sorted(M: torch.Tensor, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The messages sorted per coordinate along K, the invalid ones (``valid`` [r, K] false) last;
    and the count of valid ones [r, 1, 1]."""
    if valid is None:
        return M.sort(1).values, torch.full((M.shape[0], 1, 1), M.shape[1], device=M.device)
    filled = torch.where(valid.unsqueeze(-1), M, torch.full_like(M, math.inf))
    return filled.sort(1).values, valid.sum(1).view(-1, 1, 1)


def median(M: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Coordinate-wise median over K [r, d]: the mean of the two middle values for an even count."""
    S, c = _sorted(M, valid)
    lower = S.gather(1, ((c - 1) // 2).expand(-1, 1, S.shape[2]))
    upper = S.gather(1, (c // 2).expand(-1, 1, S.shape[2]))
    return ((lower + upper) / 2).squeeze(1)


def trimmed_mean(M: torch.Tensor, b: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Coordinate-wise mean over K [r, d] of the values left when the b largest and b smallest are
    dropped (b lowered to (count − 1)//2 where fewer are left)."""
    S, c = _sorted(M, valid)
    b = torch.clamp((c - 1) // 2, max=b)
    pos = torch.arange(S.shape[1], device=S.device).view(1, -1, 1)
    keep = (pos >= b) & (pos < c - b)
    return torch.where(keep, S, torch.zeros_like(S)).sum(1) / (c - 2 * b).squeeze(-1).to(S.dtype)


def krum_scores(M: torch.Tensor, f: int) -> torch.Tensor:
    """Krum's score of each of the K messages [r, K]: the sum of its K − f − 2 smallest squared
    distances to the others."""
    d2 = torch.cdist(M, M, compute_mode="donot_use_mm_for_euclid_dist").square()
    d2.diagonal(dim1=1, dim2=2).fill_(math.inf)
    return d2.sort(2).values[:, :, : M.shape[1] - f - 2].sum(2)


def krum(M: torch.Tensor, f: int, select: int = 1) -> torch.Tensor:
    """The mean of the ``select`` messages of lowest Krum score [r, d] (krum: 1; multi-krum: K − f)."""
    chosen = krum_scores(M, f).argsort(dim=1, stable=True)[:, :select]
    return M.gather(1, chosen.unsqueeze(-1).expand(-1, -1, M.shape[2])).mean(1)


def clip(U: torch.Tensor, tau: torch.Tensor | float) -> torch.Tensor:
    """CLIP(u, τ) = u·min(1, τ/‖u‖) along the last dimension (u itself where ‖u‖ ≤ τ, also u = 0
    with τ = 0: self-centered clipping's τ_i is 0 when a neighbour sent x_i itself)."""
    norm = U.norm(dim=-1, keepdim=True)
    return torch.where(norm > tau, U * (tau / norm), U)


def centered_clip(M: torch.Tensor, center: torch.Tensor, tau: float, iterations: int) -> torch.Tensor:
    """v ← v + (1/K) Σ_j CLIP(m_j − v, τ), ``iterations`` times from ``center`` [r, d]."""
    v = center
    for _ in range(iterations):
        v = v + clip(M - v.unsqueeze(1), tau).mean(1)
    return v


def clipped_gossip(x: torch.Tensor, M: torch.Tensor, weight: torch.Tensor, neighbour: torch.Tensor,
                   tau: torch.Tensor | float) -> torch.Tensor:
    """x_i + Σ_k w_ik CLIP(m_ik − x_i, τ_i) over the neighbour slots k [m, d] (x [m, d], M [m, K, d],
    weight [m, K], ``neighbour`` [m, K]: the slots that are a neighbour with weight ≠ 0)."""
    w = torch.where(neighbour, weight, torch.zeros_like(weight)).unsqueeze(-1)
    tau = tau if isinstance(tau, float) else tau.view(-1, 1, 1)
    return x + (w * clip(M - x.unsqueeze(1), tau)).sum(1)


def second_largest_distance(x: torch.Tensor, M: torch.Tensor, neighbour: torch.Tensor) -> torch.Tensor:
    """Self-centered clipping's τ_i [m]: the second-largest ‖m_ik − x_i‖ over i's neighbours (the
    largest with one neighbour)."""
    dist = torch.where(neighbour, (M - x.unsqueeze(1)).norm(dim=-1), torch.full_like(neighbour, -math.inf,
                                                                                       dtype=M.dtype))
    top = dist.topk(min(2, dist.shape[1]), dim=1).values
    second = top[:, -1]
    return torch.where(torch.isfinite(second), second, top[:, 0])


@dataclass(frozen=True)
class Received:
    """What a rule combines for r receivers (groups, in the all-reduce family): the messages M
    [r, K, d]; in gossip also each receiver's own model x [r, d], W's weights [r, K] and which
    slots are a neighbour (weight ≠ 0) or the receiver itself (``own``); an aggregator with the
    ``center`` trait its start ``center`` [r, d]."""

    M: torch.Tensor
    x: torch.Tensor | None = None
    weight: torch.Tensor | None = None
    neighbour: torch.Tensor | None = None
    own: torch.Tensor | None = None
    center: torch.Tensor | None = None

    @property
    def valid(self) -> torch.Tensor | None:
        """The slots that hold a message to combine (gossip: the neighbours' and x_i; None: all)."""
        return None if self.neighbour is None else self.neighbour | self.own


BOTH = ("allreduce", "gossip")


def _assumed(cfg, f: int) -> int:
    """The Byzantine count krum and multi-krum assume: ``krum``, else the actual one f."""
    return f if cfg.krum is None else cfg.krum


@AGGREGATORS.register("mean", families=BOTH, mean=True, help="the mean; gossip: Σ_j w_ij m_j (plain gossip)")
def _mean(cfg, f: int, r: Received) -> torch.Tensor:  # gossip's: the all-reduce family's is the engine's
    return (r.weight.unsqueeze(-1) * r.M).sum(1)


@AGGREGATORS.register("median", families=BOTH, majority=True, help="coordinate-wise median")
def _median(cfg, f: int, r: Received) -> torch.Tensor:
    return median(r.M, r.valid)


@AGGREGATORS.register("trimmed-mean", families=BOTH, majority=True, keys=("trim",),
                      help="coordinate-wise mean without the b largest and b smallest")
def _trimmed_mean(cfg, f: int, r: Received) -> torch.Tensor:
    return trimmed_mean(r.M, f if cfg.trim is None else cfg.trim, r.valid)


@AGGREGATORS.register("krum", families=("allreduce",), majority=True, keys=("krum",),
                      help="the message of lowest Krum score")
def _krum(cfg, f: int, r: Received) -> torch.Tensor:
    return krum(r.M, _assumed(cfg, f), 1)


@AGGREGATORS.register("multi-krum", families=("allreduce",), majority=True, keys=("krum",),
                      help="the mean of the g − f messages of lowest Krum score")
def _multi_krum(cfg, f: int, r: Received) -> torch.Tensor:
    assumed = _assumed(cfg, f)
    return krum(r.M, assumed, r.M.shape[1] - assumed)


@AGGREGATORS.register("centered-clip", families=("allreduce",), majority=True, keys=("clip", "clip_iterations"),
                      center=True, help="L times v ← v + mean CLIP(m_j − v, τ), from the previous aggregate")
def _centered_clip(cfg, f: int, r: Received) -> torch.Tensor:
    return centered_clip(r.M, r.center, cfg.clip, cfg.clip_iterations)


@AGGREGATORS.register("clipped-gossip", families=("gossip",), keys=("clip",),
                      help="x_i + Σ_j w_ij CLIP(m_j − x_i, τ)")
def _clipped_gossip(cfg, f: int, r: Received) -> torch.Tensor:
    return clipped_gossip(r.x, r.M, r.weight, r.neighbour, cfg.clip)


@AGGREGATORS.register("self-centered-clip", families=("gossip",),
                      help="clipped gossip, τ_i the second-largest ‖m_j − x_i‖ of i's neighbours")
def _self_centered_clip(cfg, f: int, r: Received) -> torch.Tensor:
    return clipped_gossip(r.x, r.M, r.weight, r.neighbour, second_largest_distance(r.x, r.M, r.neighbour))
