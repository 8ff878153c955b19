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
