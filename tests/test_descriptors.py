"""Legacy cuDNN descriptors against the real libcudnn (no GPU needed)."""

from __future__ import annotations

import copy
import ctypes
import gc
import os
import pickle
import threading

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pycudnn.ffi import library as _lib
from pycudnn.cudnn import descriptors as D
from pycudnn._types import (ActivationMode, ConvolutionMode, DataType, MathType, NanPropagation,
                            OpTensorOp, TensorFormat)
from pycudnn.cudnn.descriptors import (ActivationDescriptor, ConvolutionDescriptor, FilterDescriptor,
                                 OpTensorDescriptor, TensorDescriptor, live_descriptor_count)
from pycudnn.errors import CudnnBadParamError, CudnnNotSupportedError

# one factory per descriptor kind, for tests that apply to all of them
KINDS = {
    "tensor": lambda: TensorDescriptor((2, 3, 8, 8), "float32"),
    "filter": lambda: FilterDescriptor((4, 3, 3, 3), "float16", "NHWC"),
    "convolution": lambda: ConvolutionDescriptor((1, 1), (1, 1), (1, 1)),
    "activation": lambda: ActivationDescriptor(),
    "optensor": lambda: OpTensorDescriptor(),
}


@pytest.fixture
def no_leak():
    """Asserts that the test leaves no C descriptor alive (also on its error paths)."""
    before = live_descriptor_count()
    yield
    if live_descriptor_count() != before:  # a traceback may hold a frame: collect, then judge
        gc.collect()
    assert live_descriptor_count() == before


class CCalls:
    """Every C descriptor this process's pycudnn creates and destroys while installed (the
    library's create and destroy functions wrapped): pycudnn's own allocations, counted exactly,
    whatever else the process or the machine does. cuDNN may hand out a freed address again, so
    the handles are followed in order: live from its create to its destroy."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.created = self.destroyed = 0
        self.live: set[int] = set()
        self.errors: list[str] = []
        L = _lib.lib()
        for cls in {type(make()) for make in KINDS.values()}:
            create, destroy = getattr(L, cls._create_name), getattr(L, cls._destroy_name)
            monkeypatch.setattr(L, cls._create_name, self._creating(create))
            monkeypatch.setattr(L, cls._destroy_name, self._destroying(destroy))

    def _creating(self, create):
        def wrapped(pointer):
            status = create(pointer)
            if not status:
                self.created += 1
                self.live.add(pointer._obj.value)
            return status
        return wrapped

    def _destroying(self, destroy):
        def wrapped(handle):
            self.destroyed += 1
            if handle in self.live:
                self.live.remove(handle)
            else:
                self.errors.append(f"destroyed {handle:#x}, not a live descriptor made here")
            return destroy(handle)
        return wrapped

    def assert_balanced(self) -> None:
        """Each descriptor created was destroyed, once."""
        assert not self.errors, self.errors[:3]
        assert not self.live, f"{len(self.live)} of {self.created} C descriptors never destroyed"
        assert self.created == self.destroyed


def expected_out(i: int, k: int, p: int, s: int, d: int) -> int:
    return (i + 2 * p - d * (k - 1) - 1) // s + 1


# ---- creation and repr --------------------------------------------------------------------------

def test_tensor_repr_reads_cudnn(no_leak):
    with TensorDescriptor((2, 3, 8, 8), "float32") as t:
        assert repr(t) == ("TensorDescriptor(dtype=CUDNN_DATA_FLOAT, dims=[2, 3, 8, 8], "
                           "strides=[192, 64, 8, 1])")
        assert t.shape == (2, 3, 8, 8)
        assert t.strides == (192, 64, 8, 1)
        assert t.dtype == np.dtype("float32")
        assert t.ndim == 4
        assert isinstance(t.handle, int) and t.handle != 0
        assert not t.closed
        # what cuDNN holds, read through cudnnGetTensorNdDescriptor
        assert t.query() == (int(DataType.FLOAT), [2, 3, 8, 8], [192, 64, 8, 1])


@pytest.mark.parametrize("dtype, name, np_dtype", [
    ("float32", "CUDNN_DATA_FLOAT", np.float32),
    (np.float32, "CUDNN_DATA_FLOAT", np.float32),
    ("float", "CUDNN_DATA_FLOAT", np.float32),
    ("float16", "CUDNN_DATA_HALF", np.float16),
    (np.dtype("float16"), "CUDNN_DATA_HALF", np.float16),
    ("half", "CUDNN_DATA_HALF", np.float16),
    ("bfloat16", "CUDNN_DATA_BFLOAT16", ml_dtypes.bfloat16),
    (ml_dtypes.bfloat16, "CUDNN_DATA_BFLOAT16", ml_dtypes.bfloat16),
    ("float64", "CUDNN_DATA_DOUBLE", np.float64),
    ("double", "CUDNN_DATA_DOUBLE", np.float64),
])
def test_tensor_dtypes(dtype, name, np_dtype, no_leak):
    with TensorDescriptor((1, 2, 3), dtype) as t:
        assert t.dtype == np.dtype(np_dtype)
        assert f"dtype={name}," in repr(t)
    with FilterDescriptor((1, 2, 3), dtype) as w:
        assert w.dtype == np.dtype(np_dtype)
        assert f"dtype={name}," in repr(w)


def test_tensor_explicit_strides_channels_last(no_leak):
    # NHWC memory for an NCHW-ordered shape: strides in elements
    with TensorDescriptor([2, 3, 8, 8], "float16", strides=[192, 1, 24, 3]) as t:
        assert repr(t) == ("TensorDescriptor(dtype=CUDNN_DATA_HALF, dims=[2, 3, 8, 8], "
                           "strides=[192, 1, 24, 3])")


@pytest.mark.parametrize("nd", range(3, 9))
def test_tensor_accepts_3_to_8_dims(nd, no_leak):
    shape = tuple(range(2, 2 + nd))
    with TensorDescriptor(shape, "float32") as t:
        _, dims, strides = t.query()
        assert dims == list(shape)
        assert strides == list(np.array(np.zeros(shape, np.float32).strides) // 4)
    with FilterDescriptor(shape, "float32") as w:
        assert w.query()[2] == list(shape)


def test_tensor_broadcast_stride_zero_on_size_one_dim(no_leak):
    with TensorDescriptor((1, 4, 1, 1), "float32", strides=(0, 1, 0, 0)) as t:
        assert t.query()[2] == [0, 1, 0, 0]


def test_tensor_accepts_numpy_ints_and_returns_python_ints(no_leak):
    shape = np.array([2, 3, 4, 5], dtype=np.int64)
    with TensorDescriptor(shape, "float32", strides=np.array([60, 20, 5, 1])) as t:
        assert t.shape == (2, 3, 4, 5)
        assert all(type(v) is int for v in t.shape + t.strides)


def test_tensor_largest_int32_size(no_leak):
    # 2**31 - 1 elements spanned: the largest tensor cuDNN's legacy API describes
    with TensorDescriptor((2**31 - 1, 1, 1), "float16") as t:
        assert t.query()[1] == [2**31 - 1, 1, 1]


def test_filter_repr_and_formats(no_leak):
    with FilterDescriptor((8, 3, 5, 5), "float16", format="NHWC") as w:
        assert repr(w) == ("FilterDescriptor(dtype=CUDNN_DATA_HALF, dims=[8, 3, 5, 5], "
                           "format=CUDNN_TENSOR_NHWC)")
        assert w.format is TensorFormat.NHWC
        assert w.shape == (8, 3, 5, 5)
    with FilterDescriptor((8, 3, 5), "bfloat16") as w:
        assert repr(w) == ("FilterDescriptor(dtype=CUDNN_DATA_BFLOAT16, dims=[8, 3, 5], "
                           "format=CUDNN_TENSOR_NCHW)")
    for fmt in (TensorFormat.NHWC, 1, "nhwc"):
        with FilterDescriptor((8, 3, 5, 5), "float32", fmt) as w:
            assert w.format is TensorFormat.NHWC
            assert w.query()[1] == int(TensorFormat.NHWC)


def test_convolution_repr_reads_cudnn(no_leak):
    with ConvolutionDescriptor((1, 1), (1, 1), (1, 1), dtype="float16") as c:
        assert repr(c) == ("ConvolutionDescriptor(padding=[1, 1], stride=[1, 1], dilation=[1, 1], "
                           "groups=1, compute=CUDNN_DATA_FLOAT, math=CUDNN_TENSOR_OP_MATH)")
    with ConvolutionDescriptor([0, 2, 1], [1, 2, 3], [2, 1, 1], groups=4, dtype="float64",
                               mode=ConvolutionMode.CONVOLUTION) as c:
        assert repr(c) == ("ConvolutionDescriptor(padding=[0, 2, 1], stride=[1, 2, 3], "
                           "dilation=[2, 1, 1], groups=4, compute=CUDNN_DATA_DOUBLE, "
                           "math=CUDNN_DEFAULT_MATH, mode=CUDNN_CONVOLUTION)")
        assert c.padding == (0, 2, 1) and c.stride == (1, 2, 3) and c.dilation == (2, 1, 1)
        assert c.groups == 4 and c.spatial_dims == 3 and c.mode is ConvolutionMode.CONVOLUTION
        assert c.query() == ([0, 2, 1], [1, 2, 3], [2, 1, 1], int(ConvolutionMode.CONVOLUTION),
                              int(DataType.DOUBLE), 4, int(MathType.DEFAULT_MATH))


@pytest.mark.parametrize("dtype, allow_tf32, math, compute", [
    ("float16", True, MathType.TENSOR_OP_MATH, DataType.FLOAT),
    ("float16", False, MathType.TENSOR_OP_MATH, DataType.FLOAT),
    ("bfloat16", True, MathType.TENSOR_OP_MATH, DataType.FLOAT),
    ("bfloat16", False, MathType.TENSOR_OP_MATH, DataType.FLOAT),
    ("float32", True, MathType.DEFAULT_MATH, DataType.FLOAT),
    ("float32", False, MathType.FMA_MATH, DataType.FLOAT),
    ("float64", True, MathType.DEFAULT_MATH, DataType.DOUBLE),
    ("float64", False, MathType.DEFAULT_MATH, DataType.DOUBLE),
])
def test_convolution_math_and_compute_type(dtype, allow_tf32, math, compute, no_leak):
    with ConvolutionDescriptor((0, 0), (1, 1), (1, 1), dtype=dtype, allow_tf32=allow_tf32) as c:
        assert c.math_type is math  # read back through cudnnGetConvolutionMathType
        assert c.compute_type is compute
        assert c.allow_tf32 is allow_tf32
        assert c.query()[4] == int(compute)


def test_convolution_math_type_setter(no_leak):
    with ConvolutionDescriptor((1, 1), (1, 1), (1, 1), dtype="float32") as c:
        c.math_type = MathType.TENSOR_OP_MATH_ALLOW_CONVERSION
        assert c.math_type is MathType.TENSOR_OP_MATH_ALLOW_CONVERSION
        c.math_type = 3  # an algorithm record's plain int
        assert c.math_type is MathType.FMA_MATH
        assert "math=CUDNN_FMA_MATH" in repr(c)
        with pytest.raises(ValueError, match=r"math_type: expected one of MathType's members .* got 9"):
            c.math_type = 9
        assert c.math_type is MathType.FMA_MATH


def test_activation_and_optensor(no_leak):
    with ActivationDescriptor() as a:
        assert repr(a) == ("ActivationDescriptor(mode=CUDNN_ACTIVATION_RELU, "
                           "nan=CUDNN_NOT_PROPAGATE_NAN, coef=0.0)")
    with ActivationDescriptor("clipped_relu", NanPropagation.PROPAGATE_NAN, 6) as a:
        assert a.query() == (int(ActivationMode.CLIPPED_RELU), 1, 6.0)
        assert a.mode is ActivationMode.CLIPPED_RELU and a.coef == 6.0
        assert a.nan_propagation is NanPropagation.PROPAGATE_NAN
    with OpTensorDescriptor() as o:
        assert repr(o) == ("OpTensorDescriptor(op=CUDNN_OP_TENSOR_ADD, compute=CUDNN_DATA_FLOAT, "
                           "nan=CUDNN_NOT_PROPAGATE_NAN)")
    for dtype, compute in (("float16", DataType.FLOAT), ("bfloat16", DataType.FLOAT),
                           ("float32", DataType.FLOAT), ("float64", DataType.DOUBLE)):
        with OpTensorDescriptor(OpTensorOp.MUL, dtype) as o:
            assert o.query() == (int(OpTensorOp.MUL), int(compute), 0)
            assert o.compute_type is compute and o.op is OpTensorOp.MUL


# ---- lifetime -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_close_double_close_and_use_after_close(kind, no_leak):
    before = live_descriptor_count()
    d = KINDS[kind]()
    assert live_descriptor_count() == before + 1
    handle = d.handle
    d.close()
    assert d.closed
    assert live_descriptor_count() == before
    d.close()  # no-op
    assert live_descriptor_count() == before
    name = type(d).__name__
    assert repr(d) == f"{name}(<closed>)"
    with pytest.raises(ValueError, match=rf"{name} is closed"):
        d.handle
    # passing the object itself to a C function: ctypes asks _as_parameter_, which refuses
    destroy = getattr(_lib.lib(), f"cudnnDestroy{name}")  # cudnnDestroyTensorDescriptor, ...
    with pytest.raises(ctypes.ArgumentError, match=rf"{name} is closed"):
        destroy(d)
    assert handle != 0


def test_use_after_close_in_methods(no_leak):
    x = TensorDescriptor((1, 3, 8, 8), "float32")
    w = FilterDescriptor((4, 3, 3, 3), "float32")
    c = ConvolutionDescriptor((1, 1), (1, 1), (1, 1))
    assert c.output_shape(x, w) == (1, 4, 8, 8)
    x.close()
    with pytest.raises(ValueError, match="TensorDescriptor is closed"):
        c.output_shape(x, w)
    c.close()
    with pytest.raises(ValueError, match="ConvolutionDescriptor is closed"):
        c.math_type
    with pytest.raises(ValueError, match="ConvolutionDescriptor is closed"):
        c.math_type = MathType.FMA_MATH
    with pytest.raises(ValueError, match="ConvolutionDescriptor is closed"):
        c.output_shape(TensorDescriptor((1, 3, 8, 8), "float32"), w)
    # Python-side attributes stay readable
    assert x.shape == (1, 3, 8, 8) and c.padding == (1, 1)
    w.close()


def test_context_manager_closes_on_error(no_leak):
    with pytest.raises(RuntimeError, match="boom"):
        with TensorDescriptor((1, 2, 3), "float32") as t:
            assert not t.closed
            raise RuntimeError("boom")
    assert t.closed


@pytest.mark.parametrize("kind", KINDS)
def test_dropping_the_last_reference_frees_at_once(kind):
    # No reference cycle: with the cyclic collector off, refcounting alone frees the C descriptor,
    # which proves the finalizer does not hold the object.
    gc.collect()
    before = live_descriptor_count()
    gc.disable()
    try:
        d = KINDS[kind]()
        assert live_descriptor_count() == before + 1
        del d
        assert live_descriptor_count() == before
    finally:
        gc.enable()


@pytest.mark.parametrize("kind", KINDS)
def test_finalizer_binds_only_function_handle_and_counter(kind, no_leak):
    d = KINDS[kind]()
    obj, func, args, kwargs = d._finalizer.peek()
    assert obj is d
    assert func is D._destroy
    destroy_fn, handle, counter = args
    assert handle == d.handle and type(handle) is int
    assert destroy_fn is getattr(_lib.lib(), f"cudnnDestroy{type(d).__name__}")
    assert counter is D._LIVE
    assert not kwargs
    assert d._finalizer.atexit is False
    d.close()
    assert d._finalizer.peek() is None


@pytest.mark.parametrize("kind", KINDS)
def test_copy_and_pickle_refused(kind, no_leak):
    d = KINDS[kind]()
    for action in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match="owns a cuDNN descriptor"):
            action(d)
    d.close()


@pytest.mark.parametrize("kind", KINDS)
def test_no_leak_over_many_descriptors(kind, monkeypatch):
    make = KINDS[kind]
    gc.collect()
    count0 = live_descriptor_count()
    calls = CCalls(monkeypatch)
    for i in range(20000):
        d = make()
        if i % 3 == 0:
            d.close()
        elif i % 3 == 1:
            with d:
                pass
        del d  # the third: its finalizer destroys it
    gc.collect()
    assert live_descriptor_count() == count0
    assert calls.created == 20000
    calls.assert_balanced()


def test_no_leak_when_cudnn_refuses(no_leak, monkeypatch):
    # every refusal destroys the freshly created C descriptor before raising
    def refusals():
        with pytest.raises(CudnnBadParamError):
            TensorDescriptor((1, -1, 4, 4), "float32", validate=False)
        with pytest.raises(CudnnBadParamError):
            ConvolutionDescriptor((1,), (1,), (1,), groups=0, validate=False)
        with pytest.raises(CudnnNotSupportedError):
            TensorDescriptor((2**30, 2, 1), "float32")

    before = live_descriptor_count()
    calls = CCalls(monkeypatch)
    for _ in range(2000):
        refusals()
    assert live_descriptor_count() == before
    assert calls.created == 6000  # each refusal made its descriptor first
    calls.assert_balanced()


def test_live_count_is_thread_safe(no_leak):
    before = live_descriptor_count()
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def work(k: int) -> None:
        try:
            start.wait()
            make = list(KINDS.values())[k % len(KINDS)]
            for _ in range(2000):
                make()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    gc.collect()
    assert live_descriptor_count() == before


# ---- output shapes ------------------------------------------------------------------------------

def _case(n, c, spatial, k, kernel, pad, stride, dil, groups=1):
    return (n, c, tuple(spatial), k, tuple(kernel), tuple(pad), tuple(stride), tuple(dil), groups)


OUTPUT_CASES = [
    # 1-D as 3-D (N, C, L): cuDNN 9 accepts 3-D tensors and filters for a 1-D convolution
    _case(2, 3, [10], 4, [3], [1], [1], [1]),
    _case(2, 3, [10], 4, [3], [0], [2], [1]),
    _case(1, 4, [17], 8, [5], [2], [3], [2], groups=2),
    _case(3, 6, [7], 6, [7], [0], [1], [1], groups=6),
    _case(1, 1, [1], 1, [1], [0], [1], [1]),
    _case(2, 2, [9], 2, [2], [3], [4], [3]),
    # 1-D as 4-D with a size-1 dim (N, C, 1, L)
    _case(2, 3, [1, 10], 4, [1, 3], [0, 1], [1, 1], [1, 1]),
    _case(2, 3, [1, 10], 4, [1, 3], [0, 0], [1, 2], [1, 1]),
    _case(1, 4, [1, 17], 8, [1, 5], [0, 2], [1, 3], [1, 2], groups=2),
    # 2-D
    _case(2, 3, [8, 8], 4, [3, 3], [1, 1], [1, 1], [1, 1]),
    _case(2, 3, [9, 9], 4, [3, 3], [1, 1], [2, 2], [1, 1]),
    _case(2, 3, [224, 224], 64, [7, 7], [3, 3], [2, 2], [1, 1]),
    _case(1, 8, [15, 11], 16, [3, 5], [0, 2], [2, 3], [2, 1], groups=4),
    _case(4, 32, [14, 14], 32, [3, 3], [1, 1], [1, 1], [1, 1], groups=32),
    _case(1, 2, [5, 6], 2, [5, 6], [0, 0], [1, 1], [1, 1]),
    _case(1, 3, [2, 2], 4, [3, 3], [1, 1], [1, 1], [1, 1]),
    _case(1, 4, [13, 13], 6, [3, 3], [4, 0], [3, 1], [3, 5], groups=2),
    _case(2, 6, [1, 1], 3, [1, 1], [0, 0], [1, 1], [1, 1], groups=3),
    # 3-D
    _case(1, 2, [8, 8, 8], 4, [3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1]),
    _case(2, 4, [9, 10, 11], 8, [3, 2, 1], [1, 0, 2], [2, 1, 3], [1, 2, 1], groups=2),
    _case(1, 3, [16, 16, 16], 3, [3, 3, 3], [2, 2, 2], [2, 2, 2], [2, 2, 2], groups=3),
    _case(1, 1, [5, 7, 9], 2, [5, 7, 9], [0, 0, 0], [1, 1, 1], [1, 1, 1]),
]


def _ids(case):
    n, c, spatial, k, kernel, pad, stride, dil, groups = case
    return f"{len(spatial)}d-x{spatial}-k{kernel}-p{pad}-s{stride}-d{dil}-g{groups}"


@pytest.mark.parametrize("case", OUTPUT_CASES, ids=_ids)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_output_shape_matches_formula(case, layout, no_leak):
    n, c, spatial, k, kernel, pad, stride, dil, groups = case
    x_shape = (n, c) + spatial
    w_shape = (k, c // groups) + kernel
    strides = None
    if layout == "NHWC":  # channels-last memory: C innermost
        nhwc = np.zeros((n,) + spatial + (c,), np.float32).strides
        strides = (nhwc[0] // 4, 1) + tuple(s // 4 for s in nhwc[1:-1])
    expected = (n, k) + tuple(expected_out(i, kk, p, s, d)
                              for i, kk, p, s, d in zip(spatial, kernel, pad, stride, dil))
    with TensorDescriptor(x_shape, "float32", strides) as x, \
            FilterDescriptor(w_shape, "float32", layout) as w, \
            ConvolutionDescriptor(pad, stride, dil, groups=groups) as conv:
        out = conv.output_shape(x, w)
        assert out == expected
        assert all(type(v) is int for v in out)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_output_shape_matches_formula_random(data):
    nsp = data.draw(st.integers(1, 3), label="spatial dims")
    groups = data.draw(st.integers(1, 4), label="groups")
    cpg = data.draw(st.integers(1, 3), label="channels per group")
    kpg = data.draw(st.integers(1, 3), label="filters per group")
    n = data.draw(st.integers(1, 4), label="batch")
    dims = []
    for _ in range(nsp):
        k = data.draw(st.integers(1, 5))
        d = data.draw(st.integers(1, 3))
        p = data.draw(st.integers(0, 3))
        s = data.draw(st.integers(1, 4))
        ext = d * (k - 1) + 1
        i = data.draw(st.integers(max(1, ext - 2 * p), 40))
        dims.append((i, k, p, s, d))
    x = TensorDescriptor((n, cpg * groups) + tuple(t[0] for t in dims), "float16")
    w = FilterDescriptor((kpg * groups, cpg) + tuple(t[1] for t in dims), "float16")
    conv = ConvolutionDescriptor([t[2] for t in dims], [t[3] for t in dims],
                                 [t[4] for t in dims], groups=groups, dtype="float16")
    expected = (n, kpg * groups) + tuple(expected_out(*t) for t in dims)
    assert conv.output_shape(x, w) == expected


# ---- bad inputs: Python-level checks -------------------------------------------------------------

BAD_TENSORS = [
    # (args, kwargs, exception, message pattern)
    (((1, -1, 4, 4), "float32"), {}, ValueError,
     r"shape: expected every size to be positive, got \(1, -1, 4, 4\)"),
    (((2, 0, 4, 4), "float32"), {}, ValueError,
     r"shape: expected every size to be positive, got \(2, 0, 4, 4\)"),
    (((2, 3), "float32"), {}, ValueError, r"shape: expected 3 to 8 dims .* got 2"),
    (((5,), "float32"), {}, ValueError, r"shape: expected 3 to 8 dims .* got 1"),
    (((1,) * 9, "float32"), {}, ValueError, r"shape: expected 3 to 8 dims .* got 9"),
    (((), "float32"), {}, ValueError, r"shape: expected 3 to 8 dims .* got 0"),
    (((1, 2, 3, 4), "int8"), {}, TypeError, r"dtype: unsupported dtype 'int8'"),
    (((1, 2, 3, 4), np.int8), {}, TypeError, r"dtype: unsupported dtype 'int8'"),
    (((1, 2, 3, 4), "complex64"), {}, TypeError, r"dtype: unsupported dtype 'complex64'"),
    (((1, 2, 3, 4), "float32", (24, 12, 4)), {}, ValueError,
     r"strides: expected 4 values \(one per dim\), got 3"),
    (((1, 2, 3, 4), "float32", (24, 12, -4, 1)), {}, ValueError,
     r"strides: expected every stride to be >= 0, got \(24, 12, -4, 1\)"),
    (((1, 2, 3, 4), "float32", (24, 12, 4, 0)), {}, ValueError,
     r"strides: a stride of 0 is only valid for a dim of size 1, got stride 0 for dim 3 of size 4"),
    (((1, 2.0, 3, 4), "float32"), {}, TypeError, r"shape: expected ints, got float 2.0 at index 1"),
    (((1, True, 3, 4), "float32"), {}, TypeError, r"shape: expected ints, got bool True at index 1"),
    (((1, np.bool_(True), 3, 4), "float32"), {}, TypeError, r"shape: expected ints, got bool"),
    (((1, 2, 3, 4), "float32", (24, 12, 4, 1.0)), {}, TypeError,
     r"strides: expected ints, got float 1.0 at index 3"),
    (((1, 2, 3, 4), "float32", (24, 12, 4, False)), {}, TypeError, r"strides: expected ints, got bool"),
    ((4, "float32"), {}, TypeError, r"shape: expected a sequence of ints, got int 4"),
    (("1234", "float32"), {}, TypeError, r"shape: expected a sequence of ints, got str"),
    (((2**31, 1, 1), "float32"), {}, ValueError,
     r"shape: expected every size to fit in int32 \(<= 2147483647\), got \(2147483648, 1, 1\)"),
    (((2, 1, 1), "float32", (2**31, 1, 1)), {}, ValueError,
     r"strides: expected every stride to fit in int32"),
    (((2, 2**16, 2**16, 1), "float32"), {}, ValueError,
     r"shape: \(2, 65536, 65536, 1\) is too large for cuDNN's int32 strides"),
    (((1, -1, 4, 4), "float32"), {"validate": False, "strides": (2**31, 1, 1, 1)}, ValueError,
     r"strides: expected every stride to fit in int32"),
]


@pytest.mark.parametrize("args, kwargs, exc, pattern", BAD_TENSORS,
                         ids=[p[:40] for *_, p in BAD_TENSORS])
def test_bad_tensor(args, kwargs, exc, pattern, no_leak):
    with pytest.raises(exc, match=pattern):
        TensorDescriptor(*args, **kwargs)


BAD_FILTERS = [
    (((4, 3), "float32"), {}, ValueError, r"shape: expected 3 to 8 dims .* got 2"),
    (((1,) * 9, "float32"), {}, ValueError, r"shape: expected 3 to 8 dims .* got 9"),
    (((4, -3, 3, 3), "float32"), {}, ValueError,
     r"shape: expected every size to be positive, got \(4, -3, 3, 3\)"),
    (((4, 3, 0, 3), "float16"), {}, ValueError, r"shape: expected every size to be positive"),
    (((4, 3, 3, 3), "int8"), {}, TypeError, r"dtype: unsupported dtype 'int8'"),
    (((4, 3, 3, 3), "float32", "NCHW_VECT_C"), {}, ValueError,
     r"format: expected 'NCHW' or 'NHWC' .* got 'NCHW_VECT_C'"),
    (((4, 3, 3, 3), "float32", TensorFormat.NCHW_VECT_C), {}, ValueError, r"format: expected"),
    (((4, 3, 3, 3), "float32", 7), {}, ValueError, r"format: expected .* got 7"),
    (((4, 3, 3, 3), "float32", True), {}, ValueError, r"format: expected .* got True"),
    (((4, 3, 3, 3), "float32", None), {}, ValueError, r"format: expected .* got None"),
    (((4, 3, 3.5), "float32"), {}, TypeError, r"shape: expected ints, got float 3.5"),
    (((4, 2**31, 3), "float32"), {}, ValueError, r"shape: expected every size to fit in int32"),
]


@pytest.mark.parametrize("args, kwargs, exc, pattern", BAD_FILTERS,
                         ids=[p[:40] for *_, p in BAD_FILTERS])
def test_bad_filter(args, kwargs, exc, pattern, no_leak):
    with pytest.raises(exc, match=pattern):
        FilterDescriptor(*args, **kwargs)


BAD_CONVS = [
    (((-1, 0), (1, 1), (1, 1)), {}, ValueError,
     r"padding: expected every value to be >= 0, got \(-1, 0\)"),
    (((1, 1), (0, 1), (1, 1)), {}, ValueError,
     r"stride: expected every value to be >= 1, got \(0, 1\)"),
    (((1, 1), (1, -2), (1, 1)), {}, ValueError,
     r"stride: expected every value to be >= 1, got \(1, -2\)"),
    (((1, 1), (1, 1), (0, 1)), {}, ValueError,
     r"dilation: expected every value to be >= 1, got \(0, 1\)"),
    (((1, 1), (1, 1), (1, -1)), {}, ValueError, r"dilation: expected every value to be >= 1"),
    (((1, 1), (1, 1), (1, 1)), {"groups": 0}, ValueError, r"groups: expected a positive int, got 0"),
    (((1, 1), (1, 1), (1, 1)), {"groups": -3}, ValueError, r"groups: expected a positive int, got -3"),
    (((1, 1), (1, 1, 1), (1, 1)), {}, ValueError,
     r"stride: expected 2 values \(one per spatial dim, as in padding=\(1, 1\)\), got 3"),
    (((1, 1), (1, 1), (1,)), {}, ValueError, r"dilation: expected 2 values .* got 1"),
    (((), (), ()), {}, ValueError, r"padding: expected 1 to 6 values \(one per spatial dim\), got 0"),
    (((0,) * 7, (1,) * 7, (1,) * 7), {}, ValueError, r"padding: expected 1 to 6 values .* got 7"),
    (((1.0, 1), (1, 1), (1, 1)), {}, TypeError, r"padding: expected ints, got float 1.0 at index 0"),
    (((1, 1), (True, 1), (1, 1)), {}, TypeError, r"stride: expected ints, got bool True at index 0"),
    (((1, 1), (1, 1), (1, "2")), {}, TypeError, r"dilation: expected ints, got str '2' at index 1"),
    ((1, (1, 1), (1, 1)), {}, TypeError, r"padding: expected a sequence of ints, got int 1"),
    (((1, 1), (1, 1), (1, 1)), {"groups": True}, TypeError, r"groups: expected an int, got bool"),
    (((1, 1), (1, 1), (1, 1)), {"groups": 2.0}, TypeError, r"groups: expected an int, got float"),
    (((2**31, 1), (1, 1), (1, 1)), {}, ValueError, r"padding: expected every value to fit in int32"),
    (((1, 1), (1, 1), (1, 1)), {"groups": 2**31}, ValueError, r"groups: expected every value to fit in int32"),
    (((1, 1), (1, 1), (1, 1)), {"dtype": "int8"}, TypeError, r"dtype: unsupported dtype 'int8'"),
    (((1, 1), (1, 1), (1, 1)), {"mode": 5}, ValueError, r"mode: expected one of ConvolutionMode's members .* got 5"),
]


@pytest.mark.parametrize("args, kwargs, exc, pattern", BAD_CONVS,
                         ids=[p[:40] for *_, p in BAD_CONVS])
def test_bad_convolution(args, kwargs, exc, pattern, no_leak):
    with pytest.raises(exc, match=pattern):
        ConvolutionDescriptor(*args, **kwargs)


@pytest.mark.parametrize("make, exc, pattern", [
    (lambda: ActivationDescriptor(99), ValueError, r"mode: expected one of ActivationMode's members .* got 99"),
    (lambda: ActivationDescriptor("gelu"), ValueError, r"mode: expected one of ActivationMode's members .* 'gelu'"),
    (lambda: ActivationDescriptor(nan_propagation=5), ValueError, r"nan_propagation: expected"),
    (lambda: ActivationDescriptor(coef="1"), TypeError, r"coef: expected a real number, got str"),
    (lambda: ActivationDescriptor(coef=True), TypeError, r"coef: expected a real number, got bool"),
    (lambda: ActivationDescriptor(coef=float("nan")), ValueError, r"coef: expected a number, got nan"),
    (lambda: OpTensorDescriptor("FOO"), ValueError, r"op: expected one of OpTensorOp's members .* got 'FOO'"),
    (lambda: OpTensorDescriptor(compute_dtype="int8"), TypeError,
     r"compute_dtype: unsupported dtype 'int8'"),
])
def test_bad_activation_and_optensor(make, exc, pattern, no_leak):
    with pytest.raises(exc, match=pattern):
        make()


# ---- bad inputs that reach cuDNN: its reason must reach the user --------------------------------

def test_cudnn_reason_for_negative_size(no_leak):
    with pytest.raises(CudnnBadParamError) as info:
        TensorDescriptor((1, -1, 4, 4), "float32", validate=False)
    e = info.value
    assert e.function == "cudnnSetTensorNdDescriptor"
    assert e.status_name == "CUDNN_STATUS_BAD_PARAM"
    assert "dimA[i] <= 0" in e.reason  # cuDNN's own words, from cudnnGetLastErrorString
    msg = str(e)
    assert "cudnnSetTensorNdDescriptor failed with CUDNN_STATUS_BAD_PARAM" in msg
    # cuDNN 9.28 adds a sentence ("Tensor dimension 1 has invalid size -1 ..."); 9.19 gives only
    # the failed condition. Either way the reason is cuDNN's own text, after the status.
    assert "CUDNN_STATUS_BAD_PARAM (2000): " + e.reason.split("\n")[0] in msg
    assert "dims=[1, -1, 4, 4]" in msg  # our context line


@pytest.mark.parametrize("make, function, reason", [
    (lambda: TensorDescriptor((1, 1, 4, 4), "float32", (16, 16, 4, 0), validate=False),
     "cudnnSetTensorNdDescriptor", r"(stride 0 is only valid when dim size is 1|\(strideA\[i\] == 0\) && \(dimA\[i\] != 1\))"),
    (lambda: FilterDescriptor((4, -3, 3, 3), "float32", validate=False),
     "cudnnSetFilterNdDescriptor", r"(Filter dimension 1 has invalid size -3|filterDimA\[i\] <= 0)"),
    (lambda: ConvolutionDescriptor((-1, 0), (1, 1), (1, 1), validate=False),
     "cudnnSetConvolutionNdDescriptor", r"(padding\[0\] = -1 is negative|padA\[i\] < 0)"),
    (lambda: ConvolutionDescriptor((0, 0), (1, 0), (1, 1), validate=False),
     "cudnnSetConvolutionNdDescriptor", r"(stride\[1\] = 0 must be > 0|strideA\[i\] <= 0)"),
    (lambda: ConvolutionDescriptor((0, 0), (1, 1), (1, 0), validate=False),
     "cudnnSetConvolutionNdDescriptor", r"(dilation\[1\] = 0 must be > 0|dilationA\[i\] <= 0)"),
    (lambda: ConvolutionDescriptor((0,), (1,), (1,), groups=0, validate=False),
     "cudnnSetConvolutionGroupCount", r"(group count must be >= 1, but got 0|groupCount < 1)"),
])
def test_cudnn_reasons_reach_the_user(make, function, reason, no_leak):
    with pytest.raises(CudnnBadParamError, match=rf"{function} failed with CUDNN_STATUS_BAD_PARAM"
                                                 rf" \(2000\): .*{reason}"):
        make()


def test_tensor_spanning_2_31_elements_is_refused_by_cudnn(no_leak):
    # Only cuDNN checks this; it records no reason, so pycudnn adds the span.
    with pytest.raises(CudnnNotSupportedError,
                       match=r"cudnnSetTensorNdDescriptor failed with CUDNN_STATUS_NOT_SUPPORTED"
                             r"(.|\n)*spans 2147483648 elements"):
        TensorDescriptor((2**30, 2, 1, 1), "float32")
    with pytest.raises(CudnnNotSupportedError, match=r"spans 2147483648 elements"):
        TensorDescriptor((2, 1, 1), "float32", strides=(2**31 - 1, 1, 1))  # sparse, same span
    # one element less spans fine
    with TensorDescriptor((2, 1, 1), "float32", strides=(2**30 + 1, 1, 1)):
        pass


def _conv_setup(x_shape, w_shape, pad, stride=None, dil=None, groups=1):
    n = len(pad)
    return (TensorDescriptor(x_shape, "float32"), FilterDescriptor(w_shape, "float32"),
            ConvolutionDescriptor(pad, stride or (1,) * n, dil or (1,) * n, groups=groups))


def test_groups_not_matching_channels(no_leak):
    x, w, conv = _conv_setup((2, 6, 9, 9), (4, 3, 3, 3), (1, 1), (2, 2))
    # Python-level check names groups
    with pytest.raises(ValueError, match=r"groups: given groups=1 and weight of shape "
                                         r"\(4, 3, 3, 3\), expected input \(2, 6, 9, 9\) to have "
                                         r"3 channels .* but got 6 channels"):
        conv.output_shape(x, w)
    # cuDNN's own check, with its reason and our context
    with pytest.raises(CudnnBadParamError) as info:
        conv.output_shape(x, w, validate=False)
    msg = str(info.value)
    assert info.value.function == "cudnnGetConvolutionNdForwardOutputDim"
    assert "inputTensorDesc->dimA[1] != convDesc->groupCount * filterDesc->dimA[1]" in msg
    assert "input: TensorDescriptor(dtype=CUDNN_DATA_FLOAT, dims=[2, 6, 9, 9]" in msg
    assert "convolution: ConvolutionDescriptor(padding=[1, 1], stride=[2, 2]" in msg
    # groups=2 makes it consistent; groups=4 does not divide C=6
    with ConvolutionDescriptor((1, 1), (2, 2), (1, 1), groups=2) as g2:
        assert g2.output_shape(x, w) == (2, 4, 5, 5)
    with ConvolutionDescriptor((1, 1), (2, 2), (1, 1), groups=4) as g4:
        with pytest.raises(ValueError, match=r"groups: given groups=4 .* to have 12 channels"):
            g4.output_shape(x, w)
        with pytest.raises(CudnnBadParamError, match=r"convDesc->groupCount"):
            g4.output_shape(x, w, validate=False)


def test_filter_count_not_divisible_by_groups(no_leak):
    # cuDNN 9 does not check K % groups in the output-dim call: only the Python check catches it
    x, w, conv = _conv_setup((2, 6, 8, 8), (5, 3, 3, 3), (1, 1), groups=2)
    with pytest.raises(ValueError, match=r"groups: given groups=2, expected weight's output "
                                         r"channels 5 .* to be divisible by 2"):
        conv.output_shape(x, w)


def test_kernel_larger_than_padded_input(no_leak):
    x, w, conv = _conv_setup((1, 3, 2, 2), (4, 3, 3, 3), (0, 0))
    with pytest.raises(ValueError, match=r"x_desc: padded input size per channel \(2, 2\) is "
                                         r"smaller than the dilated kernel size \(3, 3\)"):
        conv.output_shape(x, w)
    with pytest.raises(CudnnBadParamError, match=r"cudnnGetConvolutionNdForwardOutputDim failed "
                                                 r"with CUDNN_STATUS_BAD_PARAM(.|\n)*"
                                                 r"weight: FilterDescriptor"):
        conv.output_shape(x, w, validate=False)
    # dilation counts: 3x3 dilated by 4 spans 9
    x8, w3, dil4 = _conv_setup((1, 3, 8, 8), (4, 3, 3, 3), (0, 0), dil=(4, 4))
    with pytest.raises(ValueError, match=r"\(8, 8\) is smaller than the dilated kernel size \(9, 9\)"):
        dil4.output_shape(x8, w3)
    with TensorDescriptor((1, 3, 9, 9), "float32") as x9:
        assert dil4.output_shape(x9, w3) == (1, 4, 1, 1)


def test_dims_mismatch_between_descriptors(no_leak):
    x, w, conv = _conv_setup((1, 3, 8, 8, 8), (4, 3, 3, 3), (1, 1))
    with pytest.raises(ValueError, match=r"x_desc: expected 4 dims for a 2-d convolution, got 5"):
        conv.output_shape(x, w)
    with pytest.raises(CudnnBadParamError, match=r"inputTensorDesc->nbDims != filterDesc->nbDims"):
        conv.output_shape(x, w, validate=False)
    x4 = TensorDescriptor((1, 3, 8, 8), "float32")
    w3 = FilterDescriptor((4, 3, 3), "float32")
    with pytest.raises(ValueError, match=r"w_desc: expected 4 dims for a 2-d convolution, got 3"):
        conv.output_shape(x4, w3)
    c1 = ConvolutionDescriptor((1,), (1,), (1,))
    with pytest.raises(CudnnBadParamError, match=r"convDesc->arrayLength != \(filterDesc->nbDims - 2\)"):
        c1.output_shape(x4, FilterDescriptor((4, 3, 3, 3), "float32"), validate=False)


def test_output_shape_argument_types(no_leak):
    x, w, conv = _conv_setup((1, 3, 8, 8), (4, 3, 3, 3), (1, 1))
    with pytest.raises(TypeError, match=r"x_desc: expected a TensorDescriptor, got FilterDescriptor"):
        conv.output_shape(w, w)
    with pytest.raises(TypeError, match=r"w_desc: expected a FilterDescriptor, got TensorDescriptor"):
        conv.output_shape(x, x)
