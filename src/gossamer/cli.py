"""Command line: ``gossamer train | topology | compare | plot | demo | repro``.

Bad input exits with status 2 and one line ``gossamer: error: ...`` (set GOSSAMER_DEBUG=1 for the
traceback); a diverged run exits with status 1 and keeps its last good checkpoint; SIGINT and
SIGTERM stop a run after its current step with a checkpoint (exit 130 / 143).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import plugins
from .checkpoint import check_resumable
from .codecs import CODECS
from .outer import OUTER_OPTIMIZERS
from .config import KINDS, ConfigError, from_dict, load_config
from .registry import short
from .network import PRESETS, NetworkConfig
from .plots import plot_runs
from .report import AXES, COMPARED, axis_table, comparison_table
from .repro import SCALES, SUITES, run_suite
from .topology import DECAY, SAMPLE_ROUNDS, TOPOLOGIES, analyse, build_topology
from .train import Diverged
# one run into its directory, shared with gossamer.run (re-exported: gossamer.cli.run_training)
from .async_processes import event_log, replay, run_processes, served
from .pair_processes import replay_pairs, run_pairs
from .many_runs import empty_out, positive, seed_range, train_many
from .runner import Finished, Stopped, run_training, train_suite_run
from .rundir import LOCK, MARKER, RunLock, default_out, read_summary, saved_config
from .version import package_version


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse prints usage too)
        raise SystemExit(_fail(message, 2))


def _fail(message: str, code: int) -> int:
    line = " ".join(message.split("\n"))  # one line, whatever the message quotes
    print(f"gossamer: error: {line}", file=sys.stderr)
    return code


def _rank() -> int:
    """This process's rank under torchrun (0 without it)."""
    return int(os.environ.get("RANK", 0))


def _path(value: str) -> str:
    """A path option (argparse ``type``): refused in one line when the OS cannot even look it up
    (a name too long, a file where a folder is expected, ...); a missing path is fine."""
    try:
        os.stat(value)
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as e:
        raise argparse.ArgumentTypeError(f"'{value[:100]}': {e.strerror or e}") from None
    return value


def _resumed_config(args, resume: Path):
    """The config of the run in ``--resume DIR``, with the changes of CONFIG and --set (only
    those that do not change training are allowed); with ``--resume-if-exists``, CONFIG and --set
    alone, which must be the run's config (but those keys)."""
    if args.resume and (args.out or args.overwrite):
        raise ConfigError("--resume continues the run in its own directory: drop --out and --overwrite")
    saved = saved_config(resume)
    cfg = load_config(args.config, args.set, base=None if args.resume_if_exists else saved, plugin=args.plugin)
    check_resumable(from_dict(saved).to_dict(), cfg.to_dict(), str(resume))
    return cfg


def _resume_dir(args) -> Path | None:
    """The run to continue: ``--resume DIR``, or ``--out DIR`` with ``--resume-if-exists`` when DIR
    holds a checkpoint (what a process restarted by torchrun --max-restarts finds)."""
    if not args.resume_if_exists:
        return args.resume
    if args.resume or not args.out or args.overwrite:
        raise ConfigError("--resume-if-exists needs --out DIR, without --resume and --overwrite")
    return args.out if (Path(args.out) / "checkpoint.pt").is_file() else None


def _resume_lock(resume: Path | None) -> RunLock | None:
    """The lock of the run to continue, taken first: its config and checkpoint are read under it
    (rank 0 holds it for all processes; a DIR that is not a folder is refused later, naming it)."""
    if not resume or _rank() != 0 or not Path(resume).is_dir():
        return None
    return RunLock(Path(resume), "--resume")


def cmd_train(args) -> int:
    if args.replay:
        return _replay(args)
    if args.seeds is not None or args.first_seed is not None or args.sweep or args.jobs != 1:
        return train_many(args)
    resume = _resume_dir(args)
    lock = _resume_lock(resume)
    try:
        cfg = _resumed_config(args, resume) if resume else load_config(args.config, args.set, plugin=args.plugin)
        if lock and served(cfg) and cfg.server_rank != 0:  # the run's writer, its server, takes the lock
            lock.release()
            lock = None
        out = Path(resume or args.out or default_out(f"{cfg.algorithm}-n{cfg.workers}"))
        # a restart that finds the folder its killed first attempt left before any checkpoint (its marker,
        # config.yaml, metrics.jsonl) starts over there
        restart = args.resume_if_exists and not resume and ((out / MARKER).is_file() or (out / "config.yaml").is_file())
        if args.resume_if_exists and not resume and not restart and out.is_dir():
            theirs = sorted(p.name for p in out.iterdir() if p.name != LOCK)
            if theirs:
                raise ConfigError(f"--out '{short(out)}' holds {short(theirs[0])}, which no gossamer run wrote: "
                                  f"--resume-if-exists starts a run only in an empty folder or continues its own; "
                                  f"choose another --out")
        trains = {"push-pull": run_processes, "pairs": run_pairs}.get(served(cfg), run_training)
        summary = trains(cfg, out, args.overwrite or restart, progress=not args.quiet, resume=bool(resume),
                         lock=lock)
    except Finished as e:
        if not args.resume_if_exists:
            raise
        summary = read_summary(out)  # a relaunched job of a finished run: nothing to do, and no failure
        print(f"{e} — nothing to do", file=sys.stderr)
    finally:
        if lock:
            lock.release()
    if cfg.engine == "dist" and _rank() != (cfg.server_rank if served(cfg) else 0):
        return 0
    return _said(summary, out)


def _said(summary: dict, out: Path) -> int:
    shown = [k for k in summary if k.startswith("test_")] + ["final_consensus_distance_sq", "comm_rounds"]
    print(json.dumps({k: summary[k] for k in shown}))
    print(f"run written to {out}")
    return 0


def _replay(args) -> int:
    """``--replay DIR``: the run's config (or CONFIG and --set, which must be its config) on its event log."""
    taken = [o for o, v in (("--resume", args.resume), ("--resume-if-exists", args.resume_if_exists),
                            ("--seeds", args.seeds is not None), ("--sweep", args.sweep), ("--jobs", args.jobs != 1))
             if v]
    if taken:
        raise ConfigError(f"--replay trains one run from an event log; {taken[0]} does not apply to it")
    event_log(Path(args.replay))
    saved = None if args.config or args.set else saved_config(args.replay)
    cfg = load_config(args.config, args.set, base=saved, plugin=args.plugin)
    if not served(cfg):
        raise ConfigError(f"--replay replays an event log of async-local-sgd or ad-psgd on engine dist; this config "
                          f"is algorithm {cfg.algorithm} on engine {cfg.engine}")
    out = Path(args.out or default_out(f"replay-{cfg.algorithm}-n{cfg.workers}"))
    replayed = {"push-pull": replay, "pairs": replay_pairs}[served(cfg)]
    return _said(replayed(cfg, Path(args.replay), out, args.overwrite, progress=not args.quiet), out)


WORKING_AFTER = 5.0  # seconds after which `gossamer topology` says it is still working


def _say_working(name: str, n: int) -> None:
    print(f"building and analysing '{short(name)}' on {n:,} workers (the spectral gap of each sampled round: this "
          f"can take minutes) ...", file=sys.stderr, flush=True)


def cmd_topology(args) -> int:
    if not 0.0 <= args.decay < 1.0:
        raise ConfigError(f"--decay must be in [0, 1), got {args.decay}")
    if args.rounds < 1:
        raise ConfigError(f"--rounds must be a positive number of rounds, got {args.rounds}")
    import threading

    # minutes on a loaded machine: say so while it works (not for what is refused or done at once)
    working = threading.Timer(WORKING_AFTER, _say_working, (args.name, args.n))
    working.daemon = True
    working.start()
    try:
        topology = build_topology(args.name, args.n, seed=args.seed, rounds=args.rounds)
        info = analyse(topology, decay=args.decay)
    finally:
        working.cancel()
    if args.network:
        info.update(network_times(topology, info["rounds_to_halve"], args.network, args.parameters))
    if args.json:
        print(json.dumps(info))
    else:
        print("\n".join(f"{k:>20}: {v}" for k, v in info.items()))
    return 0


def network_times(topology, rounds_to_halve: float, preset: str, parameters: int) -> dict:
    """The time of one gossip round of a model of ``parameters`` float32 values on a network
    preset (the mean over the period of a time-varying graph), of halving the disagreement, and of
    an exact all-reduce of the same model."""
    from types import SimpleNamespace

    from .engines.ledger import Transfer
    from .groups import Groups

    if parameters < 1:
        raise ConfigError(f"--parameters must be a positive number of model values, got {parameters}")
    net = NetworkConfig(preset)
    net.validate(SimpleNamespace(workers=topology.n))
    m = parameters * 4  # float32 values
    rounds = [net.seconds(Transfer("gossip", m, "gossip", mixing=w)) for w in topology.mixings]
    round_seconds = sum(rounds) / len(rounds)
    return {"network": preset, "parameters": parameters, "round_seconds": round_seconds,
            "halve_seconds": rounds_to_halve * round_seconds,
            "allreduce_seconds": net.seconds(Transfer("allreduce", m, "global", groups=Groups.blocks(topology.n, topology.n)))}


def cmd_compare(args) -> int:
    if args.x:
        print(axis_table({str(d): Path(d) for d in args.runs}, args.x))
        return 0
    print(comparison_table({str(d): read_summary(d, COMPARED) for d in args.runs}))
    return 0


def cmd_plot(args) -> int:
    out = Path(args.out)
    if out.suffix.lower() != ".png":
        raise ConfigError(f"--out must name a .png file, got '{args.out[:100]}'")
    if out.is_dir():
        raise ConfigError(f"--out '{args.out[:100]}' is a directory; name a .png file")
    if out.exists() and not args.overwrite:
        raise ConfigError(f"--out '{args.out[:100]}' exists; pass --overwrite to replace it")
    plot_runs({str(d): Path(d) for d in args.runs}, args.x, args.y, out)
    print(f"plot written to {out}")
    return 0


DEMO_WORKERS, DEMO_EPOCHS, DEMO_FACTOR = 32, 20, 0.25


def demo_runs(out: Path) -> dict[str, list[str]]:
    """The demo's three runs (after the repro suites' recipe: linearly scaled lr, decay ×0.1 at 50 %
    and 75 %, so three learning-rate phases): All-Reduce, D-SGD on a ring, and D-SGD whose first
    phase keeps Ξ at DEMO_FACTOR × the ring run's (Kong et al.'s phase-1 control)."""
    ring = ["algorithm=gossip", "topology=ring"]
    return {"allreduce": ["algorithm=allreduce"], "gossip-ring": ring,
            "gossip-ring-controlled": [*ring, "phases=[controlled,gossip,gossip]",
                                       f"consensus.target=run:{out / 'gossip-ring'}",
                                       f"consensus.factor={DEMO_FACTOR}", "consensus.max_extra_rounds=1000"]}


def demo_story(summaries: dict[str, dict], phase1_xi_sq: dict[str, float]) -> list[str]:
    """Three plain sentences read off the demo's numbers (whatever they turn out to be)."""
    a, r, c = (summaries[k]["test_accuracy"] for k in ("allreduce", "gossip-ring", "gossip-ring-controlled"))
    gap, extra = 100 * (a - r), summaries["gossip-ring-controlled"].get("extra_gossip_rounds", 0)
    rounds = summaries["gossip-ring"]["comm_rounds"]
    cost = (f"{extra:,} extra gossip rounds ({extra / rounds:.1f}× the ring's {rounds:,}) and the probes of Ξ² that "
            f"decided them: {summaries['gossip-ring-controlled']['bytes_per_worker'] / summaries['gossip-ring']['bytes_per_worker']:.1f}× "
            f"the ring's bytes")
    drift = (f"its {DEMO_WORKERS} models drift apart (mean Ξ² in the first phase "
             f"{phase1_xi_sq['gossip-ring']:.3g}, where All-Reduce keeps one model)")
    first = (f"The ring falls {gap:.1f} points behind All-Reduce: {drift}." if gap > 0 else
             f"This time the ring did not fall behind All-Reduce ({gap:+.1f} points), although {drift}.")
    second = (f"Holding Ξ at {DEMO_FACTOR:g} × the ring's in the first phase only (mean Ξ² "
              f"{phase1_xi_sq['gossip-ring-controlled']:.3g}) closes {100 * (c - r) / (a - r):.0f} % of the gap, "
              f"for {cost}." if gap > 0 else
              f"Holding Ξ at {DEMO_FACTOR:g} × the ring's in the first phase cost {cost}, and moved accuracy by "
              f"{100 * (c - r):+.1f} points.")
    finding = ("the consensus distance of the first phase decides how well decentralized training "
               "generalizes; later phases tolerate drift")
    third = (f"This is Kong et al.'s finding (ICML 2021) at CIFAR-10 scale: {finding}." if gap > 0 and c - r > (a - r) / 2
             else f"Kong et al. (ICML 2021) find at CIFAR-10 scale that {finding}; this run does not show it "
                  f"(the default {DEMO_EPOCHS} epochs do, in 5 of 5 seeds measured).")
    return [first, second, third]


def cmd_demo(args) -> int:
    """32 workers on MNIST-1D: All-Reduce, D-SGD on a ring, and D-SGD with phase-1 consensus
    control; a comparison table and what it shows."""
    from .repro import cpu_base, phase_means

    out = Path(args.out) if args.out else default_out("demo")
    epochs = args.epochs if args.epochs is not None else DEMO_EPOCHS
    positive("--epochs", epochs)
    base = [*cpu_base(False, epochs), "num_samples=10000", f"workers={DEMO_WORKERS}", f"eval_every={epochs}"]
    summaries, phase1 = {}, {}
    for name, overrides in demo_runs(out).items():
        cfg = load_config(None, [*base, *overrides])
        print(f"training {name}: {DEMO_WORKERS} workers, {cfg.model} on {cfg.dataset}, {cfg.epochs} epochs ...",
              flush=True)
        summaries[name] = run_training(cfg, out / name, args.overwrite)
        phase1[name] = phase_means(out / name / "metrics.jsonl", cfg.milestones)[0]
        print(f"  done in {summaries[name]['wall_seconds']:.0f} s: test accuracy "
              f"{summaries[name]['test_accuracy']:.4f}", flush=True)  # a line a run where no progress bar shows
    print()
    print(comparison_table(summaries))
    print()
    print("\n".join(demo_story(summaries, phase1)))
    print(f"\nruns written to {out}; compare again with: gossamer compare {out}/*")
    return 0


def cmd_repro(args) -> int:
    """A paper experiment suite: every variant × seed, then results.md and its plots."""
    positive("--seeds", args.seeds)
    seed_range(args.first_seed, args.seeds)
    if len(args.tune) > 1:
        keys = " and ".join(t.partition("=")[0] for t in args.tune)
        raise ConfigError(f"--tune is given {len(args.tune)} times ({short(keys)}): one key is tuned at a time; tune "
                          f"one, then give the value chosen with --set")
    positive("--jobs", args.jobs)
    out = Path(args.out) if args.out else default_out(f"repro-{args.suite}")
    empty_out(out, args.overwrite or args.dry_run)
    results = run_suite(args.suite, out, args.seeds, args.quick, train_suite_run, overrides=args.set,
                        scale=args.scale, dry_run=args.dry_run, first_seed=args.first_seed,
                        tune_grid=args.tune[0] if args.tune else None, jobs=args.jobs)
    if results is None:
        return 0
    print(results.read_text())
    print(f"results written to {results}")
    return 0


def _registry_help() -> str:
    """What each concept offers, from its registry: names, one line each, and their own keys."""
    parts = []
    for kind, registry in {**KINDS, "topology": TOPOLOGIES, "compression": CODECS,
                           "outer_optimizer": OUTER_OPTIMIZERS}.items():
        lines = []
        for e in registry.entries.values():
            keys = f" [keys: {', '.join(e.keys)}]" if e.keys else ""
            lines.append(f"  {e.spec:<22} {e.help}{keys}")
        also = (", a chain SPARSIFIER+CODEC such as top-k:0.03+quant:2, or ef-NAME for error feedback"
                if registry is CODECS else "")
        parts.append(f"{kind} (--set {kind}=NAME{also}):\n" + "\n".join(lines))
    presets = [f"  {name:<22} {p.bandwidth:g} Gbit/s, {p.latency:g} µs: {p.what}" for name, p in PRESETS.items()]
    parts.append("network (--set network=PRESET, or network.bandwidth=GBIT_S and network.latency=US; "
                 "docs/time.md):\n" + "\n".join(presets))
    return "\n\n".join(parts)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="gossamer", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"gossamer {package_version()}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_train(sub)
    _add_check_plugin(sub)
    _add_topology(sub)
    _add_compare(sub)
    _add_plot(sub)
    _add_demo(sub)
    _add_repro(sub)
    return p


def _add_train(sub) -> None:
    """``gossamer train``: one run, or --seeds/--sweep runs, from a config and overrides."""
    t = sub.add_parser("train", help="train n workers from a YAML config and --set overrides",
                       epilog=_registry_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("config", nargs="?", type=_path, help="YAML config file (defaults apply to missing keys)")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    t.add_argument("--out", type=_path, help="run directory (default runs/ALGORITHM-nN-TIME)")
    t.add_argument("--overwrite", action="store_true",
                   help="replace the run in a non-empty --out (at the new run's first checkpoint)")
    t.add_argument("--resume", metavar="DIR", type=_path,
                   help="continue the stopped run in DIR from its last checkpoint (CONFIG and --set may change "
                   "only epochs, eval_every, metrics_every, checkpoint_every, logger and the sharpness keys)")
    t.add_argument("--resume-if-exists", action="store_true",
                   help="with --out DIR: continue the run there if DIR holds a checkpoint of this config, else "
                   "start it (an elastic restart under torchrun --max-restarts; see docs/faults.md)")
    t.add_argument("--replay", metavar="RUN_DIR", type=_path,
                   help="train in this process on the event log of an async-local-sgd run on engine dist (its "
                        "config, or CONFIG and --set, which must match it): the rows equal the processes' bit for "
                        "bit (docs/distributed.md)")
    t.add_argument("--plugin", action="append", default=[], metavar="FILE_OR_MODULE", type=_path,
                   help="import a Python file or module that registers algorithms, codecs, topologies, optimizers, "
                        "models or data sets (repeatable; recorded in config.yaml; docs/extending.md)")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.add_argument("--seeds", type=int, metavar="K",
                   help="train K runs, seeds S ... S+K-1 (S: --first-seed, else the config's seed), each in "
                        "OUT/seed-S (with --sweep: OUT/seed-S-KEY-V...)")
    t.add_argument("--first-seed", type=int, metavar="S", help="the first seed of --seeds")
    t.add_argument("--sweep", action="append", default=[], metavar="KEY=[V1,...]",
                   help="also train every value of KEY (repeatable: every combination), for every seed")
    t.add_argument("--jobs", type=int, default=1, metavar="J",
                   help="train --seeds/--sweep runs in J worker processes, the cores shared out (default 1)")
    t.set_defaults(func=cmd_train)


def _add_check_plugin(sub) -> None:
    """``gossamer check-plugin``: the conformance checks of a plugin's entries."""
    k = sub.add_parser("check-plugin", help="run gossamer's conformance checks on every entry a plugin registers "
                       "(exact resume, no host reads in the hot path, the traffic ledger, 2-process parity)")
    k.add_argument("plugin", type=_path, help="the plugin: a .py file or a module")
    k.add_argument("--no-processes", action="store_true", help="skip the 2-process (gloo) parity check")
    k.set_defaults(func=cmd_check_plugin)


def _add_topology(sub) -> None:
    """``gossamer topology``: the analysis of a mixing matrix."""
    g = sub.add_parser("topology", help="mixing matrix analysis: spectral gap, p, rounds to halve, expected "
                       "contraction, effective number of neighbours")
    g.add_argument("name", help=TOPOLOGIES.choices())
    g.add_argument("-n", type=int, required=True, help="number of workers")
    g.add_argument("--seed", type=int, default=0, help="seed of random graphs (topology_seed)")
    g.add_argument("--decay", type=float, default=DECAY,
                   help=f"γ in [0, 1) of the effective number of neighbours (Vogels et al.): a model averages the "
                        f"noise of about 1/(1 − γ) rounds; small learning rates ↔ γ near 1 (default {DECAY})")
    g.add_argument("--rounds", type=int, default=SAMPLE_ROUNDS,
                   help=f"rounds a random topology is sampled over: its empirical spectral gap and expected "
                        f"contraction (default {SAMPLE_ROUNDS})")
    g.add_argument("--json", action="store_true", help="one JSON object")
    g.add_argument("--network", choices=list(PRESETS),
                   help="also the time of one round, of halving the disagreement and of an all-reduce on this network")
    g.add_argument("--parameters", type=int, default=1_000_000,
                   help="model size in float32 values for --network (default 1,000,000)")
    g.set_defaults(func=cmd_topology)


def _add_compare(sub) -> None:
    """``gossamer compare``: a table of finished runs."""
    c = sub.add_parser("compare", help="table of finished runs")
    c.add_argument("runs", nargs="+", type=_path, help="run directories")
    c.add_argument("--x", choices=list(AXES), help="along steps, epochs, simulated time or bytes sent: length, to target, and "
                   "the test metric at the shortest run's length")
    c.set_defaults(func=cmd_compare)


def _add_plot(sub) -> None:
    """``gossamer plot``: a metric of runs in one PNG."""
    pl = sub.add_parser("plot", help="test accuracy (or another metric) of runs against simulated time, bytes sent, steps or "
                        "epochs, in one PNG")
    pl.add_argument("runs", nargs="+", type=_path, help="run directories")
    pl.add_argument("--x", choices=list(AXES), default="steps", help="the x axis (default: steps)")
    pl.add_argument("--y", help="a metric of the rows (default: test_accuracy, or test_loss for language models)")
    pl.add_argument("--out", default="plot.png", type=_path, help="the PNG to write (default plot.png)")
    pl.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    pl.set_defaults(func=cmd_plot)


def _add_demo(sub) -> None:
    """``gossamer demo``: three runs side by side."""
    d = sub.add_parser("demo", help="All-Reduce, a ring, and a ring with phase-1 consensus control: 32 workers, "
                       "MNIST-1D (about a minute)")
    d.add_argument("--out", type=_path, help="where the three runs go (default runs/demo-TIME)")
    d.add_argument("--epochs", type=int, help=f"epochs per run (default {DEMO_EPOCHS})")
    d.add_argument("--overwrite", action="store_true")
    d.set_defaults(func=cmd_demo)


def _add_repro(sub) -> None:
    """``gossamer repro``: a suite of the papers' experiments."""
    r = sub.add_parser("repro", help="the papers' experiments: " + ", ".join(SUITES))
    r.add_argument("suite", choices=list(SUITES))
    r.add_argument("--scale", choices=SCALES, default="cpu",
                   help="cpu: a small workload two CPU cores run (default); paper: the papers' configs in configs/paper/ (GPUs)")
    r.add_argument("--seeds", type=int, default=1,
                   help="seeds per variant (mean ± 95%% Student t interval over them; paired differences)")
    r.add_argument("--first-seed", type=int, default=0, metavar="S", help="run seeds S ... S+SEEDS-1 (default 0)")
    r.add_argument("--tune", metavar="KEY=[V1,...]", action="append", default=[],
                   help="first train each baseline at every value on a validation split of the training set, then "
                        "run every variant at its baseline's best (e.g. lr=[0.001,0.0025,0.005])")
    r.add_argument("--out", type=_path,
                   help="where the runs, results.md and the plot go (default runs/repro-SUITE-TIME)")
    r.add_argument("--quick", action="store_true", help="tiny smoke-test version of --scale cpu (about a minute)")
    r.add_argument("--dry-run", action="store_true", help="check every config and print the estimated work; train nothing")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="change the suite's base config for every variant (e.g. lr=0.005)")
    r.add_argument("--overwrite", action="store_true", help="reuse a non-empty --out")
    r.add_argument("--jobs", type=int, default=1, metavar="J",
                   help="train the runs in J worker processes, the cores shared out among them (default 1: one "
                        "after another in this process)")
    r.set_defaults(func=cmd_repro)


def cmd_check_plugin(args) -> int:
    from .testing import check_plugin

    results = check_plugin(args.plugin, processes=not args.no_processes, out=print)
    applicable = [r for r in results if r.passed is not None]
    failed = [r for r in applicable if not r.passed]
    print(f"{len(applicable) - len(failed)} of {len(applicable)} checks passed ({len(results) - len(applicable)} "
          f"not applicable)")
    return 1 if failed else 0


def _plugins_named(argv: list[str]) -> list[str]:
    """The --plugin values of a command line (imported before its parser is built, so that the
    help lists their entries)."""
    named = [v for flag, v in zip(argv, argv[1:]) if flag == "--plugin"]
    return named + [a.split("=", 1)[1] for a in argv if a.startswith("--plugin=")]


def main(argv: list[str] | None = None) -> int:
    """The ``gossamer`` command: its exit status; every failure one line on stderr (Ctrl-C too,
    whenever it comes: "interrupted", status 130)."""
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)


NO_PLUGINS = ("compare", "plot")  # commands that read run directories only


def _main(argv: list[str]) -> int:
    try:
        plugins.load(_plugins_named(argv))
    except ConfigError as e:
        return _fail(str(e), 2)
    try:
        plugins.load_installed()
    except ConfigError as e:  # a broken installed package stops only the commands that may need it
        command = next((a for a in argv if not a.startswith("-")), None)
        if command not in NO_PLUGINS and "--version" not in argv:
            return _fail(str(e), 2)
        print(f"gossamer: warning: {e}", file=sys.stderr)
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:  # ConfigError, TopologyError and bad data/model names
        if os.environ.get("GOSSAMER_DEBUG"):
            raise
        return _fail(str(e), 2) if _rank() == 0 else 2  # dist: every rank fails alike, rank 0 says it
    except Diverged as e:
        return _fail(str(e), 1) if _rank() == 0 else 1
    except RuntimeError as e:
        from .engines.failures import PeerLost
        if not isinstance(e, PeerLost):
            raise
        _fail(str(e), 1)  # every surviving rank says which rank it lost, then leaves at once
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)
    except Stopped as e:
        return _fail(str(e), e.code) if _rank() == 0 else e.code
    except OSError as e:  # a path the OS refuses where no option's check caught it (a data file, ...)
        if os.environ.get("GOSSAMER_DEBUG"):
            raise
        where = f"'{str(e.filename)[:100]}': " if e.filename else ""
        return _fail(f"{where}{e.strerror or e}", 2) if _rank() == 0 else 2
