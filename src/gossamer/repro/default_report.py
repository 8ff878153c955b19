"""The report of a suite that sets none of its own: the test metrics, mean Ξ² per learning-rate
phase, communication (and the optional columns) per variant, control from the estimate against
control from the exact Ξ where the suite pairs them, and the plots."""

from __future__ import annotations

import json
from pathlib import Path

from ..plots import plot_consensus, plot_tradeoff
from ..report import ci_cell, test_metrics
from ..rundir import read_summary
from .base import Suite, run_dirs, slug
from .stats import phase_means


OPTIONAL_COLUMNS = [("sharpness", "sharpness (x̄)", "{:.3g}"), ("gossip_rounds_saved", "gossip rounds saved", "{:.0f}")]
"""Summary keys shown, as (key, heading, format), where a run of the suite has them ("—": a variant without)."""


def consensus_report(suite: Suite, configs: dict, out: Path, seeds: range) -> str:
    """The table of the test metrics, mean Ξ² per learning-rate phase, rounds (and the optional
    columns); the Ξ² plot and the test metric against communication (and sharpness)."""
    boundaries = configs[suite.variants[0].name].milestones
    phases = len(boundaries) + 1
    summaries = {v.name: [read_summary(r) for r in run_dirs(v.name, out, seeds)] for v in suite.variants}
    metrics = test_metrics([s for runs in summaries.values() for s in runs])
    optional = [c for c in OPTIONAL_COLUMNS if any(c[0] in s for runs in summaries.values() for s in runs)]
    head = ["variant", *[f"{x_bar} (x̄)" for _, x_bar, _, _ in metrics],
            *[f"mean Ξ² phase {k + 1}" for k in range(phases)], "MB/worker", "comm rounds", "extra gossip rounds",
            *[heading for _, heading, _ in optional]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in suite.variants:
        per_phase = [phase_means(out / f"{slug(v.name)}-seed{s}" / "metrics.jsonl", boundaries) for s in seeds]
        runs = summaries[v.name]
        cells = [v.name, *[ci_cell([s[key] for s in runs], fmt) for key, _, _, fmt in metrics],
                 *[ci_cell([p[k] for p in per_phase], "{:.2e}") for k in range(phases)],
                 ci_cell([s["bytes_per_worker"] / 1e6 for s in runs], "{:.2f}"),
                 ci_cell([s["comm_rounds"] for s in runs], "{:.0f}"),
                 ci_cell([s.get("extra_gossip_rounds", 0) for s in runs], "{:.0f}"),
                 *[ci_cell([s[key] for s in runs], fmt) if key in runs[0] else "—" for key, _, fmt in optional]]
        lines.append("| " + " | ".join(cells) + " |")
    if suite.estimate_pairs:
        lines += ["", *_estimate_section(suite, out, seeds)]
    plot_consensus({v.name: out / f"{slug(v.name)}-seed{seeds[0]}" / "metrics.jsonl" for v in suite.variants},
                   boundaries, out / "consensus.png", suite.title)
    plot_tradeoff(summaries, out / "tradeoff.png", suite.title)
    return ("\n".join(lines) + "\n\n![Ξ² over training](consensus.png)\n\n"
            "![test metric against communication](tradeoff.png)\n")


def _estimate_section(suite: Suite, out: Path, seeds: range) -> list[str]:
    """Control from the estimate (2/p)Θ against control from the exact Ξ: extra rounds, how often the
    estimate ran more rounds than the exact rule would have from the same state, accuracy."""
    lines = ["## Control from the local estimate vs the exact Ξ", "",
             "\"more than exact\": the share of controlled steps where the estimate-driven controller ran more "
             "extra rounds than the exact rule would have from the same state (Ξ probed after each of its rounds, "
             "as measurement only). Mean ± 95 % interval over seeds.", "",
             "| variant | extra rounds exact | extra rounds estimate | more than exact | rounds: estimate / exact rule "
             "(same states) | test acc exact | test acc estimate |", "|---|---|---|---|---|---|---|"]
    for exact, estimate in suite.estimate_pairs:
        runs = {name: [out / f"{slug(name)}-seed{s}" for s in seeds] for name in (exact, estimate)}
        summaries = {name: [read_summary(r) for r in rs] for name, rs in runs.items()}
        more, ratio = [], []
        for run in runs[estimate]:
            steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            steps = [r for r in steps if "extra_gossip_rounds_if_exact" in r]
            more.append(sum(r["extra_gossip_rounds"] > r["extra_gossip_rounds_if_exact"] for r in steps) / len(steps))
            ratio.append(sum(r["extra_gossip_rounds"] for r in steps)
                         / max(1, sum(r["extra_gossip_rounds_if_exact"] for r in steps)))
        lines.append("| " + " | ".join([
            exact, ci_cell([s["extra_gossip_rounds"] for s in summaries[exact]], "{:.0f}"),
            ci_cell([s["extra_gossip_rounds"] for s in summaries[estimate]], "{:.0f}"),
            ci_cell([100 * m for m in more], "{:.1f}") + " %", ci_cell(ratio, "{:.2f}"),
            ci_cell([s["test_accuracy"] for s in summaries[exact]], "{:.4f}"),
            ci_cell([s["test_accuracy"] for s in summaries[estimate]], "{:.4f}")]) + " |")
    return lines
