"""Tasks: what a model is trained for — its loss, and the test metrics of a model.

Both tasks here minimise the cross-entropy over the last dimension of the model's output:
class logits [b, C] against labels [b] (classification), or next-token logits [b, T, V] against
tokens [b, T] (language modelling: the mean over every position). They differ in what is reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .registry import Registry

# an entry's build() is its Task; a data set names one (Dataset.task), a model the one it serves
TASKS = Registry("task", traits={
    "targets": "what a target is: 'classes' (a class label: partition dirichlet and byzantine.attack label-flip "
               "apply) or 'tokens' (the next token, of the inputs' vocabulary)"})


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits over their last dimension."""
    return F.cross_entropy(output.flatten(0, -2), target.flatten())


def _chunks(x: torch.Tensor, y: torch.Tensor, chunk: int):
    for i in range(0, len(y), chunk):
        yield x[i : i + chunk], y[i : i + chunk]


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, chunk: int = 4096) -> dict[str, float]:
    """``test_accuracy``: the fraction of test samples whose largest logit is the label."""
    correct = sum((model(xb).argmax(-1) == yb).sum().item() for xb, yb in _chunks(x, y, chunk))
    return {"test_accuracy": correct / len(y)}


@torch.no_grad()
def perplexity(model: nn.Module, x: torch.Tensor, y: torch.Tensor, chunk: int = 256) -> dict[str, float]:
    """``test_loss`` (mean cross-entropy per token, nats) and ``test_perplexity`` = exp(test_loss)."""
    total = sum(cross_entropy(model(xb), yb).item() * yb.numel() for xb, yb in _chunks(x, y, chunk))
    loss = total / y.numel()
    return {"test_loss": loss, "test_perplexity": math.exp(min(loss, 700.0))}


@dataclass(frozen=True)
class Task:
    """What a model is trained for: its loss, and the test metrics of a model.

    Args:
        name (str): the task's name (a data set's ``task``).
        loss (Callable[[Tensor, Tensor], Tensor]): ``loss(output, target)``, what is trained.
        evaluate (Callable[..., dict[str, float]]): ``evaluate(model, x, y)``, the test metrics
            (summary.json keys).
        metric (str): the headline one of them.

    Example::

        >>> import torch
        >>> from gossamer.extend import TASKS, Task
        >>> task: Task = TASKS["classification"].build()
        >>> task.metric, round(task.loss(torch.zeros(2, 3), torch.tensor([0, 2])).item(), 4)  # log 3
        ('test_accuracy', 1.0986)
    """

    name: str
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    evaluate: Callable[..., dict[str, float]]
    metric: str


@TASKS.register("classification", targets="classes", help="class logits [b, C] against labels [b]: test_accuracy")
def _classification() -> Task:
    return Task("classification", cross_entropy, accuracy, "test_accuracy")


@TASKS.register("language-model", targets="tokens",
                help="next-token logits [b, T, V] against tokens [b, T]: test_loss and test_perplexity")
def _language_model() -> Task:
    return Task("language-model", cross_entropy, perplexity, "test_loss")
