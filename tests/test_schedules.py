"""Which communication primitive each schedule calls at which step, recorded by a fake engine
(no processes); and that measurement never changes training and is counted apart."""

import contextlib
import itertools

import pytest
import torch

from conftest import small_config, train_rows
from gossamer.engines.sim import SimEngine
from gossamer.engines.ledger import allreduce_bytes
from gossamer.train import build_run, train

S = 12  # steps per epoch of the small config


class RecordingEngine(SimEngine):
    """The simulator, recording every communication primitive as (step, op, which rows)."""

    def __init__(self, n: int):
        super().__init__(n)
        self.calls, self.t, self.names = [], None, {}

    def _log(self, op: str, X: torch.Tensor, *args) -> None:
        self.calls.append((self.t, op, self.names.get(X.data_ptr(), f"{X.shape[1]} columns"), *args))

    def allreduce_mean_(self, X, site="rows", async_op=False):
        self._log("allreduce", X)
        return super().allreduce_mean_(X, site, async_op)

    def block_mean_(self, X, block_size, site="rows"):
        self._log("block", X, block_size)
        super().block_mean_(X, block_size, site)

    def gossip_(self, X, mixing, measure=False):
        self._log("gossip", X)
        return super().gossip_(X, mixing, measure)

    def exchange(self, payload, mixing, nbytes=None):
        self.calls.append((self.t, "exchange", payload[0].numel() * payload.element_size(), mixing.index.shape[0]))
        return super().exchange(payload, mixing, nbytes)

    def all_gather(self, payload, block_size=None, async_op=False):
        self.calls.append((self.t, "all_gather", payload.shape[1], block_size))
        return super().all_gather(payload, block_size, async_op)


def record(*overrides: str, steps: int = 2 * S, mark_steps: bool = False) -> list[tuple]:
    """Train ``steps`` steps (the training loop itself, :func:`gossamer.train.train`, with no
    metric due) and return the primitives the schedule called, by step (with ``mark_steps``, also
    (t, "local step") where the local optimizer steps)."""
    cfg = small_config(*overrides, f"epochs={-(-steps // S)}", "metrics_every=1000", "eval_every=1000")
    engine = RecordingEngine(cfg.workers)
    run = build_run(cfg, engine=engine)
    w = run.workers
    engine.names = {w.X.data_ptr(): "X", w.G.data_ptr(): "G",
                    **{t.data_ptr(): f"opt.{k}" for k, t in run.optimizer.rows.items()}}
    schedule_step, optimizer_step = run.schedule.step, run.optimizer.step

    def step(io):
        engine.t = io.t
        if io.t == steps:
            raise Finished
        return schedule_step(io)

    def local_step(*args):
        optimizer_step(*args)
        engine.calls.append((engine.t, "local step"))
    run.schedule.step = step
    if mark_steps:
        run.optimizer.step = local_step
    with contextlib.suppress(Finished):
        train(cfg, run)
    return engine.calls


class Finished(Exception):
    """The steps to record are done."""


def test_local_sgd_h4_averages_the_parameters_after_every_fourth_step():
    assert record("algorithm=local", "local_steps=4") == [(t, "allreduce", "X") for t in (3, 7, 11, 15, 19, 23)]


def test_post_local_averages_gradients_before_the_switch_then_parameters_every_h():
    calls = record("algorithm=post-local", "switch_step=5", "local_steps=3")
    assert calls == [(t, "allreduce", "G") for t in range(5)] + [(t, "allreduce", "X") for t in (7, 10, 13, 16, 19, 22)]


def test_hierarchical_block_averages_and_every_hb_th_a_global_one():
    calls = record("algorithm=hierarchical", "block_size=2", "block_rounds=3", "local_steps=2")
    expected = [(t, "allreduce", "X") if (t + 1) // 2 % 3 == 0 else (t, "block", "X", 2) for t in range(1, 24, 2)]
    assert calls == expected


def test_compressed_local_sgd_all_gathers_packed_messages():
    calls = record("algorithm=hierarchical", "block_size=2", "block_rounds=2", "local_steps=3",
                   "compression=ef-sign", steps=12)
    d_bytes = -(-5210 // 8) + 4 * 8  # ⌈d/8⌉ sign bytes + a float32 scale per tensor (8 tensors)
    assert calls == [(2, "all_gather", d_bytes, 2), (5, "all_gather", d_bytes, None),
                     (8, "all_gather", d_bytes, 2), (11, "all_gather", d_bytes, None)]


def test_gossip_with_phases_and_the_average_when_an_allreduce_phase_starts():
    calls = record("algorithm=gossip", "epochs=2", "momentum=0.9", "phases=[allreduce,gossip,allreduce]",
                   "phase_epochs=[0.5,1]", "average_optimizer_state=true")
    phase1 = [(t, "allreduce", "G") for t in range(6)]
    phase2 = [c for t in range(6, 12) for c in ((t, "gossip", "opt.momentum"), (t, "gossip", "X"))]
    switch = [(11, "allreduce", "X"), (11, "allreduce", "opt.momentum")]
    phase3 = [(t, "allreduce", "G") for t in range(12, 24)]
    assert calls == phase1 + phase2 + switch + phase3


def test_mix_then_step_gossips_before_the_local_step():
    calls = record("algorithm=gossip", "gossip_form=mix-then-step", steps=3)
    assert calls == [(t, "gossip", "X") for t in range(3)]


def test_local_gossip_gossips_after_every_h_th_step_counted_from_each_decentralized_phase():
    assert record("algorithm=gossip", "local_steps=3", steps=12) == [(t, "gossip", "X") for t in (2, 5, 8, 11)]
    calls = record("algorithm=gossip", "local_steps=4", "phases=[allreduce,gossip,allreduce,gossip]",
                   "phase_steps=[3,13,15]")
    assert calls == ([(t, "allreduce", "G") for t in range(3)] + [(t, "gossip", "X") for t in (6, 10)]
                     + [(12, "allreduce", "X")] + [(t, "allreduce", "G") for t in (13, 14)]
                     + [(t, "gossip", "X") for t in (18, 22)])


def test_local_gossip_in_mix_then_step_form_gossips_before_the_local_step():
    calls = record("algorithm=gossip", "local_steps=3", "gossip_form=mix-then-step", steps=9, mark_steps=True)
    assert calls == [c for t in range(9) for c in ([(t, "gossip", "X")] if t % 3 == 2 else []) + [(t, "local step")]]


def test_frequency_control_lengthens_the_period_by_one_under_an_unreachable_target():
    calls = record("algorithm=gossip", "consensus.target=constant", "consensus.value=1e9",
                   "consensus.action=frequency", "consensus.max_local_steps=3")
    periods = [1, 2] + [3] * 8  # H_t: +1 per round up to the maximum
    assert calls == [(t - 1, "gossip", "X") for t in itertools.accumulate(periods) if t <= 2 * S]


def test_diloco_averages_every_h_steps_for_its_outer_step():
    # the mean of a copy of X (the workers' rows stay theirs until the outer model is applied)
    assert record("algorithm=diloco", "local_steps=5") == [(t, "allreduce", "5210 columns") for t in (4, 9, 14, 19)]


def test_choco_exchanges_compressed_messages_with_the_union_of_its_neighbours_every_step():
    calls = record("algorithm=choco", "topology=ring", "compression=top-k:0.01", "choco_gamma=0.5", steps=3)
    k = sum(-(-n // 100) for n in (125, 25, 1875, 25, 1875, 25, 1250, 10))  # ⌈0.01·numel⌉ of the CNN's 8 tensors
    assert calls == [(t, "exchange", 8 * k, 3) for t in range(3)]  # 3 slots: self and the two ring neighbours
    calls = record("algorithm=choco", "topology=one-peer-exponential", steps=3)  # identity codec: d float64
    assert calls == [(t, "exchange", 8 * 5210, 3) for t in range(3)]  # slots of the period's union: self, +1, +2


def test_sgp_gossips_the_model_and_its_push_sum_weight_in_one_message():
    assert record("algorithm=sgp", "topology=directed-exponential", steps=3) == \
        [(t, "gossip", "5211 columns") for t in range(3)]


def test_gradient_tracking_gossips_model_and_tracker_in_one_message():
    assert record("algorithm=gradient-tracking", steps=3) == [(t, "gossip", "10420 columns") for t in range(3)]


def test_quasi_global_momentum_communicates_as_gossip_does():
    assert record("algorithm=gossip", "momentum_mode=quasi-global", "momentum=0.9", steps=3) == \
        [(t, "gossip", "X") for t in range(3)]


def test_estimate_control_gossips_extra_rounds_without_probing_the_models():
    calls = record("algorithm=gossip", "consensus.target=constant", "consensus.value=1e-3",
                   "consensus.measure=estimate", "consensus.max_extra_rounds=3", steps=2)
    assert calls == [(t, op, "X") for t in range(2) for op in ["gossip"] * 4 + ["allreduce"]]  # budget spent


def test_allreduce_averages_gradients_every_step():
    assert record("algorithm=allreduce", steps=4) == [(t, "allreduce", "G") for t in range(4)]


# ---------------------------------------------------------------- measurement


@pytest.mark.parametrize("overrides", [("algorithm=gossip",), ("algorithm=local", "local_steps=3")])
def test_metrics_every_changes_rows_and_measurement_traffic_not_training(overrides):
    every, every_row = train_rows(*overrides, "metrics_every=5")[1:], train_rows(*overrides)[1:]
    (sparse, run_sparse), (dense, run_dense) = every, every_row
    torch.testing.assert_close(run_sparse.workers.X, run_dense.workers.X, rtol=0, atol=0)
    for key in ("comm_rounds", "bytes_per_worker", "final_loss", "test_accuracy", "final_consensus_distance_sq"):
        assert sparse[key] == dense[key], key
    assert 0 < sparse["bytes_per_worker_metrics"] < dense["bytes_per_worker_metrics"]
    rows, _, _ = train_rows(*overrides, "metrics_every=5")
    assert [r["step"] for r in rows] == [5, 10, 12, 15, 20, 24]  # every 5th step, and each evaluation


def test_measurement_traffic_is_counted_apart_and_exactly():
    """allreduce, n = 4: the algorithm's bytes are its gradient all-reduces alone; measurement is
    φ², loss and Ξ² at each measured step, plus what each evaluation reads (bookkeeping such as
    the finite check before a checkpoint is not counted)."""
    cfg = small_config("algorithm=allreduce", "metrics_every=3")
    run = build_run(cfg)
    summary = train(cfg, run)
    n, d, steps = 4, run.workers.d, summary["steps"]
    g, r = (n - 1) * 8, allreduce_bytes(d, n, 8)  # a float64 all-gather, an all-reduce of d float64 values
    measured, evaluations = len({*range(3, steps + 1, 3), S, 2 * S}), 2
    per_step = 3 * g + r  # φ², loss, Ξ² (x̄ and one scalar)
    per_evaluation = (r + 0) + g + 2 * r  # x̄ and b̄ (no buffers), local mean, per layer
    assert summary["bytes_per_worker"] == steps * r
    assert summary["bytes_per_worker_metrics"] == pytest.approx(measured * per_step + evaluations * per_evaluation)


@pytest.mark.parametrize("overrides, steps", [
    (["algorithm=allreduce"], range(2 * S)),
    (["algorithm=local", "local_steps=3"], []),
    (["algorithm=post-local", "switch_step=5", "local_steps=3"], range(5)),
    (["algorithm=gossip", "phases=[gossip,allreduce,gossip]", "phase_steps=[4,9]"], range(4, 9)),
    (["algorithm=gossip", "gossip_form=mix-then-step", "phases=[allreduce,gossip]", "phase_steps=[7]"], range(7)),
    (["algorithm=gossip", "local_steps=3", "phases=[gossip,allreduce]", "phase_steps=[10]"], range(10, 2 * S)),
    (["algorithm=diloco", "local_steps=4"], []),
])
def test_averages_gradients_says_exactly_when_on_gradients_averages_them(overrides, steps):
    """What DDP's comm hook relies on (gossamer.integrations): at step t, on_gradients all-reduces
    G — and does nothing else — exactly when averages_gradients(t)."""
    from gossamer.algorithms import Step

    cfg = small_config(*overrides)
    engine = RecordingEngine(cfg.workers)
    run = build_run(cfg, engine=engine)
    w = run.workers
    engine.names = {w.X.data_ptr(): "X", w.G.data_ptr(): "G"}
    run.schedule.start(engine, w.X)
    averaged = []
    for t in range(2 * S):
        engine.t, engine.calls = t, []
        w.G.normal_()
        step = Step(t, lr=0.01, measure=False)
        run.schedule.on_gradients(engine, w.X, w.G, step)
        expected = [(t, "allreduce", "G")] if run.schedule.averages_gradients(t) else []
        assert [c for c in engine.calls if c[2] == "G" or expected] == expected
        averaged += [t] if expected else []
        run.optimizer.step(w.X, w.G, 0.01)
        run.schedule.after_step(engine, w.X, step)
    assert averaged == list(steps)
