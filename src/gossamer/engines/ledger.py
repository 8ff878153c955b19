"""What moved: one ledger of every operator's traffic, recorded where it moves; the communication
counters and the simulated clock read only this.

An operator records a :class:`Transfer` from its real inputs — the groups that averaged (their
living members), the round's W (repaired for the workers taking part), the size of the tensors
that travel (their dtype's width: 4 bytes a value in float32 runs, 8 in float64 ones, a codec's
encoded bytes) — and a step's computation a :class:`Compute` of the workers that computed. Per
worker (means over all n workers, a gone or idle worker sending nothing):

- a ring all-reduce of b bytes within a group of g sends 2(g − 1)/g · b bytes in 2(g − 1)
  messages from each member;
- a ring all-gather of one b-byte message per member sends (g − 1) · b bytes in g − 1 messages;
- a gossip round sends worker j's b bytes to every i ≠ j with W_ij ≠ 0 (what i mixes in or
  copies); a rejoining worker's fetch is one: each living neighbour's rows to it;
- a ``push`` or ``pull`` is one b-byte message between one worker and a parameter server (its
  pseudo-gradient up, the model down), counted on that worker's link either way.

The algorithm's own traffic (``rounds``, ``messages_per_worker``, ``bytes_per_worker`` and their
split by level: :data:`LEVELS`) is everything an algorithm consumes — its averages and gossip
rounds, and also the scalars and probes it decides from (consensus control's Ξ², Θ² and φ²,
level ``control``) and a returning worker's fetch (level ``rejoin``). Measurement traffic
(``bytes_per_worker_metrics``: x̄, Ξ² and scalar means for the rows and evaluations, which
nothing reads but the user) is kept apart: a deployment that does not measure would not pay it.
A transfer also says what computation it runs behind (``backward``, ``behind``), for the clock.
After :meth:`Ledger.record`, every entry is also kept until :meth:`Ledger.take` (the clock prices
the step's entries in order); entries are not state. :mod:`gossamer.engines.wire` checks the
ledger against what real processes hand to torch.distributed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..groups import Groups

CONTROL, REJOIN, SERVER = "control", "rejoin", "server"
# all-reduce of all workers, inside groups, gossip rounds, what control decides from, rejoining workers' fetches,
# messages between a worker and a parameter server
LEVELS = ("global", "block", "gossip", CONTROL, REJOIN, SERVER)
METRICS = "metrics"  # the level of measurement traffic, counted apart


@dataclass(frozen=True, eq=False)
class Transfer:
    """One operator as the network carries it (module docstring).

    ``op``: ``allreduce`` or ``allgather`` within each of ``groups``, or ``gossip`` along the
    round's ``mixing``; ``nbytes``: the vector reduced, or one member's message; ``level``: one
    of :data:`LEVELS`, or :data:`METRICS`; what computation it overlaps: ``backward``, the
    backward pass of the step that sends it (the gradient all-reduce, bucketed as DDP does), or
    ``behind`` > 0, the next steps' compute (Streaming DiLoCo's fragments), or neither;
    ``initiator``: a one-sided exchange (AD-PSGD's pair average, a push or pull between a worker
    and a server, ``groups`` then the workers the server serves) that only this worker waits for
    and spends time on, its peer passive; ``queued``: the seconds it waits to start (a server's
    link busy with another's message, a grace window open)."""

    op: str
    nbytes: float
    level: str
    groups: Groups | None = None
    mixing: object | None = None  # a topology.Mixing
    behind: int = 0
    backward: bool = False
    initiator: int | None = None
    queued: float = 0.0

    @property
    def n(self) -> int:
        return self.groups.n if self.groups is not None else self.mixing.n

    @cached_property
    def per_worker(self) -> tuple[float, float]:
        """(messages, bytes) sent, means over the n workers."""
        if self.op == "gossip":
            peers = self.mixing.messages_per_worker
            return peers, peers * self.nbytes
        if self.op in ("push", "pull"):
            return 1 / self.n, self.nbytes / self.n
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
        self._overlap: dict = {}  # what the transfers recorded now overlap (Transfer's behind, backward)

    @contextlib.contextmanager
    def overlapping(self, backward: bool = False, behind: int = 0):
        """Transfers recorded inside run in the background of this step's backward pass
        (``backward``), or of the next ``behind`` steps' compute."""
        self._overlap = {"backward": backward, "behind": behind}
        try:
            yield
        finally:
            self._overlap = {}

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
        if self._overlap:
            transfer = dataclasses.replace(transfer, **self._overlap)
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
        """The counts of :meth:`state_dict` (a level the state lacks, from an earlier version: 0)."""
        fresh = Ledger(self.n)
        for key, value in state.items():
            setattr(self, key, {**getattr(fresh, key), **value} if isinstance(value, dict) else value)


def row_bytes(T) -> int:
    """The bytes of one row of a tensor [rows, ...]: what one worker's message of it carries."""
    return math.prod(T.shape[1:]) * T.element_size()


def allreduce_bytes(d: int, g: int, value_bytes: int) -> float:
    """Bytes one member sends in a ring all-reduce of d values of ``value_bytes`` within a group of g."""
    return 2 * d * (g - 1) / g * value_bytes
