"""Pooling and softmax forward (and softmax backward) with x, dy and out in different layouts
(NCHW, channels-last, strided views), against PyTorch in float64 on the CPU; NaN guard elements
between the elements of a strided out must stay untouched."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
F = torch.nn.functional

from pycudnn.ops.pooling import pooling_forward  # noqa: E402
from pycudnn.ops.softmax import softmax_backward, softmax_forward  # noqa: E402

CL, CL3 = torch.channels_last, torch.channels_last_3d


def err(a, b):
    return (a.double().cpu() - b).abs().max().item()


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
