"""Run directories and reports: config.yaml, metrics.jsonl, summary.json, checkpoint.pt, tables."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
from pathlib import Path

import torch
import yaml

from .config import Config, ConfigError, read_yaml
from .checkpoint import FORMAT


RUN_FILES = ("config.yaml", "metrics.jsonl", "metrics.csv", "summary.json", "checkpoint.pt")
RUN_DIRS = ("tensorboard",)  # written by logger: tensorboard
MARKER = ".gossamer-run"  # written into every run directory: its run files were written by gossamer
STAGING = ".gossamer-new"  # where a run that replaces another one writes until its first checkpoint


def write_atomic(path: Path, write) -> None:
    """``write(file)`` into a temporary file, flushed to disk, then renamed onto ``path``: a
    reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def is_run(path: Path) -> bool:
    """Whether ``path`` holds a gossamer run (its marker, or the files of a run from before it)."""
    names = {p.name for p in path.iterdir()} if path.is_dir() else set()
    return MARKER in names or ({"config.yaml", "metrics.jsonl"} <= names and bool({"checkpoint.pt", "summary.json"} & names))


class RunDir:
    """A run's output folder: config.yaml, metrics.jsonl, summary.json, checkpoint.pt (and a marker).

    - A missing or empty folder is written in place.
    - A non-empty one is refused unless ``overwrite``. Then it must hold a gossamer run (no file
      the run would write may be someone else's), and nothing of the old run is removed until the
      new one has written its first checkpoint: until then it writes into a staging folder inside
      (a new run that fails to start or diverges before that leaves the old run as it was).
      Files that are not a run's stay.
    - ``resume``: the folder's own run continues; metrics.jsonl is cut back to the checkpoint.
    Every file but metrics.jsonl is written atomically; metrics.jsonl is flushed to disk at every
    checkpoint and evaluation.
    """

    def __init__(self, path: str | Path, overwrite: bool = False, logger: str = "none",
                 resume_step: int | None = None):
        self.path = Path(path)
        self.dir = self.path
        self.checkpoints = 0  # written by this run
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"--out '{_short(self.path)}' exists and is not a directory")
        if resume_step is None and self.path.is_dir() and any(p.name != STAGING for p in self.path.iterdir()):
            if not overwrite:
                raise ConfigError(f"--out '{_short(self.path)}' is not empty; pass --overwrite to replace its run")
            foreign = [n for n in RUN_FILES if (self.path / n).exists()] if not is_run(self.path) else []
            if foreign:
                raise ConfigError(f"--out '{_short(self.path)}' holds {foreign[0]}, which no gossamer run wrote; "
                                  f"--overwrite replaces only a run's own files: choose another --out")
            self.dir = self.path / STAGING
        try:
            if self.dir != self.path:
                shutil.rmtree(self.dir, ignore_errors=True)
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / MARKER).write_text("written by gossamer: --overwrite may replace the run files here\n")
            metrics = self.dir / "metrics.jsonl"
            if resume_step is not None:
                kept = [line for line in metrics.read_text().splitlines()
                        if line and json.loads(line).get("step", 0) <= resume_step]
                write_atomic(metrics, lambda f: f.write("".join(line + "\n" for line in kept).encode()))
            self._metrics = open(metrics, "a" if resume_step is not None else "w")
            self._logger = make_logger(logger, self.dir, resume_step)
        except OSError as e:
            raise ConfigError(f"--out '{_short(self.path)}': cannot write a run there ({e.strerror or e})") from None

    def write_config(self, cfg: Config) -> None:
        text = yaml.safe_dump(cfg.to_dict(), sort_keys=False)
        write_atomic(self.dir / "config.yaml", lambda f: f.write(text.encode()))

    def row(self, row: dict) -> None:
        self._metrics.write(json.dumps(row) + "\n")
        if self._logger is not None:
            self._logger.row(row)
        if any(k.startswith("test_") for k in row):  # an evaluation
            self.flush()

    def flush(self) -> None:
        self._metrics.flush()
        os.fsync(self._metrics.fileno())

    def checkpoint(self, state: dict) -> None:
        """The rows written so far reach the disk, then the checkpoint replaces the previous one;
        the first checkpoint of a run that replaces another one moves it into place."""
        self.flush()
        write_atomic(self.dir / "checkpoint.pt", lambda f: torch.save(state, f))
        self.checkpoints += 1
        if self.dir != self.path:
            self._commit()

    def _commit(self) -> None:
        """Replace the old run's files by the staged ones (the new run now has a checkpoint)."""
        for name in RUN_FILES:
            (self.path / name).unlink(missing_ok=True)
        for name in RUN_DIRS:
            shutil.rmtree(self.path / name, ignore_errors=True)
        for name in (*RUN_FILES, *RUN_DIRS, MARKER):
            if (self.dir / name).exists():
                os.replace(self.dir / name, self.path / name)
        self.dir.rmdir()
        self.dir = self.path  # open files (metrics, logger) moved with their directory entries
        if self._logger is not None:
            self._logger.moved(self.path)

    def write_summary(self, summary: dict) -> None:
        text = json.dumps(summary, indent=2) + "\n"
        write_atomic(self.dir / "summary.json", lambda f: f.write(text.encode()))

    def close(self) -> None:
        """Close the metrics file; a staged run that never checkpointed is removed."""
        self._metrics.close()
        if self._logger is not None:
            self._logger.close()
        if self.dir != self.path:
            shutil.rmtree(self.dir, ignore_errors=True)


def scalars(row: dict, prefix: str = "") -> dict[str, float]:
    """The numbers of a metric row, nested sections flattened to ``section/key`` (the per-layer
    Ξ²), booleans as 0/1; values that are not numbers (None) are left out."""
    out = {}
    for key, value in row.items():
        if isinstance(value, dict):
            out.update(scalars(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float)):
            out[prefix + key] = float(value)
    return out


class CSVLog:
    """``metrics.csv``: one line per metric row, a column per scalar (a column that appears later,
    such as the test accuracy at the first evaluation, rewrites the header; earlier rows leave it
    empty). Resuming after ``resume_step`` keeps the rows up to that step."""

    def __init__(self, folder: Path, resume_step: int | None = None):
        self.path = folder / "metrics.csv"
        old = self._read() if resume_step is not None else []
        self.columns = list(old[0]) if old else []
        self._write([r for r in old if float(r["step"]) <= resume_step] if old else [])

    def _read(self) -> list[dict]:
        if not self.path.exists():
            return []
        with open(self.path, newline="") as f:
            return list(csv.DictReader(f))

    def _write(self, rows: list[dict]) -> None:
        self._file = open(self.path, "w", newline="")
        self._writer = csv.DictWriter(self._file, self.columns)
        if self.columns:
            self._writer.writeheader()
            self._writer.writerows(rows)

    def row(self, row: dict) -> None:
        values = scalars(row)
        new = [k for k in values if k not in self.columns]
        if new:
            self._file.close()
            old = self._read()
            self.columns += new
            self._write(old)
        self._writer.writerow(values)

    def moved(self, folder: Path) -> None:
        """The file was moved (with its folder's run files) into ``folder``."""
        self.path = folder / "metrics.csv"

    def close(self) -> None:
        self._file.close()


class TensorBoardLog:
    """TensorBoard scalars in ``tensorboard/``, one per metric at its row's step (``tensorboard
    --logdir``). Resuming after ``resume_step`` purges the events written after it."""

    def __init__(self, folder: Path, resume_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(folder / "tensorboard"),
                                    purge_step=None if resume_step is None else resume_step + 1)

    def row(self, row: dict) -> None:
        for tag, value in scalars(row).items():
            if tag != "step":
                self.writer.add_scalar(tag, value, row["step"])

    def moved(self, folder: Path) -> None:
        pass  # the writer's open event file moved with its folder

    def close(self) -> None:
        self.writer.close()


def make_logger(name: str, folder: Path, resume_step: int | None = None) -> CSVLog | TensorBoardLog | None:
    """The ``logger`` of a run directory: ``none``, ``csv`` or ``tensorboard``."""
    return {"none": lambda *a: None, "csv": CSVLog, "tensorboard": TensorBoardLog}[name](folder, resume_step)


def load_checkpoint(path: str | Path) -> dict:
    """The checkpoint of the run in ``path`` (tensors on the CPU), loaded with weights_only=True."""
    file = Path(path) / "checkpoint.pt"
    if not file.is_file():
        raise ConfigError(f"--resume '{_short(path)}': no checkpoint.pt there (not a gossamer run, or it "
                          f"stopped before its first checkpoint)")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated or foreign file
        raise ConfigError(f"--resume '{_short(path)}': checkpoint.pt cannot be read ({str(e).splitlines()[0][:100]})") \
            from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else None
        raise ConfigError(f"--resume '{_short(path)}': checkpoint.pt is of format {found}, this gossamer reads "
                          f"format {FORMAT} (schedules' state changed); start the run again")
    return state


def saved_config(path: str | Path) -> dict:
    """The resolved config a run in ``path`` was started with (its config.yaml)."""
    file = Path(path) / "config.yaml"
    if not is_run(Path(path)) or not file.is_file():
        raise ConfigError(f"--resume '{_short(path)}' is not a gossamer run directory (no config.yaml)")
    values = read_yaml(file)
    if not isinstance(values, dict):
        raise ConfigError(f"'{_short(file)}' must hold a mapping of keys to values")
    return values


def _short(value) -> str:
    text = str(value)
    return text if len(text) <= 100 else text[:97] + "..."


def reference_trajectory(cfg: Config) -> list[float] | None:
    """For a ``consensus.target: run:DIR``, the Ξ_t² that run had at steps 1, 2, … (as far as its
    metrics.jsonl has every step); None for other targets.

    The run must have the same ``workers``, ``batch_size`` and ``num_samples`` (checked where its
    config has them), so that step t means the same point of training."""
    run_dir = getattr(cfg, "consensus", None) and cfg.consensus.reference_run
    if not run_dir:
        return None
    return read_trajectory(run_dir, {key: getattr(cfg, key, None) for key in ("workers", "batch_size", "num_samples")})


def read_trajectory(run_dir: str | Path, expect: dict) -> list[float]:
    """The Ξ_t² of the run in ``run_dir`` at steps 1, 2, … (as far as its metrics.jsonl has every
    step), after checking that its config has the ``expect``ed values where it has those keys."""
    path, what = Path(run_dir), f"consensus.target run:{_short(run_dir)}"
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        raise ConfigError(f"{what}: no metrics.jsonl there (not a gossamer run)")
    ref_cfg = read_yaml(path / "config.yaml", f"{what}: config.yaml") if (path / "config.yaml").exists() else {}
    if not isinstance(ref_cfg, dict):
        raise ConfigError(f"{what}: config.yaml must hold a mapping of keys to values")
    for key, value in expect.items():
        if key in ref_cfg and ref_cfg[key] != value:
            raise ConfigError(f"{what} is incompatible: it has {key} = {_short(ref_cfg[key])}, this run {value}")
    by_step = {}
    for number, line in enumerate(_text(metrics, what).splitlines(), start=1):
        try:
            row = json.loads(line)
            step, xi_sq = row["step"], float(row["consensus_distance_sq"])
        except (ValueError, TypeError, KeyError):
            raise ConfigError(f"{what}: metrics.jsonl line {number} has no step and numeric "
                              f"consensus_distance_sq: {_short(line)}") from None
        if not math.isfinite(xi_sq):
            raise ConfigError(f"{what}: metrics.jsonl line {number} has consensus_distance_sq = {xi_sq}; "
                              f"a reference must be finite")
        by_step[step] = xi_sq
    steps = 0
    while steps + 1 in by_step:
        steps += 1
    return [by_step[s] for s in range(1, steps + 1)]


def _text(file: Path, what: str) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what}: {file.name} cannot be read ({getattr(e, 'strerror', None) or e})") from None


def read_summary(path: str | Path, keys: tuple[str, ...] = ()) -> dict:
    """The summary.json of a finished run, which must be a JSON object with ``keys``."""
    file = Path(path) / "summary.json"
    if not file.is_file():
        raise ConfigError(f"'{_short(path)}' holds no summary.json (not a finished gossamer run)")
    try:
        summary = json.loads(_text(file, f"'{_short(path)}'"))
    except ValueError:
        summary = None
    if not isinstance(summary, dict):
        raise ConfigError(f"'{_short(file)}' is not a summary (a JSON object of a finished run)")
    missing = [k for k in keys if k not in summary]
    if missing:
        raise ConfigError(f"'{_short(file)}' lacks {', '.join(missing)} (not a finished gossamer run)")
    return summary


COMPARED = ("final_consensus_distance_sq", "comm_rounds", "bytes_per_worker")  # what every compared summary has
# the test metrics a summary may hold: key, header for x̄, header for the local mean, format
TEST_METRICS = [("test_accuracy", "test acc", "local acc", "{:.4f}"),
                ("test_loss", "test loss", "local loss", "{:.4f}"),
                ("test_perplexity", "test ppl", "local ppl", "{:.2f}")]


def test_metrics(summaries) -> list[tuple[str, str, str, str]]:
    """The entries of TEST_METRICS that every summary has, for x̄ and as the local mean (accuracy
    for classifiers; loss and perplexity for language models)."""
    return [m for m in TEST_METRICS if all(m[0] in s and m[0] + "_local_mean" in s for s in summaries)]


def comparison_table(runs: dict[str, dict]) -> str:
    """A Markdown table of named run summaries: the test metrics, final Ξ², communication."""
    metrics = test_metrics(runs.values())
    head = ["run", *[h for _, x_bar, local, _ in metrics for h in (x_bar, local)], "final Ξ²", "comm rounds",
            "MB/worker"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in runs.items():
        cells = [name, *[fmt.format(s[k + suffix]) for k, _, _, fmt in metrics for suffix in ("", "_local_mean")],
                 f"{s['final_consensus_distance_sq']:.3e}", f"{s['comm_rounds']:d}",
                 f"{s['bytes_per_worker'] / 1e6:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


AXES = {"steps": ("step", "step"), "epochs": ("epoch", "epoch"), "time": ("sim_seconds", "simulated time (s)")}
"""``--x`` of compare and plot: the metric-row key it reads and its label."""


def read_rows(path: str | Path) -> list[dict]:
    """The metric rows of a run (its metrics.jsonl), each a JSON object with a step."""
    file = Path(path) / "metrics.jsonl"
    if not file.is_file():
        raise ConfigError(f"'{_short(path)}' holds no metrics.jsonl (not a gossamer run)")
    rows = []
    for number, line in enumerate(_text(file, f"'{_short(path)}'").splitlines(), start=1):
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict) or "step" not in row:
            raise ConfigError(f"'{_short(file)}' line {number} is not a metric row: {_short(line)}")
        rows.append(row)
    return rows


def headline(rows: list[dict]) -> str:
    """The test metric a run is judged by: accuracy, or the test loss of a language model."""
    return "test_accuracy" if any("test_accuracy" in r for r in rows) else "test_loss"


def _series(name: str, rows: list[dict], x: str, y: str) -> tuple[list[float], list[float]]:
    """(x, y) of every row that has y; the x key must be in them (sim_seconds: a network run)."""
    key = AXES[x][0]
    points = [(r[key], r[y]) for r in rows if isinstance(r.get(y), (int, float)) and key in r]
    if not points:
        why = "it was trained without a network section" if x == "time" and not any(key in r for r in rows) \
            else f"no metric row has {y}"
        raise ConfigError(f"'{_short(name)}' has no {y} against {x} to show: {why}")
    return [p[0] for p in points], [p[1] for p in points]


def axis_table(runs: dict[str, Path], x: str) -> str:
    """A Markdown table of finished runs along ``x`` (steps, epochs or simulated time): the
    headline test metric at the end, the run's length, where it first reached its target, and
    the metric at an equal budget — the shortest run's length (each run's last evaluation at or
    before it)."""
    key, unit = AXES[x]
    summaries = {name: read_summary(path, ("steps",)) for name, path in runs.items()}
    rows = {name: read_rows(path) for name, path in runs.items()}
    metric = headline(next(iter(rows.values())))
    series = {name: _series(name, rows[name], x, metric) for name in runs}
    budget = min(xs[-1] for xs, _ in series.values())
    head = ["run", metric, unit, *(["communication"] if x == "time" else []), f"{unit} to target",
            f"{metric} at {budget:.4g}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in runs:
        s, (xs, ys) = summaries[name], series[name]
        reached = next((r[key] for r in rows[name] if r["step"] == s.get("steps_to_target")), None)
        at_budget = [y for v, y in zip(xs, ys) if v <= budget]
        cells = [name, f"{ys[-1]:.4f}", f"{rows[name][-1][key]:.4g}",
                 *([f"{s['sim_seconds_comm'] / s['sim_seconds']:.0%}"] if x == "time" else []),
                 "—" if reached is None else f"{reached:.4g}", f"{at_budget[-1]:.4f}" if at_budget else "—"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_runs(runs: dict[str, Path], x: str, y: str | None, out: Path, title: str = "") -> None:
    """One PNG: ``y`` (default: the runs' headline test metric) against ``x`` for every run."""
    rows = {name: read_rows(path) for name, path in runs.items()}
    y = y or headline(next(iter(rows.values())))
    series = {name: _series(name, r, x, y) for name, r in rows.items()}  # every run checked before drawing
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, (xs, ys) in series.items():
        ax.plot(xs, ys, label=name, linewidth=1, marker="." if len(xs) < 50 else None)
    ax.set(xlabel=AXES[x][1], ylabel=y, title=title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_consensus(metrics: dict[str, Path], phase_epochs: list[float], out: Path, title: str) -> None:
    """Ξ² over training (log scale), one line per run, learning-rate phases marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, file in metrics.items():
        rows = [json.loads(line) for line in Path(file).read_text().splitlines()]
        ax.plot([r["epoch"] for r in rows], [max(r["consensus_distance_sq"], 1e-16) for r in rows],
                label=name, linewidth=1)
    for epoch in phase_epochs:
        ax.axvline(epoch, color="grey", linestyle="--", linewidth=0.8)
    ax.set(yscale="log", xlabel="epoch", ylabel="consensus distance Ξ²", title=title)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_tradeoff(summaries: dict[str, list[dict]], out: Path, title: str) -> None:
    """The test metric of x̄ against communication rounds (log scale) and, where every run measured
    it, against sharpness: one point per variant, mean ± std over its seeds' summaries."""
    import statistics

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [s for group in summaries.values() for s in group]
    metric = "test_accuracy" if all("test_accuracy" in s for s in runs) else "test_loss"
    panels = [("comm_rounds", "communication rounds", "log")]
    if all("sharpness" in s for s in runs):
        panels.append(("sharpness", "sharpness of x̄ (top Hessian eigenvalue of the training loss)", "linear"))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for ax, (key, label, scale) in zip(axes[0], panels):
        for name, group in summaries.items():
            x, y = [s[key] for s in group], [s[metric] for s in group]
            spread = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in (x, y)]
            point = statistics.mean(x), statistics.mean(y)
            ax.errorbar(*point, xerr=spread[0], yerr=spread[1], fmt="o", capsize=3, markersize=4)
            ax.annotate(name, point, textcoords="offset points", xytext=(4, 3), fontsize=6)
        ax.set(xscale=scale, xlabel=label, ylabel=f"{metric.replace('_', ' ')} (x̄)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
