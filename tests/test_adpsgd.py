"""AD-PSGD (Lian et al., ICML 2018): the event-driven simulation against the paper's update."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from cases import DIRECTED
from conftest import small_config

from gossamer.algorithms import StepIO
from gossamer.algorithms.asynchronous import ADPSGD
from gossamer.cli import main
from gossamer.engines.sim import SimEngine
from gossamer.network import Speeds
from gossamer.rng import row_uniforms
from gossamer.topology import build_topology
from gossamer.train import build_run, epoch_indices, lr_at, train
from gossamer.workers import WorkerMatrix

STRAGGLERS = ["algorithm=ad-psgd", "topology=ring", "workers=6", "epochs=1", "network=ethernet-10g", "compute_ms=1",
              "network.count_metrics=false", "slow_workers=0.2@3", "compute_jitter=lognormal:0.5", "model=mlp",
              "grad_backend=loop", "metrics_every=100"]


def reference(cfg, run) -> tuple[torch.Tensor, np.ndarray, int]:
    """(X, each worker's clock: when its last exchange ended, the pair averages) of the paper's
    Algorithm 1 as moments of each worker in (time, worker) order, in float64: a read x̂_i ← x_i
    when i's gradient begins, then c·s_i·ε_i(k) later its event: the gradient at x̂_i, a neighbour j
    drawn from i's neighbours in W_k by (seed, k, i), x_i, x_j ← (x_i + x_j)/2, x_i ← x_i − η g_i;
    i's next read is τ after its event (the two models cross the link)."""
    n, S = cfg.workers, run.steps_per_epoch
    one = WorkerMatrix(copy.deepcopy(run.workers.template), 1, backend="loop", loss=run.task.loss)
    X = run.workers.X.clone()
    topology = build_topology(cfg.topology, n, seed=cfg.seed)
    speeds, c = Speeds.of(cfg), cfg.compute_ms / 1000
    tau = cfg.network.link.message(X.shape[1] * X.element_size())  # d float64 values
    moment = [(0.0, "read")] * n  # each worker's next moment
    count, read, clocks, events, pairs = [0] * n, X.clone(), np.zeros(n), 0, 0
    while events < cfg.epochs * S * n:
        i = min(range(n), key=lambda w: (moment[w][0], w))
        now, kind = moment[i]
        if kind == "read":
            read[i] = X[i]
            moment[i] = (now + c * speeds.factor(count[i], i), "event")
            continue
        k = count[i]
        idx = epoch_indices(run, k // S)[k % S, i]
        one.X[0] = read[i]
        one.loss_and_grad(run.data.x_train[idx][None], run.data.y_train[idx][None])
        W = topology.mixing(k)
        peers = sorted({int(j) for j, w in zip(W.index[:, i], W.weight[:, i]) if w and j != i})
        wait = 0.0
        if peers:
            u = row_uniforms("ad-psgd-neighbour", cfg.seed, k, rows=[i], width=1)[0, 0]  # worker i's row
            j = peers[int(u * len(peers))]
            X[i] = X[j] = (X[i] + X[j]) / 2
            wait, pairs = tau, pairs + 1
        X[i] -= lr_at(cfg, events // n, S) * one.G[0]
        count[i], events = k + 1, events + 1
        clocks[i] = now + wait
        moment[i] = (clocks[i], "read")
    return X, clocks, pairs


@pytest.mark.parametrize("topology", ["ring", "random-matching"])
def test_the_simulation_is_the_papers_update_event_by_event(topology):
    """Against the paper's Algorithm 1 replayed moment by moment (above): the rows, the clocks,
    and the traffic (a pair average: both models cross once, 2·d·8 bytes among the n workers)."""
    cfg = small_config(*STRAGGLERS, f"topology={topology}")
    expected, clocks, pairs = reference(cfg, build_run(cfg))
    run = build_run(cfg)
    summary = train(cfg, run)
    assert run.schedule.calls < cfg.epochs * run.steps_per_epoch * cfg.workers  # gradients were batched
    torch.testing.assert_close(run.workers.X, expected, rtol=0, atol=1e-12)
    assert summary["sim_seconds"] == pytest.approx(clocks.max(), rel=1e-12)
    # nobody waits in an exchange: the only idle time is the end of the run, until the last one's
    assert summary["sim_seconds_idle_fraction"] == pytest.approx((1 - clocks / clocks.max()).mean(), rel=1e-9)
    d = run.workers.X.shape[1]
    assert summary["comm_rounds"] == pairs and 0 < pairs <= cfg.epochs * run.steps_per_epoch * cfg.workers
    assert summary["bytes_per_worker"] == pytest.approx(pairs * 2 * d * 8 / cfg.workers, rel=1e-12)


def test_equal_speeds_batch_one_gradient_call_per_n_events():
    cfg = small_config("algorithm=ad-psgd", "model=mlp", "grad_backend=loop", "epochs=1", "momentum=0.9")
    run = build_run(cfg)
    train(cfg, run)
    assert run.schedule.calls == run.steps_per_epoch


def test_pairwise_averages_keep_the_mean_of_the_models_on_the_complete_graph():
    n, d = 8, 5
    X = torch.randn(n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    mean, spread = X.mean(0), (X - X.mean(0)).square().sum()
    schedule, engine = ADPSGD(build_topology("complete", n), seed=3), SimEngine(n)
    schedule.start(engine, X)
    means = []

    def record(rows):  # after each event's pair average, instead of a gradient step
        means.append(X.mean(0).clone())
    io = StepIO(engine, X, torch.zeros_like(X), 0, 0.1, False, None, None,
                lambda rows, at, counts, draw: torch.zeros(n, dtype=X.dtype), record)
    schedule.step(io)
    assert len(means) == n
    for m in means:
        torch.testing.assert_close(m, mean, rtol=0, atol=1e-15)
    assert (X - X.mean(0)).square().sum() < spread


def test_the_same_seed_gives_the_same_rows():
    cfg = small_config(*STRAGGLERS, "metrics_every=1", "network.count_metrics=true")
    first, again = [], []
    train(cfg, build_run(cfg), on_row=first.append)
    train(cfg, build_run(cfg), on_row=again.append)
    assert first == again and first[-1]["sim_seconds"] > 0


@pytest.mark.parametrize("overrides, fragment", [
    (["server_rank=1"], "server_rank applies only to engine dist"),
    (["network=nvlink"], "algorithm ad-psgd orders its events by the simulated clock: give compute_ms"),
    ([f"topology=edges:{DIRECTED}"], "algorithm ad-psgd needs an undirected one"),
    (["average_optimizer_state=true"], "algorithm ad-psgd averages only the parameters of a pair"),
])
def test_bad_ad_psgd_options_are_one_line(tmp_path, capsys, overrides, fragment):
    argv = ["train", "--quiet", "--out", str(tmp_path / "never")]
    code = main([*argv, *(a for o in ["workers=4", "num_samples=1000", "algorithm=ad-psgd", *overrides] for a in ("--set", o))])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and fragment in err, err


def test_neighbour_draws_are_uniform_over_the_ring():
    schedule = ADPSGD(build_topology("ring", 5), seed=0)
    draws = np.array([schedule.neighbour(2, k) for k in range(2000)])
    assert set(draws) == {1, 3} and abs((draws == 1).mean() - 0.5) < 0.05
