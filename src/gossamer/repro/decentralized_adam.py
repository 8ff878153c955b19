"""``decentralized-adam`` (Kong et al.): decentralized Adam on the character Transformer."""

from __future__ import annotations

from .base import Suite, Variant, against, register


@register("decentralized-adam")
def decentralized_adam(scale: str, quick: bool) -> Suite:
    """Kong et al.: decentralized Adam with local moments vs All-Reduce Adam, and gossip with the
    moments averaged (mixed with the parameters), on the character Transformer."""
    n = 4 if quick else 16
    if scale == "paper":
        suite = Suite(f"decentralized-adam (paper scale, stand-in workload): char Transformer, ring, n = {n}", [],
                      base_file="kong2021-decentralized-adam.yaml")
    else:
        epochs = 2 if quick else 16
        # the offline pydoc-topics text (≈ 419 K training characters), windows of 64 characters;
        # Adam with a warm-up and ×0.1 at 50 % and 75 % of training, as the SGD suites
        size = ["text_chars=12000", "context=32", "width=32"] if quick else ["context=64", "width=64"]
        suite = Suite(f"decentralized-adam: char Transformer, Adam, ring, n = {n}",
                      ["dataset=text", "model=transformer", *size, "layers=2", "heads=4", "batch_size=16",
                       f"epochs={epochs}", f"milestones=[{epochs / 2},{epochs * 3 / 4}]", "optimizer=adam",
                       "lr=0.001", f"warmup_epochs={0 if quick else 1}", f"eval_every={1 if quick else 4}"])
    gossip = ["algorithm=gossip", "topology=ring"]
    suite.variants = against(Variant("allreduce adam", ["algorithm=allreduce"], n), [
        Variant("ring adam, local moments", gossip, n),
        Variant("ring adam, moments averaged", [*gossip, "average_optimizer_state=true"], n),
    ])
    return suite
