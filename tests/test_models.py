import pytest
import torch

from gossamer.config import ConfigError, load_config
from gossamer.data import Dataset
from gossamer.models import CNN1D, MLP, MODELS, CharTransformer, ResNet20, build_model, no_decay_mask


def signals(shape=(1, 40), classes=10) -> Dataset:
    x, y = torch.randn(8, *shape), torch.randint(0, classes, (8,))
    return Dataset(x, y, x, y, classes)


def tokens(context=12, vocab=7) -> Dataset:
    x, y = torch.randint(0, vocab, (8, context)), torch.randint(0, vocab, (8, context))
    return Dataset(x, y, x, y, vocab, task="language-model")


INPUTS = {"mlp": (1, 40), "cnn1d": (1, 40), "resnet20": (3, 32, 32)}


@pytest.mark.parametrize("name", MODELS.names())
def test_output_shape(name):
    if name == "transformer":
        data = tokens()
        assert build_model(load_config(None, ["model=transformer"]), data)(data.x_train[:5]).shape == (5, 12, 7)
        return
    model = build_model(load_config(None, [f"model={name}"]), signals(INPUTS[name], classes=7))
    assert model(torch.randn(5, *INPUTS[name])).shape == (5, 7)


@pytest.mark.parametrize("model, data, fragment", [
    ("transformer", signals((3, 32, 32)), r"model 'transformer' takes token sequences \[T\] for language modelling, "
                                          r"not the dataset's inputs of shape \[3, 32, 32\] \(classification\)"),
    ("resnet20", tokens(), r"model 'resnet20' takes images \[3, H, W\] for classification, not .*\[12\] \(language-model\)"),
    ("mlp", tokens(), "model 'mlp' takes real-valued inputs"),
    ("cnn1d", tokens(), "model 'cnn1d' takes 1-D signals"),
])
def test_models_refuse_data_sets_they_cannot_take(model, data, fragment):
    with pytest.raises(ConfigError, match=fragment):
        build_model(load_config(None, [f"model={model}"]), data)


def test_resnet20_norms():
    count = lambda m: sum(p.numel() for p in m.parameters())
    batch, group, none = ResNet20(norm="batch"), ResNet20(norm="group"), ResNet20(norm="none")
    assert count(batch) == 272_474  # He et al.'s 0.27 M
    norm_params = sum(p.numel() for m in batch.modules() if isinstance(m, torch.nn.BatchNorm2d) for p in m.parameters())
    conv_channels = sum(m.out_channels for m in none.modules() if isinstance(m, torch.nn.Conv2d))
    assert count(group) == count(batch) and count(none) == count(batch) - norm_params + conv_channels
    assert sum(1 for _ in group.buffers()) == 0 and sum(1 for _ in none.buffers()) == 0
    assert sum(b.numel() for b in batch.buffers() if b.is_floating_point()) == norm_params  # running mean, var
    x = torch.randn(2, 3, 32, 32)
    for model in (batch, group, none):
        assert model(x).shape == (2, 10)
    with pytest.raises(ConfigError, match="unknown norm 'layer'; choose one of: batch, group, none"):
        load_config(None, ["model=resnet20", "norm=layer"])
    with pytest.raises(ConfigError, match="norm does not apply to model 'cnn1d': it is an option of model resnet20"):
        load_config(None, ["norm=group"])


def test_transformer_is_causal_and_counts_its_parameters():
    torch.manual_seed(0)
    V, T, C, L = 11, 9, 16, 2
    model = CharTransformer(V, T, width=C, layers=L, heads=4).double()
    per_block = 2 * 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C)
    assert sum(p.numel() for p in model.parameters()) == V * C + T * C + L * per_block + 2 * C + C * V
    x = torch.randint(0, V, (3, T))
    changed = x.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % V  # change the future from position 5 on
    out, out_changed = model(x), model(changed)
    assert torch.equal(out[:, :5], out_changed[:, :5])  # positions < 5 never see positions >= 5
    assert not torch.allclose(out[:, 5:], out_changed[:, 5:])
    assert model(x[:, :4]).shape == (3, 4, V)  # shorter sequences use the first positions


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
