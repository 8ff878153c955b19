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
    assert (out / "consensus.png").stat().st_size > 10_000 and (out / "tradeoff.png").stat().st_size > 10_000
    assert main(["repro", suite, "--quick", "--out", str(out)]) == 2  # a finished suite is not overwritten
    assert main(["repro", suite, "--quick", "--out", str(tmp_path / "other"), "--set", "colour=red"]) == 2
    cells = [[c.strip() for c in line.strip("| ").split(" | ")] for line in table.splitlines() if line.startswith("| ")]
    rows = {row[0]: dict(zip(cells[0], row)) for row in cells[1:]}

    def mean(variant: str, column: str) -> float:
        return float(rows[variant][column].split(" ± ")[0])
    if suite == "consensus-phases":  # control bought a smaller phase-1 Ξ² with extra rounds, or saved rounds
        assert mean("ctrl-phase-1 c=1/4", "mean Ξ² phase 1") < mean("ring", "mean Ξ² phase 1")
        assert mean("ctrl-phase-1 c=1/4", "extra gossip rounds") > 0
        assert rows["freq-phase-1 c=1/2"]["gossip rounds saved"] != "—" and rows["ring"]["gossip rounds saved"] == "—"
    if suite == "local-sgd":  # every run measured the sharpness of x̄; local SGD communicated less
        assert all(mean(v, "sharpness (x̄)") > 0 for v in rows)
        assert mean("local H=16", "comm rounds") < mean("large-batch (All-Reduce, n=4)", "comm rounds")
