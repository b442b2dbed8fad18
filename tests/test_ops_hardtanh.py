"""pycudnn.ops.hardtanh without a GPU: the argument checks (PyTorch's rules, the parameter
named) fire before any GPU work, and valid calls go on to ask for a cuDNN handle. The values are
checked against PyTorch's in tests/test_parity_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest

import pycudnn
from pycudnn.ops.hardtanh import hardtanh_backward, hardtanh_forward

NO_GPU = pytest.mark.skipif(
    pycudnn.device_count() > 0,
    reason="a GPU is visible: calls that pass validation would launch on made-up addresses")
BASE = 0x7F00_0000_0000


def t(*shape, dtype="float32", region=0, strides=None, readonly=False):
    return pycudnn.tensor_from_pointer(BASE + (region << 40), shape, dtype, strides=strides,
                                       readonly=readonly)


X, DY = t(2, 3, 4, 5), t(2, 3, 4, 5, region=1)


@pytest.mark.parametrize("call,exc,words", [
    (lambda: hardtanh_forward(X, 1.0, -1.0), ValueError,
     r"min_val cannot be greater than max_val, but got min_val=1.0 and max_val=-1.0"),
    (lambda: hardtanh_forward(X, float("nan")), ValueError, "min_val must not be NaN"),
    (lambda: hardtanh_forward(X, -1.0, "1"), TypeError, "max_val must be a real number"),
    (lambda: hardtanh_forward(X, True), TypeError, "min_val must be a real number"),
    (lambda: hardtanh_forward(t(1, 2, 3, 4, 5, 6)), ValueError, "x"),
    (lambda: hardtanh_forward(t(4, 3, strides=(0, 1))), ValueError, "broadcast"),
    (lambda: hardtanh_forward(X, out=t(2, 3, 4, 4, region=2)), ValueError, "out"),
    (lambda: hardtanh_forward(X, out=t(2, 3, 4, 5, region=2, readonly=True)), ValueError,
     "read-only"),
    (lambda: hardtanh_backward(t(2, 3, 4, 4, region=1), X), ValueError,
     r"expected dy of size \[2, 3, 4, 5\]"),
    (lambda: hardtanh_backward(t(2, 3, 4, 5, region=1, dtype="float16"), X), TypeError,
     r"x type \(float32\) and dy type \(float16\)"),
    (lambda: hardtanh_backward(DY, X, 2.0, 1.0), ValueError, "min_val cannot be greater"),
    (lambda: hardtanh_backward(DY, X, out=DY), ValueError, "out overlaps dy"),
])
def test_bad_input_is_refused_before_any_gpu_work(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


@NO_GPU
@pytest.mark.parametrize("call", [
    lambda: hardtanh_forward(X),
    lambda: hardtanh_forward(X, -0.5, 2.0, out=X),  # in place
    lambda: hardtanh_forward(t(7, dtype="bfloat16"), np.float32(-2), 3),
    lambda: hardtanh_forward(t(dtype="float16"), 0, 6),  # 0-d
    lambda: hardtanh_backward(DY, X, -2.0, 2.0),
    lambda: hardtanh_backward(DY, X, 1.0, 1.0),  # equal bounds: PyTorch allows them
])
def test_valid_input_passes_validation(call):
    with pytest.raises(pycudnn.NoDeviceError):
        call()


def test_empty_tensors_need_no_gpu():
    e = t(0, 3)
    assert hardtanh_forward(e).shape == (0, 3)
    assert hardtanh_backward(t(0, 3, region=1), e).shape == (0, 3)
