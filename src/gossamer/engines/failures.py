"""Failure detection for the dist engine: a lost peer is named within ``dist_timeout``, never a hang.

Every collective waits at most a timeout. A heartbeat thread writes to the rendezvous store, so
that when a collective fails (a peer died: its connections close at once; or it stopped
answering: the wait times out) the engine raises :class:`PeerLost` with one line naming the rank
that is gone, the same rank on every survivor.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta

import torch.distributed as dist


class PeerLost(RuntimeError):
    """A process died or stopped answering; ``str(e)`` is one line naming the lost rank."""

    def __init__(self, message: str, ranks: list[int]):
        super().__init__(message)
        self.ranks = ranks


class Watchdog:
    """Heartbeats in the rendezvous store: when an operation fails, whose heartbeat stopped names the lost rank.

    Each rank's thread writes ``hb/RANK = "beat ops"`` every ``interval`` seconds through its own
    store connection. The verdict of the first rank to judge is stored, so every survivor names the
    same rank; ranks that stop deliberately mark ``exit/RANK`` so that they are not blamed.
    """

    def __init__(self, rank: int, world: int, interval: float, window: float):
        self.rank, self.world, self.interval, self.window = rank, world, interval, window
        self.ops = 0
        self.store = self._connect()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        if self.store is not None and world > 1:
            self._beat(0)
            self._thread = threading.Thread(target=self._loop, name="gossamer-heartbeat", daemon=True)
            self._thread.start()

    def _connect(self):
        host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not (host and port):
            try:  # a group initialised some other way: the TCPStore it was built from
                base = dist.distributed_c10d._get_default_store()
                while hasattr(base, "underlying_store"):
                    base = base.underlying_store
                host, port = base.host, base.port
            except Exception:
                return None
        try:
            store = dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                                  timeout=timedelta(seconds=max(2.0, 2 * self.window)))
        except Exception:
            return None
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        return dist.PrefixStore(f"gossamer/{attempt}/", store)

    def _beat(self, beat: int) -> None:
        with self._lock:
            self.store.set(f"hb/{self.rank}", f"{beat} {self.ops}")

    def _loop(self) -> None:
        beat = 0
        while not self._stop.wait(self.interval):
            beat += 1
            try:
                self._beat(beat)
            except Exception:
                return  # the store is gone; the main thread will find out

    def _read(self, key: str) -> str | None:
        with self._lock:
            return self.store.get(key).decode() if self.store.check([key]) else None

    def verdict(self, peers: list[int] | None, timeout: float) -> list[int]:
        """The ranks that are gone: agreed with the other survivors through the store."""
        if self.store is None:
            return list(peers or [])
        others = [r for r in range(self.world) if r != self.rank]
        try:
            decided = self._read("lost")
            if decided is None:
                first = {r: self._read(f"hb/{r}") for r in others}
                time.sleep(self.window)
                decided = self._read("lost")
            if decided is None:
                last = {r: self._read(f"hb/{r}") for r in others}
                exited = {r for r in others if self._read(f"exit/{r}") is not None}
                silent = [r for r in others if first[r] == last[r] and r not in exited]
                if not silent:  # all alive: blame whoever is behind us in the sequence of operations
                    behind = [r for r in others if last[r] and int(last[r].split()[1]) < self.ops]
                    silent = behind or [r for r in (peers or []) if r not in exited]
                with self._lock:
                    decided = self.store.compare_set("lost", "", ",".join(map(str, silent))).decode()
            self.stop()  # no more heartbeats: the store may go away once every survivor has judged
            with self._lock:
                self.store.set(f"exit/{self.rank}", "lost")
            lost = [int(r) for r in decided.split(",") if r]
            if self.rank == 0:  # the store may live here: wait until the other survivors have read the verdict
                waiting = [r for r in others if r not in lost]
                deadline = time.monotonic() + timeout
                while waiting and time.monotonic() < deadline:
                    waiting = [r for r in waiting if self._read(f"exit/{r}") is None]
                    time.sleep(0.05)
            return lost
        except Exception:  # the store itself is gone: it lived with rank 0 (or the torchrun agent)
            return [0] if self.rank != 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" else []

    def stop(self) -> None:
        """End the heartbeat thread and wait for it (at most the store's own timeout): a daemon
        thread still inside a store call when the interpreter shuts down aborts the process."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(2.0, 2 * self.window) + self.interval + 1)
