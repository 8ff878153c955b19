"""Outer optimizers (:mod:`gossamer.outer`) and asynchronous local SGD, against the identities of
their rules (shared/specs/asynchronous-outer-steps.md §2.4–2.5, §4): Delayed Nesterov with N = 1,
c = 0 is torch's Nesterov SGD bit for bit (compared with torch 2.13's ``torch.optim.SGD``), its
block of N steps moves θ by −ε(mean g + β((N − 1)c·m_old + (1 − (N − 1)c)·m_new)) (HALoS's rule,
utnslab/halos 4b5bf73 ``src/halos/opt.py``; forgather's double count fails it); DyLU's steps;
asynchronous local SGD with equal speeds and all n pushes in one window is DiLoCo; the server's
traffic and the clock against closed forms."""

import math
from pathlib import Path

import pytest
import torch
from cases import SHORT
from conftest import small_config
from test_bad_input import one_line_error, sets

from gossamer.algorithms.async_local import local_steps_of
from gossamer.config import load_config
from gossamer.optim import SGD
from gossamer.outer import DelayedNesterov, Momentum, OuterAdam, OuterSchedule, OuterStep
from gossamer.train import build_run, train


def gradients(steps: int, d: int = 5, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, d, generator=g, dtype=torch.float64) for _ in range(steps)]


def test_default_outer_optimizer_is_the_earlier_nesterov_sgd_bit_for_bit():
    """The registry's ``nesterov`` does the arithmetic of the row SGD DiLoCo stepped before it."""
    x, y = torch.ones(3, 5, dtype=torch.float64), torch.ones(3, 5, dtype=torch.float64)
    ours, before = Momentum(True, 0.9), SGD(y, 0.9, True)
    ours.start(x)
    for g in gradients(6, seed=1):
        ours.step(x, g.expand(3, 5).clone(), 0.7, 0.9)
        before.step(y, g.expand(3, 5).clone(), 0.7)
    assert torch.equal(x, y)


@pytest.mark.parametrize("nesterov", [True, False])
def test_momentum_outer_optimizers_are_torch_sgd_bit_for_bit(nesterov):
    p = torch.nn.Parameter(torch.zeros(5, dtype=torch.float64))
    torch_sgd = torch.optim.SGD([p], lr=0.7, momentum=0.9, nesterov=nesterov, foreach=False)
    x, ours = torch.zeros(1, 5, dtype=torch.float64), Momentum(nesterov, 0.9)
    ours.start(x)
    for g in gradients(7):
        p.grad = g[0].clone()
        torch_sgd.step()
        ours.step(x, g.clone(), 0.7, 0.9)
    assert torch.equal(x[0], p.detach())


def test_delayed_nesterov_with_one_step_a_block_is_torch_nesterov_bit_for_bit():
    p = torch.nn.Parameter(torch.zeros(5, dtype=torch.float64))
    torch_sgd = torch.optim.SGD([p], lr=0.7, momentum=0.9, nesterov=True, foreach=False)
    x, dn = torch.zeros(1, 5, dtype=torch.float64), DelayedNesterov(1, 0.0)
    dn.start(x)
    for g in gradients(7, seed=2):
        p.grad = g[0].clone()
        torch_sgd.step()
        dn.step(x, g.clone(), 0.7, 0.9)
    assert torch.equal(x[0], p.detach())


@pytest.mark.parametrize("spread", [0.0, 0.1, 0.25])
def test_a_delayed_nesterov_block_moves_by_the_block_mean_and_its_momentum(spread):
    """Over each block of N = 4 steps: θ moves by −ε(Σg/N + β((N−1)c·m_old + (1−(N−1)c)·m_new)),
    m_new = βm_old + Σg/N: the momentum's coefficients sum to 1 (c = 0: Nesterov on the block mean)."""
    N, lr, beta = 4, 0.5, 0.9
    x, dn = torch.zeros(1, 5, dtype=torch.float64), DelayedNesterov(N, spread)
    dn.start(x)
    m = torch.zeros_like(x)
    for block in range(3):
        gs, before = gradients(N, seed=10 + block), x.clone()
        for g in gs:
            dn.step(x, g.clone(), lr, beta)
        mean = sum(gs) / N
        m_new = beta * m + mean
        expected = before - lr * (mean + beta * ((N - 1) * spread * m + (1 - (N - 1) * spread) * m_new))
        torch.testing.assert_close(x, expected, rtol=0, atol=1e-14)
        m = m_new
    torch.testing.assert_close(dn.rows["momentum"], m, rtol=0, atol=1e-14)


def test_adam_outer_optimizer_is_torch_adam():
    p = torch.nn.Parameter(torch.zeros(5, dtype=torch.float64))
    torch_adam = torch.optim.Adam([p], lr=0.01, betas=(0.8, 0.999), eps=1e-8, foreach=False)
    x, ours = torch.zeros(1, 5, dtype=torch.float64), OuterAdam()
    ours.start(x)
    for g in gradients(6, seed=3):
        p.grad = g[0].clone()
        torch_adam.step()
        ours.step(x, g.clone(), 0.01, 0.8)
    torch.testing.assert_close(x[0], p.detach(), rtol=0, atol=1e-15)


def test_outer_schedules_are_their_closed_forms():
    """ε_k = ε·min(1, (k+1)/K)·d(t/T), β_k the same with its own K and decay; none: ε and β exactly."""
    schedule = OuterSchedule(0.8, 0.9, lr_warmup=4, lr_decay="cosine", momentum_warmup=2, momentum_decay="linear",
                             total=100)
    assert schedule.at(0, 0) == (0.8 * 0.25, 0.9 * 0.5)
    lr, momentum = schedule.at(5, 50)
    assert lr == pytest.approx(0.8 * 0.5) and momentum == pytest.approx(0.9 * 0.5)
    assert OuterSchedule(1.3, 0.9, total=10).at(7, 9) == (1.3, 0.9)  # an outer lr above 1 is legal
    outer, seen = OuterStep(Momentum(False, 0.9), OuterSchedule(1.0, 0.0, lr_warmup=2)), []
    outer.optimizer.step = lambda x, g, lr, momentum, staleness: seen.append(lr)
    for t in range(3):
        outer.step(None, None, t)
    assert seen == [0.5, 1.0, 1.0] and outer.steps == 3


def test_dylu_gives_each_worker_its_share_of_the_fastest_workers_steps():
    """H_w = max(H_min, ⌊(v_w / max v)·H⌋): with 0.5@3 half the workers take ⌊6/3⌋ = 2 of H = 6;
    equal speeds: every H_w = H."""
    cfg = small_config("algorithm=async-local-sgd", "local_steps=6", "network=ethernet-1g", "compute_ms=1",
                       "slow_workers=0.5@3", "dylu=true")
    assert sorted(local_steps_of(cfg)) == [2, 2, 6, 6]
    cfg = small_config("algorithm=async-local-sgd", "local_steps=6", "network=ethernet-1g", "compute_ms=1",
                       "slow_workers=0.5@8", "dylu=true", "dylu_min_steps=3")
    assert sorted(local_steps_of(cfg)) == [3, 3, 6, 6]
    assert local_steps_of(small_config("algorithm=async-local-sgd", "local_steps=6")) == [6] * 4
    cfg = small_config("algorithm=async-local-sgd", "local_steps=20", "network=ethernet-1g", "compute_ms=1",
                       "worker_speeds=[0.58,0.75,1.51,3.33]", "dylu=true")  # the authors' toy's speeds
    assert local_steps_of(cfg) == [20, 15, 7, 3]


@pytest.mark.parametrize("inner", [["optimizer=sgd", "momentum=0.9"], ["optimizer=adamw"]])
def test_async_with_equal_speeds_and_one_window_for_all_is_diloco(inner):
    """Equal speeds, no network: all n pushes arrive at once and share the window, so every worker
    restarts from the same θ; Delayed Nesterov with N = n, c = 0 and unit weights moves it by
    Nesterov on the mean pseudo-gradient — DiLoCo at the same ε and β. Not bit for bit: DN sums the
    n pushes one by one, DiLoCo averages the models (the same values to float64 rounding)."""
    common = [*SHORT, "local_steps=3", "outer_lr=0.7", "outer_momentum=0.9", *inner]
    runs = {}
    for algorithm in ("diloco", "async-local-sgd"):
        cfg = load_config(None, [*common, f"algorithm={algorithm}"])
        run, rows = build_run(cfg), []
        summary = train(cfg, run, on_row=rows.append)
        runs[algorithm] = run, rows, summary
    (sync, sync_rows, _), (server, server_rows, summary) = runs["diloco"], runs["async-local-sgd"]
    torch.testing.assert_close(server.schedule.theta[0], sync.schedule.x_outer[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(server.workers.X, sync.workers.X, rtol=0, atol=1e-12)
    assert [r["loss"] for r in server_rows] == pytest.approx([r["loss"] for r in sync_rows], abs=1e-12)
    assert summary["pushes"] == 4 * 4 and summary["staleness_max"] == 3  # n pushes a round, 12 steps / H
    assert summary["staleness_mean"] == 1.5  # the k-th push of a window is k − 1 versions late


def test_a_push_and_a_pull_are_one_model_each_on_the_workers_link():
    """bytes_per_worker = (pushes + pulls)·b/n, all of it at level server; messages the same count."""
    cfg = small_config("algorithm=async-local-sgd", "local_steps=2", "network=ethernet-1g", "compute_ms=1",
                       "slow_workers=0.25@3")
    run = build_run(cfg)
    summary = train(cfg, run)
    b, n = run.workers.d * 8, cfg.workers
    moved = summary["pushes"] + summary["pulls"]
    assert summary["pulls"] <= summary["pushes"]
    assert summary["bytes_per_worker"] == pytest.approx(moved * b / n, rel=1e-15)
    assert summary["bytes_per_worker_server"] == summary["bytes_per_worker"]
    assert summary["messages_per_worker"] == pytest.approx(moved / n, rel=1e-15)


def test_compute_utilization_of_a_two_speed_run_is_its_closed_form():
    """Two speeds balanced by DyLU (s = 1: H = 3 steps; s = 3: 1 step; each round 3c of compute) on
    a link of latency α and (almost) no transfer time: every round costs 3c + 2α (a push, then a
    pull as it arrives), all workers alike. After 12 loop steps (48 inner steps: 6 rounds, the
    sixth's pushes sent, not arrived) T = 18c + 11α, compute_utilization = 18c / (18c + 11α) for
    every worker, and nobody waited."""
    c, alpha = 4e-3, 1e-3
    cfg = load_config(None, [*SHORT, "algorithm=async-local-sgd", "local_steps=3", "network.bandwidth=1e6",
                             "network.latency=1000", "compute_ms=4", "slow_workers=0.5@3", "dylu=true"])
    summary = train(cfg)
    assert summary["pushes"] == 24 and summary["pulls"] == 20 and summary["server_version"] == 20
    assert summary["sim_seconds"] == pytest.approx(18 * c + 11 * alpha, rel=1e-6)
    assert summary["compute_utilization"] == pytest.approx(18 * c / (18 * c + 11 * alpha), rel=1e-6)
    assert summary["compute_utilization_min"] == pytest.approx(18 * c / (18 * c + 11 * alpha), rel=1e-6)
    assert summary["idle_seconds"] < 1e-7


def test_a_push_waits_while_the_servers_link_carries_another():
    """The same run on 1 Gbit/s (h = b/β ≈ 1 ms a model): round 1's four pushes, sent together,
    queue on the server's link, the j-th waiting j·h; the later rounds leave h apart and wait no more."""
    cfg = load_config(None, [*SHORT, "algorithm=async-local-sgd", "local_steps=3", "network.bandwidth=1",
                             "network.latency=1000", "compute_ms=4", "slow_workers=0.5@3", "dylu=true"])
    run = build_run(cfg)
    train(cfg, run)
    h = run.workers.d * 8 / (1e9 / 8)
    assert sorted(run.clock.idle) == pytest.approx([0, h, 2 * h, 3 * h], rel=1e-9)


def test_a_grace_window_holds_the_pushes_of_the_faster_workers():
    """With a window as long as the slow workers' extra compute, each round's pushes meet in one window:
    every worker pulls the same θ, so the rounds are synchronous (staleness up to n − 1, no worker
    runs ahead) and the fast workers wait for the slow ones."""
    common = ["algorithm=async-local-sgd", "local_steps=2", "network.bandwidth=1000", "network.latency=0",
              "compute_ms=1", "slow_workers=0.5@2"]
    open_summary = train(small_config(*common))
    held_summary = train(small_config(*common, "grace_window=0.0021"))
    assert held_summary["staleness_max"] == 3 < open_summary["staleness_max"]
    assert held_summary["sim_seconds"] > 1.5 * open_summary["sim_seconds"]  # the same inner steps
    assert open_summary["compute_utilization_min"] > 0.99 > 0.5 > held_summary["compute_utilization_min"]


@pytest.mark.parametrize("overrides, fragment", [
    (["engine=dist", "network.bandwidth=1000", "network.latency=0", "compute_ms=1"],
     "async-local-sgd on engine dist runs on a real network: drop the network section"),
    (["engine=dist", "server_rank=-1"], "server_rank must be a rank >= 0"),
    (["server_rank=1"], "server_rank applies only to engine dist"),
    (["engine=dist", "compute_ms=1"], "compute_ms applies only with a network section"),
    (["grace_window=-1"], "grace_window must be >= 0"),
    (["grace_window=0.1"], "grace_window is in simulated seconds: it needs a network section"),
    (["dylu=true"], "dylu sets each worker's steps from its speed: it needs slow_workers"),
    (["dylu_min_steps=2"], "dylu_min_steps applies only with dylu: true"),
    (["outer_buffer=0"], "outer_buffer (N) must be a positive integer"),
    (["outer_spread=0.5"], "outer_spread (c) must be in [0, 1/(N-1)]"),
    (["outer_optimizer=nesterov", "outer_buffer=2"], "outer_buffer applies only with outer_optimizer: delayed-nesterov"),
    (["outer_optimizer=lion"], "unknown outer_optimizer 'lion'; choose one of: nesterov, sgd, adam, delayed-nesterov"),
    (["async_weight=linear"], "unknown async_weight 'linear'; choose one of: unit, constant, polynomial"),
    (["inner_state=average"], "unknown inner_state 'average'"),
    (["outer_lr_decay=step"], "unknown outer_lr_decay 'step'"),
    (["outer_momentum_warmup=-1"], "outer_momentum_warmup must be a number of outer steps >= 0"),
    (["network=ethernet-1g"], "give compute_ms in milliseconds"),
    (["network=ethernet-1g", "compute_ms=1", "network.count_metrics=true"], "count_metrics holds every worker"),
    (["average_optimizer_state=true"], "keeps each worker's optimizer state"),
    (["worker_speeds=[1,2]"], "worker_speeds applies only with a network section"),
    (["network=ethernet-1g", "compute_ms=1", "worker_speeds=[1,2]"], "worker_speeds must be a list of 16 numbers > 0"),
    (["network=ethernet-1g", "compute_ms=1", "worker_speeds=[1,2,0,1]"], "worker_speeds must be a list of 16"),
    (["network=ethernet-1g", "compute_ms=1", "worker_speeds=[1,2,3,4]", "slow_workers=0.5@2"],
     "give slow_workers or worker_speeds, not both"),
])
def test_bad_async_options_are_refused_in_one_line(overrides, fragment, capsys):
    one_line_error(capsys, ["train", *sets("algorithm=async-local-sgd", "num_samples=1000", *overrides)], fragment)


@pytest.mark.parametrize("overrides, fragment", [
    (["algorithm=gossip", "outer_optimizer=adam"], "outer_optimizer does not apply to algorithm 'gossip'"),
    (["algorithm=allreduce", "outer_lr_warmup=3"], "outer_lr_warmup does not apply to algorithm 'allreduce'"),
    (["algorithm=local", "dylu=true"], "dylu does not apply to algorithm 'local'"),
    (["algorithm=diloco", "outer_lr=0"], "diloco needs outer_lr > 0"),
])
def test_outer_keys_are_refused_where_there_is_no_outer_step(overrides, fragment):
    from gossamer.config import ConfigError
    with pytest.raises(ConfigError, match=fragment):
        load_config(None, overrides)


def test_evaluation_is_of_the_servers_model():
    """The rows' test metrics are θ's, not the mean of the workers' models mid-round."""
    cfg = small_config("algorithm=async-local-sgd", "local_steps=5", "epochs=1")
    run = build_run(cfg)
    train(cfg, run)
    assert torch.equal(run.schedule.model_row(run.engine, run.workers.X), run.schedule.theta[0])
    assert not torch.equal(run.schedule.theta[0], run.engine.mean_row(run.workers.X))
    assert math.isfinite(float(run.schedule.theta.sum()))


def test_a_plugin_outer_optimizer_is_given_each_pushs_staleness(tmp_path):
    """docs/extending.md's staleness-aware rule, registered from its text: it steps once a push, with
    the staleness the server counted, and moves θ by −ε·g/(1 + τ)."""
    import re

    from gossamer.outer import OUTER_OPTIMIZERS

    text = (Path(__file__).resolve().parents[1] / "docs" / "extending.md").read_text()
    section = text[text.index("## An outer optimizer"):]
    namespace = {}
    exec(re.search(r"```python\n(.*?)```", section, re.S).group(1), namespace)
    try:
        cfg = small_config("algorithm=async-local-sgd", "local_steps=2", "outer_optimizer=damped", "epochs=1",
                           "network.bandwidth=1", "network.latency=100", "compute_ms=1", "slow_workers=0.5@2")
        run = build_run(cfg)
        seen, step = [], run.schedule.outer.optimizer.step

        def recorded(x_outer, g, lr, momentum, staleness=0):
            before = x_outer.clone()
            expected = before - lr * g / (1 + staleness)
            step(x_outer, g, lr, momentum, staleness)
            torch.testing.assert_close(x_outer, expected, rtol=0, atol=1e-15)
            seen.append(staleness)
        run.schedule.outer.optimizer.step = recorded
        summary = train(cfg, run)
    finally:
        del OUTER_OPTIMIZERS.entries["damped"]
    assert len(seen) == summary["server_version"] and max(seen) == summary["staleness_max"] > 0
    assert sum(seen) / len(seen) == pytest.approx(summary["staleness_mean"])
