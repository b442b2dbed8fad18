"""pycudnn.ops.hardtanh without a GPU: the argument checks (PyTorch's rules, the parameter
named) fire before any GPU work, valid calls go on to ask for a cuDNN handle, and the backward's
two mask terms, evaluated in NumPy in the compute dtype, give PyTorch's gradient (infinite bounds
included). The values on the device are checked against PyTorch's in tests/test_parity_gpu.py."""

from __future__ import annotations

import math

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


INF = math.inf
MASK_BOUNDS = [(-1.0, 1.0), (0.0, 6.0), (0.1, 0.1), (-0.0, 0.0), (0.0, INF), (-INF, 0.0),
               (-INF, INF), (-INF, -INF), (INF, INF), (-INF, 2.5), (-3.0, INF)]


@pytest.mark.parametrize("wide", ["float32", "float64"])
@pytest.mark.parametrize("bounds", MASK_BOUNDS, ids=[f"{a}:{b}" for a, b in MASK_BOUNDS])
def test_backward_masks_give_pytorchs_gradient_at_every_edge(wide, bounds):
    """``alpha * x + b`` of each mask, a NaN made +inf, then ``> 0`` (ReLU's gradient): dy passes
    exactly where PyTorch's ``x <= min_val || x >= max_val ? 0 : dy`` passes it (NaN included)."""
    from pycudnn.ops.hardtanh import mask_terms

    lo, hi = bounds
    dt = np.dtype(wide)
    fi = np.finfo(dt)
    rng = np.random.default_rng(3)
    edges = [np.nan, INF, -INF, 0.0, -0.0, fi.max, -fi.max, fi.tiny, -fi.tiny,
             fi.smallest_subnormal, -fi.smallest_subnormal, 1.0, -1.0]
    near = [v for b in (lo, hi) if math.isfinite(b)
            for v in (b, np.nextafter(dt.type(b), dt.type(INF)),
                      np.nextafter(dt.type(b), dt.type(-INF)))]
    x = np.concatenate([np.array(edges + near, dt), rng.uniform(-8, 8, 200).astype(dt)])
    dy = np.full_like(x, 2.0)
    (a1, b1), (a2, b2) = mask_terms(lo, hi, dt)
    with np.errstate(over="ignore", invalid="ignore"):
        above = dt.type(a1) * x + dt.type(b1)
        below = dt.type(a2) * x + dt.type(b2)
    above[np.isnan(above)] = INF
    below[np.isnan(below)] = INF
    got = np.where((above > 0) & (below > 0), dy, 0.0)
    # PyTorch's CUDA kernel's rule (its CPU kernels disagree with each other at NaN: their scalar
    # path gives 0, their vectorized one dy), checked against its CPU kernel away from NaN
    with np.errstate(invalid="ignore"):
        want = np.where((x <= lo) | (x >= hi), 0.0, dy)
    real = ~np.isnan(x)
    try:
        import torch
    except ImportError:  # the rule above stands alone; PyTorch's kernel confirms it where present
        pass
    else:
        cpu = torch.ops.aten.hardtanh_backward(torch.from_numpy(dy), torch.from_numpy(x), lo,
                                               hi).numpy()
        assert np.array_equal(want[real], cpu[real])
    assert np.array_equal(got, want), [(float(v), g, w) for v, g, w in zip(x, got, want)
                                       if g != w]


def test_hardtanh_is_exported_at_the_top_level_like_the_other_operations():
    from pycudnn.ops import hardtanh

    for name in ("hardtanh_forward", "hardtanh_backward"):
        assert name in pycudnn.__all__ and name in dir(pycudnn)
        assert getattr(pycudnn, name) is getattr(hardtanh, name)
