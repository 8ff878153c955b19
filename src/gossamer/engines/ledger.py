"""What moved: one ledger of every operator's traffic, recorded where it moves; the communication
counters and the simulated clock read only this.

An operator records a :class:`Transfer` from its real inputs — the groups that averaged, the
round's W (repaired for the workers taking part), the message size — and a step's computation a
:class:`Compute` of the workers that computed. Per worker (means over all n workers, a gone or
idle worker sending nothing):

- a ring all-reduce of b bytes within a group of g sends 2(g − 1)/g · b bytes in 2(g − 1)
  messages from each member;
- a ring all-gather of one b-byte message per member sends (g − 1) · b bytes in g − 1 messages;
- a gossip round sends worker j's b bytes to every i ≠ j with W_ij ≠ 0 (what i mixes in or
  copies).

The algorithm's own traffic (``rounds``, ``messages_per_worker``, ``bytes_per_worker`` and their
split by level) is kept apart from measurement traffic (``bytes_per_worker_metrics``: x̄ and Ξ²,
scalar means for the rows, consensus control's probes), which a deployment that does not
measure would not pay. After :meth:`Ledger.record`, every entry is also kept until
:meth:`Ledger.take` (the clock prices the step's entries in order); entries are not state.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..groups import Groups

BYTES_PER_VALUE = 4  # float32 on the wire (float64 runs are counted as float32 too)
LEVELS = ("global", "block", "gossip")  # all-reduce of all workers, inside groups, gossip rounds
METRICS = "metrics"  # the level of measurement traffic, counted apart


@dataclass(frozen=True, eq=False)
class Transfer:
    """One operator as the network carries it (module docstring).

    ``op``: ``allreduce`` or ``allgather`` within each of ``groups``, or ``gossip`` along the
    round's ``mixing``; ``nbytes``: the vector reduced, or one member's message; ``level``: one
    of :data:`LEVELS`, or :data:`METRICS`; ``behind``: the steps of compute it may run behind
    (Streaming DiLoCo's fragments); ``initiator``: a one-sided exchange (AD-PSGD's pair average)
    that only this worker waits for and spends time on, its peer passive."""

    op: str
    nbytes: float
    level: str
    groups: Groups | None = None
    mixing: object | None = None  # a topology.Mixing
    behind: int = 0
    initiator: int | None = None

    @property
    def n(self) -> int:
        return self.groups.n if self.groups is not None else self.mixing.n

    @cached_property
    def per_worker(self) -> tuple[float, float]:
        """(messages, bytes) sent, means over the n workers."""
        if self.op == "gossip":
            peers = self.mixing.messages_per_worker
            return peers, peers * self.nbytes
        g = self.groups.sizes.astype(np.int64)
        if self.op == "allreduce":
            return float((2 * (g - 1) * g).sum()) / self.n, float((2 * (g - 1)).sum()) * self.nbytes / self.n
        if self.op == "allgather":
            return float((g * (g - 1)).sum()) / self.n, float((g * (g - 1)).sum()) * self.nbytes / self.n
        raise ValueError(f"unknown operator '{self.op}'")


@dataclass(frozen=True, eq=False)
class Compute:
    """The workers that computed a gradient (None: all), and which one of each's the clock draws
    its time for: ``counts`` [len(workers)] (or one step index for all)."""

    workers: np.ndarray | None
    counts: np.ndarray | int


@dataclass
class Ledger:
    """Communication per worker (means over the n workers), from the recorded transfers."""

    n: int
    rounds: int = 0
    messages_per_worker: float = 0.0
    bytes_per_worker: float = 0.0
    rounds_by_level: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LEVELS, 0))
    bytes_by_level: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LEVELS, 0.0))
    bytes_per_worker_metrics: float = 0.0

    def __post_init__(self) -> None:
        self.entries: list[Transfer | Compute] | None = None  # not a field: never in the state
        self.behind = 0  # the steps of compute the transfers recorded now may run behind

    @contextlib.contextmanager
    def running_behind(self, steps: int):
        """Transfers recorded inside run in the background of the next ``steps`` steps' compute."""
        self.behind = steps
        try:
            yield
        finally:
            self.behind = 0

    def keep(self) -> None:
        """Keep every entry from now on (for the clock)."""
        self.entries = []

    def take(self) -> list:
        """The entries since the last call, in order (none unless kept)."""
        taken = self.entries or []
        if self.entries is not None:
            self.entries = []
        return taken

    def record(self, transfer: Transfer) -> None:
        """Count a transfer (and keep it)."""
        if self.behind:
            transfer = dataclasses.replace(transfer, behind=self.behind)
        if self.entries is not None:
            self.entries.append(transfer)
        messages, nbytes = transfer.per_worker
        if transfer.level == METRICS:
            self.bytes_per_worker_metrics += nbytes
            return
        self.rounds += 1
        self.messages_per_worker += messages
        self.bytes_per_worker += nbytes
        self.rounds_by_level[transfer.level] += 1
        self.bytes_by_level[transfer.level] += nbytes

    def compute(self, workers: np.ndarray | None, counts: np.ndarray | int) -> None:
        """Keep a step's computation (the clock charges it to those workers only)."""
        if self.entries is not None:
            self.entries.append(Compute(workers, counts))

    def summary(self) -> dict:
        """The counts as summary.json keys."""
        return {"comm_rounds": self.rounds, "messages_per_worker": self.messages_per_worker,
                "bytes_per_worker": self.bytes_per_worker,
                **{f"comm_rounds_{level}": r for level, r in sorted(self.rounds_by_level.items())},
                **{f"bytes_per_worker_{level}": b for level, b in sorted(self.bytes_by_level.items())},
                "bytes_per_worker_metrics": self.bytes_per_worker_metrics}

    def state_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "n"}

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, dict(value) if isinstance(value, dict) else value)


def allreduce_bytes(d: int, g: int) -> float:
    """Bytes one member sends in a ring all-reduce of d values within a group of g."""
    return 2 * d * (g - 1) / g * BYTES_PER_VALUE
