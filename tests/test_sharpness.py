"""Sharpness: power iteration with Hessian-vector products against known and full Hessians."""

import numpy as np
import pytest
import torch
from torch import nn

from conftest import train_rows, write_cifar
from gossamer.config import load_config
from gossamer.sharpness import HVP_CHUNK, loss_hvp, model_sharpness, top_eigenvalue, training_subset
from gossamer.rng import host_stream
from gossamer.train import averaged_model, build_run, evaluate
from gossamer.workers import WorkerMatrix, flatten


def symmetric(eigenvalues: list[float], seed: int = 0) -> torch.Tensor:
    """Q diag(λ) Qᵀ for a random orthogonal Q."""
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(len(eigenvalues), len(eigenvalues), generator=g, dtype=torch.float64))
    return q @ torch.diag(torch.tensor(eigenvalues, dtype=torch.float64)) @ q.T


@pytest.mark.parametrize("eigenvalues", [
    [5.0, 1.0, 0.5, -0.3, 0.0],  # a minimum's direction dominates
    [2.0, 1.0, -7.0, 0.1],  # a saddle: the negative eigenvalue is the largest in magnitude
    [-1.0, -3.0, -0.5],  # a maximum: λ_max is the negative eigenvalue closest to 0
])
def test_power_iteration_finds_the_top_eigenvalue_of_a_quadratic(eigenvalues):
    """f(x) = ½ xᵀAx has Hessian A: the estimate is A's largest eigenvalue, not its largest in magnitude."""
    A = symmetric(eigenvalues)
    v0 = torch.randn(len(eigenvalues), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert top_eigenvalue(lambda v: A @ v, v0, iterations=300) == pytest.approx(max(eigenvalues), rel=1e-9)


def test_loss_hvp_is_the_hessian_of_a_mean_loss_across_chunks():
    """f(x) = (1/N) Σ_k ½ (a_kᵀx − b_k)², over more samples than one chunk: ∇²f = (1/N) Σ_k a_k a_kᵀ."""
    g = torch.Generator().manual_seed(0)
    N, d = HVP_CHUNK + 88, 6
    a, b = torch.randn(N, d, generator=g, dtype=torch.float64), torch.randn(N, generator=g, dtype=torch.float64)
    a[:, 0] *= 3  # a well-separated top eigenvalue, so that power iteration converges in few steps
    hvp = loss_hvp(lambda x, ak, bk: 0.5 * ((ak @ x - bk) ** 2).mean(), torch.randn(d, dtype=torch.float64), a, b)
    hessian = a.T @ a / N
    v = torch.randn(d, generator=g, dtype=torch.float64)
    torch.testing.assert_close(hvp(v), hessian @ v, atol=1e-12, rtol=0)
    sharpness = top_eigenvalue(hvp, torch.ones(d, dtype=torch.float64), iterations=200)
    assert sharpness == pytest.approx(torch.linalg.eigvalsh(hessian).max().item(), rel=1e-9)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")  # torch.func.hessian's forward AD
def test_model_sharpness_agrees_with_the_full_hessian_of_a_small_mlp():
    torch.manual_seed(0)
    template = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    workers = WorkerMatrix(template, 2)
    inputs = torch.randn(40, 5, dtype=torch.float64)
    targets = torch.randint(0, 3, (40,))
    x = workers.X[0] + 0.5 * torch.randn(workers.d, dtype=torch.float64)  # away from the initialisation

    def loss(flat):
        named = {s.name: flat[s.offset : s.offset + s.numel].view(s.shape) for s in workers.param_slots}
        return nn.functional.cross_entropy(torch.func.functional_call(template, named, (inputs,)), targets)
    full = torch.func.hessian(loss)(x)
    expected = torch.linalg.eigvalsh(full).max().item()
    estimate = model_sharpness(workers, x, workers.B[0], inputs, targets, iterations=500, rng=np.random.default_rng(3))
    assert estimate == pytest.approx(expected, rel=1e-6)
    assert model_sharpness(workers, x, workers.B[0], inputs, targets, iterations=500, rng=np.random.default_rng(3)) == estimate


def test_training_reports_the_sharpness_of_x_bar_at_each_evaluation():
    rows, summary, run = train_rows("algorithm=local", "local_steps=3", "sharpness=true", "sharpness_samples=200",
                                    "sharpness_iterations=10")
    evaluated = [r for r in rows if "test_accuracy" in r]
    assert [r["step"] for r in evaluated] == [12, 24]
    assert all("sharpness" in r for r in evaluated) and not any("sharpness" in r for r in rows if r not in evaluated)
    assert summary["sharpness"] == evaluated[-1]["sharpness"] > 0
    # the last one is the top eigenvalue of the loss over the run's fixed subset at the final x̄, from the
    # start vector of its step (issue 45, item 22: only > 0 was checked)
    data, w = run.data, run.workers
    x_bar, b_bar = flatten(averaged_model(run, 23))
    subset = training_subset(len(data.y_train), 200, host_stream("sharpness-subset", run.cfg.seed))
    expected = model_sharpness(w, x_bar, b_bar, data.x_train[subset], data.y_train[subset], 10,
                               host_stream("sharpness-start", run.cfg.seed, 24))
    assert summary["sharpness"] == pytest.approx(expected, rel=1e-12)
    again, _, _ = train_rows("algorithm=local", "local_steps=3", "sharpness=true", "sharpness_samples=200",
                             "sharpness_iterations=10")
    assert again == rows  # a seeded start vector and a fixed subset: the same numbers
    plain, _, plain_run = train_rows("algorithm=local", "local_steps=3")
    assert [{k: v for k, v in r.items() if k != "sharpness"} for r in rows] == plain  # measuring changes nothing
    torch.testing.assert_close(run.workers.X, plain_run.workers.X, rtol=0, atol=0)


def test_sharpness_is_taken_with_the_batchnorm_statistics_bn_eval_gives_x_bar(tmp_path):
    """ResNet-20: the evaluation row's sharpness is λ_max at x̄ with x̄'s statistics — the workers'
    mean (average) or re-estimated with x̄ (recompute) — so the two differ."""
    write_cifar(tmp_path)
    base = ["dataset=cifar10", f"data_dir={tmp_path}", "model=resnet20", "workers=2", "batch_size=10", "epochs=1",
            "sharpness=true", "sharpness_samples=20", "sharpness_iterations=3", "eval_local=none"]
    found = {}
    for bn_eval in ("average", "recompute"):
        run = build_run(load_config(None, [*base, f"bn_eval={bn_eval}"]))
        found[bn_eval] = evaluate(run, 0)["sharpness"]
        x_bar, b_bar = flatten(averaged_model(run, 0))
        subset = training_subset(len(run.data.y_train), 20, host_stream("sharpness-subset", run.cfg.seed))
        assert found[bn_eval] == model_sharpness(run.workers, x_bar, b_bar, run.data.x_train[subset],
                                                 run.data.y_train[subset], 3, host_stream("sharpness-start", run.cfg.seed, 1))
    assert found["average"] != found["recompute"]
