"""What a real network would carry: the communication counts every engine keeps alike."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

BYTES_PER_VALUE = 4  # float32 on the wire (float64 runs are counted as float32 too)
LEVELS = ("global", "block", "gossip")  # all-reduce of all workers, inside blocks, gossip rounds


@dataclass
class CommStats:
    """Communication per worker (means over workers), as a real network would carry it.

    An all-reduce of d values among n workers is counted as a ring all-reduce: 2·d·(n−1)/n values
    sent per worker in one round. An all-gather of one B-byte message per worker: (n−1)·B bytes.
    A gossip round sends d values (or one compressed message) to each peer that uses the
    worker's model.

    The algorithm's own traffic (``rounds``, ``messages_per_worker``, ``bytes_per_worker`` and
    their split by level) is kept apart from measurement traffic (``bytes_per_worker_metrics``:
    x̄ and Ξ², scalar means for the metric rows, the probes of consensus control), which a
    deployment that does not measure would not pay.
    """

    rounds: int = 0
    messages_per_worker: float = 0.0
    bytes_per_worker: float = 0.0
    rounds_by_level: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LEVELS, 0))
    bytes_by_level: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LEVELS, 0.0))
    bytes_per_worker_metrics: float = 0.0

    def _add(self, level: str, messages: float, nbytes: float) -> None:
        self.rounds += 1
        self.messages_per_worker += messages
        self.bytes_per_worker += nbytes
        self.rounds_by_level[level] += 1
        self.bytes_by_level[level] += nbytes

    def allreduce(self, d: int, n: int, level: str = "global") -> None:
        """A ring all-reduce of d values among n workers."""
        self._add(level, 2 * (n - 1), allreduce_bytes(d, n))

    def allgather(self, nbytes: int, n: int, level: str = "global") -> None:
        """A ring all-gather of one ``nbytes`` message per worker among n workers (compressed
        messages cannot be summed on the way, so every worker receives every message)."""
        self._add(level, n - 1, (n - 1) * nbytes)

    def gossip(self, d: int, peers_per_worker: float) -> None:
        """d values to each of the peers that use this worker's model."""
        self._add("gossip", peers_per_worker, peers_per_worker * d * BYTES_PER_VALUE)

    def exchange(self, nbytes: int, peers_per_worker: float) -> None:
        """A message of ``nbytes`` to each of the peers that keep a copy of this worker's (a
        gossip round of compressed messages)."""
        self._add("gossip", peers_per_worker, peers_per_worker * nbytes)

    def metrics(self, nbytes: float) -> None:
        """Measurement traffic: never part of the algorithm's counts."""
        self.bytes_per_worker_metrics += nbytes

    def summary(self) -> dict:
        """The counts as summary.json keys."""
        return {"comm_rounds": self.rounds, "messages_per_worker": self.messages_per_worker,
                "bytes_per_worker": self.bytes_per_worker,
                **{f"comm_rounds_{level}": r for level, r in sorted(self.rounds_by_level.items())},
                **{f"bytes_per_worker_{level}": b for level, b in sorted(self.bytes_by_level.items())},
                "bytes_per_worker_metrics": self.bytes_per_worker_metrics}

    def state_dict(self) -> dict:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, dict(value) if isinstance(value, dict) else value)


def allreduce_bytes(d: int, n: int) -> float:
    """Bytes one worker sends in a ring all-reduce of d values among n workers."""
    return 2 * d * (n - 1) / n * BYTES_PER_VALUE
