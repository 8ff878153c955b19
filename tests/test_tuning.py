"""A validation split held out of the training set, tuning on it (``repro --tune``), and the
statistics of the repro tables: Student t intervals over seeds and paired differences."""

import json
import math

import pytest
import torch

from conftest import small_config, train_rows
from gossamer.cli import main
from gossamer.config import ConfigError, load_config
from gossamer.data.partition import validation_split
from gossamer.report import mean_ci, t_quantile
from gossamer import repro
from gossamer.train import Diverged, averaged_model, build_run


def _same(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if "seconds" not in k} == {k: v for k, v in b.items() if "seconds" not in k}


def test_validation_fraction_zero_is_the_run_without_it_bit_for_bit():
    rows, summary, _ = train_rows("epochs=1", "model=mlp")
    rows0, summary0, _ = train_rows("epochs=1", "model=mlp", "validation_fraction=0")
    assert len(rows) == len(rows0) and all(_same(a, b) for a, b in zip(rows, rows0)) and _same(summary, summary0)
    assert not [k for k in summary0 if k.startswith("val_")]


def test_the_split_is_disjoint_and_drawn_from_the_seed():
    kept, held = validation_split(1000, 0.25, seed=3, n=4, batch_size=16)
    assert (len(kept), len(held)) == (750, 250)
    assert sorted(torch.cat([kept, held]).tolist()) == list(range(1000))
    again = validation_split(1000, 0.25, seed=3, n=4, batch_size=16)
    assert torch.equal(kept, again[0]) and torch.equal(held, again[1])
    assert not torch.equal(held, validation_split(1000, 0.25, seed=4, n=4, batch_size=16)[1])


def test_a_run_with_a_validation_split_trains_on_the_rest_and_reports_val_metrics():
    full = build_run(small_config())
    rows, summary, run = train_rows("epochs=1", "model=mlp", "validation_fraction=0.25")
    kept, held = validation_split(800, 0.25, seed=0, n=4, batch_size=16)
    assert torch.equal(run.data.x_train, full.data.x_train[kept]) and torch.equal(run.data.x_val, full.data.x_train[held])
    assert torch.equal(run.data.x_test, full.data.x_test)  # the test set is untouched
    assert 0 <= summary["val_accuracy"] <= 1 and "test_accuracy" in summary and "val_accuracy_local_mean" not in summary
    assert summary["val_accuracy"] == rows[-1]["val_accuracy"]
    # x̄ of the last step on the held-out split, evaluated directly (issue 45, item 22: bounds only)
    held_out = run.task.evaluate(averaged_model(run, summary["steps"] - 1), run.data.x_val, run.data.y_val)
    assert summary["val_accuracy"] == held_out["test_accuracy"]


@pytest.mark.parametrize("value, what", [("1", "in \\[0, 1\\)"), ("-0.1", "in \\[0, 1\\)"),
                                         ("0.99", "leaves 8 samples, 2 per worker"), ("0.001", "holds out no sample")])
def test_a_bad_validation_fraction_is_refused_naming_it(value, what):
    with pytest.raises(ConfigError, match=f"validation_fraction.*{what}"):
        build_run(small_config(f"validation_fraction={value}"))


def test_t_quantiles_match_their_closed_forms_and_tables():
    for q in (0.9, 0.975, 0.995):  # ν = 1: A = 2θ/π; ν = 2: A = sin θ = t / sqrt(t² + 2)
        a = 2 * q - 1
        assert t_quantile(q, 1) == pytest.approx(math.tan(math.pi * a / 2), rel=1e-12)
        assert t_quantile(q, 2) == pytest.approx(a * math.sqrt(2 / (1 - a * a)), rel=1e-12)
    scipy_ppf = {3: 3.1824463052837078, 4: 2.7764451051977934, 9: 2.262157162798205, 30: 2.0422724563012378,
                 100: 1.9839715185235518}  # scipy.stats.t.ppf(0.975, df)
    for df, t in scipy_ppf.items():
        assert t_quantile(0.975, df) == pytest.approx(t, rel=1e-12)
    with pytest.raises(ValueError):
        t_quantile(0.975, 0)


def test_the_interval_over_seeds_and_the_paired_difference(tmp_path):
    assert mean_ci([1.0, 2.0, 3.0]) == pytest.approx((2.0, t_quantile(0.975, 2) / math.sqrt(3)), rel=1e-14)
    assert mean_ci([0.5]) == (0.5, None)
    suite = repro.Suite("t", [], repro.against(repro.Variant("base", [], 4), [repro.Variant("v", [], 4)]))
    for name, accuracies in (("base", (0.40, 0.45, 0.65)), ("v", (0.50, 0.60, 0.70))):
        for seed, acc in zip((7, 8, 9), accuracies):
            (tmp_path / f"{name}-seed{seed}").mkdir()
            (tmp_path / f"{name}-seed{seed}" / "summary.json").write_text(json.dumps({"test_accuracy": acc}))
    table = repro.paired_section(suite, tmp_path, range(7, 10))
    # Δ = 10, 15, 5 points: mean 10, s = 5, half-width t_{0.975,2}·5/√3 = 12.42
    assert "| v | base | +10.00, +15.00, +5.00 | +10.00 ± 12.42 | no |" in table
    assert "Δ per seed (7, 8, 9)" in table and "95% Student t" in table


class _Guarded(dict):
    """A summary whose test metrics cannot be read: tuning must choose without them."""

    def __getitem__(self, key):
        assert not key.startswith("test_"), f"tuning read {key}"
        return super().__getitem__(key)

    get = None  # not used by tuning: a read through get would fail too


def _fake_training(val: dict, test: dict, diverge=(), trained=None):
    """A train_run writing a summary whose val_/test_ accuracy depend on lr as given (a value in
    ``diverge`` raises Diverged), recording every (config, directory) into ``trained``."""
    def run(cfg, out):
        if trained is not None:
            trained.append((cfg, out))
        if cfg.lr in diverge:
            raise Diverged("loss is nan")
        out.mkdir(parents=True)
        summary = {"val_accuracy": val[cfg.lr] + cfg.seed * 1e-3, "test_accuracy": test[cfg.lr] + cfg.seed * 1e-2}
        (out / "summary.json").write_text(json.dumps(summary))
    return run


def test_tuning_picks_the_best_validation_value_and_never_reads_test_metrics(tmp_path, monkeypatch):
    monkeypatch.setattr(repro.runner, "read_summary",  # where tune reads the summaries
                        lambda path: _Guarded(json.loads((path / "summary.json").read_text())))
    suite = repro.build_suite("ring-scaling", quick=True)
    grid, trained = [0.001, 0.002, 0.004, 0.008], []
    val = {0.001: 0.5, 0.002: 0.7, 0.004: 0.6, 0.008: 0.9}  # 0.008 diverges: 0.002 wins on validation,
    test = {0.001: 0.5, 0.002: 0.6, 0.004: 0.9, 0.008: 0.5}  # 0.004 would have on test
    tuned = repro.tune(suite, "lr", grid, range(3, 5), tmp_path, _fake_training(val, test, {0.008}, trained))
    assert {name: t.value for name, t in tuned.items()} == {"allreduce n=4": 0.002, "allreduce n=8": 0.002}
    assert tuned["allreduce n=4"].scores[1] == [0.703, 0.704] and tuned["allreduce n=4"].scores[3] == [None, None]
    assert {(c.workers, c.lr, c.seed) for c, _ in trained} == {(n, lr, s) for n in (4, 8) for lr in grid for s in (3, 4)}
    assert all(c.algorithm == "allreduce" and c.validation_fraction == 0.1 and c.eval_local == "none" for c, _ in trained)


def test_tuning_a_language_model_minimises_the_validation_loss(tmp_path):
    suite = repro.build_suite("decentralized-adam", quick=True)

    def run(cfg, out):
        out.mkdir(parents=True)
        (out / "summary.json").write_text(json.dumps({"val_loss": abs(cfg.lr - 0.002), "val_perplexity": 1.0}))
    tuned = repro.tune(suite, "lr", [0.001, 0.002, 0.004], range(1), tmp_path, run)
    assert {name: (t.value, t.metric) for name, t in tuned.items()} == {"allreduce adam": (0.002, "val_loss")}
    with pytest.raises(ConfigError, match="--tune lr: allreduce adam diverged at every value"):
        repro.tune(suite, "lr", [0.001, 0.002], range(1), tmp_path / "nan", _fake_training({}, {}, {0.001, 0.002}))


def test_repro_runs_the_seeds_from_first_seed_at_the_tuned_rate(tmp_path, monkeypatch):
    monkeypatch.setattr(repro.runner, "consensus_report", lambda suite, configs, out, seeds: "(the suite's tables)\n")
    trained = []
    val, test = {0.001: 0.6, 0.002: 0.8}, {0.001: 0.9, 0.002: 0.1}
    out = tmp_path / "suite"
    results = repro.run_suite("ring-scaling", out, 2, True, _fake_training(val, test, trained=trained), log=lambda m: None,
                              first_seed=3, tune_grid="lr=[0.001,0.002]")
    final = [(c, d) for c, d in trained if d.parent == out]
    assert sorted(d.name for _, d in final) == sorted(f"{repro.slug(v.name)}-seed{s}" for v in
                                                      repro.build_suite("ring-scaling", quick=True).variants
                                                      for s in (3, 4))
    assert {(c.seed, c.lr, c.validation_fraction) for c, _ in final} == {(3, 0.002, None), (4, 0.002, None)}
    text = results.read_text()
    assert "`gossamer repro ring-scaling --seeds 2 --first-seed 3 --quick --tune lr=[0.001,0.002]`" in text
    assert "over K = 2 seeds (3, 4)" in text and "| allreduce n=4 | 0.002 | val accuracy 0.8035 ± " in text
    assert "| ring n=8 | allreduce n=8 | " in text and "Δ per seed (3, 4)" in text
    assert "**At the grid's edge** (allreduce n=4: 0.002 is the grid's largest value; allreduce n=8: " in text


def test_a_choice_at_the_grids_edge_is_flagged():
    assert [repro.grid_edge([0.1, 0.2, 0.4], v) for v in (0.1, 0.2, 0.4)] == ["smallest", None, "largest"]
    assert repro.grid_edge([0.1], 0.1) is None and repro.grid_edge(["adam", "sgd"], "adam") is None


def test_bad_repro_seed_and_tune_options_are_refused(capsys):
    assert main(["repro", "ring-scaling", "--quick", "--dry-run", "--first-seed", "-1"]) == 2
    assert main(["repro", "ring-scaling", "--quick", "--dry-run", "--tune", "lr=0.1"]) == 2
    assert main(["repro", "ring-scaling", "--quick", "--dry-run", "--tune", "lr=[0.1,-1]"]) == 2
    assert main(["repro", "ring-scaling", "--quick", "--dry-run", "--tune", "lr=[0.1,0.2]", "--set", "lr=0.3"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert [line.split(":")[2].strip().split(" ")[0] for line in err] == ["--first-seed", "--tune", "--tune", "--tune"]
    assert load_config(None, ["validation_fraction=0.5"]).validation_fraction == 0.5


def test_a_second_tune_and_a_validation_fraction_of_0_are_refused_not_ignored(capsys):
    """Issue 34: a second --tune was dropped silently, and --set validation_fraction=0 replaced by 0.1."""
    assert main(["repro", "ring-scaling", "--quick", "--dry-run", "--tune", "lr=[0.1,0.2]",
                 "--tune", "momentum=[0.8,0.9]"]) == 2
    assert capsys.readouterr().err == ("gossamer: error: --tune is given 2 times (lr and momentum): one key is tuned "
                                       "at a time; tune one, then give the value chosen with --set\n")
    assert main(["repro", "ring-scaling", "--quick", "--dry-run", "--tune", "lr=[0.1,0.2]",
                 "--set", "validation_fraction=0"]) == 2
    assert capsys.readouterr().err == ("gossamer: error: --tune lr: validation_fraction 0 holds nothing out, and "
                                       "tuning reads only the validation split: give a fraction in (0, 1), or leave "
                                       "it unset (0.1)\n")
    assert main(["repro", "ring-scaling", "--quick", "--dry-run", "--tune", "lr=[0.1,0.2]",
                 "--set", "validation_fraction=0.2"]) == 0


def test_a_validation_fraction_that_leaves_no_batch_blames_itself_in_the_estimate(capsys):
    """Issue 34: repro's work estimate blamed batch_size for what validation_fraction=0.999999 did."""
    assert main(["repro", "local-sgd", "--quick", "--dry-run", "--set", "validation_fraction=0.999999"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gossamer: error: validation_fraction=0.999999 of the ")
