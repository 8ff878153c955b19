"""The statistics of the suites' tables: Spearman's rank correlation and its bootstrap over
the seeds, the mean Ξ² per learning-rate phase, and each variant's paired difference from its
baseline."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from ..report import CONFIDENCE, ci_cell, mean_ci
from ..rng import declare, host_stream
from .base import Suite, read_summaries


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (tied values share their mean rank); None where either side is
    constant (no ranking to compare)."""
    def ranks(values):
        order = sorted(range(len(values)), key=lambda i: values[i])
        rank = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                rank[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return rank
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / (sxx * syy) ** 0.5 if sxx > 0 and syy > 0 else None


BOOTSTRAP = declare("bootstrap-seeds", "the seeds a bootstrap resample of a suite's runs draws", ("draw",))
BOOTSTRAP_DRAWS = 2000


def bootstrap_spearman(accuracy: list[list[float]], measures: dict[str, list[float]],
                       draws: int = BOOTSTRAP_DRAWS) -> dict[str, tuple[float, float]]:
    """Percentile intervals (CONFIDENCE) of Spearman's ρ between each measure and the variants'
    mean accuracy, and of each pair's difference (``"a − b"``), over bootstrap resamples of the
    seeds: ``accuracy`` [variant][seed]; every resample draws K seeds with replacement (the same for
    every variant: a seed is one initialisation and data order for all of them), stream
    ``bootstrap-seeds``. A resample where a ρ is undefined (all means equal) is left out of it."""
    k = len(accuracy[0])
    samples: dict[str, list[float]] = {name: [] for name in measures}
    names = list(measures)
    differences = {f"{a} − {b}": [] for i, a in enumerate(names) for b in names[i + 1:]}
    for draw in range(draws):
        chosen = host_stream(BOOTSTRAP, 0, draw).integers(0, k, size=k)
        means = [statistics.mean(runs[j] for j in chosen) for runs in accuracy]
        rho = {name: spearman(values, means) for name, values in measures.items()}
        for name, r in rho.items():
            if r is not None:
                samples[name].append(r)
        for key in differences:
            a, b = key.split(" − ")
            if rho[a] is not None and rho[b] is not None:
                differences[key].append(rho[a] - rho[b])
    low, high = round((1 - CONFIDENCE) / 2 * 1000) - 1, round((1 + CONFIDENCE) / 2 * 1000) - 1
    cuts = {name: statistics.quantiles(v, n=1000, method="inclusive")
            for name, v in {**samples, **differences}.items() if len(v) > 1}
    return {name: (q[low], q[high]) for name, q in cuts.items()}


def phase_means(metrics_file: Path, boundaries: list[float]) -> list[float]:
    """Mean Ξ² over the steps of each learning-rate phase."""
    sums, counts = [0.0] * (len(boundaries) + 1), [0] * (len(boundaries) + 1)
    for line in metrics_file.read_text().splitlines():
        row = json.loads(line)
        k = sum(row["epoch"] > b for b in boundaries)
        sums[k] += row["consensus_distance_sq"]
        counts[k] += 1
    return [s / max(c, 1) for s, c in zip(sums, counts)]


def paired_section(suite: Suite, out: Path, seeds: range) -> str:
    """Each variant against its baseline: the difference of the headline test metric seed by seed
    (the same seed: the same initial model and batches) and its 95 % Student t interval."""
    pairs = [v for v in suite.variants if v.baseline is not None]
    if not pairs:
        return ""
    summaries = {v.name: read_summaries(v.name, out, seeds) for v in suite.variants}
    accuracy = all("test_accuracy" in s for runs in summaries.values() for s in runs if s is not None)
    key, unit, fmt = ("test_accuracy", "points", "{:+.2f}") if accuracy else ("test_loss", "nats", "{:+.4f}")
    scale = 100 if accuracy else 1
    lines = ["## Paired differences against the baseline", "",
             f"Δ = {key} of the variant − {key} of its baseline on the same seed (in {unit}); mean ± "
             f"{CONFIDENCE:.0%} Student t interval of the per-seed differences.", "",
             f"| variant | baseline | Δ per seed ({', '.join(map(str, seeds))}) | mean Δ | interval excludes 0 |",
             "|---|---|---|---|---|"]
    for v in pairs:  # a seed where either run diverged has no difference
        deltas = [None if a is None or b is None else scale * (a[key] - b[key])
                  for a, b in zip(summaries[v.name], summaries[v.baseline])]
        finished = [d for d in deltas if d is not None]
        mean, half = mean_ci(finished) if finished else (None, None)
        excludes = "—" if half is None else ("yes" if abs(mean) > half else "no")
        shown = ", ".join("diverged" if d is None else fmt.format(d) for d in deltas)
        lines.append(f"| {v.name} | {v.baseline} | {shown} | {ci_cell(finished, fmt) if finished else '—'} | "
                     f"{excludes} |")
    return "\n".join(lines) + "\n"
