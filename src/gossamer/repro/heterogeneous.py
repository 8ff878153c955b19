"""``heterogeneous``: non-i.i.d. data on a ring, D-SGD and the methods meant for it."""

from __future__ import annotations

from .base import KONG_CIFAR, Suite, Variant, against, cpu_base, register


CHOCO_GAMMA = 0.05  # CHOCO's consensus step for top-1 % in the heterogeneous suite (a sweep: docs/results.md)


@register("heterogeneous")
def heterogeneous(scale: str, quick: bool) -> Suite:
    """Non-i.i.d. data on a ring: Dirichlet α = 0.1 and 1 and i.i.d. shards; D-SGD, D-SGD with
    quasi-global momentum, gradient tracking, CHOCO-SGD with top-1 % compression, All-Reduce."""
    n = 4 if quick else 16
    if scale == "paper":
        suite = Suite(f"heterogeneous (paper scale): CIFAR-10 ResNet-20, ring, n = {n}, Dirichlet α", [],
                      base_file=KONG_CIFAR)
    else:
        suite = Suite(f"heterogeneous: ring, n = {n}, Dirichlet α", cpu_base(quick, 2 if quick else 20))
    ring = ["topology=ring"]
    algorithms = [("All-Reduce", ["algorithm=allreduce"]),
                  ("D-SGD", ["algorithm=gossip", *ring]),
                  ("D-SGD + QG momentum", ["algorithm=gossip", *ring, "momentum_mode=quasi-global"]),
                  ("gradient tracking", ["algorithm=gradient-tracking", *ring]),
                  ("CHOCO top-1%", ["algorithm=choco", *ring, "compression=top-k:0.01", f"choco_gamma={CHOCO_GAMMA}"])]
    for label, partition in (("α=0.1", ["partition=dirichlet", "dirichlet_alpha=0.1"]),
                             ("α=1", ["partition=dirichlet", "dirichlet_alpha=1"]),
                             ("iid", ["partition=iid"])):
        runs = [Variant(f"{name} {label}", [*overrides, *partition], n) for name, overrides in algorithms]
        suite.variants += against(runs[0], runs[1:])
    return suite
