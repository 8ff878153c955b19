"""conv-mixer-1d: a model a user brings — a small 1-D ConvMixer (Trockman & Kolter 2022, in 1-D) for
MNIST-1D-like signals [1, L], registered from a plugin.

    gossamer train --plugin examples/plugins/my_model.py --set model=conv-mixer-1d --set mixer_width=32

Patches of ``mixer_patch`` samples are embedded into ``mixer_width`` channels; each of
``mixer_depth`` blocks mixes along the signal (a depthwise convolution with a residual) and then
across channels (a pointwise one); a mean over positions and a linear layer give the classes.
GroupNorm instead of BatchNorm keeps the model free of running statistics.
"""

from dataclasses import dataclass

from torch import nn

from gossamer.extend import MODELS, ConfigError


class ConvMixer1D(nn.Module):
    def __init__(self, classes: int, width: int, depth: int, patch: int, kernel: int = 5):
        super().__init__()
        self.embed = nn.Sequential(nn.Conv1d(1, width, patch, stride=patch), nn.GELU(), nn.GroupNorm(1, width))
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "spatial": nn.Sequential(nn.Conv1d(width, width, kernel, groups=width, padding="same"), nn.GELU(),
                                     nn.GroupNorm(1, width)),
            "channels": nn.Sequential(nn.Conv1d(width, width, 1), nn.GELU(), nn.GroupNorm(1, width))})
            for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block["channels"](x + block["spatial"](x))
        return self.head(x.mean(-1))


@dataclass
class MixerOptions:
    mixer_width: int = 32
    mixer_depth: int = 2
    mixer_patch: int = 4

    def validate(self, cfg) -> None:
        for name in ("mixer_width", "mixer_depth", "mixer_patch"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}")


@MODELS.register("conv-mixer-1d", options=MixerOptions, example=("mixer_width=8", "mixer_depth=1"),
                 help="a 1-D ConvMixer for signals [1, L] (a plugin: examples/plugins/my_model.py)")
def build(cfg, data) -> nn.Module:
    shape = data.input_shape
    if data.task != "classification" or len(shape) != 2 or shape[0] != 1:
        raise ConfigError(f"model 'conv-mixer-1d' takes 1-D signals [1, L] for classification, not {list(shape)}")
    if cfg.mixer_patch > shape[1]:
        raise ConfigError(f"mixer_patch must be at most the signal's length {shape[1]}, got {cfg.mixer_patch}")
    return ConvMixer1D(data.num_classes, cfg.mixer_width, cfg.mixer_depth, cfg.mixer_patch)
