"""Workers that leave and return (gossamer.faults): quorum averages, the repaired gossip matrix,
frozen rows of gone workers, rejoining, and a faults section without events changing nothing."""

import numpy as np
import pytest
import torch
from cases import SHORT
from test_bad_input import one_line_error, sets
from gossamer.testing import through_bytes, untimed

from gossamer.config import ConfigError, load_config
from gossamer.engines.sim import SimEngine
from gossamer.faults import Faults, FaultsConfig, repair
from gossamer.topology import build_topology, keep_living
from gossamer.algorithms import graph_of
from gossamer.train import _state_rows, build_run, train


def _begin_faults(run, t: int):
    """The loop's start of step t under faults."""
    return run.faults.begin_step(t, run.engine, graph_of(run.schedule), _state_rows(run), run.optimizer)


def test_quorum_average_is_the_plain_mean_of_the_living_rows():
    engine, X = SimEngine(8), torch.randn(8, 5, dtype=torch.float64)
    alive = np.array([1, 0, 1, 1, 0, 0, 1, 1], dtype=bool)
    engine.set_alive(alive)
    for size in (8, 4, 2):
        Y = X.clone()
        engine.block_mean_(Y, size) if size < 8 else engine.allreduce_mean_(Y)
        for g in range(0, 8, size):
            living = [i for i in range(g, g + size) if alive[i]]
            torch.testing.assert_close(Y[living], X[living].mean(0).expand(len(living), 5), rtol=0, atol=1e-12)
        assert torch.equal(Y[~torch.as_tensor(alive)], X[~torch.as_tensor(alive)])
    torch.testing.assert_close(engine.mean_row(X), X[torch.as_tensor(alive)].mean(0), rtol=0, atol=0)
    assert engine.mean_scalar(torch.arange(8.0)) == pytest.approx(np.flatnonzero(alive).mean())


@pytest.mark.parametrize("spec", ["ring", "exponential", "torus", "one-peer-exponential", "random-matching",
                                  "epidemic:2", "equistatic"])
def test_local_repair_drops_only_the_gone_workers_links(spec):
    """A row that never read a gone worker is unchanged, a round keeps its links among the living,
    every row still sums to 1; a symmetric W stays doubly stochastic and keeps the living mean."""
    topology, rng = build_topology(spec, 16, seed=1), np.random.default_rng(0)
    X = np.random.default_rng(1).standard_normal((16, 3))
    for t in range(4):
        alive = rng.random(16) < 0.6
        W0 = topology.mixing(t).dense()
        W = keep_living(topology.mixing(t), alive).dense()
        np.testing.assert_allclose(W.sum(1), 1, atol=1e-12)
        np.testing.assert_array_equal(W[~alive], np.eye(16)[~alive])  # a gone worker's row: itself
        assert (W[np.ix_(alive, ~alive)] == 0).all()
        untouched = alive & (W0[:, ~alive] == 0).all(1)
        np.testing.assert_array_equal(W[untouched], W0[untouched])
        links = (W0 != 0) & ~np.eye(16, dtype=bool)
        np.testing.assert_array_equal((W != 0) & ~np.eye(16, dtype=bool), links & np.outer(alive, alive))
        if np.allclose(W0, W0.T):
            np.testing.assert_allclose(W.sum(0), 1, atol=1e-12)
            np.testing.assert_allclose((W @ X)[alive].mean(0), X[alive].mean(0), atol=1e-12)


def test_a_one_peer_round_stays_one_peer_and_metropolis_reweights_what_never_read_the_gone():
    alive = np.ones(16, dtype=bool)
    alive[5] = False
    one_peer = build_topology("one-peer-exponential", 16).mixing(1)
    assert keep_living(one_peer, alive).messages_per_worker < one_peer.messages_per_worker  # the links to 5 gone
    assert repair(one_peer, alive, per_round=True).messages_per_worker == pytest.approx(
        1.75 * one_peer.messages_per_worker, rel=0.05)  # Metropolis–Hastings on the round's induced graph: +75 %
    equistatic = build_topology("equistatic", 16, seed=0).mixing(0)
    W0 = equistatic.dense()
    never = alive & (W0[:, 5] == 0)
    changed = (repair(equistatic, alive, per_round=False).dense()[never] != W0[never]).any(1)
    assert never.sum() > 5 and changed.all()  # every living row that never read worker 5
    np.testing.assert_array_equal(keep_living(equistatic, alive).dense()[never], W0[never])


@pytest.mark.parametrize("spec", ["ring", "exponential", "torus", "one-peer-exponential", "random-matching",
                                  "epidemic:2", "directed-exponential"])
def test_the_metropolis_repair_is_doubly_stochastic_and_keeps_the_living_mean(spec):
    topology, rng = build_topology(spec, 16, seed=1), np.random.default_rng(0)
    X = np.random.default_rng(1).standard_normal((16, 3))
    for t in range(4):
        alive = rng.random(16) < 0.6
        W = repair(topology.mixing(t), alive, per_round=topology.kind != "static").dense()
        np.testing.assert_allclose(W.sum(0), 1, atol=1e-12)
        np.testing.assert_allclose(W.sum(1), 1, atol=1e-12)
        assert (W >= 0).all() and (W[np.ix_(alive, ~alive)] == 0).all()
        np.testing.assert_array_equal(W[~alive], np.eye(16)[~alive])  # a gone worker's row: itself
        np.testing.assert_allclose((W @ X)[alive].mean(0), X[alive].mean(0), atol=1e-12)


def test_a_missing_partner_of_a_symmetric_round_is_a_self_loop():
    w = build_topology("random-matching", 6, seed=0).mixing(3)
    alive = np.array([0, 1, 1, 1, 1, 1], dtype=bool)
    W, W0 = repair(w, alive, per_round=True).dense(), w.dense()
    partner = int(np.flatnonzero(W0[0] * (np.arange(6) != 0))[0])
    assert W[partner, partner] == W0[partner, partner] + W0[partner, 0]
    np.testing.assert_array_equal(np.delete(np.delete(W, [0, partner], 0), [0, partner], 1),
                                  np.delete(np.delete(W0, [0, partner], 0), [0, partner], 1))


@pytest.mark.parametrize("case", [["algorithm=gossip", "topology=ring"],
                                  ["algorithm=diloco", "local_steps=2", "momentum=0.9"]])
def test_a_gone_worker_keeps_its_rows_through_its_window(case):
    cfg = load_config(None, [*SHORT, *case, "momentum=0.9", "faults.events=[1@2-7]", "checkpoint_every=0.01"])
    saved = {}
    train(cfg, build_run(cfg),
          on_checkpoint=lambda s: saved.update({s["step"]: through_bytes(s)}) if s["step"] in (2, 7) else None)
    before, after = saved[2], saved[7]
    rows = [("rows", "X"), ("optimizer", "rows", "momentum")] + ([("schedule", "rows", "x_outer")]
                                                                 if "diloco" in case[0] else [])
    for path in rows:
        a, b = before, after
        for key in path:
            a, b = a[key], b[key]
        assert torch.equal(a[1], b[1]), path
        assert not torch.equal(a[0], b[0]), path  # the living moved on


def test_rejoin_neighbours_takes_the_mean_of_the_living_neighbours():
    cfg = load_config(None, [*SHORT, "workers=6", "algorithm=gossip", "topology=ring", "momentum=0.9",
                             "faults.events=[2@0-3,3@1-]"])
    run = build_run(cfg)
    for t in range(3):
        _begin_faults(run, t)
    X, M = run.workers.X, run.optimizer.rows["momentum"]
    X.copy_(torch.randn_like(X))
    M.copy_(torch.randn_like(M))
    expected = X[1].clone()  # of 2's ring neighbours 1 and 3, only 1 is alive
    _begin_faults(run, 3)
    assert torch.equal(X[2], expected) and (M[2] == 0).all()
    assert run.engine.alive.tolist() == [True, True, True, False, True, True]


def test_rejoin_without_a_graph_takes_the_mean_of_every_living_worker():
    cfg = load_config(None, [*SHORT, "algorithm=local", "local_steps=2", "faults.events=[0@0-3]",
                             "faults.rejoin=neighbours"])
    run = build_run(cfg)
    for t in range(3):
        _begin_faults(run, t)
    X = run.workers.X
    X.copy_(torch.randn_like(X))
    _begin_faults(run, 3)
    torch.testing.assert_close(X[0], X[1:].mean(0), rtol=0, atol=1e-15)  # no graph: every living worker


def test_churn_is_drawn_from_the_seed_and_resumes():
    cfg = FaultsConfig(churn=0.2, downtime=3)
    a, b = Faults(cfg, 8, seed=5), Faults(cfg, 8, seed=5)
    trace = [a.advance(t).copy() for t in range(40)]
    for t in range(20):
        b.advance(t)
    c = Faults(cfg, 8, seed=5)
    c.load_state_dict(b.state_dict())
    assert all(np.array_equal(c.advance(t), trace[t]) for t in range(20, 40))
    assert 0 < a.alive_min < 8


def test_a_faults_section_without_events_is_the_run_without_it():
    plain = load_config(None, [*SHORT, "algorithm=gossip", "topology=ring"])
    faulty = load_config(None, [*SHORT, "algorithm=gossip", "topology=ring", "faults.events=[]"])
    (rows_a, run_a), (rows_b, run_b) = ([], build_run(plain)), ([], build_run(faulty))
    summary_a = train(plain, run_a, on_row=rows_a.append)
    summary_b = train(faulty, run_b, on_row=rows_b.append)
    assert summary_b.pop("workers_alive_min") == 4
    assert untimed(summary_a) == untimed(summary_b)
    assert rows_a == [{k: v for k, v in r.items() if k not in ("workers_alive", "living_components")} for r in rows_b]
    assert torch.equal(run_a.workers.X, run_b.workers.X)


@pytest.mark.parametrize("overrides, fragment", [
    (["faults.events=[4@1-3]"], "unknown worker 4"),
    (["faults.events=[1@5-3]"], "reversed or empty"),
    (["faults.events=[1@1-5,1@4-]"], "overlap"),
    (["faults.events=[1 at 3]"], "is not W@A-B"),
    (["faults.churn=1"], "faults.churn must be a probability in [0, 1)"),
    (["faults.churn=0.1"], "faults.churn needs faults.downtime D"),
    (["faults.churn=0.1", "faults.downtime=0.5"], "faults.downtime must be in [1, 1e+09]"),
    (["faults.rejoin=stale"], "faults.rejoin applies only when workers leave"),
    (["faults.repair=metropolis", "faults.rejoin=stale"], "faults.rejoin and faults.repair apply only when workers"),
    (["faults.events=[0@2-,1@1-,2@0-5,3@3-]"], "all 4 workers are gone at step 3"),
    (["faults.rejoin=random"], "faults.rejoin"),
    (["algorithm=choco", "faults.events=[1@2-3]"], "algorithm choco does not drop workers"),
    # issue 45, item 10: the same run bit for bit as without the repair
    (["algorithm=allreduce", "faults.events=[1@2-3]", "faults.repair=metropolis"],
     "faults.repair metropolis repairs a gossip graph: algorithm allreduce has none"),
    (["algorithm=moshpit", "moshpit_group=2", "faults.events=[1@2-3]", "faults.repair=metropolis"],
     "algorithm moshpit has none"),
    # issue 45, item 15: column sums 0.5 and 1.5 with a gone worker
    (["algorithm=gossip", "topology=directed-exponential", "faults.events=[1@2-3]"],
     "on the directed topology 'directed-exponential' the living workers' mean drifts"),
])
def test_bad_faults_are_one_line(capsys, tmp_path, overrides, fragment):
    one_line_error(capsys, ["train", "--quiet", "--out", str(tmp_path / "never"), *sets(*SHORT, *overrides)], fragment)


def test_an_event_after_the_last_step_is_refused():
    with pytest.raises(ConfigError, match="starts after the run's 12 steps"):
        build_run(load_config(None, [*SHORT, "faults.events=[1@12-]"]))


@pytest.mark.parametrize("case, per_step, gone_per_step, neighbours", [
    (["algorithm=gossip", "topology=ring"], 2.0, 1.0, 2),  # ring of 4: 2 messages each; without 1: 8 - 2 - 2 of them
    (["algorithm=allreduce"], 2 * 3 / 4, 2 * 2 / 4, 3),  # ring all-reduce of g: 2(g - 1) vectors over n = 4
])
def test_bytes_are_counted_on_the_living_workers_links(case, per_step, gone_per_step, neighbours):
    """Worker 1 of 4 gone for the steps 2 <= t < 6 of 12: the bytes are what moves among the living
    (closed forms per step, means over the 4 workers; a vector is d float64 values, 8 bytes each),
    and, back at step 6, its fetch: one vector from each of its living neighbours (all 3 others
    without a graph)."""
    cfg = load_config(None, [*SHORT, *case, "faults.events=[1@2-6]"])
    run = build_run(cfg)
    summary = train(cfg, run)
    d = run.workers.X.shape[1]
    assert summary["comm_rounds"] == 12 + 1 and summary["comm_rounds_rejoin"] == 1
    assert summary["bytes_per_worker_rejoin"] == pytest.approx(8 * d * neighbours / 4, rel=1e-12)
    assert summary["bytes_per_worker"] == pytest.approx(8 * d * (8 * per_step + 4 * gone_per_step + neighbours / 4),
                                                        rel=1e-12)
