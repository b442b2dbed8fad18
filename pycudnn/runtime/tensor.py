"""The device tensor view, allocation through cuda.core, and interop in and out.

A [`Tensor`][pycudnn.runtime.tensor.Tensor] is a view of device memory: pointer, shape, strides (in
elements), dtype, device, and an optional ``owner`` that keeps the memory alive. Building one needs
no GPU. pycudnn's functions take anything [`as_tensor()`][pycudnn.runtime.tensor.as_tensor] accepts and
never copy it.

**In** ([`as_tensor()`][pycudnn.runtime.tensor.as_tensor], zero-copy, checked in this order):

1. a [`Tensor`][pycudnn.runtime.tensor.Tensor]: returned as is;
2. a PyTorch tensor (recognised only when ``torch`` is already imported): its attributes are read
   directly (``data_ptr()``, ``shape``, ``stride()``, ``dtype``, ``get_device()``), which is the
   fastest path and also covers bfloat16 and tensors that require grad (pycudnn does no autograd;
   the result simply is not tracked). No stream synchronisation, as with CAI v2 which PyTorch
   exports: pass PyTorch's current stream to the operation;
3. ``__cuda_array_interface__`` (CuPy, Numba, ...), read once. Version 3's ``stream`` is honoured:
   when it differs from the consumer's stream (``stream=`` of
   [`as_tensor()`][pycudnn.runtime.tensor.as_tensor], default the legacy default stream) the consumer waits
   on it through an event. CAI has no bfloat16 type
   string: ``'<V2'`` is read as bfloat16 (and pycudnn exports bfloat16 as ``'<V2'``). A CuPy
   ``ndarray`` (recognised when ``cupy`` is imported) is read through its attributes instead
   (CuPy builds the interface dictionary on every access), with the interface's stream rule:
   CuPy's current stream, its null stream as the default stream it exports, nothing under
   ``CUPY_CUDA_ARRAY_INTERFACE_EXPORT_VERSION=2``;
4. ``__dlpack__`` / ``__dlpack_device__`` (JAX, PyTorch, CuPy, ...): called with the consumer's
   stream (the legacy default stream is passed as 1, as the DLPack spec requires) and
   ``max_version=(1, 0)``, falling back to a legacy capsule. The producer's deleter runs when the
   Tensor (its owner) is garbage-collected.

Host arrays (numpy, CPU torch tensors, lists) are refused with a TypeError pointing at
[`from_numpy()`][pycudnn.runtime.tensor.from_numpy]. Negative strides are refused (cuDNN cannot use them),
and so is a device address that is not an int in ``[0, 2**64)`` (a bool, a float, a negative or too
large number), with the same check as [`tensor_from_pointer()`][pycudnn.runtime.tensor.tensor_from_pointer].

**Read-only** memory stays read-only: the flag of CAI (``data[1]``) and of versioned DLPack
(``DLPACK_FLAG_BITMASK_READ_ONLY``) becomes `Tensor.readonly`, views of the tensor inherit
it, and every pycudnn function refuses a read-only tensor where it would write (``out=``) with
a ValueError naming the parameter (`check_writable()`). It is exported again through CAI and
versioned DLPack. Legacy DLPack capsules and PyTorch tensors carry no such flag (writable).

**Out**: ``__cuda_array_interface__`` (version 3, ``stream: None``) and ``__dlpack__``. DLPack
capsules are built with ctypes on top of a numpy-made ``DLManagedTensor``: numpy's C deleter and
capsule destructor own the lifetime (they keep the Tensor alive through the numpy array's base and
save any in-flight Python exception), and pycudnn overwrites the descriptive fields (data, device,
dtype, shape, strides) to describe the device memory. Pure-Python ctypes callbacks as deleters
would break when a consumer frees the tensor while an exception is propagating (CPython then runs
the callback with the exception set and turns it into a SystemError). pycudnn tracks no pending
work: its operations are ordered on the stream the caller passed, so ``__dlpack__(stream=...)``
does not synchronise; order the consumer's stream after pycudnn's yourself (same stream, or an
event) as with any CUDA library.

**memory_format** follows PyTorch's ``suggest_memory_format`` (what ``cudnn_conv_suggest_memory_format``
looks at): a 4-D tensor whose strides are ordered like NHWC (``is_channels_last_strides_2d``) or a
5-D one ordered like NDHWC is ``"channels_last"``; everything else, including ambiguous strides and
non-dense views, is ``"contiguous"``. ``"channels_last_3d"`` is accepted as an input spelling for
5-D tensors. ``channels_last`` for shapes other than 4-D and 5-D is refused (PyTorch has none).
"""

from __future__ import annotations

import ctypes
import math
import operator
import sys
import weakref
from ctypes import (c_char_p, c_int, c_int32, c_int64, c_uint8, c_uint16, c_uint32, c_uint64,
                    c_void_p)
from typing import Any, Sequence

import numpy as np

from .._types import SUPPORTED_DTYPES, normalize_dtype
from . import memory as _mem

__all__ = ["Tensor", "as_tensor", "tensor_from_pointer", "empty", "zeros", "from_numpy",
           "span_elements", "contiguous_strides", "channels_last_strides", "MEMORY_FORMATS",
           "has_internal_overlap", "spans_overlap", "views_overlap", "check_writable",
           "dlpack_managed"]

#: memory_format spellings accepted by [`empty()`][pycudnn.runtime.tensor.empty],
#: [`from_numpy()`][pycudnn.runtime.tensor.from_numpy] and ``is_contiguous``
MEMORY_FORMATS = ("contiguous", "channels_last", "channels_last_3d")

_F32: np.dtype = np.dtype("float32")
_F16: np.dtype = np.dtype("float16")
_F64: np.dtype = np.dtype("float64")
_bf16: np.dtype | None = None


def _bfloat16() -> np.dtype:
    global _bf16
    if _bf16 is None:
        _bf16 = normalize_dtype("bfloat16")
    return _bf16


_TYPESTR: dict[str, np.dtype] = {"<f4": _F32, "<f2": _F16, "<f8": _F64, "=f4": _F32, "=f2": _F16, "=f8": _F64}
_BF16_TYPESTRS = ("<V2", "|V2", "=V2")
_EXPECTED = ", ".join(SUPPORTED_DTYPES)

# DLPack
_kDLCPU, _kDLCUDA, _kDLCUDAHost, _kDLCUDAManaged = 1, 2, 3, 13
_kDLFloat, _kDLBfloat = 2, 4
_DL_CODES = {"float32": (_kDLFloat, 32), "float16": (_kDLFloat, 16), "float64": (_kDLFloat, 64),
             "bfloat16": (_kDLBfloat, 16)}
_DL_DEVICE_NAMES = {1: "kDLCPU", 2: "kDLCUDA", 3: "kDLCUDAHost", 4: "kDLOpenCL", 7: "kDLVulkan",
                    8: "kDLMetal", 9: "kDLVPI", 10: "kDLROCM", 11: "kDLROCMHost", 12: "kDLExtDev",
                    13: "kDLCUDAManaged", 14: "kDLOneAPI"}


# ---- shapes and strides -------------------------------------------------------------------------

def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """C-order (row-major) strides in elements (a size-0 dim counts as 1, as in PyTorch)."""
    out = []
    acc = 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n or 1
    out.reverse()
    return tuple(out)


def channels_last_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Strides (in elements) of a 4-D NCHW shape stored NHWC, or a 5-D NCDHW shape stored NDHWC."""
    nd = len(shape)
    if nd not in (4, 5):
        raise ValueError(f"memory_format: 'channels_last' needs a 4-D (N, C, H, W) or 5-D "
                         f"(N, C, D, H, W) shape, got {nd}-D {tuple(shape)}")
    strides = [0] * nd
    acc = 1
    for d in [1] + list(range(nd - 1, 1, -1)) + [0]:  # C fastest, then W, H, (D), N
        strides[d] = acc
        acc *= max(shape[d], 1)
    return tuple(strides)


def span_elements(shape: Sequence[int], strides: Sequence[int]) -> int:
    """Elements spanned in memory by a strided view (0 when it has no element)."""
    span = 1
    for n, s in zip(shape, strides):
        if n == 0:
            return 0
        span += (n - 1) * s
    return span


#: views of at most this many elements are checked for overlap element by element when the quick
#: rules cannot tell; larger exotic layouts are let through, as PyTorch does ("too hard")
_OVERLAP_EXACT_MAX = 1 << 16


def _offsets(shape: Sequence[int], strides: Sequence[int]) -> np.ndarray:
    """Every element's offset (in elements) from the view's start, sorted."""
    off: np.ndarray = np.zeros((), np.int64)
    for n, s in zip(shape, strides):
        off = np.add.outer(off, np.arange(n, dtype=np.int64) * s)
    return np.sort(off, axis=None)


def has_internal_overlap(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether two elements of a view share memory (an output like that is undefined).

    Exact for every layout a view can be made of a dense buffer (permuted, padded, sliced); a
    zero stride on a dim of size > 1, or more elements than the span has places, always is one.
    Other interleaved layouts are checked element by element up to ``_OVERLAP_EXACT_MAX`` elements
    and let through above (never a false refusal)."""
    dims = sorted((s, n) for n, s in zip(shape, strides) if n > 1)
    reach = 0  # the largest offset the smaller-stride dims reach
    for s, n in dims:
        if s <= reach:
            break
        reach += (n - 1) * s
    else:
        return False  # each dim steps past everything the smaller ones span
    if any(s == 0 for s, _ in dims):
        return True
    count = math.prod(n for _, n in dims)
    if count > span_elements(shape, strides):
        return True  # more elements than places
    if count > _OVERLAP_EXACT_MAX:
        return False
    off = _offsets(shape, strides)
    return bool(np.any(off[1:] == off[:-1]))


def spans_overlap(a: "Tensor", b: "Tensor") -> bool:
    """Whether the memory spans of two tensors intersect (conservative: by extent)."""
    if a.size == 0 or b.size == 0:
        return False
    return a.ptr < b.ptr + b.span_bytes and b.ptr < a.ptr + a.span_bytes


def views_overlap(a: "Tensor", b: "Tensor") -> bool:
    """Whether an element of ``a`` shares a byte with an element of ``b``.

    False when their spans are apart; True when they start at the same address or are both dense
    (no gaps in their spans); otherwise exact up to ``_OVERLAP_EXACT_MAX`` elements each, and
    False above (interleaved views of one buffer are legitimate: never a false refusal)."""
    if not spans_overlap(a, b):
        return False
    a0, b0 = a.ptr, b.ptr
    if a0 == b0 or (a.span_bytes == a.nbytes and b.span_bytes == b.nbytes):
        return True
    if a.size > _OVERLAP_EXACT_MAX or b.size > _OVERLAP_EXACT_MAX:
        return False
    sa = a0 + _offsets(a.shape, a.strides) * a.dtype.itemsize  # byte starts, sorted
    sb = b0 + _offsets(b.shape, b.strides) * b.dtype.itemsize
    # an element [p, p + size) of a meets one of b iff some start of b lies in (p - b_item, p + a_item)
    lo = np.searchsorted(sb, sa - b.dtype.itemsize, side="right")
    hi = np.searchsorted(sb, sa + a.dtype.itemsize, side="left")
    return bool(np.any(hi > lo))


def _is_contiguous(shape: tuple, strides: tuple) -> bool:
    expected = 1
    for i in range(len(shape) - 1, -1, -1):
        n = shape[i]
        if n == 0:
            return True
        if n != 1:
            if strides[i] != expected:
                return False
            expected *= n
    return True


def _is_channels_last_contiguous(shape: tuple, strides: tuple) -> bool:
    """PyTorch's compute_channels_last_contiguous_2d / _3d (size-1 dims are ignored)."""
    order = (1, 3, 2, 0) if len(shape) == 4 else (1, 4, 3, 2, 0)
    expected = 1
    for d in order:
        n = shape[d]
        if n != 1:
            if strides[d] != expected:
                return False
            expected *= n
    return True


def _strides_like_channels_last(shape: tuple, strides: tuple) -> bool:
    """PyTorch's is_channels_last_strides_2d_s4 / 3d_s5: strides ordered C < W < H (< D) < N."""
    order = (1, 3, 2, 0) if len(shape) == 4 else (1, 4, 3, 2, 0)
    if strides[1] == 0:  # trivial C dimension: default to contiguous
        return False
    minimum = 0
    for d in order:
        if shape[d] == 0:
            return False
        if strides[d] < minimum:
            return False
        # N111 with identical strides, or N11W sliced on W: ambiguous, default to contiguous
        if d == 0 and minimum == strides[1]:
            return False
        minimum = strides[d]
        if shape[d] > 1:
            minimum *= shape[d]
    return True


def _type_name(obj: Any) -> str:
    t = type(obj)
    mod = t.__module__
    return t.__qualname__ if mod == "builtins" else f"{mod}.{t.__qualname__}"


def _int_tuple(value: Any, parameter: str, what: str) -> tuple[int, ...]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (value,)
    try:
        items = tuple(value)
    except TypeError:
        raise TypeError(f"{what}: {parameter} must be a sequence of ints, got "
                        f"{type(value).__name__}") from None
    out = []
    for v in items:
        if isinstance(v, (bool, np.bool_)):  # NumPy < 2.3's bool_ has __index__: never a size
            raise TypeError(f"{what}: {parameter} must be a sequence of ints, got {value!r}")
        try:
            v = operator.index(v)
        except TypeError:
            raise TypeError(f"{what}: {parameter} must be a sequence of ints, got {value!r}") from None
        if v < 0:
            raise ValueError(f"{what}: {parameter} must be non-negative, got {tuple(items)}")
        out.append(v)
    return tuple(out)


def _check_format(memory_format: Any, ndim: int, what: str) -> str:
    if memory_format == "contiguous":
        return "contiguous"
    if memory_format == "channels_last":
        if ndim not in (4, 5):
            raise ValueError(f"{what}: memory_format='channels_last' needs a 4-D (N, C, H, W) or 5-D "
                             f"(N, C, D, H, W) shape, got {ndim}-D; PyTorch has no channels_last for "
                             "other ranks; use memory_format='contiguous'")
        return "channels_last"
    if memory_format == "channels_last_3d":
        if ndim != 5:
            raise ValueError(f"{what}: memory_format='channels_last_3d' needs a 5-D (N, C, D, H, W) "
                             f"shape, got {ndim}-D")
        return "channels_last"
    raise ValueError(f"{what}: memory_format must be one of {', '.join(map(repr, MEMORY_FORMATS))}, "
                     f"got {memory_format!r}")


# ---- the tensor ---------------------------------------------------------------------------------

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
            of it ([`narrow()`][pycudnn.runtime.tensor.Tensor.narrow],
            [`unsqueeze()`][pycudnn.runtime.tensor.Tensor.unsqueeze]) are read-only too.
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

    def __init__(self, ptr: int, shape: Sequence[int], dtype: Any, strides: Sequence[int] | None = None,
                 device: int = 0, owner: Any = None, *, readonly: bool = False) -> None:
        ptr, shape, dtype, strides, device = _validate_view(ptr, shape, dtype, strides, device, "Tensor")
        self.ptr = ptr
        self.shape = shape
        self.strides = strides
        self.dtype = dtype
        self.device = device
        self.owner = owner
        self.readonly = _check_readonly(readonly, "Tensor")
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
            if nd in (4, 5) and _strides_like_channels_last(self.shape, self.strides):
                fmt = "channels_last"
            self._fmt = fmt
        return fmt

    def is_contiguous(self, memory_format: str = "contiguous") -> bool:
        """Whether the view is dense in ``memory_format`` (strides of size-1 dims are ignored).

        ``"channels_last"`` is NHWC for 4-D and NDHWC for 5-D tensors (False for other ranks);
        ``"channels_last_3d"`` is NDHWC for 5-D tensors.
        """
        if memory_format == "contiguous":
            return _is_contiguous(self.shape, self.strides)
        if memory_format == "channels_last":
            return len(self.shape) in (4, 5) and _is_channels_last_contiguous(self.shape, self.strides)
        if memory_format == "channels_last_3d":
            return len(self.shape) == 5 and _is_channels_last_contiguous(self.shape, self.strides)
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
    def numpy(self, stream: Any = None) -> np.ndarray:
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
            "strides": None if _is_contiguous(self.shape, self.strides)
            else tuple(s * item for s in self.strides),
            "version": 3,
            "stream": None,
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_kDLCUDA, self.device)

    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """A DLPack capsule viewing this tensor (no copy).

        ``max_version >= (1, 0)`` gives a versioned ``"dltensor_versioned"`` capsule, otherwise a
        legacy ``"dltensor"`` one; a versioned capsule of a `readonly` tensor has
        ``DLPACK_FLAG_BITMASK_READ_ONLY`` set (a legacy one cannot say so). ``stream`` is accepted and not synchronised on (see the module
        docstring). ``copy=True`` and a ``dl_device`` other than this tensor's raise BufferError.
        """
        if dl_device is not None and tuple(dl_device) != (_kDLCUDA, self.device):
            raise BufferError(f"pycudnn.Tensor.__dlpack__: cannot export to dl_device {dl_device}; "
                              f"the tensor is on {(_kDLCUDA, self.device)} and copies are not supported")
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


def _check_ptr(ptr: Any, what: str, parameter: str = "ptr") -> int:
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
    p = _check_ptr(ptr, what)
    shp = _int_tuple(shape, "shape", what)
    dt = normalize_dtype(dtype, f"{what}: dtype")
    if strides is None:
        st = contiguous_strides(shp)
    else:
        st = _int_tuple(strides, "strides (in elements)", what)
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


def tensor_from_pointer(ptr: int, shape: Sequence[int], dtype: Any, strides: Sequence[int] | None = None,
                        device: int = 0, owner: Any = None, *, readonly: bool = False) -> Tensor:
    """A [`Tensor`][pycudnn.runtime.tensor.Tensor] viewing raw device memory (e.g. a cuda-python
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


# ---- interop in ---------------------------------------------------------------------------------

def _host_refusal(obj: Any, where: str = "") -> TypeError:
    return TypeError("as_tensor: expected a CUDA device array (with __cuda_array_interface__ or "
                     f"__dlpack__ on a CUDA device), got {_type_name(obj)}{where}; use "
                     "pycudnn.from_numpy(...) to copy host data")


def _unsupported(dtype_desc: str) -> TypeError:
    return TypeError(f"as_tensor: unsupported dtype {dtype_desc}; expected one of {_EXPECTED}")


_torch_dtypes: dict[Any, np.dtype] | None = None


def _torch_dtype(torch: Any, tdtype: Any) -> np.dtype:
    global _torch_dtypes
    table = _torch_dtypes
    if table is None:
        table = _torch_dtypes = {torch.float32: _F32, torch.float16: _F16, torch.float64: _F64}
    dt = table.get(tdtype)
    if dt is None:
        if tdtype is not torch.bfloat16:
            raise _unsupported(str(tdtype))
        dt = table[tdtype] = _bfloat16()  # imports ml_dtypes only when bfloat16 is met
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
    dt = _TYPESTR.get(typestr)
    if dt is None and typestr in _BF16_TYPESTRS:
        dt = _bfloat16()
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
        raise TypeError(f"as_tensor: {_type_name(obj)}.__cuda_array_interface__ lacks shape, typestr "
                        "or data") from None
    dtype = _typestr_dtype(typestr)
    if dtype is None:
        if hasattr(obj, "__dlpack__"):
            return _from_dlpack(obj, consumer)
        raise _unsupported(f"{_typestr_name(typestr)} (CUDA Array Interface typestr {typestr!r})")
    if cai.get("mask") is not None:
        raise TypeError("as_tensor: masked arrays (a __cuda_array_interface__ mask) are not supported")
    source = f"{_type_name(obj)}.__cuda_array_interface__"
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise TypeError(f"as_tensor: {source} data must be a (pointer, read-only flag) pair, got "
                        f"{data!r}")
    # a zero-size array may give None as its pointer (older CAI producers)
    ptr = 0 if data[0] is None else _check_ptr(data[0], "as_tensor", f"{source} data[0]")
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
        if producer is not None and not _mem.same_stream(int(producer), consumer):
            _mem.stream_wait(consumer, int(producer))
    mod = type(obj).__module__
    if mod.startswith("cupy"):
        device = obj.device.id
    else:
        device = _mem.pointer_device(ptr)
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
        if not _mem.same_stream(producer, consumer):
            _mem.stream_wait(consumer, producer)
    elif version != 2:
        return None
    return Tensor._make(ptr, shape, strides, dtype, memory.device_id, obj, False)


def _typestr_name(typestr: Any) -> str:
    try:
        dt = np.dtype(typestr)
    except Exception:
        return repr(typestr)
    return dt.name if dt.isnative or dt.itemsize == 1 else f"big-endian {dt.name}"


# DLPack C structures (dlpack.h, versions 0.x legacy and 1.x versioned)
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", c_void_p), ("device", _DLDevice), ("ndim", c_int32), ("dtype", _DLDataType),
                ("shape", c_void_p), ("strides", c_void_p), ("byte_offset", c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", c_void_p), ("deleter", c_void_p)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", _DLPackVersion), ("manager_ctx", c_void_p), ("deleter", c_void_p),
                ("flags", c_uint64), ("dl_tensor", _DLTensor)]


_capi = ctypes.pythonapi
_PyCapsule_IsValid = ctypes.PYFUNCTYPE(c_int, ctypes.py_object, c_char_p)(("PyCapsule_IsValid", _capi))
_PyCapsule_GetPointer = ctypes.PYFUNCTYPE(c_void_p, ctypes.py_object, c_char_p)(
    ("PyCapsule_GetPointer", _capi))
_PyCapsule_SetName = ctypes.PYFUNCTYPE(c_int, ctypes.py_object, c_char_p)(("PyCapsule_SetName", _capi))
_DELETER = ctypes.PYFUNCTYPE(None, c_void_p)  # producers' deleters, called with the GIL held

_DLTENSOR = b"dltensor"
_DLTENSOR_VERSIONED = b"dltensor_versioned"
_USED_DLTENSOR = b"used_dltensor"
_USED_DLTENSOR_VERSIONED = b"used_dltensor_versioned"
_DLPACK_FLAG_BITMASK_READ_ONLY = 1 << 0  # dlpack.h, versioned capsules only


def dlpack_managed(capsule: Any) -> Any:
    """The structure an unconsumed DLPack capsule points at, as a ctypes structure over the
    producer's memory: ``DLManagedTensorVersioned`` (fields ``version``, ``flags``, ``dl_tensor``,
    ...) for a ``"dltensor_versioned"`` capsule, ``DLManagedTensor`` (``dl_tensor``, ...) for a
    legacy ``"dltensor"`` one, with the field names of ``dlpack.h``. Reading it copies nothing;
    writing a field changes what the consumer of the capsule will read.

    Raises:
        TypeError: ``capsule`` is not an unconsumed DLPack capsule.
    """
    if _PyCapsule_IsValid(capsule, _DLTENSOR_VERSIONED):
        return _DLManagedTensorVersioned.from_address(_PyCapsule_GetPointer(capsule, _DLTENSOR_VERSIONED))
    if _PyCapsule_IsValid(capsule, _DLTENSOR):
        return _DLManagedTensor.from_address(_PyCapsule_GetPointer(capsule, _DLTENSOR))
    raise TypeError(f"dlpack_managed: expected an unconsumed DLPack capsule, got {_type_name(capsule)}")


def _call_deleter(deleter: int, managed: int) -> None:
    _DELETER(deleter)(managed)


class _DLPackImport:
    """Owner of memory imported through DLPack: keeps the source object alive and calls the
    producer's deleter when collected (a weakref.finalize, so an in-flight exception is saved)."""

    __slots__ = ("source", "__weakref__")

    def __init__(self, source: Any, managed: int, deleter: int | None) -> None:
        self.source = source
        if deleter:
            weakref.finalize(self, _call_deleter, deleter, managed).atexit = False


def _from_dlpack(obj: Any, consumer: int) -> Tensor:
    try:
        dev_type, _dev_id = obj.__dlpack_device__()
    except AttributeError:
        raise _host_refusal(obj) from None
    dev_type = int(dev_type)
    if dev_type == _kDLCPU:
        raise _host_refusal(obj)
    if dev_type == _kDLCUDAHost:
        raise _host_refusal(obj, " (pinned host memory, DLPack kDLCUDAHost)")
    if dev_type not in (_kDLCUDA, _kDLCUDAManaged):
        raise TypeError(f"as_tensor: {_type_name(obj)} is on DLPack device "
                        f"{_DL_DEVICE_NAMES.get(dev_type, dev_type)}, not a CUDA device")
    dl_stream = 1 if consumer == 0 else consumer  # the DLPack spec forbids 0 for CUDA
    try:
        capsule = obj.__dlpack__(stream=dl_stream, max_version=(1, 0))
    except TypeError:
        capsule = obj.__dlpack__(stream=dl_stream)
    m: Any
    if _PyCapsule_IsValid(capsule, _DLTENSOR_VERSIONED):
        managed = _PyCapsule_GetPointer(capsule, _DLTENSOR_VERSIONED)
        m = _DLManagedTensorVersioned.from_address(managed)
        if m.version.major > 1:
            raise BufferError(f"as_tensor: {_type_name(obj)} exported DLPack "
                              f"{m.version.major}.{m.version.minor}; pycudnn reads 1.x")
        used = _USED_DLTENSOR_VERSIONED
        readonly = bool(m.flags & _DLPACK_FLAG_BITMASK_READ_ONLY)
    elif _PyCapsule_IsValid(capsule, _DLTENSOR):
        managed = _PyCapsule_GetPointer(capsule, _DLTENSOR)
        m = _DLManagedTensor.from_address(managed)
        used = _USED_DLTENSOR
        readonly = False  # a legacy capsule has no flags
    else:
        raise TypeError(f"as_tensor: {_type_name(obj)}.__dlpack__ did not return a DLPack capsule")
    t = m.dl_tensor
    if t.device.device_type not in (_kDLCUDA, _kDLCUDAManaged):
        raise _host_refusal(obj, f" (DLPack device {_DL_DEVICE_NAMES.get(t.device.device_type)})")
    code, bits, lanes = t.dtype.code, t.dtype.bits, t.dtype.lanes
    dtype: np.dtype | None = None
    if lanes == 1:
        if code == _kDLFloat:
            dtype = {32: _F32, 16: _F16, 64: _F64}.get(bits)
        elif code == _kDLBfloat and bits == 16:
            dtype = _bfloat16()
    if dtype is None:
        names = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 5: "complex", 6: "bool"}
        raise _unsupported(f"{names.get(code, f'code {code} ')}{bits}"
                           + (f"x{lanes}" if lanes != 1 else "") + " (DLPack)")
    ndim = t.ndim
    if ndim < 0 or (ndim and not t.shape):
        raise TypeError(f"as_tensor: {_type_name(obj)} exported a malformed DLPack tensor "
                        f"(ndim {ndim}, shape pointer {t.shape})")
    shape = tuple((c_int64 * ndim).from_address(t.shape)) if ndim else ()
    if t.strides and ndim:
        strides = tuple((c_int64 * ndim).from_address(t.strides))
        if any(s < 0 for s in strides):
            raise ValueError(f"as_tensor: negative strides {strides} are not supported by cuDNN")
    else:
        strides = contiguous_strides(shape)
    source = f"{_type_name(obj)}.__dlpack__"
    ptr = _check_ptr((t.data or 0) + t.byte_offset, "as_tensor", f"{source} data + byte_offset")
    _check_import(ptr, shape, strides, dtype.itemsize, source)
    device = int(t.device.device_id)
    deleter = m.deleter
    _PyCapsule_SetName(capsule, used)  # consumed: from now on the deleter is ours to call
    return Tensor._make(ptr, shape, strides, dtype, device, _DLPackImport(obj, managed, deleter),
                        readonly)


def as_tensor(obj: Any, *, stream: Any = None) -> Tensor:
    """A zero-copy [`Tensor`][pycudnn.runtime.tensor.Tensor] view of a CUDA device array.

    Args:
        obj: a [`Tensor`][pycudnn.runtime.tensor.Tensor] (returned as is), a PyTorch CUDA tensor, anything
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
    consumer = 0 if stream is None else (stream if type(stream) is int else _mem.resolve_stream(stream))
    torch = sys.modules.get("torch")
    # the class tests first: isinstance() goes through torch's metaclass (~100 ns)
    if torch is not None and obj.__class__ is torch.Tensor:
        return _from_torch(obj, torch)
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
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:
        cai = None
    except Exception as exc:  # e.g. a producer refusing this dtype; try DLPack before giving up
        cai, cai_error = None, exc
    if cai is not None:
        return _from_cai(obj, cai, consumer)
    if hasattr(obj, "__dlpack__"):
        return _from_dlpack(obj, consumer)
    if cai_error is not None:
        raise TypeError(f"as_tensor: {_type_name(obj)}.__cuda_array_interface__ raised "
                        f"{type(cai_error).__name__}: {cai_error}") from cai_error
    raise _host_refusal(obj)


# ---- DLPack export ------------------------------------------------------------------------------

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
    if type(m) is _DLManagedTensorVersioned:
        m.flags = _DLPACK_FLAG_BITMASK_READ_ONLY if tensor.readonly else 0  # and not a copy
    code, bits = _DL_CODES[tensor.dtype.name]
    t = m.dl_tensor
    t.data = tensor.ptr or None
    t.device.device_type = _kDLCUDA
    t.device.device_id = tensor.device
    t.ndim = len(tensor.shape)
    t.dtype.code = code
    t.dtype.bits = bits
    t.dtype.lanes = 1
    t.shape = ctypes.addressof(holder.shape)
    t.strides = ctypes.addressof(holder.strides)
    t.byte_offset = 0
    return capsule


# ---- allocation ---------------------------------------------------------------------------------

def _alloc_view(shape: Any, dtype: Any, memory_format: Any, device: Any, stream: Any,
                what: str) -> Tensor:
    shp = _int_tuple(shape, "shape", what)
    dt = normalize_dtype(dtype, f"{what}: dtype")
    fmt = _check_format(memory_format, len(shp), what)
    strides = channels_last_strides(shp) if fmt == "channels_last" else contiguous_strides(shp)
    n = 1
    for s in shp:
        n *= s
    buf = _mem.allocate(n * dt.itemsize, device, stream, what=what)
    return Tensor._make(buf.ptr, shp, strides, dt, buf.device, buf)


def empty(shape: Sequence[int], dtype: Any = "float32", memory_format: str = "contiguous",
          device: Any = None, stream: Any = None) -> Tensor:
    """An uninitialised device tensor.

    Args:
        shape: sizes (zero sizes are fine: no memory is allocated then, ``ptr`` is 0).
        dtype: numpy dtype or name ('float32', 'float16', 'bfloat16', 'float64').
        memory_format: 'contiguous', or 'channels_last' (NHWC storage of a 4-D NCHW shape, NDHWC
            of a 5-D one; refused for other ranks); 'channels_last_3d' is accepted for 5-D.
        device: device ordinal (default: the current device).
        stream: the allocation is ordered on this stream (default: legacy default stream); the
            memory is freed on it when the tensor is collected, so it must outlive the tensor.
    """
    return _alloc_view(shape, dtype, memory_format, device, stream, "empty")


def zeros(shape: Sequence[int], dtype: Any = "float32", memory_format: str = "contiguous",
          device: Any = None, stream: Any = None) -> Tensor:
    """Like [`empty()`][pycudnn.runtime.tensor.empty], then filled with zeros on ``stream``
    (asynchronously)."""
    t = _alloc_view(shape, dtype, memory_format, device, stream, "zeros")
    n = t.nbytes
    if n:
        with _mem.device_guard(t.device):
            _mem.memset(t.ptr, n, stream)
    return t


def from_numpy(array: Any, dtype: Any = None, memory_format: str = "contiguous", device: Any = None,
               stream: Any = None) -> Tensor:
    """Copy a host array to a new device tensor (waits for the copy).

    Args:
        array: a numpy array or anything ``numpy.asarray`` takes.
        dtype: convert to this dtype first (default: keep the array's, which must be supported).
        memory_format: 'contiguous' or 'channels_last' (the data is stored NHWC / NDHWC).
        device: device ordinal (default: the current device).
        stream: the stream the allocation and copy are ordered on.
    """
    if not isinstance(array, np.ndarray):
        if hasattr(array, "__cuda_array_interface__") or isinstance(array, Tensor):
            raise TypeError(f"from_numpy: {_type_name(array)} is already on a CUDA device; use "
                            "pycudnn.as_tensor(...) to view it without a copy")
        array = np.asarray(array)
    if dtype is None:
        if array.dtype.name not in SUPPORTED_DTYPES:
            raise TypeError(f"from_numpy: array has unsupported dtype {array.dtype.name!r}; expected "
                            f"one of {_EXPECTED}, or pass dtype=... to convert")
        dt = array.dtype
    else:
        dt = normalize_dtype(dtype, "from_numpy: dtype")
        array = array.astype(dt, copy=False)
    if not dt.isnative:
        array = array.astype(dt.newbyteorder("="))
        dt = array.dtype
    fmt = _check_format(memory_format, array.ndim, "from_numpy")
    t = _alloc_view(array.shape, dt, fmt, device, stream, "from_numpy")
    if t.nbytes:
        host = np.moveaxis(array, 1, -1) if fmt == "channels_last" else array
        with _mem.device_guard(t.device):
            _mem.copy_host_to_device(t.ptr, np.ascontiguousarray(host), stream)
    return t
