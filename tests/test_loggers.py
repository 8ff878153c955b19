"""The experiment trackers (gossamer.loggers): Weights & Biases offline and an MLflow file store,
several at once, each holding the run's scalars by step, its config and its summary, and a
resumed run continuing the same tracker run."""

import json
import struct
from pathlib import Path

import pytest

from gossamer.cli import main

SMALL = ["workers=4", "epochs=1", "num_samples=1000", "algorithm=gossip"]
BLOCK = 32768  # the .wandb file: LevelDB's log format (records in 32 KiB blocks) after a 7-byte header


def train(out: Path, *overrides: str, flags: tuple[str, ...] = ()) -> int:
    return main(["train", "--quiet", "--out", str(out), *flags, *[a for o in (*SMALL, *overrides) for a in ("--set", o)]])


def wandb_records(folder: Path) -> list:
    """Every record of the offline W&B runs in ``folder`` (wandb/offline-run-*/run-*.wandb), parsed."""
    from wandb.proto import wandb_internal_pb2

    records = []
    for file in sorted(folder.glob("wandb/offline-run-*/run-*.wandb")):
        data, position, pending = file.read_bytes(), 7, b""
        while position + 7 <= len(data):
            room = BLOCK - position % BLOCK
            if room < 7:  # a block's tail too short for a header is padding
                position += room
                continue
            length, kind = struct.unpack("<HB", data[position + 4 : position + 7])
            pending += data[position + 7 : position + 7 + length]
            position += 7 + length
            if kind in (1, 4):  # a whole record, or the last fragment of one
                record = wandb_internal_pb2.Record()
                record.ParseFromString(pending)
                records.append(record)
                pending = b""
            elif kind == 0:
                break
    return records


def test_wandb_and_mlflow_hold_the_scalars_config_and_summary_and_continue_on_resume(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    out = tmp_path / "run"
    assert train(out, "logger=[wandb,mlflow,csv]", "checkpoint_every=0.5") == 0
    assert main(["train", "--quiet", "--resume", str(out), "--set", "epochs=2"]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    losses = {row["step"]: row["loss"] for row in rows}
    assert (out / "metrics.csv").is_file() and sorted(losses) == list(range(1, summary["steps"] + 1))

    records = wandb_records(out)
    kinds = [r.WhichOneof("record_type") for r in records]
    assert len({r.run.run_id for r in records if r.HasField("run")}) == 1  # the resume continued the W&B run
    logged = {}
    for r in records:
        if r.HasField("history"):
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            if "loss" in items:
                logged[r.history.step.num] = items["loss"]
    assert logged == pytest.approx(losses, rel=1e-6)
    config = {item.key: json.loads(item.value_json) for r in records if r.HasField("config") for item in r.config.update}
    assert config["algorithm"] == "gossip" and config["workers"] == 4 and config["epochs"] == 2
    final = {item.key: json.loads(item.value_json) for r in records if r.HasField("summary")
             for item in r.summary.update}
    assert final["test_accuracy"] == pytest.approx(summary["test_accuracy"]) and "summary" in kinds

    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=(out / "mlruns").as_uri())
    runs = client.search_runs([client.get_experiment_by_name("gossamer").experiment_id])
    assert len(runs) == 1  # the resume continued the MLflow run
    run = runs[0]
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "loss")}
    assert history == pytest.approx(losses, rel=1e-12)
    assert run.data.params["algorithm"] == "gossip" and run.data.params["consensus.target"] == "none"
    artifacts = Path(client.download_artifacts(run.info.run_id, "summary.json", str(tmp_path)))
    assert json.loads(artifacts.read_text()) == summary


def test_trackers_are_refused_where_a_run_replaces_another(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    out = tmp_path / "run"
    assert train(out) == 0
    capsys.readouterr()
    for logger in ("wandb", "mlflow"):
        assert train(out, f"logger={logger}", flags=("--overwrite",)) == 2
        assert capsys.readouterr().err == (f"gossamer: error: logger {logger} writes by absolute path while the run "
                                           f"runs, so a run that replaces another (--overwrite) cannot use it: "
                                           f"choose another --out\n")
    assert not (out / "wandb").exists() and not (out / "mlruns").exists()
