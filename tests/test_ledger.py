"""The traffic ledger: every operator records what moved, from its real inputs, and the counters and
the clock read only that — byte counts in closed form for the cases that were once counted by
assumption (AD-PSGD's idle events, NoLoCo's buffers, a faults run's living group, groups:G)."""

import threading

import numpy as np
import pytest
import torch
from cases import FEATURES, SHORT, covering

from gossamer.config import load_config
from gossamer.engines.ledger import BYTES_PER_VALUE, Transfer, allreduce_bytes
from gossamer.engines.sim import SimEngine
from gossamer.engines.threads import ThreadedSim
from gossamer.groups import Groups
from gossamer.testing import RecordingEngine, ledger_difference
from gossamer.integrations.hooks import DiLoCo
from gossamer.network import NetworkConfig
from gossamer.topology import build_topology
from gossamer.train import build_run, train


def test_ad_psgd_sends_two_models_per_event_with_a_peer_and_nothing_without():
    """random-matching with odd n leaves one worker without a peer every round; without a network
    the events of a step are rounds of n in worker order, all in the same round of the graph."""
    n = 5
    cfg = load_config(None, [*SHORT, "algorithm=ad-psgd", "topology=random-matching", f"workers={n}"])
    run = build_run(cfg)
    summary = train(cfg, run)
    steps, d = summary["steps"], summary["parameters"]
    with_peer = steps * (n - 1)  # one worker of each round's matching is left out
    assert summary["bytes_per_worker"] == pytest.approx(2 * d * BYTES_PER_VALUE * with_peer / n, rel=1e-12)
    assert summary["comm_rounds"] == with_peer  # one exchange per event with a peer


def test_noloco_through_the_hooks_mixes_the_buffers_in_its_gossip_round_and_never_all_reduces():
    hub, results = ThreadedSim(4, timeout=60), [None] * 4
    models = []
    for _ in range(4):
        torch.manual_seed(0)  # the same model on every rank
        models.append(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2)))

    def work(rank: int) -> None:
        model = models[rank]
        inner = torch.optim.SGD(model.parameters(), lr=0.1)
        outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
        sync = DiLoCo(model, inner, outer, local_steps=2, outer_topology="ring", buffers="average",
                      engine=hub.engine(rank))
        g = torch.Generator().manual_seed(rank)
        for _ in range(4):  # two outer steps
            inner.zero_grad()
            model(torch.randn(8, 3, generator=g) + rank).square().mean().backward()
            inner.step()
        results[rank] = (dict(sync.comm.rounds_by_level), sync.B.clone())

    threads = [threading.Thread(target=work, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(levels == {"global": 0, "block": 0, "gossip": 2} for levels, _ in results)
    buffers = torch.cat([b for _, b in results])
    assert not torch.equal(buffers[0], buffers[1])  # mixed with the ring's neighbours, not averaged by all


def test_a_faults_run_prices_every_operator_over_the_same_living_group():
    n, d = 8, 10
    alive = np.array([1, 1, 0, 1, 1, 1, 0, 1], dtype=bool)
    e, X = SimEngine(n), torch.randn(n, d, dtype=torch.float64)
    e.set_alive(alive)
    e.comm.keep()
    e.allreduce_mean_(X)
    e.block_mean_(X, 4)
    e.consensus_distance_sq(X)  # x̄: an all-reduce; Ξ²: a scalar all-gather
    transfers = e.comm.take()
    for t in transfers:
        assert (t.groups.of_worker >= 0).tolist() == alive.tolist()  # every operator: the living, no one else
    q, m = alive.sum(), d * BYTES_PER_VALUE
    assert e.comm.bytes_by_level["global"] == pytest.approx(2 * (q - 1) * m / n, rel=1e-12)  # q members, 2(q−1)/q each
    assert e.comm.bytes_by_level["block"] == pytest.approx(2 * ((3 - 1) + (3 - 1)) * m / n, rel=1e-12)
    assert e.comm.bytes_per_worker_metrics == pytest.approx((2 * (q - 1) * m + q * (q - 1) * BYTES_PER_VALUE) / n,
                                                            rel=1e-12)


def test_groups_rounds_are_priced_as_a_ring_all_reduce_within_each_group():
    n, G, d = 16, 4, 7
    topology = build_topology(f"groups:{G}", n, seed=3)
    e, X = SimEngine(n), torch.randn(n, d, dtype=torch.float64)
    e.comm.keep()
    mixing = topology.mixing(5)
    expected = torch.tensor(mixing.dense()) @ X
    e.gossip_(X, mixing)
    torch.testing.assert_close(X, expected, rtol=0, atol=1e-14)  # the exact mean of each group
    (transfer,) = e.comm.take()
    assert transfer.op == "allreduce" and transfer.groups.size == G and transfer.level == "gossip"
    assert e.comm.bytes_per_worker == allreduce_bytes(d, G)  # not G − 1 full models a worker
    net = NetworkConfig(bandwidth=10.0, latency=30.0)
    net.validate(type("cfg", (), {"workers": n}))
    alpha, beta = 30e-6, 10e9 / 8
    assert net.seconds(transfer) == pytest.approx(2 * (G - 1) * (alpha + d * BYTES_PER_VALUE / (G * beta)), rel=1e-12)


def test_groups_means_are_the_means_of_the_members_on_every_engine():
    n, d = 8, 5
    X = torch.randn(n, d, dtype=torch.float64)
    alive = np.array([1, 0, 1, 1, 1, 1, 0, 1], dtype=bool)
    columns = Groups(n, np.arange(n).reshape(2, 4).T.ravel(), 2)  # {0,4} {1,5} {2,6} {3,7}
    for living in (None, alive):
        sim = SimEngine(n)
        sim.set_alive(living)
        Y = X.clone()
        sim.groups_mean_(Y, columns)
        for r in range(4):
            members = [i for i in (r, r + 4) if living is None or living[i]]
            torch.testing.assert_close(Y[members], X[members].mean(0).expand(len(members), d), rtol=0, atol=1e-15)
        untouched = [i for i in range(n) if living is not None and not living[i]]
        assert torch.equal(Y[untouched], X[untouched])
        hub, out = ThreadedSim(n), [None] * n  # n threads of one row each: the simulator's rows

        def work(rank, living=living):
            engine = hub.engine(rank)
            engine.set_alive(living)
            row = X[rank : rank + 1].clone()
            engine.groups_mean_(row, columns)
            out[rank] = row
        threads = [threading.Thread(target=work, args=(r,)) for r in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert torch.equal(torch.cat(out), Y)


def test_the_group_averaging_matrix_is_the_mean_over_the_members():
    groups = Groups.of(7, [[0, 3, 5], [1, 2], [6]])  # worker 4 not seated
    W = groups.mixing.dense()
    expected = np.eye(7)
    for members in ([0, 3, 5], [1, 2], [6]):
        expected[np.ix_(members, members)] = 1 / len(members)
    np.testing.assert_allclose(W, expected, rtol=0, atol=1e-15)
    assert groups.sizes.tolist() == [3, 2, 1] and groups.of_worker.tolist() == [0, 1, 1, 0, -1, 0, 2]


def test_a_transfer_sends_what_its_closed_form_says():
    m = 1000.0
    ring = Transfer("gossip", m, "gossip", mixing=build_topology("ring", 6).mixing(0))
    assert ring.per_worker == (2.0, 2 * m)
    blocks = Transfer("allreduce", m, "block", groups=Groups.blocks(6, 3))
    assert blocks.per_worker == (4.0, allreduce_bytes(m / BYTES_PER_VALUE, 3))
    gather = Transfer("allgather", m, "global", groups=Groups.of(6, [[0, 1, 2, 3], [4]]))
    assert gather.per_worker == (4 * 3 / 6, 4 * 3 * m / 6)


LEDGER_CASES = {**covering(), **FEATURES}


@pytest.mark.parametrize("name", list(LEDGER_CASES))
def test_every_primitive_that_moves_data_is_in_the_ledger_as_it_moved(name):
    """The conformance kit's trace (gossamer.testing.ledger_difference): each case of the covering
    on a recording simulator — operator, participants (the groups or W it ran over) and payload
    size of every primitive, in order, against the ledger's transfers."""
    where, count = ledger_difference(LEDGER_CASES[name])
    assert where is None and count > 0


def test_the_trace_catches_traffic_recorded_by_assumption(monkeypatch):
    """A schedule that records a round it did not run (as the old AD-PSGD did for peerless workers)."""
    original = SimEngine._mixed  # a round whose primitive the recording engine does not see: recorded, not moved
    monkeypatch.setattr(RecordingEngine, "_mixed", lambda self, X, mixing: original(self, X, mixing))
    where, _ = ledger_difference(["algorithm=gossip", "topology=ring"])
    assert where == "the ledger records a gossip (gossip) that no primitive moved"
