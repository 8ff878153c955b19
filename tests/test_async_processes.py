"""Asynchronous local SGD on real processes (:mod:`gossamer.async_processes`): a run of 4 processes
(a server and 3 workers, one of them 3 times slower, one killed on the way, then the server, then
the run resumed) replayed by the simulator bit for bit in float64; the replay of the order the simulator's clocks give is the simulator; an event log of
another run, or one that ends early, is refused in one line."""

import json
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
from launch import finish, sets, spawn
from test_bad_input import one_line_error

from gossamer.async_processes import LOG, LOG_FORMAT, replay
from gossamer.cli import main
from gossamer.config import load_config
from gossamer.network import Speeds
from gossamer.rundir import load_checkpoint, read_rows, read_summary
from gossamer.train import build_run, train

ROOT = Path(__file__).resolve().parents[1]
# float64, 3 workers of H = 2 (one 3x slower), a grace window, the server on rank 1, a checkpoint
# every quarter epoch
PROCESSES = ["algorithm=async-local-sgd", "engine=dist", "workers=3", "local_steps=2", "epochs=2", "batch_size=16",
             "num_samples=2000", "lr=0.05", "momentum=0.9", "nesterov=true", "dtype=float64", "grad_backend=loop",
             "slow_workers=0.3@3", "grace_window=0.003", "server_rank=1", "dist_timeout=30", "checkpoint_every=0.25"]
SERVER_RANK = 1

# AD-PSGD: 3 workers (odd n, so each round's random matching leaves one out) and the coordinator
# on the last rank, one worker 3x slower
PAIRS = ["algorithm=ad-psgd", "engine=dist", "workers=3", "topology=random-matching", "epochs=1", "batch_size=16",
         "num_samples=800", "lr=0.05", "momentum=0.9", "dtype=float64", "grad_backend=loop", "slow_workers=0.34@3",
         "server_rank=3", "dist_timeout=30"]


def roles(config: list[str] = PROCESSES) -> tuple[int, int, int]:
    """(the slow worker, the fast one that lives, the fast one the test kills)."""
    slow = int(Speeds.of(load_config(None, config)).slow.argmax())
    fast = [w for w in range(3) if w != slow]
    return slow, fast[0], fast[1]


def kill_when(proc, ready, seconds: float = 90) -> None:
    """SIGKILL ``proc`` as soon as ``ready()`` (polled every 5 ms), unless it ended first."""
    began = time.monotonic()
    while time.monotonic() - began < seconds and proc.poll() is None:
        if ready():
            proc.send_signal(signal.SIGKILL)
            return
        time.sleep(0.005)


@pytest.fixture(scope="module")
def processes_run(tmp_path_factory) -> Path:
    """The run: one fast worker SIGKILLed after its second push, later the server (after a
    checkpoint), then the run resumed on 4 new processes, the killed worker rejoining; the same
    processes then run AD-PSGD twice, a fast worker SIGKILLed after 30 events of the second."""
    out = tmp_path_factory.mktemp("async") / "run"
    procs = spawn(4, ["-m", "gossamer", "train", "--quiet", "--out", str(out), *sets(PROCESSES)], cwd=ROOT)
    victim = roles()[2]
    rank = [r for r in range(4) if r != SERVER_RANK][victim]
    log = out / LOG

    def lines() -> list[str]:
        return log.read_text().splitlines() if log.is_file() else []
    kill_when(procs[rank], lambda: sum(f'"push": {victim},' in line for line in lines()) >= 2)
    kill_when(procs[SERVER_RANK], lambda: (out / "checkpoint.pt").is_file() and len(lines()) >= 100)
    results = finish(procs, 120)
    assert [code for code, _, _ in results] == [1 if r not in (rank, SERVER_RANK) else -signal.SIGKILL
                                                for r in range(4)], [err[-2000:] for _, _, err in results]
    assert all(f"lost the server (rank {SERVER_RANK})" in err for r, (_, _, err) in enumerate(results)
               if r not in (rank, SERVER_RANK))
    pairs, killed = out.parent / "pairs", out.parent / "pairs-killed"  # the same 4 processes: one launch less
    script = (f"import sys; from gossamer.cli import main; sys.exit(main(['train', '--quiet', '--resume', {str(out)!r}])"
              f" or main(['train', '--quiet', '--out', {str(pairs)!r}, *{sets(PAIRS)!r}])"
              f" or main(['train', '--quiet', '--out', {str(killed)!r}, *{sets(PAIRS + ['epochs=8'])!r}]))")
    procs = spawn(4, ["-c", script], cwd=ROOT)
    victim = roles(PAIRS)[2]  # ranks 0-2 are workers 0-2
    kill_when(procs[victim], lambda: (killed / LOG).is_file() and (killed / LOG).read_text().count('"event"') >= 30)
    results = finish(procs, 120)
    assert [code for code, _, _ in results] == [-signal.SIGKILL if r == victim else 0 for r in range(4)], \
        [err[-3000:] for _, _, err in results]
    written = {r: o.count("run written to") for r, (_, o, _) in enumerate(results) if r != victim}
    assert written == {r: {SERVER_RANK: 1, 3: 2}.get(r, 0) for r in written}  # the server's, the coordinator's two
    return out


def events_of(run: Path) -> tuple[dict, list[dict]]:
    lines = [json.loads(line) for line in (run / LOG).read_text().splitlines()]
    return lines[0], lines[1:]


@pytest.mark.slow
def test_a_run_of_processes_is_replayed_bit_for_bit(processes_run, tmp_path):
    """Pushes in their real order, a slow worker, a grace window, a worker killed, then the server,
    the run resumed with every worker rejoining: the replay's rows are the processes' to the last bit."""
    header, events = events_of(processes_run)
    assert header["processes"] == 4 and header["server_rank"] == SERVER_RANK and events[-1]["end"]
    slow, fast, victim = roles()
    version, read = 0, dict.fromkeys(range(3), 0)
    for e in events[:-1]:  # every push writes the next version; a pull or a rejoin reads the latest
        if "push" in e:
            assert (e["read"], e["wrote"]) == (read[e["push"]], version + 1)
            version = e["wrote"]
        elif "pull" in e or "rejoin" in e:
            assert e["version"] == version
            read[e.get("pull", e.get("rejoin"))] = version
    resumed = next(k for k, e in enumerate(events) if "resume" in e)
    gone = [k for k, e in enumerate(events) if "gone" in e]
    assert [events[k]["gone"] for k in gone] == [victim] and gone[0] < resumed  # dropped once, before the resume
    assert all(e.get("push") != victim for e in events[gone[0]:resumed])  # and not heard of until then
    assert [e.get("rejoin") for e in events[resumed + 1 : resumed + 4]] == [0, 1, 2]  # every worker rejoins
    pushes = [e["push"] for e in events if "push" in e]
    assert victim in [e.get("push") for e in events[resumed:]]  # the killed worker trains again
    assert pushes.count(slow) < pushes.count(fast)  # the slow worker pushes less: the order is real
    assert main(["train", "--quiet", "--replay", str(processes_run), "--out", str(tmp_path / "replay")]) == 0
    processes, replayed = read_rows(processes_run), read_rows(tmp_path / "replay")
    assert len(processes) == 66 and processes == replayed  # every metric, every step, to the last bit
    assert processes[-1]["staleness_max"] == max(e["wrote"] - 1 - e["read"] for e in events if "push" in e)
    summary = read_summary(processes_run)
    assert summary["workers_gone"] == 1 and summary["pushes"] == len(pushes)
    model_bytes = summary["bytes_per_worker"] * 3 / (summary["pushes"] + summary["pulls"])  # the ledger's, a message
    since = sum("push" in e for e in events[resumed:])  # the resumed processes' wire
    assert summary["wire_bytes_received"] == pytest.approx(since * (model_bytes + 16), rel=1e-12)


def write_log(run: Path, cfg, rounds: int) -> None:
    """The event log the simulator's clocks give with equal speeds and no network: each round, all
    n pushes in worker order, then their pulls (one window)."""
    run.mkdir()
    lines = [{"log": LOG_FORMAT, "config": cfg.to_dict(), "processes": cfg.workers + 1, "server_rank": 0,
              "threads": torch.get_num_threads()}]
    version = 0
    for _ in range(rounds):
        read = version
        for w in range(cfg.workers):
            lines.append({"push": w, "read": read, "wrote": version + 1})
            version += 1
        lines += [{"pull": w, "version": version} for w in range(cfg.workers)]
    (run / LOG).write_text("".join(json.dumps(line) + "\n" for line in lines))


@pytest.mark.parametrize("weight", ["unit", "polynomial"])
def test_the_replay_of_the_simulators_order_is_the_simulator(tmp_path, weight):
    """Equal speeds: the simulator applies each round's n pushes in worker order, then all pull. Its
    log replayed (each push computed on a one-row run of its own) gives the same θ, bit for bit."""
    common = ["algorithm=async-local-sgd", "workers=3", "local_steps=2", "epochs=1", "batch_size=16",
              "num_samples=400", "lr=0.05", "momentum=0.9", "dtype=float64", "grad_backend=loop",
              f"async_weight={weight}"]
    cfg = load_config(None, common)
    run = build_run(cfg)
    simulated = train(cfg, run)
    on_processes = load_config(None, [*common, "engine=dist"])
    write_log(tmp_path / "log", on_processes, rounds=run.steps_per_epoch // 2)
    replayed = replay(on_processes, tmp_path / "log", tmp_path / "replay", False, False)
    assert torch.equal(load_checkpoint(tmp_path / "replay")["schedule"]["theta"], run.schedule.theta)
    assert replayed["test_accuracy"] == simulated["test_accuracy"] and replayed["pushes"] == simulated["pushes"]


def test_event_logs_that_are_not_this_runs_are_refused(tmp_path, capsys, monkeypatch):
    common = ["algorithm=async-local-sgd", "engine=dist", "workers=2", "epochs=1", "num_samples=200", "batch_size=8"]
    cfg = load_config(None, common)
    write_log(tmp_path / "log", cfg, rounds=6)
    (tmp_path / "log" / "config.yaml").write_text("")
    out = str(tmp_path / "never")
    replay_of = ["train", "--quiet", "--out", out, "--replay", str(tmp_path / "log")]
    one_line_error(capsys, [*replay_of, *sets([*common, "seed=1"])], "its event log is of another run",
                   "seed (0 → 1)")
    one_line_error(capsys, [*replay_of, *sets([*common, "model=mlp"])], "the config differs in model")
    one_line_error(capsys, [*replay_of, *sets([*common, "epochs=2"])], "the event log ends after event 24, at inner "
                   "step 12 of the 40", "stopped early")
    one_line_error(capsys, [*replay_of, *sets([*common, "engine=sim"])], "--replay replays an event log of "
                   "async-local-sgd or ad-psgd on engine dist")
    one_line_error(capsys, [*replay_of, "--resume", out], "--resume does not apply to it")
    one_line_error(capsys, ["train", "--quiet", "--out", out, "--replay", str(tmp_path)], f"no {LOG} there")
    assert not Path(out).exists()
    monkeypatch.setenv("WORLD_SIZE", "3")
    one_line_error(capsys, ["train", "--quiet", "--out", out, *sets([*common, "server_rank=3"])],
                   "server_rank 3 is out of range: the run has 3 processes (ranks 0-2)")
    monkeypatch.delenv("WORLD_SIZE")
    one_line_error(capsys, ["train", "--quiet", "--out", out, *sets(common)],
                   "workers=2 needs 3, got 1")
    assert not Path(out).exists()


@pytest.mark.slow
def test_ad_psgd_on_processes_is_replayed_bit_for_bit(processes_run, tmp_path, capsys):
    """The pairs the coordinator granted, in its order: the replay's final models are the processes'
    to the bit, and a log with one pair changed is refused."""
    run = tmp_path / "run"
    shutil.copytree(processes_run.parent / "pairs", run)
    header, events = events_of(run)
    assert header["server_rank"] == 3 and [e["event"] for e in events] == list(range(len(events)))
    count = dict.fromkeys(range(3), 0)
    for e in events:  # each worker's events in its own order; the unmatched one of a round averages with none
        assert e["k"] == count[e["i"]]
        count[e["i"]] += 1
    assert {e["j"] is None for e in events} == {True, False}
    pairs, d = sum(e["j"] is not None for e in events), read_summary(run)["parameters"]
    # what every process handed dist.send: two models a pair; a request, a done, a grant (3, 3, 2 values) an
    # event; a notice (2) a pair; each of the 3 workers' last request, its stop grant and stop notice, and its
    # passive thread's stop report (3, 2, 2, 1)
    control = len(events) * 8 + 2 * pairs + 3 * (3 + 2 + 2 + 1)
    assert read_summary(run)["wire_bytes_sent"] == 8 * (2 * d * pairs + control)
    assert main(["train", "--quiet", "--replay", str(run), "--out", str(tmp_path / "replay")]) == 0
    processes = torch.load(run / "models.pt", weights_only=True)
    assert torch.equal(load_checkpoint(tmp_path / "replay")["rows"]["X"], processes)
    assert len(read_rows(tmp_path / "replay")) == read_summary(run)["steps"]
    changed = next(k for k, e in enumerate(events) if e["j"] is not None and e["k"] >= 2)  # models differ by then
    events[changed]["j"] = 3 - events[changed]["i"] - events[changed]["j"]  # the third worker instead
    (run / LOG).write_text("".join(json.dumps(line) + "\n" for line in [header, *events]))
    capsys.readouterr()
    one_line_error(capsys, ["train", "--quiet", "--replay", str(run), "--out", str(tmp_path / "other")],
                   "the replay's final models differ from the processes' (models.pt)")
    one_line_error(capsys, ["train", "--quiet", "--resume", str(run)], "--resume: ad-psgd on processes does not "
                   "continue a run")


@pytest.mark.slow
def test_an_ad_psgd_worker_that_dies_is_dropped_and_the_replay_follows(processes_run, tmp_path):
    """A fast worker SIGKILLed after 30 events (of 312, so that the kill lands mid-run): the
    coordinator logs it gone, grants the pairs drawn with it from then on without a partner, and
    the run ends with the living; the replay (the cut sides of pairs kept apart) gives the living
    workers' final models to the bit, and measures the living from the gone line on."""
    run = processes_run.parent / "pairs-killed"
    victim = roles(PAIRS)[2]
    header, lines = events_of(run)
    events = [e for e in lines if "event" in e]
    [gone] = [e for e in lines if "gone" in e]
    assert gone["gone"] == victim and 30 <= gone["after"] < len(events) == 3 * read_summary(run)["steps"]
    after = events[gone["after"]:]
    assert all(e["i"] != victim and e["j"] != victim for e in after)
    assert any(e.get("lost") == victim and e["j"] is None for e in after)
    assert all(c["worker"] != victim and events[c["cut"]]["event"] == c["cut"] for c in lines if "cut" in c)
    summary = read_summary(run)
    assert summary["workers_gone"] == 1 and summary["events"] == len(events)
    processes = torch.load(run / "models.pt", weights_only=True)
    living = [w for w in range(3) if w != victim]
    assert processes[victim].isnan().all() and processes[living].isfinite().all()
    assert main(["train", "--quiet", "--replay", str(run), "--out", str(tmp_path / "replay")]) == 0
    assert torch.equal(load_checkpoint(tmp_path / "replay")["rows"]["X"][living], processes[living])
    replayed = read_summary(tmp_path / "replay")
    assert replayed["final_consensus_distance_sq"] == pytest.approx(summary["final_consensus_distance_sq"], rel=1e-12)
    assert replayed["test_accuracy"] == summary["test_accuracy"]


@pytest.mark.lifecycle
def test_sigterm_to_every_process_stops_the_server_after_a_step_with_a_checkpoint(tmp_path):
    """What torchrun does on Ctrl-C or SIGTERM (it forwards the signal to every process): the server
    finishes its step, checkpoints and says so in one line; its stop ends the workers, silently;
    the checkpoint holds the rows up to that step and the log every event it applied."""
    out = tmp_path / "run"
    procs = spawn(4, ["-m", "gossamer", "train", "--quiet", "--out", str(out),
                      *sets(PROCESSES + ["epochs=40", "server_rank=0"])], cwd=ROOT)
    began = time.monotonic()
    while not (out / "checkpoint.pt").is_file() and time.monotonic() - began < 90:
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.05)
    for p in procs:
        p.send_signal(signal.SIGTERM)
    (code, _, err), *workers = finish(procs, 60)
    assert workers == [(0, "", "")] * 3
    step = load_checkpoint(out)["step"]
    assert code == 128 + signal.SIGTERM and err == (f"gossamer: error: SIGTERM: stopped after step {step} with a "
                                                    f"checkpoint; resume with: gossamer train --resume {out}\n")
    _, events = events_of(out)
    assert len(read_rows(out)) == step and len(events) >= load_checkpoint(out)["schedule"]["recorded"]
    assert not (out / "summary.json").exists()
