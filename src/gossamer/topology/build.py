"""Building a topology: the :class:`Topology` type (a static, time-varying or random sequence of
W_t), :func:`build_topology` (a registered builder's rounds, each checked stochastic; a random
topology's sample, and its later rounds, drawn from (seed, t) by :func:`round_generator`), the
memory that takes (:func:`graph_bytes`; refused before it is built when it does not fit:
:func:`check_fits`), and what algorithms and engines do to a round's W (:func:`drop_slots`,
:func:`keep_living`, :func:`require_undirected`).

The builders are registered in :data:`~gossamer.topology.mixing.TOPOLOGIES` by :mod:`.static` and
:mod:`.dynamic`, which the package imports; this module only reads the registry when it builds.
Pure numpy (+ scipy for strong connectivity); no torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

import numpy as np
from tqdm import tqdm

from ..registry import short
from ..rng import host_stream
from .mixing import TOL, TOPOLOGIES, Mixing, RandomRounds, TopologyError, circulant, from_rows


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Topology:
    """The gossip matrices W_t of every round t: a static, time-varying or random topology.

    Static or time-varying: W_t = mixings[t % period]; random: W_t = draw(t), a fresh matrix
    every round drawn from (topology seed, t) alone — so every engine and process draws the same
    W_t, and a resumed run the ones it would have drawn. ``doubly_stochastic``:
    every W_t's rows sum to 1 too (else it is directed, column-stochastic: for push-sum).

    A random topology's ``mixings`` are its first rounds, W_0 … W_{R−1}: the sample its analysis
    reads (the empirical spectral gap over R rounds, messages per round, ...); ``period`` is then
    R, the number of rounds the analysis spans, not a period of W_t.

    Args:
        name (str): the topology's spec (``ring``, ``random-regular:4``).
        n (int): the workers.
        mixings (tuple[Mixing, ...]): W_0 … W_{P−1} (a random topology's: its sample).
        doubly_stochastic (bool): whether every W_t's rows sum to 1 too.
        draw (Callable[[int], Mixing] | None): a random topology's W_t of round t (None: not random).
        symmetry (str | None): a random topology's (:class:`RandomRounds`).

    Example::

        >>> from gossamer.extend import Mixing, Topology
        >>> n = 4
        >>> ring = Mixing([range(n), [(i + 1) % n for i in range(n)], [(i - 1) % n for i in range(n)]],
        ...               [[1 / 3] * n] * 3)
        >>> topology = Topology("my-ring", n, (ring,))
        >>> topology.kind, topology.mixing(7) is ring, topology.matrix(0).sum(0)
        ('static', True, array([1., 1., 1., 1.]))
    """

    name: str
    n: int
    mixings: tuple[Mixing, ...]
    doubly_stochastic: bool = True
    draw: Callable[[int], Mixing] | None = field(default=None, compare=False, repr=False)
    symmetry: str | None = None
    _recent: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def period(self) -> int:
        return len(self.mixings)

    @property
    def random(self) -> bool:
        """Whether W_t is drawn afresh every round (no period)."""
        return self.draw is not None

    @property
    def kind(self) -> str:
        return "random" if self.random else "static" if self.period == 1 else "time-varying"

    @cached_property
    def union(self) -> Mixing:
        """One matrix whose slots hold every neighbour a worker has in any W_t of the period (the
        mean of the W_t); a static topology's own W. Who must keep copies of whom. A random
        topology may pair any two workers some round: its union is the complete graph."""
        if self.random:
            return circulant(self.n, list(range(self.n)), [1.0 / self.n] * self.n)
        if self.period == 1:
            return self.mixings[0]
        index = np.concatenate([m.index for m in self.mixings])
        weight = np.concatenate([m.weight for m in self.mixings]) / self.period
        return from_rows(self.n, [_combine(index[:, i], weight[:, i], i) for i in range(self.n)])

    def mixing(self, t: int) -> Mixing:
        if not self.random:
            return self.mixings[t % self.period]
        if t < self.period:
            return self.mixings[t]
        if t not in self._recent:
            if len(self._recent) >= 4:  # a round's matrix is asked for a few times at most, all in its round
                self._recent.pop(next(iter(self._recent)))
            self._recent[t] = self.draw(t)
        return self._recent[t]

    def matrix(self, t: int) -> np.ndarray:
        return self.mixing(t).dense()


# --------------------------------------------------------------------------- edits of a round


def drop_slots(mixing: Mixing, dropped: np.ndarray) -> Mixing:
    """W without the links in the dropped slots: each worker keeps the weight it gave a dropped neighbour.

    The weight goes to slot 0, so each row still sums as before and a row with nothing dropped
    is unchanged. Dropping both directions of an undirected link keeps a symmetric W symmetric,
    hence doubly stochastic.

    Args:
        mixing (Mixing): W.
        dropped (ndarray): bool [K, n], the slots whose links are dropped (slot 0 is never).

    Returns:
        Mixing: the new W (``mixing`` itself when nothing is dropped).

    Example::

        >>> import numpy as np
        >>> from gossamer.extend import Mixing, drop_slots
        >>> pair = Mixing([[0, 1], [1, 0]], [[0.5, 0.5], [0.5, 0.5]])  # workers 0 and 1 average
        >>> drop_slots(pair, np.array([[False, False], [True, False]])).dense()  # 0 does not hear 1
        array([[1. , 0. ],
               [0.5, 0.5]])
    """
    dropped = dropped & (np.arange(mixing.K) > 0)[:, None]
    if not dropped.any():
        return mixing
    weight = np.where(dropped, 0.0, mixing.weight)
    weight[0] += np.where(dropped, mixing.weight, 0.0).sum(0)
    return Mixing(mixing.index, weight)


def require_undirected(topology: Topology, option: str, who: str) -> None:
    """Refuse, in one line, a topology with a round whose W is not symmetric (a worker reads one
    that does not read it: directed-exponential, an edge list with ``->``), for ``who`` (an
    algorithm that uses each link for both ends) — a random topology by its sampled rounds."""
    for mixing in topology.mixings:
        w = mixing.sparse()
        if abs(w - w.T).max() > 1e-12:
            raise TopologyError(f"{option} '{short(topology.name)}' has rounds in which a worker reads one that does "
                                f"not read it (a directed graph): {who} uses each link for both ends; use an "
                                f"undirected graph (ring, torus, exponential, random-matching, ...)")


def keep_living(mixing: Mixing, alive: np.ndarray) -> Mixing:
    """W among the living workers by local repair: every link to or from a gone worker is dropped.

    As :func:`drop_slots` drops them: a gone worker's row is e_i and no living worker reads it; a
    living row that never read a gone worker is unchanged, and a one-peer round stays one peer.
    Column sums, hence the living workers' mean, are kept when W is symmetric. The engines'
    default repair (``engine.living(W)``).

    Args:
        mixing (Mixing): W.
        alive (ndarray): bool [n], the workers alive.

    Returns:
        Mixing: the repaired W.

    Example::

        >>> import numpy as np
        >>> from gossamer.extend import Mixing, keep_living
        >>> everyone = Mixing([[0, 1, 2], [1, 2, 0], [2, 0, 1]], np.full((3, 3), 1 / 3))
        >>> keep_living(everyone, np.array([True, True, False])).dense().round(3)
        array([[0.667, 0.333, 0.   ],
               [0.333, 0.667, 0.   ],
               [0.   , 0.   , 1.   ]])
    """
    rows = np.broadcast_to(np.arange(mixing.n), mixing.index.shape)
    return drop_slots(mixing, (mixing.weight != 0) & ~(alive[rows] & alive[mixing.index]))


def _combine(index: np.ndarray, weight: np.ndarray, i: int) -> dict[int, float]:
    """Worker i's weight on each worker, from (possibly repeated) slots; self and nonzero ones."""
    total = {i: 0.0}
    for j, w in zip(index.tolist(), weight.tolist()):
        if w:
            total[j] = total.get(j, 0.0) + w
    return total


# --------------------------------------------------------------------------- building


def _check_stochastic(m: Mixing, name: str, t: int = 0) -> bool:
    """Raise TopologyError unless W >= 0 with columns summing to 1 (tol 1e-12): every worker sends
    out all of its mass. Returns whether the rows sum to 1 too (W doubly stochastic). From the
    slot form (no n×n matrix)."""
    w = m.weight
    if not np.all(np.isfinite(w)):
        raise TopologyError(f"topology '{name}': W_{t} has non-finite entries")
    if (w < -TOL).any():
        raise TopologyError(f"topology '{name}': W_{t} has negative entries (min {w.min():g})")
    rows = np.abs(w.sum(axis=0) - 1).max(initial=0.0)
    cols = np.abs(np.bincount(m.index.ravel(), weights=w.ravel(), minlength=m.n) - 1).max(initial=0.0)
    if cols > TOL:
        raise TopologyError(
            f"topology '{name}': W_{t} is not column stochastic "
            f"(max column error {cols:.3g}, row error {rows:.3g})"
        )
    return bool(rows <= TOL)


def _check_strongly_connected(mixings: tuple[Mixing, ...], name: str) -> None:
    """Every worker reaches every other over one period (else push-sum cannot agree on an average)."""
    from scipy.sparse.csgraph import connected_components

    n = mixings[0].n
    graph = sum(m.sparse() for m in mixings)  # W[i, j] != 0: an edge j -> i
    sends = np.asarray((graph != 0).sum(0)).ravel() - (graph.diagonal() != 0)
    if n > 1 and (sends == 0).any():
        raise TopologyError(f"topology '{name}': node {int(np.argmin(sends))} has no out-edge; every worker "
                            f"must send to another (a strongly connected graph)")
    parts, _ = connected_components(graph, directed=True, connection="strong")
    if parts > 1:
        raise TopologyError(f"topology '{name}' is not strongly connected ({parts} components)")


def round_generator(seed: int, t: int) -> np.random.Generator:
    """The random numbers of round t of a random topology: a function of (seed, t) alone, so W_t
    needs neither W_{t−1} nor any state — every process draws it alike, and a resumed run too."""
    return host_stream("topology-round", seed, t)


SAMPLE_ROUNDS = 32  # the rounds of a random topology kept as its sample (the analysis: empirical gap, ...)


def build_topology(spec: str, n: int, seed: int = 0, rounds: int | None = None) -> Topology:
    """Build and validate the topology named by `spec` ('name' or 'name:param') for n workers.
    ``rounds``: how many rounds of a random topology to draw as its sample (default
    SAMPLE_ROUNDS; its other rounds are drawn when asked for, each checked like these)."""
    rounds = SAMPLE_ROUNDS if rounds is None else rounds
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TopologyError(f"topology '{short(spec)}' needs an integer number of workers n, got {short(repr(n))}")
    n = int(n)
    if n < 1:
        raise TopologyError(f"topology '{short(spec)}' needs n >= 1 workers, got n = {n}")
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 1:
        raise TopologyError(f"the rounds a random topology is sampled over must be a positive integer, "
                            f"got {short(repr(rounds))}")
    entry, param = TOPOLOGIES.parse(spec)
    free = free_memory()
    if entry.traits.get("per_round") and free is not None and graph_bytes(spec, n, 1) <= free < graph_bytes(
            spec, n, rounds):  # n fits, the sample does not: the rounds are the cause
        most = free // max(graph_bytes(spec, n, 1), 1)
        raise TopologyError(f"sampling {rounds:,} rounds of topology '{short(spec)}' (--rounds) with n = {n} needs "
                            f"about {graph_bytes(spec, n, rounds) / 2**30:.1f} GiB, more than the {free / 2**30:.1f} "
                            f"GiB free; at most --rounds {most:,} fits")
    check_fits(f"building topology '{short(spec)}'", n, lambda k: graph_bytes(spec, k, rounds))
    built = entry.build(n, param, seed)
    if isinstance(built, RandomRounds):
        label = short(spec)

        def draw(t: int) -> Mixing:
            m = built.draw(round_generator(seed, t))
            if m.n != n:
                raise TopologyError(f"topology '{label}': W_{t} has {m.n} workers, expected {n}")
            if not _check_stochastic(m, label, t):
                raise TopologyError(f"topology '{label}': W_{t} is not doubly stochastic (rows do not sum to 1)")
            return m
        sample = tqdm(range(int(rounds)), desc=f"sampling {label}", unit="round", disable=None, delay=2, leave=False)
        return Topology(name=spec, n=n, mixings=tuple(draw(t) for t in sample), draw=draw, symmetry=built.symmetry)
    mixings = built if isinstance(built, tuple) else (built,)
    doubly = True
    for t, m in enumerate(mixings):
        if m.n != n:
            raise TopologyError(f"topology '{short(spec)}': W_{t} has {m.n} workers, expected {n}")
        doubly &= _check_stochastic(m, short(spec), t)
    if not doubly:
        _check_strongly_connected(mixings, short(spec))
    return Topology(name=spec, n=n, mixings=mixings, doubly_stochastic=doubly)


# --------------------------------------------------------------------------- memory

# Peak bytes of building and analysing a topology, measured (build_topology, then analyse) on
# complete, ring, exponential, torus, random-regular and erdos-renyi graphs of 10^3-10^6 workers
# and rounded up: per neighbour slot of the period's W_t (index and weight, and the copies their
# construction, checks and spectra make), and per edge and node of a networkx graph.
SLOT_BYTES = 96
EDGE_BYTES = 256
NODE_BYTES = 384


def free_memory() -> int | None:
    """Bytes of memory free on this host (None where the system does not say): what memory
    preflights compare their estimates with."""
    if hasattr(os, "sysconf") and "SC_AVPHYS_PAGES" in os.sysconf_names:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None


def graph_bytes(spec: str, n: int, rounds: int = SAMPLE_ROUNDS) -> int:
    """About the memory building and analysing topology ``spec`` for n workers takes at its peak,
    from the ``size`` it is registered with (0 without one; a ``per_round`` one's sample of
    ``rounds`` rounds)."""
    entry, param = TOPOLOGIES.parse(spec)
    size = entry.traits.get("size")
    slots, edges, nodes = size(n, param) if size else (0, 0, 0)
    if entry.traits.get("per_round", False):
        slots *= rounds
    return int(SLOT_BYTES * slots + EDGE_BYTES * edges + NODE_BYTES * nodes)


def check_fits(what: str, n: int, need: Callable[[int], int]) -> None:
    """Refuse ``what`` for n workers before it starts when it needs (``need(n)`` bytes, growing with
    n) more memory than is free, saying how many workers fit."""
    free = free_memory()
    if free is None or need(n) <= free:
        return
    low, high = 0, n
    while low < high - 1:
        mid = (low + high) // 2
        low, high = (mid, high) if need(mid) <= free else (low, mid)
    raise TopologyError(f"{what} with n = {n} workers (-n, or workers in a run) needs about {need(n) / 2**30:.1f} GiB, "
                        f"more than the {free / 2**30:.1f} GiB free; at most n = {low} fits")
