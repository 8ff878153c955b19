"""What a plugin writes against: the registries and the pieces gossamer's own modules are made of.

A plugin (``gossamer train --plugin FILE``, :mod:`gossamer.plugins`) registers entries with the
same decorators the built-ins use, e.g.::

    from gossamer.extend import ALGORITHMS, Schedule

    @ALGORITHMS.register("my-algorithm", options=MyOptions, example=("topology=ring",), help="...")
    def build(cfg, ctx) -> Schedule: ...

- registries (``NAME.register(name, options=..., help=..., example=..., **traits)``): ALGORITHMS
  (builder ``(cfg, ctx: Context) -> Schedule``; trait ``requires={key: value or (accepted, ...)}``
  with ``requires_why``: the values it sets of other keys), CODECS, TOPOLOGIES, OPTIMIZERS
  (``(cfg, X, decay)``; with the trait ``matrices=True``, ``(cfg, X, decay, matrices)``: the slots
  of the hidden weight matrices, as Muon takes them), MODELS (``(cfg, data) -> nn.Module``),
  DATASETS (``(cfg) -> Dataset``), OUTER_OPTIMIZERS (``(cfg) -> OuterOptimizer``: the outer step of
  DiLoCo and asynchronous local SGD, e.g. a staleness-aware rule; :class:`OuterOptimizer`);
- the schedule protocol: :class:`Schedule`, :class:`Step`, :class:`StepIO`, :class:`Stepped`,
  :class:`Context`, :func:`synchronous_step`, :func:`shared_rows`; the gossip graph of an
  algorithm: :class:`GraphOptions`, :func:`build_graph`, :func:`gossip_state`;
- W in neighbour-slot form: :class:`Mixing`, :class:`Topology`, :func:`drop_slots`;
- random draws from their own named stream: :func:`declare`, :func:`host_stream`, and a row per
  worker of a row stream: :func:`row_uniforms`, :func:`row_normals`;
- :class:`ConfigError` (bad input: one line, exit 2), :data:`REJOIN_MODES` (the ``faults`` trait
  of an algorithm that runs with faults), :class:`Dataset`.

docs/extending.md walks through a whole plugin (examples/plugins/lossy_gossip.py).
"""

from .algorithms import ALGORITHMS, Context, Schedule, Step, StepIO, Stepped
from .algorithms.gossip import GossipOptions, GraphOptions, build_graph, gossip_state
from .algorithms.schedule import shared_rows, synchronous_step
from .codecs import CODECS
from .data import DATASETS, Dataset
from .faults import REJOIN_MODES
from .models import MODELS
from .optim import OPTIMIZERS
from .outer import OUTER_OPTIMIZERS, OuterOptimizer
from .registry import ConfigError
from .rng import declare, host_stream, row_normals, row_uniforms
from .topology import TOPOLOGIES, Mixing, Topology, drop_slots

__all__ = ["ALGORITHMS", "CODECS", "ConfigError", "Context", "DATASETS", "Dataset", "GossipOptions", "GraphOptions",
           "MODELS", "Mixing", "OPTIMIZERS", "OUTER_OPTIMIZERS", "OuterOptimizer", "REJOIN_MODES", "Schedule", "Step", "StepIO", "Stepped", "TOPOLOGIES",
           "Topology", "build_graph", "declare", "drop_slots", "gossip_state", "host_stream", "row_normals",
           "row_uniforms", "shared_rows", "synchronous_step"]
