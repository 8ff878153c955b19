"""``low-communication``: the DiLoCo family and its kin against all-reduced AdamW, test loss
against bytes and simulated time."""

from __future__ import annotations

import statistics
from pathlib import Path

from ..config import ConfigError
from ..plots import plot_runs
from ..report import ci_cell, test_metrics
from ..rundir import read_summary
from .base import Suite, Variant, against, register, run_dirs, slug


LOWCOMM_NETWORKS = ("wan-100m", "ethernet-1g")  # between data centres, and a slow cluster
LOWCOMM_COMPUTE_MS = 10  # one worker's compute per step, assumed (the time columns scale with it)


@register("low-communication")
def low_communication(scale: str, quick: bool) -> Suite:
    """The DiLoCo family against AdamW with the gradient all-reduced every step, on the character
    Transformer, n = 8: DiLoCo (H inner AdamW steps, outer Nesterov lr 0.7, μ 0.9), DiLoCo with
    its pseudo-gradients top-k 3 % + 2-bit with error feedback (SparseLoCo's codec), streaming
    DiLoCo (F = 4 fragments, τ = 5), NoLoCo (the outer step on the one-peer exponential graph),
    SPARTA (p = 0.005 of the coordinates averaged every step), DeMo (its sign step, defaults
    s = 64, k = 32), SparseLoCo (Templar's codec, :mod:`gossamer.sparseloco`: the top 4 of each
    block, about 3 % here, 2-bit values, with its decayed error feedback and Templar's hparams:
    β = 0.95, outer lr 1, no outer momentum), MuLoCo (DiLoCo with Muon inner steps), local AdamW
    averaging its moments every H and DES-LOC (parameters every H, first moments every 2H, second
    every 5H). Each variant trains on each of LOWCOMM_NETWORKS — the same training (a fixed
    ``compute_ms``, measurement free), only the simulated time differs. CPU scale only: the
    papers' models (150 M–1 B parameters) are beyond this simulator's CPU budget."""
    if scale == "paper":
        raise ConfigError("low-communication has only --scale cpu: its papers train 150M–1B-parameter language "
                          "models, for which configs/paper has no file")
    n, H = 8, 2 if quick else 50
    epochs = 1 if quick else 5
    size = ["text_chars=3000", "context=16", "width=16", "layers=1", "batch_size=4"] if quick else \
        ["context=32", "width=32", "layers=2", "batch_size=16"]
    suite = Suite(f"low-communication: char Transformer, AdamW, n = {n}",
                  ["dataset=text", "model=transformer", *size, "heads=4", f"epochs={epochs}", "optimizer=adamw",
                   "lr=0.002", "weight_decay=0", f"warmup_epochs={0 if quick else 1}", "eval_every=1",
                   f"compute_ms={LOWCOMM_COMPUTE_MS}", "network.count_metrics=false"])
    diloco = ["algorithm=diloco", f"local_steps={H}"]
    F, tau = (2, 1) if quick else (4, 5)
    methods = [("AdamW all-reduce", ["algorithm=allreduce"]),
               (f"DiLoCo H={H}", diloco),
               (f"DiLoCo H={H} + ef-top-k:0.03+quant:2", [*diloco, "compression=ef-top-k:0.03+quant:2"]),
               (f"streaming DiLoCo H={H} F={F} τ={tau}", [*diloco, f"fragments={F}", f"fragment_delay={tau}"]),
               (f"NoLoCo H={H} one-peer-exp", [*diloco, "outer_topology=one-peer-exponential"]),
               ("SPARTA p=0.005", ["algorithm=sparta", "sparta_fraction=0.005"]),
               ("DeMo", ["algorithm=decoupled-momentum", "optimizer=sgd", "momentum=0", "nesterov=false"]),
               (f"SparseLoCo H={H} (Templar codec, top-4 a block, ef_decay 0.95, outer lr 1, no momentum)",
                [*diloco, "compression=ef-sparseloco:4", "ef_decay=0.95", "outer_lr=1", "outer_momentum=0"]),
               (f"MuLoCo H={H} (Muon inner)", [*diloco, "optimizer=muon"]),
               (f"local AdamW H={H}, moments averaged", ["algorithm=local", f"local_steps={H}",
                                                          "average_optimizer_state=true"]),
               (f"DES-LOC K=({H},{2 * H},{5 * H})", ["algorithm=des-loc", "optimizer=adamw", f"local_steps={H}",
                                                     f"desloc_m1_steps={2 * H}", f"desloc_m2_steps={5 * H}"])]
    rows = {label: [f"{label} on {net}" for net in LOWCOMM_NETWORKS] for label, _ in methods}
    for net in LOWCOMM_NETWORKS:  # on each network, all-reduced AdamW is the baseline
        runs = [Variant(f"{label} on {net}", [*overrides, f"network.preset={net}"], n) for label, overrides in methods]
        suite.variants += against(runs[0], runs[1:])
    suite.report = lambda suite, configs, out, seeds: _lowcomm_report(rows, configs, out, seeds)
    return suite


def _lowcomm_report(rows: dict[str, list[str]], configs: dict, out: Path, seeds: range) -> str:
    """A table of the test loss of x̄, bytes per worker (and the factor fewer than the first row's)
    and the simulated time on each network; plots of the test loss against bytes per worker and
    against simulated time on each network (the first seed)."""
    first = next(iter(rows.values()))
    nets = [configs[name].network.preset for name in first]
    summaries = {name: [read_summary(r) for r in run_dirs(name, out, seeds)]
                 for names in rows.values() for name in names}
    metrics = test_metrics([s for runs in summaries.values() for s in runs])
    base = statistics.mean(s["bytes_per_worker"] for s in summaries[first[0]])
    head = ["variant", *[f"{x_bar} (x̄)" for _, x_bar, _, _ in metrics], "MB/worker", "× fewer bytes",
            *[f"{h} on {net}" for net in nets for h in ("s total", "comm")]]
    lines = [f"Simulated seconds: compute {configs[first[0]].compute_ms} ms a step (assumed) plus the α–β time "
             f"of every operator of the algorithm; measurement is free. Training is the same on every network. "
             f"Mean ± 95 % interval over seeds.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, names in rows.items():
        runs = summaries[names[0]]
        sent = statistics.mean(s["bytes_per_worker"] for s in runs)
        cells = [label, *[ci_cell([s[key] for s in runs], fmt) for key, _, _, fmt in metrics],
                 ci_cell([s["bytes_per_worker"] / 1e6 for s in runs], "{:.3g}"),
                 f"{base / sent:.3g}" if sent else "∞"]
        for name in names:
            cells += [ci_cell([s["sim_seconds"] for s in summaries[name]], "{:.4g}"),
                      f"{statistics.mean(s['sim_seconds_comm'] / s['sim_seconds'] for s in summaries[name]):.0%}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    plots = {"bytes.png": ("bytes", 0), **{f"time-{net}.png": ("time", i) for i, net in enumerate(nets)}}
    for file, (x, i) in plots.items():
        plot_runs({label: out / f"{slug(names[i])}-seed{seeds[0]}" for label, names in rows.items()}, x, None, out / file,
                  title=file.removesuffix(".png"))
        lines.append(f"![test loss against {'bytes per worker' if x == 'bytes' else 'simulated time'}]({file})")
    return "\n".join(lines) + "\n"
