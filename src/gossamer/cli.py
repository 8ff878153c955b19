"""Command line: ``gossamer train | topology | compare | demo``.

Bad input exits with status 2 and one line ``gossamer: error: ...`` (set GOSSAMER_DEBUG=1 for the
traceback); a diverged run exits with status 1 and keeps its last good checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from .config import load_config
from .report import RunDir, comparison_table, read_summary
from .topology import analyse, build_topology
from .train import Diverged, build_run, train


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse prints usage too)
        raise SystemExit(_fail(message, 2))


def _fail(message: str, code: int) -> int:
    print(f"gossamer: error: {message}", file=sys.stderr)
    return code


def _default_out(prefix: str) -> Path:
    return Path("runs") / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_training(cfg, out: Path, overwrite: bool, progress: bool = True) -> dict:
    """Train one config into a run directory and return its summary.

    The run is built (and so every option checked) before the directory is touched."""
    run = build_run(cfg)
    run_dir = RunDir(out, overwrite)
    run_dir.write_config(cfg)
    try:
        summary = train(cfg, run, on_row=run_dir.row, on_checkpoint=run_dir.checkpoint, progress=progress)
    except Diverged as e:
        kept = "; last good state kept in " + str(out / "checkpoint.pt") if (out / "checkpoint.pt").exists() else ""
        raise Diverged(f"{e}{kept}") from None
    finally:
        run_dir.close()
    run_dir.write_summary(summary)
    return summary


def cmd_train(args) -> int:
    cfg = load_config(args.config, args.set)
    out = Path(args.out) if args.out else _default_out(f"{cfg.algorithm}-n{cfg.workers}")
    summary = run_training(cfg, out, args.overwrite, progress=not args.quiet)
    print(json.dumps({k: summary[k] for k in ("test_accuracy", "test_accuracy_local_mean",
                                                "final_consensus_distance_sq", "comm_rounds")}))
    print(f"run written to {out}")
    return 0


def cmd_topology(args) -> int:
    info = analyse(build_topology(args.name, args.n, seed=args.seed))
    if args.json:
        print(json.dumps(info))
    else:
        print("\n".join(f"{k:>20}: {v}" for k, v in info.items()))
    return 0


def cmd_compare(args) -> int:
    print(comparison_table({str(d): read_summary(d) for d in args.runs}))
    return 0


DEMO_RUNS = {"allreduce": ["algorithm=allreduce"], "gossip-ring": ["algorithm=gossip", "topology=ring"]}


def cmd_demo(args) -> int:
    """16 workers on MNIST-1D: All-Reduce SGD vs gossip SGD on a ring, then a comparison table."""
    out = Path(args.out) if args.out else _default_out("demo")
    summaries = {}
    for name, overrides in DEMO_RUNS.items():
        epochs = [f"epochs={args.epochs}"] if args.epochs else []
        cfg = load_config(None, ["workers=16", *epochs, *overrides])
        print(f"training {name}: 16 workers, {cfg.model} on {cfg.dataset}, {cfg.epochs} epochs ...", flush=True)
        summaries[name] = run_training(cfg, out / name, args.overwrite)
    print()
    print(comparison_table(summaries))
    print(f"\nruns written to {out}; compare again with: gossamer compare {out}/*")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="gossamer", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    t = sub.add_parser("train", help="train n workers from a YAML config and --set overrides")
    t.add_argument("config", nargs="?", help="YAML config file (defaults apply to missing keys)")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    t.add_argument("--out", help="run directory (default runs/ALGORITHM-nN-TIME)")
    t.add_argument("--overwrite", action="store_true", help="replace the run files in a non-empty --out")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.set_defaults(func=cmd_train)

    g = sub.add_parser("topology", help="mixing matrix analysis: spectral gap, p, rounds to halve")
    g.add_argument("name", help="ring, torus, exponential, one-peer-exponential, random-regular[:D], ...")
    g.add_argument("-n", type=int, required=True, help="number of workers")
    g.add_argument("--seed", type=int, default=0, help="seed of random graphs")
    g.add_argument("--json", action="store_true", help="one JSON object")
    g.set_defaults(func=cmd_topology)

    c = sub.add_parser("compare", help="table of finished runs")
    c.add_argument("runs", nargs="+", help="run directories")
    c.set_defaults(func=cmd_compare)

    d = sub.add_parser("demo", help="All-Reduce vs ring gossip, 16 workers, MNIST-1D (about two minutes)")
    d.add_argument("--out", help="where the two runs go (default runs/demo-TIME)")
    d.add_argument("--epochs", type=int, help="epochs per run (default: the config default, 40)")
    d.add_argument("--overwrite", action="store_true")
    d.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:  # ConfigError, TopologyError and bad data/model names
        if os.environ.get("GOSSAMER_DEBUG"):
            raise
        return _fail(str(e), 2)
    except Diverged as e:
        return _fail(str(e), 1)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)


if __name__ == "__main__":
    sys.exit(main())
