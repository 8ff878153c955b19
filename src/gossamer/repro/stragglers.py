"""``stragglers``: slow and uneven workers, synchronous schedules and AD-PSGD on per-worker clocks."""

from __future__ import annotations

from pathlib import Path

from ..config import ConfigError
from ..plots import plot_runs
from ..report import axis_table, ci_cell
from ..rundir import read_summary
from .base import Suite, Variant, against, cpu_base, register, run_dirs, slug, target_cell, target_rows


STRAGGLER_NETWORK = "ethernet-10g"
SPEEDS = {"equal speeds": [], "10% at 4x": ["slow_workers=0.1@4"], "jitter lognormal 0.5": ["compute_jitter=lognormal:0.5"]}


@register("stragglers")
def stragglers(scale: str, quick: bool) -> Suite:
    """Slow and uneven workers (issue 21): All-Reduce, local SGD (H = 4), D-SGD on a ring and on
    the one-peer exponential graph, and AD-PSGD (Lian et al. 2018) on a ring, at n = 16 on
    ``STRAGGLER_NETWORK`` with a step of ``compute_ms`` = 1 ms, each with equal speeds, 10 % of
    the workers 4× slower, and log-normal jitter σ = 0.5. Measurement is free. CPU scale only."""
    if scale == "paper":
        raise ConfigError("repro stragglers runs at --scale cpu only (it has no paper configuration)")
    n, epochs = (4, 1) if quick else (16, 20)
    base = [*cpu_base(quick, epochs), "eval_every=1", f"network={STRAGGLER_NETWORK}", "compute_ms=1",
            "network.count_metrics=false", f"target_accuracy={0.1 if quick else 0.55}"]
    algorithms = {"All-Reduce": ["algorithm=allreduce"], "local H=4": ["algorithm=local", "local_steps=4"],
                  "D-SGD ring": ["algorithm=gossip", "topology=ring"],
                  "D-SGD one-peer-exp": ["algorithm=gossip", "topology=one-peer-exponential"],
                  "AD-PSGD ring": ["algorithm=ad-psgd", "topology=ring"]}
    suite = Suite(f"stragglers: slow and uneven workers (n = {n}, {STRAGGLER_NETWORK})", base)
    for speed, slow in SPEEDS.items():
        runs = [Variant(f"{name}, {speed}", [*overrides, *slow], n) for name, overrides in algorithms.items()]
        suite.variants += against(runs[0], runs[1:])
    suite.report = lambda suite, configs, out, seeds: _straggler_report(list(algorithms), configs, out, seeds)
    return suite


def _straggler_report(algorithms: list[str], configs: dict, out: Path, seeds: range) -> str:
    """Per speed setting: a table over seeds (test accuracy, simulated seconds to the target and in
    total, idle fraction, final Ξ²), the accuracy at equal simulated time (the first
    seed: :func:`gossamer.report.axis_table`) and a plot of accuracy against simulated time."""
    head = ["variant", "test acc", "s to target", "s total", "idle", "final Ξ²"]
    lines = [f"Simulated seconds: compute {next(iter(configs.values())).compute_ms} ms a step (× each worker's "
             f"factor) plus the α–β time of every operator, on per-worker clocks.", ""]
    for speed in SPEEDS:
        names = [f"{name}, {speed}" for name in algorithms]
        lines += [f"## {speed}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for name in names:
            runs = [read_summary(r) for r in run_dirs(name, out, seeds)]
            lines.append("| " + " | ".join([
                name, ci_cell([s["test_accuracy"] for s in runs], "{:.4f}"),
                target_cell(target_rows(run_dirs(name, out, seeds), configs[name]), "sim_seconds", "{:.3f}"),
                ci_cell([s["sim_seconds"] for s in runs], "{:.3f}"),
                ci_cell([100 * s["sim_seconds_idle_fraction"] for s in runs], "{:.0f} %"),
                ci_cell([s["final_consensus_distance_sq"] for s in runs], "{:.2e}")]) + " |")
        seed0 = {name: out / f"{slug(name)}-seed{seeds[0]}" for name in names}
        file = f"{slug(speed)}.png"
        plot_runs(seed0, "time", None, out / file, title=speed)
        lines += ["", f"Seed {seeds[0]} at equal simulated time:", "", axis_table(seed0, "time"), "",
                  f"![test accuracy against simulated time]({file})", ""]
    return "\n".join(lines) + "\n"
