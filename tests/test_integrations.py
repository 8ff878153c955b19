"""gossamer.integrations: the step hooks in a plain PyTorch loop on 4 gloo processes (one launch runs
every case, tests/dist_scripts/hooks.py) give the parameters of ``gossamer train`` with the
simulator on the same config, resume exactly, and refuse bad input in one line."""

import json
from pathlib import Path

import pytest
import torch
from launch import SMALL, finish, spawn

SCRIPTS = Path(__file__).resolve().parent / "dist_scripts"
PROCS = 4

# (name, overrides of `gossamer train` and of the loop's config, the synchroniser doing the same)
PARITY_CASES = [
    ("local", ["algorithm=local", "local_steps=3"], {"kind": "LocalSGD", "kwargs": {"local_steps": 3}}),
    ("post-local", ["algorithm=post-local", "switch_step=6", "local_steps=2"],
     {"kind": "LocalSGD", "kwargs": {"local_steps": 2, "switch_step": 6}}),
    ("post-local-ddp", ["algorithm=post-local", "switch_step=6", "local_steps=2"],
     {"kind": "LocalSGD", "kwargs": {"local_steps": 2, "switch_step": 6}, "ddp": True}),
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
    ("gossip-phases-ddp", ["algorithm=gossip", "topology=one-peer-exponential", "phases=[allreduce,gossip]",
                           "phase_epochs=[0.5]"],
     {"kind": "Gossip", "kwargs": {"topology": "one-peer-exponential", "phases": ["allreduce", "gossip"],
                                   "phase_steps": [6]}, "ddp": True}),
    ("dec-phase-1", ["algorithm=gossip", "topology=ring", "phases=[gossip,allreduce]", "phase_steps=[5]"],
     {"kind": "Gossip", "kwargs": {"topology": "ring", "phases": ["gossip", "allreduce"], "phase_steps": [5]}}),
    ("gossip-local-frequency", ["algorithm=gossip", "topology=ring", "local_steps=2", "consensus.target=constant",
                                "consensus.value=0.1", "consensus.action=frequency", "consensus.max_local_steps=4"],
     {"kind": "Gossip", "kwargs": {"topology": "ring", "local_steps": 2, "consensus": {
         "target": "constant", "value": 0.1, "action": "frequency", "max_local_steps": 4}}}),
    ("diloco", ["algorithm=diloco", "local_steps=3"], {"kind": "DiLoCo", "kwargs": {"local_steps": 3}}),
]
CASES = {name: (overrides, hook) for name, overrides, hook in PARITY_CASES}
RESUME_CASES = ["local-ef-sign", "post-local", "gossip-one-peer-exponential", "dec-phase-1", "gossip-local-frequency",
                "diloco"]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    root = tmp_path_factory.mktemp("hooks")
    cases = {"parity": [[name, SMALL + overrides, hook] for name, overrides, hook in PARITY_CASES],
             "resume": [[name, SMALL + CASES[name][0], CASES[name][1], 5] for name in RESUME_CASES]}
    (root / "cases.json").write_text(json.dumps(cases))
    for code, out, err in finish(spawn(PROCS, [str(SCRIPTS / "hooks.py"), str(root), str(root / "cases.json")],
                                       cwd=root), 600):
        assert code == 0, err[-3000:]
    return root


def rank_results(root: Path, name: str) -> list[dict]:
    return [json.loads((root / f"{name}-rank{r}.json").read_text()) for r in range(PROCS)]


@pytest.mark.parametrize("name", list(CASES))
def test_hooks_give_the_simulators_parameters(name, launched, sim_run):
    """Each rank's model equals the simulator's worker of that rank (float64, to rounding), the
    algorithm's communication is counted alike, and the parameters are views into the row X."""
    sim = torch.load(sim_run(SMALL + CASES[name][0]) / "checkpoint.pt")
    for rank in range(PROCS):
        mine = torch.load(launched / name / f"rank{rank}.pt")
        assert (mine["X"][0] - sim["rows"]["X"][rank]).abs().max() < 1e-10, rank
        assert mine["views"]  # the model's parameters live in the row the schedule updates in place
        for key in ("rounds", "bytes_per_worker", "rounds_by_level", "bytes_by_level"):
            assert mine["comm"][key] == sim["comm"][key], key
        assert mine["step"] == sim["step"]


def test_a_gossip_round_sends_each_ring_neighbour_the_whole_model_as_one_message(launched):
    for rank in range(PROCS):
        mine = torch.load(launched / "gossip-ring" / f"rank{rank}.pt")
        rounds, d = mine["comm"]["rounds"], mine["X"].shape[1]
        assert mine["sent"]["messages"] == 2 * rounds and mine["sent"]["values"] == 2 * d * rounds


@pytest.mark.parametrize("name", list(CASES))
def test_the_cheap_estimate_bounds_the_exact_consensus_distance(name, launched):
    for rank in range(PROCS):
        mine = torch.load(launched / name / f"rank{rank}.pt")
        assert 0 <= mine["exact"] <= mine["bound"] * (1 + 1e-9) + 1e-20


def test_a_resumed_run_is_bit_for_bit_the_straight_run(launched):
    """state_dict after 5 steps into fresh objects (the step counter, compression residuals, gossip
    rounds of a time-varying graph, DiLoCo's outer state), then the rest."""
    for resumed in rank_results(launched, "resume"):
        assert resumed == dict.fromkeys(RESUME_CASES, 0.0)


def test_buffers_are_averaged_with_the_parameters_or_stay_local(launched):
    for checks in rank_results(launched, "checks"):
        assert checks["buffers average"]["spread"] == 0 and checks["buffers average"]["from_mean"] < 1e-12
        assert checks["buffers local"]["spread"] > 1e-3


def test_a_group_of_processes_averages_only_among_itself(launched):
    for checks in rank_results(launched, "checks"):
        assert checks["groups"]["workers"] == 2
        assert checks["groups"]["inside"] < 1e-15 < checks["groups"]["between"]


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
