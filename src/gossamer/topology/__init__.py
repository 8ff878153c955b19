"""Gossip mixing matrices W_t (n x n), static and time-varying, undirected and directed.

A gossip round maps worker models X (one row per worker) to W_t X:
    x_i <- sum_j W_t[i, j] x_j,
where W_t[i, j] is the weight worker i gives to worker j's model. Every W_t is
nonnegative with columns summing to 1 (worker j sends out all its mass). Undirected
topologies are doubly stochastic (rows sum to 1 too), so the average x_bar is preserved
and plain gossip converges to it. Directed ones (``directed-exponential`` is doubly
stochastic anyway; ``edges:FILE`` with ``i -> j`` lines need not be) are only
column-stochastic: plain gossip would not converge to the average, push-sum
(``algorithm: sgp``) does; their graph over one period must be strongly connected.

Random topologies draw a fresh W_t every round from (topology seed, t) alone (``RandomRounds``,
``round_generator``); they, EquiTopo's static graph and the finite-time Base-(K+1) graph live in
:mod:`.dynamic`. Beside the spectral gap, :func:`analyse` reports the expected contraction
E‖W_t − J‖² and Vogels et al.'s effective number of neighbours (docs/topologies.md).

The modules, each importing only those above it:

- :mod:`.mixing`: a matrix W in neighbour-slot form (:class:`Mixing`), what a random topology's
  builder returns (:class:`RandomRounds`), the registry :data:`TOPOLOGIES`, :class:`TopologyError`
  and the helpers the builders share;
- :mod:`.static`: the static and periodic graphs (complete, ring, torus, the exponential graphs,
  random-regular, erdos-renyi, ``edges:FILE``);
- :mod:`.dynamic`: the topologies that change every round (random-matching, epidemic, equidyn,
  groups), EquiTopo's equistatic and the finite-time Base-(K+1) graph;
- :mod:`.build`: :class:`Topology`, :func:`build_topology` (every round checked), the memory it
  takes (:func:`graph_bytes`), and what algorithms and engines do to a round (:func:`drop_slots`,
  :func:`keep_living`, :func:`require_undirected`);
- :mod:`.analysis`: the spectral gap, the expected contraction, the effective number of
  neighbours, :func:`analyse`.

This package imports :mod:`.static` and :mod:`.dynamic`, which register their builders, so
``gossamer.topology.TOPOLOGIES`` holds every built-in topology.

Pure numpy + networkx (+ scipy for sparse spectra and strong connectivity); no torch.
"""

# each registers its topologies; static first: the registry lists the built-ins (help, choices) in this order
from . import static, dynamic  # noqa: F401,I001
from .analysis import DECAY, analyse, effective_neighbours, expected_contraction, spectral_gap
from .build import (SAMPLE_ROUNDS, Topology, build_topology, drop_slots, free_memory, graph_bytes, keep_living,
                    require_undirected, round_generator)
from .mixing import TOPOLOGIES, Mixing, RandomRounds, TopologyError, circulant, from_rows, identity
from .static import metropolis_hastings

__all__ = ["DECAY", "Mixing", "RandomRounds", "SAMPLE_ROUNDS", "TOPOLOGIES", "Topology", "TopologyError", "analyse",
           "build_topology", "circulant", "drop_slots", "effective_neighbours", "expected_contraction", "free_memory",
           "from_rows", "graph_bytes", "identity", "keep_living", "metropolis_hastings", "require_undirected",
           "round_generator", "spectral_gap"]
