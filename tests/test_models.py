import pytest
import torch

from gossamer.config import ConfigError, load_config
from gossamer.data import Dataset
from gossamer.models import CNN1D, MLP, MODELS, build_model, no_decay_mask


def signals(shape=(1, 40), classes=10) -> Dataset:
    x, y = torch.randn(8, *shape), torch.randint(0, classes, (8,))
    return Dataset(x, y, x, y, classes)


INPUTS = {"mlp": (1, 40), "cnn1d": (1, 40), "resnet20": (3, 32, 32)}


@pytest.mark.parametrize("name", MODELS.names())
def test_output_shape(name):
    model = build_model(load_config(None, [f"model={name}"]), signals(INPUTS[name], classes=7))
    assert model(torch.randn(5, *INPUTS[name])).shape == (5, 7)


def test_a_model_refuses_data_it_cannot_take():
    images = signals(shape=(3, 32, 32))
    with pytest.raises(ConfigError, match=r"model 'cnn1d' takes 1-D signals \[1, L\].*\[3, 32, 32\]"):
        build_model(load_config(None, ["model=cnn1d"]), images)
    assert build_model(load_config(None, ["model=mlp"]), images)(images.x_train).shape == (8, 10)


def test_parameter_counts():
    count = lambda m: sum(p.numel() for p in m.parameters())
    assert count(MLP()) == 40 * 100 + 100 + 100 * 100 + 100 + 100 * 10 + 10
    conv = (1 * 5 + 1) * 25 + (25 * 3 + 1) * 25 * 2
    assert count(CNN1D()) == conv + 25 * 5 * 10 + 10
    assert count(CNN1D(norm=True)) == count(CNN1D()) + 3 * 2 * 25


def test_cnn_norm_forward():
    model = CNN1D(norm=True)
    assert model(torch.randn(4, 1, 40)).shape == (4, 10)
    assert sum(1 for _ in model.buffers()) == 9  # running mean/var + num_batches_tracked per BN


def test_unknown_model():
    with pytest.raises(ConfigError, match="unknown model 'x'; choose one of: mlp, cnn1d"):
        load_config(None, ["model=x"])


def test_no_decay_mask():
    model = CNN1D(norm=True)
    mask = no_decay_mask(model)
    names = [n for n, _ in model.named_parameters()]
    assert len(mask) == len(names)
    decayed = [n for n, m in zip(names, mask) if not m]
    assert decayed == ["0.weight", "3.weight", "6.weight", "10.weight"]  # 3 convs + linear
    assert no_decay_mask(MLP()) == [False, True, False, True, False, True]
