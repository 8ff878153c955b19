"""Model registry: each entry builds an ``nn.Module`` for a data set (its input shape and classes)
and refuses, in one line, a data set it cannot take."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from gossamer.models.cnn1d import CNN1D
from gossamer.models.cnn1d import CHANNELS as CNN1D_CHANNELS
from gossamer.models.cnn1d import KERNELS as CNN1D_KERNELS
from gossamer.models.mlp import HIDDEN as MLP_HIDDEN
from gossamer.models.mlp import MLP
from gossamer.models.resnet20 import NORMS, ResNet20
from gossamer.models.resnet20 import BLOCKS as RESNET_BLOCKS
from gossamer.models.resnet20 import STAGES as RESNET_STAGES
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
            raise ConfigError(f"unknown norm {self.norm[:100]!r}; choose one of: {', '.join(NORMS)}")


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


def _needs_tokens(data) -> None:
    _needs("transformer", data, len(data.input_shape) == 1 and not data.x_train.is_floating_point(),
           "token sequences [T] for language modelling", task="language-model")


@MODELS.register("transformer", options=TransformerOptions,
                 help="decoder-only character Transformer (GPT-2 layout), token inputs [T] of a language-model data set")
def _transformer(cfg, data) -> nn.Module:
    _needs_tokens(data)
    return CharTransformer(data.num_classes, context=data.input_shape[0], width=cfg.width, layers=cfg.layers,
                           heads=cfg.heads)


# ---------------------------------------------------------------- footprints


@dataclass(frozen=True)
class Footprint:
    """A model's size before it is built, in values: its parameters; per sample, the activations
    a training step holds at its peak (kept for backward, and the transients of the layer running)
    and those an evaluation (no gradients, one layer at a time) holds. ``options``: the model's
    options that set them, the one they grow with fastest first."""

    parameters: int
    train: int
    test: int
    options: tuple[str, ...] = ()


FOOTPRINTS: dict[str, Callable[..., Footprint]] = {}  # model name → footprint(cfg, data)


def footprint(cfg, data) -> Footprint:
    """The :class:`Footprint` of the model ``cfg.model`` for ``data``, without building it (a
    model registered without one: its parameters, activations unknown)."""
    return FOOTPRINTS.get(cfg.model, _parameters_only)(cfg, data)


def _footprint(name: str):
    def add(fn: Callable[..., Footprint]) -> Callable[..., Footprint]:
        FOOTPRINTS[name] = fn
        return fn
    return add


def _built_parameters(cfg, data) -> int:
    """The parameter count of the model, built on the meta device (no memory): for models whose
    size the data bounds."""
    with torch.device("meta"):
        return sum(p.numel() for p in MODELS[cfg.model].build(cfg, data).parameters())


def _parameters_only(cfg, data) -> Footprint:
    return Footprint(_built_parameters(cfg, data), 0, 0)


@_footprint("mlp")
def _mlp_footprint(cfg, data) -> Footprint:
    parameters = _built_parameters(cfg, data)
    inputs, outputs = math.prod(data.input_shape), 2 * sum(MLP_HIDDEN) + data.num_classes  # Linear and ReLU outputs
    return Footprint(parameters, inputs + 3 * outputs, inputs + 2 * max(MLP_HIDDEN))


@_footprint("cnn1d")
def _cnn1d_footprint(cfg, data) -> Footprint:
    parameters, length, outputs = _built_parameters(cfg, data), data.input_shape[1], 0
    for kernel in CNN1D_KERNELS:
        length = (length + 2 - kernel) // 2 + 1
        outputs += 2 * CNN1D_CHANNELS * length  # Conv1d and ReLU outputs
    return Footprint(parameters, data.input_shape[1] + 3 * outputs, 2 * CNN1D_CHANNELS * data.input_shape[1])


@_footprint("resnet20")
def _resnet20_footprint(cfg, data) -> Footprint:
    """Each convolution keeps three maps for backward (its output, the norm's, the ReLU's), each
    block's residual sum one more, a downsampling shortcut two; an evaluation holds about six maps
    of the first stage's size at once."""
    parameters, (_, h, w) = _built_parameters(cfg, data), data.input_shape
    maps, in_ch = 3 * 16 * h * w, 16
    for out_ch, stride in RESNET_STAGES:
        h, w = (h - 1) // stride + 1, (w - 1) // stride + 1
        shortcut = stride != 1 or in_ch != out_ch
        maps += (7 * RESNET_BLOCKS + 2 * shortcut) * out_ch * h * w  # a block: 2 convolutions, the sum, a ReLU
        in_ch = out_ch
    return Footprint(parameters, maps, 6 * 16 * data.input_shape[1] * data.input_shape[2])


@_footprint("transformer")
def _transformer_footprint(cfg, data) -> Footprint:
    """Attention: each layer keeps its heads × T² softmax for backward, and while a layer runs its
    scores, masked scores and softmax (3 × heads × T²) are alive; besides, about 24 width-sized
    vectors per token and layer (LayerNorms, q, k, v, the 4× MLP and its GELU, residuals) and the
    logits with their log-softmax and gradient (3 × vocabulary) per token."""
    _needs_tokens(data)
    T, C, L, H, V = data.input_shape[0], cfg.width, cfg.layers, cfg.heads, data.num_classes
    parameters = 2 * V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
    train = (L + 2) * H * T * T + T * (24 * L * C + 4 * C + 3 * V)
    test = 3 * H * T * T + T * (10 * C + 2 * V)
    return Footprint(parameters, train, test, options=("context", "layers", "heads", "width"))


def build_model(cfg, data) -> nn.Module:
    """The model named by ``cfg.model`` for ``data``."""
    return MODELS[cfg.model].build(cfg, data)


def no_decay_mask(model: nn.Module) -> list[bool]:
    """Per parameter, in named_parameters() order: True if it should get no weight decay
    (biases and other ndim <= 1 tensors, and all parameters of normalisation layers)."""
    norm_params = {id(p) for m in model.modules() if isinstance(m, _NORM_TYPES) for p in m.parameters()}
    return [p.ndim <= 1 or id(p) in norm_params for _, p in model.named_parameters()]


def hidden_matrices(model: nn.Module) -> list[bool]:
    """Per parameter, in named_parameters() order: True for a hidden layer's weight matrix (ndim 2,
    neither an embedding's table nor the output layer: the last Linear) — the ones Muon steps."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    outside = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    outside |= {id(linears[-1].weight)} if linears else set()
    return [p.ndim == 2 and id(p) not in outside for _, p in model.named_parameters()]


__all__ = ["CNN1D", "CharTransformer", "Footprint", "MLP", "MODELS", "ResNet20", "build_model", "footprint",
           "hidden_matrices", "no_decay_mask"]
