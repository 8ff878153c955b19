"""What a plugin writes against: the registries and the pieces gossamer's own modules are made of.

A plugin (``gossamer train --plugin FILE``, :mod:`gossamer.plugins`) registers entries with the
same decorators the built-ins use, e.g.::

    from gossamer.extend import ALGORITHMS, Schedule

    @ALGORITHMS.register("my-algorithm", options=MyOptions, example=("topology=ring",), help="...")
    def build(cfg, ctx) -> Schedule: ...

- registries (``NAME.register(name, options=..., help=..., example=..., **traits)``, documented
  at :meth:`gossamer.registry.Registry.register`): ALGORITHMS (builder ``(cfg, ctx: Context) ->
  Schedule``; trait ``requires={key: value or (accepted, ...)}`` with ``requires_why``: the values
  it sets of other keys), CODECS (``(param, numels, dtype, seed, contractive) -> Codec``),
  TOPOLOGIES (``(n, param, seed)`` -> a Mixing, a tuple of them, or :class:`RandomRounds`),
  OPTIMIZERS (``(cfg, X, decay) -> RowOptimizer``; with the trait ``matrices=True``,
  ``(cfg, X, decay, matrices)``: the slots of the hidden weight matrices, as Muon takes them),
  MODELS (``(cfg, data) -> nn.Module``), DATASETS (``(cfg) -> Dataset``), OUTER_OPTIMIZERS
  (``(cfg) -> OuterOptimizer``: the outer step of DiLoCo and asynchronous local SGD), ENGINES
  (``(cfg, device) -> Engine``), TASKS (a data set's ``task``: ``() -> Task``), ATTACKS (a
  Byzantine worker's message: ``(s, μ, σ) -> rows``, or as its traits ``noise``, ``graph``,
  ``flips_labels`` say), AGGREGATORS (the honest workers' robust rule: ``(cfg, f, received) ->
  rows``, trait ``families``), LOGGERS (a class ``(folder, resume_step)`` with ``row(row)``,
  ``moved(folder)``, ``close()``); each registry's ``traits`` says the traits its entries may declare;
- the schedule protocol: :class:`Schedule`, :class:`Step`, :class:`StepIO`, :class:`Stepped`,
  :class:`Context`, :class:`Phases`, :func:`synchronous_step`, :func:`shared_rows`; the engine
  its hooks are handed, :class:`Engine`, with :class:`Groups`, :class:`Work` (an operator started
  with ``async_op=True``) and :class:`Gathered` (an all-gather's messages); the local optimizer,
  :class:`RowOptimizer`;
- the gossip graph of an algorithm: :class:`GraphOptions`, :func:`build_graph`, gossip's
  :class:`GossipOptions` and :func:`gossip_state` (the graph gossip's phases share, which
  examples/plugins/lossy_gossip.py replaces); W in neighbour-slot form: :class:`Mixing`,
  :class:`Topology`, :class:`RandomRounds`, :func:`drop_slots`, :func:`keep_living`;
- compression: :class:`Codec`, :class:`Compressor`, :func:`build_compressor`, and a codec's
  per-worker draws :func:`worker_uniforms`;
- random draws from their own named stream: :func:`declare`, :func:`host_stream`, and a row per
  worker of a row stream: :func:`row_uniforms`, :func:`row_normals`;
- :class:`ConfigError` (bad input: one line, exit 2), :data:`REJOIN_MODES` (the ``faults`` trait
  of an algorithm that runs with faults: the rejoin modes, ``("neighbours", "stale")``),
  :class:`Dataset`, :class:`Task`.

docs/extending.md walks through a whole plugin (examples/plugins/lossy_gossip.py) and says which
of these names are stable (semantic versioning) and which provisional.
"""

from .algorithms import ALGORITHMS, Context, Phases, Schedule, Step, StepIO, Stepped
from .algorithms.gossip import GossipOptions, GraphOptions, build_graph, gossip_state
from .algorithms.schedule import shared_rows, synchronous_step
from .byzantine import ATTACKS
from .codecs import CODECS, Codec, Compressor, build_compressor, worker_uniforms
from .data import DATASETS, Dataset
from .engines import ENGINES
from .engines.base import Engine, Gathered, Work
from .faults import REJOIN_MODES
from .groups import Groups
from .loggers import LOGGERS
from .models import MODELS
from .optim import OPTIMIZERS, RowOptimizer
from .outer import OUTER_OPTIMIZERS, OuterOptimizer
from .registry import ConfigError
from .robust import AGGREGATORS
from .rng import declare, host_stream, row_normals, row_uniforms
from .tasks import TASKS, Task
from .topology import TOPOLOGIES, Mixing, RandomRounds, Topology, drop_slots, keep_living

__all__ = ["AGGREGATORS", "ALGORITHMS", "ATTACKS", "CODECS", "Codec", "Compressor", "ConfigError",
           "Context", "DATASETS", "Dataset", "ENGINES", "Engine", "Gathered", "GossipOptions",
           "GraphOptions", "Groups", "LOGGERS", "MODELS", "Mixing", "OPTIMIZERS", "OUTER_OPTIMIZERS",
           "OuterOptimizer", "Phases", "REJOIN_MODES", "RandomRounds", "RowOptimizer", "Schedule", "Step",
           "StepIO", "Stepped", "TASKS", "TOPOLOGIES", "Task", "Topology", "Work", "build_compressor",
           "build_graph", "declare", "drop_slots", "gossip_state", "host_stream", "keep_living",
           "row_normals", "row_uniforms", "shared_rows", "synchronous_step", "worker_uniforms"]
