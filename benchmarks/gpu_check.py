"""The GPU check: one script, under 8 minutes on one GPU, that writes ``gpu-check.json`` and
``gpu-check.md`` into ``--out``:

1. the CUDA tests (``pytest -m cuda``, tests/test_cuda.py): the simulator on the GPU equals the CPU
   run in float64 to 1e-10 (allreduce, local, gossip, choco); loop = vmap with BatchNorm; no host
   synchronisation in a step whose metrics are not due;
2. the simulator on the GPU (benchmarks/simulator.py's builders): ResNet-20 at n = 16 and 64,
   b = 32 — images/s of the n workers (both gradient backends) against one ResNet-20 on the union
   batch n·b, and the peak memory of each;
3. a timed slice of Kong et al.'s n = 64 ResNet-20 config (configs/paper, ring) on random
   CIFAR-shaped data (50,000 training images), projected to its 300 epochs;
4. the ceiling of batched runs (benchmarks/simulator.py's benchmark 9): one step of K·n rows
   against K steps of n rows — what decides whether issue 31's batched simulator is worth building
   on a GPU (on the CPU it is 1.0–1.5×).
5. the floor (benchmarks/simulator.py's benchmark 10, issue 46): gossamer's step of n workers
   (the 1-D CNN at n = 8 to 64, the character Transformer at n = 8; gossip on a ring, b = 16)
   against one model's step on the union batch, the step's split, and the hand-written batched
   CNN forms.

    python benchmarks/gpu_check.py --out gpu-check                    # on a GPU
    python benchmarks/gpu_check.py --out /tmp/check --device cpu --smoke  # rehearsal, a minute on CPU

``--smoke`` shrinks every case (n = 2 and 4, b = 4, 1,000 images, 2 steps): it checks the script,
not the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import simulator  # noqa: E402  (benchmarks/simulator.py: its builders and timers)

from gossamer.config import load_config  # noqa: E402
from gossamer.data import Dataset  # noqa: E402
from gossamer.train import build_run  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
KONG = ROOT / "configs" / "paper" / "kong2021-cifar10-resnet20-ring.yaml"


def cuda_tests(device: str) -> dict:
    """Item 1: ``pytest -m cuda`` on ``device``; its exit status and its last line."""
    env = {**os.environ, "GOSSAMER_TEST_DEVICE": device}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider",
                           str(ROOT / "tests" / "test_cuda.py")], capture_output=True, text=True, env=env, cwd=ROOT)
    lines = proc.stdout.strip().splitlines()
    return {"exit_status": proc.returncode, "result": lines[-1] if lines else proc.stderr.strip()[-300:],
            "failures": [line for line in lines if line.startswith("FAILED")]}


def _peak(fn) -> int | None:
    """Peak device memory of one call of ``fn`` (None on CPU)."""
    if simulator.DEVICE.type != "cuda":
        fn()
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def simulator_throughput(smoke: bool) -> list[dict]:
    """Item 2: ResNet-20, n workers (loop and vmap) against one model on the union batch."""
    rows = []
    for n, b in ((2, 4), (4, 4)) if smoke else ((16, 32), (64, 32)):
        steps = {k: simulator.sim_step(simulator.build("resnet20", n, b, backend=k)) for k in ("loop", "vmap")}
        steps["one"] = simulator.one_model_step("resnet20", n, b)
        seconds = simulator._median_interleaved(steps, reps=2 if smoke else 10, warmup=1 if smoke else 3)
        row = {"workers": n, "batch": b}
        for k, step in steps.items():
            row[f"{k}_images_per_second"] = n * b / seconds[k]
            row[f"{k}_peak_bytes"] = _peak(step)
        rows.append(row)
        print("  ..", json.dumps(row), file=sys.stderr, flush=True)
    return rows


def kong_slice(smoke: bool) -> dict:
    """Item 3: steps of Kong et al.'s ring config at n = 64 on random CIFAR-shaped data, timed and
    projected to the config's epochs."""
    train_size, workers = (1000, 4) if smoke else (50_000, 64)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(train_size, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (train_size,), generator=g)
    data = Dataset(x.to(simulator.DEVICE), y.to(simulator.DEVICE), x[:1000].to(simulator.DEVICE),
                   y[:1000].to(simulator.DEVICE), 10)
    cfg = load_config(KONG, [f"workers={workers}", f"device={simulator.DEVICE.type}", "data_dir=unused"])
    run = build_run(cfg, data=data)
    step = simulator.sim_step(run)
    timed = 2 if smoke else 20
    seconds = simulator._median_interleaved({"step": step}, reps=timed, warmup=1 if smoke else 5)["step"]
    total = run.steps_per_epoch * cfg.epochs
    return {"config": KONG.name, "workers": workers, "batch": cfg.batch_size, "steps_per_epoch": run.steps_per_epoch,
            "epochs": cfg.epochs, "step_seconds": seconds, "timed_steps": timed,
            "projected_hours": total * seconds / 3600}


def report(res: dict) -> str:
    t = res["cuda_tests"]
    out = [f"# GPU check — {res['machine']}", "", f"`{res['command']}` ({res['seconds']:.0f} s)", "",
           f"## 1. CUDA tests: {'passed' if t['exit_status'] == 0 else 'FAILED'}", "", f"`pytest -m cuda`: {t['result']}",
           *[f"- {f}" for f in t["failures"]], "",
           "## 2. The simulator: ResNet-20, n workers against one model on the union batch", "",
           "| n | b | loop img/s | vmap img/s | one model img/s | vmap / one | peak: loop / vmap / one |",
           "|---|---|---|---|---|---|---|"]
    mib = (lambda v: f"{v / 2**20:.0f} MiB" if v is not None else "—")
    for r in res["throughput"]:
        out.append(f"| {r['workers']} | {r['batch']} | {r['loop_images_per_second']:,.0f} | "
                   f"{r['vmap_images_per_second']:,.0f} | {r['one_images_per_second']:,.0f} | "
                   f"{r['vmap_images_per_second'] / r['one_images_per_second']:.2f} | "
                   f"{mib(r['loop_peak_bytes'])} / {mib(r['vmap_peak_bytes'])} / {mib(r['one_peak_bytes'])} |")
    k = res["kong"]
    out += ["", f"## 3. Kong et al.'s ring config, n = {k['workers']}, timed slice", "",
            f"{k['config']}: b = {k['batch']}, {k['steps_per_epoch']} steps an epoch; median of {k['timed_steps']} "
            f"steps: {k['step_seconds'] * 1e3:.1f} ms a step (metrics every step, as the config asks) → "
            f"**{k['projected_hours']:.2f} h for its {k['epochs']} epochs** (evaluations not included).", "",
            simulator.report({"batching": res["batching"]}).replace("## 9.", "## 4."),
            simulator.report({"floor": res["floor"]}).replace("## 10.", "## 5.")]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/gpu_check.py", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for gpu-check.json and gpu-check.md")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--smoke", action="store_true", help="tiny cases: rehearse the script (e.g. on CPU)")
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; use --device cpu --smoke to rehearse", file=sys.stderr)
        return 2
    simulator.DEVICE = torch.device(a.device)
    torch.manual_seed(0)
    start = time.perf_counter()
    gpu = torch.cuda.get_device_name() if a.device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    res = {"command": "python benchmarks/gpu_check.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "machine": f"{gpu}, torch {torch.__version__}", "cuda_tests": cuda_tests(a.device),
           "throughput": simulator_throughput(a.smoke), "kong": kong_slice(a.smoke),
           "batching": simulator.bench_batching(a.smoke), "floor": simulator.bench_floor(a.smoke, smoke=a.smoke)}
    res["seconds"] = time.perf_counter() - start
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "gpu-check.json").write_text(json.dumps(res, indent=1))
    (a.out / "gpu-check.md").write_text(report(res) + "\n")
    print(report(res))
    return 0 if res["cuda_tests"]["exit_status"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
