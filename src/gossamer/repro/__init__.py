"""``gossamer repro``: the papers' experiments, at the papers' scale or at a scale two CPU cores run.

A suite is a list of variants (config overrides) run for seeds S … S+K−1 (``--first-seed``,
``--seeds``); it writes every run, ``results.md`` (mean ± the 95 % Student t interval over seeds
of the test metrics, Ξ² per learning-rate phase, communication, and where measured the sharpness
of x̄ and the rounds frequency control saved), a plot of Ξ² over training with the phases marked and one of the test metric against communication
(and against sharpness, where measured); ``time-to-accuracy`` instead its tables of simulated time
to a target accuracy and plots of accuracy against it. Every results.md ends with each variant's
paired difference from its baseline (the same seed: the same initial model and batches) and its
interval. ``--tune KEY=[...]`` first tunes each baseline on a validation split of the training
set (:func:`tune`) and runs every variant at its baseline's choice.

Scales: ``cpu`` (the default) runs each suite on a small workload from a base list of overrides
(MNIST-1D and the 1-D CNN; the character Transformer on the offline ``pydoc-topics`` text for
``decentralized-adam``), ``--quick`` a smoke-test version of it; ``paper`` runs the same
variants on top of the papers' configurations in ``configs/paper/`` (CIFAR-10 ResNet-20, meant
for GPUs). The estimated work is printed before anything trains.

Suites: ``ring-scaling`` and ``consensus-phases`` (Kong et al.; the latter also compares consensus
control from the local estimate with control from the exact Ξ), ``decentralized-adam`` (Kong et al.),
``local-sgd`` (Lin et al.), ``time-to-accuracy`` (both),
``heterogeneous`` (non-i.i.d. data: D-SGD, quasi-global momentum, gradient tracking, CHOCO-SGD
and All-Reduce), ``stragglers`` (slow and jittery workers: synchronous schedules and AD-PSGD on
per-worker clocks), ``topologies`` (static, time-varying, finite-time and random per-round graphs:
which of the spectral gap and the effective number of neighbours ranks their accuracy),
``low-communication`` (the DiLoCo family — compressed, streaming, NoLoCo, SparseLoCo, MuLoCo —
SPARTA, DeMo, local AdamW and DES-LOC against all-reduced AdamW: test loss against bytes and
simulated time; CPU scale only),
``faults`` (workers lost mid-run and churned, both rejoin modes; CPU scale only), ``byzantine``
(attacks against robust aggregators),
``asynchronous`` (overlapped DiLoCo and asynchronous local SGD on uneven workers: loss, simulated
time and compute utilisation; CPU scale only).

Layout: :mod:`.base` (:class:`Variant`, :class:`Suite`, the table :data:`SUITES` and
:func:`build_suite`, where a variant's runs lie), :mod:`.runner` (:func:`run_suite`,
:func:`train_all`, :func:`tune`, :func:`estimate_work`), :mod:`.stats` (Spearman's ρ and its
bootstrap, Ξ² per phase, paired differences), :mod:`.default_report` (the tables of a suite with
no report of its own), and one module per suite with its builder, its constants and its report.
A new suite is a module that registers its builder (``@register("name")``) and one name in the
import of the suite modules below.
"""

# each module registers its suite; this order is the order `gossamer repro --help` lists them in
from . import (ring_scaling, consensus_phases, decentralized_adam, local_sgd, time_to_accuracy,  # noqa: F401, I001
               heterogeneous, stragglers, topologies, low_communication, faults, byzantine, asynchronous)
from .base import (DIVERGED, KONG_CIFAR, PAPER_CONFIGS, SCALES, SUITES, Suite, Variant, against, build_suite, cpu_base,
                   slug)
from .low_communication import LOWCOMM_NETWORKS
from .runner import Job, estimate_work, grid_edge, parse_grid, run_suite, train_all, tune
from .stats import bootstrap_spearman, paired_section, phase_means, spearman
from .time_to_accuracy import LIN_CIFAR, LIN_NETWORKS

__all__ = ["DIVERGED", "KONG_CIFAR", "LIN_CIFAR", "LIN_NETWORKS", "LOWCOMM_NETWORKS", "PAPER_CONFIGS", "SCALES",
           "SUITES", "Job", "Suite", "Variant", "against", "bootstrap_spearman", "build_suite", "cpu_base",
           "estimate_work", "grid_edge", "paired_section", "parse_grid", "phase_means", "run_suite", "slug", "spearman",
           "train_all", "tune"]
