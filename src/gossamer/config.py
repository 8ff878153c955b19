"""Typed run configuration: defaults, YAML files, dotted ``--set`` overrides, validation.

Every error raised here is a :class:`ConfigError` whose message is one line naming the option
and what is allowed; the CLI prints it and exits with status 2.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """Bad configuration: the message names the option and what is allowed."""


ALGORITHMS = ("allreduce", "local", "post-local", "hierarchical", "gossip", "diloco")
COMPRESSIONS = ("none", "sign", "ef-sign")
GOSSIP_FORMS = ("step-then-mix", "mix-then-step")
OPTIMIZERS = ("sgd", "adam", "adamw")
ENGINES = ("sim", "dist")
DIST_BACKENDS = ("auto", "gloo", "nccl")
DEVICES = ("cpu", "cuda", "auto")
PARTITIONS = ("iid", "dirichlet")
LR_SCALINGS = ("none", "linear")
GRAD_BACKENDS = ("auto", "loop", "vmap")
DTYPES = ("float32", "float64")
PHASE_MODES = ("allreduce", "gossip", "controlled")
ON_BUDGET = ("allreduce", "continue")


@dataclass
class ConsensusConfig:
    """Consensus control (Kong et al.): keep Ξ ≤ target with extra gossip rounds.

    target: none | constant (Ξ ≤ value) | gradient (factor · η_t · sqrt(EMA φ_t²) / p)
    | run:DIR (factor · EMA of the Ξ_t an earlier uncontrolled run had at the same step).
    """

    target: str = "none"
    value: float = 0.0
    factor: float = 1.0
    max_extra_rounds: int = 100
    on_budget: str = "allreduce"
    ema: float = 0.9

    def validate(self) -> None:
        t = self.target
        if t not in ("none", "constant", "gradient") and not (t.startswith("run:") and len(t) > 4):
            raise ConfigError(f"unknown consensus.target '{t}'; choose one of: none, constant, gradient, run:DIR")
        if t == "constant" and not self.value > 0:
            raise ConfigError(f"consensus.target constant needs consensus.value > 0, got {self.value}")
        if not self.factor > 0:
            raise ConfigError(f"consensus.factor must be > 0, got {self.factor}")
        if self.max_extra_rounds < 0:
            raise ConfigError(f"consensus.max_extra_rounds must be >= 0, got {self.max_extra_rounds}")
        if self.on_budget not in ON_BUDGET:
            raise ConfigError(f"unknown consensus.on_budget '{self.on_budget}'; choose one of: {', '.join(ON_BUDGET)}")
        if not 0 <= self.ema < 1:
            raise ConfigError(f"consensus.ema must be in [0, 1), got {self.ema}")


@dataclass
class Config:
    """One training run. Learning-rate keys are in epochs; ``lr`` is the per-worker base rate."""

    # workers and communication
    workers: int = 16
    algorithm: str = "allreduce"
    topology: str = "ring"
    topology_seed: int | None = None  # None: use `seed`
    local_steps: int = 1  # H: local steps between averages (local, post-local, hierarchical, diloco)
    switch_epoch: float | None = None  # post-local: None = the first lr milestone
    switch_step: int | None = None  # post-local: the switch in steps instead of epochs
    block_size: int = 1  # hierarchical: consecutive workers per block
    block_rounds: int = 1  # hierarchical: H_b, block averages per global average
    compression: str = "none"  # local, post-local, hierarchical: none | sign | ef-sign
    gossip_form: str = "step-then-mix"  # or mix-then-step
    consensus: ConsensusConfig = field(default_factory=ConsensusConfig)
    phases: list[str] = field(default_factory=list)  # gossip: a mode per phase (allreduce|gossip|controlled)
    phase_epochs: list[float] = field(default_factory=list)  # phase boundaries; [] = the lr milestones
    outer_lr: float = 0.7  # diloco
    outer_momentum: float = 0.9  # diloco (Nesterov)
    engine: str = "sim"  # "dist": torch.distributed processes under torchrun
    dist_backend: str = "auto"  # auto: nccl on CUDA, gloo on CPU
    dist_timeout: float = 60.0  # seconds before a lost peer stops the run
    device: str = "cpu"
    grad_backend: str = "auto"
    dtype: str = "float32"  # float64 for exactness studies
    # optimisation
    epochs: int = 40
    batch_size: int = 16  # per worker
    lr: float = 0.1
    lr_scaling: str = "none"  # "linear": peak lr = lr * workers
    warmup_epochs: float = 0.0
    milestones: list[float] = field(default_factory=list)  # epochs of lr *= lr_decay
    lr_decay: float = 0.1
    optimizer: str = "sgd"  # sgd | adam | adamw
    momentum: float = 0.9  # sgd
    nesterov: bool = True  # sgd
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    adam_eps: float = 1e-8
    average_optimizer_state: bool = False  # average momenta/moments whenever parameters are averaged
    weight_decay: float = 0.0
    decay_norm_and_bias: bool = False  # False: no weight decay on biases and norm layers
    # data and model
    dataset: str = "mnist1d"
    num_samples: int = 5000
    partition: str = "iid"
    dirichlet_alpha: float = 0.5
    model: str = "cnn1d"
    seed: int = 0
    eval_every: int = 1  # epochs

    def validate(self) -> Config:
        _positive_int(self, "workers", "epochs", "batch_size", "local_steps", "eval_every", "num_samples")
        _choice(self, "algorithm", ALGORITHMS)
        _choice(self, "compression", COMPRESSIONS)
        _choice(self, "gossip_form", GOSSIP_FORMS)
        _choice(self, "optimizer", OPTIMIZERS)
        _choice(self, "engine", ENGINES)
        _choice(self, "dist_backend", DIST_BACKENDS)
        _choice(self, "device", DEVICES)
        _choice(self, "partition", PARTITIONS)
        _choice(self, "lr_scaling", LR_SCALINGS)
        _choice(self, "grad_backend", GRAD_BACKENDS)
        _choice(self, "dtype", DTYPES)
        if not self.lr > 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.optimizer == "sgd" and self.nesterov and self.momentum == 0:
            raise ConfigError("nesterov: true needs momentum > 0")
        if not self.dist_timeout > 0:
            raise ConfigError(f"dist_timeout must be > 0 seconds, got {self.dist_timeout}")
        for name in ("weight_decay", "warmup_epochs"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 < self.lr_decay <= 1:
            raise ConfigError(f"lr_decay must be in (0, 1], got {self.lr_decay}")
        if any(not 0 < m < self.epochs for m in self.milestones) or self.milestones != sorted(self.milestones):
            raise ConfigError(f"milestones must be increasing epochs in (0, epochs={self.epochs}), got {self.milestones}")
        self._validate_algorithm()
        self._validate_phases()
        if len(self.adam_betas) != 2 or not all(0 <= b < 1 for b in self.adam_betas):
            raise ConfigError(f"adam_betas must be two numbers in [0, 1), got {self.adam_betas}")
        if not self.adam_eps > 0:
            raise ConfigError(f"adam_eps must be > 0, got {self.adam_eps}")
        if not self.dirichlet_alpha > 0:
            raise ConfigError(f"dirichlet_alpha must be > 0, got {self.dirichlet_alpha}")
        return self

    def _validate_algorithm(self) -> None:
        _positive_int(self, "block_size", "block_rounds")
        if self.algorithm == "hierarchical" and self.workers % self.block_size:
            raise ConfigError(f"block_size must divide workers: {self.block_size} does not divide {self.workers}")
        if self.compression != "none" and self.algorithm not in ("local", "post-local", "hierarchical"):
            raise ConfigError(f"compression '{self.compression}' works with local, post-local and hierarchical, "
                              f"not with {self.algorithm}")
        if self.compression != "none" and self.average_optimizer_state:
            raise ConfigError("average_optimizer_state: true needs compression: none")
        if self.switch_epoch is not None and self.switch_step is not None:
            raise ConfigError("give post-local's switch as switch_epoch or switch_step, not both")
        if self.algorithm == "post-local" and self.switch_epoch is None and self.switch_step is None \
                and not self.milestones:
            raise ConfigError("post-local needs switch_epoch, switch_step or a learning-rate milestone")
        if (self.switch_epoch or 0) < 0 or (self.switch_step or 0) < 0:
            raise ConfigError("switch_epoch and switch_step must be >= 0")
        if not self.outer_lr > 0 or not 0 <= self.outer_momentum < 1:
            raise ConfigError(f"diloco needs outer_lr > 0 and outer_momentum in [0, 1), "
                              f"got {self.outer_lr} and {self.outer_momentum}")

    def _validate_phases(self) -> None:
        self.consensus.validate()
        if (self.phases or self.consensus.target != "none") and self.algorithm != "gossip":
            raise ConfigError(f"phases and consensus.target apply to algorithm gossip, not {self.algorithm}")
        for mode in self.phases:
            if mode not in PHASE_MODES:
                raise ConfigError(f"unknown phase mode '{mode}'; choose from: {', '.join(PHASE_MODES)}")
        boundaries = self.phase_boundaries()
        if self.phases and len(boundaries) != len(self.phases) - 1:
            raise ConfigError(f"phases has {len(self.phases)} modes but {len(boundaries)} boundaries "
                              f"(phase_epochs, or the lr milestones when phase_epochs is empty)")
        if boundaries != sorted(boundaries) or any(not 0 < b < self.epochs for b in boundaries):
            raise ConfigError(f"phase_epochs must be increasing epochs in (0, {self.epochs}), got {boundaries}")
        if "controlled" in self.phase_modes() and self.consensus.target == "none":
            raise ConfigError("a controlled phase needs consensus.target (constant, gradient or run:DIR)")

    def phase_boundaries(self) -> list[float]:
        """Epochs where one phase ends and the next begins."""
        return list(self.phase_epochs or (self.milestones if self.phases else []))

    def phase_modes(self) -> list[str]:
        """One mode per phase; without ``phases``, gossip is one phase, controlled if a target is set."""
        if self.phases:
            return list(self.phases)
        return ["controlled" if self.consensus.target != "none" else "gossip"]

    def switch_at(self, steps_per_epoch: int) -> int:
        """Post-local SGD's switch step t′: switch_step, switch_epoch, or the first milestone."""
        if self.switch_step is not None:
            return self.switch_step
        epoch = self.switch_epoch if self.switch_epoch is not None else (self.milestones or [0.0])[0]
        return round(epoch * steps_per_epoch)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _positive_int(cfg: Config, *names: str) -> None:
    for name in names:
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name} must be a positive integer, got {getattr(cfg, name)}")


def _choice(cfg: Config, name: str, allowed: tuple[str, ...]) -> None:
    if getattr(cfg, name) not in allowed:
        raise ConfigError(f"unknown {name} '{getattr(cfg, name)}'; choose one of: {', '.join(allowed)}")


def _coerce(name: str, value: Any, annotation: str) -> Any:
    """Check a value against the field's type (from its annotation string) and convert ints to floats."""
    if annotation == "list[str]":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{name} must be a list of names, got {value!r}")
        return value
    if "list" in annotation:
        if not isinstance(value, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{name} must be a list of numbers, got {value!r}")
        return [float(v) for v in value]
    if value is None and "None" in annotation:
        return None
    if annotation.startswith("bool"):
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, got {value!r}")
        return value
    if annotation.startswith("int"):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
        return value
    if annotation.startswith("float"):
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ConfigError(f"{name} must be a number, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, got {value!r}")
    return value


def _build(cls, values: Any, prefix: str = ""):
    """A dataclass from a mapping, checking keys and types; sections are nested dataclasses."""
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix.rstrip('.')} must be a section of keys, got {values!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"unknown config key '{prefix}{unknown[0]}'; known keys: "
                          f"{', '.join(prefix + f for f in fields)}")
    kwargs = {}
    for key, value in values.items():
        section = SECTIONS.get(str(fields[key].type))
        kwargs[key] = (_build(section, value, f"{prefix}{key}.") if section
                       else _coerce(prefix + key, value, str(fields[key].type)))
    return cls(**kwargs)


SECTIONS = {"ConsensusConfig": ConsensusConfig}


def from_dict(values: dict[str, Any]) -> Config:
    """Build and validate a Config; unknown keys are refused with the list of known ones."""
    return _build(Config, values).validate()


def parse_override(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE parsed as YAML (so ``lr=0.1`` is a float, ``milestones=[10,20]`` a list)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects KEY=VALUE, got '{text}'")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def set_dotted(values: dict[str, Any], key: str, value: Any) -> None:
    """Set ``a.b.c`` in a nested dict, creating sections as needed."""
    *parents, leaf = key.split(".")
    node = values
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {key}: '{part}' is not a section")
    node[leaf] = value


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """Defaults, then the YAML file (if any), then each ``KEY=VALUE`` override in order."""
    values: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file '{path}' does not exist") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config file '{path}' is not valid YAML: {str(e).splitlines()[0]}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file '{path}' must hold a mapping of keys to values")
        values = loaded or {}
    for text in overrides:
        set_dotted(values, *parse_override(text))
    return from_dict(values)
