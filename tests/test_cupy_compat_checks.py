"""The CuPy 13 drop-in's own logic without a GPU: which buffers batch norm's training call
writes and copies back, and which pooling geometries it accepts (none with a window that holds
no input element).

Views point at made-up device addresses; for batch norm the GPU pieces (allocation, the copy
kernel, the batch-norm launch) are replaced by recorders, since what is checked is which
buffer is handed to the launch and what is copied back afterwards. The values are checked on a
GPU by tests/test_cupy_compat_bn_gpu.py.
"""

from __future__ import annotations

import pytest

from pycudnn import cupy_compat as cc
from pycudnn.ops import batchnorm, pooling
from pycudnn.runtime.tensor import tensor_from_pointer

BASE = 1 << 36


class _Recorder:
    def __init__(self, monkeypatch):
        self.next = 1 << 40
        self.copies: list[tuple[int, int, str, str]] = []
        self.seen: dict = {}
        monkeypatch.setattr(cc.normalization, "new_tensor", self.new)
        monkeypatch.setattr(cc.normalization, "bn_copy", self.copy)
        monkeypatch.setattr(cc.normalization, "bn_module", lambda: self)

    def new(self, shape, dtype, like, stream):
        self.next += 1 << 20
        return tensor_from_pointer(self.next, tuple(shape), dtype, device=like.device)

    def copy(self, src, dst, stream):
        self.copies.append((src.ptr, dst.ptr, src.dtype.name, dst.dtype.name))

    def batch_norm_forward_training(self, xv, g, b, rm, rv, *, momentum, eps, mode, out,
                                    save_mean, save_invstd, stream):
        self.seen.update(save_mean=save_mean, save_invstd=save_invstd)
        return batchnorm.BatchNormResult(out, save_mean, save_invstd, None)


def _bn_args(dtype, pshape=(8,), pstrides=None):
    c = 8
    x = tensor_from_pointer(BASE, (4, c, 5, 5), dtype)
    p = [tensor_from_pointer(BASE + (1 << 24) + i * 4096, (c,), dtype) for i in range(4)]
    out = [tensor_from_pointer(BASE + (1 << 25) + i * 4096, pshape, dtype, strides=pstrides)
           for i in range(2)]
    return x, p, out


@pytest.mark.parametrize("fn", ["batch_normalization_forward_training",
                                "batch_normalization_forward_training_ex"])
@pytest.mark.parametrize("layout", ["float16", "float32 non-contiguous 2-D"])
def test_training_copies_mean_and_inv_std_back_into_the_callers_arrays(monkeypatch, fn, layout):
    rec = _Recorder(monkeypatch)
    if layout == "float16":
        x, (g, b, rm, rv), (mean, inv_std) = _bn_args("float16")
    else:  # (2, 4) viewed with transposed strides: cuDNN gets a dense copy
        x, (g, b, rm, rv), (mean, inv_std) = _bn_args("float32", (2, 4), (1, 2))
    getattr(cc, fn)(x, g, b, rm, rv, mean, inv_std, 1e-5, 0.9, True, cc.CUDNN_BATCHNORM_SPATIAL,
                    False)
    sm, si = rec.seen["save_mean"], rec.seen["save_invstd"]
    for launched, caller in ((sm, mean), (si, inv_std)):
        assert launched.dtype.name == "float32"
        assert launched.ptr != caller.ptr  # a converted (or dense) temporary ...
        back = [c for c in rec.copies if c[0] == launched.ptr and c[1] == caller.ptr]
        assert len(back) == 1, rec.copies  # ... copied back into the caller's array once
        assert back[0][3] == caller.dtype.name


def test_training_writes_float32_mean_and_inv_std_directly(monkeypatch):
    rec = _Recorder(monkeypatch)
    x, (g, b, rm, rv), (mean, inv_std) = _bn_args("float32")
    cc.batch_normalization_forward_training_ex(x, g, b, rm, rv, mean, inv_std, 1e-5, 0.9, True,
                                               cc.CUDNN_BATCHNORM_SPATIAL, False)
    assert rec.seen["save_mean"].ptr == mean.ptr
    assert rec.seen["save_invstd"].ptr == inv_std.ptr
    assert rec.copies == []


# ---- cover_all pooling: every window holds an input element ---------------------------------------

def _pool(x_shape, y_shape):
    return (tensor_from_pointer(BASE, x_shape, "float32"),
            tensor_from_pointer(BASE + (1 << 30), y_shape, "float32"))


@pytest.mark.parametrize("fn", ["pooling_forward", "pooling_backward"])
def test_cover_all_window_past_the_input_is_refused_naming_y(fn):
    # x 4x4, ksize 2, stride 3, pad 1: Chainer's cover_all size 3x3 puts window 2 on rows 5..6
    x, y = _pool((1, 1, 4, 4), (1, 1, 3, 3))
    assert cc.operations.pooling_rule(x, y, (2, 2), (3, 3), (1, 1), fn, "y") == "window"
    call = (lambda: cc.pooling_forward(x, y, (2, 2), (3, 3), (1, 1), cc.CUDNN_POOLING_MAX)) \
        if fn == "pooling_forward" else \
        (lambda: cc.pooling_backward(x, y, y, (2, 2), (3, 3), (1, 1), cc.CUDNN_POOLING_MAX))
    with pytest.raises(ValueError, match=r"y of size \[1, 1, 3, 3\].*holds no input element.*"
                                         r"pass y of size \[1, 1, 2, 2\]"):
        call()


def test_cover_all_keeps_windows_that_hold_an_input_element():
    # x 5x5, ksize 2, stride 2: cover_all 3x3, the last window covers row 4 (an input row)
    x, y = _pool((1, 1, 5, 5), (1, 1, 3, 3))
    rule = cc.operations.pooling_rule(x, y, (2, 2), (2, 2), (0, 0), "pooling_forward", "y")
    assert rule == "window_cover_all"
    k, s, p, out = pooling.pooling_geometry(x, (2, 2), (2, 2), (0, 0), "pooling_forward", rule)
    assert out == (1, 1, 3, 3)


@pytest.mark.parametrize("i,k,s,p", [(i, k, s, p) for i in range(1, 9) for k in range(1, 4)
                                     for s in range(1, 5) for p in range(0, k)])
def test_accepted_cover_all_geometries_have_no_empty_window(i, k, s, p):
    x, _ = _pool((1, 1, i, i), (1, 1, 1, 1))
    cover = pooling.output_size((i, i), (k, k), (s, s), (p, p), cover_all=True)
    if min(cover) < 1:
        return
    _, y = _pool((1, 1, i, i), (1, 1) + cover)
    rule = cc.operations.pooling_rule(x, y, (k, k), (s, s), (p, p), "pooling_forward", "y")
    if rule != "window_cover_all":
        return
    for o in range(cover[0]):  # brute force: each window has a row inside [0, i)
        assert any(0 <= r < i for r in range(o * s - p, o * s - p + k)), (o, i, k, s, p)
