"""What every engine shares: the gossip combine and the communication accounting."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

BYTES_PER_VALUE = 4  # float32 on the wire
LEVELS = ("global", "block", "gossip")  # all-reduce of all workers, inside blocks, gossip rounds


def mix_rows(source: torch.Tensor, index: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Neighbour-slot gossip combine: out_i = sum_k weight[k, i] * source[index[k, i]].

    ``index`` [K, m] addresses rows of ``source``; ``weight`` is [K, m, 1]. Slot 0 is the worker
    itself. The sim engine passes all rows as ``source``; the dist engine its own rows followed
    by the rows received from neighbours, with ``index`` remapped to that order.
    """
    out = source[index[0]] * weight[0]
    for k in range(1, index.shape[0]):
        out.addcmul_(source[index[k]], weight[k])
    return out


@dataclass
class CommStats:
    """Communication a real network would carry, per worker (means over workers).

    An all-reduce of d values is counted as a ring all-reduce: 2·d·(n−1)/n values sent per
    worker in one round. A gossip round sends d values to each peer that uses the worker's model.
    """

    rounds: int = 0
    messages_per_worker: float = 0.0
    bytes_per_worker: float = 0.0
    rounds_by_level: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LEVELS, 0))
    bytes_by_level: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LEVELS, 0.0))

    def _add(self, level: str, messages: float, nbytes: float) -> None:
        self.rounds += 1
        self.messages_per_worker += messages
        self.bytes_per_worker += nbytes
        self.rounds_by_level[level] += 1
        self.bytes_by_level[level] += nbytes

    def allreduce(self, d: int, n: int, level: str = "global") -> None:
        """A ring all-reduce of d values among n workers."""
        self._add(level, 2 * (n - 1), 2 * d * (n - 1) / n * BYTES_PER_VALUE)

    def allgather(self, nbytes: int, n: int, level: str = "global") -> None:
        """A ring all-gather of one nbytes message per worker among n workers (compressed averaging:
        sign messages cannot be summed on the way, so every worker receives every message)."""
        self._add(level, n - 1, (n - 1) * nbytes)

    def gossip(self, d: int, peers_per_worker: float) -> None:
        """d values to each of the peers that use this worker's model."""
        self._add("gossip", peers_per_worker, peers_per_worker * d * BYTES_PER_VALUE)
