"""AD-PSGD on real processes, and its replay (the rules: :mod:`gossamer.algorithms.pair_events`).

Under torchrun, P = n + 1 processes: rank ``server_rank`` is the coordinator, the others workers.
Messages, point to point over gloo, each on its own tag:

- worker → coordinator (``REQUEST``): [0, j (−1: no neighbour), k] asks for the pair (i, j) of its
  k-th event; [1, c, 0] says its event is done (the pair is released), c = 1 when its exchange was
  cut (below);
- coordinator → worker (``GRANT``): [s, p] the event is granted as event s, with the pair (p = 1)
  or without it (p = 0: j is gone); [−1, 0] stop;
- coordinator → the passive worker's thread (``PASSIVE``): [i, s] average with i in event s;
  [−1, 0] stop;
- i → j (``MODEL``) and j → i (``REPLY``): the models x_i, x_j (d values each), both taken before
  either averages;
- the passive thread → coordinator (``CUT``): [s] its side of event s was cut; [−1] it stopped;
- worker → coordinator (``FINAL``): its model when the run ends, then the bytes it sent.

Every process counts the bytes it hands ``dist.send``; the summary's ``wire_bytes_sent`` is their
sum (the coordinator's and every worker's that finished, the final models and counts left out).

**A worker that dies** (SIGKILL: its connections close) is dropped and the others go on. The
coordinator learns it when a message to or from it fails (or when it says nothing for
``dist_timeout``), logs ``{"gone": w, "after": s}`` (s: the events granted until then), releases
its pair and grants the pairs drawn with it from then on without a partner (``"j": null, "lost":
w``). A pair exchange that fails on one side is **cut** there: that side keeps its model (no
average) and says so, logged as ``{"cut": s, "worker": i}``; a side whose exchange completed
averages as always. Only when every worker is gone does the run stop; the coordinator's death ends
it (each worker says so in one line), and such a run is not resumed.

The coordinator grants the first n·T requests (T loop steps of n events) and answers the rest
with a stop; then it stops the passive threads, collects the final models and writes the run
directory: config.yaml, ``events.jsonl`` (a header as async-local-sgd's, then one line per
granted event: ``{"event": s, "i": i, "j": j, "k": k, "wall": seconds}``, and the gone and cut
lines), ``models.pt`` (the final x_i, [n, d]; NaN for a gone worker, whose model died with it) and
summary.json (x̄'s test metrics and Ξ² of the living workers' final models; the rows come from
``gossamer train --replay``, whose final models equal ``models.pt`` bit for bit).
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections import deque
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from .algorithms.pair_events import PairReplay, PairWorker, average_
from .async_processes import (LOG, LOG_FORMAT, gather_errors, listen, log_lines, one_row_run, process_group,
                              threads_of)
from .data import load_dataset
from .engines import SimEngine
from .engines.dist import agree, first_line
from .engines.failures import PeerLost
from .network import Speeds
from .registry import ConfigError, short
from .rundir import RunDir, RunLock
from .runner import train_into
from .train import Batches, Run, build_run, evaluate, lr_at

REQUEST, GRANT, PASSIVE, MODEL, REPLY, FINAL, CUT = range(1, 8)  # the tags
MODELS = "models.pt"
STOP = -1


def pair_worker(run: Run, w: int, sleeps: bool) -> PairWorker:
    cfg = run.cfg
    return PairWorker(run, w, lambda k: lr_at(cfg, k, run.steps_per_epoch), Batches(run),
                      Speeds.of(cfg) if sleeps else None)


def run_pairs(cfg, out: Path, overwrite: bool, progress: bool, resume: bool, lock: RunLock | None) -> dict:
    """This process's part: the summary on the coordinator, {} on a worker."""
    if resume:
        raise ConfigError("--resume: ad-psgd on processes does not continue a run (its workers' state lives in "
                          "their processes); train it again")
    with process_group(cfg) as ranks:
        if dist.get_rank() == cfg.server_rank:
            return _coordinate(cfg, out, overwrite, lock, ranks)
        _work(cfg, ranks.index(dist.get_rank()), ranks)
        return {}


def _lost(who: str, e: BaseException, ranks: list[int]) -> PeerLost:
    return PeerLost(f"rank {dist.get_rank()}: lost {who}: {first_line(e)}; stopping", ranks)


def _work(cfg, w: int, ranks: list[int]) -> None:
    """Worker w: its gradients and events (main thread), its passive averages (a thread)."""
    me = pair_worker(agree(lambda: one_row_run(cfg, w), gather_errors), w, sleeps=True)
    coordinator, guard = cfg.server_rank, threading.Lock()
    sent, failed = [0, 0], []  # bytes sent by the main thread and by the passive one; a failure of the latter

    def send(tensor: torch.Tensor, dst: int, tag: int, by: int) -> None:
        dist.send(tensor, dst, tag=tag)
        sent[by] += tensor.numel() * tensor.element_size()

    def passive() -> None:
        notice = torch.empty(2, dtype=torch.float64)
        theirs = torch.empty_like(me.model)
        try:
            while True:
                dist.recv(notice, coordinator, tag=PASSIVE)
                if notice[0] == STOP:
                    send(notice[:1].clone(), coordinator, CUT, by=1)
                    return
                peer = ranks[int(notice[0])]
                with guard:
                    try:
                        dist.recv(theirs, peer, tag=MODEL)
                        send(me.model.contiguous(), peer, REPLY, by=1)
                    except RuntimeError:  # the active peer is lost: this side is cut (no average)
                        send(notice[1:].clone(), coordinator, CUT, by=1)
                        continue
                    average_(me.model, theirs)
        except RuntimeError as e:  # the coordinator is lost: the main thread tells it, in one line
            failed.append(e)

    thread = threading.Thread(target=passive, name="passive averages", daemon=True)
    thread.start()
    message, grant = torch.zeros(3, dtype=torch.float64), torch.empty(2, dtype=torch.float64)
    theirs = torch.empty_like(me.model)
    try:
        while not failed:
            me.compute()
            j = me.partner()
            message[:] = torch.tensor([0.0, -1.0 if j is None else j, me.count])
            send(message, coordinator, REQUEST, by=0)
            dist.recv(grant, coordinator, tag=GRANT)
            if grant[0] == STOP:
                break
            paired, cut = j is not None and grant[1] == 1, False
            with guard:
                if paired:
                    try:
                        send(me.model.contiguous(), ranks[j], MODEL, by=0)
                        dist.recv(theirs, ranks[j], tag=REPLY)
                    except RuntimeError:  # j is lost: this side is cut (no average)
                        cut = True
                me.event(theirs if paired and not cut else None)
            message[:] = torch.tensor([1.0, float(cut), 0.0])
            send(message, coordinator, REQUEST, by=0)
        thread.join()
        if failed:
            raise failed[0]
        dist.send(me.model.contiguous(), coordinator, tag=FINAL)
        dist.send(torch.tensor([float(sum(sent))], dtype=torch.float64), coordinator, tag=FINAL)
    except RuntimeError as e:
        raise _lost(f"a peer of worker {w}", e, []) from None


class Coordinator:
    """The grants (module docstring): which workers are in a pair, the requests waiting, who is
    gone, the log (written by this thread alone; the receiving threads queue what they get)."""

    def __init__(self, cfg, ranks: list[int], total: int, log):
        self.ranks, self.total, self.log, self.timeout = ranks, total, log, cfg.dist_timeout
        n = len(ranks)
        self.busy = [False] * n
        self.open: dict[int, tuple[int, int | None]] = {}  # the active worker of each open pair → (s, partner)
        self.waiting: deque[tuple[int, int | None, int]] = deque()
        self.stopped: set[int] = set()  # told to stop
        self.gone: set[int] = set()
        self.ended: set[int] = set()  # whose passive thread stopped: its cut reports are all in
        self.granted = self.pairs = 0  # events, and those with a pair average
        self.sent = 0  # bytes the coordinator sent
        self.arrivals: queue.Queue = queue.Queue()
        self.requests = torch.empty(n, 3, dtype=torch.float64)  # each worker's last request (or done)
        self.reports = torch.empty(n, 1, dtype=torch.float64)  # each passive thread's last cut report
        self.started = time.perf_counter()
        for w in range(n):
            self._listen(w)
            listen(self.arrivals, w, self.reports[w], self.ranks[w], CUT)

    def _listen(self, w: int) -> None:
        """Await w's next request (or done)."""
        listen(self.arrivals, w, self.requests[w], self.ranks[w], REQUEST)

    def run(self) -> None:
        """Grant until every worker is stopped or gone and no pair is open."""
        while len(self.stopped | self.gone) < len(self.ranks) or self.open:
            w, tag, error = self._next()
            message = self.requests[w]
            if tag == REQUEST and error is None and message[0] == 1:  # done: the pair is released
                s, j = self.open.pop(w)
                self.busy[w] = False
                if j is not None:
                    self.busy[j] = False
                if message[1] == 1:
                    self._write({"cut": s, "worker": w})
                self._listen(w)
            elif tag == REQUEST and error is None:
                self.waiting.append((w, None if message[1] < 0 else int(message[1]), int(message[2])))
            self._grant()

    def _next(self) -> tuple[int, int, RuntimeError | None]:
        """The next arrival (worker, tag, the error of a failed receive): a lost worker is dropped, a
        cut report logged (and the next awaited)."""
        try:
            w, tag, error = self.arrivals.get(timeout=self.timeout)
        except queue.Empty:
            raise PeerLost(f"coordinator (rank {dist.get_rank()}): no worker spoke within "
                           f"dist_timeout={self.timeout:g} s; stopping", []) from None
        if error is not None:
            self._gone(w)
        elif tag == CUT and self.reports[w, 0] == STOP:
            self.ended.add(w)
        elif tag == CUT:
            self._write({"cut": int(self.reports[w, 0]), "worker": w})
            listen(self.arrivals, w, self.reports[w], self.ranks[w], CUT)
        return w, tag, error

    def _gone(self, w: int) -> None:
        """w's process is lost: dropped, its pair released, its requests forgotten."""
        if w in self.gone:
            return
        self.gone.add(w)
        self._write({"gone": w, "after": self.granted})
        self.waiting = deque(r for r in self.waiting if r[0] != w)
        self.busy[w] = False
        if w in self.open:
            _, j = self.open.pop(w)
            if j is not None:
                self.busy[j] = False
        if len(self.gone) == len(self.ranks):
            raise PeerLost(f"coordinator (rank {dist.get_rank()}): every worker is gone, the last worker {w} "
                           f"(rank {self.ranks[w]}); stopping", [])

    def _grant(self) -> None:
        """Every waiting request that can go, in arrival order (both workers free; a gone partner
        is none); past the run's events, a stop."""
        for request in list(self.waiting):
            i, j, k = request
            if request not in self.waiting:  # its worker was lost meanwhile
                continue
            if self.granted >= self.total:
                self.waiting.remove(request)
                self.stopped.add(i)
                self._send(i, [STOP, 0], GRANT)
            elif not self.busy[i] and (j is None or j in self.gone or not self.busy[j]):
                self.waiting.remove(request)
                s, partner = self.granted, None if j in self.gone else j
                self.granted += 1
                self.busy[i], self.open[i] = True, (s, partner)
                self._write({"event": s, "i": i, "j": partner, "k": k, **({"lost": j} if j != partner else {}),
                             "wall": round(time.perf_counter() - self.started, 6)})
                if partner is not None:
                    self.busy[partner] = True
                    self.pairs += 1
                    self._send(partner, [i, s], PASSIVE)
                if self._send(i, [s, partner is not None], GRANT):
                    self._listen(i)

    def _write(self, line: dict) -> None:
        self.log.write(json.dumps(line) + "\n")

    def _send(self, w: int, values: list[float], tag: int) -> bool:
        """Send to worker w; False (and w gone) where it is lost."""
        message = torch.tensor(values, dtype=torch.float64)
        try:
            dist.send(message, self.ranks[w], tag=tag)
        except RuntimeError:
            self._gone(w)
            return False
        self.sent += message.numel() * message.element_size()
        return True

    def finish(self, like: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Stop the passive threads and take their last cut reports; the final models [n, d] (NaN
        for the gone) and the bytes every process that finished sent."""
        for w in range(len(self.ranks)):
            if w not in self.gone:
                self._send(w, [STOP, 0], PASSIVE)
        while self.ended | self.gone != set(range(len(self.ranks))):
            self._next()
        models = torch.full((len(self.ranks), *like.shape[1:]), float("nan"), dtype=like.dtype)
        sent, count = self.sent, torch.empty(1, dtype=torch.float64)
        for w in sorted(set(range(len(self.ranks))) - self.gone):
            try:
                dist.recv(models[w : w + 1], self.ranks[w], tag=FINAL)
                dist.recv(count, self.ranks[w], tag=FINAL)
            except RuntimeError:
                models[w] = float("nan")
                self._gone(w)
                continue
            sent += int(count[0])
        return models, sent


def _coordinate(cfg, out: Path, overwrite: bool, lock: RunLock | None, ranks: list[int]) -> dict:
    def build():
        run = build_run(cfg, SimEngine(cfg.workers))
        return run, RunDir(out, overwrite, cfg.logger, lock=lock, extra=(LOG, MODELS))
    run, run_dir = agree(build, gather_errors)
    start, total = time.perf_counter(), cfg.epochs * run.steps_per_epoch
    try:
        run_dir.write_config(cfg)
        with open(run_dir.dir / LOG, "w", buffering=1) as log:
            log.write(json.dumps({"log": LOG_FORMAT, "config": cfg.to_dict(), "processes": len(ranks) + 1,
                                  "server_rank": cfg.server_rank, "threads": torch.get_num_threads()}) + "\n")
            coordinator = Coordinator(cfg, ranks, cfg.workers * total, log)
            coordinator.run()
            X = run.workers.X
            models, sent = coordinator.finish(X)
        X.copy_(models.to(X.device))
        torch.save(X.cpu(), run_dir.dir / MODELS)
        if coordinator.gone:  # x̄ and Ξ² over the living
            run.engine.set_alive(np.array([w not in coordinator.gone for w in range(cfg.workers)]))
        summary = {**evaluate(run, total - 1), "final_consensus_distance_sq": run.engine.consensus_distance_sq(X),
                   "events": coordinator.granted, "comm_rounds": coordinator.pairs, "wire_bytes_sent": sent,
                   "workers_gone": len(coordinator.gone), "steps": total,
                   "parameters": X.shape[1],
                   "wall_seconds": time.perf_counter() - start}
        run_dir.write_summary(summary)
        run_dir.publish()  # it writes no checkpoint: a run that replaces another one takes its place here
        return summary
    finally:
        run_dir.close()


def replay_pairs(cfg, source: Path, out: Path, overwrite: bool, progress: bool) -> dict:
    """Train ``cfg`` in this process on the events logged in run directory ``source`` into ``out``:
    the rows, and the final models, which must equal the processes' (``models.pt``)."""
    lines, where = log_lines(source, cfg), short(str(source))
    data = load_dataset(cfg)  # once: the run and every worker's are built from it
    run = build_run(cfg, SimEngine(cfg.workers), data=data)
    events = [e for e in lines[1:] if "event" in e]
    cuts = {(e["cut"], e["worker"]) for e in lines[1:] if "cut" in e}
    gone = [(e["after"], e["gone"]) for e in lines[1:] if "gone" in e]
    if len(events) < cfg.workers * cfg.epochs * run.steps_per_epoch:
        raise ConfigError(f"--replay '{where}': the event log ends after event {len(events)} of the "
                          f"{cfg.workers * cfg.epochs * run.steps_per_epoch} the run takes: the run stopped early")
    workers = [pair_worker(one_row_run(cfg, w, data), w, sleeps=False) for w in range(cfg.workers)]
    run.schedule = PairReplay(workers, events, where, cuts, gone)
    with threads_of(lines[0]):
        summary = train_into(cfg, run, RunDir(out, overwrite, cfg.logger), out, progress, None)
    final, living = Path(source) / MODELS, [w for w in range(cfg.workers) if w not in {w for _, w in gone}]
    if final.is_file() and not torch.equal(torch.load(final, weights_only=True)[living], run.workers.X.cpu()[living]):
        raise ConfigError(f"--replay '{where}': the replay's final models differ from the processes' ({MODELS}): "
                          f"the log is not this run's")
    return summary
