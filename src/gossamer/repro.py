"""``gossamer repro``: the papers' experiments at a scale two CPU cores can run.

A suite is a list of variants (config overrides) run for several seeds on MNIST-1D with the
1-D CNN; it writes every run, ``results.md`` (mean ± std over seeds), a plot of Ξ² over
training with the learning-rate phases marked and one of test accuracy against communication
(and against sharpness, where measured). Suites: ``ring-scaling`` and ``consensus-phases``
(Kong et al.), ``local-sgd`` (Lin et al.).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .config import load_config
from .report import plot_consensus, plot_tradeoff, read_summary


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
    for label, c in (("1", 1.0), ("1/2", 0.5), ("1/4", 0.25), ("1/8", 0.125), ("1/16", 0.0625)):
        suite.variants.append(Variant(
            f"ctrl-phase-1 c={label}",
            [*gossip, "phases=[controlled,allreduce,allreduce]", "consensus.target=run:{ref}",
             f"consensus.factor={c}", "consensus.max_extra_rounds=1000"], n))
    # control by frequency can only lengthen the gossip period beyond D-SGD's one step: a fraction
    # c < 1 of D-SGD's own distance would keep H = 1, so these follow c × η_t·sqrt(EMA φ²)/p,
    # the on-the-fly reading of "c × φ^ema", which lies above the ring's distance
    suite.variants += [
        Variant(f"dec-phase-1 H={FREQUENCY_MAX}", [*gossip, f"local_steps={FREQUENCY_MAX}",
                                                  "phases=[gossip,allreduce,allreduce]"], n),
        *[Variant(f"freq-phase-1 c={label}", [*gossip, "phases=[controlled,allreduce,allreduce]",
                                              "consensus.target=gradient", f"consensus.factor={c}",
                                              "consensus.action=frequency", f"consensus.max_local_steps={FREQUENCY_MAX}"],
                  n) for label, c in (("1/2", 0.5), ("1/4", 0.25))],
    ]
    return suite


FREQUENCY_MAX = 16  # the longest gossip period of the frequency-controlled variants


def local_sgd(quick: bool) -> Suite:
    """Lin et al.'s generalization study at equal global batch n·B: small-batch SGD (one worker,
    batch B), large-batch SGD (All-Reduce, n workers), local SGD and post-local SGD (switch at
    the first decay) with H = 4 and 16, hierarchical local SGD; test accuracy, sharpness of x̄
    (the top Hessian eigenvalue of the training loss) and communication rounds."""
    n = 4 if quick else 16
    suite = Suite(f"local-sgd: equal global batch n·B, n = {n}", [*_base(quick, 4 if quick else 40), "sharpness=true"])
    suite.variants = [
        Variant("small-batch (1 worker)", ["algorithm=allreduce"], 1),
        Variant(f"large-batch (All-Reduce, n={n})", ["algorithm=allreduce"], n),
        *[Variant(f"local H={h}", ["algorithm=local", f"local_steps={h}"], n) for h in (4, 16)],
        *[Variant(f"post-local H={h}", ["algorithm=post-local", f"local_steps={h}"], n) for h in (4, 16)],
        Variant("hierarchical H=4, H_b=4, blocks of 4" if not quick else "hierarchical H=4, H_b=4, blocks of 2",
                ["algorithm=hierarchical", "local_steps=4", "block_rounds=4", f"block_size={2 if quick else 4}"], n),
    ]
    return suite


SUITES: dict[str, Callable[[bool], Suite]] = {"ring-scaling": ring_scaling, "consensus-phases": consensus_phases,
                                              "local-sgd": local_sgd}


def _slug(name: str) -> str:
    return name.replace(" ", "_").replace("=", "").replace("/", "-").replace(",", "").replace("(", "").replace(")", "")


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
    plot_tradeoff({v.name: [read_summary(out / f"{_slug(v.name)}-seed{s}") for s in range(seeds)]
                   for v in suite.variants}, out / "tradeoff.png", suite.title)
    return results


def _mean_std(values: list[float], fmt: str) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{fmt.format(statistics.mean(values))} ± {fmt.format(std)}"


OPTIONAL_COLUMNS = [("sharpness", "sharpness (x̄)", "{:.3g}"), ("gossip_rounds_saved", "gossip rounds saved", "{:.0f}")]
"""Summary keys shown, as (key, heading, format), where a run of the suite has them ("—": a variant without)."""


def _results_table(suite: Suite, configs: dict, out: Path, seeds: int, name: str, quick: bool) -> str:
    boundaries = configs[suite.variants[0].name].milestones
    phases = len(boundaries) + 1
    summaries = {v.name: [read_summary(out / f"{_slug(v.name)}-seed{s}") for s in range(seeds)] for v in suite.variants}
    optional = [c for c in OPTIONAL_COLUMNS if any(c[0] in s for runs in summaries.values() for s in runs)]
    head = ["variant", "test acc (x̄)", *[f"mean Ξ² phase {k + 1}" for k in range(phases)],
            "comm rounds", "extra gossip rounds", *[heading for _, heading, _ in optional]]
    lines = [f"# {suite.title}", "",
             f"Command: `gossamer repro {name} --seeds {seeds}{' --quick' if quick else ''}"
             f"{''.join(' --set ' + o for o in suite.base[len(SUITES[name](quick).base):])}`; "
             f"mean ± std over {seeds} seed(s). Base config: `{' '.join(suite.base)}`.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in suite.variants:
        runs = summaries[v.name]
        per_phase = [phase_means(out / f"{_slug(v.name)}-seed{s}" / "metrics.jsonl", boundaries) for s in range(seeds)]
        cells = [v.name, _mean_std([s["test_accuracy"] for s in runs], "{:.4f}"),
                 *[_mean_std([p[k] for p in per_phase], "{:.2e}") for k in range(phases)],
                 _mean_std([s["comm_rounds"] for s in runs], "{:.0f}"),
                 _mean_std([s["extra_gossip_rounds"] for s in runs], "{:.0f}"),
                 *[_mean_std([s[key] for s in runs], fmt) if key in runs[0] else "—" for key, _, fmt in optional]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n![Ξ² over training](consensus.png)\n\n![test accuracy against communication](tradeoff.png)\n"
