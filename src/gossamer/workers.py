"""The worker matrix: m workers' models as the rows of flat matrices.

Row i of ``X`` [m, d] is worker i's parameters flattened, row i of ``G`` its gradient, and row i
of ``B`` [m, d_b] its floating-point buffers (BatchNorm running statistics: local, never
communicated). Each worker also has an ordinary ``nn.Module`` replica whose parameters are views
into its row of ``X`` and whose ``.grad`` tensors are views into its row of ``G``: backward writes
straight into ``G`` and every optimizer or communication operator is a row-wise tensor op, with
no copies between modules and matrices. Operators must therefore update ``X`` in place.

Two gradient backends compute the same per-worker losses, gradients and BatchNorm statistics
(tests/test_workers.py):

- ``loop``: forward and backward of each replica in turn; backward writes into its row of G and
  BatchNorm updates the running statistics in its row of B. One worker's activations are alive
  at a time, so memory is n models + one set of activations.
- ``vmap``: ``torch.func.vmap`` of ``functional_call`` over X viewed per parameter [m, *shape],
  B viewed per buffer [m, *shape] and the batches [m, b, ...]: one batched forward for all
  workers (a grouped convolution, a batched matmul, one batch norm over m·C channels), then one
  ordinary backward that accumulates into G's column blocks. BatchNorm's batching rule updates
  batched running statistics in place only in contiguous tensors, so each step copies B's
  column blocks (d_b values per worker: 0.5 % of d for ResNet-20) into contiguous ones and back.
  The rows go through in blocks of ``VMAP_ROWS``: oneDNN's grouped convolution slows per group as
  the groups grow (the 1-D CNN's backward at b = 1: 0.58 s for 16,384 workers in blocks of 256,
  1.4 s in one call, and 32 s for 65,536 in one call; docs/benchmarks.md, benchmark 11), and a
  worker's numbers do not depend on its block (tests/test_workers.py: bit for bit in float64, and
  in float32 on the CPU measured).

``auto`` picks ``loop`` for one worker; on CUDA, ``vmap`` (each layer of the n workers is one
kernel instead of n launches; chosen without a GPU measurement, see docs/benchmarks.md). On CPU
it picks by model size: ``vmap`` below 50,000 parameters, where the loop pays the fixed per-op
cost of tiny ops n times (vmap was 1.8-5.4x faster for the MLP and the 1-D CNN, 5-16 K
parameters, at n = 16 and 64 on 2 CPU cores, in two runs of docs/benchmarks.md) — except float64 convolutional models with fewer
than 8 workers (no oneDNN kernel for float64: the grouped convolution lost to the loop there);
``loop`` from 50,000 parameters on, where the step is compute-bound and CPU kernels on one
worker's batch are as fast as vmap's batched ones or faster (vmap was 1.2-3.4x slower than the
loop for ResNet-20, 0.27 M, at n = 16 and 64, b = 8 and 32, and 1.06x for the char Transformer,
0.43 M, at n = 16: docs/benchmarks.md, benchmark 2).
The rule is fixed, not timed at run time, so that the same config always takes the same path
(and gives the same numbers).
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.func import functional_call, vmap

from .tasks import cross_entropy

GRAD_BACKENDS = ("auto", "loop", "vmap")
VMAP_MAX_PARAMETERS_CPU = 50_000  # auto on CPU: vmap below, loop from here on (see the module doc)
VMAP_ROWS = 256  # the rows one vmapped call takes at most (see the module doc)


@dataclass(frozen=True)
class Slot:
    """Where one named tensor lives in a flat row: columns [offset, offset + numel)."""

    name: str
    shape: torch.Size
    offset: int

    @property
    def numel(self) -> int:
        return self.shape.numel()


def layout(named: list[tuple[str, torch.Tensor]]) -> tuple[list[Slot], int]:
    """The slots of named tensors laid end to end in one row, and the row's length."""
    slots, offset = [], 0
    for name, t in named:
        slots.append(Slot(name, t.shape, offset))
        offset += t.numel()
    return slots, offset


def float_buffers(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The floating-point buffers (BatchNorm running statistics): the ones a row B holds."""
    return [(n, b) for n, b in model.named_buffers() if b.is_floating_point()]


def _set_tensor(model: nn.Module, name: str, value: torch.Tensor, parameter: bool) -> None:
    owner_name, _, attr = name.rpartition(".")
    owner = model.get_submodule(owner_name)
    if parameter:
        getattr(owner, attr).data = value
    else:
        owner._buffers[attr] = value


def bind_row(model: nn.Module, slots: list[Slot], row: torch.Tensor, parameter: bool = True,
             grads: torch.Tensor | None = None) -> None:
    """Make the model's tensors named by ``slots`` views into the flat ``row`` (parameters, or
    buffers when not ``parameter``), and the parameters' ``.grad`` views into ``grads``: an
    in-place update of the row is the model's, with no copies."""
    for s in slots:
        _set_tensor(model, s.name, row[s.offset : s.offset + s.numel].view(s.shape), parameter)
        if grads is not None:
            model.get_parameter(s.name).grad = grads[s.offset : s.offset + s.numel].view(s.shape)


def flatten(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """A model's parameters and floating buffers as two flat vectors (the row layout)."""
    params = [p.detach().reshape(-1) for p in model.parameters()]
    buffers = [b.detach().reshape(-1) for _, b in float_buffers(model)]
    empty = torch.zeros(0)
    return (torch.cat(params) if params else empty), (torch.cat(buffers) if buffers else empty)


class WorkerMatrix:
    """m replicas of ``template`` bound to rows of X (parameters), G (gradients) and B (buffers).

    All rows start from the template's parameters (every worker starts from the same model).
    ``loss(output, target)`` is what each worker minimises (the task's loss).
    """

    def __init__(self, template: nn.Module, m: int, device: torch.device | str = "cpu", backend: str = "loop",
                 loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = cross_entropy):
        self.template = template.to(device)
        self.loss = loss
        self.param_slots, self.d = layout(list(template.named_parameters()))
        self.buffer_slots, self.d_buffers = layout(float_buffers(template))
        x0, b0 = flatten(self.template)
        self.X = x0.to(device).repeat(m, 1)
        self.G = torch.zeros_like(self.X)
        self.B = b0.to(device).repeat(m, 1)
        self.backend = choose_backend(self.template, m, backend, torch.device(device))
        self._replicas: list[nn.Module] | None = None
        if self.backend == "vmap":
            self._vmap_init()
        if self.backend == "loop" or any(not b.is_floating_point() for b in template.buffers()):
            self.replicas  # noqa: B018  (built now: their integer buffers start as the template's do now)

    @property
    def m(self) -> int:
        return self.X.shape[0]

    @property
    def replicas(self) -> list[nn.Module]:
        """m copies of the template bound to the rows of X, G and B (the loop backend's models).
        The vmap backend needs them only for integer buffers: without any, they are built when
        first asked for (m deep copies: minutes at tens of thousands of workers)."""
        if self._replicas is None:
            self._replicas = [self._bind(copy.deepcopy(self.template), i).train() for i in range(self.m)]
        return self._replicas

    def _bind(self, model: nn.Module, i: int) -> nn.Module:
        bind_row(model, self.param_slots, self.X[i], grads=self.G[i])
        bind_row(model, self.buffer_slots, self.B[i], parameter=False)
        return model

    def loss_and_grad(self, x: torch.Tensor, y: torch.Tensor, rows: list[int] | None = None) -> torch.Tensor:
        """The loss of each worker on its batch (x [m, b, ...], y [m, b, ...]); gradients land in G.
        ``rows``: the workers whose gradients are needed (the loop backend computes only theirs,
        vmap all; the other rows of G and of the losses are then undefined).

        Returns the per-worker losses [m]."""
        if self.backend == "vmap":
            return self._loss_and_grad_vmap(x, y)
        self.G.zero_()  # backward accumulates into the .grad views
        losses = torch.empty(self.m, dtype=self.X.dtype, device=self.X.device)
        for i in range(self.m) if rows is None else rows:
            model = self.replicas[i]
            loss = self.loss(model(x[i]), y[i])
            loss.backward()  # frees worker i's activations before worker i + 1 runs
            losses[i] = loss.detach()
        return losses

    def _vmap_init(self) -> None:
        template = self.template
        # per block of rows and parameter, a leaf [rows, *shape] that shares storage with X's block
        # (no copy) and whose .grad is the same block of G: backward accumulates straight into G
        self._blocks = [range(a, min(a + VMAP_ROWS, self.m)) for a in range(0, self.m, VMAP_ROWS)]
        self._leaves = [{s.name: self._leaf(rows, s) for s in self.param_slots} for rows in self._blocks]
        # non-floating buffers (e.g. BatchNorm's num_batches_tracked) are passed, unbatched: with a
        # momentum, BatchNorm's update does not read them
        others = {n: b for n, b in template.named_buffers() if not b.is_floating_point()}
        objective = self.loss

        def loss(params, buffers, x, y):
            return objective(functional_call(template, (params, buffers, others), (x,)), y)

        # vmap of the forward only; the backward is ordinary autograd through the batched ops (a
        # grad transform inside vmap would import torch._dynamo, ~1 s of start-up, and copy into G)
        self._vmapped_loss = vmap(loss)

    def _leaf(self, rows: range, s: Slot) -> torch.Tensor:
        block = slice(rows.start, rows.stop), slice(s.offset, s.offset + s.numel)
        leaf = self.X[block].view(len(rows), *s.shape).detach().requires_grad_()
        leaf.grad = self.G[block].view(len(rows), *s.shape)
        return leaf

    def _loss_and_grad_vmap(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.G.zero_()
        self.template.train()
        losses = torch.empty(self.m, dtype=self.X.dtype, device=self.X.device)
        for rows, leaves in zip(self._blocks, self._leaves):
            B, block = self.B[rows.start : rows.stop], slice(rows.start, rows.stop)
            buffers = {s.name: B[:, s.offset : s.offset + s.numel].view(len(rows), *s.shape).contiguous()
                       for s in self.buffer_slots}  # updated in place by the forward (running statistics)
            out = self._vmapped_loss(leaves, buffers, x[block], y[block])
            for s in self.buffer_slots:
                B[:, s.offset : s.offset + s.numel].copy_(buffers[s.name].view(len(rows), s.numel))
            with warnings.catch_warnings():
                # the leaves are column blocks of X (row stride d), their grads the same blocks of G:
                # autograd warns that this layout is not the dense one it prefers, and accumulates anyway
                warnings.filterwarnings("ignore", message="grad and param do not obey the gradient layout contract")
                out.sum().backward()  # the losses are independent: d(sum)/dx_i = d(loss_i)/dx_i
            losses[block] = out.detach()
        return losses

    def integer_buffers(self) -> torch.Tensor:
        """Every worker's integer buffers (e.g. BatchNorm's num_batches_tracked) as rows [m, k]."""
        if self._replicas is None:  # none (else the replicas were built with the matrix)
            return torch.zeros(self.m, 0, dtype=torch.long, device=self.X.device)
        rows = [[b.reshape(-1) for n, b in model.named_buffers() if not b.is_floating_point()]
                for model in self.replicas]
        return torch.stack([torch.cat(r) if r else torch.zeros(0, dtype=torch.long) for r in rows]).to(self.X.device)

    def load_integer_buffers(self, rows: torch.Tensor) -> None:
        if self._replicas is None:
            return
        for model, row in zip(self.replicas, rows):
            offset = 0
            for _, b in ((n, b) for n, b in model.named_buffers() if not b.is_floating_point()):
                b.copy_(row[offset : offset + b.numel()].view_as(b))
                offset += b.numel()

    def model_at(self, params: torch.Tensor, buffers: torch.Tensor) -> nn.Module:
        """The template in eval mode with the given flat parameters [d] and buffers [d_b] (e.g. x̄)."""
        bind_row(self.template, self.param_slots, params)
        bind_row(self.template, self.buffer_slots, buffers, parameter=False)
        return self.template.eval()


def choose_backend(model: nn.Module, m: int, backend: str = "auto", device: torch.device | None = None) -> str:
    """The gradient backend for ``m`` replicas of ``model`` on ``device``: ``loop`` or ``vmap`` (see module doc)."""
    convs = any(isinstance(mod, nn.modules.conv._ConvNd) for mod in model.modules())
    float64 = any(p.dtype == torch.float64 for p in model.parameters())
    return backend_for(backend, m, device, sum(p.numel() for p in model.parameters()), convs and float64)


def backend_for(backend: str, m: int, device: torch.device | None, parameters: int, float64_convs: bool) -> str:
    """:func:`choose_backend`'s rule on the model's facts: its parameter count and whether it has
    float64 convolutions (the memory preflight asks before the model is built)."""
    if backend not in GRAD_BACKENDS:
        raise ValueError(f"grad_backend must be one of {', '.join(GRAD_BACKENDS)}; got '{backend}'")
    if backend != "auto":
        return backend
    if m == 1:
        return "loop"
    if device is not None and device.type == "cuda":
        return "vmap"
    if parameters >= VMAP_MAX_PARAMETERS_CPU:
        return "loop"
    # float64 convolutions have no oneDNN kernel; their grouped (vmapped) fallback lost to the
    # loop below 8 workers (1.5x at n = 2 and 4, CNN1D), and won from n = 16 on
    return "loop" if float64_convs and m < 8 else "vmap"
