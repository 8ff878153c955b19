"""Typed run configuration: defaults, YAML files, dotted ``--set`` overrides, validation.

Keys are flat (``local_steps: 4``, ``--set outer_lr=0.5``) plus sections (``consensus.*``). The
general keys are :class:`Config`'s fields; every other key belongs to the entry chosen for one of
the concepts in :data:`KINDS` (the algorithm, data set, model, optimizer or engine) and is
declared, with its default and its validation, by that entry's options dataclass in the module
that owns the concept. A key that belongs to an entry that was not chosen (``outer_lr`` for
``allreduce``) is refused, never silently ignored. ``cfg.local_steps`` reads the chosen entry's
option; :meth:`Config.to_dict` writes the flat form back (what ``config.yaml`` holds).

Every error raised here is a :class:`ConfigError` whose message is one line naming the option
and what is allowed; the CLI prints it and exits with status 2.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import math
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .algorithms import ALGORITHMS
from .data import DATASETS
from .engines import ENGINES
from .models import MODELS
from .byzantine import ByzantineConfig
from .config_yaml import YAMLSyntaxError, parse_yaml, read_yaml
from .faults import FaultsConfig
from .loggers import LOGGERS
from .network import TIME_KEYS, NetworkConfig, check_compute, check_worker_speeds, parse_jitter, parse_slow_workers
from . import plugins
from .optim import OPTIMIZERS
from .registry import ConfigError, Entry, Registry, positive_ints, short
from .workers import GRAD_BACKENDS

__all__ = ["Config", "ConfigError", "GIVEN", "KINDS", "entry_of", "from_dict", "load_config", "parse_override"]

KINDS: dict[str, Registry] = {"algorithm": ALGORITHMS, "engine": ENGINES, "optimizer": OPTIMIZERS,
                              "dataset": DATASETS, "model": MODELS}
# the name of a model or data set given from Python (gossamer.run(model=..., data=...)): what config.yaml
# records; it is in no registry (the run is handed the model and the data, gossamer.train.build_run)
GIVEN = "python"


def _given_only(kind: str, argument: str) -> Entry:
    def build(*args: Any) -> Any:
        raise ConfigError(f"{kind} '{GIVEN}' is one given from Python: gossamer.run({argument}=...)")
    return Entry(GIVEN, build, help=f"the {kind} given from Python: gossamer.run({argument}=...)")


_GIVEN_ENTRIES = {"dataset": _given_only("dataset", "data"), "model": _given_only("model", "model")}


def entry_of(kind: str, name: Any) -> Entry:
    """The entry ``name`` of the concept ``kind`` of :data:`KINDS`: its registry's, or for
    :data:`GIVEN` (a model or data set given from Python) one that owns no keys."""
    if name == GIVEN and kind in _GIVEN_ENTRIES:
        return _GIVEN_ENTRIES[kind]
    return KINDS[kind][name]


DEVICES = ("cpu", "cuda", "auto")
PARTITIONS = ("iid", "dirichlet")
LR_SCALINGS = ("none", "linear")
DTYPES = ("float32", "float64")
BN_EVALS = ("average", "recompute")
# seeds: a step's batches are drawn with seed * 1_000_003 + step, and torch takes seeds below 2**64
SEED_LIMIT = 2**44


@dataclass
class Config:
    """One training run. Learning-rate keys are in epochs; ``lr`` is the per-worker base rate.

    ``options`` holds, per concept of :data:`KINDS`, the options of the chosen entry; their keys
    read as attributes of the config (``cfg.local_steps``)."""

    workers: int = 16  # n
    algorithm: str = "allreduce"  # the communication schedule (its own keys below, under Algorithm)
    engine: str = "sim"  # "dist": torch.distributed processes under torchrun
    device: str = "cpu"  # cpu, cuda or auto
    grad_backend: str = "auto"  # per-worker gradients: loop (a module per worker), vmap, or auto (by device, size and n)
    dtype: str = "float32"  # float64 for exactness studies
    # -- optimisation
    epochs: int = 40  # the training length (schedules and milestones are in epochs)
    batch_size: int = 16  # per worker
    lr: float = 0.1  # η: the per-worker peak learning rate
    lr_scaling: str = "none"  # "linear": peak lr = lr * workers
    warmup_epochs: float = 0.0  # linear warm-up from 0 to the peak rate
    milestones: list[float] = field(default_factory=list)  # epochs of lr *= lr_decay
    lr_decay: float = 0.1  # the factor at each milestone
    optimizer: str = "sgd"  # the local optimizer (its own keys below, under Optimizer)
    average_optimizer_state: bool = False  # average momenta/moments whenever parameters are averaged
    weight_decay: float = 0.0  # L2 (sgd, adam) or decoupled (adamw)
    decay_norm_and_bias: bool = False  # False: no weight decay on biases and norm layers
    # -- data and model
    dataset: str = "mnist1d"  # its own keys below, under Dataset
    partition: str = "iid"  # iid, or dirichlet: each class split among the workers by Dirichlet(α) shares
    dirichlet_alpha: float = 0.5  # α of partition dirichlet: small → each worker sees few classes
    model: str = "cnn1d"  # its own keys below, under Model
    # BatchNorm statistics of the averaged model x̄ at evaluation: "average" (the mean of the workers')
    # or "recompute" (re-estimated with x̄ on training batches); None: "average" where the model has them
    bn_eval: str | None = None
    seed: int = 0  # every random stream of the run (gossamer.rng) and the model's initialisation
    # a fraction of the training set held out (drawn from the seed) and evaluated as val_* beside the
    # test set; None (= 0): train on all of it, nothing held out
    validation_fraction: float | None = None
    eval_every: int = 1  # epochs
    # the local models evaluated for the *_local_mean metrics: all, none, or K drawn once from the seed
    eval_local: int | str = "all"
    checkpoint_every: float = 1.0  # epochs (fractions allowed); and always at the last step
    metrics_every: int = 1  # steps between metric rows (Ξ², loss, ...); evaluations always have one
    # every metric row also to metrics.csv (csv), TensorBoard (tensorboard), Weights & Biases (wandb) or MLflow
    # (mlflow, a file store in mlruns/); a list runs several
    logger: str | list[str] = "none"
    sharpness: bool = False  # at each evaluation, the top Hessian eigenvalue of the training loss at x̄
    sharpness_samples: int | None = None  # the fixed training subset it is taken over (None: 1000, or all if fewer)
    sharpness_iterations: int = 20  # power iterations (Hessian-vector products)
    # time (gossamer.network): none of it without a network section
    network: NetworkConfig | None = field(default=None, metadata={"section": NetworkConfig})
    compute_ms: float | str | None = None  # one worker's step: measured (the default), ms, or flops:TFLOPS
    slow_workers: str | None = None  # F@X: a fraction F of the workers (drawn from the seed) computes X times slower
    # each worker's compute time as a multiple of compute_ms, one per worker (instead of slow_workers' draw)
    worker_speeds: list[float] | None = None
    compute_jitter: str | None = None  # lognormal:S: every worker's step × a log-normal factor (σ = S, mean 1)
    target_accuracy: float | None = None  # summary: steps (and simulated seconds) to this test accuracy
    target_loss: float | None = None  # ... or to this test loss (language models)
    # workers that leave and return (gossamer.faults): events, churn, rejoin
    faults: FaultsConfig | None = field(default=None, metadata={"section": FaultsConfig})
    # workers that lie (gossamer.byzantine): who, their attack, the honest workers' robust aggregator
    byzantine: ByzantineConfig | None = field(default=None, metadata={"section": ByzantineConfig})
    # Python files or modules imported before the rest is read (gossamer.plugins); recorded as SOURCE#sha256=HEX
    plugins: list[str] | None = None
    options: dict[str, Any] = field(default_factory=dict, repr=False, metadata={"internal": True})

    def __post_init__(self) -> None:
        for kind in KINDS:
            entry = entry_of(kind, getattr(self, kind))
            if not isinstance(self.options.get(kind), entry.options):
                self.options[kind] = entry.options()

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("__"):
            for kind, opts in self.__dict__.get("options", {}).items():
                if name in _field_names(opts):
                    return getattr(opts, name)
        chosen = ", ".join(f"{kind} {self.__dict__.get(kind)}" for kind in KINDS)
        raise AttributeError(f"config has no key '{name}' (neither a general key nor an option of {chosen})")

    def validate(self) -> Config:
        positive_ints(self, "workers", "epochs", "batch_size", "eval_every", "metrics_every", "sharpness_iterations")
        for name in ("seed", "topology_seed"):
            seed = getattr(self, name, None)  # topology_seed: only where the algorithm has a graph
            if seed is not None and not 0 <= seed < SEED_LIMIT:
                raise ConfigError(f"{name} must be an integer in [0, 2**44), got {short(seed)}")
        if self.sharpness_samples is not None:
            positive_ints(self, "sharpness_samples")
        for name in ("sharpness_samples", "sharpness_iterations"):
            if not self.sharpness and getattr(self, name) != getattr(Config, name):
                raise ConfigError(f"{name} applies only with sharpness: true")
        _choice(self, "device", DEVICES)
        _choice(self, "partition", PARTITIONS)
        _choice(self, "lr_scaling", LR_SCALINGS)
        _choice(self, "grad_backend", GRAD_BACKENDS)
        _choice(self, "dtype", DTYPES)
        if self.bn_eval is not None:
            _choice(self, "bn_eval", BN_EVALS)
        self.logger = _loggers(self.logger)
        if not self.lr > 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")
        for name in ("weight_decay", "warmup_epochs"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        self._validate_scales()
        if not 0 < self.lr_decay <= 1:
            raise ConfigError(f"lr_decay must be in (0, 1], got {self.lr_decay}")
        if any(not 0 < m < self.epochs for m in self.milestones) or self.milestones != sorted(self.milestones):
            raise ConfigError(f"milestones must be increasing epochs in (0, epochs={self.epochs}), "
                              f"got {short(self.milestones)}")
        if not self.checkpoint_every > 0:
            raise ConfigError(f"checkpoint_every must be > 0 epochs, got {self.checkpoint_every}")
        if self.eval_local not in ("all", "none") and not (isinstance(self.eval_local, int)
                                                          and 1 <= self.eval_local <= self.workers):
            raise ConfigError(f"eval_local must be all, none or a number of workers in [1, workers={self.workers}], "
                              f"got {short(self.eval_local)}")
        if self.validation_fraction is not None and not 0 <= self.validation_fraction < 1:
            raise ConfigError(f"validation_fraction must be in [0, 1), got {self.validation_fraction}")
        if not 0 < self.dirichlet_alpha <= 1e6:  # beyond 1e6 the split is i.i.d. (partition=iid); numpy's draw underflows
            raise ConfigError(f"dirichlet_alpha must be in (0, 1e6], got {self.dirichlet_alpha}")
        self._validate_time()
        for opts in self.options.values():
            opts.validate(self)
        if self.faults is not None:
            self.faults.validate(self, ALGORITHMS)
        if self.byzantine is not None:
            if self.faults is not None:
                raise ConfigError("byzantine and faults together are not supported: give one of the two sections")
            self.byzantine.validate(self, ALGORITHMS)
        return self

    def _validate_scales(self) -> None:
        """lr and weight_decay scale tensors of the run's dtype: they must be numbers of that dtype."""
        largest = torch.finfo(getattr(torch, self.dtype)).max
        linear = self.lr_scaling == "linear"
        if self.lr * (self.workers if linear else 1) > largest:
            raise ConfigError(f"lr must be at most {largest:.4g}{' / workers (lr_scaling linear)' if linear else ''}, "
                              f"the largest {self.dtype}; got {self.lr:.4g}")
        if self.weight_decay > largest:
            raise ConfigError(f"weight_decay must be at most {largest:.4g}, the largest {self.dtype}; "
                              f"got {self.weight_decay:.4g}")

    def _validate_time(self) -> None:
        if self.network is not None:
            self.network.validate(self)
            check_compute(self.compute_ms if self.compute_ms is not None else "measured")
        else:
            # the workers of a server on real processes sleep their speeds (algorithms/async_server.py)
            sleeping = self.engine == "dist" and ALGORITHMS[self.algorithm].traits.get("server")
            for key in TIME_KEYS:
                if getattr(self, key) is not None and not (sleeping and key != "compute_ms"):
                    raise ConfigError(f"{key} applies only with a network section (network: PRESET or "
                                      f"network.bandwidth and network.latency): it sets the compute time of the "
                                      f"simulated clock")
        if self.slow_workers is not None:
            parse_slow_workers(self.slow_workers)
        if self.worker_speeds is not None:
            check_worker_speeds(self.worker_speeds, self.workers, self.slow_workers)
        if self.compute_jitter is not None:
            parse_jitter(self.compute_jitter)
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise ConfigError(f"target_accuracy must be in (0, 1], got {self.target_accuracy}")
        if self.target_loss is not None and not self.target_loss > 0:
            raise ConfigError(f"target_loss must be > 0, got {self.target_loss}")
        if self.target_accuracy is not None and self.target_loss is not None:
            raise ConfigError("give target_accuracy or target_loss, not both")

    def to_dict(self) -> dict[str, Any]:
        """The flat form: general keys, each chosen entry's options right after its name; keys
        that are unset by default (``network``, ``compute_ms``, the targets) only when set."""
        out: dict[str, Any] = {}
        for f in _fields(Config):
            value = getattr(self, f.name)
            if value is None and f.default is None:
                continue
            out[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
            if f.name in self.options:
                out.update(dataclasses.asdict(self.options[f.name]))
        return out


def _fields(cls) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if not f.metadata.get("internal")]


def _field_names(options) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(options))


def _choice(cfg: Config, name: str, allowed: tuple[str, ...]) -> None:
    if getattr(cfg, name) not in allowed:
        raise ConfigError(f"unknown {name} '{short(getattr(cfg, name))}'; choose one of: {', '.join(allowed)}")


def _loggers(logger: str | list[str]) -> str | list[str]:
    """``logger`` checked and in its canonical form: one name as a string, several as a list (in
    the order given, each once, without ``none``); each one's package must be installed."""
    names = [logger] if isinstance(logger, str) else list(logger)
    for name in names:
        if name != "none" and name not in LOGGERS.names():
            raise ConfigError(f"unknown logger '{short(name)}'; choose one or a list of: none, "
                              f"{', '.join(LOGGERS.names())}")
        package = LOGGERS[name].traits.get("package") if name != "none" else None
        if package and importlib.util.find_spec(package) is None:
            raise ConfigError(f"logger {name} needs the {package} package: pip install 'gossamer[{name}]'")
    if len(names) > 1 and "none" in names:
        raise ConfigError(f"logger none cannot be listed with others, got {short(logger)}")
    if not names or len(set(names)) != len(names):
        raise ConfigError(f"logger must name each logger once, got {short(logger)}")
    return names[0] if len(names) == 1 else names


def _coerce(name: str, value: Any, annotation: str) -> Any:
    """Check a value against the field's type (from its annotation string) and convert ints to floats."""
    if value is None and "None" in annotation:
        return None
    if annotation == "str | list[str]":  # a name or a list of names (logger)
        return value if isinstance(value, str) else _coerce(name, value, "list[str]")
    if annotation.startswith("list[str]"):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{name} must be a list of names, got {short(value)}")
        return value
    if annotation == "list[int]":
        if not isinstance(value, list) or not all(_is_int(v) for v in value):
            raise ConfigError(f"{name} must be a list of integers in [-2**63, 2**63), got {short(value)}")
        return value
    if "list" in annotation:
        if not isinstance(value, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{name} must be a list of numbers, got {short(value)}")
        if not all(_is_finite(v) for v in value):
            raise ConfigError(f"{name} must be a list of finite numbers, got {short(value)}")
        return [float(v) for v in value]
    if value is None and "None" in annotation:
        return None
    if annotation.startswith("bool"):
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, got {short(value)}")
        return value
    if annotation.startswith("int | str"):  # a count or a word (eval_local)
        return value if isinstance(value, str) else _coerce(name, value, "int")
    if annotation.startswith("int"):
        if not _is_int(value):
            raise ConfigError(f"{name} must be an integer in [-2**63, 2**63), got {short(value)}")
        return value
    if annotation.startswith("float | str"):  # a number or a word (compute_ms)
        number = _number(value)
        return value if isinstance(number, str) else _coerce(name, number, "float")
    if annotation.startswith("float"):
        value = _number(value)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ConfigError(f"{name} must be a number, got {short(value)}")
        if not _is_finite(value):
            raise ConfigError(f"{name} must be a finite number, got {short(value)}")
        return float(value)
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, got {short(value)}")
    return value


def _is_int(value: Any) -> bool:
    """An integer that fits int64, as torch and numpy take them."""
    return isinstance(value, int) and not isinstance(value, bool) and -2**63 <= value < 2**63


def _is_finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer past float's range
        return False


def _number(value: Any) -> Any:
    """A string that reads as a float (YAML 1.1 reads 1e-3, without a dot, as a string) as that
    float; any other value as it is."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def _annotation(f: dataclasses.Field) -> str:
    """A field's type as its annotation reads (a plugin's module may not postpone annotations)."""
    return f.type if isinstance(f.type, str) else f.type.__name__ if isinstance(f.type, type) else str(f.type)


def _section(f: dataclasses.Field) -> type | None:
    """The dataclass of a section field (``consensus``; ``network``, unset by default), else None."""
    factory = f.default_factory
    return f.metadata.get("section") or (factory if factory is not MISSING and dataclasses.is_dataclass(factory) else None)


def _build(cls, values: Any, prefix: str = ""):
    """A dataclass from a mapping, checking keys and types; sections are nested dataclasses. A
    section with a ``preset`` key may be given as the preset's name (``network: ethernet-10g``)."""
    presets = "preset" in {f.name for f in _fields(cls)}
    if isinstance(values, str) and presets:
        values = {"preset": values}
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix.rstrip('.')} must be {'a preset name or ' if presets else ''}a section of keys, "
                          f"got {short(values)}")
    fields = {f.name: f for f in _fields(cls)}
    unknown = sorted((str(k) for k in set(values) - set(fields)))
    if unknown:
        raise ConfigError(f"unknown config key '{prefix}{short(str(unknown[0]))}'; known keys: "
                          f"{', '.join(prefix + f for f in fields)}")
    kwargs = {}
    for key, value in values.items():
        section = _section(fields[key])
        kwargs[key] = (_build(section, value, f"{prefix}{key}.") if section and value is not None
                       else _coerce(prefix + key, value, _annotation(fields[key])))
    return cls(**kwargs)


def from_dict(values: dict[str, Any]) -> Config:
    """Build and validate a Config. Each key goes to the general fields or to the options of the
    entry chosen for its concept; unknown keys and keys of entries not chosen are refused."""
    if not isinstance(values, dict):
        raise ConfigError(f"a config must be a mapping of keys to values, got {type(values).__name__}")
    values = _with_required(_with_plugins(values))
    general = {f.name: f for f in _fields(Config)}
    chosen = {kind: entry_of(kind, _coerce(kind, values.get(kind, general[kind].default), "str"))
              for kind in KINDS}
    top: dict[str, Any] = {}
    routed: dict[str, dict[str, Any]] = {kind: {} for kind in KINDS}
    for key, value in values.items():
        owner = next((kind for kind, entry in chosen.items() if key in entry.keys), None)
        if key in general:
            top[key] = value
        elif owner:
            routed[owner][key] = value
        else:
            raise _not_applicable(str(key), chosen, general)
    cfg = _build(Config, top)
    cfg.options = {kind: _build(entry.options, routed[kind]) for kind, entry in chosen.items()}
    return cfg.validate()


def _with_required(values: dict[str, Any]) -> dict[str, Any]:
    """The values the chosen algorithm requires of other keys (its entry's ``requires`` trait: a
    value, or a tuple of the values it accepts, e.g. DeMo's momentum 0, DES-LOC's adam or adamw)
    set where the user left them unset (the first accepted); a value the user gave otherwise is
    refused, naming it."""
    algorithm = values.get("algorithm", Config.algorithm)
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        return values  # refused below, naming the choices
    entry = ALGORITHMS[algorithm]
    chosen = dict(values)
    for key, value in entry.traits.get("requires", {}).items():
        accepted = value if isinstance(value, tuple) else (value,)
        if key in values and values[key] not in accepted:
            allowed = " or ".join(str(a).lower() for a in accepted)
            raise ConfigError(f"algorithm {algorithm} sets {key} to {allowed} ({entry.traits['requires_why']}): "
                              f"drop {key}={short(values[key])}")
        chosen.setdefault(key, accepted[0])
    return chosen


def _with_plugins(values: dict[str, Any]) -> dict[str, Any]:
    """Import the config's plugins and the installed ones (before any name is looked up); the
    config then records as SOURCE#sha256=HEX (a recorded one must not have changed) each plugin it
    names and each installed one whose entries it uses — not every installed package's, so a run
    that uses none resumes after one is edited or uninstalled."""
    given = values.get("plugins") or []
    if not isinstance(given, list):
        raise ConfigError(f"plugins must be a list of .py files or module names, got {short(given)}")
    records = plugins.load(given)
    named = _names(values)
    records += [r for r in plugins.load_installed() if r not in records
                and any(name in named for _, name in plugins.registered(r))]
    return {**values, "plugins": records} if records else {k: v for k, v in values.items() if k != "plugins"}


def _names(values: Any) -> set[str]:
    """Every name a config's values could give an entry by: each string value (in sections and
    lists too) cut at ``:``, ``+``, ``@`` and ``,``, with a codec's ``ef-`` taken off."""
    if isinstance(values, dict):
        return {name for value in values.values() for name in _names(value)}
    if isinstance(values, (list, tuple)):
        return {name for value in values for name in _names(value)}
    if not isinstance(values, str):
        return set()
    parts = values.replace("+", ":").replace("@", ":").replace(",", ":").split(":")
    return {part.strip().removeprefix("ef-") for part in parts}


def _not_applicable(key: str, chosen: dict, general: dict) -> ConfigError:
    owners = [f"{kind} {name}" for kind, registry in KINDS.items() for name in registry.owners(key)]
    if owners:
        kinds = sorted({o.split()[0] for o in owners})
        this = ", ".join(f"{kind} '{chosen[kind].name}'" for kind in kinds)
        return ConfigError(f"{key} does not apply to {this}: it is an option of {', '.join(owners)}")
    known = [*general, *(k for entry in chosen.values() for k in entry.keys)]
    return ConfigError(f"unknown config key '{key[:100]}'; known keys: {', '.join(known)}")


def parse_override(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE parsed as YAML (so ``lr=0.1`` is a float, ``milestones=[10,20]`` a list)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects KEY=VALUE, got '{short(text)}'")
    try:
        value = parse_yaml(raw, f"--set {short(key)}") if raw.strip() else ""
    except YAMLSyntaxError:
        value = raw
    return key.strip(), value


def set_dotted(values: dict[str, Any], key: str, value: Any) -> None:
    """Set ``a.b.c`` in a nested dict, creating sections as needed."""
    *parents, leaf = key.split(".")
    node = values
    for part in parents:
        if isinstance(node.get(part), str):  # a section given by its preset's name: network=ethernet-10g
            node[part] = {"preset": node[part]}
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {key}: '{part}' is not a section")
    node[leaf] = value


def read_config_file(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The keys of a YAML config file. A file may name a ``base`` config file (a path relative to
    itself) whose keys it extends and overrides, sections key by key."""
    loaded = read_yaml(path)
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"config file '{short(path)}' must hold a mapping of keys to values")
    values = loaded or {}
    if isinstance(values.get("plugins"), list):  # a plugin's path is relative to the file that names it
        values["plugins"] = [str(Path(path).parent / p) if isinstance(p, str) and plugins.is_path(p)
                             and not p.startswith("~") else p for p in values["plugins"]]
    parent = values.pop("base", None)
    if parent is None:
        return values
    if not isinstance(parent, str):
        raise ConfigError(f"base in '{short(path)}' must be the path of a config file, got {short(parent)}")
    parent_path = Path(path).parent / parent
    if parent_path.resolve() in _seen:
        raise ConfigError(f"config file '{short(path)}' names base '{short(parent)}', which leads back to itself")
    merged = read_config_file(parent_path, (*_seen, Path(path).resolve()))
    _merge(merged, values)
    return merged


def _merge(into: dict[str, Any], values: dict[str, Any]) -> None:
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def load_config(path: str | Path | None = None, overrides: list[str] = (),
                base: dict[str, Any] | None = None, plugin: list[str] = ()) -> Config:
    """Defaults, then ``base`` (e.g. a saved run's config), then the YAML file (if any, with the
    files it names as its ``base``), then each ``KEY=VALUE`` override in order; ``plugin``: more
    plugins (``--plugin``) after the config's own."""
    values: dict[str, Any] = copy.deepcopy(base or {})
    if path is not None:
        values.update(read_config_file(path))
    for text in overrides:
        set_dotted(values, *parse_override(text))
    if plugin:
        values["plugins"] = [*(values.get("plugins") or []), *plugin]
    return from_dict(values)
