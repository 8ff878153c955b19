"""The simulator: all n workers' rows in one process; communication operators are tensor ops."""

from __future__ import annotations

import torch

from ..compression import SignMessage, sign_decompress
from ..topology import Mixing
from .comm import CommStats


def _group_mean_(X: torch.Tensor, group: int) -> None:
    """Rows of each group of ``group`` consecutive rows ← their mean (in place)."""
    blocks = X.view(-1, group, X.shape[1])
    blocks.copy_(blocks.mean(1, keepdim=True).expand_as(blocks))


def _cyclic_shifts(index) -> list[int] | None:
    """s_k per slot if index[k, i] == (i + s_k) mod n for every slot k, else None."""
    K, n = index.shape
    shifts = []
    for k in range(K):
        s = int(index[k, 0]) % n if n else 0
        if any(int(index[k, i]) != (i + s) % n for i in range(n)):
            return None
        shifts.append(s)
    return shifts


def _mix_shifts(X: torch.Tensor, shifts: list[int], weight: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """mix_rows(X, index, weight) for index[k, i] = (i + shifts[k]) mod n, without gathers:
    row block [0, n − s) reads X[s:], the rest X[:s]. Same products and sums in the same order."""
    n = X.shape[0]
    torch.mul(X.roll(-shifts[0], 0) if shifts[0] else X, weight[0], out=out)
    for s, w in zip(shifts[1:], weight[1:]):
        if s == 0:
            out.addcmul_(X, w)
            continue
        out[: n - s].addcmul_(X[s:], w[: n - s])
        out[n - s :].addcmul_(X[:s], w[n - s :])
    return out


def _mix_gathers(X: torch.Tensor, index: torch.Tensor, weight: torch.Tensor, out: torch.Tensor,
                 gathered: torch.Tensor) -> torch.Tensor:
    """mix_rows(X, index, weight) into preallocated ``out``, gathering into ``gathered`` (no
    allocation per slot and step). Same products and sums in the same order."""
    torch.mul(torch.index_select(X, 0, index[0], out=gathered), weight[0], out=out)
    for k in range(1, index.shape[0]):
        out.addcmul_(torch.index_select(X, 0, index[k], out=gathered), weight[k])
    return out


class SimEngine:
    """n workers in one process. ``rows`` are the global indices of the rows held here (all)."""

    def __init__(self, n: int):
        self.n = n
        self.rows = range(n)
        self.comm = CommStats()
        self._mixing_cache: dict[tuple, tuple] = {}
        self._scratch: torch.Tensor | None = None  # one [n, d] buffer reused by gossip and Ξ²
        self._gathered: torch.Tensor | None = None  # a second one, for graphs that are not shifts

    def _scratch_like(self, X: torch.Tensor) -> torch.Tensor:
        """An uninitialised buffer shaped like X, allocated once (not reallocated every step)."""
        if self._scratch is None or self._scratch.shape != X.shape or self._scratch.dtype != X.dtype \
                or self._scratch.device != X.device:
            self._scratch = torch.empty_like(X)
        return self._scratch

    def _gather_buffer(self, X: torch.Tensor) -> torch.Tensor:
        if self._gathered is None or self._gathered.shape != X.shape or self._gathered.dtype != X.dtype \
                or self._gathered.device != X.device:
            self._gathered = torch.empty_like(X)
        return self._gathered

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
        index, weight, dense, peers, shifts = self._prepared(mixing, X)
        mixed = self._scratch_like(X)
        if dense is not None:
            torch.matmul(dense, X, out=mixed)
        elif shifts is not None:
            _mix_shifts(X, shifts, weight, out=mixed)
        else:
            _mix_gathers(X, index, weight, out=mixed, gathered=self._gather_buffer(X))
        theta_sq = (mixed - X).square().sum(1).mean().item() if measure else None
        X.copy_(mixed)
        self.comm.gossip(X.shape[1], peers)
        return theta_sq

    def _prepared(self, mixing: Mixing, like: torch.Tensor) -> tuple:
        """(index, weight, dense W or None, messages per worker, shifts or None) on like's device
        and dtype, cached. ``shifts``: when every slot k is a cyclic shift, index[k, i] = (i + s_k)
        mod n (ring, exponential graphs), the s_k: gossip then reads slices of X, no gathers."""
        key = (id(mixing), like.dtype, like.device)
        if key not in self._mixing_cache:
            index = torch.tensor(mixing.index, device=like.device)
            weight = torch.tensor(mixing.weight).to(like).unsqueeze(-1)
            # a dense product beats K gathers once a worker has neighbours in about half the graph
            dense = (torch.tensor(mixing.dense()).to(like)
                     if 2 * index.shape[0] > self.n else None)
            # the mixing rides along so that its id (in the key) is never reused while cached
            self._mixing_cache[key] = (index, weight, dense, mixing.messages_per_worker(),
                                       _cyclic_shifts(mixing.index), mixing)
        return self._mixing_cache[key][:5]

    def mean_row(self, X: torch.Tensor) -> torch.Tensor:
        """x̄ = (1/n) Σ_i x_i, without changing X."""
        return X.mean(0)

    def consensus_distance_sq(self, X: torch.Tensor) -> float:
        """Ξ² = (1/n) Σ_i ‖x_i − x̄‖²."""
        diff = torch.sub(X, X.mean(0, keepdim=True), out=self._scratch_like(X))
        return diff.square_().sum(1).mean().item()

    def distance_sq_per_tensor(self, X: torch.Tensor, slots) -> dict[str, float]:
        """Ξ² restricted to each parameter tensor (the per-layer consensus distance)."""
        per_coordinate = (X - X.mean(0, keepdim=True)).square().mean(0)
        return {s.name: per_coordinate[s.offset : s.offset + s.numel].sum().item() for s in slots}

    def mean_scalar(self, values: torch.Tensor) -> float:
        """Mean over all workers of a per-worker scalar [m]."""
        return values.mean().item()
