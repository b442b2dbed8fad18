"""pycudnn.cupy_compat without a GPU: CuPy 13's signatures, the NHWC views, the flag mapping and
argument checks (the convolutions themselves are replaced by a recorder; the GPU tests in
test_cupy_compat_gpu.py run them for real)."""

from __future__ import annotations

import inspect

import numpy
import pytest

import pycudnn
from pycudnn.api import conv as real_conv
from pycudnn import cupy_compat as cc

P, KO = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY

# CuPy 13, cupyx/cudnn.pyx: (name, kind, default or `required`)
REQ = inspect.Parameter.empty
CUPY13 = {
    "convolution_forward": [
        ("x", P, REQ), ("W", P, REQ), ("b", P, REQ), ("y", P, REQ), ("pad", P, REQ),
        ("stride", P, REQ), ("dilation", P, REQ), ("groups", P, REQ), ("auto_tune", KO, REQ),
        ("tensor_core", KO, REQ), ("d_layout", KO, 0), ("w_layout", KO, 0)],
    "convolution_backward_data": [
        ("W", P, REQ), ("x", P, REQ), ("b", P, REQ), ("y", P, REQ), ("pad", P, REQ),
        ("stride", P, REQ), ("dilation", P, REQ), ("groups", P, REQ), ("deterministic", KO, REQ),
        ("auto_tune", KO, REQ), ("tensor_core", KO, REQ), ("d_layout", KO, 0), ("w_layout", KO, 0)],
    "convolution_backward_filter": [
        ("x", P, REQ), ("gy", P, REQ), ("gW", P, REQ), ("pad", P, REQ), ("stride", P, REQ),
        ("dilation", P, REQ), ("groups", P, REQ), ("deterministic", KO, REQ), ("auto_tune", KO, REQ),
        ("tensor_core", KO, REQ), ("d_layout", KO, 0), ("w_layout", KO, 0)],
}


@pytest.mark.parametrize("name", sorted(CUPY13))
def test_signatures_are_cupy13s(name):
    params = inspect.signature(getattr(cc, name)).parameters.values()
    assert [(p.name, p.kind, p.default) for p in params] == CUPY13[name]


def test_constants():
    assert (cc.CUDNN_TENSOR_NCHW, cc.CUDNN_TENSOR_NHWC) == (0, 1)  # cudnnTensorFormat_t


class Recorder:
    """Stands in for the convolutions of pycudnn.api.conv: records each call."""

    NAMES = ("convolution", "convolution_backward_data", "convolution_backward_filter",
             "conv_transpose")

    def __init__(self):
        self.calls = []

    def recording(self, name):
        def record(*args, **kwargs):
            self.calls.append((name, args, kwargs))
        return record


@pytest.fixture
def rec(monkeypatch):
    r = Recorder()
    for name in Recorder.NAMES:
        monkeypatch.setattr(real_conv, name, r.recording(name))
    return r


def T(shape, strides=None, ptr=0x10000, dtype="float32"):
    return pycudnn.tensor_from_pointer(ptr, shape, dtype, strides=strides)


def test_forward_nchw(rec):
    x, w, b, y = T((2, 3, 8, 8)), T((4, 3, 3, 3)), T((4,)), T((2, 4, 4, 4))
    assert cc.convolution_forward(x, w, b, y, (1, 1), (2, 2), (1, 1), 1, auto_tune=False,
                                  tensor_core="auto") is None
    (name, args, kw), = rec.calls
    assert name == "convolution"
    assert args[0] is x and args[1] is w and args[2] is b
    assert kw["out"] is y
    assert kw["stride"] == (2, 2) and kw["padding"] == (1, 1) and kw["dilation"] == (1, 1)
    assert kw["groups"] == 1 and kw["stream"] == 0
    assert kw["benchmark"] is False and kw["allow_tf32"] is True and kw["deterministic"] is False
    assert "workspace_limit" not in kw


def test_forward_nhwc_views_without_copies(rec):
    # CuPy 13's NHWC arrays: x (N, H, W, C), W (K, R, S, C), y (N, OH, OW, K), all C-contiguous
    x = T((2, 8, 6, 3), ptr=0x20000)
    w = T((4, 3, 3, 3), ptr=0x30000)
    y = T((2, 8, 6, 4), ptr=0x40000)
    cc.convolution_forward(x, w, None, y, (1, 1), (1, 1), None, 1, auto_tune=True,
                           tensor_core="never", d_layout=cc.CUDNN_TENSOR_NHWC,
                           w_layout=cc.CUDNN_TENSOR_NHWC)
    (_name, args, kw), = rec.calls
    xv, wv, bv = args
    yv = kw["out"]
    assert bv is None
    assert (xv.ptr, xv.shape, xv.strides) == (0x20000, (2, 3, 8, 6), (144, 1, 18, 3))
    assert (wv.ptr, wv.shape, wv.strides) == (0x30000, (4, 3, 3, 3), (27, 1, 9, 3))
    assert (yv.ptr, yv.shape, yv.strides) == (0x40000, (2, 4, 8, 6), (192, 1, 24, 4))
    assert xv.memory_format == wv.memory_format == yv.memory_format == "channels_last"
    assert xv.owner is x  # a view: the original stays alive
    assert kw["dilation"] == (1, 1)  # None means ones
    assert kw["benchmark"] is True and kw["allow_tf32"] is False


def test_mixed_layouts_and_strided_nhwc(rec):
    # data NHWC viewed from a strided (sliced) array; filter NCHW
    x = T((2, 8, 6, 3), strides=(300, 30, 5, 1))
    y = T((2, 8, 6, 4))
    w = T((4, 3, 3, 3))
    cc.convolution_forward(x, w, None, y, (1, 1), (1, 1), (1, 1), 1, auto_tune=False,
                           tensor_core="always", d_layout=cc.CUDNN_TENSOR_NHWC)
    (_name, (xv, wv, _b), kw), = rec.calls
    assert xv.shape == (2, 3, 8, 6) and xv.strides == (300, 1, 30, 5)
    assert wv is w and kw["allow_tf32"] is True


def test_layout_ignored_for_other_ranks_like_cupy(rec):
    x, w, y = T((2, 3, 4, 8, 8)), T((4, 3, 3, 3, 3)), T((2, 4, 2, 6, 6))
    cc.convolution_forward(x, w, None, y, (0, 0, 0), (1, 1, 1), (1, 1, 1), 1, auto_tune=False,
                           tensor_core="auto", d_layout=cc.CUDNN_TENSOR_NHWC)
    (_name, (xv, _w, _b), kw), = rec.calls
    assert xv is x and kw["out"] is y
    with pytest.raises(ValueError, match="needs a 4-D filter"):
        cc.convolution_forward(x, w, None, y, (0, 0, 0), (1, 1, 1), (1, 1, 1), 1, auto_tune=False,
                               tensor_core="auto", w_layout=cc.CUDNN_TENSOR_NHWC)


def test_bias_reshaped_to_one_value_per_channel(rec):
    x, w, y = T((2, 3, 8, 8)), T((4, 3, 3, 3)), T((2, 4, 6, 6))
    b = T((1, 4, 1, 1), ptr=0x50000)
    cc.convolution_forward(x, w, b, y, (0, 0), (1, 1), (1, 1), 1, auto_tune=False,
                           tensor_core="auto")
    bv = rec.calls[0][1][2]
    assert (bv.ptr, bv.shape, bv.strides) == (0x50000, (4,), (1,))
    with pytest.raises(ValueError, match="one value per channel"):
        cc.convolution_forward(x, w, T((4, 2), strides=(4, 1)), y, (0, 0), (1, 1), (1, 1), 1,
                               auto_tune=False, tensor_core="auto")


def test_backward_data_without_and_with_bias(rec):
    w, gy, gx = T((4, 3, 3, 3)), T((2, 4, 4, 4)), T((2, 3, 8, 8))
    cc.convolution_backward_data(w, gy, None, gx, (1, 1), (2, 2), (1, 1), 1, deterministic=True,
                                 auto_tune=False, tensor_core="auto")
    name, args, kw = rec.calls[-1]
    assert name == "convolution_backward_data"
    assert args == (gy, w, (2, 3, 8, 8)) and kw["out"] is gx and kw["deterministic"] is True
    b = T((3,))
    cc.convolution_backward_data(w, gy, b, gx, (1, 1), (2, 2), (1, 1), 1, deterministic=False,
                                 auto_tune=True, tensor_core="auto")
    name, args, kw = rec.calls[-1]
    # (4 - 1) * 2 - 2 + 2 + 1 = 7, so an output padding of 1 makes the 8 of gx
    assert name == "conv_transpose" and args == (gy, w, b) and kw["output_padding"] == (1, 1)
    assert kw["out"] is gx and kw["benchmark"] is True
    gx7 = T((2, 3, 7, 7))
    cc.convolution_backward_data(w, gy, b, gx7, (1, 1), (2, 2), (1, 1), 1, deterministic=False,
                                 auto_tune=False, tensor_core="auto")
    assert rec.calls[-1][2]["output_padding"] == (0, 0)
    with pytest.raises(ValueError, match="forward output of spatial size"):
        cc.convolution_backward_data(w, gy, b, T((2, 3, 12, 12)), (1, 1), (2, 2), (1, 1), 1,
                                     deterministic=False, auto_tune=False, tensor_core="auto")


def test_backward_data_nhwc(rec):
    w, gy, gx = T((4, 3, 3, 3)), T((2, 4, 4, 4)), T((2, 8, 8, 3))
    cc.convolution_backward_data(w, gy, None, gx, (1, 1), (2, 2), (1, 1), 1, deterministic=False,
                                 auto_tune=False, tensor_core="auto", d_layout=1, w_layout=1)
    _name, (gyv, wv, shape), kw = rec.calls[-1]
    assert shape == (2, 3, 8, 8) and kw["out"].strides == (192, 1, 24, 3)
    assert gyv.strides == (64, 1, 16, 4) and wv.strides == (27, 1, 9, 3)


@pytest.fixture
def restore_workspace_bound():
    saved = cc.get_max_workspace_size()
    yield
    cc.set_max_workspace_size(saved)


def test_backward_filter(rec, restore_workspace_bound):
    x, gy, gw = T((2, 8, 8, 3)), T((2, 8, 8, 4)), T((4, 3, 3, 3))
    cc.set_max_workspace_size(1 << 20)
    assert cc.get_max_workspace_size() == 1 << 20
    cc.convolution_backward_filter(x, gy, gw, (1, 1), (1, 1), (1, 1), 1, deterministic=True,
                                   auto_tune=False, tensor_core="never", d_layout=1)
    name, (xv, gyv, shape), kw = rec.calls[-1]
    assert name == "convolution_backward_filter" and shape == (4, 3, 3, 3) and kw["out"] is gw
    assert xv.shape == (2, 3, 8, 8) and gyv.shape == (2, 4, 8, 8)
    assert kw["workspace_limit"] == 1 << 20 and kw["deterministic"] is True
    assert kw["allow_tf32"] is False
    cc.set_max_workspace_size(None)
    assert cc.get_max_workspace_size() == cc.UNBOUNDED_WORKSPACE  # an int, as CuPy's
    cc.set_max_workspace_size(cc.get_max_workspace_size() * 4)  # CuPy 13 code does this
    assert cc.get_max_workspace_size() == cc.UNBOUNDED_WORKSPACE
    cc.convolution_backward_filter(x, gy, gw, (1, 1), (1, 1), (1, 1), 1, deterministic=False,
                                   auto_tune=False, tensor_core="auto", d_layout=1)
    assert "workspace_limit" not in rec.calls[-1][2]  # no bound
    cc.set_max_workspace_size(numpy.int64(1 << 21))  # NumPy integers, as CuPy's size_t took
    assert cc.get_max_workspace_size() == 1 << 21
    with pytest.raises(ValueError):
        cc.set_max_workspace_size(-1)
    with pytest.raises(ValueError):
        cc.set_max_workspace_size(1.5)


def test_argument_errors(rec):
    x, w, y = T((2, 3, 8, 8)), T((4, 3, 3, 3)), T((2, 4, 6, 6))
    kw = dict(auto_tune=False, tensor_core="auto")
    with pytest.raises(ValueError, match='"always", "auto", or "never"'):
        cc.convolution_forward(x, w, None, y, (0, 0), (1, 1), (1, 1), 1, auto_tune=False,
                               tensor_core="sometimes")
    with pytest.raises(ValueError, match="unknown cudnnTensorFormat: 2"):
        cc.convolution_forward(x, w, None, y, (0, 0), (1, 1), (1, 1), 1, d_layout=2, **kw)
    with pytest.raises(ValueError, match="pad and stride must be of same length"):
        cc.convolution_forward(x, w, None, y, (0, 0, 0), (1, 1), (1, 1), 1, **kw)
    with pytest.raises(TypeError, match="pad: expected a tuple"):
        cc.convolution_forward(x, w, None, y, 0, (1, 1), (1, 1), 1, **kw)
    with pytest.raises(TypeError, match="auto_tune"):
        cc.convolution_forward(x, w, None, y, (0, 0), (1, 1), (1, 1), 1, tensor_core="auto")
    assert rec.calls == []


def test_real_validation_runs_before_any_gpu_work():
    """With the real pycudnn.api.conv: a wrong output shape is refused in Python (no GPU needed)."""
    x, w = T((2, 3, 8, 8)), T((4, 3, 3, 3))
    with pytest.raises(ValueError, match="out: expected shape"):
        cc.convolution_forward(x, w, None, T((2, 4, 5, 5)), (0, 0), (1, 1), (1, 1), 1,
                               auto_tune=False, tensor_core="auto")
    with pytest.raises(ValueError, match="expected grad_y of size"):
        cc.convolution_backward_filter(x, T((2, 4, 5, 5)), T((4, 3, 3, 3)), (0, 0), (1, 1),
                                       (1, 1), 1, deterministic=False, auto_tune=False,
                                       tensor_core="auto")
