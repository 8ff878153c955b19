"""``time-to-accuracy`` (both papers): simulated time to a target accuracy, and its report."""

from __future__ import annotations

import statistics
from pathlib import Path

from ..plots import plot_runs
from ..report import ci_cell
from ..rundir import read_summary
from .base import KONG_CIFAR, Suite, against, cpu_base, on_networks, register, run_dirs, slug, target_cell, target_rows


LIN_NETWORKS = ("infiniband-100g", "ethernet-1g")  # the fast and the slow network between nodes
KONG_NETWORKS = ("ethernet-1g", "wan-100m")  # machines on a LAN, and data centres apart


LIN_CIFAR = "lin2020-cifar10-resnet20-minibatch.yaml"
PAPER_TFLOPS = 25  # the assumed sustained rate of one worker's GPU at paper scale (compute_ms=flops:25)


@register("time-to-accuracy")
def time_to_accuracy(scale: str, quick: bool) -> Suite:
    """Both papers' time claims: test accuracy and simulated time to a target accuracy.

    Lin et al. (n = 16 as 4 nodes of 4 workers, NVLink inside, a fast and a slow network between
    them): small- and large-batch mini-batch SGD, local SGD H = 4 and 16, post-local SGD H = 16,
    hierarchical local SGD. Kong et al. (n = 32, one worker per machine, on 1 GbE and on a WAN):
    All-Reduce, ring, one-peer exponential, the ring in phase 1 only (dec-phase-1) and phase-1
    control at c = 1/2 and 1/4 from Ξ (exact), and at c = 1/2 from Θ (estimate), whose reference
    is dec-phase-1 on the first network (its phase 1 is the ring's): the cost of control — its
    rounds and the probes it decides from — is its time beyond dec-phase-1's on the same network.
    Measurement is free (count_metrics: false). CPU
    scale: MNIST-1D, a step computes for ``compute_ms`` = 1 ms (4 ms at the 4× batch). Paper scale:
    each paper's CIFAR-10 ResNet-20 file (Lin's for Lin's variants, Kong's for Kong's), a step
    computes for one worker's FLOPs at ``PAPER_TFLOPS`` (an assumption, stated in the results)."""
    paper = scale == "paper"
    n_lin, n_kong, per_node = (4, 4, 2) if quick else (16, 32, 4)
    if paper:
        base = ["eval_every=5", f"compute_ms=flops:{PAPER_TFLOPS}", "target_accuracy=0.9"]
        large_batch = ["batch_size=512", "lr=0.8"]  # 4 × B_loc at the same lr per sample
    else:
        epochs = 2 if quick else 20
        base = [*cpu_base(quick, epochs), "eval_every=1", "compute_ms=1", f"target_accuracy={0.1 if quick else 0.55}"]
        large_batch = ["batch_size=64", "lr=0.01", "compute_ms=4"]
    lin_file, kong_file = (LIN_CIFAR, KONG_CIFAR) if paper else (None, None)
    uncontrolled = f"dec-phase-1 n={n_kong} on {KONG_NETWORKS[0]}"
    suite = Suite(f"time-to-accuracy{' (paper scale)' if paper else ''}: Lin et al. (n = {n_lin}) and "
                  f"Kong et al. (n = {n_kong})", base, reference=uncontrolled)
    free = ["network.count_metrics=false"]
    lin = [(f"mini-batch B={128 if paper else 16}", ["algorithm=allreduce"]),
           (f"mini-batch B={512 if paper else 64}", ["algorithm=allreduce", *large_batch]),
           ("local H=4", ["algorithm=local", "local_steps=4"]),
           ("local H=16", ["algorithm=local", "local_steps=16"]),
           ("post-local H=16", ["algorithm=post-local", "local_steps=16"]),
           ("hierarchical H=2 H_b=8", ["algorithm=hierarchical", f"block_size={per_node}", "local_steps=2",
                                       "block_rounds=8"])]
    lin_runs, lin_rows = on_networks(lin, LIN_NETWORKS, [f"network.workers_per_node={per_node}", *free], n_lin,
                                     lin_file)
    for runs in lin_runs:  # per network: the small mini-batch the baseline; the large one (its own lr) one too
        for v in runs[2:]:
            v.baseline = runs[0].name
        suite.variants += runs
    gossip = ["algorithm=gossip", "topology=ring"]
    control = ["phases=[controlled,allreduce,allreduce]", "consensus.target=run:{ref}", "consensus.max_extra_rounds=1000"]
    kong = [(f"All-Reduce n={n_kong}", ["algorithm=allreduce"]),
            (f"ring n={n_kong}", gossip),
            (f"one-peer-exp n={n_kong}", ["algorithm=gossip", "topology=one-peer-exponential"]),
            (f"dec-phase-1 n={n_kong}", [*gossip, "phases=[gossip,allreduce,allreduce]"]),
            (f"ctrl-phase-1 c=1/2 n={n_kong}", [*gossip, *control, "consensus.factor=0.5"]),
            (f"ctrl-phase-1 c=1/4 n={n_kong}", [*gossip, *control, "consensus.factor=0.25"]),
            (f"ctrl-phase-1 c=1/2 estimate n={n_kong}", [*gossip, *control, "consensus.factor=0.5",
                                                         "consensus.measure=estimate"])]
    kong_runs, kong_rows = on_networks(kong, KONG_NETWORKS, free, n_kong, kong_file)
    for runs in kong_runs:  # per network: All-Reduce the baseline
        suite.variants += against(runs[0], runs[1:])
    suite.report = lambda suite, configs, out, seeds: _time_report(lin_rows, kong_rows, configs, out, seeds)
    return suite


def _time_report(lin: dict[str, list[str]], kong: dict[str, list[str]], configs: dict, out: Path, seeds: range) -> str:
    """Tables of accuracy and simulated time (to the target, in total, communication) and plots of
    test accuracy against simulated time (the first seed): Lin et al.'s variants on each network;
    Kong et al.'s on each network, with the cost and the benefit of control against dec-phase-1 (the
    ring in phase 1 only) on that network. ``lin``, ``kong``: each row's variant on each network."""
    first = next(iter(kong.values()))[0]
    target = configs[first].target_accuracy
    names = [*sum(lin.values(), []), *sum(kong.values(), [])]
    summaries = {name: [read_summary(r) for r in run_dirs(name, out, seeds)] for name in names}
    at_target = {name: target_rows(run_dirs(name, out, seeds), configs[name]) for name in names}
    nets = [configs[name].network.preset for name in next(iter(lin.values()))]
    head = ["variant", "test acc", "steps to target",
            *[f"{h} on {net}" for net in nets for h in ("s to target", "s total", "comm")]]
    lines = [f"Target: test accuracy ≥ {target}. Simulated seconds: compute {configs[first].compute_ms} ms a step "
             f"plus the α–β time of every operator (consensus control's probes included).", "", "## Lin et al.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, names in lin.items():
        cells = [label, ci_cell([s["test_accuracy"] for s in summaries[names[0]]], "{:.4f}"),
                 target_cell(at_target[names[0]], "step", "{:.0f}")]
        for name in names:
            runs = summaries[name]
            cells += [target_cell(at_target[name], "sim_seconds", "{:.3f}"),
                      ci_cell([s["sim_seconds"] for s in runs], "{:.3f}"),
                      f"{statistics.mean(s['sim_seconds_comm'] / s['sim_seconds'] for s in runs):.0%}"]
        lines.append("| " + " | ".join(cells) + " |")
    head = ["variant", "test acc", "extra gossip rounds", "control rounds (probes)", "s to target", "s total",
            "comm (s)", "control: cost (s) / benefit (points) vs dec-phase-1"]
    kong_nets = [configs[name].network.preset for name in next(iter(kong.values()))]
    uncontrolled = next(names for label, names in kong.items() if label.startswith("dec-phase-1"))
    for i, net in enumerate(kong_nets):
        plain = summaries[uncontrolled[i]]
        lines += ["", f"## Kong et al. (on {net})", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for label, names in kong.items():
            name, runs = names[i], summaries[names[i]]
            controlled = getattr(configs[name], "consensus", None) and configs[name].consensus.target != "none"
            cells = [label, ci_cell([s["test_accuracy"] for s in runs], "{:.4f}"),
                     ci_cell([s.get("extra_gossip_rounds", 0) for s in runs], "{:.0f}"),
                     ci_cell([s["comm_rounds_control"] for s in runs], "{:.0f}"),
                     target_cell(at_target[name], "sim_seconds", "{:.3f}"),
                     ci_cell([s["sim_seconds"] for s in runs], "{:.3f}"),
                     ci_cell([s["sim_seconds_comm"] for s in runs], "{:.3f}"),
                     f"{ci_cell([s['sim_seconds'] - r['sim_seconds'] for s, r in zip(runs, plain)], '{:.3f}')} / "
                     f"{ci_cell([100 * (s['test_accuracy'] - r['test_accuracy']) for s, r in zip(runs, plain)], '{:+.1f}')}"
                     if controlled else "—"]
            lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    plots = {f"lin-{net}.png": {label: out / f"{slug(names[i])}-seed{seeds[0]}" for label, names in lin.items()}
             for i, net in enumerate(nets)}
    plots.update({f"kong-{net}.png": {label: out / f"{slug(names[i])}-seed{seeds[0]}" for label, names in kong.items()}
                  for i, net in enumerate(kong_nets)})
    for file, runs in plots.items():
        plot_runs(runs, "time", None, out / file, title=file.removesuffix(".png"))
        lines.append(f"![test accuracy against simulated time]({file})")
    return "\n".join(lines) + "\n"
