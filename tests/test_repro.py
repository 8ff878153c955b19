"""The repro suites in their --quick form: every variant runs, results.md and the plot appear."""

import json
import re

import pytest
import yaml

from gossamer.cli import main
from gossamer.repro import LIN_NETWORKS, SUITES, _slug


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_quick_suite_writes_results_and_plot(suite, tmp_path, capsys):
    out = tmp_path / suite
    assert main(["repro", suite, "--quick", "--out", str(out), "--set", "weight_decay=0"]) == 0
    table = (out / "results.md").read_text()
    assert f"gossamer repro {suite} --seeds 1 --quick --set weight_decay=0`" in table
    for run in (p for p in out.iterdir() if p.is_dir()):  # the override reached every run
        assert yaml.safe_load((run / "config.yaml").read_text())["weight_decay"] == 0
    for variant in SUITES[suite](True).variants:  # time-to-accuracy: one row per variant, a column per network
        assert f"| {variant.name.split(' on ')[0]} |" in table
    plots = re.findall(r"!\[[^]]*\]\(([^)]+)\)", table)
    assert plots and all((out / p).stat().st_size > 10_000 for p in plots)
    assert main(["repro", suite, "--quick", "--out", str(out)]) == 2  # a finished suite is not overwritten
    assert main(["repro", suite, "--quick", "--out", str(tmp_path / "other"), "--set", "colour=red"]) == 2
    if suite == "consensus-phases":  # control bought a smaller phase-1 Ξ² with extra rounds
        rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in table.splitlines()
                if line.startswith("| ")}
        ring, ctrl = rows["ring"], rows["ctrl-phase-1 c=1/4"]
        assert float(ctrl[2].split(" ± ")[0]) < float(ring[2].split(" ± ")[0])
        assert float(ctrl[-1].split(" ± ")[0]) > 0
    if suite == "time-to-accuracy":
        the_network_changes_time_not_training(out, table)


def the_network_changes_time_not_training(out, table: str) -> None:
    """Each Lin variant trained on both networks: the same training, more simulated seconds on the
    slow one; control's extra rounds cost seconds."""
    fast, slow = LIN_NETWORKS
    for variant in (v for v in SUITES["time-to-accuracy"](True).variants if v.name.endswith(fast)):
        a, b = (json.loads((out / f"{_slug(v)}-seed0" / "summary.json").read_text())
                for v in (variant.name, variant.name.replace(fast, slow)))
        assert {k: v for k, v in a.items() if "seconds" not in k} == {k: v for k, v in b.items() if "seconds" not in k}
        assert b["sim_seconds"] > a["sim_seconds"] > 0 and b["sim_seconds_to_target"] >= a["sim_seconds_to_target"]
    assert f"s to target on {fast}" in table and f"s to target on {slow}" in table
    ctrl = next(line for line in table.splitlines() if line.startswith("| ctrl-phase-1 c=1/4"))
    assert float(ctrl.split(" | ")[-1].split(" ± ")[0]) > 0
