"""Model registry: each entry builds an ``nn.Module`` for a data set (its input shape and classes)
and refuses, in one line, a data set it cannot take."""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import nn

from gossamer.models.cnn1d import CNN1D
from gossamer.models.mlp import MLP
from gossamer.models.resnet20 import NORMS, ResNet20
from gossamer.models.transformer import CharTransformer
from gossamer.registry import ConfigError, Registry, positive_ints

MODELS = Registry("model")

_NORM_TYPES = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm)


def _needs(model: str, data, shape_ok: bool, wants: str, task: str = "classification") -> None:
    if not shape_ok or data.task != task:
        raise ConfigError(f"model '{model}' takes {wants}, not the dataset's inputs of shape "
                          f"{list(data.input_shape)} ({data.task})")


@MODELS.register("mlp", help="fully connected, hidden widths 100, 100, ReLU (any classification input, flattened)")
def _mlp(cfg, data) -> nn.Module:
    _needs("mlp", data, data.x_train.is_floating_point(), "real-valued inputs for classification")
    return MLP(in_features=math.prod(data.input_shape), num_classes=data.num_classes)


@MODELS.register("cnn1d", help="the MNIST-1D paper's 1-D CNN (5,210 parameters), inputs [1, L]")
def _cnn1d(cfg, data) -> nn.Module:
    shape = data.input_shape
    _needs("cnn1d", data, len(shape) == 2 and shape[0] == 1, "1-D signals [1, L] for classification")
    return CNN1D(num_classes=data.num_classes, length=shape[1])


@dataclass
class ResNetOptions:
    norm: str = "batch"  # batch | group | none

    def validate(self, cfg) -> None:
        if self.norm not in NORMS:
            raise ConfigError(f"unknown norm '{self.norm[:100]}'; choose one of: {', '.join(NORMS)}")


@MODELS.register("resnet20", options=ResNetOptions,
                 help="He et al.'s CIFAR ResNet-20 (0.27 M parameters), inputs [3, H, W]; norm: batch | group | none")
def _resnet20(cfg, data) -> nn.Module:
    shape = data.input_shape
    _needs("resnet20", data, len(shape) == 3 and shape[0] == 3, "images [3, H, W] for classification")
    return ResNet20(num_classes=data.num_classes, norm=cfg.norm)


@dataclass
class TransformerOptions:
    layers: int = 2
    heads: int = 4
    width: int = 128  # model dimension; heads divide it

    def validate(self, cfg) -> None:
        positive_ints(self, "layers", "heads", "width")
        if self.width % self.heads:
            raise ConfigError(f"heads must divide width: {self.heads} does not divide {self.width}")


@MODELS.register("transformer", options=TransformerOptions,
                 help="decoder-only character Transformer (GPT-2 layout), token inputs [T] of a language-model data set")
def _transformer(cfg, data) -> nn.Module:
    shape = data.input_shape
    _needs("transformer", data, len(shape) == 1 and not data.x_train.is_floating_point(),
           "token sequences [T] for language modelling", task="language-model")
    return CharTransformer(data.num_classes, context=shape[0], width=cfg.width, layers=cfg.layers, heads=cfg.heads)


def build_model(cfg, data) -> nn.Module:
    """The model named by ``cfg.model`` for ``data``."""
    return MODELS[cfg.model].build(cfg, data)


def no_decay_mask(model: nn.Module) -> list[bool]:
    """Per parameter, in named_parameters() order: True if it should get no weight decay
    (biases and other ndim <= 1 tensors, and all parameters of normalisation layers)."""
    norm_params = {id(p) for m in model.modules() if isinstance(m, _NORM_TYPES) for p in m.parameters()}
    return [p.ndim <= 1 or id(p) in norm_params for _, p in model.named_parameters()]


__all__ = ["CNN1D", "CharTransformer", "MLP", "MODELS", "ResNet20", "build_model", "no_decay_mask"]
