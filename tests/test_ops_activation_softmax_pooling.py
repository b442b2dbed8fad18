"""Activation, softmax and pooling without a GPU: every argument check (the parameter named, the
check done before any GPU work), the pooling descriptor against the real libcudnn, the C rows,
the signatures and constants of the CuPy 13 drop-ins, and a small property-based fuzz of the
arguments with an oracle written from PyTorch's rules.

Inputs are views of made-up device addresses: a refused call must never touch them. Calls that
pass validation end in ``NoDeviceError`` here; those tests are skipped where a GPU is visible
(made-up addresses must never reach it) and run there through ``test_ops_gpu.py`` in a
subprocess that sees no GPU.
"""

from __future__ import annotations

import ctypes
import inspect
import os
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pycudnn
from pycudnn import cupy_compat as cc
from pycudnn.cudnn.descriptors import TensorDescriptor, live_descriptor_count
from pycudnn.ffi import library as _lib
from pycudnn.ops.activation import activation_backward, activation_forward
from pycudnn._types import PoolingMode
from pycudnn.cudnn.descriptors import PoolingDescriptor
from pycudnn.ops.pooling import pooling_backward, pooling_forward
from pycudnn.ops.softmax import softmax_backward, softmax_forward
from pycudnn.runtime.tensor import contiguous_strides

NO_GPU = pytest.mark.skipif(
    pycudnn.device_count() > 0,
    reason="a GPU is visible: calls that pass validation would launch on made-up addresses; "
           "test_ops_gpu.py runs this module with CUDA_VISIBLE_DEVICES=''")

BASE = 0x7F00_0000_0000
ROLES = {"x": 0, "y": 1, "dy": 2, "out": 3}


def t(*shape, dtype="float32", role="x", strides=None, offset=0, readonly=False):
    """A view of a made-up device address; each role in its own 1 TiB region (no overlap)."""
    return pycudnn.tensor_from_pointer(BASE + (ROLES[role] << 40) + offset, shape, dtype,
                                       strides=strides, readonly=readonly)


X = t(2, 3, 8, 8)
Y = t(2, 3, 8, 8, role="y")
DY = t(2, 3, 8, 8, role="dy")
PY = t(2, 3, 4, 4, role="y")      # 2x2/2 pooling of X
PDY = t(2, 3, 4, 4, role="dy")

CASES = [
    # activation_forward
    (activation_forward, (X, "softplus"), {}, ValueError, r"activation_forward: mode must be one of 'relu'.*'gelu', 'gelu_tanh'"),
    (activation_forward, (t(2, 3, dtype="float64"), "gelu"), {}, TypeError, r"mode 'gelu' runs on cuDNN's graph API, which takes float32, float16 or bfloat16 data, but got x of dtype float64"),
    (activation_backward, (t(2, 3, dtype="float64"), t(2, 3, dtype="float64", role="dy"), t(2, 3, dtype="float64", role="out"), "gelu_tanh"), {}, TypeError, r"activation_backward: mode 'gelu_tanh' runs on cuDNN's graph API"),
    (activation_forward, (X, "identity"), {}, ValueError, r"mode 'identity' is not supported"),
    (activation_forward, (X, 1), {}, ValueError, r"mode must be one of"),
    (activation_forward, (X, "RELU"), {}, ValueError, r"mode must be one of"),
    (activation_forward, (X, "elu"), {"coef": "1"}, TypeError, r"coef must be a real number"),
    (activation_forward, (X, "elu"), {"coef": True}, TypeError, r"coef must be a real number"),
    (activation_forward, (X, "elu"), {"coef": float("nan")}, ValueError, r"coef must be a number"),
    (activation_forward, (t(1, 2, 3, 4, 5, 6),), {}, ValueError, r"expected x to have 0 to 5 dims"),
    (activation_forward, (t(2, 3, 8, 8, strides=(0, 64, 8, 1)),), {}, ValueError, r"without broadcast dims.*dim 0 of x"),
    (activation_forward, (X,), {"out": t(2, 3, 8, 7, role="out")}, ValueError, r"expected out of size \[2, 3, 8, 8\]"),
    (activation_forward, (X,), {"out": t(2, 3, 8, 8, role="out", dtype="float16")}, TypeError, r"expected out to have dtype float32"),
    (activation_forward, (X,), {"out": t(2, 3, 8, 8, role="out", readonly=True)}, ValueError, r"out: is read-only"),
    (activation_forward, (X,), {"out": t(2, 3, 8, 8, role="out", strides=(0, 64, 8, 1))}, ValueError, r"out has elements that overlap each other"),
    (activation_forward, (X,), {"out": t(2, 3, 8, 8, offset=4)}, ValueError, r"out partially overlaps the input"),
    (activation_forward, (X,), {"stream": "default"}, TypeError, r"stream"),
    (activation_forward, (np.zeros((2, 3), np.float32),), {}, TypeError, r"from_numpy"),
    # activation_backward
    (activation_backward, (Y, DY, t(2, 3, 8, 7)), {}, ValueError, r"expected y of size \[2, 3, 8, 7\] \(the shape of x\)"),
    (activation_backward, (Y, t(2, 3, 8, 8, role="dy", dtype="float64"), X), {}, TypeError, r"x type \(float32\) and dy type \(float64\) should be the same"),
    (activation_backward, (Y, DY, X, "swish"), {"coef": [1.0]}, TypeError, r"coef must be a real number"),
    (activation_backward, (Y, DY, X, "softplus"), {}, ValueError, r"mode must be one of"),
    (activation_backward, (Y, DY, X), {"out": t(2, 3, 8, 8, role="dy")}, ValueError, r"out overlaps dy, which the call reads"),
    (activation_backward, (Y, DY, X), {"out": X}, ValueError, r"out overlaps x, which the call reads"),
    # softmax
    (softmax_forward, (t(5),), {}, ValueError, r"softmax_forward: expected x to have 2 to 5 dims"),
    (softmax_forward, (X,), {"algorithm": "stable"}, ValueError, r"algorithm must be one of 'fast', 'accurate', 'log'"),
    (softmax_forward, (X,), {"mode": "spatial"}, ValueError, r"mode must be one of 'channel', 'instance'"),
    (softmax_forward, (X,), {"out": X}, ValueError, r"out overlaps x, which the call reads"),
    (softmax_forward, (X,), {"out": t(2, 3, 8, 8, role="out", readonly=True)}, ValueError, r"out: is read-only"),
    (softmax_backward, (Y, t(2, 3, 8, 9, role="dy")), {}, ValueError, r"expected dy of size \[2, 3, 8, 8\] \(the shape of y\)"),
    (softmax_backward, (Y, t(2, 3, 8, 8, role="dy", dtype="bfloat16")), {}, TypeError, r"y type \(float32\) and dy type \(bfloat16\)"),
    (softmax_backward, (Y, DY), {"algorithm": 2}, ValueError, r"algorithm must be one of"),
    (softmax_backward, (Y, DY), {"out": t(2, 3, 8, 8, role="y", offset=64)}, ValueError, r"out overlaps y"),
    # pooling_forward
    (pooling_forward, (t(2, 3, 8), 2), {}, ValueError, r"expected x to have 4 dims \(N, C, H, W\) for 2-D pooling or 5 dims"),
    (pooling_forward, (t(1, 2, 3, 4, 5, 6), 2), {}, ValueError, r"expected x to have 4 dims"),
    (pooling_forward, (X, 0), {}, ValueError, r"kernel size should be greater than zero, but got kernel_size=\(0, 0\)"),
    (pooling_forward, (X, (3, 3, 3)), {}, ValueError, r"kernel_size must be a single int or a tuple of 2 ints"),
    (pooling_forward, (X, True), {}, TypeError, r"kernel_size must be a single int"),
    (pooling_forward, (X, 2.0), {}, TypeError, r"kernel_size must be a single int"),
    (pooling_forward, (X, 3), {"stride": 0}, ValueError, r"stride should be greater than zero"),
    (pooling_forward, (X, 3), {"stride": (1, 1, 1)}, ValueError, r"stride must be a single int or a tuple of 2"),
    (pooling_forward, (X, 3), {"padding": -1}, ValueError, r"pad must be non-negative"),
    (pooling_forward, (X, 3), {"padding": 2}, ValueError, r"pad should be at most half of kernel size, but got padding=\(2, 2\) and kernel_size=\(3, 3\)"),
    (pooling_forward, (X, 3), {"padding": (1, 2)}, ValueError, r"pad should be at most half"),
    (pooling_forward, (t(2, 3, 2, 2), 3), {}, ValueError, r"Given input size: \(3x2x2\). Calculated output size: \(3x0x0\). Output size is too small"),
    (pooling_forward, (t(2, 3, 0, 4), 1), {}, ValueError, r"expected x to have non-zero spatial sizes"),
    (pooling_forward, (X, 2), {"mode": "avg"}, ValueError, r"mode must be one of 'max', 'max_deterministic', 'average_include_padding', 'average_exclude_padding'"),
    (pooling_forward, (X, 2), {"mode": "average"}, ValueError, r"mode must be one of"),
    (pooling_forward, (X, 2**31), {}, ValueError, r"at most 2147483647"),
    (pooling_forward, (X, 2), {"out": t(2, 3, 8, 8, role="out")}, ValueError, r"expected out of size \[2, 3, 4, 4\]"),
    (pooling_forward, (X, 2), {"out": t(2, 3, 4, 4, offset=128)}, ValueError, r"out overlaps x"),
    (pooling_forward, (X, 2), {"out": t(2, 3, 4, 4, role="out", readonly=True)}, ValueError, r"out: is read-only"),
    # PyTorch's ceil_mode, dilation and divisor_override: its checks and its messages
    (pooling_forward, (X, 2), {"ceil_mode": 1}, TypeError, r"ceil_mode must be a bool"),
    (pooling_forward, (X, 2), {"dilation": 2, "mode": "average_include_padding"}, ValueError, r"dilation=\(2, 2\) applies to max pooling"),
    (pooling_forward, (t(2, 3, 4, 4), 3), {"dilation": 2}, ValueError, r"Calculated output size: \(3x0x0\). Output size is too small"),
    (pooling_backward, (PY, PDY, X, 2), {"dilation": 2}, ValueError, r"expected y of size \[2, 3, 3, 3\]"),
    (pooling_forward, (X, 2), {"dilation": 0}, ValueError, r"dilation should be greater than zero"),
    (pooling_forward, (X, 2), {"divisor_override": 0}, ValueError, r"divisor must be not zero"),
    (pooling_forward, (X, 2), {"divisor_override": 2.0}, TypeError, r"divisor_override must be an int"),
    (pooling_forward, (X, 2), {"divisor_override": 3}, ValueError, r"divisor_override applies to average pooling, but got mode='max'"),
    (pooling_backward, (PY, PDY, X, 3), {"stride": 3, "ceil_mode": True}, ValueError, r"expected y of size \[2, 3, 3, 3\]"),  # floor: 2x2
    # pooling_backward
    (pooling_backward, (t(2, 3, 3, 3, role="y"), PDY, X, 2), {}, ValueError, r"expected y of size \[2, 3, 4, 4\] \(the pooled size of x \[2, 3, 8, 8\]\)"),
    (pooling_backward, (PY, t(2, 3, 4, 4, role="dy", dtype="float16"), X, 2), {}, TypeError, r"x type \(float32\) and dy type \(float16\)"),
    (pooling_backward, (PY, PDY, X, 2), {"stride": 1}, ValueError, r"expected y of size \[2, 3, 7, 7\]"),
    (pooling_backward, (PY, PDY, X, 2), {"mode": "min"}, ValueError, r"mode must be one of"),
    (pooling_backward, (PY, PDY, X, 2), {"out": t(2, 3, 8, 8, role="dy")}, ValueError, r"out overlaps dy"),
    (pooling_backward, (PY, PDY, t(2, 3, 8), 2), {}, ValueError, r"expected x to have 4 dims"),
    # CuPy 13 drop-ins: checks before anything is allocated
    (cc.activation_forward, (X, 9), {}, ValueError, r"mode must be a cudnnActivationMode_t value"),
    (cc.activation_forward, (X, cc.CUDNN_ACTIVATION_IDENTITY), {}, ValueError, r"mode 'identity' is not supported"),
    (cc.activation_forward, (X, True), {}, ValueError, r"mode must be a cudnnActivationMode_t"),
    (cc.activation_forward, (X, 4, "1.0"), {}, TypeError, r"coef must be a real number"),
    (cc.activation_backward, (X, Y, t(2, 3, 8, 7, role="dy"), 1), {}, ValueError, r"expected gy of size \[2, 3, 8, 8\]"),
    (cc.softmax_forward, (X, 4, cc.CUDNN_SOFTMAX_ACCURATE), {}, IndexError, r"Dimension out of range \(expected to be in range of \[-4, 3\], but got 4\)"),
    (cc.softmax_forward, (X, 1.0, cc.CUDNN_SOFTMAX_ACCURATE), {}, TypeError, r"axis must be an int"),
    (cc.softmax_forward, (X, 1, 3), {}, ValueError, r"algorithm must be a cudnnSoftmaxAlgorithm_t value"),
    (cc.softmax_backward, (Y, t(2, 3, 8, 1, role="dy"), 1, 1), {}, ValueError, r"expected gy of size"),
    (cc.pooling_forward, (X, PY, (2, 2), (2,), (0, 0), 0), {}, ValueError, r"ksize, stride, and pad must be of same length"),
    (cc.pooling_forward, (X, PY, 2, (2, 2), (0, 0), 0), {}, TypeError, r"ksize must be a tuple"),
    (cc.pooling_forward, (X, PY, (2, 2, 2), (2, 2, 2), (0, 0, 0), 0), {}, ValueError, r"expected ksize, stride and pad with 2 values"),
    (cc.pooling_forward, (X, PY, (2, 2), (2, 2), (0, 0), 7), {}, ValueError, r"mode must be a cudnnPoolingMode_t value"),
    (cc.pooling_forward, (X, t(2, 3, 4, 4, role="y", strides=(48, 1, 12, 3)), (2, 2), (2, 2), (0, 0), 0), {}, ValueError, r"pooling_forward supports c-contiguous y only"),
    (cc.pooling_forward, (X, t(2, 3, 5, 4, role="y"), (2, 2), (2, 2), (0, 0), 0), {}, ValueError, r"expected y of size \[2, 3, 4, 4\]"),
    (cc.pooling_forward, (X, t(2, 3, 4, 4, offset=64), (2, 2), (2, 2), (0, 0), 0), {}, ValueError, r"pooling_forward: y overlaps x"),
    (cc.pooling_forward, (X, t(2, 3, 4, 4, role="y", readonly=True), (2, 2), (2, 2), (0, 0), 0), {}, ValueError, r"pooling_forward: y: is read-only"),
    (cc.pooling_forward, (X, t(2, 3, 12, 12, role="y"), (3, 3), (1, 1), (3, 3), 0), {}, ValueError, r"pad should be smaller than kernel size"),
    (cc.pooling_backward, (X, PY, t(2, 3, 4, 5, role="dy"), (2, 2), (2, 2), (0, 0), 0), {}, ValueError, r"expected gy of size \[2, 3, 4, 4\]"),
]


@pytest.mark.parametrize("fn,args,kwargs,exc,words", CASES,
                         ids=[f"{c[0].__module__.split('.')[-1]}.{c[0].__name__}-{i}"
                              for i, c in enumerate(CASES)])
def test_bad_input_is_refused_before_any_gpu_work(fn, args, kwargs, exc, words):
    with pytest.raises(exc, match=words):
        fn(*args, **kwargs)


# ---- what passes validation (ends in NoDeviceError here) -------------------------------------------

VALID = [
    (activation_forward, (X,), {}),
    (activation_forward, (X, "clipped_relu"), {"coef": 6.0}),
    (activation_forward, (X, "swish"), {"coef": np.float32(1.5)}),
    (activation_forward, (X,), {"out": X}),  # in place: the same view
    (activation_forward, (t(10),), {}),
    (activation_forward, (t(2, 3, 4, 5, 6),), {"out": t(2, 3, 4, 5, 6, role="out", strides=(720, 1, 180, 36, 6))}),
    (activation_backward, (Y, DY, X, "elu"), {"coef": 1}),
    (activation_backward, (Y, DY, t(2, 3, 8, 8, strides=(192, 1, 24, 3))), {}),  # staged
    (activation_forward, (X, "gelu"), {}),
    (activation_forward, (t(7, dtype="bfloat16"), "gelu_tanh"), {}),  # no flat block: padded
    (activation_backward, (Y, DY, X, "gelu"), {}),
    (activation_backward, (Y, DY, t(2, 3, 8, 8, strides=(192, 1, 24, 3)), "gelu_tanh"), {}),
    (softmax_forward, (t(32, 1000),), {"algorithm": "log"}),
    (softmax_forward, (t(2, 3, 4, 5, 6),), {"mode": "instance", "algorithm": "fast"}),
    (softmax_backward, (Y, DY), {"out": t(2, 3, 8, 8, role="out")}),
    (pooling_forward, (X, 3), {"stride": 2, "padding": 1}),
    (pooling_forward, (t(2, 3, 6, 7, 8), (2, 3, 4)), {"mode": "average_exclude_padding", "padding": (1, 1, 2)}),
    (pooling_forward, (X, 8), {"mode": "average_include_padding"}),   # global pooling
    (pooling_forward, (X, [2, np.int64(2)]), {"mode": "max_deterministic"}),
    (pooling_backward, (PY, PDY, X, 2), {}),
    (pooling_backward, (PY, PDY, X, (2, 2)), {"stride": (2, 2), "out": t(2, 3, 8, 8, role="out")}),
    (cc.pooling_forward, (X, t(2, 3, 10, 10, role="y"), (3, 3), (1, 1), (2, 2), 0), {}),  # CuPy's looser padding rule
    (pooling_forward, (X, 3), {"stride": 2, "ceil_mode": True}),  # 4x4, the last window partial
    (pooling_forward, (t(2, 3, 7, 7), 3), {"stride": 2, "padding": 1, "ceil_mode": True, "mode": "average_include_padding"}),  # no partial window
    (pooling_forward, (X, 3), {"stride": 2, "mode": "average_exclude_padding", "divisor_override": 5}),
    (pooling_backward, (t(2, 3, 4, 4, role="y"), t(2, 3, 4, 4, role="dy"), X, 3), {"stride": 2, "ceil_mode": True, "dilation": (1, 1)}),
    (pooling_forward, (X, 3), {"stride": 1, "padding": 1, "dilation": 2}),
    (pooling_forward, (t(2, 3, 9, 9, 9), 2), {"stride": (1, 2, 3), "dilation": (3, 2, 1), "mode": "max_deterministic"}),
    (pooling_backward, (t(2, 3, 3, 3, role="y"), t(2, 3, 3, 3, role="dy"), X, 2), {"dilation": 2}),
]


@NO_GPU
@pytest.mark.parametrize("fn,args,kwargs", VALID, ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(VALID)])
def test_valid_input_passes_validation(fn, args, kwargs):
    with pytest.raises(pycudnn.NoDeviceError):
        fn(*args, **kwargs)


@NO_GPU
def test_a_repeated_call_creates_no_descriptor():
    x = t(3, 5, 7, 9)
    for fn, args, kwargs in [(activation_forward, (x, "tanh"), {}),
                             (softmax_forward, (x,), {"mode": "instance"}),
                             (pooling_forward, (x, 3), {"stride": 2, "padding": 1}),
                             (pooling_backward, (t(3, 5, 4, 5, role="y"), t(3, 5, 4, 5, role="dy"), x, 3),
                              {"stride": 2, "padding": 1})]:
        before = live_descriptor_count()
        with pytest.raises(pycudnn.NoDeviceError):
            fn(*args, **kwargs)
        made = live_descriptor_count() - before
        assert made >= 1, fn  # the first call made its descriptors (kept for the next calls)
        for _ in range(3):
            with pytest.raises(pycudnn.NoDeviceError):
                fn(*args, **kwargs)
        assert live_descriptor_count() - before == made, fn


@NO_GPU
def test_a_planned_call_still_checks_its_out(monkeypatch):
    """A repeated signature skips the full checks (patched to fail here), not the ones that depend
    on addresses and flags: an out that overlaps an input, or is read-only, is still refused."""
    from pycudnn.ops import activation, pooling, softmax

    x, y, dy = t(2, 3, 8, 8), t(2, 3, 8, 8, role="y"), t(2, 3, 8, 8, role="dy")
    py, pdy = t(2, 3, 4, 4, role="y"), t(2, 3, 4, 4, role="dy")
    calls = {
        "activation_forward": lambda o: activation_forward(x, "elu", coef=1.0, out=o),
        "activation_backward": lambda o: activation_backward(y, dy, x, out=o),
        "softmax_forward": lambda o: softmax_forward(x, algorithm="log", out=o),
        "softmax_backward": lambda o: softmax_backward(y, dy, out=o),
        "pooling_forward": lambda o: pooling_forward(x, 2, out=o),
        "pooling_backward": lambda o: pooling_backward(py, pdy, x, 2, out=o),
    }
    shape = {"pooling_forward": (2, 3, 4, 4)}
    for name, call in calls.items():
        with pytest.raises(pycudnn.NoDeviceError):
            call(t(*shape.get(name, (2, 3, 8, 8)), role="out"))  # leaves its plan
    for module in (activation, softmax, pooling):
        for plan in ("forward_plan", "backward_plan"):
            monkeypatch.setattr(module, plan, lambda *a: pytest.fail("the full checks ran"))
    for name, call in calls.items():
        size = shape.get(name, (2, 3, 8, 8))
        with pytest.raises(pycudnn.NoDeviceError):
            call(t(*size, role="out", offset=1 << 20))  # the plan
        with pytest.raises(ValueError, match="read-only"):
            call(t(*size, role="out", readonly=True))
        overlapping = t(*size, role="y" if "backward" in name else "x", offset=8)
        with pytest.raises(ValueError, match="overlap"):
            call(overlapping)


def test_empty_tensors_give_empty_results_without_a_gpu():
    y = activation_forward(t(0, 3, 4, 4), "sigmoid")
    assert (y.shape, y.size, y.ptr) == ((0, 3, 4, 4), 0, 0)
    y = softmax_forward(t(0, 10))
    assert y.shape == (0, 10)
    y = pooling_forward(t(0, 3, 8, 8), 3, stride=2, padding=1)
    assert y.shape == (0, 3, 4, 4)
    y = pooling_forward(t(2, 0, 8, 8, strides=(64, 64, 8, 1)), 2)
    assert y.shape == (2, 0, 4, 4)
    dx = pooling_backward(t(0, 3, 4, 4, role="y"), t(0, 3, 4, 4, role="dy"), t(0, 3, 8, 8), 2)
    assert dx.shape == (0, 3, 8, 8)
    out = t(0, 3, 4, 4, role="out")
    assert activation_forward(t(0, 3, 4, 4), out=out) is out


def test_output_follows_the_inputs_memory_format():
    # a channels-last input gets a channels-last output: checked on the plan, without a GPU
    from pycudnn.ops import _common

    nhwc = t(2, 3, 8, 8, strides=(192, 1, 24, 3))
    assert _common.layout_strides((2, 3, 4, 4), nhwc) == (48, 1, 12, 3)
    assert _common.layout_strides((2, 3, 4, 4), X) == (48, 16, 4, 1)
    ndhwc = t(2, 3, 4, 4, 4, strides=(192, 1, 48, 12, 3))
    assert _common.layout_strides((2, 3, 2, 2, 2), ndhwc) == (24, 1, 12, 6, 3)
    sliced = t(2, 3, 8, 8, strides=(400, 100, 10, 1))  # a strided NCHW view: dense NCHW output
    assert _common.layout_strides((2, 3, 8, 8), sliced) == (192, 64, 8, 1)


@pytest.mark.parametrize("shape,strides,mode,desc,stage_x", [
    # 2-D and 3-D: unit dims appended, the strides kept
    ((6, 10), (40, 2), "channel", ((6, 10, 1, 1), (40, 2, 1, 1)), None),
    ((2, 3, 7), (21, 7, 1), "channel", ((2, 3, 7, 1), (21, 7, 1, 1)), None),
    # 5-D NCDHW and NDHWC: H and W folded into one dim
    ((2, 5, 2, 3, 4), (120, 24, 12, 4, 1), "channel", ((2, 5, 2, 12), (120, 24, 12, 1)), None),
    ((2, 5, 2, 3, 4), (120, 1, 60, 20, 5), "channel", ((2, 5, 2, 12), (120, 1, 60, 5)), None),
    # H and W not adjacent, D and H are: those folded
    ((2, 5, 2, 3, 4), (480, 96, 48, 16, 2), "channel", ((2, 5, 6, 4), (480, 96, 16, 2)), None),
    # 5-D with gaps between every dim: nothing folds, x is staged dense
    ((2, 5, 2, 3, 4), (3840, 384, 96, 16, 2), "channel", ((2, 5, 2, 12), (120, 24, 12, 1)),
     (120, 24, 12, 4, 1)),
    # instance mode: a non-packed x is staged (also a 4-D one that cuDNN would take in channel mode)
    ((3, 7, 4, 5), (1120, 160, 40, 2), "channel", ((3, 7, 4, 5), (1120, 160, 40, 2)), None),
    ((3, 7, 4, 5), (1120, 160, 40, 2), "instance", ((3, 7, 4, 5), (140, 20, 5, 1)),
     (140, 20, 5, 1)),
    ((6, 10), (40, 2), "instance", ((6, 10, 1, 1), (10, 1, 1, 1)), (10, 1, 1, 1)),
    ((3, 7, 4, 5), (140, 1, 35, 7), "instance", ((3, 7, 4, 5), (140, 1, 35, 7)), None),
])
def test_softmax_gives_cudnn_4d_descriptors_and_stages_what_it_cannot_take(shape, strides, mode,
                                                                           desc, stage_x):
    """cuDNN's softmax is given (N, C, H, W) descriptors; layouts it reads wrongly (5-D that does
    not fold, non-packed in instance mode) go through a dense copy. Checked on the plan."""
    from pycudnn.ops import softmax as sm

    x = t(*shape, strides=strides)
    plan = sm.forward_plan(x, "log", mode, None, "softmax_forward")
    xd = plan.keep[0]
    assert (xd.shape, xd.strides) == desc
    padded = None if stage_x is None else stage_x + (1,) * (4 - len(stage_x))
    assert plan.stage_x == padded
    assert plan.stage_y is None  # the new output is dense in x's memory format
    back = sm.backward_plan(x, t(*shape, strides=strides, role="dy"), "log", mode, None,
                             "softmax_backward")
    assert len(back.keep[0].shape) == 4
    # backward: y, dy and dx share one dense layout (x's memory format), others staged into it
    assert back.stage == (not x.is_contiguous() and not x.is_contiguous("channels_last"))


def test_softmax_stages_an_out_that_cuDNN_cannot_write():
    from pycudnn.ops import softmax as sm

    x = t(2, 5, 2, 3, 4)
    out = t(2, 5, 2, 3, 4, role="out", strides=(3840, 384, 96, 16, 2))
    plan = sm.forward_plan(x, "accurate", "channel", out, "softmax_forward")
    assert plan.stage_y == (120, 24, 12, 4, 1) and plan.stage_x is None
    nhwc_out = t(3, 7, 4, 5, role="out", strides=(140, 1, 35, 7))
    plan = sm.forward_plan(t(3, 7, 4, 5), "accurate", "instance", nhwc_out, "softmax_forward")
    # instance mode: x is brought into the (packed) layout of out, not out into x's
    assert plan.stage_y is None and plan.stage_x == (140, 1, 35, 7)


@pytest.mark.parametrize("dtype,wide", [("float16", "float32"), ("bfloat16", "float32"),
                                        ("float32", None), ("float64", None)])
def test_half_softmax_backward_and_elu_backward_compute_in_float32(dtype, wide):
    """cuDNN's half-precision softmax backward and ELU backward lose accuracy beyond their
    dtype's rounding of float64; their calls run cuDNN on float32 copies (descriptors say
    float32), as PyTorch computes them. The values are checked in test_edge_values_gpu.py."""
    from pycudnn.ops import activation as act
    from pycudnn.ops import softmax as sm

    y, dy = t(1, 1, 5, dtype=dtype, role="y"), t(1, 1, 5, dtype=dtype, role="dy")
    back = sm.backward_plan(y, dy, "accurate", "instance", None, "softmax_backward")
    assert (None if back.wide is None else back.wide.name) == wide
    assert back.keep[0].dtype.name == (wide or dtype)
    assert back.stage == (wide is not None)  # a dense layout, but another dtype: staged
    x = t(dtype=dtype)  # 0-d: PyTorch's OpInfo sample
    elu = act.backward_plan(t(dtype=dtype, role="y"), t(dtype=dtype, role="dy"), x, "elu",
                             1.0, None, act.NanPropagation.PROPAGATE_NAN, "activation_backward")
    assert (None if elu.wide is None else elu.wide.name) == wide
    assert elu.keep[1].dtype.name == (wide or dtype)
    relu = act.backward_plan(t(dtype=dtype, role="y"), t(dtype=dtype, role="dy"), x, "relu",
                              0.0, None, act.NanPropagation.PROPAGATE_NAN, "activation_backward")
    assert relu.wide is None  # only ELU's half kernel is off


@pytest.mark.parametrize("i", [1, 2, 5, 7, 8, 13])
@pytest.mark.parametrize("k,s,p", [(k, s, p) for k in (1, 2, 3, 4) for s in (1, 2, 3)
                                   for p in range(k // 2 + 1)])
def test_ceil_mode_output_size_is_pytorchs(i, k, s, p):
    """Against PyTorch's own max_pool1d (CPU) output size, every small geometry."""
    torch = pytest.importorskip("torch")
    from pycudnn.ops import pooling as pl

    if i + 2 * p < k:
        return
    ref = torch.nn.functional.max_pool1d(torch.zeros(1, 1, i), k, s, p, ceil_mode=True).shape[-1]
    assert pl.ceil_output_size((i,), (k,), (s,), (p,)) == (ref,)
    y = pl.pooling_geometry(t(1, 1, i, i), k, s, p, "pooling_forward", pl.HALF_CEIL)[3]
    assert y == (1, 1, ref, ref)


@pytest.mark.parametrize("hw", [(8, 9), (7, 7), (10, 6), (5, 13)])
@pytest.mark.parametrize("k,s,p", [(2, 2, 0), (3, 2, 0), (3, 2, 1), (3, 3, 1), (4, 3, 2),
                                   (3, 1, 1), ((3, 2), (2, 3), (1, 0))])
@pytest.mark.parametrize("divisor", [None, 5, -3])
def test_ceil_mode_edge_factors_give_pytorchs_include_padding_average(hw, k, s, p, divisor):
    """PyTorch's exclude-padding average (what cuDNN's exclude mode computes, checked on the GPU
    in test_parity_gpu) times `ceil_divisors`' alpha and edge factors is PyTorch's
    include-padding (or divisor_override) average with ceil_mode, in float64 on the CPU."""
    torch = pytest.importorskip("torch")
    from pycudnn.ops import pooling as pl

    F = torch.nn.functional
    x = torch.tensor(np.random.default_rng(sum(hw)).standard_normal((2, 3) + hw))
    want = F.avg_pool2d(x, k, s, p, ceil_mode=True, count_include_pad=True,
                        divisor_override=divisor)
    got = F.avg_pool2d(x, k, s, p, ceil_mode=True, count_include_pad=False)
    k2, s2, p2, shape = pl.pooling_geometry(t(2, 3, *hw), k, s, p, "pooling_forward", pl.HALF_CEIL)
    assert shape == tuple(want.shape)
    edges = pl.ceil_divisors(t(2, 3, *hw), k2, s2, p2, shape,
                              pl.PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING, divisor)
    if edges is None:  # no window past the padding: cuDNN's own include mode is PyTorch's
        assert all((o - 1) * si - pi + ki <= i + pi
                   for i, ki, si, pi, o in zip(hw, k2, s2, p2, shape[2:]))
        return
    alpha, slices = edges
    got = got * alpha
    for d, j, factor in slices:
        got.narrow(2 + d, j, 1).mul_(factor)
    assert torch.allclose(got, want, rtol=1e-13, atol=1e-13)


def _plain_max(xv, k, pad, stride, n):
    """What cuDNN's plain max pooling computes over a 1-D view: window t covers
    [t * stride - pad, + k) of the view, elements outside it ignored (None: no element)."""
    out = []
    for t_ in range(n):
        vals = [xv[m] for m in range(t_ * stride - pad, t_ * stride - pad + k) if 0 <= m < len(xv)]
        out.append(max(vals) if vals else None)
    return out


@pytest.mark.parametrize("i", [5, 8, 13])
@pytest.mark.parametrize("k,s,p,d", [(k, s, p, d) for k in (1, 2, 3) for s in (1, 2, 3, 4)
                                     for p in range(k // 2 + 1) for d in (2, 3, 4)])
@pytest.mark.parametrize("ceil", [False, True])
def test_dilated_max_pooling_is_plain_poolings_on_strided_views(i, k, s, p, d, ceil):
    """The split of a dilated window into plain cuDNN poolings (emulated here as cuDNN computes
    them) gives PyTorch's dilated max pooling (its own CPU result and output size)."""
    torch = pytest.importorskip("torch")
    from pycudnn.ops import pooling as pl

    if d * (k - 1) + 1 > i + 2 * p:
        return
    x = np.random.default_rng(i * 100 + k * 10 + s).permutation(i).astype(np.float64)
    ref = torch.nn.functional.max_pool1d(torch.tensor(x).view(1, 1, -1), k, s, p, d,
                                         ceil_mode=ceil).view(-1).numpy()
    o = len(ref)
    ke = d * (k - 1) + 1
    assert o == (pl.ceil_output_size if ceil else pl.output_size)((i,), (ke,), (s,), (p,))[0]
    got = [None] * o
    for c, n, start, length, pad, step in pl.dilated_classes(i, k, s, p, d, o):
        view = x[start::d][:length]
        assert len(view) == length
        for t_, v in enumerate(_plain_max(view, k, pad, step, n)):
            assert got[c + t_ * (d // np.gcd(s, d))] is None  # each output exactly once
            got[c + t_ * (d // np.gcd(s, d))] = v
    assert got == list(ref)


def test_divisor_override_scales_cudnns_window_average():
    """cuDNN averages over the whole window (include padding); alpha = window / divisor."""
    import ctypes

    from pycudnn.ops import pooling as pl

    for dtype, ctype in (("float32", ctypes.c_float), ("float64", ctypes.c_double),
                         ("float16", ctypes.c_float)):
        x = t(2, 3, 8, 8, dtype=dtype)
        plan = pl.forward_plan(x, 3, 2, 1, "average_exclude_padding", None,
                                pl.NanPropagation.PROPAGATE_NAN, "half", "pooling_forward",
                                divisor=5)
        assert ctype.from_address(plan.one).value == pytest.approx(9 / 5)
        assert plan.keep[0].mode == pl.PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING
        back = pl.backward_plan(t(2, 3, 4, 4, dtype=dtype, role="y"),
                                 t(2, 3, 4, 4, dtype=dtype, role="dy"), x, 3, 2, 1,
                                 "average_include_padding", None,
                                 pl.NanPropagation.PROPAGATE_NAN, "half", "pooling_backward",
                                 divisor=5)
        assert ctype.from_address(back.one).value == pytest.approx(9 / 5)
    plain = pl.forward_plan(t(2, 3, 8, 8), 3, 2, 1, "average_exclude_padding", None,
                             pl.NanPropagation.PROPAGATE_NAN, "half", "pooling_forward")
    assert ctypes.c_float.from_address(plain.one).value == 1.0


def test_same_layout_ignores_size_one_dims():
    from pycudnn.ops._common import same_layout

    assert same_layout((2, 1, 4), (4, 99, 1), (4, 4, 1))
    assert not same_layout((2, 3, 4), (12, 4, 1), (12, 1, 3))


# ---- the pooling descriptor against the real libcudnn ------------------------------------------------

def test_pooling_descriptor_holds_what_it_was_given():
    with PoolingDescriptor((3, 3), (1, 1), (2, 2), "max") as d:
        assert (d.window, d.padding, d.stride, d.mode) == ((3, 3), (1, 1), (2, 2), PoolingMode.MAX)
        assert repr(d) == ("PoolingDescriptor(mode=CUDNN_POOLING_MAX, nan=CUDNN_NOT_PROPAGATE_NAN, "
                           "window=[3, 3], padding=[1, 1], stride=[2, 2])")
    assert d.closed and repr(d) == "PoolingDescriptor(<closed>)"
    with pytest.raises(ValueError, match="is closed"):
        d.handle
    d3 = PoolingDescriptor((2, 3, 4), (0, 1, 2), (1, 2, 3), PoolingMode.AVERAGE_COUNT_EXCLUDE_PADDING,
                           "PROPAGATE_NAN")
    assert "CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING" in repr(d3) and "CUDNN_PROPAGATE_NAN" in repr(d3)
    assert "window=[2, 3, 4], padding=[0, 1, 2], stride=[1, 2, 3]" in repr(d3)


@pytest.mark.parametrize("shape,window,padding,stride", [
    ((2, 3, 9, 9), (3, 3), (1, 1), (2, 2)),
    ((1, 1, 7, 10), (2, 3), (0, 1), (2, 3)),
    ((2, 3, 5, 6, 7), (3, 3, 3), (1, 0, 1), (1, 2, 3)),
    ((32, 2048, 7, 7), (7, 7), (0, 0), (7, 7)),
])
def test_cudnn_output_shape_is_pytorchs_formula(shape, window, padding, stride):
    from pycudnn.ops.pooling import output_size

    with PoolingDescriptor(window, padding, stride) as d, TensorDescriptor(shape, "float32") as xd:
        expected = tuple((i + 2 * p - k) // s + 1 for i, k, p, s in zip(shape[2:], window, padding, stride))
        assert d.output_shape(xd) == shape[:2] + expected
        assert output_size(shape[2:], window, stride, padding) == expected


@pytest.mark.parametrize("kwargs,words", [
    (dict(window=(0, 3), padding=(0, 0), stride=(1, 1)), "window: expected every value to be >= 1"),
    (dict(window=(3, 3), padding=(-1, 0), stride=(1, 1)), "padding: expected every value to be >= 0"),
    (dict(window=(3, 3), padding=(0, 0), stride=(1, 0)), "stride: expected every value to be >= 1"),
    (dict(window=(3, 3), padding=(0,), stride=(1, 1)), "padding: expected 2 values"),
    (dict(window=(1,) * 7, padding=(0,) * 7, stride=(1,) * 7), "window: expected 1 to 6 values"),
    (dict(window=(3, True), padding=(0, 0), stride=(1, 1)), "window: expected ints, got bool"),
    (dict(window=(3, 3), padding=(0, 0), stride=(1, 1), mode="median"), "mode: expected one of PoolingMode"),
    (dict(window=(2**31, 3), padding=(0, 0), stride=(1, 1)), "window: expected every value to fit in int32"),
])
def test_pooling_descriptor_checks_name_the_parameter(kwargs, words):
    before = live_descriptor_count()
    with pytest.raises((ValueError, TypeError), match=re.escape(words)):
        PoolingDescriptor(**kwargs)
    assert live_descriptor_count() == before


def test_cudnn_refuses_what_python_would_and_says_why():
    """validate=False hands the values to cuDNN: its own checks and reasons (the facts the module
    docstring states), and nothing leaks."""
    before = live_descriptor_count()
    with pytest.raises(pycudnn.CudnnBadParamError, match=r"windowDimA\[i\] <= 0"):
        PoolingDescriptor((0, 3), (0, 0), (1, 1), validate=False)
    with pytest.raises(pycudnn.CudnnBadParamError, match=r"strideA\[i\] <= 0"):
        PoolingDescriptor((3, 3), (0, 0), (0, 1), validate=False)
    assert live_descriptor_count() == before
    # cuDNN itself accepts negative padding and padding as large as the window
    with PoolingDescriptor((3, 3), (-1, 3), (1, 1), validate=False) as d:
        with TensorDescriptor((1, 1, 8, 8), "float32") as xd:
            assert d.output_shape(xd) == (1, 1, 4, 12)  # windows wholly in the padding counted
    with PoolingDescriptor((3, 3), (0, 0), (1, 1)) as d, TensorDescriptor((1, 1, 2, 2), "float32") as xd:
        with pytest.raises(pycudnn.CudnnBadParamError):
            d.output_shape(xd)  # a window larger than the padded input
        with TensorDescriptor((1, 1, 8, 8, 8), "float32") as x5:
            with pytest.raises(ValueError, match="expected 4 dims for a 2-d pooling window"):
                d.output_shape(x5)


def test_swish_beta_is_set_on_the_descriptor():
    from pycudnn._types import NanPropagation
    from pycudnn.ops.activation import activation_descriptor

    d = activation_descriptor("swish", 1.75, NanPropagation.PROPAGATE_NAN)
    beta = ctypes.c_double()
    assert _lib.lib().cudnnGetActivationDescriptorSwishBeta(d.handle, ctypes.byref(beta)) == 0
    assert beta.value == 1.75
    assert "CUDNN_ACTIVATION_SWISH" in repr(d) and "CUDNN_PROPAGATE_NAN" in repr(d)


# (their C rows are in the one table: tests/test_lib.py checks each against its signature)


# ---- signatures and constants --------------------------------------------------------------------------

P, KO = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
REQ = inspect.Parameter.empty

NATIVE = {
    activation_forward: [("x", P, REQ), ("mode", P, "relu"), ("coef", KO, 0.0), ("out", KO, None),
                         ("stream", KO, None)],
    activation_backward: [("y", P, REQ), ("dy", P, REQ), ("x", P, REQ), ("mode", P, "relu"),
                          ("coef", KO, 0.0), ("out", KO, None), ("stream", KO, None)],
    softmax_forward: [("x", P, REQ), ("algorithm", KO, "accurate"), ("mode", KO, "channel"),
                      ("out", KO, None), ("stream", KO, None)],
    softmax_backward: [("y", P, REQ), ("dy", P, REQ), ("algorithm", KO, "accurate"),
                       ("mode", KO, "channel"), ("out", KO, None), ("stream", KO, None)],
    pooling_forward: [("x", P, REQ), ("kernel_size", P, REQ), ("stride", KO, None),
                      ("padding", KO, 0), ("mode", KO, "max"), ("ceil_mode", KO, False),
                      ("dilation", KO, 1), ("divisor_override", KO, None), ("out", KO, None),
                      ("stream", KO, None)],
    pooling_backward: [("y", P, REQ), ("dy", P, REQ), ("x", P, REQ), ("kernel_size", P, REQ),
                       ("stride", KO, None), ("padding", KO, 0), ("mode", KO, "max"),
                       ("ceil_mode", KO, False), ("dilation", KO, 1),
                       ("divisor_override", KO, None), ("out", KO, None), ("stream", KO, None)],
}

# CuPy 13, cupyx/cudnn.pyx
CUPY13 = {
    "activation_forward": [("x", P, REQ), ("mode", P, REQ), ("coef", P, 0.0)],
    "activation_backward": [("x", P, REQ), ("y", P, REQ), ("gy", P, REQ), ("mode", P, REQ),
                            ("coef", P, 0.0)],
    "softmax_forward": [("x", P, REQ), ("axis", P, REQ), ("algorithm", P, REQ)],
    "softmax_backward": [("y", P, REQ), ("gy", P, REQ), ("axis", P, REQ), ("algorithm", P, REQ)],
    "pooling_forward": [("x", P, REQ), ("y", P, REQ), ("ksize", P, REQ), ("stride", P, REQ),
                        ("pad", P, REQ), ("mode", P, REQ)],
    "pooling_backward": [("x", P, REQ), ("y", P, REQ), ("gy", P, REQ), ("ksize", P, REQ),
                         ("stride", P, REQ), ("pad", P, REQ), ("mode", P, REQ)],
}


@pytest.mark.parametrize("fn", list(NATIVE), ids=lambda f: f.__name__)
def test_native_signatures(fn):
    params = inspect.signature(fn).parameters.values()
    assert [(p.name, p.kind, p.default) for p in params] == NATIVE[fn]


@pytest.mark.parametrize("name", sorted(CUPY13))
def test_cupy13_signatures(name):
    params = inspect.signature(getattr(cc, name)).parameters.values()
    assert [(p.name, p.kind, p.default) for p in params] == CUPY13[name]
    assert name in cc.__all__


def test_cupy13_constants_are_the_headers_values():
    include = Path(_lib.library_path()).resolve().parent.parent / "include"
    headers = [include / "cudnn_ops_v9.h", include / "cudnn_graph_v9.h"]
    if not all(h.is_file() for h in headers):
        pytest.skip(f"no cuDNN headers in {include}")
    text = "\n".join(h.read_text() for h in headers)
    header = dict((m.group(1), int(m.group(2))) for m in re.finditer(
        r"\b(CUDNN_(?:ACTIVATION|SOFTMAX|POOLING)_\w+)\s*=\s*(\d+)", text))
    ours = {n: getattr(cc, n) for n in cc.__all__ if re.match(r"CUDNN_(ACTIVATION|SOFTMAX|POOLING)_", n)}
    assert len(ours) == 16
    assert ours == {n: header[n] for n in ours}
    # and every value of those enums in the header is here
    assert set(header) == set(ours)


# ---- fuzz: random arguments against an oracle from PyTorch's rules -------------------------------------

SCALE = float(os.environ.get("PYCUDNN_FUZZ_SCALE", "1") or 1)
POOL_MODES = ["max", "max_deterministic", "average_include_padding", "average_exclude_padding"]
ACT_MODES = ["relu", "sigmoid", "tanh", "clipped_relu", "elu", "swish", "gelu", "gelu_tanh"]


def _geo_value(draw, nd):
    kind = draw(st.sampled_from(["int", "tuple", "tuple", "wrong-len", "bool", "float", "list"]))
    if kind == "int":
        return draw(st.integers(-1, 5))
    if kind == "tuple":
        return tuple(draw(st.integers(-1, 5)) for _ in range(nd))
    if kind == "list":
        return [draw(st.integers(0, 5)) for _ in range(nd)]
    if kind == "wrong-len":
        return tuple(draw(st.integers(1, 3)) for _ in range(draw(st.sampled_from([1, 3, 4])) if nd != 3 else 2))
    if kind == "bool":
        return True
    return 2.0


@st.composite
def pooling_cases(draw):
    rank = draw(st.sampled_from([3, 4, 4, 4, 5, 5, 6]))
    shape = tuple(draw(st.integers(0, 2)) for _ in range(2)) + tuple(
        draw(st.integers(0, 7)) for _ in range(rank - 2))
    nd = max(rank - 2, 1)
    kernel = _geo_value(draw, nd)
    stride = None if draw(st.booleans()) else _geo_value(draw, nd)
    padding = _geo_value(draw, nd)
    mode = draw(st.sampled_from(POOL_MODES + ["avg", "MAX", 0]))
    return shape, kernel, stride, padding, mode


def _as_tuple(v, nd):
    """The oracle's reading of a geometry argument: a tuple, or the parameter's violation."""
    if type(v) is int:
        return (v,) * nd
    if isinstance(v, (tuple, list)) and len(v) == 1 and type(v[0]) is int:
        return (v[0],) * nd  # PyTorch's one value for every dim
    if isinstance(v, (tuple, list)) and len(v) == nd and all(type(e) is int for e in v):
        return tuple(v)
    return None


def pooling_violations(shape, kernel, stride, padding, mode):
    """Every rule the case breaks, as words the error message must contain (PyTorch's rules)."""
    if len(shape) not in (4, 5):
        return ["expected x to have 4 dims"]
    nd = len(shape) - 2
    if min(shape[2:]) == 0:
        return ["non-zero spatial sizes"]
    out = []
    k = _as_tuple(kernel, nd)
    s = k if stride is None or stride in ((), []) else _as_tuple(stride, nd)
    p = _as_tuple(padding, nd)
    if k is None:
        out.append("kernel_size must be")
    if stride is not None and s is None:
        out.append("stride must be")
    if p is None:
        out.append("padding must be")
    if mode not in POOL_MODES:
        out.append("mode must be one of")
    if k is None or s is None or p is None:
        return out
    if min(k) < 1:
        out.append("kernel size should be greater than zero")
    if min(s) < 1:
        out.append("stride should be greater than zero")
    if min(p) < 0:
        out.append("pad must be non-negative")
    if min(k) >= 1 and min(s) >= 1 and min(p) >= 0:
        if any(2 * pi > ki for pi, ki in zip(p, k)):
            out.append("pad should be at most half of kernel size")
        elif any((i + 2 * pi - ki) // si + 1 < 1 for i, ki, si, pi in zip(shape[2:], k, s, p)):
            out.append("Output size is too small")
    return out


def _expected_shape(shape, kernel, stride, padding):
    nd = len(shape) - 2
    k = _as_tuple(kernel, nd)
    s = k if stride is None or stride in ((), []) else _as_tuple(stride, nd)
    p = _as_tuple(padding, nd)
    return shape[:2] + tuple((i + 2 * pi - ki) // si + 1 for i, ki, si, pi in zip(shape[2:], k, s, p))


@NO_GPU
@settings(max_examples=max(1, int(300 * SCALE)), deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(pooling_cases())
def test_fuzz_pooling_forward_and_backward(case):
    shape, kernel, stride, padding, mode = case
    x = t(*shape)
    violations = pooling_violations(*case)
    try:
        y = pooling_forward(x, kernel, stride=stride, padding=padding, mode=mode)
    except (ValueError, TypeError) as exc:
        assert violations, f"valid case refused: {exc}"
        assert any(v in str(exc) for v in violations), (str(exc), violations)
        assert str(exc).startswith("pooling_forward: ")
        return
    except pycudnn.NoDeviceError:
        assert not violations, f"accepted a case breaking {violations}"
        y = None
    else:
        assert not violations, f"accepted a case breaking {violations}"
        assert x.size == 0 and y.size == 0  # nothing to compute: no GPU needed
    expected = _expected_shape(shape, kernel, stride, padding)
    if y is not None:
        assert y.shape == expected
    yv, dyv = t(*expected, role="y"), t(*expected, role="dy")
    try:
        pooling_backward(yv, dyv, x, kernel, stride=stride, padding=padding, mode=mode)
    except pycudnn.NoDeviceError:
        assert x.size
    # and a dy of another shape is refused, naming dy
    bad = t(*(expected[:-1] + (expected[-1] + 1,)), role="dy")
    with pytest.raises(ValueError, match=r"pooling_backward: expected dy of size"):
        pooling_backward(yv, bad, x, kernel, stride=stride, padding=padding, mode=mode)


@st.composite
def elementwise_cases(draw):
    rank = draw(st.integers(0, 7))
    shape = tuple(draw(st.integers(0, 4)) for _ in range(rank))
    layout = draw(st.sampled_from(["contiguous", "permuted", "sliced", "broadcast"]))
    fn = draw(st.sampled_from(["activation", "softmax"]))
    mode = draw(st.sampled_from(ACT_MODES + ["identity", "softplus"]) if fn == "activation"
                else st.sampled_from(["channel", "instance", "spatial"]))
    extra = draw(st.sampled_from(["accurate", "fast", "log", "precise"]) if fn == "softmax"
                 else st.sampled_from([0.0, 1.5, -2, float("nan"), "1", True, np.float64(0.5)]))
    return shape, layout, fn, mode, extra


def _layout_strides(shape, layout):
    strides = list(contiguous_strides(shape))
    if layout == "permuted" and len(shape) >= 2:
        order = list(range(len(shape)))[::-1]
        acc = 1
        for d in reversed(order):
            strides[d] = acc
            acc *= max(shape[d], 1)
    elif layout == "sliced":
        strides = [s * 2 for s in strides]
    elif layout == "broadcast" and shape and shape[0] > 1:
        strides[0] = 0
    return tuple(strides)


@NO_GPU
@settings(max_examples=max(1, int(300 * SCALE)), deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(elementwise_cases())
def test_fuzz_activation_and_softmax(case):
    shape, layout, fn, mode, extra = case
    x = t(*shape, strides=_layout_strides(shape, layout))
    violations = []
    broadcast = any(s == 0 and n > 1 for n, s in zip(x.shape, x.strides)) and x.size
    if fn == "activation":
        if len(shape) > 5:
            violations.append("expected x to have 0 to 5 dims")
        elif broadcast:
            violations.append("without broadcast dims")
        if mode == "identity":
            violations.append("mode 'identity' is not supported")
        elif mode not in ACT_MODES:
            violations.append("mode must be one of")
        if isinstance(extra, (str, bool)):
            violations.append("coef must be a real number")
        elif isinstance(extra, float) and np.isnan(extra):
            violations.append("coef must be a number")
        call = lambda: activation_forward(x, mode, coef=extra)  # noqa: E731
        prefix = "activation_forward: "
    else:
        if not 2 <= len(shape) <= 5:
            violations.append("expected x to have 2 to 5 dims")
        elif broadcast:
            violations.append("without broadcast dims")
        if mode not in ("channel", "instance"):
            violations.append("mode must be one of")
        if extra not in ("accurate", "fast", "log"):
            violations.append("algorithm must be one of")
        call = lambda: softmax_forward(x, algorithm=extra, mode=mode)  # noqa: E731
        prefix = "softmax_forward: "
    try:
        y = call()
    except (ValueError, TypeError) as exc:
        assert violations, f"valid case refused: {exc}"
        assert any(v in str(exc) for v in violations), (str(exc), violations)
        assert str(exc).startswith(prefix)
        return
    except pycudnn.NoDeviceError:
        assert not violations and x.size, violations
        return
    assert not violations and x.size == 0 and y.shape == x.shape
