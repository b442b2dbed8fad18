"""CPU tests of PreparedConvolution's argument checks (bias, z and out of a fused epilogue).

A prepared convolution must check its epilogue tensors exactly as the full path does, and refuse
(nothing launched) what the full path refuses. There is no GPU here: the launch is replaced by a
recorder of what ``cudnnBackendExecute`` would be given, and the tensors are views of made-up
device addresses that are never touched. The GPU twins are in test_prepared_gpu.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from pycudnn.api import conv as C
from pycudnn.api import prepared as P
from pycudnn.cudnn import tensor_ops
from pycudnn.engines.problem import ConvolutionParams
from pycudnn.runtime.tensor import tensor_from_pointer
from scripted_engine import ScriptedEngine

F32 = np.dtype("float32")
SHAPES = {"x": (1, 8, 32, 32), "w": (16, 8, 3, 3), "y": (1, 16, 30, 30), "b": (16,),
          "z": (1, 16, 30, 30)}
STRIDES = {"x": (8192, 1024, 32, 1), "w": (72, 9, 3, 1), "y": (14400, 900, 30, 1), "b": (1,),
           "z": (14400, 900, 30, 1)}
OUT_BYTES = 16 * 30 * 30 * 4
NEW_OUT = 0x7F0000000000  # where the output is "allocated" when none is given


class _Record:
    workspace = 0
    time_ms = -1.0
    source = "test"

    def describe(self) -> str:
        return "a recorded launch"


class _Recorder(ScriptedEngine):
    """An engine whose launches record the pointers cudnnBackendExecute would be given."""

    def __init__(self, launched: list) -> None:
        self.launched = launched

    def launch(self, params, record, handle, pointers, stream):
        self.launched.append(pointers)


class _Buf:
    ptr = NEW_OUT


def _params(epilogue: str) -> ConvolutionParams:
    return ConvolutionParams(
        direction="forward", device=0, cudnn_version=92800, dtype="float32",
        input_shape=SHAPES["x"], input_strides=STRIDES["x"], weight_shape=SHAPES["w"],
        weight_format="NCHW", output_shape=SHAPES["y"], output_strides=STRIDES["y"],
        padding=(0, 0), stride=(1, 1), dilation=(1, 1), groups=1, deterministic=False,
        allow_tf32=True, workspace_limit=None, engine="graph", epilogue=epilogue,
        z_strides=STRIDES["z"] if epilogue == "add_relu" else None, alignments=(16,) * 5)


def _slow(*args, **kwargs):
    raise AssertionError("a refused call must not reach the full path either")


def T(ptr: int, name: str, device: int = 0, strides=None, dtype=F32):
    return tensor_from_pointer(ptr, SHAPES[name], dtype, strides or STRIDES[name], device=device)


@pytest.fixture
def launched(monkeypatch):
    """What the prepared convolutions launched (one tuple of pointers per launch)."""
    monkeypatch.setattr(P, "get_handle", lambda device, stream: 0x1234)
    monkeypatch.setattr(P, "callers_device", lambda: None)
    monkeypatch.setattr(P, "restore_device", lambda prev: None)
    monkeypatch.setattr(P, "allocate_fast", lambda n, dev, s, ref=None: _Buf())
    return []


def _prepared(launched, epilogue: str = "bias"):
    has_z = epilogue == "add_relu"
    has_bias = epilogue in ("bias", "add_relu")
    return P.PreparedConvolution(_params(epilogue), _Record(), _Recorder(launched), F32, SHAPES, STRIDES,
                                 _slow, has_bias=has_bias, has_z=has_z, out_size_bytes=OUT_BYTES)


X, W = T(0x10000000, "x"), T(0x20000000, "w")


def test_dense_bias_is_launched_as_given(launched):
    conv = _prepared(launched)
    conv(X, W, bias=T(0x30000000, "b"))
    assert launched == [(X.ptr, W.ptr, NEW_OUT, 0x30000000)]


def test_strided_bias_is_copied_dense_first_as_the_full_path_does(launched, monkeypatch):
    """The fused plan reads K contiguous elements: a bias of stride 2 read as is would be the
    first K elements of its buffer. Like the full path, the prepared call copies it on the call's
    stream and launches with the copy."""
    copies = []
    staged = tensor_from_pointer(0x31000000, (16,), F32, device=0)
    monkeypatch.setattr(tensor_ops, "get_handle", lambda device, stream: 0x1234)
    monkeypatch.setattr(tensor_ops, "empty", lambda shape, dtype, device=None, stream=None: staged)
    monkeypatch.setattr(tensor_ops, "transform", lambda handle, src, dst: copies.append((src, dst)))
    conv = _prepared(launched)
    strided = tensor_from_pointer(0x30000000, (16,), F32, strides=(2,), device=0)
    conv(X, W, bias=strided, stream=7)
    assert len(copies) == 1
    src, dst = copies[0]
    assert (src.ptr, src.strides[1]) == (0x30000000, 2) and dst.ptr == staged.ptr
    assert launched == [(X.ptr, W.ptr, NEW_OUT, staged.ptr)]


@pytest.mark.parametrize("epilogue", ["bias", "add_relu"])
def test_bias_on_another_device_is_refused(launched, epilogue):
    conv = _prepared(launched, epilogue)
    z = T(0x60000000, "z") if epilogue == "add_relu" else None
    with pytest.raises(ValueError, match=r"bias to be on the input's device \(cuda:0\), but got bias on cuda:1"):
        conv(X, W, z=z, bias=tensor_from_pointer(0x40000000, (16,), F32, device=1))
    assert launched == []


@pytest.mark.parametrize("bias, error, words", [
    (tensor_from_pointer(0x40000000, (15,), F32), ValueError, r"1-dimensional with 16 elements.* \[15\]"),
    (tensor_from_pointer(0x40000000, (16, 1), F32), ValueError, "1-dimensional with 16 elements"),
    (tensor_from_pointer(0x40000000, (16,), "float16"), TypeError,
     r"bias type \(float16\) and input type \(float32\)"),
])
def test_bad_bias_is_refused_with_the_full_paths_words(launched, bias, error, words):
    with pytest.raises(error, match=words):
        _prepared(launched)(X, W, bias=bias)
    with pytest.raises(error, match=words):  # the full path's own check says the same
        C.convolution(X, W, bias=bias)
    assert launched == []


def test_z_on_another_device_is_refused(launched):
    conv = _prepared(launched, "add_relu")
    with pytest.raises(ValueError, match="z to be on the same device.* z on cuda:1"):
        conv(X, W, z=T(0x60000000, "z", device=1))
    assert launched == []


@pytest.mark.parametrize("z, error, words", [
    (None, ValueError, r"expected z of size \[1, 16, 30, 30\].* got None"),
    (tensor_from_pointer(0x60000000, (1, 16, 30, 29), F32), ValueError, r"expected z of size \[1, 16, 30, 30\]"),
    (T(0x60000000, "z", dtype="float16"), TypeError, r"input type \(float32\) and z type \(float16\)"),
    (T(0x60000000, "z", strides=(14400, 1, 480, 16)), ValueError,
     r"z with strides \[14400, 900, 30, 1\].* got z with strides \[14400, 1, 480, 16\]"),
])
def test_bad_z_is_refused(launched, z, error, words):
    with pytest.raises(error, match=words):
        _prepared(launched, "add_relu")(X, W, z=z)
    assert launched == []


def test_out_partly_overlapping_z_is_refused_out_being_z_is_not(launched):
    conv = _prepared(launched, "add_relu")
    conv.default_bias = T(0x50000000, "b")
    z = T(0x60000000, "z")
    shifted = T(0x60000000 + 4 * 4 * 30, "y")  # z moved by 4 rows: most of their elements shared
    with pytest.raises(ValueError, match="out partially overlaps z, which it may replace in place"):
        conv(X, W, out=shifted, z=z)
    assert launched == []
    # out is z exactly: the in-place residual the full path allows too
    assert conv(X, W, out=T(0x60000000, "y"), z=z).ptr == z.ptr
    assert launched == [(X.ptr, W.ptr, z.ptr, z.ptr, 0x50000000)]


def test_out_overlapping_bias_is_refused(launched):
    conv = _prepared(launched)
    out = T(0x50000000, "y")
    with pytest.raises(ValueError, match="out overlaps bias"):
        conv(X, W, out=out, bias=tensor_from_pointer(0x50000000 + 64, (16,), F32, device=0))
    assert launched == []


@pytest.mark.parametrize("given", ["bias", "z"])
def test_epilogue_tensor_given_to_a_convolution_prepared_without_it_is_refused(launched, given):
    """conv(x, w, bias=b) on a convolution prepared without a bias must not return conv(x, w)."""
    conv = _prepared(launched, "")
    kwargs = {"bias": T(0x70000000, "b")} if given == "bias" else {"z": T(0x71000000, "z")}
    with pytest.raises(ValueError, match=f"{given} was given, but this convolution was prepared without"):
        conv(X, W, **kwargs)
    assert launched == []


def test_z_given_to_a_bias_only_convolution_is_refused(launched):
    with pytest.raises(ValueError, match="z was given"):
        _prepared(launched)(X, W, bias=T(0x70000000, "b"), z=T(0x71000000, "z"))
    assert launched == []


def test_missing_bias_uses_the_made_up_zero_bias_or_is_refused(launched):
    conv = _prepared(launched, "add_relu")
    z = T(0x60000000, "z")
    with pytest.raises(ValueError, match=r"prepared with a bias; pass bias= \(a tensor of size \[16\]\)"):
        conv(X, W, z=z)
    assert launched == []
    conv.default_bias = T(0x50000000, "b")
    conv(X, W, z=z)
    assert launched == [(X.ptr, W.ptr, NEW_OUT, z.ptr, 0x50000000)]


def test_read_only_out_is_refused(launched):
    out = tensor_from_pointer(0x50000000, SHAPES["y"], F32, STRIDES["y"], device=0)
    out.readonly = True
    with pytest.raises(ValueError, match="prepared convolution: out: is read-only"):
        _prepared(launched)(X, W, out=out, bias=T(0x30000000, "b"))
    assert launched == []
