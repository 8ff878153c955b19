"""``gossamer repro``: the papers' experiments, at the papers' scale or at a scale two CPU cores run.

A suite is a list of variants (config overrides) run for seeds S … S+K−1 (``--first-seed``,
``--seeds``); it writes every run, ``results.md`` (mean ± the 95 % Student t interval over seeds
of the test metrics, Ξ² per learning-rate phase, communication, and where measured the sharpness
of x̄ and the rounds frequency control saved), a plot of Ξ² over training with the phases marked and one of the test metric against communication
(and against sharpness, where measured); ``time-to-accuracy`` instead its tables of simulated time
to a target accuracy and plots of accuracy against it. Every results.md ends with each variant's
paired difference from its baseline (the same seed: the same initial model and batches) and its
interval. ``--tune KEY=[...]`` first tunes each baseline on a validation split of the training
set (:func:`tune`) and runs every variant at its baseline's choice. Suites: ``ring-scaling``,
``consensus-phases``, ``decentralized-adam`` (Kong et al.), ``local-sgd`` (Lin et al.),
``time-to-accuracy`` (both).

Scales: ``cpu`` (the default) runs each suite on a small workload from a base list of overrides
(MNIST-1D and the 1-D CNN; the character Transformer on the offline ``pydoc-topics`` text for
``decentralized-adam``), ``--quick`` a smoke-test version of it; ``paper`` runs the same
variants on top of the papers' configurations in ``configs/paper/`` (CIFAR-10 ResNet-20, meant
for GPUs). The estimated work is printed before anything trains.

Suites: ``ring-scaling`` and ``consensus-phases`` (Kong et al.; the latter also compares consensus
control from the local estimate with control from the exact Ξ), ``decentralized-adam``,
``heterogeneous`` (non-i.i.d. data: D-SGD, quasi-global momentum, gradient tracking, CHOCO-SGD
and All-Reduce), ``stragglers`` (slow and jittery workers: synchronous schedules and AD-PSGD on
per-worker clocks), ``topologies`` (static, time-varying, finite-time and random per-round graphs:
which of the spectral gap and the effective number of neighbours ranks their accuracy),
``low-communication`` (the DiLoCo family — compressed, streaming, NoLoCo, SparseLoCo, MuLoCo —
SPARTA, DeMo, local AdamW and DES-LOC against all-reduced AdamW: test loss against bytes and
simulated time; CPU scale only),
``faults`` (workers lost mid-run and churned, both rejoin modes; CPU scale only),
``asynchronous`` (overlapped DiLoCo and asynchronous local SGD on uneven workers: loss, simulated
time and compute utilisation; CPU scale only).
"""

from __future__ import annotations

import contextlib
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .config import Config, ConfigError, load_config, parse_yaml
from .registry import short
from .rng import declare, host_stream
from .report import (CONFIDENCE, axis_table, ci_cell, mean_ci, plot_consensus, plot_runs, plot_tradeoff, read_rows,
                     read_summary, test_metrics)
from .train import Diverged, reached_target

SCALES = ("cpu", "paper")
PAPER_CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "paper"


@dataclass
class Variant:
    """One line of a suite: a name and its config overrides (``{ref}`` = the seed's reference run);
    ``baseline``: the variant it is compared with, seed by seed, and whose tuned value it runs at
    (None: it is a baseline itself)."""

    name: str
    overrides: list[str]
    workers: int
    base_file: str | None = None  # paper scale: this variant's configs/paper file, if not the suite's
    baseline: str | None = None


def _against(baseline: Variant, variants: list[Variant]) -> list[Variant]:
    """``baseline``, then ``variants``, each compared with it."""
    for v in variants:
        v.baseline = baseline.name
    return [baseline, *variants]


@dataclass
class Suite:
    title: str
    base: list[str]  # overrides shared by every variant (applied to base_file, if any)
    variants: list[Variant] = field(default_factory=list)
    reference: str | None = None  # name of the variant whose run controlled variants follow
    estimate_pairs: list[tuple[str, str]] = field(default_factory=list)  # (exact, estimate) controlled variants
    base_file: str | None = None  # paper scale: the configs/paper file every variant starts from
    report: Callable | None = None  # (suite, configs, out, seeds) → results.md body, plots written; default: Ξ²
    reports_diverged: bool = False  # whether report takes seeds where runs diverged (else it gets the others)

    def config(self, v: Variant, seed: int = 0, ref: str = "REF", extra: list[str] = ()) -> Config:
        """The config of variant ``v`` for one seed (``ref``: the reference run's directory), with
        ``extra`` overrides last."""
        path, name = None, v.base_file or self.base_file
        if name is not None:
            path = PAPER_CONFIGS / name
            if not path.is_file():
                raise ConfigError(f"--scale paper reads {path}, which is missing: run from a source checkout of gossamer")
        return load_config(path, [*self.base, f"workers={v.workers}", f"seed={seed}",
                                  *[o.replace("{ref}", ref) for o in v.overrides], *extra])


def _base(quick: bool, epochs: int) -> list[str]:
    # lr 0.0025 per worker scaled linearly with n (the papers scale 0.1 per 64 samples), warm-up,
    # decay ×0.1 at 50 % and 75 % of training, Nesterov momentum 0.9, weight decay 1e-4
    size = ["num_samples=1000", "batch_size=16"] if quick else ["num_samples=10000", "batch_size=16"]
    return [*size, f"epochs={epochs}", f"milestones=[{epochs / 2},{epochs * 3 / 4}]", "lr=0.0025",
            "lr_scaling=linear", f"warmup_epochs={0 if quick else 2}", "momentum=0.9", "nesterov=true",
            "weight_decay=1e-4", "eval_every=5", "model=cnn1d"]


KONG_CIFAR = "kong2021-cifar10-resnet20-allreduce.yaml"


def ring_scaling(scale: str, quick: bool) -> Suite:
    """All-Reduce vs ring vs one-peer exponential graph as n grows (Kong et al.: the gap grows with n)."""
    sizes = (4, 8) if quick else (16, 32, 64)  # quick: 1000 samples leave 100 per worker at n = 8
    if scale == "paper":
        suite = Suite("ring-scaling (paper scale): CIFAR-10 ResNet-20, test accuracy and Ξ² as n grows", [],
                      base_file=KONG_CIFAR)
    else:
        suite = Suite("ring-scaling: test accuracy and Ξ² as n grows", _base(quick, 4 if quick else 40))
    for n in sizes:
        suite.variants += _against(Variant(f"allreduce n={n}", ["algorithm=allreduce"], n), [
            Variant(f"ring n={n}", ["algorithm=gossip", "topology=ring"], n),
            Variant(f"one-peer-exp n={n}", ["algorithm=gossip", "topology=one-peer-exponential"], n),
        ])
    return suite


def consensus_phases(scale: str, quick: bool) -> Suite:
    """Kong et al.'s phase study: which phase needs a small Ξ (ring, phases = lr phases)."""
    n = 8 if quick else 32
    if scale == "paper":
        suite = Suite(f"consensus-phases (paper scale): CIFAR-10 ResNet-20, ring, n = {n}", [], reference="ring",
                      base_file=KONG_CIFAR)
    else:
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
    for label in ("1", "1/2", "1/4"):  # the same control, deciding from Θ and Ξ ≤ (2/p)Θ alone
        exact = next(v for v in suite.variants if v.name == f"ctrl-phase-1 c={label}")
        suite.variants.append(Variant(f"{exact.name} estimate", [*exact.overrides, "consensus.measure=estimate"], n))
        suite.estimate_pairs.append((exact.name, f"{exact.name} estimate"))
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
    suite.variants = _against(suite.variants[0], suite.variants[1:])
    return suite


FREQUENCY_MAX = 16  # the longest gossip period of the frequency-controlled variants


def decentralized_adam(scale: str, quick: bool) -> Suite:
    """Kong et al.: decentralized Adam with local moments vs All-Reduce Adam, and gossip with the
    moments averaged (mixed with the parameters), on the character Transformer."""
    n = 4 if quick else 16
    if scale == "paper":
        suite = Suite(f"decentralized-adam (paper scale, stand-in workload): char Transformer, ring, n = {n}", [],
                      base_file="kong2021-decentralized-adam.yaml")
    else:
        epochs = 2 if quick else 16
        # the offline pydoc-topics text (≈ 419 K training characters), windows of 64 characters;
        # Adam with a warm-up and ×0.1 at 50 % and 75 % of training, as the SGD suites
        size = ["text_chars=12000", "context=32", "width=32"] if quick else ["context=64", "width=64"]
        suite = Suite(f"decentralized-adam: char Transformer, Adam, ring, n = {n}",
                      ["dataset=text", "model=transformer", *size, "layers=2", "heads=4", "batch_size=16",
                       f"epochs={epochs}", f"milestones=[{epochs / 2},{epochs * 3 / 4}]", "optimizer=adam",
                       "lr=0.001", f"warmup_epochs={0 if quick else 1}", f"eval_every={1 if quick else 4}"])
    gossip = ["algorithm=gossip", "topology=ring"]
    suite.variants = _against(Variant("allreduce adam", ["algorithm=allreduce"], n), [
        Variant("ring adam, local moments", gossip, n),
        Variant("ring adam, moments averaged", [*gossip, "average_optimizer_state=true"], n),
    ])
    return suite


CHOCO_GAMMA = 0.05  # CHOCO's consensus step for top-1 % in the heterogeneous suite (a sweep: docs/results.md)


def heterogeneous(scale: str, quick: bool) -> Suite:
    """Non-i.i.d. data on a ring: Dirichlet α = 0.1 and 1 and i.i.d. shards; D-SGD, D-SGD with
    quasi-global momentum, gradient tracking, CHOCO-SGD with top-1 % compression, All-Reduce."""
    n = 4 if quick else 16
    if scale == "paper":
        suite = Suite(f"heterogeneous (paper scale): CIFAR-10 ResNet-20, ring, n = {n}, Dirichlet α", [],
                      base_file=KONG_CIFAR)
    else:
        suite = Suite(f"heterogeneous: ring, n = {n}, Dirichlet α", _base(quick, 2 if quick else 20))
    ring = ["topology=ring"]
    algorithms = [("All-Reduce", ["algorithm=allreduce"]),
                  ("D-SGD", ["algorithm=gossip", *ring]),
                  ("D-SGD + QG momentum", ["algorithm=gossip", *ring, "momentum_mode=quasi-global"]),
                  ("gradient tracking", ["algorithm=gradient-tracking", *ring]),
                  ("CHOCO top-1%", ["algorithm=choco", *ring, "compression=top-k:0.01", f"choco_gamma={CHOCO_GAMMA}"])]
    for label, partition in (("α=0.1", ["partition=dirichlet", "dirichlet_alpha=0.1"]),
                             ("α=1", ["partition=dirichlet", "dirichlet_alpha=1"]),
                             ("iid", ["partition=iid"])):
        runs = [Variant(f"{name} {label}", [*overrides, *partition], n) for name, overrides in algorithms]
        suite.variants += _against(runs[0], runs[1:])
    return suite


def local_sgd(scale: str, quick: bool) -> Suite:
    """Lin et al.'s generalization study at equal global batch n·B: small-batch SGD (one worker,
    batch B), large-batch SGD (All-Reduce, n workers), local SGD and post-local SGD (switch at
    the first decay) with H = 4 and 16, hierarchical local SGD; test accuracy, sharpness of x̄
    (the top Hessian eigenvalue of the training loss) and communication rounds."""
    n = 4 if quick else 16
    if scale == "paper":
        suite = Suite(f"local-sgd (paper scale): CIFAR-10 ResNet-20, equal global batch n·B, n = {n}",
                      ["sharpness=true"], base_file="lin2020-cifar10-resnet20-minibatch.yaml")
    else:
        sharpness = ["sharpness=true", *(["sharpness_samples=100", "sharpness_iterations=5"] if quick else [])]
        suite = Suite(f"local-sgd: equal global batch n·B, n = {n}", [*_base(quick, 4 if quick else 40), *sharpness])
    block = 2 if quick else 4
    # the small batch at n = 1 is a baseline of its own (tuned at its n); the rest are compared with the large batch
    suite.variants = [Variant("small-batch (1 worker)", ["algorithm=allreduce"], 1), *_against(
        Variant(f"large-batch (All-Reduce, n={n})", ["algorithm=allreduce"], n), [
            *[Variant(f"local H={h}", ["algorithm=local", f"local_steps={h}"], n) for h in (4, 16)],
            *[Variant(f"post-local H={h}", ["algorithm=post-local", f"local_steps={h}"], n) for h in (4, 16)],
            Variant(f"hierarchical H=4, H_b=4, blocks of {block}",
                    ["algorithm=hierarchical", "local_steps=4", "block_rounds=4", f"block_size={block}"], n)])]
    return suite


LIN_NETWORKS = ("infiniband-100g", "ethernet-1g")  # the fast and the slow network between nodes
KONG_NETWORKS = ("ethernet-1g", "wan-100m")  # machines on a LAN, and data centres apart


LIN_CIFAR = "lin2020-cifar10-resnet20-minibatch.yaml"
PAPER_TFLOPS = 25  # the assumed sustained rate of one worker's GPU at paper scale (compute_ms=flops:25)


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
        base = [*_base(quick, epochs), "eval_every=1", "compute_ms=1", f"target_accuracy={0.1 if quick else 0.55}"]
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
    lin_runs, lin_rows = _on_networks(lin, LIN_NETWORKS, [f"network.workers_per_node={per_node}", *free], n_lin,
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
    kong_runs, kong_rows = _on_networks(kong, KONG_NETWORKS, free, n_kong, kong_file)
    for runs in kong_runs:  # per network: All-Reduce the baseline
        suite.variants += _against(runs[0], runs[1:])
    suite.report = lambda suite, configs, out, seeds: _time_report(lin_rows, kong_rows, configs, out, seeds)
    return suite


def _on_networks(rows: list[tuple[str, list[str]]], networks: tuple[str, ...], extra: list[str], workers: int,
                 base_file: str | None) -> tuple[list[list[Variant]], dict[str, list[str]]]:
    """Each row (label, overrides) trained on each network, as "LABEL on NETWORK" (``extra`` after
    the network): the variants of each network, and each label's variant names by network."""
    by_network, names = [], {}
    for net in networks:
        runs = [Variant(f"{label} on {net}", [*overrides, f"network.preset={net}", *extra], workers, base_file)
                for label, overrides in rows]
        for (label, _), v in zip(rows, runs):
            names.setdefault(label, []).append(v.name)
        by_network.append(runs)
    return by_network, names


STRAGGLER_NETWORK = "ethernet-10g"
SPEEDS = {"equal speeds": [], "10% at 4x": ["slow_workers=0.1@4"], "jitter lognormal 0.5": ["compute_jitter=lognormal:0.5"]}


def stragglers(scale: str, quick: bool) -> Suite:
    """Slow and uneven workers (issue 21): All-Reduce, local SGD (H = 4), D-SGD on a ring and on
    the one-peer exponential graph, and AD-PSGD (Lian et al. 2018) on a ring, at n = 16 on
    ``STRAGGLER_NETWORK`` with a step of ``compute_ms`` = 1 ms, each with equal speeds, 10 % of
    the workers 4× slower, and log-normal jitter σ = 0.5. Measurement is free. CPU scale only."""
    if scale == "paper":
        raise ConfigError("repro stragglers runs at --scale cpu only (it has no paper configuration)")
    n, epochs = (4, 1) if quick else (16, 20)
    base = [*_base(quick, epochs), "eval_every=1", f"network={STRAGGLER_NETWORK}", "compute_ms=1",
            "network.count_metrics=false", f"target_accuracy={0.1 if quick else 0.55}"]
    algorithms = {"All-Reduce": ["algorithm=allreduce"], "local H=4": ["algorithm=local", "local_steps=4"],
                  "D-SGD ring": ["algorithm=gossip", "topology=ring"],
                  "D-SGD one-peer-exp": ["algorithm=gossip", "topology=one-peer-exponential"],
                  "AD-PSGD ring": ["algorithm=ad-psgd", "topology=ring"]}
    suite = Suite(f"stragglers: slow and uneven workers (n = {n}, {STRAGGLER_NETWORK})", base)
    for speed, slow in SPEEDS.items():
        runs = [Variant(f"{name}, {speed}", [*overrides, *slow], n) for name, overrides in algorithms.items()]
        suite.variants += _against(runs[0], runs[1:])
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
            runs = [read_summary(r) for r in _runs(name, out, seeds)]
            lines.append("| " + " | ".join([
                name, ci_cell([s["test_accuracy"] for s in runs], "{:.4f}"),
                _to_target(_at_target(_runs(name, out, seeds), configs[name]), "sim_seconds", "{:.3f}"),
                ci_cell([s["sim_seconds"] for s in runs], "{:.3f}"),
                ci_cell([100 * s["sim_seconds_idle_fraction"] for s in runs], "{:.0f} %"),
                ci_cell([s["final_consensus_distance_sq"] for s in runs], "{:.2e}")]) + " |")
        seed0 = {name: out / f"{_slug(name)}-seed{seeds[0]}" for name in names}
        file = f"{_slug(speed)}.png"
        plot_runs(seed0, "time", None, out / file, title=speed)
        lines += ["", f"Seed {seeds[0]} at equal simulated time:", "", axis_table(seed0, "time"), "",
                  f"![test accuracy against simulated time]({file})", ""]
    return "\n".join(lines) + "\n"


# (label, topology) of the topologies suite: static, time-varying, finite-time and random graphs
TOPOLOGY_VARIANTS = [("ring", "ring"), ("torus", "torus"), ("exponential", "exponential"),
                     ("one-peer-exp", "one-peer-exponential"), ("base:1", "base:1"), ("equidyn", "equidyn"),
                     ("epidemic:2", "epidemic:2"), ("random-matching", "random-matching")]


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
        suite = Suite("topologies: D-SGD over each topology, equal gossip rounds", _base(quick, 4 if quick else 40))
    for n in sizes:
        suite.variants += _against(Variant(f"allreduce n={n}", ["algorithm=allreduce"], n),
                                   [Variant(f"{label} n={n}", ["algorithm=gossip", f"topology={spec}"], n)
                                    for label, spec in TOPOLOGY_VARIANTS])
    suite.report = _topologies_report
    return suite



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
    suite = Suite(f"faults: n = {n}, workers lost and churned", _base(quick, epochs))
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
        suite.variants += _against(runs[0], runs[1:])
    suite.report = lambda suite, configs, out, seeds: _faults_report(suite, configs, out, seeds, window, steps)
    return suite


def _faults_report(suite: Suite, configs: dict, out: Path, seeds: range, window: tuple[int, int],
                   steps: int) -> str:
    """Accuracy of x̄ over the living, mean Ξ² before, during and after the fault window, the
    fewest workers alive, rounds; Ξ² over training with the window marked (lost workers, and churn)."""
    spe = steps / configs[suite.variants[0].name].epochs
    bounds = [window[0] / spe, window[1] / spe]
    summaries = {v.name: [read_summary(r) for r in _runs(v.name, out, seeds)] for v in suite.variants}
    metrics = test_metrics([s for runs in summaries.values() for s in runs])
    head = ["variant", *[f"{x_bar} (x̄, living)" for _, x_bar, _, _ in metrics],
            *[f"mean Ξ² {part}" for part in ("before", "during", "after")], "workers alive (fewest)", "comm rounds"]
    lines = [f"Fault window: steps {window[0]}–{window[1]} of {steps} (epochs {bounds[0]:g}–{bounds[1]:g}); "
             "Ξ² and accuracy are over the living workers. Mean ± 95 % interval over seeds.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in suite.variants:
        parts = [phase_means(out / f"{_slug(v.name)}-seed{s}" / "metrics.jsonl", bounds) for s in seeds]
        runs = summaries[v.name]
        lines.append("| " + " | ".join([
            v.name, *[ci_cell([s[key] for s in runs], fmt) for key, _, _, fmt in metrics],
            *[ci_cell([p[k] for p in parts], "{:.2e}") for k in range(3)],
            ci_cell([s.get("workers_alive_min", v.workers) for s in runs], "{:.0f}"),
            ci_cell([s["comm_rounds"] for s in runs], "{:.0f}")]) + " |")
    for kind, words in (("lost", "lost mid-run"), ("churn", "churn")):
        chosen = [v for v in suite.variants if words in v.name or v.name.endswith("no faults")]
        plot_consensus({v.name: out / f"{_slug(v.name)}-seed{seeds[0]}" / "metrics.jsonl" for v in chosen}, bounds,
                       out / f"consensus-{kind}.png", f"{suite.title}: {words} (dashed: the fault window)")
        lines += ["", f"![Ξ² over training, {words}](consensus-{kind}.png)"]
    return "\n".join(lines) + "\n"


LOWCOMM_NETWORKS = ("wan-100m", "ethernet-1g")  # between data centres, and a slow cluster
LOWCOMM_COMPUTE_MS = 10  # one worker's compute per step, assumed (the time columns scale with it)


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
        suite.variants += _against(runs[0], runs[1:])
    suite.report = lambda suite, configs, out, seeds: _lowcomm_report(rows, configs, out, seeds)
    return suite


def _lowcomm_report(rows: dict[str, list[str]], configs: dict, out: Path, seeds: range) -> str:
    """A table of the test loss of x̄, bytes per worker (and the factor fewer than the first row's)
    and the simulated time on each network; plots of the test loss against bytes per worker and
    against simulated time on each network (the first seed)."""
    first = next(iter(rows.values()))
    nets = [configs[name].network.preset for name in first]
    summaries = {name: [read_summary(r) for r in _runs(name, out, seeds)] for names in rows.values() for name in names}
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
        plot_runs({label: out / f"{_slug(names[i])}-seed{seeds[0]}" for label, names in rows.items()}, x, None, out / file,
                  title=file.removesuffix(".png"))
        lines.append(f"![test loss against {'bytes per worker' if x == 'bytes' else 'simulated time'}]({file})")
    return "\n".join(lines) + "\n"


ASYNC_NETWORKS = ("ethernet-1g", "wan-100m")
ASYNC_SPEEDS = (0.58, 0.75, 1.51, 3.33)  # s a step of the authors' toy's four workers (google-deepmind/asyncdiloco)
ASYNC_TARGET_LOSS = 2.3  # nats of test loss: the asynchronous suite's time to target


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
        runs, names = _on_networks(rows, ASYNC_NETWORKS, [], n, None)
        for per_network in runs:
            suite.variants += _against(per_network[0], per_network[1:])
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
                summaries = [read_summary(r) for r in _runs(name, out, seeds)]
                cells += [ci_cell([s["test_loss"] for s in summaries], "{:.4f}"),
                          ci_cell([s["sim_seconds"] for s in summaries], "{:.4g}"),
                          _to_target(_at_target(_runs(name, out, seeds), configs[name]), "sim_seconds", "{:.4g}"),
                          f"{statistics.mean(s['compute_utilization'] for s in summaries):.1%}, "
                          f"{statistics.mean(s['compute_utilization_min'] for s in summaries):.1%}"]
                if stale:
                    cells.append(f"{statistics.mean(s['staleness_mean'] for s in summaries):.2f}, "
                                 f"{max(s['staleness_max'] for s in summaries)}" if "pushes" in summaries[0] else "—")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        for i, net in enumerate(nets):
            plot = f"{file}-{net}.png"
            plot_runs({label: out / f"{_slug(names[i])}-seed{seeds[0]}" for label, names in rows.items()}, "time",
                      None, out / plot, title=f"{file} on {net}")
            lines.append(f"![test loss against simulated time on {net}]({plot})")
        lines.append("")
    return "\n".join(lines) + "\n"


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
    suite = Suite(f"byzantine: workers that lie (n = {n})", [*_base(quick, epochs), "eval_every=1"])
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
            suite.variants += _against(clean, attacked)
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
    summaries = {name: _summaries(name, out, seeds) for names in table.values() for name in names}
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
        runs = {f"{row}, {col}": out / f"{_slug(f'{row}, {col}')}-seed{seeds[0]}"
                for row in table if row.startswith(f"{graph},") for col in (columns[0], strongest)}
        diverged = {name for name, path in runs.items() if (path / DIVERGED).is_file()}
        plot_runs({name: path for name, path in runs.items() if name not in diverged}, "epochs", None,
                  out / f"{_slug(graph)}-accuracy.png", title=f"{graph}: {strongest}")
        plot_consensus({f"{name}{' (diverged)' * (name in diverged)}": path / "metrics.jsonl"
                        for name, path in runs.items()}, [],
                       out / f"{_slug(graph)}-consensus.png", title=f"{graph}: honest Ξ², {strongest}")
        lines += [f"![{graph}: accuracy]({_slug(graph)}-accuracy.png) "
                  f"![{graph}: honest Ξ²]({_slug(graph)}-consensus.png)", ""]
    return "\n".join(lines) + "\n"


SUITES: dict[str, Callable[[str, bool], Suite]] = {"ring-scaling": ring_scaling, "consensus-phases": consensus_phases,
                                                   "decentralized-adam": decentralized_adam, "local-sgd": local_sgd,
                                                   "time-to-accuracy": time_to_accuracy,
                                                   "heterogeneous": heterogeneous, "stragglers": stragglers,
                                                   "topologies": topologies, "low-communication": low_communication,
                                                   "faults": faults, "byzantine": byzantine,
                                                   "asynchronous": asynchronous}


def build_suite(name: str, scale: str = "cpu", quick: bool = False) -> Suite:
    if scale not in SCALES:
        raise ConfigError(f"unknown scale '{scale}'; choose one of: {', '.join(SCALES)}")
    if quick and scale != "cpu":
        raise ConfigError("--quick is the smoke-test version of --scale cpu; it does not apply to --scale paper")
    return SUITES[name](scale, quick)


TUNE_VALIDATION = 0.1  # the validation split of the tuning runs where the base config holds out none


def parse_grid(text: str, option: str = "--tune") -> tuple[str, list]:
    """``KEY=[V1,V2,...]`` (``--tune``, ``--sweep``): the key and its grid of at least two distinct scalar values."""
    key, sep, raw = text.partition("=")
    try:
        grid = parse_yaml(raw, option) if sep else None
    except ConfigError:
        grid = None
    if (not key.strip() or not isinstance(grid, list) or len({str(g) for g in grid}) != len(grid) or len(grid) < 2
            or not all(isinstance(g, (int, float, str)) for g in grid)):
        raise ConfigError(f"{option} expects KEY=[V1,V2,...] with at least two distinct values, got '{short(text)}'")
    return key.strip(), grid


@dataclass
class Tuned:
    """A baseline's tuning: the value chosen, the validation metric read and its value per grid
    value and seed (None: that run diverged)."""

    value: object
    metric: str
    scores: list[list[float | None]]


def tuning_overrides(suite: Suite, v: Variant, key: str, value) -> list[str]:
    """The overrides of a tuning run of baseline ``v`` at ``key`` = ``value``: its validation split
    (the base config's validation_fraction, or TUNE_VALIDATION where it is unset; 0 is refused), no local models
    evaluated (tuning reads only x̄'s val_* metrics)."""
    fraction = suite.config(v).validation_fraction
    if fraction == 0:
        raise ConfigError(f"validation_fraction 0 holds nothing out, and tuning reads only the validation split: "
                          f"give a fraction in (0, 1), or leave it unset ({TUNE_VALIDATION})")
    return [f"{key}={value}", f"validation_fraction={fraction or TUNE_VALIDATION}", "eval_local=none"]


def tune(suite: Suite, key: str, grid: list, seeds: range, out: Path, train_run: Callable, log=print,
         jobs: int = 1) -> dict[str, Tuned]:
    """Train every baseline of ``suite`` at each ``key`` of ``grid`` for each seed into ``out`` and
    choose, per baseline, the value of the best mean over the seeds of x̄'s validation metric
    (val_accuracy, highest; val_loss for a language model, lowest); a value with a diverged seed
    is never chosen. Only val_* metrics are read: test metrics choose nothing. ``jobs``: as
    :func:`train_all`."""
    baselines = [v for v in suite.variants if v.baseline is None]
    runs = {(v.name, i, seed): out / f"{_slug(v.name)}-{_slug(key)}{value}-seed{seed}"
            for v in baselines for i, value in enumerate(grid) for seed in seeds}
    train_all([Job(f"[tune] seed {seed}: {v.name}, {key}={value}",
                   suite.config(v, seed, extra=tuning_overrides(suite, v, key, value)), runs[v.name, i, seed])
               for v in baselines for i, value in enumerate(grid) for seed in seeds], train_run, log, jobs)
    tuned = {}
    for v in baselines:
        scores, metric = [], None
        for i in range(len(grid)):
            scores.append([])
            for seed in seeds:
                if (runs[v.name, i, seed] / DIVERGED).is_file():
                    scores[-1].append(None)
                    continue
                summary = read_summary(runs[v.name, i, seed])
                metric = "val_accuracy" if "val_accuracy" in summary else "val_loss"
                scores[-1].append(summary[metric])
        sign = 1 if metric == "val_accuracy" else -1
        finite = [i for i, row in enumerate(scores) if None not in row]
        if not finite:
            raise ConfigError(f"--tune {key}: {v.name} diverged at every value of {grid}; try smaller values")
        best = max(finite, key=lambda i: (sign * sum(scores[i]) / len(seeds), -i))
        tuned[v.name] = Tuned(grid[best], metric, scores)
        if edge := grid_edge(grid, grid[best]):
            log(f"[tune] {v.name}: {key}={grid[best]} is the grid's {edge} value; the best may lie beyond it: "
                f"widen the grid and re-run")
    return tuned


@dataclass
class Job:
    """One training run of a suite: what the log calls it, its config and its directory."""

    label: str
    cfg: Config
    out: Path


def train_all(jobs: list[Job], train_run: Callable, log=print, processes: int = 1, threads: int | None = None
              ) -> None:
    """Train every job with ``train_run(cfg, out)``: one after another, or in ``processes`` worker
    processes (spawned, each with ``threads`` torch threads: by default the cores shared out,
    ⌊cores / processes⌋, at least 1; ``train_run`` must then be a module-level function, and the
    plugins the configs record are loaded there first). The runs are independent, so the order does not change
    them; a run's float32 numbers can depend on its thread count (reduction order). A run that
    diverges stops alone: its directory gets a DIVERGED file with the message (an earlier run it
    replaces, with ``--overwrite``, stays as it was beside it); a run that finishes removes a DIVERGED
    an earlier attempt left. So a directory holds DIVERGED exactly when its latest training diverged."""
    def finished(job: Job, error: str | None) -> None:
        if error is None:
            (job.out / DIVERGED).unlink(missing_ok=True)
            return
        job.out.mkdir(parents=True, exist_ok=True)
        (job.out / DIVERGED).write_text(f"{error}\n")
        log(f"{job.label}: {error}")

    if processes == 1:
        for job in jobs:
            log(job.label)
            finished(job, _train_job(train_run, job.cfg, job.out))
        return
    import concurrent.futures
    import multiprocessing
    import os

    threads = threads or max(1, (os.cpu_count() or 1) // processes)
    used = sorted({record for job in jobs for record in job.cfg.plugins or []})
    pool = concurrent.futures.ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"),
                                                  initializer=_worker_start, initargs=(threads, used, os.getpid()))
    try:
        with _ctrl_c_held():  # the workers start (at the submits) deaf to it; a Ctrl-C meanwhile comes after
            running = {pool.submit(_train_job, train_run, job.cfg, job.out): job for job in jobs}
        for done in concurrent.futures.as_completed(running):
            log(f"{running[done].label} (done)")
            finished(running[done], done.result())
    except BaseException:  # Ctrl-C, a failed run: the workers go now, not after their runs
        for process in list(getattr(pool, "_processes", {}).values()):
            process.kill()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()


PARENT_POLL = 1.0  # seconds between a worker's checks that the process that started it is alive


@contextlib.contextmanager
def _ctrl_c_held():
    """Within, SIGINT is blocked (in the main thread: pthread_sigmask), and the worker processes
    started inside inherit the mask, so a Ctrl-C while one still imports is not its traceback
    (it leaves the terminal's process group at its start and stays deaf to SIGINT). A Ctrl-C in
    the window is not lost: held pending, it is KeyboardInterrupt when the window ends (at once if
    another thread of this process, not blocking it, takes it)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _worker_start(threads: int, records: list[str], parent: int) -> None:
    """A suite's worker process: its torch threads, and the plugins its configs record (before a
    config that names their entries is unpickled). Ctrl-C is the parent's to handle (the worker is
    in a process group of its own; the parent kills it), and a worker whose parent is gone (killed:
    SIGKILL, SIGTERM) exits within PARENT_POLL seconds instead of training on for nobody."""
    import os
    import threading
    import time

    from tqdm import tqdm

    from . import plugins

    os.setpgrp()  # Ctrl-C at the terminal reaches the parent's process group only: the parent kills the workers
    tqdm.set_lock(threading.RLock())  # not its default multiprocessing lock, which a killed worker would leak

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL)
        os._exit(1)
    threading.Thread(target=watch, daemon=True).start()
    torch.set_num_threads(threads)
    plugins.load(records)  # the installed plugins too: a config records them


def _train_job(train_run: Callable, cfg: Config, out: Path) -> str | None:
    """Train one run; the message of its divergence, or None."""
    try:
        train_run(cfg, out)
    except Diverged as e:
        return str(e)
    return None


def grid_edge(grid: list, value) -> str | None:
    """"smallest" or "largest" when ``value`` is that end of a numeric ``grid`` of several values."""
    if len(grid) < 2 or not all(isinstance(g, (int, float)) for g in grid):
        return None
    return "smallest" if value == min(grid) else "largest" if value == max(grid) else None


def _tuning_section(suite: Suite, key: str, grid: list, tuned: dict[str, Tuned], fraction: str) -> str:
    """results.md's account of the tuning: per baseline, the validation metric at each value."""
    lines = [f"## Tuning {key}", "",
             f"Each baseline was trained at every {key} of {grid} for each seed on the training set less a "
             f"validation split ({fraction}, drawn from the seed), and the value with the best mean validation "
             f"metric of x̄ over the seeds (accuracy, or loss for a language model) was chosen; a value with a "
             f"diverged seed is never chosen. Test metrics chose nothing. Every variant then trained on the whole "
             f"training set at its baseline's value:", "",
             ", ".join(f"{v.name} → {tuned[v.baseline or v.name].value}" for v in suite.variants) + ".", "",
             f"| baseline | {key} | validation metric (x̄) | chosen |", "|---|---|---|---|"]
    for name, t in tuned.items():
        fmt = "{:.4f}"
        for value, row in zip(grid, t.scores):
            cell = (ci_cell(row, fmt) if None not in row else
                    f"diverged in {row.count(None)} of {len(row)} seeds")
            lines.append(f"| {name} | {value} | {t.metric.replace('_', ' ')} {cell} | "
                         f"{'**chosen**' if value == t.value else ''} |")
    edges = [f"{name}: {t.value} is the grid's {grid_edge(grid, t.value)} value" for name, t in tuned.items()
             if grid_edge(grid, t.value)]
    if edges:
        lines += ["", f"**At the grid's edge** ({'; '.join(edges)}): the best {key} may lie beyond the grid; "
                      f"widen it and re-run."]
    return "\n".join(lines) + "\n\n"


def _paired_section(suite: Suite, out: Path, seeds: range) -> str:
    """Each variant against its baseline: the difference of the headline test metric seed by seed
    (the same seed: the same initial model and batches) and its 95 % Student t interval."""
    pairs = [v for v in suite.variants if v.baseline is not None]
    if not pairs:
        return ""
    summaries = {v.name: _summaries(v.name, out, seeds) for v in suite.variants}
    accuracy = all("test_accuracy" in s for runs in summaries.values() for s in runs if s is not None)
    key, unit, fmt = ("test_accuracy", "points", "{:+.2f}") if accuracy else ("test_loss", "nats", "{:+.4f}")
    scale = 100 if accuracy else 1
    lines = ["## Paired differences against the baseline", "",
             f"Δ = {key} of the variant − {key} of its baseline on the same seed (in {unit}); mean ± "
             f"{CONFIDENCE:.0%} Student t interval of the per-seed differences.", "",
             f"| variant | baseline | Δ per seed ({', '.join(map(str, seeds))}) | mean Δ | interval excludes 0 |",
             "|---|---|---|---|---|"]
    for v in pairs:  # a seed where either run diverged has no difference
        deltas = [None if a is None or b is None else scale * (a[key] - b[key])
                  for a, b in zip(summaries[v.name], summaries[v.baseline])]
        finished = [d for d in deltas if d is not None]
        mean, half = mean_ci(finished) if finished else (None, None)
        excludes = "—" if half is None else ("yes" if abs(mean) > half else "no")
        shown = ", ".join("diverged" if d is None else fmt.format(d) for d in deltas)
        lines.append(f"| {v.name} | {v.baseline} | {shown} | {ci_cell(finished, fmt) if finished else '—'} | "
                     f"{excludes} |")
    return "\n".join(lines) + "\n"


def run_suite(name: str, out: Path, seeds: int, quick: bool, train_run: Callable, log=print,
              overrides: list[str] = (), scale: str = "cpu", dry_run: bool = False, first_seed: int = 0,
              tune_grid: str | None = None, jobs: int = 1) -> Path | None:
    """Run every variant for seeds ``first_seed`` … ``first_seed + seeds − 1`` into ``out``; write
    results.md (mean ± 95 % Student t interval over the seeds; each variant's paired difference
    with its baseline) and the suite's plots.

    ``overrides`` (``KEY=VALUE``) change the suite's base config for every variant. ``tune_grid``
    (``KEY=[V1,...]``): first :func:`tune` the baselines on a validation split (runs in
    ``out/tune``), then run every variant at its baseline's chosen value. Every config is checked
    and the estimated work printed before anything trains; ``dry_run`` stops there. ``jobs``: the
    worker processes the runs are trained in (:func:`train_all`; a suite with a reference run trains
    those first)."""
    suite = build_suite(name, scale, quick)
    suite.base += list(overrides)
    key, grid = parse_grid(tune_grid) if tune_grid else (None, [])
    if key is not None and any(o.partition("=")[0].strip() == key for o in overrides):
        raise ConfigError(f"--tune {key} and --set {key} both set {key}: give one")
    run_seeds = range(first_seed, first_seed + seeds)
    tuning = {}  # the tuning runs' configs, checked before training anything
    for v in (v for v in suite.variants if key is not None and v.baseline is None):
        try:
            tuning[v.name] = [suite.config(v, run_seeds[0], extra=tuning_overrides(suite, v, key, x)) for x in grid]
        except ConfigError as e:
            raise ConfigError(f"--tune {key}: {e}") from None
    # the final configs (at the grid's first value, until tuned): checked before training anything
    configs = {v.name: suite.config(v, run_seeds[0], extra=[f"{key}={grid[0]}"] if key else []) for v in suite.variants}
    planned = list(configs.values()) + [c for cs in tuning.values() for c in cs]
    log(f"[{name}] {len(configs)} variants{f' + {len(planned) - len(configs)} tuning runs' if tuning else ''} × "
        f"{seeds} seed(s): {estimate_work(planned, seeds)}")
    if dry_run:
        return None
    tuned = tune(suite, key, grid, run_seeds, out / "tune", train_run, log, jobs) if key else {}
    extra = {v.name: [f"{key}={tuned[v.baseline or v.name].value}"] if key else [] for v in suite.variants}
    configs = {v.name: suite.config(v, run_seeds[0], extra=extra[v.name]) for v in suite.variants}

    def job(v: Variant, seed: int) -> Job:
        ref = str(_run(suite.reference, out, seed)) if suite.reference else ""
        return Job(f"[{name}] seed {seed}: {v.name}", suite.config(v, seed, ref, extra[v.name]),
                   _run(v.name, out, seed))
    # the reference runs first: the controlled variants read their Ξ_t² trajectory
    for wave in (True, False):
        train_all([job(v, seed) for seed in run_seeds for v in suite.variants if (v.name == suite.reference) == wave],
                  train_run, log, jobs)
    command = (f"gossamer repro {name} --seeds {seeds}{f' --first-seed {first_seed}' if first_seed else ''}"
               f"{' --scale paper' if scale == 'paper' else ''}{' --quick' if quick else ''}"
               f"{''.join(' --set ' + o for o in overrides)}{f' --tune {tune_grid}' if tune_grid else ''}")
    results = out / "results.md"
    files = sorted({v.base_file or suite.base_file for v in suite.variants} - {None})
    base = f" on {', '.join(f'`configs/paper/{f}`' for f in files)}" if files else ""
    interval = (f"mean ± the {CONFIDENCE:.0%} Student t interval x̄ ± t_{{0.975, K−1}}·s/√K over K = {seeds} seeds "
                f"({', '.join(map(str, run_seeds))})" if seeds > 1 else f"one seed ({first_seed}): no interval")
    head = f"# {suite.title}\n\nCommand: `{command}`; {interval}. Base config{base}: `{' '.join(suite.base)}`.\n\n"
    fractions = sorted({c.validation_fraction for configs in tuning.values() for c in configs})
    body = (_tuning_section(suite, key, grid, tuned, "validation_fraction " + ", ".join(map(str, fractions)))
            if key else "")
    diverged = {(v.name, seed): (_run(v.name, out, seed) / DIVERGED).read_text().strip()
                for v in suite.variants for seed in run_seeds if (_run(v.name, out, seed) / DIVERGED).is_file()}
    complete = [seed for seed in run_seeds if suite.reports_diverged or all(s != seed for _, s in diverged)]
    if diverged:
        body += _diverged_section(diverged, complete, run_seeds, suite.reports_diverged)
    if complete:
        body += (suite.report or _consensus_report)(suite, configs, out, complete)
    results.write_text(head + body + "\n" + _paired_section(suite, out, run_seeds))
    return results


def _diverged_section(diverged: dict[tuple[str, int], str], complete: list[int], seeds: range,
                      reported: bool) -> str:
    """The runs that diverged, and which seeds the suite's tables are over because of them (a
    report that does not take diverged runs gets the seeds where none diverged, so that every
    variant is compared on the same seeds)."""
    lines = ["**Diverged runs** (their directories hold DIVERGED with the message; a paired difference below "
             "leaves out a seed where either run of the pair diverged):", "", *[f"- {name}, seed {seed}: {message}"
                                                    for (name, seed), message in diverged.items()], ""]
    if not reported:
        lines += [f"The tables below are over the seeds where no run diverged: {', '.join(map(str, complete))} "
                  f"({len(complete)} of {len(seeds)})." if complete else
                  "Every seed has a diverged run: no table (see the paired differences).", ""]
    return "\n".join(lines) + "\n"


def estimate_work(configs: list[Config], seeds: int = 1) -> str:
    """Steps, sample gradients and FLOPs of training and evaluating the runs of ``configs``, each
    ``seeds`` times: matmul and convolution FLOPs of one sample counted by
    ``torch.utils.flop_counter`` (forward + backward for training on the training set less any
    validation split, forward for evaluation of x̄ and the local models ``eval_local`` names on
    the test set and of x̄ on the validation split), times the samples. Communication and Ξ² are
    not counted."""
    from .data import load_dataset
    from .data.partition import steps_per_epoch, validation_size
    from .train import local_eval_workers

    steps = samples = train_flops = eval_flops = 0
    datasets: dict = {}
    flops: dict = {}  # per data set and model
    for cfg in configs:
        data_key = (cfg.dataset, repr(cfg.options["dataset"]))
        if data_key not in datasets:
            datasets[data_key] = load_dataset(cfg)
        data = datasets[data_key]
        model_key = (*data_key, cfg.model, repr(cfg.options["model"]))
        if model_key not in flops:
            flops[model_key] = sample_flops(cfg, data)
        forward, forward_backward = flops[model_key]
        held = validation_size(len(data.y_train), cfg.validation_fraction, cfg.workers, cfg.batch_size) \
            if cfg.validation_fraction else 0
        run_steps = cfg.epochs * steps_per_epoch(len(data.y_train) - held, cfg.workers, cfg.batch_size)
        evaluations = sum((e + 1) % cfg.eval_every == 0 or e + 1 == cfg.epochs for e in range(cfg.epochs))
        steps += seeds * run_steps
        samples += seeds * run_steps * cfg.workers * cfg.batch_size
        train_flops += seeds * run_steps * cfg.workers * cfg.batch_size * forward_backward
        models = 1 + len(local_eval_workers(cfg))  # x̄ and the local models eval_local names
        eval_flops += seeds * evaluations * (models * len(data.y_test) + held) * forward
    return (f"{steps:,} steps, {samples:,} sample gradients; ≈ {_flop(train_flops)} of training and "
            f"{_flop(eval_flops)} of evaluation (matmuls and convolutions)")


def _flop(x: float) -> str:
    for unit, size in (("E", 1e18), ("P", 1e15), ("T", 1e12)):
        if x >= size:
            return f"{x / size:.3g} {unit}FLOP"
    return f"{x / 1e9:.3g} GFLOP"


def sample_flops(cfg: Config, data) -> tuple[int, int]:
    """(forward, forward + backward) FLOPs of the model of ``cfg`` on one training sample."""
    from torch.utils.flop_counter import FlopCounterMode

    from .models import build_model
    from .tasks import TASKS

    with torch.random.fork_rng():
        model = build_model(cfg, data)
    x, y = data.x_train[:1], data.y_train[:1]
    with FlopCounterMode(display=False) as forward:
        output = model(x)
    with FlopCounterMode(display=False) as backward:
        TASKS[data.task].loss(output, y).backward()
    return forward.get_total_flops(), forward.get_total_flops() + backward.get_total_flops()


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


OPTIONAL_COLUMNS = [("sharpness", "sharpness (x̄)", "{:.3g}"), ("gossip_rounds_saved", "gossip rounds saved", "{:.0f}")]
"""Summary keys shown, as (key, heading, format), where a run of the suite has them ("—": a variant without)."""


def _run(name: str, out: Path, seed: int) -> Path:
    """The directory of variant ``name``'s run of ``seed``."""
    return out / f"{_slug(name)}-seed{seed}"


def _runs(name: str, out: Path, seeds: range) -> list[Path]:
    return [_run(name, out, s) for s in seeds]


DIVERGED = "DIVERGED"  # the file a suite writes in a run directory whose training diverged (its message)


def _summaries(name: str, out: Path, seeds: range) -> list[dict | None]:
    """The summaries of a variant's runs, seed by seed; None for a run that diverged."""
    return [None if (r / DIVERGED).is_file() else read_summary(r) for r in _runs(name, out, seeds)]


def _cell(runs: list[dict | None], value: Callable[[dict], float], fmt: str) -> str:
    """:func:`ci_cell` over the runs that finished, with how many diverged."""
    finished = [value(s) for s in runs if s is not None]
    diverged = len(runs) - len(finished)
    cell = ci_cell(finished, fmt) if finished else "—"
    return cell if not diverged else f"{cell} ({diverged}/{len(runs)} diverged)"


def _consensus_report(suite: Suite, configs: dict, out: Path, seeds: range) -> str:
    """The table of the test metrics, mean Ξ² per learning-rate phase, rounds (and the optional
    columns); the Ξ² plot and the test metric against communication (and sharpness)."""
    boundaries = configs[suite.variants[0].name].milestones
    phases = len(boundaries) + 1
    summaries = {v.name: [read_summary(r) for r in _runs(v.name, out, seeds)] for v in suite.variants}
    metrics = test_metrics([s for runs in summaries.values() for s in runs])
    optional = [c for c in OPTIONAL_COLUMNS if any(c[0] in s for runs in summaries.values() for s in runs)]
    head = ["variant", *[f"{x_bar} (x̄)" for _, x_bar, _, _ in metrics],
            *[f"mean Ξ² phase {k + 1}" for k in range(phases)], "MB/worker", "comm rounds", "extra gossip rounds",
            *[heading for _, heading, _ in optional]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in suite.variants:
        per_phase = [phase_means(out / f"{_slug(v.name)}-seed{s}" / "metrics.jsonl", boundaries) for s in seeds]
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
    plot_consensus({v.name: out / f"{_slug(v.name)}-seed{seeds[0]}" / "metrics.jsonl" for v in suite.variants},
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
        runs = {name: [out / f"{_slug(name)}-seed{s}" for s in seeds] for name in (exact, estimate)}
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


def _at_target(runs: list[Path], cfg) -> list[dict | None]:
    """Per run, its first evaluation row that reaches cfg's target (None where none does): what
    the loop reports as steps_to_target, for the suite's target whatever the runs were trained with."""
    return [next((r for r in read_rows(run) if any(k.startswith("test_") for k in r) and reached_target(cfg, r)),
                 None) for run in runs]


def _to_target(rows: list[dict | None], key: str, fmt: str) -> str:
    """Mean ± 95 % interval of ``key`` (step or sim_seconds) at the target over the seeds that reached it."""
    reached = [r[key] for r in rows if r is not None]
    if not reached:
        return "not reached"
    cell = ci_cell(reached, fmt)
    return cell if len(reached) == len(rows) else f"{cell} ({len(reached)} of {len(rows)} seeds)"


def _time_report(lin: dict[str, list[str]], kong: dict[str, list[str]], configs: dict, out: Path, seeds: range) -> str:
    """Tables of accuracy and simulated time (to the target, in total, communication) and plots of
    test accuracy against simulated time (the first seed): Lin et al.'s variants on each network;
    Kong et al.'s on each network, with the cost and the benefit of control against dec-phase-1 (the
    ring in phase 1 only) on that network. ``lin``, ``kong``: each row's variant on each network."""
    first = next(iter(kong.values()))[0]
    target = configs[first].target_accuracy
    names = [*sum(lin.values(), []), *sum(kong.values(), [])]
    summaries = {name: [read_summary(r) for r in _runs(name, out, seeds)] for name in names}
    at_target = {name: _at_target(_runs(name, out, seeds), configs[name]) for name in names}
    nets = [configs[name].network.preset for name in next(iter(lin.values()))]
    head = ["variant", "test acc", "steps to target",
            *[f"{h} on {net}" for net in nets for h in ("s to target", "s total", "comm")]]
    lines = [f"Target: test accuracy ≥ {target}. Simulated seconds: compute {configs[first].compute_ms} ms a step "
             f"plus the α–β time of every operator (consensus control's probes included).", "", "## Lin et al.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, names in lin.items():
        cells = [label, ci_cell([s["test_accuracy"] for s in summaries[names[0]]], "{:.4f}"),
                 _to_target(at_target[names[0]], "step", "{:.0f}")]
        for name in names:
            runs = summaries[name]
            cells += [_to_target(at_target[name], "sim_seconds", "{:.3f}"),
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
                     _to_target(at_target[name], "sim_seconds", "{:.3f}"),
                     ci_cell([s["sim_seconds"] for s in runs], "{:.3f}"),
                     ci_cell([s["sim_seconds_comm"] for s in runs], "{:.3f}"),
                     f"{ci_cell([s['sim_seconds'] - r['sim_seconds'] for s, r in zip(runs, plain)], '{:.3f}')} / "
                     f"{ci_cell([100 * (s['test_accuracy'] - r['test_accuracy']) for s, r in zip(runs, plain)], '{:+.1f}')}"
                     if controlled else "—"]
            lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    plots = {f"lin-{net}.png": {label: out / f"{_slug(names[i])}-seed{seeds[0]}" for label, names in lin.items()}
             for i, net in enumerate(nets)}
    plots.update({f"kong-{net}.png": {label: out / f"{_slug(names[i])}-seed{seeds[0]}" for label, names in kong.items()}
                  for i, net in enumerate(kong_nets)})
    for file, runs in plots.items():
        plot_runs(runs, "time", None, out / file, title=file.removesuffix(".png"))
        lines.append(f"![test accuracy against simulated time]({file})")
    return "\n".join(lines) + "\n"


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (tied values share their mean rank); None where either side is
    constant (no ranking to compare)."""
    def ranks(values):
        order = sorted(range(len(values)), key=lambda i: values[i])
        rank = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                rank[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return rank
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / (sxx * syy) ** 0.5 if sxx > 0 and syy > 0 else None


BOOTSTRAP = declare("bootstrap-seeds", "the seeds a bootstrap resample of a suite's runs draws", ("draw",))
BOOTSTRAP_DRAWS = 2000


def bootstrap_spearman(accuracy: list[list[float]], measures: dict[str, list[float]],
                       draws: int = BOOTSTRAP_DRAWS) -> dict[str, tuple[float, float]]:
    """Percentile intervals (CONFIDENCE) of Spearman's ρ between each measure and the variants'
    mean accuracy, and of each pair's difference (``"a − b"``), over bootstrap resamples of the
    seeds: ``accuracy`` [variant][seed]; every resample draws K seeds with replacement (the same for
    every variant: a seed is one initialisation and data order for all of them), stream
    ``bootstrap-seeds``. A resample where a ρ is undefined (all means equal) is left out of it."""
    k = len(accuracy[0])
    samples: dict[str, list[float]] = {name: [] for name in measures}
    names = list(measures)
    differences = {f"{a} − {b}": [] for i, a in enumerate(names) for b in names[i + 1:]}
    for draw in range(draws):
        chosen = host_stream(BOOTSTRAP, 0, draw).integers(0, k, size=k)
        means = [statistics.mean(runs[j] for j in chosen) for runs in accuracy]
        rho = {name: spearman(values, means) for name, values in measures.items()}
        for name, r in rho.items():
            if r is not None:
                samples[name].append(r)
        for key in differences:
            a, b = key.split(" − ")
            if rho[a] is not None and rho[b] is not None:
                differences[key].append(rho[a] - rho[b])
    low, high = round((1 - CONFIDENCE) / 2 * 1000) - 1, round((1 + CONFIDENCE) / 2 * 1000) - 1
    cuts = {name: statistics.quantiles(v, n=1000, method="inclusive")
            for name, v in {**samples, **differences}.items() if len(v) > 1}
    return {name: (q[low], q[high]) for name, q in cuts.items()}


def topology_measures(cfg) -> dict:
    """``gossamer topology``'s measures of a run's graph (All-Reduce: the complete graph)."""
    from .topology import analyse, build_topology

    spec = getattr(cfg, "topology", None) or "complete"
    seed = cfg.seed if getattr(cfg, "topology_seed", None) is None else cfg.topology_seed
    return analyse(build_topology(spec, cfg.workers, seed=seed))


def _topologies_report(suite: Suite, configs: dict, out: Path, seeds: range) -> str:
    """Per n: accuracy of x̄, mean Ξ² per learning-rate phase, MB sent per worker and the measures
    of each topology; Spearman's rank correlation of the accuracy with the spectral gap and with
    the effective number of neighbours over the variants, with bootstrap intervals over the seeds
    (:func:`bootstrap_spearman`), and which ranks the accuracy better: the one whose ρ_s exceeds
    the other's with a difference interval that excludes 0, else neither."""
    from .topology import DECAY

    boundaries = configs[suite.variants[0].name].milestones
    phases = len(boundaries) + 1
    summaries = {v.name: [read_summary(r) for r in _runs(v.name, out, seeds)] for v in suite.variants}
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
            per_phase = [phase_means(r / "metrics.jsonl", boundaries) for r in _runs(v.name, out, seeds)]
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
        plot_consensus({v.name: out / f"{_slug(v.name)}-seed{seeds[0]}" / "metrics.jsonl" for v in variants}, boundaries,
                       out / f"consensus-n{n}.png", f"{suite.title}, n = {n}")
        lines += [f"![Ξ² over training, n = {n}](consensus-n{n}.png)", ""]
    return "\n".join(lines + ["Reading: " + "; ".join(readings) + ".", ""])
