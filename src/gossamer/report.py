"""Reports of finished runs: the tables of ``gossamer compare`` and of the repro suites, and the
statistics over seeds (the mean and its Student t interval)."""

from __future__ import annotations

import math
from pathlib import Path

from .registry import ConfigError, short
from .rundir import read_rows, read_summary


COMPARED = ("final_consensus_distance_sq", "comm_rounds", "bytes_per_worker")  # what every compared summary has
# the test metrics a summary may hold: key, header for x̄, header for the local mean, format
TEST_METRICS = [("test_accuracy", "test acc", "local acc", "{:.4f}"),
                ("test_loss", "test loss", "local loss", "{:.4f}"),
                ("test_perplexity", "test ppl", "local ppl", "{:.2f}")]


def test_metrics(summaries) -> list[tuple[str, str, str, str]]:
    """The entries of TEST_METRICS that every summary has for x̄ (accuracy for classifiers; loss
    and perplexity for language models); the local mean is shown where a run has it (eval_local)."""
    return [m for m in TEST_METRICS if all(m[0] in s for s in summaries)]


def comparison_table(runs: dict[str, dict]) -> str:
    """A Markdown table of named run summaries: the test metrics, final Ξ², communication."""
    metrics = test_metrics(runs.values())
    head = ["run", *[h for _, x_bar, local, _ in metrics for h in (x_bar, local)], "final Ξ²", "comm rounds",
            "MB/worker"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in runs.items():
        cells = [name, *[fmt.format(s[k + suffix]) if k + suffix in s else "—"
                         for k, _, _, fmt in metrics for suffix in ("", "_local_mean")],
                 f"{s['final_consensus_distance_sq']:.3e}", f"{s['comm_rounds']:d}",
                 f"{s['bytes_per_worker'] / 1e6:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


AXES = {"steps": ("step", "step"), "epochs": ("epoch", "epoch"), "time": ("sim_seconds", "simulated time (s)"),
        "bytes": ("bytes_per_worker", "bytes sent per worker")}
"""``--x`` of compare and plot: the metric-row key it reads and its label (bytes: on a log scale)."""


def headline(rows: list[dict]) -> str:
    """The test metric a run is judged by: accuracy, or the test loss of a language model."""
    return "test_accuracy" if any("test_accuracy" in r for r in rows) else "test_loss"


def metric_series(name: str, rows: list[dict], x: str, y: str) -> tuple[list[float], list[float]]:
    """(x, y) of every row that has y; the x key must be in them (sim_seconds: a network run)."""
    key = AXES[x][0]
    points = [(r[key], r[y]) for r in rows if isinstance(r.get(y), (int, float)) and key in r]
    if not points:
        why = "it was trained without a network section" if x == "time" and not any(key in r for r in rows) \
            else f"no metric row has {y}"
        raise ConfigError(f"'{short(name)}' has no {y} against {x} to show: {why}")
    return [p[0] for p in points], [p[1] for p in points]


def axis_table(runs: dict[str, Path], x: str) -> str:
    """A Markdown table of finished runs along ``x`` (steps, epochs, simulated time or bytes): the
    headline test metric at the end, the run's length, where it first reached its target, and
    the metric at an equal budget — the shortest run's length (each run's last evaluation at or
    before it)."""
    key, unit = AXES[x]
    summaries = {name: read_summary(path, ("steps",)) for name, path in runs.items()}
    rows = {name: read_rows(path) for name, path in runs.items()}
    metric = headline(next(iter(rows.values())))
    series = {name: metric_series(name, rows[name], x, metric) for name in runs}
    budget = min(xs[-1] for xs, _ in series.values())
    head = ["run", metric, unit, *(["communication"] if x == "time" else []), f"{unit} to target",
            f"{metric} at {budget:.4g}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in runs:
        s, (xs, ys) = summaries[name], series[name]
        reached = next((r[key] for r in rows[name] if r["step"] == s.get("steps_to_target")), None)
        at_budget = [y for v, y in zip(xs, ys) if v <= budget]
        cells = [name, f"{ys[-1]:.4f}", f"{rows[name][-1][key]:.4g}",
                 *([f"{s['sim_seconds_comm'] / s['sim_seconds']:.0%}"] if x == "time" else []),
                 "—" if reached is None else f"{reached:.4g}", f"{at_budget[-1]:.4f}" if at_budget else "—"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


CONFIDENCE = 0.95  # the level of every interval over seeds in the repro tables


def t_quantile(q: float, df: int) -> float:
    """The q-quantile (1/2 < q < 1) of Student's t with ``df`` ≥ 1 degrees of freedom (scipy's)."""
    from scipy.stats import t

    if not (0.5 < q < 1 and isinstance(df, int) and df >= 1):
        raise ValueError(f"t_quantile needs 1/2 < q < 1 and an integer df >= 1, got q={q}, df={df}")
    return float(t.ppf(q, df))


def mean_ci(values: list[float], level: float = CONFIDENCE) -> tuple[float, float | None]:
    """(mean, half-width) of the Student t interval for the mean of K values: x̄ ± t_{(1+level)/2,
    K−1}·s/√K, s the sample standard deviation (None with one value: no interval). A paired
    difference is this interval of the per-seed differences."""
    k = len(values)
    mean = sum(values) / k
    if k == 1:
        return mean, None
    s = math.sqrt(sum((v - mean) ** 2 for v in values) / (k - 1))
    return mean, t_quantile((1 + level) / 2, k - 1) * s / math.sqrt(k)


def ci_cell(values: list[float], fmt: str) -> str:
    """"mean ± half-width" of :func:`mean_ci` in ``fmt`` (the half-width unsigned); the mean alone
    for one value."""
    mean, half = mean_ci(values)
    return fmt.format(mean) if half is None else f"{fmt.format(mean)} ± {fmt.replace('+', '').format(half)}"
