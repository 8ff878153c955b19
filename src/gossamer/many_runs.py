"""``gossamer train --seeds K --sweep KEY=[V,...] --jobs J``: many runs of one config, each its own
run directory, trained in worker processes (:mod:`gossamer.repro`'s runner), and the checks of
the options that say how many."""

from __future__ import annotations

import math
import sys
from itertools import product
from pathlib import Path

from .config import SEED_LIMIT, ConfigError, load_config
from .report import comparison_table
from .repro import DIVERGED, Job, estimate_work, parse_grid, slug, train_all
from .rundir import default_out, read_summary
from .runner import train_suite_run


def positive(option: str, value: int) -> None:
    if value < 1:
        raise ConfigError(f"{option} must be a positive integer, got {value}")


def seed_range(first: int, seeds: int) -> None:
    """Seeds first … first + seeds − 1 must all be valid seeds."""
    if not 0 <= first <= SEED_LIMIT - seeds:
        raise ConfigError(f"--first-seed must be an integer in [0, 2**44 - seeds], got {first}")


MAX_RUNS = 100_000  # runs one train --seeds/--sweep command builds (each a config, checked before any trains)


def empty_out(out: Path, overwrite: bool) -> None:
    """Refuse to train many runs into a folder that holds something, unless told to overwrite."""
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"--out '{out}' is not empty; pass --overwrite to replace its runs")


def train_many(args) -> int:
    """``gossamer train --seeds K [--first-seed S] [--sweep KEY=[V,...]] [--jobs J]``: every seed ×
    every combination of the swept values, each its own run in ``--out``/``seed-S[-KEY-V...]``, the
    run ``gossamer train --set seed=S --set KEY=V`` writes; trained in J worker processes."""
    if args.resume or args.resume_if_exists:
        raise ConfigError("--seeds, --sweep and --jobs train new runs; resume each run directory on its own "
                          "(gossamer train --resume DIR)")
    seeds = 1 if args.seeds is None else args.seeds
    positive("--seeds", seeds)
    positive("--jobs", args.jobs)
    if args.first_seed is not None:
        seed_range(args.first_seed, seeds)
    grids = [parse_grid(text, "--sweep") for text in args.sweep]
    keys = [key for key, _ in grids]
    given = {o.partition("=")[0].strip() for o in args.set}
    for key in keys:
        clash = ("swept twice" if keys.count(key) > 1 else "what --seeds and --first-seed set" if key == "seed"
                 else "also given with --set" if key in given else None)
        if clash:
            raise ConfigError(f"--sweep {key}: {key} is {clash}; give it once")
    base = load_config(args.config, args.set, plugin=args.plugin)
    if base.engine == "dist":
        raise ConfigError("--seeds, --sweep and --jobs run on the simulator (engine sim); under torchrun launch each "
                          "run on its own")
    first = base.seed if args.first_seed is None else args.first_seed
    out = Path(args.out or default_out(f"{base.algorithm}-n{base.workers}-runs"))
    runs = seeds * math.prod(len(grid) for _, grid in grids)
    if runs > MAX_RUNS:
        raise ConfigError(f"--seeds {seeds}{' and --sweep' if grids else ''} ask for {runs:,} runs; one command trains "
                          f"at most {MAX_RUNS:,}")
    empty_out(out, args.overwrite)
    jobs, names = [], {}
    for seed in range(first, first + seeds):
        for values in product(*(grid for _, grid in grids)):
            chosen = [f"{key}={value}" for key, value in zip(keys, values)]
            name = "-".join([f"seed-{seed}", *(f"{slug(k)}-{slug(str(v))}" for k, v in zip(keys, values))])
            if names.setdefault(name, chosen) != chosen:
                raise ConfigError(f"--sweep: {' '.join(names[name])} and {' '.join(chosen)} would share the run "
                                  f"folder '{name}'; sweep values that differ in more than / and - and spaces")
            cfg = load_config(args.config, [*args.set, f"seed={seed}", *chosen], plugin=args.plugin)
            if cfg.engine == "dist":
                raise ConfigError(f"--sweep {' '.join(chosen)}: --seeds, --sweep and --jobs run on the simulator "
                                  f"(engine sim); under torchrun launch each run on its own")
            jobs.append(Job(f"training {name}", cfg, out / name))
    combinations = len(jobs) // seeds  # each built once (its data and model) before any trains: bad ones refused now
    work = estimate_work([job.cfg for job in jobs[:combinations]], seeds)
    print(f"{len(jobs)} runs into {out}{f' in {args.jobs} processes' if args.jobs > 1 else ''}: {work}", file=sys.stderr)
    train_all(jobs, train_suite_run, lambda line: print(line, file=sys.stderr), args.jobs)
    finished = {job.out.name: read_summary(job.out) for job in jobs
                if (job.out / "summary.json").is_file() and not (job.out / DIVERGED).is_file()}
    print(comparison_table(finished))
    diverged = [job.out.name for job in jobs if job.out.name not in finished]
    if diverged:
        print(f"diverged (no summary): {', '.join(diverged)}")
    print(f"runs written to {out}")
    return 0
