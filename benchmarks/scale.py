"""Benchmark 11 (docs/benchmarks.md): tens of thousands of workers, and what their random draws cost.

    python benchmarks/scale.py [--threads T] [--quick] [--json FILE]

1. the per-worker draws of one step at n = 16,384 (qsgd's rounding of the 1-D CNN's d = 5,210
   coordinates a worker, compute jitter's factor a worker): the row streams (one generator, one
   call) against a generator per worker (the named streams before issue 46), interleaved;
2. n = 16,384 workers of the 1-D CNN, batch 1, gossip on a ring: a whole step (gradients, the
   local step, the gossip round, the ledger and the clock) with Ξ² not due and with Ξ² every step,
   interleaved in one process;
3. the same n: CHOCO-SGD on a ring with qsgd:4 and ``compute_jitter: lognormal:0.5`` against the
   same run without them (``compression: none``, no jitter), interleaved;
4. n = 65,536, batch 1, ``eval_local: 16``, gossip on a ring: a step's time and the process's peak
   resident memory (a process of its own, so that its peak is its alone).

Each case runs in a process of its own (this script, ``--case NAME``), built as `gossamer train`
builds a run, on random data of MNIST-1D's shape. Prints markdown; ``--json`` saves the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from gossamer.config import load_config
from gossamer.data import Dataset
from gossamer.rng import row_normals, row_uniforms
from gossamer.train import Progress, _advance_clocks, build_run, train_step

sys.path.insert(0, str(Path(__file__).resolve().parent))
from simulator import _median_interleaved as _interleaved  # noqa: E402

D_CNN = 5210  # the 1-D CNN's parameters


def _peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return 1024 * int(line.split()[1])
    return 0


def _run(n: int, b: int, extra: list[str]):
    """A run of n 1-D CNN workers (batch b) on random data: two steps an epoch."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(2 * n * b, 1, 40, generator=g), torch.randint(0, 10, (2 * n * b,), generator=g)
    cfg = load_config(None, [f"workers={n}", f"batch_size={b}", "model=cnn1d", "epochs=1", "lr=0.01",
                             "momentum=0.9", "nesterov=true", f"num_samples={4 * n * b}", *extra])
    return build_run(cfg, data=Dataset(x, y, x[:1000], y[:1000], 10))


def _stepper(run, measure: bool):
    """One whole step as the training loop takes it: train_step, then the ledger into the clock."""
    n, b = run.cfg.workers, run.cfg.batch_size
    x, y = run.data.x_train[: n * b].view(n, b, 1, 40), run.data.y_train[: n * b].view(n, b)
    batches, progress, t = SimpleNamespace(of=lambda counts, draw: (x, y)), Progress(), [0]
    run.schedule.start(run.engine, run.workers.X)

    def step():
        train_step(run, progress, batches, t[0], 0.01, measure, computes=None)
        _advance_clocks(run, progress, None)
        t[0] += 1
    return step


def _per_worker_generators(name: str, n: int, draw) -> list:
    """The named streams before issue 46: a SeedSequence and a generator per worker, then its draw."""
    key = zlib.crc32(name.encode())
    return [draw(np.random.default_rng(np.random.SeedSequence(0, spawn_key=(key, 3, w)))) for w in range(n)]


def case_draws(quick: bool) -> dict:
    n, d = (2048, D_CNN) if quick else (16384, D_CNN)
    got = _interleaved({
        "qsgd rows": lambda: row_uniforms("qsgd", 0, 3, rows=range(n), width=d, dtype=np.float32),
        "qsgd per worker": lambda: _per_worker_generators("qsgd", n, lambda g: g.random(d, dtype=np.float32)),
        "jitter rows": lambda: row_normals("jitter", 0, 3, rows=range(n), width=1),
        "jitter per worker": lambda: _per_worker_generators("jitter", n, lambda g: g.standard_normal()),
    }, reps=2 if quick else 3)
    return {"workers": n, "d": d, **got}


def case_gossip(quick: bool) -> dict:
    n = 2048 if quick else 16384
    run = _run(n, 1, ["algorithm=gossip", "topology=ring"])
    got = _interleaved({"step": _stepper(run, False), "step with Ξ²": _stepper(run, True)}, reps=2 if quick else 3)
    return {"workers": n, **got, "peak_rss": _peak_rss()}


def case_codec(quick: bool) -> dict:
    n = 2048 if quick else 16384
    timed = ["network=ethernet-10g", "compute_ms=1", "algorithm=choco", "topology=ring"]
    plain = _run(n, 1, [*timed, "compression=none"])
    drawn = _run(n, 1, [*timed, "compression=qsgd:4", "compute_jitter=lognormal:0.5"])
    got = _interleaved({"CHOCO, none": _stepper(plain, False), "CHOCO, qsgd:4 + jitter": _stepper(drawn, False)},
                       reps=2 if quick else 3)
    return {"workers": n, **got}


def case_many(quick: bool) -> dict:
    n = 4096 if quick else 65536
    start = time.perf_counter()
    run = _run(n, 1, ["algorithm=gossip", "topology=ring", "eval_local=16"])
    built = time.perf_counter() - start
    got = _interleaved({"step": _stepper(run, False)}, reps=2 if quick else 3)
    return {"workers": n, "build": built, **got, "peak_rss": _peak_rss()}


CASES = {"draws": case_draws, "gossip": case_gossip, "codec": case_codec, "many": case_many}


def report(res: dict) -> str:
    d, g, c, m = (res.get(k) for k in ("draws", "gossip", "codec", "many"))
    out = []
    if d:
        out += [f"Per-worker draws of one step, n = {d['workers']:,} (threads: {res['threads']}):", "",
                "| draw | a generator per worker | row stream | × faster |", "|---|---|---|---|",
                *(f"| {what} | {d[f'{k} per worker']:.3f} s | {d[f'{k} rows']:.3f} s | "
                  f"{d[f'{k} per worker'] / d[f'{k} rows']:.1f} |"
                  for k, what in (("qsgd", f"qsgd's uniforms, {d['d']:,} a worker (float32)"),
                                  ("jitter", "jitter's normal, one a worker"))), ""]
    if g or c or m:
        out += ["| case | n | step | against | ratio |", "|---|---|---|---|---|"]
    if g:
        out.append(f"| gossip, ring, b = 1: Ξ² every step | {g['workers']:,} | {g['step with Ξ²']:.2f} s | "
                   f"{g['step']:.2f} s without | {g['step with Ξ²'] / g['step']:.2f} |")
    if c:
        out.append(f"| CHOCO, ring, b = 1: qsgd:4 + jitter | {c['workers']:,} | {c['CHOCO, qsgd:4 + jitter']:.2f} s | "
                   f"{c['CHOCO, none']:.2f} s without | {c['CHOCO, qsgd:4 + jitter'] / c['CHOCO, none']:.2f} |")
    if m:
        out.append(f"| gossip, ring, b = 1, eval_local 16 | {m['workers']:,} | {m['step']:.2f} s | "
                   f"peak {m['peak_rss'] / 2**30:.1f} GiB (built in {m['build']:.0f} s) | |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/scale.py", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="n = 2,048 (4,096 for the largest case)")
    ap.add_argument("--only", default=",".join(CASES), help="comma-separated cases: " + ", ".join(CASES))
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--json", type=Path, help="also save the figures here")
    ap.add_argument("--case", choices=list(CASES), help=argparse.SUPPRESS)  # one case, in this process
    args = ap.parse_args(argv)
    if args.case:
        torch.set_num_threads(args.threads)
        print(json.dumps(CASES[args.case](args.quick)))
        return 0
    res = {"threads": args.threads}
    for name in args.only.split(","):
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        cmd = [sys.executable, __file__, "--case", name, "--threads", str(args.threads), *(["--quick"] if args.quick else [])]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode:
            print(f"case {name} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
            return 1
        res[name] = json.loads(done.stdout.strip().splitlines()[-1])
        print(name, res[name], file=sys.stderr, flush=True)
    print(report(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
