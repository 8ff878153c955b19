"""Slow and uneven workers: per-worker clocks in the time model (issue 21)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import train_rows

from gossamer.engines.ledger import Compute, Transfer
from gossamer.network import Clock, NetworkConfig, Speeds
from gossamer.topology import build_topology
from gossamer.cli import main

NET = ["network.bandwidth=1", "network.latency=50", "network.count_metrics=false"]  # 1 Gbit/s, 50 µs
A1, B1 = 50e-6, 1e9 / 8


def all_reduce_seconds(d: int, n: int = 4) -> float:
    """A ring all-reduce of d float64 values (the small config's dtype)."""
    return 2 * (n - 1) * (A1 + d * 8 / (n * B1))


def test_one_slow_worker_makes_every_all_reduce_step_wait_for_it():
    _, summary, run = train_rows("algorithm=allreduce", "epochs=1", *NET, "compute_ms=2", "slow_workers=0.25@3")
    assert (run.clock.speeds.slow == 3).sum() == 1  # ⌈0.25 · 4⌉ workers
    step = 3 * 2e-3 + all_reduce_seconds(summary["parameters"])
    assert summary["sim_seconds"] == pytest.approx(summary["steps"] * step, rel=1e-12)
    # the three fast workers wait 2 × 2 ms in every step
    assert summary["sim_seconds_idle_fraction"] == pytest.approx(3 / 4 * 4e-3 / step, rel=1e-9)
    # each computes c (the slow one 3c) of every step's 3c + τ: the mean share and the least
    steps = summary["steps"]
    assert summary["compute_utilization"] == pytest.approx((3 * 2e-3 + 6e-3) / 4 / step, rel=1e-12)
    assert summary["compute_utilization_min"] == pytest.approx(2e-3 / step, rel=1e-12)
    assert summary["idle_seconds"] == pytest.approx(3 / 4 * 4e-3 * steps, rel=1e-9)


def ring_clock(n: int, slow: int, factor: float, c: float) -> tuple[Clock, list[Transfer]]:
    net = NetworkConfig(bandwidth=1.0, latency=50.0, count_metrics=False)
    speeds = np.ones(n)
    speeds[slow] = factor
    mixing = build_topology("ring", n).mixing(0)
    return Clock(net, c, Speeds(speeds, None, 0)), [Transfer("gossip", 4000, "gossip", mixing=mixing)]


def test_a_ring_round_waits_only_for_the_neighbours():
    """One slow worker s on a ring: its delay spreads one hop per round. With compute c, slowdown X
    and a round of τ, worker i at distance k from s after t steps has the clock
    T_i(t) = t(c + τ) + min(t, max(0, t − k + 1))·(X − 1)c (the longest walk to i stays at s)."""
    n, s, X, c = 12, 3, 4.0, 1e-3
    clock, events = ring_clock(n, s, X, c)
    tau = clock.network.seconds(events[0])
    distance = np.minimum(np.abs(np.arange(n) - s), n - np.abs(np.arange(n) - s))
    for t in range(1, 9):
        clock.tick([Compute(None, t - 1), *events], n)
        expected = t * (c + tau) + np.minimum(t, np.maximum(0, t - distance + 1)) * (X - 1) * c
        np.testing.assert_allclose(clock.times, expected, rtol=1e-12)
    idle = clock.idle
    assert idle[s] == 0 and (idle[distance > 8] == 0).all() and (idle[distance == 1] > 0).all()


def test_equal_speeds_change_no_number():
    """slow_workers at 1× prices every step as the model without stragglers, bit for bit."""
    common = ["algorithm=gossip", "epochs=1", *NET, "compute_ms=1", "network.count_metrics=true"]
    rows, summary, _ = train_rows(*common)
    same_rows, same, _ = train_rows(*common, "slow_workers=1@1")
    assert same_rows == rows and {k: v for k, v in same.items() if k != "wall_seconds"} == \
        {k: v for k, v in summary.items() if k != "wall_seconds"}
    assert summary["sim_seconds_idle_fraction"] == 0


def test_jitter_is_log_normal_of_mean_one_and_drawn_from_seed_step_and_worker():
    speeds = Speeds(np.ones(4), 0.5, seed=7)
    draws = np.log([speeds.factor(t, i) for t in range(2500) for i in range(4)])
    assert draws.mean() == pytest.approx(-0.5**2 / 2, abs=0.03) and draws.std() == pytest.approx(0.5, rel=0.05)
    assert speeds.factor(3, 2) == Speeds(np.ones(8), 0.5, seed=7).factor(3, 2) != speeds.factor(3, 1)
    assert list(speeds.factors(5)) == [speeds.factor(5, i) for i in range(4)]


def test_stragglers_are_deterministic_and_only_change_time():
    common = ["algorithm=gossip", "epochs=1", *NET, "compute_ms=1"]
    rows, summary, _ = train_rows(*common)
    slow = ["slow_workers=0.5@2", "compute_jitter=lognormal:0.5"]
    first, a, _ = train_rows(*common, *slow)
    again, b, _ = train_rows(*common, *slow)
    assert first == again and a["sim_seconds"] == b["sim_seconds"]
    def untimed(r: dict) -> dict:
        return {k: v for k, v in r.items() if "seconds" not in k and not k.startswith("compute_utilization")}
    assert [untimed(r) for r in first] == [untimed(r) for r in rows]
    assert a["sim_seconds"] > 2 * summary["steps"] * 1e-3 and 0 < a["sim_seconds_idle_fraction"] < 1


@pytest.mark.parametrize("overrides, fragment", [
    (["slow_workers=0.1@4"], "slow_workers applies only with a network section"),
    (["compute_jitter=lognormal:0.5"], "compute_jitter applies only with a network section"),
    (["network=nvlink", "slow_workers=0@4"], "slow_workers must be F@X with a fraction F in (0, 1]"),
    (["network=nvlink", "slow_workers=1.5@4"], "slow_workers must be F@X"),
    (["network=nvlink", "slow_workers=0.5@0.9"], "a slowdown X in [1, inf)"),
    (["network=nvlink", "slow_workers=0.5@inf"], "slow_workers must be F@X"),
    (["network=nvlink", "slow_workers=half"], "slow_workers must be F@X"),
    (["network=nvlink", "compute_jitter=gaussian:1"], "compute_jitter must be lognormal:S"),
    (["network=nvlink", "compute_jitter=lognormal:0"], "compute_jitter must be lognormal:S with a log-normal σ"),
    (["network=nvlink", "compute_jitter=lognormal:x"], "compute_jitter must be lognormal:S"),
])
def test_bad_straggler_options_are_one_line(tmp_path, capsys, overrides, fragment):
    argv = ["train", "--quiet", "--out", str(tmp_path / "never")]
    code = main([*argv, *(a for o in ["workers=4", *overrides] for a in ("--set", o))])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and fragment in err, err


def test_on_real_processes_the_slow_workers_process_sleeps_for_its_extra_compute(monkeypatch):
    naps = []
    monkeypatch.setattr("gossamer.network.time.sleep", naps.append)
    net = NetworkConfig(bandwidth=1.0, latency=50.0)
    slow = np.array([1.0, 3.0, 1.0, 1.0])
    Clock(net, 0.2, Speeds(slow, None, 0), sleeps=True).straggle(0, range(0, 2))  # the process of workers 0 and 1
    Clock(net, 0.2, Speeds(slow, None, 0), sleeps=True).straggle(0, range(2, 4))
    Clock(net, 0.2, Speeds(slow, None, 0)).straggle(0, range(0, 2))  # the simulator never sleeps
    assert naps == [pytest.approx(0.4, rel=1e-12)]
