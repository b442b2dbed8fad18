"""CPU tests of pycudnn.runtime.tensor, pycudnn.runtime.memory and pycudnn.runtime.handle: views, layouts, interop
protocols, validation messages, and the no-GPU behaviour. Nothing here needs a GPU."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import numpy as np
import pytest

from pycudnn.runtime import handle as H
from pycudnn.runtime import memory as M
from pycudnn.runtime import tensor as T
from pycudnn.errors import NoDeviceError, OutOfMemoryError

from conftest import has_gpu

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)


def view(shape, dtype="float32", strides=None, ptr=0x10000, device=0, owner=None):
    return T.tensor_from_pointer(ptr, shape, dtype, strides=strides, device=device, owner=owner)


class CAI:
    """A plain object exposing the CUDA Array Interface (that is the whole protocol)."""

    def __init__(self, **cai):
        self.__cuda_array_interface__ = cai


class DLPackOnly:
    """Forwards the DLPack protocol of another object (e.g. a pycudnn Tensor) and nothing else."""

    def __init__(self, target, versioned_ok=True):
        self.target = target
        self.versioned_ok = versioned_ok
        self.calls = []

    def __dlpack__(self, **kw):
        self.calls.append(kw)
        if not self.versioned_ok and "max_version" in kw:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        return self.target.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.target.__dlpack_device__()


# ---- views --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,expected", [("float32", np.float32), ("float16", np.float16),
                                           ("float64", np.float64), ("bfloat16", BF16)])
def test_view_basics(name, expected):
    t = view((2, 3, 4), name)
    assert t.dtype == np.dtype(expected) and t.dtype.name == name
    assert t.shape == (2, 3, 4) and t.strides == (12, 4, 1)
    assert t.ndim == 3 and t.size == 24 and t.itemsize == t.dtype.itemsize
    assert t.nbytes == 24 * t.itemsize == t.span_bytes
    assert t.data_ptr == t.ptr == 0x10000 and t.device == 0
    r = repr(t)
    assert "(2, 3, 4)" in r and name in r and "(12, 4, 1)" in r and "0x10000" in r and "device=0" in r


def test_view_keeps_owner_and_accepts_numpy_dtypes():
    owner = object()
    t = T.Tensor(0x20000, [4, 5], np.float16, strides=(1, 4), device=3, owner=owner)
    assert t.owner is owner and t.shape == (4, 5) and t.strides == (1, 4) and t.device == 3
    assert not t.is_contiguous()


def test_contiguous_and_channels_last_strides():
    assert T.contiguous_strides((2, 3, 4, 5)) == (60, 20, 5, 1)
    assert T.channels_last_strides((2, 3, 4, 5)) == (60, 1, 15, 3)
    assert T.channels_last_strides((2, 3, 4, 5, 6)) == (360, 1, 90, 18, 3)
    with pytest.raises(ValueError, match="channels_last"):
        T.channels_last_strides((2, 3, 4))


@pytest.mark.parametrize("shape,strides,fmt", [
    ((2, 3, 4, 5), None, "contiguous"),                      # NCHW
    ((2, 3, 4, 5), (60, 1, 15, 3), "channels_last"),          # NHWC
    ((2, 3, 4, 5, 6), None, "contiguous"),                    # NCDHW
    ((2, 3, 4, 5, 6), (360, 1, 90, 18, 3), "channels_last"),  # NDHWC
    ((2, 1, 4, 5), None, "contiguous"),                       # C == 1: ambiguous, contiguous
    ((2, 3, 1, 1), None, "contiguous"),                       # N C 1 1 contiguous
    ((2, 3, 1, 1), (3, 1, 3, 3), "channels_last"),            # what torch makes for channels_last
    ((2, 3, 4), None, "contiguous"),                          # 3-D: never channels_last
    ((2, 3, 4, 5), (120, 1, 30, 3), "channels_last"),         # NHWC view narrowed on W
    ((0, 3, 4, 5), (60, 1, 15, 3), "contiguous"),             # empty: PyTorch says contiguous
])
def test_memory_format(shape, strides, fmt):
    assert view(shape, strides=strides).memory_format == fmt


def test_is_contiguous_formats():
    nchw = view((2, 3, 4, 5))
    nhwc = view((2, 3, 4, 5), strides=(60, 1, 15, 3))
    ndhwc = view((2, 3, 4, 5, 6), strides=(360, 1, 90, 18, 3))
    assert nchw.is_contiguous() and not nchw.is_contiguous("channels_last")
    assert nhwc.is_contiguous("channels_last") and not nhwc.is_contiguous()
    assert ndhwc.is_contiguous("channels_last") and ndhwc.is_contiguous("channels_last_3d")
    assert not nhwc.is_contiguous("channels_last_3d")
    assert not view((2, 3, 4)).is_contiguous("channels_last")
    # size-1 dims: any stride
    assert view((2, 1, 4), strides=(4, 99, 1)).is_contiguous()
    with pytest.raises(ValueError, match="memory_format"):
        nchw.is_contiguous("nhwc")


def test_narrow_and_unsqueeze():
    t = view((6, 3, 4, 5), "float16", strides=(60, 1, 15, 3))
    n = t.narrow(0, 2, 3)
    assert n.shape == (3, 3, 4, 5) and n.strides == t.strides and n.ptr == t.ptr + 2 * 60 * 2
    assert n.owner is t and n.memory_format == "channels_last"
    assert t.narrow(-1, 1, 2).ptr == t.ptr + 1 * 3 * 2
    assert t.narrow(0, -2, 2).ptr == t.ptr + 4 * 60 * 2
    assert t.narrow(0, 6, 0).shape[0] == 0
    with pytest.raises(ValueError, match="exceeds dimension size"):
        t.narrow(0, 4, 3)
    with pytest.raises(IndexError, match="dim 4"):
        t.narrow(4, 0, 1)
    with pytest.raises(TypeError, match="dim must be an int"):
        t.narrow("0", 0, 1)
    u = view((2, 3, 5)).unsqueeze(2)
    assert u.shape == (2, 3, 1, 5) and u.strides == (15, 5, 5, 1) and u.is_contiguous()
    assert view((2, 3)).unsqueeze(-1).strides == (3, 1, 1)


def test_span():
    assert T.span_elements((2, 3), (3, 1)) == 6
    assert T.span_elements((2, 3), (1, 4)) == 10
    assert T.span_elements((2, 0, 3), (0, 3, 1)) == 0
    assert T.span_elements((), ()) == 1
    assert view((4, 4), strides=(8, 1)).span_bytes == (3 * 8 + 3 + 1) * 4


# ---- validation -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(ptr=-1), ValueError, "ptr"),
    (dict(ptr="0x10"), TypeError, "ptr"),
    (dict(ptr=True), TypeError, "ptr"),
    (dict(ptr=1 << 64), ValueError, "ptr"),
    (dict(ptr=0x10002), ValueError, "aligned"),
    (dict(ptr=0), ValueError, "null"),
    (dict(shape=(2, -1)), ValueError, "shape"),
    (dict(shape=(2, 1.5)), TypeError, "shape"),
    (dict(shape="23"), TypeError, "shape"),
    (dict(strides=(1,)), ValueError, "strides"),
    (dict(strides=(1, -1)), ValueError, "strides"),
    (dict(dtype="int32"), TypeError, "int32"),
    (dict(dtype=np.int8), TypeError, "int8"),
    (dict(device=-1), ValueError, "device"),
    (dict(device="cuda"), TypeError, "device"),
])
def test_tensor_from_pointer_validation(kwargs, exc, match):
    args = dict(ptr=0x10000, shape=(2, 3), dtype="float32", strides=None, device=0)
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        T.tensor_from_pointer(args.pop("ptr"), args.pop("shape"), args.pop("dtype"), **args)


def test_tensor_from_pointer_accepts_null_for_empty_and_numpy_ints():
    t = T.tensor_from_pointer(0, (0, 3), "float32")
    assert t.ptr == 0 and t.size == 0 and t.nbytes == 0
    t = T.tensor_from_pointer(np.uint64(0x10000), (np.int64(2), 3), "half", device=np.int32(1))
    assert t.ptr == 0x10000 and t.shape == (2, 3) and t.dtype == np.float16 and t.device == 1


def test_allocation_argument_errors_need_no_gpu():
    with pytest.raises(ValueError, match="memory_format='channels_last' needs a 4-D"):
        T.empty((2, 3, 4), "float32", memory_format="channels_last")
    with pytest.raises(ValueError, match="memory_format must be one of"):
        T.empty((2, 3), "float32", memory_format="NHWC")
    with pytest.raises(TypeError, match="int64.*dtype="):
        T.from_numpy(np.arange(6))
    with pytest.raises(TypeError, match="unsupported dtype"):
        T.zeros((2,), "int32")
    with pytest.raises(ValueError, match="shape"):
        T.empty((2, -3))
    with pytest.raises(TypeError, match="already on a CUDA device"):
        T.from_numpy(view((2,)))


def test_zero_size_tensors_need_no_gpu():
    t = T.empty((0, 3, 4, 4), "float16", memory_format="channels_last")
    assert t.ptr == 0 and t.shape == (0, 3, 4, 4) and t.strides == (48, 1, 12, 3)
    assert t.nbytes == 0 and t.span_bytes == 0
    z = T.zeros((0,), "bfloat16")
    assert z.numpy().shape == (0,) and z.numpy().dtype == BF16
    f = T.from_numpy(np.zeros((3, 0), np.float64))
    assert f.shape == (3, 0) and f.numpy().shape == (3, 0)
    assert t.narrow(0, 0, 0).shape == (0, 3, 4, 4)


# ---- interop out ----------------------------------------------------------------------------------

def test_cuda_array_interface_contents():
    t = view((2, 3), "float32")
    cai = t.__cuda_array_interface__
    assert cai == {"shape": (2, 3), "typestr": "<f4", "data": (0x10000, False), "strides": None,
                   "version": 3, "stream": None}
    s = view((2, 3), "float16", strides=(1, 2)).__cuda_array_interface__
    assert s["typestr"] == "<f2" and s["strides"] == (2, 4)
    assert view((2,), "float64").__cuda_array_interface__["typestr"] == "<f8"
    assert view((2,), "bfloat16").__cuda_array_interface__["typestr"] == "<V2"


def test_dlpack_device():
    assert view((2,), device=3).__dlpack_device__() == (2, 3)


def test_dlpack_export_refusals():
    t = view((2,))
    with pytest.raises(BufferError, match="dl_device"):
        t.__dlpack__(dl_device=(1, 0))
    with pytest.raises(BufferError, match="copy"):
        t.__dlpack__(copy=True)
    t.__dlpack__(dl_device=(2, 0), copy=False)


@pytest.mark.parametrize("versioned_ok", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "bfloat16"])
def test_dlpack_round_trip_through_our_own_importer(dtype, versioned_ok):
    t = view((2, 3, 4, 5), dtype, strides=(60, 1, 15, 3), ptr=0x40000, device=2)
    src = DLPackOnly(t, versioned_ok)
    u = T.as_tensor(src)
    assert (u.ptr, u.shape, u.strides, u.dtype, u.device) == (t.ptr, t.shape, t.strides, t.dtype, 2)
    assert u.owner.source is src
    assert src.calls[0] == {"stream": 1, "max_version": (1, 0)}  # legacy default stream is 1


def test_dlpack_lifetime_consumed_and_unconsumed():
    t = view((4,), "float64")
    ref = weakref.ref(t)
    u = T.as_tensor(DLPackOnly(t))
    del t
    gc.collect()
    assert ref() is not None  # the consumer (u) keeps the producer alive
    del u
    gc.collect()
    assert ref() is None  # our finalizer called the producer's deleter

    t = view((4,), "float64")
    ref = weakref.ref(t)
    cap = t.__dlpack__(max_version=(1, 0))
    del t
    assert ref() is not None
    del cap  # never consumed: the capsule destructor releases it
    gc.collect()
    assert ref() is None


def test_dlpack_release_while_an_exception_propagates():
    t = view((4,), "float32")
    ref = weakref.ref(t)

    def fail_after_export():
        return [t.__dlpack__(), 1 / 0]

    def fail_after_import():
        return [T.as_tensor(DLPackOnly(t)), 1 / 0]

    for fn in (fail_after_export, fail_after_import):
        with pytest.raises(ZeroDivisionError):  # not a SystemError
            fn()
    del t
    gc.collect()
    assert ref() is None


# ---- interop in -----------------------------------------------------------------------------------

def test_as_tensor_passthrough():
    t = view((2,))
    assert T.as_tensor(t) is t


@pytest.mark.skipif(has_gpu(), reason="made-up device addresses are refused by cudaPointerGetAttributes "
                    "where a GPU is present; test_tensor_gpu.py covers real CuPy/Numba arrays there")
def test_as_tensor_cuda_array_interface():
    obj = CAI(shape=(2, 3), typestr="<f4", data=(0x10000, False), version=3, strides=None, stream=None)
    t = T.as_tensor(obj)
    assert (t.ptr, t.shape, t.strides, t.dtype) == (0x10000, (2, 3), (3, 1), np.float32)
    assert t.owner is obj and t.device == 0
    t = T.as_tensor(CAI(shape=(2, 3), typestr="<f2", data=(0x10000, False), strides=(2, 4), version=2))
    assert t.strides == (1, 2) and t.dtype == np.float16
    t = T.as_tensor(CAI(shape=(4,), typestr="<V2", data=(0x10000, True), version=3))
    assert t.dtype == BF16
    # the producer's stream is the legacy default, like ours: no synchronisation needed
    t = T.as_tensor(CAI(shape=(4,), typestr="<f8", data=(0x10000, False), version=3, stream=1))
    assert t.dtype == np.float64
    t = T.as_tensor(CAI(shape=(0, 4), typestr="<f4", data=(0, False), version=3))
    assert t.ptr == 0 and t.size == 0


@pytest.mark.parametrize("cai,exc,match", [
    (dict(shape=(2,), typestr="<i4", data=(0x10000, False), version=3), TypeError, "int32"),
    (dict(shape=(2,), typestr=">f4", data=(0x10000, False), version=3), TypeError, "big-endian"),
    (dict(shape=(2,), typestr="<f4", data=(0x10000, False), version=3, mask=object()), TypeError, "mask"),
    (dict(shape=(2,), typestr="<f4", data=(0x10000, False), version=3, strides=(-4,)), ValueError, "strides"),
    (dict(shape=(2,), typestr="<f4", data=(0x10000, False), version=3, strides=(6,)), ValueError, "strides"),
    (dict(typestr="<f4", data=(0x10000, False), version=3), TypeError, "lacks shape"),
])
def test_as_tensor_cuda_array_interface_errors(cai, exc, match):
    with pytest.raises(exc, match=match):
        T.as_tensor(CAI(**cai))


HOST_MESSAGE = ("as_tensor: expected a CUDA device array (with __cuda_array_interface__ or __dlpack__ "
                "on a CUDA device), got {}; use pycudnn.from_numpy(...) to copy host data")


@pytest.mark.parametrize("obj,name", [(np.zeros(3, np.float32), "numpy.ndarray"), ([1.0, 2.0], "list"),
                                      (3.0, "float")])
def test_as_tensor_refuses_host_arrays(obj, name):
    with pytest.raises(TypeError) as info:
        T.as_tensor(obj)
    assert str(info.value) == HOST_MESSAGE.format(name)


def test_as_tensor_refuses_unsupported_dlpack_dtype():
    class IntDL(DLPackOnly):
        pass

    t = view((2,), "float32")
    src = IntDL(t)

    def int_capsule(**kw):
        cap = t.__dlpack__(**kw)
        m = T.dlpack_managed(cap)
        assert m.version.major == 1  # a versioned capsule
        m.dl_tensor.dtype.code = 0  # kDLInt
        return cap

    src.__dlpack__ = int_capsule
    with pytest.raises(TypeError, match="unsupported dtype int32"):
        T.as_tensor(src)


# ---- imported pointers and the read-only flag -----------------------------------------------------

BAD_POINTERS = [(-16, ValueError), (2**64 + 0x1000, ValueError), (1 << 64, ValueError),
                (4.0e9, TypeError), (65536.0, TypeError), (True, TypeError), ("0x10000", TypeError)]


@pytest.mark.parametrize("ptr,exc", BAD_POINTERS)
def test_as_tensor_checks_a_cai_pointer_as_tensor_from_pointer_does(ptr, exc):
    # Before, all of these became a Tensor (2**64 + 0x1000 then reached cuDNN as 0x1000).
    with pytest.raises(exc) as direct:
        T.tensor_from_pointer(ptr, (2, 2), "float32")
    with pytest.raises(exc) as imported:
        T.as_tensor(CAI(shape=(2, 2), typestr="<f4", data=(ptr, False), version=3))
    # one check: the same wording, naming where the value came from
    assert str(direct.value).startswith("tensor_from_pointer: ptr must be a non-negative ")
    assert str(imported.value) == str(direct.value).replace(
        "tensor_from_pointer: ptr", "as_tensor: test_tensor.CAI.__cuda_array_interface__ data[0]")


@pytest.mark.parametrize("cai,exc,match", [
    (dict(data=(0x10000,)), TypeError, r"data must be a \(pointer, read-only flag\) pair"),
    (dict(data=0x10000), TypeError, "data must be a"),
    (dict(data=(0x10000, "no")), TypeError, r"data\[1\] \(the read-only flag\) must be a bool, got str"),
    (dict(data=(0x10000, False), strides=(8.0, 4.0)), TypeError, "strides must be a sequence of ints"),
    (dict(data=(0x10000, False), strides=(True, 4)), TypeError, "strides must be a sequence of ints"),
    (dict(data=(0x10000, False), shape=(True, 2)), ValueError, "non-integer size"),
])
def test_as_tensor_cai_data_and_strides_must_be_well_formed(cai, exc, match):
    full = dict(shape=(2, 2), typestr="<f4", version=3)
    full.update(cai)
    with pytest.raises(exc, match=match):
        T.as_tensor(CAI(**full))


@pytest.fixture
def device_address():
    """A device address as_tensor accepts through CAI: a made-up one without a GPU, a real
    allocation where there is one (made-up addresses are refused there)."""
    if not has_gpu():
        yield 0x10000
        return
    buf = T.zeros((64,), "float32")
    yield buf.ptr  # buf stays alive until the test is done


@pytest.mark.parametrize("flag,readonly", [(True, True), (False, False), (np.bool_(True), True),
                                           (1, True), (0, False)])
def test_as_tensor_keeps_the_cai_read_only_flag(device_address, flag, readonly):
    t = T.as_tensor(CAI(shape=(2, 2), typestr="<f4", data=(device_address, flag), version=3))
    assert t.readonly is readonly
    # views keep it, and it is exported again
    assert t.narrow(0, 1, 1).readonly is readonly and t.unsqueeze(0).readonly is readonly
    assert t.__cuda_array_interface__["data"] == (device_address, readonly)
    assert ("readonly=True" in repr(t)) is readonly


def test_readonly_flag_of_views_built_here():
    assert view((2,)).readonly is False
    t = T.tensor_from_pointer(0x10000, (2, 3), "float32", readonly=True)
    assert t.readonly is True and t.narrow(1, 1, 2).readonly is True
    assert T.Tensor(0x10000, (2,), "float32", readonly=True).readonly is True
    with pytest.raises(TypeError, match="tensor_from_pointer: readonly must be a bool, got int"):
        T.tensor_from_pointer(0x10000, (2,), "float32", readonly=1)
    with pytest.raises(TypeError, match="Tensor: readonly must be a bool, got str"):
        T.Tensor(0x10000, (2,), "float32", readonly="yes")


@pytest.mark.parametrize("versioned_ok,kept", [(True, True), (False, False)])
def test_dlpack_round_trip_keeps_the_read_only_flag(versioned_ok, kept):
    t = T.tensor_from_pointer(0x40000, (2, 3), "float32", readonly=True)
    u = T.as_tensor(DLPackOnly(t, versioned_ok))
    # a versioned capsule carries DLPACK_FLAG_BITMASK_READ_ONLY; a legacy one cannot
    assert u.readonly is kept
    assert T.as_tensor(DLPackOnly(view((2, 3)))).readonly is False


def _versioned_producer(target, **fields):
    """A DLPack producer whose versioned capsule has ``fields`` of DLManagedTensorVersioned (or of
    its dl_tensor) overwritten, as a foreign producer could export them."""
    src = DLPackOnly(target)

    def dlpack(**kw):
        cap = target.__dlpack__(**kw)
        m = T.dlpack_managed(cap)
        assert m.version.major == 1  # a versioned capsule
        for name, value in fields.items():
            setattr(m if name == "flags" else m.dl_tensor, name, value)
        return cap

    src.__dlpack__ = dlpack
    return src


def test_as_tensor_keeps_a_foreign_versioned_dlpack_read_only_flag():
    t = view((2, 3))
    assert T.as_tensor(_versioned_producer(t, flags=1)).readonly is True   # READ_ONLY
    assert T.as_tensor(_versioned_producer(t, flags=2)).readonly is False  # IS_COPIED only
    assert T.as_tensor(_versioned_producer(t, flags=3)).readonly is True


def test_as_tensor_refuses_a_dlpack_address_past_64_bits():
    # data + byte_offset wraps in C; ctypes would pass the wrapped value on
    src = _versioned_producer(view((2,), ptr=0x10000), byte_offset=2**64 - 0x8000)
    with pytest.raises(ValueError, match=r"as_tensor: test_tensor.DLPackOnly.__dlpack__ data \+ "
                                         r"byte_offset must be a non-negative 64-bit address"):
        T.as_tensor(src)


def test_check_writable_names_the_parameter():
    T.check_writable(view((2,)), "out")
    with pytest.raises(ValueError) as info:
        T.check_writable(T.tensor_from_pointer(0x10000, (2,), "float32", readonly=True), "out")
    assert str(info.value) == ("out: is read-only (its producer marked the memory read-only), and "
                               "this call writes it; pass a writable tensor")


def test_convolution_refuses_a_read_only_out(device_address):
    import pycudnn

    if has_gpu():  # real memory: should the check be missing, the call must not crash
        x, w = T.zeros((1, 1, 4, 4), "float32"), T.zeros((1, 1, 3, 3), "float32")
    else:
        x = T.tensor_from_pointer(0x100000, (1, 1, 4, 4), "float32")
        w = T.tensor_from_pointer(0x200000, (1, 1, 3, 3), "float32")
    out = CAI(shape=(1, 1, 2, 2), typestr="<f4", data=(device_address, True), version=3)
    with pytest.raises(ValueError, match=r"^out: is read-only"):
        pycudnn.convolution(x, w, out=out)


# ---- memory ---------------------------------------------------------------------------------------

class _StreamProtocol:
    def __init__(self, handle, attribute=False):
        if attribute:
            self.__cuda_stream__ = (0, handle)
        else:
            self._h = handle

    def __cuda_stream__(self):
        return (0, self._h)


class _TorchLikeStream:
    cuda_stream = 0x5000


class _CupyLikeStream:
    ptr = 0x6000


def test_resolve_stream_kinds():
    assert M.resolve_stream(None) == 0
    assert M.resolve_stream(0) == 0 and M.resolve_stream(0x1234) == 0x1234
    assert M.resolve_stream(np.uint64(7)) == 7
    assert M.resolve_stream(_StreamProtocol(0x4000)) == 0x4000
    assert M.resolve_stream(_StreamProtocol(0x4100, attribute=True)) == 0x4100
    assert M.resolve_stream(_TorchLikeStream()) == 0x5000
    assert M.resolve_stream(_CupyLikeStream()) == 0x6000
    with pytest.raises(TypeError, match="stream"):
        M.resolve_stream("default")
    with pytest.raises(TypeError, match="stream"):
        M.resolve_stream(True)
    with pytest.raises(ValueError, match="stream"):
        M.resolve_stream(-1)


def test_resolve_stream_cuda_core():
    core = pytest.importorskip("cuda.core")
    assert M.resolve_stream(core.Stream.from_handle(0x7000)) == 0x7000
    assert M.resolve_stream(core.LEGACY_DEFAULT_STREAM) == 1


def test_check_cuda_mapping(monkeypatch, driver_library_found):
    M.check_cuda(0, "nothing")
    M.check_cuda((0, 5), "nothing")
    # with a driver library present, error 35 means an old driver: the runtime's words and a hint
    with pytest.raises(NoDeviceError, match="cudaErrorInsufficientDriver.*older than this CUDA"):
        M.check_cuda(35, "cudaFoo")
    with pytest.raises(NoDeviceError, match="no CUDA-capable device"):
        M.check_cuda(100, "cudaFoo")
    with pytest.raises(OutOfMemoryError, match="cudaErrorMemoryAllocation"):
        M.check_cuda(2, "cudaMalloc")
    with pytest.raises(M.CudaError, match="cudaMemcpy failed: cudaErrorInvalidValue") as info:
        M.check_cuda(1, "cudaMemcpy")
    assert info.value.code == 1


def test_allocate_refuses_huge_sizes_up_front():
    for n in (1 << 40, 2**64 - 1):
        with pytest.raises(OutOfMemoryError, match=rf"allocation of {n} bytes.*near 2\^64"):
            M.allocate(n, 0)
    with pytest.raises(ValueError, match="nbytes"):
        M.allocate(-1)
    with pytest.raises(TypeError, match="nbytes"):
        M.allocate(1.5)
    buf = M.allocate(0, 0)
    assert buf.ptr == 0 and buf.nbytes == 0
    buf.close()
    buf.close()


@pytest.mark.skipif(has_gpu(), reason="checks the behaviour without a GPU")
class TestWithoutGPU:
    def test_device_count_is_zero(self):
        assert M.device_count() == 0 and H.device_count() == 0
        assert "cuda" in M.no_device_reason().lower()

    def test_get_handle_names_the_driver_reason(self):
        for device in (None, 0):
            with pytest.raises(NoDeviceError) as info:
                H.get_handle(device)
            assert M.no_device_reason().split(":")[0] in str(info.value)

    def test_allocate_and_copies_raise_no_device(self):
        with pytest.raises(NoDeviceError, match="no (usable CUDA device|NVIDIA driver found)"):
            M.allocate(1024)
        with pytest.raises(NoDeviceError):
            T.empty((2, 3))
        with pytest.raises(NoDeviceError):
            T.from_numpy(np.ones(3, np.float32))
        with pytest.raises(NoDeviceError):
            view((2,)).numpy()
        with pytest.raises(NoDeviceError):
            M.mem_get_info()

    def test_errors_name_the_public_call_and_what_to_do(self):
        import pycudnn

        for name, call in [("from_numpy", lambda: pycudnn.from_numpy(np.zeros(4, np.float32))),
                           ("empty", lambda: pycudnn.empty((2, 3))),
                           ("zeros", lambda: pycudnn.zeros((2,), device=0)),
                           ("get_handle", lambda: pycudnn.get_handle())]:
            with pytest.raises(NoDeviceError) as info:
                call()
            message = str(info.value)
            if M.errors.driver_found():  # a driver without a usable device: the runtime's reason
                assert message.startswith(f"{name}: no usable CUDA device: "), message
                assert "run `pycudnn info` to see why" in message
            else:  # no driver at all: says so first, in one short line, then what to do
                first, advice = message.split("\n")
                assert first == f"{name}: no NVIDIA driver found (libcuda.so.1)", message
                assert "NVIDIA GPU and its driver" in advice and "pycudnn info" in advice
                assert "InsufficientDriver" not in message
            assert "allocate" not in message

    def test_no_driver_is_named_as_such(self):
        if M.errors.driver_found():
            pytest.skip("libcuda.so.1 loads here: the no-driver case cannot be seen")
        assert M.no_device_reason() == "no NVIDIA driver found (libcuda.so.1)"
        for code in (35, 100, 3):  # whatever the runtime says, the missing driver comes first
            with pytest.raises(NoDeviceError) as info:
                M.check_cuda(code, "cudaGetDevice")
            assert str(info.value).split("\n")[0] == \
                "cudaGetDevice: no NVIDIA driver found (libcuda.so.1)"


# ---- handle pool logic, with cuDNN and the device replaced by fakes --------------------------------

@pytest.fixture
def fake_cudnn(monkeypatch):
    """Run handle.py's pooling logic without a GPU: handles are counters, streams a dict."""
    state = {"next": 0x100, "streams": {}, "set_calls": 0}

    def create(device):
        state["next"] += 1
        return state["next"]

    def set_stream(handle, stream):
        state["set_calls"] += 1
        state["streams"][handle] = stream

    monkeypatch.setattr(M.devices, "normalize_device", lambda d, parameter="device", what="": 0 if d is None else d)
    monkeypatch.setattr(M.devices, "ensure_device", lambda d: d)
    monkeypatch.setattr(M.devices, "current_device", lambda: 0)
    with H.isolated_handles(create, set_stream):
        yield state


def _in_thread(fn):
    out = []
    th = threading.Thread(target=lambda: out.append(fn()))
    th.start()
    th.join()
    return out[0]


def _wait_pooled(n):
    for _ in range(200):
        gc.collect()
        if H.pooled_handle_count(0) >= n:
            return
        time.sleep(0.01)
    raise AssertionError(f"expected {n} pooled handles, have {H.pooled_handle_count(0)}")


def test_handle_pool_logic(fake_cudnn):
    h = H.get_handle(0)
    assert H.get_handle(0) == h and H.get_handle() == h
    assert H.live_handle_count() == 1 and fake_cudnn["set_calls"] == 1
    H.get_handle(0, 0x77)
    assert fake_cudnn["streams"][h] == 0x77 and fake_cudnn["set_calls"] == 2
    H.get_handle(0, 0x77)
    assert fake_cudnn["set_calls"] == 2  # same stream: cudnnSetStream skipped
    H.get_handle(0, _StreamProtocol(0x88))
    assert fake_cudnn["streams"][h] == 0x88

    # two threads alive at the same time get different handles
    barrier = threading.Barrier(2)
    got = []

    def worker():
        got.append(H.get_handle(0))
        barrier.wait()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(set(got)) == 2 and h not in got
    assert H.live_handle_count(0) == 3
    _wait_pooled(2)  # both threads ended: their handles went back to the pool

    # the next thread reuses a pooled handle (no creation), and sets its stream afresh
    reused = _in_thread(lambda: H.get_handle(0, 0x99))
    assert reused in got and H.live_handle_count(0) == 3
    assert fake_cudnn["streams"][reused] == 0x99
    _wait_pooled(2)


# ---- overlap detection (outputs must not overlap themselves or the inputs) ----------------------

def _brute_overlap(shape, strides) -> bool:
    import itertools
    seen = set()
    for idx in itertools.product(*(range(n) for n in shape)):
        off = sum(i * s for i, s in zip(idx, strides))
        if off in seen:
            return True
        seen.add(off)
    return False


@pytest.mark.parametrize("shape,strides", [
    ((2, 3, 4), (12, 4, 1)),      # contiguous
    ((2, 3, 4), (1, 2, 6)),       # permuted
    ((2, 3, 4), (20, 5, 1)),      # padded
    ((2, 3), (3, 2)),             # interleaved, no overlap (the sorted-stride rule cannot tell)
    ((3, 3), (2, 3)),             # interleaved with overlap: offset 6 = 2*3 + 3*0 = 2*0 + 3*2
    ((2, 4), (1, 1)),             # all strides 1: overlap
    ((4, 1, 5), (0, 7, 1)),       # expanded: overlap
    ((1, 1, 5), (0, 0, 1)),       # zero strides on size-1 dims: fine
    ((5, 5), (4, 5)),             # 4i + 5j: 5+0 == 0+... 4*5=20=5*4: overlap
])
def test_internal_overlap_is_exact(shape, strides):
    from pycudnn.runtime.tensor import has_internal_overlap

    assert has_internal_overlap(shape, strides) == _brute_overlap(shape, strides)


def test_views_overlap_is_exact_for_interleaved_views():
    from pycudnn.runtime.tensor import tensor_from_pointer, views_overlap

    base = 0x7F00_0000_0000
    buf = lambda off, shape, strides: tensor_from_pointer(base + 4 * off, shape, "float32", strides=strides)  # noqa: E731
    even = buf(0, (2, 4), (8, 2))       # columns 0, 2, 4, 6 of a (2, 8) buffer
    odd = buf(1, (2, 4), (8, 2))        # columns 1, 3, 5, 7
    assert not views_overlap(even, odd)  # interleaved, disjoint: a legitimate out= and input
    assert views_overlap(even, buf(2, (2, 4), (8, 2)))   # shifted by one even column
    assert views_overlap(even, buf(0, (16,), (1,)))      # the whole buffer
    assert not views_overlap(even, buf(16, (4,), (1,)))  # past the end
    # other element sizes: a float16 view of the bytes of even's second element
    half = tensor_from_pointer(base + 4 * 2 + 2, (1,), "float16")
    assert views_overlap(even, half) and views_overlap(half, even)
    assert not views_overlap(even, tensor_from_pointer(base + 4 * 1 + 2, (1,), "float16"))


def test_overlap_checks_match_brute_force_on_random_layouts():
    """Property: for random small views (interleaved, padded, zero strides, offsets), the overlap
    checks agree exactly with enumerating every element's bytes."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from pycudnn.runtime.tensor import has_internal_overlap, tensor_from_pointer, views_overlap

    base = 0x7F00_0000_0000
    dims = st.lists(st.tuples(st.integers(1, 4), st.integers(0, 9)), min_size=1, max_size=4)

    def bytes_of(offset, layout, item):
        import itertools
        out = set()
        for idx in itertools.product(*(range(n) for n, _ in layout)):
            start = offset + item * sum(i * s for i, (_, s) in zip(idx, layout))
            out.update(range(start, start + item))
        return out

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(a=dims, b=dims, off=st.integers(0, 40), item_a=st.sampled_from([2, 4]),
           item_b=st.sampled_from([2, 4]))
    def check(a, b, off, item_a, item_b):
        shape_a, strides_a = tuple(n for n, _ in a), tuple(s for _, s in a)
        assert has_internal_overlap(shape_a, strides_a) == _brute_overlap(shape_a, strides_a)
        dt = {2: "float16", 4: "float32"}
        ta = tensor_from_pointer(base, shape_a, dt[item_a], strides=strides_a)
        tb = tensor_from_pointer(base + off * 4, tuple(n for n, _ in b), dt[item_b],
                                 strides=tuple(s for _, s in b))
        expected = bool(bytes_of(0, a, item_a) & bytes_of(off * 4, b, item_b))
        assert views_overlap(ta, tb) == expected == views_overlap(tb, ta)

    check()
