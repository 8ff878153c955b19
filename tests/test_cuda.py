"""On a GPU (``pytest -m cuda``; skipped where the device is missing): the simulator on the device
equals the CPU run, the two gradient backends agree with BatchNorm, and a step whose metrics are
not due never synchronises with the host. ``GOSSAMER_TEST_DEVICE`` names the device (default
cuda; ``benchmarks/gpu_check.py --device cpu --smoke`` sets cpu to rehearse the script)."""

import os

import pytest
import torch
from cases import SHORT

from gossamer.config import load_config
from gossamer.models.resnet20 import ResNet20
from gossamer.train import Batches, Progress, build_run, train, train_step
from gossamer.workers import WorkerMatrix

DEVICE = torch.device(os.environ.get("GOSSAMER_TEST_DEVICE", "cuda"))
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(),
                                                   reason="no CUDA device")]


@pytest.mark.parametrize("algorithm", [["algorithm=allreduce"], ["algorithm=local", "local_steps=3"],
                                       ["algorithm=gossip", "topology=ring"],
                                       ["algorithm=choco", "compression=top-k:0.1", "choco_gamma=0.5"]],
                         ids=lambda a: a[0].split("=")[1])
def test_the_simulator_on_the_device_is_the_cpu_run_in_float64(algorithm):
    runs = {}
    for device in ("cpu", DEVICE.type):
        cfg = load_config(None, [*SHORT, *algorithm, f"device={device}"])
        run = build_run(cfg)
        runs[device] = (train(cfg, run), run.workers.X.cpu())
    (cpu, x_cpu), (dev, x_dev) = runs["cpu"], runs[DEVICE.type]
    torch.testing.assert_close(x_dev, x_cpu, atol=1e-10, rtol=0)
    for key in ("test_accuracy", "final_loss", "final_consensus_distance_sq"):
        assert dev[key] == pytest.approx(cpu[key], abs=1e-10), key


def test_loop_and_vmap_agree_with_batchnorm_on_the_device():
    torch.manual_seed(0)
    template = ResNet20().double().to(DEVICE)
    loop, vmap = (WorkerMatrix(template, 3, device=DEVICE, backend=b) for b in ("loop", "vmap"))
    noise = 0.01 * torch.randn_like(loop.X)
    loop.X.add_(noise)
    vmap.X.add_(noise)
    for _ in range(2):
        x = torch.randn(3, 8, 3, 8, 8, dtype=torch.float64, device=DEVICE)
        y = torch.randint(0, 10, (3, 8), device=DEVICE)
        torch.testing.assert_close(vmap.loss_and_grad(x, y), loop.loss_and_grad(x, y), atol=1e-10, rtol=0)
        torch.testing.assert_close(vmap.G, loop.G, atol=1e-10, rtol=0)
        torch.testing.assert_close(vmap.B, loop.B, atol=1e-10, rtol=0)


@pytest.mark.skipif(DEVICE.type != "cuda", reason="host synchronisation is a CUDA notion")
def test_a_step_whose_metrics_are_not_due_never_synchronises_with_the_host():
    cfg = load_config(None, [*SHORT, "algorithm=gossip", "topology=ring", "device=cuda"])
    run = build_run(cfg)
    batches, progress = Batches(run), Progress()
    batches.epoch(0)
    run.schedule.start(run.engine, run.workers.X)
    train_step(run, progress, batches, 0, 0.05, measure=False, computes=None)  # warm-up: plans, caches
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        train_step(run, progress, batches, 1, 0.05, measure=False, computes=None)
    finally:
        torch.cuda.set_sync_debug_mode("default")
