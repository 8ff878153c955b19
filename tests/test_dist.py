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
from launch import SMALL, finish, sets, spawn, torchrun

from conftest import write_cifar
from gossamer.cli import main

SCRIPTS = Path(__file__).resolve().parent / "dist_scripts"
FAST = ["grad_backend=loop"]  # the per-worker module loop: the fast gradients for the small CNN

# simulated time on 2 nodes of 2 workers, with a target: the same sim_seconds on both engines
TIMED = ["network=ethernet-1g", "network.workers_per_node=2", "compute_ms=3", "target_accuracy=0.2"]
MEASURED = ("wall_seconds", "comm_seconds", "comm_seconds_metrics")  # wall-clock: the dist engine's own

# (name, overrides): each runs on 4 processes and on 2 (2 workers each), compared with engine=sim.
PARITY_CASES = [
    ("allreduce", ["algorithm=allreduce"]),
    ("local", ["algorithm=local", "local_steps=3"]),
    ("gossip-ring", ["algorithm=gossip", "topology=ring"]),
    ("gossip-one-peer-exponential", ["algorithm=gossip", "topology=one-peer-exponential"]),
    ("post-local", ["algorithm=post-local", "switch_step=6", "local_steps=2"]),
    ("hierarchical", ["algorithm=hierarchical", "block_size=2", "block_rounds=2", "local_steps=2", *TIMED]),
    ("local-ef-sign", ["algorithm=local", "local_steps=2", "compression=ef-sign"]),
    ("gossip-controlled", ["algorithm=gossip", "topology=ring", "consensus.target=constant", "consensus.value=0.01",
                           "network=ethernet-10g", "compute_ms=1"]),
    ("gossip-phases", ["algorithm=gossip", "topology=one-peer-exponential", "phases=[allreduce,gossip]",
                       "phase_epochs=[0.5]"]),
    ("gossip-local-mix-then-step", ["algorithm=gossip", "topology=ring", "local_steps=3",
                                    "gossip_form=mix-then-step"]),
    # H_t goes 2, 3, 1, 2 here (every decision 0.7 % or more from its threshold: float64 rounding cannot flip it)
    ("gossip-frequency", ["algorithm=gossip", "topology=one-peer-exponential", "local_steps=2",
                          "consensus.target=constant", "consensus.value=0.1", "consensus.action=frequency",
                          "consensus.max_local_steps=6", "sharpness=true", "sharpness_samples=200"]),
    ("diloco", ["algorithm=diloco", "local_steps=3"]),
    ("local-ef-top-k", ["algorithm=local", "local_steps=2", "compression=ef-top-k:0.1"]),
    ("post-local-random-k", ["algorithm=post-local", "switch_step=4", "local_steps=2", "compression=random-k:0.2"]),
    ("hierarchical-qsgd", ["algorithm=hierarchical", "block_size=2", "block_rounds=2", "local_steps=2",
                           "compression=qsgd:4"]),
    ("choco-top-k", ["algorithm=choco", "topology=ring", "compression=top-k:0.1", "choco_gamma=0.5"]),
    ("choco-random-k-one-peer-exponential", ["algorithm=choco", "topology=one-peer-exponential",
                                             "compression=random-k:0.1", "choco_gamma=0.3"]),
    ("choco-qsgd", ["algorithm=choco", "topology=ring", "compression=qsgd:4", "choco_gamma=0.3"]),
    ("sgp-directed-exponential", ["algorithm=sgp", "topology=directed-exponential"]),
    ("sgp-directed-edges", ["algorithm=sgp", f"topology=edges:{SCRIPTS / 'directed-4.txt'}"]),
    ("gradient-tracking", ["algorithm=gradient-tracking", "topology=ring"]),
    ("gossip-quasi-global", ["algorithm=gossip", "momentum_mode=quasi-global"]),
    ("gossip-controlled-estimate", ["algorithm=gossip", "topology=ring", "consensus.target=constant",
                                    "consensus.value=0.01", "consensus.measure=estimate"]),
]


# CIFAR's per-worker augmentation and ResNet-20's BatchNorm statistics (rows of B), each process
# holding its block of workers; x̄ evaluated with statistics recomputed on every process alike
CIFAR_CASE = "cifar-resnet20-gossip"


@pytest.fixture(scope="module")
def cifar_case(tmp_path_factory) -> list[str]:
    data = write_cifar(tmp_path_factory.mktemp("cifar"), train=128, test=32)
    return ["dataset=cifar10", f"data_dir={data}", "model=resnet20", "workers=4", "epochs=1", "batch_size=4",
            "lr=0.05", "momentum=0.9", "nesterov=true", "dtype=float64", "grad_backend=loop", "algorithm=gossip",
            "bn_eval=recompute"]


# ---------------------------------------------------------------- parity: 4 and 2 processes


ACCEPTANCE = ["workers=4", "epochs=1", "num_samples=1000", "algorithm=gossip", *FAST]  # float32, CLI defaults


@pytest.fixture(scope="module")
def dist_runs(tmp_path_factory, cifar_case):
    """{procs: run root}, launched on first use: one launch per process count runs every case.
    2 processes go through torchrun (its agent hosts the store); 4 are started directly with
    torchrun's environment (rank 0 hosts the store)."""
    roots = {}

    def get(procs: int) -> Path:
        if procs not in roots:
            root = tmp_path_factory.mktemp(f"dist{procs}")
            cases = ([[name, SMALL + o] for name, o in PARITY_CASES] + [[CIFAR_CASE, cifar_case]]
                     + [["acceptance", ACCEPTANCE]])
            (root / "cases.json").write_text(json.dumps(cases))
            argv = [str(SCRIPTS / "parity.py"), str(root), str(root / "cases.json")]
            if procs == 2:
                proc = torchrun(procs, *argv, cwd=root, timeout=240)
                results = [(proc.returncode, proc.stdout, proc.stderr)]
                # rank 0 alone prints, once per run
                assert proc.stdout.count("run written to") == len(cases), proc.stdout
            else:
                results = finish(spawn(procs, argv, cwd=root), 240)
            for code, out, err in results:
                assert code == 0, err[-3000:]
            roots[procs] = root
        return roots[procs]
    return get


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


@pytest.mark.parametrize("procs", [4, 2])
@pytest.mark.parametrize("name", [name for name, _ in PARITY_CASES] + [CIFAR_CASE])
def test_dist_matches_the_simulator(name, procs, sim_run, dist_runs, cifar_case):
    overrides = cifar_case if name == CIFAR_CASE else SMALL + dict(PARITY_CASES)[name]
    sim, dist_ = sim_run(overrides), dist_runs(procs) / name
    a, b = torch.load(sim / "checkpoint.pt"), torch.load(dist_ / "checkpoint.pt")
    Xa, Xb = a["rows"]["X"], b["rows"]["X"]
    assert Xb.shape == Xa.shape == (4, Xa.shape[1])  # rank 0 saved the full gathered matrix
    assert (Xb - Xa).abs().max() < 1e-10  # in float64 the difference is rounding only
    torch.testing.assert_close(b["rows"]["B"], a["rows"]["B"], rtol=0, atol=1e-10)  # BatchNorm statistics, if any
    for key, value in a["optimizer"]["rows"].items():
        assert (b["optimizer"]["rows"][key] - value).abs().max() < 1e-10, key
    for key, value in a["schedule"].get("rows", {}).items():  # compression references and residuals
        assert (b["schedule"]["rows"][key] - value).abs().max() < 1e-10, key
    assert a["schedule"].keys() == b["schedule"].keys() and a["comm"] == b["comm"]
    assert_same_summary(summary_of(sim), summary_of(dist_), rel=1e-9)
    rows = [json.loads(line) for line in (dist_ / "metrics.jsonl").read_text().splitlines()]
    sim_rows = [json.loads(line) for line in (sim / "metrics.jsonl").read_text().splitlines()]
    for key in ("comm_rounds", "gossip_period", "sim_seconds"):  # sim_seconds: the same events priced
        assert [r.get(key) for r in rows] == [r.get(key) for r in sim_rows], key


@pytest.mark.parametrize("procs", [4, 2])
def test_the_dist_engine_times_its_communication_with_a_network(procs, dist_runs):
    """comm_seconds: the wall time of the algorithm's collectives, growing with the rows; only
    where time is asked for (a network section)."""
    rows = [json.loads(line) for line in (dist_runs(procs) / "hierarchical" / "metrics.jsonl").read_text().splitlines()]
    measured = [r["comm_seconds"] for r in rows]
    assert measured == sorted(measured) and measured[-1] > 0
    s = json.loads((dist_runs(procs) / "hierarchical" / "summary.json").read_text())
    assert s["comm_seconds"] == measured[-1] and s["comm_seconds_metrics"] > 0
    assert "comm_seconds" not in json.loads((dist_runs(procs) / "local" / "summary.json").read_text())


@pytest.mark.parametrize("procs", [4, 2])
def test_every_operator_matches_the_simulator(procs, dist_runs):
    """allreduce, block means (inside and across processes), gossip on static and time-varying
    graphs, packed sign averaging, x̄, Ξ², scalar means: the simulator's rows and the same counts."""
    for rank in range(procs):
        report = json.loads((dist_runs(procs) / f"engine-rank{rank}.json").read_text())
        for n, r in report.items():
            assert r["comm_equal"], (rank, n)
            bad = {op: diff for op, diff in r["diffs"].items() if not diff <= 1e-12}
            assert not bad, (rank, n, bad)


def test_ring_gossip_sends_two_messages_of_d_floats_and_allreduce_counts_the_ring_volume(dist_runs):
    """One worker per process (n = P = 4): a ring round sends d values to each of the 2 neighbours."""
    for rank in range(4):
        r = json.loads((dist_runs(4) / f"engine-rank{rank}.json").read_text())["n=4"]
        sent = r["ring_sent"]
        assert sent["messages"] == 2 * sent["rounds"]
        assert sent["values"] == 2 * sent["d"] * sent["rounds"]
    s = summary_of(dist_runs(4) / "allreduce")
    n, d = 4, s["parameters"]
    assert s["bytes_per_worker"] == pytest.approx(s["steps"] * 2 * d * (n - 1) / n * 4)
    g = summary_of(dist_runs(4) / "gossip-ring")
    assert g["bytes_per_worker"] == pytest.approx(g["steps"] * 2 * d * 4)
    assert g["messages_per_worker"] == 2 * g["steps"]


# ---------------------------------------------------------------- the command line under torchrun


@pytest.mark.parametrize("procs", [2, 4])
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


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_lost_process_stops_the_others_within_the_timeout_naming_it(tmp_path, how):
    """3 processes; rank 1 is killed (its connections close) or stopped (it stops answering). The
    others exit non-zero within dist_timeout, each with one line naming rank 1."""
    timeout = 6
    procs = spawn(3, ["-m", "gossamer", "train", "--quiet", "--set", "engine=dist", "--set", "workers=3",
                      "--set", "epochs=500", "--set", "num_samples=1000", "--set", "algorithm=gossip",
                      "--set", f"dist_timeout={timeout}", *sets(FAST), "--out", "run"], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 90
        while not (tmp_path / "run" / "checkpoint.pt").exists():  # training is under way on all ranks
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            assert time.monotonic() < deadline
            time.sleep(0.1)
        os.kill(procs[1].pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        lost_at = time.monotonic()
        for rank in (0, 2):
            code = procs[rank].wait(timeout + 5)
            elapsed = time.monotonic() - lost_at
            err = procs[rank].communicate()[1]
            assert code == 1, err
            assert elapsed <= timeout, elapsed
            lines = err.strip().splitlines()
            assert len(lines) == 1, err
            assert lines[0].startswith("gossamer: error:") and "lost rank 1 of 3" in lines[0], err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()


# ---------------------------------------------------------------- stop and resume


def test_a_signal_on_one_rank_stops_all_at_the_same_step_and_resume_is_exact(tmp_path):
    from test_durable import assert_same_run

    cases = [["gossip", SMALL + ["algorithm=gossip", "topology=ring", "epochs=2"]],
             ["local", SMALL + ["algorithm=local", "local_steps=3", "epochs=2"]]]
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    proc = torchrun(2, str(SCRIPTS / "resume.py"), str(tmp_path), str(tmp_path / "cases.json"), "9",
                    cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name, _ in cases:
        assert torch.load(tmp_path / f"{name}-stopped" / "checkpoint.pt", weights_only=True)["step"] == 2 * 12
        assert_same_run(tmp_path / f"{name}-straight", tmp_path / f"{name}-stopped")

