"""A small decoder-only Transformer for character-level language modelling (GPT-2's layout).

Tokens [B, T] → token + learned position embeddings → ``layers`` pre-norm blocks, each
x + Attn(LN(x)) then x + MLP(LN(x)) with causal multi-head self-attention (``heads``) and a
4× GELU MLP → LayerNorm → next-token logits [B, T, V]. No dropout (every worker's step stays a
deterministic function of its batch); weights initialised N(0, 0.02), biases 0. The input and
output embeddings are separate matrices (tied weights would be one tensor in two modules).
"""

from __future__ import annotations

import math

import torch
from torch import nn


class CausalSelfAttention(nn.Module):
    """softmax(q kᵀ/√d_h, future masked) v per head, written out: under vmap, PyTorch's fused
    attention kernels have no batching rule and would run once per worker."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in self.qkv(x).split(C, dim=-1))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.heads)
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        y = scores.masked_fill(future, float("-inf")).softmax(-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharTransformer(nn.Module):
    """Decoder-only Transformer over ``vocab`` tokens with a context of up to ``context`` positions."""

    def __init__(self, vocab: int, context: int, width: int = 128, layers: int = 2, heads: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(context, width)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.position.weight[: tokens.shape[-1]]
        return self.head(self.norm(self.blocks(h)))
