"""``gossamer train --seeds K --sweep KEY=[...] --jobs J``: every seed × swept value is the run that
``gossamer train --set seed=S --set KEY=V`` writes, in worker processes as in this one; bad
combinations are one line with exit 2."""

from pathlib import Path

import pytest
import torch

from cases import SHORT
from gossamer.cli import main
from gossamer.rundir import load_checkpoint, read_summary

BASE = [o for o in SHORT if not o.startswith("lr=")]  # lr is swept


def settings(*overrides):
    return [arg for o in (*BASE, *overrides) for arg in ("--set", o)]


def without_wall(summary):
    return {k: v for k, v in summary.items() if k != "wall_seconds"}


@pytest.mark.parametrize("jobs", [1, 2])
def test_each_seed_and_swept_value_is_its_standalone_run(tmp_path, capsys, jobs):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the worker processes' count: float64 sums can depend on it
    try:
        assert main(["train", *settings(), "--seeds", "2", "--first-seed", "3", "--sweep", "lr=[0.05,0.1]",
                     "--jobs", str(jobs), "--out", str(tmp_path / "many"), "--quiet"]) == 0
        assert main(["train", *settings("seed=4", "lr=0.1"), "--out", str(tmp_path / "one"), "--quiet"]) == 0
    finally:
        torch.set_num_threads(threads)
    runs = sorted(p.name for p in (tmp_path / "many").iterdir())
    assert runs == ["seed-3-lr-0.05", "seed-3-lr-0.1", "seed-4-lr-0.05", "seed-4-lr-0.1"]
    alone, batch = tmp_path / "one", tmp_path / "many" / "seed-4-lr-0.1"
    assert without_wall(read_summary(batch)) == without_wall(read_summary(alone))
    assert torch.equal(load_checkpoint(batch)["rows"]["X"], load_checkpoint(alone)["rows"]["X"])
    assert (batch / "config.yaml").read_text() == (alone / "config.yaml").read_text()
    table = capsys.readouterr().out
    assert all(f"| {run} |" in table for run in runs)


@pytest.mark.parametrize("args, message", [
    (["--seeds", "0"], "--seeds must be a positive integer, got 0"),
    (["--jobs", "0"], "--jobs must be a positive integer, got 0"),
    (["--seeds", "2", "--first-seed", "-1"], "--first-seed must be an integer in [0, 2**44 - seeds], got -1"),
    (["--sweep", "lr=[0.1]"], "--sweep expects KEY=[V1,V2,...] with at least two distinct values"),
    (["--sweep", "lr=[0.1,0.2]", "--sweep", "lr=[0.3,0.4]"], "--sweep lr: lr is swept twice"),
    (["--sweep", "lr=[0.1,0.2]", "--set", "lr=0.3"], "--sweep lr: lr is also given with --set"),
    (["--sweep", "seed=[1,2]"], "--sweep seed: seed is what --seeds and --first-seed set"),
    (["--seeds", "2", "--resume", "runs/x"], "--seeds, --sweep and --jobs train new runs"),
    (["--seeds", "2", "--set", "engine=dist"], "run on the simulator"),
    (["--sweep", "colour=[1,2]"], "colour"),
    # issue 45: 1e8 configs were built before anything was checked (a hang); a dist run refused after one trained
    (["--seeds", "100000000"], "--seeds 100000000 ask for 100,000,000 runs; one command trains at most 100,000"),
    (["--sweep", "engine=[sim,dist]"], "--sweep engine=dist: --seeds, --sweep and --jobs run on the simulator"),
])
def test_bad_many_run_options_are_one_line(args, message, tmp_path, capsys):
    assert main(["train", *settings(), "--out", str(tmp_path / "many"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_non_empty_out_is_not_overwritten(tmp_path, capsys):
    out = tmp_path / "many"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["train", *settings(), "--seeds", "2", "--out", str(out)]) == 2
    assert "is not empty; pass --overwrite" in capsys.readouterr().err and (out / "keep.txt").read_text() == "mine"


@pytest.mark.slow
def test_a_plugins_algorithm_trains_in_worker_processes(tmp_path, capsys):
    """The worker processes import the plugin the configs record before reading them: the plugin's
    own option (drop_rate, of its options class) arrives, and each run is its standalone run."""
    plugin = str(Path(__file__).resolve().parents[1] / "examples" / "plugins" / "lossy_gossip.py")
    chosen = ["algorithm=lossy-gossip", "topology=ring", "drop_rate=0.3"]
    assert main(["train", "--plugin", plugin, *settings("lr=0.05", *chosen), "--seeds", "2", "--jobs", "2",
                 "--out", str(tmp_path / "many"), "--quiet"]) == 0
    assert main(["train", "--plugin", plugin, *settings("lr=0.05", *chosen, "seed=1"), "--out", str(tmp_path / "one"),
                 "--quiet"]) == 0
    assert "drop_rate: 0.3" in (tmp_path / "many" / "seed-1" / "config.yaml").read_text()
    a, b = (read_summary(p) for p in (tmp_path / "many" / "seed-1", tmp_path / "one"))
    assert without_wall(a).keys() == without_wall(b).keys()
    torch.testing.assert_close(load_checkpoint(tmp_path / "many" / "seed-1")["rows"]["X"],
                               load_checkpoint(tmp_path / "one")["rows"]["X"], rtol=0, atol=1e-12)


def test_runs_that_would_share_a_folder_are_refused_before_any_trains(tmp_path, capsys):
    """'/' and '-' map to one folder name: the first run was silently replaced (issue 45, item 3)."""
    for name in ("g/ring.txt", "g-ring.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("0 1\n1 2\n2 3\n3 0\n")
    sweep = f"topology=[edges:{tmp_path}/g/ring.txt,edges:{tmp_path}/g-ring.txt]"
    assert main(["train", *settings("algorithm=gossip"), "--sweep", sweep, "--out", str(tmp_path / "many")]) == 2
    err = capsys.readouterr().err
    assert "would share the run folder" in err and err.count("\n") == 1
    assert not (tmp_path / "many").exists()


def test_a_sweep_that_diverges_over_a_finished_one_reports_its_own_runs(tmp_path, capsys):
    """--overwrite over a finished sweep whose new runs diverge: they are listed as diverged, and the old
    runs' numbers are not shown as theirs (the old runs stay beside a DIVERGED file; issue 45, item 1)."""
    out, sweep = str(tmp_path / "many"), ["--sweep", "momentum=[0.5,0.9]"]
    assert main(["train", *settings("lr=0.05"), *sweep, "--out", out, "--quiet"]) == 0
    capsys.readouterr()
    assert main(["train", *settings("lr=1e9"), *sweep, "--out", out, "--overwrite", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "diverged (no summary): seed-0-momentum-0.5, seed-0-momentum-0.9" in printed
    assert "| seed-0-momentum-0.5 |" not in printed


def test_a_finished_run_clears_the_divergence_an_earlier_attempt_left(tmp_path):
    """A suite re-run with --overwrite: a run that now finishes removes its old DIVERGED (issue 45,
    item 2: results.md reported every run diverged, quoting the old messages)."""
    from gossamer.repro import DIVERGED, Job, train_all
    from gossamer.train import Diverged

    def diverges(cfg, out):
        raise Diverged("training diverged: loss is nan at step 1")

    job = Job("a run", None, tmp_path / "run")
    train_all([job], diverges, log=lambda line: None)
    assert (job.out / DIVERGED).read_text().startswith("training diverged")
    train_all([job], lambda cfg, out: None, log=lambda line: None)
    assert not (job.out / DIVERGED).exists()


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_text()
    except OSError:
        return ""


def _wait(condition, seconds: float = 60.0) -> bool:
    import time
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.2)
    return False


@pytest.mark.lifecycle
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGKILL"])
def test_a_stopped_parent_leaves_no_worker_behind(tmp_path, signal_name):
    """issue 45, item 4: Ctrl-C (SIGINT to the process group) of train --jobs 2 is one line and exit
    130, not worker tracebacks or a hang; SIGKILL of the parent leaves no worker training forever.
    Signalled once both workers have started (polled, no fixed sleep)."""
    import os
    import signal
    import subprocess
    import sys

    argv = [sys.executable, "-m", "gossamer", "train", *settings("lr=0.05", "epochs=500"), "--seeds", "4", "--jobs", "2",
            "--out", str(tmp_path / "many")]
    # the child starts with SIGINT's default action whatever this process inherited (a shell's
    # background job ignores it, and a program started ignoring it rightly goes on ignoring it)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)  # a handler: reset at exec
    try:
        parent = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, inherited)
    try:
        def workers() -> list[int]:
            return [c for c in _children(parent.pid) if _alive(c) and "spawn_main" in _cmdline(c)]
        assert _wait(lambda: len(workers()) == 2)
        started = workers()
        if signal_name == "SIGINT":
            os.killpg(parent.pid, signal.SIGINT)
            err = parent.communicate(timeout=60)[1]
            assert parent.returncode == 130 and err.strip().splitlines()[-1] == "gossamer: error: interrupted", err
            assert "Traceback" not in err
        else:
            parent.kill()
            parent.wait(timeout=60)
        assert _wait(lambda: not any(_alive(w) for w in started)), "a worker outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_every_combination_is_built_before_any_run_trains(tmp_path, capsys):
    """A model the data set cannot feed was refused only after the first run had trained (issue 45, item 13)."""
    out = tmp_path / "many"
    argv = ["train", "--set", "workers=4", "--set", "num_samples=1000", "--set", "epochs=1", "--sweep",
            "model=[mlp,resnet20]", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "model 'resnet20' takes images" in err and err.count("\n") == 1
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_a_ctrl_c_while_the_workers_start_is_held_and_delivered_after_not_lost():
    """train_all starts its worker processes with SIGINT blocked (_ctrl_c_held): a process started
    inside inherits the block (it cannot die of a Ctrl-C while it imports), and a Ctrl-C that lands
    inside is held and is KeyboardInterrupt when the window ends — before, it was ignored and lost
    (CI on a loaded machine: the parent trained on after Ctrl-C). The signal is sent to the main
    thread (pthread_kill): sent to the process, another thread of pytest-xdist's could take it."""
    import signal
    import subprocess
    import sys
    import threading

    from gossamer.repro.runner import _ctrl_c_held

    child, reached = None, []
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)  # were it ignored here
    try:
        with pytest.raises(KeyboardInterrupt):
            with _ctrl_c_held():
                child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
                reached.append("past the signal")  # held: not raised here
        blocked = next(int(line.split()[1], 16) for line in (Path("/proc") / str(child.pid) / "status")
                       .read_text().splitlines() if line.startswith("SigBlk:"))
        assert reached == ["past the signal"] and blocked & (1 << (signal.SIGINT - 1))
    finally:
        signal.signal(signal.SIGINT, inherited)
        if child is not None:
            child.kill()
            child.wait()
