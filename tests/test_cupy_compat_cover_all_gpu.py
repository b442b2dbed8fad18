"""The CuPy 13 drop-in's cover_all pooling on a GPU: a window that holds no input element, which
cuDNN would fill with -FLT_MAX (max) or NaN (average), is refused and the caller's y is left as
it was; the floor size is taken."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")


def test_cupy_cover_all_window_without_input_is_refused_and_leaves_y_alone():
    """x 4x4, ksize 2, stride 3, pad 1: Chainer's 3x3 y puts window 2 past the input and its
    padding, where cuDNN writes -FLT_MAX (max) and NaN (average): refused, y untouched."""
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
