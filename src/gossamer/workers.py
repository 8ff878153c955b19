"""The worker matrix: m workers' models as the rows of flat matrices.

Row i of ``X`` [m, d] is worker i's parameters flattened, row i of ``G`` its gradient, and row i
of ``B`` [m, d_b] its floating-point buffers (BatchNorm running statistics: local, never
communicated). Each worker also has an ordinary ``nn.Module`` replica whose parameters are views
into its row of ``X`` and whose ``.grad`` tensors are views into its row of ``G``: backward writes
straight into ``G`` and every optimizer or communication operator is a row-wise tensor op, with
no copies between modules and matrices. Operators must therefore update ``X`` in place.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Slot:
    """Where one named tensor lives in a flat row: columns [offset, offset + numel)."""

    name: str
    shape: torch.Size
    offset: int

    @property
    def numel(self) -> int:
        return self.shape.numel()


def _layout(named: list[tuple[str, torch.Tensor]]) -> tuple[list[Slot], int]:
    slots, offset = [], 0
    for name, t in named:
        slots.append(Slot(name, t.shape, offset))
        offset += t.numel()
    return slots, offset


def _float_buffers(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [(n, b) for n, b in model.named_buffers() if b.is_floating_point()]


def _set_tensor(model: nn.Module, name: str, value: torch.Tensor, parameter: bool) -> None:
    owner_name, _, attr = name.rpartition(".")
    owner = model.get_submodule(owner_name)
    if parameter:
        getattr(owner, attr).data = value
    else:
        owner._buffers[attr] = value


def flatten(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """A model's parameters and floating buffers as two flat vectors (the row layout)."""
    params = [p.detach().reshape(-1) for p in model.parameters()]
    buffers = [b.detach().reshape(-1) for _, b in _float_buffers(model)]
    empty = torch.zeros(0)
    return (torch.cat(params) if params else empty), (torch.cat(buffers) if buffers else empty)


class WorkerMatrix:
    """m replicas of ``template`` bound to rows of X (parameters), G (gradients) and B (buffers).

    All rows start from the template's parameters (every worker starts from the same model).
    """

    def __init__(self, template: nn.Module, m: int, device: torch.device | str = "cpu", backend: str = "loop"):
        self.template = template.to(device)
        self.param_slots, self.d = _layout(list(template.named_parameters()))
        self.buffer_slots, self.d_buffers = _layout(_float_buffers(template))
        x0, b0 = flatten(self.template)
        self.X = x0.to(device).repeat(m, 1)
        self.G = torch.zeros_like(self.X)
        self.B = b0.to(device).repeat(m, 1)
        self.replicas = [self._bind(copy.deepcopy(self.template), i) for i in range(m)]

    @property
    def m(self) -> int:
        return self.X.shape[0]

    def _bind(self, model: nn.Module, i: int) -> nn.Module:
        for s in self.param_slots:
            view = self.X[i, s.offset : s.offset + s.numel].view(s.shape)
            _set_tensor(model, s.name, view, parameter=True)
            model.get_parameter(s.name).grad = self.G[i, s.offset : s.offset + s.numel].view(s.shape)
        for s in self.buffer_slots:
            _set_tensor(model, s.name, self.B[i, s.offset : s.offset + s.numel].view(s.shape), parameter=False)
        return model

    def loss_and_grad(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of each worker on its batch (x [m, b, ...], y [m, b]); gradients land in G.

        Returns the per-worker losses [m]."""
        self.G.zero_()
        losses = []
        for i, model in enumerate(self.replicas):
            model.train()
            losses.append(F.cross_entropy(model(x[i]), y[i]))
        losses = torch.stack(losses)
        losses.sum().backward()  # the losses are independent: d(sum)/dx_i = d(loss_i)/dx_i
        return losses.detach()

    def tensor_views(self, row: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-parameter views of a row-shaped tensor (a row [d] or rows [k, d])."""
        return {s.name: row[..., s.offset : s.offset + s.numel] for s in self.param_slots}

    @torch.no_grad()
    def accuracy(self, params: torch.Tensor, buffers: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                 chunk: int = 4096) -> float:
        """Test accuracy of the model with the given flat parameters [d] and buffers [d_b]."""
        model = self._bind_eval(params, buffers)
        correct = sum((model(x[i : i + chunk]).argmax(1) == y[i : i + chunk]).sum().item()
                      for i in range(0, len(y), chunk))
        return correct / len(y)

    def _bind_eval(self, params: torch.Tensor, buffers: torch.Tensor) -> nn.Module:
        model = self.template
        for s in self.param_slots:
            _set_tensor(model, s.name, params[s.offset : s.offset + s.numel].view(s.shape), parameter=True)
        for s in self.buffer_slots:
            _set_tensor(model, s.name, buffers[s.offset : s.offset + s.numel].view(s.shape), parameter=False)
        return model.eval()
