"""The caller's arrays as pycudnn views: CuPy 13's tensor formats (`CUDNN_TENSOR_NCHW`,
`CUDNN_TENSOR_NHWC`: NHWC data and filters viewed as channels-last tensors), broadcast inputs
made dense, the stream of an array's framework, and results of the kind the input was (a CuPy
array for CuPy input)."""

from __future__ import annotations

from typing import Any

from ..cudnn.tensor_ops import add_tensor
from ..runtime.handle import get_handle
from ..runtime.interop import current_stream
from ..runtime.tensor import Tensor, as_tensor, empty, tensor_from_pointer


__all__ = ["CUDNN_TENSOR_NCHW", "CUDNN_TENSOR_NHWC"]


CUDNN_TENSOR_NCHW = 0
"""``cudnnTensorFormat_t`` channels-first, as ``cupy.cuda.cudnn.CUDNN_TENSOR_NCHW``."""
CUDNN_TENSOR_NHWC = 1
"""``cudnnTensorFormat_t`` channels-last, as ``cupy.cuda.cudnn.CUDNN_TENSOR_NHWC``: data arrays
shaped ``(N, H, W, C)``, filters ``(K, R, S, C)``."""

_LAYOUT_NAMES = {CUDNN_TENSOR_NCHW: "CUDNN_TENSOR_NCHW", CUDNN_TENSOR_NHWC: "CUDNN_TENSOR_NHWC"}


def check_layout(value: Any, name: str) -> int:
    if isinstance(value, bool) or value not in _LAYOUT_NAMES:
        raise ValueError(f"unknown cudnnTensorFormat: {value!r} ({name}); expected "
                         f"CUDNN_TENSOR_NCHW ({CUDNN_TENSOR_NCHW}) or CUDNN_TENSOR_NHWC "
                         f"({CUDNN_TENSOR_NHWC})")
    return int(value)


def data_view(arr: Any, layout: int, stream: int) -> Tensor:
    """A pycudnn view of a data array given in ``layout`` (NHWC arrays are (N, H, W, C))."""
    t = as_tensor(arr, stream=stream)
    if layout == CUDNN_TENSOR_NHWC and t.ndim == 4:
        return channels_last_view(t)
    return t


def filter_view(arr: Any, layout: int, stream: int) -> Tensor:
    """A pycudnn view of a filter given in ``layout`` (NHWC filters are (K, R, S, C))."""
    t = as_tensor(arr, stream=stream)
    if layout == CUDNN_TENSOR_NHWC:
        if t.ndim != 4:
            raise ValueError(f"w_layout=CUDNN_TENSOR_NHWC needs a 4-D filter (K, R, S, C), got "
                             f"shape {list(t.shape)}; pass 3-D and 5-D filters channels-first "
                             "(CUDNN_TENSOR_NCHW)")
        return channels_last_view(t)
    return t


def channels_last_view(t: Tensor) -> Tensor:
    """(N, H, W, C) with any strides -> the (N, C, H, W) view of the same memory."""
    n, h, w, c = t.shape
    sn, sh, sw, sc = t.strides
    return tensor_from_pointer(t.ptr, (n, c, h, w), t.dtype, strides=(sn, sc, sh, sw),
                               device=t.device, owner=t, readonly=t.readonly)


def input_view(arr: Any, stream: int) -> Tensor:
    """An input array as a pycudnn view; a broadcast one (stride-0 dims, as ``cupy.broadcast_to``
    makes) as a C-contiguous copy, which cuDNN can read (CuPy 13 copied every input)."""
    t = as_tensor(arr, stream=stream)
    if all(st or n < 2 for n, st in zip(t.shape, t.strides)):
        return t
    if t.ndim > 5:
        raise ValueError(f"an input of {t.ndim} dims with broadcast (stride-0) dims, shape "
                         f"{list(t.shape)} strides {list(t.strides)}: pycudnn expands broadcast "
                         f"inputs of up to 5 dims; pass a contiguous copy")
    pad = (1,) * max(0, 4 - t.ndim)  # cudnnAddTensor takes 4-D and 5-D tensors
    # the source without its broadcast dims (size 1 there), added into a dense array: cuDNN
    # broadcasts size-1 dims of the source over the destination
    src = tensor_from_pointer(
        t.ptr, tuple(1 if st == 0 else n for n, st in zip(t.shape, t.strides)) + pad, t.dtype,
        strides=tuple(st or 1 for st in t.strides) + pad, device=t.device, owner=t)
    dense = empty(t.shape + pad, t.dtype, device=t.device, stream=stream)
    add_tensor(get_handle(t.device, stream), src, dense, alpha=1.0, beta=0.0)
    return tensor_from_pointer(dense.ptr, t.shape, t.dtype, device=t.device, owner=dense)


def stream_of(arr: Any) -> int:
    """The current stream of ``arr``'s framework (CuPy's for a CuPy array); 0 for anything else."""
    try:
        return current_stream(arr)
    except TypeError:
        return 0


def new_tensor(shape: tuple[int, ...], dtype: Any, like: Tensor, stream: int) -> Tensor:
    """A new pycudnn tensor on ``like``'s device, allocated on ``stream``."""
    return empty(shape, dtype, device=like.device, stream=stream)


def result_like(t: Tensor, like: Any) -> Any:
    """``t`` as the kind of array ``like`` is: a CuPy array for CuPy input (no copy)."""
    if type(like).__module__.split(".")[0] in ("cupy", "cupy_backends"):
        import cupy

        return cupy.asarray(t)
    return t
