"""Batch-norm backward with and without the reserve cuDNN's semi-persistent NHWC kernels ask the
forward pass to keep, against PyTorch's float64 batch norm on the CPU."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
F = torch.nn.functional

from pycudnn.ops import batchnorm as bn  # noqa: E402

CL = torch.channels_last


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

