"""The test cases generated from the registries: every registered algorithm × optimizer, and
every compressing algorithm × codec (with SGD: a codec acts on model changes, which the optimizer
only enters through the local step that the uncompressed cases cover), that the config accepts
together, each run as its entries' ``example`` says, plus the option variants of an algorithm that
its example does not reach (FEATURES). The resume, dist-parity and hot-path tests are parametrized
from here, so a new registration is covered without editing them.
"""

import functools
from pathlib import Path

from gossamer import testing
from gossamer.algorithms import ALGORITHMS
from gossamer.async_processes import served
from gossamer.codecs import CODECS, ERROR_FEEDBACK
from gossamer.config import load_config
from gossamer.optim import OPTIMIZERS
from gossamer.registry import ConfigError

DIRECTED = Path(__file__).resolve().parent / "dist_scripts" / "directed-4.txt"

# a fraction of a second in float64: the MLP (the cheapest model; the CNN and ResNet-20 have their
# own parity and resume tests), 4 workers, 6 steps an epoch, 2 epochs — the conformance kit's run
SHORT = [*testing.SHORT, testing.MNIST1D_SAMPLES]

# option variants beyond the entries' examples: (name, overrides)
FEATURES = {
    "gossip-ring": ["algorithm=gossip", "topology=ring", "eval_local=3"],
    "gossip-controlled-time": ["algorithm=gossip", "topology=ring", "consensus.target=constant", "consensus.value=0.01",
                               "network=ethernet-10g", "compute_ms=1"],
    "gossip-ring-mix-then-step": ["algorithm=gossip", "topology=ring", "gossip_form=mix-then-step", "local_steps=2"],
    "gossip-frequency": ["algorithm=gossip", "topology=one-peer-exponential", "local_steps=2",
                         "phases=[controlled,allreduce,controlled]", "phase_steps=[5,7]", "consensus.target=constant",
                         "consensus.value=0.1", "consensus.action=frequency", "consensus.max_local_steps=6"],
    "gossip-estimate-quasi-global": ["algorithm=gossip", "momentum_mode=quasi-global", "momentum=0.9",
                                     "consensus.target=constant", "consensus.value=0.05",
                                     "consensus.measure=estimate"],
    "gossip-gradient-target": ["algorithm=gossip", "topology=ring", "consensus.target=gradient",
                               "consensus.factor=0.5"],
    "hierarchical-average-optimizer-state": ["algorithm=hierarchical", "block_size=2", "local_steps=1",
                                             "momentum=0.9", "average_optimizer_state=true"],
    "sgp-directed-edges": ["algorithm=sgp", f"topology=edges:{DIRECTED}"],
    "diloco-streaming": ["algorithm=diloco", "local_steps=4", "fragments=2", "fragment_delay=1", "fragment_alpha=0.5",
                         "compression=ef-top-k:0.1+quant:2"],
    "noloco": ["algorithm=diloco", "local_steps=2", "outer_topology=one-peer-exponential", "outer_gamma=0.5"],
    # the outer all-reduce in flight through the next round: eager over a codec, delayed over fragments
    "diloco-eager": ["algorithm=diloco", "local_steps=2", "outer_overlap=eager", "compression=ef-top-k:0.1"],
    "diloco-delayed-streaming": ["algorithm=diloco", "local_steps=4", "fragments=2", "fragment_alpha=0.5",
                                 "outer_overlap=delayed"],
    # SparseLoCo as Templar runs it: 2-D blocks, 12-bit indices, 2-bit values, the clipped mean over senders
    "sparseloco": ["algorithm=diloco", "local_steps=2", "compression=ef-sparseloco:4@8", "ef_decay=0.95",
                   "outer_lr=1", "outer_momentum=0"],
    "gossip-stragglers": ["algorithm=gossip", "topology=ring", "network=ethernet-10g", "compute_ms=1",
                          "slow_workers=0.25@3", "compute_jitter=lognormal:0.5"],
    # a parameter server on uneven clocks: Delayed Nesterov, DyLU, a grace window, staleness weights; and the
    # vanilla rule with Adam, the inner state reset at each pull, the outer lr and momentum scheduled
    "async-local-sgd-stragglers": ["algorithm=async-local-sgd", "local_steps=3", "network=ethernet-10g", "compute_ms=1",
                                   "slow_workers=0.25@3", "compute_jitter=lognormal:0.5", "dylu=true",
                                   "grace_window=0.0005", "async_weight=polynomial", "outer_spread=0.2"],
    "async-local-sgd-adam-reset": ["algorithm=async-local-sgd", "local_steps=2", "outer_optimizer=adam", "outer_lr=0.05",
                                   "inner_state=reset", "optimizer=adamw", "outer_lr_warmup=3", "outer_lr_decay=cosine",
                                   "outer_momentum_warmup=2"],
    "diloco-outer-schedule": ["algorithm=diloco", "local_steps=2", "outer_optimizer=sgd", "outer_lr_warmup=2",
                              "outer_momentum_decay=linear", "fragments=2"],
    "ad-psgd-stragglers": ["algorithm=ad-psgd", "network=ethernet-10g", "compute_ms=1", "slow_workers=0.25@3",
                           "compute_jitter=lognormal:0.5", "weight_decay=0.01"],
    "gossip-faults": ["algorithm=gossip", "topology=ring", "momentum=0.9", "faults.events=[1@2-7]", "faults.churn=0.1",
                      "faults.downtime=2"],
    "hierarchical-faults": ["algorithm=hierarchical", "block_size=2", "local_steps=2", "momentum=0.9",
                            "faults.events=[0@1-5,3@4-]"],
    "diloco-faults-stale": ["algorithm=diloco", "local_steps=2", "faults.churn=0.15", "faults.downtime=2",
                            "faults.rejoin=stale"],
    # a random partition into pairs every round (group means that are not blocks), a worker gone and back
    "gossip-groups-faults": ["algorithm=gossip", "topology=groups:2", "faults.events=[2@3-8]"],
    # workers that lie: each attack and each aggregator at least once, in both families (the dist
    # parity launch and the resume tests take every FEATURE)
    "byzantine-allreduce-alie-trimmed-mean": ["algorithm=allreduce", "byzantine.workers=[1]", "byzantine.attack=alie",
                                              "byzantine.aggregator=trimmed-mean"],
    "byzantine-local-sign-flip-centered-clip": ["algorithm=local", "local_steps=2", "momentum=0.9",
                                                "average_optimizer_state=true", "byzantine.fraction=0.25",
                                                "byzantine.attack=sign-flip", "byzantine.aggregator=centered-clip",
                                                "byzantine.clip=0.05", "byzantine.clip_iterations=2"],
    "byzantine-hierarchical-gaussian-median": ["algorithm=hierarchical", "workers=8", "block_size=4", "block_rounds=2",
                                               "local_steps=2", "byzantine.workers=[0,5]", "byzantine.attack=gaussian",
                                               "byzantine.aggregator=median"],
    "byzantine-diloco-ipm-krum": ["algorithm=diloco", "local_steps=2", "workers=6", "byzantine.workers=[4]",
                                  "byzantine.attack=ipm", "byzantine.aggregator=krum"],
    "byzantine-post-local-label-flip-multi-krum": ["algorithm=post-local", "switch_step=5", "local_steps=2",
                                                   "workers=6", "byzantine.workers=[2]",
                                                   "byzantine.attack=label-flip", "byzantine.aggregator=multi-krum"],
    "byzantine-gossip-dissensus-clipped-gossip": ["algorithm=gossip", "topology=ring", "byzantine.workers=[1]",
                                                  "byzantine.attack=dissensus", "byzantine.strength=1.5",
                                                  "byzantine.aggregator=clipped-gossip", "byzantine.clip=0.05"],
    "byzantine-gossip-alie-self-centered-clip": ["algorithm=gossip", "topology=exponential", "workers=8",
                                                 "byzantine.workers=[2,5]", "byzantine.attack=alie",
                                                 "byzantine.aggregator=self-centered-clip"],
    "byzantine-gossip-gaussian-trimmed-mean": ["algorithm=gossip", "topology=random-matching",
                                               "byzantine.fraction=0.25", "byzantine.attack=gaussian",
                                               "byzantine.strength=0.1", "byzantine.aggregator=trimmed-mean"],
    "byzantine-gossip-clean-reference": ["algorithm=gossip", "topology=ring", "byzantine.workers=[1]",
                                         "byzantine.attack=ipm", "byzantine.clean_reference=true"],
    "simulated-time": ["algorithm=hierarchical", "block_size=2", "local_steps=2", "network=ethernet-1g",
                       "network.workers_per_node=2", "compute_ms=2", "target_accuracy=0.15"],
}


# the hooks on real processes (DDP's comm hook, a DistEngine's messages): (overrides of `gossamer
# train` on launch.SMALL, the synchroniser doing the same); run in the one 4-process launch
HOOK_PROCESS_CASES = {
    "post-local-ddp": (["algorithm=post-local", "switch_step=6", "local_steps=2"],
                       {"kind": "LocalSGD", "kwargs": {"local_steps": 2, "switch_step": 6}, "ddp": True}),
    "gossip-ring-processes": (["algorithm=gossip", "topology=ring"], {"kind": "Gossip", "kwargs": {"topology": "ring"}}),
    "gossip-phases-ddp": (["algorithm=gossip", "topology=one-peer-exponential", "phases=[allreduce,gossip]",
                           "phase_epochs=[0.5]"],
                          {"kind": "Gossip", "kwargs": {"topology": "one-peer-exponential",
                                                        "phases": ["allreduce", "gossip"], "phase_steps": [6]},
                           "ddp": True}),
    "diloco-delayed-processes": (["algorithm=diloco", "local_steps=3", "outer_overlap=delayed"],
                                 {"kind": "DiLoCo", "kwargs": {"local_steps": 3, "outer_overlap": "delayed"}}),
}


def _spec(entry) -> str:
    return f"{entry.name}:{entry.example[0]}" if entry.takes == "required" else entry.name


CHAIN = "top-k:0.1+quant:2"  # a sparsifier whose kept values are quantised (SparseLoCo's codec)


def codecs() -> list[str]:
    """``none``, every registered codec with its example parameter and the CHAIN, and each with
    error feedback."""
    plain = [*(_spec(e) for e in CODECS.entries.values()), CHAIN]
    return ["none", *plain, *(ERROR_FEEDBACK + c for c in plain)]


def _valid(overrides: list[str]) -> bool:
    return _accepted(tuple(overrides))


@functools.cache
def _accepted(overrides: tuple[str, ...]) -> bool:
    try:
        load_config(None, [*SHORT, *overrides])
    except ConfigError:
        return False
    return True


def combinations(optimizers: bool = True) -> dict[str, list[str]]:
    """{name: overrides} for every algorithm × optimizer (or SGD alone) and every compressing
    algorithm × codec with SGD, that the config accepts together (a new dict each call; the config
    checks behind it are made once a session)."""
    return {name: list(o) for name, o in _combinations(optimizers).items()}


@functools.cache
def _combinations(optimizers: bool) -> dict[str, list[str]]:
    cases = {}
    for algorithm in ALGORITHMS.entries.values():
        compresses = "compression" in algorithm.keys
        required = algorithm.traits.get("requires", {})  # what the algorithm sets (DeMo's momentum 0)
        default = required.get("optimizer", "sgd")  # des-loc: adam
        default = default[0] if isinstance(default, tuple) else default
        for codec in codecs() if compresses else ["none"]:
            for optimizer in OPTIMIZERS.entries.values() if optimizers and codec == "none" else [OPTIMIZERS[default]]:
                overrides = [f"algorithm={algorithm.name}",
                             *([f"compression={codec}"] if codec != "none" else []),
                             f"optimizer={optimizer.name}",
                             *(o for o in optimizer.example if o.partition("=")[0] not in required), *algorithm.example]
                if _valid(overrides):
                    cases["-".join([algorithm.name, codec, optimizer.name])] = overrides
    return cases


def all_cases(optimizers: bool = True) -> dict[str, list[str]]:
    """The registry combinations and the FEATURES."""
    return {**combinations(optimizers), **FEATURES}


def covering(optimizers: bool = True) -> dict[str, list[str]]:
    """Every algorithm × optimizer uncompressed, and every codec once, each with the next
    compressing algorithm in turn that takes it: a codec's state (residuals, references) and draws
    are the same whichever algorithm sends it, so the tests that cost a run per case take this
    instead of the whole product (the snapshot and the dist launches take their own)."""
    cases = combinations(optimizers)
    chosen = {name: o for name, o in cases.items() if name.split("-none-")[0] in ALGORITHMS}
    compressing = [e.name for e in ALGORITHMS.entries.values() if "compression" in e.keys]
    turn = 0
    for codec in codecs()[1:]:
        for k in range(len(compressing)):
            name = f"{compressing[(turn + k) % len(compressing)]}-{codec}-sgd"
            if name in cases:
                chosen[name], turn = cases[name], (turn + k + 1) % len(compressing)
                break
    return chosen


def representatives(first_codec: int = 0, features: tuple[str, ...] = ("gossip-ring", "gossip-frequency",
                                                                       "simulated-time")) -> dict[str, list[str]]:
    """A subset for costly engines: each algorithm once with SGD (or the optimizer it requires) —
    compressed where it compresses, the codecs taken in turn across algorithms from the
    ``first_codec``-th — and the named FEATURES."""
    chosen, compressed = {}, [c for c in codecs() if c != "none"]
    turn = first_codec % len(compressed)
    cases = combinations(optimizers=False)
    for algorithm in ALGORITHMS.names():
        for codec in [*compressed[turn:], *compressed[:turn], "none"]:
            name = next((k for k in cases if k.startswith(f"{algorithm}-{codec}-")), None)
            if name is not None:
                chosen[name] = cases[name]
                turn = (compressed.index(codec) + 1) % len(compressed) if codec != "none" else turn
                break
    return {**chosen, **{name: FEATURES[name] for name in features}}


# the topologies that change every round (a fresh W_t drawn from (topology_seed, t) on every
# process, and a finite-time sequence whose union CHOCO copies), in the 4-process launch only:
# 8 workers, 2 a process, so pairs fall within and across processes
ROUND_TOPOLOGY_CASES = {"gossip-random-matching": ["algorithm=gossip", "topology=random-matching", "workers=8"],
                        "choco-base-1": ["algorithm=choco", "topology=base:1", "workers=12", "batch_size=16",
                                         "choco_gamma=0.5", "compression=top-k:0.1"]}


# the dist engine's parity launches, compared with engine=sim, each a representative subset of the
# cases engine dist runs (every algorithm but the simulator's own, the codecs in turn): on 2
# processes (2 workers each) from the middle of the codec list and with every FEATURE, on 4 (one
# worker each) from its start
def on_dist(cases: dict[str, list[str]]) -> dict[str, list[str]]:
    """The cases engine dist runs in its lock-step loop (ad-psgd is the simulator's only; a server
    algorithm, async-local-sgd, runs its own processes: tests/test_async_processes.py)."""
    return {name: o for name, o in cases.items() if _valid([*o, "engine=dist"]) and not _served(o)}


def _served(overrides: list[str]) -> bool:
    return served(load_config(None, [*SHORT, *overrides, "engine=dist"]))


# on 4 processes, the algorithms whose traffic changes when every neighbour, group or block member
# is in another process (the all-reduce family, SPARTA's and DeMo's collectives are the same calls
# on 2): gossip, peers, blocks across processes, grid lines, dropped links, DiLoCo
ONE_PER_PROCESS = ("allreduce", "gossip", "choco", "sgp", "gradient-tracking", "hierarchical", "diloco", "moshpit",
                   "dspodfl")
def byzantine_pairs() -> dict[str, list[str]]:
    """Each attack against the plain mean (its rows crafted from the engine's reads of the honest
    moments, or its noise drawn per row) and each robust aggregator against one attack, in turn:
    local SGD (the all-reduce family) and gossip on a ring, 6 workers, worker 3 Byzantine (the
    2-process launch holds it in its second process). Every pair runs in the simulator
    (tests/test_byzantine.py); the pairs meet on processes only through these paths."""
    from gossamer.byzantine import aggregators, attacks
    from gossamer.robust import AGGREGATORS

    families = {"local": (["algorithm=local", "local_steps=2"], "allreduce"),
                "gossip": (["algorithm=gossip", "topology=ring"], "gossip")}
    cases = {}
    for family, (algorithm, model) in families.items():
        threats, robust = attacks(model), [rule for rule in aggregators(model) if rule != "mean"]
        pairs = [(attack, "mean") for attack in threats] + [(threats[k % len(threats)], rule)
                                                           for k, rule in enumerate(robust)]
        for attack, rule in pairs:
            clip = ["byzantine.clip=0.1"] if "clip" in AGGREGATORS[rule].traits.get("keys", ()) else []
            cases[f"byzantine-pair-{family}-{attack}-{rule}"] = [
                *algorithm, "workers=6", "byzantine.workers=[3]", f"byzantine.attack={attack}",
                f"byzantine.aggregator={rule}", *clip]
    return cases


# groups that are not blocks, each spanning processes unevenly or one member a process: on 4 and
# 3 processes (the wire check: each group's all-reduce among the processes holding members)
GROUP_CASES = {4: {"groups-4-of-16": ["algorithm=gossip", "topology=groups:4", "workers=16", "batch_size=8"],
                   "moshpit-4x4": ["algorithm=moshpit", "moshpit_group=4", "workers=16", "batch_size=8",
                                   "local_steps=1"]},
               3: {"moshpit-3x3": ["algorithm=moshpit", "moshpit_group=3", "workers=9", "batch_size=16",
                                   "local_steps=1", "faults.events=[4@2-6]"],
                   "groups-3-of-9": ["algorithm=gossip", "topology=groups:3", "workers=9", "batch_size=16",
                                     "faults.events=[1@2-7]", "faults.rejoin=stale"]}}
DIST_CASES = {2: {**on_dist(representatives(first_codec=len(codecs()) // 2, features=tuple(FEATURES))),
                  **byzantine_pairs()},
              3: GROUP_CASES[3],
              4: {**{name: o for name, o in on_dist(representatives(features=(
                  "gossip-ring", "gossip-frequency", "simulated-time", "hierarchical-faults"))).items()
                  if name in FEATURES or name.rsplit("-", 2)[0] in ONE_PER_PROCESS}, **ROUND_TOPOLOGY_CASES,
                  **GROUP_CASES[4]}}
# CIFAR's per-worker augmentation and ResNet-20's BatchNorm statistics (rows of B), each process
# holding its block of workers; x̄ evaluated with statistics recomputed on every process alike
CIFAR_CASE = "cifar-resnet20-gossip"
ACCEPTANCE = ["workers=4", "epochs=1", "num_samples=1000", "algorithm=gossip", "grad_backend=loop"]  # float32
