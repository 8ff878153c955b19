"""Where a run's metric rows go besides metrics.jsonl (``logger``: one name or a list): metrics.csv,
TensorBoard, Weights & Biases, MLflow. Each logger writes inside the run directory, continues on
``--resume`` (the rows after the checkpoint written again) and receives the config and the summary.

- ``csv``: metrics.csv; ``tensorboard``: tensorboard/ (``tensorboard --logdir``);
- ``wandb``: a Weights & Biases run in wandb/ — online, or offline with ``WANDB_MODE=offline``
  (``wandb sync`` uploads it later); project ``gossamer`` unless ``WANDB_PROJECT`` says otherwise;
  a resumed run continues the same W&B run (its id is kept in wandb/gossamer-run-id);
- ``mlflow``: an MLflow run in the file store mlruns/ (``mlflow ui --backend-store-uri
  ./RUN/mlruns``), experiment ``gossamer``: metrics by step, the config as parameters and
  config.yaml, the summary as summary.json; a resumed run continues the same MLflow run. MLflow 3
  keeps its file store in maintenance mode behind ``MLFLOW_ALLOW_FILE_STORE``, which this logger
  sets: a run directory needs no database or server.

W&B and MLflow keep absolute paths into the run directory while it runs, so a run that replaces
another (``--overwrite``, written in a staging folder until its first checkpoint) cannot use them.
"""

from __future__ import annotations

import csv
import os
import uuid
from pathlib import Path

from .registry import ConfigError, Registry

# an entry's build(folder, resume_step) is the logger of a run ("none", the default, is none: no entry)
LOGGERS = Registry("logger", traits={
    "writes": "the names it writes in the run directory (rundir.py: a run's own files)",
    "package": "the optional package it needs, refused without it: pip install 'gossamer[NAME]' (config.py)",
    "in_place": "True: it writes by absolute path while the run runs, so not into a staging folder (rundir.py)"})


def logger_names(logger: str | list[str]) -> list[str]:
    """The loggers of a ``logger`` value (one name, or a list), ``none`` left out."""
    return [name for name in ([logger] if isinstance(logger, str) else logger) if name != "none"]


def logger_files(logger: str | list[str]) -> list[str]:
    """The names the loggers of a ``logger`` value write in the run directory (an unknown one: none)."""
    return [name for logged in logger_names(logger) if logged in LOGGERS.names()
            for name in LOGGERS[logged].traits["writes"]]


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


@LOGGERS.register("csv", writes=("metrics.csv",), help="metrics.csv, a column per scalar")
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


@LOGGERS.register("tensorboard", writes=("tensorboard",), package="tensorboard",
                  help="TensorBoard scalars in tensorboard/")
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


@LOGGERS.register("wandb", writes=("wandb",), package="wandb", in_place=True,
                  help="a Weights & Biases run in wandb/ (online, or offline with WANDB_MODE=offline)")
class WandbLog:
    """A Weights & Biases run in ``wandb/`` (module docstring)."""

    def __init__(self, folder: Path, resume_step: int | None = None):
        import wandb

        (folder / "wandb").mkdir(exist_ok=True)
        try:
            self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "gossamer"), dir=str(folder),
                                  id=_run_id(folder / "wandb", resume_step), resume="allow",
                                  name=folder.resolve().name, settings=wandb.Settings(silent=True, console="off"))
        except wandb.errors.Error as e:  # no API key, no network, ...: one line
            reason = (str(e).splitlines() or [type(e).__name__])[0]
            raise ConfigError(f"logger wandb: {reason[:200]} (or log offline: WANDB_MODE=offline)") from None

    def config(self, values: dict) -> None:
        self.run.config.update(values, allow_val_change=True)

    def row(self, row: dict) -> None:
        self.run.log({k: v for k, v in scalars(row).items() if k != "step"}, step=row["step"])

    def summary(self, summary: dict) -> None:
        self.run.summary.update(scalars(summary))

    def moved(self, folder: Path) -> None:
        pass  # never staged (IN_PLACE)

    def close(self) -> None:
        self.run.finish()


@LOGGERS.register("mlflow", writes=("mlruns",), package="mlflow", in_place=True,
                  help="an MLflow run in the file store mlruns/")
class MLflowLog:
    """An MLflow run in the file store ``mlruns/`` (module docstring)."""

    def __init__(self, folder: Path, resume_step: int | None = None):
        os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=(folder / "mlruns").resolve().as_uri())
        known = (folder / "mlruns" / "gossamer-run-id").read_text().strip() if resume_step is not None and \
            (folder / "mlruns" / "gossamer-run-id").is_file() else None
        if known:
            self.run_id = known
            self.client.update_run(known, status="RUNNING")
            return
        experiment = self.client.get_experiment_by_name("gossamer")
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment("gossamer")
        self.run_id = self.client.create_run(experiment_id, run_name=folder.resolve().name).info.run_id
        (folder / "mlruns" / "gossamer-run-id").write_text(self.run_id + "\n")

    def config(self, values: dict) -> None:
        from mlflow.entities import Param

        self.client.log_dict(self.run_id, values, "config.yaml")
        logged = self.client.get_run(self.run_id).data.params  # a parameter is written once (a resume: again)
        params = [Param(k, str(v)[:6000]) for k, v in _flat(values).items() if k not in logged]
        if params:
            self.client.log_batch(self.run_id, params=params)

    def row(self, row: dict) -> None:
        from mlflow.entities import Metric

        self.client.log_batch(self.run_id, metrics=[Metric(k, v, 0, row["step"]) for k, v in scalars(row).items()
                                                    if k != "step"])

    def summary(self, summary: dict) -> None:
        self.client.log_dict(self.run_id, summary, "summary.json")

    def moved(self, folder: Path) -> None:
        pass  # never staged (IN_PLACE)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _flat(values: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def _run_id(folder: Path, resume_step: int | None) -> str:
    """The id of the logger's run in ``folder``: kept from the run being resumed, else a new one."""
    file = folder / "gossamer-run-id"
    if resume_step is not None and file.is_file():
        return file.read_text().strip()
    run_id = uuid.uuid4().hex[:16]
    file.write_text(run_id + "\n")
    return run_id


class Loggers:
    """The run's loggers, each given every row, the config and the summary."""

    def __init__(self, logger: str | list[str], folder: Path, resume_step: int | None = None):
        self.loggers = []
        try:
            for name in logger_names(logger):
                self.loggers.append(LOGGERS[name].build(folder, resume_step))
        except BaseException:
            self.close()
            raise

    def config(self, values: dict) -> None:
        for log in self.loggers:  # csv and tensorboard keep the rows only
            getattr(log, "config", lambda v: None)(values)

    def row(self, row: dict) -> None:
        for log in self.loggers:
            log.row(row)

    def summary(self, summary: dict) -> None:
        for log in self.loggers:
            getattr(log, "summary", lambda s: None)(summary)

    def moved(self, folder: Path) -> None:
        for log in self.loggers:
            log.moved(folder)

    def close(self) -> None:
        for log in self.loggers:
            log.close()
