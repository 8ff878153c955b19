"""What a real network would carry: the communication counts every engine keeps alike."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Any

BYTES_PER_VALUE = 4  # float32 on the wire (float64 runs are counted as float32 too)
LEVELS = ("global", "block", "gossip")  # all-reduce of all workers, inside blocks, gossip rounds
METRICS = "metrics"  # the level of measurement traffic, counted apart


@dataclass(frozen=True)
class Event:
    """One operator as the network carries it (what :mod:`gossamer.network` prices).

    ``op``: ``allreduce`` (of a vector of ``nbytes``), ``allgather`` (one ``nbytes`` message per
    member) or ``gossip`` (every worker's ``nbytes`` model to the workers that mix it in, as
    ``mixing`` says); ``group``: the workers taking part, consecutive and aligned to a multiple
    of ``group`` (all n, or a block); ``level``: one of :data:`LEVELS`, or ``metrics``;
    ``behind``: the steps of compute it may run behind (Streaming DiLoCo's delayed fragments)."""

    op: str
    group: int
    nbytes: float
    level: str
    mixing: Any = None
    behind: int = 0


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

    After :meth:`record`, every operator is also kept as an :class:`Event` until :meth:`take`
    (the simulated clock prices them step by step); events are not state.
    """

    rounds: int = 0
    messages_per_worker: float = 0.0
    bytes_per_worker: float = 0.0
    rounds_by_level: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LEVELS, 0))
    bytes_by_level: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LEVELS, 0.0))
    bytes_per_worker_metrics: float = 0.0

    def __post_init__(self) -> None:
        self.events: list[Event] | None = None  # not a field: never in the state
        self.behind = 0  # the steps of compute the operators recorded now may run behind

    @contextlib.contextmanager
    def running_behind(self, steps: int):
        """Operators recorded inside run in the background of the next ``steps`` steps' compute."""
        self.behind = steps
        try:
            yield
        finally:
            self.behind = 0

    def record(self) -> None:
        """Keep every operator from now on as an :class:`Event`."""
        self.events = []

    def take(self) -> list[Event]:
        """The events since the last call (none unless recording)."""
        taken = self.events or []
        if self.events is not None:
            self.events = []
        return taken

    def _add(self, event: Event, messages: float, nbytes: float) -> None:
        if self.events is not None:
            self.events.append(dataclasses.replace(event, behind=self.behind) if self.behind else event)
        if event.level == METRICS:
            self.bytes_per_worker_metrics += nbytes
            return
        self.rounds += 1
        self.messages_per_worker += messages
        self.bytes_per_worker += nbytes
        self.rounds_by_level[event.level] += 1
        self.bytes_by_level[event.level] += nbytes

    def allreduce(self, d: int, n: int, level: str = "global") -> None:
        """A ring all-reduce of d values among n workers."""
        self._add(Event("allreduce", n, d * BYTES_PER_VALUE, level), 2 * (n - 1), allreduce_bytes(d, n))

    def allgather(self, nbytes: int, n: int, level: str = "global") -> None:
        """A ring all-gather of one ``nbytes`` message per worker among n workers (compressed
        messages cannot be summed on the way, so every worker receives every message)."""
        self._add(Event("allgather", n, nbytes, level), n - 1, (n - 1) * nbytes)

    def gossip(self, d: int, mixing) -> None:
        """d values to each of the peers that use this worker's model (``mixing``: the round's W)."""
        peers = mixing.messages_per_worker
        self._add(Event("gossip", mixing.n, d * BYTES_PER_VALUE, "gossip", mixing), peers,
                  peers * d * BYTES_PER_VALUE)

    def exchange(self, nbytes: int, mixing) -> None:
        """A message of ``nbytes`` to each of the peers that keep a copy of this worker's, as
        ``mixing``'s slots say (a gossip round of compressed messages)."""
        peers = mixing.messages_per_worker
        self._add(Event("gossip", mixing.n, nbytes, "gossip", mixing), peers, peers * nbytes)

    def pairwise(self, d: int) -> None:
        """A step of AD-PSGD, n pairwise averages of d values among n workers, counted as one
        round: each pair exchanges its two models, 2 messages per worker on average."""
        self._add(Event("pairwise", 2, d * BYTES_PER_VALUE, "gossip"), 2, 2 * d * BYTES_PER_VALUE)

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
