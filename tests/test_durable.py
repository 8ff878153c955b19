"""Durable runs: exact resume after a stop, a signal or SIGKILL; atomic files; --overwrite that
loses nothing until the new run has a checkpoint."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gossamer import rundir
from gossamer.cli import main
from conftest import assert_same_state

SMALL = ["workers=4", "epochs=2", "num_samples=1000", "batch_size=16", "lr=0.05"]
S = 12  # steps per epoch


def sets(*overrides: str) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def summary(run: Path) -> dict:
    return {k: v for k, v in json.loads((run / "summary.json").read_text()).items() if not k.endswith("_seconds")}


def assert_same_run(a: Path, b: Path) -> None:
    """Bit for bit: the metric rows, the summary (but measured times) and the final state."""
    assert rows(a) == rows(b)
    assert summary(a) == summary(b)
    ca, cb = (torch.load(r / "checkpoint.pt", weights_only=True) for r in (a, b))
    assert_same_state(ca, cb, skip=("state.rng",))


def stop_with(signum: int, at_step: int, monkeypatch) -> None:
    """Deliver ``signum`` to this process while step ``at_step``'s row is written (mid-run)."""
    real = rundir.RunDir.row

    def row(self, r):
        real(self, r)
        if r["step"] == at_step:
            signal.raise_signal(signum)
    monkeypatch.setattr(rundir.RunDir, "row", row)


# the command line's stop, files and resume; every combination of algorithm, codec and optimizer
# resumes exactly in tests/test_resume.py
CASES = {
    "allreduce": ["algorithm=allreduce", "momentum=0.9"],
    "post-local-ef-sign": ["algorithm=post-local", "switch_step=5", "local_steps=2", "compression=ef-sign"],
    "gossip-controlled-run-dir": ["algorithm=gossip", "phases=[controlled,allreduce]", "phase_epochs=[1]",
                                  "consensus.target=run:{ref}", "consensus.factor=0.5", "momentum=0.9"],
    "gossip-frequency-sharpness": ["algorithm=gossip", "local_steps=2", "consensus.target=constant",
                                   "consensus.value=0.1", "consensus.action=frequency", "consensus.max_local_steps=6",
                                   "sharpness=true", "sharpness_samples=200"],
    "simulated-time": ["algorithm=hierarchical", "block_size=2", "local_steps=2", "network=ethernet-1g",
                       "network.workers_per_node=2", "compute_ms=2", "target_accuracy=0.15"],
}


@pytest.mark.parametrize("codec", ["ef-sign", "random-k:0.2"])
def test_post_local_with_compression_resumes_after_its_switch_to_a_longer_run(tmp_path, capsys, codec):
    """The reported failure (a KeyError on resume): the compressors exist from the start, and the
    phase entered is state. A run extended from its final checkpoint equals a run that long."""
    run = ["algorithm=post-local", "local_steps=2", "switch_epoch=1", f"compression={codec}", *SMALL]
    short, long = tmp_path / "short", tmp_path / "long"
    assert main(["train", "--quiet", "--out", str(short), *sets(*run, "epochs=2")]) == 0
    assert main(["train", "--quiet", "--resume", str(short), "--set", "epochs=3"]) == 0
    assert main(["train", "--quiet", "--out", str(long), *sets(*run, "epochs=3")]) == 0
    capsys.readouterr()
    assert_same_run(short, long)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    ref = tmp_path_factory.mktemp("ref") / "ring"
    assert main(["train", "--quiet", "--out", str(ref), *sets(*SMALL, "algorithm=gossip")]) == 0
    return ref


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_signal_mid_epoch_then_resume_gives_the_uninterrupted_run(name, tmp_path, capsys, monkeypatch, reference):
    overrides = [*SMALL, *(o.replace("{ref}", str(reference)) for o in CASES[name])]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert main(["train", "--quiet", "--out", str(straight), *sets(*overrides)]) == 0
    with monkeypatch.context() as m:
        stop_with(signal.SIGTERM, 7, m)
        code = main(["train", "--quiet", "--out", str(stopped), *sets(*overrides)])
    err = capsys.readouterr().err
    assert code == 143 and err.count("\n") == 1 and f"gossamer train --resume {stopped}" in err
    assert torch.load(stopped / "checkpoint.pt", weights_only=True)["step"] == 7
    assert [r["step"] for r in rows(stopped)][-1] == 7 and not (stopped / "summary.json").exists()
    assert main(["train", "--quiet", "--resume", str(stopped)]) == 0
    assert_same_run(straight, stopped)


def test_half_the_epochs_then_resume_with_more_epochs(tmp_path):
    straight, half = tmp_path / "straight", tmp_path / "half"
    overrides = [*SMALL, "algorithm=local", "local_steps=5", "momentum=0.9", "checkpoint_every=0.5"]
    assert main(["train", "--quiet", "--out", str(straight), *sets(*overrides)]) == 0
    assert main(["train", "--quiet", "--out", str(half), *sets(*overrides, "epochs=1")]) == 0
    assert main(["train", "--quiet", "--resume", str(half), *sets("epochs=2")]) == 0
    assert_same_run(straight, half)


def test_sigint_stops_with_130_and_a_second_resume_of_a_finished_run_is_refused(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        stop_with(signal.SIGINT, 3, m)
        assert main(["train", "--quiet", "--out", str(out), *sets(*SMALL)]) == 130
    assert main(["train", "--quiet", "--resume", str(out)]) == 0
    capsys.readouterr()
    assert main(["train", "--quiet", "--resume", str(out)]) == 2
    assert "finished (24 of 24 steps)" in capsys.readouterr().err


# the killed process: `gossamer train` whose run directory, once it has written the row of step
# KILLED_AT, says so on stdout and waits to be killed (mid-run, rows past the last checkpoint on disk)
KILLED_AT = 14
WAIT_FOR_SIGKILL = f"""
import sys, time
from gossamer import rundir
from gossamer.cli import main
row = rundir.RunDir.row
def row_then_wait(self, values):
    row(self, values)
    if values["step"] == {KILLED_AT}:
        print("ready", flush=True)
        time.sleep(600)
rundir.RunDir.row = row_then_wait
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.lifecycle
def test_sigkill_loses_at_most_the_rows_since_the_last_checkpoint(tmp_path):
    """A real process, killed with SIGKILL mid-run (after the row of step 14, the last checkpoint at
    step 12), resumes to the uninterrupted run's files. Event-driven: the process says when."""
    overrides = ["workers=4", "epochs=2", "num_samples=1000", "batch_size=16", "algorithm=gossip",
                 "checkpoint_every=0.25", "grad_backend=loop", "model=mlp"]
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", WAIT_FOR_SIGKILL, "train", "--quiet", "--out", str(killed),
                             *sets(*overrides)], env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n", proc.communicate(timeout=60)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.communicate()
    assert torch.load(killed / "checkpoint.pt", weights_only=True)["step"] == 12  # every quarter epoch (3 steps)
    steps = [r["step"] for r in rows(killed)]  # every row up to the checkpoint is on disk; later ones may be
    assert steps == list(range(1, len(steps) + 1)) and 12 <= len(steps) <= KILLED_AT
    assert main(["train", "--quiet", "--out", str(tmp_path / "straight"), *sets(*overrides)]) == 0  # one thread too
    assert main(["train", "--quiet", "--resume", str(killed)]) == 0
    assert_same_run(tmp_path / "straight", killed)


@pytest.mark.parametrize("change, allowed", [("eval_every=2", True), ("metrics_every=3", True), ("lr=0.5", False),
                                             ("algorithm=gossip", False), ("seed=1", False)])
def test_resume_accepts_only_changes_that_do_not_change_training(tmp_path, capsys, change, allowed):
    out = tmp_path / "run"
    assert main(["train", "--quiet", "--out", str(out), *sets(*SMALL, "epochs=1")]) == 0
    capsys.readouterr()
    code = main(["train", "--quiet", "--resume", str(out), "--set", "epochs=2", "--set", change])
    err = capsys.readouterr().err
    assert code == (0 if allowed else 2)
    if not allowed:
        assert f"differs from the run's in {change.split('=')[0]}" in err and err.count("\n") == 1


# ---------------------------------------------------------------- files


def test_overwrite_keeps_the_old_run_until_the_new_one_checkpoints(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    assert main(["train", "--quiet", "--out", str(out), *sets(*SMALL)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    # a new run that diverges before its first checkpoint leaves the old run as it was
    assert main(["train", "--quiet", "--overwrite", "--out", str(out), *sets(*SMALL, "lr=1e30")]) == 1
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # a new run stopped after its first checkpoint has replaced the old run
    with monkeypatch.context() as m:
        stop_with(signal.SIGTERM, S + 2, m)
        assert main(["train", "--quiet", "--overwrite", "--out", str(out), *sets(*SMALL, "seed=3")]) == 143
    assert not (out / "summary.json").exists() and len(rows(out)) == S + 2
    assert {p.name for p in out.iterdir()} == {"config.yaml", "metrics.jsonl", "checkpoint.pt", ".gossamer-run"}
    assert main(["train", "--quiet", "--resume", str(out)]) == 0


def test_a_users_config_in_out_is_never_replaced(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("config.yaml").write_text("workers: 4\nepochs: 1\nnum_samples: 1000\n")
    for flags in ([], ["--overwrite"]):
        assert main(["train", "config.yaml", "--quiet", "--out", ".", *flags]) == 2
    assert Path("config.yaml").read_text() == "workers: 4\nepochs: 1\nnum_samples: 1000\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_files_are_written_atomically(tmp_path, monkeypatch):
    """A crash inside a write leaves the previous file whole and no temporary behind."""
    target = tmp_path / "f.json"
    rundir.write_atomic(target, lambda f: f.write(b"old"))

    def crash(f):
        f.write(b"half")
        raise OSError("disk gone")
    with pytest.raises(OSError):
        rundir.write_atomic(target, crash)
    assert target.read_bytes() == b"old"


def test_checkpoints_hold_the_full_state_and_load_with_weights_only(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--quiet", "--out", str(out), *sets(*SMALL, "algorithm=diloco", "local_steps=3",
                                                              "optimizer=adam", "lr=0.003")]) == 0
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert state["step"] == 2 * S and state["config"]["algorithm"] == "diloco"
    assert state["optimizer"]["rows"]["steps"].tolist() == [2 * S] * 4  # each worker's Adam step count
    assert set(state["optimizer"]["rows"]) == {"exp_avg", "exp_avg_sq", "steps"}
    assert set(state["schedule"]["rows"]) == {"x_outer"} and "momentum" in state["schedule"]["outer"]["rows"]
    assert state["comm"]["rounds"] == 2 * S // 3 and state["rng"]["rows"]["torch"].shape[0] == 4
    assert (state["rng"]["rows"]["torch"] == state["rng"]["rows"]["torch"][0]).all()  # one process: its copies


def test_each_process_resumes_its_own_generator_state():
    """The checkpoint kept rank 0's torch generator and gave it to every rank (issue 45, item 22): each
    process's state is kept on its rows, and a process resumes from the copy on its own first row;
    a checkpoint from before (one state) still resumes."""
    from gossamer.checkpoint import local_rows, process_rng

    states = torch.stack([torch.full((5,), k, dtype=torch.uint8) for k in (0, 0, 7, 7)])  # 2 processes, 2 rows each
    state = {"rng": {"rows": {"torch": states}}}
    assert process_rng(local_rows(state, range(2, 4)))["torch"].tolist() == [7] * 5
    assert process_rng(local_rows(state, range(0, 2)))["torch"].tolist() == [0] * 5
    old = {"rng": {"torch": torch.arange(3, dtype=torch.uint8)}}
    assert process_rng(local_rows(old, range(2, 4)))["torch"].tolist() == [0, 1, 2]


def test_the_csv_log_of_a_resumed_run_equals_the_uninterrupted_ones(tmp_path, monkeypatch):
    overrides = [*SMALL, "algorithm=gossip", "logger=csv"]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert main(["train", "--quiet", "--out", str(straight), *sets(*overrides)]) == 0
    with monkeypatch.context() as m:
        stop_with(signal.SIGTERM, S + 3, m)  # after the first evaluation added the test columns
        assert main(["train", "--quiet", "--out", str(stopped), *sets(*overrides)]) == 143
    assert main(["train", "--quiet", "--resume", str(stopped)]) == 0
    assert (stopped / "metrics.csv").read_text() == (straight / "metrics.csv").read_text()


def test_a_checkpoint_of_format_4_resumes(tmp_path):
    """Format 4 kept one generator state (rank 0's): it still resumes, to the same run."""
    out, straight = tmp_path / "run", tmp_path / "straight"
    assert main(["train", "--quiet", "--out", str(straight), *sets(*SMALL, "epochs=2")]) == 0
    assert main(["train", "--quiet", "--out", str(out), *sets(*SMALL, "epochs=1")]) == 0
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    state["format"], state["rng"] = 4, {"torch": state["rng"]["rows"]["torch"][0]}
    torch.save(state, out / "checkpoint.pt")
    assert main(["train", "--quiet", "--resume", str(out), "--set", "epochs=2"]) == 0
    assert torch.equal(torch.load(out / "checkpoint.pt", weights_only=True)["rows"]["X"],
                       torch.load(straight / "checkpoint.pt", weights_only=True)["rows"]["X"])
