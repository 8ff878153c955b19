"""Multi-layer perceptron."""

from __future__ import annotations

from torch import nn

HIDDEN = (100, 100)


class MLP(nn.Sequential):
    """Flatten, then Linear-ReLU per hidden width, then a Linear classifier."""

    def __init__(self, in_features: int = 40, hidden: tuple[int, ...] = HIDDEN, num_classes: int = 10):
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, num_classes))
        super().__init__(*layers)
