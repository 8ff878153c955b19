"""The conformance kit: the checks gossamer's generated tests run on its own entries, for a plugin's.

``gossamer check-plugin PATH_OR_MODULE`` (or :func:`check_plugin`) imports a plugin and, for every
entry it registers, trains a short float64 run that uses the entry (an algorithm as its example
says; a codec with the first compressing algorithm that takes it; an optimizer, a topology with
gossip on it; a model or a data set as its example says) and checks:

- ``resume``: the run stopped at a step before the examples' boundaries and at one after them, and
  resumed from its checkpoints, gives the straight run's rows, summary and state bit for bit
  (deviation: max |Δ| of the final state);
- ``hot-path``: ten steps without metrics read nothing back from the device (no ``.item()``, no
  tensor → Python conversion);
- ``ledger``: on 2 real processes (the ``processes`` launch), what each hands torch.distributed
  between two transfers of the ledger — every collective's group and bytes, every message's peer
  and bytes — is what the transfer implies (:mod:`gossamer.engines.wire`): nothing assumed,
  nothing missed, no byte count taken on trust;
- ``hooks``: the entry in a user's plain PyTorch loop with the synchroniser of gossamer.integrations
  that runs the same algorithm (LocalSGD, Gossip, DiLoCo), 4 workers in threads over a
  ThreadedSim, gives the simulator's parameters to 1e-10 and its traffic counts — for a codec,
  topology, model or data set (a plugin's algorithm has no synchroniser: not applicable);
- ``processes``: the same run on 2 real processes (engine dist, gloo) gives the simulator's
  worker matrix to 1e-10 and the same traffic counts (one launch for all of a plugin's entries).

Each check prints one line with its measured deviation; :func:`check_plugin` returns them.
gossamer's own tests call the same functions (tests/test_resume.py, tests/test_hot_path.py,
tests/test_ledger.py on the parity launches of tests/test_dist.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from . import plugins
from .algorithms import ALGORITHMS
from .config import load_config
from .registry import ConfigError

# a fraction of a second in float64: 4 workers, 2 epochs of 6 steps, the MLP
SHORT = ["workers=4", "epochs=2", "batch_size=32", "lr=0.05", "dtype=float64", "model=mlp", "grad_backend=loop"]
MNIST1D_SAMPLES = "num_samples=1000"  # MNIST-1D's option, where the run's data set is MNIST-1D
STEPS = 12  # SHORT's steps: the examples' boundaries lie in steps 4..8
PARITY = 1e-10  # float64, sums taken in another order across processes
HOST_READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__")


@dataclass(frozen=True)
class Check:
    """One check of one entry: passed or not, the measured deviation, what was measured."""

    entry: str
    check: str
    passed: bool | None  # None: not applicable
    deviation: float | None
    detail: str

    def line(self) -> str:
        verdict = "n/a " if self.passed is None else "PASS" if self.passed else "FAIL"
        # inf: not a number that moved (rows, keys, a run that stopped): the detail says what differs
        shown = "" if self.deviation is None or math.isinf(self.deviation) else f" (max |Δ| = {self.deviation:.3g})"
        return f"{verdict}  {self.entry:<32} {self.check:<10} {self.detail}{shown}"


# ---------------------------------------------------------------- the runs an entry is checked with


def overrides_for(kind: str, name: str) -> list[str]:
    """The overrides of a short run that uses the entry ``name`` of registry ``kind`` (after SHORT,
    and MNIST1D_SAMPLES where the data set is MNIST-1D)."""
    from .algorithms import ALGORITHMS
    from .codecs import CODECS
    from .data import DATASETS
    from .models import MODELS
    from .optim import OPTIMIZERS
    from .topology import TOPOLOGIES
    registry = {r.kind: r for r in (ALGORITHMS, CODECS, DATASETS, MODELS, OPTIMIZERS, TOPOLOGIES)}[kind]
    entry = registry[name]
    spec = f"{name}:{entry.example[0]}" if entry.takes == "required" else name
    example = list(entry.example) if entry.takes != "required" else []
    if kind == "compression":
        for algorithm in ALGORITHMS.entries.values():
            if "compression" in algorithm.keys:
                candidate = [f"algorithm={algorithm.name}", *algorithm.example, f"compression={spec}"]
                if _accepted(candidate):
                    return candidate
        raise ConfigError(f"compression '{spec}': no compressing algorithm takes it in a short run")
    gossip = ["algorithm=gossip", "topology=ring"]  # a synchroniser runs it too (the hooks' check)
    kind_keys = {"algorithm": [], "optimizer": gossip, "topology": ["algorithm=gossip"], "model": gossip,
                 "dataset": gossip}[kind]
    return [*kind_keys, f"{kind}={spec}", *example]


def _accepted(overrides: list[str]) -> bool:
    try:
        config(overrides)
    except ConfigError:
        return False
    return True


def config(overrides: list[str]):
    """The config of a short run with ``overrides`` (MNIST-1D on 1000 samples unless they choose
    another data set)."""
    try:
        return load_config(None, [*SHORT, MNIST1D_SAMPLES, *overrides])
    except ConfigError:
        return load_config(None, [*SHORT, *overrides])


# ---------------------------------------------------------------- resume


def through_bytes(state: dict) -> dict:
    """A checkpoint as it comes back from disk (copied; loads with weights_only=True)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def untimed(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if not k.endswith("_seconds")}


def state_difference(a, b, path: str = "state") -> tuple[str | None, float]:
    """(the first path where two nested states differ, or None; the max |Δ| of their tensors)."""
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            return path, float("inf")
        delta = (a.double() - b.double()).abs().max().item() if a.numel() and a.is_floating_point() else \
            float(not torch.equal(a, b))
        return (None if torch.equal(a, b) else path), delta
    if isinstance(a, dict):
        if not isinstance(b, dict) or a.keys() != b.keys():
            return path, float("inf")
        first, worst = None, 0.0
        for key in a:
            where, delta = state_difference(a[key], b[key], f"{path}.{key}")
            first, worst = first or where, max(worst, delta)
        return first, worst
    return (None if a == b else path), 0.0


def resume_difference(overrides: list[str], seed: str) -> tuple[str | None, float]:
    """Train ``overrides`` straight, and again stopped at a random step before the boundaries
    (1..3) and one after (9..11), resumed from its checkpoints as a chain of restarts; returns
    (what first differs from the straight run — rows, summary or a state's path — or None; the
    max |Δ| of the final states). ``seed`` names the draw of the stop steps."""
    from .train import Interrupted, build_run, train

    cfg = config([*overrides, "checkpoint_every=0.01"])  # a checkpoint after every step
    steps = cfg.epochs * build_run(cfg).steps_per_epoch
    draw = random.Random(seed)
    first, second = draw.randint(1, 3), draw.randint(steps - 3, steps - 1)
    rows, saved = [], {}

    def keep(state):
        if state["step"] in (first, steps):
            saved[state["step"]] = through_bytes(state)
    summary = train(cfg, build_run(cfg), on_row=rows.append, on_checkpoint=keep)
    resumed_rows, state = [], saved[first]
    for stop in (second, steps):
        resumed_rows.clear()
        try:
            resumed = train(cfg, build_run(cfg), on_row=resumed_rows.append, resume=state,
                            on_checkpoint=lambda s: saved.update(last=through_bytes(s) if s["step"] in (second, steps)
                                                                 else {"step": s["step"]}),
                            stop=lambda: saved.get("last", {}).get("step") == second - 1)
        except Interrupted as interrupted:
            if interrupted.step != second:
                return f"stopped at step {interrupted.step}, not {second}", float("inf")
        start = state["step"]
        if resumed_rows != [r for r in rows if start < r["step"] <= stop]:
            return f"the rows after resuming at step {start}", float("inf")
        state = saved.pop("last")
    if untimed(resumed) != untimed(summary):
        return "the summary", float("inf")
    return state_difference(state, saved[steps])


# ---------------------------------------------------------------- hot path


@contextlib.contextmanager
def no_host_reads() -> Iterator[None]:
    """Inside: any Python read of a tensor's value raises AssertionError."""
    saved = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def forbid(name):
        def read(*args, **kwargs):
            raise AssertionError(f"host synchronisation in the hot path: Tensor.{name}")
        return read
    try:
        for name in HOST_READS:
            setattr(torch.Tensor, name, forbid(name))
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


def host_steps(run, steps: int = 10) -> None:
    """``steps`` steps of a built run with no metrics due, reading nothing back from the device
    (the epochs' batch indices are drawn first: on the host, once per epoch)."""
    from .train import Batches, Progress, train_step

    progress = Progress()
    run.schedule.start(run.engine, run.workers.X)
    batches = Batches(run)
    for epoch in range(-(-steps // run.steps_per_epoch)):
        batches.epoch(epoch)
    with no_host_reads():
        for t in range(steps):
            train_step(run, progress, batches, t, lr=0.05, measure=False, computes=None)


def host_read(overrides: list[str], steps: int = 10) -> str | None:
    """The first host read in ``steps`` unmeasured steps of the run, or None."""
    from .train import build_run

    run = build_run(config([*overrides, "metrics_every=100"]))
    try:
        host_steps(run, steps)
    except AssertionError as e:
        return str(e)
    return None


# ---------------------------------------------------------------- hooks: a user's loop, one model per worker

PROCS = 4  # the synchronisers' parity: 4 workers, one a thread (SHORT's workers)
_SEEDED = threading.Lock()  # threads share torch's global generator: one seeded build at a time


def hook_of(overrides: list[str]) -> dict | None:
    """The synchroniser of gossamer.integrations (and its keyword options) that does what
    ``gossamer train`` does with these overrides, or None where the algorithm has none."""
    cfg = config(overrides)
    hook = ALGORITHMS[cfg.algorithm].traits.get("hook")  # its registration's: (kind, cfg → keyword options)
    return None if hook is None else {"kind": hook[0], "kwargs": hook[1](cfg)}


def hooked(cfg, data, hook: dict, seed: int | None = None, engine=None):
    """(model, optimizer, synchroniser) as a user writes them, from the run's config (``engine``:
    the synchroniser's engine; None: a DistEngine on the default group)."""
    from torch.nn.parallel import DistributedDataParallel

    from .integrations import DiLoCo, Gossip, LocalSGD
    from .models import build_model

    with _SEEDED:
        torch.manual_seed(cfg.seed if seed is None else seed)
        model = build_model(cfg, data).to(torch.float64)
    if hook.get("ddp"):
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)
    kwargs = {**hook.get("kwargs", {}), **({"engine": engine} if engine is not None else {})}
    if hook["kind"] == "DiLoCo":
        outer = torch.optim.SGD(model.parameters(), lr=cfg.outer_lr, momentum=cfg.outer_momentum, nesterov=True)
        return model, optimizer, DiLoCo(model, optimizer, outer, **kwargs)
    return model, optimizer, {"LocalSGD": LocalSGD, "Gossip": Gossip}[hook["kind"]](model, optimizer, **kwargs)


def hooked_steps(cfg, data, model, optimizer, steps: range, rank: int) -> None:
    """Steps ``steps`` of worker ``rank`` in a plain loop: the simulator's batches and learning rates."""
    from .data.partition import iid_epoch_indices, steps_per_epoch
    from .rng import host_stream
    from .train import lr_at

    S = steps_per_epoch(len(data.y_train), cfg.workers, cfg.batch_size)
    for t in steps:
        epoch, s = divmod(t, S)
        idx = iid_epoch_indices(len(data.y_train), cfg.workers, cfg.batch_size, epoch, cfg.seed)
        x, y = data.train_batch(idx[s], range(rank, rank + 1), host_stream("augment", cfg.seed, t))
        for group in optimizer.param_groups:
            group["lr"] = lr_at(cfg, t, S)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x[0]), y[0]).backward()
        optimizer.step()


def hooked_data(cfg):
    """The run's data set in float64 (one thread at a time: it may write the cache)."""
    from .data import load_dataset

    with _SEEDED:
        return load_dataset(cfg).to(torch.device("cpu"), torch.float64)


def hooked_total_steps(cfg, data) -> int:
    from .data.partition import steps_per_epoch

    return cfg.epochs * steps_per_epoch(len(data.y_train), cfg.workers, cfg.batch_size)


def in_threads(work: Callable, procs: int = PROCS) -> list:
    """``work(rank, engine)`` for every rank, each in its own thread over one ThreadedSim."""
    from .engines.threads import ThreadedSim

    hub, results, errors = ThreadedSim(procs, timeout=120), [None] * procs, []

    def run(rank):
        try:
            results[rank] = work(rank, hub.engine(rank))
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(e)
            hub.barrier.abort()
    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(procs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def hook_difference(overrides: list[str]) -> tuple[str | None, float]:
    """The run's synchroniser in a plain loop, 4 workers in threads, against the simulator: (what
    differs beyond 1e-10 — a worker's parameters or the traffic counts — or None; max |ΔX|)."""
    from .train import build_run, train

    hook = hook_of(overrides)
    cfg = config(overrides)

    def work(rank, engine):
        data = hooked_data(cfg)
        model, optimizer, sync = hooked(cfg, data, hook, engine=engine)
        hooked_steps(cfg, data, model, optimizer, range(hooked_total_steps(cfg, data)), rank)
        mine = sync.X[0].clone(), sync.comm.state_dict()
        sync.close()
        return mine
    mine = in_threads(work)
    run = build_run(cfg)
    train(cfg, run)
    delta = max((x - run.workers.X[rank]).abs().max().item() for rank, (x, _) in enumerate(mine))
    keys = ("rounds", "bytes_per_worker", "rounds_by_level", "bytes_by_level")
    comm = run.engine.comm.state_dict()
    counts = all(c[key] == comm[key] for _, c in mine for key in keys)
    return ("a worker's parameters" if not delta <= PARITY else None if counts else "the traffic counts"), delta


# ---------------------------------------------------------------- processes


@dataclass(frozen=True)
class OnProcesses:
    """One case on real processes against the simulator: what differs beyond 1e-10 (the worker
    matrix, the traffic counts) or None, max |ΔX|; the wire check (the first mismatch or None, the
    transfers compared); why the run on processes failed, if it did."""

    differs: str | None
    delta: float
    wire: str | None
    operators: int
    failed: str | None = None


def wire_difference(prefix: Path, procs: int) -> tuple[str | None, int]:
    """The wire reports ``PREFIX-rank{R}.json`` of a run on ``procs`` processes
    (:mod:`gossamer.engines.wire`): (the first mismatch, or None; the transfers compared)."""
    operators = 0
    for rank in range(procs):
        path = Path(f"{prefix}-rank{rank}.json")
        if not path.exists():
            return f"rank {rank} wrote no wire report", operators
        report = json.loads(path.read_text())
        if report["mismatches"]:
            return report["mismatches"][0], operators
        operators = max(operators, report["operators"])
    return None, operators


def process_differences(plugin: str | None, cases: dict[str, list[str]], procs: int = 2,
                        timeout: float = 600) -> dict[str, OnProcesses]:
    """Each case trained by the simulator here and on ``procs`` gloo processes (one launch for
    all, the wire tap on): {case: :class:`OnProcesses`}."""
    from .train import build_run, train

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        runs = dict(cases)
        (root / "cases.json").write_text(json.dumps({"plugin": plugin, "cases": runs}))
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                               str(procs), "-m", "gossamer.testing_processes", str(root)], capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if done.returncode != 0:
            failed = f"the {procs}-process launch failed: {launch_failure(done.stderr)[:300]}"
            return {name: OnProcesses(None, float("inf"), None, 0, failed) for name in cases}
        results = {}
        for name, overrides in runs.items():
            failed = root / f"failed-{name}.txt"
            if failed.exists():
                why = f"the {procs}-process run failed: {failed.read_text().strip()[:300]}"
                results[name] = OnProcesses(None, float("inf"), None, 0, why)
                continue
            cfg = config(overrides)
            run = build_run(cfg)
            train(cfg, run)
            state = torch.load(root / name / "checkpoint.pt", weights_only=True)
            delta = (state["rows"]["X"] - run.workers.X).abs().max().item()
            comm = run.engine.comm.state_dict()
            differs = "the worker matrix" if not delta <= PARITY else \
                "the traffic counts" if state["comm"] != comm else None
            results[name] = OnProcesses(differs, delta, *wire_difference(root / f"wire-{name}", procs))
        return results


def launch_failure(stderr: str) -> str:
    """The line of a failed torchrun launch's stderr that says why: our own error line (a lost peer,
    a bad config) if a process wrote one, else the last line that is not one of torchrun's rules of
    ``=`` or ``-``."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip() and set(line.strip()) - set("=-")]
    ours = [line for line in lines if "gossamer: error:" in line]
    return (ours or lines or ["(no output)"])[-1]





# ---------------------------------------------------------------- the kit


def _attempt(entry: str, check: str, run: Callable[[], Check]) -> Check:
    """``run()``'s check, or a failed one naming the error the entry's run raised (one line)."""
    try:
        return run()
    except Exception as e:  # noqa: BLE001 - the kit reports what the entry raised, whatever it is
        lines = str(e).strip().splitlines()
        return Check(entry, check, False, None, f"the run raised {type(e).__name__}: {lines[0][:300] if lines else ''}")


def check_entry(kind: str, name: str) -> list[Check]:
    """The in-process checks of one registered entry."""
    entry = f"{kind} {name}"
    overrides = overrides_for(kind, name)

    def resume() -> Check:
        where, delta = resume_difference(overrides, entry)
        return Check(entry, "resume", where is None, delta,
                     "stopped before and after the boundaries, resumed: the straight run bit for bit" if where is None
                     else f"differs in {where}")

    def hot_path() -> Check:
        if any(o.startswith("consensus.") for o in overrides):  # control decides from Ξ² every step: a read
            return Check(entry, "hot-path", None, None, "consensus control reads Ξ² by design")
        read = host_read(overrides)
        return Check(entry, "hot-path", read is None, None,
                     "10 steps, nothing read back from the device" if read is None else read)

    def hooks() -> Check:
        if hook_of(overrides) is None:
            return Check(entry, "hooks", None, None, "gossamer's synchronisers (LocalSGD, Gossip, DiLoCo) run their "
                                                     "own algorithms, not this one")
        where, delta = hook_difference(overrides)
        return Check(entry, "hooks", where is None, delta,
                     "the synchroniser in a plain loop (4 threads) gives the simulator's run and its counts"
                     if where is None else f"differs in {where}")
    return [_attempt(entry, check, run) for check, run in (("resume", resume), ("hot-path", hot_path),
                                                            ("hooks", hooks))]


def check_plugin(spec: str, processes: bool = True, out: Callable[[str], None] = lambda line: None) -> list[Check]:
    """Import the plugin ``spec`` and run the kit on every entry it registers (``out``: each
    check's line as it finishes)."""
    record = plugins.load([spec])[0]
    entries = plugins.registered(record)
    if not entries:
        raise ConfigError(f"plugin '{spec[:100]}' registers nothing (use the registries of gossamer.extend)")
    checks = []
    for kind, name in entries:
        for check in check_entry(kind, name):
            out(check.line())
            checks.append(check)
    if not processes:
        for kind, name in entries:
            check = Check(f"{kind} {name}", "ledger", None, None, "checked against what 2 processes hand "
                          "torch.distributed: it runs with the processes check")
            out(check.line())
            checks.append(check)
        return checks
    source = record.partition(plugins.HASH)[0]
    cases = {f"{kind}-{name}": overrides_for(kind, name) for kind, name in entries}
    for (kind, name), result in zip(entries, process_differences(source, cases).values()):
        entry = f"{kind} {name}"
        if result.failed:
            found = [Check(entry, check, False, None, result.failed) for check in ("ledger", "processes")]
        else:
            outside = " although every transfer is what moved: rows combined outside the engine's operators (a " \
                      "process holds only its own)?" if result.differs == "the worker matrix" and result.wire is None else ""
            found = [Check(entry, "ledger", result.wire is None, None,
                           f"{result.operators} transfers, each what the 2 processes handed torch.distributed"
                           if result.wire is None else result.wire),
                     Check(entry, "processes", result.differs is None, result.delta,
                           "2 gloo processes give the simulator's run (1e-10) and its counts" if result.differs is None
                           else f"differs in {result.differs}{outside}")]
        for check in found:
            out(check.line())
            checks.append(check)
    return checks
