"""The simulator: all n workers' rows in one process; communication operators are tensor ops."""

from __future__ import annotations

import torch

from ..compression import SignMessage, sign_decompress
from ..topology import Mixing
from .comm import CommStats, mix_rows


def _group_mean_(X: torch.Tensor, group: int) -> None:
    """Rows of each group of ``group`` consecutive rows ← their mean (in place)."""
    blocks = X.view(-1, group, X.shape[1])
    blocks.copy_(blocks.mean(1, keepdim=True).expand_as(blocks))


class SimEngine:
    """n workers in one process. ``rows`` are the global indices of the rows held here (all)."""

    def __init__(self, n: int):
        self.n = n
        self.rows = range(n)
        self.comm = CommStats()
        self._mixing_cache: dict[tuple, tuple] = {}

    def allreduce_mean_(self, X: torch.Tensor) -> None:
        """Exact average: every row becomes mean_i X_i (in place)."""
        _group_mean_(X, self.n)
        self.comm.allreduce(X.shape[1], self.n, level="global")

    def block_mean_(self, X: torch.Tensor, block_size: int) -> None:
        """Exact average inside each block of ``block_size`` consecutive workers (in place)."""
        _group_mean_(X, block_size)
        self.comm.allreduce(X.shape[1], block_size, level="block")

    def sign_mean(self, message: SignMessage, numels: list[int], block_size: int | None = None) -> torch.Tensor:
        """Row i ← mean of the decompressed messages of i's group (all n workers, or its block)."""
        C = sign_decompress(message, numels)
        _group_mean_(C, block_size or self.n)
        self.comm.allgather(message.nbytes, block_size or self.n, level="block" if block_size else "global")
        return C

    def gossip_(self, X: torch.Tensor, mixing: Mixing, measure: bool = False) -> float | None:
        """One gossip round X ← W X (in place), W the mixing matrix of this round.

        With ``measure``, returns Θ² = (1/n) Σ_i ‖Σ_j w_ij x_j − x_i‖², what the workers can
        compute locally from the models they received (one scalar all-reduce)."""
        index, weight, dense, peers = self._prepared(mixing, X)
        mixed = dense @ X if dense is not None else mix_rows(X, index, weight)
        theta_sq = (mixed - X).square().sum(1).mean().item() if measure else None
        X.copy_(mixed)
        self.comm.gossip(X.shape[1], peers)
        return theta_sq

    def _prepared(self, mixing: Mixing, like: torch.Tensor) -> tuple:
        """(index, weight, dense W or None, messages per worker) on like's device and dtype, cached."""
        key = (id(mixing), like.dtype, like.device)
        if key not in self._mixing_cache:
            index = torch.tensor(mixing.index, device=like.device)
            weight = torch.tensor(mixing.weight).to(like).unsqueeze(-1)
            # a dense product beats K gathers once a worker has neighbours in about half the graph
            dense = (torch.tensor(mixing.dense()).to(like)
                     if 2 * index.shape[0] > self.n else None)
            # the mixing rides along so that its id (in the key) is never reused while cached
            self._mixing_cache[key] = (index, weight, dense, mixing.messages_per_worker(), mixing)
        return self._mixing_cache[key][:4]

    def mean_row(self, X: torch.Tensor) -> torch.Tensor:
        """x̄ = (1/n) Σ_i x_i, without changing X."""
        return X.mean(0)

    def consensus_distance_sq(self, X: torch.Tensor) -> float:
        """Ξ² = (1/n) Σ_i ‖x_i − x̄‖²."""
        return (X - X.mean(0, keepdim=True)).square().sum(1).mean().item()

    def distance_sq_per_tensor(self, X: torch.Tensor, slots) -> dict[str, float]:
        """Ξ² restricted to each parameter tensor (the per-layer consensus distance)."""
        per_coordinate = (X - X.mean(0, keepdim=True)).square().mean(0)
        return {s.name: per_coordinate[s.offset : s.offset + s.numel].sum().item() for s in slots}

    def mean_scalar(self, values: torch.Tensor) -> float:
        """Mean over all workers of a per-worker scalar [m]."""
        return values.mean().item()
