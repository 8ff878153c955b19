"""The worker matrix's gradient backends: loop and vmap compute the same losses and gradients."""

import pytest
import torch
import torch.nn.functional as F

from gossamer.models import CNN1D, MLP, CharTransformer, ResNet20
from gossamer.workers import WorkerMatrix, choose_backend

MODELS = {"mlp": MLP, "cnn1d": CNN1D}


def _pair(name: str, m: int = 5):
    """Two float64 worker matrices of the same model, rows perturbed so that the workers differ."""
    torch.manual_seed(0)
    model = MODELS[name]().double()
    loop, vmap = WorkerMatrix(model, m, backend="loop"), WorkerMatrix(model, m, backend="vmap")
    noise = 0.01 * torch.randn_like(loop.X)
    loop.X.add_(noise)
    vmap.X.add_(noise)
    x = torch.randn(m, 8, 1, 40, dtype=torch.float64)
    y = torch.randint(0, 10, (m, 8))
    return loop, vmap, x, y


@pytest.mark.parametrize("name", sorted(MODELS))
def test_loop_and_vmap_agree(name):
    loop, vmap, x, y = _pair(name)
    assert (loop.backend, vmap.backend) == ("loop", "vmap")
    for _ in range(2):  # the second call must overwrite G, not accumulate into it
        l_loop, l_vmap = loop.loss_and_grad(x, y), vmap.loss_and_grad(x, y)
    torch.testing.assert_close(l_vmap, l_loop, rtol=0, atol=1e-10)
    torch.testing.assert_close(vmap.G, loop.G, rtol=0, atol=1e-10)
    assert loop.G.abs().sum() > 0


@pytest.mark.parametrize("backend", ["loop", "vmap"])
def test_gradients_land_in_G(backend):
    """Row i of G is worker i's own gradient, as plain autograd on a separate model computes it."""
    loop, vmap, x, y = _pair("cnn1d", m=3)
    w = {"loop": loop, "vmap": vmap}[backend]
    losses = w.loss_and_grad(x, y)
    for i in (0, 2):
        ref = CNN1D().double()
        torch.nn.utils.vector_to_parameters(w.X[i].clone(), ref.parameters())
        loss = F.cross_entropy(ref(x[i]), y[i])
        loss.backward()
        torch.testing.assert_close(losses[i], loss.detach(), rtol=0, atol=1e-12)
        torch.testing.assert_close(w.G[i], torch.cat([p.grad.reshape(-1) for p in ref.parameters()]),
                                   rtol=0, atol=1e-12)


def test_loop_grad_tensors_are_views_of_G():
    w = WorkerMatrix(MLP(), 3, backend="loop")
    for i, model in enumerate(w.replicas):
        for p in model.parameters():
            assert p.grad.untyped_storage().data_ptr() == w.G.untyped_storage().data_ptr()
            assert p.untyped_storage().data_ptr() == w.X.untyped_storage().data_ptr()
    ptr = w.G.data_ptr()
    w.loss_and_grad(torch.randn(3, 4, 1, 40), torch.randint(0, 10, (3, 4)))
    assert w.G.data_ptr() == ptr and w.G.abs().sum() > 0


def test_auto_choice():
    assert choose_backend(MLP(), 16) == "vmap"
    assert choose_backend(CNN1D(), 64) == "vmap"
    assert choose_backend(CNN1D(), 1) == "loop"  # nothing to batch over
    assert choose_backend(CNN1D().double(), 4) == "loop"  # float64 convs: no oneDNN kernel
    assert choose_backend(CNN1D().double(), 16) == "vmap"
    assert choose_backend(MLP().double(), 4) == "vmap"
    assert choose_backend(CNN1D(norm=True), 16) == "vmap"  # BatchNorm running statistics: vmapped too
    assert choose_backend(ResNet20(), 16) == "loop"  # compute-bound on CPU: measured, the loop is as fast
    assert choose_backend(CharTransformer(65, 64, width=64), 16) == "loop"
    assert choose_backend(ResNet20(), 16, device=torch.device("cuda")) == "vmap"
    assert choose_backend(ResNet20(), 1, device=torch.device("cuda")) == "loop"
    assert WorkerMatrix(CNN1D(norm=True), 2, backend="auto").backend == "vmap"
    with pytest.raises(ValueError, match="grad_backend must be one of"):
        choose_backend(MLP(), 2, "jit")


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
@pytest.mark.parametrize("model", ["resnet20", "cnn1d-bn"])
def test_vmap_updates_batchnorm_statistics_as_n_separate_modules(model, dtype, tol):
    """The vmap backend's losses, gradients and running statistics equal the loop's, whose
    replicas are n ordinary modules with their own nn.BatchNorm layers, over two steps.

    In float32, oneDNN's grouped convolution (what vmap makes of n convolutions) was seen to give
    ResNet-20 gradients 1e-3 away from n separate convolutions on one input of this test (float64
    and PyTorch's own convolutions agree to rounding), so the float32 case uses the latter."""
    torch.manual_seed(0)
    template, shape = {"resnet20": (ResNet20(), (3, 32, 32)), "cnn1d-bn": (CNN1D(norm=True), (1, 40))}[model]
    template, m = template.to(dtype), 3
    loop, vmap = WorkerMatrix(template, m, backend="loop"), WorkerMatrix(template, m, backend="vmap")
    noise = 0.01 * torch.randn_like(loop.X)
    loop.X.add_(noise)
    vmap.X.add_(noise)
    start = loop.B.clone()
    with torch.backends.mkldnn.flags(enabled=dtype == torch.float64):
        _two_steps(loop, vmap, m, shape, dtype, tol)
    assert (loop.B - start).abs().max() > 1e-3  # the statistics did move, differently per worker
    assert (loop.B[0] - loop.B[1]).abs().max() > 1e-4
    # the loop's replicas are ordinary BatchNorm modules whose buffers are views of B
    bn = next(mod for mod in loop.replicas[1].modules() if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm))
    assert bn.running_mean.untyped_storage().data_ptr() == loop.B.untyped_storage().data_ptr()


def _two_steps(loop, vmap, m, shape, dtype, tol):
    for step in range(2):
        x, y = torch.randn(m, 4, *shape, dtype=dtype), torch.randint(0, 10, (m, 4))
        l_loop, l_vmap = loop.loss_and_grad(x, y), vmap.loss_and_grad(x, y)
        torch.testing.assert_close(l_vmap, l_loop, rtol=0, atol=tol)
        torch.testing.assert_close(vmap.G, loop.G, rtol=0, atol=tol)
        torch.testing.assert_close(vmap.B, loop.B, rtol=0, atol=tol)
