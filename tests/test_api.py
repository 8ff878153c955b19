"""The Python API (gossamer.run, gossamer.load, gossamer.Data): a model and data given from Python
train exactly as the registered ones; a run directory reads back as the run that wrote it."""

import threading
import time

import pytest
import torch
from cases import SHORT

import gossamer
from gossamer.config import load_config
from gossamer.data import DATASETS, load_dataset
from gossamer.models import MODELS, build_model
from gossamer.registry import ConfigError

CONFIG = {key: value for key, value in (o.split("=") for o in SHORT)}
KEYS = {**{k: v for k, v in CONFIG.items() if k not in ("num_samples", "model")}, "algorithm": "gossip",
        "topology": "ring", "workers": 4, "epochs": 2, "batch_size": 32, "lr": 0.05}


def mnist1d():
    cfg = load_config(None, SHORT)
    data = load_dataset(cfg)
    return cfg, data


def test_a_model_and_tensors_given_from_python_train_as_the_registered_ones():
    """The MLP and MNIST-1D given as an nn.Module factory and tensors: the registered run bit for bit."""
    cfg, data = mnist1d()
    registered = gossamer.run({**KEYS, "model": "mlp", "num_samples": 1000})
    given = gossamer.run(KEYS, model=lambda: build_model(cfg, data),
                         data=gossamer.Data(train=(data.x_train, data.y_train), test=(data.x_test, data.y_test)))
    assert torch.equal(registered.x, given.x) and registered.rows == given.rows
    assert given.config["model"] == given.config["dataset"] == "python"
    assert given.x.shape == (4, sum(p.numel() for p in build_model(cfg, data).parameters()))
    assert "python" not in MODELS and "python" not in DATASETS  # handed to the run, never registered


def test_a_torch_dataset_is_the_same_data_as_its_tensors():
    _, data = mnist1d()
    pairs = torch.utils.data.TensorDataset(data.x_train, data.y_train)
    a = gossamer.Data(train=pairs, test=(data.x_test, data.y_test)).dataset()
    b = gossamer.Data(train=(data.x_train, data.y_train), test=(data.x_test, data.y_test)).dataset()
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_train, b.y_train) and a.num_classes == 10


def test_a_run_directory_loads_as_the_run(tmp_path):
    result = gossamer.run({**KEYS, "model": "mlp", "num_samples": 1000}, out=tmp_path / "run")
    again = gossamer.load(tmp_path / "run")
    straight = gossamer.run({**KEYS, "model": "mlp", "num_samples": 1000})
    assert torch.equal(again.x, straight.x) and again.rows == straight.rows == result.rows
    assert again.summary["steps"] == 12 and again.config["algorithm"] == "gossip" and again.path == tmp_path / "run"
    with pytest.raises(ConfigError, match="is not empty"):  # nothing the user had is replaced
        gossamer.run({**KEYS, "model": "mlp", "num_samples": 1000}, out=tmp_path / "run")


def test_rows_as_a_data_frame_need_pandas(monkeypatch):
    result = gossamer.Result({}, [{"step": 1, "loss": 2.0}], {}, torch.zeros(1, 1))
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install pandas"):
            result.frame
    else:
        assert list(result.frame["loss"]) == [2.0]
    monkeypatch.setitem(__import__("sys").modules, "pandas", None)  # not installed: one clear line
    with pytest.raises(ImportError, match="Result.frame needs pandas: pip install pandas"):
        result.frame


@pytest.mark.parametrize("kwargs, message", [
    ({"model": 3}, "model must be an nn.Module or a function that builds one, got int"),
    ({"model": lambda: 3}, "model must build an nn.Module, got int"),
    ({"data": (1, 2)}, "data must be a gossamer.Data, got tuple"),
    ({"data": gossamer.Data(train=([[0.0]], [0.5]), test=([[0.0]], [1]))}, "Data train targets must be integer"),
    ({"data": gossamer.Data(train=([[0.0]], [0]), test=([[0.0, 1.0]], [1]))}, "Data train and test inputs differ"),
])
def test_bad_arguments_are_one_line(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        gossamer.run({**KEYS, "model": "mlp"} if "data" in kwargs else KEYS, **kwargs)


class Pair(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(40, 10)

    def forward(self, x):
        return self.linear(x), x


SAMPLES = torch.randn(256, 40)
LABELS = torch.arange(256) % 10


@pytest.mark.parametrize("data, model, message", [  # issue 45, item 9: PyTorch's internal errors, or accepted
    (gossamer.Data(train=(SAMPLES, LABELS - 1), test=(SAMPLES, LABELS)), torch.nn.Linear(40, 10),
     r"Data targets must be class or token ids >= 0, got -1"),
    (gossamer.Data(train=(SAMPLES, LABELS), test=(SAMPLES, LABELS), num_classes=0), torch.nn.Linear(40, 10),
     r"Data num_classes must be an integer above the largest id \(9\), got 0"),
    (gossamer.Data(train=(SAMPLES, LABELS), test=(SAMPLES, LABELS), num_classes=5), torch.nn.Linear(40, 5),
     r"Data num_classes must be an integer above the largest id \(9\), got 5"),
    (gossamer.Data(train=(SAMPLES, LABELS), test=(SAMPLES, LABELS)), torch.nn.Linear(40, 3),
     r"model returns 3 values a sample; the data has 10 classes"),
    (gossamer.Data(train=(SAMPLES, LABELS), test=(SAMPLES, LABELS)), torch.nn.ReLU(), "model has no parameters"),
    (gossamer.Data(train=(SAMPLES, LABELS), test=(SAMPLES, LABELS)), Pair(), "model must return a tensor of logits, got tuple"),
    (gossamer.Data(train=(SAMPLES, LABELS), test=(SAMPLES, LABELS)), torch.nn.Linear(30, 10),
     r"model fails on one training input \(\[1, 40\]\): RuntimeError"),
])
def test_a_model_or_data_that_cannot_train_is_one_line(data, model, message):
    with pytest.raises(ConfigError, match=message):
        gossamer.run({k: v for k, v in KEYS.items() if k != "dataset"}, model=model, data=data)


def test_a_model_named_in_the_config_and_given_is_refused():
    with pytest.raises(ConfigError, match="model 'mlp' is set in the config and model= is given: give one"):
        gossamer.run({**KEYS, "model": "mlp"}, model=torch.nn.Linear(40, 10))


def test_the_dist_engine_is_refused():
    with pytest.raises(ConfigError, match="gossamer.run trains on the simulator"):
        gossamer.run({**KEYS, "model": "mlp", "engine": "dist"})


# ---------------------------------------------------------------- gossamer.run is pure (issue 44, item 5)

UNTIMED = ("wall_seconds", "comm_seconds", "comm_metrics_seconds")
GIVEN_KEYS = {k: v for k, v in KEYS.items() if k != "dataset"}


def timeless(result):
    """A result's rows and summary without the wall times (what two runs of one config share)."""
    return ([{k: v for k, v in row.items() if k not in UNTIMED} for row in result.rows],
            {k: v for k, v in result.summary.items() if k not in UNTIMED})


def paused(width: int):
    """A model builder that draws from torch's global generator before and after a pause (a run
    seeding it in between, in another thread, would change the model)."""
    def build():
        first = torch.nn.Linear(40, width)
        time.sleep(0.05)
        return torch.nn.Sequential(first, torch.nn.ReLU(), torch.nn.Linear(width, 10))
    return build


@pytest.mark.parametrize("extra", [{}, {"byzantine": {"workers": [1], "attack": "sign-flip", "clean_reference": True}}],
                         ids=["plain", "clean-reference"])
def test_the_model_builder_is_called_once_and_the_callers_generator_is_left_as_it_was(extra, tmp_path):
    """The builder once (a clean reference run starts from a copy of the model: the same rows as the
    registered MLP's, built twice from the seed); torch's generator as the caller left it."""
    cfg, data = mnist1d()
    calls = []

    def mlp():
        calls.append(1)
        return build_model(cfg, data)

    torch.manual_seed(1234)
    torch.rand(3)
    before = torch.get_rng_state()
    given = gossamer.run({**KEYS, **extra}, model=mlp,
                         data=gossamer.Data(train=(data.x_train, data.y_train), test=(data.x_test, data.y_test)))
    assert len(calls) == 1 and torch.equal(torch.get_rng_state(), before)
    registered = gossamer.run({**KEYS, **extra, "model": "mlp", "num_samples": 1000}, out=tmp_path / "run")
    assert torch.equal(torch.get_rng_state(), before)  # with out= too
    assert torch.equal(registered.x, given.x) and timeless(registered)[0] == timeless(given)[0]
    assert "python" not in MODELS and "python" not in DATASETS


def test_runs_in_two_threads_at_once_give_their_standalone_results():
    """Two runs, different models and data, in two threads at once: each the run it is alone
    (nothing registered for a call, the model seeded and built one run at a time), and torch's
    generator as the caller left it once both returned."""
    _, data = mnist1d()
    runs = [({**GIVEN_KEYS, "seed": 3}, paused(32),
             gossamer.Data(train=(SAMPLES, LABELS), test=(SAMPLES[:64], LABELS[:64]))),
            ({**GIVEN_KEYS, "topology": "complete"}, paused(64),
             gossamer.Data(train=(data.x_train, data.y_train), test=(data.x_test, data.y_test)))]
    alone = [timeless(gossamer.run(config, model=model, data=given)) for config, model, given in runs]
    before, start, results, errors = torch.get_rng_state(), threading.Barrier(len(runs)), [None] * len(runs), []

    def work(i):
        try:
            start.wait()
            results[i] = timeless(gossamer.run(runs[i][0], model=runs[i][1], data=runs[i][2]))
        except BaseException as e:  # noqa: BLE001 — reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(runs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert results == alone and alone[0] != alone[1]
    assert torch.equal(torch.get_rng_state(), before)
