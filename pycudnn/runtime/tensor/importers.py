"""`as_tensor`: a `Tensor` view of what another library made, zero-copy, in this order: a
`Tensor`, a PyTorch tensor (its attributes), a CuPy array (its attributes), the CUDA array
interface, DLPack. See the package docstring for the rules of each.
"""

from __future__ import annotations

import operator
import sys
import weakref
from ctypes import c_int64
from typing import Any, Mapping, Protocol, Sequence, Union

import numpy as np

from ..memory import devices as _devices
from ..memory import streams as _streams
from ..memory.streams import StreamLike
from .dlpack import (
    DL_DEVICE_NAMES,
    DLPACK_FLAG_BITMASK_READ_ONLY,
    DLTENSOR,
    DLTENSOR_VERSIONED,
    USED_DLTENSOR,
    USED_DLTENSOR_VERSIONED,
    DLManagedTensor,
    DLManagedTensorVersioned,
    PyCapsule_GetPointer,
    PyCapsule_IsValid,
    PyCapsule_SetName,
    call_deleter,
    kDLBfloat,
    kDLCPU,
    kDLCUDA,
    kDLCUDAHost,
    kDLCUDAManaged,
    kDLFloat,
)
from .geometry import contiguous_strides, type_name
from .view import (
    BF16_TYPESTRS,
    EXPECTED_DTYPES,
    F16,
    F32,
    F64,
    TYPESTR_DTYPES,
    Tensor,
    bfloat16_dtype,
    check_pointer,
)


class SupportsCudaArrayInterface(Protocol):
    """An object exporting the CUDA array interface (CuPy, Numba, PyTorch, ...): a mapping
    with ``shape``, ``typestr``, ``data`` and optionally ``strides`` and ``stream``."""

    @property
    def __cuda_array_interface__(self) -> Mapping[str, Any]: ...


class SupportsDLPack(Protocol):
    """An object exporting DLPack (JAX, PyTorch, CuPy, ...): ``__dlpack__(stream=...,
    max_version=...)`` returning a capsule, and ``__dlpack_device__()``."""

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any: ...


TensorLike = Union[Tensor, SupportsCudaArrayInterface, SupportsDLPack]
"""What `as_tensor()`, and so every pycudnn function taking a tensor, accepts: a `Tensor`, a
PyTorch CUDA tensor, or any object on a CUDA device with ``__cuda_array_interface__`` or
``__dlpack__`` (CuPy, Numba, JAX, ...), never copied. Host arrays are refused at run time."""


def _host_refusal(obj: Any, where: str = "") -> TypeError:
    return TypeError("as_tensor: expected a CUDA device array (with __cuda_array_interface__ or "
                     f"__dlpack__ on a CUDA device), got {type_name(obj)}{where}; use "
                     "pycudnn.from_numpy(...) to copy host data")


def _unsupported(dtype_desc: str) -> TypeError:
    return TypeError(f"as_tensor: unsupported dtype {dtype_desc}; expected one of {EXPECTED_DTYPES}")


_torch_dtypes: dict[Any, np.dtype] | None = None


def _torch_dtype(torch: Any, tdtype: Any) -> np.dtype:
    global _torch_dtypes
    table = _torch_dtypes
    if table is None:
        table = _torch_dtypes = {torch.float32: F32, torch.float16: F16, torch.float64: F64}
    dt = table.get(tdtype)
    if dt is None:
        if tdtype is not torch.bfloat16:
            raise _unsupported(str(tdtype))
        dt = table[tdtype] = bfloat16_dtype()  # imports ml_dtypes only when bfloat16 is met
    return dt


_torch_has_neg: bool | None = None  # whether torch.Tensor has is_neg() (torch >= 1.10)


def _from_torch(obj: Any, torch: Any) -> Tensor:
    # The hot path of every call with torch tensors: each torch accessor costs 50-100 ns, so each
    # is read once, the dtype table is read inline and the Tensor is built here (as _make does).
    global _torch_has_neg
    if not obj.is_cuda:
        where = "" if obj.device.type == "cpu" else f" on {obj.device}"
        raise _host_refusal(obj, where)
    if obj.layout is not torch.strided:
        raise TypeError(f"as_tensor: expected a strided (dense) torch tensor, got layout {obj.layout}")
    has_neg = _torch_has_neg
    if has_neg is None:
        has_neg = _torch_has_neg = hasattr(torch.Tensor, "is_neg")
    if has_neg and obj.is_neg():
        raise TypeError("as_tensor: the torch tensor has its negative bit set; call .resolve_neg() first")
    tdtype = obj.dtype
    table = _torch_dtypes
    dtype = table.get(tdtype) if table is not None else None
    if dtype is None:
        dtype = _torch_dtype(torch, tdtype)
    strides = obj.stride()
    if strides.__class__ is not tuple:  # a tuple in every torch release; kept exact if not
        strides = tuple(strides)
    t = _new(Tensor)
    t.ptr = obj.data_ptr()
    t.shape = tuple(obj.shape)  # a plain tuple: torch.Size would print differently in messages
    t.strides = strides
    t.dtype = dtype
    t.device = obj.get_device()
    t.owner = obj
    t.readonly = False
    return t


_new = object.__new__


def _typestr_dtype(typestr: Any) -> np.dtype | None:
    dt = TYPESTR_DTYPES.get(typestr)
    if dt is None and typestr in BF16_TYPESTRS:
        dt = bfloat16_dtype()
    return dt


def _check_import(ptr: int, shape: tuple, strides: tuple, itemsize: int, source: str) -> None:
    """An imported array must describe usable device memory: what tensor_from_pointer checks."""
    if any((not isinstance(d, int)) or isinstance(d, bool) or d < 0 for d in shape):
        raise ValueError(f"as_tensor: {source} has a negative or non-integer size in shape {shape}")
    if len(strides) != len(shape):
        raise ValueError(f"as_tensor: {source} gives {len(strides)} strides for a {len(shape)}-D shape")
    if ptr % itemsize:  # as tensor_from_pointer: refused even for an empty array
        raise ValueError(f"as_tensor: {source} pointer {ptr:#x} is not aligned to its element "
                         f"size ({itemsize} bytes)")
    if not ptr and all(d > 0 for d in shape):
        raise ValueError(f"as_tensor: {source} is a null pointer for a non-empty array of shape {shape}")


def _element_strides(byte_strides: Sequence[int], item: int) -> tuple[int, ...] | None:
    """Byte strides in elements; None unless each is a non-negative multiple of ``item``."""
    strides = []
    for s in byte_strides:
        if s < 0 or s % item:
            return None
        strides.append(s // item)
    return tuple(strides)


def _from_cai(obj: Any, cai: Any, consumer: int) -> Tensor:
    try:
        shape = cai["shape"]
        typestr = cai["typestr"]
        data = cai["data"]
    except (KeyError, TypeError):
        raise TypeError(f"as_tensor: {type_name(obj)}.__cuda_array_interface__ lacks shape, typestr "
                        "or data") from None
    dtype = _typestr_dtype(typestr)
    if dtype is None:
        if hasattr(obj, "__dlpack__"):
            return _from_dlpack(obj, consumer)
        raise _unsupported(f"{_typestr_name(typestr)} (CUDA Array Interface typestr {typestr!r})")
    if cai.get("mask") is not None:
        raise TypeError("as_tensor: masked arrays (a __cuda_array_interface__ mask) are not supported")
    source = f"{type_name(obj)}.__cuda_array_interface__"
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise TypeError(f"as_tensor: {source} data must be a (pointer, read-only flag) pair, got "
                        f"{data!r}")
    # a zero-size array may give None as its pointer (older CAI producers)
    ptr = 0 if data[0] is None else check_pointer(data[0], "as_tensor", f"{source} data[0]")
    flag = data[1]
    if not isinstance(flag, (bool, np.bool_, int, np.integer)):
        raise TypeError(f"as_tensor: {source} data[1] (the read-only flag) must be a bool, got "
                        f"{type(flag).__name__}")
    readonly = bool(flag)
    shape = tuple(shape)
    item = dtype.itemsize
    bstrides = cai.get("strides")
    if bstrides is None:
        strides = contiguous_strides(shape)
    else:
        try:
            bstrides = tuple(operator.index(s) for s in bstrides if not isinstance(s, bool))
        except TypeError:
            bstrides = ()
        if len(bstrides) != len(cai["strides"]):  # a float, a bool, or not a sequence at all
            raise TypeError(f"as_tensor: {source} strides must be a sequence of ints (bytes), got "
                            f"{cai['strides']!r}")
        elements = _element_strides(bstrides, item)
        if elements is None:
            raise ValueError(f"as_tensor: unsupported strides {tuple(bstrides)} (bytes): cuDNN "
                             f"needs non-negative multiples of the element size {item}")
        strides = elements
    _check_import(ptr, shape, strides, item, source)
    if cai.get("version", 0) >= 3:
        producer = cai.get("stream")
        if producer is not None and not _streams.same_stream(int(producer), consumer):
            _streams.stream_wait(consumer, int(producer))
    mod = type(obj).__module__
    if mod.startswith("cupy"):
        device = obj.device.id
    else:
        device = _devices.pointer_device(ptr)
    return Tensor._make(ptr, shape, strides, dtype, device, obj, readonly)


_cupy_dtypes: dict[Any, np.dtype | None] = {}
#: what CuPy's __cuda_array_interface__ reports as the stream of its null stream (the legacy or
#: the per-thread default stream, fixed at CuPy's import), learnt from the first export read
_cupy_null_stream: int | None = None


def _from_cupy(obj: Any, cupy: Any, consumer: int) -> Tensor | None:
    """A CuPy array read through its attributes, with the stream rule of the CUDA Array Interface
    export it replaces (the dict CuPy builds per access and its checks cost ~3 us a call); None
    where this path does not apply (a dtype or strides the interface path handles or refuses
    with its own message, an export setting it does not know)."""
    global _cupy_null_stream
    npdt = obj.dtype
    try:
        dtype = _cupy_dtypes[npdt]
    except KeyError:
        dtype = _cupy_dtypes[npdt] = _typestr_dtype(npdt.str)
    if dtype is None or not obj.size:  # (an empty array's strides are CuPy's zeros: the
        return None                    # interface path gives its contiguous ones)
    item = dtype.itemsize
    strides = _element_strides(obj.strides, item)
    if strides is None:
        return None
    shape = obj.shape
    memory = obj.data
    ptr = memory.ptr
    if ptr % item or not ptr:
        return None
    # CAI v3 (CuPy's default export): the consumer waits for CuPy's current stream; version 2
    # exports no stream (no ordering), as CUPY_CUDA_ARRAY_INTERFACE_EXPORT_VERSION=2 asks
    version = getattr(getattr(cupy, "_util", None), "CUDA_ARRAY_INTERFACE_EXPORT_VERSION", None)
    if version == 3:
        producer = cupy.cuda.get_current_stream().ptr
        if not producer:
            producer = _cupy_null_stream
            if producer is None:
                exported = obj.__cuda_array_interface__.get("stream")
                if type(exported) is not int:
                    return None
                producer = _cupy_null_stream = exported
        if not _streams.same_stream(producer, consumer):
            _streams.stream_wait(consumer, producer)
    elif version != 2:
        return None
    return Tensor._make(ptr, shape, strides, dtype, memory.device_id, obj, False)


def _typestr_name(typestr: Any) -> str:
    try:
        dt = np.dtype(typestr)
    except Exception:
        return repr(typestr)
    return dt.name if dt.isnative or dt.itemsize == 1 else f"big-endian {dt.name}"


class _DLPackImport:
    """Owner of memory imported through DLPack: keeps the source object alive and calls the
    producer's deleter when collected (a weakref.finalize, so an in-flight exception is saved)."""

    __slots__ = ("source", "__weakref__")

    def __init__(self, source: Any, managed: int, deleter: int | None) -> None:
        self.source = source
        if deleter:
            weakref.finalize(self, call_deleter, deleter, managed).atexit = False


def _from_dlpack(obj: Any, consumer: int) -> Tensor:
    try:
        dev_type, _dev_id = obj.__dlpack_device__()
    except AttributeError:
        raise _host_refusal(obj) from None
    dev_type = int(dev_type)
    if dev_type == kDLCPU:
        raise _host_refusal(obj)
    if dev_type == kDLCUDAHost:
        raise _host_refusal(obj, " (pinned host memory, DLPack kDLCUDAHost)")
    if dev_type not in (kDLCUDA, kDLCUDAManaged):
        raise TypeError(f"as_tensor: {type_name(obj)} is on DLPack device "
                        f"{DL_DEVICE_NAMES.get(dev_type, dev_type)}, not a CUDA device")
    dl_stream = 1 if consumer == 0 else consumer  # the DLPack spec forbids 0 for CUDA
    try:
        capsule = obj.__dlpack__(stream=dl_stream, max_version=(1, 0))
    except TypeError:
        capsule = obj.__dlpack__(stream=dl_stream)
    m: Any
    if PyCapsule_IsValid(capsule, DLTENSOR_VERSIONED):
        managed = PyCapsule_GetPointer(capsule, DLTENSOR_VERSIONED)
        m = DLManagedTensorVersioned.from_address(managed)
        if m.version.major > 1:
            raise BufferError(f"as_tensor: {type_name(obj)} exported DLPack "
                              f"{m.version.major}.{m.version.minor}; pycudnn reads 1.x")
        used = USED_DLTENSOR_VERSIONED
        readonly = bool(m.flags & DLPACK_FLAG_BITMASK_READ_ONLY)
    elif PyCapsule_IsValid(capsule, DLTENSOR):
        managed = PyCapsule_GetPointer(capsule, DLTENSOR)
        m = DLManagedTensor.from_address(managed)
        used = USED_DLTENSOR
        readonly = False  # a legacy capsule has no flags
    else:
        raise TypeError(f"as_tensor: {type_name(obj)}.__dlpack__ did not return a DLPack capsule")
    t = m.dl_tensor
    if t.device.device_type not in (kDLCUDA, kDLCUDAManaged):
        raise _host_refusal(obj, f" (DLPack device {DL_DEVICE_NAMES.get(t.device.device_type)})")
    code, bits, lanes = t.dtype.code, t.dtype.bits, t.dtype.lanes
    dtype: np.dtype | None = None
    if lanes == 1:
        if code == kDLFloat:
            dtype = {32: F32, 16: F16, 64: F64}.get(bits)
        elif code == kDLBfloat and bits == 16:
            dtype = bfloat16_dtype()
    if dtype is None:
        names = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 5: "complex", 6: "bool"}
        raise _unsupported(f"{names.get(code, f'code {code} ')}{bits}"
                           + (f"x{lanes}" if lanes != 1 else "") + " (DLPack)")
    ndim = t.ndim
    if ndim < 0 or (ndim and not t.shape):
        raise TypeError(f"as_tensor: {type_name(obj)} exported a malformed DLPack tensor "
                        f"(ndim {ndim}, shape pointer {t.shape})")
    shape = tuple((c_int64 * ndim).from_address(t.shape)) if ndim else ()
    if t.strides and ndim:
        strides = tuple((c_int64 * ndim).from_address(t.strides))
        if any(s < 0 for s in strides):
            raise ValueError(f"as_tensor: negative strides {strides} are not supported by cuDNN")
    else:
        strides = contiguous_strides(shape)
    source = f"{type_name(obj)}.__dlpack__"
    ptr = check_pointer((t.data or 0) + t.byte_offset, "as_tensor", f"{source} data + byte_offset")
    _check_import(ptr, shape, strides, dtype.itemsize, source)
    device = int(t.device.device_id)
    deleter = m.deleter
    PyCapsule_SetName(capsule, used)  # consumed: from now on the deleter is ours to call
    return Tensor._make(ptr, shape, strides, dtype, device, _DLPackImport(obj, managed, deleter),
                        readonly)


def as_tensor(obj: TensorLike, *, stream: StreamLike | None = None) -> Tensor:
    """A zero-copy `Tensor` view of a CUDA device array.

    Args:
        obj: a `Tensor` (returned as is), a PyTorch CUDA tensor, anything
            with ``__cuda_array_interface__`` (CuPy, Numba, ...) or ``__dlpack__`` on a CUDA device
            (JAX, PyTorch, ...). See the module docstring for the order and the stream rules.
        stream: the stream the caller will use the data on (anything
            `pycudnn.runtime.memory.resolve_stream()` accepts; default: the legacy default stream).
            Producers that report a stream (CAI v3, DLPack) are ordered before it.

    Raises:
        TypeError: a host array, an unsupported dtype, or an object that is not an array.
    """
    if type(obj) is Tensor:
        return obj
    torch = sys.modules.get("torch")
    # the class tests first: isinstance() goes through torch's metaclass (~100 ns)
    if torch is not None and obj.__class__ is torch.Tensor:
        return _from_torch(obj, torch)  # no stream rule for torch tensors: not resolved for them
    # the consumer's stream, resolved only for the producers that order on it
    consumer = 0 if stream is None else _streams.resolve_stream(stream)
    cupy = sys.modules.get("cupy")
    if cupy is not None and obj.__class__ is cupy.ndarray:
        t = _from_cupy(obj, cupy, consumer)
        if t is not None:
            return t
    if torch is not None and isinstance(obj, torch.Tensor):  # a subclass (nn.Parameter)
        return _from_torch(obj, torch)
    if isinstance(obj, Tensor):  # a subclass
        return obj
    cai_error = None
    given: Any = obj  # the protocols are tried here, not trusted from the annotation
    try:
        cai = given.__cuda_array_interface__
    except AttributeError:
        cai = None
    except Exception as exc:  # e.g. a producer refusing this dtype; try DLPack before giving up
        cai, cai_error = None, exc
    if cai is not None:
        return _from_cai(obj, cai, consumer)
    if hasattr(obj, "__dlpack__"):
        return _from_dlpack(obj, consumer)
    if cai_error is not None:
        raise TypeError(f"as_tensor: {type_name(obj)}.__cuda_array_interface__ raised "
                        f"{type(cai_error).__name__}: {cai_error}") from cai_error
    raise _host_refusal(obj)
