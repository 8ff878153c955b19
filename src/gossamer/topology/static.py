"""The static and periodic graphs: complete, ring, torus, the exponential graphs (static,
one-peer, directed), random-regular and erdos-renyi (seeded, Metropolis–Hastings weights) and any
graph from an edge list (``edges:FILE``: Metropolis–Hastings or push-sum weights). Each registers
its builder ``(n, param, seed) → Mixing`` (or a tuple of them: a period) in
:data:`~gossamer.topology.mixing.TOPOLOGIES`, with its memory ``size``.

Pure numpy + networkx (imported inside the functions that build graphs: it would be a third of the
command line's start after torch's); no torch.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..registry import short
from ..rng import stream_seed
from .mixing import TOPOLOGIES, Mixing, TopologyError, circulant, from_rows, identity, parse_int, regular_degree

if TYPE_CHECKING:
    import networkx as nx

_MAX_TRIES = 100


# --------------------------------------------------------------------------- builders


# The helpers of builders here and in dynamic.py (identity, circulant, from_rows, parse_int,
# regular_degree) live in mixing.py, which both import.


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
    import networkx as nx

    name = "random-regular"
    d = regular_degree(name, arg, 4, "D", n)
    return _first_connected(lambda s: nx.random_regular_graph(d, n, seed=s), f"{name}:{d}", n, seed, "D")


def _first_connected(draw, spec: str, n: int, seed: int, knob: str) -> Mixing:
    """Metropolis–Hastings weights of the first connected graph draw(s) of the seeds s of attempts
    0, 1, ... of the ``graph`` stream."""
    import networkx as nx

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
    import networkx as nx

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
    import networkx as nx

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
