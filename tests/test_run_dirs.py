"""Run directories under stress: --overwrite that replaces only a run's own files, a lock per
folder, stops and kills during the swap, resumes of damaged or mismatched runs, bad paths and a
full disk — every failure one line (exit 2) that keeps what the user had."""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from gossamer import rundir, runner
from gossamer.cli import main
from test_durable import rows, stop_with, summary

TINY = ["workers=4", "epochs=1", "num_samples=1000", "batch_size=16", "model=mlp"]  # 12 steps, under a second
S = 12  # steps per epoch
LONG = "a" * 300  # a path component longer than any file system takes (255 bytes)


def sets(*overrides: str) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def train(out, *overrides: str, flags=()) -> int:
    return main(["train", "--quiet", "--out", str(out), *flags, *sets(*TINY, *overrides)])


def resume(out, *overrides: str) -> int:
    return main(["train", "--quiet", "--resume", str(out), *sets(*overrides)])


def files(folder: Path) -> dict[str, bytes | None]:
    """Everything under ``folder`` by relative path (folders as None)."""
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes() for p in sorted(folder.rglob("*"))}


def one_line(err: str, *fragments: str) -> bool:
    """stderr is one error line (no traceback) holding every fragment."""
    return (err.count("\n") == 1 and err.startswith("gossamer: error:") and "Traceback" not in err
            and all(f in err for f in fragments))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished tiny run (seed 0) to copy from."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert train(out) == 0
    return out


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ---------------------------------------------------------------- --overwrite replaces only a run's own files


@pytest.mark.parametrize("where", ["run", "."])
def test_overwrite_keeps_a_tensorboard_folder_no_run_wrote(tmp_path, capsys, monkeypatch, where):
    monkeypatch.chdir(tmp_path)
    out = Path(where)
    assert train(out) == 0  # logger: none
    (out / "tensorboard").mkdir()
    (out / "tensorboard" / "mine.txt").write_text("my own events")
    before = (out / "summary.json").read_bytes()
    assert train(out, "seed=1", flags=["--overwrite"]) == 0
    assert (out / "tensorboard" / "mine.txt").read_text() == "my own events"
    assert (out / "summary.json").read_bytes() != before
    # a new tensorboard run may not write into a tensorboard/ it did not write either
    capsys.readouterr()
    assert train(out, "logger=tensorboard", flags=["--overwrite"]) == 2
    assert one_line(capsys.readouterr().err, "tensorboard, which no gossamer run wrote")
    assert (out / "tensorboard" / "mine.txt").read_text() == "my own events"


def test_overwrite_replaces_the_tensorboard_folder_its_run_wrote(tmp_path):
    out = tmp_path / "run"
    assert train(out, "logger=tensorboard") == 0
    assert train(out, "seed=1", flags=["--overwrite"]) == 0  # logger: none
    assert not (out / "tensorboard").exists()
    assert train(out, "logger=tensorboard") == 2  # not empty
    assert train(out, "logger=tensorboard", flags=["--overwrite"]) == 0
    assert train(out, "logger=csv", flags=["--overwrite"]) == 0
    assert {p.name for p in out.iterdir()} == {"config.yaml", "metrics.jsonl", "metrics.csv", "summary.json",
                                               "checkpoint.pt", ".gossamer-run"}


def test_overwrite_refuses_another_tools_run_without_the_marker(tmp_path, capsys):
    out = tmp_path / "theirs"
    out.mkdir()
    (out / "config.yaml").write_text("workers: 4\n")
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 2.3}\n')
    (out / "summary.json").write_text('{"steps": 1}\n')
    before = files(out)
    assert train(out, flags=["--overwrite"]) == 2
    assert one_line(capsys.readouterr().err, "does not look like a gossamer run directory", "nothing was changed")
    assert files(out) == before


# ---------------------------------------------------------------- one run per folder


def test_a_second_run_into_a_folder_in_use_is_refused_at_once(tmp_path, capsys, monkeypatch):
    """A run (in a thread) replaces the run in a folder; while it is at step 3, a second
    --overwrite run and a --resume into the folder exit 2 at once; the first run ends intact."""
    straight, out = tmp_path / "straight", tmp_path / "run"
    assert train(straight) == 0
    assert train(out, "seed=1") == 0
    real, at_step_3, go_on = rundir.RunDir.row, threading.Event(), threading.Event()

    def row(self, r):
        real(self, r)
        if r["step"] == 3 and threading.current_thread().name == "first":
            at_step_3.set()
            go_on.wait(60)
    monkeypatch.setattr(rundir.RunDir, "row", row)
    first_code = []
    first = threading.Thread(target=lambda: first_code.append(train(out, flags=["--overwrite"])), name="first")
    first.start()
    try:
        assert at_step_3.wait(60)
        capsys.readouterr()
        codes = [train(out, "seed=2", flags=["--overwrite"]), resume(out, "epochs=2")]
        err = capsys.readouterr().err
    finally:
        go_on.set()
        first.join(60)
    assert codes == [2, 2] and err.count("\n") == 2 and err.count("is in use by another run") == 2
    assert first_code == [0]
    assert rows(out) == rows(straight) and summary(out) == summary(straight)  # the first run's, intact
    assert {p.name for p in out.iterdir()} == {"config.yaml", "metrics.jsonl", "summary.json", "checkpoint.pt",
                                               ".gossamer-run"}


# ---------------------------------------------------------------- stops and kills while replacing a run


def test_a_stop_before_the_first_checkpoint_leaves_the_replaced_run(tmp_path, capsys, monkeypatch, finished):
    out = copy_run(finished, tmp_path / "run")
    before = files(out)
    with monkeypatch.context() as m:
        stop_with(signal.SIGINT, 1, m)  # Ctrl-C within a second of the start
        assert train(out, "seed=1", flags=["--overwrite"]) == 130
    assert one_line(capsys.readouterr().err, "SIGINT", "left as it was")
    assert files(out) == before


def test_signals_inside_the_swap_wait_for_its_end(tmp_path, capsys, monkeypatch, finished):
    """Two Ctrl-C while the new run's first checkpoint moves it into place: the swap completes,
    then the run stops after one more step, resumable."""
    out = copy_run(finished, tmp_path / "run")
    real_replace, real_swap_in = os.replace, rundir.swap_in

    def swap_in(*args):
        def replace(src, dst):  # a signal at each of the first two moves
            moves.append(src)
            if len(moves) <= 2:
                signal.raise_signal(signal.SIGINT)
            real_replace(src, dst)
        moves = []
        with monkeypatch.context() as m:
            m.setattr(rundir.os, "replace", replace)
            real_swap_in(*args)
    monkeypatch.setattr(rundir, "swap_in", swap_in)
    assert train(out, "seed=1", "epochs=2", flags=["--overwrite"]) == 130
    assert one_line(capsys.readouterr().err, "SIGINT", f"gossamer train --resume {out}")
    assert {p.name for p in out.iterdir()} == {"config.yaml", "metrics.jsonl", "checkpoint.pt", ".gossamer-run"}
    assert torch.load(out / "checkpoint.pt", weights_only=True)["step"] == S + 1
    monkeypatch.undo()
    assert resume(out) == 0
    assert len(rows(out)) == 2 * S and "seed: 1" in (out / "config.yaml").read_text()


def test_a_swap_killed_at_any_point_is_restored_or_finished_at_the_next_start(tmp_path, capsys, monkeypatch,
                                                                              finished):
    """The old run is moved aside, the new one in, the old one deleted: a kill (no clean-up) after
    any single move leaves a state that the next start in the folder turns into one of the two
    runs, whole, with one line saying which."""
    new = tmp_path / "new"
    assert train(new, "seed=1") == 0
    (new / "summary.json").unlink()  # what the staging folder holds at the first checkpoint
    old_files, new_files = files(finished), files(new)

    class Killed(BaseException):
        pass

    real = os.replace
    for kill_at in range(1, 20):
        out = copy_run(finished, tmp_path / f"run{kill_at}")
        lock = rundir.RunLock(out, "--out")
        shutil.copytree(new, out / rundir.STAGING)
        calls = []

        def replace(src, dst):
            calls.append(src)
            if len(calls) == kill_at:
                raise Killed
            real(src, dst)
        monkeypatch.setattr(rundir.os, "replace", replace)
        try:
            rundir.swap_in(out, rundir.written(out))
        except Killed:
            killed = True
        else:
            killed = False
        monkeypatch.setattr(rundir.os, "replace", real)
        os.close(lock._fd)  # a killed process lets go of its lock, removes nothing
        capsys.readouterr()
        rundir.RunLock(out, "--out").release()  # the next start
        err = capsys.readouterr().err
        assert files(out) in (old_files, new_files), kill_at
        restored = files(out) == old_files
        if killed:
            assert err.count("\n") == 1 and ("restored" if restored else "finished") in err, kill_at
        if not killed:
            assert not restored and err == ""
            break
    assert kill_at > 10  # every move of the swap (5 out, 1 rename, 4 in) was a kill point


KILL = """
import os, sys
from gossamer import rundir
from gossamer.cli import main

real_replace, real_swap_in = os.replace, rundir.swap_in


def swap_in(*args):  # the process dies (SIGKILL-like: no clean-up) at the K-th move of the swap
    moves = []

    def replace(src, dst):
        moves.append(src)
        if len(moves) == int(os.environ["KILL_AT"]):
            os._exit(9)
        real_replace(src, dst)
    rundir.os.replace = replace
    real_swap_in(*args)


rundir.swap_in = swap_in
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.lifecycle
@pytest.mark.parametrize("kill_at, done", [(2, "restored"), (8, "finished")])
def test_a_process_killed_inside_the_swap_leaves_a_folder_the_next_start_repairs(tmp_path, capsys, finished,
                                                                               kill_at, done):
    out = copy_run(finished, tmp_path / "run")
    proc = subprocess.run([sys.executable, "-c", KILL, "train", "--quiet", "--overwrite", "--out", str(out),
                           *sets(*TINY, "seed=1", "epochs=2")], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "KILL_AT": str(kill_at)})
    assert proc.returncode == 9, proc.stderr[-2000:]
    code = resume(out)
    warning, *rest = capsys.readouterr().err.splitlines()
    assert warning.startswith("gossamer: warning:") and done in warning and str(out) in warning
    if done == "restored":  # the old run, finished
        assert code == 2 and files(out) == files(finished) and len(rest) == 1
    else:  # the new run, at its first checkpoint: resumed to its end
        assert code == 0 and rest == [] and len(rows(out)) == 2 * S and "seed: 1" in (out / "config.yaml").read_text()


# ---------------------------------------------------------------- resume: mismatches, damage, a missing summary


def test_resume_refuses_a_checkpoint_of_another_config(tmp_path, capsys, finished):
    eight = tmp_path / "eight"
    assert train(eight, "workers=8", "batch_size=8") == 0
    out = tmp_path / "run"
    assert train(out, "epochs=2", "checkpoint_every=0.5") == 0
    (out / "summary.json").unlink()
    shutil.copy(eight / "checkpoint.pt", out / "checkpoint.pt")
    before = files(out)
    capsys.readouterr()
    assert resume(out, "epochs=2") == 2
    assert one_line(capsys.readouterr().err, "checkpoint.pt", "config.yaml", "workers", "batch_size")
    assert files(out) == before


def test_resume_refuses_an_edited_config_yaml(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        stop_with(signal.SIGTERM, 3, m)
        assert train(out) == 143
    text = (out / "config.yaml").read_text()
    assert "lr: 0.1\n" in text
    (out / "config.yaml").write_text(text.replace("lr: 0.1\n", "lr: 0.5\n"))
    before = files(out)
    capsys.readouterr()
    assert resume(out) == 2
    assert one_line(capsys.readouterr().err, "config.yaml", "lr (0.1 → 0.5)")
    assert files(out) == before


@pytest.mark.parametrize("overrides", [[], ["algorithm=gossip", "network=ethernet-1g", "compute_ms=2",
                                             "target_accuracy=0.1", "logger=csv"]])
def test_a_run_killed_between_its_final_checkpoint_and_summary_is_completed_by_resume(tmp_path, capsys, overrides):
    out = tmp_path / "run"
    assert train(out, *overrides) == 0
    expected, metrics = summary(out), (out / "metrics.jsonl").read_bytes()
    (out / "summary.json").unlink()
    assert resume(out) == 0
    assert summary(out) == expected and (out / "metrics.jsonl").read_bytes() == metrics
    capsys.readouterr()
    assert resume(out) == 2
    assert one_line(capsys.readouterr().err, f"finished ({S} of {S} steps)")


def test_a_partial_last_metrics_line_is_cut_on_resume_with_a_warning(tmp_path, capsys, monkeypatch):
    straight, out = tmp_path / "straight", tmp_path / "run"
    assert train(straight) == 0
    with monkeypatch.context() as m:
        stop_with(signal.SIGTERM, 5, m)
        assert train(out) == 143
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "epoch": 0.5, "lr": 0.1, "lo')  # what a crash below Python leaves
    capsys.readouterr()
    assert resume(out) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gossamer: warning:") and str(out / "metrics.jsonl") in err
    assert rows(out) == rows(straight)


@pytest.mark.parametrize("tail", ["\x00" * 300, "\x00" * 4096 + "\n", "\x00" * 10 + "\n" + "\x00" * 7 + "\n"])
def test_a_nul_filled_last_metrics_line_is_cut_on_resume_with_a_warning(tmp_path, capsys, monkeypatch, tail):
    """What a crash of the file system (not of the process) leaves: blocks of NULs, with or without newlines."""
    straight, out = tmp_path / "straight", tmp_path / "run"
    assert train(straight) == 0
    with monkeypatch.context() as m:
        stop_with(signal.SIGTERM, 5, m)
        assert train(out) == 143
    with open(out / "metrics.jsonl", "a") as f:
        f.write(tail)
    capsys.readouterr()
    assert resume(out) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gossamer: warning:") and "partial line" in err
    assert rows(out) == rows(straight)


def test_resume_if_exists_on_a_finished_run_reports_it_and_exits_0(tmp_path, capsys, finished):
    """A requeued job of a completed run succeeds without training; with a larger epochs it continues."""
    out = copy_run(finished, tmp_path / "run")
    before = files(out)
    capsys.readouterr()
    assert train(out, flags=("--resume-if-exists",)) == 0
    printed, err = capsys.readouterr()
    assert "finished (12 of 12 steps)" in err and "nothing to do" in err and f"run written to {out}" in printed
    assert files(out) == before
    assert train(out, "epochs=2", flags=("--resume-if-exists",)) == 0
    assert summary(out)["steps"] == 2 * S
    assert resume(out, "epochs=2") == 2  # an explicit --resume of a finished run still says so


@pytest.mark.parametrize("left", [[rundir.MARKER], [rundir.MARKER, "metrics.jsonl"], [rundir.MARKER, "config.yaml"]])
def test_resume_if_exists_starts_in_a_folder_holding_only_a_runs_start_up_files(tmp_path, finished, left):
    """A process killed right after writing its first files (no checkpoint): every restart starts there."""
    out = tmp_path / "run"
    out.mkdir()
    for name in left:
        shutil.copy(finished / name, out / name) if name != "metrics.jsonl" else (out / name).write_text("")
    assert train(out, flags=("--resume-if-exists",)) == 0
    assert rows(out) == rows(finished)


def test_resume_if_exists_in_a_folder_of_someone_elses_files_says_what_to_do(tmp_path, capsys):
    """It said "pass --overwrite", which --resume-if-exists refuses (issue 45, item 25)."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert train(out, flags=("--resume-if-exists",)) == 2
    err = capsys.readouterr().err
    assert "holds notes.txt, which no gossamer run wrote" in err and "choose another --out" in err
    assert "--overwrite" not in err and (out / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("size", [0, 1000, "half"])
def test_an_empty_or_truncated_checkpoint_is_one_line_naming_it(tmp_path, capsys, finished, size):
    out = copy_run(finished, tmp_path / "run")
    (out / "summary.json").unlink()
    data = (out / "checkpoint.pt").read_bytes()
    (out / "checkpoint.pt").write_bytes(data[: len(data) // 2 if size == "half" else size])
    before = files(out)
    assert resume(out, "epochs=2") == 2
    assert one_line(capsys.readouterr().err, "checkpoint.pt", "cannot be read")
    assert files(out) == before


@pytest.mark.parametrize("edit, fragment", [
    (lambda state: state.update(step=-5), "step -5"),
    (lambda state: state.update(step="12"), "step '12'"),
    (lambda state: state["rows"].update(X=state["rows"]["X"][:, :-3]), "X"),
    (lambda state: state["rows"].update(B=torch.zeros(7, 2)), "B"),
])
def test_a_hand_edited_checkpoint_is_one_line_naming_what_does_not_fit(tmp_path, capsys, finished, edit, fragment):
    out = copy_run(finished, tmp_path / "run")
    (out / "summary.json").unlink()
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    edit(state)
    torch.save(state, out / "checkpoint.pt")
    before = files(out)
    assert resume(out, "epochs=2") == 2
    err = capsys.readouterr().err
    assert one_line(err, "checkpoint.pt", "does not fit this run", fragment), err
    assert files(out) == before


def test_a_resume_on_a_process_count_that_does_not_divide_n_names_the_counts_that_do(tmp_path, capsys, finished,
                                                                                     monkeypatch):
    """Not 'use workers=3': a resume keeps the run's workers, so the launch must change."""
    out = copy_run(finished, tmp_path / "run")
    (out / "summary.json").unlink()
    (out / "config.yaml").write_text((out / "config.yaml").read_text().replace("engine: sim", "engine: dist"))
    monkeypatch.setenv("WORLD_SIZE", "3")
    before = files(out)
    assert resume(out) == 2
    err = capsys.readouterr().err
    assert one_line(err, "workers=4", "3 processes", "launch it on 1, 2, 4 processes"), err
    assert "use workers" not in err and files(out) == before


# ---------------------------------------------------------------- paths the OS refuses


@pytest.mark.parametrize("argv", [
    ["train", "--quiet", "--out", f"{{tmp}}/{LONG}"],
    ["train", "--quiet", "--out", f"{{tmp}}/{LONG}/run"],
    ["train", "--quiet", "--resume", f"{{tmp}}/{LONG}"],
    ["train", f"{{tmp}}/{LONG}.yaml", "--quiet"],
    ["plot", "{finished}", "--out", f"{{tmp}}/{LONG}.png"],
    ["plot", f"{{tmp}}/{LONG}", "--out", "{tmp}/p.png"],
    ["compare", f"{{tmp}}/{LONG}"],
    ["compare", "{finished}", f"{{tmp}}/{LONG}", "--x", "steps"],
    ["demo", "--out", f"{{tmp}}/{LONG}"],
    ["repro", "local-sgd", "--quick", "--out", f"{{tmp}}/{LONG}"],
    ["train", "--quiet", "--out", "{tmp}/run", "--set", "algorithm=gossip", "--set",
     f"consensus.target=run:{{tmp}}/{LONG}"],
    ["train", "--quiet", "--out", "{tmp}/run", "--set", "dataset=text", "--set", "model=transformer",
     "--set", f"text_file={{tmp}}/{LONG}.txt"],
])
def test_a_path_component_too_long_is_one_line(tmp_path, capsys, finished, argv):
    argv = [a.format(tmp=tmp_path, finished=finished) for a in argv]
    try:
        code = main(argv)
    except SystemExit as e:  # refused by the parser
        code = e.code
    assert code == 2
    assert one_line(capsys.readouterr().err, "File name too long")
    assert list(tmp_path.iterdir()) == []


@contextlib.contextmanager
def tmpfs(folder: Path, *options: str):
    """A small tmpfs mounted on ``folder`` (root only: the test is skipped elsewhere)."""
    folder.mkdir()
    try:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(folder)],
                              capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no mount command: cannot make a small or read-only file system for this test")
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs (root is needed): {proc.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=True)


def fill(folder: Path, pages_free: int) -> Path:
    """Fill the file system of ``folder`` but ``pages_free`` pages; returns the filler file."""
    page, filler = os.sysconf("SC_PAGE_SIZE"), folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        with contextlib.suppress(OSError):
            while f.write(b"\0" * page) == page:
                pass
    os.truncate(filler, (filler.stat().st_size // page - pages_free) * page)
    return filler


@pytest.mark.parametrize("what", ["missing", "folder"])
def test_plot_into_a_missing_folder_or_onto_a_folder_is_one_line(tmp_path, capsys, finished, what):
    if what == "missing":
        argv, fragment = ["--out", str(tmp_path / "missing" / "p.png")], "No such file or directory"
    else:
        (tmp_path / "p.png").mkdir()
        argv, fragment = ["--out", str(tmp_path / "p.png"), "--overwrite"], "is a directory"
    assert main(["plot", str(finished), *argv]) == 2
    assert one_line(capsys.readouterr().err, fragment)


def test_plot_and_train_on_a_read_only_file_system_are_one_line(tmp_path, capsys, finished):
    with tmpfs(tmp_path / "ro", "size=64k", "ro") as ro:
        for argv in (["plot", str(finished), "--out", str(ro / "p.png")],
                     ["train", "--quiet", "--out", str(ro / "run"), *sets(*TINY)]):
            assert main(argv) == 2
            assert one_line(capsys.readouterr().err, "Read-only file system")


@pytest.mark.parametrize("pages_free, failing", [(0, ""), (1, "config.yaml"), (2, "metrics.jsonl"),
                                                  (3, "checkpoint.pt")])
def test_a_full_disk_while_replacing_a_run_keeps_the_old_one(tmp_path, capsys, finished, pages_free, failing):
    with tmpfs(tmp_path / "disk", "size=2m") as disk:
        out = copy_run(finished, disk / "run")
        before = files(out)
        filler = fill(disk, pages_free)
        capsys.readouterr()
        assert train(out, "seed=1", flags=["--overwrite"]) == 2
        err = capsys.readouterr().err
        assert one_line(err, "No space left on device", failing) and "unexpected pos" not in err
        assert files(out) == before
        filler.unlink()
        assert train(out, "seed=1", flags=["--overwrite"]) == 0


def test_a_full_disk_while_resuming_keeps_the_last_checkpoint(tmp_path, capsys, monkeypatch):
    straight = tmp_path / "straight"
    assert train(straight, "epochs=2") == 0
    with tmpfs(tmp_path / "disk", "size=2m") as disk:
        out = disk / "run"
        with monkeypatch.context() as m:
            stop_with(signal.SIGTERM, 3, m)
            assert train(out, "epochs=2") == 143
        checkpoint = (out / "checkpoint.pt").read_bytes()
        filler = fill(disk, 8)  # room for the small files, not for a second checkpoint
        capsys.readouterr()
        assert resume(out) == 2
        assert one_line(capsys.readouterr().err, "No space left on device", "checkpoint.pt")
        assert (out / "checkpoint.pt").read_bytes() == checkpoint
        filler.unlink()
        assert resume(out) == 0
        assert rows(out) == rows(straight) and summary(out) == summary(straight)


# ---------------------------------------------------------------- which signal stopped the run


def test_the_stop_names_the_signal_another_process_received(tmp_path):
    """engine: dist in threads (one worker each over one simulator): rank 1's process gets SIGINT,
    rank 0 (which writes and reports) none; both stop after the same step, rank 0 says SIGINT."""
    from gossamer.config import load_config
    from gossamer.engines.threads import ThreadedSim
    from gossamer.train import build_run

    cfg = load_config(None, [*TINY, "workers=2"])
    hub = ThreadedSim(2)
    runs = [build_run(cfg, hub.engine(rank)) for rank in range(2)]
    received = {"0": [], "1": [signal.SIGINT]}
    errors = {}
    out = tmp_path / "run"
    run_dir = rundir.RunDir(out)

    def rank(r):
        try:
            runner.train_into(cfg, runs[r], run_dir if r == 0 else None, out, False, None)
        except runner.Stopped as e:
            errors[r] = e

    with pytest.MonkeyPatch.context() as m:
        m.setattr(runner, "stop_on_signals", lambda: contextlib.nullcontext(received[threading.current_thread().name]))
        threads = [threading.Thread(target=rank, args=(r,), name=str(r)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert {r: (e.code, str(e).split(":")[0]) for r, e in errors.items()} == {0: (130, "SIGINT"), 1: (130, "SIGINT")}


def test_a_run_without_checkpoints_that_replaces_another_takes_its_place_when_published(tmp_path):
    """AD-PSGD's coordinator writes no checkpoint: with --overwrite its files stay staged until
    ``publish``; unpublished (a failure) the old run stays, published the new one replaces it."""
    RunDir = rundir.RunDir
    old = RunDir(tmp_path, logger="none", extra=("models.pt",))
    old.write_summary({"run": "old"})
    old.checkpoint({"old": True})
    old.close()
    failed = RunDir(tmp_path, overwrite=True, logger="none", extra=("models.pt",))
    failed.write_summary({"run": "failed"})
    failed.close()
    assert rundir.read_summary(tmp_path) == {"run": "old"}
    new = RunDir(tmp_path, overwrite=True, logger="none", extra=("models.pt",))
    (new.dir / "models.pt").write_bytes(b"new")
    new.write_summary({"run": "new"})
    new.publish()
    new.close()
    assert rundir.read_summary(tmp_path) == {"run": "new"}
    assert (tmp_path / "models.pt").read_bytes() == b"new" and not (tmp_path / "checkpoint.pt").exists()
