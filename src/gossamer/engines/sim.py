"""The simulator: all n workers' rows in one process; communication primitives are tensor ops."""

from __future__ import annotations

import torch

from ..groups import Groups
from ..topology import Mixing
from .base import Engine, Gathered, combine


def groups_mean(Y: torch.Tensor, member: torch.Tensor | None) -> torch.Tensor:
    """Each group of Y [k, g, d] with its members' mean in their rows (``member`` [k, g, 1]:
    which seats hold a member; the others keep their rows)."""
    if member is None:
        return Y.mean(1, keepdim=True).expand_as(Y)
    means = Y.mul(member).sum(1, keepdim=True).div_(member.sum(1, keepdim=True).clamp(min=1))
    return torch.where(member, means, Y)


def _mix_shifts(X: torch.Tensor, shifts: list[int], weight: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """W X for index[k, i] = (i + shifts[k]) mod n, without gathers:
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
    """W X into preallocated ``out``, gathering each slot's rows into ``gathered`` (no allocation
    per slot and step)."""
    return combine((torch.index_select(X, 0, index[k], out=gathered) for k in range(index.shape[0])), weight, out)


class SimEngine(Engine):
    """n workers in one process: every row is here, communication is tensor ops. ``rows``: fewer
    (a process that trains one worker of an asynchronous run alone and never communicates
    through the engine: :mod:`gossamer.async_processes`)."""

    def __init__(self, n: int, rows: range | None = None):
        super().__init__(n, range(n) if rows is None else rows)
        self._gathered: torch.Tensor | None = None  # a second [n, d] buffer, for graphs that are not shifts

    def _groups_mean_(self, X: torch.Tensor, groups: Groups) -> None:
        """The seated rows as [k, g, d] (a view when the seats are the workers in order, else
        gathered), each group's mean written to its members' rows."""
        g, d = groups.size, X.shape[1]
        member = None if groups.member is None else groups.plan(("sim member", X.device), lambda: torch.tensor(
            groups.member, device=X.device).view(-1, g, 1))
        if groups.consecutive:
            blocks = X.view(-1, g, d)
            blocks.copy_(groups_mean(blocks, member))
            return
        index, seated = groups.plan(("sim index", X.device), lambda: (
            torch.tensor(groups.index, device=X.device),
            None if groups.member is None else torch.tensor(groups.member, device=X.device)))
        means = groups_mean(X.index_select(0, index).view(-1, g, d), member).reshape(-1, d)
        if seated is None:
            X.index_copy_(0, index, means)
        else:  # an empty seat may name any worker (padding): only the members' rows are written
            X.index_copy_(0, index[seated], means[seated])

    def _mixed(self, X: torch.Tensor, mixing: Mixing) -> torch.Tensor:
        index, weight, dense, shifts = mixing.plan(("sim", X.dtype, X.device), lambda: self._plan(mixing, X))
        mixed = self._scratch_like(X)
        if dense is not None:
            return torch.matmul(dense, X, out=mixed)
        if shifts is not None:
            return _mix_shifts(X, shifts, weight, out=mixed)
        if self._gathered is None or self._gathered.shape != X.shape or self._gathered.dtype != X.dtype \
                or self._gathered.device != X.device:
            self._gathered = torch.empty_like(X)
        return _mix_gathers(X, index, weight, out=mixed, gathered=self._gathered)

    def _plan(self, mixing: Mixing, like: torch.Tensor) -> tuple:
        """(index, weight, dense W or None, shifts or None) on like's device and dtype. ``shifts``:
        when every slot k is a cyclic shift, index[k, i] = (i + s_k) mod n (ring, exponential
        graphs), the s_k: gossip then reads slices of X, no gathers."""
        index = torch.tensor(mixing.index, device=like.device)
        weight = torch.tensor(mixing.weight).to(like).unsqueeze(-1)
        # a dense product beats K gathers once a worker has neighbours in about half the graph
        dense = torch.tensor(mixing.dense()).to(like) if 2 * index.shape[0] > self.n else None
        return index, weight, dense, mixing.shifts

    def _exchange(self, payload: torch.Tensor, mixing: Mixing) -> torch.Tensor:
        slots = mixing.plan(("sim-slots", payload.device), lambda: torch.tensor(mixing.index.T, device=payload.device))
        return payload[slots]

    def _all_gather(self, payload: torch.Tensor, groups: Groups) -> Gathered:
        size = groups.size
        rows = torch.arange(self.n, device=payload.device)
        messages = payload.view(self.n // size, size, payload.shape[1])
        member = self._member(groups, payload.device)
        if member is not None:  # a gone worker sends nothing
            messages = messages * member.view(-1, size, 1).to(messages.dtype)
            member = member.view(-1, size)
        return Gathered(messages, rows // size, member)

    def _rows_mean(self, T: torch.Tensor, workers: torch.Tensor | None, over: Groups | None) -> torch.Tensor:
        return T.mean(0) if workers is None else T.index_select(0, workers).mean(0)

    def _gather_scalars(self, values: torch.Tensor, over: Groups) -> torch.Tensor:
        member = self._member(over, values.device)
        return values if member is None else values * member.to(values.dtype)  # a gone worker's: 0, as it sends none

    @staticmethod
    def _member(groups: Groups, device: torch.device) -> torch.Tensor | None:
        """Which workers are seated members of consecutive groups (bool [n]; None: all)."""
        if groups.member is None:
            return None
        return groups.plan(("sim seats", device), lambda: torch.tensor(groups.member, device=device))

    def gather_rows(self, T: torch.Tensor) -> torch.Tensor:
        return T

    def _any(self, flag: torch.Tensor) -> bool:
        return bool(flag.item())
