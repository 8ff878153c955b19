"""ResNet-20 for 32x32 images (He et al. 2016, the CIFAR-10 network of both papers), ~0.27M parameters."""

from __future__ import annotations

from torch import nn


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with a residual; a strided 1x1 conv-BN shortcut when the shape changes."""

    def __init__(self, in_ch: int, out_ch: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride, bias=False), nn.BatchNorm2d(out_ch))

    def forward(self, x):
        out = self.bn1(self.conv1(x)).relu()
        return (self.bn2(self.conv2(out)) + self.shortcut(x)).relu()


class ResNet20(nn.Module):
    """3 stages of 3 basic blocks (16, 32, 64 channels), global average pooling, linear head; input [B, 3, 32, 32]."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, blocks: int = 3):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        layers, in_ch = [], 16
        for out_ch, stride in ((16, 1), (32, 2), (64, 2)):
            for b in range(blocks):
                layers.append(BasicBlock(in_ch, out_ch, stride if b == 0 else 1))
                in_ch = out_ch
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(64, num_classes)

    def forward(self, x):
        x = self.layers(self.bn(self.conv(x)).relu())
        return self.head(x.mean((2, 3)))
