"""Communication schedules, one module per family; each algorithm's class, options, builder and
docstring sit together there, registered in :data:`ALGORITHMS` under the one name that the
config, the summary and the hooks use.

- :mod:`.schedule`: the :class:`Schedule` protocol, :class:`Step`, :class:`Context`,
  :class:`Phases` (sub-schedules switched at steps) and :func:`begin_step` (the loop's and the
  hooks' gradient stage);
- :mod:`.local`: ``allreduce``, ``local``, ``post-local``, ``hierarchical`` (Lin et al.);
- :mod:`.gossip`: ``gossip`` — D-SGD by phase, consensus control, quasi-global momentum (Kong et al.);
- :mod:`.peer`: ``choco``, ``sgp``, ``gradient-tracking``;
- :mod:`.diloco`: ``diloco`` (compressed, streaming, NoLoCo's outer topology, overlapped outer steps);
- :mod:`.sparta`: ``sparta``;
- :mod:`.demo`: ``decoupled-momentum`` (DeMo);
- :mod:`.asynchronous`: ``ad-psgd`` (Lian et al.), event-driven on the per-worker clocks;
- :mod:`.async_local`: ``async-local-sgd`` (Liu et al.), a parameter server on the same clocks;
- :mod:`.moshpit`: ``moshpit`` (Ryabinin et al.), exact means within the lines of a grid;
- :mod:`.dspodfl`: ``dspodfl`` (Zehtabi et al.), sporadic computation and sporadic links.
"""

# each module registers its algorithms
from . import async_local, asynchronous, demo, diloco, dspodfl, gossip, local, moshpit, peer, sparta  # noqa: F401
from .schedule import (ALGORITHMS, Context, Phases, Schedule, Step, StepIO, Stepped, begin_step, build_schedule,
                       graph_of)

__all__ = ["ALGORITHMS", "Context", "Phases", "Schedule", "Step", "StepIO", "Stepped", "begin_step", "build_schedule",
           "graph_of"]
