"""The repro suites: their --quick form runs every variant and writes results.md and the plot; the
paper scale runs the shipped configs/paper files, checked and estimated before anything trains."""

import json
import re

import pytest
import yaml

from conftest import write_cifar
from gossamer.cli import main
from gossamer.config import load_config
from gossamer.rundir import read_summary
from gossamer.repro import (KONG_CIFAR, LIN_CIFAR, LIN_NETWORKS, LOWCOMM_NETWORKS, PAPER_CONFIGS, SUITES, build_suite,
                            slug)


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_quick_suite_writes_results_and_plot(suite, tmp_path, capsys):
    out = tmp_path / suite
    assert main(["repro", suite, "--quick", "--first-seed", "3", "--out", str(out), "--set", "weight_decay=0"]) == 0
    assert "sample gradients; ≈" in capsys.readouterr().out  # the estimated work, printed first
    table = (out / "results.md").read_text()
    assert f"gossamer repro {suite} --seeds 1 --first-seed 3 --quick --set weight_decay=0`" in table
    for run in (p for p in out.iterdir() if p.is_dir()):  # the override reached every run
        assert yaml.safe_load((run / "config.yaml").read_text())["weight_decay"] == 0
    for variant in build_suite(suite, "cpu", quick=True).variants:  # time-to-accuracy: a column per network
        assert f"| {variant.name.split(' on ')[0]} |" in table
    plots = re.findall(r"!\[[^]]*\]\(([^)]+)\)", table)
    assert plots and all((out / p).stat().st_size > 10_000 for p in plots)
    assert main(["repro", suite, "--quick", "--out", str(out)]) == 2  # a finished suite is not overwritten
    assert main(["repro", suite, "--quick", "--out", str(tmp_path / "other"), "--set", "colour=red"]) == 2
    tables, paired, differences = table.partition("## Paired differences against the baseline")
    assert paired and "| mean Δ | interval excludes 0 |" in differences  # every suite: variants against baselines
    main_table, _, estimates = tables.partition("## Control from the local estimate")
    cells = [[c.strip() for c in line.strip("| ").split(" | ")] for line in main_table.splitlines()
             if line.startswith("| ")]
    rows = {row[0]: dict(zip(cells[0], row)) for row in cells[1:]}

    def mean(variant: str, column: str) -> float:
        return float(rows[variant][column].split(" ± ")[0])
    if suite == "consensus-phases":  # control bought a smaller phase-1 Ξ² with extra rounds, or saved rounds
        assert mean("ctrl-phase-1 c=1/4", "mean Ξ² phase 1") < mean("ring", "mean Ξ² phase 1")
        assert mean("ctrl-phase-1 c=1/4", "extra gossip rounds") > 0
        assert rows["freq-phase-1 c=1/2"]["gossip rounds saved"] != "—" and rows["ring"]["gossip rounds saved"] == "—"
        assert "| ctrl-phase-1 c=1/4 | " in estimates
    if suite == "local-sgd":  # every run measured the sharpness of x̄; local SGD communicated less
        assert all(mean(v, "sharpness (x̄)") > 0 for v in rows)
        assert mean("local H=16", "comm rounds") < mean("large-batch (All-Reduce, n=4)", "comm rounds")
    if suite == "decentralized-adam":  # a language model: test loss and perplexity, no accuracy
        assert "test loss (x̄) | test ppl (x̄)" in table and "test acc" not in table
        assert mean("allreduce adam", "mean Ξ² phase 1") < 1e-9  # All-Reduce keeps Ξ² at 0
        assert mean("ring adam, local moments", "mean Ξ² phase 1") > 1e-6
    if suite == "heterogeneous":  # gradient tracking gossips x and y: twice D-SGD's bytes
        assert mean("gradient tracking iid", "MB/worker") == pytest.approx(2 * mean("D-SGD iid", "MB/worker"), rel=1e-2)
    if suite == "time-to-accuracy":
        the_network_changes_time_not_training(out, table)
    if suite == "faults":  # the fewest alive: 4 of 8 gone in the window; the window's Ξ² over the living
        assert rows["ring, no faults"]["workers alive (fewest)"] == "8"
        assert rows["ring, 4 lost mid-run, rejoin stale"]["workers alive (fewest)"] == "4"
        assert "Fault window: steps 8–16 of 24" in table
    if suite == "topologies":  # the measures beside the accuracy, and which ranks it better
        assert rows["allreduce n=16"]["spectral gap (rounds)"] == "1.0000 (1)"
        assert float(rows["allreduce n=16"]["n_W(γ)"]) == pytest.approx(16)
        assert rows["random-matching n=16"]["spectral gap (rounds)"].endswith("(32)")
        assert 1 < float(rows["ring n=16"]["n_W(γ)"]) < float(rows["exponential n=16"]["n_W(γ)"]) < 16
        assert mean("allreduce n=16", "mean Ξ² phase 1") < 1e-9 < mean("ring n=16", "mean Ξ² phase 1")
        assert "ρ_s(accuracy, spectral gap) = " in table and "Reading: n = 16: " in table

    if suite == "low-communication":  # DiLoCo sends the model every H steps; the chain ~1/27 of that
        fast, slow = LOWCOMM_NETWORKS[1], LOWCOMM_NETWORKS[0]
        for variant in (v.name for v in build_suite(suite, "cpu", quick=True).variants if v.name.endswith(fast)):
            a, b = (read_summary(out / f"{slug(v)}-seed3") for v in (variant, variant.replace(fast, slow)))
            assert untimed(a) == untimed(b)
            assert b["sim_seconds"] > a["sim_seconds"] > 0
        plain = read_summary(out / f"{slug('DiLoCo H=2 on ' + fast)}-seed3")
        assert mean("DiLoCo H=2", "× fewer bytes") == plain["steps"] / plain["comm_rounds"]
        assert mean("DiLoCo H=2 + ef-top-k:0.03+quant:2", "MB/worker") < mean("DiLoCo H=2", "MB/worker") / 5


def test_spearman_ranks_with_ties_and_refuses_a_constant_side():
    from gossamer.repro import spearman

    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1)
    assert spearman([1, 1, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)  # scipy.stats.spearmanr
    assert spearman([1, 1, 1], [1, 2, 3]) is None


def untimed(summary: dict) -> dict:
    """A summary without its simulated times and the compute's share of them (they change with the network)."""
    return {k: v for k, v in summary.items() if "seconds" not in k and not k.startswith("compute_utilization")}


def the_network_changes_time_not_training(out, table: str) -> None:
    """Each Lin variant trained on both networks: the same training, more simulated seconds on the
    slow one; control's extra rounds cost seconds."""
    fast, slow = LIN_NETWORKS
    for variant in (v for v in build_suite("time-to-accuracy", "cpu", quick=True).variants if v.name.endswith(fast)):
        a, b = (json.loads((out / f"{slug(v)}-seed3" / "summary.json").read_text())
                for v in (variant.name, variant.name.replace(fast, slow)))
        assert untimed(a) == untimed(b)
        assert b["sim_seconds"] > a["sim_seconds"] > 0 and b["sim_seconds_to_target"] >= a["sim_seconds_to_target"]
    assert f"s to target on {fast}" in table and f"s to target on {slow}" in table
    ctrl = next(line for line in table.splitlines() if line.startswith("| ctrl-phase-1 c=1/4"))
    assert float(ctrl.split(" | ")[-1].split(" ")[0]) > 0  # "cost [± interval] / benefit"


# the shipped file that each paper-scale variant is (up to the reference run of controlled ones)
PAPER_FILES = {
    ("ring-scaling", "allreduce n=32"): "kong2021-cifar10-resnet20-allreduce.yaml",
    ("ring-scaling", "ring n=32"): "kong2021-cifar10-resnet20-ring.yaml",
    ("ring-scaling", "one-peer-exp n=32"): "kong2021-cifar10-resnet20-exponential.yaml",
    ("consensus-phases", "dec-phase-1"): "kong2021-cifar10-resnet20-dec-phase-1.yaml",
    ("consensus-phases", "dec-phase-2"): "kong2021-cifar10-resnet20-dec-phase-2.yaml",
    ("consensus-phases", "dec-phase-3"): "kong2021-cifar10-resnet20-dec-phase-3.yaml",
    ("consensus-phases", "ctrl-phase-1 c=1/4"): "kong2021-cifar10-resnet20-phase1-control.yaml",
    ("decentralized-adam", "allreduce adam"): "kong2021-decentralized-adam.yaml",
    ("decentralized-adam", "ring adam, local moments"): "kong2021-decentralized-adam-ring.yaml",
    ("decentralized-adam", "ring adam, moments averaged"): "kong2021-decentralized-adam-ring-averaged-moments.yaml",
}


@pytest.mark.parametrize("suite, variant", sorted(PAPER_FILES))
def test_paper_scale_runs_the_shipped_configs(suite, variant):
    s = build_suite(suite, "paper")
    v = next(v for v in s.variants if v.name == variant)
    shipped = load_config(PAPER_CONFIGS / PAPER_FILES[suite, variant], ["consensus.target=run:REF"]
                          if "control" in PAPER_FILES[suite, variant] else [])
    assert s.config(v).to_dict() == shipped.to_dict()


def test_paper_scale_heterogeneous_variants_are_valid_configs():
    s = build_suite("heterogeneous", "paper")
    configs = [s.config(v) for v in s.variants]
    assert {(c.algorithm, c.partition, c.model) for c in configs} >= {("choco", "dirichlet", "resnet20"),
                                                                       ("gradient-tracking", "iid", "resnet20")}


def test_paper_scale_time_to_accuracy_starts_each_paper_from_its_own_file():
    s = build_suite("time-to-accuracy", "paper")
    configs = {v.name: s.config(v) for v in s.variants}
    fast, slow = LIN_NETWORKS
    for name, shipped, workers in ((f"mini-batch B=128 on {slow}", LIN_CIFAR, 16), ("ring n=32 on wan-100m", KONG_CIFAR, 32)):
        cfg, paper = configs[name], load_config(PAPER_CONFIGS / shipped)
        assert (cfg.workers, cfg.batch_size, cfg.lr, cfg.epochs, cfg.model) == \
            (workers, paper.batch_size, paper.lr, paper.epochs, "resnet20")
        assert (cfg.compute_ms, cfg.target_accuracy) == ("flops:25", 0.9)
    large = configs[f"mini-batch B=512 on {fast}"]  # 4 × the batch at the same lr per sample
    assert (large.batch_size, large.lr) == (512, 0.8)
    assert configs["hierarchical H=2 H_b=8 on " + slow].block_size == 4


def test_every_paper_config_loads_with_the_papers_values():
    files = sorted(PAPER_CONFIGS.glob("*.yaml"))
    assert len(files) == 14
    for path in files:
        text = path.read_text()
        assert text.startswith("# ") and ("Lin" in text or "Kong" in text)  # names its source
        cfg = load_config(path)
        if path.name.startswith("lin2020"):  # K = 16, B = 128, peak lr 0.1 per 64 samples = 3.2
            assert (cfg.workers, cfg.batch_size, cfg.lr * cfg.workers) == (16, 128, 3.2)
        if "cifar10" in path.name:
            assert (cfg.model, cfg.dataset, cfg.epochs, cfg.milestones, cfg.warmup_epochs) == \
                ("resnet20", "cifar10", 300, [150.0, 225.0], 5.0)
            assert (cfg.momentum, cfg.nesterov, cfg.weight_decay) == (0.9, True, 1e-4)
        if path.name.startswith("kong2021-cifar10"):  # local batch 32, lr 0.05 n
            assert (cfg.batch_size, cfg.lr) == (32, 0.05)
    assert load_config(PAPER_CONFIGS / "lin2020-cifar10-resnet20-post-local-sgd.yaml").switch_epoch == 150
    assert "unconfirmed" in (PAPER_CONFIGS / "lin2020-cifar10-resnet20-hierarchical.yaml").read_text()


def test_paper_scale_dry_run_prints_the_work_and_trains_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GOSSAMER_DATA", str(write_cifar(tmp_path / "data", train=3200, test=100)))
    out = tmp_path / "never"
    assert main(["repro", "ring-scaling", "--scale", "paper", "--dry-run", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    # n = 16, 32, 64: 300 epochs of 3200 images, 6, 3, 1 steps of 32 per worker; 3 variants each
    assert "9 variants × 1 seed(s): 9,000 steps, 7,372,800 sample gradients" in printed
    assert not out.exists()
    assert main(["repro", "ring-scaling", "--scale", "paper", "--quick"]) == 2
    monkeypatch.setenv("GOSSAMER_DATA", str(tmp_path / "nothing"))
    assert main(["repro", "consensus-phases", "--scale", "paper", "--dry-run", "--set", "download=false"]) == 2
    assert "CIFAR-10 (cifar-10-batches-bin/" in capsys.readouterr().err


def test_local_sgd_at_paper_scale_is_lins_mini_batch_config_measuring_sharpness():
    suite = build_suite("local-sgd", "paper")
    large = next(v for v in suite.variants if v.name == "large-batch (All-Reduce, n=16)")
    shipped = load_config(PAPER_CONFIGS / "lin2020-cifar10-resnet20-minibatch.yaml", ["sharpness=true"])
    assert suite.config(large).to_dict() == shipped.to_dict()
    post = next(v for v in suite.variants if v.name == "post-local H=16")
    assert (suite.config(post).algorithm, suite.config(post).local_steps) == ("post-local", 16)


def test_low_communication_has_no_paper_scale(capsys):
    assert main(["repro", "low-communication", "--scale", "paper", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "low-communication has only --scale cpu" in err[0]


VICTIM = "ctrl-phase-1 c=1/16"  # the consensus-phases run made to diverge


def train_or_diverge(cfg, out):
    """A suite's run as the CLI trains it, on half the samples (fewer steps: these tests are
    about where runs are trained and how a divergence is told), but VICTIM's at a rate that diverges
    (module level: worker processes import it)."""
    from dataclasses import replace

    from gossamer.runner import train_suite_run

    cfg = fewer_samples(cfg)
    train_suite_run(replace(cfg, lr=1e6) if out.name.startswith(slug(VICTIM)) else cfg, out)


def fewer_samples(cfg):
    """``cfg`` with half its data set's samples."""
    from dataclasses import replace

    data = cfg.options["dataset"]
    return replace(cfg, options={**cfg.options, "dataset": replace(data, num_samples=data.num_samples // 2)})


@pytest.mark.slow
def test_runs_trained_in_worker_processes_are_the_runs_trained_one_by_one(tmp_path):
    """consensus-phases (a reference run that the controlled variants follow, so trained first)
    with --jobs 2 gives every run's summary of the sequential suite and the same results.md (one
    torch thread in both: a run's float32 sums depend on the thread count). One run diverges (its
    learning rate made huge) in a worker process: the suite goes on, its directory holds DIVERGED
    with the message, the tables count it and the paired differences skip it."""
    import torch

    from gossamer.repro import DIVERGED, run_suite

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    logged = []
    try:
        results = [run_suite("consensus-phases", tmp_path / f"jobs{jobs}", 1, True, train_or_diverge,
                             log=logged.append, jobs=jobs).read_text() for jobs in (1, 2)]
    finally:
        torch.set_num_threads(threads)
    runs = sorted(r.name for r in (tmp_path / "jobs1").iterdir() if r.is_dir())
    assert len(runs) == 16 and runs == sorted(r.name for r in (tmp_path / "jobs2").iterdir() if r.is_dir())
    for run in (r for r in runs if not r.startswith(slug(VICTIM))):
        a, b = ({k: v for k, v in read_summary(tmp_path / f"jobs{jobs}" / run).items() if k != "wall_seconds"}
                for jobs in (1, 2))
        assert a == b, run
    assert results[0] == results[1]
    assert "training diverged" in (tmp_path / "jobs2" / f"{slug(VICTIM)}-seed0" / DIVERGED).read_text()
    assert sum("diverged" in line for line in logged) == 2
    assert f"- {VICTIM}, seed 0: training diverged" in results[1]
    assert f"| {VICTIM} | allreduce | diverged | — | — |" in results[1]


def test_jobs_must_be_positive(capsys):
    assert main(["repro", "ring-scaling", "--quick", "--jobs", "0"]) == 2
    assert "--jobs must be a positive integer, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["consensus-phases", "time-to-accuracy", "topologies", "byzantine"])
def test_a_suite_whose_run_diverged_reports_the_seeds_where_none_did(tmp_path, name):
    """The last variant diverges at the second of two seeds: results.md lists it, the suite's own
    tables are over the first seed alone (every variant on the same seeds) — but byzantine's, which
    count a cell's diverged runs — and the paired differences show the diverged seed."""
    from dataclasses import replace

    from gossamer.cli import run_training
    from gossamer.repro import build_suite, run_suite

    victim = build_suite(name, "cpu", True).variants[-1].name

    def train_run(cfg, out):  # on half the samples: the test is about the report
        bad = out.name == f"{slug(victim)}-seed1"
        cfg = fewer_samples(cfg)
        run_training(replace(cfg, lr=1e6) if bad else cfg, out, overwrite=True, progress=False)
    results = run_suite(name, tmp_path, 2, True, train_run, log=lambda line: None).read_text()
    assert f"- {victim}, seed 1: training diverged" in results
    if name == "byzantine":
        assert "(1/2 diverged)" in results and "The tables below" not in results
    else:
        assert "The tables below are over the seeds where no run diverged: 0 (1 of 2)." in results
    assert re.search(rf"\| {re.escape(victim)} \| [^|]+ \| [^|]+, diverged \|", results)


def test_bootstrap_intervals_of_the_rank_correlations_resample_the_seeds():
    """Accuracies ordered by the second measure in every seed: every resample gives ρ = +1 for it
    and −1 for the first, so both intervals are points and their difference's excludes 0; with
    noise the interval holds the point estimate; the draws come from a named stream (repeatable)."""
    from gossamer.repro import bootstrap_spearman, spearman

    accuracy = [[0.1, 0.2, 0.15], [0.3, 0.4, 0.35], [0.5, 0.6, 0.55]]
    intervals = bootstrap_spearman(accuracy, {"gap": [3.0, 2.0, 1.0], "nw": [1.0, 2.0, 3.0]}, draws=200)
    assert intervals["gap"] == (-1.0, -1.0) and intervals["nw"] == (1.0, 1.0) and intervals["gap − nw"] == (-2.0, -2.0)
    noisy = [[0.5, 0.1, 0.3, 0.2], [0.2, 0.4, 0.3, 0.5], [0.4, 0.3, 0.6, 0.1], [0.3, 0.5, 0.2, 0.4]]
    measures = {"gap": [1.0, 2.0, 3.0, 4.0], "nw": [4.0, 1.0, 3.0, 2.0]}
    first = bootstrap_spearman(noisy, measures, draws=300)
    assert first == bootstrap_spearman(noisy, measures, draws=300)
    point = spearman(measures["gap"], [sum(r) / 4 for r in noisy])
    assert first["gap"][0] <= point <= first["gap"][1] and first["gap"][0] < first["gap"][1]
