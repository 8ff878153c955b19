"""DSpodFL (Zehtabi et al. 2024; the rule of the authors' code ShahryarBQ/DSpodFL 1f1511b): p = q = 1
is D-SGD in the mix-then-step form bit for bit; a round's W' drops each unused link on both ends;
a worker that does not compute keeps its model and optimizer state, and the clock charges it no
compute; bytes and waits follow the links used; the coins' frequencies are p and q."""

import numpy as np
import pytest
import torch
from cases import SHORT
from test_bad_input import one_line_error, sets

from gossamer.algorithms import StepIO
from gossamer.algorithms.dspodfl import links
from gossamer.config import load_config
from gossamer.topology import build_topology
from gossamer.train import build_run, train


def rows_and_run(*overrides: str):
    cfg = load_config(None, [*SHORT, "momentum=0.9", *overrides])
    run, rows = build_run(cfg), []
    summary = train(cfg, run, on_row=rows.append)
    return rows, summary, run


@pytest.mark.parametrize("topology", ["ring", "one-peer-exponential", "random-matching"])
def test_always_computing_and_always_linked_is_d_sgd_mixing_then_stepping_bit_for_bit(topology):
    d_sgd_rows, d_sgd, d_sgd_run = rows_and_run("algorithm=gossip", f"topology={topology}", "gossip_form=mix-then-step")
    rows, summary, run = rows_and_run("algorithm=dspodfl", f"topology={topology}", "dspodfl_compute=1",
                                      "dspodfl_edge=1")
    assert torch.equal(run.workers.X, d_sgd_run.workers.X)
    assert torch.equal(run.optimizer.rows["momentum"], d_sgd_run.optimizer.rows["momentum"])
    shared = ("loss", "consensus_distance_sq", "grad_norm_sq", "bytes_per_worker", "comm_rounds", "test_accuracy")
    assert [{k: r[k] for k in shared if k in r} for r in rows] == [{k: r[k] for k in shared if k in r} for r in d_sgd_rows]


def test_an_unused_link_is_dropped_on_both_ends_and_its_weight_stays_home():
    schedule = build_run(load_config(None, [*SHORT, "algorithm=dspodfl", "topology=exponential", "workers=8",
                                            "dspodfl_edge=0.5"])).schedule
    W = build_topology("exponential", 8).mixing(0).dense()
    dropped = 0
    for t in range(20):
        Wt = schedule.round(t).dense()
        np.testing.assert_allclose(Wt, Wt.T, rtol=0, atol=1e-15)  # a link is on or off for both ends
        np.testing.assert_allclose(Wt.sum(0), 1, atol=1e-12)
        off = (W > 0) & (Wt == 0)
        dropped += off.sum()
        np.testing.assert_allclose(np.diag(Wt), np.diag(W) + (W * off).sum(1), rtol=0, atol=1e-15)
        assert ((Wt == W) | off | np.eye(8, dtype=bool)).all()  # every used link keeps its weight
    assert dropped > 0


def test_the_coins_come_up_with_probabilities_p_and_q():
    cfg = load_config(None, [*SHORT, "algorithm=dspodfl", "topology=exponential", "workers=16", "dspodfl_compute=0.3",
                             "dspodfl_edge=0.7"])
    schedule = build_run(cfg).schedule
    computing = np.array([schedule.computing(t) for t in range(400)])
    edges, _ = links(schedule.topology.mixing(0))
    used = np.mean([len(links(schedule.round(t))[0]) / len(edges) for t in range(400)])
    assert abs(computing.mean() - 0.3) < 0.03 and abs(used - 0.7) < 0.03  # 6400 and ~19000 coins


def test_a_worker_that_does_not_compute_keeps_its_model_and_momentum_when_no_link_is_used():
    cfg = load_config(None, [*SHORT, "algorithm=dspodfl", "momentum=0.9", "dspodfl_compute=0.5", "dspodfl_edge=0"])
    run = build_run(cfg)
    train(load_config(None, [*SHORT, "algorithm=dspodfl", "momentum=0.9", "dspodfl_compute=0.5", "dspodfl_edge=0",
                             "epochs=1"]), run)
    X, M = run.workers.X.clone(), run.optimizer.rows["momentum"].clone()
    t = run.steps_per_epoch
    computes = run.schedule.computing(t)
    assert computes.any() and not computes.all()
    io = StepIO(run.engine, run.workers.X, run.workers.G, t, 0.05, False, None, computes,
                lambda rows, at, counts, draw: run.workers.loss_and_grad(
                    *run.data.train_batch(torch.zeros(4, 32, dtype=torch.long), run.engine.rows,
                                          np.random.default_rng(0)), None if rows is None else rows.tolist()),
                lambda rows: run.optimizer.step(run.workers.X, run.workers.G, 0.05, rows))
    run.schedule.step(io)
    idle = torch.as_tensor(~computes)
    assert torch.equal(run.workers.X[idle], X[idle]) and torch.equal(run.optimizer.rows["momentum"][idle], M[idle])
    assert not torch.equal(run.workers.X[~idle], X[~idle])


def test_bytes_and_waits_follow_the_links_used_and_compute_is_charged_to_who_computed():
    common = [*SHORT, "algorithm=dspodfl", "topology=ring", "dspodfl_compute=0.5", "dspodfl_edge=0.5",
              "network=ethernet-10g", "compute_ms=5", "network.count_metrics=false"]
    rows, summary, run = rows_and_run(*common)
    schedule, n, steps = run.schedule, 4, summary["steps"]
    m = summary["parameters"] * 8  # float64 values
    used = [len(links(schedule.round(t))[0]) for t in range(steps)]
    assert summary["bytes_per_worker"] == pytest.approx(sum(2 * u * m for u in used) / n, rel=1e-12)
    # one worker's clock by hand: c for each step it computes, then the round's τ with its used links
    clock, net = np.zeros(n), run.clock.network
    for t in range(steps):
        clock += 5e-3 * schedule.computing(t)
        W = schedule.round(t)
        linked = (W.dense() > 0) & ~np.eye(n, dtype=bool)
        if linked.any():
            k = max(linked.sum(0).max(), linked.sum(1).max())
            tau = k * net.link.message(m)
            waits = np.where(linked.any(1), np.max(np.where(linked | np.eye(n, dtype=bool), clock[None, :], 0), 1), clock)
            clock = np.where(linked.any(1), waits + tau, clock)
    assert summary["sim_seconds"] == pytest.approx(clock.max(), rel=1e-12)


@pytest.mark.parametrize("overrides, fragment", [
    (["dspodfl_compute=0"], "dspodfl_compute must be a probability in (0, 1]"),
    (["dspodfl_edge=1.5"], "dspodfl_edge must be a probability in [0, 1]"),
    (["topology=one-peer-exponential"], "dspodfl_edge < 1 (a link used for both ends or for neither)"),
])
def test_bad_dspodfl_options_are_one_line(capsys, tmp_path, overrides, fragment):
    argv = ["train", "--quiet", "--out", str(tmp_path / "never"), *sets(*SHORT, "algorithm=dspodfl", *overrides)]
    one_line_error(capsys, argv, fragment)


def test_a_run_whose_last_step_nobody_computed_ends_with_a_summary(tmp_path):
    """p = 0.001: at the last step no worker computes, so its row has no training loss; the summary's
    final_loss is the latest loss measured (None if there was none), and the run ends with exit 0,
    on --resume too (issue 45, item 7: a KeyError after the whole run)."""
    import json

    from gossamer.cli import main

    out = tmp_path / "run"
    argv = ["train", *sets("algorithm=dspodfl", "dspodfl_compute=0.001", "workers=4", "epochs=1", "num_samples=1000",
                           "seed=1"), "--out", str(out)]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    assert "loss" not in rows[-1]
    assert summary["final_loss"] == next((r["loss"] for r in reversed(rows) if "loss" in r), None)
    assert main(["train", "--resume", str(out)]) == 2  # finished: one line, not a traceback
