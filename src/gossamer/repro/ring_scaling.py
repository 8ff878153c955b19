"""``ring-scaling`` (Kong et al.): All-Reduce vs the ring vs the one-peer exponential graph as n grows."""

from __future__ import annotations

from .base import KONG_CIFAR, Suite, Variant, against, cpu_base, register


@register("ring-scaling")
def ring_scaling(scale: str, quick: bool) -> Suite:
    """All-Reduce vs ring vs one-peer exponential graph as n grows (Kong et al.: the gap grows with n)."""
    sizes = (4, 8) if quick else (16, 32, 64)  # quick: 1000 samples leave 100 per worker at n = 8
    if scale == "paper":
        suite = Suite("ring-scaling (paper scale): CIFAR-10 ResNet-20, test accuracy and Ξ² as n grows", [],
                      base_file=KONG_CIFAR)
    else:
        suite = Suite("ring-scaling: test accuracy and Ξ² as n grows", cpu_base(quick, 4 if quick else 40))
    for n in sizes:
        suite.variants += against(Variant(f"allreduce n={n}", ["algorithm=allreduce"], n), [
            Variant(f"ring n={n}", ["algorithm=gossip", "topology=ring"], n),
            Variant(f"one-peer-exp n={n}", ["algorithm=gossip", "topology=one-peer-exponential"], n),
        ])
    return suite
