"""New device tensors: `empty`, `zeros` and `from_numpy` (a host array copied), allocated through
`pycudnn.runtime.memory` on the caller's stream.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import numpy.typing as npt

from ..._types import SUPPORTED_DTYPES, DTypeLike, normalize_dtype
from .. import memory as _mem
from ..memory import DeviceLike, StreamLike
from .geometry import channels_last_strides, check_format, contiguous_strides, int_tuple, type_name
from .view import EXPECTED_DTYPES, Tensor


def _alloc_view(shape: Any, dtype: Any, memory_format: Any, device: Any, stream: Any,
                what: str) -> Tensor:
    shp = int_tuple(shape, "shape", what)
    dt = normalize_dtype(dtype, f"{what}: dtype")
    fmt = check_format(memory_format, len(shp), what)
    strides = channels_last_strides(shp) if fmt == "channels_last" else contiguous_strides(shp)
    n = 1
    for s in shp:
        n *= s
    buf = _mem.allocate_kept_first(n * dt.itemsize, device, stream, what=what)
    return Tensor._make(buf.ptr, shp, strides, dt, buf.device, buf)


def empty(shape: Sequence[int], dtype: DTypeLike = "float32", memory_format: str = "contiguous",
          device: DeviceLike | None = None, stream: StreamLike | None = None) -> Tensor:
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


def zeros(shape: Sequence[int], dtype: DTypeLike = "float32", memory_format: str = "contiguous",
          device: DeviceLike | None = None, stream: StreamLike | None = None) -> Tensor:
    """Like `empty()`, then filled with zeros on ``stream``
    (asynchronously)."""
    t = _alloc_view(shape, dtype, memory_format, device, stream, "zeros")
    n = t.nbytes
    if n:
        with _mem.device_guard(t.device):
            _mem.memset(t.ptr, n, stream)
    return t


def from_numpy(array: npt.ArrayLike, dtype: DTypeLike | None = None,
               memory_format: str = "contiguous", device: DeviceLike | None = None,
               stream: StreamLike | None = None) -> Tensor:
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
            raise TypeError(f"from_numpy: {type_name(array)} is already on a CUDA device; use "
                            "pycudnn.as_tensor(...) to view it without a copy")
        array = np.asarray(array)
    if dtype is None:
        if array.dtype.name not in SUPPORTED_DTYPES:
            raise TypeError(f"from_numpy: array has unsupported dtype {array.dtype.name!r}; expected "
                            f"one of {EXPECTED_DTYPES}, or pass dtype=... to convert")
        dt = array.dtype
    else:
        dt = normalize_dtype(dtype, "from_numpy: dtype")
        array = array.astype(dt, copy=False)
    if not dt.isnative:
        array = array.astype(dt.newbyteorder("="))
        dt = array.dtype
    fmt = check_format(memory_format, array.ndim, "from_numpy")
    t = _alloc_view(array.shape, dt, fmt, device, stream, "from_numpy")
    if t.nbytes:
        host = np.moveaxis(array, 1, -1) if fmt == "channels_last" else array
        with _mem.device_guard(t.device):
            _mem.copy_host_to_device(t.ptr, np.ascontiguousarray(host), stream)
    return t
