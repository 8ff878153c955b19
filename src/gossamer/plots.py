"""Plots of runs (PNG, matplotlib's Agg backend): a metric against steps, epochs, simulated time or
bytes (``gossamer plot``), Ξ² over training and the accuracy–communication trade-off (repro suites)."""

from __future__ import annotations

import json
from pathlib import Path

from .registry import ConfigError, short
from .report import AXES, headline, mean_ci, metric_series
from .rundir import read_rows, write_atomic


def plot_runs(runs: dict[str, Path], x: str, y: str | None, out: Path, title: str = "") -> None:
    """One PNG: ``y`` (default: the runs' headline test metric) against ``x`` for every run."""
    rows = {name: read_rows(path) for name, path in runs.items()}
    y = y or headline(next(iter(rows.values())))
    series = {name: metric_series(name, r, x, y) for name, r in rows.items()}  # every run checked before drawing
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, (xs, ys) in series.items():
        ax.plot(xs, ys, label=name, linewidth=1, marker="." if len(xs) < 50 else None)
    ax.set(xlabel=AXES[x][1], ylabel=y, title=title, xscale="log" if x == "bytes" else "linear")
    ax.legend(fontsize=7)
    fig.tight_layout()
    try:
        write_atomic(out, lambda f: fig.savefig(f, format="png", dpi=120))
    except OSError as e:
        raise ConfigError(f"--out '{short(out)}': cannot write the plot there ({e.strerror or e})") from None
    finally:
        plt.close(fig)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_consensus(metrics: dict[str, Path], phase_epochs: list[float], out: Path, title: str) -> None:
    """Ξ² over training (log scale), one line per run, learning-rate phases marked."""
    plt = _pyplot()
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


def plot_tradeoff(summaries: dict[str, list[dict]], out: Path, title: str) -> None:
    """The test metric of x̄ against communication rounds (log scale) and, where every run measured
    it, against sharpness: one point per variant, mean ± the 95 % interval over its seeds' summaries
    (:func:`mean_ci`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [s for group in summaries.values() for s in group]
    metric = "test_accuracy" if all("test_accuracy" in s for s in runs) else "test_loss"
    panels = [("comm_rounds", "communication rounds", "log")]
    if all("sharpness" in s for s in runs):
        panels.append(("sharpness", "sharpness of x̄ (top Hessian eigenvalue of the training loss)", "linear"))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for ax, (key, label, scale) in zip(axes[0], panels):
        for name, group in summaries.items():
            x, y = [s[key] for s in group], [s[metric] for s in group]
            (mx, hx), (my, hy) = mean_ci(x), mean_ci(y)
            point = mx, my
            ax.errorbar(*point, xerr=hx or 0.0, yerr=hy or 0.0, fmt="o", capsize=3, markersize=4)
            ax.annotate(name, point, textcoords="offset points", xytext=(4, 3), fontsize=6)
        ax.set(xscale=scale, xlabel=label, ylabel=f"{metric.replace('_', ' ')} (x̄)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
