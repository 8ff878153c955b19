"""Groups of workers that average exactly among themselves: all workers, consecutive blocks (nodes),
the living members of each under faults, a grid's lines (Moshpit SGD), a random partition
(``groups:G``), one pair.

A :class:`Groups` is k groups of at most g members laid out as ``index`` [k·g] (group r's members
at positions r·g … r·g + g − 1, ascending by position) and ``member`` [k·g] (False: an empty
seat — a gone worker, or padding for a smaller group). Workers not seated are not part of the
operation. Engines run a mean over each group (rows of its members ← their mean, the others
unchanged); the ledger prices it as a ring all-reduce within each group; the clock makes each
member wait for the others of its group. Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .topology import Mixing


@dataclass(frozen=True, eq=False)
class Groups:
    """k groups of at most ``size`` members out of ``n`` workers, each averaging exactly among itself.

    What ``engine.groups_mean_(X, groups)`` averages within (module docstring); build one with
    :meth:`blocks` or :meth:`of`.

    Args:
        n (int): the workers.
        index (ndarray): int64 [k·size], the workers seated, group by group.
        size (int): the seats of a group.
        member (ndarray | None): bool [k·size], which seats hold a member (None: all).

    Example::

        >>> from gossamer.extend import Groups
        >>> nodes = Groups.blocks(8, 4)  # two nodes of 4 consecutive workers
        >>> nodes.count, nodes.members(1)
        (2, array([4, 5, 6, 7]))
        >>> lines = Groups.of(4, [[0, 3], [1, 2]])
        >>> lines.of_worker, lines.sizes
        (array([0, 1, 1, 0]), array([2, 2]))
    """

    n: int
    index: np.ndarray
    size: int
    member: np.ndarray | None = None
    _plans: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        index = np.asarray(self.index, dtype=np.int64)
        if self.size < 1 or index.ndim != 1 or len(index) % self.size:
            raise ValueError(f"groups need a flat index of whole groups of {self.size}, got shape {index.shape}")
        seated = index if self.member is None else index[self.member]
        if len(seated) and (seated.min() < 0 or seated.max() >= self.n or len(np.unique(seated)) != len(seated)):
            raise ValueError(f"groups must seat distinct workers of 0..{self.n - 1}")
        index.setflags(write=False)
        object.__setattr__(self, "index", index)
        if self.member is not None:
            member = np.asarray(self.member, dtype=bool)
            member.setflags(write=False)
            object.__setattr__(self, "member", None if member.all() else member)

    @classmethod
    def blocks(cls, n: int, size: int) -> Groups:
        """Consecutive blocks of ``size`` workers (``size`` = n: everyone)."""
        return cls(n, np.arange(n), size)

    @classmethod
    def of(cls, n: int, groups) -> Groups:
        """Groups from a list of member lists (or an int array [k, g]); smaller ones padded."""
        groups = [np.asarray(g, dtype=np.int64).ravel() for g in groups]
        size = max((len(g) for g in groups), default=1)
        index = np.zeros((len(groups), size), dtype=np.int64)
        member = np.zeros((len(groups), size), dtype=bool)
        for r, g in enumerate(groups):
            index[r, : len(g)], member[r, : len(g)] = g, True
        return cls(n, index.ravel(), size, member.ravel())

    def among(self, alive: np.ndarray | None) -> Groups:
        """The same groups with only the workers ``alive`` (bool [n]; None: all) as members."""
        if alive is None:
            return self
        kept = alive[self.index] if self.member is None else alive[self.index] & self.member
        return Groups(self.n, self.index, self.size, kept)

    @property
    def count(self) -> int:
        """k, the number of groups (empty ones included)."""
        return len(self.index) // self.size

    @cached_property
    def sizes(self) -> np.ndarray:
        """Members of each group [k]."""
        if self.member is None:
            return np.full(self.count, self.size)
        return self.member.reshape(self.count, self.size).sum(1)

    @cached_property
    def consecutive(self) -> bool:
        """Whether the seats are the workers in order (consecutive blocks, some seats perhaps
        empty): the engines' fast path, a view of the rows."""
        return len(self.index) == self.n and bool((self.index == np.arange(self.n)).all())

    @cached_property
    def of_worker(self) -> np.ndarray:
        """The group of each worker [n] (−1: not a member)."""
        group = np.full(self.n, -1, dtype=np.int64)
        seats = np.arange(len(self.index)) // self.size
        kept = slice(None) if self.member is None else self.member
        group[self.index[kept]] = seats[kept]
        return group

    @cached_property
    def mixing(self) -> Mixing:
        """The same average as a mixing matrix: W_ij = 1/g_r for members i, j of group r, the row
        e_i for a worker not seated (slot s of the member at seat p: the seat (p + s) mod g)."""
        k, g = self.count, self.size
        seats = self.index.reshape(k, g)
        member = np.ones((k, g), dtype=bool) if self.member is None else self.member.reshape(k, g)
        share = np.where(member, 1.0 / np.maximum(member.sum(1, keepdims=True), 1), 0.0)
        index = np.tile(np.arange(self.n, dtype=np.int64), (g, 1))
        weight = np.zeros((g, self.n))
        weight[0] = 1.0
        for s in range(g):
            other, other_member = np.roll(seats, -s, axis=1), np.roll(member, -s, axis=1)
            used = member & other_member
            index[s, seats[used]] = other[used]
            weight[s, seats[member]] = np.where(other_member, np.roll(share, -s, axis=1), 0.0)[member]
        return Mixing(index, weight)

    def members(self, r: int) -> np.ndarray:
        """The members of group r, by seat."""
        seats = slice(r * self.size, (r + 1) * self.size)
        return self.index[seats] if self.member is None else self.index[seats][self.member[seats]]

    def plan(self, key, build):
        """An engine's precomputed plan for these groups, built once per ``key``."""
        if key not in self._plans:
            self._plans[key] = build()
        return self._plans[key]
