"""``byzantine``: workers that lie, against robust aggregation on All-Reduce and on graphs."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..config import ConfigError
from ..plots import plot_consensus, plot_runs
from ..report import ci_cell
from .base import DIVERGED, Suite, Variant, against, cpu_base, read_summaries, register, slug


BYZANTINE_FRACTIONS = {"1/8": 0.125, "1/4": 0.25}
BYZANTINE_ATTACKS = {"sign-flip": [], "alie": [], "ipm": [],
                     "dissensus": ["byzantine.strength=1.5"]}  # ε = 1.5, as He et al.'s experiments
BYZANTINE_RULES = {"All-Reduce": ("algorithm=allreduce", {
                       "mean": [], "median": ["byzantine.aggregator=median"],
                       "trimmed-mean": ["byzantine.aggregator=trimmed-mean"],
                       "centered-clip": ["byzantine.aggregator=centered-clip", "byzantine.clip=3"]}),
                   **{label: (f"topology={spec}", {
                       "gossip": [], "clipped-gossip": ["byzantine.aggregator=clipped-gossip", "byzantine.clip=0.1"],
                       "self-centered-clip": ["byzantine.aggregator=self-centered-clip"]})
                      for label, spec in (("ring", "ring"), ("exponential", "exponential"), ("complete", "complete"))}}


@register("byzantine")
def byzantine(scale: str, quick: bool) -> Suite:
    """Workers that lie (issue 32), n = 16 on MNIST-1D: All-Reduce with the mean, the coordinate-wise
    median, the trimmed mean (b = f) and centered clipping (τ = 3 on the gradients, one iteration);
    D-SGD on a ring, the exponential graph and the complete graph with plain gossip, clipped gossip
    (τ = 0.1) and self-centered clipping (τ_i adaptive); each without attackers and under
    sign-flip, ALIE, IPM (and, on the graphs, dissensus with ε = 1.5) with f = 1/8 and 1/4 of
    the workers Byzantine (drawn from the seed). Each attacked run is compared with the same
    algorithm and rule without attackers, each robust rule without attackers with the plain one.
    The metrics are the honest workers'. CPU scale only."""
    if scale == "paper":
        raise ConfigError("repro byzantine runs at --scale cpu only (it has no paper configuration)")
    n, epochs = (8, 2) if quick else (16, 20)
    fractions = {"1/4": 0.25} if quick else BYZANTINE_FRACTIONS
    attacks = {k: v for k, v in BYZANTINE_ATTACKS.items() if not quick or k in ("sign-flip", "dissensus")}
    rules = {label: (algorithm, dict(list(aggregators.items())[:2]) if quick else aggregators)
             for label, (algorithm, aggregators) in BYZANTINE_RULES.items()
             if not quick or label in ("All-Reduce", "ring")}
    suite = Suite(f"byzantine: workers that lie (n = {n})", [*cpu_base(quick, epochs), "eval_every=1"])
    table = {}
    for label, (setting, aggregators) in rules.items():
        algorithm = ["algorithm=allreduce"] if label == "All-Reduce" else ["algorithm=gossip", setting]
        plain = None
        for rule, keys in aggregators.items():
            clean = Variant(f"{label}, {rule}, no attack", [*algorithm, *keys], n)
            attacked = [Variant(f"{label}, {rule}, {attack} f={frac}",
                                [*algorithm, *keys, f"byzantine.fraction={fractions[frac]}",
                                 f"byzantine.attack={attack}", *extra], n)
                        for attack, extra in attacks.items() if label != "All-Reduce" or attack != "dissensus"
                        for frac in fractions]
            suite.variants += against(clean, attacked)
            if plain is None:
                plain = clean
            else:
                clean.baseline = plain.name
            table[f"{label}, {rule}"] = [clean.name, *(v.name for v in attacked)]
    suite.report = lambda suite, configs, out, seeds: _byzantine_report(table, out, seeds)
    suite.reports_diverged = True
    return suite


def _byzantine_report(table: dict[str, list[str]], out: Path, seeds: range) -> str:
    """Two tables, one row per algorithm and rule, one column per attack and f: the honest
    workers' x̄ test accuracy and their final Ξ²; plots (the first seed) of the accuracy and the
    honest Ξ² over training under the strongest setting of each graph."""
    summaries = {name: read_summaries(name, out, seeds) for names in table.values() for name in names}
    columns = [name.rsplit(", ", 1)[1] for name in max(table.values(), key=len)]
    lines = ["Test accuracy (%) of the honest workers' mean x̄; mean ± 95 % interval over seeds.", "",
             "| algorithm, rule | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for row, names in table.items():
        cells = {name.rsplit(", ", 1)[1]: _cell(summaries[name], lambda s: 100 * s["test_accuracy"], "{:.1f}")
                 for name in names}
        lines.append(f"| {row} | " + " | ".join(cells.get(c, "—") for c in columns) + " |")
    lines += ["", "Final Ξ² among the honest workers (gossip; the all-reduce family's is ~0).", "",
              "| algorithm, rule | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for row, names in table.items():
        if row.startswith("All-Reduce"):
            continue
        cells = {name.rsplit(", ", 1)[1]: _cell(summaries[name], lambda s: s["final_consensus_distance_sq"], "{:.2e}")
                 for name in names}
        lines.append(f"| {row} | " + " | ".join(cells.get(c, "—") for c in columns) + " |")
    lines.append("")
    graphs = sorted({row.split(", ")[0] for row in table} - {"All-Reduce"})
    strongest = columns[-1]  # dissensus at the largest f
    for graph in graphs:
        runs = {f"{row}, {col}": out / f"{slug(f'{row}, {col}')}-seed{seeds[0]}"
                for row in table if row.startswith(f"{graph},") for col in (columns[0], strongest)}
        diverged = {name for name, path in runs.items() if (path / DIVERGED).is_file()}
        plot_runs({name: path for name, path in runs.items() if name not in diverged}, "epochs", None,
                  out / f"{slug(graph)}-accuracy.png", title=f"{graph}: {strongest}")
        plot_consensus({f"{name}{' (diverged)' * (name in diverged)}": path / "metrics.jsonl"
                        for name, path in runs.items()}, [],
                       out / f"{slug(graph)}-consensus.png", title=f"{graph}: honest Ξ², {strongest}")
        lines += [f"![{graph}: accuracy]({slug(graph)}-accuracy.png) "
                  f"![{graph}: honest Ξ²]({slug(graph)}-consensus.png)", ""]
    return "\n".join(lines) + "\n"


def _cell(runs: list[dict | None], value: Callable[[dict], float], fmt: str) -> str:
    """:func:`ci_cell` over the runs that finished, with how many diverged."""
    finished = [value(s) for s in runs if s is not None]
    diverged = len(runs) - len(finished)
    cell = ci_cell(finished, fmt) if finished else "—"
    return cell if not diverged else f"{cell} ({diverged}/{len(runs)} diverged)"
