"""What :func:`gossamer.train.build_run` refuses before it builds or trains: a run that cannot
fit in the memory free on its device (the worker matrix, the largest activations, a Byzantine
gossip round), a target that does not apply to the task, ``faults.repair: local`` on a directed
graph. Each refusal is one :class:`~gossamer.config.ConfigError` line naming the option to change."""

from __future__ import annotations

import inspect
from typing import NamedTuple

import torch

from .config import Config, ConfigError
from .data import Dataset
from .models import Footprint, footprint
from .registry import short
from .sharpness import HVP_CHUNK
from .sharpness import SAMPLES as SHARPNESS_SAMPLES
from .tasks import TASKS, Task
from .topology import TopologyError, free_memory, require_undirected
from .workers import backend_for


def check_local_repair(graph) -> None:
    """``faults.repair: local`` keeps a gone worker's weight at home: W's rows still sum to 1, its
    columns only where W is symmetric. On a directed graph the living mean would drift: refused."""
    try:
        require_undirected(graph, "topology", "faults")
    except TopologyError:
        raise ConfigError(f"faults.repair local keeps a gone worker's weight at home, so on the directed topology "
                          f"'{short(graph.name)}' the living workers' mean drifts (W's columns no longer sum to 1): "
                          f"use faults.repair metropolis") from None


TARGETS = {"target_accuracy": "test_accuracy", "target_loss": "test_loss"}  # config key → metric it targets


def check_target(cfg: Config, task: Task) -> None:
    for key, metric in TARGETS.items():
        if getattr(cfg, key) is not None and task.metric != metric:
            other = next(k for k, m in TARGETS.items() if m == task.metric)
            raise ConfigError(f"{key} does not apply to the {task.name} task of dataset {cfg.dataset} (its "
                              f"evaluations report {task.metric}): use {other}")


def check_data(cfg: Config, data: Dataset) -> None:
    """Refuse what the data set cannot give: more sharpness samples than its training set has, or
    a Dirichlet split of a task without classes."""
    if cfg.sharpness and (cfg.sharpness_samples or 0) > len(data.y_train):
        raise ConfigError(f"sharpness_samples ({cfg.sharpness_samples}) must be at most the {len(data.y_train)} "
                          f"samples of the training set")
    if cfg.partition == "dirichlet" and TASKS[data.task].traits["targets"] != "classes":
        raise ConfigError(f"partition 'dirichlet' splits classes among workers; dataset '{cfg.dataset}' is a "
                          f"{data.task} task: use partition: iid")


def check_memory(cfg: Config, data: Dataset, task: Task, m: int, dtype: torch.dtype, device: torch.device,
                 size: Footprint | None = None) -> None:
    """Refuse, before building the model, a run that cannot fit in the memory free on its device:
    m rows of d values for X, G, a scratch copy and at least two rows of optimizer or schedule
    state, and the most activations alive at once (:func:`_activations`). ``size``: the model's
    footprint (default: ``cfg.model``'s, :func:`~gossamer.models.footprint`)."""
    free = _free_bytes(device)
    if free is None:
        return
    size, value = size or footprint(cfg, data), torch.empty(0, dtype=dtype).element_size()
    matrix = 5 * m * size.parameters * value
    held = _activations(cfg, data, task, m, device, size)
    need = matrix + held.values * value
    if need <= free:
        return
    if matrix < held.values * value:
        option, advice = held.option, held.advice
    elif 5 * size.parameters * value > free:  # not even one worker's rows
        option, advice = (size.options or ("model",))[0], f"use a smaller {_either(size.options) or 'model'}"
    else:
        option, advice = "workers", "use fewer workers (or engine=dist across machines)"
    raise ConfigError(f"{option}: model {cfg.model} needs about {_gib(need)} on {device.type}, more than the "
                      f"{_gib(free)} free: {_gib(held.values * value)} of activations for {held.what} and "
                      f"{_gib(matrix)} for 5 copies of the [{m}, {_count(size.parameters)}] worker matrix; {advice}")


def check_robust_gossip_memory(m: int, d: int, topology, dtype: torch.dtype, device: torch.device) -> None:
    """Refuse a Byzantine gossip run whose round cannot fit: every local worker receives its K
    neighbours' rows, [m, K, d], held about three times over (received, attacked, clipped)."""
    if topology is None:
        return
    K = topology.mixing(0).K
    need = 3 * m * K * d * torch.empty(0, dtype=dtype).element_size()
    free = _free_bytes(device)
    if free is not None and need > free:
        raise ConfigError(f"byzantine: a gossip round with an adversary holds every worker's {K} neighbours' rows "
                          f"([{m}, {K}, {_count(d)}], about {_gib(need)}), more than the {_gib(free)} free on "
                          f"{device.type}; use a sparser topology or fewer workers")


def _free_bytes(device: torch.device) -> int | None:
    """Bytes free on ``device`` (None where the host does not say): what the preflights compare with."""
    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else free_memory()


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.3g} GiB"


def _count(n: int) -> str:
    return f"{n:,}" if n < 10**12 else f"{n:.3g}"


class _Held(NamedTuple):
    """Activations alive at once: how many values, for what, and the option that shrinks them."""

    values: int
    what: str
    option: str
    advice: str


def _activations(cfg: Config, data: Dataset, task: Task, m: int, device: torch.device, size: Footprint) -> _Held:
    """The largest activations a run holds at once: a training step's (one worker's batch with the
    loop backend, all m workers' with vmap), an evaluation's (a chunk of the test set, one model at
    a time) or sharpness's (a chunk of its samples, double backward: about 3 training steps')."""
    first = size.options[0] if size.options else None
    vmap = _vmap_backend(cfg, m, size.parameters, device)
    k = m if vmap else 1
    held = [_Held(k * cfg.batch_size * size.train, f"a training step of {k} × {cfg.batch_size} samples",
                  first or "batch_size", f"use a smaller {_either(('batch_size', *size.options))}"
                                         f"{' (or grad_backend=loop)' if vmap else ''}")]
    chunk = min(len(data.y_test), inspect.signature(task.evaluate).parameters["chunk"].default)
    if cfg.bn_eval == "recompute":
        chunk = max(chunk, cfg.workers * cfg.batch_size)
    held.append(_Held(chunk * size.test, f"an evaluation of {chunk} samples at once", first or "model",
                      f"use a smaller {_either(size.options) or 'model'}"))
    if cfg.sharpness:
        samples = min(HVP_CHUNK, cfg.sharpness_samples or SHARPNESS_SAMPLES)
        held.append(_Held(3 * samples * size.train, f"sharpness on {samples} samples",
                          "sharpness_samples", f"use fewer sharpness_samples (or a smaller {_either(size.options)})"
                          if size.options else "use fewer sharpness_samples"))
    return max(held)


def _either(options: tuple[str, ...]) -> str:
    """'a, b or c'."""
    return " or ".join(filter(None, [", ".join(options[:-1]), *options[-1:]]))


def _vmap_backend(cfg: Config, m: int, parameters: int, device: torch.device) -> bool:
    """Whether the gradient backend runs all m workers' batches at once (a loop picked for float64
    convolutions is counted as vmap: the preflight does not build the model)."""
    return backend_for(cfg.grad_backend, m, device, parameters, float64_convs=False) == "vmap"
