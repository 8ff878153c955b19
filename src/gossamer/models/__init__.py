"""Model registry."""

from __future__ import annotations

from torch import nn

from gossamer.models.cnn1d import CNN1D
from gossamer.models.mlp import MLP

MODELS = {"mlp": MLP, "cnn1d": CNN1D}

_NORM_TYPES = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm)


def build_model(name: str, num_classes: int) -> nn.Module:
    """Build a registered model by name."""
    if name not in MODELS:
        raise ValueError(f"unknown model '{name}'; choose one of: {', '.join(sorted(MODELS))}")
    return MODELS[name](num_classes=num_classes)


def no_decay_mask(model: nn.Module) -> list[bool]:
    """Per parameter, in named_parameters() order: True if it should get no weight decay
    (biases and other ndim <= 1 tensors, and all parameters of normalisation layers)."""
    norm_params = {id(p) for m in model.modules() if isinstance(m, _NORM_TYPES) for p in m.parameters()}
    return [p.ndim <= 1 or id(p) in norm_params for _, p in model.named_parameters()]


__all__ = ["CNN1D", "MLP", "MODELS", "build_model", "no_decay_mask"]
