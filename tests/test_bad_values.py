"""Values that used to slip through: memory a run or a graph cannot have, unbounded error lines,
numbers YAML reads as strings, time models that overflow, constant images, repeated YAML keys and
seeds torch cannot take. Each is refused early in one line naming the option, or accepted."""


import warnings

import numpy as np
import pytest
from test_bad_input import one_line_error, sets

from conftest import write_cifar
from gossamer import models
from gossamer import preflight
from gossamer import topology as topology_module
from gossamer import train as train_module
from gossamer.config import SEED_LIMIT, ConfigError, load_config
from gossamer.data import load_dataset
from gossamer.models import MODELS, build_model
from gossamer.train import build_run, train

TINY = ["workers=2", "epochs=1", "num_samples=200", "batch_size=8"]
GIB = 2**30


def train_argv(tmp_path, *overrides: str) -> list[str]:
    return ["train", "--quiet", "--out", str(tmp_path / "never"), *sets(*overrides)]


# ---------------------------------------------------------------- 1. memory


def test_a_transformer_whose_attention_cannot_fit_is_refused_before_training(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(preflight, "free_memory", lambda: int(3.5 * GIB))
    monkeypatch.setattr(train_module, "WorkerMatrix", never("the worker matrix was built"))
    one_line_error(capsys, train_argv(tmp_path, "dataset=text", "model=transformer", "context=4096", "workers=2",
                                      "batch_size=4"),
                   "context", "GiB", "3.5 GiB free")
    assert not (tmp_path / "never").exists()


def never(what: str):
    """A stand-in for a costly step that a refusal must come before: it fails the test if called."""
    def called(*args, **kwargs):
        raise AssertionError(what)
    return called


def test_a_sequence_keeps_every_layers_attention_for_backward():
    cfg = load_config(None, ["dataset=text", "model=transformer", "context=4096"])
    size = models.footprint(cfg, load_dataset(cfg))
    assert size.train > cfg.layers * cfg.heads * 4096**2 and size.test > cfg.heads * 4096**2


@pytest.mark.parametrize("overrides", [[], ["model=mlp", "num_samples=200", "workers=2"],
                                       ["dataset=text", "model=transformer"],
                                       ["dataset=text", "model=transformer", "layers=3", "heads=2", "width=34",
                                        "context=17"]])
def test_the_parameter_count_is_the_models_before_it_is_built(overrides):
    cfg = load_config(None, overrides)
    data = load_dataset(cfg)
    assert models.footprint(cfg, data).parameters == sum(p.numel() for p in build_model(cfg, data).parameters())


def test_every_model_has_a_footprint(tmp_path):
    write_cifar(tmp_path, train=20, test=10)
    for norm in ("batch", "group", "none"):
        cfg = load_config(None, ["dataset=cifar10", f"data_dir={tmp_path}", "model=resnet20", f"norm={norm}"])
        data = load_dataset(cfg)
        size = models.footprint(cfg, data)
        assert size.parameters == sum(p.numel() for p in build_model(cfg, data).parameters()) and size.train > 0
    assert set(models.FOOTPRINTS) == set(MODELS.names())


@pytest.mark.parametrize("spec, n", [("erdos-renyi", 20000), ("complete", 20000), ("ring", 10**9),
                                     ("random-regular:100", 10**7)])
def test_a_graph_that_cannot_fit_is_refused_before_it_is_built(capsys, monkeypatch, spec, n):
    monkeypatch.setattr(topology_module.build, "free_memory", lambda: int(3.5 * GIB))
    monkeypatch.setattr(topology_module.static, "Mixing", never("a mixing matrix was built"))
    one_line_error(capsys, ["topology", spec, "-n", str(n)], f"n = {n}", "-n", "workers", "GiB",
                   "3.5 GiB free", "at most n = ")


def test_graphs_that_fit_are_built_and_the_bound_is_what_fits(monkeypatch):
    monkeypatch.setattr(topology_module.build, "free_memory", lambda: int(3.5 * GIB))
    with pytest.raises(ConfigError) as refused:
        topology_module.build_topology("complete", 20000)
    fits = int(str(refused.value).split("at most n = ")[1].split()[0].rstrip(",;:"))
    assert 2000 < fits < 20000
    graph_bytes = topology_module.graph_bytes
    assert graph_bytes("complete", fits) <= 3.5 * GIB < graph_bytes("complete", fits + 1)
    assert topology_module.build_topology("erdos-renyi", 64).n == 64
    assert all(e.traits.get("size") for e in topology_module.TOPOLOGIES.entries.values())


def test_too_many_sampled_rounds_blame_rounds_not_workers(capsys, monkeypatch):
    monkeypatch.setattr(topology_module.build, "free_memory", lambda: int(3.5 * GIB))
    monkeypatch.setattr(topology_module.dynamic, "Mixing", never("a mixing matrix was built"))
    message = one_line_error(capsys, ["topology", "random-matching", "-n", "8", "--rounds", "100000000"],
                             "100,000,000 rounds", "--rounds", "3.5 GiB free", "at most --rounds ")
    assert "at most n" not in message
    most = int(message.split("at most --rounds ")[1].split()[0].replace(",", ""))
    graph_bytes = topology_module.graph_bytes
    assert graph_bytes("random-matching", 8, most) <= 3.5 * GIB < graph_bytes("random-matching", 8, most + 1)


def test_the_dense_spectrum_of_a_directed_graph_is_refused_before_it_is_computed(tmp_path, capsys, monkeypatch):
    n = 20000
    (tmp_path / "directed.txt").write_text("".join(f"{i} -> {(i + 1) % n}\n" + f"{i} -> {(i + 2) % n}\n" * (i % 2 == 0)
                                                   for i in range(n)))
    monkeypatch.setattr(topology_module.build, "free_memory", lambda: int(3.5 * GIB))
    monkeypatch.setattr(np.linalg, "eig", never("the dense spectrum was computed"))
    one_line_error(capsys, ["topology", f"edges:{tmp_path / 'directed.txt'}", "-n", str(n)],
                   "the spectral gap of directed topology", f"n = {n}", "-n", "at most n = ")


# ---------------------------------------------------------------- 2. bounded error lines


@pytest.mark.parametrize("overrides, fragment", [
    (["algorithm=gossip", "gossip_form=" + "x" * 200_000], "unknown gossip_form 'xxx"),
    (["algorithm=gossip", 'gossip_form="' + "x\\n" * 1000 + '"'], "unknown gossip_form 'x\\nx"),
    (["algorithm=gossip", "consensus.target=constant", "consensus.value=1", "consensus.on_budget=" + "x" * 200_000],
     "unknown consensus.on_budget 'xxx"),
    (["algorithm=gossip", 'consensus.measure="' + "x\\n" * 1000 + '"'], "unknown consensus.measure"),
    (["algorithm=gossip", "topology=random-regular:" + "7" * 300_000], "takes an integer degree D"),
    (["algorithm=gossip", "topology=erdos-renyi:x" + "7" * 300_000], "takes an edge probability Q"),
    (["milestones=[" + ",".join(["3", "2"] * 25_000) + "]"], "milestones must be increasing epochs"),
    (["model=resnet20", 'norm="' + "x\\n" * 1000 + '"'], "unknown norm"),
    (["algorithm=local", "compression=top-k:" + "x" * 3000], "takes a fraction F"),
    (["algorithm=local", "compression=qsgd:" + "x" * 3000], "takes an integer number of levels"),
    (["algorithm=local", "compression=sign:" + "x" * 3000], "takes no parameter"),
    (["engine=dist", "dist_backend=" + "x" * 3000], "unknown dist_backend 'xxx"),
])
def test_a_long_value_is_cut_in_the_error_line(tmp_path, capsys, overrides, fragment):
    err = one_line_error(capsys, train_argv(tmp_path, *overrides), fragment)
    assert len(err) < 300, err


def test_topology_errors_cut_the_spec(capsys):
    for spec in ["random-regular:" + "7" * 300_000, "erdos-renyi:x" + "7" * 300_000]:
        err = one_line_error(capsys, ["topology", spec, "-n", "8"], "topology")
        assert len(err) < 300, err


# ---------------------------------------------------------------- 3. numbers YAML reads as strings


@pytest.mark.parametrize("text, ms", [("2e1", 20.0), ("1e-3", 0.001), ("20", 20.0), ("2.5", 2.5)])
def test_compute_ms_in_e_notation_is_a_number(text, ms):
    assert load_config(None, ["network=ethernet-10g", f"compute_ms={text}"]).compute_ms == ms


@pytest.mark.parametrize("text, fragment", [("nan", "compute_ms must be a finite number"),
                                            ("-2e1", "compute_ms must be >= 0"),
                                            ("2e1x", "compute_ms must be measured")])
def test_compute_ms_strings_that_are_not_usable_numbers_are_refused(tmp_path, capsys, text, fragment):
    one_line_error(capsys, train_argv(tmp_path, "network=ethernet-10g", f"compute_ms={text}"), fragment)


# ---------------------------------------------------------------- 4. the time model stays finite


@pytest.mark.parametrize("overrides, fragment", [
    (["network.bandwidth=1e-320", "network.latency=1"], "network.bandwidth must be a normal"),
    (["network.bandwidth=5e-324", "network.latency=1"], "network.bandwidth must be a normal"),
    (["network=ethernet-1g", "network.workers_per_node=2", "network.intra_node_bandwidth=1e-310"],
     "network.intra_node_bandwidth must be a normal"),
    ([*TINY, "epochs=3000", "network.bandwidth=3e-308", "network.latency=1"], "network.bandwidth"),
    ([*TINY, "epochs=3000", "network.bandwidth=1", "network.latency=1e308"], "network.latency"),
    ([*TINY, "epochs=3000", "network=nvlink", "compute_ms=1e307"], "compute_ms"),
    ([*TINY, "network=nvlink", "compute_ms=1e308"], "compute_ms of 1e+308 ms"),
    ([*TINY, "network=nvlink", "compute_ms=5", "slow_workers=0.5@1e308"], "slow_workers with a slowdown of 1e+308"),
])
def test_links_that_make_the_simulated_time_overflow_are_refused(tmp_path, capsys, overrides, fragment):
    """One line naming the key that overflows, and no numpy RuntimeWarning before it (issue 34)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        err = one_line_error(capsys, train_argv(tmp_path, "workers=2", *overrides), fragment)
    assert "finite" in err or "normal" in err, err


def test_a_slow_but_finite_network_trains_to_finite_seconds(tmp_path):
    cfg = load_config(None, [*TINY, "network.bandwidth=1e-200", "network.latency=1e206", "compute_ms=1"])
    summary = train(cfg, build_run(cfg))
    assert np.isfinite(summary["sim_seconds"]) and summary["sim_seconds"] > 1e200


# ---------------------------------------------------------------- 5. constant images


def test_cifar_with_a_constant_channel_is_a_data_error(tmp_path, capsys):
    root = write_cifar(tmp_path / "data", train=40, test=20)
    folder = root / "cifar-10-batches-bin"
    for path in folder.iterdir():
        records = np.frombuffer(path.read_bytes(), np.uint8).reshape(-1, 3073).copy()
        records[:, 1 + 1024 : 1 + 2048] = 128  # every green pixel
        path.write_bytes(records.tobytes())
    one_line_error(capsys, train_argv(tmp_path, "dataset=cifar10", f"data_dir={root}", "download=false",
                                      "model=resnet20", "workers=2", "batch_size=4", "epochs=1"),
                   f"data_dir '{root}'", "constant", "green")


# ---------------------------------------------------------------- 6. repeated YAML keys


@pytest.mark.parametrize("text, key", [("workers: 4\nepochs: 2\nworkers: 8\n", "workers"),
                                       ("network:\n  latency: 1\n  bandwidth: 2\n  latency: 3\n", "latency")])
def test_a_config_file_that_repeats_a_key_is_refused(tmp_path, capsys, text, key):
    (tmp_path / "twice.yaml").write_text(text)
    one_line_error(capsys, ["train", str(tmp_path / "twice.yaml"), "--quiet", "--out", str(tmp_path / "never")],
                   f"'{tmp_path / 'twice.yaml'}'", f"'{key}'", "twice")


def test_a_set_value_that_repeats_a_key_is_refused(tmp_path, capsys):
    one_line_error(capsys, train_argv(tmp_path, "network={latency: 1, bandwidth: 2, latency: 3}"),
                   "--set network", "'latency'", "twice")


def test_a_yaml_merge_key_may_be_overridden(tmp_path):
    (tmp_path / "run.yaml").write_text("network:\n  <<: {bandwidth: 1, latency: 2}\n  latency: 5\nworkers: 4\n")
    assert load_config(tmp_path / "run.yaml").network.latency == 5.0


# ---------------------------------------------------------------- 7. seeds


@pytest.mark.parametrize("overrides, key", [(["seed=-1"], "seed"), (["seed=1125899906842624"], "seed"),
                                            (["seed=9223372036854775808"], "seed"),
                                            (["seed=" + "9" * 40], "seed"), (["seed=18446744073709551616"], "seed"),
                                            (["algorithm=gossip", "topology_seed=-5"], "topology_seed"),
                                            (["algorithm=gossip", "topology_seed=" + "9" * 30], "topology_seed")])
def test_a_seed_out_of_range_names_the_option(tmp_path, capsys, overrides, key):
    one_line_error(capsys, train_argv(tmp_path, *overrides), f"{key} must be an integer in [")


def test_the_largest_seed_trains(tmp_path):
    cfg = load_config(None, [*TINY, f"seed={SEED_LIMIT - 1}", "algorithm=gossip", "topology=random-regular:1",
                             f"topology_seed={SEED_LIMIT - 1}", "partition=dirichlet", "sharpness=true",
                             "sharpness_samples=4", "sharpness_iterations=1"])
    assert np.isfinite(train(cfg, build_run(cfg))["test_accuracy"])
