"""Launching processes for the tests: torchrun, or its environment set by hand (one node, loopback)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

# a seconds-long float64 run of 4 workers: the configs the multi-process parity tests compare
SMALL = ["workers=4", "epochs=1", "batch_size=16", "num_samples=1000", "lr=0.05", "momentum=0.9",
         "nesterov=true", "dtype=float64", "grad_backend=loop"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(procs: int, argv: list[str], cwd: Path, **env_extra) -> list[subprocess.Popen]:
    """``procs`` processes of ``python ARGV`` with torchrun's environment (one node, loopback)."""
    port = free_port()
    out = []
    for rank in range(procs):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(procs),
               "LOCAL_WORLD_SIZE": str(procs), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1", **env_extra}
        out.append(subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    return out


def finish(procs: list[subprocess.Popen], timeout: float) -> list[tuple[int, str, str]]:
    try:
        return [(p.wait(timeout), *p.communicate()) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def torchrun(procs: int, *argv: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", str(procs), *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"})


def sets(overrides: list[str]) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]
