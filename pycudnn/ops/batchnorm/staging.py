"""The working memory of a call: new tensors, dense copies of strided inputs and parameters (and the
copies back into strided outputs, `Params`), and the workspace around a ``...Ex`` launch
(`launch_with_workspace`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...cudnn.tensor_ops import transform
from ...runtime.memory import allocate_fast
from ...runtime.tensor import Tensor, channels_last_strides, contiguous_strides
from ...engines.contract import release as _release_workspace
from ...engines.contract import workspace as _workspace
from .arguments import memory_format_of, param_view


def alloc_like(t: Tensor, s: int, sref: Any, dtype: np.dtype | None = None) -> Tensor:
    """A new tensor with ``t``'s shape and (dense) strides; ``t``'s device must be current."""
    dt = t.dtype if dtype is None else dtype
    buf = allocate_fast(t.size * dt.itemsize, t.device, s, sref)
    return Tensor._make(buf.ptr, t.shape, t.strides, dt, t.device, buf)


def alloc(shape: tuple[int, ...], dtype: np.dtype, device: int, s: int, sref: Any) -> Tensor:
    acc, strides = 1, []
    for size in reversed(shape):
        strides.append(acc)
        acc *= size
    buf = allocate_fast(acc * dtype.itemsize, device, s, sref)
    return Tensor._make(buf.ptr, shape, tuple(reversed(strides)), dtype, device, buf)


def dense_strides(x4: Tensor) -> tuple[int, ...]:
    """The strides cuDNN gets ``x4`` in: its own where it is dense in its memory format, else
    those of a dense copy in that format."""
    fmt = memory_format_of(x4)
    if x4.is_contiguous(fmt):
        return x4.strides
    return channels_last_strides(x4.shape) if fmt == "channels_last" else \
        contiguous_strides(x4.shape)


def dense_input(handle: int, x4: Tensor, s: int, sref: Any) -> Tensor:
    """``x4`` where it is dense in its memory format, else a dense copy in that format."""
    strides = dense_strides(x4)
    if strides == x4.strides:
        return x4
    buf = allocate_fast(x4.size * x4.itemsize, x4.device, s, sref)
    tmp = Tensor._make(buf.ptr, x4.shape, strides, x4.dtype, x4.device, buf)
    transform(handle, x4, tmp)
    return tmp


def like(handle: int, t4: Tensor, layout: Tensor, s: int, sref: Any) -> Tensor:
    """``t4`` with ``layout``'s strides (itself when they match, else a copy)."""
    if t4.strides == layout.strides:
        return t4
    tmp = alloc_like(layout, s, sref)
    transform(handle, t4, tmp)
    return tmp


class Params:
    """Parameter tensors as cuDNN reads them (dense (1, C, ...) views or staged copies), and the
    copies to write back once the call has run."""

    __slots__ = ("handle", "s", "sref", "p4", "keep", "writeback")

    def __init__(self, handle: int, s: int, sref: Any, p4: tuple[int, ...]) -> None:
        self.handle, self.s, self.sref, self.p4 = handle, s, sref, p4
        self.keep: list[Tensor] = []  # staged copies, alive until the call has been queued
        self.writeback: list[tuple[Tensor, Tensor]] = []

    def _staged(self, v: Tensor, read: bool) -> Tensor:
        tmp = alloc(self.p4, v.dtype, v.device, self.s, self.sref)
        if read:
            transform(self.handle, v, tmp)
        self.keep.append(tmp)
        return tmp

    def read(self, t: Tensor | None) -> int | None:
        """The address of ``t`` as a dense parameter (a staged copy if it is strided)."""
        if t is None:
            return None
        v = param_view(t, self.p4)
        return v.ptr if v.is_contiguous() else self._staged(v, True).ptr

    def inout(self, t: Tensor | None, read: bool = True) -> int | None:
        """The address to write ``t`` through (copied back by `finish` when ``t`` is strided)."""
        if t is None:
            return None
        v = param_view(t, self.p4)
        if v.is_contiguous():
            return v.ptr
        tmp = self._staged(v, read)
        self.writeback.append((tmp, v))
        return tmp.ptr

    def finish(self) -> None:
        """Copy the staged outputs into the caller's strided tensors."""
        for tmp, v in self.writeback:
            transform(self.handle, tmp, v)


def contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    acc, strides = 1, []
    for size in reversed(shape):
        strides.append(acc)
        acc *= size
    return tuple(reversed(strides))


def launch_with_workspace(function: Any, ws_size: int, device: int, s: int, res_ptr: int | None,
                          res_size: int, *args: Any) -> int:
    """``function(*args, workspace, ws_size, res_ptr, res_size)``: a ``...Ex`` batch-norm call
    with the workspace the search's policy gives (the thread's, or one of its own during a CUDA
    graph capture), released after the launch is queued; the status."""
    ws, owned = _workspace(ws_size, device, s, True)
    try:
        return function(*args, ws or None, ws_size, res_ptr, res_size)
    finally:
        _release_workspace(owned, s)
