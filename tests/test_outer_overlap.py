"""Overlapped outer steps of DiLoCo (``outer_overlap``), against the identities of the rules
(shared/specs/asynchronous-outer-steps.md §1.7, §4): eager with one replica is DiLoCo bit for
bit; with outer momentum 0, eager's replicas telescope to x^(0) − ε[Σ_{s<r} Δ^(s) + Δ_m^(r)/M] and
delayed's outer model to x^(0) − ε Σ_{s<r} Δ^(s), with Δ^(s) the run's own all-reduced means (a
replica that used the torchft fork's Δ_m/M + (M−1)/M·Δ^(r−1), or applied Δ^(r) at once, fails
them); the all-reduce runs behind the next round's compute on the clock."""

import pytest
import torch
from cases import SHORT
from conftest import small_config

from gossamer.config import load_config
from gossamer.engines.base import Work
from gossamer.testing import hook_difference
from gossamer.train import Interrupted, build_run, train

NET = ["network.bandwidth=1", "network.latency=50", "network.count_metrics=false"]  # 1 Gbit/s, 50 µs
A1, B1 = 50e-6, 1e9 / 8


def rounds(*overrides: str):
    """A DiLoCo run with the overrides; (its initial model, the run, after each overlapped send of
    fragment 0: (Δ^(r) in flight, each replica's Δ_m^(r) (eager), x_outer))."""
    cfg = load_config(None, [*SHORT, "algorithm=diloco", *overrides])
    run = build_run(cfg)
    start, schedule, seen = run.workers.X.clone(), run.schedule, []
    step = schedule._overlapped_step

    def recorded(engine, X, j, t):
        step(engine, X, j, t)
        seen.append((schedule.pending[j].wait().clone(), schedule.own[j].clone() if schedule.own else None,
                     schedule.x_outer.clone()))
    schedule._overlapped_step = recorded
    train(cfg, run)
    return start, run, seen


@pytest.mark.parametrize("codec", ["none", "ef-top-k:0.1"])
def test_eager_with_one_replica_is_diloco_bit_for_bit(codec):
    """M = 1: Δ^(r−1) is the replica's own Δ_1^(r−1), so Δ̂ = Δ_1^(r) exactly — with a codec, only
    if the own share subtracted is the decoded message, as the all-gather delivers it."""
    runs = {}
    for overlap in ("none", "eager"):
        cfg = load_config(None, [*SHORT, "algorithm=diloco", "workers=1", "local_steps=3", f"compression={codec}",
                                 f"outer_overlap={overlap}"])
        run = build_run(cfg)
        train(cfg, run)
        runs[overlap] = run
    assert torch.equal(runs["eager"].workers.X, runs["none"].workers.X)
    assert torch.equal(runs["eager"].schedule.x_outer, runs["none"].schedule.x_outer)


def test_eager_replicas_are_their_own_fresh_share_and_the_others_one_round_late():
    """Outer momentum 0: θ_m^(r) = θ^(0) − ε[Σ_{s<r} Δ^(s) + Δ_m^(r)/M], so the replicas differ by
    exactly −(ε/M)(Δ_m^(r) − Δ_m'^(r)) and their mean lags a DiLoCo step by ε(1 − 1/M)Δ^(r)."""
    lr, M = 0.7, 4
    start, run, seen = rounds("local_steps=3", "outer_overlap=eager", "outer_momentum=0", f"outer_lr={lr}")
    assert len(seen) == 4  # 12 steps, H = 3
    applied = torch.zeros_like(start)
    for mean, own, x_outer in seen:
        expected = start - lr * (applied + own / M)
        assert (x_outer - expected).abs().max() < 1e-12
        applied += mean
    spread = seen[-1][2] - seen[-1][2][:1]
    assert spread.abs().max() > 1e-6  # the replicas do differ
    assert (spread + lr / M * (seen[-1][1] - seen[-1][1][:1])).abs().max() < 1e-12


def test_delayed_applies_the_previous_rounds_mean_and_makes_no_first_step():
    """Outer momentum 0: x_outer^(r) = x^(0) − ε Σ_{s<r} Δ^(s) on every replica (the first round
    leaves x^(0)), and the workers restart from it."""
    lr = 0.7
    start, run, seen = rounds("local_steps=3", "outer_overlap=delayed", "outer_momentum=0", f"outer_lr={lr}")
    assert torch.equal(seen[0][2], start)  # PCCL: no outer gradient in hand, no outer step
    applied = torch.zeros_like(start)
    for mean, _, x_outer in seen:
        assert (x_outer - (start - lr * applied)).abs().max() < 1e-12
        assert torch.equal(x_outer, x_outer[:1].expand_as(x_outer))  # the replicas stay identical
        applied += mean


def test_eager_first_sync_is_one_diloco_step_then_eager():
    """``eager_first: sync``: the first round is DiLoCo's (bit for bit), the second is not."""
    def after(steps: int, *overrides: str) -> torch.Tensor:
        cfg = load_config(None, [*SHORT, "algorithm=diloco", "local_steps=3", "metrics_every=1", *overrides])
        run, rows = build_run(cfg), []
        with pytest.raises(Interrupted):
            train(cfg, run, on_row=rows.append, stop=lambda: len(rows) == steps)
        return run.workers.X.clone()
    assert torch.equal(after(3, "outer_overlap=eager", "eager_first=sync"), after(3))
    assert not torch.equal(after(3, "outer_overlap=eager"), after(3))
    assert not torch.equal(after(6, "outer_overlap=eager", "eager_first=sync"), after(6))


@pytest.mark.parametrize("overlap", ["none", "delayed", "eager"])
@pytest.mark.parametrize("compute_ms", [0.01, 5.0])  # the all-reduce longer, and shorter, than a round's compute
def test_the_outer_all_reduce_runs_behind_the_next_rounds_compute(overlap, compute_ms):
    """H = 3: a round's all-reduce of d float64 values costs max(0, τ − 3c) overlapped, τ without."""
    rows = []
    cfg = small_config("algorithm=diloco", "local_steps=3", "epochs=1", f"outer_overlap={overlap}", *NET,
                       f"compute_ms={compute_ms}")
    summary = train(cfg, build_run(cfg), on_row=rows.append)
    n, d, c, steps = 4, summary["parameters"], compute_ms / 1000, summary["steps"]
    tau = 2 * (n - 1) * (A1 + d * 8 / (n * B1))
    exposed = tau if overlap == "none" else max(0.0, tau - 3 * c)
    assert summary["sim_seconds"] == pytest.approx(steps * c + steps // 3 * exposed, rel=1e-12)
    assert summary["compute_utilization"] == pytest.approx(steps * c / summary["sim_seconds"], rel=1e-12)


@pytest.mark.parametrize("overlap", ["delayed", "eager"])
def test_a_users_loop_with_the_diloco_hooks_runs_the_same_overlap(overlap):
    """gossamer.integrations.DiLoCo(outer_overlap=...) with torch's own optimizers, 4 workers in
    threads: the simulator's parameters (1e-10) and its traffic counts."""
    where, delta = hook_difference(["algorithm=diloco", "local_steps=2", f"outer_overlap={overlap}",
                                    "outer_lr=0.7", "outer_momentum=0.9"])
    assert where is None and delta <= 1e-10


def waits(*overrides: str) -> list[tuple[int, int]]:
    """(the step after which each outer transfer started, the step after which it was waited for)
    in a DiLoCo run: the schedule's engine wrapped so that each Work records when it is waited on."""
    cfg = load_config(None, [*SHORT, "algorithm=diloco", "checkpoint_every=2", *overrides])  # one, at the end
    run = build_run(cfg)
    engine, schedule, now, log = run.engine, run.schedule, [None], []
    after_step = schedule.after_step

    def stepping(engine, X, step):
        now[0] = step.t
        return after_step(engine, X, step)

    def timed(operator):
        def started(*args, async_op=False, **kwargs):
            work = operator(*args, async_op=async_op, **kwargs)
            if not async_op:
                return work
            sent = now[0]
            return Work(lambda: log.append((sent, now[0])) or work.wait())
        return started
    schedule.after_step = stepping
    engine.allreduce_mean_, engine.all_gather = timed(engine.allreduce_mean_), timed(engine.all_gather)
    train(cfg, run)
    return log


@pytest.mark.parametrize("overrides, after", [
    (["local_steps=4", "fragments=2", "fragment_delay=3"], 3),  # Streaming DiLoCo: applied τ steps later
    (["local_steps=4", "fragments=2", "fragment_delay=3", "compression=ef-top-k:0.1"], 3),  # its all-gather
    (["local_steps=3"], 0),  # DiLoCo: at once
    (["local_steps=3", "outer_overlap=delayed"], 3),  # consumed at the next round's send
    (["local_steps=3", "outer_overlap=eager", "compression=ef-top-k:0.1"], 3)])
def test_an_outer_transfer_is_waited_for_where_it_is_consumed_not_where_it_starts(overrides, after):
    """What the algorithm has in flight is started with async_op and waited for only where the
    algorithm consumes it: the inner steps between run while it travels (on the dist engine, for
    real). The final checkpoint (after step 11) waits for what is still in flight."""
    log = waits(*overrides)
    assert len(log) >= 3
    for sent, waited in log:
        assert waited == sent + after or waited == 11 < sent + after, (sent, waited)
