"""Simulator benchmarks (docs/benchmarks.md): ratios measured side by side in one process.

    python benchmarks/simulator.py [--quick] [--only 1,2,3,4,5] [--json FILE] [--threads T]

1. the simulator vs one process per worker (``gossamer train`` vs torchrun + ``engine=dist``),
   whole-process wall time including start-up;
2. n workers with batch b vs one model with batch n·b (the same FLOPs): step-time ratio;
3. gossip + Ξ² per step as a share of the step time at n = 64;
4. the ``loop`` and ``vmap`` gradient backends, and what ``auto`` picks;
5. peak memory of ResNet-20 training at n = 64 vs n × (params + grads + momentum) + one set of
   activations, and the largest n that fits in this machine's memory (extrapolated).

The machine is shared and noisy: every comparison interleaves its contenders (A B A B ...) and
reports medians. Prints markdown; ``--json`` also saves the raw figures.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from gossamer.config import load_config
from gossamer.data import Dataset
from gossamer.models import build_model
from gossamer.train import Progress, Run, build_run, train_step
from gossamer.workers import choose_backend

# model name -> (input shape of one sample, per-worker batch b)
MODELS = {"mlp": ((1, 40), 16), "cnn1d": ((1, 40), 16), "resnet20": ((3, 32, 32), 8)}


def _median_interleaved(fns: dict, reps: int, warmup: int = 1) -> dict[str, float]:
    """Median seconds per call of each function, calls interleaved A B A B ... (noise hits all alike)."""
    for _ in range(warmup):
        for f in fns.values():
            f()
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def _batch(name: str, n: int, b: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    shape = MODELS[name][0]
    return torch.randn(n, b, *shape, generator=g), torch.randint(0, 10, (n, b), generator=g)


NO_SYNC = ("algorithm=local", "local_steps=1000000")  # local SGD that never averages: compute only


def build(name: str, n: int, b: int, backend: str = "auto", algorithm: tuple[str, ...] = NO_SYNC) -> Run:
    """A run of n workers of ``name`` on random data (one batch per worker), built as `gossamer
    train` builds it; by default with no communication (the compute and the local optimizer)."""
    x, y = _batch(name, n, b)
    data = Dataset(x.flatten(0, 1), y.flatten(), x[0], y[0], 10)
    cfg = load_config(None, [f"workers={n}", f"batch_size={b}", f"model={name}", f"grad_backend={backend}",
                             "momentum=0.9", "nesterov=true", "lr=0.01", "epochs=1", *algorithm])
    return build_run(cfg, data=data)


def sim_step(run: Run, measure: bool = False):
    """One training step of every worker (gradients, local Nesterov SGD and the schedule)."""
    x, y = _batch(run.cfg.model, run.cfg.workers, run.cfg.batch_size)
    progress, t = Progress(), [0]

    def step():
        train_step(run, progress, x, y, t[0], 0.01, measure)
        t[0] += 1
    step.run = run
    return step


def one_model_step(name: str, batch: int):
    """One training step of one model with batch n·b (torch.optim.SGD, Nesterov momentum)."""
    x, y = _batch(name, 1, batch)
    x, y = x[0], y[0]
    torch.manual_seed(0)
    model = build_model(load_config(None, [f"model={name}"]), Dataset(x, y, x, y, 10)).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)

    def step():
        opt.zero_grad(set_to_none=False)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return step


# -- 1. simulator vs one process per worker ------------------------------------------------------

def bench_processes(quick: bool) -> dict:
    n, epochs = 16, (1 if quick else 3)
    args = ["train", "--quiet", "--overwrite", "--set", "algorithm=gossip", "--set", "topology=ring",
            "--set", f"workers={n}", "--set", f"epochs={epochs}", "--set", "model=cnn1d"]
    out = {"workers": n, "epochs": epochs}
    with tempfile.TemporaryDirectory() as tmp:
        cmds = {
            "sim": [sys.executable, "-m", "gossamer", *args, "--out", f"{tmp}/sim"],
            "dist": [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
                     "-m", "gossamer", *args, "--out", f"{tmp}/dist", "--set", "engine=dist"],
        }
        env = {**os.environ, "OMP_NUM_THREADS": "1"}  # torchrun's default; 16 processes share 2 cores
        for k, cmd in cmds.items():
            t = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env if k == "dist" else None)
            out[f"{k}_seconds"] = time.perf_counter() - t
            out[f"{k}_ok"] = proc.returncode == 0
            if proc.returncode:
                out[f"{k}_error"] = (proc.stderr.strip().splitlines() or ["?"])[-1][:200]
            summary = Path(tmp, k, "summary.json")
            if summary.exists():
                out[f"{k}_test_accuracy"] = json.loads(summary.read_text())["test_accuracy"]
    if out["sim_ok"] and out["dist_ok"]:
        out["speedup"] = out["dist_seconds"] / out["sim_seconds"]
    return out


# -- 2. n workers vs one model ---------------------------------------------------------------------

def bench_one_model(quick: bool) -> list[dict]:
    cases = ([("mlp", 16), ("cnn1d", 16), ("resnet20", 4)] if quick else
             [(m, n) for m in MODELS for n in (16, 64)])
    rows = []
    for name, n in cases:
        b = MODELS[name][1] if not (quick and name == "resnet20") else 4
        heavy = name == "resnet20"
        sim = sim_step(build(name, n, b))
        t = _median_interleaved({"sim": sim, "one": one_model_step(name, n * b)},
                                reps=1 if heavy else 10)
        rows.append({"model": name, "workers": n, "batch": b, "backend": sim.run.workers.backend,
                     "sim_ms": 1e3 * t["sim"], "one_ms": 1e3 * t["one"], "ratio": t["sim"] / t["one"]})
        _log(rows[-1])
    return rows


# -- 3. communication overhead ---------------------------------------------------------------------

def bench_comm(quick: bool) -> list[dict]:
    n, rows = 64, []
    for name in ("cnn1d",) if quick else ("mlp", "cnn1d"):
        b = MODELS[name][1]
        compute = sim_step(build(name, n, b))
        w = compute.run.workers
        for topo in ("ring", "one-peer-exponential", "random-regular:4"):
            gossip = build(name, n, b, algorithm=("algorithm=gossip", f"topology={topo}"))
            engine, topology = gossip.engine, gossip.schedule.topology
            t_round = [0]

            def comm():
                engine.gossip_(w.X, topology.mixing(t_round[0]))
                engine.consensus_distance_sq(w.X)
                t_round[0] += 1
            t = _median_interleaved({"compute": compute, "comm": comm}, reps=10 if quick else 15)
            rows.append({"model": name, "topology": topo, "workers": n, "compute_ms": 1e3 * t["compute"],
                         "comm_ms": 1e3 * t["comm"], "share": t["comm"] / (t["compute"] + t["comm"])})
            _log(rows[-1])
    return rows


# -- 4. gradient backends --------------------------------------------------------------------------

def bench_backends(quick: bool, one_model_rows: list[dict]) -> list[dict]:
    rows = []
    for name, n in ([("mlp", 16), ("cnn1d", 16)] if quick else [(m, n) for m in ("mlp", "cnn1d") for n in (16, 64)]):
        b = MODELS[name][1]
        runs = {k: build(name, n, b, backend=k) for k in ("loop", "vmap")}
        t = _median_interleaved({k: sim_step(run) for k, run in runs.items()}, reps=5 if quick else 9)
        auto = choose_backend(runs["loop"].workers.template, n)
        rows.append({"model": name, "workers": n, "batch": b, "loop_ms": 1e3 * t["loop"], "vmap_ms": 1e3 * t["vmap"],
                     "auto": auto, "auto_vs_fastest": t[auto] / min(t.values())})
        _log(rows[-1])
    for r in one_model_rows:  # ResNet-20 has BatchNorm buffers: loop only (measured in benchmark 2)
        if r["model"] == "resnet20":
            rows.append({"model": "resnet20", "workers": r["workers"], "batch": r["batch"], "loop_ms": r["sim_ms"],
                         "vmap_ms": None, "auto": "loop", "auto_vs_fastest": 1.0})
    return rows


# -- 5. memory and scale ---------------------------------------------------------------------------

def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _can_probe_memory() -> bool:
    """Benchmark 5 reads and resets the peak RSS through Linux's /proc (VmHWM, clear_refs)."""
    return os.access("/proc/self/clear_refs", os.W_OK) and Path("/proc/self/status").exists()


def _activation_bytes(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """Bytes of the tensors autograd saves for backward in one forward (one set of activations)."""
    storages = {}

    def pack(t):
        if isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter):
            s = t.untyped_storage()
            storages[s.data_ptr()] = s  # held, so that no address is reused during the forward
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.cross_entropy(model(x), y)
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(s.nbytes() for k, s in storages.items() if k not in param_ptrs)


def memory_probe(n: int, b: int, steps: int) -> dict:
    """Run in a fresh process: peak RSS of `steps` ResNet-20 gossip steps of n workers above the
    RSS before the run existed (the interpreter, torch and the data are not counted)."""
    x, y = _batch("resnet20", 1, b)
    warm = build_model(load_config(None, ["model=resnet20"]), Dataset(x[0], y[0], x[0], y[0], 10))
    act = _activation_bytes(warm, x[0].clone(), y[0])
    F.cross_entropy(warm(x[0]), y[0]).backward()  # loads the kernels before the baseline
    del warm
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # give the warm-up's freed heap back: it must not hide the peak
    base = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
    step = sim_step(build("resnet20", n, b, backend="loop", algorithm=("algorithm=gossip", "topology=ring")))
    engine, X = step.run.engine, step.run.workers.X
    t = time.perf_counter()
    for _ in range(steps):
        step()  # gradients, local step, one gossip round
        engine.consensus_distance_sq(X)
    seconds = (time.perf_counter() - t) / steps
    w = step.run.workers
    peak = (_status_kib("VmHWM") - base) * 1024
    return {"workers": n, "batch": b, "d": w.d, "d_buffers": w.d_buffers, "peak_bytes": peak,
            "state_bytes": n * 3 * w.d * w.X.element_size(), "activation_bytes": act,
            "step_seconds": seconds, "backend": w.backend}


def bench_memory(quick: bool) -> dict:
    b = MODELS["resnet20"][1]
    sizes = (4, 16) if quick else (16, 64)
    probes = []
    for n in sizes:
        cmd = [sys.executable, __file__, "--memory-probe", str(n), str(b)]
        probes.append(json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout))
        _log(probes[-1])
    ref = probes[-1] if quick else next(p for p in probes if p["workers"] == 64)
    minimum = ref["state_bytes"] + ref["activation_bytes"]
    (n1, p1), (n2, p2) = [(p["workers"], p["peak_bytes"]) for p in probes[-2:]]
    per_worker = (p2 - p1) / (n2 - n1)
    fixed = p2 - per_worker * n2
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    budget = total - 2 * 2**30 - 1.5 * 2**30  # 2 GiB for the OS, 1.5 GiB for python + torch + data
    n_max = int((budget - fixed) / per_worker)
    step_per_worker = probes[-1]["step_seconds"] / probes[-1]["workers"]
    return {"probes": probes, "reference_workers": ref["workers"], "minimum_bytes": minimum,
            "peak_vs_minimum": ref["peak_bytes"] / minimum, "per_worker_bytes": per_worker,
            "fixed_bytes": fixed, "memory_bytes": total, "n_max": n_max,
            "n_max_step_seconds": n_max * step_per_worker}


# -- report ------------------------------------------------------------------------------------------

def _log(row) -> None:
    print("  ..", json.dumps(row, default=str), file=sys.stderr, flush=True)


def _mib(x: float) -> str:
    return f"{x / 2**20:.1f} MiB"


def report(res: dict) -> str:
    out = []
    if "processes" in res:
        p = res["processes"]
        out += ["## 1. Simulator vs one process per worker", "",
                f"n = {p['workers']}, MNIST-1D CNN, gossip on a ring, {p['epochs']} epochs, whole process "
                "(start-up included). Target: simulator ≥ 5× faster.", "",
                "| run | wall time | test acc |", "|---|---|---|"]
        for k, label in (("sim", "`gossamer train` (sim, 1 process)"), ("dist", "torchrun, 16 gloo processes (dist)")):
            wall = f"{p[k + '_seconds']:.1f} s" if p[k + "_ok"] else f"failed: {p.get(k + '_error')}"
            out.append(f"| {label} | {wall} | {p.get(k + '_test_accuracy', '—')} |")
        out += ["", f"**Speed-up: {p['speedup']:.1f}×**" if "speedup" in p else "**Speed-up: not measured (a run failed)**", ""]
    if "one_model" in res:
        out += ["## 2. n workers with batch b vs one model with batch n·b", "",
                "Step = forward, backward and Nesterov-momentum SGD. Target: ratio ≤ 1.0.", "",
                "| model | n | b | backend | n workers | one model (batch n·b) | ratio |", "|---|---|---|---|---|---|---|"]
        out += [f"| {r['model']} | {r['workers']} | {r['batch']} | {r['backend']} | {r['sim_ms']:.1f} ms | "
                f"{r['one_ms']:.1f} ms | {r['ratio']:.2f} |" for r in res["one_model"]]
        out.append("")
    if "comm" in res:
        out += ["## 3. Gossip + Ξ² as a share of the step time (n = 64)", "", "Target ≤ 5 %.", "",
                "| model | topology | compute step | gossip + Ξ² | share |", "|---|---|---|---|---|"]
        out += [f"| {r['model']} | {r['topology']} | {r['compute_ms']:.2f} ms | {r['comm_ms']:.3f} ms | "
                f"{100 * r['share']:.1f} % |" for r in res["comm"]]
        out.append("")
    if "backends" in res:
        out += ["## 4. Gradient backends", "", "Target: `auto` within 5 % of the faster.", "",
                "| model | n | b | loop | vmap | auto picks | auto / fastest |", "|---|---|---|---|---|---|---|"]
        out += [f"| {r['model']} | {r['workers']} | {r['batch']} | {r['loop_ms']:.1f} ms | "
                + (f"{r['vmap_ms']:.1f} ms" if r["vmap_ms"] is not None else "n/a (BatchNorm)")
                + f" | {r['auto']} | {r['auto_vs_fastest']:.2f} |" for r in res["backends"]]
        out.append("")
    if "memory" in res:
        m = res["memory"]
        out += ["## 5. Memory and scale (ResNet-20, gossip on a ring, loop backend)", "",
                "Peak RSS above the peak before the run was built. Minimum = n × (params + grads + "
                "momentum) × 4 B + one worker's saved activations.", "",
                "| n | b | peak | n × (params + grads + momentum) | one set of activations | peak / minimum | step |",
                "|---|---|---|---|---|---|---|"]
        for p in m["probes"]:
            mn = p["state_bytes"] + p["activation_bytes"]
            out.append(f"| {p['workers']} | {p['batch']} | {_mib(p['peak_bytes'])} | {_mib(p['state_bytes'])} | "
                       f"{_mib(p['activation_bytes'])} | {p['peak_bytes'] / mn:.2f} | {p['step_seconds']:.1f} s |")
        out += ["", f"**Peak / minimum at n = {m['reference_workers']}: {m['peak_vs_minimum']:.2f}** (target ≤ 1.5).", "",
                f"Per worker: {_mib(m['per_worker_bytes'])} (slope between the two largest probes); fixed: "
                f"{_mib(m['fixed_bytes'])}; memory {m['memory_bytes'] / 2**30:.1f} GiB, of which 3.5 GiB kept for "
                f"the OS, the interpreter, torch and the data. **Largest n (extrapolated): ≈ {m['n_max']}**, at "
                f"≈ {m['n_max_step_seconds'] / 60:.0f} min per step on this machine (step time linear in n).", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/simulator.py", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller cases, fewer repetitions (~2 min)")
    ap.add_argument("--only", default="1,2,3,4,5", help="comma-separated benchmark numbers")
    ap.add_argument("--json", type=Path, help="also save the raw figures here")
    ap.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice). On a machine "
                    "whose cores other processes also use, 1 avoids OpenMP threads waiting on descheduled peers")
    ap.add_argument("--memory-probe", nargs=2, type=int, metavar=("N", "B"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
        os.environ["OMP_NUM_THREADS"] = str(a.threads)  # for the subprocesses (benchmarks 1 and 5)
    if a.memory_probe:
        print(json.dumps(memory_probe(*a.memory_probe, steps=1)))
        return 0
    only = {int(s) for s in a.only.split(",")}
    start = time.perf_counter()
    res: dict = {"command": "python benchmarks/simulator.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                 "machine": f"{os.cpu_count()} CPU cores, {platform.processor() or platform.machine()}, "
                            f"torch {torch.__version__}, {torch.get_num_threads()} threads"}
    if 1 in only:
        res["processes"] = bench_processes(a.quick)
    if 2 in only or 4 in only:
        res["one_model"] = bench_one_model(a.quick)
    if 3 in only:
        res["comm"] = bench_comm(a.quick)
    if 4 in only:
        res["backends"] = bench_backends(a.quick, res["one_model"])
    if 5 in only and _can_probe_memory():
        res["memory"] = bench_memory(a.quick)
    elif 5 in only:
        print("benchmark 5 skipped: it reads the peak RSS from Linux's /proc", file=sys.stderr)
    res["seconds"] = time.perf_counter() - start
    print(f"`{res['command']}` — {res['machine']}; {res['seconds']:.0f} s\n")
    print(report(res))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
