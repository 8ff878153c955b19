"""Two real nodes on one machine: two network namespaces joined by a veth pair, one `torchrun
--nnodes 2 --node-rank R` in each with its rendezvous on the first namespace's address, running
hierarchical local SGD with ``network.workers_per_node`` equal to the processes a node; the final
parameters must equal the single-node simulator's run of the same config to 1e-10 (float64). Then
asynchronous local SGD on the same two nodes (the server on node 0, a third of the workers 3 times
slower): its replay from the event log (``gossamer train --replay``) must give the same metric
rows, bit for bit.

    sudo python benchmarks/two_nodes.py [--procs-per-node 2] [--out DIR]

Needs root and ``ip netns`` (exits 0 with the reason where they are missing). Only the two
namespaces carry the traffic: gloo binds the veth interfaces (GLOO_SOCKET_IFNAME).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from gossamer.async_processes import replay
from gossamer.config import load_config
from gossamer.rundir import read_rows, read_summary
from gossamer.train import build_run, train

NAMESPACES = ("gossamer-node0", "gossamer-node1")
ADDRESSES = ("10.77.0.1", "10.77.0.2")
INTERFACES = ("gsm-veth0", "gsm-veth1")
ASYNC = ["algorithm=async-local-sgd", "local_steps=4", "slow_workers=0.34@3", "grace_window=0.002", "epochs=1",
         "num_samples=1000", "batch_size=16", "lr=0.05", "momentum=0.9", "dtype=float64", "grad_backend=loop"]


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def make_nodes() -> None:
    """Two namespaces, each with its loopback and one end of a veth pair (10.77.0.1 and .2)."""
    for ns in NAMESPACES:
        ip("netns", "add", ns)
    ip("link", "add", INTERFACES[0], "type", "veth", "peer", "name", INTERFACES[1])
    for ns, iface, addr in zip(NAMESPACES, INTERFACES, ADDRESSES):
        ip("link", "set", iface, "netns", ns)
        ip("-n", ns, "addr", "add", f"{addr}/24", "dev", iface)
        ip("-n", ns, "link", "set", iface, "up")
        ip("-n", ns, "link", "set", "lo", "up")


def remove_nodes() -> None:
    for ns in NAMESPACES:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs-per-node", type=int, default=2)
    ap.add_argument("--out", type=Path, help="where the run goes (default: a temporary folder)")
    a = ap.parse_args(argv)
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("two_nodes: skipped — needs root and the ip command (network namespaces)")
        return 0
    p = a.procs_per_node
    overrides = [f"workers={2 * p}", "algorithm=hierarchical", f"block_size={p}", "local_steps=2", "block_rounds=2",
                 f"network.workers_per_node={p}", "network=ethernet-1g", "compute_ms=1", "epochs=1",
                 "num_samples=1000", "batch_size=16", "lr=0.05", "dtype=float64", "grad_backend=loop"]
    out = a.out or Path(tempfile.mkdtemp(prefix="two-nodes-"))
    remove_nodes()
    try:
        make_nodes()
    except subprocess.CalledProcessError as e:
        print(f"two_nodes: skipped — network namespaces unavailable: {e.stderr.strip()[:200]}")
        return 0
    try:
        results = launch(p, overrides + ["engine=dist"], out / "run")
        asynchronous = ASYNC + [f"workers={2 * p - 1}", "engine=dist"]
        results += launch(p, asynchronous, out / "async")
    finally:
        remove_nodes()
    for rank, (code, _, err) in enumerate(results):
        if code:
            print(f"two_nodes: launch {rank // 2}, node {rank % 2} failed ({code}):\n{err[-3000:]}")
            return 1
    cfg = load_config(None, overrides)
    run = build_run(cfg)
    train(cfg, run)
    dist = torch.load(out / "run" / "checkpoint.pt", weights_only=True)["rows"]["X"]
    diff = (dist - run.workers.X).abs().max().item()
    print(f"two nodes × {p} processes (hierarchical local SGD, workers_per_node={p}) against the single-node "
          f"simulator: max |Δx| = {diff:.2e} ({'equal to 1e-10' if diff <= 1e-10 else 'NOT equal'})")
    replay(load_config(None, asynchronous), out / "async", out / "async-replay", False, False)
    rows, replayed = read_rows(out / "async"), read_rows(out / "async-replay")
    pushes = read_summary(out / "async")["pushes"]
    print(f"two nodes × {p} processes (async-local-sgd, {2 * p - 1} workers and a server, {pushes} pushes) against "
          f"its replay: {len(rows)} rows {'equal bit for bit' if rows == replayed else 'NOT equal'}")
    return 0 if diff <= 1e-10 and rows == replayed else 1


def launch(p: int, overrides: list[str], out: Path) -> list[tuple[int, str, str]]:
    """``gossamer train`` on the two nodes, p processes each; (code, stdout, stderr) per node."""
    procs = []
    for rank, (ns, iface) in enumerate(zip(NAMESPACES, INTERFACES)):
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
               "--node-rank", str(rank), "--nproc-per-node", str(p),
               # static rendezvous on node 0's veth address: both namespaces share the machine's
               # hostname, which a c10d rendezvous would hand out as the master's address
               "--master-addr", ADDRESSES[0], "--master-port", "29400",
               "-m", "gossamer", "train", "--quiet", "--out", str(out), *[x for o in overrides for x in ("--set", o)]]
        env = {**os.environ, "GLOO_SOCKET_IFNAME": iface, "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen(cmd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    return [(proc.wait(600), *proc.communicate()) for proc in procs]


if __name__ == "__main__":
    sys.exit(main())
