"""A suite's wall time with ``--jobs J`` against one run after another (docs/benchmarks.md).

    python benchmarks/suite_jobs.py [--suite topologies] [--seeds 1] [--jobs 2] [--quick]

Runs ``gossamer repro SUITE`` as whole processes, start-up included, one after another in this
order: ``--jobs 1`` with torch's default threads (every core), ``--jobs 1`` with one thread,
``--jobs J`` (J worker processes, the cores shared out). The ratios are the point; the machine
is shared and noisy, so they are measured side by side in one script. Every contender must
write the same runs: their summaries are compared (the ones at equal threads must be equal).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def contenders(jobs: int) -> dict[str, tuple[list[str], dict]]:
    """name → (extra repro arguments, environment changes)."""
    return {"--jobs 1, default threads": ([], {}),
            "--jobs 1, 1 thread": ([], {"OMP_NUM_THREADS": "1"}),
            f"--jobs {jobs}": (["--jobs", str(jobs)], {})}


def summaries(out: Path) -> dict[str, dict]:
    return {run.name: {k: v for k, v in json.loads((run / "summary.json").read_text()).items() if k != "wall_seconds"}
            for run in sorted(out.iterdir()) if (run / "summary.json").is_file()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="topologies")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--quick", action="store_true", help="the suite's --quick version (start-up dominates)")
    a = ap.parse_args(argv)
    rows, runs = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (extra, env) in contenders(a.jobs).items():
            out = Path(tmp) / name.replace(" ", "").replace(",", "-")
            command = [sys.executable, "-m", "gossamer", "repro", a.suite, "--seeds", str(a.seeds), "--out", str(out),
                       *(["--quick"] if a.quick else []), *extra]
            start = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True, env={**os.environ, **env})
            rows.append((name, time.perf_counter() - start))
            runs[name] = summaries(out)
            print(f"{name}: {rows[-1][1]:.1f} s", file=sys.stderr)
    first = rows[0][1]
    names = list(runs)
    same_threads = runs[names[1]] == runs[names[2]] if (os.cpu_count() or 1) // a.jobs == 1 else None
    print(f"`python benchmarks/suite_jobs.py --suite {a.suite} --seeds {a.seeds} --jobs {a.jobs}"
          f"{' --quick' if a.quick else ''}` — {os.cpu_count()} CPU cores, {len(runs[names[0]])} runs\n")
    print("| contender | wall time | × faster than --jobs 1 (default threads) |\n|---|---|---|")
    for name, seconds in rows:
        print(f"| {name} | {seconds:.1f} s | {first / seconds:.2f} |")
    if same_threads is not None:
        print(f"\nSummaries of `--jobs {a.jobs}` (1 thread a process) equal to `--jobs 1, 1 thread`: {same_threads}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
