"""The MNIST-1D paper's 1-D ConvNet."""

from __future__ import annotations

from torch import nn

CHANNELS = 25
KERNELS = (5, 3, 3)  # each with stride 2 and padding 1


class CNN1D(nn.Sequential):
    """Three stride-2 Conv1d+ReLU blocks (optionally with BatchNorm1d) and a Linear head; input [B, 1, 40]."""

    def __init__(self, channels: int = CHANNELS, num_classes: int = 10, norm: bool = False, length: int = 40):
        layers: list[nn.Module] = []
        in_ch = 1
        for kernel in KERNELS:
            layers.append(nn.Conv1d(in_ch, channels, kernel, stride=2, padding=1))
            if norm:
                layers.append(nn.BatchNorm1d(channels))
            layers.append(nn.ReLU())
            length = (length + 2 - kernel) // 2 + 1
            in_ch = channels
        layers += [nn.Flatten(), nn.Linear(channels * length, num_classes)]
        super().__init__(*layers)
