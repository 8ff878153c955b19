"""Sharpness: the top eigenvalue λ_max of the training-loss Hessian ∇²f(x) at a model x.

Lin et al. (ICLR 2020) connect post-local SGD's better generalization with flatter minima than
large-batch SGD reaches, measured by the Hessian's top eigenvalues. Here λ_max of
f(x) = (1/N) Σ_k ℓ(x; ξ_k), over a fixed subset of N training samples, is found by power
iteration with Hessian-vector products (double backward through the loss; the d × d Hessian is
never formed):

    v_0 a seeded random unit vector,  v_{k+1} = H v_k / ‖H v_k‖,  λ ≈ v_kᵀ H v_k.

Power iteration converges to the eigenvalue of largest magnitude, λ_dom, at the rate |λ_2/λ_1|
per iteration. Near a minimum that is λ_max; if it is negative (a saddle region), a second run on
H − λ_dom I, whose eigenvalues are all ≥ 0 and whose dominant one is λ_max − λ_dom, gives λ_max.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch.func import functional_call

HVP_CHUNK = 512  # samples per Hessian-vector product pass (memory: one double backward of a chunk)
SAMPLES = 1000  # the default subset: this many training samples, or all of them if fewer


def training_subset(n_train: int, samples: int | None, rng: np.random.Generator) -> torch.Tensor:
    """The indices of the training samples the loss is taken over: the first ``samples`` (default
    :data:`SAMPLES`) of a permutation drawn from ``rng`` (the run's ``sharpness-subset`` stream: the
    same at every evaluation of a run)."""
    size = samples or min(SAMPLES, n_train)
    return torch.from_numpy(rng.permutation(n_train)[:size])


def top_eigenvalue(hvp: Callable[[torch.Tensor], torch.Tensor], v0: torch.Tensor, iterations: int) -> float:
    """λ_max of the symmetric matrix H given by ``hvp`` (v ↦ H v): power iteration from ``v0``
    (``iterations`` products), shifted once by −λ_dom if the dominant eigenvalue is negative."""
    dominant = _power(hvp, v0, iterations)
    if dominant >= 0:
        return dominant
    return dominant + _power(lambda v: hvp(v) - dominant * v, v0, iterations)


def _power(hvp: Callable[[torch.Tensor], torch.Tensor], v: torch.Tensor, iterations: int) -> float:
    """The Rayleigh quotient vᵀHv after ``iterations`` steps of power iteration from v."""
    v = v / v.norm()
    eigenvalue = 0.0
    for _ in range(iterations):
        w = hvp(v)
        eigenvalue = torch.dot(v, w).item()
        norm = w.norm()
        if norm == 0:  # v is in H's null space (H = 0 there)
            return eigenvalue
        v = w / norm
    return eigenvalue


def loss_hvp(loss_at: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor], x: torch.Tensor,
             inputs: torch.Tensor, targets: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """v ↦ ∇²f(x) v for f(x) = mean over the samples of ``loss_at(x, inputs, targets)`` (a mean
    loss over a batch), computed chunk by chunk (each chunk's Hessian weighted by its share)."""
    x = x.detach()

    def hvp(v: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        for i in range(0, len(targets), HVP_CHUNK):
            xi = x.clone().requires_grad_()
            chunk = targets[i : i + HVP_CHUNK]
            (grad,) = torch.autograd.grad(loss_at(xi, inputs[i : i + HVP_CHUNK], chunk), xi, create_graph=True)
            (hv,) = torch.autograd.grad(grad @ v, xi)
            out.add_(hv, alpha=len(chunk) / len(targets))
        return out
    return hvp


def model_sharpness(workers, params: torch.Tensor, buffers: torch.Tensor, inputs: torch.Tensor,
                    targets: torch.Tensor, iterations: int, rng: np.random.Generator) -> float:
    """λ_max of the Hessian of the workers' loss over (inputs, targets) at the flat parameters
    ``params`` (e.g. x̄) of the worker matrix's template, in eval mode with floating buffers
    ``buffers``; the start vector is drawn from ``rng``."""
    template = workers.template.eval()
    fixed = {s.name: buffers[s.offset : s.offset + s.numel].view(s.shape) for s in workers.buffer_slots}

    def loss_at(x: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        named = {s.name: x[s.offset : s.offset + s.numel].view(s.shape) for s in workers.param_slots}
        return workers.loss(functional_call(template, {**named, **fixed}, (xb,)), yb)

    v0 = torch.from_numpy(rng.standard_normal(params.shape))
    return top_eigenvalue(loss_hvp(loss_at, params, inputs, targets), v0.to(params), iterations)
