"""Running a suite: tuning its baselines on a validation split, training its runs (one after
another, or in worker processes), estimating the work first, and writing results.md."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..config import Config, ConfigError
from ..config_yaml import parse_yaml
from ..registry import short
from ..report import CONFIDENCE, ci_cell
from ..rundir import read_summary
from ..train import Diverged
from .base import DIVERGED, Suite, Variant, build_suite, run_dir, slug
from .default_report import consensus_report
from .stats import paired_section


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
    runs = {(v.name, i, seed): out / f"{slug(v.name)}-{slug(key)}{value}-seed{seed}"
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

    from .. import plugins

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
        ref = str(run_dir(suite.reference, out, seed)) if suite.reference else ""
        return Job(f"[{name}] seed {seed}: {v.name}", suite.config(v, seed, ref, extra[v.name]),
                   run_dir(v.name, out, seed))
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
    diverged = {(v.name, seed): (run_dir(v.name, out, seed) / DIVERGED).read_text().strip()
                for v in suite.variants for seed in run_seeds if (run_dir(v.name, out, seed) / DIVERGED).is_file()}
    complete = [seed for seed in run_seeds if suite.reports_diverged or all(s != seed for _, s in diverged)]
    if diverged:
        body += _diverged_section(diverged, complete, run_seeds, suite.reports_diverged)
    if complete:
        body += (suite.report or consensus_report)(suite, configs, out, complete)
    results.write_text(head + body + "\n" + paired_section(suite, out, run_seeds))
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
    from ..data import load_dataset
    from ..data.partition import steps_per_epoch, validation_size
    from ..train import local_eval_workers

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

    from ..models import build_model
    from ..tasks import TASKS

    with torch.random.fork_rng():
        model = build_model(cfg, data)
    x, y = data.x_train[:1], data.y_train[:1]
    with FlopCounterMode(display=False) as forward:
        output = model(x)
    with FlopCounterMode(display=False) as backward:
        TASKS[data.task].build().loss(output, y).backward()
    return forward.get_total_flops(), forward.get_total_flops() + backward.get_total_flops()
