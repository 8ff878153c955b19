import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from filelock import FileLock
from hypothesis import settings
from cases import ACCEPTANCE, CIFAR_CASE, DIST_CASES, HOOK_PROCESS_CASES, SHORT
from launch import SMALL, finish, sets, spawn

from gossamer.cli import main
from gossamer.config import load_config
from gossamer.rundir import reference_trajectory
from gossamer.train import build_run, train


# CI draws the same examples every run (a failure reproduces); HYPOTHESIS_PROFILE=explore draws new ones.
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

SCRIPTS = Path(__file__).resolve().parent / "dist_scripts"


def small_config(*overrides: str):
    """A seconds-long run in float64: 1000 MNIST-1D samples (800 train), 4 workers, 2 epochs;
    plain SGD unless the overrides choose another optimizer."""
    sgd = [] if any(o.startswith("optimizer=") and o != "optimizer=sgd" for o in overrides) else \
        ["momentum=0.0", "nesterov=false"]
    return load_config(None, ["workers=4", "epochs=2", "batch_size=16", "num_samples=1000", "lr=0.05",
                              *sgd, "dtype=float64", *overrides])


def train_rows(*overrides: str):
    """Train a small config; return (metric rows, summary, run) so tests can read the final rows."""
    cfg = small_config(*overrides)
    run, rows = build(cfg), []
    summary = train(cfg, run, on_row=rows.append)
    return rows, summary, run


def build(cfg):
    """build_run as the CLI does it: with the reference trajectory of a run:DIR target."""
    return build_run(cfg, reference=reference_trajectory(cfg))


def train_final(*overrides: str):
    """(summary, run) of a small training."""
    _, summary, run = train_rows(*overrides)
    return summary, run


def assert_same_state(a, b, path: str = "state", skip: tuple[str, ...] = ()) -> None:
    """Two (nested) states equal bit for bit: tensors, keys and values, but the paths in ``skip``."""
    if path in skip:
        return
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            assert_same_state(a[key], b[key], f"{path}.{key}", skip)
    else:
        assert a == b, path


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def sim_run(tmp_path_factory):
    """The run directory of ``gossamer train`` (the simulator) with a list of overrides, trained
    once per session: the reference that multi-process runs of the same config are compared with."""
    runs = {}

    def get(overrides: list[str]):
        key = tuple(overrides)
        if key not in runs:
            out = tmp_path_factory.mktemp("sim") / "run"
            assert main(["train", "--quiet", "--out", str(out), *sets(overrides)]) == 0
            runs[key] = out
        return runs[key]
    return get


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """$GOSSAMER_CACHE in a temporary folder for the session: the suite never writes to the
    user's cache (~/.cache/gossamer) nor reads what an earlier run left there."""
    old = os.environ.get("GOSSAMER_CACHE")
    os.environ["GOSSAMER_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if old is None:
        del os.environ["GOSSAMER_CACHE"]
    else:
        os.environ["GOSSAMER_CACHE"] = old


@pytest.fixture(scope="session")
def cifar_case(tmp_path_factory) -> list[str]:
    data = write_cifar(tmp_path_factory.mktemp("cifar"), train=64, test=32)
    return ["dataset=cifar10", f"data_dir={data}", "model=resnet20", "workers=4", "epochs=1", "batch_size=4",
            "lr=0.05", "momentum=0.9", "nesterov=true", "dtype=float64", "grad_backend=loop", "algorithm=gossip",
            "bn_eval=recompute"]


@pytest.fixture(scope="session")
def dist_runs(tmp_path_factory, cifar_case):
    """{procs: run root}, launched on first use: one launch per process count runs every case of
    tests/dist_scripts/parity.py (the dist tests), and the 4-process one also the hooks' process
    checks (tests/dist_scripts/hooks.py, into ROOT/hooks). The processes are started with
    torchrun's environment (rank 0 hosts the store); torchrun itself, its agent's store and its
    restarts, is exercised by the elastic-restart test.

    Under pytest-xdist (``-n 2``, the README's test command) the workers share each launch: the
    first to need it runs it under a file lock in the session's common temporary folder, the
    other waits for it and reads the same runs."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the session's folder, above each worker's own
    roots = {}

    def get(procs: int) -> Path:
        if procs not in roots:
            root = shared / f"dist{procs}"
            with FileLock(f"{root}.lock"):
                if not (root / "launched").exists():
                    _launch(root, procs, cifar_case)
            roots[procs] = root
        return roots[procs]
    return get


def _launch(root: Path, procs: int, cifar_case: list[str]) -> None:
    """One launch of tests/dist_scripts/parity.py on ``procs`` processes into ``root`` (see
    dist_runs); ``root/launched`` marks it complete."""
    shutil.rmtree(root, ignore_errors=True)  # what a launch that failed on the other worker left
    root.mkdir()
    runs = [[name, SHORT + o] for name, o in DIST_CASES[procs].items()]
    if procs == 2:  # the costliest cases once: blocks of two rows a process (CIFAR's per-row augmentation)
        runs += [[CIFAR_CASE, cifar_case], ["acceptance", ACCEPTANCE]]
    cases = {"runs": runs}
    if procs == 4:
        cases["hooks"] = {
            "parity": [[name, SMALL + overrides, hook] for name, (overrides, hook) in HOOK_PROCESS_CASES.items()],
            "resume": [[name, SMALL + overrides, hook, [3, 8]]
                       for name, (overrides, hook) in HOOK_PROCESS_CASES.items()]}
    (root / "cases.json").write_text(json.dumps(cases))
    argv = [str(SCRIPTS / "parity.py"), str(root), str(root / "cases.json")]
    results = finish(spawn(procs, argv, cwd=root), 300)
    for code, out, err in results:
        assert code == 0, err[-3000:]
    # rank 0 alone prints, once per run
    assert [out.count("run written to") for _, out, _ in results] == [len(runs)] + [0] * (procs - 1)
    (root / "launched").touch()


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """One intra-op thread, like every launched process (OMP_NUM_THREADS=1): on a shared 2-core
    machine a second OpenMP thread mostly waits at barriers for a descheduled peer — measured, a
    small Transformer step took 1.6 s with 2 threads under load and 0.03 s with 1
    (docs/benchmarks.md, "Why --threads 1")."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def write_cifar(root, train: int = 200, test: int = 60, cifar100: bool = False, seed: int = 0):
    """A tiny CIFAR in the real binary layout and file names under ``root``: random pixels, labels
    cycling over the classes (CIFAR-100: coarse label byte, then the fine one)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    folder, classes, files = (("cifar-100-binary", 100, {"train.bin": train, "test.bin": test}) if cifar100 else
                              ("cifar-10-batches-bin", 10, {**{f"data_batch_{i}.bin": train // 5 for i in range(1, 6)},
                                                            "test_batch.bin": test}))
    (root / folder).mkdir(parents=True, exist_ok=True)
    for name, count in files.items():
        labels = (np.arange(count) % classes).astype(np.uint8)[:, None]
        pixels = rng.integers(0, 256, (count, 3072), dtype=np.uint8)
        label_bytes = [labels // 5, labels] if cifar100 else [labels]
        (root / folder / name).write_bytes(np.concatenate([*label_bytes, pixels], axis=1).tobytes())
    return root



def pytest_collection_modifyitems(items):
    """The tests that launch processes first (in their order): under xdist their launches then run
    beside the other worker's in-process tests, instead of alone at the end of the run."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
