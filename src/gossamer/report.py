"""Run directories and reports: config.yaml, metrics.jsonl, summary.json, checkpoint.pt, tables."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import shutil
import signal
import sys
from pathlib import Path

import torch
import yaml

from .config import Config, ConfigError, read_yaml
from .checkpoint import READABLE
from .loggers import IN_PLACE, LOGGED, Loggers, logger_names
from .registry import short


RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json", "checkpoint.pt")  # what every run writes
MARKER = ".gossamer-run"  # in every run directory: the names its runs wrote (all --overwrite may replace)
MARKER_HEAD = "written by gossamer: --overwrite may replace the run files listed below"
LOCK = ".gossamer-lock"  # locked (flock) by the run that writes the directory
STAGING = ".gossamer-new"  # where a run that replaces another one writes until its first checkpoint
ASIDE = ".gossamer-aside"  # the replaced run's files while they are moved out of the way,
OLD = ".gossamer-old"  # and once all of them are (the new run's are moved in, then this is deleted)


def warn(message: str) -> None:
    """One line on stderr about something done that the user should know of."""
    print(f"gossamer: warning: {' '.join(message.split())}", file=sys.stderr)


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


def save(state: dict, f) -> None:
    """``torch.save`` into ``f``; a write that failed (a full disk) raises its OSError, not torch's
    "unexpected pos"."""
    try:
        torch.save(state, f)
    except RuntimeError as e:
        if isinstance(e.__context__, OSError):
            raise e.__context__ from None
        if "unexpected pos" in str(e):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)) from None
        raise


def is_run(path: Path) -> bool:
    """Whether ``path`` holds a gossamer run (its marker, or the files of a run from before it)."""
    names = {p.name for p in path.iterdir()} if path.is_dir() else set()
    return MARKER in names or ({"config.yaml", "metrics.jsonl"} <= names and bool({"checkpoint.pt", "summary.json"} & names))


def written(path: Path) -> set[str]:
    """The names the gossamer runs in ``path`` wrote, as its marker lists them (a marker or a run
    from before the list: the run files, and tensorboard/ where config.yaml has that logger)."""
    listed = (path / MARKER).read_text().splitlines()[1:] if (path / MARKER).is_file() else []
    if listed:
        return set(listed)
    try:
        logger = read_yaml(path / "config.yaml").get("logger", "none")
    except (ConfigError, AttributeError):
        logger = "none"
    return {*RUN_FILES, "metrics.csv", *(name for logged in logger_names(logger) for name in LOGGED.get(logged, ()))}


def _write_marker(folder: Path, names) -> None:
    text = "\n".join([MARKER_HEAD, *sorted(names)]) + "\n"
    write_atomic(folder / MARKER, lambda f: f.write(text.encode()))


def swap_in(path: Path, old: set[str]) -> None:
    """Replace the run in ``path`` (its names ``old``) by the one staged in STAGING, recoverably:
    the old run's files are moved into ASIDE, which is then renamed OLD (all of them are out),
    the new run's files are moved in, OLD is deleted. :func:`recover` finishes or undoes it
    after a kill at any point."""
    aside = path / ASIDE
    aside.mkdir()
    for name in sorted(old & {p.name for p in path.iterdir()}) + [MARKER]:
        os.replace(path / name, aside / name)
    os.replace(aside, path / OLD)
    _finish_swap(path)


def _finish_swap(path: Path) -> None:
    staging = path / STAGING
    if staging.is_dir():
        for p in sorted(staging.iterdir()):
            os.replace(p, path / p.name)
    shutil.rmtree(path / OLD)
    shutil.rmtree(staging, ignore_errors=True)


def recover(path: Path) -> str | None:
    """Repair what a killed run left in ``path`` (whose lock is held) and say what was done: a
    swap that had not moved all of the old run aside is undone, one that had is finished; a
    staging folder alone (a run that never checkpointed) is deleted."""
    if (path / ASIDE).is_dir():
        for p in (path / ASIDE).iterdir():
            os.replace(p, path / p.name)
        (path / ASIDE).rmdir()
        shutil.rmtree(path / STAGING, ignore_errors=True)
        return "a run that was replacing the run here was killed: restored the previous run"
    if (path / OLD).is_dir():
        _finish_swap(path)
        return "a run that was replacing the run here was killed after its first checkpoint: finished moving it in"
    shutil.rmtree(path / STAGING, ignore_errors=True)
    return None


@contextlib.contextmanager
def _signals_deferred():
    """Within the block SIGINT and SIGTERM wait (they arrive after it): a swap is not cut short."""
    signals = {signal.SIGINT, signal.SIGTERM}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


class RunLock:
    """A run directory held by one run: an exclusive flock on its LOCK file, which a second run
    into the folder finds taken (refused at once); :meth:`release` removes it. Once the lock is
    held, what a killed run left there is repaired (:func:`recover`), with one line on stderr."""

    def __init__(self, path: Path, option: str):
        self.path, self._fd = path, None
        try:
            while self._fd is None:
                fd = os.open(path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    raise ConfigError(f"{option} '{short(path)}' is in use by another run (its {LOCK} is locked); "
                                      f"wait for that run to end or choose another folder") from None
                if _same_file(fd, path / LOCK):
                    self._fd = fd
                else:  # its last holder removed it meanwhile: lock the file there now
                    os.close(fd)
            done = recover(path)
        except OSError as e:
            self.release()
            raise ConfigError(f"{option} '{short(path)}': cannot take it for this run ({e.strerror or e})") from None
        if done:
            warn(f"{option} '{short(path)}': {done}")

    def release(self) -> None:
        if self._fd is not None:
            (self.path / LOCK).unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


class RunDir:
    """A run's output folder: config.yaml, metrics.jsonl, summary.json, checkpoint.pt (and a marker).

    - It is locked for the life of the run (:class:`RunLock`; ``lock``: one already held).
    - A missing or empty folder is written in place.
    - A non-empty one is refused unless ``overwrite``. Then it must hold a gossamer run (its
      marker), no name the new run writes may be someone else's, and nothing of the old run is
      removed until the new one has written its first regular checkpoint (not one a signal asked
      for): until then it writes into a staging folder inside (a new run that fails to start,
      diverges or is stopped before that leaves the old run as it was); then the two are swapped
      (:func:`swap_in`). Only the names the old run wrote are replaced; other files stay.
    - ``resume``: the folder's own run continues; metrics.jsonl is cut back to the checkpoint.
    Every file but metrics.jsonl is written atomically; metrics.jsonl is flushed to disk at every
    checkpoint and evaluation. An OSError while writing (a full disk) is one line naming the file.
    """

    def __init__(self, path: str | Path, overwrite: bool = False, logger: str | list[str] = "none",
                 resume_step: int | None = None, lock: RunLock | None = None):
        self.path = Path(path)
        self.dir = self.path
        self.option = "--out" if resume_step is None else "--resume"
        self.checkpoints = 0  # written by this run
        self._metrics = self._logger = None
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"--out '{short(self.path)}' exists and is not a directory")
        with self._os_errors("cannot write a run there"):
            self.path.mkdir(parents=True, exist_ok=True)
        self._lock = lock or RunLock(self.path, self.option)
        try:
            names = {*RUN_FILES, *(name for logged in logger_names(logger) for name in LOGGED[logged])}
            old = self._check(names, overwrite, resume_step)
            staged = [name for name in logger_names(logger) if name in IN_PLACE] if old and resume_step is None else []
            if staged:
                raise ConfigError(f"logger {staged[0]} writes by absolute path while the run runs, so a run that "
                                  f"replaces another (--overwrite) cannot use it: choose another --out")
            with self._os_errors("cannot write a run there"):
                self._open(names, old, logger, resume_step)
        except BaseException:
            self.close()
            raise

    @contextlib.contextmanager
    def _os_errors(self, what: str):
        """An OSError within (a full disk, a read-only file system) → one line: ``what`` and the OS's reason."""
        try:
            yield
        except OSError as e:
            raise ConfigError(f"{self.option} '{short(self.path)}': {what} ({e.strerror or e})") from None

    def _check(self, names: set[str], overwrite: bool, resume_step: int | None) -> set[str]:
        """Refuse what would replace files the user had; returns the names the old run wrote
        (to replace: empty for a folder without a run)."""
        present = {p.name for p in self.path.iterdir()} - {LOCK}
        if not present:
            return set()
        if resume_step is None:
            if not overwrite:
                raise ConfigError(f"--out '{short(self.path)}' is not empty; pass --overwrite to replace its run")
            if MARKER not in present:
                theirs = sorted(set(RUN_FILES) & present)
                held = f": it holds {theirs[0]}, which no gossamer run wrote" if theirs else ""
                raise ConfigError(f"--out '{short(self.path)}' does not look like a gossamer run directory (no "
                                  f"{MARKER} marker){held}; nothing was changed: choose another --out")
        old = written(self.path)
        theirs = sorted((names & present) - old)
        if theirs:
            raise ConfigError(f"{self.option} '{short(self.path)}' holds {theirs[0]}, which no gossamer run wrote; "
                              f"a run replaces only its own files: choose another folder")
        return old

    def _open(self, names: set[str], old: set[str], logger: str | list[str], resume_step: int | None) -> None:
        """The marker (the names this run writes), metrics.jsonl and the logger's files, in place
        or (a run to replace) in the staging folder."""
        self._replaced = old
        if old and resume_step is None:
            self.dir = self.path / STAGING
            self.dir.mkdir()
        _write_marker(self.dir, names | (old if resume_step is not None else set()))
        metrics = self.dir / "metrics.jsonl"
        if resume_step is not None:
            self._cut(metrics, resume_step)
        self._metrics = open(metrics, "a" if resume_step is not None else "w")
        self._logger = Loggers(logger, self.dir, resume_step)

    def _cut(self, metrics: Path, step: int) -> None:
        """metrics.jsonl back to the rows up to ``step`` (the resumed run writes the rest again);
        a partial last line (a crash while it was written) is cut with a warning."""
        lines = metrics.read_text(errors="replace").split("\n")
        while len(lines) > 1 and lines[-2] and not lines[-2].strip("\x00"):  # a NUL-filled line: a crash's
            lines[-1] = lines.pop(-2) + lines[-1]                              # blocks, taken as a partial one
        if lines[-1]:
            warn(f"{short(metrics)} ends in a partial line (a crash while it was written): cut it")
        kept = []
        for number, line in enumerate(lines[:-1], start=1):
            try:
                row_step = json.loads(line)["step"] if line else None
            except (ValueError, TypeError, KeyError):
                raise ConfigError(f"--resume '{short(self.path)}': metrics.jsonl line {number} is not a metric "
                                  f"row: {short(line)}") from None
            if row_step is not None and row_step <= step:
                kept.append(line)
        write_atomic(metrics, lambda f: f.write("".join(line + "\n" for line in kept).encode()))

    def write_config(self, cfg: Config) -> None:
        text = yaml.safe_dump(cfg.to_dict(), sort_keys=False)
        with self._os_errors("cannot write config.yaml"):
            write_atomic(self.dir / "config.yaml", lambda f: f.write(text.encode()))
        self._logger.config(cfg.to_dict())

    def row(self, row: dict) -> None:
        with self._os_errors("cannot write metrics.jsonl"):
            self._metrics.write(json.dumps(row) + "\n")
            self._logger.row(row)
            if any(k.startswith("test_") for k in row):  # an evaluation
                self.flush()

    def flush(self) -> None:
        with self._os_errors("cannot write metrics.jsonl"):
            self._metrics.flush()
            os.fsync(self._metrics.fileno())

    def checkpoint(self, state: dict, stop: bool = False) -> None:
        """The rows written so far reach the disk, then the checkpoint replaces the previous one;
        the first regular checkpoint of a run that replaces another one swaps it in. A ``stop``
        checkpoint (a signal asked for it) of such a run is not written: the old run stays."""
        if stop and self.replacing:
            return
        self.flush()
        with self._os_errors("cannot write checkpoint.pt"):
            write_atomic(self.dir / "checkpoint.pt", lambda f: save(state, f))
        self.checkpoints += 1
        if self.replacing:
            with self._os_errors("cannot replace the old run's files"), _signals_deferred():
                swap_in(self.path, self._replaced)
            self.dir = self.path  # open files (metrics, logger) moved with their directory entries
            self._logger.moved(self.path)

    @property
    def replacing(self) -> bool:
        """Whether the run still writes into the staging folder (the old run is in place)."""
        return self.dir != self.path

    def write_summary(self, summary: dict) -> None:
        text = json.dumps(summary, indent=2) + "\n"
        with self._os_errors("cannot write summary.json"):
            write_atomic(self.dir / "summary.json", lambda f: f.write(text.encode()))
        self._logger.summary(summary)

    def close(self) -> None:
        """Close the files (what a full disk kept from them is lost), remove a staged run that
        never swapped in (or repair a swap that failed half way), let go of the folder."""
        try:
            for file in (self._metrics, self._logger):
                if file is not None:
                    with contextlib.suppress(OSError):
                        file.close()
            if self.replacing:
                with contextlib.suppress(OSError):
                    recover(self.path)
        finally:
            self._lock.release()


def load_checkpoint(path: str | Path) -> dict:
    """The checkpoint of the run in ``path`` (tensors on the CPU), loaded with weights_only=True."""
    file = Path(path) / "checkpoint.pt"
    if not file.is_file():
        raise ConfigError(f"--resume '{short(path)}': no checkpoint.pt there (not a gossamer run, or it "
                          f"stopped before its first checkpoint)")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # an empty, truncated or foreign file
        reason = str(e).strip().splitlines()[0][:100] if str(e).strip() else "it ends early: empty or truncated"
        raise ConfigError(f"--resume '{short(path)}': checkpoint.pt cannot be read ({reason})") from None
    if not isinstance(state, dict) or state.get("format") not in READABLE:
        found = state.get("format") if isinstance(state, dict) else None
        raise ConfigError(f"--resume '{short(path)}': checkpoint.pt is of format {found}, this gossamer reads "
                          f"formats {' and '.join(map(str, READABLE))} (the state it holds changed); start the run again")
    return state


def saved_config(path: str | Path) -> dict:
    """The resolved config a run in ``path`` was started with (its config.yaml)."""
    file = Path(path) / "config.yaml"
    if not is_run(Path(path)) or not file.is_file():
        raise ConfigError(f"--resume '{short(path)}' is not a gossamer run directory (no config.yaml)")
    values = read_yaml(file)
    if not isinstance(values, dict):
        raise ConfigError(f"'{short(file)}' must hold a mapping of keys to values")
    return values



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
    path, what = Path(run_dir), f"consensus.target run:{short(run_dir)}"
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        raise ConfigError(f"{what}: no metrics.jsonl there (not a gossamer run)")
    ref_cfg = read_yaml(path / "config.yaml", f"{what}: config.yaml") if (path / "config.yaml").exists() else {}
    if not isinstance(ref_cfg, dict):
        raise ConfigError(f"{what}: config.yaml must hold a mapping of keys to values")
    for key, value in expect.items():
        if key in ref_cfg and ref_cfg[key] != value:
            raise ConfigError(f"{what} is incompatible: it has {key} = {short(ref_cfg[key])}, this run {value}")
    by_step = {}
    for number, line in enumerate(_text(metrics, what).splitlines(), start=1):
        try:
            row = json.loads(line)
            step, xi_sq = row["step"], float(row["consensus_distance_sq"])
        except (ValueError, TypeError, KeyError):
            raise ConfigError(f"{what}: metrics.jsonl line {number} has no step and numeric "
                              f"consensus_distance_sq: {short(line)}") from None
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
        raise ConfigError(f"'{short(path)}' holds no summary.json (not a finished gossamer run)")
    try:
        summary = json.loads(_text(file, f"'{short(path)}'"))
    except ValueError:
        summary = None
    if not isinstance(summary, dict):
        raise ConfigError(f"'{short(file)}' is not a summary (a JSON object of a finished run)")
    missing = [k for k in keys if k not in summary]
    if missing:
        raise ConfigError(f"'{short(file)}' lacks {', '.join(missing)} (not a finished gossamer run)")
    return summary


COMPARED = ("final_consensus_distance_sq", "comm_rounds", "bytes_per_worker")  # what every compared summary has
# the test metrics a summary may hold: key, header for x̄, header for the local mean, format
TEST_METRICS = [("test_accuracy", "test acc", "local acc", "{:.4f}"),
                ("test_loss", "test loss", "local loss", "{:.4f}"),
                ("test_perplexity", "test ppl", "local ppl", "{:.2f}")]


def test_metrics(summaries) -> list[tuple[str, str, str, str]]:
    """The entries of TEST_METRICS that every summary has for x̄ (accuracy for classifiers; loss
    and perplexity for language models); the local mean is shown where a run has it (eval_local)."""
    return [m for m in TEST_METRICS if all(m[0] in s for s in summaries)]


def comparison_table(runs: dict[str, dict]) -> str:
    """A Markdown table of named run summaries: the test metrics, final Ξ², communication."""
    metrics = test_metrics(runs.values())
    head = ["run", *[h for _, x_bar, local, _ in metrics for h in (x_bar, local)], "final Ξ²", "comm rounds",
            "MB/worker"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in runs.items():
        cells = [name, *[fmt.format(s[k + suffix]) if k + suffix in s else "—"
                         for k, _, _, fmt in metrics for suffix in ("", "_local_mean")],
                 f"{s['final_consensus_distance_sq']:.3e}", f"{s['comm_rounds']:d}",
                 f"{s['bytes_per_worker'] / 1e6:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


AXES = {"steps": ("step", "step"), "epochs": ("epoch", "epoch"), "time": ("sim_seconds", "simulated time (s)"),
        "bytes": ("bytes_per_worker", "bytes sent per worker")}
"""``--x`` of compare and plot: the metric-row key it reads and its label (bytes: on a log scale)."""


def read_rows(path: str | Path) -> list[dict]:
    """The metric rows of a run (its metrics.jsonl), each a JSON object with a step."""
    file = Path(path) / "metrics.jsonl"
    if not file.is_file():
        raise ConfigError(f"'{short(path)}' holds no metrics.jsonl (not a gossamer run)")
    rows = []
    for number, line in enumerate(_text(file, f"'{short(path)}'").splitlines(), start=1):
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict) or "step" not in row:
            raise ConfigError(f"'{short(file)}' line {number} is not a metric row: {short(line)}")
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
        raise ConfigError(f"'{short(name)}' has no {y} against {x} to show: {why}")
    return [p[0] for p in points], [p[1] for p in points]


def axis_table(runs: dict[str, Path], x: str) -> str:
    """A Markdown table of finished runs along ``x`` (steps, epochs, simulated time or bytes): the
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


CONFIDENCE = 0.95  # the level of every interval over seeds in the repro tables


def t_quantile(q: float, df: int) -> float:
    """The q-quantile (1/2 < q < 1) of Student's t with ``df`` ≥ 1 degrees of freedom (scipy's)."""
    from scipy.stats import t

    if not (0.5 < q < 1 and isinstance(df, int) and df >= 1):
        raise ValueError(f"t_quantile needs 1/2 < q < 1 and an integer df >= 1, got q={q}, df={df}")
    return float(t.ppf(q, df))


def mean_ci(values: list[float], level: float = CONFIDENCE) -> tuple[float, float | None]:
    """(mean, half-width) of the Student t interval for the mean of K values: x̄ ± t_{(1+level)/2,
    K−1}·s/√K, s the sample standard deviation (None with one value: no interval). A paired
    difference is this interval of the per-seed differences."""
    k = len(values)
    mean = sum(values) / k
    if k == 1:
        return mean, None
    s = math.sqrt(sum((v - mean) ** 2 for v in values) / (k - 1))
    return mean, t_quantile((1 + level) / 2, k - 1) * s / math.sqrt(k)


def ci_cell(values: list[float], fmt: str) -> str:
    """"mean ± half-width" of :func:`mean_ci` in ``fmt`` (the half-width unsigned); the mean alone
    for one value."""
    mean, half = mean_ci(values)
    return fmt.format(mean) if half is None else f"{fmt.format(mean)} ± {fmt.replace('+', '').format(half)}"


def plot_runs(runs: dict[str, Path], x: str, y: str | None, out: Path, title: str = "") -> None:
    """One PNG: ``y`` (default: the runs' headline test metric) against ``x`` for every run."""
    rows = {name: read_rows(path) for name, path in runs.items()}
    y = y or headline(next(iter(rows.values())))
    series = {name: _series(name, r, x, y) for name, r in rows.items()}  # every run checked before drawing
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, (xs, ys) in series.items():
        ax.plot(xs, ys, label=name, linewidth=1, marker="." if len(xs) < 50 else None)
    ax.set(xlabel=AXES[x][1], ylabel=y, title=title, xscale="log" if x == "bytes" else "linear")
    ax.legend(fontsize=7)
    fig.tight_layout()
    try:
        write_atomic(out, lambda f: fig.savefig(f, format="png", dpi=120))
    except OSError as e:
        raise ConfigError(f"--out '{short(out)}': cannot write the plot there ({e.strerror or e})") from None
    finally:
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
    it, against sharpness: one point per variant, mean ± the 95 % interval over its seeds' summaries
    (:func:`mean_ci`)."""
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
            (mx, hx), (my, hy) = mean_ci(x), mean_ci(y)
            point = mx, my
            ax.errorbar(*point, xerr=hx or 0.0, yerr=hy or 0.0, fmt="o", capsize=3, markersize=4)
            ax.annotate(name, point, textcoords="offset points", xytext=(4, 3), fontsize=6)
        ax.set(xscale=scale, xlabel=label, ylabel=f"{metric.replace('_', ' ')} (x̄)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
