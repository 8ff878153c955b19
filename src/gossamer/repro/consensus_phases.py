"""``consensus-phases`` (Kong et al.): which learning-rate phase needs a small consensus distance."""

from __future__ import annotations

from .base import KONG_CIFAR, Suite, Variant, against, cpu_base, register


FREQUENCY_MAX = 16  # the longest gossip period of the frequency-controlled variants


@register("consensus-phases")
def consensus_phases(scale: str, quick: bool) -> Suite:
    """Kong et al.'s phase study: which phase needs a small Ξ (ring, phases = lr phases)."""
    n = 8 if quick else 32
    if scale == "paper":
        suite = Suite(f"consensus-phases (paper scale): CIFAR-10 ResNet-20, ring, n = {n}", [], reference="ring",
                      base_file=KONG_CIFAR)
    else:
        suite = Suite(f"consensus-phases: ring, n = {n}", cpu_base(quick, 4 if quick else 40), reference="ring")
    gossip = ["algorithm=gossip", "topology=ring"]
    suite.variants = [
        Variant("allreduce", ["algorithm=allreduce"], n),
        Variant("ring", gossip, n),
        Variant("dec-phase-1", [*gossip, "phases=[gossip,allreduce,allreduce]"], n),
        Variant("dec-phase-2", [*gossip, "phases=[allreduce,gossip,allreduce]"], n),
        Variant("dec-phase-3", [*gossip, "phases=[allreduce,allreduce,gossip]"], n),
    ]
    for label, c in (("1", 1.0), ("1/2", 0.5), ("1/4", 0.25), ("1/8", 0.125), ("1/16", 0.0625)):
        suite.variants.append(Variant(
            f"ctrl-phase-1 c={label}",
            [*gossip, "phases=[controlled,allreduce,allreduce]", "consensus.target=run:{ref}",
             f"consensus.factor={c}", "consensus.max_extra_rounds=1000"], n))
    for label in ("1", "1/2", "1/4"):  # the same control, deciding from Θ and Ξ ≤ (2/p)Θ alone
        exact = next(v for v in suite.variants if v.name == f"ctrl-phase-1 c={label}")
        suite.variants.append(Variant(f"{exact.name} estimate", [*exact.overrides, "consensus.measure=estimate"], n))
        suite.estimate_pairs.append((exact.name, f"{exact.name} estimate"))
    # control by frequency can only lengthen the gossip period beyond D-SGD's one step: a fraction
    # c < 1 of D-SGD's own distance would keep H = 1, so these follow c × η_t·sqrt(EMA φ²)/p,
    # the on-the-fly reading of "c × φ^ema", which lies above the ring's distance
    suite.variants += [
        Variant(f"dec-phase-1 H={FREQUENCY_MAX}", [*gossip, f"local_steps={FREQUENCY_MAX}",
                                                  "phases=[gossip,allreduce,allreduce]"], n),
        *[Variant(f"freq-phase-1 c={label}", [*gossip, "phases=[controlled,allreduce,allreduce]",
                                              "consensus.target=gradient", f"consensus.factor={c}",
                                              "consensus.action=frequency", f"consensus.max_local_steps={FREQUENCY_MAX}"],
                  n) for label, c in (("1/2", 0.5), ("1/4", 0.25))],
    ]
    suite.variants = against(suite.variants[0], suite.variants[1:])
    return suite
