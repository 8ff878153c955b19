import pytest
import torch
from launch import sets

from gossamer.cli import main
from gossamer.config import load_config
from gossamer.report import reference_trajectory
from gossamer.train import build_run, train


def small_config(*overrides: str):
    """A seconds-long run in float64: 1000 MNIST-1D samples (800 train), 4 workers, 2 epochs;
    plain SGD unless the overrides choose another optimizer."""
    sgd = [] if any(o.startswith("optimizer=") and o != "optimizer=sgd" for o in overrides) else \
        ["momentum=0.0", "nesterov=false"]
    return load_config(None, ["workers=4", "epochs=2", "batch_size=16", "num_samples=1000", "lr=0.05",
                              *sgd, "dtype=float64", *overrides])


def train_rows(*overrides: str):
    """Train a small config; return (metric rows, summary, run) so tests can read the final rows."""
    cfg = small_config(*overrides)
    run, rows = build(cfg), []
    summary = train(cfg, run, on_row=rows.append)
    return rows, summary, run


def build(cfg):
    """build_run as the CLI does it: with the reference trajectory of a run:DIR target."""
    return build_run(cfg, reference=reference_trajectory(cfg))


def train_final(*overrides: str):
    """(summary, run) of a small training."""
    _, summary, run = train_rows(*overrides)
    return summary, run


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def sim_run(tmp_path_factory):
    """The run directory of ``gossamer train`` (the simulator) with a list of overrides, trained
    once per session: the reference that multi-process runs of the same config are compared with."""
    runs = {}

    def get(overrides: list[str]):
        key = tuple(overrides)
        if key not in runs:
            out = tmp_path_factory.mktemp("sim") / "run"
            assert main(["train", "--quiet", "--out", str(out), *sets(overrides)]) == 0
            runs[key] = out
        return runs[key]
    return get
