"""Run directories: creating, locking and reading them (config.yaml, metrics.jsonl, summary.json,
checkpoint.pt), refusing to overwrite what no gossamer run wrote, replacing a run recoverably."""

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
import time
from pathlib import Path

import torch
import yaml

from .config import Config, ConfigError
from .config_yaml import read_yaml
from .checkpoint import READABLE
from .loggers import LOGGERS, Loggers, logger_files, logger_names
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
    return {*RUN_FILES, "metrics.csv", *logger_files(logger)}


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
    - ``extra``: the names of other files the run writes there (an event log).
    Every file but metrics.jsonl is written atomically; metrics.jsonl is flushed to disk at every
    checkpoint and evaluation. An OSError while writing (a full disk) is one line naming the file.
    """

    def __init__(self, path: str | Path, overwrite: bool = False, logger: str | list[str] = "none",
                 resume_step: int | None = None, lock: RunLock | None = None, extra: tuple[str, ...] = ()):
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
            names = {*RUN_FILES, *logger_files(logger), *extra}
            old = self._check(names, overwrite, resume_step)
            staged = [name for name in logger_names(logger) if LOGGERS[name].traits.get("in_place")] \
                if old and resume_step is None else []
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
        self.publish()

    def publish(self) -> None:
        """A run that replaces another one takes its place now (its first regular checkpoint, or
        the end of a run that writes none: AD-PSGD's coordinator); nothing where it does not."""
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


def default_out(prefix: str) -> Path:
    """runs/PREFIX-TIME: where a run goes without --out."""
    return Path("runs") / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"


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
