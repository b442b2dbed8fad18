"""The GPU repros of round 3 (issue 27, ../shared/repros/round3/gpu) as tests: batch-norm
backward with and without the reserve cuDNN asked for, pooling and softmax forward with x and
out in different layouts (guard elements around strided outputs), and the CuPy drop-in's
cover_all pooling whose last window holds no input element (now refused; guards untouched).
The float32 CuPy batch-norm write-back (repro 02) is in test_cupy_compat_bn_gpu.py, the
activation edge values (repro 06) in test_edge_values_gpu.py. References: PyTorch in float64 on
the CPU."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
F = torch.nn.functional

from pycudnn.ops import batchnorm as bn  # noqa: E402
from pycudnn.ops.pooling import pooling_forward  # noqa: E402
from pycudnn.ops.softmax import softmax_backward, softmax_forward  # noqa: E402

CL, CL3 = torch.channels_last, torch.channels_last_3d


def err(a, b):
    return (a.double().cpu() - b).abs().max().item()


@pytest.mark.parametrize("mode", ["spatial_persistent", "spatial"])
def test_batch_norm_backward_with_or_without_the_forward_reserve(mode):
    """fp16 NHWC with C % 4 == 0 takes cuDNN's semi-persistent kernels, which ask for a
    reserve: dx must be right with it, and right (or the call refused) without it."""
    torch.manual_seed(0)
    n, c, h, w = 8, 64, 14, 14
    x = torch.randn(n, c, h, w, device="cuda", dtype=torch.float16).contiguous(memory_format=CL)
    wt, b = torch.rand(c, device="cuda") + 0.5, torch.randn(c, device="cuda")
    dy = torch.randn(n, c, h, w, device="cuda", dtype=torch.float16).contiguous(memory_format=CL)
    res = bn.batch_norm_forward_training(x, wt, b, mode=mode)
    _, sm, si = res
    xd = x.detach().double().cpu().requires_grad_()
    F.batch_norm(xd, None, None, wt.double().cpu(), b.double().cpu(), training=True,
                 eps=1e-5).backward(dy.double().cpu())
    scale = xd.grad.abs().max().item()
    for reserve in (res.reserve, None):
        try:
            dx, _, _ = bn.batch_norm_backward(x, dy, wt, sm, si, mode=mode, reserve=reserve)
        except Exception as exc:  # a clean refusal without the reserve is acceptable
            assert reserve is None and res.reserve is not None, exc
            continue
        got = torch.from_numpy(dx.numpy().astype("float64"))
        assert not torch.isnan(got).any()
        assert (got - xd.grad).abs().max().item() / scale <= 0.05


def _pool_ref(x, k, s, p, mode):
    xd = x.double().cpu()
    if mode == "max":
        return (F.max_pool2d if x.dim() == 4 else F.max_pool3d)(xd, k, s, p)
    return (F.avg_pool2d if x.dim() == 4 else F.avg_pool3d)(xd, k, s, p, count_include_pad=True)


@pytest.mark.parametrize("mode", ["max", "average_include_padding"])
def test_pooling_forward_with_x_and_out_in_different_layouts(mode):
    torch.manual_seed(1)
    k, s, p = 3, 2, 1
    x = torch.randn(2, 5, 11, 9, device="cuda")
    cases = [(x, torch.empty(2, 5, 6, 5, device="cuda").contiguous(memory_format=CL)),
             (x.contiguous(memory_format=CL), torch.empty(2, 5, 6, 5, device="cuda")),
             (torch.randn(2, 5, 11, 18, device="cuda")[..., ::2],
              torch.empty(2, 5, 6, 5, device="cuda"))]
    for xi, out in cases:
        pooling_forward(xi, k, stride=s, padding=p, mode=mode, out=out)
        assert err(out, _pool_ref(xi, k, s, p, mode)) < 1e-5
    buf = torch.full((2, 5, 6, 10), float("nan"), device="cuda")
    pooling_forward(x, k, stride=s, padding=p, mode=mode, out=buf[..., ::2])
    assert err(buf[..., ::2], _pool_ref(x, k, s, p, mode)) < 1e-5
    assert torch.isnan(buf[..., 1::2]).all()  # the guard elements between
    x3 = torch.randn(2, 3, 5, 6, 7, device="cuda")
    out3 = torch.empty(2, 3, 3, 3, 4, device="cuda").contiguous(memory_format=CL3)
    pooling_forward(x3, 3, stride=2, padding=1, mode=mode, out=out3)
    assert err(out3, _pool_ref(x3, 3, 2, 1, mode)) < 1e-5


def _softmax_ref(x, algorithm, mode):
    xd = x.double().cpu()
    if mode == "instance":
        f = xd.reshape(xd.shape[0], -1)
        return (f.log_softmax(1) if algorithm == "log" else f.softmax(1)).reshape(xd.shape)
    return xd.log_softmax(1) if algorithm == "log" else xd.softmax(1)


def test_softmax_forward_with_x_and_out_in_different_layouts():
    torch.manual_seed(2)
    x = torch.randn(3, 7, 4, 5, device="cuda") * 3
    x5 = torch.randn(2, 6, 3, 4, 5, device="cuda") * 3
    cases = [(x, torch.empty_like(x).contiguous(memory_format=CL), "accurate", "channel"),
             (x.contiguous(memory_format=CL), torch.empty_like(x), "accurate", "channel"),
             (x, torch.empty_like(x).contiguous(memory_format=CL), "log", "channel"),
             (x, torch.empty_like(x).contiguous(memory_format=CL), "accurate", "instance"),
             ((torch.randn(3, 7, 4, 10, device="cuda") * 3)[..., ::2],
              torch.empty(3, 7, 4, 5, device="cuda"), "accurate", "channel"),
             ((torch.randn(3, 14, 4, 5, device="cuda") * 3)[:, ::2],
              torch.empty(3, 7, 4, 5, device="cuda"), "accurate", "channel"),
             (x5, torch.empty_like(x5).contiguous(memory_format=CL3), "accurate", "channel"),
             (x5.contiguous(memory_format=CL3), torch.empty_like(x5), "accurate", "channel")]
    for xi, out, algorithm, mode in cases:
        softmax_forward(xi, algorithm=algorithm, mode=mode, out=out)
        assert err(out, _softmax_ref(xi, algorithm, mode)) < 1e-5, (algorithm, mode)
    buf = torch.full((3, 7, 4, 10), float("nan"), device="cuda")
    softmax_forward(x, out=buf[..., ::2])
    assert err(buf[..., ::2], _softmax_ref(x, "accurate", "channel")) < 1e-5
    assert torch.isnan(buf[..., 1::2]).all()
    y = torch.softmax(x, 1)
    dy = torch.randn_like(x).contiguous(memory_format=CL)
    dx = torch.empty_like(x)
    softmax_backward(y, dy, out=dx)
    yd, dyd = y.double().cpu(), dy.double().cpu()
    assert err(dx, yd * (dyd - (dyd * yd).sum(1, keepdim=True))) < 1e-5


def test_cupy_cover_all_window_without_input_is_refused_and_leaves_y_alone():
    """x 4x4, ksize 2, stride 3, pad 1: Chainer's 3x3 y puts window 2 past the input and its
    padding, where cuDNN wrote -FLT_MAX (max) and NaN (average): refused, y untouched."""
    from pycudnn import cupy_compat as cc

    x = (torch.randperm(16, device="cuda").float() - 7.5).reshape(1, 1, 4, 4)
    for m in (cc.CUDNN_POOLING_MAX, cc.CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
              cc.CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING):
        ybuf = torch.full((64,), float("nan"), device="cuda")
        y = ybuf[16:25].view(1, 1, 3, 3)
        with pytest.raises(ValueError, match="holds no input element"):
            cc.pooling_forward(x, y, (2, 2), (3, 3), (1, 1), m)
        with pytest.raises(ValueError, match="holds no input element"):
            cc.pooling_backward(x, y, torch.ones_like(y), (2, 2), (3, 3), (1, 1), m)
        torch.cuda.synchronize()
        assert torch.isnan(ybuf).all()
        y2 = torch.empty(1, 1, 2, 2, device="cuda")  # the floor size is taken
        cc.pooling_forward(x, y2, (2, 2), (3, 3), (1, 1), m)
        assert torch.isfinite(y2).all()
