"""``faults``: workers lost mid-run and churned, both rejoin modes and the repair rules."""

from __future__ import annotations

from pathlib import Path

from ..config import ConfigError
from ..plots import plot_consensus
from ..report import ci_cell, test_metrics
from ..rundir import read_summary
from .base import Suite, Variant, against, cpu_base, register, run_dirs, slug
from .stats import phase_means


@register("faults")
def faults(scale: str, quick: bool) -> Suite:
    """Workers that fail and return (issue 22): All-Reduce, D-SGD on a ring and on the exponential
    graph at n = 32, with no faults, 4 workers (spread over the ring) gone for the middle third of
    training, and churn (each step every living worker leaves with probability P = 0.002 for a
    geometric D = 50 steps), each with ``rejoin: neighbours`` and ``stale``; on the graphs, the
    ``neighbours`` settings also with ``repair: metropolis`` (the default is ``local``: how much of a
    fault's effect is the repair rule's). Every variant is compared with the same algorithm without
    faults. CPU scale only (no paper-scale workload is defined)."""
    if scale == "paper":
        raise ConfigError("repro faults runs at --scale cpu only (it has no paper configuration)")
    n, epochs = (8, 4) if quick else (32, 40)
    suite = Suite(f"faults: n = {n}, workers lost and churned", cpu_base(quick, epochs))
    steps = epochs * (int(0.8 * (1000 if quick else 10000)) // (n * 16))
    window = (steps // 3, 2 * steps // 3)
    lost = [k * n // 4 + n // 8 for k in range(4)]  # 4 workers, a quarter of the ring apart
    events = "[" + ",".join(f'"{w}@{window[0]}-{window[1]}"' for w in lost) + "]"
    churn = ["faults.churn=0.05", "faults.downtime=5"] if quick else ["faults.churn=0.002", "faults.downtime=50"]
    settings = [("no faults", []),
                *[(f"4 lost mid-run, rejoin {r}", [f"faults.events={events}", f"faults.rejoin={r}"])
                  for r in ("neighbours", "stale")],
                *[(f"churn, rejoin {r}", [*churn, f"faults.rejoin={r}"]) for r in ("neighbours", "stale")]]
    metropolis = [(f"{setting}, repair metropolis", [*fault, "faults.repair=metropolis"])
                  for setting, fault in settings if setting.endswith("neighbours")]
    algorithms = [("All-Reduce", ["algorithm=allreduce"]), ("ring", ["algorithm=gossip", "topology=ring"]),
                  ("exponential", ["algorithm=gossip", "topology=exponential"])]
    for label, overrides in algorithms[1:2] if quick else algorithms:  # quick: the ring only
        graph = label != "All-Reduce"
        runs = [Variant(f"{label}, {setting}", [*overrides, *fault], n)
                for setting, fault in settings + (metropolis if graph else [])]
        suite.variants += against(runs[0], runs[1:])
    suite.report = lambda suite, configs, out, seeds: _faults_report(suite, configs, out, seeds, window, steps)
    return suite


def _faults_report(suite: Suite, configs: dict, out: Path, seeds: range, window: tuple[int, int],
                   steps: int) -> str:
    """Accuracy of x̄ over the living, mean Ξ² before, during and after the fault window, the
    fewest workers alive, rounds; Ξ² over training with the window marked (lost workers, and churn)."""
    spe = steps / configs[suite.variants[0].name].epochs
    bounds = [window[0] / spe, window[1] / spe]
    summaries = {v.name: [read_summary(r) for r in run_dirs(v.name, out, seeds)] for v in suite.variants}
    metrics = test_metrics([s for runs in summaries.values() for s in runs])
    head = ["variant", *[f"{x_bar} (x̄, living)" for _, x_bar, _, _ in metrics],
            *[f"mean Ξ² {part}" for part in ("before", "during", "after")], "workers alive (fewest)", "comm rounds"]
    lines = [f"Fault window: steps {window[0]}–{window[1]} of {steps} (epochs {bounds[0]:g}–{bounds[1]:g}); "
             "Ξ² and accuracy are over the living workers. Mean ± 95 % interval over seeds.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in suite.variants:
        parts = [phase_means(out / f"{slug(v.name)}-seed{s}" / "metrics.jsonl", bounds) for s in seeds]
        runs = summaries[v.name]
        lines.append("| " + " | ".join([
            v.name, *[ci_cell([s[key] for s in runs], fmt) for key, _, _, fmt in metrics],
            *[ci_cell([p[k] for p in parts], "{:.2e}") for k in range(3)],
            ci_cell([s.get("workers_alive_min", v.workers) for s in runs], "{:.0f}"),
            ci_cell([s["comm_rounds"] for s in runs], "{:.0f}")]) + " |")
    for kind, words in (("lost", "lost mid-run"), ("churn", "churn")):
        chosen = [v for v in suite.variants if words in v.name or v.name.endswith("no faults")]
        plot_consensus({v.name: out / f"{slug(v.name)}-seed{seeds[0]}" / "metrics.jsonl" for v in chosen}, bounds,
                       out / f"consensus-{kind}.png", f"{suite.title}: {words} (dashed: the fault window)")
        lines += ["", f"![Ξ² over training, {words}](consensus-{kind}.png)"]
    return "\n".join(lines) + "\n"
