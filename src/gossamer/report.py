"""Run directories and reports: config.yaml, metrics.jsonl, summary.json, checkpoint.pt, tables."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import yaml

from .config import Config, ConfigError


RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json", "checkpoint.pt")


class RunDir:
    """A run's output folder. A non-empty existing folder is refused unless ``overwrite``, which
    removes only the files a run writes (anything else the user keeps there stays)."""

    def __init__(self, path: str | Path, overwrite: bool = False):
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"--out '{self.path}' exists and is not a directory")
        if self.path.is_dir() and any(self.path.iterdir()) and not overwrite:
            raise ConfigError(f"--out '{self.path}' is not empty; pass --overwrite to replace its run")
        self.path.mkdir(parents=True, exist_ok=True)
        for name in RUN_FILES:
            (self.path / name).unlink(missing_ok=True)
        self._metrics = open(self.path / "metrics.jsonl", "w")

    def write_config(self, cfg: Config) -> None:
        (self.path / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))

    def row(self, row: dict) -> None:
        self._metrics.write(json.dumps(row) + "\n")

    def checkpoint(self, state: dict) -> None:
        """Write atomically, so a crash mid-write keeps the previous good checkpoint."""
        tmp = self.path / "checkpoint.pt.tmp"
        torch.save(state, tmp)
        os.replace(tmp, self.path / "checkpoint.pt")

    def write_summary(self, summary: dict) -> None:
        (self.path / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    def close(self) -> None:
        self._metrics.close()


def reference_trajectory(cfg: Config) -> list[float] | None:
    """For a ``consensus.target: run:DIR``, the Ξ_t² that run had at steps 1, 2, … (as far as its
    metrics.jsonl has every step); None for other targets.

    The run must have the same workers, batch size and data size, so that step t means the same
    point of training."""
    run_dir = getattr(cfg, "consensus", None) and cfg.consensus.reference_run
    if not run_dir:
        return None
    path = Path(run_dir)
    metrics = path / "metrics.jsonl"
    if not metrics.exists():
        raise ConfigError(f"consensus.target run:{run_dir}: no metrics.jsonl there (not a gossamer run)")
    ref_cfg = yaml.safe_load((path / "config.yaml").read_text()) if (path / "config.yaml").exists() else {}
    for key in ("workers", "batch_size", "num_samples"):
        if key in ref_cfg and ref_cfg[key] != getattr(cfg, key, None):
            raise ConfigError(f"consensus.target run:{run_dir} is incompatible: it has {key} = {ref_cfg[key]}, "
                              f"this run {getattr(cfg, key, None)}")
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


# the test metrics a summary may hold: key, header for x̄, header for the local mean, format
TEST_METRICS = [("test_accuracy", "test acc", "local acc", "{:.4f}"),
                ("test_loss", "test loss", "local loss", "{:.4f}"),
                ("test_perplexity", "test ppl", "local ppl", "{:.2f}")]


def test_metrics(summaries) -> list[tuple[str, str, str, str]]:
    """The entries of TEST_METRICS that every summary has (accuracy for classifiers; loss and
    perplexity for language models)."""
    return [m for m in TEST_METRICS if all(m[0] in s for s in summaries)]


def comparison_table(runs: dict[str, dict]) -> str:
    """A Markdown table of named run summaries: the test metrics, final Ξ², communication."""
    metrics = test_metrics(runs.values())
    head = ["run", *[h for _, x_bar, local, _ in metrics for h in (x_bar, local)], "final Ξ²", "comm rounds",
            "MB/worker"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in runs.items():
        cells = [name, *[fmt.format(s[k + suffix]) for k, _, _, fmt in metrics for suffix in ("", "_local_mean")],
                 f"{s['final_consensus_distance_sq']:.3e}", f"{s['comm_rounds']:d}",
                 f"{s['bytes_per_worker'] / 1e6:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
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
