"""Every script in examples/ runs as its docstring says (2 gloo processes with torchrun's
environment, or Lightning starting its own 2), on tiny data, and does what it claims. System tests
(`-m system`): .ci/run runs them after the 3-minute suite, whose hook tests cover the same
synchronisers in threads and in the 4-process launch."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from launch import finish, spawn

pytestmark = [pytest.mark.slow, pytest.mark.system]  # every test launches processes

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def run_example(name: str, *args: str, cwd: Path) -> dict:
    """The example on 2 processes with torchrun's environment (torchrun itself is exercised by
    tests/test_dist.py; its agent process would only add a start-up here); rank 0's last line."""
    results = finish(spawn(2, [str(EXAMPLES / name), *args], cwd=cwd), 300)
    for code, out, err in results:
        assert code == 0, 'STDOUT:' + out[-2000:] + 'STDERR:' + err[-3000:]
    return last_json(results[0][1])


def test_local_sgd_in_a_plain_loop(tmp_path):
    result = run_example("local_sgd.py", "--steps", "64", "--local-steps", "8", cwd=tmp_path)
    assert result["final_loss"] < 0.5 * result["first_loss"]
    assert result["consensus_distance_sq"] == 0  # 64 steps end with an average
    assert result["comm_rounds"] == 64 // 8


def test_post_local_sgd_on_ddp(tmp_path):
    result = run_example("ddp_post_local.py", "--steps", "40", "--switch-step", "20", cwd=tmp_path)
    assert result["max_xi_sq_before_switch"] == 0  # DDP averaged the gradients: identical models
    assert result["max_xi_sq_after_switch"] > 0  # and kept them local after the switch
    assert result["last_loss"] < 0.5 * result["first_loss"]
    assert result["comm_rounds"] == 20 + 20 // 4 + 1  # gradient means, model averages, the final average


def test_gossip_with_consensus_control(tmp_path):
    result = run_example("gossip_consensus.py", "--steps", "40", "--target", "0.02", cwd=tmp_path)
    assert result["max_consensus_distance"] <= result["target"]
    assert result["extra_gossip_rounds"] > 0
    assert result["gossip_rounds"] == result["steps"] + result["extra_gossip_rounds"]
    assert result["control_rounds"] == 2 * result["gossip_rounds"]  # Ξ² before the extra rounds and after each


def test_diloco_with_a_user_outer_optimizer(tmp_path):
    result = run_example("diloco.py", "--local-steps", "10", "--outer-steps", "4", cwd=tmp_path)
    assert result["last_loss"] < 0.5 * result["first_loss"]
    assert result["consensus_distance_sq"] == 0 and result["comm_rounds"] == 4


def test_hugging_face_trainer_with_diloco_on_two_processes(tmp_path):
    """transformers.Trainer (DDP, a tiny GPT-2 from a config) with DiLoCo attached by a callback:
    DDP keeps the gradients local between the outer steps (Ξ² > 0), every H = 5 optimizer steps
    an outer step (4 in 20), Ξ² = 0 after the last, and the loss falls. Needs the [hf] extra:
    .ci/run installs it after the suite and runs the system tests."""
    pytest.importorskip("transformers", reason="the [hf] extra: pip install 'gossamer[hf]'")
    result = run_example("hf_trainer_diloco.py", "--steps", "20", "--local-steps", "5", "--out", str(tmp_path / "hf"),
                         cwd=tmp_path)
    assert result["outer_steps"] == 4 and result["consensus_distance_sq"] == 0
    assert result["min_xi_sq_between"] > 0
    assert result["last_loss"] < 0.8 * result["first_loss"]


def test_lightning_trainer_with_ddp_on_two_cpu_processes(tmp_path):
    """Trainer(accelerator="cpu", devices=2, strategy="ddp"): Lightning's logger gets Ξ² every
    step; it is 0 after each average (every 4 steps) and not between (DDP kept the gradients local);
    the bytes sent grow by one model all-reduce at each average and by nothing between."""
    proc = subprocess.run([sys.executable, str(EXAMPLES / "lightning_local_sgd.py"), "--devices", "2", "--steps", "12",
                           "--out", str(tmp_path / "log")], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert result["steps"] == 12 and result["comm_rounds"] == 3
    rows = list(csv.DictReader(open(result["metrics"])))
    xi = {int(r["step"]) + 1: float(r["consensus_distance_sq"]) for r in rows if r["consensus_distance_sq"]}
    assert sorted(xi) == list(range(1, 13))
    assert all((xi[t] == 0) == (t % 4 == 0) for t in xi), xi
    d = 10 * 32 + 32 + 32 * 3 + 3  # the example's Linear(10, 32) and Linear(32, 3)
    average = 2 * d * (2 - 1) / 2 * 4  # a ring all-reduce of d float32 values between 2 workers: bytes each sends
    sent = {int(r["step"]) + 1: float(r["bytes_per_worker"]) for r in rows if r["bytes_per_worker"]}
    assert sent == {t: t // 4 * average for t in range(1, 13)}, sent
