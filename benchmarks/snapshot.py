"""Every generated test case's metric rows and summary, written to a folder and compared between
two folders: how an architecture change shows that it changed no recorded number (or which ones).

    python benchmarks/snapshot.py write runs/snap-before          # on the old tree
    python benchmarks/snapshot.py write runs/snap-after           # on the new one
    python benchmarks/snapshot.py compare runs/snap-before runs/snap-after
    python benchmarks/snapshot.py write runs/snap32 --set dtype=float32   # every case with a key changed

The cases are tests/cases.py's (every algorithm × optimizer and compressing algorithm × codec the
config accepts, and the option variants) plus :data:`EXTRA` (the keys that draw from their own
random streams). ``compare`` prints, per case, "same" or the first keys that differ (wall times
are left out); it exits 1 if any case differs or is missing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from cases import SHORT, all_cases  # noqa: E402

# the variants that draw from a stream of their own besides the epoch shuffle
EXTRA = {
    "validation": ["algorithm=local", "local_steps=2", "validation_fraction=0.2"],
    "eval-local-2": ["algorithm=gossip", "topology=ring", "eval_local=2"],
    "random-matching-odd": ["algorithm=gossip", "topology=random-matching", "workers=5"],
    "groups-2": ["algorithm=gossip", "topology=groups:2"],
    "ad-psgd-random-matching-odd": ["algorithm=ad-psgd", "topology=random-matching", "workers=5"],
    "gossip-faults-events": ["algorithm=gossip", "topology=exponential", "workers=8", "faults.events=[1@2-7]"],
    "local-faults-events": ["algorithm=local", "local_steps=2", "faults.events=[1@2-7,2@3-9]"],
    "diloco-faults-events": ["algorithm=diloco", "local_steps=2", "faults.events=[1@2-7]"],
}
UNTIMED = ("wall_seconds", "comm_seconds", "comm_metrics_seconds")


def cases() -> dict[str, list[str]]:
    return {**all_cases(), **EXTRA}


def write(out: Path, extra: list[str]) -> None:
    from gossamer.config import load_config
    from gossamer.train import build_run, train

    out.mkdir(parents=True, exist_ok=True)
    for name, overrides in cases().items():
        cfg = load_config(None, [*SHORT, *overrides, *extra])
        rows: list[dict] = []
        summary = train(cfg, build_run(cfg), on_row=rows.append)
        record = {"rows": rows, "summary": {k: v for k, v in summary.items() if k not in UNTIMED}}
        (out / f"{name}.json").write_text(json.dumps(record, sort_keys=True))
        print(name, flush=True)


def _differences(a, b, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(a.keys() | b.keys()) for d in
                (_differences(a.get(k), b.get(k), f"{path}.{k}") if k in a and k in b else [f"{path}.{k} (only one)"])]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path} (length)"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{path}[{i}]")]
    same = a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))
    return [] if same else [path]


def compare(before: Path, after: Path) -> int:
    names = sorted({p.stem for p in before.glob("*.json")} | {p.stem for p in after.glob("*.json")})
    bad = 0
    for name in names:
        a, b = before / f"{name}.json", after / f"{name}.json"
        if not (a.exists() and b.exists()):
            print(f"{name}: only in {'before' if a.exists() else 'after'}")
            bad += 1
            continue
        found = _differences(json.loads(a.read_text()), json.loads(b.read_text()))
        keys = sorted({d.split("[")[0].split(".")[-1] if "summary" in d else d.split("].", 1)[-1] for d in found})
        print(f"{name}: {'same' if not found else 'differs in ' + ', '.join(keys[:8])}")
        bad += bool(found)
    print(f"{len(names) - bad} of {len(names)} cases the same")
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    writing = sub.add_parser("write")
    writing.add_argument("out", type=Path)
    writing.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                         help="a key for every case, after its own (e.g. dtype=float32)")
    both = sub.add_parser("compare")
    both.add_argument("before", type=Path)
    both.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "write":
        write(args.out, args.set)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
