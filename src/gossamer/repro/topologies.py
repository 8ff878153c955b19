"""``topologies``: which measure of a topology, the spectral gap or the effective number of
neighbours, ranks D-SGD's accuracy over it."""

from __future__ import annotations

import statistics
from pathlib import Path

from ..plots import plot_consensus
from ..report import CONFIDENCE, ci_cell
from ..rundir import read_summary
from .base import KONG_CIFAR, Suite, Variant, against, cpu_base, register, run_dirs, slug
from .stats import bootstrap_spearman, phase_means, spearman


# (label, topology) of the topologies suite: static, time-varying, finite-time and random graphs
TOPOLOGY_VARIANTS = [("ring", "ring"), ("torus", "torus"), ("exponential", "exponential"),
                     ("one-peer-exp", "one-peer-exponential"), ("base:1", "base:1"), ("equidyn", "equidyn"),
                     ("epidemic:2", "epidemic:2"), ("random-matching", "random-matching")]


@register("topologies")
def topologies(scale: str, quick: bool) -> Suite:
    """Which measure of a topology predicts its accuracy: D-SGD on static (ring, torus, exponential),
    time-varying (one-peer exponential), finite-time (Base-2) and random per-round graphs
    (EquiTopo's one-peer EquiDyn, Epidemic Learning's 2-regular graphs, random matchings) and
    All-Reduce, at n = 32 and 64, all with one gossip round a step (equal gossip rounds); the
    report sets each topology's spectral gap and effective number of neighbours beside its
    accuracy and ranks them (:func:`_topologies_report`)."""
    sizes = (16,) if quick else (32, 64)  # quick: 16 is the smallest n with a torus and a power of two
    if scale == "paper":
        suite = Suite("topologies (paper scale): CIFAR-10 ResNet-20, D-SGD over each topology", [], base_file=KONG_CIFAR)
    else:
        suite = Suite("topologies: D-SGD over each topology, equal gossip rounds", cpu_base(quick, 4 if quick else 40))
    for n in sizes:
        suite.variants += against(Variant(f"allreduce n={n}", ["algorithm=allreduce"], n),
                                  [Variant(f"{label} n={n}", ["algorithm=gossip", f"topology={spec}"], n)
                                   for label, spec in TOPOLOGY_VARIANTS])
    suite.report = _topologies_report
    return suite


def topology_measures(cfg) -> dict:
    """``gossamer topology``'s measures of a run's graph (All-Reduce: the complete graph)."""
    from ..topology import analyse, build_topology

    spec = getattr(cfg, "topology", None) or "complete"
    seed = cfg.seed if getattr(cfg, "topology_seed", None) is None else cfg.topology_seed
    return analyse(build_topology(spec, cfg.workers, seed=seed))


def _topologies_report(suite: Suite, configs: dict, out: Path, seeds: range) -> str:
    """Per n: accuracy of x̄, mean Ξ² per learning-rate phase, MB sent per worker and the measures
    of each topology; Spearman's rank correlation of the accuracy with the spectral gap and with
    the effective number of neighbours over the variants, with bootstrap intervals over the seeds
    (:func:`bootstrap_spearman`), and which ranks the accuracy better: the one whose ρ_s exceeds
    the other's with a difference interval that excludes 0, else neither."""
    from ..topology import DECAY

    boundaries = configs[suite.variants[0].name].milestones
    phases = len(boundaries) + 1
    summaries = {v.name: [read_summary(r) for r in run_dirs(v.name, out, seeds)] for v in suite.variants}
    lines = [f"Every gossip variant is D-SGD with one gossip round a step, so all run the same rounds; All-Reduce "
             f"is measured as the complete graph. Measures (`gossamer topology`, seed {seeds[0]}'s graph): the spectral gap "
             f"ρ over the rounds in brackets (the period; for a random topology the empirical gap of its first "
             f"rounds), the effective number of neighbours n_W(γ) at γ = {DECAY} (Vogels "
             f"et al. 2022) and the expected contraction ‖E[(W_t − J)ᵀ(W_t − J)]‖₂. ρ_s: Spearman's rank "
             f"correlation with the accuracy of x̄ over the variants, [its {CONFIDENCE:.0%} bootstrap interval over "
             f"the seeds].", ""]
    readings = []
    for n in sorted({v.workers for v in suite.variants}):
        variants = [v for v in suite.variants if v.workers == n]
        head = ["variant", "test acc (x̄)", *[f"mean Ξ² phase {k + 1}" for k in range(phases)], "MB/worker",
                "spectral gap (rounds)", "n_W(γ)", "E-contraction"]
        lines += [f"## n = {n}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        accuracy, gaps, neighbours = [], [], []
        for v in variants:
            runs, info = summaries[v.name], topology_measures(configs[v.name])
            per_phase = [phase_means(r / "metrics.jsonl", boundaries) for r in run_dirs(v.name, out, seeds)]
            accuracy.append(statistics.mean(s["test_accuracy"] for s in runs))
            gaps.append(info["spectral_gap"])
            neighbours.append(info["effective_neighbours"])
            lines.append("| " + " | ".join([
                v.name, ci_cell([s["test_accuracy"] for s in runs], "{:.4f}"),
                *[ci_cell([p[k] for p in per_phase], "{:.2e}") for k in range(phases)],
                ci_cell([s["bytes_per_worker"] / 1e6 for s in runs], "{:.2f}"),
                f"{info['spectral_gap']:.4f} ({info['gap_rounds']})", f"{info['effective_neighbours']:.2f}",
                f"{info['expected_contraction']:.4f}"]) + " |")
        by_gap, by_neighbours = spearman(gaps, accuracy), spearman(neighbours, accuracy)
        shown = {k: "undefined" if r is None else f"{r:+.2f}" for k, r in (("gap", by_gap), ("nw", by_neighbours))}
        intervals = bootstrap_spearman([[s["test_accuracy"] for s in summaries[v.name]] for v in variants],
                                       {"gap": gaps, "nw": neighbours}) if len(seeds) > 1 else {}
        for key in ("gap", "nw"):
            if key in intervals:
                shown[key] += " [{:+.2f}, {:+.2f}]".format(*intervals[key])
        difference = intervals.get("gap − nw")
        if difference is not None:  # the bootstrap decides: does the interval of ρ_gap − ρ_nW exclude 0?
            verdict = ("neither ranks it better at this scale (the bootstrap interval of ρ_s(gap) − ρ_s(n_W), "
                       "[{:+.2f}, {:+.2f}], holds 0)".format(*difference) if difference[0] <= 0 <= difference[1] else
                       ("the spectral gap" if difference[0] > 0 else "the effective number of neighbours") +
                       " ranks it better (the bootstrap interval of ρ_s(gap) − ρ_s(n_W), [{:+.2f}, {:+.2f}], "
                       "excludes 0)".format(*difference))
        elif by_gap is None or by_neighbours is None or abs(by_gap - by_neighbours) < 0.05:
            verdict = "neither ranks it clearly better"
        else:
            verdict = ("the effective number of neighbours" if by_neighbours > by_gap else "the spectral gap") + \
                " ranks it better (one seed: no interval)"
        spread = max(accuracy) - min(accuracy)
        noise = statistics.mean(statistics.stdev([s["test_accuracy"] for s in summaries[v.name]])
                                for v in variants) if len(seeds) > 1 else None
        caution = "" if noise is None or spread > 2 * noise else \
            f" (but the variants' accuracies span {spread:.4f}, within twice their mean std over seeds {noise:.4f}: " \
            f"the ranking of the accuracy itself is noise)"
        lines += ["", f"ρ_s(accuracy, spectral gap) = {shown['gap']}, ρ_s(accuracy, n_W) = {shown['nw']}: "
                      f"{verdict}{caution}.", ""]
        readings.append(f"n = {n}: {verdict}")
        plot_consensus({v.name: out / f"{slug(v.name)}-seed{seeds[0]}" / "metrics.jsonl" for v in variants}, boundaries,
                       out / f"consensus-n{n}.png", f"{suite.title}, n = {n}")
        lines += [f"![Ξ² over training, n = {n}](consensus-n{n}.png)", ""]
    return "\n".join(lines + ["Reading: " + "; ".join(readings) + ".", ""])
