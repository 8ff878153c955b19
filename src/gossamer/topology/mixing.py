"""The data of gossip mixing: a matrix W in neighbour-slot form (:class:`Mixing`), what a random
topology's builder returns (:class:`RandomRounds`), the registry of topologies, and the helpers that
builders of :mod:`gossamer.topology.static` and :mod:`gossamer.topology.dynamic` share (``identity``,
``circulant``, ``from_rows``, ``parse_int``, ``regular_degree``).

Both builder modules import this one and not each other's definitions: ``static.py`` registers the
static graphs and ``dynamic.py`` the per-round ones; the package imports both, so
``gossamer.topology.TOPOLOGIES`` holds every built-in topology. Pure numpy; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable

import numpy as np

from ..registry import ConfigError, Registry, short

TOL = 1e-12
DENSE_MAX = 2048  # above this many workers, spectra of graphs that are not circulant are iterative


class TopologyError(ConfigError):
    """Bad topology spec; str(e) is one clear line naming the option and what is allowed."""


# Each entry declares, where it is registered, the traits :func:`~gossamer.topology.graph_bytes` reads:
#   size(n, param) -> (neighbour slots over one period and in its union, networkx edges, networkx
#       nodes) of building it for n workers (a parameter beyond n is refused by the builder, so a
#       size takes n's and leaves the refusal to it);
#   per_round=True: a random topology, whose size is one round's (its sample holds many).
TOPOLOGIES = Registry("topology", error=TopologyError, traits={
    "size": "size(n, param) -> (neighbour slots, networkx edges, networkx nodes): its memory, graph_bytes",
    "per_round": "True: a random topology drawn every round (its size is one round's)"})


@dataclass(frozen=True, eq=False)
class Mixing:
    """One gossip matrix W in neighbour-slot form, what engines gossip and exchange over:

        (W X)_i = sum_k weight[k, i] * X[index[k, i]],

    with index int64 [K, n] and weight float64 [K, n]. Slot 0 is the worker itself
    (index[0, i] == i). Unused slots point at i with weight 0; duplicate slots add up.

    ``groups`` (optional), int64 [k, G]: a round that averages exactly within groups says so —
    row r holds the worker ids of group r, every worker in exactly one group, and W is the
    block-diagonal mean over them (W[i, j] = 1/G when i and j share a group, else 0), which
    index/weight hold as well. Engines may then run the round as a mean within each group (priced
    as a ring all-reduce per group) instead of a gossip round. None: a gossip round.

    Args:
        index (array-like): int [K, n], the worker that i reads in slot k.
        weight (array-like): float [K, n], the weight i gives it.
        groups (array-like | None): int [k, G], the groups W averages exactly, or None.

    Example::

        >>> from gossamer.extend import Mixing
        >>> n = 4  # slot 0: the worker itself, slots 1 and 2: its neighbours on a ring
        >>> ring = Mixing([range(n), [(i + 1) % n for i in range(n)], [(i - 1) % n for i in range(n)]],
        ...               [[1 / 3] * n] * 3)
        >>> ring.dense()[0].round(3)  # row 0 of W
        array([0.333, 0.333, 0.   , 0.333])
        >>> ring.n, ring.K, round(ring.p, 3)  # p: the mixing quality 1 − ‖W − J‖²
        (4, 3, 0.889)
    """

    index: np.ndarray
    weight: np.ndarray
    groups: np.ndarray | None = None
    _plans: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        index = np.array(self.index, dtype=np.int64)
        weight = np.array(self.weight, dtype=np.float64)
        if index.ndim != 2 or index.shape != weight.shape or index.shape[0] < 1:
            raise TopologyError(
                f"mixing index/weight must both be [K, n] with K >= 1; "
                f"got {index.shape} and {weight.shape}"
            )
        n = index.shape[1]
        if n and (index.min() < 0 or index.max() >= n):
            raise TopologyError(f"mixing index out of range 0..{n - 1}")
        index.setflags(write=False)
        weight.setflags(write=False)
        object.__setattr__(self, "index", index)
        object.__setattr__(self, "weight", weight)
        if self.groups is not None:
            groups = np.array(self.groups, dtype=np.int64)
            if groups.ndim != 2 or groups.size != n or (np.sort(groups.ravel()) != np.arange(n)).any():
                raise TopologyError(f"mixing groups must be [k, G] with every worker 0..{n - 1} in exactly one "
                                    f"group; got shape {groups.shape}")
            groups.setflags(write=False)
            object.__setattr__(self, "groups", groups)

    @property
    def n(self) -> int:
        return int(self.index.shape[1])

    @property
    def K(self) -> int:
        """The slots per worker."""
        return int(self.index.shape[0])

    def dense(self) -> np.ndarray:
        """W as float64 [n, n]: W[i, index[k, i]] += weight[k, i] (duplicates accumulate)."""
        K, n = self.index.shape
        w = np.zeros((n, n), dtype=np.float64)
        rows = np.broadcast_to(np.arange(n), (K, n))
        np.add.at(w, (rows, self.index), self.weight)
        return w

    @cached_property
    def messages_per_worker(self) -> float:
        """Mean over workers j of #{i != j : W[i, j] != 0} (the workers j sends to)."""
        n = self.n
        rows = np.broadcast_to(np.arange(n), self.index.shape)
        used = (self.weight != 0) & (self.index != rows)
        pairs = np.unique(rows[used].astype(np.int64) * n + self.index[used])
        return len(pairs) / n if n else 0.0

    @cached_property
    def p(self) -> float:
        """Mixing quality of this round, p = 1 − ‖W − J‖₂²: ‖WX − X̄‖² ≤ (1 − p)‖X − X̄‖² for every X.

        For a static symmetric W this is the paper's p = 1 − λ²; for one round of a time-varying
        graph it can be 0 (one-peer exponential at hops ≥ 2 leaves some modes unmixed)."""
        return float(min(1.0, max(0.0, 1.0 - norm_minus_mean((self,)) ** 2)))

    @cached_property
    def shifts(self) -> list[int] | None:
        """s_k per slot when every slot is a cyclic shift, index[k, i] = (i + s_k) mod n (ring,
        exponential graphs), else None."""
        n = self.n
        s = self.index[:, 0] % max(n, 1)
        if n and not (self.index == (np.arange(n)[None, :] + s[:, None]) % n).all():
            return None
        return [int(x) for x in s]

    @cached_property
    def spectrum(self) -> np.ndarray | None:
        """The eigenvalues λ_m = Σ_k w_k exp(2πi·m·s_k/n), m = 0..n−1, of a circulant W (every slot
        a cyclic shift s_k with one weight w_k for all workers); None for other graphs."""
        if self.shifts is None or not (self.weight == self.weight[:, :1]).all():
            return None
        m = np.arange(self.n)
        return sum(w * np.exp(2j * np.pi * m * s / self.n) for w, s in zip(self.weight[:, 0], self.shifts))

    def weights_in(self, slots: Mixing) -> np.ndarray:
        """W's weights in the neighbour slots of ``slots`` [K', n] (a matrix whose slots hold all
        of W's neighbours, e.g. the union of a period): worker i's weight on j sits in the
        first of i's slots that holds j, 0 in the others."""
        if slots is self:
            return self.weight
        index = slots.index
        weight = ((index[:, None, :] == self.index[None, :, :]) * self.weight[None]).sum(1)
        earlier = (index[:, None, :] == index[None, :, :]) & np.tril(np.ones((len(index),) * 2, bool), -1)[..., None]
        weight[earlier.any(1)] = 0.0
        if not np.allclose(weight.sum(0), self.weight.sum(0), rtol=0, atol=TOL):
            raise ValueError("a mixing matrix has neighbours outside the given slots")
        return weight

    def sparse(self):
        """W as a scipy CSR matrix (duplicate slots add up)."""
        from scipy.sparse import csr_matrix

        K, n = self.index.shape
        rows = np.broadcast_to(np.arange(n), (K, n))
        return csr_matrix((self.weight.ravel(), (rows.ravel(), self.index.ravel())), shape=(n, n))

    def plan(self, key: Any, build: Callable[[], Any]) -> Any:
        """An engine's precomputed plan for this matrix (tensors on its device, send and receive
        lists), built once per ``key`` and kept as long as the matrix."""
        if key not in self._plans:
            self._plans[key] = build()
        return self._plans[key]


# --------------------------------------------------------------------------- builders' helpers


def identity(n: int) -> Mixing:
    """W = I: every worker keeps its model."""
    return Mixing(np.arange(n, dtype=np.int64)[None, :], np.ones((1, n)))


def circulant(n: int, offsets: list[int], weights: list[float]) -> Mixing:
    """W[i, (i + off_k) % n] += w_k for every slot k (offset 0 first): the same weights round every worker."""
    i = np.arange(n, dtype=np.int64)
    index = np.stack([(i + off) % n for off in offsets])
    weight = np.stack([np.full(n, w, dtype=np.float64) for w in weights])
    return Mixing(index, weight)


def from_rows(n: int, rows: list[dict[int, float]]) -> Mixing:
    """Slot form of W from each worker's {neighbour: weight} (row i: W[i, j] for each j): self
    first, then the others ascending, padded with (i, 0) to K = 1 + the most neighbours a worker has."""
    K = max(len(r) for r in rows)
    index = np.tile(np.arange(n, dtype=np.int64), (K, 1))
    weight = np.zeros((K, n), dtype=np.float64)
    for i, row in enumerate(rows):
        weight[0, i] = row.get(i, 0.0)
        for k, j in enumerate(sorted(j for j in row if j != i), start=1):
            index[k, i], weight[k, i] = j, row[j]
    return Mixing(index, weight)


def parse_int(name: str, arg: str | None, default: int, what: str) -> int:
    """The integer parameter of topology ``name`` (``default`` when absent), refused in one line
    naming ``what`` when it is not an integer."""
    if arg is None:
        return default
    try:
        return int(arg)
    except ValueError:
        raise TopologyError(f"topology '{name}' takes an integer {what}, got '{short(arg)}'") from None


def regular_degree(name: str, arg: str | None, default: int, letter: str, n: int) -> int:
    """The degree of a regular graph on n workers from its parameter: 1 <= degree < n, n·degree even."""
    d = parse_int(name, arg, default=default, what=f"degree {letter}")
    if d < 1:
        raise TopologyError(f"topology '{name}' needs degree {letter} >= 1, got {letter} = {short(str(d))}")
    if d >= n:
        raise TopologyError(f"topology '{name}' needs degree {letter} < n, got {letter} = {short(str(d))}, n = {n}")
    if (n * d) % 2:
        raise TopologyError(f"topology '{name}' needs n·{letter} even (a {letter}-regular graph), got n = {n}, "
                            f"{letter} = {d}")
    return d


@dataclass(frozen=True)
class RandomRounds:
    """What the builder of a random topology returns: a fresh W_t every round, drawn from (seed, t) alone.

    Args:
        draw (Callable[[Generator], Mixing]): W_t from numpy's generator of (topology seed, t).
        symmetry (str | None): what relabelling of the workers leaves the law of W_t unchanged —
            "exchangeable" (any permutation: random matchings, regular graphs, partitions),
            "cyclic" (the rotations i → i + c) or None — which the analysis averages its
            estimates over (:func:`~gossamer.topology.expected_contraction`).

    Example::

        >>> import numpy as np
        >>> from gossamer.extend import TOPOLOGIES, Mixing, RandomRounds, host_stream
        >>> def shift(n, s):  # every worker averages with the one s ahead of it
        ...     return Mixing([range(n), [(i + s) % n for i in range(n)]], np.full((2, n), 0.5))
        >>> @TOPOLOGIES.register("random-shift", help="a random cyclic shift every round", per_round=True)
        ... def build(n, param, seed):
        ...     return RandomRounds(lambda rng: shift(n, int(rng.integers(1, n))), symmetry="cyclic")
        >>> rounds = build(8, None, seed=0)
        >>> rounds.draw(host_stream("topology-round", 0, 5)).dense().sum(0)  # W_5 of seed 0: column-stochastic
        array([1., 1., 1., 1., 1., 1., 1., 1.])
    """

    draw: Callable[[np.random.Generator], Mixing]
    symmetry: str | None = None


# --------------------------------------------------------------------------- the mixing quality


def norm_minus_mean(mixings: tuple[Mixing, ...], dense_max: int = DENSE_MAX) -> float:
    """‖W_{P−1} ⋯ W_0 − J‖₂ (J = 11ᵀ/n): in closed form for circulant matrices (they share the
    Fourier basis, so the product's eigenvalues are the products of theirs, and a normal matrix's
    norm is its largest |eigenvalue| off the mean mode); densely for small n; else by a sparse
    singular-value iteration."""
    n = mixings[0].n
    if n == 1:
        return 0.0
    spectra = [m.spectrum for m in mixings]
    if all(s is not None for s in spectra):
        sigma = float(np.abs(np.prod(spectra, axis=0)[1:]).max())
        return sigma if sigma > TOL else 0.0  # below float64 noise: an exact average
    if n <= dense_max:
        prod = np.eye(n)
        for m in mixings:
            prod = m.dense() @ prod
        sigma = float(np.linalg.norm(prod - np.full((n, n), 1.0 / n), 2))
        return sigma if sigma > TOL else 0.0  # a finite-time graph's exact average, up to rounding
    from scipy.sparse.linalg import LinearOperator, svds

    sparse = [m.sparse() for m in mixings]

    def apply(x, transpose=False):
        x = np.asarray(x, dtype=np.float64).reshape(n, -1)
        for w in (reversed(sparse) if transpose else sparse):
            x = (w.T if transpose else w) @ x
        return x - x.mean(0, keepdims=True)
    op = LinearOperator((n, n), matvec=apply, rmatvec=lambda x: apply(x, True), dtype=np.float64)
    probe = np.random.default_rng(0).standard_normal(n)
    if np.linalg.norm(apply(probe)) <= TOL * np.linalg.norm(probe):  # a finite-time graph: nothing left (ARPACK
        return 0.0  # would stop on its zero vectors)
    sigma = float(svds(op, k=1, return_singular_vectors=False, random_state=0)[0])
    return sigma if sigma > TOL else 0.0
