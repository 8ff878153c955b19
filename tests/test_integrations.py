"""gossamer.integrations: the step hooks in a plain PyTorch loop, one model per worker, give the
parameters of ``gossamer train`` with the simulator on the same config, resume exactly, and refuse
bad input in one line. The hooks' logic runs in 4 threads of this process over a ThreadedSim
engine (tests/dist_scripts/hooks.py's loop); the wiring that needs real processes — DDP, process
groups, the DistEngine's messages — in one launch of 4 gloo processes (marked slow)."""

import json
import random
import sys
from pathlib import Path

import pytest
import torch
from cases import FEATURES, HOOK_PROCESS_CASES, SHORT, combinations, covering, representatives
from launch import SMALL

from conftest import SCRIPTS
from gossamer.config import load_config
from gossamer.engines.threads import ThreadedSim
from gossamer.testing import PROCS, hook_of, in_threads

sys.path.insert(0, str(SCRIPTS))
import hooks  # noqa: E402  (the loop of tests/dist_scripts/hooks.py)


PARITY_CASES = [
    ("local", ["algorithm=local", "local_steps=3"], {"kind": "LocalSGD", "kwargs": {"local_steps": 3}}),
    ("post-local", ["algorithm=post-local", "switch_step=6", "local_steps=2"],
     {"kind": "LocalSGD", "kwargs": {"local_steps": 2, "switch_step": 6}}),
    ("hierarchical", ["algorithm=hierarchical", "block_size=2", "block_rounds=2", "local_steps=2"],
     {"kind": "LocalSGD", "kwargs": {"local_steps": 2, "block_size": 2, "block_rounds": 2}}),
    ("local-ef-sign", ["algorithm=local", "local_steps=2", "compression=ef-sign"],
     {"kind": "LocalSGD", "kwargs": {"local_steps": 2, "compression": "ef-sign"}}),
    ("gossip-ring", ["algorithm=gossip", "topology=ring"], {"kind": "Gossip", "kwargs": {"topology": "ring"}}),
    ("gossip-one-peer-exponential", ["algorithm=gossip", "topology=one-peer-exponential"],
     {"kind": "Gossip", "kwargs": {"topology": "one-peer-exponential"}}),
    ("gossip-mix-then-step", ["algorithm=gossip", "topology=ring", "gossip_form=mix-then-step"],
     {"kind": "Gossip", "kwargs": {"topology": "ring", "gossip_form": "mix-then-step"}}),
    ("gossip-controlled", ["algorithm=gossip", "topology=ring", "consensus.target=constant", "consensus.value=0.01"],
     {"kind": "Gossip", "kwargs": {"topology": "ring", "consensus": {"target": "constant", "value": 0.01}}}),
    ("gossip-gradient-target", ["algorithm=gossip", "topology=ring", "consensus.target=gradient",
                                "consensus.factor=0.5"],
     {"kind": "Gossip", "kwargs": {"topology": "ring", "consensus": {"target": "gradient", "factor": 0.5}}}),
    ("gossip-phases", ["algorithm=gossip", "topology=one-peer-exponential", "phases=[allreduce,gossip]",
                       "phase_epochs=[0.5]"],
     {"kind": "Gossip", "kwargs": {"topology": "one-peer-exponential", "phases": ["allreduce", "gossip"],
                                   "phase_steps": [6]}}),
    ("dec-phase-1", ["algorithm=gossip", "topology=ring", "phases=[gossip,allreduce]", "phase_steps=[5]"],
     {"kind": "Gossip", "kwargs": {"topology": "ring", "phases": ["gossip", "allreduce"], "phase_steps": [5]}}),
    ("gossip-local-frequency", ["algorithm=gossip", "topology=ring", "local_steps=2", "consensus.target=constant",
                                "consensus.value=0.1", "consensus.action=frequency", "consensus.max_local_steps=4"],
     {"kind": "Gossip", "kwargs": {"topology": "ring", "local_steps": 2, "consensus": {
         "target": "constant", "value": 0.1, "action": "frequency", "max_local_steps": 4}}}),
    ("diloco", ["algorithm=diloco", "local_steps=3"], {"kind": "DiLoCo", "kwargs": {"local_steps": 3}}),
]
CASES = {name: (overrides, hook) for name, overrides, hook in PARITY_CASES}
THREADED = dict(CASES)
LAUNCHED = HOOK_PROCESS_CASES  # DDP, a DistEngine's messages: in the 4-process launch of the dist tests
CASES.update(LAUNCHED)


# DiLoCo's codecs share one path through the hook (the all-gather of the compressed
# pseudo-gradients): a per-worker stochastic codec, a shared-seed one and SparseLoCo's chain with
# error feedback cover it (the simulator's tests take every codec)
DILOCO = [f"diloco-{codec}-sgd" for codec in ("none", "qsgd:4", "random-k:0.2", "ef-top-k:0.1+quant:2")]
# every registered algorithm that a synchroniser runs (SGD) and every codec with one of them in turn
# (tests/cases.py's covering), DiLoCo's codecs above, and the FEATURES of DiLoCo's options
# (streaming with a compressed chain; NoLoCo; the overlapped outer steps)
DILOCO_FEATURES = ["diloco-streaming", "noloco", "diloco-eager", "diloco-delayed-streaming"]
GENERATED = {name: (o, hook_of(o)) for name, o in {
    **covering(optimizers=False), **{name: o for name, o in combinations(optimizers=False).items() if name in DILOCO},
    **{name: FEATURES[name] for name in DILOCO_FEATURES}}.items()
    if hook_of(o) is not None and (not name.startswith("diloco-") or name in DILOCO + DILOCO_FEATURES)}
# resumed: a representative subset (each algorithm once, compressed where it compresses, the codecs
# in turn; every algorithm × codec × optimizer resumes in the simulator, tests/test_resume.py) and
# DiLoCo's features (per-fragment residuals and outer state, the outer gradients in flight)
RESUMED = [name for name in GENERATED if name in representatives() or name in DILOCO_FEATURES]


@pytest.mark.parametrize("name", list(THREADED) + list(GENERATED))
def test_hooks_give_the_simulators_parameters(name, sim_run, tmp_path):
    """Each worker's model equals the simulator's worker of that rank (float64, to rounding), the
    algorithm's communication is counted alike, the parameters are views into the row X, and the
    cheap estimate bounds the exact consensus distance."""
    overrides, hook = (SMALL + CASES[name][0], CASES[name][1]) if name in CASES else \
        (SHORT + GENERATED[name][0], GENERATED[name][1])
    in_threads(lambda rank, engine: hooks.parity(tmp_path, name, overrides, hook, rank, engine))
    sim = torch.load(sim_run(overrides) / "checkpoint.pt")
    for rank in range(PROCS):
        mine = torch.load(tmp_path / name / f"rank{rank}.pt")
        assert_like_the_simulator(mine, sim, rank)


def assert_like_the_simulator(mine: dict, sim: dict, rank: int) -> None:
    assert (mine["X"][0] - sim["rows"]["X"][rank]).abs().max() < 1e-10, rank
    assert mine["views"] is True  # the model's parameters live in the row the schedule updates in place
    for key in ("rounds", "bytes_per_worker", "rounds_by_level", "bytes_by_level"):
        assert mine["comm"][key] == sim["comm"][key], key
    assert mine["step"] == sim["step"]
    assert 0 <= mine["exact"] <= mine["bound"] * (1 + 1e-9) + 1e-20


@pytest.mark.parametrize("name", RESUMED + ["gossip-gradient-target", "gossip-local-frequency"])
def test_a_resumed_run_is_bit_for_bit_the_straight_run(name):
    """state_dicts at a random step before the example's switch or phase boundaries, and at one
    after them, into fresh objects (the step counter, compression references and residuals,
    phases, gossip rounds of a time-varying graph, DiLoCo's outer state), then the rest."""
    overrides, hook = (SHORT + GENERATED[name][0], GENERATED[name][1]) if name in GENERATED else \
        (SMALL + CASES[name][0], CASES[name][1])
    steps = load_config(None, overrides).epochs * 12 if name in CASES else 12
    draw = random.Random(name)
    cuts = [draw.randint(1, 3), draw.randint(9, steps - 1)]
    diffs = in_threads(lambda rank, engine: hooks.resume(overrides, hook, cuts, rank, engine))
    assert diffs == [0.0] * PROCS, cuts


# ---------------------------------------------------------------- real processes (slow)


@pytest.fixture(scope="module")
def launched(dist_runs):
    """The hooks' part of the one 4-process launch (tests/dist_scripts/parity.py runs hooks.py's checks)."""
    return dist_runs(4) / "hooks"


def rank_results(root: Path, name: str) -> list[dict]:
    return [json.loads((root / f"{name}-rank{r}.json").read_text()) for r in range(PROCS)]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAUNCHED))
def test_hooks_on_processes_give_the_simulators_parameters(name, launched, sim_run):
    """DDP's comm hook stands in for the gradient all-reduce of the mini-batch phases; a DistEngine."""
    sim = torch.load(sim_run(SMALL + CASES[name][0]) / "checkpoint.pt")
    for rank in range(PROCS):
        assert_like_the_simulator(torch.load(launched / name / f"rank{rank}.pt"), sim, rank)


@pytest.mark.slow
def test_on_processes_a_resumed_run_is_the_straight_run(launched):
    """Bit for bit on the DistEngine; to rounding with DDP, whose gradient buckets are laid out
    anew by a fresh DDP model (its all-reduce then sums each value in another order)."""
    for resumed in rank_results(launched, "resume"):
        assert resumed.keys() == LAUNCHED.keys()
        for name, diff in resumed.items():
            assert diff <= (1e-15 if LAUNCHED[name][1].get("ddp") else 0.0), name


@pytest.mark.slow
def test_a_second_synchroniser_after_close_joins_the_group_the_first_created(launched):
    """No false "lost rank" and no hang: the group a synchroniser created outlives its close."""
    assert json.loads((launched / "synchronizers.json").read_text()) == {"consensus_distance_sq": 0.0,
                                                                         "comm_rounds": 1}


@pytest.mark.slow
def test_a_gossip_round_sends_each_ring_neighbour_the_whole_model_as_one_message(launched):
    for rank in range(PROCS):
        mine = torch.load(launched / "gossip-ring-processes" / f"rank{rank}.pt")
        rounds, d = mine["comm"]["rounds"], mine["X"].shape[1]
        assert mine["sent"]["messages"] == 2 * rounds and mine["sent"]["values"] == 2 * d * rounds


@pytest.mark.slow
def test_buffers_are_averaged_with_the_parameters_or_stay_local(launched):
    for checks in rank_results(launched, "checks"):
        assert checks["buffers average"]["spread"] == 0 and checks["buffers average"]["from_mean"] < 1e-12
        assert checks["buffers local"]["spread"] > 1e-3


@pytest.mark.slow
def test_a_group_of_processes_averages_only_among_itself(launched):
    for checks in rank_results(launched, "checks"):
        assert checks["groups"]["workers"] == 2
        assert checks["groups"]["inside"] < 1e-15 < checks["groups"]["between"]


@pytest.mark.slow
def test_bad_input_is_one_line_naming_what_is_allowed(launched):
    expected = {
        "models differ": "parameters differ across ranks at the start",
        "block size": "block_size must divide workers: 3 does not divide 4",
        "post-local hierarchical": "block_size does not apply to algorithm 'post-local'",
        "topology size": "node 4 out of range 0..3",
        "buffers": "unknown buffers 'everywhere'; choose one of: local, average",
        "phases": "phases has 2 modes but 0 boundaries",
        "ddp broadcasts buffers": "broadcast_buffers=False",
    }
    for checks in rank_results(launched, "checks"):
        for case, text in expected.items():
            message = checks["errors"][case]
            assert message is not None and text in message and "\n" not in message, (case, message)


def test_the_lightning_callback_without_lightning_names_the_install(monkeypatch):
    import importlib
    import sys

    from gossamer.registry import ConfigError

    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)  # as if it were not installed
    monkeypatch.delitem(sys.modules, "gossamer.integrations.lightning", raising=False)
    with pytest.raises(ConfigError, match=r"pip install 'gossamer\[lightning\]'"):
        importlib.import_module("gossamer.integrations.lightning")


def test_load_state_dict_of_another_configuration_is_one_line_naming_what_differs():
    from torch import nn

    from gossamer.integrations import LocalSGD
    from gossamer.registry import ConfigError

    def synchronizer(**options):
        model = nn.Linear(3, 1)
        return LocalSGD(model, torch.optim.SGD(model.parameters(), lr=0.1), engine=ThreadedSim(1).engine(0), **options)
    state = synchronizer(local_steps=2, compression="ef-sign").state_dict()
    synchronizer(local_steps=2, compression="ef-sign").load_state_dict(state)  # the same configuration loads
    with pytest.raises(ConfigError, match=r"another configuration: compression \(ef-sign → none\)$") as e:
        synchronizer(local_steps=2).load_state_dict(state)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="a state_dict\\(\\) of a gossamer synchroniser"):
        synchronizer().load_state_dict({"schedule": {}})


@pytest.mark.parametrize("options, message", [
    ({"local_steps": 2, "fragments": 3}, "fragments must be at most local_steps=2"),
    ({"outer_gamma": 0.5}, "outer_gamma applies only with an outer_topology"),
    ({"local_steps": 2, "outer_topology": "ring", "fragments": 2}, "outer_topology .NoLoCo. needs compression: none"),
])
def test_diloco_hook_refuses_what_the_config_refuses_in_one_line(options, message):
    from torch import nn

    from gossamer.integrations import DiLoCo
    from gossamer.registry import ConfigError

    model = nn.Linear(3, 1)
    with pytest.raises(ConfigError, match=message) as e:
        DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(model.parameters(), lr=0.7),
               engine=ThreadedSim(1).engine(0), **options)
    assert "\n" not in str(e.value)


def test_a_synchroniser_naming_a_schedule_the_hooks_cannot_run_is_refused():
    """A subclass naming decoupled-momentum trained plain local SGD while the ledger counted DeMo's
    bytes; engine='sim' (as a message advised) failed with an AttributeError (issue 45, item 14)."""
    from torch import nn

    from gossamer.integrations import Gossip
    from gossamer.integrations.hooks import Synchronizer
    from gossamer.registry import ConfigError

    class DeMoHook(Synchronizer):
        algorithm = "decoupled-momentum"

    model = nn.Linear(3, 1)
    for algorithm in ("decoupled-momentum", "gradient-tracking", "ad-psgd"):
        DeMoHook.algorithm = algorithm
        with pytest.raises(ConfigError, match=f"the step hooks run the algorithms local, .*, not '{algorithm}'"):
            DeMoHook(model, torch.optim.SGD(model.parameters(), lr=0.1), {}, engine=ThreadedSim(1).engine(0))
    with pytest.raises(ConfigError, match="engine must be an Engine holding this worker's row .* got the string 'sim'"):
        Gossip(model, torch.optim.SGD(model.parameters(), lr=0.1), engine="sim")
