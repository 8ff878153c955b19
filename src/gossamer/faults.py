"""Workers that leave and return: who is alive at step t, the repaired gossip matrix, rejoining.

A ``faults`` section names when workers are gone: ``events`` ("3@100-300": worker 3 is gone for
the steps 100 ≤ t < 300, 0-based; "5@250-": from step 250 to the end) and ``churn`` P with
``downtime`` D (before step t every living worker leaves with probability P and stays away for
a number of steps drawn geometric with mean D; the draws of step t come from (seed, t) alone).
A gone worker takes no part in the step: it computes nothing (the loop's participation), sends
nothing (the engine's operators run over the living: means over the living members of each
group, gossip over W_t repaired by ``repair``), and its rows (model, buffers, optimizer and
schedule state) do not change (:meth:`Faults.begin_step` keeps them and puts them back). Ξ², x̄,
the losses and the accuracies are over the living. The repair of W_t: ``local`` (default:
:func:`gossamer.topology.keep_living`, every link of a gone worker dropped, its neighbours keeping
the weight they gave it) or ``metropolis`` (:func:`repair`: Metropolis–Hastings weights of the
living subgraph, a self-loop for a missing partner in a symmetric round of a changing graph). A
returning worker (``rejoin``) comes back with the state it left with (``stale``) or takes the
mean of its living neighbours' rows and a fresh local optimizer state (``neighbours``: each
neighbour sends it one message of its rows, the engine's ``fetch_``, priced at the ledger's level
``rejoin``; without a graph, every living worker is a neighbour). Every
process draws the same fault state from the seed, so the dist engine drops the same workers as
the simulator, wherever their rows are held. Churn never takes the last living worker (the step's
leaves are then cancelled); events that leave no worker alive are refused. Which algorithms drop
workers, and with which rejoin modes, each algorithm declares where it is registered
(``faults=``; an option of it may refuse faults in its own ``validate``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import torch

from .registry import ConfigError, short
from .rng import host_stream
from .topology import Mixing, Topology, keep_living, metropolis_hastings

REJOIN_MODES = ("neighbours", "stale")
REPAIRS = ("local", "metropolis")
MAX_DOWNTIME = 1e9  # steps; a longer mean stay is a worker gone for good (an event "W@A-")
_EVENT = re.compile(r"^(\d+)@(\d+)-(\d*)$")


@dataclass
class FaultsConfig:
    """The ``faults`` section (see the module docstring)."""

    events: list[str] = field(default_factory=list)  # "W@A-B" (gone for steps A ≤ t < B) or "W@A-" (to the end)
    churn: float = 0.0  # P: per step, the probability that a living worker leaves
    downtime: float = 0.0  # D: mean steps a churned worker stays away (geometric), ≥ 1 with churn
    rejoin: str = "neighbours"  # neighbours | stale
    repair: str = "local"  # the gossip matrix on the living: local (drop a gone worker's links) | metropolis

    def validate(self, cfg, algorithms) -> None:
        """Refuse a bad section; ``algorithms`` is the registry of algorithms (their ``faults`` traits),
        handed in by the config, which sits above both."""
        parse_events(self.events, cfg.workers)
        if not 0 <= self.churn < 1:
            raise ConfigError(f"faults.churn must be a probability in [0, 1), got {self.churn}")
        if self.churn > 0 and not self.downtime:
            raise ConfigError(f"faults.churn needs faults.downtime D: the mean steps a churned worker stays away, "
                              f"in [1, {MAX_DOWNTIME:g}]")
        if self.churn > 0 and not 1 <= self.downtime <= MAX_DOWNTIME:
            raise ConfigError(f"faults.downtime must be in [1, {MAX_DOWNTIME:g}] steps (the mean of a geometric draw) "
                              f"with churn > 0, got {self.downtime}")
        if self.churn == 0 and self.downtime:
            raise ConfigError("faults.downtime applies only with faults.churn > 0")
        unused = [f"faults.{k}" for k in ("rejoin", "repair") if getattr(self, k) != getattr(FaultsConfig, k)]
        if unused and not self.events and not self.churn:
            raise ConfigError(f"{' and '.join(unused)} appl{'ies' if len(unused) == 1 else 'y'} only when workers leave: give faults.events or faults.churn")
        if self.rejoin not in REJOIN_MODES:
            raise ConfigError(f"unknown faults.rejoin '{short(self.rejoin)}'; choose one of: {', '.join(REJOIN_MODES)}")
        if self.repair not in REPAIRS:
            raise ConfigError(f"unknown faults.repair '{short(self.repair)}'; choose one of: {', '.join(REPAIRS)}")
        _check_supported(cfg, algorithms, self.rejoin, self.repair)


def _check_supported(cfg, algorithms, rejoin: str, repair: str) -> None:
    """Refuse, in one line, an algorithm that does not declare that it drops workers (its
    registration's ``faults``: the rejoin modes it takes), and a repair of W where it gossips on
    no graph (its options have no topology, nor NoLoCo's outer one)."""
    graph = "topology" in algorithms[cfg.algorithm].keys or getattr(cfg, "outer_topology", "none") != "none"
    if repair != "local" and not graph:
        raise ConfigError(f"faults.repair {repair} repairs a gossip graph: algorithm {cfg.algorithm} has none here "
                          f"(its means are over the living workers); drop faults.repair")

    modes = {name: e.traits.get("faults", ()) for name, e in algorithms.entries.items()}
    if not modes[cfg.algorithm]:
        raise ConfigError(f"faults: algorithm {cfg.algorithm} does not drop workers; use one of: "
                          f"{', '.join(name for name, m in modes.items() if m)}")
    if rejoin not in modes[cfg.algorithm]:
        raise ConfigError(f"faults.rejoin {rejoin} does not apply to algorithm {cfg.algorithm}; it takes "
                          f"{', '.join(modes[cfg.algorithm])}")


def parse_events(events: list[str], n: int) -> list[tuple[int, int, int | None]]:
    """(worker, first gone step, first step back or None) of each event; refuses unknown workers,
    reversed or empty intervals, overlapping intervals of a worker, and a step with no worker alive."""
    parsed = []
    for text in events:
        match = _EVENT.match(text.replace(" ", ""))
        if not match:
            raise ConfigError(f"faults.events: '{short(text)}' is not W@A-B or W@A- (worker W gone for the steps "
                              f"A <= t < B, or from A to the end)")
        worker, start, end = int(match[1]), int(match[2]), int(match[3]) if match[3] else None
        if worker >= n:
            raise ConfigError(f"faults.events: unknown worker {worker} in '{short(text)}'; workers are 0..{n - 1}")
        if end is not None and end <= start:
            raise ConfigError(f"faults.events: '{short(text)}' is reversed or empty (B must be > A)")
        parsed.append((worker, start, end))
    ends = {}
    for worker, start, end in sorted(parsed):
        if worker in ends and (ends[worker] is None or start < ends[worker]):
            raise ConfigError(f"faults.events: worker {worker}'s intervals overlap; give each gone period once")
        ends[worker] = end
    for _, start, _ in parsed:  # the gone set only grows at an interval's start
        if len({w for w, a, b in parsed if a <= start and (b is None or start < b)}) == n:
            raise ConfigError(f"faults.events: all {n} workers are gone at step {start}; at least one must stay")
    return parsed


@dataclass
class Faults:
    """Who is alive at each step: the events, and the churn state (``back_at[i]``: the step a
    churned worker returns at; ≤ t: not churned). ``alive`` is the last step's; the state
    (``state_dict``) makes a resumed run draw what the uninterrupted one did."""

    cfg: FaultsConfig
    n: int
    seed: int
    events: list[tuple[int, int, int | None]] = field(default_factory=list)
    back_at: np.ndarray = None
    alive: np.ndarray = None
    alive_min: int = 0

    def __post_init__(self) -> None:
        self.events = parse_events(self.cfg.events, self.n)
        self.back_at = np.zeros(self.n, dtype=np.int64)
        self.alive = np.ones(self.n, dtype=bool)
        self.alive_min = self.n

    def check_steps(self, total: int) -> None:
        """Refuse events that start after the run's last step (they would say nothing)."""
        late = [f"{w}@{a}-{'' if b is None else b}" for w, a, b in self.events if a >= total]
        if late:
            raise ConfigError(f"faults.events: {late[0]} starts after the run's {total} steps (0..{total - 1})")

    def advance(self, t: int) -> np.ndarray:
        """Move to step t: returns the workers that come back at t (bool [n]); ``alive`` is t's."""
        gone = np.zeros(self.n, dtype=bool)
        for w, a, b in self.events:
            gone[w] |= a <= t and (b is None or t < b)
        if self.cfg.churn:
            rng = host_stream("churn", self.seed, t)
            leave = (rng.random(self.n) < self.cfg.churn) & ~gone & (self.back_at <= t)
            stays = rng.geometric(1 / self.cfg.downtime, self.n)
            if (gone | (self.back_at > t) | leave).all():
                leave[:] = False  # the last living workers stay
            self.back_at[leave] = t + stays[leave]
            gone |= self.back_at > t
        alive = ~gone
        returning = alive & ~self.alive
        self.alive = alive
        self.alive_min = min(self.alive_min, int(alive.sum()))
        return returning

    def begin_step(self, t: int, engine, topology: Topology | None, rows: list[torch.Tensor],
                   optimizer) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Step t's living workers to the ``engine`` (with this section's repair of W on
        ``topology``, the schedule's graph); the returning ones rejoin (``neighbours``: the mean of
        their living neighbours' ``rows``, the optimizer's state afresh; ``stale``: as they left).
        Returns (tensor, local gone rows, their values) of every row tensor and the optimizer's, to
        put back after the step: a gone worker changes nothing."""
        returning = self.advance(t)
        engine.set_alive(self.alive, self._repair(topology))
        if engine.alive is None and not returning.any():  # all alive, none back: nothing to fetch or keep
            return []
        if self.cfg.rejoin == "neighbours":
            for i in np.flatnonzero(returning):
                peers = neighbours(topology, int(i), self.n)
                peers = peers[self.alive[peers] & ~returning[peers]]
                if len(peers):
                    engine.fetch_(rows, int(i), peers)
                    if i in engine.rows:
                        optimizer.reset_(int(i) - engine.rows.start)
        if engine.alive is None:
            return []
        gone = torch.as_tensor(np.flatnonzero(~self.alive[engine.rows.start : engine.rows.stop]),
                               device=rows[0].device)
        return [(T, gone, T[gone].clone()) for T in [*rows, *optimizer.rows.values()]]

    def _repair(self, topology: Topology | None):
        """W_t among the living, by the section's ``repair``."""
        if self.cfg.repair == "local":
            return keep_living
        per_round = topology is not None and topology.kind != "static"
        return lambda mixing, alive: repair(mixing, alive, per_round)

    def metrics(self, topology: Topology | None) -> dict:
        """A row's living workers and, on a graph, the components of its living subgraph."""
        return {"workers_alive": int(self.alive.sum()),
                **({"living_components": components(topology, self.alive)} if topology is not None else {})}

    def state_dict(self) -> dict:
        return {"back_at": self.back_at.tolist(), "alive": self.alive.tolist(), "alive_min": self.alive_min}

    def load_state_dict(self, state: dict) -> None:
        self.back_at = np.array(state["back_at"], dtype=np.int64)
        self.alive = np.array(state["alive"], dtype=bool)
        self.alive_min = int(state["alive_min"])


def repair(mixing: Mixing, alive: np.ndarray, per_round: bool) -> Mixing:
    """``repair: metropolis``: W on the living subgraph; a gone worker's row is e_i and no living
    worker reads it.

    A static graph (``per_round`` False), or a round whose W is not symmetric: Metropolis–Hastings
    weights of the induced graph, w_ij = 1/(1 + max(deg_i, deg_j)) on its edges — symmetric,
    doubly stochastic. A symmetric W_t of a graph that changes every round: a missing partner's
    weight goes to the worker itself (a self-loop for the round), w'_ii = 1 − Σ_{j alive} w_ij —
    symmetric, so doubly stochastic too. Either way the mean of the living rows is kept."""
    rows = np.broadcast_to(np.arange(mixing.n), mixing.index.shape)
    used = (mixing.weight != 0) & alive[rows] & alive[mixing.index]
    if per_round and _symmetric(mixing):
        weight = np.where(used, mixing.weight, 0.0)
        weight[0] += 1.0 - weight.sum(0)
        return Mixing(mixing.index, weight)
    import networkx as nx

    graph = nx.Graph()
    graph.add_nodes_from(range(mixing.n))
    graph.add_edges_from(zip(rows[used].tolist(), mixing.index[used].tolist()))
    return metropolis_hastings(graph, mixing.n)


def _symmetric(mixing: Mixing) -> bool:
    return mixing.plan(("symmetric",), lambda: abs(mixing.sparse() - mixing.sparse().T).max() <= 1e-12)


def components(topology: Topology, alive: np.ndarray) -> int:
    """Connected components of the living subgraph of the graph's union over rounds: the groups
    whose models can still reach consensus with each other."""
    from scipy.sparse.csgraph import connected_components

    living = np.flatnonzero(alive)
    return int(connected_components(topology.union.sparse()[living][:, living], directed=False)[0])


def neighbours(topology: Topology | None, i: int, n: int) -> np.ndarray:
    """Worker i's neighbours in any round (the union's slots); every other worker without a graph."""
    if topology is None:
        return np.arange(n)
    u = topology.union
    return np.unique(u.index[(u.weight[:, i] != 0) & (u.index[:, i] != i), i])
