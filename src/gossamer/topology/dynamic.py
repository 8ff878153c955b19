"""Topologies that change every round: per-round random mixing, and finite-time sequences.

Random ones draw W_t from (topology seed, t) alone (:func:`~gossamer.topology.round_generator`):
no state carries from round to round, so every engine and process draws the same W_t and a run
resumed at round r draws the rounds it would have drawn. Every W_t is doubly stochastic and
checked as it is drawn.

- ``random-matching``: a uniformly random perfect matching of the workers each round (one worker
  idles when n is odd); matched pairs average.
- ``epidemic:S``: Epidemic Learning's EL-Oracle (de Vos et al., NeurIPS 2023): a random S-regular
  graph each round, uniform weights 1/(S + 1).
- ``equidyn[:ETA]``: EquiTopo's one-peer undirected dynamic graph, OU-EquiDyn (Song et al.,
  NeurIPS 2022): each round a shift u ∈ {1..n−1} and a start s drawn uniformly; going round the
  workers from s, worker i pairs with i + u when both are free; a pair mixes with weights
  1/n (self) and (n − 1)/n (the other), relaxed by η: W = (1 − η) I + η W_pairs (default η = 0.53,
  the authors' runs).
- ``equistatic[:M]``: EquiTopo's static undirected graph, U-EquiStatic: M shifts u_1..u_M drawn
  once (with replacement) from {1..n−1}, W = I/n + (n − 1)/(2nM) Σ_m (S^{u_m} + S^{−u_m}), S the
  cyclic shift; degree ≤ 2M, default M = ⌈log₂ n⌉ (O(ln n)); circulant, so its spectrum is
  exact.
- ``groups:G``: a fresh random partition of the workers into n/G groups of G each round, exact
  averaging within each group (the round's ``Mixing.groups``); ``groups:n`` is the complete
  graph. Random partitions need never give the exact average (G < n); Moshpit SGD's groups
  follow a d-dimensional grid, so that after d rounds every worker holds it: that is
  ``algorithm: moshpit``, not this topology.
- ``base:K``: the Base-(K+1) graph (Takezawa et al., NeurIPS 2023): a finite sequence of mixing
  matrices, each worker with at most K peers a round, whose product is exactly J = 11ᵀ/n, for
  any n; it repeats with that period (deterministic, no seed).
"""

from __future__ import annotations

import math

import numpy as np

from ..registry import short
from ..rng import host_stream
from .mixing import (
    TOPOLOGIES,
    Mixing,
    RandomRounds,
    TopologyError,
    circulant,
    from_rows,
    identity,
    parse_int,
    regular_degree,
)

# --------------------------------------------------------------------------- random, per round


def _pairs(n: int, first: np.ndarray, second: np.ndarray, self_weight: np.ndarray | float,
           other_weight: np.ndarray | float) -> Mixing:
    """Two slots: worker first[k] paired with second[k] (both ways) with the given weights; the
    workers in no pair keep their model (slot 1 padded with itself, weight 0)."""
    index = np.tile(np.arange(n, dtype=np.int64), (2, 1))
    weight = np.zeros((2, n))
    weight[0] = 1.0
    paired = np.concatenate([first, second])
    index[1, first], index[1, second] = second, first
    weight[0, paired] = self_weight
    weight[1, paired] = other_weight
    return Mixing(index, weight)


def _matching(n: int, rng: np.random.Generator) -> Mixing:
    order = rng.permutation(n)
    half = n // 2
    return _pairs(n, order[0 : 2 * half : 2], order[1 : 2 * half : 2], 0.5, 0.5)


@TOPOLOGIES.register("random-matching", per_round=True, size=lambda n, _: (2 * n, 0, 0),
                     help="random, per round: a uniformly random perfect matching (one idles if n is odd); pairs average")
def _random_matching(n: int, arg: str | None, seed: int) -> RandomRounds:
    return RandomRounds(lambda rng: _matching(n, rng), symmetry="exchangeable")


def _regular(n: int, s: int, rng: np.random.Generator) -> Mixing:
    """A random S-regular graph (networkx's pairing sampler), its workers relabelled by a uniform
    permutation: the law of W_t is then exactly invariant under relabelling."""
    import networkx as nx

    graph = nx.random_regular_graph(s, n, seed=int(rng.integers(2**32)))
    labels = rng.permutation(n)
    graph = nx.relabel_nodes(graph, {v: int(labels[v]) for v in range(n)})
    adjacency = nx.to_scipy_sparse_array(graph, nodelist=range(n), format="csr")
    adjacency.sort_indices()
    index = np.vstack([np.arange(n, dtype=np.int64), adjacency.indices.reshape(n, s).T.astype(np.int64)])
    return Mixing(index, np.full((s + 1, n), 1.0 / (s + 1)))


def _epidemic_size(n: int, param: str | None) -> tuple[float, float, int]:
    s = min(n, max(0, parse_int("epidemic", param, default=0, what="degree S")))
    return (s + 1) * n, n * s / 2, n


@TOPOLOGIES.register("epidemic", spec="epidemic:S", takes="required", example=("2",), per_round=True,
                     size=_epidemic_size,
                     help="random, per round: a random S-regular graph, weights 1/(S+1) (Epidemic Learning's EL-Oracle)")
def _epidemic(n: int, arg: str, seed: int) -> RandomRounds:
    s = regular_degree("epidemic", arg, 0, "S", n)
    return RandomRounds(lambda rng: _regular(n, s, rng), symmetry="exchangeable")


EQUIDYN_ETA = 0.53  # η of EquiTopo's one-peer graphs in the authors' runs


def _eta(arg: str | None) -> float:
    if arg is None:
        return EQUIDYN_ETA
    try:
        eta = float(arg)
    except ValueError:
        raise TopologyError(f"topology 'equidyn' takes a weight η in (0, 1], got '{short(arg)}'") from None
    if not 0.0 < eta <= 1.0:
        raise TopologyError(f"topology 'equidyn' needs 0 < η <= 1, got η = {eta}")
    return eta


def _one_peer_equi(n: int, eta: float, rng: np.random.Generator) -> Mixing:
    shift, start = int(rng.integers(1, n)), int(rng.integers(n))
    free = np.ones(n, dtype=bool)
    first, second = [], []
    for i in [*range(start, n), *range(start)]:
        j = (i + shift) % n
        if free[i] and free[j]:
            free[i] = free[j] = False
            first.append(i)
            second.append(j)
    return _pairs(n, np.array(first, dtype=np.int64), np.array(second, dtype=np.int64),
                  1.0 - eta + eta / n, eta * (n - 1) / n)


@TOPOLOGIES.register("equidyn", spec="equidyn[:ETA]", takes="optional", per_round=True,
                     size=lambda n, _: (2 * n, 0, 0),
                     help=f"random, per round: EquiTopo's one-peer undirected graph OU-EquiDyn, pairs weighted "
                          f"1/n and (n−1)/n, relaxed by η (default {EQUIDYN_ETA})")
def _equidyn(n: int, arg: str | None, seed: int) -> RandomRounds | Mixing:
    eta = _eta(arg)
    if n == 1:
        return identity(1)
    return RandomRounds(lambda rng: _one_peer_equi(n, eta, rng), symmetry="cyclic")


def _equistatic_m(n: int, arg: str | None) -> int:
    m = parse_int("equistatic", arg, default=max(1, math.ceil(math.log2(max(n, 2)))), what="number of shifts M")
    if m < 1:
        raise TopologyError(f"topology 'equistatic' needs M >= 1 shifts, got M = {short(str(m))}")
    if n > 1 and m >= n:  # the theory's M is O(ln n); M ≥ n draws shifts n − 1 values can only repeat
        raise TopologyError(f"topology 'equistatic' needs M < n shifts, got M = {short(str(m))}, n = {n}")
    return m


@TOPOLOGIES.register("equistatic", spec="equistatic[:M]", takes="optional",
                     size=lambda n, param: ((1 + 2 * min(n, _equistatic_m(n, param))) * n, 0, 0),
                     help="static, seeded: EquiTopo's U-EquiStatic, M random shifts ±u_m (default ⌈log₂ n⌉), "
                          "degree ≤ 2M")
def _equistatic(n: int, arg: str | None, seed: int) -> Mixing:
    m = _equistatic_m(n, arg)
    if n == 1:
        return identity(1)
    shifts = host_stream("equistatic", seed).integers(1, n, size=m)
    offsets = [0, *[int(u) for u in shifts], *[int(-u % n) for u in shifts]]
    share = (n - 1) / (2 * n * m)
    return circulant(n, offsets, [1.0 / n] + [share] * (2 * m))


def _groups_size(n: int, arg: str) -> int:
    g = parse_int("groups", arg, default=0, what="group size G")
    if g < 2:
        raise TopologyError(f"topology 'groups' needs groups of G >= 2 workers, got G = {short(str(g))}")
    if n % g:
        raise TopologyError(f"topology 'groups' needs G to divide n, got G = {short(str(g))}, n = {n}")
    return g


def _partition(n: int, g: int, rng: np.random.Generator) -> Mixing:
    """A uniformly random partition into n/g groups of g, each averaged exactly (``Mixing.groups``)."""
    groups = rng.permutation(n).reshape(n // g, g)
    index = np.empty((g, n), dtype=np.int64)
    for k in range(g):  # slot k of the worker at position p of a group: the member at position p + k
        index[k, groups.ravel()] = np.roll(groups, -k, axis=1).ravel()
    return Mixing(index, np.full((g, n), 1.0 / g), groups=groups)


@TOPOLOGIES.register("groups", spec="groups:G", takes="required", example=("2",), per_round=True,
                     size=lambda n, param: (min(n, max(1, parse_int("groups", param, 1, "group size G"))) * n, 0, 0),
                     help="random, per round: a fresh random partition into groups of G (G divides n), exact "
                          "averaging within each; groups:n is the complete graph (Moshpit SGD's grid groups: algorithm moshpit)")
def _groups(n: int, arg: str, seed: int) -> RandomRounds:
    g = _groups_size(n, arg)
    return RandomRounds(lambda rng: _partition(n, g, rng), symmetry="exchangeable")


# --------------------------------------------------------------------------- Base-(K+1), finite time

# A round is {worker: {worker: weight}} for the workers it moves (the others keep their model).


def _factors(m: int, k: int) -> list[int] | None:
    """m as a product of factors in 2..k+1 (greedily the largest first, listed smallest first),
    or None if m has a prime factor above k + 1."""
    factors, rest = [], m
    for f in range(k + 1, 1, -1):
        while rest % f == 0:
            factors.append(f)
            rest //= f
    return factors[::-1] if rest == 1 else None


def _average(round_: dict, group: list[int]) -> None:
    for i in group:
        round_[i] = {j: 1.0 / len(group) for j in group}


def _hypercube(nodes: list[int], k: int) -> list[dict]:
    """The k-peer hyper-hypercube on ``nodes`` (every prime factor of their number ≤ k + 1):
    number them in the mixed radix of the factors f_0, f_1, ...; round l averages exactly each
    group of f_l workers that differ in digit l alone. After the last round every worker holds
    the average."""
    m = len(nodes)
    factors = _factors(m, k)
    if factors is None:
        raise ValueError(f"{m} workers have a prime factor above {k + 1}")
    rounds, stride = [], 1
    for f in factors:
        round_: dict = {}
        for b in range(m):
            if (b // stride) % f == 0:
                _average(round_, [nodes[b + stride * c] for c in range(f)])
        rounds.append(round_)
        stride *= f
    return rounds


def _merge(*parts: list[dict]) -> list[dict]:
    """Round r of the result: round r of every part that has one (their workers are disjoint)."""
    merged = [{} for _ in range(max((len(p) for p in parts), default=0))]
    for part in parts:
        for r, round_ in enumerate(part):
            merged[r].update(round_)
    return merged


def _simple_base(nodes: list[int], k: int) -> list[dict]:
    """The simple Base-(k+1) graph on ``nodes``: exact average after its last round, any number m.

    If m's prime factors are all ≤ k + 1 it is the hyper-hypercube. Else write m in base k + 1,
    m = Σ_l a_l (k+1)^{p_l} (p_0 > p_1 > ..., 1 ≤ a_l ≤ k), and split the workers into
    consecutive groups V_l of a_l (k+1)^{p_l}, each V_l into a_l subsets of (k+1)^{p_l}.
    1. Each V_l averages itself (its hyper-hypercube; all in parallel).
    2. Round t = 0 .. L−2 hands V_t's share on: every worker i of a later group V_l (l > t) pairs
       with one fresh worker j of each subset of V_t, i ← (1 − f) x_i + Σ_j (f/a_t) x_j with
       f = |V_t| / |V_t ∪ V_{t+1} ∪ ...|, and j ← (1 − f/a_t) x_j + (f/a_t) x_i. The later groups
       then hold the same affine mix of their values, whose mean over V_{t+1} ∪ ... is still the
       global average; and each subset of V_t now sums to its size times the global average
       (the later groups number fewer than (k+1)^{p_t}, so the fresh workers suffice).
    3. From round t + 1 on, each subset of V_t averages itself (a hyper-hypercube of p_t rounds,
       in parallel with the hand-overs that follow): all of V_t holds the global average. The
       last group holds it after hand-over L − 2.
    """
    m = len(nodes)
    if m == 1:
        return []
    if _factors(m, k) is not None:
        return _hypercube(nodes, k)
    base = k + 1
    digits, power = [], 0  # (a_l, p_l), the highest power first
    rest = m
    while rest:
        rest, a = divmod(rest, base)
        if a:
            digits.append((a, power))
        power += 1
    digits.reverse()
    groups, start = [], 0
    for a, p in digits:
        size = a * base**p
        groups.append(nodes[start : start + size])
        start += size
    subsets = [[g[s * base**p : (s + 1) * base**p] for s in range(a)] for g, (a, p) in zip(groups, digits)]
    rounds = _merge(*[_hypercube(g, k) for g in groups])
    settle = [_merge(*[_hypercube(s, k) for s in subs]) for subs in subsets]  # step 3 of each group
    first = len(rounds)
    total_after = [sum(len(g) for g in groups[t:]) for t in range(len(groups))]
    handovers = []
    for t in range(len(groups) - 1):
        a = digits[t][0]
        share = len(groups[t]) / total_after[t]
        pools = [list(s) for s in subsets[t]]
        round_: dict = {}
        for later in groups[t + 1 :]:
            for i in later:
                row = {i: 1.0 - share}
                for pool in pools:
                    j = pool.pop()
                    row[j] = share / a
                    round_[j] = {j: 1.0 - share / a, i: share / a}
                round_[i] = row
        handovers.append(round_)
    tail = [{} for _ in range(max(t + 1 + len(settle[t]) for t in range(len(groups) - 1)))]
    for t, round_ in enumerate(handovers):
        tail[t].update(round_)
    for t in range(len(groups) - 1):
        for r, round_ in enumerate(settle[t]):
            tail[t + 1 + r].update(round_)
    return rounds[:first] + tail


def _smooth_part(n: int, k: int) -> int:
    """The largest divisor of n whose prime factors are all ≤ k + 1."""
    smooth, rest = 1, n
    for f in range(2, k + 2):
        while rest % f == 0:
            smooth *= f
            rest //= f
    return smooth


def base_rounds(n: int, k: int) -> list[dict]:
    """The Base-(k+1) graph's rounds for n workers: the simple Base-(k+1) graph on all n, or — when
    n = c·r with c > 1 the part of n whose prime factors are ≤ k + 1 and r > 1 — the simple graph
    on each of c consecutive blocks of r workers at once, then a hyper-hypercube across the
    blocks (workers r apart), whichever is shorter."""
    simple = _simple_base(list(range(n)), k)
    c = _smooth_part(n, k)
    r = n // c
    if c > 1 and r > 1:
        inner = _merge(*[_simple_base(list(range(b * r, (b + 1) * r)), k) for b in range(c)])
        across = _merge(*[_hypercube(list(range(s, n, r)), k) for s in range(r)])
        if len(inner) + len(across) <= len(simple):
            return inner + across
    return simple


def _as_mixing(n: int, round_: dict) -> Mixing:
    return from_rows(n, [round_.get(i, {i: 1.0}) for i in range(n)])


def _base_k(arg: str) -> int:
    k = parse_int("base", arg, default=0, what="peer count K")
    if k < 1:
        raise TopologyError(f"topology 'base' needs K >= 1 peers a round, got K = {short(str(k))}")
    return k


def _base_size(n: int, param: str | None) -> tuple[float, float, int]:
    k = min(n, _base_k(param))
    period = 2 * (math.log(max(n, 2)) / math.log(k + 1) + 2)
    return period * (k + 1) * n + n * (k + 1), 0, 0  # the rounds, and their dict form while built


@TOPOLOGIES.register("base", spec="base:K", takes="required", example=("1",), size=_base_size,
                     help="time-varying, any n: the Base-(K+1) graph, ≤ K peers a round, exact average after "
                          "its period (Takezawa et al.)")
def _base(n: int, arg: str, seed: int) -> tuple[Mixing, ...]:
    k = _base_k(arg)
    rounds = base_rounds(n, k)
    return tuple(_as_mixing(n, r) for r in rounds) or (identity(n),)
