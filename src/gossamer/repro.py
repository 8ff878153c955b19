"""``gossamer repro``: the papers' experiments at a scale two CPU cores can run.

A suite is a list of variants (config overrides) run for several seeds on MNIST-1D with the
1-D CNN; it writes every run, ``results.md`` (mean ± std over seeds) and a plot of Ξ² over
training with the learning-rate phases marked. Suites: ``ring-scaling`` and
``consensus-phases`` (Kong et al.), ``heterogeneous`` (non-i.i.d. data: D-SGD, quasi-global
momentum, gradient tracking, CHOCO-SGD and All-Reduce).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .config import load_config
from .report import plot_consensus, read_summary


@dataclass
class Variant:
    """One line of a suite: a name and its config overrides (``{ref}`` = the seed's reference run)."""

    name: str
    overrides: list[str]
    workers: int


@dataclass
class Suite:
    title: str
    base: list[str]  # overrides shared by every variant
    variants: list[Variant] = field(default_factory=list)
    reference: str | None = None  # name of the variant whose run controlled variants follow
    estimate_pairs: list[tuple[str, str]] = field(default_factory=list)  # (exact, estimate) controlled variants


def _base(quick: bool, epochs: int) -> list[str]:
    # lr 0.0025 per worker scaled linearly with n (the papers scale 0.1 per 64 samples), warm-up,
    # decay ×0.1 at 50 % and 75 % of training, Nesterov momentum 0.9, weight decay 1e-4
    size = ["num_samples=1000", "batch_size=16"] if quick else ["num_samples=10000", "batch_size=16"]
    return [*size, f"epochs={epochs}", f"milestones=[{epochs / 2},{epochs * 3 / 4}]", "lr=0.0025",
            "lr_scaling=linear", f"warmup_epochs={0 if quick else 2}", "momentum=0.9", "nesterov=true",
            "weight_decay=1e-4", "eval_every=5", "model=cnn1d"]


def ring_scaling(quick: bool) -> Suite:
    """All-Reduce vs ring vs one-peer exponential graph as n grows (Kong et al.: the gap grows with n)."""
    sizes = (4, 8) if quick else (16, 32, 64)  # quick: 1000 samples leave 100 per worker at n = 8
    suite = Suite("ring-scaling: test accuracy and Ξ² as n grows", _base(quick, 4 if quick else 40))
    for n in sizes:
        suite.variants += [
            Variant(f"allreduce n={n}", ["algorithm=allreduce"], n),
            Variant(f"ring n={n}", ["algorithm=gossip", "topology=ring"], n),
            Variant(f"one-peer-exp n={n}", ["algorithm=gossip", "topology=one-peer-exponential"], n),
        ]
    return suite


def consensus_phases(quick: bool) -> Suite:
    """Kong et al.'s phase study: which phase needs a small Ξ (ring, phases = lr phases)."""
    n = 8 if quick else 32
    suite = Suite(f"consensus-phases: ring, n = {n}", _base(quick, 4 if quick else 40), reference="ring")
    gossip = ["algorithm=gossip", "topology=ring"]
    suite.variants = [
        Variant("allreduce", ["algorithm=allreduce"], n),
        Variant("ring", gossip, n),
        Variant("dec-phase-1", [*gossip, "phases=[gossip,allreduce,allreduce]"], n),
        Variant("dec-phase-2", [*gossip, "phases=[allreduce,gossip,allreduce]"], n),
        Variant("dec-phase-3", [*gossip, "phases=[allreduce,allreduce,gossip]"], n),
    ]
    for label, c in (("1", 1.0), ("1/2", 0.5), ("1/4", 0.25)):
        suite.variants.append(Variant(
            f"ctrl-phase-1 c={label}",
            [*gossip, "phases=[controlled,allreduce,allreduce]", "consensus.target=run:{ref}",
             f"consensus.factor={c}", "consensus.max_extra_rounds=1000"], n))
    for label in ("1", "1/2", "1/4"):  # the same control, deciding from Θ and Ξ ≤ (2/p)Θ alone
        exact = next(v for v in suite.variants if v.name == f"ctrl-phase-1 c={label}")
        suite.variants.append(Variant(f"{exact.name} estimate", [*exact.overrides, "consensus.measure=estimate"], n))
        suite.estimate_pairs.append((exact.name, f"{exact.name} estimate"))
    return suite


CHOCO_GAMMA = 0.05  # CHOCO's consensus step for top-1 % in the heterogeneous suite (tuned, docs/results.md)


def heterogeneous(quick: bool) -> Suite:
    """Non-i.i.d. data on a ring: Dirichlet α = 0.1 and 1 and i.i.d. shards; D-SGD, D-SGD with
    quasi-global momentum, gradient tracking, CHOCO-SGD with top-1 % compression, All-Reduce."""
    n = 4 if quick else 16
    suite = Suite(f"heterogeneous: ring, n = {n}, Dirichlet α", _base(quick, 2 if quick else 10))
    ring = ["topology=ring"]
    algorithms = [("All-Reduce", ["algorithm=allreduce"]),
                  ("D-SGD", ["algorithm=gossip", *ring]),
                  ("D-SGD + QG momentum", ["algorithm=gossip", *ring, "momentum_mode=quasi-global"]),
                  ("gradient tracking", ["algorithm=gradient-tracking", *ring]),
                  ("CHOCO top-1%", ["algorithm=choco", *ring, "compression=top-k:0.01", f"choco_gamma={CHOCO_GAMMA}"])]
    for label, partition in (("α=0.1", ["partition=dirichlet", "dirichlet_alpha=0.1"]),
                             ("α=1", ["partition=dirichlet", "dirichlet_alpha=1"]),
                             ("iid", ["partition=iid"])):
        suite.variants += [Variant(f"{name} {label}", [*overrides, *partition], n) for name, overrides in algorithms]
    return suite


SUITES: dict[str, Callable[[bool], Suite]] = {"ring-scaling": ring_scaling, "consensus-phases": consensus_phases,
                                              "heterogeneous": heterogeneous}


def _slug(name: str) -> str:
    return name.replace(" ", "_").replace("=", "").replace("/", "-")


def phase_means(metrics_file: Path, boundaries: list[float]) -> list[float]:
    """Mean Ξ² over the steps of each learning-rate phase."""
    sums, counts = [0.0] * (len(boundaries) + 1), [0] * (len(boundaries) + 1)
    for line in metrics_file.read_text().splitlines():
        row = json.loads(line)
        k = sum(row["epoch"] > b for b in boundaries)
        sums[k] += row["consensus_distance_sq"]
        counts[k] += 1
    return [s / max(c, 1) for s, c in zip(sums, counts)]


def run_suite(name: str, out: Path, seeds: int, quick: bool, train_run: Callable, log=print,
              overrides: list[str] = ()) -> Path:
    """Run every variant for every seed into ``out``; write results.md and the Ξ² plot.

    ``overrides`` (``KEY=VALUE``) change the suite's base config for every variant."""
    suite = SUITES[name](quick)
    suite.base += list(overrides)
    configs = {}
    for v in suite.variants:  # check every config before training anything
        configs[v.name] = load_config(None, [*suite.base, f"workers={v.workers}",
                                             *[o.replace("{ref}", "REF") for o in v.overrides]])
    for seed in range(seeds):
        for v in suite.variants:
            ref = out / f"{_slug(suite.reference)}-seed{seed}" if suite.reference else ""
            overrides = [*suite.base, f"workers={v.workers}", f"seed={seed}",
                         *[o.replace("{ref}", str(ref)) for o in v.overrides]]
            log(f"[{name}] seed {seed}: {v.name}")
            train_run(load_config(None, overrides), out / f"{_slug(v.name)}-seed{seed}")
    results = out / "results.md"
    results.write_text(_results_table(suite, configs, out, seeds, name, quick))
    plot_consensus({v.name: out / f"{_slug(v.name)}-seed0" / "metrics.jsonl" for v in suite.variants},
                   configs[suite.variants[0].name].milestones, out / "consensus.png", suite.title)
    return results


def _mean_std(values: list[float], fmt: str) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{fmt.format(statistics.mean(values))} ± {fmt.format(std)}"


def _results_table(suite: Suite, configs: dict, out: Path, seeds: int, name: str, quick: bool) -> str:
    boundaries = configs[suite.variants[0].name].milestones
    phases = len(boundaries) + 1
    head = ["variant", "test acc (x̄)", *[f"mean Ξ² phase {k + 1}" for k in range(phases)],
            "MB/worker", "comm rounds", "extra gossip rounds"]
    lines = [f"# {suite.title}", "",
             f"Command: `gossamer repro {name} --seeds {seeds}{' --quick' if quick else ''}"
             f"{''.join(' --set ' + o for o in suite.base[len(SUITES[name](quick).base):])}`; "
             f"mean ± std over {seeds} seed(s). Base config: `{' '.join(suite.base)}`.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in suite.variants:
        runs = [out / f"{_slug(v.name)}-seed{s}" for s in range(seeds)]
        summaries = [read_summary(r) for r in runs]
        per_phase = [phase_means(r / "metrics.jsonl", boundaries) for r in runs]
        cells = [v.name, _mean_std([s["test_accuracy"] for s in summaries], "{:.4f}"),
                 *[_mean_std([p[k] for p in per_phase], "{:.2e}") for k in range(phases)],
                 _mean_std([s["bytes_per_worker"] / 1e6 for s in summaries], "{:.2f}"),
                 _mean_std([s["comm_rounds"] for s in summaries], "{:.0f}"),
                 _mean_std([s["extra_gossip_rounds"] for s in summaries], "{:.0f}")]
        lines.append("| " + " | ".join(cells) + " |")
    if suite.estimate_pairs:
        lines += ["", *_estimate_section(suite, out, seeds)]
    return "\n".join(lines) + "\n\n![Ξ² over training](consensus.png)\n"


def _estimate_section(suite: Suite, out: Path, seeds: int) -> list[str]:
    """Control from the estimate (2/p)Θ against control from the exact Ξ: extra rounds, how often the
    estimate ran more rounds than the exact rule would have from the same state, accuracy."""
    lines = ["## Control from the local estimate vs the exact Ξ", "",
             "\"more than exact\": the share of controlled steps where the estimate-driven controller ran more "
             "extra rounds than the exact rule would have from the same state (Ξ probed after each of its rounds, "
             "as measurement only). Mean ± std over seeds.", "",
             "| variant | extra rounds exact | extra rounds estimate | more than exact | rounds: estimate / exact rule "
             "(same states) | test acc exact | test acc estimate |", "|---|---|---|---|---|---|---|"]
    for exact, estimate in suite.estimate_pairs:
        runs = {name: [out / f"{_slug(name)}-seed{s}" for s in range(seeds)] for name in (exact, estimate)}
        summaries = {name: [read_summary(r) for r in rs] for name, rs in runs.items()}
        more, ratio = [], []
        for run in runs[estimate]:
            steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            steps = [r for r in steps if "extra_gossip_rounds_if_exact" in r]
            more.append(sum(r["extra_gossip_rounds"] > r["extra_gossip_rounds_if_exact"] for r in steps) / len(steps))
            ratio.append(sum(r["extra_gossip_rounds"] for r in steps)
                         / max(1, sum(r["extra_gossip_rounds_if_exact"] for r in steps)))
        lines.append("| " + " | ".join([
            exact, _mean_std([s["extra_gossip_rounds"] for s in summaries[exact]], "{:.0f}"),
            _mean_std([s["extra_gossip_rounds"] for s in summaries[estimate]], "{:.0f}"),
            _mean_std([100 * m for m in more], "{:.1f}") + " %", _mean_std(ratio, "{:.2f}"),
            _mean_std([s["test_accuracy"] for s in summaries[exact]], "{:.4f}"),
            _mean_std([s["test_accuracy"] for s in summaries[estimate]], "{:.4f}")]) + " |")
    return lines
