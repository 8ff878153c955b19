import pytest
import torch

from gossamer.models import CNN1D, MLP, MODELS, build_model, no_decay_mask


@pytest.mark.parametrize("name", sorted(MODELS))
def test_output_shape(name):
    model = build_model(name, num_classes=10)
    assert model(torch.randn(7, 1, 40)).shape == (7, 10)


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
    with pytest.raises(ValueError, match="unknown model 'x'; choose one of: cnn1d, mlp"):
        build_model("x", 10)


def test_no_decay_mask():
    model = CNN1D(norm=True)
    mask = no_decay_mask(model)
    names = [n for n, _ in model.named_parameters()]
    assert len(mask) == len(names)
    decayed = [n for n, m in zip(names, mask) if not m]
    assert decayed == ["0.weight", "3.weight", "6.weight", "10.weight"]  # 3 convs + linear
    assert no_decay_mask(MLP()) == [False, True, False, True, False, True]
