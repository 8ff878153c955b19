"""Run directories and reports: config.yaml, metrics.jsonl, summary.json, checkpoint.pt, tables."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import torch
import yaml

from .config import Config, ConfigError


RUN_FILES = ("config.yaml", "metrics.jsonl", "metrics.csv", "summary.json", "checkpoint.pt")
TENSORBOARD_DIR = "tensorboard"


class RunDir:
    """A run's output folder. A non-empty existing folder is refused unless ``overwrite``, which
    removes only the files a run writes (anything else the user keeps there stays). ``logger``
    (``csv``, ``tensorboard``) also sends every metric row there (:func:`make_logger`)."""

    def __init__(self, path: str | Path, overwrite: bool = False, logger: str = "none"):
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"--out '{self.path}' exists and is not a directory")
        if self.path.is_dir() and any(self.path.iterdir()) and not overwrite:
            raise ConfigError(f"--out '{self.path}' is not empty; pass --overwrite to replace its run")
        self.path.mkdir(parents=True, exist_ok=True)
        for name in RUN_FILES:
            (self.path / name).unlink(missing_ok=True)
        for events in (self.path / TENSORBOARD_DIR).glob("events.out.tfevents.*"):
            events.unlink()
        self._metrics = open(self.path / "metrics.jsonl", "w")
        self._logger = make_logger(logger, self.path)

    def write_config(self, cfg: Config) -> None:
        (self.path / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))

    def row(self, row: dict) -> None:
        self._metrics.write(json.dumps(row) + "\n")
        if self._logger is not None:
            self._logger.row(row)

    def checkpoint(self, state: dict) -> None:
        """Write atomically, so a crash mid-write keeps the previous good checkpoint."""
        tmp = self.path / "checkpoint.pt.tmp"
        torch.save(state, tmp)
        os.replace(tmp, self.path / "checkpoint.pt")

    def write_summary(self, summary: dict) -> None:
        (self.path / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    def close(self) -> None:
        self._metrics.close()
        if self._logger is not None:
            self._logger.close()


def scalars(row: dict, prefix: str = "") -> dict[str, float]:
    """The numbers of a metric row, nested sections flattened to ``section/key`` (the per-layer
    Ξ²), booleans as 0/1; values that are not numbers (None) are left out."""
    out = {}
    for key, value in row.items():
        if isinstance(value, dict):
            out.update(scalars(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float)):
            out[prefix + key] = float(value)
    return out


class CSVLog:
    """``metrics.csv``: one line per metric row, a column per scalar (a column that appears later,
    such as the test accuracy at the first evaluation, rewrites the header; earlier rows leave it empty)."""

    def __init__(self, path: Path):
        self.path = path / "metrics.csv"
        self.columns: list[str] = []
        self._file = open(self.path, "w", newline="")

    def row(self, row: dict) -> None:
        values = scalars(row)
        new = [k for k in values if k not in self.columns]
        if new:
            self._file.close()
            with open(self.path, newline="") as f:
                old = list(csv.DictReader(f))
            self.columns += new
            self._file = open(self.path, "w", newline="")
            self._writer = csv.DictWriter(self._file, self.columns)
            self._writer.writeheader()
            self._writer.writerows(old)
        self._writer.writerow(values)

    def close(self) -> None:
        self._file.close()


class TensorBoardLog:
    """TensorBoard scalars in ``tensorboard/``, one per metric at its row's step (``tensorboard --logdir``)."""

    def __init__(self, path: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(path / TENSORBOARD_DIR))

    def row(self, row: dict) -> None:
        for tag, value in scalars(row).items():
            if tag != "step":
                self.writer.add_scalar(tag, value, row["step"])

    def close(self) -> None:
        self.writer.close()


def make_logger(name: str, path: Path) -> CSVLog | TensorBoardLog | None:
    """The ``logger`` of a run directory: ``none``, ``csv`` or ``tensorboard``."""
    return {"none": lambda p: None, "csv": CSVLog, "tensorboard": TensorBoardLog}[name](path)


def reference_trajectory(cfg: Config) -> list[float] | None:
    """For a ``consensus.target: run:DIR``, the Ξ_t² that run had at steps 1, 2, … (as far as its
    metrics.jsonl has every step); None for other targets.

    The run must have the same workers, batch size and data size, so that step t means the same
    point of training."""
    run_dir = getattr(cfg, "consensus", None) and cfg.consensus.reference_run
    if not run_dir:
        return None
    return read_trajectory(run_dir, {key: getattr(cfg, key, None) for key in ("workers", "batch_size", "num_samples")})


def read_trajectory(run_dir: str | Path, expect: dict) -> list[float]:
    """The Ξ_t² of the run in ``run_dir`` at steps 1, 2, … (as far as its metrics.jsonl has every
    step), after checking that its config has the ``expect``ed values where it has those keys."""
    path = Path(run_dir)
    metrics = path / "metrics.jsonl"
    if not metrics.exists():
        raise ConfigError(f"consensus.target run:{run_dir}: no metrics.jsonl there (not a gossamer run)")
    ref_cfg = yaml.safe_load((path / "config.yaml").read_text()) if (path / "config.yaml").exists() else {}
    for key, value in expect.items():
        if key in ref_cfg and ref_cfg[key] != value:
            raise ConfigError(f"consensus.target run:{run_dir} is incompatible: it has {key} = {ref_cfg[key]}, "
                              f"this run {value}")
    by_step = {}
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        by_step[row["step"]] = row["consensus_distance_sq"]
    steps = 0
    while steps + 1 in by_step:
        steps += 1
    return [by_step[s] for s in range(1, steps + 1)]


def read_summary(path: str | Path) -> dict:
    file = Path(path) / "summary.json"
    if not file.exists():
        raise ConfigError(f"'{path}' holds no summary.json (not a finished gossamer run)")
    return json.loads(file.read_text())


COLUMNS = [("run", "{}"), ("test acc", "{:.4f}"), ("local acc", "{:.4f}"), ("final Ξ²", "{:.3e}"),
           ("comm rounds", "{:d}"), ("MB/worker", "{:.2f}")]


def comparison_table(runs: dict[str, dict]) -> str:
    """A Markdown table of named run summaries: accuracy, final Ξ², communication."""
    lines = ["| " + " | ".join(c for c, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for name, s in runs.items():
        values = [name, s["test_accuracy"], s["test_accuracy_local_mean"], s["final_consensus_distance_sq"],
                  s["comm_rounds"], s["bytes_per_worker"] / 1e6]
        lines.append("| " + " | ".join(f.format(v) for (_, f), v in zip(COLUMNS, values)) + " |")
    return "\n".join(lines)


def plot_consensus(metrics: dict[str, Path], phase_epochs: list[float], out: Path, title: str) -> None:
    """Ξ² over training (log scale), one line per run, learning-rate phases marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, file in metrics.items():
        rows = [json.loads(line) for line in Path(file).read_text().splitlines()]
        ax.plot([r["epoch"] for r in rows], [max(r["consensus_distance_sq"], 1e-16) for r in rows],
                label=name, linewidth=1)
    for epoch in phase_epochs:
        ax.axvline(epoch, color="grey", linestyle="--", linewidth=0.8)
    ax.set(yscale="log", xlabel="epoch", ylabel="consensus distance Ξ²", title=title)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
