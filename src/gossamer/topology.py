"""Gossip mixing matrices W_t (n x n), static and time-varying, undirected and directed.

A gossip round maps worker models X (one row per worker) to W_t X:
    x_i <- sum_j W_t[i, j] x_j,
where W_t[i, j] is the weight worker i gives to worker j's model. Every W_t is
nonnegative with columns summing to 1 (worker j sends out all its mass). Undirected
topologies are doubly stochastic (rows sum to 1 too), so the average x_bar is preserved
and plain gossip converges to it. Directed ones (``directed-exponential`` is doubly
stochastic anyway; ``edges:FILE`` with ``i -> j`` lines need not be) are only
column-stochastic: plain gossip would not converge to the average, push-sum
(``algorithm: sgp``) does; their graph over one period must be strongly connected.

Spectral analysis (Kong et al. 2021, section B of papers.md): with J = 11^T/n and
period P, the spectral gap is

    rho = 1 - || W_{P-1} ... W_0 - J ||_2 ^ (1/P),

which for a static symmetric W is 1 - max(|lambda_2|, |lambda_n|). The mixing
quality is p = 1 - (1 - rho)^2, and the slowest mode halves in
ln 2 / (-ln(1 - rho)) rounds.

Random topologies draw a fresh W_t every round from (topology seed, t) alone (``RandomRounds``,
``round_generator``); they, EquiTopo's static graph and the finite-time Base-(K+1) graph live in
``topology_dynamic.py``. Beside the spectral gap, :func:`analyse` reports the expected contraction
E‖W_t − J‖² and Vogels et al.'s effective number of neighbours (docs/topologies.md).

Pure numpy + networkx (+ scipy for sparse spectra and strong connectivity); no torch.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

import networkx as nx
import numpy as np
from tqdm import tqdm

from .registry import short
from .rng import host_stream, stream_seed
# the data and the helpers builders share with topology_dynamic.py (re-exported: gossamer.topology.Mixing, ...)
from .mixing import DENSE_MAX, TOPOLOGIES, Mixing, RandomRounds, TopologyError, circulant, from_rows, identity
from .mixing import TOL as _TOL
from .mixing import norm_minus_mean, parse_int, regular_degree

_MAX_TRIES = 100


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Topology:
    """A topology: static, time-varying (W_t = mixings[t % period]) or random (W_t = draw(t), a
    fresh matrix every round drawn from (topology seed, t) alone — so every engine and process
    draws the same W_t, and a resumed run the ones it would have drawn). ``doubly_stochastic``:
    every W_t's rows sum to 1 too (else it is directed, column-stochastic: for push-sum).

    A random topology's ``mixings`` are its first rounds, W_0 … W_{R−1}: the sample its analysis
    reads (the empirical spectral gap over R rounds, messages per round, ...); ``period`` is then
    R, the number of rounds the analysis spans, not a period of W_t."""

    name: str
    n: int
    mixings: tuple[Mixing, ...]
    doubly_stochastic: bool = True
    draw: Callable[[int], Mixing] | None = field(default=None, compare=False, repr=False)
    symmetry: str | None = None  # a random topology's: see RandomRounds
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


# --------------------------------------------------------------------------- builders


# The helpers of builders here and in topology_dynamic.py (identity, circulant, from_rows, parse_int,
# regular_degree) live in mixing.py, which both import.


def drop_slots(mixing: Mixing, dropped: np.ndarray) -> Mixing:
    """W without the links in the ``dropped`` slots (bool [K, n]): each worker keeps for itself
    the weight it gave a dropped neighbour (slot 0), so its row still sums as before and a row
    with nothing dropped is unchanged. Dropping both directions of an undirected link keeps a
    symmetric W symmetric, hence doubly stochastic."""
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
    """W among the ``alive`` workers (bool [n]) by local repair: every link to or from a gone
    worker is dropped (:func:`drop_slots`): a gone worker's row is e_i and no living worker reads
    it; a living row that never read a gone worker is unchanged, and a one-peer round stays one
    peer. Column sums, hence the living workers' mean, are kept when W is symmetric."""
    rows = np.broadcast_to(np.arange(mixing.n), mixing.index.shape)
    return drop_slots(mixing, (mixing.weight != 0) & ~(alive[rows] & alive[mixing.index]))


def _combine(index: np.ndarray, weight: np.ndarray, i: int) -> dict[int, float]:
    """Worker i's weight on each worker, from (possibly repeated) slots; self and nonzero ones."""
    total = {i: 0.0}
    for j, w in zip(index.tolist(), weight.tolist()):
        if w:
            total[j] = total.get(j, 0.0) + w
    return total


def _no_param(build: Callable[[int], Mixing | tuple[Mixing, ...]]):
    """A builder of n alone, as a registry builder (n, param, seed)."""
    return lambda n, param, seed: build(n)


@TOPOLOGIES.register("complete", help="11ᵀ/n: exact averaging in one round", size=lambda n, _: (n * n, 0, 0))
@_no_param
def _complete(n: int) -> Mixing:
    return circulant(n, list(range(n)), [1.0 / n] * n)


@TOPOLOGIES.register("ring", help="self and i±1, weights 1/3", size=lambda n, _: (3 * n, 0, 0))
@_no_param
def _ring(n: int) -> Mixing:
    if n == 1:
        return identity(1)
    return circulant(n, [0, 1, -1], [1.0 / 3] * 3)


def _torus_shape(n: int) -> tuple[int, int] | None:
    """Most square a * b = n with 3 <= a <= b, or None."""
    for a in range(math.isqrt(n), 2, -1):
        if n % a == 0 and n // a >= 3:
            return a, n // a
    return None


@TOPOLOGIES.register("torus", help="2-D torus n = a·b (a, b ≥ 3, most square), weights 1/5",
                     size=lambda n, _: (5 * n, 0, 0))
@_no_param
def _torus(n: int) -> Mixing:
    shape = _torus_shape(n)
    if shape is None:
        raise TopologyError(
            f"topology 'torus' needs n = a·b with a, b >= 3; n = {n} has no such factorisation"
        )
    a, b = shape
    # Worker i sits at (r, c) = divmod(i, b).
    r, c = np.divmod(np.arange(n, dtype=np.int64), b)
    slots = [
        r * b + c,
        ((r + 1) % a) * b + c,
        ((r - 1) % a) * b + c,
        r * b + (c + 1) % b,
        r * b + (c - 1) % b,
    ]
    return Mixing(np.stack(slots), np.full((5, n), 0.2))


def _log(n: int) -> int:
    """How many hops 2^k ≤ n − 1 the exponential graphs have (1 for n ≤ 2)."""
    return max(n - 1, 1).bit_length()


@TOPOLOGIES.register("exponential", help="static: peers at hops ±2^k, uniform weights",
                     size=lambda n, _: ((1 + 2 * _log(n)) * n, 0, 0))
@_no_param
def _exponential(n: int) -> Mixing:
    """Static exponential graph: neighbours i ± 2^k (mod n), k = 0..floor(log2(n-1))."""
    if n == 1:
        return identity(1)
    offsets = set()
    for k in range((n - 1).bit_length()):  # 2^k <= n - 1
        h = 1 << k
        offsets.add(h % n)
        offsets.add((-h) % n)
    offsets.discard(0)
    offs = [0] + sorted(offsets)
    return circulant(n, offs, [1.0 / len(offs)] * len(offs))


@TOPOLOGIES.register("one-peer-exponential",
                     help="time-varying, n a power of two: x_i ← (x_i + x_{i+2^k})/2, k = t mod log₂n",
                     size=lambda n, _: (3 * _log(n) * n, 0, 0))
@_no_param
def _one_peer_exponential(n: int) -> tuple[Mixing, ...]:
    """W_t: x_i <- (x_i + x_{(i + 2^k) mod n}) / 2, k = t mod log2 n."""
    if n & (n - 1):
        raise TopologyError(
            f"topology 'one-peer-exponential' needs n a power of two, got n = {n}"
        )
    if n == 1:
        return (identity(1),)
    return tuple(circulant(n, [0, 1 << k], [0.5, 0.5]) for k in range(n.bit_length() - 1))


@TOPOLOGIES.register("directed-exponential",
                     help="directed, time-varying, any n: i sends ½ to i + 2^k, k = t mod (⌊log₂(n−1)⌋ + 1) (SGP's graph)",
                     size=lambda n, _: (3 * _log(n) * n, 0, 0))
@_no_param
def _directed_exponential(n: int) -> tuple[Mixing, ...]:
    """Assran et al.'s graph: in round t worker i keeps half of its model and sends half to
    i + 2^k (mod n), k cycling over 0..⌊log₂(n − 1)⌋; so x_i ← (x_i + x_{i−2^k}) / 2. Every
    worker has one in- and one out-peer per round, so W_t is doubly stochastic."""
    if n == 1:
        return (identity(1),)
    return tuple(circulant(n, [0, -(1 << k) % n], [0.5, 0.5]) for k in range((n - 1).bit_length()))


def _push_sum(graph: nx.DiGraph, n: int) -> Mixing:
    """Column-stochastic push-sum weights of a directed graph: worker j splits its model equally
    among itself and its out-neighbours, W[i, j] = 1 / (1 + outdeg j) — what j can set alone."""
    share = [1.0 / (1 + sum(1 for i in graph.successors(j) if i != j)) for j in range(n)]
    return from_rows(n, [{i: share[i], **{j: share[j] for j in graph.predecessors(i) if j != i}} for i in range(n)])


def metropolis_hastings(graph: nx.Graph, n: int) -> Mixing:
    """w_ij = 1 / (1 + max(deg_i, deg_j)) on edges, w_ii = 1 - sum_j w_ij.

    Slot form with K = 1 + max degree; missing slots padded with (i, 0).
    """
    nbrs = [sorted(int(j) for j in graph.neighbors(i) if j != i) for i in range(n)]
    deg = [len(x) for x in nbrs]
    K = 1 + max(deg, default=0)
    index = np.tile(np.arange(n, dtype=np.int64), (K, 1))
    weight = np.zeros((K, n), dtype=np.float64)
    for i in range(n):
        total = 0.0
        for k, j in enumerate(nbrs[i], start=1):
            w = 1.0 / (1 + max(deg[i], deg[j]))
            index[k, i] = j
            weight[k, i] = w
            total += w
        weight[0, i] = 1.0 - total
    return Mixing(index, weight)


def _random_regular_size(n: int, param: str | None) -> tuple[float, float, int]:
    d = min(n, max(0, parse_int("random-regular", param, default=4, what="degree D")))
    return (d + 1) * n, n * d / 2, n


@TOPOLOGIES.register("random-regular", spec="random-regular[:D]", takes="optional",
                     help="random D-regular graph (default 4), Metropolis–Hastings weights", size=_random_regular_size)
def _random_regular(n: int, arg: str | None, seed: int) -> Mixing:
    name = "random-regular"
    d = regular_degree(name, arg, 4, "D", n)
    return _first_connected(lambda s: nx.random_regular_graph(d, n, seed=s), f"{name}:{d}", n, seed, "D")


def _first_connected(draw, spec: str, n: int, seed: int, knob: str) -> Mixing:
    """Metropolis–Hastings weights of the first connected graph draw(s) of the seeds s of attempts
    0, 1, ... of the ``graph`` stream."""
    for attempt in range(_MAX_TRIES):
        g = draw(stream_seed("graph", seed, attempt))
        if nx.is_connected(g):
            return metropolis_hastings(g, n)
    raise TopologyError(
        f"topology '{spec}' gave no connected graph for n = {n} in {_MAX_TRIES} draws "
        f"(topology_seed {seed}); use a larger {knob}"
    )


def _erdos_renyi_size(n: int, param: str | None) -> tuple[float, float, int]:
    q = _edge_probability(param)  # slots: 1 + the largest degree, about Q·n + a few standard deviations
    return n * min(n, 2 + q * n + 4 * math.sqrt(q * n)), q * n * (n - 1) / 2, n


@TOPOLOGIES.register("erdos-renyi", spec="erdos-renyi[:Q]", takes="optional",
                     help="G(n, Q) redrawn until connected (default Q = 0.3), Metropolis–Hastings weights",
                     size=_erdos_renyi_size)
def _erdos_renyi(n: int, arg: str | None, seed: int) -> Mixing:
    q = _edge_probability(arg)
    return _first_connected(lambda s: nx.erdos_renyi_graph(n, q, seed=s), f"erdos-renyi:{q}", n, seed, "Q")


def _edge_probability(arg: str | None) -> float:
    """Q of ``erdos-renyi[:Q]`` (default 0.3)."""
    if arg is None:
        return 0.3
    try:
        q = float(arg)
    except ValueError:
        raise TopologyError(f"topology 'erdos-renyi' takes an edge probability Q in (0, 1], "
                            f"got '{short(arg)}'") from None
    if not (0.0 < q <= 1.0):
        raise TopologyError(f"topology 'erdos-renyi' needs edge probability 0 < Q <= 1, got Q = {q}")
    return q


def _edges_size(n: int, path: str) -> tuple[float, float, int]:
    edges = os.path.getsize(path) // 4 if os.path.isfile(path) else 0  # a line "i j" takes at least 4 bytes
    return n + 2 * edges, edges, n


@TOPOLOGIES.register("edges", spec="edges:FILE", takes="required",
                     help="any graph from an edge list: 'i j' undirected (Metropolis–Hastings weights), "
                          "'i -> j' directed (push-sum weights, for sgp)", size=_edges_size)
def _edges(n: int, path: str, seed: int) -> Mixing:
    """Edge list: one 'i j' (undirected) or 'i -> j' (i sends to j) per line; '#' comments and
    blank lines allowed. Self-loops are ignored (the self weight is implied); duplicate edges
    count once. Without directed edges the graph must be connected and gets Metropolis–Hastings
    weights; with them it gets push-sum weights (:func:`_push_sum`), column-stochastic.
    """
    name = "edges"
    if not os.path.isfile(path):
        raise TopologyError(f"topology '{name}': edge file '{short(path)}' not found")
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    directed = False
    try:
        with open(path, "rb") as fh:
            text = fh.read().decode("utf-8")
    except UnicodeDecodeError:
        raise TopologyError(f"topology '{name}': edge file '{short(path)}' is not UTF-8 text") from None
    except OSError as e:
        raise TopologyError(f"topology '{name}': edge file '{short(path)}' cannot be read ({e.strerror})") from None
    if "\x00" in text:
        raise TopologyError(f"topology '{name}': edge file '{short(path)}' is binary, not an edge list")
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].replace("->", " -> ").strip()
        if not line:
            continue
        parts = line.split()
        arrow = len(parts) == 3 and parts[1] == "->"
        try:
            if len(parts) != 2 and not arrow:
                raise ValueError
            i, j = int(parts[0]), int(parts[-1])
        except ValueError:
            raise TopologyError(
                f"topology '{name}': {short(path)} line {lineno}: expected two integers 'i j' or 'i -> j', "
                f"got '{short(raw.strip())}'"
            ) from None
        for v in (i, j):
            if not 0 <= v < n:
                raise TopologyError(
                    f"topology '{name}': {short(path)} line {lineno}: node {v} out of range "
                    f"0..{n - 1}"
                )
        if i != j:
            directed |= arrow
            g.add_edges_from([(i, j)] if arrow else [(i, j), (j, i)])
    if directed:
        return _push_sum(g, n)
    g = g.to_undirected()
    if not nx.is_connected(g):
        k = nx.number_connected_components(g)
        raise TopologyError(
            f"topology '{name}': graph in {short(path)} is not connected on n = {n} nodes "
            f"({k} components)"
        )
    return metropolis_hastings(g, n)


def _check_stochastic(m: Mixing, name: str, t: int = 0) -> bool:
    """Raise TopologyError unless W >= 0 with columns summing to 1 (tol 1e-12): every worker sends
    out all of its mass. Returns whether the rows sum to 1 too (W doubly stochastic). From the
    slot form (no n×n matrix)."""
    w = m.weight
    if not np.all(np.isfinite(w)):
        raise TopologyError(f"topology '{name}': W_{t} has non-finite entries")
    if (w < -_TOL).any():
        raise TopologyError(f"topology '{name}': W_{t} has negative entries (min {w.min():g})")
    rows = np.abs(w.sum(axis=0) - 1).max(initial=0.0)
    cols = np.abs(np.bincount(m.index.ravel(), weights=w.ravel(), minlength=m.n) - 1).max(initial=0.0)
    if cols > _TOL:
        raise TopologyError(
            f"topology '{name}': W_{t} is not column stochastic "
            f"(max column error {cols:.3g}, row error {rows:.3g})"
        )
    return bool(rows <= _TOL)


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
    _check_fits(f"building topology '{short(spec)}'", n, lambda k: graph_bytes(spec, k, rounds))
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
DENSE_BYTES = 80  # per entry of the n×n matrices of a directed topology's spectrum (W_t, their product, eigenvectors)


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


def _check_fits(what: str, n: int, need: Callable[[int], int]) -> None:
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


# --------------------------------------------------------------------------- analysis


def _norm_minus_mean(mixings: tuple[Mixing, ...]) -> float:
    """‖W_{P−1} ⋯ W_0 − J‖₂ (:func:`~gossamer.mixing.norm_minus_mean`), dense up to this module's DENSE_MAX."""
    return norm_minus_mean(mixings, DENSE_MAX)


def _log_norm_minus_mean(mixings: tuple[Mixing, ...]) -> float:
    """ln ‖Π_t (W_t − J)‖₂ over many rounds of doubly stochastic W_t (dense, n ≤ DENSE_MAX): the
    product is taken on the mean-free part and rescaled after every round, so that a long product
    of contractions neither underflows nor drowns in the rounding of W − J; −inf once a round
    leaves nothing (an exact average)."""
    n = mixings[0].n
    P = (np.eye(n) - 1.0 / n) / math.sqrt(n - 1)  # ‖I − J‖_F = √(n − 1)
    log = 0.5 * math.log(n - 1)
    for m in mixings:
        P = m.sparse() @ P
        P -= P.mean(0, keepdims=True)  # (W − J) P = W P − J P; 1ᵀP = 0 up to rounding
        size = float(np.linalg.norm(P))
        if size <= _TOL:
            return -math.inf
        log += math.log(size)
        P /= size
    return log + math.log(float(np.linalg.norm(P, 2)))


def _norm_minus_limit(mixings: tuple[Mixing, ...]) -> float:
    """‖W_{P−1} ⋯ W_0 − π1ᵀ‖₂ for column-stochastic W (dense): π the Perron vector of the product,
    P π = π with Σπ = 1, the limit of its powers that push-sum divides out."""
    n = mixings[0].n
    prod = np.eye(n)
    for m in mixings:
        prod = m.dense() @ prod
    values, vectors = np.linalg.eig(prod)
    pi = np.real(vectors[:, np.argmin(np.abs(values - 1))])
    return float(np.linalg.norm(prod - np.outer(pi / pi.sum(), np.ones(n)), 2))


def spectral_gap(topology: Topology) -> float:
    """rho = 1 - ||W_{P-1} ... W_0 - J||_2^(1/P), clipped to [0, 1]. J = 11^T/n, the limit of the
    products of doubly stochastic W; for a directed topology J = pi 1^T (:func:`_norm_minus_limit`).
    A random topology's is the empirical one over its P sampled rounds (``topology.period``)."""
    if topology.n == 1:
        return 1.0
    if topology.random and topology.n <= DENSE_MAX:
        log = _log_norm_minus_mean(topology.mixings)
        return float(min(1.0, max(0.0, 1.0 - math.exp(log / topology.period))))
    if not topology.doubly_stochastic:
        _check_fits(f"the spectral gap of directed topology '{short(topology.name)}' (dense)", topology.n,
                    lambda n: DENSE_BYTES * n * n)
    norm = _norm_minus_mean if topology.doubly_stochastic else _norm_minus_limit
    rho = 1.0 - norm(topology.mixings) ** (1.0 / topology.period)
    return float(min(1.0, max(0.0, rho)))


DECAY = 0.95  # γ of the effective number of neighbours: noise is averaged over about 1/(1 − γ) = 20 rounds


def _check_decay(decay: float) -> float:
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 <= decay < 1.0:
        raise TopologyError(f"the decay γ of the effective number of neighbours must be in [0, 1), got {decay!r}")
    return float(decay)


def _circulant_spectra(topology: Topology) -> np.ndarray | None:
    """|λ_{t,m}|² [P, n − 1] of the rounds' circulant W_t off the mean mode (None unless all are)."""
    spectra = [m.spectrum for m in topology.mixings]
    if any(s is None for s in spectra):
        return None
    return np.abs(np.stack(spectra))[:, 1:] ** 2


def expected_contraction(topology: Topology) -> float | None:
    """‖E_t[(W_t − J)ᵀ(W_t − J)]‖₂: the factor 1 − p by which a round shrinks the disagreement in
    expectation, E‖X W_t − X̄‖²_F ≤ (1 − p)‖X − X̄‖²_F (Koloskova et al. 2020's assumption on
    random and time-varying W_t). E is the mean over the period; for a static W it is
    ‖W − J‖₂² = (1 − ρ)². For a random topology it is estimated from its sampled rounds, averaged
    over the relabellings that leave the law of W_t unchanged (:func:`_random_modes`); it is 1
    for a one-peer round taken alone (some mode stays unmixed), yet below 1 in expectation. None
    for a directed topology (its limit is not J)."""
    n = topology.n
    if not topology.doubly_stochastic:
        return None
    if n == 1:
        return 0.0
    if topology.period == 1 and not topology.random:
        return (1.0 - spectral_gap(topology)) ** 2
    if topology.random and topology.symmetry is not None:
        modes = _random_modes(topology)
        if modes is None:
            return None
        return float(modes if np.isscalar(modes) else modes.sum(0).max())  # E[WᵀW] − J: column sums of K
    squares = _circulant_spectra(topology)
    if squares is not None:
        return float(squares.mean(0).max())
    mean = sum(m.sparse().T @ m.sparse() for m in topology.mixings) / topology.period
    if n <= DENSE_MAX:
        return float(max(0.0, np.linalg.eigvalsh(mean.toarray() - 1.0 / n)[-1]))
    from scipy.sparse.linalg import LinearOperator, eigsh

    def apply(x):
        x = np.asarray(x, dtype=np.float64).reshape(n, -1)
        x = x - x.mean(0, keepdims=True)
        y = mean @ x
        return y - y.mean(0, keepdims=True)
    op = LinearOperator((n, n), matvec=apply, dtype=np.float64)
    start = np.random.default_rng(0).standard_normal(n)
    return float(max(0.0, eigsh(op, k=1, which="LA", return_eigenvectors=False, v0=start)[0]))


def _random_modes(topology: Topology) -> float | np.ndarray | None:
    """What a random topology's symmetry makes of the expectations over its sampled rounds.

    "exchangeable" (the law of W_t is invariant under every relabelling): E[(W − J)ᵀ(W − J)] and
    E[(W − J)(W − J)ᵀ] commute with every permutation, so both are c (I − J) with
    c = E‖W_t − J‖²_F / (n − 1); returns c, estimated from the sample's Frobenius
    norms (exact for a random matching, whose every round has the same norm).
    "cyclic" (invariant under the rotations i → i + c): in the Fourier basis f_m of the
    rotations, A_t = F* W_t F, returns K with K[m', m] = E|A_t[m', m]|² over the sample,
    on the modes m, m' ≠ 0: E[W D Wᵀ] for a circulant D = F diag(δ) F* is circulant with
    eigenvalues K δ, and E[Wᵀ W] − J has eigenvalues the column sums of K (dense: None for
    n > DENSE_MAX)."""
    n, sample = topology.n, topology.mixings
    if topology.symmetry == "exchangeable":
        squares = [float((m.sparse().data ** 2).sum()) for m in sample]  # csr sums duplicate slots
        return float(np.mean(squares) - 1.0) / (n - 1)
    if topology.symmetry == "cyclic":
        if n > DENSE_MAX:
            return None
        K = np.zeros((n - 1, n - 1))
        for m in sample:
            A = np.fft.ifft(np.fft.fft(m.dense(), axis=1), axis=0)  # F* W F, F_jm = exp(−2πi jm/n)/√n
            K += np.abs(A[1:, 1:]) ** 2
        return K / len(sample)
    raise ValueError(f"unknown symmetry {topology.symmetry!r}")


def effective_neighbours(topology: Topology, decay: float = DECAY) -> float | None:
    """Vogels, Hendrikx, Jaggi's effective number of neighbours n_W(γ) (NeurIPS 2022, "Beyond
    spectral gap"), in its learning-rate-free form: in the random walk x ← W_t (√γ x + ξ_t), one
    scalar per worker and ξ_t i.i.d. standard normal noise, a worker's model averages the noise
    of the last ~1/(1 − γ) rounds; alone (W = I) its variance is 1/(1 − γ), with the exact
    average 1/(n(1 − γ)). n_W(γ) = (1/(1 − γ)) / (mean over workers of its stationary variance):
    how many workers' noise a model averages, 1 for I, n for J (for every γ), in between for a
    graph; higher means a worker's model is closer to the average over the horizon. γ ∈ [0, 1)
    is the decay: small learning rates correspond to γ near 1 (where every connected graph tends
    to n), large ones to small γ (where only the direct neighbours count).

    Computed as n / (1 + (1 − γ)·tr D), D the covariance's part off the mean mode, which follows
    D ← γ W D Wᵀ + W Wᵀ − J: in closed form per Fourier mode for circulant W_t (static or
    periodic: ring, exponential graphs, any n), from the eigenvalues for a static symmetric W,
    else by iterating D to its stationary cycle (periodic W_t: the mean over the phases of the
    period). For a random topology, E[D] over the law of W_t from its symmetry
    (:func:`_random_modes`): exchangeable, E[D] = d (I − J) with d = c / (1 − γc); invariant under
    rotations, E[D] circulant with eigenvalues δ = (I − γK)⁻¹ K 1 — estimates from the sampled
    rounds; without a symmetry, by iterating D along drawn rounds (a burn-in of ln 10⁻⁸ / ln γ
    rounds, then the mean over as many rounds as the sample). None for a directed topology, and
    for graphs that are not circulant with n > DENSE_MAX."""
    gamma = _check_decay(decay)
    n = topology.n
    if not topology.doubly_stochastic:
        return None
    if n == 1:
        return 1.0
    if topology.random and topology.symmetry is not None:
        modes = _random_modes(topology)
        if modes is None:
            return None
        if np.isscalar(modes):  # exchangeable: E[D] = d (I − J), d = γ c d + c
            return n / (1 + (1 - gamma) * (n - 1) * modes / (1 - gamma * modes))
        # cyclic: E[D] circulant with eigenvalues δ = γ K δ + K 1 (E[W Wᵀ] − J has eigenvalues K 1)
        delta = np.linalg.solve(np.eye(n - 1) - gamma * modes, modes.sum(1))
        return n / (1 + (1 - gamma) * float(delta.sum()))
    squares = None if topology.random else _circulant_spectra(topology)
    if squares is not None:  # per mode m: d ← |λ_{t,m}|² (γ d + 1)
        shrink, offset = np.ones(n - 1), np.zeros(n - 1)
        for a in squares:  # one period as one affine map d ← shrink·d + offset
            shrink, offset = a * gamma * shrink, a * (gamma * offset + 1)
        d, total = offset / (1 - shrink), 0.0
        for a in squares:
            d = a * (gamma * d + 1)
            total += float(d.sum())
        return n / (1 + (1 - gamma) * total / len(squares))
    if n > DENSE_MAX:
        return None
    if topology.period == 1 and not topology.random:
        w = topology.mixings[0].dense()
        if np.allclose(w, w.T, rtol=0, atol=_TOL):
            mu = np.linalg.eigvalsh(w - 1.0 / n) ** 2
            return n / (1 + (1 - gamma) * float((mu / (1 - gamma * mu)).sum()))
    return n / (1 + (1 - gamma) * _iterated_trace(topology, gamma))


def _iterated_trace(topology: Topology, gamma: float) -> float:
    """tr D of :func:`effective_neighbours` by iterating D ← γ W_t D W_tᵀ + W_t W_tᵀ − J from 0."""
    n, P = topology.n, topology.period
    D = np.zeros((n, n))

    def step(m: Mixing) -> float:
        nonlocal D
        w = m.sparse()
        WD = w @ D
        D = gamma * (w @ WD.T).T + (w @ w.T).toarray() - 1.0 / n
        D = (D + D.T) / 2
        return float(np.trace(D))
    burn = 0 if gamma == 0 else min(100_000, math.ceil(math.log(1e-8) / math.log(gamma)))
    if topology.random:
        for t in range(burn):
            step(topology.mixing(t))
        return float(np.mean([step(topology.mixing(t)) for t in range(burn, burn + P)]))
    previous = None
    for cycle in range(burn // P + 2):  # the stationary cycle: D after a period stops changing
        traces = [step(m) for m in topology.mixings]
        if previous is not None and abs(traces[-1] - previous) <= 1e-12 * (1 + abs(previous)):
            break
        previous = traces[-1]
    return float(np.mean(traces))


def analyse(topology: Topology, decay: float = DECAY) -> dict:
    """Summary: the kind (static, time-varying or random), spectral gap rho over ``gap_rounds``
    rounds (1, the period, or a random topology's sampled rounds: the empirical gap),
    p = 1 - (1 - rho)^2, rounds to halve the slowest mode ln 2 / (-ln(1 - rho)) (0 if rho = 1,
    inf if rho = 0), mean messages per worker per round over those rounds, the expected
    contraction E‖W_t − J‖² (:func:`expected_contraction`) and the effective number of neighbours
    at decay γ (:func:`effective_neighbours`)."""
    gamma = _check_decay(decay)
    rho = spectral_gap(topology)
    if rho >= 1.0:
        halve = 0.0
    elif rho <= 0.0:
        halve = float("inf")
    else:
        halve = math.log(2.0) / -math.log1p(-rho)
    msgs = float(np.mean([m.messages_per_worker for m in topology.mixings]))
    return {
        "name": topology.name,
        "n": topology.n,
        "kind": topology.kind,
        "spectral_gap": rho,
        "gap_rounds": topology.period,
        "p": 1.0 - (1.0 - rho) ** 2,
        "period": None if topology.random else topology.period,
        "rounds_to_halve": halve,
        "messages_per_worker": msgs,
        "expected_contraction": expected_contraction(topology),
        "effective_neighbours": effective_neighbours(topology, gamma),
        "decay": gamma,
    }


from . import topology_dynamic  # noqa: E402,F401  (registers the per-round random and finite-time topologies)
