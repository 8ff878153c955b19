"""The package as a user installs it: a built wheel in a fresh environment outside the repository."""

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.system]  # builds a wheel and a fresh environment: .ci/run, after the suite


def run(*argv, cwd: Path) -> str:
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def test_the_wheel_installs_and_runs_the_demo_outside_the_repository(tmp_path):
    """Build the wheel, install it (no dependencies: those come from this environment, through a
    .pth file, so nothing is downloaded) into a new virtual environment, check that its declared
    requirements are met there, and run ``gossamer --version`` and a one-epoch demo from elsewhere."""
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp_path / "dist",
        ROOT, cwd=tmp_path)
    wheel, = (tmp_path / "dist").glob("gossamer-*.whl")
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path).strip())
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel, cwd=tmp_path)
    run(sys.executable, "-m", "pip", "--python", python, "check", cwd=tmp_path)  # torch, numpy, ... as declared

    where = run(python, "-c", "import gossamer; print(gossamer.__file__)", cwd=tmp_path)
    assert where.startswith(str(site)), where  # the wheel's copy, not the repository's
    assert run(venv / "bin" / "gossamer", "--version", cwd=tmp_path).startswith("gossamer 0.")
    out = run(venv / "bin" / "gossamer", "demo", "--epochs", "1", "--out", tmp_path / "demo", cwd=tmp_path)
    assert "| allreduce |" in out and "| gossip-ring |" in out
    assert (tmp_path / "demo" / "gossip-ring" / "summary.json").exists()
