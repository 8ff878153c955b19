"""The time model against a real bandwidth-limited network (docs/benchmarks.md).

    sudo python benchmarks/network.py [--rates 100mbit,1gbit] [--repeat 2] [--json FILE] [--only CASE,...]

Four gloo processes (``engine: dist``, one worker each) train a 1.01 M-parameter MLP on random
data inside a network namespace whose loopback is rate-limited with ``tc`` (a token bucket,
``tbf``), for all-reduce SGD, local SGD with H = 8, ring gossip and one-peer exponential gossip.
Each run reports the communication time the dist engine measured (``comm_seconds``: wall time
in the algorithm's collectives) and the time the α–β model predicts for the same operators
(``sim_seconds_comm``, measurement traffic left out on both sides). In the straggler cases one
process sleeps for its modelled extra compute, and rank 0's measured time in its collectives
includes its waits for it: the model's counterpart is the communication plus worker 0's waits
(``sim_seconds_comm`` + its idle time on the per-worker clocks).

All four processes share the one loopback queue of rate R, and in every operator here all
workers send at once, so the model's per-worker link is β = R / 4. The latency α is calibrated
first, without a rate limit, from all-reduces of an 11,310-parameter MLP (45 KB, whose bytes
take microseconds on an unlimited loopback): α = (measured time per all-reduce) / (2 (P − 1)).
Neither is fitted to the rate-limited runs.

``--overlap``: DiLoCo's outer all-reduce in flight through the next inner phase, for real
(``outer_overlap``: the all-reduce started with ``async_op`` and waited for a round later).
Blocking DiLoCo, delayed and eager with H = 8 at a rate where the all-reduce takes about one
inner phase; the compute is real (a batch of OVERLAP_BATCH on the same MLP; the clock measures it,
``compute_ms`` unset). Each rank marks the wall clock and the model's clock at every outer
round; the per-round figures are medians over the rounds after the first.

Needs root, ``ip netns`` and ``tc``; where they cannot be used the script says so and exits 0
without figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

P = 4  # processes, one worker each
INPUTS = 10_000  # MLP 10,000 → 100 → 100 → 10: 1,011,210 parameters
CASES = {
    "all-reduce": (["algorithm=allreduce"], 8),
    "local SGD H=8": (["algorithm=local", "local_steps=8"], 16),
    "ring gossip": (["algorithm=gossip", "topology=ring"], 8),
    "one-peer-exp gossip": (["algorithm=gossip", "topology=one-peer-exponential"], 8),
    # one slow process of four (worker 1, drawn from seed 0) at 3×: it sleeps 2 × 200 ms a step
    "all-reduce 1 slow of 4 (3×)": (["algorithm=allreduce", "compute_ms=200", "slow_workers=0.25@3"], 8),
    "ring gossip 1 slow of 4 (3×)": (["algorithm=gossip", "topology=ring", "compute_ms=200", "slow_workers=0.25@3"], 8),
}  # name: (overrides, steps)
BATCH = 4
OVERLAP_H = 8  # inner steps a round
OVERLAP_BATCH = 128  # a step's real compute: an inner phase about one all-reduce at 1 Gbit/s shared by 4
OVERLAP_ROUNDS = 6
OVERLAP = {"DiLoCo (blocking)": "none", "DiLoCo delayed": "delayed", "DiLoCo eager": "eager"}


def overrides(case: list[str], steps: int, bandwidth_gbit: float, latency_us: float, batch: int = BATCH,
              compute: list[str] = ("compute_ms=1",)) -> list[str]:
    """The run of ``case``; ``compute``: the model's compute (none: measured)."""
    return [f"workers={P}", "engine=dist", "dist_backend=gloo", "model=mlp", f"batch_size={batch}", "epochs=1",
            f"metrics_every={steps}", "momentum=0.9", "lr=0.01", "grad_backend=loop",
            f"network.bandwidth={bandwidth_gbit}", f"network.latency={latency_us}", "network.count_metrics=false",
            *compute, *case]


# ---------------------------------------------------------------- one process (run by each rank)


def worker(spec_file: str) -> None:
    import torch

    from gossamer.config import load_config
    from gossamer.data import Dataset
    from gossamer.train import build_run, train

    spec = json.loads(Path(spec_file).read_text())
    cfg = load_config(None, spec["overrides"])
    g = torch.Generator().manual_seed(0)
    n_train = spec["steps"] * P * spec.get("batch", BATCH)
    data = Dataset(torch.randn(n_train, 1, spec["inputs"], generator=g), torch.randint(0, 10, (n_train,), generator=g),
                   torch.randn(8, 1, spec["inputs"], generator=g), torch.randint(0, 10, (8,), generator=g), 10)
    run, states = build_run(cfg, data=data), []
    marks = mark_rounds(run, spec["round"]) if "round" in spec else []
    summary = train(cfg, run, on_checkpoint=states.append)
    if run.engine.is_root:
        summary["root_idle_seconds"] = states[-1]["clock"]["idle"][0]
        summary["round_marks"] = marks
        Path(spec["out"]).write_text(json.dumps(summary))
    run.engine.close()


def mark_rounds(run, H: int) -> list[tuple[float, float]]:
    """(wall clock, the model's clock) after every H-th step: the schedule's after_step wrapped."""
    after_step, marks = run.schedule.after_step, []

    def marked(engine, X, step):
        out = after_step(engine, X, step)
        if (step.t + 1) % H == 0:
            marks.append((time.perf_counter(), run.clock.now))
        return out
    run.schedule.after_step = marked
    return marks


# ---------------------------------------------------------------- the namespace and its rate limit


def sh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True)


class Namespace:
    """A network namespace with its loopback up; ``limit(rate)`` puts a token bucket on it."""

    def __init__(self):
        self.name = f"gossamer-bench-{os.getpid()}"

    def __enter__(self) -> Namespace:
        for cmd in (["ip", "netns", "add", self.name], ["ip", "netns", "exec", self.name, "ip", "link", "set", "lo", "up"]):
            r = sh(*cmd)
            if r.returncode:
                self.__exit__()
                raise OSError(f"`{' '.join(cmd)}` failed: {r.stderr.strip() or r.returncode}")
        return self

    def __exit__(self, *exc) -> None:
        sh("ip", "netns", "del", self.name)

    def limit(self, rate: str | None) -> None:
        """tbf at ``rate`` (e.g. 100mbit) with a queue deep enough never to drop; None: no limit.
        The bucket holds at least four of the loopback's 64 KiB packets: tbf drops a packet larger
        than its bucket, and TCP would then retransmit it forever."""
        sh("ip", "netns", "exec", self.name, "tc", "qdisc", "del", "dev", "lo", "root")
        if rate is None:
            return
        bits = parse_rate(rate)
        burst = max(256 * 1024, int(bits / 8 / 1000))  # four loopback packets, or a millisecond of traffic
        r = sh("ip", "netns", "exec", self.name, "tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", rate,
               "burst", str(burst), "latency", "5s")
        if r.returncode:
            raise OSError(f"tc qdisc add ... tbf rate {rate} failed: {r.stderr.strip() or r.returncode}")

    def run(self, spec: dict, timeout: float) -> dict:
        """The four ranks of one training run inside the namespace; rank 0's summary."""
        with tempfile.TemporaryDirectory() as tmp:
            spec_file, out = Path(tmp) / "spec.json", Path(tmp) / "summary.json"
            spec_file.write_text(json.dumps({**spec, "out": str(out)}))
            port = free_port()
            procs = []
            for rank in range(P):
                env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(P),
                       "LOCAL_WORLD_SIZE": str(P), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "OMP_NUM_THREADS": "1"}
                procs.append(subprocess.Popen(["ip", "netns", "exec", self.name, sys.executable, __file__,
                                               "--worker", str(spec_file)], env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, text=True))
            try:
                for p in procs:
                    _, err = p.communicate(timeout=timeout)
                    if p.returncode:
                        raise RuntimeError(f"a rank failed ({p.returncode}): {err.strip()[-2000:]}")
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            return json.loads(out.read_text())


def parse_rate(rate: str) -> float:
    """bits per second of a tc rate such as 100mbit or 1gbit."""
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3}
    for unit, factor in units.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * factor
    raise ValueError(f"--rates takes values like 100mbit or 1gbit, got {rate}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unavailable() -> str | None:
    """Why bandwidth limits cannot be set here, or None."""
    if sys.platform != "linux":
        return "network namespaces and tc are Linux only"
    if os.geteuid() != 0:
        return "creating a network namespace and a qdisc needs root"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found (iproute2)"
    return None


# ---------------------------------------------------------------- the measurement


def calibrate(ns: Namespace, timeout: float) -> float:
    """α in µs: an unlimited loopback, all-reduces of a 45 KB model (bandwidth negligible)."""
    steps = 40
    spec = {"overrides": overrides(["algorithm=allreduce"], steps, 1000.0, 0.0), "steps": steps, "inputs": 1}
    ns.limit(None)
    summary = ns.run(spec, timeout)
    return summary["comm_seconds"] / steps / (2 * (P - 1)) * 1e6


def measure(rates: list[str], repeat: int, timeout: float, names: list[str], log=print) -> dict:
    results = {"rates": {}, "repeat": repeat, "processes": P}
    with Namespace() as ns:
        alphas = [calibrate(ns, timeout) for _ in range(repeat)]
        alpha = statistics.median(alphas)
        results["latency_us"], results["latency_us_runs"] = alpha, alphas
        log(f"calibrated α = {alpha:.0f} µs per message (runs: {', '.join(f'{a:.0f}' for a in alphas)})")
        for rate in rates:
            ns.limit(rate)
            beta_gbit = parse_rate(rate) / P / 1e9
            rows = {}
            for name in names:
                case, steps = CASES[name]
                spec = {"overrides": overrides(case, steps, beta_gbit, alpha), "steps": steps, "inputs": INPUTS}
                runs = []
                for _ in range(repeat):
                    started = time.perf_counter()
                    s = ns.run(spec, timeout)
                    runs.append({"model": s["sim_seconds_comm"] + s["root_idle_seconds"], "measured": s["comm_seconds"],
                                 "parameters": s["parameters"], "wall": time.perf_counter() - started})
                    log(f"{rate:>8} {name:<22} model {runs[-1]['model']:8.3f} s   measured {runs[-1]['measured']:8.3f} s")
                rows[name] = runs
            results["rates"][rate] = rows
    return results


def measure_overlap(rate: str, repeat: int, timeout: float, log=print) -> dict:
    """Per-round wall time and the model's, for each of OVERLAP, at ``rate``."""
    steps = OVERLAP_H * OVERLAP_ROUNDS
    results = {"rate": rate, "repeat": repeat, "processes": P, "cases": {}}
    with Namespace() as ns:
        alpha = calibrate(ns, timeout)
        results["latency_us"] = alpha
        ns.limit(rate)
        beta_gbit = parse_rate(rate) / P / 1e9
        for name, overlap in OVERLAP.items():
            case = ["algorithm=diloco", f"local_steps={OVERLAP_H}", f"outer_overlap={overlap}"]
            spec = {"overrides": overrides(case, steps, beta_gbit, alpha, batch=OVERLAP_BATCH, compute=[]),
                    "steps": steps, "inputs": INPUTS, "round": OVERLAP_H, "batch": OVERLAP_BATCH}
            runs = []
            for _ in range(repeat):
                marks = ns.run(spec, timeout)["round_marks"]
                rounds = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(marks[1:], marks[2:])]  # after the first
                runs.append({"measured": statistics.median(w for w, _ in rounds),
                             "model": statistics.median(m for _, m in rounds)})
                log(f"{rate:>8} {name:<18} a round: model {runs[-1]['model']:.3f} s   "
                    f"measured {runs[-1]['measured']:.3f} s")
            results["cases"][name] = runs
    return results


def cells(runs: list[dict]) -> str:
    """model | measured median (min–max) | model / measured, of a case's runs."""
    model = statistics.median(r["model"] for r in runs)
    measured = [r["measured"] for r in runs]
    med = statistics.median(measured)
    return f"{model:.3f} | {med:.3f} ({min(measured):.3f}–{max(measured):.3f}) | {model / med:.2f}"


def overlap_table(results: dict) -> str:
    lines = [f"{results['rate']}, α = {results['latency_us']:.0f} µs (calibrated), H = {OVERLAP_H}, batch "
             f"{OVERLAP_BATCH}; {results['repeat']} run(s) per case, median (min–max) of the per-round medians", "",
             "| case | model, a round (s) | measured, a round (s) | model / measured |", "|---|---|---|---|"]
    lines += [f"| {name} | {cells(runs)} |" for name, runs in results["cases"].items()]
    return "\n".join(lines)


def table(results: dict) -> str:
    lines = [f"α = {results['latency_us']:.0f} µs (calibrated), β = rate / {results['processes']} per worker; "
             f"{results['repeat']} run(s) per case, measured as median (min–max)", "",
             "| rate | case | steps | model (s) | measured (s) | model / measured |", "|---|---|---|---|---|---|"]
    lines += [f"| {rate} | {name} | {CASES[name][1]} | {cells(runs)} |"
              for rate, rows in results["rates"].items() for name, runs in rows.items()]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", help="loopback rates, comma-separated (tc syntax; default 100mbit,1gbit, and 1gbit "
                                   "with --overlap)")
    p.add_argument("--repeat", type=int, default=2, help="runs per case (medians reported)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per run")
    p.add_argument("--json", help="also write the raw figures here")
    p.add_argument("--only", help="the cases to run, comma-separated names (default: all)")
    p.add_argument("--overlap", action="store_true",
                   help="DiLoCo blocking, delayed and eager a round, at the first of --rates (default 1gbit)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.worker)
        return 0
    why = unavailable()
    names = args.only.split(",") if args.only else list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown or (args.only and args.overlap):
        print(f"--only: unknown case {unknown[0]!r}; choose from: {', '.join(CASES)}" if unknown else
              "--only chooses among the time-model cases; --overlap runs its own three", file=sys.stderr)
        return 2
    if why is None:
        try:
            if args.overlap:
                results = measure_overlap((args.rates or "1gbit").split(",")[0], args.repeat, args.timeout)
            else:
                results = measure((args.rates or "100mbit,1gbit").split(","), args.repeat, args.timeout, names)
        except OSError as e:
            why = str(e)
    if why is not None:
        print(f"bandwidth limits cannot be set on this machine: {why}; no figures")
        return 0
    print()
    print(overlap_table(results) if args.overlap else table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
