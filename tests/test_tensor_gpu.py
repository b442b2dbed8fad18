"""GPU tests of pycudnn.runtime.tensor and pycudnn.runtime.memory: allocation, copies, out-of-memory, stream
capture, and zero-copy interop with CuPy, PyTorch and Numba (each skipped when absent)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from pycudnn.runtime import memory as M
from pycudnn.runtime import tensor as T
from pycudnn.errors import OutOfMemoryError

pytestmark = pytest.mark.gpu

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = ["float32", "float16", "bfloat16", "float64"]
GiB = 1 << 30


def data(shape, dtype, seed=0):
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return a.astype(BF16 if dtype == "bfloat16" else dtype)


def assert_same(actual, expected):
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    if expected.dtype == BF16:
        np.testing.assert_array_equal(actual.view(np.uint16), expected.view(np.uint16))
    else:
        np.testing.assert_array_equal(actual, expected)


# ---- devices, memory ------------------------------------------------------------------------------

def test_device_helpers():
    n = M.device_count()
    assert n >= 1 and M.no_device_reason() is None
    M.ensure_device(0)
    assert M.current_device() == 0
    with M.device_guard(0) as d:
        assert d == 0 and M.current_device() == 0
    free, total = M.mem_get_info(0)
    assert 0 < free <= total
    M.synchronize()
    M.stream_synchronize(None)
    with pytest.raises(ValueError, match="does not exist"):
        M.allocate(16, n)
    if n >= 2:
        with M.device_guard(1):
            assert M.current_device() == 1
        assert M.current_device() == 0


def test_allocate_on_each_kind_of_stream():
    from cuda.core import Device

    dev = Device(0)
    dev.set_current()
    s = dev.create_stream()
    for stream in (None, 0, int(s.handle), s):
        buf = M.allocate(1 << 20, 0, stream)
        assert buf.ptr and buf.nbytes == 1 << 20 and buf.device == 0
        assert M.pointer_device(buf.ptr) == 0
        M.memset(buf.ptr, buf.nbytes, stream)
        buf.close(stream)
        buf.close()  # twice is harmless
        with pytest.raises(ValueError, match="after close"):
            buf.ptr
    M.stream_synchronize(s)
    with M.allocate(4096) as buf:
        assert buf.ptr


def test_garbage_collected_buffers_are_freed():
    _free, total = M.mem_get_info(0)
    chunk = 4 * GiB
    for _ in range(2 * total // chunk + 2):  # twice the card: would run out if nothing were freed
        buf = M.allocate(chunk, 0)
        del buf
    M.synchronize()


def test_out_of_memory_names_bytes_device_and_memory():
    n = 900 * GiB  # below the 1 TiB guard, above any H200
    with pytest.raises(OutOfMemoryError) as info:
        M.allocate(n, 0)
    msg = str(info.value)
    assert f"{n} bytes" in msg and "device 0" in msg and "free of" in msg, msg
    with pytest.raises(OutOfMemoryError):
        T.empty((n // 4,), "float32")
    with pytest.raises(OutOfMemoryError, match="near 2\\^64"):
        M.allocate(1 << 40, 0)
    # the device still works afterwards
    assert T.from_numpy(np.ones(4, np.float32)).numpy().sum() == 4


def test_allocate_during_stream_capture():
    from cuda.bindings import runtime as rt
    from cuda.core import Device

    dev = Device(0)
    dev.set_current()
    s = dev.create_stream()
    h = int(s.handle)
    assert not M.stream_is_capturing(h)
    M.check_cuda(rt.cudaStreamBeginCapture(h, rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal),
                 "cudaStreamBeginCapture")
    try:
        assert M.stream_is_capturing(h)
        buf = M.allocate(1 << 20, 0, h)
        M.memset(buf.ptr, buf.nbytes, h)
        buf.close(h)
    finally:
        err, graph = rt.cudaStreamEndCapture(h)
    M.check_cuda(err, "cudaStreamEndCapture")
    rt.cudaGraphDestroy(graph)
    assert not M.stream_is_capturing(h)


def test_pointer_device_refuses_host_memory():
    a = np.zeros(4, np.float32)
    with pytest.raises(TypeError, match="host memory"):
        M.pointer_device(a.ctypes.data)


# ---- tensors --------------------------------------------------------------------------------------

SHAPES = [((7,), "contiguous"), ((3, 5), "contiguous"), ((2, 3, 7), "contiguous"),
          ((2, 3, 4, 5), "contiguous"), ((2, 3, 4, 5), "channels_last"),
          ((2, 3, 2, 4, 5), "contiguous"), ((2, 3, 2, 4, 5), "channels_last")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,fmt", SHAPES)
def test_from_numpy_round_trip(dtype, shape, fmt):
    a = data(shape, dtype)
    t = T.from_numpy(a, memory_format=fmt)
    assert t.dtype == a.dtype and t.shape == shape and t.device == 0
    assert t.memory_format == fmt and t.is_contiguous(fmt)
    assert_same(t.numpy(), a)
    if fmt == "channels_last":  # the storage really is N(D)HWC
        perm = (0,) + tuple(range(2, len(shape))) + (1,)
        raw = T.tensor_from_pointer(t.ptr, tuple(shape[i] for i in perm), dtype, owner=t)
        assert_same(raw.numpy(), np.ascontiguousarray(a.transpose(perm)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_from_numpy_converts_and_takes_non_contiguous_arrays(dtype):
    a = np.random.default_rng(1).standard_normal((4, 6, 5)).astype(np.float64)
    t = T.from_numpy(a[:, ::2, 1:], dtype=dtype)
    assert_same(t.numpy(), a[:, ::2, 1:].astype(BF16 if dtype == "bfloat16" else dtype))


def test_numpy_honours_strides_and_narrow():
    a = data((6, 3, 4, 5), "float32")
    t = T.from_numpy(a, memory_format="channels_last")
    assert_same(t.narrow(0, 2, 3).numpy(), a[2:5])
    assert_same(t.narrow(3, 1, 2).numpy(), a[:, :, :, 1:3])
    u = T.from_numpy(data((3, 5), "float32"))
    transposed = T.tensor_from_pointer(u.ptr, (5, 3), "float32", strides=(1, 5), owner=u)
    assert_same(transposed.numpy(), u.numpy().T)
    assert_same(u.unsqueeze(1).numpy(), u.numpy()[:, None, :])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", ["contiguous", "channels_last"])
def test_zeros(dtype, fmt):
    shape = (2, 3, 4, 5)
    junk = T.from_numpy(np.full(shape, 7, np.float32), dtype=dtype)  # leave non-zero bytes behind
    del junk
    z = T.zeros(shape, dtype, memory_format=fmt)
    assert z.memory_format == fmt
    assert_same(z.numpy(), np.zeros(shape, BF16 if dtype == "bfloat16" else dtype))


def test_zero_size_tensors():
    for shape, fmt in [((0, 3, 4, 5), "channels_last"), ((2, 0), "contiguous"), ((0,), "contiguous")]:
        t = T.empty(shape, "float16", memory_format=fmt)
        assert t.ptr == 0 and t.numpy().shape == shape
        z = T.zeros(shape, "float32", memory_format=fmt)
        assert z.numpy().shape == shape
        f = T.from_numpy(np.zeros(shape, np.float64), memory_format=fmt)
        assert f.numpy().shape == shape


def test_streams_for_copies():
    from cuda.core import Device

    dev = Device(0)
    dev.set_current()
    s = dev.create_stream()
    a = data((64, 64), "float32")
    t = T.from_numpy(a, stream=s)
    assert_same(t.numpy(stream=s), a)
    z = T.zeros((8,), "float64", stream=int(s.handle))
    assert_same(z.numpy(stream=s), np.zeros(8))


# ---- CuPy -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_cupy_interop(dtype):
    cupy = pytest.importorskip("cupy")
    a = data((2, 3, 4, 5), dtype)
    t = T.from_numpy(a, memory_format="channels_last")
    c = cupy.asarray(t)  # __cuda_array_interface__
    assert c.data.ptr == t.ptr and c.strides == tuple(s * t.itemsize for s in t.strides)
    assert_same(cupy.asnumpy(c), a)
    d = cupy.from_dlpack(t)  # __dlpack__
    assert d.data.ptr == t.ptr
    assert_same(cupy.asnumpy(d), a)

    src = cupy.asarray(a)
    u = T.as_tensor(src)
    assert u.ptr == src.data.ptr and u.device == src.device.id and u.owner is src
    assert_same(u.numpy(), a)
    sliced = src[:, :, ::2]
    v = T.as_tensor(sliced)
    assert v.ptr == sliced.data.ptr and v.strides == tuple(s // src.itemsize for s in sliced.strides)
    assert_same(v.numpy(), a[:, :, ::2])


def test_cupy_array_on_another_stream():
    cupy = pytest.importorskip("cupy")
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        c = cupy.arange(1 << 20, dtype=cupy.float32)
    t = T.as_tensor(c)  # CAI v3 names s: the legacy default stream is made to wait on it
    assert t.ptr == c.data.ptr
    assert t.numpy()[-1] == (1 << 20) - 1
    assert T.as_tensor(c, stream=s).ptr == c.data.ptr  # same stream: no wait needed


class _InterfaceOnly:
    """Exposes an array's ``__cuda_array_interface__`` and nothing else (the interface path)."""

    def __init__(self, array):
        self.array = array

    @property
    def __cuda_array_interface__(self):
        return self.array.__cuda_array_interface__


def test_cupy_attribute_path_agrees_with_the_interface_path(monkeypatch):
    """CuPy arrays are read through their attributes (the interface dict costs ~3 us a call);
    the Tensor and the stream ordering must be what the interface path gives: the same view, and
    the same waits (CuPy's current stream, its null stream reported as the default stream)."""
    cupy = pytest.importorskip("cupy")
    waits = []
    real_wait = M.stream_wait
    monkeypatch.setattr(M.streams, "stream_wait", lambda w, p: (waits.append((w, p)), real_wait(w, p)))
    base = cupy.arange(2 * 3 * 4 * 6, dtype=cupy.float32).reshape(2, 3, 4, 6)
    side = cupy.cuda.Stream(non_blocking=True)
    views = [base, base[:, 1:, :, ::2], base.transpose(0, 2, 3, 1), base[1], base.astype(
        cupy.float16), base.astype(cupy.float64)[..., 1:], cupy.empty((0, 3), cupy.float32)]
    for stream_ctx in (None, side):
        for consumer in (None, side.ptr):
            for v in views:
                with (stream_ctx or cupy.cuda.Stream.null):
                    waits.clear()
                    fast = T.as_tensor(v, stream=consumer)
                    fast_waits = list(waits)
                    waits.clear()
                    slow = T.as_tensor(_InterfaceOnly(v), stream=consumer)
                    slow_waits = list(waits)
                assert (fast.ptr, fast.shape, fast.strides, fast.dtype, fast.device,
                        fast.readonly) == (slow.ptr, slow.shape, slow.strides, slow.dtype,
                                           slow.device, slow.readonly)
                assert fast.owner is v
                assert fast_waits == slow_waits, (stream_ctx, consumer, v.shape)
    side.synchronize()
    # values read through the attribute path
    assert_same(T.as_tensor(base[:, 1:, :, ::2]).numpy(), cupy.asnumpy(base[:, 1:, :, ::2]))


def test_cupy_export_version_2_orders_nothing(monkeypatch):
    cupy = pytest.importorskip("cupy")
    util = pytest.importorskip("cupy._util")
    monkeypatch.setattr(util, "CUDA_ARRAY_INTERFACE_EXPORT_VERSION", 2)
    waits = []
    monkeypatch.setattr(M.streams, "stream_wait", lambda w, p: waits.append((w, p)))
    side = cupy.cuda.Stream(non_blocking=True)
    with side:
        c = cupy.ones((4, 4), cupy.float32)
        t = T.as_tensor(c)  # the default stream would wait on side under version 3
    side.synchronize()
    assert t.ptr == c.data.ptr and waits == []


# ---- PyTorch --------------------------------------------------------------------------------------

def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    return torch


def _torch_bits(x):
    torch = _torch()
    if x.dtype == torch.bfloat16:
        return x.view(torch.int16).cpu().numpy().view(np.uint16)
    return x.cpu().numpy()


def _np_bits(a):
    return a.view(np.uint16) if a.dtype == BF16 else a


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", ["contiguous", "channels_last"])
def test_torch_from_dlpack(dtype, fmt):
    torch = _torch()
    a = data((2, 3, 4, 5), dtype)
    t = T.from_numpy(a, memory_format=fmt)
    x = torch.from_dlpack(t)
    assert x.data_ptr() == t.ptr and x.stride() == t.strides and x.device.index == 0
    assert x.is_contiguous(memory_format=torch.channels_last if fmt == "channels_last"
                           else torch.contiguous_format)
    np.testing.assert_array_equal(_torch_bits(x), _np_bits(a))
    del t  # torch keeps the memory alive through the capsule's deleter
    gc.collect()
    np.testing.assert_array_equal(_torch_bits(x), _np_bits(a))


@pytest.mark.parametrize("dtype", DTYPES)
def test_as_tensor_of_torch_tensors(dtype):
    torch = _torch()
    tdtype = getattr(torch, dtype)
    x = torch.randn(2, 3, 4, 5, device="cuda").to(tdtype)
    for y in (x, x.to(memory_format=torch.channels_last), x[:, :, 1:3], x.requires_grad_(True)):
        u = T.as_tensor(y)
        assert u.ptr == y.data_ptr() and u.strides == y.stride() and u.shape == tuple(y.shape)
        assert u.dtype.name == dtype and u.device == 0 and u.owner is y
        np.testing.assert_array_equal(_np_bits(u.numpy()), _torch_bits(y.detach()))
    assert T.as_tensor(x.to(memory_format=torch.channels_last)).memory_format == "channels_last"
    with pytest.raises(TypeError, match="got torch.Tensor; use pycudnn.from_numpy"):
        T.as_tensor(torch.zeros(3))


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_through_our_dlpack_importer(dtype):
    torch = _torch()

    class DLPackOnly:
        def __init__(self, x):
            self.x = x

        def __dlpack__(self, **kw):
            return self.x.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.x.__dlpack_device__()

    x = torch.randn(2, 3, 4, 5, device="cuda").to(getattr(torch, dtype)).to(
        memory_format=torch.channels_last)
    expected = _torch_bits(x)
    ptr = x.data_ptr()
    u = T.as_tensor(DLPackOnly(x))
    del x  # only the DLPack import keeps the memory now
    gc.collect()
    torch.cuda.empty_cache()
    assert u.ptr == ptr and u.memory_format == "channels_last" and u.dtype.name == dtype
    np.testing.assert_array_equal(_np_bits(u.numpy()), expected)
    del u
    gc.collect()  # the deleter ran; torch must not crash later
    torch.cuda.synchronize()


# ---- Numba ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_numba_interop(dtype):
    numba_cuda = pytest.importorskip("numba.cuda")
    if not numba_cuda.is_available():
        pytest.skip("numba without CUDA")
    a = data((3, 4, 5), dtype)
    t = T.from_numpy(a)
    n = numba_cuda.as_cuda_array(t)
    assert n.device_ctypes_pointer.value == t.ptr
    assert_same(n.copy_to_host(), a)
    d = numba_cuda.to_device(a)
    u = T.as_tensor(d)
    assert u.ptr == d.device_ctypes_pointer.value
    assert_same(u.numpy(), a)
