"""The worker matrix's gradient backends: loop and vmap compute the same losses and gradients."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.utils import vector_to_parameters
from torch.overrides import TorchFunctionMode

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


ROUNDING = 256  # tolerated relative-norm error of a computation against float64, in eps of its dtype
KINK = 256 * torch.finfo(torch.float32).eps  # the least distance of a ReLU input from 0 (_screened_batches)


class _ReluMargin(TorchFunctionMode):
    """The smallest |input| of the ReLUs run under it: how near the forward came to a ReLU's kink."""

    def __init__(self):
        super().__init__()
        self.margin = math.inf

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.relu, torch.Tensor.relu, F.relu):
            self.margin = min(self.margin, args[0].abs().min().item())
        return func(*args, **(kwargs or {}))


def _screened_batches(template, X, shape, steps=2, b=4):
    """``steps`` batches (x [m, b, *shape], y [m, b]) on which no ReLU input lies within KINK of 0,
    in float64 with row i of X as worker i's parameters.

    A ReLU's gradient jumps at 0: an input that float32 rounding moves across 0 changes the gradient
    by far more than rounding. On 32x32 images (ResNet-20, 3 workers of 4 images: 2.3 M ReLU inputs a
    step, some within 1e-7 of 0) the loop or vmap, as the CPU's kernels round, was 6e-4 to 1e-2 away
    from float64 in relative norm; on unscreened 8x8 and 6x6 images, in 3 and 1 seeds of 40. float32
    moved ResNet-20's ReLU inputs near 0 (within 1e-3) on 6x6 images by at most 6.5e-6 (55 eps, at
    its deepest layers; 20 seeds): none crosses 0 from KINK = 256 eps."""
    probe = copy.deepcopy(template).double().train()
    batches = []
    for _ in range(50 * steps):
        x, y = torch.randn(len(X), b, *shape, dtype=X.dtype), torch.randint(0, 10, (len(X), b))
        with torch.no_grad(), _ReluMargin() as relus:
            for row, xi in zip(X, x):
                vector_to_parameters(row.double(), probe.parameters())
                probe(xi.double())
        if relus.margin >= KINK:
            batches.append((x, y))
            if len(batches) == steps:
                return batches
    raise AssertionError(f"fewer than {steps} of {50 * steps} batches kept every ReLU input {KINK:.1e} from 0")


def _assert_rounding_close(actual, expected):
    """Each worker's row of ``actual`` is within ROUNDING eps (of its dtype) of the float64 ``expected``,
    in relative norm."""
    tol = ROUNDING * torch.finfo(actual.dtype).eps
    a, e = actual.double().reshape(len(actual), -1), expected.reshape(len(expected), -1)
    error = (a - e).norm(dim=1) / e.norm(dim=1)
    assert (error <= tol).all(), f"relative errors {error.tolist()} above {tol:.1e}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("model", ["resnet20", "cnn1d-bn"])
def test_vmap_updates_batchnorm_statistics_as_n_separate_modules(model, dtype):
    """Both backends' losses, gradients and running statistics, over two steps, are those of n
    ordinary modules with their own nn.BatchNorm layers computed in float64 (a float64 loop on the
    same parameters and batches), to rounding: within ROUNDING eps of the dtype, per worker.

    Measured in float32 (AMD EPYC, AVX-512; 40 seeds, oneDNN on and off): gradients up to 24 eps
    away (ResNet-20; 3 eps for the 1-D CNN), losses 3 eps, statistics 1 eps; in float64, vmap's
    gradients 20 eps. The batches keep every ReLU input away from its kink (_screened_batches), which
    6x6 images make likely for ResNet-20 while its last BatchNorm still sees 16 values a channel."""
    torch.manual_seed(0)
    template, shape = {"resnet20": (ResNet20(), (3, 6, 6)), "cnn1d-bn": (CNN1D(norm=True), (1, 40))}[model]
    template, m = template.to(dtype), 3
    loop, vmap = WorkerMatrix(template, m, backend="loop"), WorkerMatrix(template, m, backend="vmap")
    noise = 0.01 * torch.randn_like(loop.X)
    loop.X.add_(noise)
    vmap.X.add_(noise)
    reference = WorkerMatrix(copy.deepcopy(template).double(), m, backend="loop")
    reference.X.copy_(loop.X)
    start = loop.B.clone()
    for x, y in _screened_batches(template, loop.X, shape):
        expected = reference.loss_and_grad(x.double(), y)
        for w in (loop, vmap):
            _assert_rounding_close(w.loss_and_grad(x, y), expected)
            _assert_rounding_close(w.G, reference.G)
            _assert_rounding_close(w.B, reference.B)
    assert (loop.B - start).abs().max() > 1e-3  # the statistics did move, differently per worker
    assert (loop.B[0] - loop.B[1]).abs().max() > 1e-4
    # the loop's replicas are ordinary BatchNorm modules whose buffers are views of B
    bn = next(mod for mod in loop.replicas[1].modules() if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm))
    assert bn.running_mean.untyped_storage().data_ptr() == loop.B.untyped_storage().data_ptr()


def test_the_vmap_backend_copies_the_model_per_worker_only_where_integer_buffers_need_it(monkeypatch):
    """The loop backend's m module copies (m deep copies: minutes at tens of thousands of workers)
    are built by the vmap backend only for a model with integer buffers (BatchNorm's count), and for
    a plain model only when asked for."""
    copies = []
    real = copy.deepcopy
    monkeypatch.setattr(copy, "deepcopy", lambda obj, *a: (isinstance(obj, CNN1D) and copies.append(1)) or real(obj, *a))
    plain = WorkerMatrix(CNN1D(), 6, backend="vmap")
    assert copies == [] and plain.integer_buffers().shape == (6, 0)
    assert len(plain.replicas) == 6 and len(copies) == 6  # built when first asked for
    copies.clear()
    WorkerMatrix(CNN1D(norm=True), 6, backend="vmap")
    WorkerMatrix(CNN1D(), 6, backend="loop")
    assert len(copies) == 12


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("norm", [False, True])
def test_vmap_in_blocks_of_rows_gives_each_worker_the_numbers_of_one_call(monkeypatch, dtype, norm):
    """The vmap backend takes its rows VMAP_ROWS at a time (one grouped convolution of 16,384
    workers is 2.4x slower than 64 calls of 256): losses, gradients and BatchNorm statistics are
    those of one call over all rows, whatever the blocks (8 rows in blocks of 3): bit for bit in
    float64 (no oneDNN kernel: the grouped convolution loops over its groups), and in float32 on
    the CPU measured (Intel Xeon, AVX-512 and AMX; oneDNN may pick another kernel for another group count
    elsewhere, so float32 is held to torch's float32 tolerance)."""
    import gossamer.workers as workers

    torch.manual_seed(0)
    template, m = CNN1D(norm=norm).to(dtype), 8
    x, y = torch.randn(m, 4, 1, 40, dtype=dtype), torch.randint(0, 10, (m, 4))
    got = []
    for rows in (m, 3):
        monkeypatch.setattr(workers, "VMAP_ROWS", rows)
        w = WorkerMatrix(template, m, backend="vmap")
        w.X.add_(0.01 * torch.arange(m * w.d, dtype=dtype).view(m, w.d).sin())
        got.append((w.loss_and_grad(x, y), w.G.clone(), w.B.clone(), len(w._blocks)))
    (loss, G, B, one), (loss3, G3, B3, three) = got
    assert (one, three) == (1, 3)
    for a, b in ((loss, loss3), (G, G3), (B, B3)):
        assert torch.equal(a, b) if dtype == torch.float64 else torch.testing.assert_close(a, b) is None
