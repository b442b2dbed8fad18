"""pycudnn.torch on a GPU, against PyTorch with cuDNN disabled (its native convolutions) as the
reference: forward and every gradient in float32 (TF32 off on both sides), bfloat16 and float16,
NCHW and channels_last, strided, padded, dilated and grouped; first calls and remembered
replays; gradcheck in float64; the drop-in module, conversion and a few training steps; the
fused operations and their backward; inference fusion; a training step captured in a CUDA graph."""

from __future__ import annotations

import copy

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # a CPU build of PyTorch on a GPU machine
    pytest.skip("PyTorch has no CUDA here", allow_module_level=True)

import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import calls  # noqa: E402
from torch_models import SmallResNet, randomize_batchnorm  # noqa: E402

nn = torch.nn
F = torch.nn.functional
DEV = torch.device("cuda", 0)
CL = torch.channels_last
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 3e-3, torch.float64: 1e-10}


@pytest.fixture(autouse=True)
def _strict_flags():
    """No TF32 on either side; PyTorch's reference without cuDNN."""
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.benchmark)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    routing = pt.routing.routing()
    pt.set_routing("pycudnn")  # these tests are of pycudnn's own launches (routing: its own file)
    yield
    pt.set_routing(routing)
    (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
     torch.backends.cudnn.benchmark) = saved


def rel_err(got, ref):
    got, ref = got.double(), ref.double()
    return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def reference(fn, *tensors):
    """fn on float64 copies of the tensors with PyTorch's native (non-cuDNN) convolutions:
    outputs and the gradients of the tensors that require them."""
    copies = [t.detach().double().requires_grad_(t.requires_grad) if t is not None else None
              for t in tensors]
    with torch.backends.cudnn.flags(enabled=False):
        y = fn(*copies)
        return y, copies


GEOMETRIES = [
    dict(stride=1, padding=1, dilation=1, groups=1),
    dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2),
]


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=["plain", "strided-dilated-grouped"])
@pytest.mark.parametrize("fmt", [torch.contiguous_format, CL], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])
def test_conv2d_forward_and_backward_against_pytorch(dtype, fmt, geometry):
    g = torch.Generator(device=DEV).manual_seed(0)
    x = torch.randn(4, 8, 13, 11, device=DEV, generator=g).to(dtype, memory_format=fmt)
    w = (torch.randn(12, 8 // geometry["groups"], 3, 3, device=DEV, generator=g) * 0.2).to(
        dtype, memory_format=fmt)
    b = torch.randn(12, device=DEV, generator=g).to(dtype)
    x.requires_grad_(True), w.requires_grad_(True), b.requires_grad_(True)
    ref_y, (rx, rw, rb) = reference(lambda x_, w_, b_: F.conv2d(x_, w_, b_, **geometry), x, w, b)
    gy = torch.randn(ref_y.shape, device=DEV, generator=g).to(dtype)
    ref_y.backward(gy.double())
    for attempt in ("first call", "remembered replay"):
        x.grad = w.grad = b.grad = None
        y = pt.conv2d(x, w, b, **geometry)
        y.backward(gy)
        assert y.dtype == dtype and y.shape == ref_y.shape
        # PyTorch's memory format rule: channels_last in, channels_last out (gradients too)
        if fmt is CL:
            assert y.is_contiguous(memory_format=CL) and x.grad.is_contiguous(memory_format=CL)
        else:
            assert y.is_contiguous() and x.grad.is_contiguous()
        for name, got, ref in (("output", y, ref_y), ("grad input", x.grad, rx.grad),
                               ("grad weight", w.grad, rw.grad), ("grad bias", b.grad, rb.grad)):
            assert rel_err(got, ref) < TOL[dtype], (attempt, name, rel_err(got, ref))


def test_only_the_gradients_asked_for_are_computed():
    pt.clear_cache()
    x = torch.randn(2, 4, 8, 8, device=DEV)
    w = torch.randn(6, 4, 3, 3, device=DEV, requires_grad=True)
    pt.conv2d(x, w).sum().backward()
    backward = calls.remembered_signatures()["backward"]
    assert [k[0] for k in backward] == ["filter"]  # no backward-data convolution ran
    x.requires_grad_(True)
    w.requires_grad_(False)
    pt.clear_cache()
    pt.conv2d(x, w).sum().backward()
    assert [k[0] for k in calls.remembered_signatures()["backward"]] == ["data"]
    with torch.no_grad():
        y = pt.conv2d(x, w)
    assert y.grad_fn is None


def test_gradcheck_float64():
    g = torch.Generator(device=DEV).manual_seed(0)
    x = torch.randn(2, 4, 7, 6, device=DEV, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(6, 2, 3, 3, device=DEV, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(6, device=DEV, dtype=torch.float64, generator=g, requires_grad=True)
    fn = lambda x_, w_, b_: pt.conv2d(x_, w_, b_, stride=(2, 1), padding=1, dilation=(1, 2),  # noqa: E731
                                      groups=2)
    assert torch.autograd.gradcheck(fn, (x, w, b), eps=1e-6, atol=1e-5, rtol=1e-3,
                                    nondet_tol=1e-10)
    z = torch.randn(2, 6, 4, 4, device=DEV, dtype=torch.float64, generator=g, requires_grad=True)
    fused = lambda x_, w_, z_, b_: pt.conv2d_add_relu(x_, w_, z_, b_, 0.5, stride=(2, 1),  # noqa: E731
                                                      padding=1, dilation=(1, 2), groups=2)
    assert torch.autograd.gradcheck(fused, (x, w, z, b), eps=1e-6, atol=1e-5, rtol=1e-3,
                                    nondet_tol=1e-10)


def test_second_derivatives_float64():
    """create_graph=True (gradient penalties, Hessian-vector products): the backward pass is
    itself differentiable, for the plain and the fused convolutions."""
    g = torch.Generator(device=DEV).manual_seed(3)
    opts = dict(device=DEV, dtype=torch.float64, generator=g)
    x = torch.randn(2, 4, 7, 6, **opts).requires_grad_()
    w = torch.randn(6, 2, 3, 3, **opts).requires_grad_()
    b = torch.randn(6, **opts).requires_grad_()
    z = torch.randn(2, 6, 4, 4, **opts).requires_grad_()
    geometry = dict(stride=(2, 1), padding=1, dilation=(1, 2), groups=2)
    check = dict(eps=1e-6, atol=1e-5, rtol=1e-3, nondet_tol=1e-10)
    gx, gw = torch.autograd.grad(pt.conv2d(x, w, b, **geometry).pow(2).sum(), (x, w),
                                 create_graph=True)
    assert gx.requires_grad and gw.requires_grad  # the backward pass has a history
    assert torch.autograd.gradgradcheck(lambda x_, w_, b_: pt.conv2d(x_, w_, b_, **geometry),
                                        (x, w, b), **check)
    assert torch.autograd.gradgradcheck(
        lambda x_, w_, z_, b_: pt.conv2d_add_relu(x_, w_, z_, b_, 0.5, **geometry),
        (x, w, z, b), **check)
    assert torch.autograd.gradgradcheck(
        lambda x_, w_, b_: pt.conv2d_bias_relu(x_, w_, b_, **geometry), (x, w, b), **check)


def test_gradient_penalty_matches_pytorch():
    """A WGAN-GP style penalty, ||d out / d x||^2, differentiated w.r.t. the weights: the same
    through pycudnn.torch as through PyTorch's native convolutions."""
    g = torch.Generator(device=DEV).manual_seed(4)
    x = torch.randn(3, 4, 9, 9, device=DEV, generator=g)
    w1 = torch.randn(8, 4, 3, 3, device=DEV, generator=g) * 0.3
    w2 = torch.randn(1, 8, 3, 3, device=DEV, generator=g) * 0.3

    def penalty_grads(conv):
        xi = x.clone().requires_grad_()
        a, c = w1.clone().requires_grad_(), w2.clone().requires_grad_()
        out = conv(torch.tanh(conv(xi, a, None, 1, 1)), c, None, 2, 0).sum()
        (gx,) = torch.autograd.grad(out, xi, create_graph=True)
        gx.pow(2).sum().backward()
        return a.grad, c.grad

    with torch.backends.cudnn.flags(enabled=False):
        ref = penalty_grads(F.conv2d)
    ours = penalty_grads(pt.conv2d)
    for got, want in zip(ours, ref):
        assert got is not None and rel_err(got, want) < 1e-4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_autocast_casts_like_pytorch(dtype):
    """Under torch.autocast the convolutions run in the autocast dtype, as F.conv2d's do: the
    same output dtype and values, gradients back in the parameters' float32."""
    g = torch.Generator(device=DEV).manual_seed(5)
    x = torch.randn(2, 8, 9, 9, device=DEV, generator=g)
    w = torch.randn(16, 8, 3, 3, device=DEV, generator=g) * 0.2
    b = torch.randn(16, device=DEV, generator=g)
    z = torch.randn(2, 16, 9, 9, device=DEV, generator=g)

    def run(conv, fused):
        leaves = [t.clone().requires_grad_() for t in (x, w, b)]
        with torch.autocast("cuda", dtype=dtype):
            y = conv(leaves[0], leaves[1], leaves[2], padding=1)
            yf = fused(leaves[0], leaves[1], z, leaves[2], 1.0, padding=1)
        (y.float().square().sum() + yf.float().sum()).backward()
        return y, yf, [t.grad for t in leaves]

    ref = run(F.conv2d, lambda x_, w_, z_, b_, a, padding: torch.relu(
        F.conv2d(x_, w_, b_, padding=padding) + z_))
    ours = run(pt.conv2d, pt.conv2d_add_relu)
    assert ours[0].dtype == ref[0].dtype == dtype
    assert ours[1].dtype == dtype  # the fused op is a convolution: the autocast dtype (PyTorch's
    for got, want in zip(ours[:2], ref[:2]):  # unfused add promotes to z's float32)
        assert rel_err(got, want) < 2e-2
    for got, want in zip(ours[2], ref[2]):
        assert got.dtype == torch.float32
        assert rel_err(got, want) < 3e-2
    x64 = x.double()
    with torch.autocast("cuda", dtype=dtype):  # float64 is left alone, as autocast does
        assert pt.conv2d(x64, w.double(), padding=1).dtype == torch.float64


def test_pytorchs_fp32_precision_settings_are_followed():
    """PyTorch 2.9's per-operator fp32_precision (the legacy allow_tf32 reader raises once conv
    and RNN differ): calls keep working and follow the convolutions' own setting."""
    conv_settings = getattr(getattr(torch.backends.cudnn, "conv", None), "fp32_precision", None)
    if conv_settings is None:
        pytest.skip("this PyTorch has no per-operator fp32_precision")
    g = torch.Generator(device=DEV).manual_seed(7)
    x = torch.randn(2, 64, 16, 16, device=DEV, generator=g)
    w = torch.randn(64, 64, 3, 3, device=DEV, generator=g)
    ref = reference(lambda x_, w_: F.conv2d(x_, w_, padding=1), x, w)[0]
    saved = torch.backends.cudnn.conv.fp32_precision
    try:
        torch.backends.cudnn.conv.fp32_precision = "ieee"
        assert rel_err(pt.conv2d(x, w, padding=1), ref) < 1e-5  # full float32
        torch.backends.cudnn.conv.fp32_precision = "tf32"
        assert rel_err(pt.conv2d(x, w, padding=1), ref) < 1e-2
    finally:
        torch.backends.cudnn.conv.fp32_precision = saved


def test_argument_forms_pytorch_takes():
    g = torch.Generator(device=DEV).manual_seed(8)
    x = torch.randn(2, 4, 9, 9, device=DEV, generator=g)
    w = torch.randn(6, 2, 3, 3, device=DEV, generator=g)
    ref = F.conv2d(x, w, stride=2, padding=1, groups=2)
    for kwargs in (dict(stride=(2,), padding=[1], groups=np.int64(2)),
                   dict(stride=np.int64(2), padding=(np.int64(1), 1), groups=2),
                   dict(stride=torch.Size([2, 2]), padding=1, groups=2)):
        assert rel_err(pt.conv2d(x, w, **kwargs), ref) < 1e-5, kwargs
    m = pt.Conv2d(4, 6, 3, stride=(2,), padding=np.int64(1), groups=2).cuda()
    with torch.no_grad():
        assert rel_err(m(x), F.conv2d(x, m.weight, m.bias, 2, 1, 1, 2)) < 1e-5


def test_errors_are_the_runtime_errors_pytorch_raises_too():
    x = torch.randn(2, 4, 9, 9, device=DEV)
    for call in (lambda: pt.conv2d(x, torch.randn(6, 3, 3, 3, device=DEV)),  # channels
                 lambda: pt.conv2d(x, torch.randn(6, 4, 3, 3, device=DEV).half()),  # dtype
                 lambda: pt.conv2d(x, torch.randn(6, 4, 11, 11, device=DEV)),  # kernel > input
                 lambda: pt.conv2d(x, torch.randn(6, 4, 3, 3, device=DEV), stride=0),
                 lambda: pt.conv2d(x[0, 0], torch.randn(6, 4, 3, 3, device=DEV))):  # 2-D
        with pytest.raises(RuntimeError):
            call()
        with pytest.raises((ValueError, TypeError)):  # pycudnn's own classes, as before
            call()
    with pytest.raises(RuntimeError, match=r"Expected 3D \(unbatched\) or 4D \(batched\) input"):
        pt.conv2d(x[0, 0], torch.randn(6, 4, 3, 3, device=DEV))


# torch's own forward-AD decompositions call torch.jit.script when a process first makes a dual
# tensor; the test itself uses no TorchScript
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_export_forward_ad_and_torch_func_see_a_convolution():
    """torch.export records a convolution (a launch through raw pointers would leave it out of
    the exported graph), forward-mode AD carries tangents, torch.func transforms work."""
    g = torch.Generator(device=DEV).manual_seed(9)
    x = torch.randn(2, 4, 8, 8, device=DEV, generator=g)
    w = torch.randn(6, 4, 3, 3, device=DEV, generator=g)
    model = pt.convert(nn.Sequential(nn.Conv2d(4, 6, 3, padding=1))).cuda()
    with torch.no_grad():
        exported = torch.export.export(model, (x,))
        assert "conv" in str(exported.graph)
        x2 = torch.randn(2, 4, 8, 8, device=DEV, generator=g)
        assert rel_err(exported.module()(x2), model(x2)) < 1e-5
    import torch.autograd.forward_ad as fwad
    t = torch.randn_like(w)
    with fwad.dual_level():
        tangent = fwad.unpack_dual(pt.conv2d(x, fwad.make_dual(w, t), padding=1)).tangent
    assert tangent is not None and rel_err(tangent, F.conv2d(x, t, padding=1)) < 1e-5
    grad = torch.func.grad(lambda w_: pt.conv2d(x, w_, padding=1).square().sum())(w)
    w_ref = w.clone().requires_grad_()
    F.conv2d(x, w_ref, padding=1).square().sum().backward()
    assert rel_err(grad, w_ref.grad) < 1e-5


def test_unbatched_input_same_padding_and_views():
    g = torch.Generator(device=DEV).manual_seed(1)
    w = torch.randn(5, 3, 4, 3, device=DEV, generator=g)
    x = torch.randn(3, 9, 9, device=DEV, generator=g)
    with torch.backends.cudnn.flags(enabled=False):
        ref = F.conv2d(x.double(), w.double(), padding="same", dilation=(1, 2))
    assert rel_err(pt.conv2d(x, w, padding="same", dilation=(1, 2)), ref) < 1e-5
    # a strided (non-dense) input and an expanded gradient go through dense copies
    big = torch.randn(2, 6, 10, 10, device=DEV, generator=g)
    xs = big[:, ::2].requires_grad_(False)
    with torch.backends.cudnn.flags(enabled=False):
        ref = F.conv2d(xs.double(), w[:, :, :3, :3].double())
    assert rel_err(pt.conv2d(xs, w[:, :, :3, :3]), ref) < 1e-5
    wg = w.clone().requires_grad_(True)
    pt.conv2d(x.unsqueeze(0), wg).sum().backward()  # sum's gradient has strides of 0
    xr = x.unsqueeze(0).double()
    wr = w.double().requires_grad_(True)
    with torch.backends.cudnn.flags(enabled=False):
        F.conv2d(xr, wr).sum().backward()
    assert rel_err(wg.grad, wr.grad) < 1e-5


def test_bad_shapes_are_refused_before_anything_runs():
    x = torch.randn(2, 3, 8, 8, device=DEV)
    with pytest.raises(ValueError, match=r"given groups=1, weight of size \[4, 5, 3, 3\], expected "
                                         r"input\[2, 3, 8, 8\] to have 5 channels, but got 3"):
        pt.conv2d(x, torch.randn(4, 5, 3, 3, device=DEV))
    with pytest.raises(ValueError, match="Kernel size can't be greater than actual input size"):
        pt.conv2d(x, torch.randn(4, 3, 9, 9, device=DEV))
    with pytest.raises(ValueError, match=r"expected bias to be 1-dimensional with 4 elements, but "
                                         r"got bias of size \[5\]"):
        pt.conv2d(x, torch.randn(4, 3, 3, 3, device=DEV), torch.randn(5, device=DEV))
    with pytest.raises(TypeError, match="expected input and weight to have the same dtype, but got "
                                        "input of dtype torch.float32 and weight of dtype "
                                        "torch.float16"):
        pt.conv2d(x, torch.randn(4, 3, 3, 3, device=DEV, dtype=torch.float16))
    with pytest.raises(TypeError, match="expected weight on a CUDA device, but got weight on cpu"):
        pt.conv2d(x, torch.randn(4, 3, 3, 3))
    with pytest.raises(ValueError, match=r"expected z of the output's size \[2, 4, 6, 6\]"):
        pt.conv2d_add_relu(x, torch.randn(4, 3, 3, 3, device=DEV), torch.randn(2, 4, 8, 8, device=DEV))
    with pytest.raises(ValueError, match="expected 4-D input, but got input of size"):
        pt.conv2d_bias_relu(x[0], torch.randn(4, 3, 3, 3, device=DEV))


@pytest.mark.filterwarnings("ignore:Using padding=.same. with even kernel")
@pytest.mark.parametrize("kwargs", [dict(kernel_size=3, padding=1),
                                    dict(kernel_size=4, padding="same", padding_mode="reflect"),
                                    dict(kernel_size=3, stride=2, groups=2, bias=False)],
                         ids=["plain", "same-reflect", "strided-grouped"])
def test_conv2d_module_state_dict_round_trip_and_outputs(kwargs):
    torch.manual_seed(0)
    ref = nn.Conv2d(4, 6, **kwargs).to(DEV)
    ours = pt.Conv2d(4, 6, **kwargs).to(DEV)
    ours.load_state_dict(ref.state_dict())
    back = nn.Conv2d(4, 6, **kwargs).to(DEV)
    back.load_state_dict(ours.state_dict())
    x = torch.randn(2, 4, 11, 10, device=DEV)
    with torch.backends.cudnn.flags(enabled=False):
        expected, expected_back = ref(x), back(x)
    assert torch.equal(expected, expected_back)
    assert rel_err(ours(x), expected) < 1e-5


def _small_cnn():
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=2), nn.ReLU(),
                         nn.Conv2d(16, 32, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(32, 10))


def _train(model, xs, ys, steps, lr=0.05):
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for i in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xs[i]), ys[i])
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def test_converted_model_trains_like_pytorch():
    torch.manual_seed(0)
    ref = _small_cnn().to(DEV)
    ours = pt.convert(copy.deepcopy(ref))
    assert sum(type(m) is pt.Conv2d for m in ours.modules()) == 3
    g = torch.Generator(device=DEV).manual_seed(0)
    xs = torch.randn(5, 8, 3, 16, 16, device=DEV, generator=g)
    ys = torch.randint(0, 10, (5, 8), device=DEV, generator=g)
    with torch.backends.cudnn.flags(enabled=False):
        expected = _train(ref, xs, ys, 5)
    got = _train(ours, xs, ys, 5)
    assert expected[-1] < expected[0]
    for a, b in zip(got, expected):
        assert abs(a - b) <= 1e-4 * abs(b), (got, expected)
    for p, q in zip(ours.parameters(), ref.parameters()):
        assert rel_err(p, q) < 1e-4


FUSED_CASES = [("bias_relu", CL), ("bias_relu_no_bias", CL), ("add_relu", CL),
               ("add_relu_alpha", CL), ("add_relu", torch.contiguous_format)]


@pytest.mark.parametrize("case,fmt", FUSED_CASES,
                         ids=[f"{c}-{'cl' if f is CL else 'nchw'}" for c, f in FUSED_CASES])
def test_fused_operations_forward_and_backward(case, fmt):
    """float16, where cuDNN's engines fuse these epilogues (float32 may run as separate steps)."""
    g = torch.Generator(device=DEV).manual_seed(2)
    half = dict(dtype=torch.float16, memory_format=fmt)
    x = torch.randn(3, 16, 10, 10, device=DEV, generator=g).to(**half).requires_grad_()
    w = (torch.randn(32, 16, 3, 3, device=DEV, generator=g) * 0.2).to(**half).requires_grad_()
    b = None if case == "bias_relu_no_bias" else torch.randn(32, device=DEV, generator=g).half()
    if b is not None:
        b.requires_grad_()
    z = torch.randn(3, 32, 5, 5, device=DEV, generator=g).to(**half).requires_grad_()
    alpha = 0.5 if case == "add_relu_alpha" else 1.0
    geometry = dict(stride=2, padding=1)
    if case.startswith("bias_relu"):
        def fn(x_, w_, b_, z_):
            return torch.relu(F.conv2d(x_, w_, b_, **geometry))
        ours = lambda: pt.conv2d_bias_relu(x, w, b, **geometry)  # noqa: E731
    else:
        def fn(x_, w_, b_, z_):
            return torch.relu(F.conv2d(x_, w_, b_, **geometry) + alpha * z_)
        ours = lambda: pt.conv2d_add_relu(x, w, z, b, alpha, **geometry)  # noqa: E731
    ref_y, copies = reference(fn, x, w, b, z)
    gy = torch.randn(ref_y.shape, device=DEV, generator=g).half()
    ref_y.backward(gy.double())
    for _ in range(2):  # first call, then the remembered replay
        for t in (x, w, b, z):
            if t is not None:
                t.grad = None
        y = ours()
        y.backward(gy)
        assert rel_err(y, ref_y) < 3e-3
        if fmt is CL:
            assert y.is_contiguous(memory_format=CL)
        pairs = [(x, copies[0]), (w, copies[1]), (b, copies[2])]
        if case.startswith("add_relu"):
            pairs.append((z, copies[3]))
        else:
            assert z.grad is None
        for t, r in pairs:
            if t is not None:
                assert rel_err(t.grad, r.grad) < 1e-2, (case, t.shape)
    if fmt is CL:  # the fused graph ran as one remembered launch (no separate epilogue)
        op = "bias_relu" if case.startswith("bias_relu") else "add_relu"
        assert any(k[0] == op and k[5] == torch.float16 and e[0] is not None
                   for k, e in calls.remembered_signatures()["forward"].items())


def test_fused_bfloat16_channels_last():
    g = torch.Generator(device=DEV).manual_seed(3)
    x = torch.randn(8, 64, 14, 14, device=DEV, generator=g).to(torch.bfloat16, memory_format=CL)
    w = (torch.randn(64, 64, 3, 3, device=DEV, generator=g) * 0.05).to(torch.bfloat16,
                                                                         memory_format=CL)
    b = torch.randn(64, device=DEV, generator=g).to(torch.bfloat16)
    z = torch.randn(8, 64, 14, 14, device=DEV, generator=g).to(torch.bfloat16, memory_format=CL)
    with torch.no_grad():
        y = pt.conv2d_add_relu(x, w, z, b, padding=1)
        ref = torch.relu(F.conv2d(x.double(), w.double(), b.double(), padding=1) + z.double())
    assert y.is_contiguous(memory_format=CL) and y.dtype == torch.bfloat16
    assert rel_err(y, ref) < 1e-2


@pytest.mark.parametrize("dtype,fmt", [(torch.bfloat16, CL), (torch.float16, torch.contiguous_format)],
                         ids=["bf16-channels_last", "fp16-nchw"])
def test_fuse_for_inference_matches_the_unfused_model(dtype, fmt):
    torch.manual_seed(0)
    model = randomize_batchnorm(SmallResNet()).to(DEV, dtype).to(memory_format=fmt).eval()
    x = torch.randn(4, 3, 16, 16, device=DEV).to(dtype, memory_format=fmt)
    with torch.no_grad():
        with torch.backends.cudnn.flags(enabled=False):
            expected = copy.deepcopy(model).double()(x.double())
        pt.clear_cache()
        fused = pt.fuse_for_inference(model)
        got = fused(x)
        again = fused(x)
    assert got.dtype == dtype
    assert rel_err(got, expected) < 5e-2
    assert torch.equal(got, again)
    if fmt is CL:  # each fused kind ran as one remembered launch
        ops = sorted({k[0] for k, e in calls.remembered_signatures()["forward"].items() if e[0] is not None})
        assert ops == ["add_relu", "bias_relu", "conv"]


def test_training_step_captured_in_a_cuda_graph():
    torch.manual_seed(0)
    eager = pt.convert(_small_cnn().to(DEV).to(memory_format=CL))
    graphed = copy.deepcopy(eager)
    g = torch.Generator(device=DEV).manual_seed(0)
    # six channels_last batches (a 5-D tensor has no channels_last format: one 4-D tensor each)
    xs = [torch.randn(8, 3, 16, 16, device=DEV, generator=g).to(memory_format=CL) for _ in range(6)]
    ys = torch.randint(0, 10, (6, 8), device=DEV, generator=g)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    opt_g = torch.optim.SGD(graphed.parameters(), lr=0.05, momentum=0.9)
    static_x, static_y = xs[0].clone(memory_format=CL), ys[0].clone()

    def step(model, opt, x, y):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    # warm-up on a side stream (PyTorch's recipe); the first calls search and prepare
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(3):
            static_x.copy_(xs[i]), static_y.copy_(ys[i])
            step(graphed, opt_g, static_x, static_y)
    torch.cuda.current_stream().wait_stream(side)
    eager_losses = [float(step(eager, opt_e, xs[i], ys[i])) for i in range(3)]
    graph = torch.cuda.CUDAGraph()
    opt_g.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = F.cross_entropy(graphed(static_x), static_y)
        static_loss.backward()
        opt_g.step()
    graph_losses = []
    for i in range(3, 6):
        static_x.copy_(xs[i]), static_y.copy_(ys[i])
        graph.replay()
        graph_losses.append(float(static_loss))
        eager_losses.append(float(step(eager, opt_e, xs[i], ys[i])))
    torch.cuda.synchronize()
    for a, b in zip(graph_losses, eager_losses[3:]):
        assert abs(a - b) <= 1e-4 * abs(b), (graph_losses, eager_losses)
    for p, q in zip(graphed.parameters(), eager.parameters()):
        assert rel_err(p, q) < 1e-4
