"""engine: dist — real processes (gloo on CPU, loopback only) give the simulator's numbers.

Process launches are the cost here (a torch import per process), so each launch does a lot:
one launch per process count runs the engine checks and every parity case (tests/dist_scripts/
parity.py), compared here with the same cases trained by the simulator.
"""

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from cases import ACCEPTANCE, CIFAR_CASE, DIST_CASES, SHORT, all_cases
from launch import SMALL, finish, sets, spawn, torchrun

from conftest import SCRIPTS
from gossamer.cli import main

FAST = ["grad_backend=loop"]  # the per-worker module loop: the fast gradients for the small CNN

MEASURED = ("wall_seconds", "comm_seconds", "comm_metrics_seconds")  # wall-clock: the dist engine's own


# ---------------------------------------------------------------- parity: 4 and 2 processes


def summary_of(run: Path) -> dict:
    """summary.json without what was measured by the clock of this machine."""
    return {k: v for k, v in json.loads((run / "summary.json").read_text()).items() if k not in MEASURED}


def assert_same_summary(a: dict, b: dict, rel: float) -> None:
    """Counts, bytes and accuracies equal; losses and Ξ² to float rounding (they are sums taken in
    another order across processes)."""
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], float) and ("loss" in key or "consensus" in key or "theta" in key or key == "sharpness"):
            assert a[key] == pytest.approx(b[key], rel=rel, abs=1e-20), key
        else:
            assert a[key] == b[key], key


def tensors(state, path: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of a (nested) state by its path."""
    if isinstance(state, torch.Tensor):
        return {path: state}
    if isinstance(state, dict):
        return {k: v for key, value in state.items() for k, v in tensors(value, f"{path}.{key}").items()}
    return {}


@pytest.mark.slow
@pytest.mark.parametrize("procs, name", [(p, name) for p, cases in DIST_CASES.items() for name in cases]
                         + [(2, CIFAR_CASE)])
def test_dist_matches_the_simulator(name, procs, sim_run, dist_runs, cifar_case):
    overrides = cifar_case if name == CIFAR_CASE else SHORT + DIST_CASES[procs][name]
    sim, dist_ = sim_run(overrides), dist_runs(procs) / name
    a, b = torch.load(sim / "checkpoint.pt"), torch.load(dist_ / "checkpoint.pt")
    Xa, Xb = a["rows"]["X"], b["rows"]["X"]
    workers = int([o for o in overrides if o.startswith("workers=")][-1].removeprefix("workers="))
    assert Xb.shape == Xa.shape == (workers, Xa.shape[1])  # rank 0 saved the full gathered matrix
    assert (Xb - Xa).abs().max() < 1e-10  # in float64 the difference is rounding only
    torch.testing.assert_close(b["rows"]["B"], a["rows"]["B"], rtol=0, atol=1e-10)  # BatchNorm statistics, if any
    for key, value in a["optimizer"]["rows"].items():
        assert (b["optimizer"]["rows"][key] - value).abs().max() < 1e-10, key
    ta, tb = tensors(a["schedule"]), tensors(b["schedule"])  # compression references, residuals, copies, ...
    assert ta.keys() == tb.keys()
    for key, value in ta.items():
        assert (tb[key].double() - value.double()).abs().max() < 1e-10, key
    assert a["comm"] == b["comm"]
    assert_same_summary(summary_of(sim), summary_of(dist_), rel=1e-9)
    rows = [json.loads(line) for line in (dist_ / "metrics.jsonl").read_text().splitlines()]
    sim_rows = [json.loads(line) for line in (sim / "metrics.jsonl").read_text().splitlines()]
    for key in ("comm_rounds", "gossip_period", "sim_seconds", "phase"):  # sim_seconds: the same events priced
        assert [r.get(key) for r in rows] == [r.get(key) for r in sim_rows], key


@pytest.mark.slow
@pytest.mark.parametrize("procs", [4, 2])
def test_the_dist_engine_times_its_communication_with_a_network(procs, dist_runs):
    """comm_seconds: the wall time of the algorithm's collectives, growing with the rows; only
    where time is asked for (a network section)."""
    rows = [json.loads(line) for line in (dist_runs(procs) / "simulated-time" / "metrics.jsonl").read_text().splitlines()]
    measured = [r["comm_seconds"] for r in rows]
    assert measured == sorted(measured) and measured[-1] > 0
    s = json.loads((dist_runs(procs) / "simulated-time" / "summary.json").read_text())
    assert s["comm_seconds"] == measured[-1] and s["comm_metrics_seconds"] > 0
    simulated = {k for k in s if k.startswith("sim_")} | {"idle_seconds"}  # the clock's model (idle_seconds: issue 42's name)
    assert {k for k in s if "seconds" in k} - simulated == set(MEASURED)  # wall time: the other *_seconds
    assert "comm_seconds" not in json.loads((dist_runs(procs) / "allreduce-none-sgd" / "summary.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("procs", [4, 3, 2])
def test_every_operator_matches_the_simulator(procs, dist_runs):
    """allreduce, block means (inside and across processes), gossip on static and time-varying
    graphs, packed sign averaging, x̄, Ξ², scalar means: the simulator's rows and the same counts."""
    for rank in range(procs):
        report = json.loads((dist_runs(procs) / f"engine-rank{rank}.json").read_text())
        for n, r in report.items():
            assert r["comm_equal"], (rank, n)
            bad = {op: diff for op, diff in r["diffs"].items() if not diff <= 1e-12}
            assert not bad, (rank, n, bad)


@pytest.mark.slow
def test_ring_gossip_sends_two_messages_of_d_floats_and_allreduce_counts_the_ring_volume(dist_runs):
    """One worker per process (n = P = 4): a ring round sends d values to each of the 2 neighbours."""
    for rank in range(4):
        r = json.loads((dist_runs(4) / f"engine-rank{rank}.json").read_text())["n=4"]
        sent = r["ring_sent"]
        assert sent["messages"] == 2 * sent["rounds"]
        assert sent["values"] == 2 * sent["d"] * sent["rounds"]
    s = summary_of(dist_runs(4) / "allreduce-none-sgd")
    n, d = 4, s["parameters"]
    assert s["bytes_per_worker"] == pytest.approx(s["steps"] * 2 * d * (n - 1) / n * 8)  # float64 values
    g = summary_of(dist_runs(4) / "gossip-ring")
    assert g["bytes_per_worker"] == pytest.approx(g["steps"] * 2 * d * 8)
    assert g["messages_per_worker"] == 2 * g["steps"]


# ---------------------------------------------------------------- the command line under torchrun


@pytest.mark.slow
@pytest.mark.parametrize("procs", [2])
def test_the_cli_gives_the_simulators_summary_in_float32(tmp_path, procs, dist_runs):
    """The issue's acceptance check: ``gossamer train`` with engine=dist under torchrun and the same
    command with engine=sim, in the default float32."""
    assert main(["train", "--quiet", "--out", str(tmp_path / "sim"), *sets(ACCEPTANCE)]) == 0
    run = dist_runs(procs) / "acceptance"
    assert {p.name for p in run.iterdir()} == {"config.yaml", "metrics.jsonl", "summary.json", "checkpoint.pt", ".gossamer-run"}
    assert_same_summary(summary_of(tmp_path / "sim"), summary_of(run), rel=1e-5)
    sim_x, dist_x = (torch.load(r / "checkpoint.pt")["rows"]["X"] for r in (tmp_path / "sim", run))
    assert (dist_x - sim_x).abs().max() < 1e-5


@pytest.mark.parametrize("rank", [0, 1])
def test_bad_input_fails_alike_on_every_rank_and_rank_0_says_it_once(tmp_path, capsys, monkeypatch, rank):
    """Checked before any process group forms, so one process per rank suffices (in-process here)."""
    for key, value in {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": 2, "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(key, str(value))
    code = main(["train", "--quiet", "--set", "engine=dist", "--set", "workers=3", "--out", str(tmp_path / "never")])
    err = capsys.readouterr().err
    assert code == 2
    if rank == 0:
        assert err.count("\n") == 1 and err.startswith("gossamer: error:")
        assert "workers (3)" in err and "processes (2)" in err
    else:
        assert err == ""
    assert not (tmp_path / "never").exists()


# ---------------------------------------------------------------- failures: never a hang


@pytest.mark.lifecycle
@pytest.mark.parametrize("how, lost, algorithm", [
    ("killed", 0, ["algorithm=diloco", "local_steps=3", "outer_overlap=delayed"]),  # an all-reduce in flight
    ("stopped", 1, ["algorithm=gossip"])])
def test_a_lost_process_stops_the_others_naming_it(tmp_path, how, lost, algorithm):
    """3 processes; rank 0 (the TCPStore's host) is killed (its connections close) or rank 1 stopped
    (it stops answering). The others exit non-zero instead of hanging, each with one line naming it,
    and nothing else (c10d's C++ warnings on the lost store are silenced) (no wall-clock bound
    is asserted: on a loaded 2-core machine 3 processes may be descheduled for seconds; the 60 s
    wait only turns a hang into a failure). The killed case runs overlapped DiLoCo, whose outer
    all-reduce is waited for a round after it starts: a loss found there is reported alike."""
    # the group of 3 forms within the same budget: 4 s (2.1 s to form) was too short on a loaded machine
    timeout = 8
    procs = spawn(3, ["-m", "gossamer", "train", "--quiet", "--set", "engine=dist", "--set", "workers=3",
                      "--set", "epochs=500", "--set", "num_samples=1000", *sets(algorithm),
                      "--set", f"dist_timeout={timeout}", *sets(FAST), "--out", "run"], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 90
        while not (tmp_path / "run" / "checkpoint.pt").exists():  # training is under way on all ranks
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            assert time.monotonic() < deadline
            time.sleep(0.1)
        os.kill(procs[lost].pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        for rank in {0, 1, 2} - {lost}:
            code = procs[rank].wait(60)
            err = procs[rank].communicate()[1]
            assert code == 1, err
            lines = err.strip().splitlines()
            assert len(lines) == 1, err
            assert lines[0].startswith("gossamer: error:") and f"lost rank {lost} of 3" in lines[0], err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()


# ---------------------------------------------------------------- stop and resume


@pytest.mark.lifecycle
def test_a_signal_on_one_rank_stops_all_at_the_same_step_and_resume_is_exact(tmp_path):
    from test_durable import assert_same_run

    # a representative subset of tests/cases.py, stopped at step 7: after post-local's switch
    # (compressed, with error feedback), inside the gossip example's middle phase, and inside worker 1's
    # absence (faults)
    cases = [[name, SHORT + all_cases(optimizers=False)[name]]
             for name in ("post-local-ef-sign-sgd", "gossip-none-sgd", "choco-random-k:0.2-sgd", "gossip-faults")]
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    proc = torchrun(2, str(SCRIPTS / "resume.py"), str(tmp_path), str(tmp_path / "cases.json"), "7",
                    cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name, _ in cases:
        assert torch.load(tmp_path / f"{name}-stopped" / "checkpoint.pt", weights_only=True)["step"] == 12
        assert_same_run(tmp_path / f"{name}-straight", tmp_path / f"{name}-stopped")



@pytest.mark.lifecycle
def test_a_rank_killed_under_torchrun_max_restarts_resumes_and_a_checkpoint_resumes_on_other_process_counts(tmp_path):
    """Elastic restarts: rank 1 killed by SIGKILL mid-run, torchrun --max-restarts 1 restarts both
    ranks, --resume-if-exists continues from the last checkpoint: the straight run's summary. Then
    the 2-process checkpoint resumes (epochs 1 → 2) on 1 process: the simulator's run to 1e-10.
    With faults throughout: worker 1 (of rank 0) gone across the kill and back in the resumed
    part, and churn; the checkpoints carry the fault state across process counts."""
    from conftest import small_config
    from gossamer.train import build_run, train

    overrides = [*SMALL, "engine=dist", "algorithm=gossip", "topology=ring", "checkpoint_every=0.25",
                 "faults.events=[1@2-16]", "faults.churn=0.05", "faults.downtime=3"]
    proc = torchrun(2, "--max-restarts", "1", str(SCRIPTS / "elastic.py"), str(tmp_path), "7", *sets(overrides),
                    cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-6000:]
    seconds = lambda s: {k: v for k, v in s.items() if not k.endswith("_seconds")}  # noqa: E731
    assert seconds(summary_of(tmp_path / "killed")) == seconds(summary_of(tmp_path / "straight"))
    [(code, _, err)] = finish(spawn(1, ["-m", "gossamer", "train", "--quiet", "--resume", str(tmp_path / "straight"),
                                        "--set", "epochs=2"], cwd=tmp_path), timeout=200)
    assert code == 0, err[-3000:]
    cfg = small_config(*[o for o in overrides if o != "engine=dist"], "epochs=2")
    run = build_run(cfg)
    train(cfg, run)
    resumed = torch.load(tmp_path / "straight" / "checkpoint.pt", weights_only=True)["rows"]["X"]
    torch.testing.assert_close(resumed, run.workers.X, rtol=0, atol=1e-10)


# ---------------------------------------------------------------- the works held for a clean exit

HELD_WORKS = """
import time, weakref, torch
from gossamer.engines.dist import DistEngine
engine = DistEngine(2, backend="gloo", timeout=60)
refs = []
for i in range(3):
    T = torch.full((1, 1_000_000), float(engine.rank + i))
    refs.append(weakref.ref(T))
    engine.broadcast_(T, src=0)
    assert T[0, 0].item() == i
    del T
    assert refs[-1]() is not None, i  # held, with its work, past the collective (the exit-abort fix)
    engine.allreduce_mean_(torch.ones(1, 1000))
    deadline = time.monotonic() + 5  # gloo's thread may let go of the work a few ms after the main thread
    while any(r() is not None for r in refs) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert all(r() is None for r in refs), i  # freed when the next collective began
engine.close()
print("freed")
"""


@pytest.mark.slow
def test_a_finished_collectives_tensors_are_freed_when_the_next_one_begins(tmp_path):
    """The works held for a clean exit hold their tensors: the engine frees them when its next
    collective begins (holding the last 8 collectives' grew a process by 866 MB in three steps of
    a 100 MB all-gather and all-reduce); the processes exit cleanly."""
    for code, out, err in finish(spawn(2, ["-c", HELD_WORKS], cwd=tmp_path), timeout=120):
        assert code == 0 and out.strip() == "freed", err[-3000:]
