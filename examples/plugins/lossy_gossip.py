"""lossy-gossip: D-SGD over links that lose messages — a gossamer plugin.

    gossamer train --plugin examples/plugins/lossy_gossip.py --set algorithm=lossy-gossip --set drop_rate=0.3

Each round r, every message of W_r (worker j's model to a worker i that reads it, i ≠ j) is lost
independently with probability ``drop_rate``. The receiver keeps a lost message's weight on itself:
w'_ii = w_ii + Σ_{j lost} w_ij, w'_ij = 0, so x_i stays a convex combination (each row of W'_r sums
to 1) but the columns need not: the workers' mean x̄ moves in a round where a message is lost. In
expectation nothing is lost — E[w'_ij] = (1 − p) w_ij off the diagonal, and for a symmetric W the
columns of E[W'_r] sum to (1 − p)(1 − w_jj) + w_jj + p (1 − w_jj) = 1 — so x̄ is kept on average,
not round by round. A lost message is priced as never sent (the traffic ledger records the round
of W'_r: bytes only along the links that delivered). ``drop_rate: 0`` is ``algorithm: gossip`` bit
for bit: the same schedule, with W'_r = W_r.

Everything else is gossip's: its options (topology, local_steps, phases, consensus control) and
its schedule; the plugin replaces the graph the schedule reads by one whose round r is W'_r.
"""

from dataclasses import dataclass, replace

from gossamer.extend import (ALGORITHMS, REJOIN_MODES, ConfigError, GossipOptions, Topology, declare, drop_slots,
                             gossip_state, host_stream)

LOST = declare("lossy-gossip", "the messages lossy-gossip's links lose in a round", ("round",))


@dataclass
class LossyOptions(GossipOptions):
    drop_rate: float = 0.1  # p: the probability that a message is lost

    def validate(self, cfg) -> None:
        super().validate(cfg)
        if not 0 <= self.drop_rate < 1:
            raise ConfigError(f"drop_rate must be a probability in [0, 1), got {self.drop_rate}")


def lossy(topology: Topology, drop_rate: float, seed: int) -> Topology:
    """The graph whose round r is W_r without the messages lost in round r (drawn from the LOST
    stream: one coin per neighbour slot of every worker)."""
    if drop_rate == 0:
        return topology

    def round_r(r: int):
        mixing = topology.mixing(r)
        lost = host_stream(LOST, seed, r).random(mixing.index.shape) < drop_rate
        return drop_slots(mixing, lost & (mixing.weight != 0))
    return replace(topology, mixings=tuple(round_r(r) for r in range(topology.period)), draw=round_r)


@ALGORITHMS.register("lossy-gossip", options=LossyOptions, example=("topology=ring", "drop_rate=0.3"),
                     faults=REJOIN_MODES, help="D-SGD whose messages are lost with probability drop_rate "
                                               "(the receiver keeps their weight); a plugin")
def build(cfg, ctx):
    schedule = ALGORITHMS["gossip"].build(cfg, ctx)
    state = gossip_state(schedule)
    state.topology = lossy(state.topology, cfg.drop_rate, cfg.seed)
    return schedule
