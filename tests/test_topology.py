import ast
import inspect
import math
from pathlib import Path

import networkx as nx
import numpy as np
import pytest

from gossamer import topology as topology_package
from gossamer.rng import stream_seed
from gossamer.topology import (
    TOPOLOGIES,
    Mixing,
    Topology,
    TopologyError,
    analyse,
    build_topology,
    graph_bytes,
    metropolis_hastings,
    spectral_gap,
)
from gossamer.topology.build import _check_stochastic

NS = [1, 2, 4, 8, 9, 16, 25, 32]


def _allowed(spec, n):
    base = spec.split(":")[0]
    if base == "torus":
        return n in (9, 16, 25, 32)  # 32 = 4·8
    if base == "one-peer-exponential":
        return n & (n - 1) == 0
    if base == "random-regular":
        d = int(spec.split(":")[1]) if ":" in spec else 4
        return n > d and n * d % 2 == 0
    return True


SPECS = [
    "complete",
    "ring",
    "torus",
    "exponential",
    "one-peer-exponential",
    "random-regular",
    "random-regular:3",
    "erdos-renyi",
    "erdos-renyi:0.5",
]
CASES = [(s, n) for s in SPECS for n in NS if _allowed(s, n)]


def _ring_gap(n):
    return 1 - (1 + 2 * math.cos(2 * math.pi / n)) / 3


def test_names():
    assert TOPOLOGIES.names()[:2] == ["complete", "ring"]
    assert "edges" in TOPOLOGIES and "one-peer-exponential" in TOPOLOGIES


@pytest.mark.parametrize("spec,n", CASES)
def test_doubly_stochastic_and_slots(spec, n):
    rng = np.random.default_rng(n)
    topo = build_topology(spec, n, seed=1)
    assert topo.name == spec and topo.n == n
    x = rng.standard_normal((n, 3))
    for t in range(2 * topo.period + 1):
        m = topo.mixing(t)
        assert m.index.dtype == np.int64 and m.weight.dtype == np.float64
        assert m.index.shape == m.weight.shape and m.index.shape[1] == n
        assert np.array_equal(m.index[0], np.arange(n))  # slot 0 is self
        w = topo.matrix(t)
        assert w.shape == (n, n)
        assert (w >= 0).all()
        np.testing.assert_allclose(w.sum(0), 1, atol=1e-12)
        np.testing.assert_allclose(w.sum(1), 1, atol=1e-12)
        slot = (m.weight[..., None] * x[m.index]).sum(0)
        np.testing.assert_allclose(slot, w @ x, atol=1e-12)
    rho = spectral_gap(topo)
    assert 0 <= rho <= 1
    a = analyse(topo)
    assert set(a) == {"name", "n", "kind", "spectral_gap", "gap_rounds", "p", "period", "rounds_to_halve",
                      "messages_per_worker", "expected_contraction", "effective_neighbours", "decay"}
    assert a["p"] == pytest.approx(1 - (1 - rho) ** 2)
    assert a["gap_rounds"] == a["period"] == topo.period
    assert 1 - 1e-9 <= a["effective_neighbours"] <= n + 1e-9 and 0 <= a["expected_contraction"] <= 1 + 1e-12


def test_small_ring():
    np.testing.assert_allclose(build_topology("ring", 1).matrix(0), [[1.0]])
    np.testing.assert_allclose(build_topology("ring", 2).matrix(0),
                               [[1 / 3, 2 / 3], [2 / 3, 1 / 3]], atol=1e-15)


def test_ring_gap_closed_form():
    for n in range(3, 71):
        assert spectral_gap(build_topology("ring", n)) == pytest.approx(_ring_gap(n), abs=1e-10)
    assert abs(spectral_gap(build_topology("ring", 64)) - 0.0032102) < 1e-6
    for n, r in [(16, 13.3), (32, 53.8), (64, 215.6)]:
        assert analyse(build_topology("ring", n))["rounds_to_halve"] == pytest.approx(r, abs=0.06)


def test_one_peer_exponential_exact_average():
    rng = np.random.default_rng(0)
    for n in [2, 4, 8, 16, 32]:
        topo = build_topology("one-peer-exponential", n)
        assert topo.period == int(math.log2(n))
        prod = np.eye(n)
        x = rng.standard_normal((n, 5))
        y = x.copy()
        for t in range(topo.period):
            prod = topo.matrix(t) @ prod
            m = topo.mixing(t)
            y = (m.weight[..., None] * y[m.index]).sum(0)
        np.testing.assert_allclose(prod, np.full((n, n), 1 / n), atol=1e-15)
        np.testing.assert_allclose(y, np.broadcast_to(x.mean(0), y.shape), atol=1e-12)
        assert spectral_gap(topo) == 1.0
        assert analyse(topo)["messages_per_worker"] == 1.0
        assert analyse(topo)["rounds_to_halve"] == 0.0
    # period log2 n, hop 2^k at step k
    w = build_topology("one-peer-exponential", 8).matrix(2)
    assert w[1, 5] == 0.5 and w[1, 1] == 0.5
    assert build_topology("one-peer-exponential", 1).period == 1


def test_static_exponential():
    for n in [2, 5, 8, 12, 16, 33]:
        w = build_topology("exponential", n).matrix(0)
        np.testing.assert_allclose(w, w.T)
        deg = (w[0] > 0).sum() - 1
        hops = {(s * (1 << k)) % n for k in range(int(math.floor(math.log2(n - 1))) + 1)
                for s in (1, -1)} - {0}
        assert deg == len(hops)
        np.testing.assert_allclose(w[w > 0], 1 / (deg + 1))
    # n = 8: hops ±1, ±2, ±4 -> neighbours 1, 2, 4, 6, 7
    assert set(np.flatnonzero(build_topology("exponential", 8).matrix(0)[0])) == {0, 1, 2, 4, 6, 7}


def test_complete():
    for n in [1, 2, 5, 16]:
        topo = build_topology("complete", n)
        np.testing.assert_allclose(topo.matrix(0), np.full((n, n), 1 / n))
        assert spectral_gap(topo) == pytest.approx(1.0)
        assert analyse(topo)["messages_per_worker"] == n - 1


def test_ring_messages():
    assert analyse(build_topology("ring", 16))["messages_per_worker"] == 2
    assert build_topology("ring", 2).mixing(0).messages_per_worker == 1


@pytest.mark.parametrize("a,b", [(3, 3), (4, 4), (3, 5)])
def test_torus_gap(a, b):
    n = a * b
    lam = max(abs(1 + 2 * math.cos(2 * math.pi * k / a) + 2 * math.cos(2 * math.pi * l / b)) / 5
              for k in range(a) for l in range(b) if (k, l) != (0, 0))
    topo = build_topology("torus", n)
    assert spectral_gap(topo) == pytest.approx(1 - lam, abs=1e-10)
    w = topo.matrix(0)
    np.testing.assert_allclose(w, w.T)
    assert ((w > 0).sum(1) == 5).all()


def test_torus_most_square():
    # 36 = 6·6, not 3·12 or 4·9: each node's neighbours are ±1 and ±6
    w = build_topology("torus", 36).matrix(0)
    assert set(np.flatnonzero(w[0])) == {0, 1, 5, 6, 30}


def test_edges_path_mh(tmp_path):
    f = tmp_path / "path.txt"
    f.write_text("# a path\n0 1\n\n1  2   # comment\n2\t3\n3 3\n1 0\n")
    topo = build_topology(f"edges:{f}", 4)
    assert topo.name == f"edges:{f}"
    expected = np.array([
        [2 / 3, 1 / 3, 0, 0],
        [1 / 3, 1 / 3, 1 / 3, 0],
        [0, 1 / 3, 1 / 3, 1 / 3],
        [0, 0, 1 / 3, 2 / 3],
    ])
    np.testing.assert_allclose(topo.matrix(0), expected, atol=1e-15)
    assert topo.mixing(0).index.shape == (3, 4)  # K = 1 + max degree


def test_edges_star_mh(tmp_path):
    f = tmp_path / "star.txt"
    f.write_text("0 1\n0 2\n0 3\n")
    w = build_topology(f"edges:{f}", 4).matrix(0)
    np.testing.assert_allclose(w[0], [1 / 4] * 4)
    np.testing.assert_allclose(w[1], [1 / 4, 3 / 4, 0, 0])
    m = build_topology(f"edges:{f}", 4).mixing(0)
    assert m.index.shape == (4, 4)
    assert (m.weight[2:, 1] == 0).all() and (m.index[2:, 1] == 1).all()  # padding


def test_random_graphs_deterministic():
    for spec in ["random-regular", "random-regular:3", "erdos-renyi", "erdos-renyi:0.5"]:
        a = build_topology(spec, 16, seed=1).matrix(0)
        b = build_topology(spec, 16, seed=1).matrix(0)
        c = build_topology(spec, 16, seed=2).matrix(0)
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, c)
    # a disconnected draw is redrawn with the next attempt of the graph stream
    retried = 0
    for seed in range(20):
        attempt = next(a for a in range(100) if nx.is_connected(nx.erdos_renyi_graph(16, 0.3, seed=stream_seed("graph", seed, a))))
        retried += attempt > 0
        graph = nx.erdos_renyi_graph(16, 0.3, seed=stream_seed("graph", seed, attempt))
        np.testing.assert_array_equal(build_topology("erdos-renyi", 16, seed=seed).matrix(0),
                                      metropolis_hastings(graph, 16).dense())
    assert retried  # the retry was exercised
    w = build_topology("random-regular:3", 16).matrix(0)
    assert ((w > 0).sum(1) == 4).all()
    np.testing.assert_allclose(w[(w > 0) & ~np.eye(16, dtype=bool)], 1 / 4)


def _raises(spec, n, *words, seed=0):
    with pytest.raises(TopologyError) as e:
        build_topology(spec, n, seed=seed)
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg
    return msg


def test_errors(tmp_path):
    msg = _raises("foo", 8, "unknown topology 'foo'", "complete", "ring", "edges:FILE")
    assert msg.startswith("unknown topology 'foo'; choose one of: complete, ring")
    _raises("torus", 13, "'torus'", "n = 13", "a, b >= 3")
    _raises("torus", 14, "'torus'", "n = 14")
    _raises("torus", 4, "'torus'", "n = 4")
    _raises("one-peer-exponential", 12, "'one-peer-exponential'", "power of two", "n = 12")
    _raises("random-regular:x", 8, "'random-regular'", "'x'")
    _raises("random-regular:3", 9, "'random-regular'", "even")
    _raises("random-regular:8", 8, "'random-regular'", "D < n")
    _raises("random-regular:0", 8, "'random-regular'")
    _raises("random-regular:1", 8, "'random-regular", "connected")
    _raises("erdos-renyi:x", 8, "'erdos-renyi'", "'x'")
    _raises("erdos-renyi:0", 8, "'erdos-renyi'", "0 < Q <= 1")
    _raises("erdos-renyi:1.5", 8, "'erdos-renyi'")
    _raises("erdos-renyi:0.01", 30, "'erdos-renyi", "connected")
    _raises("ring:3", 8, "'ring'", "no parameter")
    _raises("complete:1", 8, "'complete'")
    _raises("ring", 0, "n >= 1")
    _raises("ring", -3, "n >= 1")
    _raises("edges", 4, "'edges'", "edges:FILE")
    _raises(f"edges:{tmp_path / 'nope.txt'}", 4, "'edges'", "not found")
    for name, text, fragments in [
        ("bad", "0 1\n1 x\n", ("line 2",)),
        ("three", "0 1 2\n", ("line 1",)),
        ("range", "0 1\n1 4\n", ("line 2", "out of range")),
        ("neg", "0 -1\n", ("out of range",)),
        ("disc", "0 1\n2 3\n", ("not connected",)),
        ("iso", "0 1\n1 2\n", ("not connected",)),
    ]:
        edges = tmp_path / f"{name}.txt"
        edges.write_text(text)
        _raises(f"edges:{edges}", 4, "'edges'", *fragments)


def test_check_stochastic():
    swap = np.array([[0, 1], [1, 0]])  # slot 0 self, slot 1 the other worker
    assert _check_stochastic(Mixing(np.arange(3)[None], np.ones((1, 3))), "x") is True
    # W = [[0.5, 0], [0.5, 1]]: worker 0 sends half to 1; columns sum to 1, rows to 0.5 and 1.5
    assert _check_stochastic(Mixing(swap, np.array([[0.5, 1.0], [0.0, 0.5]])), "x") is False
    with pytest.raises(TopologyError, match="'x'.*not column stochastic"):
        _check_stochastic(Mixing(swap, np.array([[0.5, 0.6], [0.5, 0.4]])), "x")  # columns 1.1, 0.9
    with pytest.raises(TopologyError, match="negative"):
        _check_stochastic(Mixing(swap, np.array([[1.5, 1.5], [-0.5, -0.5]])), "x")


@pytest.mark.parametrize("spec, n", [("ring", 16), ("exponential", 12), ("one-peer-exponential", 16),
                                     ("complete", 9), ("ring", 1)])
def test_circulant_spectra_in_closed_form_equal_the_dense_ones(spec, n):
    topo = build_topology(spec, n)
    assert all(m.spectrum is not None for m in topo.mixings) or n == 1
    prod = np.eye(n)
    for m in topo.mixings:
        prod = m.dense() @ prod
    dense_gap = 1 - np.linalg.norm(prod - 1 / n, 2) ** (1 / topo.period) if n > 1 else 1.0
    assert spectral_gap(topo) == pytest.approx(min(1.0, max(0.0, dense_gap)), abs=1e-12)
    for m in topo.mixings:
        assert m.p == pytest.approx(1 - np.linalg.norm(m.dense() - 1 / n, 2) ** 2 if n > 1 else 1.0, abs=1e-12)


def test_graphs_that_are_not_circulant_use_a_sparse_iteration_for_large_n(monkeypatch):
    from gossamer.topology import analysis

    for spec in ("torus", "random-regular:3"):
        topo = build_topology(spec, 36, seed=2)
        assert topo.mixing(0).spectrum is None
        dense = spectral_gap(topo)
        monkeypatch.setattr(analysis, "DENSE_MAX", 8)
        assert spectral_gap(topo) == pytest.approx(dense, abs=1e-9)
        monkeypatch.undo()


def test_a_ring_of_100000_workers_needs_no_dense_matrix():
    """Its n×n matrix would take 80 GB: the closed form and the slot-form checks must serve."""
    topo = build_topology("ring", 100_000)
    assert analyse(topo)["spectral_gap"] == pytest.approx(_ring_gap(100_000), rel=1e-6)
    assert topo.mixing(0).messages_per_worker == 2


def test_time_varying_gap_and_analyse():
    # A custom time-varying topology: the gap uses the product over one period.
    ring = build_topology("ring", 8)
    comp = build_topology("complete", 8)
    topo = Topology("mix", 8, (ring.mixing(0), comp.mixing(0)))
    assert topo.period == 2 and topo.mixing(3) is comp.mixing(0)
    assert spectral_gap(topo) == pytest.approx(1.0)
    two_rings = Topology("rr", 8, (ring.mixing(0), ring.mixing(0)))
    assert spectral_gap(two_rings) == pytest.approx(spectral_gap(ring), abs=1e-12)
    a = analyse(topo)
    assert a["period"] == 2 and a["messages_per_worker"] == pytest.approx((2 + 7) / 2)
    ident = Topology("id", 4, (Mixing(np.arange(4)[None], np.ones((1, 4))),))
    assert spectral_gap(ident) == 0.0
    assert analyse(ident)["rounds_to_halve"] == float("inf")
    one = build_topology("ring", 1)
    assert spectral_gap(one) == 1.0 and analyse(one)["rounds_to_halve"] == 0.0


# ---------------------------------------------------------------- directed graphs and unions


@pytest.mark.parametrize("n", [2, 5, 6, 8, 13])
def test_directed_exponential_sends_half_to_one_peer_at_hop_2_to_the_k(n):
    topo = build_topology("directed-exponential", n)
    hops = [1 << k for k in range((n - 1).bit_length())]  # 2^k <= n - 1
    assert topo.period == len(hops) and topo.doubly_stochastic
    for t, h in enumerate(hops):
        expected = 0.5 * np.eye(n)
        expected[np.arange(n), (np.arange(n) - h) % n] += 0.5  # i receives from i − 2^k
        np.testing.assert_array_equal(topo.matrix(t), expected)
        assert topo.mixing(t).messages_per_worker == 1.0
    assert 0 < spectral_gap(topo) <= 1


def test_union_slots_hold_every_neighbour_of_the_period_and_weights_map_into_them():
    topo = build_topology("one-peer-exponential", 8)
    union = topo.union
    assert union.index.shape == (4, 8) and np.array_equal(union.index[0], np.arange(8))
    assert union.messages_per_worker == 3  # each worker is copied by its 3 in-neighbours of the period
    for t in range(topo.period):
        mixing = topo.mixing(t)
        w = mixing.weights_in(union)
        dense = np.zeros((8, 8))
        np.add.at(dense, (np.broadcast_to(np.arange(8), union.index.shape), union.index), w)
        np.testing.assert_array_equal(dense, mixing.dense())
    ring = build_topology("ring", 8)
    assert ring.union is ring.mixing(0) and ring.mixing(0).weights_in(ring.union) is ring.mixing(0).weight
    with pytest.raises(ValueError, match="outside the given slots"):
        build_topology("complete", 8).mixing(0).weights_in(ring.union)


def test_directed_edges_get_push_sum_weights(tmp_path):
    f = tmp_path / "directed.txt"
    f.write_text("0 -> 1\n0->2\n1 2   # undirected: both ways\n2 -> 0\n")
    topo = build_topology(f"edges:{f}", 3)
    assert not topo.doubly_stochastic
    expected = np.array([[1 / 3, 0, 1 / 3],  # W[i, j] = 1 / (1 + outdeg j): 0 sends to 1, 2; 1 to 2; 2 to 0, 1
                         [1 / 3, 1 / 2, 1 / 3],
                         [1 / 3, 1 / 2, 1 / 3]])
    np.testing.assert_allclose(topo.matrix(0), expected, atol=1e-15)
    assert 0 < spectral_gap(topo) <= 1  # measured against the Perron limit π1ᵀ, not J
    undirected = tmp_path / "undirected.txt"
    undirected.write_text("0 1\n1 2\n")
    assert build_topology(f"edges:{undirected}", 3).doubly_stochastic


def test_directed_graphs_must_be_strongly_connected(tmp_path):
    for name, text, fragment in [("sink", "0 -> 1\n1 -> 2\n0 -> 2\n", "node 2 has no out-edge"),
                                 ("split", "0 -> 1\n1 -> 0\n2 -> 3\n3 -> 2\n1 -> 2\n", "not strongly connected"),
                                 ("arrow", "0 => 1\n", "line 1")]:
        edges = tmp_path / f"{name}.txt"
        edges.write_text(text)
        _raises(f"edges:{edges}", 4, "'edges", fragment)


# graph_bytes(spec, n) at n = 1, 8, 96, 1000, and at n = 96 with a sample of 5 rounds, as computed
# when the sizes were tables in the one module topology.py (SIZES, PER_ROUND), before they moved to the traits
# every topology is registered with. FILE: 200 bytes of edge list.
GRAPH_BYTES = {
    "complete": (96, 6144, 884736, 96000000, 884736),
    "ring": (288, 2304, 27648, 288000, 27648),
    "torus": (480, 3840, 46080, 480000, 46080),
    "exponential": (288, 5376, 138240, 2016000, 138240),
    "one-peer-exponential": (288, 6912, 193536, 2880000, 193536),
    "directed-exponential": (288, 6912, 193536, 2880000, 193536),
    "random-regular": (704, 11008, 132096, 1376000, 132096),
    "random-regular:3": (704, 9216, 110592, 1152000, 110592),
    "erdos-renyi": (480, 11366, 868757, 74388675, 868757),
    "erdos-renyi:0.1": (480, 8686, 374724, 26803200, 374724),
    "edges:FILE": (22880, 26240, 68480, 502400, 68480),
    "random-matching": (6144, 49152, 589824, 6144000, 92160),
    "epidemic:2": (6656, 78848, 946176, 9856000, 199680),
    "equidyn": (6144, 49152, 589824, 6144000, 92160),
    "equidyn:0.5": (6144, 49152, 589824, 6144000, 92160),
    "equistatic": (288, 5376, 138240, 2016000, 138240),
    "equistatic:3": (288, 5376, 64512, 672000, 64512),
    "groups:2": (3072, 49152, 589824, 6144000, 92160),
    "groups:4": (3072, 98304, 1179648, 12288000, 184320),
    "base:1": (1344, 16896, 334908, 4786861, 334908),
    "base:3": (1344, 24576, 427068, 5746861, 427068),
}


def test_every_topology_declares_its_size_and_graph_bytes_keeps_its_numbers(tmp_path):
    assert {spec.split(":")[0] for spec in GRAPH_BYTES} == set(TOPOLOGIES.names())
    assert all(callable(entry.traits.get("size")) for entry in TOPOLOGIES.entries.values())
    assert {e.name for e in TOPOLOGIES.entries.values() if e.traits.get("per_round")} == {
        "random-matching", "epidemic", "equidyn", "groups"}
    edges = tmp_path / "edges.txt"
    edges.write_text("0 1\n1 2\n" * 25)
    for spec, expected in GRAPH_BYTES.items():
        spec = spec.replace("FILE", str(edges))
        got = (*(graph_bytes(spec, n) for n in (1, 8, 96, 1000)), graph_bytes(spec, 96, rounds=5))
        assert got == expected, spec


def test_no_module_of_the_topology_package_imports_a_private_name_of_another():
    """What two modules of ``gossamer.topology`` share is public (with a docstring): no module takes an
    underscore name from a sibling (``from .build import _x``, or the same written absolute)."""
    package = Path(inspect.getfile(topology_package)).parent
    imports = [(path.name, node) for path in sorted(package.glob("*.py"))
               for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
               if isinstance(node, ast.ImportFrom)
               and (node.level == 1 or node.level == 0 and (node.module or "").startswith("gossamer.topology"))]
    assert {name for name, _ in imports} == {"__init__.py", "analysis.py", "build.py", "dynamic.py", "static.py"}
    assert [f"{name}: {alias.name}" for name, node in imports for alias in node.names if alias.name.startswith("_")] == []
