"""``asynchronous``: overlapped DiLoCo and asynchronous local SGD on uneven workers."""

from __future__ import annotations

import statistics
from pathlib import Path

from ..config import ConfigError
from ..plots import plot_runs
from ..report import ci_cell
from ..rundir import read_summary
from .base import Suite, against, on_networks, register, run_dirs, slug, target_cell, target_rows
from .low_communication import LOWCOMM_COMPUTE_MS


ASYNC_NETWORKS = ("ethernet-1g", "wan-100m")
ASYNC_SPEEDS = (0.58, 0.75, 1.51, 3.33)  # s a step of the authors' toy's four workers (google-deepmind/asyncdiloco)
ASYNC_TARGET_LOSS = 2.3  # nats of test loss: the asynchronous suite's time to target


@register("asynchronous")
def asynchronous(scale: str, quick: bool) -> Suite:
    """Asynchronous and overlapped outer steps (issue 42) on the character Transformer with inner
    AdamW, n = 4, a step of ``LOWCOMM_COMPUTE_MS`` at speed 1, on each of ``ASYNC_NETWORKS``:

    - the eager paper's Table 2 (Kale, Douillard, Donchev 2025), equal speeds, H = 30: DiLoCo
      with no overlap, streaming (F = 2, τ = 1), the one-step-delayed outer step, the same at half
      the outer lr, eager, and eager at half the outer lr — the loss at equal steps, the simulated
      time and compute utilisation;
    - Liu et al. 2024's toy speeds (``ASYNC_SPEEDS``, one worker each), H = 20: synchronous
      DiLoCo against asynchronous local SGD with the vanilla rule (Nesterov a push at outer lr
      0.07, weight √n/n: the authors' toy), with Delayed Nesterov (N = n, lr 0.7: DiLoCo's step
      per n pushes) and with DN and DyLU — the loss against simulated time and the time to a
      target loss. Measurement is free. CPU scale only."""
    if scale == "paper":
        raise ConfigError("asynchronous has only --scale cpu: its papers train 20M–1B-parameter language models, "
                          "for which configs/paper has no file")
    n, epochs = 4, 1 if quick else 4
    H_eager, H_liu = (2, 2) if quick else (30, 20)
    size = ["text_chars=3000", "context=16", "width=16", "layers=1", "batch_size=4"] if quick else \
        ["context=32", "width=32", "layers=2", "batch_size=16"]
    suite = Suite(f"asynchronous: eager and delayed DiLoCo, asynchronous local SGD; char Transformer, AdamW, n = {n}",
                  ["dataset=text", "model=transformer", *size, "heads=4", f"epochs={epochs}", "optimizer=adamw",
                   "lr=0.002", "weight_decay=0", f"warmup_epochs={0 if quick else 1}", "eval_every=1",
                   f"compute_ms={LOWCOMM_COMPUTE_MS}", "network.count_metrics=false",
                   f"target_loss={3.5 if quick else ASYNC_TARGET_LOSS}"])
    diloco = ["algorithm=diloco", f"local_steps={H_eager}"]
    eager = [("no overlap", diloco), ("streaming F=2 τ=1", [*diloco, "fragments=2", "fragment_delay=1"]),
             ("delayed", [*diloco, "outer_overlap=delayed"]),
             ("delayed, outer lr 0.35", [*diloco, "outer_overlap=delayed", "outer_lr=0.35"]),
             ("eager", [*diloco, "outer_overlap=eager"]),
             ("eager, outer lr 0.35", [*diloco, "outer_overlap=eager", "outer_lr=0.35"])]
    speeds, server = f"worker_speeds=[{','.join(map(str, ASYNC_SPEEDS))}]", ["algorithm=async-local-sgd", f"local_steps={H_liu}"]
    liu = [("sync DiLoCo", ["algorithm=diloco", f"local_steps={H_liu}", speeds]),
           ("async vanilla (Nesterov a push, lr 0.07, weight 1/√n)",
            [*server, speeds, "outer_optimizer=nesterov", "outer_lr=0.07", "async_weight=constant"]),
           ("async DN (N = n)", [*server, speeds]),
           ("async DN + DyLU", [*server, speeds, "dylu=true"])]
    parts = []
    for rows in (eager, liu):
        runs, names = on_networks(rows, ASYNC_NETWORKS, [], n, None)
        for per_network in runs:
            suite.variants += against(per_network[0], per_network[1:])
        parts.append(names)
    suite.report = lambda suite, configs, out, seeds: _async_report(parts, configs, out, seeds)
    return suite


def _async_report(parts: list[dict[str, list[str]]], configs: dict, out: Path, seeds: range) -> str:
    """Per part (the eager paper's Table 2; Liu et al.'s speeds), a table of, on each network, the test
    loss (the same training on both for the synchronous schedules; the events' order differs for the
    asynchronous ones), the simulated time, the time to the target loss and the compute utilisation
    (mean and least over workers); plots of the test loss against simulated time on each network
    (the first seed)."""
    first = next(iter(parts[0].values()))
    nets = [configs[name].network.preset for name in first]
    cfg = configs[first[0]]
    lines = [f"Simulated seconds: compute {cfg.compute_ms} ms a step at speed 1 (assumed) plus the α–β time of "
             f"every operator; measurement is free. Target: test loss ≤ {cfg.target_loss} at an evaluation (every "
             f"epoch). Mean ± 95 % interval over seeds.", ""]
    for title, rows, file in (("The eager paper's Table 2 at our scale (equal speeds)", parts[0], "eager"),
                              (f"Liu et al.'s worker speeds ({', '.join(map(str, ASYNC_SPEEDS))} × compute_ms)",
                               parts[1], "liu")):
        stale = file == "liu"  # the server's pushes: their staleness
        head = ["variant", *[f"{h} on {net}" for net in nets
                             for h in ("test loss", "s total", "s to target", "compute util. (mean, least)",
                                       *(["staleness (mean, max)"] if stale else []))]]
        lines += [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for label, names in rows.items():
            cells = [label]
            for name in names:
                summaries = [read_summary(r) for r in run_dirs(name, out, seeds)]
                cells += [ci_cell([s["test_loss"] for s in summaries], "{:.4f}"),
                          ci_cell([s["sim_seconds"] for s in summaries], "{:.4g}"),
                          target_cell(target_rows(run_dirs(name, out, seeds), configs[name]), "sim_seconds", "{:.4g}"),
                          f"{statistics.mean(s['compute_utilization'] for s in summaries):.1%}, "
                          f"{statistics.mean(s['compute_utilization_min'] for s in summaries):.1%}"]
                if stale:
                    cells.append(f"{statistics.mean(s['staleness_mean'] for s in summaries):.2f}, "
                                 f"{max(s['staleness_max'] for s in summaries)}" if "pushes" in summaries[0] else "—")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        for i, net in enumerate(nets):
            plot = f"{file}-{net}.png"
            plot_runs({label: out / f"{slug(names[i])}-seed{seeds[0]}" for label, names in rows.items()}, "time",
                      None, out / plot, title=f"{file} on {net}")
            lines.append(f"![test loss against simulated time on {net}]({plot})")
        lines.append("")
    return "\n".join(lines) + "\n"
