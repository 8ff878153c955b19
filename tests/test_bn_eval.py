"""bn_eval: the averaged model x̄ evaluated with the workers' mean BatchNorm statistics or with
statistics re-estimated for x̄ itself; rejected for models without running statistics."""

import pytest
import torch
import torch.nn.functional as F
import yaml

from conftest import write_cifar
from gossamer.cli import main
from gossamer.config import ConfigError, load_config
from gossamer.train import averaged_model, build_run, recompute_batches


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_cifar(tmp_path_factory.mktemp("cifar"), train=100, test=20)


def _run(root, bn_eval):
    cfg = load_config(None, ["dataset=cifar10", f"data_dir={root}", "model=resnet20", "workers=3", "batch_size=4",
                             "dtype=float64", f"bn_eval={bn_eval}"])
    run = build_run(cfg)
    g = torch.Generator().manual_seed(0)
    run.workers.X.add_(0.05 * torch.randn(run.workers.X.shape, generator=g, dtype=torch.float64))
    run.workers.B.add_(torch.rand(run.workers.B.shape, generator=g, dtype=torch.float64))  # local statistics differ
    return run


def test_average_and_recompute_differ_and_recompute_matches_the_statistics_of_x_bar(root):
    average, recompute = _run(root, "average"), _run(root, "recompute")
    torch.testing.assert_close(average.workers.X, recompute.workers.X, rtol=0, atol=0)
    # average: x̄'s buffers are the mean of the workers' buffers
    model = averaged_model(average, t=9)
    assert not model.training
    torch.testing.assert_close(model.bn.running_mean, average.workers.B.mean(0)[:16], rtol=0, atol=1e-15)
    out_average = model(average.data.x_test).detach()
    # recompute: the first BatchNorm's statistics are those of x̄'s first convolution on the batches
    batches = recompute_batches(recompute, t=9)
    assert len(batches) == 8 and batches[0].shape == (12, 3, 32, 32)  # 8 batches of n·B = 12 images
    model = averaged_model(recompute, t=9)
    conv = [F.conv2d(x, model.conv.weight, padding=1) for x in batches]
    mean = torch.stack([c.mean((0, 2, 3)) for c in conv]).mean(0)
    var = torch.stack([c.transpose(0, 1).flatten(1).var(1) for c in conv]).mean(0)  # unbiased per batch
    torch.testing.assert_close(model.bn.running_mean, mean, rtol=0, atol=1e-12)
    torch.testing.assert_close(model.bn.running_var, var, rtol=0, atol=1e-12)
    assert not model.training and model.bn.momentum == 0.1  # restored after the re-estimate
    assert (model(recompute.data.x_test) - out_average).abs().max() > 1e-3
    # the workers' own statistics are untouched
    torch.testing.assert_close(recompute.workers.B, average.workers.B, rtol=0, atol=0)


def test_summary_and_config_say_which_was_used(root, tmp_path, capsys):
    data = ["dataset=cifar10", f"data_dir={root}", "model=resnet20", "workers=2", "batch_size=10", "epochs=1"]
    assert build_run(load_config(None, data)).cfg.bn_eval == "average"  # the default where there are statistics
    assert build_run(load_config(None, ["num_samples=500"])).cfg.bn_eval is None  # and none where there are not
    assert main(["train", "--quiet", *[a for o in [*data, "bn_eval=recompute"] for a in ("--set", o)],
                 "--out", str(tmp_path / "run")]) == 0
    assert yaml.safe_load((tmp_path / "run" / "summary.json").read_text())["bn_eval"] == "recompute"
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["bn_eval"] == "recompute"


@pytest.mark.parametrize("overrides, fragment", [
    (["bn_eval=recompute"], "bn_eval applies to models with BatchNorm running statistics; model 'cnn1d'"),
    (["bn_eval=average", "model=resnet20", "norm=group"], "model 'resnet20' as configured has none"),
])
def test_bn_eval_is_refused_where_there_are_no_statistics(overrides, fragment, root):
    data = (["dataset=cifar10", f"data_dir={root}", "workers=2", "batch_size=10"] if "model=resnet20" in overrides
            else ["num_samples=500"])
    with pytest.raises(ConfigError, match=fragment):
        build_run(load_config(None, [*data, *overrides]))
    with pytest.raises(ConfigError, match="unknown bn_eval 'median'; choose one of: average, recompute"):
        load_config(None, ["bn_eval=median"])
