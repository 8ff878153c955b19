"""The per-step hot path: when metrics are not due, a step reads nothing back from the device
(no .item(), no tensor → Python conversion), so that on a GPU the Python loop runs ahead."""

import pytest
import torch

from cases import FEATURES, covering

from conftest import write_cifar
from gossamer.config import load_config
from gossamer.testing import host_read, host_steps, no_host_reads
from gossamer.train import build_run


# every case of tests/cases.py's covering but consensus control, which decides from Ξ (or Θ, φ²) at
# every step: a host read by design
HOST_FREE = {name: o for name, o in {**covering(), **FEATURES}.items() if not any(k.startswith("consensus.") for k in o)}


@pytest.mark.parametrize("name", list(HOST_FREE))
def test_schedules_read_nothing_back(name):
    """Across a switch and phase boundaries (steps 4..8 of the examples): the conformance kit's
    check (gossamer.testing.host_read)."""
    assert host_read(HOST_FREE[name]) is None


def test_augmented_images_and_tokens_read_nothing_back(tmp_path):
    root = write_cifar(tmp_path, train=40, test=10)
    cifar = load_config(None, ["dataset=cifar10", f"data_dir={root}", "model=resnet20", "norm=group", "workers=2",
                               "batch_size=4", "algorithm=gossip", "grad_backend=vmap"])
    text = load_config(None, ["dataset=text", "text_chars=3000", "context=16", "model=transformer", "width=16",
                              "layers=1", "workers=2", "batch_size=4", "optimizer=adam", "grad_backend=loop"])
    for cfg in (cifar, text):
        host_steps(build_run(cfg), steps=2)
    with pytest.raises(AssertionError, match="host synchronisation in the hot path: Tensor.item"), no_host_reads():
        torch.ones(1).item()  # the guard is on


def test_a_step_does_no_work_proportional_to_the_data_set(monkeypatch):
    """Issue 46: a step's data work is its n·b samples whatever the training set's size N; the O(N)
    permutation of an epoch is drawn once an epoch (counted, not timed), so a larger data set
    does not slow the step."""
    import gossamer.train as train_module
    from gossamer.data import Dataset

    n, b, epochs = 2, 4, 3
    draws, gathered = [], []
    drawn = train_module.epoch_indices
    monkeypatch.setattr(train_module, "epoch_indices", lambda run, e: draws.append(e) or drawn(run, e))
    for N in (64, 640):
        draws.clear()
        gathered.clear()
        g = torch.Generator().manual_seed(0)
        data = Dataset(torch.randn(N, 1, 40, generator=g), torch.randint(0, 10, (N,), generator=g),
                       torch.randn(8, 1, 40, generator=g), torch.randint(0, 10, (8,), generator=g), 10)
        cfg = load_config(None, [f"workers={n}", f"batch_size={b}", "model=mlp", "algorithm=gossip", f"epochs={epochs}",
                                 "eval_local=none"])
        run = build_run(cfg, data=data)
        batch = type(run.data).train_batch
        monkeypatch.setattr(type(run.data), "train_batch",
                            lambda self, idx, rows, rng: gathered.append(idx.numel()) or batch(self, idx, rows, rng))
        train_module.train(cfg, run)
        monkeypatch.setattr(type(run.data), "train_batch", batch)
        assert draws == list(range(epochs))  # one permutation an epoch, not one a step
        assert gathered == [n * b] * (epochs * run.steps_per_epoch)  # each step gathers its n·b samples only
