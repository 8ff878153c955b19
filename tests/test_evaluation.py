"""Evaluation of the local models: ``eval_local`` (all, none, or K drawn once from the seed)."""

import pytest

from conftest import train_rows

from gossamer.config import ConfigError, load_config
from gossamer.train import local_eval_workers


def test_k_local_models_report_the_mean_of_exactly_those_workers():
    overrides = ("algorithm=gossip", "topology=ring", "workers=8", "epochs=1", "model=mlp")  # local models that differ
    _, every, _ = train_rows(*overrides)
    _, some, run_k = train_rows(*overrides, "eval_local=3")
    chosen = local_eval_workers(run_k.cfg)
    w, d, task = run_k.workers, run_k.data, run_k.task
    each = [task.evaluate(w.model_at(w.X[i], w.B[i]), d.x_test, d.y_test)["test_accuracy"] for i in chosen]
    assert len(chosen) == 3 and len(set(each)) > 1
    assert some["test_accuracy_local_mean"] == pytest.approx(sum(each) / 3, abs=1e-15)
    assert some["test_accuracy_local_mean"] != every["test_accuracy_local_mean"]
    assert {k: v for k, v in some.items() if "local" not in k and not k.endswith("_seconds")} == \
        {k: v for k, v in every.items() if "local" not in k and not k.endswith("_seconds")}


def test_all_workers_drawn_is_all_and_none_reports_no_local_metric():
    cfg = load_config(None, ["workers=8", "eval_local=8"])
    assert local_eval_workers(cfg) == list(range(8))
    rows, summary, _ = train_rows("eval_local=none", "epochs=1", "model=mlp")
    assert not [k for row in rows for k in row if "local" in k] and "test_accuracy" in summary
    assert not [k for k in summary if "local" in k]


@pytest.mark.parametrize("value", ["0", "9", "abc", "1.5"])
def test_a_bad_eval_local_is_refused_naming_it(value):
    with pytest.raises(ConfigError, match="eval_local"):
        load_config(None, ["workers=8", f"eval_local={value}"])
