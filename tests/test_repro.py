"""The repro suites in their --quick form: every variant runs, results.md and the plot appear."""

import pytest
import yaml

from gossamer.cli import main
from gossamer.repro import SUITES


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_quick_suite_writes_results_and_plot(suite, tmp_path, capsys):
    out = tmp_path / suite
    assert main(["repro", suite, "--quick", "--out", str(out), "--set", "weight_decay=0"]) == 0
    table = (out / "results.md").read_text()
    assert f"gossamer repro {suite} --seeds 1 --quick --set weight_decay=0`" in table
    for run in (p for p in out.iterdir() if p.is_dir()):  # the override reached every run
        assert yaml.safe_load((run / "config.yaml").read_text())["weight_decay"] == 0
    for variant in SUITES[suite](True).variants:
        assert f"| {variant.name} |" in table
    assert (out / "consensus.png").stat().st_size > 10_000
    assert main(["repro", suite, "--quick", "--out", str(out)]) == 2  # a finished suite is not overwritten
    assert main(["repro", suite, "--quick", "--out", str(tmp_path / "other"), "--set", "colour=red"]) == 2
    if suite == "consensus-phases":  # control bought a smaller phase-1 Ξ² with extra rounds
        main_table = table.split("## Control from the local estimate")[0]
        rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in main_table.splitlines()
                if line.startswith("| ")}
        ring, ctrl = rows["ring"], rows["ctrl-phase-1 c=1/4"]
        assert float(ctrl[2].split(" ± ")[0]) < float(ring[2].split(" ± ")[0])
        assert float(ctrl[-1].split(" ± ")[0]) > 0
        assert "| ctrl-phase-1 c=1/4 | " in table.split("## Control from the local estimate")[1]
