"""The ledger checked against the wire: what the dist engine hands torch.distributed, per transfer.

The ledger (:mod:`gossamer.engines.ledger`) prices each operator as n workers on machines of their
own would run it; the dist engine's P processes hold n/P consecutive workers each and carry only
what crosses between processes. For one :class:`~gossamer.engines.ledger.Transfer` — its
operator, its participants (the living members of its groups, its W) and its message size —
each process must hand torch.distributed exactly this (:func:`expected`), and nothing else:

- an all-reduce within groups: for every group whose members sit in more than one process, one
  ``all_reduce`` of the transfer's b bytes among the processes that hold members;
- an all-gather within groups: for every such group, one ``all_gather`` among those processes
  of c·b bytes from each, c the most members one of them holds (the shares padded alike);
- a gossip round (a neighbour exchange, a returning worker's fetch): to each other process, one
  ``send`` of b bytes for every row of its own that a worker there reads with a weight ≠ 0, and
  from each, the matching ``recv``;
- nothing for an operator of 0 bytes, nor for a group inside one process.

Summed over the processes, the ring volumes of these collectives (2(p − 1)/p of an all-reduce's
bytes, p − 1 shares of an all-gather's) equal the ledger's bytes wherever each member of a group
sits in a process of its own; where several share a process, the ledger counts messages that a
cluster of machines would send and the processes exchange through memory.

:class:`WireTap` collects what the engine's call sites hand (kind, peers, the tensors' bytes)
between two transfers and compares it with :func:`expected` of the transfer then recorded —
the ledger against the wire, not against itself. Bookkeeping does not pass through it:
gathering a checkpoint, agreeing to stop, sharing a result with a process whose workers are all
gone, an omniscient attacker's reads. The tap is on where the environment variable
``GOSSAMER_WIRE_CHECK`` names a file prefix: each process writes ``PREFIX-rank{R}.json`` when
its engine closes (:meth:`WireTap.report`).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .ledger import Transfer

ENV = "GOSSAMER_WIRE_CHECK"
Handed = tuple[str, tuple[int, ...], int]  # (kind, the processes: a collective's ranks or a message's peer, bytes)


def expected(transfer: Transfer, n: int, world: int, rank: int) -> list[Handed]:
    """What process ``rank`` of ``world`` (each holding n/world consecutive workers) must hand
    torch.distributed for ``transfer`` (module docstring), sorted."""
    if transfer.nbytes == 0:
        return []
    m = n // world
    if transfer.op == "gossip":
        return _gossip(transfer, m, world, rank)
    groups = transfer.groups

    def build() -> list[tuple[tuple[int, ...], int]]:  # each group's ranks and the most members one holds
        spans = []
        for r in range(groups.count):
            held = np.bincount(groups.members(r) // m, minlength=world)
            spans.append((tuple(np.flatnonzero(held).tolist()), int(held.max())))
        return spans
    out = [("all_reduce", ranks, int(transfer.nbytes)) if transfer.op == "allreduce" else
           ("all_gather", ranks, most * int(transfer.nbytes))
           for ranks, most in groups.plan(("wire", m, world), build) if len(ranks) > 1 and rank in ranks]
    return sorted(out)


def _gossip(transfer: Transfer, m: int, world: int, rank: int) -> list[Handed]:
    """A round of W: each process's rows read by another, one message per peer (kept on W)."""
    mixing = transfer.mixing

    def build() -> np.ndarray:  # rows[p, q]: the rows of process p that a worker of q reads
        readers = np.broadcast_to(np.arange(mixing.n), mixing.index.shape)
        used = (mixing.weight != 0) & (mixing.index != readers)
        pairs = np.unique(np.stack([mixing.index[used], readers[used] // m], 1), axis=0).reshape(-1, 2)
        rows = np.zeros((world, world), dtype=np.int64)
        np.add.at(rows, (pairs[:, 0] // m, pairs[:, 1]), 1)
        np.fill_diagonal(rows, 0)
        return rows
    rows = mixing.plan(("wire", m, world), build)
    b = int(transfer.nbytes)
    return sorted([("send", (q,), int(rows[rank, q]) * b) for q in range(world) if rows[rank, q]]
                  + [("recv", (p,), int(rows[p, rank]) * b) for p in range(world) if rows[p, rank]])


def _shown(handed: list[Handed]) -> str:
    return ", ".join(f"{kind} {'to' if kind == 'send' else 'from' if kind == 'recv' else 'among'} "
                     f"{'/'.join(map(str, ranks))} of {nbytes:,} B" for kind, ranks, nbytes in handed) or "nothing"


@dataclass
class WireTap:
    """What one process hands torch.distributed (:meth:`hand`), checked against each transfer the
    ledger records (:meth:`check`): the operators compared, the bytes handed by kind, and the
    first mismatches, each in one line."""

    n: int
    world: int
    rank: int
    prefix: str | None = None  # where report() is written: PREFIX-rank{R}.json
    operators: int = 0
    handed_bytes: Counter = field(default_factory=Counter)
    mismatches: list[str] = field(default_factory=list)
    _handed: list[Handed] = field(default_factory=list)

    @classmethod
    def from_env(cls, n: int, world: int, rank: int) -> WireTap | None:
        """A tap writing to ``$GOSSAMER_WIRE_CHECK-rank{R}.json``, or None where it is not set."""
        prefix = os.environ.get(ENV)
        return cls(n, world, rank, prefix) if prefix else None

    def hand(self, kind: str, ranks: tuple[int, ...], nbytes: int) -> None:
        """A call site hands torch.distributed ``nbytes`` of ``kind`` with the processes ``ranks``."""
        if nbytes:
            self._handed.append((kind, tuple(ranks), int(nbytes)))
            self.handed_bytes[kind] += int(nbytes)

    def check(self, transfer: Transfer) -> None:
        """Compare what was handed since the last transfer with what ``transfer`` implies."""
        want, got = expected(transfer, self.n, self.world, self.rank), sorted(self._handed)
        self._handed = []
        self.operators += 1
        if want != got and len(self.mismatches) < 10:
            more = sum(b for *_, b in got) - sum(b for *_, b in want)
            self.mismatches.append(
                f"operator {self.operators} ({transfer.op} of {transfer.nbytes:,.0f} B a message, level "
                f"{transfer.level}): rank {self.rank} handed torch.distributed {_shown(got)}; the ledger's transfer "
                f"implies {_shown(want)} ({more:+,} B)")

    def report(self) -> dict:
        """The tap's findings; traffic handed after the last transfer is in no transfer at all."""
        unrecorded = [f"rank {self.rank} handed torch.distributed {_shown(sorted(self._handed))} that no transfer "
                      f"records"] if self._handed else []
        return {"rank": self.rank, "world": self.world, "workers": self.n, "operators": self.operators,
                "handed_bytes": dict(self.handed_bytes), "mismatches": self.mismatches + unrecorded}

    def write(self) -> None:
        if self.prefix:
            Path(f"{self.prefix}-rank{self.rank}.json").write_text(json.dumps(self.report(), indent=1))
