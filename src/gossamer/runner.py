"""Training one config into a run directory: :func:`run_training`, under both the command line
(:mod:`gossamer.cli`: ``gossamer train``, ``demo``, ``repro``) and the Python API
(:func:`gossamer.run`), so that neither imports the other.

It continues a run (``resume``), stops after a step on SIGINT or SIGTERM with a checkpoint
(:class:`Stopped`, the same signal on every process), and under ``engine: dist`` trains this
process's block of workers while rank 0 alone writes.
"""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path

import torch

from .checkpoint import check_checkpoint, check_fits, restore
from .registry import ConfigError
from .rundir import RunDir, RunLock, load_checkpoint, read_rows, read_summary, reference_trajectory
from .train import Diverged, Interrupted, Progress, build_run, summarize, train


class Stopped(Exception):
    """A signal stopped the run after a step: with a checkpoint written, or (``replaced``: a run
    that was to replace another one, before its first checkpoint) leaving the old run as it was."""

    def __init__(self, signum: int, step: int, out: Path, replaced: bool = False):
        name = signal.Signals(signum).name
        super().__init__(f"{name}: stopped after step {step}, before the new run's first checkpoint; the run in "
                         f"{out} was left as it was" if replaced else
                         f"{name}: stopped after step {step} with a checkpoint; resume with: "
                         f"gossamer train --resume {out}")
        self.code = 128 + signum


class Finished(ConfigError):
    """The run to resume has taken all its steps (and written its summary)."""


@contextlib.contextmanager
def stop_on_signals():
    """Within the block, SIGINT and SIGTERM only record themselves (in ``received``): the loop
    finishes its step, checkpoints and stops. A second signal interrupts at once."""
    received: list[int] = []

    def handler(signum, frame):
        if received:
            raise KeyboardInterrupt
        received.append(signum)
    try:
        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: no signal handling
        yield received
        return
    try:
        yield received
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def run_training(cfg, out: Path, overwrite: bool, progress: bool = True, resume: bool = False,
                 lock: RunLock | None = None, data=None, model=None) -> dict:
    """Train one config into a run directory (or continue the run there, ``resume``) and return
    its summary (``lock``: the directory's, already held; ``data``, ``model``: a data set and a
    model builder given from Python, as :func:`gossamer.train.build_run` takes them).

    The run is built (and so every option checked) before the directory is touched. With
    ``engine: dist`` every process trains its block of workers and only rank 0 writes."""
    if cfg.engine == "dist":
        if data is not None or model is not None:
            raise ConfigError("a model or data given from Python trains on the simulator (engine sim)")
        return _run_training_dist(cfg, out, overwrite, progress, resume, lock)
    run = build_run(cfg, reference=reference_trajectory(cfg), data=data, model=model)
    state = resumed_state(cfg, run, out) if resume else None
    run_dir = RunDir(out, overwrite, cfg.logger, resume_step=state["step"] if resume else None, lock=lock)
    return train_into(cfg, run, run_dir, out, progress, state)


def train_suite_run(cfg, run_out: Path) -> None:
    """Train one run of a suite into its directory (a module-level function: worker processes import it)."""
    run_training(cfg, run_out, overwrite=True, progress=False)


def resumed_state(cfg, run, out: Path) -> dict:
    """The checkpoint of the run in ``out``, written with its config.yaml's config; a finished run
    (its summary written) is refused."""
    state = load_checkpoint(out)
    check_checkpoint(cfg.to_dict(), state["config"], str(out))
    check_fits(state, run, str(out))
    step, total = state["step"], cfg.epochs * run.steps_per_epoch
    if step > total or step == total and _summary_steps(out) == step:
        raise Finished(f"the run is finished ({step} of {total} steps); to train longer, resume with a "
                       f"larger epochs")
    return state


def _summary_steps(out: Path) -> int | None:
    """The steps that the summary.json in ``out`` counts (None: there is none, or it is damaged)."""
    try:
        return read_summary(out, ("steps",))["steps"]
    except ConfigError:
        return None


def train_into(cfg, run, run_dir: RunDir | None, out: Path, progress: bool, state: dict | None) -> dict:
    """Train ``run`` (from checkpoint ``state`` if given; if that is the last step, only the
    summary is missing: it is written); only the process with a ``run_dir`` (rank 0) writes,
    every process checkpoints (the engine gathers the rows of all processes)."""
    signals: list[int] = []  # the signal that stops the run, the same on every process

    def checkpoint(state: dict) -> None:
        full = run.engine.gather_state(state)
        if run_dir:
            run_dir.checkpoint(full, stop=bool(signals))

    try:
        if run_dir:
            run_dir.write_config(cfg)
        if state is not None and state["step"] == cfg.epochs * run.steps_per_epoch:
            summary = _final_summary(cfg, run, state, out)
        else:
            with stop_on_signals() as received:
                summary = train(cfg, run, on_row=run_dir.row if run_dir else lambda row: None,
                                on_checkpoint=checkpoint, progress=progress, resume=state,
                                stop=_agreed_stop(run.engine, received, signals))
        if run_dir:
            run_dir.write_summary(summary)
    except Diverged as e:
        kept = f"; last good state kept in {out / 'checkpoint.pt'}" if run_dir and (run_dir.checkpoints or state) else ""
        raise Diverged(f"{e}{kept}") from None
    except Interrupted as e:
        raise Stopped(signals[0], e.step, out, replaced=bool(run_dir and run_dir.replacing)) from None
    finally:
        if run_dir:
            run_dir.close()
    return summary


def _agreed_stop(engine, received: list[int], signals: list[int]):
    """``stop`` for :func:`train`: whether any process received SIGINT or SIGTERM, the same answer
    on every process; then the signal that stops the run goes into ``signals``, the same on every
    process (SIGINT if any process's first signal was SIGINT, else SIGTERM) — the process that
    reports it may have received none."""
    flag = torch.zeros(engine.m, dtype=torch.bool)

    def stop() -> bool:
        if not engine.any_worker(flag.fill_(bool(received))):
            return False
        interrupted = engine.any_worker(flag.fill_(received[:1] == [signal.SIGINT]))
        signals.append(signal.SIGINT if interrupted else signal.SIGTERM)
        return True
    return stop


def _final_summary(cfg, run, state: dict, out: Path) -> dict:
    """The summary of a run killed between its final checkpoint and its summary, as :func:`train`
    gives it: the counters from the checkpoint, the final metrics from the last row (written
    before the checkpoint); ``wall_seconds`` is this call's, as for any resumed run."""
    start = time.perf_counter()
    progress = Progress()
    run.schedule.start(run.engine, run.workers.X)
    step = restore(run, progress, state)
    row = read_rows(out)[-1]
    if row["step"] != step:
        raise ConfigError(f"--resume '{str(out)[:100]}': metrics.jsonl lacks the row of the final step {step}, "
                          f"which summary.json is made from; train the run again")
    return summarize(run, progress, row, start)


def _run_training_dist(cfg, out: Path, overwrite: bool, progress: bool, resume: bool, lock: RunLock | None) -> dict:
    """engine: dist — this process's block of workers; options fail alike on every rank (the first
    rank's error); rank 0 alone writes the run directory, with the full gathered checkpoint. To
    resume, every process reads the checkpoint (the run directory must be visible to all)."""
    from .engines import build_engine
    from .engines.dist import env_world_size
    from .train import resolve_device

    world = env_world_size()
    if resume and cfg.workers % world:  # the workers are the run's: the process count must change
        divisors = [str(k) for k in range(1, cfg.workers + 1) if cfg.workers % k == 0]
        raise ConfigError(f"--resume: the run has workers={cfg.workers}, which {world} processes cannot share "
                          f"evenly; launch it on {', '.join(divisors[:8])}{', ...' if len(divisors) > 8 else ''} "
                          f"processes (a divisor of {cfg.workers})")
    engine = build_engine(cfg, resolve_device(cfg.device))
    try:
        run = engine.agree(lambda: build_run(cfg, engine, reference=reference_trajectory(cfg)))
        state = engine.agree(lambda: resumed_state(cfg, run, out) if resume else None)
        run_dir = engine.agree(lambda: RunDir(out, overwrite, cfg.logger, resume_step=state["step"] if resume else None,
                                              lock=lock) if engine.rank == 0 else None)
        return train_into(cfg, run, run_dir, out, progress and engine.rank == 0, state)
    finally:
        engine.close()
