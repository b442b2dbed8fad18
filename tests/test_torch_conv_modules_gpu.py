"""pycudnn.torch's convolutions beside conv2d on a GPU, against PyTorch with cuDNN disabled (its
native convolutions) in float64 as the reference: conv1d, conv3d and conv_transpose1d/2d/3d
forward and every gradient in float32 (TF32 off on both sides), bfloat16 and float16, with
groups, dilation, stride, output_padding, odd 'same' padding, channels_last; first calls and
remembered replays; only the gradients asked for; double backward and gradcheck in float64;
autocast; torch.export, forward AD and torch.func through PyTorch; calls routed to PyTorch; the
converted modules with padding modes and output_size; a converted model trained a few steps."""

from __future__ import annotations

import contextlib
import copy

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # a CPU build of PyTorch on a GPU machine
    pytest.skip("PyTorch has no CUDA here", allow_module_level=True)

import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import calls, functional_nd, routing  # noqa: E402

nn = torch.nn
F = torch.nn.functional
DEV = torch.device("cuda", 0)
CL, CL3D, CONTIG = torch.channels_last, torch.channels_last_3d, torch.contiguous_format
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3, torch.float64: 1e-10}


@pytest.fixture(autouse=True)
def _strict_flags():
    """No TF32 on either side; pycudnn's own launches (routing has its own test below)."""
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.benchmark)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    mode = routing.routing()
    pt.set_routing("pycudnn")
    yield
    pt.set_routing(mode)
    (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
     torch.backends.cudnn.benchmark) = saved


def rel_err(got, ref):
    got, ref = got.double(), ref.double()
    return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def reference(fn, *tensors):
    """fn on float64 copies with PyTorch's native (non-cuDNN) convolutions; the copies."""
    copies = [t.detach().double().requires_grad_(t.requires_grad) for t in tensors]
    with torch.backends.cudnn.flags(enabled=False):
        return fn(*copies), copies


CASES = [
    ("conv1d", pt.conv1d, F.conv1d, (4, 8, 33), (12, 4, 3),
     dict(stride=2, padding=2, dilation=2, groups=2), CONTIG),
    ("conv1d-same-odd", pt.conv1d, F.conv1d, (2, 6, 20), (8, 6, 4), dict(padding="same"), CONTIG),
    ("conv3d", pt.conv3d, F.conv3d, (2, 8, 6, 7, 8), (12, 4, 3, 3, 3),
     dict(stride=(1, 2, 1), padding=1, dilation=(1, 1, 2), groups=2), CONTIG),
    ("conv3d-channels_last", pt.conv3d, F.conv3d, (2, 8, 5, 6, 7), (16, 8, 3, 3, 3),
     dict(padding=1), CL3D),
    ("conv3d-same-odd", pt.conv3d, F.conv3d, (2, 4, 5, 6, 7), (6, 4, 2, 3, 4),
     dict(padding="same", dilation=(1, 2, 1)), CONTIG),
    ("conv_transpose1d", pt.conv_transpose1d, F.conv_transpose1d, (4, 8, 15), (8, 6, 3),
     dict(stride=2, padding=1, output_padding=1, groups=2, dilation=2), CONTIG),
    ("conv_transpose2d", pt.conv_transpose2d, F.conv_transpose2d, (2, 8, 7, 9), (8, 6, 3, 3),
     dict(stride=2, padding=1, output_padding=1), CONTIG),
    ("conv_transpose2d-grouped-channels_last", pt.conv_transpose2d, F.conv_transpose2d,
     (2, 8, 6, 6), (8, 4, 3, 2), dict(stride=(1, 2), padding=(2, 0), output_padding=(0, 1),
                                      groups=2, dilation=(2, 1)), CL),
    ("conv_transpose3d", pt.conv_transpose3d, F.conv_transpose3d, (2, 4, 4, 5, 3), (4, 6, 3, 2, 3),
     dict(stride=2, padding=(1, 0, 1), output_padding=(1, 1, 0), groups=2), CONTIG),
]


def _tensors(x_shape, w_shape, kwargs, transposed, dtype, fmt, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    k = w_shape[1] * kwargs.get("groups", 1) if transposed else w_shape[0]
    x = torch.randn(x_shape, device=DEV, generator=g).to(dtype, memory_format=fmt)
    w = (torch.randn(w_shape, device=DEV, generator=g) * 0.3).to(dtype, memory_format=fmt)
    b = torch.randn(k, device=DEV, generator=g).to(dtype)
    return [t.requires_grad_(True) for t in (x, w, b)]


@pytest.mark.filterwarnings("ignore:Using padding=.same. with even kernel")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("name,ours,theirs,x_shape,w_shape,kwargs,fmt", CASES,
                         ids=[c[0] for c in CASES])
def test_forward_and_backward_against_pytorch(name, ours, theirs, x_shape, w_shape, kwargs, fmt,
                                              dtype):
    x, w, b = _tensors(x_shape, w_shape, kwargs, "transpose" in name, dtype, fmt, seed=0)
    ref_y, (rx, rw, rb) = reference(lambda x_, w_, b_: theirs(x_, w_, b_, **kwargs), x, w, b)
    gy = torch.randn(ref_y.shape, device=DEV).to(dtype)
    ref_y.backward(gy.double())
    for attempt in ("first call", "remembered replay"):
        x.grad = w.grad = b.grad = None
        y = ours(x, w, b, **kwargs)
        y.backward(gy)
        assert y.dtype == dtype and y.shape == ref_y.shape, attempt
        if fmt is not CONTIG:  # PyTorch's rule: channels_last in, channels_last out
            assert y.is_contiguous(memory_format=fmt), attempt
        for what, got, ref in (("output", y, ref_y), ("grad input", x.grad, rx.grad),
                               ("grad weight", w.grad, rw.grad), ("grad bias", b.grad, rb.grad)):
            assert rel_err(got, ref) < TOL[dtype], (attempt, what, rel_err(got, ref))
    with torch.no_grad():
        assert rel_err(ours(x, w, b, **kwargs), ref_y) < TOL[dtype]


@pytest.mark.parametrize("fn,theirs,x_shape,w_shape,kwargs", [
    (pt.conv1d, F.conv1d, (3, 9), (4, 3, 3), dict(padding=1)),
    (pt.conv3d, F.conv3d, (3, 4, 5, 6), (4, 3, 3, 3, 3), dict(padding="same")),
    (pt.conv_transpose1d, F.conv_transpose1d, (4, 7), (4, 3, 2), dict(stride=2)),
    (pt.conv_transpose2d, F.conv_transpose2d, (4, 5, 6), (4, 3, 3, 3), dict(stride=2, padding=1)),
    (pt.conv_transpose3d, F.conv_transpose3d, (4, 3, 4, 3), (4, 2, 2, 2, 2), dict(stride=2)),
], ids=["conv1d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"])
def test_unbatched_and_non_dense_input(fn, theirs, x_shape, w_shape, kwargs):
    g = torch.Generator(device=DEV).manual_seed(1)
    x = torch.randn(x_shape, device=DEV, generator=g)
    w = torch.randn(w_shape, device=DEV, generator=g)
    ref, _ = reference(lambda x_, w_: theirs(x_, w_, None, **kwargs), x, w)
    assert rel_err(fn(x, w, None, **kwargs), ref) < 1e-5
    big = torch.randn((2, x_shape[0] * 2) + x_shape[1:], device=DEV, generator=g)
    xs = big[:, ::2]  # a strided view: made dense first, as PyTorch does
    ref, _ = reference(lambda x_, w_: theirs(x_, w_, None, **kwargs), xs, w)
    assert rel_err(fn(xs, w, None, **kwargs), ref) < 1e-5


def _spy(monkeypatch):
    counts = {"run_forward": 0, "run_backward_data": 0, "run_backward_filter": 0}
    for name in counts:
        real = getattr(functional_nd, name)

        def counted(*args, _real=real, _name=name):
            counts[_name] += 1
            return _real(*args)
        monkeypatch.setattr(functional_nd, name, counted)
    return counts


@pytest.mark.parametrize("fn,x_shape,w_shape,kwargs,input_grad,weight_grad", [
    (pt.conv3d, (2, 4, 5, 5, 5), (6, 4, 3, 3, 3), dict(padding=1), "run_backward_data",
     "run_backward_filter"),
    (pt.conv_transpose2d, (2, 4, 5, 5), (4, 6, 3, 3), dict(stride=2), "run_forward",
     "run_backward_filter"),
    (pt.conv_transpose3d, (2, 4, 3, 3, 3), (4, 2, 2, 2, 2), dict(stride=2), "run_forward",
     "run_backward_filter"),
], ids=["conv3d", "conv_transpose2d", "conv_transpose3d"])
def test_only_the_gradients_asked_for_are_computed(monkeypatch, fn, x_shape, w_shape, kwargs,
                                                   input_grad, weight_grad):
    counts = _spy(monkeypatch)
    x = torch.randn(x_shape, device=DEV, requires_grad=True)
    w = torch.randn(w_shape, device=DEV)
    y = fn(x, w, None, **kwargs)
    start = dict(counts)
    y.sum().backward()
    done = {k: counts[k] - start[k] for k in counts}
    assert done[input_grad] == 1 and done[weight_grad] == 0 and sum(done.values()) == 1
    assert x.grad is not None and w.grad is None
    x = x.detach()
    w.requires_grad_(True)
    y = fn(x, w, None, **kwargs)
    start = dict(counts)
    y.sum().backward()
    done = {k: counts[k] - start[k] for k in counts}
    assert done[weight_grad] == 1 and sum(done.values()) == 1
    with torch.no_grad():
        assert fn(x, w, None, **kwargs).grad_fn is None


@pytest.mark.parametrize("fn,theirs,x_shape,w_shape,kwargs", [
    (pt.conv1d, F.conv1d, (2, 4, 9), (6, 2, 3), dict(groups=2, padding=1, dilation=2)),
    (pt.conv3d, F.conv3d, (2, 2, 4, 5, 4), (3, 2, 3, 2, 3), dict(padding=1, stride=(1, 2, 1))),
    (pt.conv_transpose1d, F.conv_transpose1d, (2, 4, 5), (4, 2, 3), dict(stride=2, output_padding=1)),
    (pt.conv_transpose2d, F.conv_transpose2d, (2, 4, 4, 5), (4, 2, 3, 2),
     dict(stride=(2, 1), padding=1, output_padding=(1, 0), groups=2)),
    (pt.conv_transpose3d, F.conv_transpose3d, (1, 2, 3, 3, 3), (2, 3, 2, 2, 2), dict(stride=2)),
], ids=["conv1d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"])
def test_gradcheck_and_double_backward_float64(fn, theirs, x_shape, w_shape, kwargs):
    g = torch.Generator(device=DEV).manual_seed(2)
    x = torch.randn(x_shape, device=DEV, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(w_shape, device=DEV, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, c: fn(a, c, None, **kwargs), (x, w), eps=1e-6,
                                    atol=1e-5, rtol=1e-3, nondet_tol=1e-10)

    def penalty(conv):  # ||d out / d x||^2 differentiated again (create_graph=True)
        out = conv(x, w, None, **kwargs)
        (gx,) = torch.autograd.grad(out.square().sum(), x, create_graph=True)
        return torch.autograd.grad(gx.square().sum(), (x, w))

    with torch.backends.cudnn.flags(enabled=False):
        want = penalty(theirs)
    for got, ref in zip(penalty(fn), want):
        assert rel_err(got, ref) < 1e-8


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("fn,theirs,x_shape,w_shape,kwargs", [
    (pt.conv1d, F.conv1d, (2, 8, 17), (8, 8, 3), dict(padding=1)),
    (pt.conv3d, F.conv3d, (2, 8, 5, 5, 5), (8, 8, 3, 3, 3), dict(padding=1)),
    (pt.conv_transpose2d, F.conv_transpose2d, (2, 8, 6, 6), (8, 8, 2, 2), dict(stride=2)),
], ids=["conv1d", "conv3d", "conv_transpose2d"])
def test_autocast_casts_like_pytorch(fn, theirs, x_shape, w_shape, kwargs, dtype):
    g = torch.Generator(device=DEV).manual_seed(3)
    x = torch.randn(x_shape, device=DEV, generator=g)
    w = torch.randn(w_shape, device=DEV, generator=g) * 0.2
    b = torch.randn(w_shape[1] if fn is pt.conv_transpose2d else w_shape[0], device=DEV,
                    generator=g)

    def run(conv):
        leaves = [t.clone().requires_grad_() for t in (x, w, b)]
        with torch.autocast("cuda", dtype=dtype):
            y = conv(leaves[0], leaves[1], leaves[2], **kwargs)
        y.float().square().sum().backward()
        return y, [t.grad for t in leaves]

    ref, ours = run(theirs), run(fn)
    assert ours[0].dtype == ref[0].dtype == dtype
    assert rel_err(ours[0], ref[0]) < 2e-2
    for got, want in zip(ours[1], ref[1]):
        assert got.dtype == torch.float32 and rel_err(got, want) < 3e-2


# torch's own forward-AD decompositions call torch.jit.script when a process first makes a dual
# tensor; the test itself uses no TorchScript
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.xfail(strict=True, reason="converted Conv1d / ConvTranspose1d modules are not custom "
                   "operators: torch.export traces into pycudnn's kernel (data_ptr of a fake tensor)")
def test_export_forward_ad_and_torch_func_run_a_convolution():
    g = torch.Generator(device=DEV).manual_seed(4)
    model = pt.convert(nn.Sequential(nn.Conv1d(4, 6, 3, padding=1),
                                     nn.ConvTranspose1d(6, 4, 2, stride=2))).to(DEV)
    x = torch.randn(2, 4, 8, device=DEV, generator=g)
    with torch.no_grad():
        exported = torch.export.export(model, (x,))
        assert "conv" in str(exported.graph)
        x2 = torch.randn(2, 4, 8, device=DEV, generator=g)
        assert rel_err(exported.module()(x2), model(x2)) < 1e-5
    import torch.autograd.forward_ad as fwad
    x3 = torch.randn(1, 4, 3, 4, 3, device=DEV, generator=g)
    w3 = torch.randn(4, 2, 2, 2, 2, device=DEV, generator=g)
    t = torch.randn_like(w3)
    with fwad.dual_level():
        tangent = fwad.unpack_dual(pt.conv_transpose3d(x3, fwad.make_dual(w3, t), stride=2)).tangent
    assert tangent is not None and rel_err(tangent, F.conv_transpose3d(x3, t, stride=2)) < 1e-5
    wc = torch.randn(3, 4, 3, 3, 3, device=DEV, generator=g)
    grad = torch.func.grad(lambda w_: pt.conv3d(x3, w_, padding=1).square().sum())(wc)
    ref = torch.func.grad(lambda w_: F.conv3d(x3, w_, padding=1).square().sum())(wc)
    assert rel_err(grad, ref) < 1e-5


def test_output_padding_past_the_stride_runs_pytorchs_transposed_convolution():
    g = torch.Generator(device=DEV).manual_seed(5)
    x = torch.randn(2, 4, 6, 6, device=DEV, generator=g, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, device=DEV, generator=g, requires_grad=True)
    kwargs = dict(stride=1, dilation=2, output_padding=1)  # allowed: below the dilation
    try:
        want = F.conv_transpose2d(x, w, None, **kwargs)
    except RuntimeError as exc:  # this PyTorch refuses it on the GPU: so does pycudnn.torch
        with pytest.raises(RuntimeError, match=str(exc).split("\n")[0][:40]):
            pt.conv_transpose2d(x, w, None, **kwargs)
        return
    got = pt.conv_transpose2d(x, w, None, **kwargs)
    assert got.shape == want.shape == (2, 3, 11, 11) and rel_err(got, want) < 1e-6


def test_calls_routed_to_pytorch_stay_right(monkeypatch):
    """In benchmark mode with routing forced to PyTorch (pycudnn would need a GPU time of 0):
    the transposed convolution's forward goes through PyTorch's convolution_backward with
    pycudnn's stand-in for the input, its gradients through PyTorch's forward and backward;
    results as PyTorch's float64 ones."""
    monkeypatch.setattr(routing, "MARGIN", 1.0)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    pt.set_routing("auto")
    pt.clear_cache()
    routing.clear_report()
    try:
        for fn, theirs, x_shape, w_shape, kwargs in (
                (pt.conv_transpose2d, F.conv_transpose2d, (2, 8, 6, 6), (8, 4, 3, 3),
                 dict(stride=2, padding=1, output_padding=1)),
                (pt.conv3d, F.conv3d, (2, 4, 5, 5, 5), (6, 4, 3, 3, 3), dict(padding=1)),
                (pt.conv1d, F.conv1d, (2, 4, 16), (6, 4, 3), dict(padding=1))):
            for step in range(3):
                x, w, b = _tensors(x_shape, w_shape, kwargs, fn is pt.conv_transpose2d,
                                   torch.float32, CONTIG, seed=step)
                y = fn(x, w, b, **kwargs)
                gy = torch.randn_like(y)
                y.backward(gy)
                ref, (rx, rw, rb) = reference(
                    lambda x_, w_, b_, f=theirs, kw=kwargs: f(x_, w_, b_, **kw), x, w, b)
                ref.backward(gy.double())
                for got, want in ((y, ref), (x.grad, rx.grad), (w.grad, rw.grad),
                                  (b.grad, rb.grad)):
                    assert rel_err(got, want) < 1e-4, (fn.__name__, step)
        decisions = pt.routing_report()
        assert decisions and all(d["winner"] == "torch" for d in decisions)
        # the transposed convolution's forward: the backward data of a convolution whose input
        # has the transposed output's shape
        assert any(d["signature"].startswith("x[2, 4, 12, 12] w[8, 4, 3, 3]")
                   and d["direction"] == "backward data" for d in decisions)
        assert any("w[6, 4, 3, 3, 3]" in d["signature"] for d in decisions)
        assert calls.torch_layers  # conv3d and conv1d: whole layers on PyTorch's side
    finally:
        pt.clear_cache()


@pytest.mark.parametrize("call,message", [
    (lambda: pt.conv1d(torch.randn(1, 3, 8, 8, device=DEV), torch.randn(4, 3, 3, device=DEV)),
     r"Expected 2D \(unbatched\) or 3D \(batched\) input to conv1d, but got input of size: "
     r"\[1, 3, 8, 8\]"),
    (lambda: pt.conv3d(torch.randn(3, 8, 8, device=DEV), torch.randn(4, 3, 3, 3, 3, device=DEV)),
     r"Expected 4D \(unbatched\) or 5D \(batched\) input to conv3d, but got input of size: "
     r"\[3, 8, 8\]"),
    (lambda: pt.conv_transpose2d(torch.randn(4, 8, device=DEV), torch.randn(4, 3, 3, 3, device=DEV)),
     r"Expected 3D \(unbatched\) or 4D \(batched\) input to conv_transpose2d, but got input of "
     r"size: \[4, 8\]"),
    (lambda: pt.conv1d(torch.randn(1, 5, 8, device=DEV), torch.randn(4, 3, 3, device=DEV)),
     r"conv1d: given groups=1, weight of size \[4, 3, 3\], expected input\[1, 5, 8\] to have 3 "
     r"channels, but got 5 channels instead"),
    (lambda: pt.conv_transpose1d(torch.randn(1, 5, 8, device=DEV), torch.randn(4, 3, 3, device=DEV)),
     r"conv_transpose1d: given transposed=1, weight of size \[4, 3, 3\], expected input\[1, 5, 8\]"),
    (lambda: pt.conv_transpose3d(torch.randn(1, 4, 2, 2, 2, device=DEV),
                                 torch.randn(4, 3, 3, 3, 3, device=DEV), torch.randn(4, device=DEV)),
     r"expected bias to be 1-dimensional with 3 elements, but got bias of size \[4\] instead"),
    (lambda: pt.conv3d(torch.randn(1, 3, 4, 4, 4, device=DEV),
                       torch.randn(4, 3, 3, 3, 3, device=DEV, dtype=torch.float64)),
     r"conv3d: expected input and weight to have the same dtype"),
])
def test_bad_arguments_get_pytorchs_wording(call, message):
    with pytest.raises(RuntimeError, match=message):
        call()


# ---- the modules --------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:Using padding=.same. with even kernel")
@pytest.mark.parametrize("make,shape", [
    (lambda: nn.Conv1d(4, 6, 4, padding="same", padding_mode="reflect"), (2, 4, 15)),
    (lambda: nn.Conv1d(4, 6, 3, stride=2, padding=2, padding_mode="circular", groups=2), (2, 4, 15)),
    (lambda: nn.Conv3d(4, 6, 3, padding=1, padding_mode="circular"), (2, 4, 5, 6, 5)),
    (lambda: nn.Conv3d(4, 4, (2, 3, 3), padding="same", padding_mode="reflect", dilation=2),
     (1, 4, 6, 7, 7)),
    (lambda: nn.Conv3d(4, 4, 3, padding=(1, 0, 2), padding_mode="replicate"), (1, 4, 5, 5, 5)),
    (lambda: nn.ConvTranspose1d(4, 6, 3, stride=2, padding=1, output_padding=1), (2, 4, 9)),
    (lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2, dilation=2), (2, 4, 5, 6)),
    (lambda: nn.ConvTranspose3d(4, 2, 2, stride=2, bias=False), (2, 4, 3, 4, 3)),
], ids=["conv1d-reflect-same", "conv1d-circular", "conv3d-circular", "conv3d-reflect-same",
        "conv3d-replicate", "transpose1d", "transpose2d", "transpose3d"])
def test_converted_modules_compute_what_the_originals_do(make, shape):
    torch.manual_seed(6)
    original = make().to(DEV)
    converted = pt.convert(copy.deepcopy(original))
    assert type(converted) is not type(original)
    x = torch.randn(shape, device=DEV, requires_grad=True)
    ref_model = copy.deepcopy(original).double()
    xr = x.detach().double().requires_grad_(True)
    with torch.backends.cudnn.flags(enabled=False):
        ref = ref_model(xr)
    y = converted(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    ref.backward(gy.double())
    assert rel_err(y, ref) < 1e-5 and rel_err(x.grad, xr.grad) < 1e-5
    for (name, p), q in zip(converted.named_parameters(), ref_model.parameters()):
        assert rel_err(p.grad, q.grad) < 1e-5, name


@pytest.mark.parametrize("cls,shape,size", [
    (nn.ConvTranspose1d, (2, 4, 5), [10]),
    (nn.ConvTranspose2d, (2, 4, 5, 6), [2, 3, 10, 12]),
    (nn.ConvTranspose3d, (1, 4, 3, 4, 3), [6, 8, 6]),
], ids=["1d", "2d", "3d"])
def test_transposed_modules_take_output_size(cls, shape, size):
    torch.manual_seed(7)
    original = cls(4, 3, 3, stride=2, padding=1).to(DEV)
    converted = pt.convert(copy.deepcopy(original))
    x = torch.randn(shape, device=DEV)
    with torch.backends.cudnn.flags(enabled=False):
        ref = copy.deepcopy(original).double()(x.double(), output_size=size)
    got = converted(x, output_size=size)
    assert list(got.shape[-len(shape) + 2:]) == size[-len(shape) + 2:]
    assert rel_err(got, ref) < 1e-5


def test_a_converted_model_of_every_kind_trains_like_pytorch():
    """A small 3-D encoder-decoder and a 1-D one: the same losses and parameters as PyTorch's
    native convolutions over a few SGD steps (float32, TF32 off)."""
    torch.manual_seed(8)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.vol = nn.Sequential(nn.Conv3d(2, 4, 3, padding=1, padding_mode="reflect"),
                                     nn.ReLU(), nn.Conv3d(4, 8, 3, stride=2, padding=1), nn.ReLU(),
                                     nn.ConvTranspose3d(8, 4, 2, stride=2), nn.Conv3d(4, 2, 1))
            self.seq = nn.Sequential(nn.Conv1d(2, 4, 5, padding="same"), nn.Tanh(),
                                     nn.Conv1d(4, 4, 3, stride=2, padding=1),
                                     nn.ConvTranspose1d(4, 2, 3, stride=2, padding=1,
                                                        output_padding=1))

        def forward(self, v, s):
            return self.vol(v).square().mean() + self.seq(s).square().mean()

    original = Net().to(DEV)
    converted = pt.convert(copy.deepcopy(original))
    assert sum(r["converted"] for r in pt.conversion_report(converted)) == 7
    v = torch.randn(2, 2, 6, 6, 6, device=DEV)
    s = torch.randn(2, 2, 16, device=DEV)
    losses = {}
    for label, model in (("pytorch", original), ("pycudnn", converted)):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses[label] = []
        # PyTorch's native convolutions for the reference (flags() would also allow TF32 in
        # its block: pycudnn's run stays outside it)
        with (torch.backends.cudnn.flags(enabled=False) if label == "pytorch"
              else contextlib.nullcontext()):
            for _ in range(3):
                opt.zero_grad()
                loss = model(v, s)
                loss.backward()
                opt.step()
                losses[label].append(float(loss))
    for a, b in zip(losses["pytorch"], losses["pycudnn"]):
        assert abs(a - b) <= 1e-4 * abs(a)
    for p, q in zip(original.parameters(), converted.parameters()):
        assert rel_err(q, p) < 1e-4
