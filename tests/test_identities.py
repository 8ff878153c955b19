"""Identities from the math: algorithms that must coincide do, to float tolerance."""

import math

import pytest
import torch

from conftest import small_config, train_final
from gossamer.data.partition import iid_epoch_indices
from gossamer.engines.sim import SimEngine
from gossamer.models import build_model, hidden_matrices, no_decay_mask
from gossamer.topology import build_topology
from gossamer.train import build_run, lr_at, train


# float64, |x| < 1: two orders of summation differ by at most 4.4e-16 here (a few ulps); 2e-15 leaves
# room for another CPU's reduction order and nothing more
FLOAT64 = 2e-15


def test_local_sgd_with_h1_equals_allreduce():
    _, local = train_final("algorithm=local", "local_steps=1")
    _, allreduce = train_final("algorithm=allreduce")
    torch.testing.assert_close(local.workers.X, allreduce.workers.X, atol=FLOAT64, rtol=0)


def test_local_sgd_with_h1_equals_allreduce_with_nesterov_momentum():
    # momentum buffers are local, but the update is linear: their average is the global buffer
    extra = ("momentum=0.9", "nesterov=true", "weight_decay=1e-3")
    _, local = train_final("algorithm=local", "local_steps=1", *extra)
    _, allreduce = train_final("algorithm=allreduce", *extra)
    torch.testing.assert_close(local.workers.X, allreduce.workers.X, atol=FLOAT64, rtol=0)


def test_gossip_on_complete_graph_equals_allreduce():
    _, gossip = train_final("algorithm=gossip", "topology=complete")
    _, allreduce = train_final("algorithm=local", "local_steps=1")
    torch.testing.assert_close(gossip.workers.X, allreduce.workers.X, atol=FLOAT64, rtol=0)  # measured: 0


def test_gossip_on_ring_differs_from_allreduce():
    # guards the identities above against a schedule that never communicates differently
    _, gossip = train_final("algorithm=gossip", "topology=ring")
    _, allreduce = train_final("algorithm=allreduce")
    assert (gossip.workers.X - allreduce.workers.X).abs().max() > 1e-4


def test_local_sgd_rows_equal_right_after_averaging_and_differ_between():
    summary, run = train_final("algorithm=local", "local_steps=4")  # 2 epochs × 12 steps
    assert summary["comm_rounds"] == summary["steps"] // 4
    assert summary["final_consensus_distance_sq"] < 1e-10
    summary, run = train_final("algorithm=local", "local_steps=5")  # 24 steps: last sync at 20
    assert summary["final_consensus_distance_sq"] > 1e-6


def test_one_worker_equals_plain_pytorch_training():
    cfg = small_config("workers=1", "momentum=0.9", "nesterov=true", "weight_decay=1e-3",
                       "warmup_epochs=0.5", "milestones=[1]")
    run = build_run(cfg)
    train(cfg, run)

    torch.manual_seed(cfg.seed)
    model = build_model(cfg, run.data).double()
    decay = [p for p, skip in zip(model.parameters(), no_decay_mask(model)) if not skip]
    no_decay = [p for p, skip in zip(model.parameters(), no_decay_mask(model)) if skip]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": cfg.weight_decay},
                           {"params": no_decay, "weight_decay": 0.0}],
                          lr=cfg.lr, momentum=cfg.momentum, nesterov=True)
    data, S = run.data, run.steps_per_epoch
    for epoch in range(cfg.epochs):
        idx = iid_epoch_indices(len(data.y_train), 1, cfg.batch_size, epoch, cfg.seed)
        for s in range(S):
            for group in opt.param_groups:
                group["lr"] = lr_at(cfg, epoch * S + s, S)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(data.x_train[idx[s, 0]]), data.y_train[idx[s, 0]]).backward()
            opt.step()
    expected = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    torch.testing.assert_close(run.workers.X[0], expected, atol=FLOAT64, rtol=0)  # measured: 0


def test_gossip_preserves_the_mean_exactly():
    X = torch.randn(16, 1000, dtype=torch.float64)
    engine = SimEngine(16)
    for name in ("ring", "torus", "exponential", "one-peer-exponential", "random-regular:3", "erdos-renyi:0.3"):
        Y = X.clone()
        topo = build_topology(name, 16, seed=1)
        for t in range(5):
            engine.gossip_(Y, topo.mixing(t))
        torch.testing.assert_close(Y.mean(0), X.mean(0), atol=FLOAT64, rtol=0)  # measured: ≤ 4.4e-16


@pytest.mark.parametrize("n", [2, 8, 32, 64])
def test_one_peer_exponential_averages_exactly_in_log2_n_rounds(n):
    X = torch.randn(n, 500)
    engine, topo = SimEngine(n), build_topology("one-peer-exponential", n)
    for t in range(int(math.log2(n))):
        assert engine.consensus_distance_sq(X) > 1e-3
        engine.gossip_(X, topo.mixing(t))
    assert engine.consensus_distance_sq(X) < 1e-10


def test_ring_gossip_contracts_by_at_most_lambda_squared():
    # E‖XW − X̄‖² ≤ (1 − p)‖X − X̄‖² with 1 − p = λ², λ = 1 − ρ
    n = 16
    topo, engine = build_topology("ring", n), SimEngine(n)
    lam = (1 + 2 * math.cos(2 * math.pi / n)) / 3
    X = torch.randn(n, 200, dtype=torch.float64)
    before = engine.consensus_distance_sq(X)
    engine.gossip_(X, topo.mixing(0))
    assert engine.consensus_distance_sq(X) <= lam**2 * before + 1e-12


def test_learning_rate_schedule():
    cfg = small_config("lr=0.1", "lr_scaling=linear", "warmup_epochs=1", "milestones=[1.5]", "epochs=3")
    S = 10
    assert lr_at(cfg, 0, S) == pytest.approx(0.4 / 10)  # warm-up from 0 to lr × n = 0.4
    assert lr_at(cfg, 9, S) == pytest.approx(0.4)
    assert lr_at(cfg, 14, S) == pytest.approx(0.4)
    assert lr_at(cfg, 15, S) == pytest.approx(0.04)


def test_local_gossip_on_the_complete_graph_equals_local_sgd():
    """W = 11ᵀ/n is the exact average: H local steps then a round is local SGD with H."""
    extra = ("momentum=0.9", "nesterov=true", "local_steps=3")
    _, local = train_final("algorithm=local", *extra)
    _, gossip = train_final("algorithm=gossip", "topology=complete", *extra)
    torch.testing.assert_close(gossip.workers.X, local.workers.X, atol=FLOAT64, rtol=0)  # measured: 0


def test_local_gossip_with_h1_is_d_sgd_and_with_h_gt_1_is_not():
    summary, one = train_final("algorithm=gossip", "local_steps=1", "momentum=0.9")
    _, dsgd = train_final("algorithm=gossip", "momentum=0.9")
    torch.testing.assert_close(one.workers.X, dsgd.workers.X, atol=0, rtol=0)
    local_summary, local = train_final("algorithm=gossip", "local_steps=4", "momentum=0.9")
    assert (local.workers.X - dsgd.workers.X).abs().max() > 1e-6
    assert local_summary["comm_rounds"] == summary["comm_rounds"] // 4 == 6


@pytest.mark.parametrize("lr_scale", ["original", "match_rms_adamw"])
def test_one_worker_muon_equals_torch_muon_and_adamw(lr_scale):
    """optimizer: muon against torch.optim.Muon (torch 2.13) on the hidden matrices and torch.optim.AdamW
    on the rest (decay off for biases), one worker, float64; Muon's Newton–Schulz runs in bfloat16 in both."""
    cfg = small_config("workers=1", "optimizer=muon", "lr=0.003", "weight_decay=0.01", "model=mlp",
                       f"muon_lr_scale={lr_scale}", "muon_momentum=0.9", "epochs=1")
    run = build_run(cfg)
    train(cfg, run)

    torch.manual_seed(cfg.seed)
    model = build_model(cfg, run.data).double()
    params = list(model.parameters())
    hidden, skip = hidden_matrices(model), no_decay_mask(model)
    assert sum(hidden) == 2  # the MLP's two hidden layers; the output layer and the biases take AdamW
    muon = torch.optim.Muon([p for p, h in zip(params, hidden) if h], lr=cfg.lr, weight_decay=cfg.weight_decay,
                            momentum=0.9, nesterov=True, adjust_lr_fn=lr_scale)
    adamw = torch.optim.AdamW([{"params": [p for p, h, s in zip(params, hidden, skip) if not h and not s]},
                               {"params": [p for p, h, s in zip(params, hidden, skip) if not h and s],
                                "weight_decay": 0.0}], lr=cfg.lr, weight_decay=cfg.weight_decay)
    data, S = run.data, run.steps_per_epoch
    idx = iid_epoch_indices(len(data.y_train), 1, cfg.batch_size, 0, cfg.seed)
    for s in range(S):
        muon.zero_grad()
        adamw.zero_grad()
        torch.nn.functional.cross_entropy(model(data.x_train[idx[s, 0]]), data.y_train[idx[s, 0]]).backward()
        muon.step()
        adamw.step()
    expected = torch.cat([p.detach().reshape(-1) for p in params])
    torch.testing.assert_close(run.workers.X[0], expected, atol=FLOAT64, rtol=0)
