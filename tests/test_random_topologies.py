"""Topologies that change every round (random-matching, epidemic:S, equidyn, groups:G: a fresh
W_t from (topology_seed, t)), EquiTopo's static equistatic, the finite-time base:K, and the
measures `gossamer topology` reports beside the spectral gap: closed forms, double
stochasticity and reproducibility of every round, every algorithm on them, exact resume
mid-sequence, bad input. (sim = dist parity: tests/cases.py ROUND_TOPOLOGY_CASES, in the
4-process launch of tests/test_dist.py.)"""

import dataclasses
import io
import math

import numpy as np
import pytest
import torch
from cases import SHORT
from test_bad_input import one_line_error

from conftest import assert_same_state
from gossamer import topology as topology_module
from gossamer.cli import main
from gossamer.config import load_config
from gossamer.topology import (
    Mixing,
    Topology,
    TopologyError,
    analyse,
    build_topology,
    effective_neighbours,
    expected_contraction,
    spectral_gap,
)
from gossamer.train import build_run, train

RANDOM = ["random-matching", "epidemic:2", "epidemic:3", "equidyn", "equidyn:1", "groups:2", "groups:4"]
NEW = [*RANDOM, "equistatic", "equistatic:2", "base:1", "base:2", "base:3"]


def _fits(spec: str, n: int) -> bool:
    name, _, arg = spec.partition(":")
    if name == "epidemic":
        return int(arg) < n and n * int(arg) % 2 == 0
    if name == "groups":
        return n % int(arg) == 0
    return True


def _doubly_stochastic(w: np.ndarray) -> None:
    assert (w >= 0).all()
    np.testing.assert_allclose(w.sum(0), 1, atol=1e-12)
    np.testing.assert_allclose(w.sum(1), 1, atol=1e-12)


def _product(mixings) -> np.ndarray:
    n = mixings[0].n
    prod = np.eye(n)
    for m in mixings:
        prod = m.dense() @ prod
    return prod


# ---------------------------------------------------------------- closed forms of the graphs


@pytest.mark.parametrize("n", [2, 3, 7, 8, 16])
def test_a_random_matching_averages_pairs_exactly(n):
    topo = build_topology("random-matching", n, seed=5)
    rng = np.random.default_rng(0)
    partners = set()
    for t in range(40):
        w, x = topo.matrix(t), rng.standard_normal((n, 3))
        idle = [i for i in range(n) if w[i, i] == 1.0]
        assert len(idle) == n % 2  # a perfect matching, or one worker idle for odd n
        y = w @ x
        for i in set(range(n)) - set(idle):
            (j,) = [j for j in np.flatnonzero(w[i]) if j != i]
            assert w[i, i] == w[i, j] == w[j, i] == 0.5
            np.testing.assert_allclose(y[i], (x[i] + x[j]) / 2, atol=1e-15)
            partners.add((i, int(j)))
        np.testing.assert_array_equal(y[idle], x[idle])
    assert len(partners) > n or n <= 3  # the pairs change from round to round


@pytest.mark.parametrize("n", [2, 6, 8, 12])
def test_groups_of_n_is_the_complete_graph(n):
    topo = build_topology(f"groups:{n}", n, seed=1)
    for t in range(5):
        np.testing.assert_allclose(topo.matrix(t), np.full((n, n), 1 / n), atol=1e-15)
    a = analyse(topo)
    assert a["spectral_gap"] == 1.0 and a["expected_contraction"] == pytest.approx(0, abs=1e-12)
    assert a["effective_neighbours"] == pytest.approx(n, rel=1e-12)
    assert a["messages_per_worker"] == n - 1


@pytest.mark.parametrize("n, g", [(8, 2), (12, 3), (12, 4), (16, 8)])
def test_groups_average_exactly_within_random_groups(n, g):
    topo = build_topology(f"groups:{g}", n, seed=2)
    seen = set()
    for t in range(10):
        w = topo.matrix(t)
        np.testing.assert_allclose(w @ w, w, atol=1e-15)  # a projection: averaging a partition
        for i in range(n):
            members = frozenset(np.flatnonzero(w[i]).tolist())
            assert len(members) == g and i in members
            np.testing.assert_array_equal(w[i][list(members)], 1 / g)
            seen.add(members)
    assert len(seen) > n // g  # new groups every round


@pytest.mark.parametrize("n, g", [(6, 2), (12, 3), (12, 4), (8, 8)])
def test_a_groups_round_names_its_groups_and_w_is_their_block_mean(n, g):
    topo = build_topology(f"groups:{g}", n, seed=4)
    for t in range(40):  # the sample's rounds and the ones drawn past it
        m = topo.mixing(t)
        assert m.groups.shape == (n // g, g) and not m.groups.flags.writeable
        np.testing.assert_array_equal(np.sort(m.groups.ravel()), np.arange(n))  # a partition
        block_mean = np.zeros((n, n))
        for group in m.groups:
            block_mean[np.ix_(group, group)] = 1 / g
        np.testing.assert_allclose(m.dense(), block_mean, rtol=0, atol=1e-15)
    assert all(build_topology(spec, 8).mixing(0).groups is None for spec in ["random-matching", "equidyn", "ring"])


def test_mixing_groups_must_partition_the_workers():
    index, weight = np.tile(np.arange(4), (2, 1)), np.tile([[1.0], [0.0]], (1, 4))
    assert Mixing(index, weight, groups=[[0], [1], [2], [3]]).groups.dtype == np.int64
    for bad in ([[0, 1], [1, 2]], [[0, 1], [2, 4]], [[0, 1, 2]], [0, 1, 2, 3], [[[0, 1], [2, 3]]]):
        with pytest.raises(TopologyError, match="every worker 0..3 in exactly one group"):
            Mixing(index, weight, groups=bad)


@pytest.mark.parametrize("n, s", [(8, 1), (8, 2), (9, 2), (10, 3), (16, 5)])
def test_epidemic_draws_an_s_regular_graph_with_uniform_weights(n, s):
    topo = build_topology(f"epidemic:{s}", n, seed=3)
    for t in range(10):
        w = topo.matrix(t)
        np.testing.assert_array_equal(w, w.T)
        assert ((w > 0).sum(1) == s + 1).all() and np.allclose(w[w > 0], 1 / (s + 1))
        assert topo.mixing(t).messages_per_worker == s


@pytest.mark.parametrize("n", [2, 5, 8, 13])
@pytest.mark.parametrize("eta", [None, 1.0, 0.25])
def test_equidyn_pairs_workers_a_random_shift_apart(n, eta):
    topo = build_topology("equidyn" + ("" if eta is None else f":{eta}"), n, seed=4)
    eta = 0.53 if eta is None else eta
    for t in range(10):
        w = topo.matrix(t)
        np.testing.assert_array_equal(w, w.T)
        hops = set()
        for i in range(n):
            others = [j for j in np.flatnonzero(w[i]) if j != i]
            assert len(others) <= 1
            if others:
                assert w[i, i] == pytest.approx(1 - eta + eta / n) and w[i, others[0]] == pytest.approx(eta * (n - 1) / n)
                hops.add(min((others[0] - i) % n, (i - others[0]) % n))
            else:
                assert w[i, i] == 1.0
        assert len(hops) <= 1  # every pair the same shift ±u apart
        assert hops or n == 1


@pytest.mark.parametrize("n", [2, 7, 16, 33])
def test_equistatic_is_a_seeded_circulant_of_m_random_shifts(n):
    topo = build_topology("equistatic", n, seed=6)
    m = math.ceil(math.log2(n))
    w = topo.matrix(0)
    np.testing.assert_allclose(w, w.T, atol=1e-15)
    np.testing.assert_allclose(np.diag(w), 1 / n if n > 2 else 1 / 2)
    assert (w > 0).sum(1).max() <= 2 * m + 1
    assert topo.mixing(0).spectrum is not None  # circulant: exact spectra
    offdiag = w[0, 1:] * 2 * n * m / (n - 1)  # each shift ±u adds (n − 1)/(2nM) to W[0, ±u]
    np.testing.assert_allclose(offdiag, np.round(offdiag), atol=1e-9)
    assert np.round(offdiag).sum() == 2 * m
    np.testing.assert_array_equal(w, build_topology("equistatic", n, seed=6).matrix(0))
    if n > 7:
        assert not np.array_equal(w, build_topology("equistatic", n, seed=7).matrix(0))
    assert ((build_topology("equistatic:1", n, seed=6).matrix(0) > 0).sum(1) <= 3).all()


PRIMES = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 53, 97]


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_base_k_reaches_the_exact_average_after_its_period(k):
    for n in sorted({*range(1, 41), *PRIMES, 48, 64, 81, 100}):
        topo = build_topology(f"base:{k}", n)
        np.testing.assert_allclose(_product(topo.mixings), np.full((n, n), 1 / n), rtol=0, atol=1e-12, err_msg=str(n))
        for m in topo.mixings:
            w = m.dense()
            _doubly_stochastic(w)
            np.testing.assert_allclose(w, w.T, atol=1e-15)
            assert ((w > 0).sum(1) - 1).max() <= k  # at most K peers a round
        # the paper's bound: 2 log_{K+1} n + 2 rounds; log_{K+1} n when n is a power of K + 1
        p = math.log(n) / math.log(k + 1) if n > 1 else 0
        assert topo.period <= max(1, 2 * math.ceil(p - 1e-9) + 2), (n, topo.period)
        if n > 1 and abs(p - round(p)) < 1e-9:
            assert topo.period == round(p)
        assert spectral_gap(topo) == 1.0


def test_base_k_has_only_k_peers_where_an_exponential_graph_has_more():
    topo = build_topology("base:1", 23)
    assert max(m.messages_per_worker for m in topo.mixings) <= 1
    assert topo.period < 23 and topo.union.index.shape[0] > 2  # CHOCO copies the period's union


# ---------------------------------------------------------------- every round: stochastic, reproducible


@pytest.mark.parametrize("spec", NEW)
@pytest.mark.parametrize("n", [1, 5, 8, 12])
def test_every_round_is_doubly_stochastic_and_a_function_of_seed_and_round(spec, n, monkeypatch):
    if not _fits(spec, n):
        return
    topo = build_topology(spec, n, seed=3, rounds=4)
    horizon = 3 * topo.period + 40  # well past a random topology's sample of 4 rounds
    for t in range(horizon):
        m = topo.mixing(t)
        assert np.array_equal(m.index[0], np.arange(n)) and m.n == n
        _doubly_stochastic(m.dense())
    again = build_topology(spec, n, seed=3)  # another sample size, the rounds asked in another order
    for t in reversed(range(horizon)):
        np.testing.assert_array_equal(again.mixing(t).dense(), topo.mixing(t).dense())
    if spec in RANDOM and n >= 5:
        assert topo.random and analyse(topo)["period"] is None
        other = build_topology(spec, n, seed=4)
        assert any(not np.array_equal(other.matrix(t), topo.matrix(t)) for t in range(10))
        assert any(not np.array_equal(topo.matrix(t), topo.matrix(t + 1)) for t in range(10))


def test_a_random_round_is_checked_as_it_is_drawn(monkeypatch):
    import gossamer.topology.dynamic as dynamic

    topo = build_topology("random-matching", 6, seed=0, rounds=2)
    # worker 1 takes all of worker 0's model: columns sum to 1, rows 0 and 2
    skewed = Mixing(np.array([[0, 1, 2, 3, 4, 5], [0, 0, 2, 3, 4, 5]]), np.array([[0.0, 1, 1, 1, 1, 1], [0, 1, 0, 0, 0, 0]]))
    monkeypatch.setattr(dynamic, "_matching", lambda n, rng: skewed)
    with pytest.raises(topology_module.TopologyError, match="W_0 is not doubly stochastic"):
        build_topology("random-matching", 6, seed=0, rounds=3)
    assert topo.mixing(1) is topo.mixings[1]  # the sample is kept: no redraw
    with pytest.raises(topology_module.TopologyError, match="W_5 is not doubly stochastic"):
        topo.mixing(5)  # a round past the sample, drawn now, is checked now


# ---------------------------------------------------------------- the measures


def _ring_eigenvalues(n):
    return np.array([(1 + 2 * math.cos(2 * math.pi * m / n)) / 3 for m in range(n)])


def _relabelled(mixing: Mixing, order: np.ndarray) -> Mixing:
    """The same graph with worker i renamed order[i]: no longer circulant."""
    w = mixing.dense()
    p = np.zeros_like(w)
    p[order, np.arange(len(order))] = 1
    return topology_module.from_rows(len(order), [
        {j: v for j, v in enumerate(row) if v or j == i} for i, row in enumerate(p @ w @ p.T)])


@pytest.mark.parametrize("gamma", [0.0, 0.5, 0.95, 0.999])
def test_effective_neighbours_of_the_complete_graph_the_identity_and_the_ring(gamma):
    for n in [2, 5, 16, 64]:
        assert effective_neighbours(build_topology("complete", n), gamma) == pytest.approx(n, rel=1e-10)
        ident = Topology("id", n, (Mixing(np.arange(n)[None], np.ones((1, n))),))
        assert effective_neighbours(ident, gamma) == pytest.approx(1, rel=1e-10)
    for n in [3, 8, 25, 64]:
        lam2 = _ring_eigenvalues(n) ** 2  # Σ_ii = (1/n) Σ_m λ_m² / (1 − γ λ_m²); n_W = 1 / ((1 − γ) Σ_ii)
        closed = 1 / ((1 - gamma) * (lam2 / (1 - gamma * lam2)).mean())
        ring = build_topology("ring", n)
        assert effective_neighbours(ring, gamma) == pytest.approx(closed, rel=1e-10)
        # the same graph relabelled (eigenvalues, not Fourier), and as a period of two (iterated)
        order = np.random.default_rng(n).permutation(n)
        shuffled = _relabelled(ring.mixing(0), order)
        assert shuffled.spectrum is None
        assert effective_neighbours(Topology("r", n, (shuffled,)), gamma) == pytest.approx(closed, rel=1e-9)
        assert effective_neighbours(Topology("rr", n, (shuffled, shuffled)), gamma) == pytest.approx(closed, rel=1e-7)


def test_effective_neighbours_grow_with_the_decay_and_order_the_graphs():
    n = 32
    ring, expo, full = (build_topology(s, n) for s in ("ring", "exponential", "complete"))
    for gamma in (0.0, 0.9, 0.99):
        assert 1 < effective_neighbours(ring, gamma) < effective_neighbours(expo, gamma) < n
    assert effective_neighbours(ring, 0.0) == pytest.approx(1 / (3 * (1 / 3) ** 2))  # γ = 0: 1 / Σ_j W_ij²
    assert effective_neighbours(ring, 0.5) < effective_neighbours(ring, 0.9) < effective_neighbours(ring, 0.999)


@pytest.mark.parametrize("n", [8, 16])
def test_periodic_measures_in_closed_form_equal_the_iterated_ones(n):
    topo = build_topology("one-peer-exponential", n)
    order = np.random.default_rng(0).permutation(n)
    shuffled = Topology("s", n, tuple(_relabelled(m, order) for m in topo.mixings))
    assert shuffled.mixings[0].spectrum is None
    for gamma in (0.3, 0.95):
        assert effective_neighbours(shuffled, gamma) == pytest.approx(effective_neighbours(topo, gamma), rel=1e-8)
    assert expected_contraction(shuffled) == pytest.approx(expected_contraction(topo), rel=1e-10)
    # E over the hops 2^k of |(1 + ω^{m 2^k})/2|² = cos²(π m 2^k / n), worst at m = n/2: all hops but 1 leave it
    assert expected_contraction(topo) == pytest.approx(1 - 1 / math.log2(n), rel=1e-12)


@pytest.mark.parametrize("n", [4, 7, 32, 64])
def test_expected_contraction_of_a_random_matching_in_closed_form(n):
    # E[W] = (I + E[Π]) / 2 with E[Π] = (11ᵀ − I)/(n − 1) for a perfect matching, and W² = W
    topo = build_topology("random-matching", n, seed=1)
    closed = (n - 2) / (2 * (n - 1)) if n % 2 == 0 else None
    c = expected_contraction(topo)
    if closed is not None:
        assert c == pytest.approx(closed, rel=1e-12)
    assert effective_neighbours(topo) == pytest.approx(n / (1 + 0.05 * (n - 1) * c / (1 - 0.95 * c)), rel=1e-12)
    # the estimate from the law's symmetry agrees with the same quantities iterated along drawn rounds
    plain = dataclasses.replace(topo, symmetry=None)
    assert effective_neighbours(plain) == pytest.approx(effective_neighbours(topo), rel=0.05)


def test_the_cyclic_estimate_of_equidyn_agrees_with_rounds_iterated():
    topo = build_topology("equidyn", 16, seed=2, rounds=200)
    plain = dataclasses.replace(topo, symmetry=None)
    assert effective_neighbours(plain) == pytest.approx(effective_neighbours(topo), rel=0.05)
    assert 0 < expected_contraction(topo) < 1


def test_the_empirical_gap_of_a_random_topology_is_that_of_its_sampled_rounds():
    for spec, n in [("random-matching", 16), ("epidemic:2", 12), ("equidyn", 10), ("groups:2", 8)]:
        topo = build_topology(spec, n, seed=0, rounds=6)
        dense = np.linalg.norm(_product(topo.mixings) - 1 / n, 2)
        assert spectral_gap(topo) == pytest.approx(1 - dense ** (1 / 6), abs=1e-9)
        info = analyse(topo)
        assert info["gap_rounds"] == 6 and info["kind"] == "random"
    # a long sample of a fast-mixing graph does not underflow: the product is rescaled every round
    long = build_topology("groups:4", 64, seed=0, rounds=400)
    assert 0.3 < spectral_gap(long) < 0.8


def test_topology_cli_reports_both_measures(capsys):
    import json

    assert main(["topology", "random-matching", "-n", "32", "--json", "--rounds", "8", "--decay", "0.5"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "random" and info["gap_rounds"] == 8 and info["period"] is None and info["decay"] == 0.5
    assert info["expected_contraction"] == pytest.approx(30 / 62)
    assert main(["topology", "base:1", "-n", "23", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "time-varying" and info["spectral_gap"] == 1.0 and info["gap_rounds"] == info["period"]


@pytest.mark.parametrize("argv, fragment", [
    (["epidemic:8", "-n", "8"], "S < n"),
    (["epidemic:9", "-n", "8"], "S < n"),
    (["epidemic:0", "-n", "8"], "S >= 1"),
    (["epidemic:3", "-n", "9"], "n·S even"),
    (["epidemic:x", "-n", "8"], "integer degree S"),
    (["epidemic", "-n", "8"], "epidemic:S"),
    (["groups:3", "-n", "8"], "G to divide n"),
    (["groups:16", "-n", "8"], "G to divide n"),
    (["groups:1", "-n", "8"], "G >= 2"),
    (["groups", "-n", "8"], "groups:G"),
    (["base:0", "-n", "8"], "K >= 1"),
    (["base:-2", "-n", "8"], "K >= 1"),
    (["base:y", "-n", "8"], "integer peer count K"),
    (["equidyn:0", "-n", "8"], "0 < η <= 1"),
    (["equidyn:1.5", "-n", "8"], "0 < η <= 1"),
    (["equistatic:0", "-n", "8"], "M >= 1"),
    (["equistatic:8", "-n", "8"], "M < n"),
    (["equistatic:" + "9" * 40, "-n", "8"], "M < n"),
    (["groups:" + "9" * 4000, "-n", "8"], "G to divide n"),
    (["epidemic:" + "9" * 4000, "-n", "8"], "S < n"),
    (["random-matching:2", "-n", "8"], "takes no parameter"),
    (["ring", "-n", "8", "--decay", "1"], "--decay"),
    (["ring", "-n", "8", "--decay", "-0.5"], "--decay"),
    (["ring", "-n", "8", "--decay", "nan"], "--decay"),
    (["random-matching", "-n", "8", "--rounds", "0"], "--rounds"),
])
def test_bad_topology_input_is_one_line(capsys, argv, fragment):
    one_line_error(capsys, ["topology", *argv], fragment)


def test_a_run_refuses_a_bad_random_topology_in_one_line(capsys):
    one_line_error(capsys, ["train", "--set", "algorithm=gossip", "--set", "topology=epidemic:4",
                            "--set", "workers=4"], "S < n")


# ---------------------------------------------------------------- training on them, and resuming


def _config(*overrides):
    return load_config(None, [*SHORT, *overrides])


@pytest.mark.parametrize("algorithm", ["gossip", "choco", "gradient-tracking", "sgp"])
@pytest.mark.parametrize("spec", ["random-matching", "epidemic:2", "equidyn", "equistatic", "groups:2", "base:1"])
def test_every_peer_algorithm_runs_on_every_new_topology(algorithm, spec):
    cfg = _config(f"algorithm={algorithm}", f"topology={spec}", "workers=6", "epochs=1")
    saved = {}
    summary = train(cfg, build_run(cfg), on_checkpoint=lambda s: saved.update(last=s))
    assert math.isfinite(summary["final_consensus_distance_sq"]) and summary["comm_rounds"] == 4
    assert summary["bytes_per_worker"] > 0 and torch.isfinite(saved["last"]["rows"]["X"]).all()


def test_the_sample_size_does_not_change_a_run(monkeypatch):
    """W_t depends on (seed, t) alone: drawn from the sample or afresh, a run is the same."""
    cfg = _config("algorithm=gossip", "topology=random-matching", "topology_seed=7")
    states = []
    for rounds in (32, 2):
        monkeypatch.setattr(topology_module.build, "SAMPLE_ROUNDS", rounds)
        saved = {}
        train(cfg, build_run(cfg), on_checkpoint=lambda s: saved.update(last=s))
        states.append(saved["last"]["rows"]["X"].clone())
    assert torch.equal(*states)


def _through_bytes(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("algorithm, spec, workers, stop", [
    ("gossip", "random-matching", 4, 5),
    ("choco", "epidemic:2", 6, 3),
    ("gradient-tracking", "equidyn", 5, 6),
    ("sgp", "groups:2", 6, 2),
    ("gossip", "base:1", 6, 3),  # base:1 on 6 workers: a period of 4, stopped mid-period
])
def test_a_run_resumed_mid_sequence_is_the_straight_run(algorithm, spec, workers, stop, monkeypatch):
    monkeypatch.setattr(topology_module.build, "SAMPLE_ROUNDS", 2)  # rounds past 2 are drawn afresh, before and after the stop
    cfg = _config(f"algorithm={algorithm}", f"topology={spec}", f"workers={workers}", "checkpoint_every=0.01")
    rows, saved = [], {}

    def keep(state):
        saved[state["step"]] = _through_bytes(state)
    summary = train(cfg, build_run(cfg), on_row=rows.append, on_checkpoint=keep)
    last = max(saved)
    resumed_rows = []
    resumed = train(cfg, build_run(cfg), on_row=resumed_rows.append, resume=saved[stop],
                    on_checkpoint=lambda s: saved.update(again=_through_bytes(s)))
    assert resumed_rows == [r for r in rows if r["step"] > stop]
    assert {k: v for k, v in resumed.items() if not k.endswith("_seconds")} == \
        {k: v for k, v in summary.items() if not k.endswith("_seconds")}
    assert_same_state(saved["again"], saved[last])


def test_above_the_dense_limit_the_measures_are_sparse_or_absent(monkeypatch):
    """Past DENSE_MAX workers no n×n matrix is formed: the empirical gap by a sparse singular-value
    iteration, the exchangeable measures in closed form, a period's contraction by a sparse
    eigenvalue iteration; the rotation-invariant estimate (dense per round) is left out."""
    small = {spec: build_topology(spec, 24, seed=1) for spec in ("random-matching", "equidyn", "base:2")}
    dense = {spec: analyse(topo) for spec, topo in small.items()}
    monkeypatch.setattr(topology_module.analysis, "DENSE_MAX", 8)
    sparse = {spec: analyse(topo) for spec, topo in small.items()}
    assert sparse["random-matching"]["spectral_gap"] == pytest.approx(dense["random-matching"]["spectral_gap"], rel=1e-6)
    assert sparse["random-matching"]["effective_neighbours"] == dense["random-matching"]["effective_neighbours"]
    assert sparse["equidyn"]["effective_neighbours"] is None and sparse["equidyn"]["expected_contraction"] is None
    assert sparse["base:2"]["expected_contraction"] == pytest.approx(dense["base:2"]["expected_contraction"], rel=1e-8)
    assert sparse["base:2"]["spectral_gap"] == 1.0 and sparse["base:2"]["effective_neighbours"] is None
