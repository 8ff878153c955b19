"""The engine-agnostic training loop: config in, metric rows and a summary out.

Nothing here knows about files or the command line: rows and checkpoints go to callbacks.
One step for all workers: per-worker batches → loss and gradients (rows of G) → the algorithm's
``on_gradients`` → the local optimizer → the algorithm's ``after_step`` → Ξ².
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import torch
from tqdm import tqdm

from .algorithms import build_algorithm
from .config import Config, ConfigError
from .consensus import Controller, Step, build_target
from .data import load_dataset
from .data.partition import dirichlet_shards, iid_epoch_indices, shard_epoch_indices, steps_per_epoch
from .engines.sim import SimEngine
from .models import build_model, no_decay_mask
from .optim import SGD, Adam, decay_vector
from .topology import build_topology, spectral_gap
from .workers import WorkerMatrix

MNIST1D_SEED = 42  # the standard MNIST-1D data set; the run's seed only draws models and batches


class Diverged(RuntimeError):
    """The loss or the parameters became NaN/inf; the last good state was already checkpointed."""


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
    engine: object
    data: object
    workers: WorkerMatrix
    optimizer: SGD | Adam
    opt_state: dict
    algorithm: object
    steps_per_epoch: int
    shards: list | None


def build_run(cfg: Config, engine=None) -> Run:
    """Build topology, data, model replicas, optimizer and schedule; ValueErrors name the option."""
    device = resolve_device(cfg.device)
    topology = build_topology(cfg.topology, cfg.workers, seed=cfg.seed if cfg.topology_seed is None else cfg.topology_seed)
    dtype = getattr(torch, cfg.dtype)
    if engine is None and cfg.engine == "dist":
        from .engines.dist import DistEngine

        engine = DistEngine(cfg.workers, cfg.dist_backend, cfg.dist_timeout, device)
    engine = engine or SimEngine(cfg.workers)
    data = load_dataset(cfg.dataset, cfg.num_samples, seed=MNIST1D_SEED)
    data = type(data)(data.x_train.to(device, dtype), data.y_train.to(device),
                      data.x_test.to(device, dtype), data.y_test.to(device), data.num_classes)
    steps = steps_per_epoch(len(data.y_train), cfg.workers, cfg.batch_size)
    shards = (dirichlet_shards(data.y_train.cpu(), cfg.workers, cfg.dirichlet_alpha, cfg.seed, min_size=cfg.batch_size)
              if cfg.partition == "dirichlet" else None)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, data.num_classes).to(dtype)
    workers = WorkerMatrix(model, len(engine.rows), device, backend=cfg.grad_backend)
    no_decay = [False] * len(workers.param_slots) if cfg.decay_norm_and_bias else no_decay_mask(model)
    optimizer = build_optimizer(cfg, decay_vector(workers.param_slots, no_decay, cfg.weight_decay, workers.X))
    opt_state = optimizer.init(workers.X)
    controller = None
    if cfg.consensus.target != "none":
        p = 1 - (1 - spectral_gap(topology)) ** 2
        controller = Controller(build_target(cfg, p, cfg.epochs * steps), cfg.consensus.max_extra_rounds,
                                cfg.consensus.on_budget)
    algorithm = build_algorithm(cfg, topology, [s.numel for s in workers.param_slots], list(opt_state.values()),
                                steps, controller)
    return Run(cfg, engine, data, workers, optimizer, opt_state, algorithm, steps, shards)


def build_optimizer(cfg: Config, decay: torch.Tensor | None):
    """The local optimizer: SGD (momentum, Nesterov), Adam or AdamW, with per-coordinate decay."""
    if cfg.optimizer == "sgd":
        return SGD(cfg.momentum, cfg.nesterov, decay)
    return Adam(tuple(cfg.adam_betas), cfg.adam_eps, decay, decoupled=cfg.optimizer == "adamw")


def epoch_indices(run: Run, epoch: int) -> torch.Tensor:
    """[steps, n, batch] training-set indices of every worker's batches in this epoch."""
    cfg = run.cfg
    if run.shards is None:
        idx = iid_epoch_indices(len(run.data.y_train), cfg.workers, cfg.batch_size, epoch, cfg.seed)
    else:
        idx = shard_epoch_indices(run.shards, run.steps_per_epoch, cfg.batch_size, epoch, cfg.seed)
    return idx.to(run.data.y_train.device)


def evaluate(run: Run) -> dict[str, float]:
    """Test accuracy of the averaged model x̄ (with averaged buffers) and mean over local models."""
    w, e, d = run.workers, run.engine, run.data
    x_bar, b_bar = e.mean_row(w.X), e.mean_row(w.B)
    local = torch.tensor([w.accuracy(w.X[i], w.B[i], d.x_test, d.y_test) for i in range(w.m)])
    return {"test_accuracy": w.accuracy(x_bar, b_bar, d.x_test, d.y_test),
            "test_accuracy_local_mean": e.mean_scalar(local)}


def train(cfg: Config, run: Run | None = None, on_row: Callable[[dict], None] = lambda row: None,
          on_checkpoint: Callable[[dict], None] = lambda state: None, progress: bool = False) -> dict:
    """Train (a prebuilt ``run`` of ``cfg``, or one built here) and return the summary.

    Raises :class:`Diverged` on NaN/inf, after the last good checkpoint was written."""
    start = time.perf_counter()
    run = run or build_run(cfg)
    w, e = run.workers, run.engine
    rows_here = torch.as_tensor(list(e.rows), device=w.X.device)
    S = run.steps_per_epoch
    bar = tqdm(total=cfg.epochs * S, disable=None if progress else True, desc=f"{cfg.algorithm} n={cfg.workers}", leave=False)
    row: dict = {}
    grad_norm_sq_ema, extra_rounds = None, 0
    run.algorithm.start(e, w.X)
    for epoch in range(cfg.epochs):
        idx = epoch_indices(run, epoch)[:, rows_here]
        for s in range(S):
            t = epoch * S + s
            lr = lr_at(cfg, t, S)
            losses = w.loss_and_grad(run.data.x_train[idx[s]], run.data.y_train[idx[s]])
            phi_sq = e.mean_scalar(w.G.square().sum(1))  # φ_t² = (1/n) Σ_i ‖g_i‖², before any averaging
            grad_norm_sq_ema = phi_sq if grad_norm_sq_ema is None else (
                cfg.consensus.ema * grad_norm_sq_ema + (1 - cfg.consensus.ema) * phi_sq)
            step = Step(t, lr, phi_sq, grad_norm_sq_ema)
            run.algorithm.on_gradients(e, w.X, w.G, step)
            run.optimizer.step(w.X, w.G, run.opt_state, lr)
            metrics = run.algorithm.after_step(e, w.X, step) or {}
            loss = e.mean_scalar(losses)
            if not math.isfinite(loss):
                raise Diverged(f"training diverged: loss is {loss} at step {t + 1} (epoch {epoch + 1}, lr {lr:g})")
            row = {"step": t + 1, "epoch": round((t + 1) / S, 6), "lr": lr, "loss": loss,
                   "consensus_distance_sq": e.consensus_distance_sq(w.X), "comm_rounds": e.comm.rounds,
                   "grad_norm_sq": phi_sq, "grad_norm_sq_ema": grad_norm_sq_ema, **metrics}
            extra_rounds += metrics.get("extra_gossip_rounds", 0)
            if s == S - 1 and ((epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs):
                _check_finite(w, e, t)
                row.update(evaluate(run))
                row["consensus_distance_sq_per_layer"] = e.distance_sq_per_tensor(w.X, w.param_slots)
                on_checkpoint({"step": t + 1, "X": w.X, "B": w.B, "optimizer": run.opt_state})
                bar.set_postfix(acc=f"{row['test_accuracy']:.3f}", xi2=f"{row['consensus_distance_sq']:.2e}")
            on_row(row)
            bar.update()
    bar.close()
    return {
        "test_accuracy": row["test_accuracy"],
        "test_accuracy_local_mean": row["test_accuracy_local_mean"],
        "final_consensus_distance_sq": row["consensus_distance_sq"],
        "final_loss": row["loss"],
        "comm_rounds": e.comm.rounds,
        "extra_gossip_rounds": extra_rounds,
        "messages_per_worker": e.comm.messages_per_worker,
        "bytes_per_worker": e.comm.bytes_per_worker,
        **{f"comm_rounds_{level}": r for level, r in sorted(e.comm.rounds_by_level.items())},
        **{f"bytes_per_worker_{level}": b for level, b in sorted(e.comm.bytes_by_level.items())},
        "steps": cfg.epochs * S,
        "parameters": w.d,
        "wall_seconds": time.perf_counter() - start,
    }


def _check_finite(w: WorkerMatrix, e, t: int) -> None:
    """All processes agree: any worker's NaN/inf stops every process."""
    bad = ~(torch.isfinite(w.X).all(1) & torch.isfinite(w.B).all(1))
    if e.mean_scalar(bad.to(w.X.dtype)) > 0:
        raise Diverged(f"training diverged: parameters are NaN/inf after step {t + 1}")
