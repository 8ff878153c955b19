"""The Python API: train on the simulator from a notebook or a script, on gossamer's models and data
sets or on one's own ``nn.Module`` and tensors, and read finished runs back.

    result = gossamer.run({"algorithm": "gossip", "topology": "ring", "workers": 16, "epochs": 3},
                          model=lambda: MyNet(), data=gossamer.Data(train=(x, y), test=(x_test, y_test)))
    result.summary["test_accuracy"], result.rows[-1]["consensus_distance_sq"], result.x

A model or data given here is handed to the run, never registered: ``config.yaml`` records it as
the model or data set ``python``, and the run is built and checked exactly as one from the command
line, both gradient backends and every algorithm alike. A call leaves nothing behind: the model
builder is called once, torch's global generator (seeded with the run's seed to initialise the
model) is as the caller left it once the call returns, and calls in several threads at once give
their results alone.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

from .config import GIVEN, Config, from_dict, read_config_file
from .data import Dataset
from .registry import ConfigError, short
from .tasks import TASKS


@dataclass(frozen=True)
class Data:
    """A user's data for :func:`run`, handed to the run (never registered): the config names it ``python``.

    Args:
        train (tuple | torch.utils.data.Dataset): (inputs, targets) tensors or arrays, or a torch
            ``Dataset`` of (input, target) pairs (stacked once).
        test (tuple | torch.utils.data.Dataset): the test set, alike.
        task (str): ``classification`` (targets are class indices) or ``language-model`` (inputs
            and targets are token ids [N, T]).
        num_classes (int | None): the model's output size (default: the largest target, or token, + 1).

    Example::

        >>> import torch, gossamer
        >>> x, y = torch.randn(96, 40), torch.arange(96) % 4
        >>> data = gossamer.Data(train=(x[:64], y[:64]), test=(x[64:], y[64:]))
        >>> data.dataset().num_classes
        4
    """

    train: Any
    test: Any
    task: str = "classification"
    num_classes: int | None = None

    def dataset(self) -> Dataset:
        if self.task not in TASKS.names():
            raise ConfigError(f"Data task must be one of: {', '.join(TASKS.names())}; got {short(self.task)}")
        (x_train, y_train), (x_test, y_test) = _tensors(self.train, "train"), _tensors(self.test, "test")
        if x_train.shape[1:] != x_test.shape[1:]:
            raise ConfigError(f"Data train and test inputs differ in shape: {list(x_train.shape[1:])} and "
                              f"{list(x_test.shape[1:])}")
        for name, y in (("train", y_train), ("test", y_test)):
            if y.is_floating_point() or y.dtype == torch.bool:
                raise ConfigError(f"Data {name} targets must be integer class or token ids, got {y.dtype}")
        tokens = [x_train, x_test] if TASKS[self.task].traits["targets"] == "tokens" else []
        ids = (y_train, y_test, *tokens)
        lowest, largest = int(min(t.min() for t in ids)), int(max(t.max() for t in ids))
        if lowest < 0:
            raise ConfigError(f"Data targets must be class or token ids >= 0, got {lowest}")
        if self.num_classes is not None and not (isinstance(self.num_classes, int) and self.num_classes > largest):
            raise ConfigError(f"Data num_classes must be an integer above the largest id ({largest}), got "
                              f"{short(self.num_classes)}")
        return Dataset(x_train, y_train, x_test, y_test, self.num_classes or largest + 1, task=self.task)


def _tensors(part: Any, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(part, torch.utils.data.Dataset):
        pairs = [part[i] for i in range(len(part))]
        if not pairs:
            raise ConfigError(f"Data {name} is empty")
        return torch.stack([torch.as_tensor(x) for x, _ in pairs]), torch.stack([torch.as_tensor(y) for _, y in pairs])
    if not (isinstance(part, (tuple, list)) and len(part) == 2):
        raise ConfigError(f"Data {name} must be (inputs, targets) or a torch Dataset of pairs, got "
                          f"{type(part).__name__}")
    x, y = (torch.as_tensor(v) for v in part)
    if len(x) != len(y) or len(x) == 0:
        raise ConfigError(f"Data {name} needs as many targets as inputs, at least one: got {len(x)} and {len(y)}")
    return x, y


@dataclass
class Result:
    """A run, as :func:`run` and :func:`load` give it.

    Args:
        config (dict): its config, as config.yaml holds it.
        rows (list[dict]): its metric rows (metrics.jsonl).
        summary (dict): its summary (summary.json).
        x (Tensor): the final worker matrix X [n, d] (row i: worker i's parameters, flattened).
        path (Path | None): its run directory, if any.

    Example::

        >>> import torch, gossamer
        >>> result = gossamer.Result({"workers": 2}, [{"step": 1, "loss": 2.3}], {"steps": 1}, torch.zeros(2, 5))
        >>> result.rows[-1]["loss"], result.x.shape
        (2.3, torch.Size([2, 5]))
    """

    config: dict
    rows: list[dict]
    summary: dict
    x: torch.Tensor
    path: Path | None = None

    @property
    def frame(self):
        """The rows as a pandas DataFrame (pandas is an optional extra: pip install pandas)."""
        try:
            import pandas
        except ImportError:
            raise ImportError("Result.frame needs pandas: pip install pandas") from None
        return pandas.DataFrame(self.rows)


def run(config: dict | str | Path | Config, model: Callable[[], nn.Module] | nn.Module | None = None,
        data: Data | None = None, out: str | Path | None = None, progress: bool = False) -> Result:
    """Train a config on the simulator and return its :class:`Result`.

    ``model`` and ``data`` are handed to the run, not registered anywhere; the config names them
    ``python``. Torch's global generators are as the caller left them once the call returns (the
    run seeds them to initialise its model, one run at a time), and runs in several threads at
    once give the results each gives alone: but a model that draws from torch's global
    generator as it trains (dropout) shares that generator with runs in other threads.

    Args:
        config (dict | str | Path | Config): the keys of ``gossamer train`` as a dict, or a YAML file.
        model (Callable[[], nn.Module] | nn.Module | None): an ``nn.Module`` (a copy of it is
            trained) or a function that builds one (called once, after torch's global generator is
            seeded with the run's seed); None: the config's ``model``.
        data (Data | None): the data; None: the config's ``dataset``.
        out (str | Path | None): a run directory to write, as ``gossamer train --out`` writes it
            (an existing run is not replaced); None: none.
        progress (bool): show a progress bar.

    Returns:
        Result: the run (read back from ``out`` when given).

    Example::

        >>> import torch, gossamer
        >>> x, y = torch.randn(96, 40), torch.randint(0, 10, (96,))
        >>> def model():
        ...     return torch.nn.Sequential(torch.nn.Linear(40, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
        >>> result = gossamer.run({"algorithm": "gossip", "topology": "ring", "workers": 4, "epochs": 1,
        ...                        "batch_size": 8}, model=model, data=gossamer.Data(train=(x[:64], y[:64]),
        ...                                                                          test=(x[64:], y[64:])))
        >>> result.summary["steps"], result.x.shape, result.config["model"]
        (2, torch.Size([4, 1642]), 'python')
    """
    from .runner import run_training
    from .train import build_run, resolve_device, train

    values = _values(config)
    dataset, build = _given_data(values, data), _given_model(values, model)
    cfg = from_dict(values)
    if cfg.engine != "sim":
        raise ConfigError("gossamer.run trains on the simulator (engine sim); engine dist runs under torchrun: "
                          "gossamer train --set engine=dist")
    with _CALLERS.kept(resolve_device(cfg.device)):
        if out is not None:
            run_training(cfg, Path(out), overwrite=False, progress=progress, data=dataset, model=build)
        else:
            built, rows = build_run(cfg, data=dataset, model=build), []
            summary = train(cfg, built, on_row=rows.append, progress=progress)
            return Result(cfg.to_dict(), rows, summary, built.workers.X.detach().clone())
    return load(out)


def load(path: str | Path) -> Result:
    """Read a run directory back as its :class:`Result`.

    Args:
        path (str | Path): the run directory (of ``gossamer train --out`` or :func:`run`'s ``out``).

    Returns:
        Result: its config.yaml, metrics.jsonl, summary.json and the worker matrix of its last checkpoint.

    Example::

        >>> import tempfile, torch, gossamer
        >>> x, y = torch.randn(72, 40), torch.randint(0, 10, (72,))
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     _ = gossamer.run({"algorithm": "allreduce", "model": "mlp", "workers": 4, "epochs": 1,
        ...                       "batch_size": 8}, data=gossamer.Data(train=(x[:64], y[:64]), test=(x[64:], y[64:])),
        ...                      out=f"{tmp}/run")
        ...     result = gossamer.load(f"{tmp}/run")
        >>> result.config["algorithm"], result.summary["steps"], result.x.shape[0]
        ('allreduce', 2, 4)
    """
    from .rundir import load_checkpoint, read_rows, read_summary, saved_config

    path = Path(path)
    return Result(saved_config(path), read_rows(path), read_summary(path), load_checkpoint(path)["rows"]["X"], path)


def _values(config: dict | str | Path | Config) -> dict:
    if isinstance(config, Config):
        return config.to_dict()
    if isinstance(config, (str, Path)):
        return read_config_file(config)
    if isinstance(config, dict):
        return dict(config)
    raise ConfigError(f"config must be a dict, a YAML file's path or a Config, got {type(config).__name__}")


def _given_data(values: dict, data: Data | None) -> Dataset | None:
    """``data``'s data set, if given (the config then names it ``python``; naming another is refused)."""
    if data is None:
        return None
    if not isinstance(data, Data):
        raise ConfigError(f"data must be a gossamer.Data, got {type(data).__name__}")
    dataset = data.dataset()
    _name(values, "dataset", "data")
    return dataset


def _given_model(values: dict, model: Callable[[], nn.Module] | nn.Module | None):
    """A (cfg, data) → model builder of ``model``, if given, that checks the model on the data (the
    config then names it ``python``; naming another is refused)."""
    if model is None:
        return None
    build = _builder(model)
    _name(values, "model", "model")
    return lambda cfg, data: _fits(build(), data)


class _Generators:
    """Torch's global generators as the caller left them, given back when its run returns: a run
    seeds them to initialise its model. Runs in several threads share them, so the state is kept
    by the first of the runs in progress and given back when the last returns."""

    def __init__(self) -> None:
        self.lock, self.runs = threading.Lock(), 0
        self.cpu: torch.Tensor | None = None
        self.cuda: list[torch.Tensor] | None = None

    @contextlib.contextmanager
    def kept(self, device: torch.device) -> Iterator[None]:
        with self.lock:
            if self.runs == 0:
                self.cpu, self.cuda = torch.get_rng_state(), None
            if device.type == "cuda" and self.cuda is None:  # a run on the cpu leaves the cuda ones alone
                self.cuda = torch.cuda.get_rng_state_all()
            self.runs += 1
        try:
            yield
        finally:
            with self.lock:
                self.runs -= 1
                if self.runs == 0:
                    torch.set_rng_state(self.cpu)
                    if self.cuda is not None:
                        torch.cuda.set_rng_state_all(self.cuda)


_CALLERS = _Generators()


def _name(values: dict, key: str, argument: str) -> None:
    if values.get(key, GIVEN) != GIVEN:
        raise ConfigError(f"{key} '{short(values[key])}' is set in the config and {argument}= is given: give one")
    values[key] = GIVEN


def _builder(model: Callable[[], nn.Module] | nn.Module) -> Callable[[], nn.Module]:
    """A function that builds a fresh module (a module given as such: a copy of it each time)."""
    if isinstance(model, nn.Module):
        return lambda: copy.deepcopy(model)
    if not callable(model):
        raise ConfigError(f"model must be an nn.Module or a function that builds one, got {type(model).__name__}")
    return lambda: _checked(model())


def _checked(module: Any) -> nn.Module:
    if not isinstance(module, nn.Module):
        raise ConfigError(f"model must build an nn.Module, got {type(module).__name__}")
    return module


def _fits(model: nn.Module, data: Dataset) -> nn.Module:
    """``model``, checked on one training sample: it has parameters and returns a tensor of
    logits, one per class (a language model's: per position)."""
    if not any(True for _ in model.parameters()):
        raise ConfigError("model has no parameters to train")
    sample, probe = data.x_train[:1], copy.deepcopy(model).eval()
    if sample.is_floating_point():
        probe.to(sample.dtype)  # as the run converts it
    with torch.no_grad():
        try:
            out = probe(sample)
        except Exception as e:  # noqa: BLE001 — the user's model, one line
            raise ConfigError(f"model fails on one training input ({list(sample.shape)}): "
                              f"{type(e).__name__}: {short(str(e).splitlines()[0] if str(e) else '')}") from None
    if not isinstance(out, torch.Tensor):
        raise ConfigError(f"model must return a tensor of logits, got {type(out).__name__}")
    if out.shape[-1] != data.num_classes:
        raise ConfigError(f"model returns {out.shape[-1]} values a sample; the data has {data.num_classes} "
                          f"{TASKS[data.task].traits['targets']} (Data num_classes)")
    return model
