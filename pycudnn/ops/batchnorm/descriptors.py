"""The descriptors of one (shape, strides, dtype, mode), cached (`layout_of`), with the workspace
and reserve sizes cuDNN asks for (`sizes_of`)."""

from __future__ import annotations

import threading
from ctypes import byref, c_size_t

import numpy as np

from ...cudnn.descriptors import TensorDescriptor
from ...cudnn.tensor_ops import relu_descriptor
from ...ffi import library as _lib
from ...runtime.tensor import Tensor
from .arguments import MODE_NAMES, OPS_BN


class Layout:
    """The descriptors of one (shape, strides, dtype, mode) and the sizes cuDNN asked for."""

    __slots__ = ("x_desc", "p_desc", "sizes", "fused_ok")

    def __init__(self, x4: Tensor, p4: tuple[int, ...], pdt: np.dtype) -> None:
        self.x_desc = TensorDescriptor(x4.shape, x4.dtype, x4.strides)
        self.p_desc = TensorDescriptor(p4, pdt)
        self.sizes: dict[tuple, tuple[int, int, int]] = {}
        self.fused_ok: bool | None = None  # None: not tried yet


_CACHE: dict[tuple, Layout] = {}
CACHE_MAX = 128
_cache_lock = threading.Lock()


def layout_of(x4: Tensor, mode: int, p4: tuple[int, ...], pdt: np.dtype) -> Layout:
    key = (x4.shape, x4.strides, x4.dtype, mode)
    entry = _CACHE.get(key)
    if entry is None:
        entry = Layout(x4, p4, pdt)
        with _cache_lock:
            while len(_CACHE) >= CACHE_MAX:
                del _CACHE[next(iter(_CACHE))]
            _CACHE[key] = entry
    return entry


def layout_count() -> int:
    """How many layouts' descriptors are cached now (at most `CACHE_MAX`). A seam for tests and
    tooling."""
    return len(_CACHE)


def clear_layouts() -> None:
    """Forget the cached descriptors (they are freed once no call uses them)."""
    with _cache_lock:
        _CACHE.clear()


def sizes_of(entry: Layout, handle: int, device: int, mode: int, ops: int) -> tuple[int, int, int]:
    """(forward workspace, reserve space, backward workspace) bytes for ``ops`` on ``device``."""
    key = (device, mode, ops)
    sizes = entry.sizes.get(key)
    if sizes is None:
        L = _lib.lib()
        xd, pd = entry.x_desc.handle, entry.p_desc.handle
        act = relu_descriptor().handle if ops != OPS_BN else None
        fwd, res, bwd = c_size_t(), c_size_t(), c_size_t()
        st = L.cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
            handle, mode, ops, xd, xd, xd, pd, act, byref(fwd))
        if st:
            _lib.raise_status(st, "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize",
                              f"  x: {entry.x_desc!r}", f"  mode: {MODE_NAMES[mode]}")
        st = L.cudnnGetBatchNormalizationTrainingExReserveSpaceSize(handle, mode, ops, act, xd,
                                                                    byref(res))
        if st:
            _lib.raise_status(st, "cudnnGetBatchNormalizationTrainingExReserveSpaceSize",
                              f"  x: {entry.x_desc!r}", f"  mode: {MODE_NAMES[mode]}")
        st = L.cudnnGetBatchNormalizationBackwardExWorkspaceSize(
            handle, mode, ops, xd, xd, xd, xd, xd, pd, act, byref(bwd))
        if st:
            _lib.raise_status(st, "cudnnGetBatchNormalizationBackwardExWorkspaceSize",
                              f"  x: {entry.x_desc!r}", f"  mode: {MODE_NAMES[mode]}")
        sizes = entry.sizes[key] = (fwd.value, res.value, bwd.value)
    return sizes
