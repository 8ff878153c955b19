"""Simulator benchmarks (docs/benchmarks.md): ratios measured side by side in one process.

    python benchmarks/simulator.py [--quick] [--only 1,...,10] [--json FILE] [--threads T] [--device D]

1. the simulator vs one process per worker (``gossamer train`` vs torchrun + ``engine=dist``),
   whole-process wall time including start-up (CPU processes, whatever ``--device``);
2. n workers with batch b vs one model with batch n·b (the same FLOPs): step-time ratio, for
   both gradient backends (``loop``, ``vmap``) — the MLP, the 1-D CNN, ResNet-20 with BatchNorm
   (b = 8 and 32) and the character Transformer;
3. gossip + Ξ² per step as a share of the step time at n = 64;
4. what ``auto`` picks against the faster backend of benchmark 2;
5. peak memory of ResNet-20 training at n = 64 vs n × (params + grads + momentum) + the
   activations the backend must hold, and the largest n that fits (extrapolated);
6. AD-PSGD's event-driven simulation against synchronous D-SGD on a ring (the 1-D CNN, n = 32):
   samples per second, with equal speeds and with stragglers;
7. thousands of workers (the MLP and the 1-D CNN at n = 256, 1,024, 4,096; gossip on a ring, b = 16,
   4 steps an epoch, MNIST-1D's 1,000 test samples): step time, an evaluation's time with
   ``eval_local: all`` and with ``eval_local: 16`` against an epoch's, and the resident memory;
8. what a robust aggregator costs (the 1-D CNN, n = 16 and 64, 1/8 of the workers Byzantine):
   All-Reduce's step with each rule against the plain mean, gossip's on a ring with clipping
   against plain gossip;
9. the ceiling of batching K runs as one simulator of K·n rows (issue 31): one step of K·n workers
   against K steps of n workers (the demo's 1-D CNN at n = 32, the character Transformer at n = 8;
   gossip on a ring and local steps, K = 5 and 20). Batching saves at most the difference: a
   ratio near 1 means a step's cost is proportional to its rows and stacking runs gains nothing.
10. the floor (issue 46): gossamer's step (gossip on a ring, ``grad_backend: auto``; metrics not due,
   and due) against one ``nn.Module`` step on the union batch (n·b samples, Nesterov SGD) — the
   1-D CNN at n = 8, 16, 32, 64 and the character Transformer at n = 8, b = 16, at 1 and 2 intra-op
   threads (set here, whatever ``--threads``); the step's split (forward, backward, the gossip
   round, Ξ², the metric scalars, the optimizer, the ledger, Python); and, as experiments that
   change float32 numbers, the CNN's vmapped loss written out with grouped convolutions or
   unfold + batched matmuls.

``--device cuda`` runs benchmarks 2-5, 9 and 10 on the GPU (timings synchronise the device; memory is
``torch.cuda.max_memory_allocated``) and checks that a step whose metrics are not due makes no
host synchronisation (``torch.cuda.set_sync_debug_mode("error")``).

The machine is shared and noisy: every comparison interleaves its contenders (A B A B ...) and
reports medians. Prints markdown; ``--json`` also saves the raw figures.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from gossamer.algorithms.gossip import gossip_state
from gossamer.config import load_config
from gossamer.data import Dataset
from gossamer.models import build_model
from gossamer.tasks import TASKS
from gossamer.train import Progress, Run, build_run, evaluate, train_step
from gossamer.workers import choose_backend

# model name -> (input shape of one sample, per-worker batch b); the transformer's samples are
# CONTEXT tokens of a VOCAB-character vocabulary (a language model), the others' 10 classes
MODELS = {"mlp": ((1, 40), 16), "cnn1d": ((1, 40), 16), "resnet20": ((3, 32, 32), 8), "transformer": ((64,), 16)}
VOCAB = 100
DEVICE = torch.device("cpu")  # set by --device


def _sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def _median_interleaved(fns: dict, reps: int, warmup: int = 1) -> dict[str, float]:
    """Median seconds per call of each function, calls interleaved A B A B ... (noise hits all alike)."""
    for _ in range(warmup):
        for f in fns.values():
            f()
    _sync()
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            _sync()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def _batch(name: str, n: int, b: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    shape = MODELS[name][0]
    if name == "transformer":
        x, y = torch.randint(0, VOCAB, (n, b, *shape), generator=g), torch.randint(0, VOCAB, (n, b, *shape), generator=g)
    else:
        x, y = torch.randn(n, b, *shape, generator=g), torch.randint(0, 10, (n, b), generator=g)
    return x.to(DEVICE), y.to(DEVICE)


def _data(name: str, x: torch.Tensor, y: torch.Tensor) -> Dataset:
    if name == "transformer":
        return Dataset(x, y, x[:1], y[:1], VOCAB, task="language-model")
    return Dataset(x, y, x[:1], y[:1], 10)


NO_SYNC = ("algorithm=local", "local_steps=1000000")  # local SGD that never averages: compute only


def build(name: str, n: int, b: int, backend: str = "auto", algorithm: tuple[str, ...] = NO_SYNC) -> Run:
    """A run of n workers of ``name`` on random data (one batch per worker), built as `gossamer
    train` builds it; by default with no communication (the compute and the local optimizer)."""
    x, y = _batch(name, n, b)
    cfg = load_config(None, [f"workers={n}", f"batch_size={b}", f"model={name}", f"grad_backend={backend}",
                             "momentum=0.9", "nesterov=true", "lr=0.01", "epochs=1", f"device={DEVICE.type}",
                             *algorithm])
    return build_run(cfg, data=_data(name, x.flatten(0, 1), y.flatten(0, 1)))


def sim_step(run: Run, measure: bool = False):
    """One training step of every worker (gradients, local Nesterov SGD and the schedule)."""
    x, y = _batch(run.cfg.model, run.cfg.workers, run.cfg.batch_size)
    progress, t = Progress(), [0]
    batches = SimpleNamespace(of=lambda counts, draw: (x, y))  # every step: the benchmark's one batch
    run.schedule.start(run.engine, run.workers.X)

    def step():
        train_step(run, progress, batches, t[0], 0.01, measure, computes=None)
        t[0] += 1
    step.run = run
    return step


def _one_model(name: str, n: int, b: int):
    """One model of ``name``, its torch.optim.SGD (Nesterov momentum), its loss and the union batch."""
    x, y = _batch(name, n, b)
    x, y = x.flatten(0, 1), y.flatten(0, 1)
    data = _data(name, x, y)
    torch.manual_seed(0)
    model = build_model(load_config(None, [f"model={name}"]), data).to(DEVICE).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
    return model, opt, TASKS[data.task].build().loss, x, y


def one_model_step(name: str, n: int, b: int):
    """One training step of one model with batch n·b (torch.optim.SGD, Nesterov momentum)."""
    model, opt, loss, x, y = _one_model(name, n, b)

    def step():
        opt.zero_grad(set_to_none=False)
        loss(model(x), y).backward()
        opt.step()
    return step


# -- 1. simulator vs one process per worker ------------------------------------------------------

def bench_processes(quick: bool) -> dict:
    n, epochs = 16, (1 if quick else 3)
    args = ["train", "--quiet", "--overwrite", "--set", "algorithm=gossip", "--set", "topology=ring",
            "--set", f"workers={n}", "--set", f"epochs={epochs}", "--set", "model=cnn1d"]
    out = {"workers": n, "epochs": epochs}
    with tempfile.TemporaryDirectory() as tmp:
        cmds = {
            "sim": [sys.executable, "-m", "gossamer", *args, "--out", f"{tmp}/sim"],
            "dist": [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
                     "-m", "gossamer", *args, "--out", f"{tmp}/dist", "--set", "engine=dist"],
        }
        env = {**os.environ, "OMP_NUM_THREADS": "1"}  # torchrun's default; 16 processes share 2 cores
        for k, cmd in cmds.items():
            t = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env if k == "dist" else None)
            out[f"{k}_seconds"] = time.perf_counter() - t
            out[f"{k}_ok"] = proc.returncode == 0
            if proc.returncode:
                out[f"{k}_error"] = (proc.stderr.strip().splitlines() or ["?"])[-1][:200]
            summary = Path(tmp, k, "summary.json")
            if summary.exists():
                out[f"{k}_test_accuracy"] = json.loads(summary.read_text())["test_accuracy"]
    if out["sim_ok"] and out["dist_ok"]:
        out["speedup"] = out["dist_seconds"] / out["sim_seconds"]
    return out


# -- 2. n workers vs one model, both gradient backends ---------------------------------------------

def one_model_cases(quick: bool) -> list[tuple[str, int, int]]:
    if quick:
        return [("mlp", 16, 16), ("cnn1d", 16, 16), ("resnet20", 4, 4), ("transformer", 4, 8)]
    return [("mlp", 16, 16), ("mlp", 64, 16), ("cnn1d", 16, 16), ("cnn1d", 64, 16), ("resnet20", 16, 8),
            ("resnet20", 16, 32), ("resnet20", 64, 8), ("resnet20", 64, 32), ("transformer", 16, 16)]


def bench_one_model(quick: bool) -> list[dict]:
    rows = []
    for name, n, b in one_model_cases(quick):
        heavy = name in ("resnet20", "transformer") and DEVICE.type == "cpu"
        runs = {k: build(name, n, b, backend=k) for k in ("loop", "vmap")}
        t = _median_interleaved({**{k: sim_step(run) for k, run in runs.items()}, "one": one_model_step(name, n, b)},
                                reps=1 if heavy else 10)
        auto = choose_backend(runs["loop"].workers.template, n, device=DEVICE)
        rows.append({"model": name, "workers": n, "batch": b, "loop_ms": 1e3 * t["loop"], "vmap_ms": 1e3 * t["vmap"],
                     "one_ms": 1e3 * t["one"], "loop_ratio": t["loop"] / t["one"], "vmap_ratio": t["vmap"] / t["one"],
                     "auto": auto, "auto_vs_fastest": t[auto] / min(t["loop"], t["vmap"])})
        _log(rows[-1])
    return rows


def host_syncs_in_a_step() -> str:
    """CUDA only: run a ResNet-20 gossip step whose metrics are not due with synchronising calls
    turned into errors; returns "none" or the first line of the error."""
    step = sim_step(build("resnet20", 8, 8, algorithm=("algorithm=gossip", "topology=ring")))
    step()  # warm-up: plans and caches are built once, outside the hot path
    _sync()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
        return "none"
    except RuntimeError as e:
        return str(e).strip().splitlines()[0][:200]
    finally:
        torch.cuda.set_sync_debug_mode("default")


# -- 3. communication overhead ---------------------------------------------------------------------

def bench_comm(quick: bool) -> list[dict]:
    n, rows = 64, []
    for name in ("cnn1d",) if quick else ("mlp", "cnn1d"):
        b = MODELS[name][1]
        compute = sim_step(build(name, n, b))
        w = compute.run.workers
        for topo in ("ring", "one-peer-exponential", "random-regular:4"):
            gossip = build(name, n, b, algorithm=("algorithm=gossip", f"topology={topo}"))
            engine, topology = gossip.engine, gossip_state(gossip.schedule).topology
            t_round = [0]

            def comm():
                engine.gossip_(w.X, topology.mixing(t_round[0]))
                engine.consensus_distance_sq(w.X)
                t_round[0] += 1
            t = _median_interleaved({"compute": compute, "comm": comm}, reps=10 if quick else 15)
            rows.append({"model": name, "topology": topo, "workers": n, "compute_ms": 1e3 * t["compute"],
                         "comm_ms": 1e3 * t["comm"], "share": t["comm"] / (t["compute"] + t["comm"])})
            _log(rows[-1])
    return rows


# -- 5. memory and scale ---------------------------------------------------------------------------

ASYNC_CASES = {"D-SGD (gossip), ring": ("algorithm=gossip", "topology=ring"),
               "AD-PSGD, ring, equal speeds": ("algorithm=ad-psgd", "topology=ring"),
               "AD-PSGD, ring, 10 % at 4×, jitter σ = 0.5": (
                   "algorithm=ad-psgd", "topology=ring", "network=ethernet-10g", "compute_ms=5",
                   "slow_workers=0.1@4", "compute_jitter=lognormal:0.5")}


def bench_async(quick: bool) -> list[dict]:
    """Samples per second (n·b per step: n gradient evaluations) of each of ASYNC_CASES."""
    n, b = (16 if quick else 32), 16
    steps = {name: sim_step(build("cnn1d", n, b, algorithm=overrides)) for name, overrides in ASYNC_CASES.items()}
    seconds = _median_interleaved(steps, reps=5 if quick else 20, warmup=2)
    base = seconds[next(iter(ASYNC_CASES))]
    rows = [{"case": name, "workers": n, "batch": b, "step_ms": 1e3 * s, "samples_per_second": n * b / s,
             "vs_dsgd": base / s, "gradient_calls": steps[name].run.schedule.calls
             if hasattr(steps[name].run.schedule, "calls") else None} for name, s in seconds.items()]
    for r in rows:
        _log(r)
    return rows


BYZANTINE_ATTACK = ("byzantine.fraction=0.125", "byzantine.attack=sign-flip")
BYZANTINE_CASES = {"All-Reduce": (("algorithm=allreduce",), {
                       "mean, no Byzantine worker": (), "mean": BYZANTINE_ATTACK,
                       **{rule: (*BYZANTINE_ATTACK, f"byzantine.aggregator={rule}", *keys) for rule, keys in (
                           ("median", ()), ("trimmed-mean", ()), ("krum", ()),
                           ("centered-clip", ("byzantine.clip=3",)))}}),
                   "gossip, ring": (("algorithm=gossip", "topology=ring"), {
                       "mean, no Byzantine worker": (), "mean": BYZANTINE_ATTACK,
                       "clipped-gossip": (*BYZANTINE_ATTACK, "byzantine.aggregator=clipped-gossip",
                                          "byzantine.clip=0.1"),
                       "self-centered-clip": (*BYZANTINE_ATTACK, "byzantine.aggregator=self-centered-clip")})}


def bench_byzantine(quick: bool) -> list[dict]:
    """Benchmark 8: a step's time with each robust rule against the same algorithm's plain step."""
    rows = []
    for n in (16,) if quick else (16, 64):
        for algorithm, (overrides, rules) in BYZANTINE_CASES.items():
            steps = {rule: sim_step(build("cnn1d", n, 16, algorithm=(*overrides, *keys)))
                     for rule, keys in rules.items()}
            seconds = _median_interleaved(steps, reps=5 if quick else 15, warmup=2)
            base = seconds["mean, no Byzantine worker"]
            for rule, t in seconds.items():
                rows.append({"algorithm": algorithm, "workers": n, "rule": rule, "step_ms": 1e3 * t,
                             "vs_plain": t / base})
                _log(rows[-1])
    return rows


BATCH_CASES = {"cnn1d": 32, "transformer": 8}  # model -> the n of one run (the demo's; the Transformer's)
BATCH_ALGORITHMS = {"gossip, ring": ("algorithm=gossip", "topology=ring"), "local steps": NO_SYNC}


def bench_batching(quick: bool) -> list[dict]:
    """Benchmark 9: one step of K·n rows against K steps of n rows (interleaved medians)."""
    rows = []
    for name, n in BATCH_CASES.items():
        for algorithm, keys in BATCH_ALGORITHMS.items():
            one = sim_step(build(name, n, MODELS[name][1], algorithm=keys))
            for K in (5,) if quick else (5, 20):
                size = f"num_samples={2 * K * n * MODELS[name][1]}"  # the config's check of each worker's share
                stacked = sim_step(build(name, K * n, MODELS[name][1], algorithm=(*keys, size)))
                seconds = _median_interleaved({"one": one, "stacked": stacked}, reps=3 if quick else 9, warmup=2)
                rows.append({"model": name, "workers": n, "runs": K, "algorithm": algorithm,
                             "one_ms": 1e3 * seconds["one"], "stacked_ms": 1e3 * seconds["stacked"],
                             "ceiling": K * seconds["one"] / seconds["stacked"]})
                _log(rows[-1])
    return rows


# -- 10. the floor: n workers against one model on the union batch ----------------------------------

FLOOR_CASES = [("cnn1d", 8), ("cnn1d", 16), ("cnn1d", 32), ("cnn1d", 64), ("transformer", 8)]
GOSSIP_RING = ("algorithm=gossip", "topology=ring")


class Split:
    """Exclusive wall time by piece: a piece's time less that of the pieces called inside it."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._open: list[list] = []  # [start, seconds of the pieces inside]

    def enter(self) -> None:
        self._open.append([time.perf_counter(), 0.0])

    def leave(self, label: str) -> None:
        _sync()
        start, inner = self._open.pop()
        elapsed = time.perf_counter() - start
        self.seconds[label] = self.seconds.get(label, 0.0) + elapsed - inner
        if self._open:
            self._open[-1][1] += elapsed

    def wrap(self, owner, attr: str, label: str) -> None:
        """Time ``owner.attr`` (an instance attribute shadows the method) as ``label``."""
        fn = getattr(owner, attr)

        def timed(*args, **kwargs):
            self.enter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.leave(label)
        setattr(owner, attr, timed)


SPLIT = ("forward", "backward", "mixing", "Ξ²", "scalars", "optimizer", "ledger", "other")


def step_split(run: Run, measure: bool, reps: int) -> dict[str, float]:
    """Milliseconds a step of ``run`` spends in each piece of :data:`SPLIT` (means over ``reps``
    steps after two): forward (the vmapped forward with the loss, or each replica's forward),
    backward (the rest of the gradient call: zeroing G, the loop's losses, autograd), the gossip
    round, Ξ² and the metric scalars (loss, φ², Θ²: steps whose metrics are due), the local
    optimizer, the ledger's records (no clock without a network section) and the rest (Python:
    the schedule, the step's bookkeeping)."""
    w, e, split = run.workers, run.engine, Split()
    if w.backend == "vmap":
        split.wrap(w, "_vmapped_loss", "forward")
    else:
        for replica in w.replicas:
            replica.register_forward_pre_hook(lambda *_: split.enter())
            replica.register_forward_hook(lambda *_: split.leave("forward"))
    split.wrap(w, "loss_and_grad", "backward")
    split.wrap(e, "gossip_", "mixing")
    split.wrap(e, "consensus_distance_sq", "Ξ²")
    split.wrap(e, "mean_scalar", "scalars")
    split.wrap(run.optimizer, "step", "optimizer")
    split.wrap(e.comm, "record", "ledger")
    split.wrap(e.comm, "compute", "ledger")
    step = sim_step(run, measure=measure)
    for _ in range(2):
        step()
    split.seconds.clear()
    _sync()
    t = time.perf_counter()
    for _ in range(reps):
        step()
    _sync()
    total = time.perf_counter() - t
    out = {k: 1e3 * split.seconds.get(k, 0.0) / reps for k in SPLIT[:-1]}
    out["other"] = 1e3 * total / reps - sum(out.values())
    out["step"] = 1e3 * total / reps
    return out


def one_model_split(name: str, n: int, b: int, reps: int) -> dict[str, float]:
    """Milliseconds of :func:`one_model_step`'s pieces: forward (with the loss, after zero_grad),
    backward, optimizer."""
    model, opt, loss_fn, x, y = _one_model(name, n, b)
    seconds = [0.0, 0.0, 0.0]
    for k in range(2 + reps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(model(x), y)
        _sync()
        t1 = time.perf_counter()
        loss.backward()
        _sync()
        t2 = time.perf_counter()
        opt.step()
        _sync()
        t3 = time.perf_counter()
        if k >= 2:
            for i, dt in enumerate((t1 - t0, t2 - t1, t3 - t2)):
                seconds[i] += dt
    out = dict(zip(("forward", "backward", "optimizer"), (1e3 * s / reps for s in seconds)))
    out["step"] = sum(out.values())
    return out


def batched_cnn_loss(template: torch.nn.Module, convs: str):
    """An experiment, not gossamer's path: the vmapped loss of a Sequential of Conv1d, ReLU,
    Flatten and Linear written out by hand, each worker's convolution as ``convs``: ``bmm`` (the
    input unfolded into [m, b·L_out, C_in·k], one batched matmul with the m weights, channels
    last) or ``grouped`` (one convolution with groups = m on [b, m·C_in, L], as vmap's batching
    rule runs it, without vmap). Same function, other kernels: float32 gradients differ in the
    last bits from vmap's (see :func:`bench_floor`)."""
    layers = list(template.named_children())
    for _, module in layers:
        if not isinstance(module, (torch.nn.Conv1d, torch.nn.ReLU, torch.nn.Flatten, torch.nn.Linear)):
            raise TypeError(f"batched_cnn_loss: no batched form of {type(module).__name__}")

    def loss(params, buffers, x, y):
        m, b = x.shape[:2]
        h = x.transpose(2, 3)  # [m, b, L, C]
        for name, module in layers:
            if isinstance(module, torch.nn.Conv1d):
                weight, bias = params[f"{name}.weight"], params[f"{name}.bias"]
                c_out, c_in, k = weight.shape[1:]
                (pad,), (stride,) = module.padding, module.stride
                if convs == "bmm":
                    u = F.pad(h, (0, 0, pad, pad)).unfold(2, k, stride)  # [m, b, L_out, C_in, k]
                    length = u.shape[2]
                    h = torch.baddbmm(bias.unsqueeze(1), u.reshape(m, b * length, c_in * k),
                                      weight.reshape(m, c_out, c_in * k).transpose(1, 2)).view(m, b, length, c_out)
                else:
                    grouped = F.conv1d(h.permute(1, 0, 3, 2).reshape(b, m * c_in, -1),
                                       weight.reshape(m * c_out, c_in, k), bias.reshape(-1), stride=stride,
                                       padding=pad, groups=m)
                    h = grouped.view(b, m, c_out, -1).permute(1, 0, 3, 2)
            elif isinstance(module, torch.nn.ReLU):
                h = h.relu()
            elif isinstance(module, torch.nn.Flatten):
                h = h.transpose(2, 3).reshape(m, b, -1)  # channel-major, as nn.Flatten
            else:
                h = torch.baddbmm(params[f"{name}.bias"].unsqueeze(1), h, params[f"{name}.weight"].transpose(1, 2))
        return F.cross_entropy(h.flatten(0, 1), y.flatten(), reduction="none").view(m, b).mean(1)
    return loss


def _experiment_step(n: int, b: int, convs: str):
    run = build("cnn1d", n, b, backend="vmap", algorithm=GOSSIP_RING)
    run.workers._vmapped_loss = batched_cnn_loss(run.workers.template, convs)
    return sim_step(run)


def _gradient_change(n: int, b: int, convs: str) -> float:
    """max |G_experiment − G_vmap| on one batch (0.0: bit-identical)."""
    x, y = _batch("cnn1d", n, b)
    ref, alt = build("cnn1d", n, b, backend="vmap"), build("cnn1d", n, b, backend="vmap")
    alt.workers._vmapped_loss = batched_cnn_loss(alt.workers.template, convs)
    ref.workers.loss_and_grad(x, y)
    alt.workers.loss_and_grad(x, y)
    return (ref.workers.G - alt.workers.G).abs().max().item()


EXPERIMENTS = ("grouped", "bmm")


def bench_floor(quick: bool, smoke: bool = False) -> dict:
    """Benchmark 10: gossamer's step (gossip on a ring, grad_backend auto; metrics not due, and
    due) against one model's step on the union batch, interleaved, at 1 and 2 intra-op threads
    (CPU; once on CUDA); the step's split; the hand-written batched CNN forms (experiments).
    ``smoke`` (benchmarks/gpu_check.py's rehearsal): n = 2 and 4, b = 4, one thread count."""
    cases = [("cnn1d", 8), ("cnn1d", 16), ("transformer", 8)] if quick else FLOOR_CASES
    b, before, rows, splits, experiments = 16, torch.get_num_threads(), [], [], []
    if smoke:
        cases, b, quick = [("cnn1d", 2), ("cnn1d", 4), ("transformer", 2)], 4, True
    for threads in (1, 2) if DEVICE.type == "cpu" and not smoke else (1,) if DEVICE.type == "cpu" else (before,):
        torch.set_num_threads(threads)
        for name, n in cases:
            heavy = name == "transformer" and DEVICE.type == "cpu"
            run = build(name, n, b, algorithm=GOSSIP_RING)
            steps = {"sim": sim_step(run),
                     "sim_metrics": sim_step(build(name, n, b, algorithm=GOSSIP_RING), measure=True),
                     "one": one_model_step(name, n, b)}
            if name == "cnn1d":
                steps.update({k: _experiment_step(n, b, k) for k in EXPERIMENTS})
            reps = (2 if quick else 7 if threads == 1 else 3) if heavy else (5 if quick else 25 if threads == 1 else 9)
            t = _median_interleaved(steps, reps=reps, warmup=2)
            rows.append({"model": name, "workers": n, "batch": b, "threads": threads, "backend": run.workers.backend,
                         **{f"{k}_ms": 1e3 * v for k, v in t.items()}, "ratio": t["sim"] / t["one"],
                         "ratio_metrics": t["sim_metrics"] / t["one"],
                         **{f"{k}_ratio": t[k] / t["one"] for k in EXPERIMENTS if k in t}})
            _log(rows[-1])
            if threads == 1 or DEVICE.type != "cpu":
                split_reps = (2 if quick else 5) if heavy else (10 if quick else 30)
                for measure in (False, True):
                    splits.append({"model": name, "workers": n, "threads": threads, "metrics": measure,
                                   **step_split(build(name, n, b, algorithm=GOSSIP_RING), measure, split_reps)})
                    _log(splits[-1])
                splits.append({"model": name, "workers": n, "threads": threads, "one": True,
                               **one_model_split(name, n, b, split_reps)})
                _log(splits[-1])
                if name == "cnn1d":
                    experiments.append({"workers": n, **{f"{k}_max_grad_change": _gradient_change(n, b, k)
                                                         for k in EXPERIMENTS}})
                    _log(experiments[-1])
    torch.set_num_threads(before)
    return {"rows": rows, "splits": splits, "experiments": experiments}


def bench_scale(quick: bool) -> list[dict]:
    """Benchmark 7: one epoch's steps against an evaluation of x̄ and the local models."""
    rows, test = [], 1000
    for name in ("mlp", "cnn1d"):
        for n in ((256, 1024) if quick else (256, 1024, 4096)):
            x, y = _batch(name, 4 * n, MODELS[name][1], seed=1)  # 4 steps an epoch
            xt, yt = _batch(name, test, 1, seed=2)
            data = Dataset(x.flatten(0, 1), y.flatten(0, 1), xt.flatten(0, 1), yt.flatten(0, 1), 10)
            row = {"model": name, "workers": n}
            for local in ("all", "16"):
                cfg = load_config(None, [f"workers={n}", f"batch_size={MODELS[name][1]}", f"model={name}",
                                         "algorithm=gossip", "topology=ring", "epochs=1", f"device={DEVICE.type}",
                                         f"eval_local={local}", f"num_samples={5 * n * MODELS[name][1]}"])
                run = build_run(cfg, data=data)
                step = sim_step(run)
                seconds = _median_interleaved({"step": step}, reps=2 if quick else 3)["step"]
                t = time.perf_counter()
                evaluate(run, 0)
                _sync()
                row.update({"step_seconds": seconds, "epoch_seconds": run.steps_per_epoch * seconds,
                            f"eval_{local}_seconds": time.perf_counter() - t})
            row["rss_bytes"] = 1024 * _status_kib("VmRSS") if _can_probe_memory() else None
            rows.append(row)
            _log(row)
    return rows


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _can_probe_memory() -> bool:
    """On CPU, benchmark 5 reads and resets the peak RSS through Linux's /proc (VmHWM, clear_refs)."""
    if DEVICE.type == "cuda":
        return True
    return os.access("/proc/self/clear_refs", os.W_OK) and Path("/proc/self/status").exists()


def _activation_bytes(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """Bytes of the tensors autograd saves for backward in one forward (one set of activations)."""
    storages = {}

    def pack(t):
        if isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter):
            s = t.untyped_storage()
            storages[s.data_ptr()] = s  # held, so that no address is reused during the forward
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.cross_entropy(model(x), y)
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(s.nbytes() for k, s in storages.items() if k not in param_ptrs)


def memory_probe(n: int, b: int, steps: int) -> dict:
    """Run in a fresh process (CPU) or after resetting the peak (CUDA): peak memory of `steps`
    ResNet-20 gossip steps of n workers above the memory in use before the run existed (the
    interpreter, torch and the data are not counted)."""
    x, y = _batch("resnet20", 1, b)
    warm = build_model(load_config(None, ["model=resnet20"]), _data("resnet20", x[0], y[0])).to(DEVICE)
    act = _activation_bytes(warm, x[0].clone(), y[0])
    F.cross_entropy(warm(x[0]), y[0]).backward()  # loads the kernels before the baseline
    del warm
    if DEVICE.type == "cuda":
        _sync()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # give the warm-up's freed heap back: it must not hide the peak
        base = _status_kib("VmRSS") * 1024
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
    step = sim_step(build("resnet20", n, b, algorithm=("algorithm=gossip", "topology=ring")))
    engine, X = step.run.engine, step.run.workers.X
    t = time.perf_counter()
    for _ in range(steps):
        step()  # gradients, local step, one gossip round
        engine.consensus_distance_sq(X)
    _sync()
    seconds = (time.perf_counter() - t) / steps
    w = step.run.workers
    peak = (torch.cuda.max_memory_allocated() if DEVICE.type == "cuda" else _status_kib("VmHWM") * 1024) - base
    held = act * (n if w.backend == "vmap" else 1)  # vmap holds every worker's activations at once
    return {"workers": n, "batch": b, "d": w.d, "d_buffers": w.d_buffers, "peak_bytes": peak,
            "state_bytes": n * 3 * w.d * w.X.element_size(), "activation_bytes": held,
            "step_seconds": seconds, "backend": w.backend}


def bench_memory(quick: bool) -> dict:
    b = MODELS["resnet20"][1]
    sizes = (4, 16) if quick else (16, 64)
    probes = []
    for n in sizes:
        if DEVICE.type == "cuda":
            probes.append(memory_probe(n, b, steps=2))
        else:
            cmd = [sys.executable, __file__, "--memory-probe", str(n), str(b)]
            probes.append(json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout))
        _log(probes[-1])
    ref = probes[-1]
    minimum = ref["state_bytes"] + ref["activation_bytes"]
    (n1, p1), (n2, p2) = [(p["workers"], p["peak_bytes"]) for p in probes[-2:]]
    per_worker = (p2 - p1) / (n2 - n1)
    fixed = p2 - per_worker * n2
    if DEVICE.type == "cuda":
        total, kept = torch.cuda.get_device_properties(DEVICE).total_memory, 2 * 2**30  # CUDA context, allocator
    else:
        total, kept = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), 3.5 * 2**30  # OS, python, torch, data
    n_max = int((total - kept - fixed) / per_worker)
    step_per_worker = probes[-1]["step_seconds"] / probes[-1]["workers"]
    return {"probes": probes, "reference_workers": ref["workers"], "minimum_bytes": minimum,
            "peak_vs_minimum": ref["peak_bytes"] / minimum, "per_worker_bytes": per_worker,
            "fixed_bytes": fixed, "memory_bytes": total, "kept_bytes": kept, "n_max": n_max,
            "n_max_step_seconds": n_max * step_per_worker}


# -- report ------------------------------------------------------------------------------------------

def _log(row) -> None:
    print("  ..", json.dumps(row, default=str), file=sys.stderr, flush=True)


def _mib(x: float) -> str:
    return f"{x / 2**20:.1f} MiB"


def _table(title: str, intro: str, head: list[str], rows: list[list]) -> list[str]:
    """A report section: its title, a sentence, and a Markdown table."""
    return [f"## {title}", "", intro, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(map(str, row)) + " |" for row in rows), ""]


def report(res: dict) -> str:
    out = []
    if "processes" in res:
        p = res["processes"]
        out += ["## 1. Simulator vs one process per worker", "",
                f"n = {p['workers']}, MNIST-1D CNN, gossip on a ring, {p['epochs']} epochs, whole process "
                "(start-up included). Target: simulator ≥ 5× faster.", "",
                "| run | wall time | test acc |", "|---|---|---|"]
        for k, label in (("sim", "`gossamer train` (sim, 1 process)"), ("dist", "torchrun, 16 gloo processes (dist)")):
            wall = f"{p[k + '_seconds']:.1f} s" if p[k + "_ok"] else f"failed: {p.get(k + '_error')}"
            out.append(f"| {label} | {wall} | {p.get(k + '_test_accuracy', '—')} |")
        out += ["", f"**Speed-up: {p['speedup']:.1f}×**" if "speedup" in p else "**Speed-up: not measured (a run failed)**", ""]
    if "one_model" in res:
        out += ["## 2. n workers with batch b vs one model with batch n·b", "",
                "Step = forward, backward and Nesterov-momentum SGD, both gradient backends. Target: ratio ≤ 1.0 "
                "(the character Transformer: ≤ 1.5).", "",
                "| model | n | b | loop | vmap | one model (batch n·b) | loop / one | vmap / one |",
                "|---|---|---|---|---|---|---|---|"]
        out += [f"| {r['model']} | {r['workers']} | {r['batch']} | {r['loop_ms']:.1f} ms | {r['vmap_ms']:.1f} ms | "
                f"{r['one_ms']:.1f} ms | {r['loop_ratio']:.2f} | {r['vmap_ratio']:.2f} |" for r in res["one_model"]]
        out.append("")
    if "host_syncs" in res:
        out += [f"Host synchronisations in a ResNet-20 gossip step whose metrics are not due (CUDA sync debug "
                f"mode): **{res['host_syncs']}**.", ""]
    if "comm" in res:
        out += ["## 3. Gossip + Ξ² as a share of the step time (n = 64)", "", "Target ≤ 5 %.", "",
                "| model | topology | compute step | gossip + Ξ² | share |", "|---|---|---|---|---|"]
        out += [f"| {r['model']} | {r['topology']} | {r['compute_ms']:.2f} ms | {r['comm_ms']:.3f} ms | "
                f"{100 * r['share']:.1f} % |" for r in res["comm"]]
        out.append("")
    if "one_model" in res and 4 in res["only"]:
        out += ["## 4. What `auto` picks", "", "Target: within 5 % of the faster backend of benchmark 2.", "",
                "| model | n | b | auto picks | auto / fastest |", "|---|---|---|---|---|"]
        out += [f"| {r['model']} | {r['workers']} | {r['batch']} | {r['auto']} | {r['auto_vs_fastest']:.2f} |"
                for r in res["one_model"]]
        out.append("")
    if "memory" in res:
        m = res["memory"]
        out += [f"## 5. Memory and scale (ResNet-20, gossip on a ring, {m['probes'][-1]['backend']} backend)", "",
                "Peak memory (RSS on CPU, allocated on CUDA) above that before the run was built. Minimum = "
                "n × (params + grads + momentum) × 4 B + the saved activations the backend holds at once (one "
                "worker's for the loop, all n workers' for vmap).", "",
                "| n | b | peak | n × (params + grads + momentum) | activations held | peak / minimum | step |",
                "|---|---|---|---|---|---|---|"]
        for p in m["probes"]:
            mn = p["state_bytes"] + p["activation_bytes"]
            out.append(f"| {p['workers']} | {p['batch']} | {_mib(p['peak_bytes'])} | {_mib(p['state_bytes'])} | "
                       f"{_mib(p['activation_bytes'])} | {p['peak_bytes'] / mn:.2f} | {p['step_seconds']:.1f} s |")
        out += ["", f"**Peak / minimum at n = {m['reference_workers']}: {m['peak_vs_minimum']:.2f}** (target ≤ 1.5).", "",
                f"Per worker: {_mib(m['per_worker_bytes'])} (slope between the two largest probes); fixed: "
                f"{_mib(m['fixed_bytes'])}; memory {m['memory_bytes'] / 2**30:.1f} GiB, of which "
                f"{m['kept_bytes'] / 2**30:.1f} GiB kept for the system, the interpreter, torch and the data. "
                f"**Largest n (extrapolated): ≈ {m['n_max']}**, at "
                f"≈ {m['n_max_step_seconds'] / 60:.0f} min per step on this machine (step time linear in n).", ""]
    if "scale" in res:
        out += ["## 7. Thousands of workers", "",
                "Gossip on a ring, b = 16, 4 steps an epoch, 1,000 test samples. An evaluation tests x̄ and the "
                "local models (`eval_local`: all of them, or 16 drawn from the seed). Target: at n = 4,096 "
                "(the 1-D CNN) an evaluation costs less than an epoch.", "",
                "| model | n | step | epoch | eval, all local | eval, 16 local | eval 16 / epoch | resident memory |",
                "|---|---|---|---|---|---|---|---|"]
        out += [f"| {r['model']} | {r['workers']:,} | {r['step_seconds']:.2f} s | {r['epoch_seconds']:.1f} s | "
                f"{r['eval_all_seconds']:.1f} s | {r['eval_16_seconds']:.2f} s | "
                f"{r['eval_16_seconds'] / r['epoch_seconds']:.2f} | "
                f"{_mib(r['rss_bytes']) if r['rss_bytes'] else '—'} |" for r in res["scale"]]
        out.append("")
    if "byzantine" in res:
        out += _table("8. What a robust aggregator costs",
                      "The 1-D CNN, b = 16, 1/8 of the workers Byzantine (sign-flip); a step's time against the same "
                      "algorithm with no byzantine section.", ["algorithm", "n", "rule", "step", "× plain"],
                      [[r["algorithm"], r["workers"], r["rule"], f"{r['step_ms']:.1f} ms", f"{r['vs_plain']:.2f}"]
                       for r in res["byzantine"]])
    if "batching" in res:
        out += _table("9. The ceiling of batched runs",
                      "One step of K·n workers (one simulator) against K steps of n workers (K runs one after "
                      "another): the most batching K runs could save in their steps. b = 16.",
                      ["model", "n", "algorithm", "K", "one run's step", "K·n rows' step", "K × one / stacked"],
                      [[r["model"], r["workers"], r["algorithm"], r["runs"], f"{r['one_ms']:.1f} ms",
                        f"{r['stacked_ms']:.1f} ms", f"{r['ceiling']:.2f}×"] for r in res["batching"]])
    if "floor" in res:
        out += _floor_report(res["floor"])
    if "async" in res:
        out += _table("6. AD-PSGD's events against synchronous D-SGD",
                      "The 1-D CNN, b = 16, a ring; a step is n gradient evaluations in both. Target: AD-PSGD ≥ 0.5× "
                      "the samples per second of D-SGD at n = 32.",
                      ["case", "n", "step", "samples/s", "vs D-SGD", "batched gradient calls"],
                      [[r["case"], r["workers"], f"{r['step_ms']:.1f} ms", f"{r['samples_per_second']:,.0f}",
                        f"{r['vs_dsgd']:.2f}", r["gradient_calls"] if r["gradient_calls"] is not None else "—"]
                       for r in res["async"]])
    return "\n".join(out)


def _floor_report(f: dict) -> list[str]:
    ms = (lambda v: f"{v:.2f}" if v < 10 else f"{v:.1f}")
    out = _table("10. The floor: one step of n workers against one model on the union batch",
                 "b = 16 a worker; gossamer's step: gossip on a ring, `grad_backend: auto`, metrics not due "
                 "(and due: Ξ², loss, φ² and Θ² measured, as `metrics_every: 1` does every step); one model: one "
                 "`nn.Module` of the same model on the n·b samples, Nesterov SGD. Interleaved medians. Target: "
                 "gossamer / one ≤ 1.25. The last two columns are experiments (float32 numbers change in the last "
                 "bits): the CNN's loss written out by hand with each worker's convolution as one grouped "
                 "convolution without vmap, or as unfold + one batched matmul.",
                 ["model", "n", "threads", "backend", "gossamer", "metrics due", "one model", "gossamer / one",
                  "metrics due / one", "grouped, no vmap / one", "unfold + bmm / one"],
                 [[r["model"], r["workers"], r["threads"], r["backend"], f"{ms(r['sim_ms'])} ms",
                   f"{ms(r['sim_metrics_ms'])} ms", f"{ms(r['one_ms'])} ms", f"**{r['ratio']:.2f}**",
                   f"{r['ratio_metrics']:.2f}", *(f"{r[k + '_ratio']:.2f}" if k + "_ratio" in r else "—"
                                                  for k in EXPERIMENTS)] for r in f["rows"]])
    out += _table("10. The step's split",
                  "Milliseconds a step (means; each piece timed exclusive of the pieces inside it). forward: the "
                  "vmapped forward with the loss (vmap) or the replicas' forwards (loop); backward: the rest of "
                  "the gradient call; other: Python (the schedule, train_step's bookkeeping) and, with metrics "
                  "due, the ‖g_i‖² of φ².",
                  ["model", "n", "threads", "step", "total", *SPLIT],
                  [[s["model"], s["workers"], s["threads"],
                    "one model" if s.get("one") else ("metrics due" if s["metrics"] else "metrics not due"),
                    *(f"{s[k]:.2f}" if k in s else "—" for k in ("step", *SPLIT))] for s in f["splits"]])
    if f["experiments"]:
        out += _table("10. The experiments' gradients", "max |G − G_vmap| on one batch (float32).",
                      ["n", *(f"{k}: max change" for k in EXPERIMENTS)],
                      [[e["workers"], *(f"{e[k + '_max_grad_change']:.1e}" for k in EXPERIMENTS)]
                       for e in f["experiments"]])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/simulator.py", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller cases, fewer repetitions (~2 min)")
    ap.add_argument("--only", default="1,2,3,4,5,6,7,8,9,10", help="comma-separated benchmark numbers")
    ap.add_argument("--json", type=Path, help="also save the raw figures here")
    ap.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice). On a machine "
                    "whose cores other processes also use, 1 avoids OpenMP threads waiting on descheduled peers")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where benchmarks 2-5, 9 and 10 run")
    ap.add_argument("--memory-probe", nargs=2, type=int, metavar=("N", "B"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    global DEVICE
    DEVICE = torch.device(a.device)
    if a.threads:
        torch.set_num_threads(a.threads)
        os.environ["OMP_NUM_THREADS"] = str(a.threads)  # for the subprocesses (benchmarks 1 and 5)
    if a.memory_probe:
        print(json.dumps(memory_probe(*a.memory_probe, steps=1)))
        return 0
    only = {int(s) for s in a.only.split(",")}
    start = time.perf_counter()
    gpu = f", {torch.cuda.get_device_name(DEVICE)}" if DEVICE.type == "cuda" else ""
    res: dict = {"command": "python benchmarks/simulator.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                 "machine": f"{os.cpu_count()} CPU cores, {platform.processor() or platform.machine()}{gpu}, "
                            f"torch {torch.__version__}, {torch.get_num_threads()} threads", "only": sorted(only)}
    if 1 in only:
        res["processes"] = bench_processes(a.quick)
    if 2 in only or 4 in only:
        res["one_model"] = bench_one_model(a.quick)
        if DEVICE.type == "cuda":
            res["host_syncs"] = host_syncs_in_a_step()
    if 3 in only:
        res["comm"] = bench_comm(a.quick)
    if 6 in only:
        res["async"] = bench_async(a.quick)
    if 7 in only:
        res["scale"] = bench_scale(a.quick)
    if 8 in only:
        res["byzantine"] = bench_byzantine(a.quick)
    if 9 in only:
        res["batching"] = bench_batching(a.quick)
    if 10 in only:
        res["floor"] = bench_floor(a.quick)
    if 5 in only and _can_probe_memory():
        res["memory"] = bench_memory(a.quick)
    elif 5 in only:
        print("benchmark 5 skipped: it reads the peak RSS from Linux's /proc", file=sys.stderr)
    res["seconds"] = time.perf_counter() - start
    print(f"`{res['command']}` — {res['machine']}; {res['seconds']:.0f} s\n")
    print(report(res))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
