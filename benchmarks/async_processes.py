"""Asynchronous local SGD against synchronous DiLoCo on real processes (``--pairs``: AD-PSGD against
synchronous gossip, D-SGD, on a ring), one worker 3 times slower:
the wall time of the same inner steps (every worker's rounds of H steps; DiLoCo waits for the slow
one at every outer all-reduce, async-local-sgd does not), side by side in one script.

    python benchmarks/async_processes.py [--workers 4] [--local-steps 8] [--epochs 1] [--rate 20mbit]

DiLoCo runs on `workers` processes; its slow worker sleeps through the time model (a network
section: the ``ethernet-1g`` preset, compute measured), async-local-sgd on `workers` + 1 (the
server). Both print ``wall_seconds`` (the training loop's, after building) from summary.json;
async-local-sgd also its pushes and the staleness. Metrics are taken at each epoch's end only
(``metrics_every=25``), so neither pays a measurement every step. Loopback gloo, no rate limit:
the network costs almost nothing here, the straggler everything. ``--rate R`` (root, ``ip netns``
and ``tc``): both run inside a network namespace whose loopback is rate-limited to R with a token
bucket, as ``benchmarks/network.py`` does; DiLoCo's time model then gets the ``ethernet-1g``
preset still (its clock only sleeps the straggler here; the all-reduce is real).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from gossamer.rundir import read_summary

COMMON = ["num_samples=4000", "lr=0.05", "momentum=0.9", "slow_workers=0.25@3",
          "engine=dist", "dtype=float32", "metrics_every=25"]


def launch(procs: int, overrides: list[str], out: Path, namespace: str | None = None) -> dict:
    within = ["ip", "netns", "exec", namespace] if namespace else []
    cmd = [*within, sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs),
           "-m", "gossamer", "train", "--quiet", "--out", str(out), *[x for o in overrides for x in ("--set", o)]]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode:
        raise SystemExit(f"{' '.join(overrides)} failed:\n{done.stderr[-3000:]}")
    return read_summary(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--local-steps", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rate", help="rate-limit a network namespace's loopback to this (tc syntax, e.g. 20mbit)")
    ap.add_argument("--pairs", action="store_true", help="AD-PSGD against synchronous gossip (D-SGD), on a ring")
    a = ap.parse_args(argv)
    if a.pairs:
        contenders = ("gossip (synchronous)", ["algorithm=gossip", "topology=ring"]), \
            ("ad-psgd", ["algorithm=ad-psgd", "topology=ring"])
        shared = [*COMMON, f"workers={a.workers}", f"epochs={a.epochs}", f"batch_size={a.batch_size}"]
    else:
        contenders = ("diloco (synchronous)", ["algorithm=diloco"]), ("async-local-sgd", ["algorithm=async-local-sgd"])
        shared = [*COMMON, f"workers={a.workers}", f"local_steps={a.local_steps}", f"epochs={a.epochs}",
                  f"batch_size={a.batch_size}"]
    out = Path(tempfile.mkdtemp(prefix="async-processes-"))
    with contextlib.ExitStack() as stack:
        namespace = None
        if a.rate:
            from network import Namespace, unavailable  # benchmarks/network.py
            if unavailable():
                print(f"async_processes: skipped — {unavailable()}")
                return 0
            namespace = stack.enter_context(Namespace())
            namespace.limit(a.rate)
            namespace = namespace.name
        (sync_name, sync_case), (async_name, async_case) = contenders
        sync = launch(a.workers, [*shared, *sync_case, "network=ethernet-1g"], out / "sync", namespace)
        asynchronous = launch(a.workers + 1, [*shared, *async_case], out / "async", namespace)
    print(f"{a.workers} workers{'' if a.pairs else f', H={a.local_steps}'}, one 3x slower, {sync['steps']} loop steps "
          f"of {a.workers} inner steps each, {sync['parameters']:,} parameters, loopback {a.rate or 'not limited'}:")
    print(f"  {sync_name:<22}{sync['wall_seconds']:7.2f} s   test accuracy {sync['test_accuracy']:.3f}")
    counts = f"{asynchronous['events']} events" if a.pairs else \
        f"{asynchronous['pushes']} pushes, staleness mean {asynchronous['staleness_mean']:.2f}, max " \
        f"{asynchronous['staleness_max']}"
    print(f"  {async_name:<22}{asynchronous['wall_seconds']:7.2f} s   test accuracy "
          f"{asynchronous['test_accuracy']:.3f}   ({counts})")
    print(f"  ratio async / sync    {asynchronous['wall_seconds'] / sync['wall_seconds']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
