"""The engine-agnostic training loop: config in, metric rows and a summary out.

Nothing here knows about files or the command line, nor any algorithm: rows and checkpoints go
to callbacks, and the schedule takes each step (:func:`train_step` hands it a
:class:`~gossamer.algorithms.StepIO`: the workers that take part — the schedule's ``computing(t)``
less the gone ones under faults —, a gradient oracle over every worker's batches, the local
optimizer's step). Metrics (loss, Ξ², φ², …) are measured every ``metrics_every`` steps and at
every evaluation; between them the step takes no host synchronisation of its own. With a
``network`` section, a :class:`~gossamer.network.Clock` prices every step from the engine's ledger
(the computations and operators recorded in it) into the simulated time ``sim_seconds``.
"""

from __future__ import annotations

import copy
import math
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import torch
from torch.optim.swa_utils import update_bn
from tqdm import tqdm

from .algorithms import Context, Schedule, StepIO, build_schedule, graph_of
from .byzantine import Adversary
from .checkpoint import capture, restore
from .config import GIVEN, Config, ConfigError
from .data import Dataset, load_dataset
from .data.partition import dirichlet_shards, iid_epoch_indices, shard_epoch_indices, steps_per_epoch, validation_split
from .engines import Engine, build_engine
from .faults import Faults
from .models import Footprint, build_model, hidden_matrices, no_decay_mask
from .network import TIME_KEYS, Clock, build_clock
from .optim import OPTIMIZERS, decay_vector
from .preflight import check_data, check_local_repair, check_memory, check_robust_gossip_memory, check_target
from .rng import host_stream
from .sharpness import model_sharpness, training_subset
from .tasks import TASKS, Task
from .workers import WorkerMatrix, flatten


class Diverged(RuntimeError):
    """The loss or the parameters became NaN/inf; the last good state was already checkpointed."""


class Interrupted(Exception):
    """Training stopped on request (a signal) after ``step`` steps, with a checkpoint written."""

    def __init__(self, step: int):
        super().__init__(f"stopped after step {step}")
        self.step = step


def lr_at(cfg: Config, step: int, steps_per_epoch: int) -> float:
    """η_t: peak = lr (× n with linear scaling), linear warm-up from 0, ×lr_decay at each milestone."""
    peak = cfg.lr * (cfg.workers if cfg.lr_scaling == "linear" else 1)
    warmup_steps = cfg.warmup_epochs * steps_per_epoch
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    epoch = step / steps_per_epoch
    return peak * cfg.lr_decay ** sum(epoch >= m for m in cfg.milestones)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' requested but no CUDA device is available; use device=cpu or auto")
    return torch.device(name)


@dataclass
class Run:
    """Everything one training run is built from (see :func:`build_run`)."""

    cfg: Config
    engine: Engine
    data: Dataset
    task: Task
    workers: WorkerMatrix
    optimizer: object  # an optim.SGD or optim.Adam: step(X, G, lr), rows, state_dict()
    schedule: Schedule
    steps_per_epoch: int
    shards: list | None
    clock: Clock | None = None  # with a network section: prices each step in simulated seconds
    faults: Faults | None = None  # with a faults section: who is alive at each step
    clean: Clean | None = None  # byzantine.clean_reference: the same run without Byzantine workers, in lockstep


@dataclass
class Progress:
    """What the loop carries from step to step besides the run's state."""

    grad_norm_sq_ema: float | None = None  # EMA of φ² over the measured steps
    sim_seconds: float = 0.0  # simulated time (with a network): the slowest worker's clock
    sim_seconds_comm: float = 0.0  # ... of which communication not hidden by compute
    sim_seconds_metrics: float = 0.0  # the modelled time of the measurement traffic (in sim_seconds if counted)
    steps_to_target: int | None = None  # first evaluation at target_accuracy / target_loss
    sim_seconds_to_target: float | None = None
    comm_seconds: float = 0.0  # measured by the engine (dist with a network): the algorithm's collectives
    comm_metrics_seconds: float = 0.0  # ... and the measurement traffic's
    last_loss: float | None = None  # the training loss of the latest measured step in which a worker computed

    def state_dict(self) -> dict:
        return dict(vars(self))

    def load_state_dict(self, state: dict) -> None:
        vars(self).update(state)


@dataclass
class Clean:
    """The run without its ``byzantine`` section (and without a network: its time is not asked),
    trained step for step beside the attacked one: the reference its honest workers are measured
    against (``byzantine.clean_reference``)."""

    run: Run
    progress: Progress
    batches: Batches

    @classmethod
    def build(cls, cfg: Config, data: Dataset, model: ModelBuilder | None = None) -> Clean:
        clean = copy.deepcopy(cfg)
        clean.byzantine = clean.network = None
        for key in TIME_KEYS:
            setattr(clean, key, None)
        clean.target_accuracy = clean.target_loss = None
        run = build_run(clean, data=data, model=model)
        return cls(run, Progress(), Batches(run))

    def step(self, t: int, lr: float) -> None:
        train_step(self.run, self.progress, self.batches, t, lr, False, computing(self.run, t))

    def distances(self, X: torch.Tensor, honest: np.ndarray) -> dict[str, float]:
        """The honest workers' mean squared distance from the clean run's x̄, (1/h) Σ_honest
        ‖x_i − x̄_clean‖², and their x̄'s, ‖x̄_honest − x̄_clean‖² (read in the simulator, not traffic)."""
        clean = self.run.workers.X.mean(0)
        rows = X[torch.as_tensor(honest, device=X.device)]
        return {"honest_distance_to_clean_sq": (rows - clean).square().sum(1).mean().item(),
                "mean_distance_to_clean_sq": (rows.mean(0) - clean).square().sum().item()}


class Batches:
    """Every worker's training batches by its count (batch s of epoch e for count e·S + s): the
    synchronous step's all at step t, an event-driven schedule's each at its own. An epoch's
    indices are drawn once (the last two are kept)."""

    def __init__(self, run: Run):
        self.run = run
        self._epochs: dict[int, torch.Tensor] = {}
        adversary = run.engine.adversary
        self.flipper = adversary if adversary is not None and adversary.flips_labels else None  # its workers' labels

    def epoch(self, e: int) -> torch.Tensor:
        if e not in self._epochs:
            if len(self._epochs) >= 2:
                self._epochs.pop(min(self._epochs))
            self._epochs[e] = epoch_indices(self.run, e)
        return self._epochs[e]

    def of(self, counts: np.ndarray | int, draw: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(x [m, b, ...], y [m, b, ...]) of the local workers' batches, augmented with ``draw``."""
        S = self.run.steps_per_epoch
        if isinstance(counts, (int, np.integer)):
            idx = self.epoch(int(counts) // S)[int(counts) % S]
        else:
            idx = torch.stack([self.epoch(int(k) // S)[int(k) % S, i] for i, k in enumerate(counts)])
        x, y = self.run.data.train_batch(idx, self.run.engine.rows, host_stream("augment", self.run.cfg.seed, draw))
        if self.flipper is not None:
            self.flipper.flip_labels_(y, self.run.engine.rows, self.run.data.num_classes)
        return x, y


ModelBuilder = Callable[[Config, Dataset], torch.nn.Module]  # (cfg, data) → a fresh model, as a MODELS entry builds
_SEEDING = threading.Lock()  # torch's global generator is the process's: one run at a time seeds it, builds its model


def build_run(cfg: Config, engine: Engine | None = None, data: Dataset | None = None,
              reference: list[float] | None = None, model: ModelBuilder | None = None) -> Run:
    """Build data, model replicas, optimizer and schedule; errors are ConfigErrors naming the option.

    ``engine``: the engine to run on (default: the one ``cfg.engine`` names); ``data``: a data
    set to use instead of loading ``cfg.dataset``; ``model``: a function that builds the model
    instead of ``cfg.model``'s entry (called once; ``cfg.model`` is then ``python``, as
    :func:`gossamer.run` gives it); ``reference``: the Ξ_t² by step of the run a
    ``consensus.target: run:DIR`` follows (:func:`gossamer.rundir.reference_trajectory`).
    ``validation_fraction`` > 0 holds its split out of the training set
    (:func:`gossamer.data.partition.validation_split`). The config is validated again (one
    changed with ``dataclasses.replace`` skipped it).

    The model is initialised from torch's global generator seeded with ``cfg.seed`` (on cuda,
    the devices' generators are seeded too, as ``torch.manual_seed`` does), one run at a time in
    the process; the generator is left in the state that building the model left it in."""
    cfg.validate()
    _check_given(cfg, data, model)
    device = resolve_device(cfg.device)
    dtype = getattr(torch, cfg.dtype)
    source = data or load_dataset(cfg)  # as given: a clean reference run starts from it too
    data = source.to(device, dtype)
    if cfg.validation_fraction:
        kept, held = validation_split(len(data.y_train), cfg.validation_fraction, cfg.seed, cfg.workers, cfg.batch_size)
        data = data.hold_out(kept.to(device), held.to(device))
    cfg.options["dataset"] = replace(cfg.options["dataset"], **data.resolved)  # e.g. a text's vocabulary
    task = TASKS[data.task].build()
    engine = engine or build_engine(cfg, device)
    engine.adversary = Adversary.build(cfg)
    flips = engine.adversary is not None and engine.adversary.flips_labels
    if flips and TASKS[data.task].traits["targets"] != "classes":
        raise ConfigError(f"byzantine.attack {cfg.byzantine.attack} flips class labels; dataset '{cfg.dataset}' is a "
                          f"{data.task} task")
    steps = steps_per_epoch(len(data.y_train), cfg.workers, cfg.batch_size)
    check_data(cfg, data)
    shards = (dirichlet_shards(data.y_train.cpu(), cfg.workers, cfg.dirichlet_alpha, cfg.seed, min_size=cfg.batch_size)
              if cfg.partition == "dirichlet" else None)
    if model is None:
        check_memory(cfg, data, task, engine.m, dtype, device)
    given = model
    model, again = _seeded_model(cfg, data, device, given)
    if given is not None:  # its size is known once built: building it to count would call the builder twice
        check_memory(cfg, data, task, engine.m, dtype, device,
                     Footprint(sum(p.numel() for p in model.parameters()), 0, 0))
    model = model.to(dtype)
    cfg.bn_eval = resolve_bn_eval(cfg, model)
    workers = WorkerMatrix(model, engine.m, device, backend=cfg.grad_backend, loss=task.loss)
    no_decay = [False] * len(workers.param_slots) if cfg.decay_norm_and_bias else no_decay_mask(model)
    decay = decay_vector(workers.param_slots, no_decay, cfg.weight_decay, workers.X)
    entry = OPTIMIZERS[cfg.optimizer]  # one that steps the hidden matrices alone is given them (muon)
    matrices = {"matrices": [s for s, hidden in zip(workers.param_slots, hidden_matrices(model)) if hidden]} \
        if entry.traits.get("matrices") else {}
    optimizer = entry.build(cfg, workers.X, decay, **matrices)
    clock = build_clock(cfg, model, data, task.loss, device)
    context = Context(workers.X, [s.numel for s in workers.param_slots], list(optimizer.rows.values()), steps,
                      reference, total_steps=cfg.epochs * steps, clock=clock,
                      shapes=[tuple(s.shape) for s in workers.param_slots], optimizer=optimizer)
    schedule = build_schedule(cfg, context)
    if engine.adversary is not None:
        check_robust_gossip_memory(engine.m, workers.d, graph_of(schedule), dtype, device)
    check_target(cfg, task)
    if clock is not None:
        engine.comm.keep()
    faults = None
    if cfg.faults is not None:
        faults = Faults(cfg.faults, cfg.workers, cfg.seed)
        faults.check_steps(cfg.epochs * steps)
        if graph_of(schedule) is not None and cfg.faults.repair == "local":
            check_local_repair(graph_of(schedule))
    run = Run(cfg, engine, data, task, workers, optimizer, schedule, steps, shards, clock, faults)
    if cfg.byzantine is not None and cfg.byzantine.clean_reference:
        run.clean = Clean.build(cfg, source, again)
    return run


def _check_given(cfg: Config, data: Dataset | None, model: ModelBuilder | None) -> None:
    """A model or data set named ``python`` (:data:`~gossamer.config.GIVEN`) is one given from
    Python: the run must be handed it."""
    for kind, argument, name, given in (("dataset", "data", cfg.dataset, data), ("model", "model", cfg.model, model)):
        if name == GIVEN and given is None:
            raise ConfigError(f"{kind} '{GIVEN}' is one given from Python: gossamer.run({argument}=...)")


def _seeded_model(cfg: Config, data: Dataset, device: torch.device,
                  given: ModelBuilder | None) -> tuple[torch.nn.Module, ModelBuilder | None]:
    """The run's model, built by ``given`` (else by ``cfg.model``'s entry) from torch's global
    generator seeded with ``cfg.seed``, one run at a time in the process; and, for a given model
    with ``byzantine.clean_reference``, the builder of the clean run's copy (:func:`_again`)."""
    again = None
    with _SEEDING:
        if device.type == "cuda":
            torch.manual_seed(cfg.seed)  # the cuda generators too, for what the model draws as it trains
        else:  # torch.manual_seed would queue a seed for the cuda generators, which a cpu run leaves alone
            torch.random.default_generator.manual_seed(cfg.seed)
        model = (given or build_model)(cfg, data)
        if given is not None and cfg.byzantine is not None and cfg.byzantine.clean_reference:
            again = _again(model, device)
    return model, again


def _again(model: torch.nn.Module, device: torch.device) -> ModelBuilder:
    """A given model's builder for the clean reference run (``byzantine.clean_reference``): a copy
    of ``model`` as built, torch's generators put in the state building it left them in, as
    building it again from the seed would (the user's builder is called once)."""
    model, cpu = copy.deepcopy(model), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if device.type == "cuda" else None

    def build(cfg: Config, data: Dataset) -> torch.nn.Module:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        return copy.deepcopy(model)
    return build


def _has_target(cfg: Config) -> bool:
    return cfg.target_accuracy is not None or cfg.target_loss is not None


def reached_target(cfg: Config, row: dict) -> bool:
    """Whether an evaluation row meets the run's target (test accuracy ≥ target_accuracy, or
    test loss ≤ target_loss); False without a target."""
    if cfg.target_accuracy is not None:
        return row["test_accuracy"] >= cfg.target_accuracy
    return cfg.target_loss is not None and row["test_loss"] <= cfg.target_loss



def epoch_indices(run: Run, epoch: int) -> torch.Tensor:
    """[steps, n, batch] training-set indices of every worker's batches in this epoch."""
    cfg = run.cfg
    if run.shards is None:
        idx = iid_epoch_indices(len(run.data.y_train), cfg.workers, cfg.batch_size, epoch, cfg.seed)
    else:
        idx = shard_epoch_indices(run.shards, run.steps_per_epoch, cfg.batch_size, epoch, cfg.seed)
    return idx.to(run.data.y_train.device)


def resolve_bn_eval(cfg: Config, model: torch.nn.Module) -> str | None:
    """``bn_eval`` for this model: "average" by default where it has BatchNorm running statistics
    (floating buffers); a ConfigError where it has none and bn_eval was given."""
    has_stats = any(b.is_floating_point() for b in model.buffers())
    if cfg.bn_eval is not None and not has_stats:
        raise ConfigError(f"bn_eval applies to models with BatchNorm running statistics; model '{cfg.model}' "
                          f"as configured has none")
    return cfg.bn_eval or ("average" if has_stats else None)


RECOMPUTE_BATCHES = 8  # bn_eval: recompute — training batches of n·B samples (fewer if the set is smaller)


def recompute_batches(run: Run, t: int) -> list[torch.Tensor]:
    """The inputs ``bn_eval: recompute`` re-estimates x̄'s statistics on before step t's evaluation:
    RECOMPUTE_BATCHES augmented training batches of n·B samples, drawn with step t's seed (the
    same on every process)."""
    cfg, data = run.cfg, run.data
    n, b = cfg.workers, cfg.batch_size
    count = min(RECOMPUTE_BATCHES, len(data.y_train) // (n * b))
    perm = torch.from_numpy(host_stream("recompute", cfg.seed, t).permutation(len(data.y_train)))
    idx = perm[: count * n * b].view(count, n, b).to(data.y_train.device)
    return [data.train_batch(idx[k], range(n), host_stream("recompute-augment", cfg.seed, t, k))[0].flatten(0, 1)
            for k in range(count)]


def averaged_model(run: Run, t: int) -> torch.nn.Module:
    """The averaged model x̄ in eval mode, with the BatchNorm statistics ``bn_eval`` says: the mean
    of the workers' (``average``), or re-estimated with x̄ (``recompute``: reset, then the
    cumulative mean of the batch statistics of x̄ on :func:`recompute_batches`)."""
    w, e = run.workers, run.engine
    model = w.model_at(run.schedule.model_row(e, w.X), e.mean_row(w.B))
    if run.cfg.bn_eval == "recompute":
        with torch.no_grad():
            update_bn(recompute_batches(run, t), model)
    return model


def local_eval_workers(cfg: Config) -> list[int]:
    """The workers whose local models ``eval_local`` evaluates: all, none, or K drawn once from
    the seed (the same K at every evaluation, on every engine)."""
    if cfg.eval_local in ("all", "none"):
        return list(range(cfg.workers)) if cfg.eval_local == "all" else []
    return sorted(host_stream("eval-local", cfg.seed).permutation(cfg.workers)[: cfg.eval_local].tolist())


def evaluate(run: Run, t: int) -> dict[str, float]:
    """The task's test metrics of the averaged model x̄ (statistics per ``bn_eval``, see
    :func:`averaged_model`), and their mean over the local models that ``eval_local`` names
    (``*_local_mean``, each with its own statistics); with ``validation_fraction``, x̄'s metrics on
    the held-out split (``val_accuracy``, ``val_loss``, ...); with ``sharpness``, the top Hessian
    eigenvalue of the training loss at x̄ (with the same statistics) before step t."""
    w, e, d, cfg = run.workers, run.engine, run.data, run.cfg
    model = averaged_model(run, t)
    metrics = run.task.evaluate(model, d.x_test, d.y_test)
    if d.x_val is not None:  # validation_fraction: x̄ on the held-out split too, as val_*
        validation = run.task.evaluate(model, d.x_val, d.y_val)
    if cfg.sharpness:  # before the local models rebind the template
        x_bar, b_bar = flatten(model)
        subset = training_subset(len(d.y_train), cfg.sharpness_samples, host_stream("sharpness-subset", cfg.seed))
        sharpness = model_sharpness(w, x_bar, b_bar, d.x_train[subset.to(d.y_train.device)],
                                    d.y_train[subset.to(d.y_train.device)], cfg.sharpness_iterations,
                                    host_stream("sharpness-start", cfg.seed, t + 1))  # its start vector: by the step
    chosen = local_eval_workers(cfg)
    if chosen:
        rows = [i - e.rows.start for i in chosen if i in e.rows]
        # one model at a time: a vmapped forward of several was slower on CPU (docs/benchmarks.md)
        local = [run.task.evaluate(w.model_at(w.X[i], w.B[i]), d.x_test, d.y_test) for i in rows]
        for key in list(metrics):
            values = torch.zeros(w.m, dtype=torch.float64)
            values[rows] = torch.tensor([m[key] for m in local], dtype=torch.float64)
            metrics[f"{key}_local_mean"] = e.mean_scalar(values, over=None if cfg.eval_local == "all" else chosen)
    if d.x_val is not None:
        metrics.update({"val_" + key.removeprefix("test_"): value for key, value in validation.items()})
    if cfg.sharpness:
        metrics["sharpness"] = sharpness
    return metrics


def computing(run: Run, t: int) -> np.ndarray | None:
    """The workers that compute at step t (bool [n]; None: all): the schedule's, less the gone."""
    computes, alive = run.schedule.computing(t), run.engine.alive
    return computes if alive is None else alive if computes is None else computes & alive


def train_step(run: Run, progress: Progress, batches: Batches, t: int, lr: float, measure: bool,
               computes: np.ndarray | None) -> dict:
    """Step t of every worker (the schedule's :meth:`~gossamer.algorithms.Schedule.step`), the
    workers ``computes`` taking part in computing. Returns the step's metric row when ``measure``
    (else only what the schedule reports)."""
    w, e, clock = run.workers, run.engine, run.clock
    timed = clock.timed if clock is not None else (lambda fn, *args: fn(*args))

    def gradients(rows: np.ndarray | None, at: torch.Tensor | None, counts, draw: int) -> torch.Tensor:
        x, y = batches.of(counts, draw)
        if at is None:
            losses = timed(w.loss_and_grad, x, y, None if rows is None else rows.tolist())
        else:  # the models of an event-driven schedule's gradients, X kept
            current = w.X.clone()
            w.X.copy_(at)
            losses = w.loss_and_grad(x, y, None if rows is None else rows.tolist())
            w.X.copy_(current)
        if clock is not None:  # engine dist: the slow workers' processes sleep
            clock.straggle(draw, e.rows if rows is None else [e.rows.start + int(r) for r in rows])
        return losses

    io = StepIO(e, w.X, w.G, t, lr, measure, progress.grad_norm_sq_ema, computes, gradients,
                lambda rows: timed(run.optimizer.step, w.X, w.G, lr, rows))
    stepped = run.schedule.step(io)
    progress.grad_norm_sq_ema = stepped.grad_norm_sq_ema
    if not measure:
        return stepped.metrics
    row = {"step": t + 1, "epoch": round((t + 1) / run.steps_per_epoch, 6), "lr": lr}
    if stepped.computed != []:  # some worker has a training loss (a sporadic step may have none)
        row["loss"] = e.mean_scalar(stepped.losses, over=stepped.computed)
        if not math.isfinite(row["loss"]):
            raise Diverged(f"training diverged: loss is {row['loss']} at step {t + 1} (epoch "
                           f"{(t + 1) / run.steps_per_epoch:g}, lr {lr:g})")
    step = stepped.step
    if e.adversary is not None:
        row["byzantine_workers"] = e.adversary.f
    return {**row, "consensus_distance_sq": e.consensus_distance_sq(w.X), "comm_rounds": e.comm.rounds,
            "bytes_per_worker": e.comm.bytes_per_worker,
            "grad_norm_sq": step.grad_norm_sq, "grad_norm_sq_ema": step.grad_norm_sq_ema, **stepped.metrics}


def train(cfg: Config, run: Run | None = None, on_row: Callable[[dict], None] = lambda row: None,
          on_checkpoint: Callable[[dict], None] = lambda state: None, progress: bool = False,
          resume: dict | None = None, stop: Callable[[], bool] = lambda: False) -> dict:
    """Train (a prebuilt ``run`` of ``cfg``, or one built here) and return the summary.

    ``resume``: a checkpoint (:func:`gossamer.checkpoint.capture`) to continue from; the rows
    and the summary are then those of an uninterrupted run. A step's row reaches ``on_row``
    before a checkpoint of that step reaches ``on_checkpoint``. Checkpoints are taken every
    ``checkpoint_every`` epochs, at the last step, and when ``stop()`` (asked after every step,
    the same answer on every process) says so: then :class:`Interrupted` is raised.
    Raises :class:`Diverged` on NaN/inf, after the last good checkpoint was written."""
    start = time.perf_counter()
    run = run or build_run(cfg)
    w, e = run.workers, run.engine
    S, total = run.steps_per_epoch, cfg.epochs * run.steps_per_epoch
    every = max(1, round(cfg.checkpoint_every * S))
    state = Progress()
    run.schedule.start(e, w.X)
    if run.clean is not None:
        run.clean.run.schedule.start(run.clean.run.engine, run.clean.run.workers.X)
    first = restore(run, state, resume) if resume is not None else 0
    if first >= total:
        raise ConfigError(f"the run is finished ({first} of {total} steps); to train longer, resume with a "
                          f"larger epochs")
    bar = tqdm(total=total, initial=first, disable=None if progress else True,
               desc=f"{cfg.algorithm} n={cfg.workers}", leave=False)
    batches, row = Batches(run), {}
    for t in range(first, total):
        epoch, s = divmod(t, S)
        evaluating = s == S - 1 and ((epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs)
        measure = evaluating or (t + 1) % cfg.metrics_every == 0
        frozen = [] if run.faults is None else run.faults.begin_step(t, e, graph_of(run.schedule), _state_rows(run),
                                                                     run.optimizer)
        computes = computing(run, t)
        lr = lr_at(cfg, t, S)
        metrics = train_step(run, state, batches, t, lr, measure, computes)
        if run.clean is not None:
            run.clean.step(t, lr)
        for T, gone, rows in frozen:
            T[gone] = rows
        if measure:
            row = metrics
            state.last_loss = row.get("loss", state.last_loss)
            if run.faults is not None:
                row.update(run.faults.metrics(graph_of(run.schedule)))
        if evaluating:
            row.update(evaluate(run, t))
            if run.clean is not None:
                row.update(run.clean.distances(w.X, e.adversary.honest))
            row["consensus_distance_sq_per_layer"] = e.distance_sq_per_tensor(w.X, w.param_slots)
            bar.set_postfix({k: f"{v:.3f}" for k, v in row.items() if k == run.task.metric},
                            xi2=f"{row['consensus_distance_sq']:.2e}")
        _advance_clocks(run, state, computes)
        if evaluating and state.steps_to_target is None and reached_target(cfg, row):
            state.steps_to_target = t + 1
            state.sim_seconds_to_target = state.sim_seconds if run.clock is not None else None
        if measure:
            if run.clock is not None:
                row.update(sim_seconds=state.sim_seconds, **run.clock.utilization())
            if e.timed:
                row["comm_seconds"] = state.comm_seconds
            on_row(row)
        stopping = stop()
        if stopping or (t + 1) % every == 0 or t + 1 == total:
            _check_finite(w, e, t)
            on_checkpoint(capture(run, state, t + 1))
        bar.update()
        if stopping:
            bar.close()
            raise Interrupted(t + 1)
    bar.close()
    return summarize(run, state, row, start)


def _state_rows(run: Run) -> list[torch.Tensor]:
    """Every tensor with a row per worker but the local optimizer's: parameters, buffers and the
    schedule's state."""
    def rows(state) -> list[torch.Tensor]:
        found = state.get("rows", {})
        return [*found.values(), *(t for v in state.values() if isinstance(v, dict) for t in rows(v))]
    return [run.workers.X, run.workers.B, *rows(run.schedule.state_dict())]


def summarize(run: Run, progress: Progress, row: dict, start: float) -> dict:
    """summary.json of ``run`` after its last step: that step's metric row (an evaluation), the
    counters of the engine, the schedule and ``progress``; wall time since ``start``."""
    cfg = run.cfg
    return {
        **{k: v for k, v in row.items() if k.startswith(("test_", "val_")) or k == "sharpness"},
        **{f"final_{k}": row[k] for k in ("honest_distance_to_clean_sq", "mean_distance_to_clean_sq") if k in row},
        "final_consensus_distance_sq": row["consensus_distance_sq"],
        "final_loss": progress.last_loss,  # None: no worker computed at a measured step (DSpodFL's coins)
        **run.engine.comm.summary(),
        **run.schedule.counters(),
        "steps": cfg.epochs * run.steps_per_epoch,
        "parameters": run.workers.d,
        **({"bn_eval": cfg.bn_eval} if cfg.bn_eval else {}),
        **_time_summary(run, progress),
        **({"workers_alive_min": run.faults.alive_min} if run.faults is not None else {}),
        **(run.engine.adversary.summary() if run.engine.adversary is not None else {}),
        "wall_seconds": time.perf_counter() - start,
    }


def _advance_clocks(run: Run, state: Progress, computes: np.ndarray | None) -> None:
    """Add the step to the simulated time (the computations and operators the engine's ledger kept
    in it, evaluation included; ``computes``: the workers that computed) and to the communication
    time the engine measured."""
    entries, e = run.engine.comm.take(), run.engine
    if run.clock is not None:
        state.sim_seconds_metrics += sum(cost for _, cost in run.clock.measurement_seconds(entries))
        measured = e.m if computes is None else int(computes[e.rows.start : e.rows.stop].sum())
        state.sim_seconds_comm += run.clock.tick(entries, measured)
        state.sim_seconds = run.clock.now
    if run.engine.timed:
        algorithm, metrics = run.engine.take_comm_seconds()
        state.comm_seconds += algorithm
        state.comm_metrics_seconds += metrics


def _time_summary(run: Run, state: Progress) -> dict:
    """summary.json's time keys: none without a network section or a target."""
    cfg, out = run.cfg, {}
    if run.clock is not None:
        out.update(sim_seconds=state.sim_seconds, sim_seconds_comm=state.sim_seconds_comm,
                   sim_seconds_idle_fraction=run.clock.idle_fraction(), sim_seconds_metrics=state.sim_seconds_metrics,
                   **run.clock.utilization())
    if _has_target(cfg):
        out["steps_to_target"] = state.steps_to_target
        if run.clock is not None:
            out["sim_seconds_to_target"] = state.sim_seconds_to_target
    if run.engine.timed:
        out.update(comm_seconds=state.comm_seconds, comm_metrics_seconds=state.comm_metrics_seconds)
    return out


def _check_finite(w: WorkerMatrix, e: Engine, t: int) -> None:
    """All processes agree: any worker's NaN/inf stops every process."""
    if e.any_worker(~(torch.isfinite(w.X).all(1) & torch.isfinite(w.B).all(1))):
        raise Diverged(f"training diverged: parameters are NaN/inf after step {t + 1}")
