"""ResNet-20 for 32x32 images (He et al. 2016, the CIFAR-10 network of both papers), ~0.27M parameters."""

from __future__ import annotations

from torch import nn

NORMS = ("batch", "group", "none")
STAGES = ((16, 1), (32, 2), (64, 2))  # (channels, stride of the stage's first block)
BLOCKS = 3  # per stage
GROUPS = 2  # GroupNorm groups per layer (16-64 channels: 8-32 channels a group)


def norm_layer(norm: str, channels: int) -> nn.Module:
    """BatchNorm (running statistics per worker), GroupNorm (none to keep), or nothing."""
    if norm == "batch":
        return nn.BatchNorm2d(channels)
    if norm == "group":
        return nn.GroupNorm(GROUPS, channels)
    return nn.Identity()


class BasicBlock(nn.Module):
    """Two 3x3 conv-norm layers with a residual; a strided 1x1 conv-norm shortcut when the shape changes.
    Without normalisation the convolutions have biases (the norm's shift is gone)."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, norm: str = "batch"):
        super().__init__()
        bias = norm == "none"
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride, 1, bias=bias)
        self.bn1 = norm_layer(norm, out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, 1, 1, bias=bias)
        self.bn2 = norm_layer(norm, out_ch)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride, bias=bias), norm_layer(norm, out_ch))

    def forward(self, x):
        out = self.bn1(self.conv1(x)).relu()
        return (self.bn2(self.conv2(out)) + self.shortcut(x)).relu()


class ResNet20(nn.Module):
    """3 stages of 3 basic blocks (16, 32, 64 channels), global average pooling, linear head; input [B, 3, 32, 32].

    ``norm``: ``batch`` (He et al.'s, and both papers'), ``group`` (GroupNorm, 2 groups) or ``none``."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, blocks: int = BLOCKS, norm: str = "batch"):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 16, 3, 1, 1, bias=norm == "none")
        self.bn = norm_layer(norm, 16)
        layers, in_ch = [], 16
        for out_ch, stride in STAGES:
            for b in range(blocks):
                layers.append(BasicBlock(in_ch, out_ch, stride if b == 0 else 1, norm))
                in_ch = out_ch
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(64, num_classes)

    def forward(self, x):
        x = self.layers(self.bn(self.conv(x)).relu())
        return self.head(x.mean((2, 3)))
