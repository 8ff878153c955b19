"""Plugins (gossamer.plugins): a user's file or module registers entries before the config is read;
the run records it with its hash; the conformance kit (gossamer.testing) checks its entries; the
example plugins in examples/plugins/ pass it."""

import importlib.metadata
import runpy
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from cases import SHORT

from gossamer import plugins
from gossamer.algorithms import ALGORITHMS
from gossamer.cli import main
from gossamer.config import load_config
from gossamer.testing import check_plugin, resume_difference
from gossamer.topology import build_topology
from gossamer.train import build_run, train

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "plugins"
LOSSY = str(EXAMPLES / "lossy_gossip.py")
MODEL = str(EXAMPLES / "my_model.py")

# state that is not saved: the round counter of a schedule that draws a new pair every round
BROKEN = '''
from gossamer.extend import ALGORITHMS, Mixing, Schedule


class ForgetfulPairs(Schedule):
    def __init__(self, n):
        self.n, self.rounds = n, 0

    def after_step(self, engine, X, step):
        shift = 1 + self.rounds % (self.n - 1)  # worker i averages with i + shift: changes every round
        index = [[i for i in range(self.n)], [(i + shift) % self.n for i in range(self.n)]]
        engine.gossip_(X, Mixing(index, [[0.5] * self.n, [0.5] * self.n]))
        self.rounds += 1  # never in state_dict: a resumed run starts the pairs over
        return {}


@ALGORITHMS.register("forgetful-pairs", help="a broken plugin: its round counter is not saved")
def build(cfg, ctx):
    return ForgetfulPairs(cfg.workers)
'''


# the review's two plugins (issue 41, item 8): a byte count told to the engine, and a mean taken
# outside the engine's operators
UNTRUSTED = '''
from gossamer.extend import ALGORITHMS, GraphOptions, Schedule, build_graph


class ToldOneByte(Schedule):
    def __init__(self, topology):
        self.union = topology.union

    def after_step(self, engine, X, step):
        received = engine.exchange(X.clone(), self.union, nbytes=1)  # each message is d values, not 1 byte
        X.copy_(received.mean(1))
        return {}


class MeanOutside(Schedule):
    def after_step(self, engine, X, step):
        X.copy_(X.mean(0).expand_as(X))  # the engine never sees it: each process averages its own rows
        return {}


@ALGORITHMS.register("told-one-byte", options=GraphOptions, help="tells the engine its messages are 1 byte")
def told(cfg, ctx):
    return ToldOneByte(build_graph(cfg))


@ALGORITHMS.register("mean-outside", help="averages X without the engine")
def outside(cfg, ctx):
    return MeanOutside()
'''


@pytest.fixture(scope="module")
def lossy():
    plugins.load([LOSSY])
    return ALGORITHMS["lossy-gossip"]


def test_no_loss_is_gossip_bit_for_bit(lossy):
    runs = {}
    for algorithm in ("gossip", "lossy-gossip"):
        cfg = load_config(None, [*SHORT, f"algorithm={algorithm}", "topology=ring", "momentum=0.9",
                                 *(["drop_rate=0"] if algorithm == "lossy-gossip" else [])])
        run, rows = build_run(cfg), []
        runs[algorithm] = (train(cfg, run, on_row=rows.append), rows, run.workers.X)
    (s_g, rows_g, x_g), (s_l, rows_l, x_l) = runs["gossip"], runs["lossy-gossip"]
    assert torch.equal(x_g, x_l) and rows_g == rows_l
    assert {k: v for k, v in s_g.items() if k != "wall_seconds"} == {k: v for k, v in s_l.items() if k != "wall_seconds"}


def test_a_lost_message_leaves_its_weight_with_the_receiver(lossy):
    """Ring of 6, W = 1/3 on self and both neighbours; round r of the lossy graph against W written
    out: where the coin lost j → i, w'_ij = 0 and w'_ii = 1/3 + 1/3 per lost message."""
    module = sys.modules[ALGORITHMS["lossy-gossip"].build.__module__]
    ring = build_topology("ring", 6)
    graph = module.lossy(ring, 0.5, seed=7)
    for r in range(3):
        coins = plugins_stream(module, 7, r, ring.mixing(r).index.shape) < 0.5
        W = np.zeros((6, 6))
        for i in range(6):
            W[i, i] = 1 / 3
            for slot, j in ((1, (i - 1) % 6), (2, (i + 1) % 6)):
                k = int(np.flatnonzero(ring.mixing(r).index[:, i] == j)[0])
                W[i, j if not coins[k, i] else i] += 1 / 3
        np.testing.assert_allclose(graph.mixing(r).dense(), W, rtol=0, atol=1e-15)
        assert np.allclose(W.sum(1), 1)
    assert any(not np.allclose(graph.mixing(r).dense().sum(0), 1) for r in range(3))  # x̄ moves


def plugins_stream(module, seed, r, shape):
    from gossamer.rng import host_stream
    return host_stream(module.LOST, seed, r).random(shape)


def test_lost_messages_are_not_priced(lossy):
    cfg = load_config(None, [*SHORT, "algorithm=lossy-gossip", "topology=ring", "drop_rate=0.5"])
    run = build_run(cfg)
    summary = train(cfg, run)
    full = 2 * run.workers.d * 8 * summary["steps"]  # a ring round: the model (float64) to both neighbours
    assert 0.3 * full < summary["bytes_per_worker"] < 0.7 * full


def test_the_plugin_runs_from_the_command_line_and_is_recorded(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--quiet", "--plugin", LOSSY, "--out", str(out), "--set", "algorithm=lossy-gossip",
                 "--set", "drop_rate=0.3", *[a for o in SHORT for a in ("--set", o)]]) == 0
    recorded = (out / "config.yaml").read_text()
    assert f"{LOSSY}#sha256={plugins.fingerprint(LOSSY).partition('#sha256=')[2]}" in recorded
    assert main(["train", "--resume", str(out), "--set", "epochs=3", "--quiet"]) == 0  # loads it again


def test_resume_refuses_a_changed_or_missing_plugin(tmp_path, capsys):
    plugin = tmp_path / "mine.py"
    plugin.write_text(Path(LOSSY).read_text().replace('"lossy-gossip"', '"lossy-mine"'))
    out = tmp_path / "run"
    sets = [a for o in [*SHORT, "algorithm=lossy-mine", "epochs=1"] for a in ("--set", o)]
    assert main(["train", "--quiet", "--plugin", str(plugin), "--out", str(out), *sets]) == 0
    plugin.write_text(plugin.read_text() + "\n# edited\n")
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--set", "epochs=2", "--quiet"]) == 2
    assert f"plugin '{plugin}' changed since the run recorded it" in capsys.readouterr().err
    plugin.unlink()
    assert main(["train", "--resume", str(out), "--set", "epochs=2", "--quiet"]) == 2
    assert f"plugin '{plugin}' does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("text, message", [
    ("import no_such_module_here\n",
     "failed to import: ModuleNotFoundError: No module named 'no_such_module_here' (bad.py line 1)"),
    ("x = 1\ndef broken(:\n", "failed to import: SyntaxError: invalid syntax (bad.py line 2)"),  # issue 45, item 20
    ("from gossamer.extend import ALGORITHMS\n@ALGORITHMS.register('gossip')\ndef b(cfg, ctx): pass\n",
     "registers a name that is taken: algorithm 'gossip' is already registered; choose another name"),
    ("from gossamer.extend import MODELS\n@MODELS.register('half-registered')\ndef b(cfg, data): pass\n1 / 0\n",
     "failed to import: ZeroDivisionError: division by zero (bad.py line 4)"),
    ("from gossamer.extend import ALGORITHMS, REJOIN_MODES\n@ALGORITHMS.register('typo-faults', fault=REJOIN_MODES)\n"
     "def b(cfg, ctx): pass\n",  # a typo'd trait is refused where it is declared, not ignored (issue 44, item 3)
     "failed to register: algorithm 'typo-faults' declares an unknown trait 'fault'; an algorithm's traits are: "
     "faults, byzantine, requires, requires_why, byzantine_group, server, hook (bad.py line 2)"),
])
def test_a_plugin_that_fails_is_one_line_and_changes_no_registry(tmp_path, capsys, text, message):
    plugin = tmp_path / "bad.py"
    plugin.write_text(text)
    assert main(["train", "--plugin", str(plugin), "--help"]) == 2
    err = capsys.readouterr().err
    assert err == f"gossamer: error: plugin '{plugin}' {message}\n"
    from gossamer.models import MODELS
    assert "half-registered" not in MODELS and ALGORITHMS["gossip"].build.__module__ == "gossamer.algorithms.gossip"
    assert "typo-faults" not in ALGORITHMS


def test_a_registry_refuses_an_unknown_trait_at_registration_and_takes_a_known_one():
    from gossamer.registry import ConfigError, Registry, UnknownTrait
    from gossamer.topology import TOPOLOGIES
    with pytest.raises(UnknownTrait, match=r"^algorithm 'my-algo' declares an unknown trait 'fault'; an algorithm's "
                                           r"traits are: faults, byzantine, requires, requires_why, byzantine_group, "
                                           r"server, hook$"):
        ALGORITHMS.register("my-algo", fault=("stale",))
    with pytest.raises(ConfigError, match=r"^topology 'my-graph' declares an unknown trait 'per_rounds'; a topology's "
                                          r"traits are: size, per_round$"):
        TOPOLOGIES.register("my-graph", size=lambda n, _: (n, 0, 0), per_rounds=True)
    from gossamer.models import MODELS
    with pytest.raises(UnknownTrait, match=r"^model 'my-model' declares an unknown trait 'size'; a model declares no "
                                           r"traits$"):
        MODELS.register("my-model", size=1)
    assert not {"my-algo", "my-graph", "my-model"} & {*ALGORITHMS.names(), *TOPOLOGIES.names(), *MODELS.names()}
    things = Registry("thing", traits={"heavy": "True: it is heavy"})
    things.register("rock", heavy=True)(lambda: None)
    assert dict(things["rock"].traits) == {"heavy": True} and dict(things.traits) == {"heavy": "True: it is heavy"}


def test_every_trait_an_entry_declares_is_one_its_registry_declares():
    """Every registry of the package declares its traits, each with a line of meaning; its entries
    use only those, and every declared trait is used by an entry (issue 44, item 3)."""
    import gossamer.cli  # noqa: F401 — every built-in module, so every registry and its entries
    import gossamer.extend  # noqa: F401
    from gossamer.byzantine import ATTACKS
    from gossamer.codecs import CODECS
    from gossamer.config import KINDS
    from gossamer.loggers import LOGGERS
    from gossamer.outer import OUTER_OPTIMIZERS
    from gossamer.registry import Registry
    from gossamer.robust import AGGREGATORS
    from gossamer.tasks import TASKS
    from gossamer.topology import TOPOLOGIES
    found = {id(v): v for name, module in list(sys.modules.items()) if name.split(".")[0] == "gossamer"
             for v in vars(module).values() if isinstance(v, Registry)}  # and any registry added since
    assert {id(r) for r in [*KINDS.values(), CODECS, TOPOLOGIES, OUTER_OPTIMIZERS, ATTACKS, AGGREGATORS, LOGGERS,
                            TASKS]} <= found.keys()
    for registry in found.values():
        assert all(isinstance(meaning, str) and meaning for meaning in registry.traits.values()), registry.kind
        for entry in registry.entries.values():
            assert set(entry.traits) <= set(registry.traits), (registry.kind, entry.name, set(entry.traits))
    used = {(r.kind, t) for r in found.values() for e in r.entries.values() for t in e.traits}
    declared = {(r.kind, t) for r in found.values() for t in r.traits}
    assert declared <= used, f"declared and used by no entry: {sorted(declared - used)}"


def test_help_lists_plugin_entries(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--plugin", MODEL, "--help"])
    assert "conv-mixer-1d" in capsys.readouterr().out


def test_a_config_files_plugins_are_relative_to_it(tmp_path):
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "model.py").write_text(Path(MODEL).read_text().replace('"conv-mixer-1d"', '"mixer-here"'))
    (folder / "run.yaml").write_text("plugins: [model.py]\nmodel: mixer-here\n")
    cfg = load_config(folder / "run.yaml")
    assert cfg.plugins == [plugins.fingerprint(str(folder / "model.py"))] and cfg.model == "mixer-here"


def test_installed_packages_announce_plugins_by_entry_point(tmp_path, monkeypatch):
    (tmp_path / "announced_plugin.py").write_text(Path(MODEL).read_text().replace('"conv-mixer-1d"', '"announced"'))
    monkeypatch.syspath_prepend(str(tmp_path))
    point = importlib.metadata.EntryPoint("mine", "announced_plugin", plugins.ENTRY_POINTS)
    monkeypatch.setattr(plugins, "announced", lambda: [point])
    cfg = load_config(None, ["model=announced"])
    assert cfg.plugins == [plugins.fingerprint("announced_plugin")]
    # a run that uses none of its entries does not record it: it resumes after the package changes or goes
    # (issue 45, item 16)
    assert load_config(None, ["model=mlp"]).plugins is None


def test_installed_entry_points_are_read_again_after_an_install(tmp_path, monkeypatch):
    """Reading every package's metadata is cached (it was a fifth of the suite's time), but a package
    installed into a folder of sys.path, or a folder added to it, is seen at the next read."""
    def install(name: str) -> None:
        time.sleep(0.05)  # past the file system's clock tick: the folder's modification time moves
        info = tmp_path / f"{name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[{plugins.ENTRY_POINTS}]\n{name} = {name}\n")

    def mine() -> list[str]:
        return sorted(p.value for p in plugins.announced() if p.value.startswith("lab_"))

    install("lab_one")
    assert mine() == []
    monkeypatch.syspath_prepend(str(tmp_path))
    assert mine() == ["lab_one"] and plugins.announced() is plugins.announced()
    install("lab_two")
    assert mine() == ["lab_one", "lab_two"]


def test_a_broken_installed_plugin_is_one_line_naming_its_package(tmp_path, monkeypatch, capsys):
    """It broke every command without naming the package (issue 45, item 17); --version and compare
    need no plugin and keep working."""
    (tmp_path / "broken_installed.py").write_text("raise RuntimeError('half-written')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    point = importlib.metadata.EntryPoint("mine", "broken_installed", plugins.ENTRY_POINTS)
    monkeypatch.setattr(plugins, "announced", lambda: [point])
    assert main(["train", "--set", "num_samples=1000", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "installed plugin 'broken_installed' failed to import: RuntimeError: half-written" in err
    assert "(package unknown package; uninstall or fix it)" in err
    with pytest.raises(SystemExit) as version:
        main(["--version"])
    assert version.value.code == 0 and "gossamer" in capsys.readouterr().out


def test_a_working_copy_of_an_installed_plugin_takes_its_names(tmp_path, monkeypatch, capsys):
    """--plugin on a working copy of an installed plugin said "already registered" (issue 45, item 19): the
    copy given by path is the one loaded, the installed one is skipped with a warning."""
    text = Path(MODEL).read_text().replace('"conv-mixer-1d"', '"copied-mixer"')
    (tmp_path / "installed_mixer.py").write_text(text)
    (tmp_path / "working_copy.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    point = importlib.metadata.EntryPoint("mine", "installed_mixer", plugins.ENTRY_POINTS)
    monkeypatch.setattr(plugins, "announced", lambda: [point])
    cfg = load_config(None, ["model=copied-mixer", f"plugins=[{tmp_path / 'working_copy.py'}]"])
    assert cfg.plugins == [plugins.fingerprint(str(tmp_path / "working_copy.py"))]
    assert "the installed plugin 'installed_mixer' (unknown package) is not loaded" in capsys.readouterr().err


def test_the_kit_passes_the_example_plugins():
    """In process here; the 2-process parity of the same entries runs in the system tests."""
    for plugin in (LOSSY, MODEL):
        checks = check_plugin(plugin, processes=False)
        assert {c.check for c in checks} == {"resume", "hot-path", "ledger", "hooks"}
        assert all(c.passed in (True, None) for c in checks), [c.line() for c in checks]
        assert [c.passed for c in checks if c.check == "hooks"] == [None if plugin == LOSSY else True]


def test_the_kit_fails_a_plugin_whose_state_is_not_saved(tmp_path):
    plugin = tmp_path / "broken.py"
    plugin.write_text(BROKEN)
    checks = {c.check: c for c in check_plugin(str(plugin), processes=False)}
    assert checks["resume"].passed is False and checks["resume"].deviation > 0
    assert checks["ledger"].passed is None and checks["hot-path"].passed  # the ledger: with processes
    assert resume_difference(["algorithm=gossip"], "gossip")[0] is None  # the same check passes a built-in


@pytest.mark.system
def test_check_plugin_fails_a_byte_count_taken_on_trust_and_a_mean_taken_outside_the_engine(tmp_path):
    """Each fails with one line that says where: the told size against the message's bytes; the
    worker matrix on 2 processes against the simulator's, though every transfer is what moved."""
    plugin = tmp_path / "untrusted.py"
    plugin.write_text(UNTRUSTED)
    done = subprocess.run([sys.executable, "-m", "gossamer", "check-plugin", str(plugin)], capture_output=True,
                          text=True, timeout=600)
    lines = done.stdout.splitlines()
    assert done.returncode == 1, done.stdout + done.stderr
    told = [line for line in lines if "told-one-byte" in line]
    assert told and not any(line.startswith("PASS") for line in told)
    assert any("nbytes=1 but each worker's message (its row of the payload) is" in line for line in told)
    outside = {line.split()[3]: line for line in lines if "mean-outside" in line}
    assert outside["ledger"].startswith("PASS") and outside["processes"].startswith("FAIL")
    assert "rows combined outside the engine's operators" in outside["processes"]


@pytest.mark.system
def test_check_plugin_on_the_examples_with_two_processes():
    for plugin in (LOSSY, MODEL):
        done = subprocess.run([sys.executable, "-m", "gossamer", "check-plugin", plugin], capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "PASS" in done.stdout and "processes" in done.stdout and "FAIL" not in done.stdout


def test_bring_your_own_prints_both_runs(monkeypatch, capsys):
    """examples/plugins/bring_your_own.py: the Python API on a user's module and tensors."""
    monkeypatch.setattr(sys, "argv", ["bring_your_own.py", "--epochs", "1"])
    runpy.run_path(str(EXAMPLES / "bring_your_own.py"), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["All-Reduce", "ring"]
    xi = [float(line.rsplit(" ", 1)[1]) for line in lines]
    assert xi[0] < 1e-9 < xi[1]  # All-Reduce keeps the models equal (to float32 rounding); the ring does not


def test_the_hooks_check_catches_a_synchroniser_that_does_something_else(monkeypatch):
    import gossamer.testing as kit
    right = kit.hook_of
    assert kit.hook_difference(["algorithm=gossip", "topology=ring"]) == (None, 0.0)
    monkeypatch.setattr(kit, "hook_of", lambda o: {**right(o), "kwargs": {**right(o)["kwargs"],
                                                                          "topology": "one-peer-exponential"}})
    where, delta = kit.hook_difference(["algorithm=gossip", "topology=ring"])
    assert where == "a worker's parameters" and delta > 1e-3


@pytest.mark.parametrize("body, message", [
    ("raise RuntimeError('oops')", "algorithm 'guarded-plugin' failed to build: RuntimeError: oops"),
    ("return None", "algorithm 'guarded-plugin' built None: its builder must return the algorithm"),
])
def test_a_plugin_builder_that_raises_or_builds_nothing_is_one_line(tmp_path, capsys, body, message):
    """issue 45, item 8: a traceback from train and check-plugin."""
    plugin = tmp_path / f"guarded_{len(body)}.py"
    plugin.write_text("from gossamer.extend import ALGORITHMS\n\n\n"
                      "@ALGORITHMS.register('guarded-plugin', help='a broken builder')\n"
                      f"def build(cfg, ctx):\n    {body}\n")
    try:
        code = main(["train", "--plugin", str(plugin), "--set", "algorithm=guarded-plugin", "--set", "num_samples=1000",
                     "--out", str(tmp_path / "run")])
        err = capsys.readouterr().err
        assert code == 2 and message in err and err.count("\n") == 1, err
    finally:
        ALGORITHMS.entries.pop("guarded-plugin", None)


def test_a_plugin_that_exits_at_import_is_one_line(tmp_path, capsys):
    plugin = tmp_path / "exits.py"
    plugin.write_text("import sys\nsys.exit(3)\n")
    code = main(["train", "--plugin", str(plugin), "--set", "num_samples=1000", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "failed to import: SystemExit: 3" in err and err.count("\n") == 1, err


HELPED = '''from gossamer.extend import OUTER_OPTIMIZERS
import {helper}


class Scaled:
    def start(self, x_outer):
        pass

    def step(self, x_outer, pseudo_gradient, lr, momentum, staleness=0):
        x_outer.add_(pseudo_gradient, alpha=-lr * {helper}.RATE)

    def state_dict(self):
        return {{}}

    def load_state_dict(self, state):
        pass


@OUTER_OPTIMIZERS.register("{name}", help="plain SGD scaled by its helper's rate")
def build(cfg):
    return Scaled()
'''


def test_a_plugins_helper_module_is_in_its_record_and_a_moved_plugin_resumes(tmp_path, capsys):
    """issue 45, item 18: a plugin importing a helper beside it resumed silently after the helper changed;
    a plugin moved elsewhere could not be pointed at. The helper is in the hash; --plugin NEWPATH with the
    recorded content resumes the run, which then records the new place."""
    from gossamer.outer import OUTER_OPTIMIZERS

    first, moved, out = tmp_path / "first", tmp_path / "moved", tmp_path / "run"
    first.mkdir()
    (first / "rate_helper_a.py").write_text("RATE = 0.5\n")
    (first / "helped.py").write_text(HELPED.format(helper="rate_helper_a", name="helped-scaled"))
    sets = [a for o in [*SHORT, "algorithm=diloco", "local_steps=2", "outer_optimizer=helped-scaled", "epochs=1"]
            for a in ("--set", o)]
    try:
        assert main(["train", "--quiet", "--plugin", str(first / "helped.py"), "--out", str(out), *sets]) == 0
        (first / "rate_helper_a.py").write_text("RATE = 0.25\n")
        capsys.readouterr()
        assert main(["train", "--resume", str(out), "--set", "epochs=2", "--quiet"]) == 2
        assert "changed since the run recorded it" in capsys.readouterr().err
        (first / "rate_helper_a.py").write_text("RATE = 0.5\n")
        first.rename(moved)
        assert main(["train", "--resume", str(out), "--set", "epochs=2", "--quiet"]) == 2
        assert "does not exist" in capsys.readouterr().err
        assert main(["train", "--resume", str(out), "--set", "epochs=2", "--quiet", "--plugin",
                     str(moved / "helped.py")]) == 0
        assert str(moved / "helped.py") in (out / "config.yaml").read_text()
    finally:
        OUTER_OPTIMIZERS.entries.pop("helped-scaled", None)


def test_a_failed_launch_names_its_cause_not_torchruns_rule():
    """check-plugin showed a line of '=' for a 2-process failure (issue 45, item 20)."""
    from gossamer.testing import Check, launch_failure

    stderr = ("[rank1]: gossamer: error: lost a peer: rank 0 stopped answering within 60 s\n"
              "E1206 torch/distributed/elastic: failed\n" + "=" * 60 + "\n" + "-" * 60 + "\n")
    assert launch_failure(stderr) == "[rank1]: gossamer: error: lost a peer: rank 0 stopped answering within 60 s"
    assert launch_failure("Traceback...\nRuntimeError: boom\n" + "=" * 40) == "RuntimeError: boom"
    assert launch_failure("") == "(no output)"
    assert "max |Δ|" not in Check("algorithm x", "resume", False, float("inf"), "the summary").line()
    assert "(max |Δ| = 0.5)" in Check("algorithm x", "resume", False, 0.5, "state.rows.X").line()
