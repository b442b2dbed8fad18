"""`Tensor`, a view of device memory (pointer, shape, strides in elements, dtype, device, owner),
with what it exports (``__cuda_array_interface__``, ``__dlpack__``), the read-only rule
(`check_writable`), overlap of two views, and `tensor_from_pointer`.
"""

from __future__ import annotations

import ctypes
import operator
from ctypes import c_int64
from typing import Any, Sequence

import numpy as np

from ..._types import SUPPORTED_DTYPES, DTypeLike, normalize_dtype
from .. import memory as _mem
from ..memory import StreamLike
from .dlpack import (
    DL_CODES,
    DLPACK_FLAG_BITMASK_READ_ONLY,
    DLManagedTensorVersioned,
    dlpack_managed,
    kDLCUDA,
)
from .geometry import (
    MEMORY_FORMATS,
    OVERLAP_EXACT_MAX,
    contiguous_strides,
    element_offsets,
    int_tuple,
    is_channels_last_contiguous,
    is_contiguous_strides,
    span_elements,
    strides_like_channels_last,
)

F32: np.dtype = np.dtype("float32")
F16: np.dtype = np.dtype("float16")
F64: np.dtype = np.dtype("float64")
_bf16: np.dtype | None = None


def bfloat16_dtype() -> np.dtype:
    global _bf16
    if _bf16 is None:
        _bf16 = normalize_dtype("bfloat16")
    return _bf16


TYPESTR_DTYPES: dict[str, np.dtype] = {"<f4": F32, "<f2": F16, "<f8": F64, "=f4": F32, "=f2": F16, "=f8": F64}
BF16_TYPESTRS = ("<V2", "|V2", "=V2")
EXPECTED_DTYPES = ", ".join(SUPPORTED_DTYPES)


def spans_overlap(a: "Tensor", b: "Tensor") -> bool:
    """Whether the memory spans of two tensors intersect (conservative: by extent)."""
    if a.size == 0 or b.size == 0:
        return False
    return a.ptr < b.ptr + b.span_bytes and b.ptr < a.ptr + a.span_bytes


def views_overlap(a: "Tensor", b: "Tensor") -> bool:
    """Whether an element of ``a`` shares a byte with an element of ``b``.

    False when their spans are apart; True when they start at the same address or are both dense
    (no gaps in their spans); otherwise exact up to ``OVERLAP_EXACT_MAX`` elements each, and
    False above (interleaved views of one buffer are legitimate: never a false refusal)."""
    if not spans_overlap(a, b):
        return False
    a0, b0 = a.ptr, b.ptr
    if a0 == b0 or (a.span_bytes == a.nbytes and b.span_bytes == b.nbytes):
        return True
    if a.size > OVERLAP_EXACT_MAX or b.size > OVERLAP_EXACT_MAX:
        return False
    sa = a0 + element_offsets(a.shape, a.strides) * a.dtype.itemsize  # byte starts, sorted
    sb = b0 + element_offsets(b.shape, b.strides) * b.dtype.itemsize
    # an element [p, p + size) of a meets one of b iff some start of b lies in (p - b_item, p + a_item)
    lo = np.searchsorted(sb, sa - b.dtype.itemsize, side="right")
    hi = np.searchsorted(sb, sa + a.dtype.itemsize, side="left")
    return bool(np.any(hi > lo))


class Tensor:
    """A view of device memory. Treat the attributes as read-only.

    Attributes:
        ptr: device address of element ``[0, ..., 0]`` (an int; may be 0 when there is no element).
        shape: tuple of sizes.
        strides: tuple of strides in **elements** (never negative).
        dtype: numpy dtype: float32, float16, float64, or ``ml_dtypes.bfloat16``.
        device: CUDA device ordinal.
        owner: object kept alive for as long as the view (an allocation, the source array, ...).
        readonly: the memory must not be written (its producer said so through CAI or DLPack, or
            ``readonly=True`` was given); pycudnn refuses such a tensor as an output, and views
            of it (`narrow()`,
            `unsqueeze()`) are read-only too.
    """

    __slots__ = ("ptr", "shape", "strides", "dtype", "device", "owner", "readonly", "_fmt",
                 "__weakref__")

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype
    device: int
    owner: Any
    readonly: bool
    _fmt: str | None

    def __init__(self, ptr: int, shape: Sequence[int], dtype: DTypeLike,
                 strides: Sequence[int] | None = None, device: int = 0, owner: object = None, *,
                 readonly: bool = False) -> None:
        self.ptr, self.shape, self.dtype, self.strides, self.device = _validate_view(
            ptr, shape, dtype, strides, device, "Tensor")
        self.owner, self.readonly = owner, _check_readonly(readonly, "Tensor")
        self._fmt = None

    @classmethod
    def _make(cls, ptr: int, shape: tuple, strides: tuple, dtype: np.dtype, device: int,
              owner: Any, readonly: bool = False) -> "Tensor":
        """Build without validation (callers pass checked values)."""
        t = object.__new__(cls)
        t.ptr = ptr
        t.shape = shape
        t.strides = strides
        t.dtype = dtype
        t.device = device
        t.owner = owner
        t.readonly = readonly
        # _fmt is left unset (memory_format computes it on first read): one store less per tensor
        return t

    # -- sizes --
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of the elements (``size * itemsize``), not of the span in memory."""
        return self.size * self.dtype.itemsize

    @property
    def span_bytes(self) -> int:
        """Bytes from the first to one past the last element in memory (0 when empty)."""
        return span_elements(self.shape, self.strides) * self.dtype.itemsize

    @property
    def data_ptr(self) -> int:
        return self.ptr

    # -- layout --
    @property
    def memory_format(self) -> str:
        """``"channels_last"`` or ``"contiguous"``, as PyTorch's ``suggest_memory_format`` decides
        (see the module docstring)."""
        try:
            fmt = self._fmt
        except AttributeError:  # not computed yet (the fast constructors leave it unset)
            fmt = None
        if fmt is None:
            nd = len(self.shape)
            fmt = "contiguous"
            if nd in (4, 5) and strides_like_channels_last(self.shape, self.strides):
                fmt = "channels_last"
            self._fmt = fmt
        return fmt

    def is_contiguous(self, memory_format: str = "contiguous") -> bool:
        """Whether the view is dense in ``memory_format`` (strides of size-1 dims are ignored).

        ``"channels_last"`` is NHWC for 4-D and NDHWC for 5-D tensors (False for other ranks);
        ``"channels_last_3d"`` is NDHWC for 5-D tensors.
        """
        if memory_format == "contiguous":
            return is_contiguous_strides(self.shape, self.strides)
        if memory_format == "channels_last":
            return len(self.shape) in (4, 5) and is_channels_last_contiguous(self.shape, self.strides)
        if memory_format == "channels_last_3d":
            return len(self.shape) == 5 and is_channels_last_contiguous(self.shape, self.strides)
        raise ValueError(f"is_contiguous: memory_format must be one of "
                         f"{', '.join(map(repr, MEMORY_FORMATS))}, got {memory_format!r}")

    # -- views --
    def _dim(self, dim: Any, what: str, extra: int = 0) -> int:
        nd = len(self.shape) + extra
        if type(dim) is not int and (isinstance(dim, bool) or not isinstance(dim, (int, np.integer))):
            raise TypeError(f"{what}: dim must be an int, got {type(dim).__name__}")
        d = int(dim)
        if not -nd <= d < nd:
            raise IndexError(f"{what}: dim {d} is out of range for a {len(self.shape)}-D tensor "
                             f"(expected {-nd}..{nd - 1})")
        return d + nd if d < 0 else d

    def narrow(self, dim: int, start: int, length: int) -> "Tensor":
        """The view of ``length`` entries from ``start`` along ``dim`` (no copy)."""
        d = self._dim(dim, "narrow")
        size = self.shape[d]
        if type(start) is not int or type(length) is not int:
            for name, v in (("start", start), ("length", length)):
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                    raise TypeError(f"narrow: {name} must be an int, got {type(v).__name__}")
            start, length = int(start), int(length)
        if start < 0:
            start += size
        if not 0 <= start <= size:
            raise IndexError(f"narrow: start {start} is out of range for dim {d} of size {size}")
        if length < 0 or start + length > size:
            raise ValueError(f"narrow: start ({start}) + length ({length}) exceeds dimension size "
                             f"({size}) of dim {d}")
        shape = self.shape[:d] + (length,) + self.shape[d + 1:]
        ptr = self.ptr + start * self.strides[d] * self.dtype.itemsize if start else self.ptr
        return Tensor._make(ptr, shape, self.strides, self.dtype, self.device, self, self.readonly)

    def unsqueeze(self, dim: int) -> "Tensor":
        """The view with a size-1 dimension inserted at ``dim`` (PyTorch's stride rule)."""
        d = self._dim(dim, "unsqueeze", extra=1)
        stride = self.shape[d] * self.strides[d] if d < len(self.shape) else 1
        return Tensor._make(self.ptr, self.shape[:d] + (1,) + self.shape[d:],
                            self.strides[:d] + (stride,) + self.strides[d:], self.dtype,
                            self.device, self, self.readonly)

    # -- host copies --
    def numpy(self, stream: StreamLike | None = None) -> np.ndarray:
        """Copy to a new C-contiguous host array of the logical shape (honours the strides).

        The copy is ordered on ``stream`` (default: the legacy default stream) and waited for.
        """
        shape, strides, dtype = self.shape, self.strides, self.dtype
        span = span_elements(shape, strides)
        if span == 0:
            return np.empty(shape, dtype)
        host = np.empty(span, dtype)
        with _mem.device_guard(self.device):
            _mem.copy_device_to_host(host, self.ptr, stream)
        item = dtype.itemsize
        view = np.lib.stride_tricks.as_strided(host, shape, tuple(s * item for s in strides))
        return np.array(view, copy=True, order="C")

    # -- interop out --
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA Array Interface v3. Strides in bytes, or None when C-contiguous. bfloat16 has no
        CAI type string and is exported as ``'<V2'``: consumers that need bfloat16 should use
        DLPack. ``stream`` is None: pycudnn keeps no record of pending work (see module doc).
        ``data[1]`` is `readonly`."""
        item = self.dtype.itemsize
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, self.readonly),
            "strides": None if is_contiguous_strides(self.shape, self.strides)
            else tuple(s * item for s in self.strides),
            "version": 3,
            "stream": None,
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        return (kDLCUDA, self.device)

    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """A DLPack capsule viewing this tensor (no copy).

        ``max_version >= (1, 0)`` gives a versioned ``"dltensor_versioned"`` capsule, otherwise a
        legacy ``"dltensor"`` one; a versioned capsule of a `readonly` tensor has
        ``DLPACK_FLAG_BITMASK_READ_ONLY`` set (a legacy one cannot say so). ``stream`` is accepted and not synchronised on (see the module
        docstring). ``copy=True`` and a ``dl_device`` other than this tensor's raise BufferError.
        """
        if dl_device is not None and tuple(dl_device) != (kDLCUDA, self.device):
            raise BufferError(f"pycudnn.Tensor.__dlpack__: cannot export to dl_device {dl_device}; "
                              f"the tensor is on {(kDLCUDA, self.device)} and copies are not supported")
        if copy:
            raise BufferError("pycudnn.Tensor.__dlpack__: copy=True is not supported (zero-copy only)")
        versioned = max_version is not None and int(max_version[0]) >= 1
        return _export_dlpack(self, versioned)

    def __repr__(self) -> str:
        return (f"Tensor(shape={self.shape}, dtype={self.dtype.name}, strides={self.strides}, "
                f"device={self.device}, ptr={self.ptr:#x}" + (", readonly=True)" if self.readonly else ")"))


def check_writable(t: Tensor, parameter: str) -> None:
    """Refuse a read-only tensor where a function would write it.

    Args:
        t: the tensor the call writes.
        parameter: how the message names it, e.g. ``"out"`` or ``"prepared convolution: out"``.

    Raises:
        ValueError: ``t.readonly`` is set.
    """
    if t.readonly:
        raise ValueError(f"{parameter}: is read-only (its producer marked the memory read-only), "
                         "and this call writes it; pass a writable tensor")


def _check_readonly(readonly: Any, what: str) -> bool:
    if type(readonly) is not bool:
        raise TypeError(f"{what}: readonly must be a bool, got {type(readonly).__name__}")
    return readonly


def check_pointer(ptr: Any, what: str, parameter: str = "ptr") -> int:
    """A device address as an int in [0, 2**64): the one check tensor_from_pointer and every
    importer apply. Bools and floats are refused, and so are values out of range (a c_void_p
    argument would pass a value past 64 bits to C wrapped, without a word)."""
    if isinstance(ptr, bool):
        raise TypeError(f"{what}: {parameter} must be a non-negative int (a device address), got bool")
    try:
        p = operator.index(ptr)
    except TypeError:
        if type(ptr).__name__ not in ("CUdeviceptr", "cudaDevicePtr"):
            raise TypeError(f"{what}: {parameter} must be a non-negative int (a device address), "
                            f"got {type(ptr).__name__}") from None
        p = int(ptr)
    if not 0 <= p < 1 << 64:
        raise ValueError(f"{what}: {parameter} must be a non-negative 64-bit address, got {p}")
    return p


def _validate_view(ptr: Any, shape: Any, dtype: Any, strides: Any, device: Any,
                   what: str) -> tuple[int, tuple, np.dtype, tuple, int]:
    p = check_pointer(ptr, what)
    shp = int_tuple(shape, "shape", what)
    dt = normalize_dtype(dtype, f"{what}: dtype")
    if strides is None:
        st = contiguous_strides(shp)
    else:
        st = int_tuple(strides, "strides (in elements)", what)
        if len(st) != len(shp):
            raise ValueError(f"{what}: strides has {len(st)} entries but shape {shp} has {len(shp)} "
                             "dimensions")
    if isinstance(device, bool):
        raise TypeError(f"{what}: device must be a device ordinal (int), got bool")
    try:
        dev = operator.index(device)
    except TypeError:
        raise TypeError(f"{what}: device must be a device ordinal (int), got "
                        f"{type(device).__name__}") from None
    if dev < 0:
        raise ValueError(f"{what}: device must be >= 0, got {dev}")
    if p % dt.itemsize:
        raise ValueError(f"{what}: ptr {p:#x} is not aligned to the {dt.name} element size "
                         f"({dt.itemsize} bytes)")
    if p == 0 and span_elements(shp, st):
        raise ValueError(f"{what}: ptr is null but shape {shp} has elements")
    return p, shp, dt, st, dev


def tensor_from_pointer(ptr: int, shape: Sequence[int], dtype: DTypeLike,
                        strides: Sequence[int] | None = None, device: int = 0,
                        owner: object = None, *, readonly: bool = False) -> Tensor:
    """A `Tensor` viewing raw device memory (e.g. a cuda-python
    ``cuMemAlloc`` result).

    Args:
        ptr: device address (an int, a ``CUdeviceptr``); 0 only for a tensor without elements.
        shape: sizes.
        dtype: numpy dtype or name ('float32', 'float16', 'bfloat16', 'float64').
        strides: in elements (default: C-contiguous); never negative.
        device: device ordinal the memory lives on.
        owner: object to keep alive as long as the view.
        readonly: the memory must not be written: pycudnn refuses the tensor as an output.

    Raises:
        TypeError / ValueError naming the bad parameter.
    """
    p, shp, dt, st, dev = _validate_view(ptr, shape, dtype, strides, device, "tensor_from_pointer")
    return Tensor._make(p, shp, st, dt, dev, owner, _check_readonly(readonly, "tensor_from_pointer"))


_EXPORT_DUMMY = (ctypes.c_char * 8)()  # host bytes numpy's exported array points at (never read)
_EXPORT_DUMMY_ADDR = ctypes.addressof(_EXPORT_DUMMY)


class _DLPackExport:
    """The base of the numpy array whose DLPack capsule is repurposed: keeps the Tensor and the
    shape/strides arrays alive until the consumer calls the deleter (or the capsule dies unused)."""

    __slots__ = ("tensor", "shape", "strides")

    def __init__(self, tensor: Tensor) -> None:
        self.tensor = tensor
        nd = len(tensor.shape)
        self.shape = (c_int64 * nd)(*tensor.shape)
        self.strides = (c_int64 * nd)(*tensor.strides)

    @property
    def __array_interface__(self) -> dict[str, Any]:
        return {"data": (_EXPORT_DUMMY_ADDR, False), "shape": (1,), "typestr": "|u1", "version": 3}


def _export_dlpack(tensor: Tensor, versioned: bool) -> Any:
    holder = _DLPackExport(tensor)
    carrier = np.asarray(holder)  # base: holder; numpy's DLPack deleter drops it
    capsule = None
    if versioned:
        try:
            capsule = carrier.__dlpack__(max_version=(1, 0))
        except TypeError:  # numpy < 2.1: legacy capsules only
            capsule = None
    if capsule is None:
        capsule = carrier.__dlpack__()
    try:
        m = dlpack_managed(capsule)
    except TypeError:  # pragma: no cover - numpy always names its capsules
        raise BufferError("pycudnn.Tensor.__dlpack__: numpy returned an unexpected capsule") from None
    if type(m) is DLManagedTensorVersioned:
        m.flags = DLPACK_FLAG_BITMASK_READ_ONLY if tensor.readonly else 0  # and not a copy
    code, bits = DL_CODES[tensor.dtype.name]
    t = m.dl_tensor
    t.data = tensor.ptr or None
    t.device.device_type = kDLCUDA
    t.device.device_id = tensor.device
    t.ndim = len(tensor.shape)
    t.dtype.code = code
    t.dtype.bits = bits
    t.dtype.lanes = 1
    t.shape = ctypes.addressof(holder.shape)
    t.strides = ctypes.addressof(holder.strides)
    t.byte_offset = 0
    return capsule
