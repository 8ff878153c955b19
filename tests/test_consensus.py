"""Consensus distance metrics, the controller, phases and the run:DIR reference."""

import json
import math
import re

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from conftest import build, small_config, train_rows
from gossamer.algorithms import Step
from gossamer.cli import main
from gossamer.config import ConfigError
from gossamer.consensus import Controller, FrequencyControl, ema
from gossamer.engines.sim import SimEngine
from gossamer.topology import build_topology

S = 12  # steps per epoch of the small config


def rows_of(*overrides):
    rows, summary, _ = train_rows(*overrides)
    return rows, summary


@settings(max_examples=25, deadline=None)
@given(n=st.integers(3, 24), graph=st.sampled_from(["ring", "erdos-renyi:0.4", "random-regular:3", "exponential"]),
       seed=st.integers(0, 1000), fraction=st.floats(0.05, 0.9))
def test_control_reaches_the_target_with_enough_budget(n, graph, seed, fraction):
    assume(graph != "random-regular:3" or n % 2 == 0)  # a 3-regular graph needs n·3 even
    topo = build_topology(graph, n, seed=seed)
    engine = SimEngine(n)
    X = torch.randn(n, 30, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    target = fraction * math.sqrt(engine.consensus_distance_sq(X))
    rounds = iter(range(10**9))
    controller = Controller(lambda step: target, max_extra_rounds=100_000, on_budget="continue")
    metrics = controller.control(engine, X, Step(0), lambda: engine.gossip_(X, topo.mixing(next(rounds))))
    assert math.sqrt(engine.consensus_distance_sq(X)) <= target
    assert metrics["extra_gossip_rounds"] >= 1 and not metrics["control_allreduce"]


@settings(max_examples=12, deadline=None)
@given(n=st.integers(4, 16), graph=st.sampled_from(["ring", "erdos-renyi:0.4", "exponential", "torus"]),
       seed=st.integers(0, 1000), fraction=st.floats(0.05, 0.9))
def test_control_from_the_estimate_reaches_the_target_never_in_fewer_rounds_than_exact(n, graph, seed, fraction):
    """From the same state (after the step's own round), the bound (2/p)Θ ≥ Ξ: control from it
    meets the target and spends at least the rounds the exact rule spends — which it reports."""
    assume(graph != "torus" or n in (9, 12, 15, 16))
    topo = build_topology(graph, n, seed=seed)
    engine = SimEngine(n)
    X = torch.randn(n, 30, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    theta_sq = engine.mean_scalar(engine.gossip_(X, topo.mixing(0), measure=True))
    bound = 2 / topo.mixing(0).p * math.sqrt(theta_sq)
    target = fraction * math.sqrt(engine.consensus_distance_sq(X))
    assume(target >= 1e-9)  # not when one round already averaged exactly (a complete graph)

    def controlled(measure, Y):
        rounds = iter(range(1, 10**9))
        step_round = (lambda: 2 / topo.mixing(0).p * math.sqrt(
            engine.mean_scalar(engine.gossip_(Y, topo.mixing(next(rounds)), measure=True)))) \
            if measure == "estimate" else (lambda: engine.gossip_(Y, topo.mixing(next(rounds))))
        controller = Controller(lambda step: target, 100_000, "continue", measure)
        return controller.control(engine, Y, Step(0), step_round, bound if measure == "estimate" else None)

    exact, estimate = controlled("exact", X.clone()), controlled("estimate", X)
    assert math.sqrt(engine.consensus_distance_sq(X)) <= target
    assert estimate["consensus_distance_bound_after_control"] <= target
    assert estimate["extra_gossip_rounds"] >= exact["extra_gossip_rounds"]
    assert estimate["extra_gossip_rounds_if_exact"] == exact["extra_gossip_rounds"]


def test_estimate_controlled_training_meets_the_target_and_measures_only_scalars():
    common = ("algorithm=gossip", "consensus.target=constant", "consensus.value=0.02", "consensus.max_extra_rounds=500")
    rows, estimate = rows_of(*common, "consensus.measure=estimate")
    for r in rows:
        xi = math.sqrt(r["consensus_distance_sq"])
        assert xi <= r["consensus_distance_bound_after_control"] + 1e-12 <= 0.02 + 1e-12
        assert r["extra_gossip_rounds"] >= r["extra_gossip_rounds_if_exact"]
    assert any(r["extra_gossip_rounds"] > r["extra_gossip_rounds_if_exact"] for r in rows)
    assert estimate["extra_gossip_rounds"] == sum(r["extra_gossip_rounds"] for r in rows) > 0
    # what control decides from: the estimate one scalar a round, the exact rule an all-reduce of d values too
    control_bytes = {measure: rows_of(*common, f"consensus.measure={measure}", "metrics_every=12")[1]
                     ["bytes_per_worker_control"] for measure in ("exact", "estimate")}
    assert 0 < control_bytes["estimate"] < control_bytes["exact"] / 10


def test_estimate_control_refuses_rounds_that_do_not_mix():
    with pytest.raises(ConfigError, match="p > 0.*one-peer-exponential"):
        build(small_config("algorithm=gossip", "topology=one-peer-exponential", "consensus.target=constant",
                           "consensus.value=0.1", "consensus.measure=estimate"))


def test_exhausted_budget_falls_back_to_allreduce_or_continues():
    n, topo = 16, build_topology("ring", 16)
    for on_budget, zero in (("allreduce", True), ("continue", False)):
        engine = SimEngine(n)
        X = torch.randn(n, 10, dtype=torch.float64)
        controller = Controller(lambda step: 1e-9, max_extra_rounds=3, on_budget=on_budget)
        metrics = controller.control(engine, X, Step(0), lambda: engine.gossip_(X, topo.mixing(0)))
        assert metrics["extra_gossip_rounds"] == 3 and metrics["control_allreduce"] == zero
        levels = dict(engine.comm.rounds_by_level)
        assert (engine.consensus_distance_sq(X) < 1e-25) == zero
        # the rounds, the fallback, and the probes of Ξ² they were decided from (before, after each round)
        assert (levels["gossip"], levels["global"], levels["control"]) == (3, zero, 2 * (1 + 3))


@pytest.mark.parametrize("name", ["complete", "ring", "torus", "exponential", "one-peer-exponential",
                                  "random-regular:3", "erdos-renyi:0.3"])
def test_local_estimate_bounds_the_consensus_distance(name):
    n = 16
    topo, engine = build_topology(name, n, seed=3), SimEngine(n)
    for t in range(topo.period + 2):
        X = torch.randn(n, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(t)) * (t + 1)
        xi_before = math.sqrt(engine.consensus_distance_sq(X))
        theta = math.sqrt(engine.mean_scalar(engine.gossip_(X, topo.mixing(t), measure=True)))
        xi_after = math.sqrt(engine.consensus_distance_sq(X))
        p = topo.mixing(t).p
        if p > 0:
            assert xi_before <= 2 / p * theta + 1e-12
            assert xi_after <= xi_before + 1e-12
        assert theta > 0 or xi_before < 1e-12 or p == 0


def test_controlled_training_keeps_xi_under_a_constant_target():
    rows, summary = rows_of("algorithm=gossip", "consensus.target=constant", "consensus.value=1e-4",
                            "consensus.max_extra_rounds=1000")
    assert all(math.sqrt(r["consensus_distance_sq"]) <= 1e-4 for r in rows)
    assert all(r["consensus_distance_sq_before_control"] >= r["consensus_distance_sq"] for r in rows)
    extra = sum(r["extra_gossip_rounds"] for r in rows)
    assert extra > 0 and summary["extra_gossip_rounds"] == extra
    assert summary["comm_rounds_gossip"] == summary["steps"] + extra and summary["comm_rounds_global"] == 0  # no fallback
    assert summary["comm_rounds_control"] == 2 * (summary["steps"] + extra)  # Ξ²: x̄'s all-reduce and a scalar's
    assert summary["comm_rounds"] == summary["comm_rounds_gossip"] + summary["comm_rounds_control"]


def test_metrics_rows_carry_the_local_estimate_and_gradient_norms():
    rows, _ = rows_of("algorithm=gossip")
    for r in rows:
        assert r["theta_sq"] > 0 and r["grad_norm_sq"] > 0
        assert math.sqrt(r["consensus_distance_sq"]) <= r["consensus_distance_bound"] + 1e-12
    assert rows[1]["grad_norm_sq_ema"] == pytest.approx(0.9 * rows[0]["grad_norm_sq"] + 0.1 * rows[1]["grad_norm_sq"])
    evaluated = [r for r in rows if "consensus_distance_sq_per_layer" in r]
    per_layer = evaluated[-1]["consensus_distance_sq_per_layer"]
    assert sum(per_layer.values()) == pytest.approx(evaluated[-1]["consensus_distance_sq"], rel=1e-9)
    assert "0.weight" in per_layer


def test_gradient_target_is_c_eta_sqrt_phi_ema_over_p():
    rows, _ = rows_of("algorithm=gossip", "consensus.target=gradient", "consensus.factor=0.5")
    rho = 1 - (1 + 2 * math.cos(2 * math.pi / 4)) / 3
    p = 1 - (1 - rho) ** 2
    for r in rows:
        assert r["consensus_target"] == pytest.approx(0.5 * r["lr"] * math.sqrt(r["grad_norm_sq_ema"]) / p)


def test_phases_switch_at_the_right_steps():
    rows, summary = rows_of("algorithm=gossip", "epochs=3", "phases=[allreduce,gossip,allreduce]",
                            "phase_epochs=[0.5,1.5]")
    assert [r["phase"] for r in rows] == [1] * 6 + [2] * 12 + [3] * 18
    for r in rows:
        decentralized = r["phase"] == 2 and r["step"] != 18  # the last gossip step ends with an average
        assert (r["consensus_distance_sq"] > 1e-12) == decentralized
    # momentum 0: no optimizer state to average when phase 3 starts, so one all-reduce there
    assert summary["comm_rounds_gossip"] == 12 and summary["comm_rounds_global"] == 6 + 1 + 18


def test_all_reduce_phase_after_gossip_stays_in_consensus_with_momentum():
    rows, _ = rows_of("algorithm=gossip", "epochs=2", "momentum=0.9", "phases=[gossip,allreduce]", "phase_epochs=[1]")
    assert rows[S - 2]["consensus_distance_sq"] > 1e-8
    assert all(r["consensus_distance_sq"] < 1e-20 for r in rows[S - 1:])


def test_lr_phases_follow_the_milestones():
    rows, _ = rows_of("algorithm=gossip", "epochs=3", "milestones=[1,2]", "phases=[gossip,allreduce,allreduce]")
    assert [r["phase"] for r in rows] == [1] * S + [2] * S + [3] * S
    assert rows[S]["lr"] == pytest.approx(0.1 * rows[0]["lr"])


def test_run_reference_is_read_and_aligned_by_step(tmp_path, capsys):
    ref = tmp_path / "ring"
    sets = ["--set", "workers=4", "--set", "epochs=2", "--set", "num_samples=1000", "--set", "algorithm=gossip"]
    assert main(["train", *sets, "--quiet", "--out", str(ref)]) == 0
    ref_rows = [json.loads(line) for line in (ref / "metrics.jsonl").read_text().splitlines()]
    smoothed = ema([math.sqrt(r["consensus_distance_sq"]) for r in ref_rows], 0.9)
    rows, _ = rows_of("algorithm=gossip", f"consensus.target=run:{ref}", "consensus.factor=0.25",
                      "dtype=float32", "momentum=0.9", "nesterov=true")
    for r, s in zip(rows, smoothed):
        assert r["consensus_target"] == pytest.approx(0.25 * s)
        assert math.sqrt(r["consensus_distance_sq"]) <= r["consensus_target"] + 1e-9


def test_bad_run_reference_gives_clear_errors(tmp_path, capsys):
    with pytest.raises(ConfigError, match="no metrics.jsonl"):
        build(small_config("algorithm=gossip", f"consensus.target=run:{tmp_path / 'missing'}"))
    ref = tmp_path / "short"
    sets = ["--set", "workers=4", "--set", "epochs=1", "--set", "num_samples=1000", "--set", "algorithm=gossip"]
    assert main(["train", *sets, "--quiet", "--out", str(ref)]) == 0
    with pytest.raises(ConfigError, match="has 12 steps; this run needs 24"):
        build(small_config("algorithm=gossip", f"consensus.target=run:{ref}"))
    with pytest.raises(ConfigError, match="incompatible: it has workers = 4"):
        build(small_config("algorithm=gossip", "workers=2", f"consensus.target=run:{ref}"))


# ---------------------------------------------------------------- control by communication frequency

FREQUENCY = ["algorithm=gossip", "consensus.target=constant", "consensus.action=frequency"]
FREQUENCY_KEYS = ("gossip_period", "consensus_target", "consensus_distance_sq_before_round", "gossip_rounds_saved")


def test_frequency_rule_halves_above_the_target_lengthens_with_room_for_one_more_step_and_holds_in_between():
    """Lengthen H only if Ξ² ≤ target²·H/(H + 1): at H = 2 below Ξ = 0.8165, at H = 3 below 0.8660."""
    control = FrequencyControl(lambda step: 1.0, fixed=2, max_local_steps=4)
    periods = []
    for xi in (0.82, 0.81, 0.87, 0.86, 0.1, 1.01, 1.5, 5.0, 0.7, 1.0):
        control.adapt(xi**2, target=1.0)
        periods.append(control.period)
    assert periods == [2, 3, 3, 4, 4, 2, 1, 1, 2, 2]


def test_frequency_control_with_a_target_of_0_is_d_sgd_step_for_step():
    rows, summary, run = train_rows(*FREQUENCY, "consensus.value=0", "momentum=0.9")
    d_rows, d_summary, d_run = train_rows("algorithm=gossip", "momentum=0.9")
    torch.testing.assert_close(run.workers.X, d_run.workers.X, rtol=0, atol=0)
    counts = FREQUENCY_KEYS + ("comm_rounds", "bytes_per_worker")  # the probes are control's traffic
    assert [{k: v for k, v in r.items() if k not in counts} for r in rows] == \
        [{k: v for k, v in r.items() if k not in counts} for r in d_rows]
    assert all(r["gossip_period"] == 1 and r["gossip_rounds_saved"] == 0 for r in rows)
    assert all(r["consensus_distance_sq_before_round"] > r["consensus_distance_sq"] for r in rows)
    assert summary["gossip_rounds_saved"] == 0 and summary["comm_rounds_gossip"] == d_summary["comm_rounds"] == 24
    assert summary["comm_rounds_control"] == 2 * 24  # Ξ² probed before every round
    assert summary["bytes_per_worker"] == d_summary["bytes_per_worker"] + summary["bytes_per_worker_control"]
    assert summary["bytes_per_worker_metrics"] == d_summary["bytes_per_worker_metrics"]
    rows, summary, _ = train_rows(*FREQUENCY, "consensus.value=0", "local_steps=4")  # from H_0 = 4 down to 1
    assert [r["gossip_period"] for r in rows] == [4] * 4 + [2] * 2 + [1] * 18
    assert summary["comm_rounds_gossip"] == 20 and summary["gossip_rounds_saved"] == 24 // 4 - 20


def test_frequency_control_with_an_unreachable_target_lengthens_the_period_to_the_maximum():
    rows, summary, _ = train_rows(*FREQUENCY, "consensus.value=1e9", "consensus.max_local_steps=5")
    periods = [1] + [2] * 2 + [3] * 3 + [4] * 4 + [5] * 14
    assert [r["gossip_period"] for r in rows] == periods
    rounds = [r["step"] for r in rows if "theta_sq" in r]  # the steps that ended with a gossip round
    assert rounds == [1, 3, 6, 10, 15, 20]
    assert summary["comm_rounds_gossip"] == 6 and summary["comm_rounds_control"] == 2 * 6  # a probe a round
    assert summary["gossip_rounds_saved"] == sum(r["gossip_rounds_saved"] for r in rows) == 24 - 6


def test_frequency_control_acts_in_controlled_phases_only():
    rows, summary, _ = train_rows(*FREQUENCY, "consensus.value=1e9", "consensus.max_local_steps=4", "local_steps=2",
                                  "phases=[controlled,allreduce]", "phase_epochs=[1]")
    assert [r.get("gossip_period") for r in rows] == [2] * 2 + [3] * 3 + [4] * 7 + [None] * S
    # rounds after steps 2, 5, 9 and the average that ends the phase at 12; H = 2 would have gossiped 6 times
    assert summary["comm_rounds_gossip"] == 3 and summary["gossip_rounds_saved"] == 6 - 3
    assert summary["comm_rounds_global"] == 1 + S


@pytest.mark.parametrize("overrides, fragment", [
    (["algorithm=gossip", "local_steps=0"], "local_steps must be a positive integer"),
    (["algorithm=gossip", "consensus.action=sideways"], "unknown consensus.action 'sideways'"),
    ([*FREQUENCY, "consensus.value=1", "consensus.max_local_steps=0"], "consensus.max_local_steps must be a positive"),
    ([*FREQUENCY, "consensus.value=1", "local_steps=8", "consensus.max_local_steps=4"],
     "local_steps (the first gossip period, 8) must be at most consensus.max_local_steps (4)"),
    ([*FREQUENCY, "consensus.value=1", "consensus.max_extra_rounds=5"],
     "consensus.max_extra_rounds applies to consensus.action rounds, not frequency"),
    ([*FREQUENCY, "consensus.value=1", "consensus.on_budget=continue"], "consensus.on_budget applies to consensus.action"),
    (["algorithm=gossip", "consensus.target=constant", "consensus.value=1", "consensus.max_local_steps=4"],
     "consensus.max_local_steps applies to consensus.action frequency, not rounds"),
    (["algorithm=gossip", "consensus.action=frequency"], "consensus.action frequency needs consensus.target"),
    (["algorithm=gossip", "consensus.target=constant", "consensus.value=0"], "consensus.value > 0 (or 0 with"),
    (["algorithm=gossip", "phases=[gossip,controlled]", "phase_epochs=[1]"], "needs consensus.target"),
    (["algorithm=gossip", "phases=[gossip,allreduce]"], "2 modes but 0 boundaries"),
    (["algorithm=gossip", "phases=[gossip,sideways]", "phase_epochs=[1]"], "unknown phase mode"),
    (["algorithm=local", "consensus.target=gradient"], "consensus does not apply to algorithm 'local'"),
    (["algorithm=gossip", "consensus.target=gradient", "metrics_every=2"], "needs metrics_every: 1"),
    (["algorithm=gossip", "consensus.target=constant"], "consensus.value > 0"),
    (["algorithm=gossip", "consensus.target=magic"], "unknown consensus.target"),
    (["algorithm=gossip", "consensus.on_budget=panic"], "unknown consensus.on_budget"),
    (["algorithm=gossip", "consensus.bogus=1"], "unknown config key 'consensus.bogus'"),
    (["algorithm=gossip", "consensus.measure=guess"], "unknown consensus.measure 'guess'"),
    (["algorithm=gossip", "consensus.measure=estimate", "gossip_form=mix-then-step"], "needs gossip_form step-then-mix"),
    (["algorithm=gossip", "consensus.target=constant", "consensus.value=0.1", "consensus.action=frequency",
      "consensus.measure=estimate"], "consensus.measure estimate applies to consensus.action rounds, not frequency"),
])
def test_bad_consensus_options(overrides, fragment):
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        small_config(*overrides)
