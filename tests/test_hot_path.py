"""The per-step hot path: when metrics are not due, a step reads nothing back from the device
(no .item(), no tensor → Python conversion), so that on a GPU the Python loop runs ahead."""

import pytest
import torch

from cases import FEATURES, SHORT, covering

from conftest import write_cifar
from gossamer.config import load_config
from gossamer.train import Batches, Progress, build_run, train_step

HOST_READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__")


@pytest.fixture
def no_host_reads(monkeypatch):
    """Turn on: any Python read of a tensor's value raises."""
    def forbid():
        for name in HOST_READS:
            def read(*args, _name=name, **kwargs):
                raise AssertionError(f"host synchronisation in the hot path: Tensor.{_name}")
            monkeypatch.setattr(torch.Tensor, name, read)
    return forbid


def _steps(run, forbid, steps: int = 3):
    e, progress = run.engine, Progress()
    run.schedule.start(e, run.workers.X)
    batches = Batches(run)
    for epoch in range(-(-steps // run.steps_per_epoch)):
        batches.epoch(epoch)  # drawn on the host once per epoch
    forbid()
    for t in range(steps):
        train_step(run, progress, batches, t, lr=0.05, measure=False, computes=None)


# every case of tests/cases.py's covering but consensus control, which decides from Ξ (or Θ, φ²) at
# every step: a host read by design
HOST_FREE = {name: o for name, o in {**covering(), **FEATURES}.items() if not any(k.startswith("consensus.") for k in o)}


@pytest.mark.parametrize("name", list(HOST_FREE))
def test_schedules_read_nothing_back(no_host_reads, name):
    """Across a switch and phase boundaries (steps 4..8 of the examples)."""
    cfg = load_config(None, [*SHORT, *HOST_FREE[name], "metrics_every=100"])
    _steps(build_run(cfg), no_host_reads, steps=10)


def test_augmented_images_and_tokens_read_nothing_back(no_host_reads, tmp_path):
    root = write_cifar(tmp_path, train=40, test=10)
    cifar = load_config(None, ["dataset=cifar10", f"data_dir={root}", "model=resnet20", "norm=group", "workers=2",
                               "batch_size=4", "algorithm=gossip", "grad_backend=vmap"])
    text = load_config(None, ["dataset=text", "text_chars=3000", "context=16", "model=transformer", "width=16",
                              "layers=1", "workers=2", "batch_size=4", "optimizer=adam", "grad_backend=loop"])
    for cfg in (cifar, text):
        _steps(build_run(cfg), no_host_reads, steps=2)
    with pytest.raises(AssertionError, match="host synchronisation in the hot path: Tensor.item"):
        torch.ones(1).item()  # the guard is on
