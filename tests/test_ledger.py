"""The traffic ledger: every operator records what moved, from its real inputs, and the counters and
the clock read only that — byte counts in closed form for the cases that were once counted by
assumption or not at all (AD-PSGD's idle events, NoLoCo's buffers, a faults run's living group,
groups:G, consensus control's probes, a returning worker's fetch, float64's width); and the
ledger checked against what real processes hand torch.distributed (the parity launches of
tests/test_dist.py, with the wire tap of gossamer.engines.wire)."""

import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from cases import CIFAR_CASE, DIST_CASES, SHORT

from gossamer.config import load_config
from gossamer.engines.ledger import Compute, Ledger, Transfer, allreduce_bytes
from gossamer.engines.sim import SimEngine
from gossamer.engines.threads import ThreadedSim
from gossamer.engines.wire import WireTap, expected
from gossamer.groups import Groups
from gossamer.integrations.hooks import DiLoCo
from gossamer.algorithms.moshpit import grid_lines
from gossamer.network import PRESETS, Clock, Link, NetworkConfig, Speeds
from gossamer.testing import wire_difference
from gossamer.topology import build_topology
from gossamer.train import build_run, train

VALUE = 8  # bytes of a float64 value: SHORT's runs travel in float64


def test_ad_psgd_sends_two_models_per_event_with_a_peer_and_nothing_without():
    """random-matching with odd n leaves one worker without a peer every round; without a network
    the events of a step are rounds of n in worker order, all in the same round of the graph."""
    n = 5
    cfg = load_config(None, [*SHORT, "algorithm=ad-psgd", "topology=random-matching", f"workers={n}"])
    run = build_run(cfg)
    summary = train(cfg, run)
    steps, d = summary["steps"], summary["parameters"]
    with_peer = steps * (n - 1)  # one worker of each round's matching is left out
    assert summary["bytes_per_worker"] == pytest.approx(2 * d * VALUE * with_peer / n, rel=1e-12)
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
    assert all(levels == {"global": 0, "block": 0, "gossip": 2, "control": 0, "rejoin": 0, "server": 0} for levels, _ in results)
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
    q, m = alive.sum(), d * VALUE
    assert e.comm.bytes_by_level["global"] == pytest.approx(2 * (q - 1) * m / n, rel=1e-12)  # q members, 2(q−1)/q each
    assert e.comm.bytes_by_level["block"] == pytest.approx(2 * ((3 - 1) + (3 - 1)) * m / n, rel=1e-12)
    assert e.comm.bytes_per_worker_metrics == pytest.approx((2 * (q - 1) * m + q * (q - 1) * VALUE) / n,
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
    assert e.comm.bytes_per_worker == allreduce_bytes(d, G, VALUE)  # not G − 1 full models a worker
    net = NetworkConfig(bandwidth=10.0, latency=30.0)
    net.validate(type("cfg", (), {"workers": n}))
    alpha, beta = 30e-6, 10e9 / 8
    assert net.seconds(transfer) == pytest.approx(2 * (G - 1) * (alpha + d * VALUE / (G * beta)), rel=1e-12)


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
    assert blocks.per_worker == (4.0, allreduce_bytes(m / 4, 3, 4))
    gather = Transfer("allgather", m, "global", groups=Groups.of(6, [[0, 1, 2, 3], [4]]))
    assert gather.per_worker == (4 * 3 / 6, 4 * 3 * m / 6)


def test_a_run_counts_the_width_of_the_values_that_travel():
    """float32 runs send 4 bytes a value, float64 runs 8: an all-reduce of d values a step."""
    counted = {}
    for dtype in ("float32", "float64"):
        cfg = load_config(None, [*SHORT, "algorithm=allreduce", f"dtype={dtype}"])
        summary = train(cfg, build_run(cfg))
        counted[dtype], d, n = summary["bytes_per_worker"], summary["parameters"], cfg.workers
        value = 4 if dtype == "float32" else 8
        assert counted[dtype] == pytest.approx(summary["steps"] * allreduce_bytes(d, n, value), rel=1e-12)
    assert counted["float64"] == 2 * counted["float32"]


def test_an_all_gather_with_a_gone_worker_is_priced_and_averaged_over_the_living():
    n, B = 4, 15
    alive = np.array([1, 1, 0, 1], dtype=bool)
    e = SimEngine(n)
    e.set_alive(alive)
    payload = torch.arange(n * B, dtype=torch.uint8).view(n, B)
    gathered = e.all_gather(payload)
    assert e.comm.bytes_by_level["global"] == pytest.approx(3 * 2 * B / n)  # 3 living send 2 messages of B
    assert gathered.member.tolist() == [alive.tolist()]
    mean = gathered.mean(lambda m: m.double())
    torch.testing.assert_close(mean, payload[alive].double().mean(0).expand(n, B), rtol=0, atol=1e-12)


def test_a_neighbour_exchange_checks_the_size_it_is_told_and_drops_a_gone_workers_links():
    n, d = 4, 3
    e, ring = SimEngine(n), build_topology("ring", n).union
    X = torch.randn(n, d, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"nbytes=1 but each worker's message .* is 24 bytes, \+23 more"):
        e.exchange(X, ring, nbytes=1)
    e.set_alive(np.array([1, 0, 1, 1], dtype=bool))
    received = e.exchange(X, ring)
    assert e.comm.bytes_per_worker == pytest.approx(4 * d * VALUE / n)  # 0↔3, 2↔3: worker 1 sends and receives nothing
    gone = (torch.tensor(ring.index.T) == 1) & (torch.arange(ring.K) > 0)  # the slots that read worker 1
    assert gone.any() and (received[gone] == 0).all() and (received[1, 1:] == 0).all()


# ---------------------------------------------------------------- what algorithms consume is their traffic

WAN = PRESETS["wan-100m"]
ALPHA, BETA = WAN.latency / 1e6, WAN.bandwidth * 1e9 / 8


def controlled(measure: str):
    """A ring of 4 on a WAN, 1 ms of compute a step, Ξ kept ≤ 0.01 (measure: exact or estimate)."""
    rows, run = [], None
    cfg = load_config(None, [*SHORT, "algorithm=gossip", "topology=ring", "consensus.target=constant",
                             "consensus.value=0.01", f"consensus.measure={measure}", "network=wan-100m",
                             "compute_ms=1", "metrics_every=1"])
    run = build_run(cfg)
    summary = train(cfg, run, on_row=rows.append)
    return rows, summary, cfg.workers


@pytest.mark.parametrize("measure", ["exact", "estimate"])
def test_consensus_control_pays_for_its_probes_in_bytes_rounds_and_time(measure):
    """Control decides from a probe before its rounds and after each (exact: Ξ², an all-reduce of
    d values and a scalar all-gather; estimate: Θ² of each round, a scalar all-gather): the
    algorithm's traffic, level control. With equal speeds every clock is the same, and the
    simulated time is the compute and the time of every operator, in closed form."""
    rows, s, n = controlled(measure)
    d, steps, b = s["parameters"], s["steps"], s["parameters"] * VALUE
    probes = sum(1 + r["extra_gossip_rounds"] for r in rows)
    assert s["extra_gossip_rounds"] > 0 and probes == steps + s["extra_gossip_rounds"]
    gather = (n - 1) * VALUE  # one float64 a worker, to n − 1 others
    reduce = allreduce_bytes(d, n, VALUE)
    per_probe = (reduce + gather, 2) if measure == "exact" else (gather, 1)
    assert s["comm_rounds_control"] == per_probe[1] * probes
    assert s["bytes_per_worker_control"] == pytest.approx(probes * per_probe[0], rel=1e-12)
    assert s["bytes_per_worker"] == pytest.approx(sum(s[f"bytes_per_worker_{k}"] for k in
                                                      ("global", "block", "gossip", "control", "rejoin")), rel=1e-12)
    tau_gossip = 2 * (ALPHA + b / BETA)
    tau_reduce = 2 * (n - 1) * (ALPHA + b / (n * BETA))
    tau_gather = (n - 1) * (ALPHA + VALUE / BETA)
    tau_probe = tau_reduce + tau_gather if measure == "exact" else tau_gather
    closed = steps * 1e-3 + s["comm_rounds_gossip"] * tau_gossip + probes * tau_probe + \
        s["comm_rounds_global"] * tau_reduce  # the fallback all-reduces, when the budget runs out
    assert s["sim_seconds"] == pytest.approx(closed, rel=1e-12)
    assert s["sim_seconds"] > steps * 1e-3 + s["comm_rounds_gossip"] * tau_gossip + probes * 0.04  # ≥ 2 latencies a probe


def test_a_returning_worker_pays_for_its_fetch_and_a_stale_one_does_not():
    """Worker 1 of a ring of 4 is gone for steps 2..4: back at step 5 it fetches the rows of its
    neighbours 0 and 2 (one message of d float64 values each, on its link), which costs exactly
    that time; with ``rejoin: stale`` it comes back as it left, for nothing."""
    out = {}
    for rejoin in ("neighbours", "stale"):
        cfg = load_config(None, [*SHORT, "algorithm=gossip", "topology=ring", "faults.events=[1@2-5]",
                                 f"faults.rejoin={rejoin}", "network=ethernet-1g", "compute_ms=1"])
        out[rejoin] = train(cfg, build_run(cfg))
    fresh, stale = out["neighbours"], out["stale"]
    b, link = fresh["parameters"] * VALUE, Link.of(PRESETS["ethernet-1g"].bandwidth, PRESETS["ethernet-1g"].latency)
    assert (fresh["comm_rounds_rejoin"], stale["comm_rounds_rejoin"]) == (1, 0)
    assert fresh["bytes_per_worker_rejoin"] == pytest.approx(2 * b / 4, rel=1e-12) and stale["bytes_per_worker_rejoin"] == 0
    assert fresh["bytes_per_worker"] - stale["bytes_per_worker"] == pytest.approx(2 * b / 4, rel=1e-12)
    assert fresh["messages_per_worker"] - stale["messages_per_worker"] == pytest.approx(2 / 4, rel=1e-12)
    assert fresh["sim_seconds"] - stale["sim_seconds"] == pytest.approx(2 * link.message(b), rel=1e-9)


def test_what_a_transfer_overlaps_is_the_ledgers_not_the_schedules():
    """With overlap, only a transfer recorded as running behind the backward pass hides in it; a
    gossip round in the same step comes after the compute, whatever the schedule does."""
    net = NetworkConfig(bandwidth=10.0, latency=30.0, overlap=True)
    net.validate(SimpleNamespace(workers=4))
    everyone, ring = Groups.blocks(4, 4), build_topology("ring", 4).mixing(0)
    reduce = Transfer("allreduce", 4e6, "global", groups=everyone, backward=True)
    gossip = Transfer("gossip", 4e5, "gossip", mixing=ring)
    c = 6e-3
    for entries, hidden in (([Compute(None, 0), reduce], True), ([Compute(None, 0), gossip], False),
                            ([Compute(None, 0), reduce, gossip], True)):
        clock = Clock(net, c, Speeds(np.ones(4), None, 0))
        clock.tick(entries, 4)
        taus = [net.seconds(e) for e in entries[1:]]
        behind = net.seconds(reduce) if hidden else 0.0
        expected_time = c + max(0.0, behind - 2 * c / 3) + sum(taus) - behind
        assert clock.now == pytest.approx(expected_time, rel=1e-12)


# ---------------------------------------------------------------- the ledger against the wire


def test_the_wire_a_transfer_implies_on_processes_in_closed_form():
    """Moshpit's 3 × 3 grid on 3 processes of 3 workers: the columns (one member a process) are an
    all-reduce of b bytes among the 3 processes each, whose ring volume over the processes —
    3 groups × 3 processes × 2(3 − 1)/3 · b = 12 b — is the ledger's n × 2(g − 1)/g · b; the rows
    lie inside processes: nothing crosses. A ring's round: one message a neighbouring process."""
    n, b = 9, 800
    rows, columns = grid_lines(n, 3)[1], grid_lines(n, 3)[0]
    assert rows.consecutive and not columns.consecutive
    for lines, handed in ((columns, [("all_reduce", (0, 1, 2), b)] * 3), (rows, [])):
        transfer = Transfer("allreduce", b, "gossip", groups=lines)
        for rank in range(3):
            assert expected(transfer, n, 3, rank) == handed
    ring_volume = 3 * 3 * 2 * (3 - 1) / 3 * b
    assert ring_volume == n * Transfer("allreduce", b, "gossip", groups=columns).per_worker[1]
    gossip = Transfer("gossip", b, "gossip", mixing=build_topology("ring", n).mixing(0))
    assert expected(gossip, n, 3, 1) == [("recv", (0,), b), ("recv", (2,), b), ("send", (0,), b), ("send", (2,), b)]
    gathered = Transfer("allgather", 5, "global", groups=Groups.blocks(n, n).among(np.arange(n) != 4))
    assert expected(gathered, n, 3, 1) == [("all_gather", (0, 1, 2), 3 * 5)]  # shares padded to 3 rows


def test_the_wire_tap_names_the_operator_whose_bytes_differ_and_by_how_much():
    tap = WireTap(4, 2, 0)
    ring = build_topology("ring", 4).mixing(0)
    tap.hand("send", (1,), 2 * 540)
    tap.hand("recv", (1,), 2 * 540)
    tap.check(Transfer("gossip", 540, "gossip", mixing=ring))
    tap.hand("send", (1,), 2 * 540)
    tap.hand("recv", (1,), 2 * 540)
    tap.check(Transfer("gossip", 1, "gossip", mixing=ring))  # a byte count taken on trust
    tap.hand("all_reduce", (0, 1), 40)  # moved, never recorded
    report = tap.report()
    assert report["operators"] == 2 and len(report["mismatches"]) == 2
    assert report["mismatches"][0] == ("operator 2 (gossip of 1 B a message, level gossip): rank 0 handed "
                                       "torch.distributed recv from 1 of 1,080 B, send to 1 of 1,080 B; the ledger's "
                                       "transfer implies recv from 1 of 2 B, send to 1 of 2 B (+2,156 B)")
    assert "no transfer records" in report["mismatches"][1]


def _launched() -> list[tuple[int, str]]:
    return [(procs, name) for procs, cases in DIST_CASES.items() for name in cases] + \
        [(2, CIFAR_CASE), (2, "acceptance")] + [(procs, f"engine-n{n}") for procs, n in
                                                 ((2, 2), (2, 8), (3, 3), (3, 9), (4, 4), (4, 8))]


@pytest.mark.slow
@pytest.mark.parametrize("procs, name", _launched())
def test_every_transfer_is_what_the_processes_hand_torch_distributed(procs, name, dist_runs):
    """Every case of the parity launches (every registered algorithm but the simulator's own
    AD-PSGD, every FEATURE: faults with both rejoins, groups, Moshpit, DSpodFL, Byzantine workers,
    codecs, control) and the engine's operators alone: what each process hands torch.distributed
    between two transfers is what the transfer implies, and nothing moves unrecorded."""
    where, operators = wire_difference(dist_runs(procs) / f"wire-{name}", procs)
    assert where is None and operators > 0


def test_a_checkpoint_of_an_earlier_version_resumes_with_the_new_counts_from_zero():
    """A ledger state without the control and rejoin levels, a clock state without ``busy`` (both
    before issue 41/42): they load, the new counts start at 0, the old ones are kept."""
    old = Ledger(4).state_dict()
    for key in ("rounds_by_level", "bytes_by_level"):
        old[key] = {level: value for level, value in old[key].items() if level in ("global", "block", "gossip")}
    old["rounds_by_level"]["gossip"], old["rounds"] = 7, 7
    ledger = Ledger(4)
    ledger.load_state_dict(old)
    assert ledger.rounds_by_level == {"global": 0, "block": 0, "gossip": 7, "control": 0, "rejoin": 0, "server": 0}
    ledger.record(Transfer("allgather", 8, "control", groups=Groups.blocks(4, 4)))
    assert ledger.rounds == 8 and ledger.rounds_by_level["control"] == 1
    clock = Clock(NetworkConfig(bandwidth=1.0, latency=1.0), 1e-3, Speeds(np.ones(4), None, 0))
    clock.load_state_dict({"times": [1.0] * 4, "idle": [0.5] * 4})
    assert clock.busy.tolist() == [0.0] * 4 and clock.utilization()["idle_seconds"] == 0.5
