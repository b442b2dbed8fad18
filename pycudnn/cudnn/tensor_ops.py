"""cuDNN tensor operations used around a convolution, and the scalars and descriptors they share.

``transform`` (a copy with any strides), ``add_tensor``, ``add_bias``, ``relu_``, ``fill_zero``,
1-D tensors viewed as 2-D, and the dense copy of a strided bias that fused epilogues read.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from ..ffi import library as _lib
from ..runtime.handle import get_handle
from ..runtime.memory import memset
from ..runtime.tensor import Tensor, empty, tensor_from_pointer
from .descriptors import ActivationDescriptor, TensorDescriptor

__all__ = ["scalar_pointers", "scalar", "relu_descriptor", "unsqueeze_1d", "tensor_descriptor",
           "transform", "add_tensor", "bias_view", "add_bias", "relu_", "fill_zero",
           "is_contiguous_bias", "contiguous_bias"]


# alpha/beta scalars: float for half, bfloat16 and float data; double for double (kept alive here)
_SCALARS = {
    "float": (ctypes.c_float(1.0), ctypes.c_float(0.0)),
    "double": (ctypes.c_double(1.0), ctypes.c_double(0.0)),
}
_ONE_F, _ZERO_F = (ctypes.addressof(s) for s in _SCALARS["float"])
_ONE_D, _ZERO_D = (ctypes.addressof(s) for s in _SCALARS["double"])


def scalar_pointers(dtype: str) -> tuple[int, int]:
    """Addresses of the constants 1 and 0 in the scaling type cuDNN expects for ``dtype``."""
    return (_ONE_D, _ZERO_D) if dtype == "float64" else (_ONE_F, _ZERO_F)


def scalar(dtype: str, value: float) -> ctypes.c_double | ctypes.c_float:
    """A ctypes scalar in cuDNN's scaling type for ``dtype`` (keep it alive across the call)."""
    return ctypes.c_double(value) if dtype == "float64" else ctypes.c_float(value)


_relu_lock = threading.Lock()
_relu_desc: list[Any] = []


def relu_descriptor() -> ActivationDescriptor:
    """One shared ReLU activation descriptor (never mutated, so threads share it)."""
    if not _relu_desc:
        with _relu_lock:
            if not _relu_desc:
                _relu_desc.append(ActivationDescriptor())
    return _relu_desc[0]


def unsqueeze_1d(t: Tensor) -> Tensor:
    """A 3-D (N, C, L) tensor as 4-D (N, C, 1, L); others unchanged (a view, no copy)."""
    if t.ndim != 3:
        return t
    return t.unsqueeze(2)


# ---- cuDNN tensor operations used around the convolution ---------------------------------------

def tensor_descriptor(t: Tensor) -> TensorDescriptor:
    t4 = unsqueeze_1d(t) if t.ndim == 3 else t
    return TensorDescriptor(t4.shape, t4.dtype, t4.strides)


def transform(handle: int, src: Tensor, dst: Tensor) -> None:
    """``dst = src`` for tensors of one shape with any strides (and dtypes cuDNN converts)."""
    if src.size == 0:
        return
    with tensor_descriptor(src) as sd, tensor_descriptor(dst) as dd:
        one, zero = scalar_pointers(dst.dtype.name if dst.dtype.name == "float64" else "float32")
        st = _lib.lib().cudnnTransformTensor(handle, one, sd.handle, src.ptr, zero, dd.handle, dst.ptr)
        if st:
            _lib.raise_status(st, "cudnnTransformTensor", f"  src: {sd!r}", f"  dst: {dd!r}")


def add_tensor(handle: int, a: Tensor, c: Tensor, alpha: float = 1.0, beta: float = 1.0) -> None:
    """``c = alpha * a + beta * c`` (a broadcast over c where a has unit dims) via cudnnAddTensor."""
    if c.size == 0:
        return
    with tensor_descriptor(a) as ad, tensor_descriptor(c) as cd:
        kind = "float64" if c.dtype.name == "float64" else "float32"
        al = ctypes.c_double(alpha) if kind == "float64" else ctypes.c_float(alpha)
        be = ctypes.c_double(beta) if kind == "float64" else ctypes.c_float(beta)
        st = _lib.lib().cudnnAddTensor(handle, ctypes.addressof(al), ad.handle, a.ptr,
                                       ctypes.addressof(be), cd.handle, c.ptr)
        if st:
            _lib.raise_status(st, "cudnnAddTensor", f"  A: {ad!r}", f"  C: {cd!r}")


def bias_view(bias: Tensor, ndim: int) -> Tensor:
    """The 1-D bias as (1, K, 1, ...) for broadcasting over an ``ndim``-dim output."""
    k = bias.shape[0]
    s = bias.strides[0] if bias.strides else 1
    return tensor_from_pointer(bias.ptr, (1, k) + (1,) * (ndim - 2), bias.dtype,
                               strides=(k * s, s) + (s,) * (ndim - 2), device=bias.device, owner=bias)


def add_bias(handle: int, y: Tensor, bias: Tensor) -> None:
    add_tensor(handle, bias_view(bias, y.ndim), y, 1.0, 1.0)


def relu_(handle: int, y: Tensor) -> None:
    """In-place ReLU through cudnnActivationForward."""
    if y.size == 0:
        return
    act = relu_descriptor()
    with tensor_descriptor(y) as yd:
        one, zero = scalar_pointers(y.dtype.name)
        st = _lib.lib().cudnnActivationForward(handle, act.handle, one, yd.handle, y.ptr, zero,
                                               yd.handle, y.ptr)
        if st:
            _lib.raise_status(st, "cudnnActivationForward", f"  y: {yd!r}")


_ZERO_BYTES = ctypes.c_double(0.0)  # zero in every floating dtype's bit pattern


def fill_zero(t: Tensor, stream: int, handle: int | None = None) -> None:
    """Zero the elements of ``t`` (a dense view with memset; a strided one through cudnnSetTensor,
    so the memory between its elements is left alone)."""
    if not t.size:
        return
    if t.span_bytes == t.nbytes:
        memset(t.ptr, t.nbytes, stream)
        return
    if handle is None:
        handle = get_handle(t.device, stream)
    with tensor_descriptor(t) as d:
        st = _lib.lib().cudnnSetTensor(handle, d.handle, t.ptr, ctypes.addressof(_ZERO_BYTES))
        if st:
            _lib.raise_status(st, "cudnnSetTensor", f"  t: {d!r}")


def is_contiguous_bias(b: Tensor) -> bool:
    """Whether ``b`` holds its K elements contiguously, as fused epilogues read a bias."""
    return b.shape[0] <= 1 or b.strides[0] == 1


def contiguous_bias(b: Tensor, stream: int, handle: int | None = None) -> Tensor:
    """The bias as fused epilogues read it (K contiguous elements): ``b`` itself when it is, else
    a dense copy made on ``stream`` (stream-ordered: allocated, copied and, once dropped, freed on
    it). The full path and prepared calls stage a strided bias through this alike."""
    if is_contiguous_bias(b):
        return b
    if handle is None:
        handle = get_handle(b.device, stream)
    tmp = empty(b.shape, b.dtype, device=b.device, stream=stream)
    transform(handle, bias_view(b, 4), bias_view(tmp, 4))
    return tmp
