"""Post-local, hierarchical, compressed averaging, gossip forms, Adam, DiLoCo: identities."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from conftest import small_config, train_final, train_rows
from gossamer.algorithms import Step
from gossamer.algorithms.gossip import gossip_state
from gossamer.algorithms.local import ModelSync, switch_step
from gossamer.codecs import SignCodec, pack_codes, unpack_codes
from gossamer.data.partition import iid_epoch_indices
from gossamer.engines.sim import SimEngine
from gossamer.models import build_model
from gossamer.registry import ConfigError
from gossamer.train import build_run, train

S = 12  # steps per epoch of the small config (800 samples, 4 workers, batch 16)


def rows_of(*overrides):
    """Per-step metric rows and the final run of a small training."""
    rows, _, run = train_rows(*overrides)
    return rows, run


def close(a, b, tol=1e-9):
    torch.testing.assert_close(a, b, atol=tol, rtol=0)


# ---------------------------------------------------------------- post-local


def test_post_local_equals_allreduce_before_the_switch_step_for_step():
    post, _ = rows_of("algorithm=post-local", "switch_epoch=1", "local_steps=4", "momentum=0.9", "nesterov=true")
    base, _ = rows_of("algorithm=allreduce", "momentum=0.9", "nesterov=true")
    for p, b in zip(post[:S], base[:S]):
        assert p["loss"] == pytest.approx(b["loss"], abs=1e-12)
        assert p["comm_rounds"] == b["comm_rounds"]
    assert abs(post[S + 1]["loss"] - base[S + 1]["loss"]) > 1e-9  # and differs after it


def test_post_local_after_the_switch_is_local_sgd():
    _, post = rows_of("algorithm=post-local", "switch_step=0", "local_steps=3")
    _, local = rows_of("algorithm=local", "local_steps=3")
    close(post.workers.X, local.workers.X)
    rows, _ = rows_of("algorithm=post-local", "switch_epoch=1", "local_steps=4")
    # S all-reduce rounds, then an average every 4 steps: Ξ² vanishes exactly at those steps
    assert rows[-1]["comm_rounds"] == S + S // 4
    for r in rows[S:]:
        synced = (r["step"] - S) % 4 == 0
        assert (r["consensus_distance_sq"] < 1e-20) == synced


def test_post_local_switch_defaults_to_the_first_milestone():
    assert switch_step(small_config("algorithm=post-local", "milestones=[1.5]"), 10) == 15
    assert switch_step(small_config("algorithm=post-local", "switch_step=7"), 10) == 7


# ---------------------------------------------------------------- hierarchical


def test_hierarchical_with_one_block_equals_local():
    _, h = rows_of("algorithm=hierarchical", "block_size=4", "block_rounds=3", "local_steps=2")
    _, local = rows_of("algorithm=local", "local_steps=2")
    close(h.workers.X, local.workers.X)


def test_hierarchical_with_blocks_of_one_and_hb_1_equals_local():
    _, h = rows_of("algorithm=hierarchical", "block_size=1", "block_rounds=1", "local_steps=2")
    _, local = rows_of("algorithm=local", "local_steps=2")
    close(h.workers.X, local.workers.X)


def test_hierarchical_counts_rounds_per_level(tmp_path):
    summary, _ = train_final("algorithm=hierarchical", "block_size=2", "block_rounds=3", "local_steps=2")
    syncs = 2 * S // 2  # 12 averaging rounds in 24 steps
    assert summary["comm_rounds_global"] == syncs // 3
    assert summary["comm_rounds_block"] == syncs - syncs // 3
    assert summary["comm_rounds"] == syncs
    d = summary["parameters"]
    assert summary["bytes_per_worker_block"] == pytest.approx(8 * 2 * d * (2 - 1) / 2 * 8)  # float64 values
    assert summary["bytes_per_worker_global"] == pytest.approx(4 * 2 * d * (4 - 1) / 4 * 8)


def test_block_average_leaves_other_blocks_untouched():
    X = torch.randn(8, 5, dtype=torch.float64)
    Y = X.clone()
    SimEngine(8).block_mean_(Y, 4)
    close(Y[:4], X[:4].mean(0).expand(4, 5))
    close(Y[4:], X[4:].mean(0).expand(4, 5))


# ---------------------------------------------------------------- compression


def test_sign_compression_message():
    delta = torch.tensor([[1.0, -3.0, 0.5, 2.0, -2.0]])
    codec = SignCodec([3, 2])
    message = codec.encode(delta, 0, range(1))
    assert message.dtype == torch.uint8 and message.shape == (1, codec.nbytes())
    close(message[:, 1:].clone(memory_format=torch.contiguous_format).view(torch.float32), torch.tensor([[1.5, 2.0]]))  # the scales, float32
    close(codec.decode(message), torch.tensor([[1.5, -1.5, 1.5, 2.0, -2.0]]))
    assert codec.nbytes() == 1 + 2 * 4  # 5 bits in one byte, two float32 scales


@pytest.mark.parametrize("bits", range(1, 10))
def test_codes_pack_end_to_end_most_significant_bit_first_as_numpys_packbits(bits):
    """pack_codes is numpy's packbits (big bit order) of the codes' bits written out, for codes that
    tile a byte (shifted in) and codes that straddle bytes (through their bits); unpack inverts it."""
    g = torch.Generator().manual_seed(bits)
    codes = torch.randint(0, 2**bits, (3, 1001), generator=g)
    expanded = (codes.numpy()[:, :, None] >> np.arange(bits - 1, -1, -1)) & 1
    packed = pack_codes(codes if bits > 1 else codes == 1, bits)
    assert packed.dtype == torch.uint8 and packed.shape == (3, -(-1001 * bits // 8))
    assert np.array_equal(packed.numpy(), np.packbits(expanded.reshape(3, -1).astype(np.uint8), axis=1))
    assert torch.equal(unpack_codes(packed, 1001, bits).to(torch.int64), codes)


def test_build_run_refuses_an_option_set_through_the_python_api_that_the_config_refuses():
    """dataclasses.replace skips the config's validation; build_run does not."""
    cfg = dataclasses.replace(small_config("algorithm=diloco"), average_optimizer_state=True)
    with pytest.raises(ConfigError, match="average_optimizer_state does not apply to algorithm diloco"):
        build_run(cfg)


def test_error_feedback_message_plus_new_residual_is_change_plus_old_residual():
    numels = [30, 70]
    X = torch.zeros(4, 100, dtype=torch.float64)
    sync = ModelSync("ef-sign", numels, like=X)
    sync.start(X)
    engine, codec = SimEngine(4), SignCodec(numels, dtype=torch.float64)
    for _ in range(3):
        residual = sync.compressors["global"].residual
        old_ref, old_error = sync.ref["global"].clone(), residual.clone()
        X += torch.randn_like(X)
        change = X - old_ref
        message = codec.decode(codec.encode(change + old_error, 0, range(4)))
        sync(engine, X, round=0)
        close(message + sync.compressors["global"].residual, change + old_error, tol=1e-12)
        close(X, old_ref + message.mean(0))  # everyone moves by the mean compressed change


def test_compressed_local_sgd_trains_and_counts_real_bits():
    summary, run = train_final("algorithm=local", "local_steps=4", "compression=sign")
    exact, _ = train_final("algorithm=local", "local_steps=4")
    d, n, syncs = summary["parameters"], 4, 2 * S // 4
    message = -(-d // 8) + 4 * len(run.workers.param_slots)
    assert summary["bytes_per_worker"] == pytest.approx(syncs * (n - 1) * message)  # ring all-gather
    assert summary["final_loss"] != exact["final_loss"]


@pytest.mark.parametrize("compression", ["sign", "ef-sign"])
def test_compressed_local_sgd_learns(compression):
    rows, _ = rows_of("algorithm=local", "local_steps=4", f"compression={compression}", "momentum=0.9", "epochs=4")
    first, last = (sum(r["loss"] for r in part) / S for part in (rows[:S], rows[-S:]))
    assert last < first - 0.02  # deterministic: seeds fixed


def test_sign_message_is_about_1_32_of_float32_for_large_tensors():
    d = 1_000_000
    codec = SignCodec([d // 2, d // 2])
    assert codec.encode(torch.randn(1, d), 0, range(1)).shape[1] == codec.nbytes()
    assert codec.nbytes() / (4 * d) == pytest.approx(1 / 32, rel=1e-3)


def test_ef_sign_hierarchical_runs():
    summary, _ = train_final("algorithm=hierarchical", "block_size=2", "block_rounds=2", "local_steps=2",
                             "compression=ef-sign")
    assert summary["comm_rounds_block"] == 6 and summary["comm_rounds_global"] == 6


# ---------------------------------------------------------------- gossip forms


def test_gossip_forms_differ():
    _, stm = rows_of("algorithm=gossip", "topology=ring")
    _, mts = rows_of("algorithm=gossip", "topology=ring", "gossip_form=mix-then-step")
    assert (stm.workers.X - mts.workers.X).abs().max() > 1e-6


def test_mix_then_step_is_one_gossip_then_the_local_step():
    cfg = small_config("algorithm=gossip", "topology=ring", "gossip_form=mix-then-step", "epochs=1")
    run = build_run(cfg)
    X0 = run.workers.X.clone()
    idx = iid_epoch_indices(800, 4, 16, 0, cfg.seed)[0]
    losses = run.workers.loss_and_grad(run.data.x_train[idx], run.data.y_train[idx])
    G0 = run.workers.G.clone()
    run.schedule.on_gradients(run.engine, run.workers.X, run.workers.G, Step(0))
    W = torch.tensor(gossip_state(run.schedule).topology.matrix(0))
    close(run.workers.X, W @ X0)
    assert losses.shape == (4,) and G0.abs().sum() > 0


# ---------------------------------------------------------------- Adam


@pytest.mark.parametrize("name, torch_cls", [("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW)])
def test_adam_with_one_worker_equals_torch(name, torch_cls):
    cfg = small_config("workers=1", f"optimizer={name}", "lr=0.003", "weight_decay=0.01", "decay_norm_and_bias=true")
    run = build_run(cfg)
    train(cfg, run)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, run.data).double()
    opt = torch_cls(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    for epoch in range(cfg.epochs):
        idx = iid_epoch_indices(800, 1, cfg.batch_size, epoch, cfg.seed)
        for s in range(run.steps_per_epoch):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(run.data.x_train[idx[s, 0]]), run.data.y_train[idx[s, 0]]).backward()
            opt.step()
    close(run.workers.X[0], torch.cat([p.detach().reshape(-1) for p in model.parameters()]), tol=1e-12)


def test_adam_moments_stay_local_unless_averaged():
    _, local = rows_of("algorithm=local", "local_steps=4", "optimizer=adam", "lr=0.003")
    m = local.optimizer.rows["exp_avg"]
    assert (m - m.mean(0)).abs().max() > 1e-6
    _, avg = rows_of("algorithm=local", "local_steps=4", "optimizer=adam", "lr=0.003", "average_optimizer_state=true")
    for moment in avg.optimizer.rows.values():  # 24 steps, the last is a sync: all moments equal
        close(moment, moment.mean(0).expand_as(moment), tol=1e-12)


# ---------------------------------------------------------------- DiLoCo


def test_diloco_with_outer_lr_1_and_no_momentum_equals_local():
    _, diloco = rows_of("algorithm=diloco", "local_steps=3", "outer_lr=1", "outer_momentum=0")
    _, local = rows_of("algorithm=local", "local_steps=3")
    close(diloco.workers.X, local.workers.X)


def test_diloco_outer_nesterov_step():
    rows, diloco = rows_of("algorithm=diloco", "local_steps=3", "outer_lr=0.7", "outer_momentum=0.9")
    _, local = rows_of("algorithm=local", "local_steps=3")
    assert (diloco.workers.X - local.workers.X).abs().max() > 1e-6
    assert rows[-1]["comm_rounds"] == 2 * S // 3


# ---------------------------------------------------------------- communication counts


def test_local_sgd_with_h4_has_s_over_4_rounds():
    summary, _ = train_final("algorithm=local", "local_steps=4")
    assert summary["comm_rounds"] == summary["comm_rounds_global"] == summary["steps"] // 4


@pytest.mark.parametrize("overrides, fragment", [
    (["algorithm=hierarchical", "block_size=3"], "block_size must divide workers"),
    (["algorithm=gossip", "compression=sign"], "compression does not apply to algorithm 'gossip'"),
    (["algorithm=local", "compression=zip"], "unknown compression 'zip'; choose one of: sign, top-k:F, random-k:F, qsgd:S"),
    (["algorithm=allreduce", "outer_lr=0.5"], "outer_lr does not apply to algorithm 'allreduce': it is an option of algorithm async-local-sgd, algorithm diloco"),
    (["optimizer=adam", "momentum=0.5"], "momentum does not apply to optimizer 'adam'"),
    (["algorithm=post-local"], "post-local needs"),
    (["algorithm=post-local", "switch_epoch=1", "switch_step=3"], "not both"),
    (["optimizer=lion"], "unknown optimizer 'lion'"),
    (["algorithm=gossip", "gossip_form=sideways"], "unknown gossip_form"),
    (["algorithm=gossip", "phase_epochs=[1]"], "phase_epochs needs phases"),
    (["algorithm=gossip", "phases=[gossip,allreduce]", "phase_steps=[5]", "phase_epochs=[1]"], "not both"),
    (["algorithm=gossip", "phases=[gossip,allreduce]", "phase_steps=[2.5]"], "phase_steps must be a list of integers"),
    (["algorithm=gossip", "phases=[gossip,allreduce,gossip]", "phase_steps=[5,5]"], "increasing steps"),
])
def test_bad_algorithm_options(overrides, fragment):
    from gossamer.config import ConfigError
    with pytest.raises(ConfigError, match=fragment):
        small_config(*overrides)


def test_every_algorithm_runs_from_the_cli(tmp_path, capsys):
    from gossamer.cli import main
    for algorithm, extra in [("post-local", ["switch_epoch=1", "local_steps=4"]),
                             ("hierarchical", ["block_size=2", "block_rounds=2", "local_steps=2"]),
                             ("diloco", ["local_steps=4", "optimizer=adamw", "lr=0.003"])]:
        sets = [x for kv in ["workers=4", "epochs=2", "num_samples=1000", f"algorithm={algorithm}", *extra]
                for x in ("--set", kv)]
        assert main(["train", *sets, "--quiet", "--out", str(tmp_path / algorithm)]) == 0
        assert json.loads((tmp_path / algorithm / "summary.json").read_text())["test_accuracy"] > 0.15


def test_phase_steps_are_phase_epochs_counted_in_steps():
    """12 steps an epoch: a boundary at step 6 is the boundary at epoch 0.5; one past the run is refused."""
    by_epoch, _ = train_final("algorithm=gossip", "epochs=1", "phases=[gossip,allreduce]", "phase_epochs=[0.5]")
    by_step, _ = train_final("algorithm=gossip", "epochs=1", "phases=[gossip,allreduce]", "phase_steps=[6]")
    by_epoch.pop("wall_seconds"), by_step.pop("wall_seconds")
    assert by_step == by_epoch and by_step["comm_rounds_gossip"] == 6
    from gossamer.config import ConfigError
    with pytest.raises(ConfigError, match="phase_steps must be below the run's 12 steps"):
        train_final("algorithm=gossip", "epochs=1", "phases=[gossip,allreduce]", "phase_steps=[12]")
