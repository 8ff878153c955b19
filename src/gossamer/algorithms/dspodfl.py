"""DSpodFL, decentralized sporadic federated learning (Zehtabi, Han, Parasnis, Hosseinalipour,
Brinton 2024): D-SGD where each worker computes only sometimes and each link is used only sometimes.

In step k, worker i computes with probability p (``dspodfl_compute``: v_i ~ Bernoulli(p)) and each
undirected link {i, j} of the topology's W_k is used with probability q (``dspodfl_edge``:
v_ij ~ Bernoulli(q), one coin for both ends), all coins independent:

    x_i ← x_i + Σ_j w_ij v_ij (x_j − x_i) − η v_i g_i(x_i),

the gradient taken at the model before the round, as in the authors' code (ShahryarBQ/DSpodFL
1f1511b: Agent.run_step1 gathers Σ_j r_ij (x_j − x_i) from the iteration's models, run_step2 adds
it and the gradient step at once). An unused link's weight stays with each end (topology.drop_slots):
W'_k is symmetric, so doubly stochastic, when W_k is. A worker that does not compute keeps its
model and its local optimizer's state (it takes no local step) and still mixes along its used
links. p = q = 1 is D-SGD in the mix-then-step form, bit for bit (tests/test_dspodfl.py). Two
departures from the code: the link coins are drawn afresh every step with probability q (the
code's final version, by a misspelt key, never switches a link off again once on; its first
version, 464980e, redraws every iteration), and p and q are one number for all workers and links
(the paper draws each from a Beta law once).

The ledger keeps what happened: the workers that computed (the clock charges only them) and the
round of W'_k (bytes only along used links). A row's ``loss`` is the mean of each worker's latest
training loss (a step may have none that computes; a worker that never computed yet has none);
φ² is over the workers that computed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..faults import REJOIN_MODES
from ..registry import ConfigError
from ..rng import declare, host_stream
from ..topology import Mixing, Topology, drop_slots, require_undirected
from .gossip import GraphOptions, build_graph
from .schedule import ALGORITHMS, Context, Schedule, Step, StepIO, Stepped, shared_rows, synchronous_step

COMPUTES = declare("dspodfl-compute", "DSpodFL's coins of the workers that compute in a step", ("step",))
LINKS = declare("dspodfl-links", "DSpodFL's coins of the links used in a step's round", ("step",))


def links(mixing: Mixing) -> tuple[np.ndarray, np.ndarray]:
    """(the undirected links {i, j}, i < j, of W as i·n + j, sorted; each slot's link or −1). Kept on W."""
    def build():
        n, rows = mixing.n, np.broadcast_to(np.arange(mixing.n), mixing.index.shape)
        used = (mixing.weight != 0) & (mixing.index != rows)
        key = np.where(used, np.minimum(rows, mixing.index) * n + np.maximum(rows, mixing.index), -1)
        return np.unique(key[used]), key
    return mixing.plan(("links",), build)


@dataclass
class DSpodFL(Schedule):
    """DSpodFL (module docstring). State: each worker's latest training loss, and which workers
    have one."""

    topology: Topology
    compute: float  # p
    link: float  # q
    seed: int
    losses: torch.Tensor  # [m]
    shared_state: list[torch.Tensor] = field(default_factory=list)
    computed: np.ndarray = None  # bool [n]: the workers that computed at least once

    def __post_init__(self) -> None:
        self.computed = np.zeros(self.topology.n, dtype=bool)

    def computing(self, t: int) -> np.ndarray | None:
        if self.compute == 1:
            return None
        return host_stream(COMPUTES, self.seed, t).random(self.topology.n) < self.compute

    def round(self, t: int) -> Mixing:
        """W'_t: the topology's W_t with the links whose coin failed dropped."""
        mixing = self.topology.mixing(t)
        if self.link == 1:
            return mixing
        edges, key = links(mixing)
        used = host_stream(LINKS, self.seed, t).random(len(edges)) < self.link
        return drop_slots(mixing, (key >= 0) & ~used[np.searchsorted(edges, np.maximum(key, 0))])

    def on_gradients(self, engine, X: torch.Tensor, G: torch.Tensor, step: Step) -> None:
        mixing = self.round(step.t)  # mixed before the local step, the gradients taken before: g_i(x_i)
        for rows in (*self.shared_state, X):
            engine.gossip_(rows, mixing)

    def step(self, io: StepIO) -> Stepped:
        stepped = synchronous_step(self, io)
        rows = io.local(io.computes)
        if rows is None:
            self.losses.copy_(stepped.losses)
            self.computed[:] = True
        else:
            index = torch.as_tensor(rows, device=self.losses.device)
            self.losses.index_copy_(0, index, stepped.losses.index_select(0, index))
            self.computed |= io.computes
        reported = None if self.computed.all() else np.flatnonzero(self.computed).tolist()
        return stepped._replace(losses=self.losses, computed=reported)

    def state_dict(self) -> dict:
        return {"computed": self.computed.tolist(), "rows": {"losses": self.losses}}

    def load_state_dict(self, state: dict) -> None:
        self.computed = np.array(state["computed"], dtype=bool)
        self.losses.copy_(state["rows"]["losses"])


@dataclass
class DSpodFLOptions(GraphOptions):
    dspodfl_compute: float = 0.5  # p: the probability that a worker computes in a step
    dspodfl_edge: float = 0.5  # q: the probability that a link is used in a step's round

    def validate(self, cfg) -> None:
        super().validate(cfg)
        if not 0 < self.dspodfl_compute <= 1:
            raise ConfigError(f"dspodfl_compute must be a probability in (0, 1], got {self.dspodfl_compute}")
        if not 0 <= self.dspodfl_edge <= 1:
            raise ConfigError(f"dspodfl_edge must be a probability in [0, 1], got {self.dspodfl_edge}")


@ALGORITHMS.register("dspodfl", options=DSpodFLOptions, example=("topology=ring", "dspodfl_compute=0.5",
                                                                 "dspodfl_edge=0.5"), faults=REJOIN_MODES,
                     help="DSpodFL: D-SGD where a worker computes with probability p and a link is used with "
                          "probability q each step (Zehtabi et al. 2024)")
def _dspodfl(cfg, ctx: Context) -> DSpodFL:
    topology = build_graph(cfg)
    if cfg.dspodfl_edge < 1:
        require_undirected(topology, "topology", "dspodfl_edge < 1 (a link used for both ends or for neither)")
    losses = torch.zeros(ctx.X.shape[0], dtype=ctx.X.dtype, device=ctx.X.device)
    return DSpodFL(topology, cfg.dspodfl_compute, cfg.dspodfl_edge, cfg.seed, losses, shared_rows(cfg, ctx))
