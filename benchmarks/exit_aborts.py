"""How often a two-process run aborts at interpreter exit: run an example N times on 2 processes
(torchrun's environment set by hand, one node, loopback) and count the exit statuses.

The defect it measures (docs/distributed.md): a gloo work destroyed on gloo's worker thread while
the interpreter finalizes ends in "terminate called without an active exception" (SIGABRT, −6).

    python benchmarks/exit_aborts.py --runs 200
    python benchmarks/exit_aborts.py --runs 100 --src OTHER_TREE/src   # another checkout, to compare

Prints a line every 20 runs and, at the end, the runs and each non-zero status with its count; a
failed run's folder (with its stderr) is kept under --out.
"""

import argparse
import collections
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(folder: Path, argv: list[str], src: Path) -> list[tuple[int, str]]:
    """(exit status, stderr) of each of the 2 processes."""
    port = free_port()
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(src)}
        procs.append(subprocess.Popen([sys.executable, *argv], cwd=folder, env=env, text=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    try:
        return [(p.wait(300), p.communicate()[1]) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="the gossamer source tree to run")
    parser.add_argument("--out", type=Path, default=Path("exit-aborts"))
    parser.add_argument("argv", nargs="*", default=[str(ROOT / "examples" / "local_sgd.py"), "--steps", "64",
                                                    "--local-steps", "8"],
                        help="the script and its arguments (default: examples/local_sgd.py, 64 steps)")
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    statuses: collections.Counter = collections.Counter()
    for i in range(args.runs):
        folder = args.out / str(i)
        folder.mkdir(parents=True)
        results = run_once(folder, args.argv, args.src.resolve())
        for rank, (code, err) in enumerate(results):
            statuses[code] += 1
            if code:
                (folder / f"stderr-rank{rank}.txt").write_text(err)
        if all(code == 0 for code, _ in results):
            shutil.rmtree(folder)
        if (i + 1) % 20 == 0:
            print(f"{i + 1} runs: exit statuses {dict(statuses)}", flush=True)
    failed = {code: count for code, count in statuses.items() if code}
    print(f"{args.runs} runs of 2 processes: {sum(failed.values())} non-zero exits {failed or ''}")


if __name__ == "__main__":
    main()
