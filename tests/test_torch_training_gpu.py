"""pycudnn.torch.fuse_for_training on a GPU: each training block's output, gradients and running
statistics against a float64 run of the original modules (PyTorch with cuDNN disabled), within a
bound set by PyTorch's own bfloat16/float16 distance from that run; a small ResNet trained 20
steps; momentum=None, eval mode, double backward, autocast and the fallback where the fused
kernels do not apply."""

from __future__ import annotations

import copy

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # a CPU build of PyTorch on a GPU machine
    pytest.skip("PyTorch has no CUDA here", allow_module_level=True)

import pycudnn.torch as pt  # noqa: E402
from torch_models import (SmallResNet, cross_entropy_steps, float64_bf16_fused,  # noqa: E402
                          randomize_batchnorm)

nn = torch.nn
F = torch.nn.functional
DEV = torch.device("cuda", 0)
CL = torch.channels_last


@pytest.fixture(autouse=True)
def _strict_flags():
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def rel(got, ref):
    got, ref = got.double().cpu(), ref.double().cpu()
    return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


class Chain(nn.Module):
    def __init__(self, cin, cout, kind, stride=1, groups=1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, stride, 1, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.kind = kind

    def forward(self, x, z=None):
        y = self.bn(self.conv(x))
        if self.kind == "add_relu":
            y = y + z
        return torch.relu(y) if self.kind != "bn" else y


def _reference(model, dtype, args):
    """The original modules in ``dtype`` (cuDNN off for float64), their output, the gradients
    of the inputs and parameters, and the running statistics after the step."""
    m = copy.deepcopy(model).to(dtype)
    args = [a.detach().to(dtype).requires_grad_() for a in args]
    with torch.backends.cudnn.flags(enabled=dtype is not torch.float64):
        y = m(*args)
        g = torch.randn(tuple(y.shape), dtype=torch.float64, device=DEV,
                        generator=torch.Generator(DEV).manual_seed(7)).to(dtype)
        y.backward(g)
    grads = [a.grad for a in args] + [m.conv.weight.grad, m.bn.weight.grad, m.bn.bias.grad]
    return y, grads, (m.bn.running_mean, m.bn.running_var), g


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["bn", "relu", "add_relu"])
@pytest.mark.parametrize("shape,stride,groups", [((8, 16, 12, 12), 1, 1), ((4, 32, 9, 9), 2, 1),
                                                 ((4, 32, 8, 8), 1, 32)])
def test_block_matches_float64(dtype, kind, shape, stride, groups):
    torch.manual_seed(0)
    n, c, h, w = shape
    model = randomize_batchnorm(Chain(c, c, kind, stride, groups)).to(DEV)
    x = torch.randn(shape, device=DEV).to(memory_format=CL)
    args = [x]
    if kind == "add_relu":
        ho = (h + 2 - 3) // stride + 1
        args.append(torch.randn(n, c, ho, ho, device=DEV).to(memory_format=CL))
    y64, g64, stats64, g = _reference(model, torch.float64, args)
    yt, gt, statst, _ = _reference(model, dtype, args)

    fused = pt.fuse_for_training(copy.deepcopy(model).to(dtype, memory_format=CL))
    block = next(m for m in fused.modules() if isinstance(m, pt.training.BLOCKS))
    assert type(block).__name__ == {"bn": "ConvBn2d", "relu": "ConvBnReLU2d",
                                    "add_relu": "ConvBnAddReLU2d"}[kind]
    ins = [a.detach().to(dtype).requires_grad_() for a in args]
    y = fused(*ins)
    assert "ConvBnFunction" in type(y.grad_fn).__name__, "the fused kernels did not run"
    y.backward(g.to(dtype))
    got = [a.grad for a in ins] + [block.conv.weight.grad, block.bn.weight.grad,
                                   block.bn.bias.grad]
    assert block.bn.weight.grad.dtype is torch.float32
    assert int(block.bn.num_batches_tracked) == 1
    names = ["y"] + [f"grad_{i}" for i in range(len(args))] + ["grad_conv_w", "grad_gamma",
                                                                "grad_beta"]
    for name, a, b, ref in zip(names, [y] + got, [yt] + gt, [y64] + g64):
        bound = max(3 * rel(b, ref), 2e-2 if dtype is torch.bfloat16 else 4e-3)
        assert rel(a, ref) <= bound, (name, rel(a, ref), rel(b, ref))
    for a, ref in zip((block.bn.running_mean, block.bn.running_var), stats64):
        assert rel(a, ref) < 1e-2


def test_momentum_none_is_the_cumulative_average():
    torch.manual_seed(0)
    model = Chain(8, 8, "relu").to(DEV)
    model.bn.momentum = None
    ref = copy.deepcopy(model).to(torch.float64)
    fused = pt.fuse_for_training(copy.deepcopy(model).to(torch.bfloat16, memory_format=CL))
    block = next(m for m in fused.modules() if isinstance(m, pt.training.BLOCKS))
    for step in range(3):
        x = torch.randn(4, 8, 6, 6, device=DEV).to(memory_format=CL)
        y = fused(x.to(torch.bfloat16))
        assert "ConvBnFunction" in type(y.grad_fn).__name__
        with torch.backends.cudnn.flags(enabled=False):
            ref(x.double())
    assert int(block.bn.num_batches_tracked) == 3
    assert rel(block.bn.running_mean, ref.bn.running_mean) < 2e-2
    assert rel(block.bn.running_var, ref.bn.running_var) < 2e-2


def test_small_resnet_trains_like_pytorch():
    """20 SGD steps in bfloat16: the fused model's losses stay as close to a float64 run as
    PyTorch's bfloat16 run does (a bound of 3x PyTorch's distance)."""
    torch.manual_seed(0)
    base = SmallResNet().to(DEV)
    data = [(torch.randn(16, 3, 16, 16, device=DEV).to(memory_format=CL),
             torch.randint(0, 10, (16,), device=DEV)) for _ in range(4)]

    l64, lt, lf, _ = float64_bf16_fused(
        base, lambda model, dtype: cross_entropy_steps(model, data, dtype), pt.fuse_for_training)
    worst_torch = max(abs(a - b) for a, b in zip(lt, l64))
    worst = max(abs(a - b) for a, b in zip(lf, l64))
    assert worst <= 3 * worst_torch + 0.02, (worst, worst_torch, lf, l64)
    assert lf[-1] < lf[0]


def test_a_training_step_captured_in_a_cuda_graph_trains_like_eager():
    """The whole step (forward, the fused blocks' backward, SGD) captured once in a CUDA graph
    as PyTorch's whole-network recipe does, then replayed: its losses follow the same fused
    model trained eagerly to bfloat16 rounding, and both stay as near a float64 run as
    PyTorch's bfloat16 run does (its running statistics too)."""
    torch.manual_seed(0)
    base = randomize_batchnorm(SmallResNet()).to(DEV)
    xs = torch.randn(6, 16, 3, 16, 16, device=DEV)
    ts = torch.randint(0, 10, (6, 16), device=DEV)

    def eager(model, dtype, flags=True):
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        losses = []
        with torch.backends.cudnn.flags(enabled=flags):
            for i in range(6):
                loss = F.cross_entropy(model(xs[i].to(dtype, memory_format=CL)).float(), ts[i])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                losses.append(float(loss))
        return losses

    l64 = eager(copy.deepcopy(base).double(), torch.float64, flags=False)
    lt = eager(copy.deepcopy(base).to(torch.bfloat16, memory_format=CL), torch.bfloat16)
    le = eager(pt.fuse_for_training(copy.deepcopy(base).to(torch.bfloat16, memory_format=CL)),
               torch.bfloat16)
    model = pt.fuse_for_training(copy.deepcopy(base).to(torch.bfloat16, memory_format=CL))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = torch.empty(16, 3, 16, 16, device=DEV, dtype=torch.bfloat16).to(memory_format=CL)
    t = torch.empty(16, dtype=torch.long, device=DEV)
    # warm-up on a side stream: every signature's first call (search, preparation) and the
    # optimizer's state outside the capture; the first two steps are those of the eager run
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    lg = []
    with torch.cuda.stream(side):
        for i in range(2):
            x.copy_(xs[i])
            t.copy_(ts[i])
            loss = F.cross_entropy(model(x).float(), t)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            lg.append(float(loss))
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = F.cross_entropy(model(x).float(), t)
        static_loss.backward()
        opt.step()
    for i in range(2, 6):
        x.copy_(xs[i])
        t.copy_(ts[i])
        graph.replay()
        lg.append(float(static_loss))
    worst_torch = max(abs(a - b) for a, b in zip(lt, l64))
    assert max(abs(a - b) for a, b in zip(lg, l64)) <= 3 * worst_torch + 0.02, (lg, l64, lt)
    assert max(abs(a - b) for a, b in zip(lg, le)) <= 0.05, (lg, le)
    bn = next(m for m in model.modules() if isinstance(m, nn.BatchNorm2d))
    assert int(bn.num_batches_tracked) == 6  # the replays updated the running statistics


def test_float32_runs_the_original_modules_and_matches_to_rounding():
    torch.manual_seed(0)
    base = randomize_batchnorm(SmallResNet()).to(DEV)
    x = torch.randn(8, 3, 16, 16, device=DEV)
    ref = copy.deepcopy(base)
    fused = pt.fuse_for_training(copy.deepcopy(base))
    y, y_ref = fused(x), ref(x)
    assert rel(y, y_ref) < 1e-5
    y.sum().backward()
    y_ref.sum().backward()
    for p, q in zip(fused.parameters(), ref.parameters()):
        assert rel(p.grad, q.grad) < 1e-4


def test_eval_mode_matches_the_original():
    torch.manual_seed(0)
    base = randomize_batchnorm(SmallResNet()).to(DEV, torch.bfloat16, memory_format=CL).eval()
    fused = pt.fuse_for_training(copy.deepcopy(base))
    x = torch.randn(4, 3, 16, 16, device=DEV, dtype=torch.bfloat16).to(memory_format=CL)
    ref = copy.deepcopy(base)
    for m in ref.modules():  # the fused model's batch norms are float32 now: so the reference's
        if isinstance(m, nn.BatchNorm2d):
            m.float()
    with torch.no_grad():
        assert rel(fused(x), ref(x)) < 1e-2


def test_double_backward_through_a_block():
    """A gradient penalty (create_graph=True) through a fused block: the second derivative is
    within 3x PyTorch's own bfloat16 distance from float64."""
    torch.manual_seed(0)
    model = Chain(8, 8, "relu").to(DEV)
    x0 = torch.randn(4, 8, 6, 6, device=DEV).to(memory_format=CL)

    def penalty_grad(m, dtype, fused):
        m = copy.deepcopy(m).to(dtype, memory_format=CL)
        if fused:
            m = pt.fuse_for_training(m)
        x = x0.to(dtype).requires_grad_()
        with torch.backends.cudnn.flags(enabled=dtype is not torch.float64):
            y = m(x)
            if fused:
                assert "ConvBnFunction" in type(y.grad_fn).__name__
            (gx,) = torch.autograd.grad(y.float().pow(2).sum(), x, create_graph=True)
            gx.float().pow(2).sum().backward()
        return next(mod for mod in m.modules() if isinstance(mod, nn.Conv2d)).weight.grad

    ref = penalty_grad(model, torch.float64, False)
    torch_err = rel(penalty_grad(model, torch.bfloat16, False), ref)
    assert rel(penalty_grad(model, torch.bfloat16, True), ref) <= max(3 * torch_err, 2e-2)


def test_autocast_runs_the_fused_kernels():
    torch.manual_seed(0)
    model = Chain(8, 8, "relu").to(DEV).to(memory_format=CL)
    ref = copy.deepcopy(model)
    fused = pt.fuse_for_training(model)
    x = torch.randn(4, 8, 6, 6, device=DEV).to(memory_format=CL)
    with torch.autocast("cuda", torch.bfloat16):
        y = fused(x)
        y_ref = ref(x)
    assert y.dtype is torch.bfloat16 and "ConvBnFunction" in type(y.grad_fn).__name__
    assert rel(y, y_ref) < 2e-2
    y.float().sum().backward()
    y_ref.float().sum().backward()
    assert rel(model.conv.weight.grad, ref.conv.weight.grad) < 5e-2


def test_nchw_and_odd_channels_run_the_original_modules():
    torch.manual_seed(0)
    for c, fmt in ((8, torch.contiguous_format), (6, CL)):
        model = Chain(c, c, "relu").to(DEV, torch.bfloat16, memory_format=fmt)
        fused = pt.fuse_for_training(copy.deepcopy(model))
        x = torch.randn(2, c, 5, 5, device=DEV, dtype=torch.bfloat16).contiguous(memory_format=fmt)
        y = fused(x)
        assert "ConvBnFunction" not in type(y.grad_fn).__name__
        ref = copy.deepcopy(model)
        for m in ref.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.float()
        assert rel(y, ref(x)) < 2e-2


def test_in_place_activation_after_a_conv_bn_block():
    """ConvBn2d's output changed in place (MobileNet's Hardswish(inplace=True)) before backward,
    as PyTorch's batch norm allows: the gradients are still those of the original modules."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                          nn.Hardswish(inplace=True)).to(DEV)
    x = torch.randn(4, 8, 6, 6, device=DEV).to(memory_format=CL)
    ref = copy.deepcopy(model).double()
    fused = pt.fuse_for_training(copy.deepcopy(model).to(torch.bfloat16, memory_format=CL))
    assert any(isinstance(m, pt.ConvBn2d) for m in fused.modules())
    y = fused(x.to(torch.bfloat16))
    y.float().sum().backward()
    with torch.backends.cudnn.flags(enabled=False):
        ref(x.double()).sum().backward()
    assert rel(fused.get_submodule("0").weight.grad, ref[0].weight.grad) < 5e-2


def _fused_ran(y):
    return "ConvBnFunction" in type(y.grad_fn).__name__


def _bn_reference(x, w, bn, post=None, z=None):
    """relu([post](batch_norm(conv(x))) [+ z]) in float64 with the batch's statistics."""
    with torch.backends.cudnn.flags(enabled=False):
        c = F.conv2d(x.double(), w.double(), None, 1, 1)
        y = F.batch_norm(c, None, None, bn.weight.detach().double(), bn.bias.detach().double(),
                         True, 0.0, bn.eps)
        y = post(y) if post else y
        return torch.relu(y if z is None else y + z.double())


def test_a_forward_hook_on_a_batch_norm_keeps_its_chain_unfused():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
    m = m.to(DEV, torch.bfloat16, memory_format=CL)
    m[1].register_forward_hook(lambda mod, inp, out: out * 0.5 + 1.0)
    fused = pt.fuse_for_training(m)
    x = torch.randn(8, 16, 12, 12, device=DEV, dtype=torch.bfloat16).to(memory_format=CL)
    y = fused(x)
    assert not _fused_ran(y)
    assert rel(y, _bn_reference(x, m[0].weight, m[1], post=lambda t: t * 0.5 + 1.0)) < 2e-2


def test_a_hook_added_after_fusion_makes_the_block_run_the_modules():
    torch.manual_seed(0)
    model = Chain(16, 16, "relu").to(DEV, torch.bfloat16, memory_format=CL)
    fused = pt.fuse_for_training(model)
    x = torch.randn(8, 16, 12, 12, device=DEV, dtype=torch.bfloat16).to(memory_format=CL)
    assert _fused_ran(fused(x))
    handle = model.bn.register_forward_hook(lambda mod, inp, out: out - 2.0)
    y = fused(x)
    assert not _fused_ran(y)
    assert rel(y, _bn_reference(x, model.conv.weight, model.bn, post=lambda t: t - 2.0)) < 2e-2
    handle.remove()
    assert _fused_ran(fused(x))


def test_a_pruned_convolution_follows_its_weight_over_two_steps():
    """prune's forward pre-hook recomputes conv.weight from weight_orig each call: the chain
    stays unfused, so the second step sees the changed weight_orig and its backward runs.
    (The pruning is applied before channels_last: PyTorch's l1_unstructured itself raises
    "view size is not compatible" on a channels-last weight, with or without pycudnn.)"""
    from torch.nn.utils import prune

    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
    prune.l1_unstructured(m[0], "weight", amount=0.5)
    m = m.to(DEV, torch.bfloat16, memory_format=CL)
    fused = pt.fuse_for_training(m)
    x = torch.randn(8, 16, 12, 12, device=DEV, dtype=torch.bfloat16).to(memory_format=CL)
    fused(x).float().square().mean().backward()
    with torch.no_grad():
        m[0].weight_orig.mul_(-1.0)  # what an optimizer step does: the pruned weight follows
    y = fused(x)
    assert not _fused_ran(y)
    want = _bn_reference(x, (m[0].weight_orig * m[0].weight_mask).detach(), m[1])
    assert rel(y, want) < 2e-2
    y.float().square().mean().backward()


def test_one_value_per_channel_raises_and_leaves_the_running_statistics():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(8, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU())
    m = m.to(DEV, torch.float16, memory_format=CL)
    fused = pt.fuse_for_training(m)
    x = torch.randn(1, 8, 3, 3, device=DEV, dtype=torch.float16).contiguous(memory_format=CL)
    bn = m[1]
    before = [t.clone() for t in (bn.running_mean, bn.running_var, bn.num_batches_tracked)]
    ref = nn.Sequential(nn.Conv2d(8, 8, 3, bias=False), nn.BatchNorm2d(8)).double()
    with pytest.raises(ValueError) as want:
        ref(x.cpu().double())
    with pytest.raises(ValueError) as got:
        fused(x)
    assert str(got.value) == str(want.value)
    torch.cuda.synchronize()
    for a, b in zip((bn.running_mean, bn.running_var, bn.num_batches_tracked), before):
        assert torch.equal(a, b)


def test_the_shortcut_changed_in_place_after_the_block_trains():
    """relu(bn(conv(x)) + z), then z.mul_(0.5) before backward (legal unfused): the fused
    block's gradients within 3x PyTorch's own bfloat16 distance from the unfused block in
    float64 on the CPU."""
    torch.manual_seed(0)
    model = Chain(16, 16, "add_relu")
    x64 = torch.randn(4, 16, 8, 8, dtype=torch.float64)
    z64 = torch.randn(4, 16, 8, 8, dtype=torch.float64)

    def step(m, dev, dtype):
        x = x64.to(dev, dtype).contiguous(memory_format=CL).requires_grad_()
        z0 = z64.to(dev, dtype).contiguous(memory_format=CL).requires_grad_()
        zz = z0 * 1.0
        y = m(x, zz)
        zz.mul_(0.5)
        y.float().sum().backward()
        return y, [x.grad, z0.grad, m.conv.weight.grad]

    _, ref = step(copy.deepcopy(model).double(), "cpu", torch.float64)
    _, plain = step(copy.deepcopy(model).to(DEV, torch.bfloat16, memory_format=CL), DEV,
                    torch.bfloat16)
    fused = pt.fuse_for_training(copy.deepcopy(model).to(DEV, torch.bfloat16, memory_format=CL))
    y, got = step(fused, DEV, torch.bfloat16)
    assert _fused_ran(y)
    for name, g, p, r in zip(["x", "z", "conv weight"], got, plain, ref):
        assert rel(g, r) <= 3 * rel(p, r) + 1e-2, name


@pytest.mark.parametrize("kind", ["bn", "relu", "add_relu"])
def test_the_conv_bias_and_shift_changed_before_backward(kind):
    """The convolution's bias (and, for ConvBn2d, the batch norm's shift, which cuDNN's
    backward reads only with a ReLU) changed in place between forward and backward, as an
    optimizer step on another loss does: the gradients are the unfused block's in float64."""
    torch.manual_seed(0)
    model = randomize_batchnorm(Chain(16, 16, kind)).to(DEV)
    model.conv.bias = nn.Parameter(torch.randn(16, device=DEV))
    x = torch.randn(4, 16, 8, 8, device=DEV).to(memory_format=CL)
    args = [x] + ([torch.randn(4, 16, 8, 8, device=DEV).to(memory_format=CL)]
                  if kind == "add_relu" else [])
    _, g64, _, g = _reference(model, torch.float64, args)
    _, gbf, _, _ = _reference(model, torch.bfloat16, args)  # PyTorch's own bfloat16 distance
    fused = pt.fuse_for_training(copy.deepcopy(model).to(torch.bfloat16, memory_format=CL))
    block = next(m for m in fused.modules() if isinstance(m, pt.training.BLOCKS))
    ins = [a.detach().to(torch.bfloat16).requires_grad_() for a in args]
    y = fused(*ins)
    assert _fused_ran(y)
    with torch.no_grad():
        block.conv.bias.add_(1.0)
        if kind == "bn":
            block.bn.bias.add_(1.0)
    y.backward(g.to(torch.bfloat16))
    got = {"x": ins[0].grad, "conv weight": block.conv.weight.grad, "bn bias": block.bn.bias.grad}
    for (name, a), i in zip(got.items(), (0, -3, -1)):
        assert rel(a, g64[i]) <= 3 * rel(gbf[i], g64[i]) + 1e-2, name


def test_double_backward_through_an_add_relu_block_with_the_shortcut_changed():
    """A gradient penalty through ConvBnAddReLU2d (create_graph=True), z changed in place after
    the forward: within 3x PyTorch's own bfloat16 distance from float64."""
    torch.manual_seed(0)
    model = Chain(8, 8, "add_relu").to(DEV)
    x0 = torch.randn(4, 8, 6, 6, device=DEV).to(memory_format=CL)
    z0 = torch.randn(4, 8, 6, 6, device=DEV).to(memory_format=CL)

    def penalty_grad(dtype, fused):
        m = copy.deepcopy(model).to(dtype, memory_format=CL)
        if fused:
            m = pt.fuse_for_training(m)
        x = x0.to(dtype).requires_grad_()
        z = z0.to(dtype).requires_grad_()
        zz = z * 1.0
        with torch.backends.cudnn.flags(enabled=dtype is not torch.float64):
            y = m(x, zz)
            if fused:
                assert _fused_ran(y)
            zz.mul_(0.5)
            gx, gz = torch.autograd.grad(y.float().pow(2).sum(), (x, z), create_graph=True)
            (gx.float().pow(2).sum() + gz.float().pow(2).sum()).backward()
        return next(mod for mod in m.modules() if isinstance(mod, nn.Conv2d)).weight.grad

    ref = penalty_grad(torch.float64, False)
    torch_err = rel(penalty_grad(torch.bfloat16, False), ref)
    assert rel(penalty_grad(torch.bfloat16, True), ref) <= max(3 * torch_err, 2e-2)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_block_on_the_second_gpu_leaves_the_callers_device_current():
    torch.manual_seed(0)
    torch.cuda.set_device(0)
    model = Chain(16, 16, "relu").to("cuda:1", torch.bfloat16, memory_format=CL)
    fused = pt.fuse_for_training(model)
    x = torch.randn(8, 16, 12, 12, device="cuda:1", dtype=torch.bfloat16)
    x = x.contiguous(memory_format=CL).requires_grad_()
    y = fused(x)
    assert _fused_ran(y) and torch.cuda.current_device() == 0
    y.float().sum().backward()
    assert torch.cuda.current_device() == 0


def test_an_in_place_add_into_the_batch_norm_output_runs_fused():
    class AddInto(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(16, 16, 3, padding=1, bias=False)
            self.bn = nn.BatchNorm2d(16)

        def forward(self, x, z):
            y = self.bn(self.conv(x))
            y += z
            return torch.relu(y)

    torch.manual_seed(0)
    model = AddInto().to(DEV)
    x = torch.randn(4, 16, 8, 8, device=DEV).to(memory_format=CL)
    z = torch.randn(4, 16, 8, 8, device=DEV).to(memory_format=CL)
    fused = pt.fuse_for_training(copy.deepcopy(model).to(torch.bfloat16, memory_format=CL))
    y = fused(x.to(torch.bfloat16), z.to(torch.bfloat16))
    assert _fused_ran(y)
    assert rel(y, _bn_reference(x, model.conv.weight, model.bn, z=z)) < 2e-2
