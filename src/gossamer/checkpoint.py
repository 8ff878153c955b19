"""The full state of a run after a step, captured and restored bit for bit (``--resume``).

A checkpoint holds everything the next step depends on: the parameters X and buffers B (and
every worker's integer buffers), the local optimizer's state and step count, the schedule's
state (compression references and residuals, the gossip round counter, DiLoCo's outer model and
momentum, ...), the communication counters, the loop's own state (the EMA of φ², extra rounds),
the RNG state, the config, with a network section each worker's simulated clock, with faults
who is alive (and the churn state), with Byzantine workers the robust aggregator's memory and
the clean reference run's own checkpoint. The position in the data order is the step: every
epoch's batches are a function of (seed, epoch). Tensors with one row per worker sit under ``rows`` keys; an
engine gathers them from all processes when saving and takes its own rows when restoring.

Everything in a checkpoint is a tensor, a number, a string, a list or a dict, so it loads with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import torch

from .registry import ConfigError, short

# 3: per-worker Adam step counts, the clock's per-worker times, AD-PSGD's events on the clock; 4: AD-PSGD's reads
# to take; 5: each process's generator states, a copy per row (rank 0's alone before)
FORMAT = 5
READABLE = (4, 5)  # the formats a resume reads (4: the generator of rank 0 for every process)
RESUMABLE_KEYS = ("epochs", "eval_every", "metrics_every", "checkpoint_every", "logger", "sharpness",
                  "sharpness_samples", "sharpness_iterations")
"""Keys a resumed run may change: its length, how it logs and what it measures, nothing that
changes training."""


def capture(run, progress, step: int) -> dict:
    """The state of ``run`` after ``step`` steps (this process's rows)."""
    w = run.workers
    # each process's generators, one copy per local row: gathered with the rows, each process gets its own back
    rng = {"torch": torch.get_rng_state()}
    if w.X.device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(w.X.device)
    rng = {"rows": {name: state.expand(w.m, -1).clone() for name, state in rng.items()}}
    return {"format": FORMAT, "step": step, "config": run.cfg.to_dict(),
            "rows": {"X": w.X, "B": w.B, "integer_buffers": w.integer_buffers()},
            "optimizer": run.optimizer.state_dict(), "schedule": run.schedule.state_dict(),
            "comm": run.engine.comm.state_dict(), "progress": progress.state_dict(), "rng": rng,
            **({"clock": run.clock.state_dict()} if run.clock is not None else {}),
            **({"faults": run.faults.state_dict()} if run.faults is not None else {}),
            **({"byzantine": run.engine.adversary.state_dict()} if run.engine.adversary is not None else {}),
            **({"clean": capture(run.clean.run, run.clean.progress, step)} if run.clean is not None else {})}


def restore(run, progress, state: dict) -> int:
    """Load a captured state into a freshly built (and started) ``run``; returns the step."""
    local = local_rows(state, run.engine.rows)
    w = run.workers
    w.X.copy_(local["rows"]["X"])
    w.B.copy_(local["rows"]["B"])
    w.load_integer_buffers(local["rows"]["integer_buffers"])
    run.optimizer.load_state_dict(_on(local["optimizer"], w.X.device))
    run.schedule.load_state_dict(_on(local["schedule"], w.X.device))
    run.engine.comm.load_state_dict(local["comm"])
    progress.load_state_dict(local["progress"])
    if run.clock is not None:
        run.clock.load_state_dict(local["clock"])
    if run.faults is not None:
        run.faults.load_state_dict(local["faults"])
    if run.engine.adversary is not None:
        run.engine.adversary.load_state_dict(_on(local["byzantine"], w.X.device))
    if run.clean is not None:
        restore(run.clean.run, run.clean.progress, local["clean"])
    rng = process_rng(local)
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and w.X.device.type == "cuda":
        torch.cuda.set_rng_state(rng["cuda"], w.X.device)
    return int(local["step"])


def process_rng(local: dict) -> dict[str, torch.Tensor]:
    """This process's generator states in a state cut to its rows (:func:`local_rows`): the copy on
    its first row (a checkpoint from before they were kept per process: the one saved, rank 0's)."""
    rng = local["rng"]
    if "rows" not in rng:
        return rng
    # a copy with storage of its own: torch reads a generator state from the start of its storage
    return {name: rows[0].cpu().clone() for name, rows in rng["rows"].items()}


def check_fits(state: dict, run, run_dir: str) -> None:
    """Refuse, naming the entry, a checkpoint whose step or rows cannot be this run's (a
    hand-edited file, or rows of another model): step a non-negative integer, X and B of n rows of
    this model's widths; the rest is held to it by the config check."""
    def refuse(what: str):
        raise ConfigError(f"--resume {short(run_dir)}: checkpoint.pt does not fit this run: {what}; it was edited "
                          f"or comes from another run")
    step = state.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        refuse(f"step {short(repr(step))} is not a step count (a non-negative integer)")
    rows = state.get("rows") if isinstance(state.get("rows"), dict) else {}
    for name, mine in (("X", run.workers.X), ("B", run.workers.B)):
        saved = rows.get(name)
        want = (run.cfg.workers, *mine.shape[1:])
        if not isinstance(saved, torch.Tensor) or tuple(saved.shape) != want:
            got = tuple(saved.shape) if isinstance(saved, torch.Tensor) else type(saved).__name__
            refuse(f"its rows {name} are {got}, this run's are {want}")


def local_rows(state, rows: range):
    """``state`` with every tensor under a ``rows`` key cut to the given workers' rows."""
    def walk(value, under_rows: bool = False):
        if under_rows and isinstance(value, torch.Tensor):
            return value[rows.start : rows.stop]
        if isinstance(value, dict):
            return {k: walk(v, under_rows or k == "rows") for k, v in value.items()}
        return value
    return walk(state)


def _on(state, device: torch.device):
    """Every tensor of a state dict on ``device``."""
    if isinstance(state, torch.Tensor):
        return state.to(device)
    if isinstance(state, dict):
        return {k: _on(v, device) for k, v in state.items()}
    return state


def check_resumable(saved: dict, new: dict, run_dir: str) -> None:
    """Refuse to resume with a config that differs from the saved one in anything that changes
    training (every key but :data:`RESUMABLE_KEYS`), naming the keys."""
    shown = config_differences(saved, new)
    if shown:
        raise ConfigError(f"--resume {run_dir[:100]}: the config differs from the run's in {shown}; "
                          f"only {', '.join(RESUMABLE_KEYS)} may change")


def check_checkpoint(run_config: dict, written_with: dict, run_dir: str) -> None:
    """Refuse a checkpoint written with another config than the run's (its config.yaml, with the
    changes a resume may make) in anything that changes training, naming the keys."""
    shown = config_differences(written_with, run_config)
    if shown:
        raise ConfigError(f"--resume {run_dir[:100]}: checkpoint.pt was written with a config that differs from "
                          f"config.yaml in {shown}; it is another run's checkpoint, or config.yaml was edited")


def config_differences(a: dict, b: dict) -> str:
    """The keys (but :data:`RESUMABLE_KEYS`) whose values differ, with both values ("" if none).
    Plugins are compared by their content (a plugin moved elsewhere, ``--plugin NEWPATH``, is the same)."""
    def comparable(config: dict, key: str):
        value = config.get(key)
        return sorted(r.partition("#sha256=")[2] for r in value) if key == "plugins" and value else value
    changed = sorted(k for k in set(a) | set(b) if k not in RESUMABLE_KEYS and comparable(a, k) != comparable(b, k))
    return ", ".join(f"{k} ({short(a.get(k))} → {short(b.get(k))})" for k in changed[:5])


