"""What every suite shares: :class:`Variant` and :class:`Suite`, the table of suites
(:data:`SUITES`, which each suite module adds its builder to with :func:`register`),
:func:`build_suite`, the CPU-scale base config, and where a variant's runs lie and how the
reports read them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..config import Config, ConfigError, load_config
from ..report import ci_cell
from ..rundir import read_rows, read_summary
from ..train import reached_target


SCALES = ("cpu", "paper")
PAPER_CONFIGS = Path(__file__).resolve().parents[3] / "configs" / "paper"


KONG_CIFAR = "kong2021-cifar10-resnet20-allreduce.yaml"


@dataclass
class Variant:
    """One line of a suite: a name and its config overrides (``{ref}`` = the seed's reference run);
    ``baseline``: the variant it is compared with, seed by seed, and whose tuned value it runs at
    (None: it is a baseline itself)."""

    name: str
    overrides: list[str]
    workers: int
    base_file: str | None = None  # paper scale: this variant's configs/paper file, if not the suite's
    baseline: str | None = None


def against(baseline: Variant, variants: list[Variant]) -> list[Variant]:
    """``baseline``, then ``variants``, each compared with it."""
    for v in variants:
        v.baseline = baseline.name
    return [baseline, *variants]


@dataclass
class Suite:
    title: str
    base: list[str]  # overrides shared by every variant (applied to base_file, if any)
    variants: list[Variant] = field(default_factory=list)
    reference: str | None = None  # name of the variant whose run controlled variants follow
    estimate_pairs: list[tuple[str, str]] = field(default_factory=list)  # (exact, estimate) controlled variants
    base_file: str | None = None  # paper scale: the configs/paper file every variant starts from
    report: Callable | None = None  # (suite, configs, out, seeds) → results.md body, plots written; default: Ξ²
    reports_diverged: bool = False  # whether report takes seeds where runs diverged (else it gets the others)

    def config(self, v: Variant, seed: int = 0, ref: str = "REF", extra: list[str] = ()) -> Config:
        """The config of variant ``v`` for one seed (``ref``: the reference run's directory), with
        ``extra`` overrides last."""
        path, name = None, v.base_file or self.base_file
        if name is not None:
            path = PAPER_CONFIGS / name
            if not path.is_file():
                raise ConfigError(f"--scale paper reads {path}, which is missing: run from a source checkout of gossamer")
        return load_config(path, [*self.base, f"workers={v.workers}", f"seed={seed}",
                                  *[o.replace("{ref}", ref) for o in v.overrides], *extra])


SUITES: dict[str, Callable[[str, bool], Suite]] = {}
"""Suite name → its builder ``(scale, quick) → Suite``, in the order the suite modules register
them (:func:`register`; ``repro/__init__.py`` imports every suite module)."""


def register(name: str) -> Callable[[Callable[[str, bool], Suite]], Callable[[str, bool], Suite]]:
    """Decorator: add the decorated builder to :data:`SUITES` as suite ``name`` (``gossamer repro NAME``)."""
    def add(builder: Callable[[str, bool], Suite]) -> Callable[[str, bool], Suite]:
        if name in SUITES:
            raise RuntimeError(f"repro suite '{name}' registered twice")
        SUITES[name] = builder
        return builder
    return add


def build_suite(name: str, scale: str = "cpu", quick: bool = False) -> Suite:
    if scale not in SCALES:
        raise ConfigError(f"unknown scale '{scale}'; choose one of: {', '.join(SCALES)}")
    if quick and scale != "cpu":
        raise ConfigError("--quick is the smoke-test version of --scale cpu; it does not apply to --scale paper")
    return SUITES[name](scale, quick)


def cpu_base(quick: bool, epochs: int) -> list[str]:
    # lr 0.0025 per worker scaled linearly with n (the papers scale 0.1 per 64 samples), warm-up,
    # decay ×0.1 at 50 % and 75 % of training, Nesterov momentum 0.9, weight decay 1e-4
    size = ["num_samples=1000", "batch_size=16"] if quick else ["num_samples=10000", "batch_size=16"]
    return [*size, f"epochs={epochs}", f"milestones=[{epochs / 2},{epochs * 3 / 4}]", "lr=0.0025",
            "lr_scaling=linear", f"warmup_epochs={0 if quick else 2}", "momentum=0.9", "nesterov=true",
            "weight_decay=1e-4", "eval_every=5", "model=cnn1d"]


def on_networks(rows: list[tuple[str, list[str]]], networks: tuple[str, ...], extra: list[str], workers: int,
                base_file: str | None) -> tuple[list[list[Variant]], dict[str, list[str]]]:
    """Each row (label, overrides) trained on each network, as "LABEL on NETWORK" (``extra`` after
    the network): the variants of each network, and each label's variant names by network."""
    by_network, names = [], {}
    for net in networks:
        runs = [Variant(f"{label} on {net}", [*overrides, f"network.preset={net}", *extra], workers, base_file)
                for label, overrides in rows]
        for (label, _), v in zip(rows, runs):
            names.setdefault(label, []).append(v.name)
        by_network.append(runs)
    return by_network, names


def slug(name: str) -> str:
    return name.replace(" ", "_").replace("=", "").replace("/", "-").replace(",", "").replace("(", "").replace(")", "")


def run_dir(name: str, out: Path, seed: int) -> Path:
    """The directory of variant ``name``'s run of ``seed``."""
    return out / f"{slug(name)}-seed{seed}"


def run_dirs(name: str, out: Path, seeds: range) -> list[Path]:
    return [run_dir(name, out, s) for s in seeds]


DIVERGED = "DIVERGED"  # the file a suite writes in a run directory whose training diverged (its message)


def read_summaries(name: str, out: Path, seeds: range) -> list[dict | None]:
    """The summaries of a variant's runs, seed by seed; None for a run that diverged."""
    return [None if (r / DIVERGED).is_file() else read_summary(r) for r in run_dirs(name, out, seeds)]


def target_rows(runs: list[Path], cfg) -> list[dict | None]:
    """Per run, its first evaluation row that reaches cfg's target (None where none does): what
    the loop reports as steps_to_target, for the suite's target whatever the runs were trained with."""
    return [next((r for r in read_rows(run) if any(k.startswith("test_") for k in r) and reached_target(cfg, r)),
                 None) for run in runs]


def target_cell(rows: list[dict | None], key: str, fmt: str) -> str:
    """Mean ± 95 % interval of ``key`` (step or sim_seconds) at the target over the seeds that reached it."""
    reached = [r[key] for r in rows if r is not None]
    if not reached:
        return "not reached"
    cell = ci_cell(reached, fmt)
    return cell if len(reached) == len(rows) else f"{cell} ({len(reached)} of {len(rows)} seeds)"
