"""``local-sgd`` (Lin et al.): generalization of local and post-local SGD at equal global batch."""

from __future__ import annotations

from .base import Suite, Variant, against, cpu_base, register


@register("local-sgd")
def local_sgd(scale: str, quick: bool) -> Suite:
    """Lin et al.'s generalization study at equal global batch n·B: small-batch SGD (one worker,
    batch B), large-batch SGD (All-Reduce, n workers), local SGD and post-local SGD (switch at
    the first decay) with H = 4 and 16, hierarchical local SGD; test accuracy, sharpness of x̄
    (the top Hessian eigenvalue of the training loss) and communication rounds."""
    n = 4 if quick else 16
    if scale == "paper":
        suite = Suite(f"local-sgd (paper scale): CIFAR-10 ResNet-20, equal global batch n·B, n = {n}",
                      ["sharpness=true"], base_file="lin2020-cifar10-resnet20-minibatch.yaml")
    else:
        sharpness = ["sharpness=true", *(["sharpness_samples=100", "sharpness_iterations=5"] if quick else [])]
        suite = Suite(f"local-sgd: equal global batch n·B, n = {n}",
                      [*cpu_base(quick, 4 if quick else 40), *sharpness])
    block = 2 if quick else 4
    # the small batch at n = 1 is a baseline of its own (tuned at its n); the rest are compared with the large batch
    suite.variants = [Variant("small-batch (1 worker)", ["algorithm=allreduce"], 1), *against(
        Variant(f"large-batch (All-Reduce, n={n})", ["algorithm=allreduce"], n), [
            *[Variant(f"local H={h}", ["algorithm=local", f"local_steps={h}"], n) for h in (4, 16)],
            *[Variant(f"post-local H={h}", ["algorithm=post-local", f"local_steps={h}"], n) for h in (4, 16)],
            Variant(f"hierarchical H=4, H_b=4, blocks of {block}",
                    ["algorithm=hierarchical", "local_steps=4", "block_rounds=4", f"block_size={block}"], n)])]
    return suite
