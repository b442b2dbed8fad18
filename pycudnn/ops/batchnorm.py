"""Batch normalization through cuDNN's legacy batch-norm API: training forward (with the running
statistics updated in place), inference, backward, and the fused batch norm + add + ReLU.

Inputs are anything `pycudnn.as_tensor()` takes, ``(N, C)``,
``(N, C, L)``, ``(N, C, H, W)`` or ``(N, C, D, H, W)`` with any strides; outputs are
`pycudnn.Tensor`s or written into ``out=``. ``x`` in float16 or bfloat16
takes float32 ``weight``, ``bias`` and statistics (cuDNN's rule); float32 takes float32 and
float64 all float64.

How a call runs: arguments are checked first (nothing is launched or allocated before that), the
input is used where it lies when it is dense in NCHW or channels-last order and copied there
(``cudnnTransformTensor``) otherwise, the descriptors come from a small cache keyed by shape,
strides, dtype and mode, and the work is one call of
``cudnnBatchNormalizationForwardTrainingEx`` / ``BackwardEx`` (with the workspace and reserve
space cuDNN asks for) or ``cudnnBatchNormalizationForwardInference``. A call that needs no copy
leaves a plan keyed by its arguments' layouts, dtypes, devices and options: the next call of
that signature checks only what the key cannot tell (addresses that must not overlap, read-only
outputs, the reserve) and goes straight to the allocations and the launch.

Why the legacy API and not the graph API: cuDNN's graph API expresses batch norm through the
norm-forward/backward operation nodes and a plan search per shape; the legacy functions run the
same kernels (the semi-persistent NHWC kernels included) in one call without a search, which is
what PyTorch does too. ``benchmarks/bn_dropout_vs_torch.py`` measures the result against PyTorch.
"""

from __future__ import annotations

import ctypes
import math
import numbers
import threading
from ctypes import byref, c_size_t
from typing import Any, Sequence

import numpy as np

from ..cudnn.descriptors import TensorDescriptor
from ..cudnn.tensor_ops import add_tensor, relu_, relu_descriptor, scalar_pointers, transform
from ..dispatch.arguments import check_no_broadcast
from ..errors import CudnnBadParamError, CudnnNotSupportedError
from ..ffi import library as _lib
from ..ops import runtime_kernels
from ..ops._common import PlanCache, Reserve, c_function, meet, scalars_of
from ..ops.runtime_kernels import ALIGNMENT
from ..runtime.handle import get_handle
from ..runtime.memory import (StreamLike, allocate_fast, callers_device, resolve_stream,
                              restore_device)
from ..runtime.tensor import (
    Tensor,
    TensorLike,
    as_tensor,
    channels_last_strides,
    check_writable,
    contiguous_strides,
    has_internal_overlap,
    views_overlap,
)
from ..search.engine import release as _release_workspace
from ..search.engine import workspace as _workspace

__all__ = ["batch_norm_forward_training", "batch_norm_forward_inference", "batch_norm_backward",
           "batch_norm_add_relu_forward_training", "batch_norm_add_relu_backward",
           "BatchNormResult", "ReserveSpace", "MODES", "BN_OPS"]

#: ``cudnnBatchNormMode_t`` by name
MODES = {"per_activation": 0, "spatial": 1, "spatial_persistent": 2}
_MODE_NAMES = {v: k for k, v in MODES.items()}
#: ``cudnnBatchNormOps_t`` by name
BN_OPS = {"bn": 0, "bn_activation": 1, "bn_add_activation": 2}
_OPS_BN, _OPS_ADD_RELU = 0, 2


# ---- results --------------------------------------------------------------------------------------

class ReserveSpace(Reserve):
    """Device memory that cuDNN fills in a training forward pass and reads in its backward pass
    (for the fused batch norm + add + ReLU: the ReLU mask). Opaque: pass it to the backward
    function of the same call; keep it alive until then.

    Attributes:
        nbytes: its size in bytes (also ``size``, as the int8 array CuPy 13 returned).
        ptr: its device address (0 when cuDNN needs none).
        device: the CUDA device it is on.
        fused: whether the fused batch norm + add + ReLU kernel wrote it.
    """

    __slots__ = ("fused", "_key")

    def __init__(self, buffer: Any, nbytes: int, device: int, fused: bool, key: tuple) -> None:
        super().__init__(buffer, nbytes, device)
        self.fused = fused
        self._key = key

    def __repr__(self) -> str:
        return (f"ReserveSpace(nbytes={self.nbytes}, device={self.device}, "
                f"fused={self.fused})")


class BatchNormResult(tuple[Tensor, Tensor, Tensor]):
    """``(y, save_mean, save_invstd)`` of a training forward pass; unpacks as a 3-tuple.

    Attributes:
        reserve: the `ReserveSpace` cuDNN asked for (its
            fast NHWC kernels), or None; give it to
            `batch_norm_backward` as ``reserve=``.
    """

    reserve: ReserveSpace | None

    def __new__(cls, y: Tensor, save_mean: Tensor, save_invstd: Tensor,
                reserve: ReserveSpace | None) -> "BatchNormResult":
        self = super().__new__(cls, (y, save_mean, save_invstd))
        self.reserve = reserve
        return self


# ---- argument checks ------------------------------------------------------------------------------

def _mode(mode: Any, fn: str) -> int:
    if isinstance(mode, str):
        key = mode.lower()
        if key.startswith("cudnn_batchnorm_"):
            key = key[len("cudnn_batchnorm_"):]
        if key in MODES:
            return MODES[key]
    elif isinstance(mode, (int, np.integer)) and not isinstance(mode, (bool, np.bool_)):
        if int(mode) in _MODE_NAMES:
            return int(mode)
    raise ValueError(f"{fn}: expected mode to be 'per_activation', 'spatial' or "
                     f"'spatial_persistent' (or CUDNN_BATCHNORM_* 0, 1, 2), but got mode={mode!r}")


def _real(value: Any, name: str, fn: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{fn}: expected {name} to be a real number, but got "
                        f"{type(value).__name__} {value!r}")
    return float(value)


def _eps(eps: Any, fn: str) -> float:
    e = _real(eps, "eps", fn)
    if not (e >= 0.0 and math.isfinite(e)):  # cuDNN's CUDNN_BN_MIN_EPSILON is 0
        raise ValueError(f"{fn}: expected eps to be a finite number >= 0, but got eps={eps!r}")
    return e


def _momentum(momentum: Any, fn: str) -> float:
    # any finite weight, as PyTorch's F.batch_norm takes (cuDNN's exponentialAverageFactor is
    # a plain double: running = (1 - m) * running + m * batch, an extrapolation outside [0, 1])
    m = _real(momentum, "momentum", fn)
    if not math.isfinite(m):
        raise ValueError(f"{fn}: expected momentum to be a finite number (the weight of the "
                         f"batch statistics in the running average), but got "
                         f"momentum={momentum!r}")
    return m


def _as_tensor(obj: Any, stream: Any) -> Tensor:
    return obj if type(obj) is Tensor else as_tensor(obj, stream=stream)


def _as4d(t: Tensor) -> Tensor:
    """(N, C) as (N, C, 1, 1) and (N, C, L) as (N, C, 1, L) views; 4-D and 5-D unchanged."""
    nd = t.ndim
    if nd == 2:
        s0, s1 = t.strides
        return Tensor._make(t.ptr, t.shape + (1, 1), (s0, s1, s1, s1), t.dtype, t.device, t,
                            t.readonly)
    if nd == 3:
        return t.unsqueeze(2)
    return t


def _from4d(t4: Tensor, shape: tuple[int, ...]) -> Tensor:
    """The view of a 4-D working tensor in the caller's ``shape`` (the inverse of _as4d)."""
    if len(shape) == t4.ndim:
        return t4
    if len(shape) == 2:
        strides: tuple[int, ...] = t4.strides[:2]
    else:
        strides = t4.strides[:2] + t4.strides[3:]
    return Tensor._make(t4.ptr, shape, strides, t4.dtype, t4.device, t4, t4.readonly)


def _format(x4: Tensor) -> str:
    return "channels_last" if x4.memory_format == "channels_last" else "contiguous"


def _check_x(x: Tensor, fn: str, name: str = "input") -> None:
    if x.ndim not in (2, 3, 4, 5):
        raise ValueError(f"{fn}: expected {name} to have 2 to 5 dims (N, C and up to 3 spatial "
                         f"dims), but got {name} of size {list(x.shape)}")
    check_no_broadcast(x, name, fn)


def _check_like(t: Tensor, name: str, x: Tensor, fn: str, x_name: str = "input") -> None:
    """A tensor that must match the input: same shape, dtype and device."""
    if tuple(t.shape) != tuple(x.shape):
        raise ValueError(f"{fn}: expected {name} of size {list(x.shape)} ({x_name}'s), but got "
                         f"{name} of size {list(t.shape)}")
    if t.dtype != x.dtype:
        raise TypeError(f"{fn}: expected {name} to have dtype {x.dtype.name} ({x_name}'s), but "
                        f"got {t.dtype.name}")
    if t.device != x.device:
        raise ValueError(f"{fn}: expected {name} on cuda:{x.device} ({x_name}'s device), but got "
                         f"cuda:{t.device}")
    check_no_broadcast(t, name, fn)


_F64, _F32 = np.dtype(np.float64), np.dtype(np.float32)


def _param_dtype(x: Tensor) -> np.dtype:
    return _F64 if x.dtype == _F64 else _F32


def _param_shape(x: Tensor, mode: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the 1-D or per-activation shape the caller passes, cuDNN's 4-D/5-D parameter shape)."""
    x4_shape = _as4d_shape(x.shape)
    if mode == MODES["per_activation"]:
        return tuple(x.shape[1:]), (1,) + x4_shape[1:]
    return (x.shape[1],), (1, x.shape[1]) + (1,) * (len(x4_shape) - 2)


def _as4d_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    if len(shape) == 2:
        return shape + (1, 1)
    if len(shape) == 3:
        return shape[:2] + (1,) + shape[2:]
    return shape


def _param(obj: Any, name: str, x: Tensor, mode: int, fn: str, stream: Any,
           writable: bool = False) -> Tensor:
    """A scale/bias/statistic: (C,) for spatial modes, (C, *spatial) or its flat (C*spatial,)
    form for per_activation; float32 (float64 for float64 input); on the input's device."""
    t = _as_tensor(obj, stream)
    shape, p4 = _param_shape(x, mode)
    count = math.prod(shape)
    if tuple(t.shape) != shape and tuple(t.shape) != (count,):
        what = (f"{count} elements, one per channel" if mode != MODES["per_activation"]
                else f"size {list(shape)} (one value per activation) or {count} elements")
        raise ValueError(f"{fn}: expected {name} with {what} for input of size {list(x.shape)} "
                         f"(mode {_MODE_NAMES[mode]!r}), but got {name} of size {list(t.shape)}")
    pdt = _param_dtype(x)
    if t.dtype != pdt:
        why = ("cuDNN keeps scale, bias and statistics in float32 for float16 and bfloat16 input"
               if x.dtype.name in ("float16", "bfloat16") else "the input's precision")
        raise TypeError(f"{fn}: expected {name} to have dtype {pdt.name} ({why}), but got "
                        f"{t.dtype.name}")
    if t.device != x.device:
        raise ValueError(f"{fn}: expected {name} on cuda:{x.device} (the input's device), but got "
                         f"cuda:{t.device}")
    # refused here, naming the parameter, before a handle is taken or anything is staged
    check_no_broadcast(t, name, fn)
    if writable:
        check_writable(t, name)
        if t.size and has_internal_overlap(t.shape, t.strides):
            raise ValueError(f"{fn}: {name} has overlapping elements (strides {list(t.strides)}); "
                             f"pass a tensor without overlapping elements")
    return t


def _pview(t: Tensor, p4: tuple[int, ...]) -> Tensor:
    """A parameter tensor as cuDNN's (1, C, ...) shape, keeping its strides."""
    if t.ndim == 1:
        s = t.strides[0] if t.strides else 1
        acc, strides = 1, []
        for size in reversed(p4):
            strides.append(acc * s)
            acc *= size
        return Tensor._make(t.ptr, p4, tuple(reversed(strides)), t.dtype, t.device, t, t.readonly)
    return _as4d(t.unsqueeze(0))


def _check_out(out: Any, name: str, x: Tensor, fn: str, stream: Any,
               reads: Sequence[tuple[str, Tensor | None]]) -> Tensor:
    o = _as_tensor(out, stream)
    check_writable(o, name)
    _check_like(o, name, x, fn)
    if o.size and has_internal_overlap(o.shape, o.strides):
        raise ValueError(f"{fn}: {name} has overlapping elements (strides {list(o.strides)}): more "
                         f"than one element refers to a single memory location; pass an output "
                         f"without overlapping elements")
    _no_overlap(o, name, reads)
    return o


def _no_overlap(o: Tensor, name: str, reads: Sequence[tuple[str, Tensor | None]]) -> None:
    for read_name, t in reads:
        if t is not None and o.size and t.size and views_overlap(o, t):
            raise ValueError(f"{name}: it overlaps {read_name}, which the call reads or writes: "
                             f"cuDNN does not compute in place; pass an output that shares no "
                             f"memory with the other arguments")


def _check_written(fn: str, o: Tensor | None, sm: Tensor | None, si: Tensor | None,
                   reads: list[tuple[str, Tensor | None]]) -> None:
    """The checks of a planned call's optional outputs that its key cannot know (read-only
    flags, memory shared with the other arguments), as `_check_out` and `_save_outputs` make
    them."""
    if o is not None:
        check_writable(o, "out")
        _no_overlap(o, "out", reads)
    reads = reads + [("out", o)]
    if sm is not None:
        check_writable(sm, "save_mean")
        _no_overlap(sm, "save_mean", reads)
    if si is not None:
        check_writable(si, "save_invstd")
        _no_overlap(si, "save_invstd", reads + [("save_mean", sm)])


def _stream_pair(stream: Any) -> tuple[int, Any]:
    """(the stream's handle, the object to keep alive until frees ordered on it, or None)."""
    if stream is None:
        return 0, None
    if type(stream) is int:
        return stream, None
    return resolve_stream(stream), stream


# ---- descriptors, cached --------------------------------------------------------------------------

class _Layout:
    """The descriptors of one (shape, strides, dtype, mode) and the sizes cuDNN asked for."""

    __slots__ = ("x_desc", "p_desc", "sizes", "fused_ok")

    def __init__(self, x4: Tensor, p4: tuple[int, ...], pdt: np.dtype) -> None:
        self.x_desc = TensorDescriptor(x4.shape, x4.dtype, x4.strides)
        self.p_desc = TensorDescriptor(p4, pdt)
        self.sizes: dict[tuple, tuple[int, int, int]] = {}
        self.fused_ok: bool | None = None  # None: not tried yet


_CACHE: dict[tuple, _Layout] = {}
_CACHE_MAX = 128
_cache_lock = threading.Lock()


def _layout(x4: Tensor, mode: int, p4: tuple[int, ...], pdt: np.dtype) -> _Layout:
    key = (x4.shape, x4.strides, x4.dtype, mode)
    entry = _CACHE.get(key)
    if entry is None:
        entry = _Layout(x4, p4, pdt)
        with _cache_lock:
            while len(_CACHE) >= _CACHE_MAX:
                del _CACHE[next(iter(_CACHE))]
            _CACHE[key] = entry
    return entry


def clear_cache() -> None:
    """Forget the cached descriptors (they are freed once no call uses them)."""
    with _cache_lock:
        _CACHE.clear()
    for plans in (_TRAIN, _INFER, _BACKWARD):
        plans.clear()


def _sizes(entry: _Layout, handle: int, device: int, mode: int, ops: int) -> tuple[int, int, int]:
    """(forward workspace, reserve space, backward workspace) bytes for ``ops`` on ``device``."""
    key = (device, mode, ops)
    sizes = entry.sizes.get(key)
    if sizes is None:
        L = _lib.lib()
        xd, pd = entry.x_desc.handle, entry.p_desc.handle
        act = relu_descriptor().handle if ops != _OPS_BN else None
        fwd, res, bwd = c_size_t(), c_size_t(), c_size_t()
        st = L.cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
            handle, mode, ops, xd, xd, xd, pd, act, byref(fwd))
        if st:
            _lib.raise_status(st, "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize",
                              f"  x: {entry.x_desc!r}", f"  mode: {_MODE_NAMES[mode]}")
        st = L.cudnnGetBatchNormalizationTrainingExReserveSpaceSize(handle, mode, ops, act, xd,
                                                                    byref(res))
        if st:
            _lib.raise_status(st, "cudnnGetBatchNormalizationTrainingExReserveSpaceSize",
                              f"  x: {entry.x_desc!r}", f"  mode: {_MODE_NAMES[mode]}")
        st = L.cudnnGetBatchNormalizationBackwardExWorkspaceSize(
            handle, mode, ops, xd, xd, xd, xd, xd, pd, act, byref(bwd))
        if st:
            _lib.raise_status(st, "cudnnGetBatchNormalizationBackwardExWorkspaceSize",
                              f"  x: {entry.x_desc!r}", f"  mode: {_MODE_NAMES[mode]}")
        sizes = entry.sizes[key] = (fwd.value, res.value, bwd.value)
    return sizes


# ---- working tensors ------------------------------------------------------------------------------

def _alloc_like(t: Tensor, s: int, sref: Any, dtype: np.dtype | None = None) -> Tensor:
    """A new tensor with ``t``'s shape and (dense) strides; ``t``'s device must be current."""
    dt = t.dtype if dtype is None else dtype
    buf = allocate_fast(t.size * dt.itemsize, t.device, s, sref)
    return Tensor._make(buf.ptr, t.shape, t.strides, dt, t.device, buf)


def _alloc(shape: tuple[int, ...], dtype: np.dtype, device: int, s: int, sref: Any) -> Tensor:
    acc, strides = 1, []
    for size in reversed(shape):
        strides.append(acc)
        acc *= size
    buf = allocate_fast(acc * dtype.itemsize, device, s, sref)
    return Tensor._make(buf.ptr, shape, tuple(reversed(strides)), dtype, device, buf)


def _dense_strides(x4: Tensor) -> tuple[int, ...]:
    """The strides cuDNN gets ``x4`` in: its own where it is dense in its memory format, else
    those of a dense copy in that format."""
    fmt = _format(x4)
    if x4.is_contiguous(fmt):
        return x4.strides
    return channels_last_strides(x4.shape) if fmt == "channels_last" else \
        contiguous_strides(x4.shape)


def _dense_input(handle: int, x4: Tensor, s: int, sref: Any) -> Tensor:
    """``x4`` where it is dense in its memory format, else a dense copy in that format."""
    strides = _dense_strides(x4)
    if strides == x4.strides:
        return x4
    buf = allocate_fast(x4.size * x4.itemsize, x4.device, s, sref)
    tmp = Tensor._make(buf.ptr, x4.shape, strides, x4.dtype, x4.device, buf)
    transform(handle, x4, tmp)
    return tmp


def _like(handle: int, t4: Tensor, layout: Tensor, s: int, sref: Any) -> Tensor:
    """``t4`` with ``layout``'s strides (itself when they match, else a copy)."""
    if t4.strides == layout.strides:
        return t4
    tmp = _alloc_like(layout, s, sref)
    transform(handle, t4, tmp)
    return tmp


class _Params:
    """Parameter tensors as cuDNN reads them (dense (1, C, ...) views or staged copies), and the
    copies to write back once the call has run."""

    __slots__ = ("handle", "s", "sref", "p4", "keep", "writeback")

    def __init__(self, handle: int, s: int, sref: Any, p4: tuple[int, ...]) -> None:
        self.handle, self.s, self.sref, self.p4 = handle, s, sref, p4
        self.keep: list[Tensor] = []  # staged copies, alive until the call has been queued
        self.writeback: list[tuple[Tensor, Tensor]] = []

    def _staged(self, v: Tensor, read: bool) -> Tensor:
        tmp = _alloc(self.p4, v.dtype, v.device, self.s, self.sref)
        if read:
            transform(self.handle, v, tmp)
        self.keep.append(tmp)
        return tmp

    def read(self, t: Tensor | None) -> int | None:
        """The address of ``t`` as a dense parameter (a staged copy if it is strided)."""
        if t is None:
            return None
        v = _pview(t, self.p4)
        return v.ptr if v.is_contiguous() else self._staged(v, True).ptr

    def inout(self, t: Tensor | None, read: bool = True) -> int | None:
        """The address to write ``t`` through (copied back by `finish` when ``t`` is strided)."""
        if t is None:
            return None
        v = _pview(t, self.p4)
        if v.is_contiguous():
            return v.ptr
        tmp = self._staged(v, read)
        self.writeback.append((tmp, v))
        return tmp.ptr

    def finish(self) -> None:
        """Copy the staged outputs into the caller's strided tensors."""
        for tmp, v in self.writeback:
            transform(self.handle, tmp, v)


# ---- the shared call path -------------------------------------------------------------------------

class _Call:
    """One validated batch-norm call: the input as cuDNN sees it and what the call writes."""

    __slots__ = ("fn", "x", "x4", "mode", "p4", "pshape", "pdt", "s", "sref", "device",
                 "handle", "entry")

    def __init__(self, fn: str, x: Tensor, mode: int, stream: Any) -> None:
        self.fn = fn
        self.x = x
        self.x4 = _as4d(x)
        self.mode = mode
        self.pshape, self.p4 = _param_shape(x, mode)
        self.pdt = _param_dtype(x)
        self.s, self.sref = _stream_pair(stream)
        self.device = x.device
        self.handle = 0
        self.entry: _Layout | None = None

    def start(self) -> None:
        """After validation: the handle (the device made current) and the input made dense."""
        self.handle = get_handle(self.device, self.s)
        self.x4 = _dense_input(self.handle, self.x4, self.s, self.sref)
        self.entry = _layout(self.x4, self.mode, self.p4, self.pdt)

    def new_params(self, count: int) -> list[Tensor]:
        """``count`` new parameter-shaped tensors in one allocation (in the caller's shape)."""
        n = math.prod(self.pshape)
        buf = allocate_fast(count * n * self.pdt.itemsize, self.device, self.s, self.sref)
        base = buf.ptr
        strides = _contiguous(self.pshape)
        return [Tensor._make(base + i * n * self.pdt.itemsize, self.pshape, strides, self.pdt,
                             self.device, buf) for i in range(count)]

    def output(self, out: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """(the 4-D tensor cuDNN writes, the caller's out to copy it into afterwards or None)."""
        if out is not None:
            o4 = _as4d(out)
            if o4.strides == self.x4.strides:
                return o4, None
            return _alloc_like(self.x4, self.s, self.sref), o4
        return _alloc_like(self.x4, self.s, self.sref), None

    def finish_output(self, y4: Tensor, target: Tensor | None) -> Tensor:
        if target is not None:
            transform(self.handle, y4, target)
            return _from4d(target, self.x.shape)
        return _from4d(y4, self.x.shape)


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    acc, strides = 1, []
    for size in reversed(shape):
        strides.append(acc)
        acc *= size
    return tuple(reversed(strides))


def _prologue(fn: str, x: Any, mode: Any, stream: Any, training: bool) -> _Call:
    xt = _as_tensor(x, stream)
    _check_x(xt, fn)
    m = _mode(mode, fn)
    if training:
        if 0 in xt.shape[1:]:
            raise ValueError(f"{fn}: expected input with positive channel and spatial sizes, but "
                             f"got input of size {list(xt.shape)}")
        n = xt.shape[0]
        per_channel = n * math.prod(xt.shape[2:]) if m != MODES["per_activation"] else n
        if per_channel <= 1:
            raise ValueError(f"{fn}: expected more than 1 value per channel when training, got "
                             f"input size {list(xt.shape)}")
    return _Call(fn, xt, m, stream)


def _check_stats(fn: str, running_mean: Any, running_var: Any, call: _Call, stream: Any,
                 reads: Sequence[tuple[str, Tensor | None]]) -> tuple[Tensor | None,
                                                                    Tensor | None]:
    if (running_mean is None) != (running_var is None):
        missing = "running_var" if running_var is None else "running_mean"
        raise ValueError(f"{fn}: expected running_mean and running_var both given or both None, "
                         f"but {missing} is None")
    if running_mean is None:
        return None, None
    rm = _param(running_mean, "running_mean", call.x, call.mode, fn, stream, writable=True)
    rv = _param(running_var, "running_var", call.x, call.mode, fn, stream, writable=True)
    if rm.size and views_overlap(rm, rv):
        raise ValueError(f"{fn}: running_mean and running_var overlap; pass separate tensors")
    # updated in place: sharing memory with what the call reads (one ``ones`` tensor as weight
    # and running_var, say) would change that input mid-call
    _no_overlap(rm, f"{fn}: running_mean", reads)
    _no_overlap(rv, f"{fn}: running_var", reads)
    return rm, rv


def _save_outputs(fn: str, save_mean: Any, save_invstd: Any, call: _Call, stream: Any,
                  reads: list[tuple[str, Tensor | None]]) -> tuple[Tensor | None, Tensor | None]:
    sm = si = None
    if save_mean is not None:
        sm = _param(save_mean, "save_mean", call.x, call.mode, fn, stream, writable=True)
        _no_overlap(sm, "save_mean", reads)
    if save_invstd is not None:
        si = _param(save_invstd, "save_invstd", call.x, call.mode, fn, stream, writable=True)
        _no_overlap(si, "save_invstd", reads + [("save_mean", sm)])
    return sm, si


def _run_training(call: _Call, ops: int, z4: Tensor | None, y4: Tensor, w: Tensor, b: Tensor,
                  rm: Tensor | None, rv: Tensor | None, sm: Tensor, si: Tensor,
                  momentum: float, eps: float, sizes: tuple[int, int, int],
                  key: tuple) -> ReserveSpace | None:
    entry = call.entry
    assert entry is not None
    p = _Params(call.handle, call.s, call.sref, call.p4)
    wp, bp = p.read(w), p.read(b)
    rmp, rvp = p.inout(rm), p.inout(rv)
    smp, sip = p.inout(sm, read=False), p.inout(si, read=False)
    ws_size, res_size, _ = sizes
    reserve = None
    res_ptr = None
    if res_size:
        buf = allocate_fast(res_size, call.device, call.s, call.sref)
        reserve = ReserveSpace(buf, res_size, call.device, ops == _OPS_ADD_RELU, key)
        res_ptr = buf.ptr
    ws, owned = _workspace(ws_size, call.device, call.s, True)
    one, zero = scalar_pointers(call.x.dtype.name)
    xd = entry.x_desc.handle
    act = relu_descriptor().handle if ops != _OPS_BN else None
    try:
        st = _lib.lib().cudnnBatchNormalizationForwardTrainingEx(
            call.handle, call.mode, ops, one, zero, xd, call.x4.ptr, xd,
            z4.ptr if z4 is not None else None, xd, y4.ptr, entry.p_desc.handle, wp, bp, momentum,
            rmp, rvp, eps, smp, sip, act, ws or None, ws_size, res_ptr, res_size)
    finally:
        _release_workspace(owned, call.s)
    if st:
        _lib.raise_status(st, "cudnnBatchNormalizationForwardTrainingEx",
                          f"  x: {entry.x_desc!r}", f"  parameters: {entry.p_desc!r}",
                          f"  mode: {_MODE_NAMES[call.mode]}, ops: {ops}")
    p.finish()
    return reserve


def _reserve_key(call: _Call, ops: int) -> tuple:
    return (call.x4.shape, call.x4.strides, call.x4.dtype, call.mode, ops)


# ---- plans: repeated calls that need no copy --------------------------------------------------------

class _Plan:
    """What a repeated call needs besides its pointers, for a call that runs without copies (the
    input dense in its memory format, the parameters dense, ``grad_output`` and ``out`` in the
    input's layout): descriptors, sizes, the new tensors' layouts, the checked scalars and the C
    function. Keyed by everything the full checks read but the addresses (and read-only flags),
    which each call checks itself: a repeated call is one dict lookup, allocations and the
    launch."""

    __slots__ = ("mode", "entry", "xd", "pd", "one", "zero", "launch", "momentum", "eps",
                 "nbytes", "pshape", "pstrides", "pdt", "p_nbytes", "reserve_key", "sizes",
                 "fast")

    def __init__(self, call: _Call, function: str, momentum: float, eps: float) -> None:
        x4 = call.x4
        self.mode = call.mode
        self.entry = _layout(x4, call.mode, call.p4, call.pdt)  # what call.start() would find
        self.xd, self.pd = self.entry.x_desc.handle, self.entry.p_desc.handle
        self.one, self.zero = scalars_of(x4.dtype)
        self.launch = c_function(function)
        self.momentum, self.eps = momentum, eps
        self.nbytes = x4.size * x4.dtype.itemsize  # the output's, in the input's strides
        self.pshape, self.pstrides, self.pdt = call.pshape, _contiguous(call.pshape), call.pdt
        self.p_nbytes = math.prod(call.pshape) * call.pdt.itemsize  # one parameter's
        self.reserve_key = (x4.shape, x4.strides, x4.dtype, call.mode, _OPS_BN)
        self.sizes: tuple[int, int, int] | None = None  # asked of cuDNN at the first launch
        # inference: the signature's runtime-compiled kernel, once built (see runtime_kernels)
        self.fast: runtime_kernels.Promotion | None = None


_TRAIN = PlanCache(128)
_INFER = PlanCache(128)
_BACKWARD = PlanCache(128)


def _plan(call: _Call, function: str, params: Sequence[Tensor | None],
          likes: Sequence[Tensor | None], momentum: float, eps: float) -> _Plan | None:
    """The plan of a validated call, or None when it needs a copy (such calls take the full path
    every time): ``params`` must be dense, ``likes`` (out, grad_output) in the input's strides."""
    x4 = call.x4
    if x4.size == 0 or not x4.is_contiguous(_format(x4)):
        return None
    if any(t is not None and _as4d(t).strides != x4.strides for t in likes):
        return None
    if any(t is not None and not _pview(t, call.p4).is_contiguous() for t in params):
        return None
    return _Plan(call, function, momentum, eps)


def _sig(t: Tensor | None) -> tuple[Any, ...] | None:
    return None if t is None else (t.shape, t.strides, t.dtype, t.device)


# the keys: the arguments as given (with their types, so that True never stands for 1) and the
# tensors' layouts; built the same way by the fast path and by the full checks that store a plan

def _train_key(mode: Any, momentum: Any, eps: Any, x: Tensor, w: Tensor, b: Tensor,
               rm: Tensor | None, rv: Tensor | None, o: Tensor | None, sm: Tensor | None,
               si: Tensor | None) -> tuple:
    return (mode, type(mode), momentum, type(momentum), eps, type(eps), x.shape, x.strides,
            x.dtype, x.device, w.shape, w.strides, w.dtype, w.device, b.shape, b.strides,
            b.dtype, b.device, _sig(rm), _sig(rv), _sig(o), _sig(sm), _sig(si))


def _infer_key(mode: Any, eps: Any, x: Tensor, w: Tensor, b: Tensor, rm: Tensor, rv: Tensor,
               o: Tensor | None) -> tuple:
    return (mode, type(mode), eps, type(eps), x.shape, x.strides, x.dtype, x.device, w.shape,
            w.strides, w.dtype, w.device, _sig(b), _sig(rm), _sig(rv), _sig(o))


def _backward_key(mode: Any, eps: Any, x: Tensor, dy: Tensor, w: Tensor, sm: Tensor | None,
                  si: Tensor | None, o: Tensor | None) -> tuple:
    return (mode, type(mode), eps, type(eps), x.shape, x.strides, x.dtype, x.device, dy.shape,
            dy.strides, dy.dtype, dy.device, w.shape, w.strides, w.dtype, w.device, _sig(sm),
            _sig(si), _sig(o))


def _new_pair(plan: _Plan, device: int, s: int, sref: Any) -> tuple[Tensor, Tensor]:
    """Two new parameter-shaped tensors in one allocation (`_Call.new_params` from a plan)."""
    n = plan.p_nbytes
    buf = allocate_fast(2 * n, device, s, sref)
    shape, strides, dt = plan.pshape, plan.pstrides, plan.pdt
    return (Tensor._make(buf.ptr, shape, strides, dt, device, buf),
            Tensor._make(buf.ptr + n, shape, strides, dt, device, buf))


def _launch_failed(st: int, function: str, plan: _Plan, more: str = "") -> None:
    """Raise for a failed launch of a planned call, as the full path words it."""
    _lib.raise_status(st, function, f"  x: {plan.entry.x_desc!r}",
                      f"  parameters: {plan.entry.p_desc!r}",
                      f"  mode: {_MODE_NAMES[plan.mode]}{more}")


# ---- public functions -----------------------------------------------------------------------------

def batch_norm_forward_training(x: TensorLike, weight: TensorLike, bias: TensorLike,
                                running_mean: TensorLike | None = None,
                                running_var: TensorLike | None = None, *, momentum: float = 0.1,
                                eps: float = 1e-5, mode: str | int = "spatial",
                                out: TensorLike | None = None, save_mean: TensorLike | None = None,
                                save_invstd: TensorLike | None = None,
                                stream: StreamLike | None = None) -> BatchNormResult:
    """Batch normalization of a training step: ``y = weight * (x - mean) / sqrt(var + eps) + bias``
    with the batch's mean and (biased) variance, as ``F.batch_norm(..., training=True)``.

    Args:
        x: input ``(N, C, *spatial)`` with 0 to 3 spatial dims, any strides.
        weight: scale, ``(C,)`` (``(C, *spatial)`` with ``mode="per_activation"``).
        bias: shift, like ``weight``.
        running_mean: updated in place to ``(1 - momentum) * running_mean + momentum * mean``;
            None (with ``running_var``) to keep no running statistics.
        running_var: updated in place the same way with the batch's unbiased variance
            (PyTorch's convention).
        momentum: the weight of this batch in the running averages (cuDNN's
            ``exponentialAverageFactor``; CuPy 13's ``decay`` is ``1 - momentum``): any
            finite number, as PyTorch takes (outside [0, 1] the update extrapolates).
        eps: added to the variance, >= 0.
        mode: ``"spatial"`` (statistics over N and the spatial dims, per channel),
            ``"per_activation"`` (over N only, per element of a sample), or
            ``"spatial_persistent"``: spatial with cuDNN's faster persistent kernels, which can
            overflow for inputs of very large magnitude. cuDNN takes its semi-persistent NHWC
            kernel for float16/bfloat16 channels-last input with C a multiple of 4 and runs its
            other spatial kernels otherwise.
        out: optional output of x's shape, dtype and device (any strides).
        save_mean: optional output for the batch mean, like ``weight``.
        save_invstd: optional output for ``1 / sqrt(var + eps)``, like ``weight``.
        stream: the CUDA stream to run on (as `pycudnn.convolution`).

    Returns:
        A `BatchNormResult` ``(y, save_mean,
            save_invstd)`` whose ``reserve`` goes to the backward pass.
    """
    try:
        xt, w, b = _as_tensor(x, stream), _as_tensor(weight, stream), _as_tensor(bias, stream)
        rm = None if running_mean is None else _as_tensor(running_mean, stream)
        rv = None if running_var is None else _as_tensor(running_var, stream)
        o = None if out is None else _as_tensor(out, stream)
        sm = None if save_mean is None else _as_tensor(save_mean, stream)
        si = None if save_invstd is None else _as_tensor(save_invstd, stream)
        plan = _TRAIN[_train_key(mode, momentum, eps, xt, w, b, rm, rv, o, sm, si)]
    except Exception:  # a new signature, or arguments the full checks refuse (in their order)
        return _training_full(x, weight, bias, running_mean, running_var, momentum, eps, mode,
                              out, save_mean, save_invstd, stream)
    # what the key cannot know: the addresses and the read-only flags of what the call writes
    if rm is not None and rv is not None:
        if rm.readonly or rv.readonly:
            check_writable(rm, "running_mean")
            check_writable(rv, "running_var")
        pn = plan.p_nbytes
        if meet(rm, pn, rv, pn):
            raise ValueError("batch_norm_forward_training: running_mean and running_var overlap; "
                             "pass separate tensors")
        # the statistics are written: never into input, weight or bias (one range test for
        # the common case, where nothing lies between or across them)
        lo, hi = min(rm.ptr, rv.ptr), max(rm.ptr, rv.ptr) + pn
        xp, wp, bp = xt.ptr, w.ptr, b.ptr
        if (xp < hi and lo < xp + plan.nbytes) or (wp < hi and lo < wp + pn) \
                or (bp < hi and lo < bp + pn):
            for name, t in (("running_mean", rm), ("running_var", rv)):
                for read, r, span in (("input", xt, plan.nbytes), ("weight", w, pn),
                                      ("bias", b, pn)):
                    if meet(t, pn, r, span):
                        _no_overlap(t, f"batch_norm_forward_training: {name}", ((read, r),))
    if o is not None or sm is not None or si is not None:
        _check_written("batch_norm_forward_training", o, sm, si,
                       [("input", xt), ("weight", w), ("bias", b), ("running_mean", rm),
                        ("running_var", rv)])
    s, sref = _stream_pair(stream)
    dev = xt.device
    prev = callers_device()
    try:
        handle = get_handle(dev, s)
        sizes = plan.sizes
        if sizes is None:
            sizes = plan.sizes = _sizes(plan.entry, handle, dev, plan.mode, _OPS_BN)
        ws_size, res_size, _ = sizes
        if sm is None or si is None:
            new = _new_pair(plan, dev, s, sref)
            sm = sm if sm is not None else new[0]
            si = si if si is not None else new[1]
        if o is None:
            owner = allocate_fast(plan.nbytes, dev, s, sref)
            o = Tensor._make(owner.ptr, xt.shape, xt.strides, xt.dtype, dev, owner)
        reserve, res_ptr = None, None
        if res_size:
            buf = allocate_fast(res_size, dev, s, sref)
            reserve = ReserveSpace(buf, res_size, dev, False, plan.reserve_key)
            res_ptr = buf.ptr
        ws, owned = _workspace(ws_size, dev, s, True)
        xd = plan.xd
        try:
            st = plan.launch(handle, plan.mode, _OPS_BN, plan.one, plan.zero, xd, xt.ptr, xd, None,
                             xd, o.ptr, plan.pd, w.ptr, b.ptr, plan.momentum,
                             None if rm is None else rm.ptr, None if rv is None else rv.ptr,
                             plan.eps, sm.ptr, si.ptr, None, ws or None, ws_size, res_ptr,
                             res_size)
        finally:
            _release_workspace(owned, s)
        if st:
            _launch_failed(st, "cudnnBatchNormalizationForwardTrainingEx", plan,
                           f", ops: {_OPS_BN}")
        return BatchNormResult(o, sm, si, reserve)
    finally:
        restore_device(prev)


def _training_full(x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                   momentum: Any, eps: Any, mode: Any, out: Any, save_mean: Any,
                   save_invstd: Any, stream: Any) -> BatchNormResult:
    """`batch_norm_forward_training` the long way: the full checks, in the order they name the
    parameters, then a call that copies what cuDNN cannot take as it is. Stores the plan of a
    call that needs no copy, which the next call of its signature takes."""
    fn = "batch_norm_forward_training"
    prev = callers_device()
    try:
        call = _prologue(fn, x, mode, stream, training=True)
        m = _momentum(momentum, fn)
        e = _eps(eps, fn)
        w = _param(weight, "weight", call.x, call.mode, fn, stream)
        b = _param(bias, "bias", call.x, call.mode, fn, stream)
        rm, rv = _check_stats(fn, running_mean, running_var, call, stream,
                              [("input", call.x), ("weight", w), ("bias", b)])
        reads: list[tuple[str, Tensor | None]] = [("input", call.x), ("weight", w), ("bias", b),
                                                  ("running_mean", rm), ("running_var", rv)]
        o = _check_out(out, "out", call.x, fn, stream, reads) if out is not None else None
        sm, si = _save_outputs(fn, save_mean, save_invstd, call, stream,
                               reads + [("out", o)])
        plan = _plan(call, "cudnnBatchNormalizationForwardTrainingEx", (w, b, rm, rv, sm, si),
                     (o,), m, e)
        if plan is not None:
            _TRAIN.put(_train_key(mode, momentum, eps, call.x, w, b, rm, rv, o, sm, si), plan)
        call.start()
        entry = call.entry
        assert entry is not None
        if sm is None or si is None:
            new = call.new_params(2)
            sm = sm if sm is not None else new[0]
            si = si if si is not None else new[1]
        y4, target = call.output(o)
        sizes = _sizes(entry, call.handle, call.device, call.mode, _OPS_BN)
        reserve = _run_training(call, _OPS_BN, None, y4, w, b, rm, rv, sm, si, m, e, sizes,
                                _reserve_key(call, _OPS_BN))
        return BatchNormResult(call.finish_output(y4, target), sm, si, reserve)
    finally:
        restore_device(prev)


def batch_norm_forward_inference(x: TensorLike, weight: TensorLike, bias: TensorLike,
                                 running_mean: TensorLike, running_var: TensorLike, *,
                                 eps: float = 1e-5, mode: str | int = "spatial",
                                 out: TensorLike | None = None,
                                 stream: StreamLike | None = None) -> Tensor:
    """Batch normalization with stored statistics:
    ``y = weight * (x - running_mean) / sqrt(running_var + eps) + bias``
    (``F.batch_norm(..., training=False)``).

    Args:
        x: input ``(N, C, *spatial)``, any strides.
        weight: scale, ``(C,)`` (``(C, *spatial)`` with ``mode="per_activation"``).
        bias: shift, like ``weight``.
        running_mean: the mean to subtract, like ``weight``.
        running_var: the variance, like ``weight``.
        eps: added to the variance, >= 0.
        mode: ``"spatial"`` or ``"per_activation"``; ``"spatial_persistent"`` is accepted and
            runs as ``"spatial"`` (cuDNN has no persistent inference kernel).
        out: optional output of x's shape, dtype and device (any strides).
        stream: the CUDA stream to run on.

    Returns:
        The output as a `pycudnn.Tensor`, ``out`` itself when given.
    """
    try:
        xt, w, b = _as_tensor(x, stream), _as_tensor(weight, stream), _as_tensor(bias, stream)
        rm, rv = _as_tensor(running_mean, stream), _as_tensor(running_var, stream)
        o = None if out is None else _as_tensor(out, stream)
        plan = _INFER[_infer_key(mode, eps, xt, w, b, rm, rv, o)]
    except Exception:  # a new signature, or arguments the full checks refuse (in their order)
        return _inference_full(x, weight, bias, running_mean, running_var, eps, mode, out, stream)
    if o is not None:
        _check_written("batch_norm_forward_inference", o, None, None,
                       [("input", xt), ("weight", w), ("bias", b), ("running_mean", rm),
                        ("running_var", rv)])
    s, sref = _stream_pair(stream)
    dev = xt.device
    prev = callers_device()
    try:
        handle = get_handle(dev, s)
        if o is None:
            owner = allocate_fast(plan.nbytes, dev, s, sref)
            o = Tensor._make(owner.ptr, xt.shape, xt.strides, xt.dtype, dev, owner)
        fast = plan.fast
        if fast is not None and fast.plan is not None \
                and not (xt.ptr | rm.ptr | rv.ptr | w.ptr | b.ptr | o.ptr) % ALIGNMENT \
                and fast.launch(handle, (xt.ptr, rm.ptr, rv.ptr, w.ptr, b.ptr, o.ptr)):
            return o
        xd = plan.xd
        st = plan.launch(handle, plan.mode, plan.one, plan.zero, xd, xt.ptr, xd, o.ptr, plan.pd,
                         w.ptr, b.ptr, rm.ptr, rv.ptr, plan.eps)
        if st:
            _launch_failed(st, "cudnnBatchNormalizationForwardInference", plan)
        if fast is not None and fast.plan is None:
            fast.tick()
        return o
    finally:
        restore_device(prev)


def _inference_full(x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any, eps: Any,
                    mode: Any, out: Any, stream: Any) -> Tensor:
    """`batch_norm_forward_inference` the long way: the full checks, in the order they name the
    parameters, then a call that copies what cuDNN cannot take as it is. Stores the plan of a
    call that needs no copy, which the next call of its signature takes."""
    fn = "batch_norm_forward_inference"
    prev = callers_device()
    try:
        call = _prologue(fn, x, mode, stream, training=False)
        if call.mode == MODES["spatial_persistent"]:
            call.mode = MODES["spatial"]
        e = _eps(eps, fn)
        w = _param(weight, "weight", call.x, call.mode, fn, stream)
        b = _param(bias, "bias", call.x, call.mode, fn, stream)
        if running_mean is None or running_var is None:
            raise ValueError(f"{fn}: expected running_mean and running_var (inference normalizes "
                             f"with stored statistics), but got None")
        rm = _param(running_mean, "running_mean", call.x, call.mode, fn, stream)
        rv = _param(running_var, "running_var", call.x, call.mode, fn, stream)
        reads: list[tuple[str, Tensor | None]] = [("input", call.x), ("weight", w), ("bias", b),
                                                  ("running_mean", rm), ("running_var", rv)]
        o = _check_out(out, "out", call.x, fn, stream, reads) if out is not None else None
        if call.x.size == 0:
            if o is not None:
                return o
            get_handle(call.device, call.s)
            return _from4d(_alloc_like(call.x4, call.s, call.sref), call.x.shape)
        plan = _plan(call, "cudnnBatchNormalizationForwardInference", (w, b, rm, rv), (o,), 0.0, e)
        if plan is not None:
            if call.mode == MODES["spatial"]:
                plan.fast = runtime_kernels.batch_norm_inference_promotion(call.x4, call.pdt, e)
            _INFER.put(_infer_key(mode, eps, call.x, w, b, rm, rv, o), plan)
        call.start()
        entry = call.entry
        assert entry is not None
        y4, target = call.output(o)
        p = _Params(call.handle, call.s, call.sref, call.p4)
        wp, bp, rmp, rvp = p.read(w), p.read(b), p.read(rm), p.read(rv)
        one, zero = scalar_pointers(call.x.dtype.name)
        xd = entry.x_desc.handle
        st = _lib.lib().cudnnBatchNormalizationForwardInference(
            call.handle, call.mode, one, zero, xd, call.x4.ptr, xd, y4.ptr, entry.p_desc.handle,
            wp, bp, rmp, rvp, e)
        if st:
            _lib.raise_status(st, "cudnnBatchNormalizationForwardInference",
                              f"  x: {entry.x_desc!r}", f"  parameters: {entry.p_desc!r}",
                              f"  mode: {_MODE_NAMES[call.mode]}")
        return call.finish_output(y4, target)
    finally:
        restore_device(prev)


def _check_saved(fn: str, save_mean: Any, save_invstd: Any, call: _Call,
                 stream: Any) -> tuple[Tensor | None, Tensor | None]:
    if (save_mean is None) != (save_invstd is None):
        missing = "save_invstd" if save_invstd is None else "save_mean"
        raise ValueError(f"{fn}: expected save_mean and save_invstd both given or both None "
                         f"(cuDNN then recomputes them from the input), but {missing} is None")
    if save_mean is None:
        return None, None
    return (_param(save_mean, "save_mean", call.x, call.mode, fn, stream),
            _param(save_invstd, "save_invstd", call.x, call.mode, fn, stream))


def _check_reserve(fn: str, reserve: Any, call: _Call, ops: int) -> ReserveSpace | None:
    if reserve is None:
        return None
    if not isinstance(reserve, ReserveSpace):
        raise TypeError(f"{fn}: expected reserve to be the ReserveSpace a training forward pass "
                        f"returned (or None), but got {type(reserve).__name__}")
    if reserve.device != call.device:
        raise ValueError(f"{fn}: expected reserve on cuda:{call.device} (the input's device), but "
                         f"got cuda:{reserve.device}")
    if ops == _OPS_ADD_RELU and not reserve.fused:
        raise ValueError(f"{fn}: reserve comes from a batch norm without the fused add + ReLU;"
                         f" pass the reserve batch_norm_add_relu_forward_training returned")
    x4 = call.x4  # as call.start() will make it
    if reserve._key != (x4.shape, _dense_strides(x4), x4.dtype, call.mode, ops):
        raise ValueError(f"{fn}: reserve was made by a forward pass of another shape, layout, "
                         f"dtype, mode or kind (fused add + ReLU or not) than this call's; pass "
                         f"the reserve of the forward pass of this input")
    return reserve


def _run_backward(call: _Call, ops: int, y4: Tensor | None, dy4: Tensor, dz4: Tensor | None,
                  dx4: Tensor, w: Tensor, b: Tensor | None, dw: Tensor, db: Tensor,
                  sm: Tensor | None, si: Tensor | None, eps: float,
                  reserve: ReserveSpace | None) -> None:
    entry = call.entry
    assert entry is not None
    _, res_needed, ws_size = _sizes(entry, call.handle, call.device, call.mode, ops)
    res_ptr, res_size = None, 0
    if reserve is not None:
        if reserve._key != _reserve_key(call, ops):
            raise ValueError(f"{call.fn}: reserve was made by a forward pass of another shape, "
                             f"layout, dtype or mode than this input's; pass the reserve of the "
                             f"forward pass of this input")
        res_ptr, res_size = reserve.ptr, reserve.nbytes
    p = _Params(call.handle, call.s, call.sref, call.p4)
    wp, bp = p.read(w), p.read(b)
    smp, sip = p.read(sm), p.read(si)
    dwp, dbp = p.inout(dw, read=False), p.inout(db, read=False)
    ws, owned = _workspace(ws_size, call.device, call.s, True)
    one, zero = scalar_pointers(call.x.dtype.name)
    xd = entry.x_desc.handle
    act = relu_descriptor().handle if ops != _OPS_BN else None
    try:
        st = _lib.lib().cudnnBatchNormalizationBackwardEx(
            call.handle, call.mode, ops, one, zero, one, zero, xd, call.x4.ptr, xd,
            y4.ptr if y4 is not None else None, xd, dy4.ptr, xd,
            dz4.ptr if dz4 is not None else None, xd, dx4.ptr, entry.p_desc.handle, wp, bp, dwp,
            dbp, eps, smp, sip, act, ws or None, ws_size, res_ptr, res_size)
    finally:
        _release_workspace(owned, call.s)
    if st:
        _lib.raise_status(st, "cudnnBatchNormalizationBackwardEx",
                          f"  x: {entry.x_desc!r}", f"  parameters: {entry.p_desc!r}",
                          f"  mode: {_MODE_NAMES[call.mode]}, ops: {ops}, reserve: "
                          f"{res_size} bytes given, {res_needed} asked")
    p.finish()


def batch_norm_backward(x: TensorLike, dy: TensorLike, weight: TensorLike,
                        save_mean: TensorLike | None, save_invstd: TensorLike | None, *,
                        eps: float = 1e-5, mode: str | int = "spatial",
                        out: TensorLike | None = None, reserve: ReserveSpace | None = None,
                        stream: StreamLike | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of `batch_norm_forward_training`
    with respect to its input, weight and bias.

    Args:
        x: the forward pass's input.
        dy: the gradient of the loss with respect to the forward output, x's shape and dtype.
        weight: the forward pass's scale.
        save_mean: the forward pass's ``save_mean`` (None, with ``save_invstd``: cuDNN
            recomputes both from ``x``).
        save_invstd: the forward pass's ``save_invstd``.
        eps: the forward pass's ``eps``.
        mode: the forward pass's ``mode``.
        out: optional output for ``dx`` (x's shape, dtype and device, any strides).
        reserve: the forward result's ``reserve`` (when it has one), for cuDNN's NHWC
            persistent kernels.
        stream: the CUDA stream to run on.

    Returns:
        ``(dx, dweight, dbias)``; ``dweight`` and ``dbias`` are shaped like ``weight``.
    """
    try:
        xt, dyt, w = _as_tensor(x, stream), _as_tensor(dy, stream), _as_tensor(weight, stream)
        sm = None if save_mean is None else _as_tensor(save_mean, stream)
        si = None if save_invstd is None else _as_tensor(save_invstd, stream)
        o = None if out is None else _as_tensor(out, stream)
        plan = _BACKWARD[_backward_key(mode, eps, xt, dyt, w, sm, si, o)]
        # the reserve: of a forward pass of this layout and mode (the full path explains others)
        if reserve is not None and (type(reserve) is not ReserveSpace or reserve.device != xt.device
                                    or reserve._key != plan.reserve_key):
            raise LookupError
    except Exception:  # a new signature, or arguments the full checks refuse (in their order)
        return _backward_full(x, dy, weight, save_mean, save_invstd, eps, mode, out, reserve,
                              stream)
    if o is not None:
        _check_written("batch_norm_backward", o, None, None,
                       [("input", xt), ("grad_output", dyt), ("weight", w), ("save_mean", sm),
                        ("save_invstd", si)])
    s, sref = _stream_pair(stream)
    dev = xt.device
    prev = callers_device()
    try:
        handle = get_handle(dev, s)
        sizes = plan.sizes
        if sizes is None:
            sizes = plan.sizes = _sizes(plan.entry, handle, dev, plan.mode, _OPS_BN)
        ws_size = sizes[2]
        dw, db = _new_pair(plan, dev, s, sref)
        if o is None:
            owner = allocate_fast(plan.nbytes, dev, s, sref)
            o = Tensor._make(owner.ptr, xt.shape, xt.strides, xt.dtype, dev, owner)
        res_ptr, res_size = (None, 0) if reserve is None else (reserve.ptr, reserve.nbytes)
        ws, owned = _workspace(ws_size, dev, s, True)
        xd, one, zero = plan.xd, plan.one, plan.zero
        try:
            st = plan.launch(handle, plan.mode, _OPS_BN, one, zero, one, zero, xd, xt.ptr, xd, None,
                             xd, dyt.ptr, xd, None, xd, o.ptr, plan.pd, w.ptr, None, dw.ptr,
                             db.ptr, plan.eps, None if sm is None else sm.ptr,
                             None if si is None else si.ptr, None, ws or None, ws_size, res_ptr,
                             res_size)
        finally:
            _release_workspace(owned, s)
        if st:
            _launch_failed(st, "cudnnBatchNormalizationBackwardEx", plan,
                           f", ops: {_OPS_BN}, reserve: {res_size} bytes given, {sizes[1]} asked")
        return o, dw, db
    finally:
        restore_device(prev)


def _backward_full(x: Any, dy: Any, weight: Any, save_mean: Any, save_invstd: Any, eps: Any,
                   mode: Any, out: Any, reserve: Any,
                   stream: Any) -> tuple[Tensor, Tensor, Tensor]:
    """`batch_norm_backward` the long way: the full checks, in the order they name the
    parameters, then a call that copies what cuDNN cannot take as it is. Stores the plan of a
    call that needs no copy, which the next call of its signature takes."""
    fn = "batch_norm_backward"
    prev = callers_device()
    try:
        call = _prologue(fn, x, mode, stream, training=True)
        e = _eps(eps, fn)
        dyt = _as_tensor(dy, stream)
        _check_like(dyt, "grad_output", call.x, fn)
        w = _param(weight, "weight", call.x, call.mode, fn, stream)
        sm, si = _check_saved(fn, save_mean, save_invstd, call, stream)
        res = _check_reserve(fn, reserve, call, _OPS_BN)
        reads: list[tuple[str, Tensor | None]] = [("input", call.x), ("grad_output", dyt),
                                                  ("weight", w), ("save_mean", sm),
                                                  ("save_invstd", si)]
        o = _check_out(out, "out", call.x, fn, stream, reads) if out is not None else None
        plan = _plan(call, "cudnnBatchNormalizationBackwardEx", (w, sm, si), (o, dyt), 0.0, e)
        if plan is not None:
            _BACKWARD.put(_backward_key(mode, eps, call.x, dyt, w, sm, si, o), plan)
        call.start()
        dy4 = _like(call.handle, _as4d(dyt), call.x4, call.s, call.sref)
        dx4, target = call.output(o)
        dw, db = call.new_params(2)
        _run_backward(call, _OPS_BN, None, dy4, None, dx4, w, None, dw, db, sm, si, e, res)
        return call.finish_output(dx4, target), dw, db
    finally:
        restore_device(prev)


# ---- fused batch norm + add + ReLU -----------------------------------------------------------------

def _fusable(call: _Call) -> bool:
    """Where cuDNN documents its fused BN + add + activation kernel: spatial persistent mode,
    4-D channels-last (NHWC) packed float16/bfloat16 tensors, C a multiple of 4."""
    x4 = call.x4
    return (call.mode == MODES["spatial_persistent"] and x4.ndim == 4
            and x4.dtype.name in ("float16", "bfloat16") and x4.shape[1] % 4 == 0
            and x4.is_contiguous("channels_last"))


def batch_norm_add_relu_forward_training(
        x: TensorLike, z: TensorLike, weight: TensorLike, bias: TensorLike,
        running_mean: TensorLike | None = None, running_var: TensorLike | None = None, *,
        momentum: float = 0.1, eps: float = 1e-5, mode: str | int = "spatial_persistent",
        out: TensorLike | None = None, save_mean: TensorLike | None = None,
        save_invstd: TensorLike | None = None,
        stream: StreamLike | None = None) -> tuple[Tensor, Tensor, Tensor, ReserveSpace | None]:
    """``y = relu(batch_norm(x) + z)`` in training, the residual block's tail.

    One fused cuDNN kernel (``cudnnBatchNormalizationForwardTrainingEx`` with
    ``CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION``) where cuDNN has one: ``mode="spatial_persistent"``,
    4-D channels-last float16/bfloat16 input with C a multiple of 4. Elsewhere, or when cuDNN
    refuses the fused call, the same result is computed in three steps (batch norm, then add,
    then ReLU) and the returned reserve is None.

    Args:
        x: input ``(N, C, *spatial)``.
        z: the residual, x's shape, dtype and device (any strides).
        weight: scale, ``(C,)``.
        bias: shift, ``(C,)``.
        running_mean: updated in place as in
            `batch_norm_forward_training`.
        running_var: updated in place (unbiased variance).
        momentum: the weight of this batch in the running averages.
        eps: added to the variance, >= 0.
        mode: as in batch_norm_forward_training; only ``"spatial_persistent"`` can fuse.
        out: optional output of x's shape, dtype and device.
        save_mean: optional output for the batch mean.
        save_invstd: optional output for ``1 / sqrt(var + eps)``.
        stream: the CUDA stream to run on.

    Returns:
        ``(y, save_mean, save_invstd, reserve)``: pass ``y``, the saved statistics and
            ``reserve`` to `batch_norm_add_relu_backward`.
    """
    fn = "batch_norm_add_relu_forward_training"
    prev = callers_device()
    try:
        call = _prologue(fn, x, mode, stream, training=True)
        m = _momentum(momentum, fn)
        e = _eps(eps, fn)
        zt = _as_tensor(z, stream)
        _check_like(zt, "z", call.x, fn)
        w = _param(weight, "weight", call.x, call.mode, fn, stream)
        b = _param(bias, "bias", call.x, call.mode, fn, stream)
        rm, rv = _check_stats(fn, running_mean, running_var, call, stream,
                              [("input", call.x), ("z", zt), ("weight", w), ("bias", b)])
        reads: list[tuple[str, Tensor | None]] = [("input", call.x), ("z", zt), ("weight", w),
                                                  ("bias", b), ("running_mean", rm),
                                                  ("running_var", rv)]
        o = _check_out(out, "out", call.x, fn, stream, reads) if out is not None else None
        sm, si = _save_outputs(fn, save_mean, save_invstd, call, stream, reads + [("out", o)])
        call.start()
        entry = call.entry
        assert entry is not None
        if sm is None or si is None:
            new = call.new_params(2)
            sm = sm if sm is not None else new[0]
            si = si if si is not None else new[1]
        y4, target = call.output(o)
        z4 = _like(call.handle, _as4d(zt), call.x4, call.s, call.sref)
        if _fusable(call) and entry.fused_ok is not False:
            try:
                sizes = _sizes(entry, call.handle, call.device, call.mode, _OPS_ADD_RELU)
                reserve = _run_training(call, _OPS_ADD_RELU, z4, y4, w, b, rm, rv, sm, si, m, e,
                                        sizes, _reserve_key(call, _OPS_ADD_RELU))
                entry.fused_ok = True
                return call.finish_output(y4, target), sm, si, reserve
            except (CudnnNotSupportedError, CudnnBadParamError):
                if entry.fused_ok:
                    raise  # it ran before for this layout: the failure is not about support
                entry.fused_ok = False  # cuDNN refused before running anything: compose
        sizes = _sizes(entry, call.handle, call.device, call.mode, _OPS_BN)
        _run_training(call, _OPS_BN, None, y4, w, b, rm, rv, sm, si, m, e, sizes, ())
        add_tensor(call.handle, z4, y4, 1.0, 1.0)
        relu_(call.handle, y4)
        return call.finish_output(y4, target), sm, si, None
    finally:
        restore_device(prev)


def _relu_backward(handle: int, y4: Tensor, dy4: Tensor, dz4: Tensor) -> None:
    """``dz = dy * (y > 0)``: ReLU's gradient from its output (y > 0 exactly where its input
    was)."""
    with TensorDescriptor(y4.shape, y4.dtype, y4.strides) as d:
        one, zero = scalar_pointers(y4.dtype.name)
        st = _lib.lib().cudnnActivationBackward(handle, relu_descriptor().handle, one, d.handle,
                                                y4.ptr, d.handle, dy4.ptr, d.handle, y4.ptr,
                                                zero, d.handle, dz4.ptr)
        if st:
            _lib.raise_status(st, "cudnnActivationBackward", f"  y: {d!r}")


def batch_norm_add_relu_backward(
        x: TensorLike, y: TensorLike, dy: TensorLike, weight: TensorLike, bias: TensorLike,
        save_mean: TensorLike | None, save_invstd: TensorLike | None,
        reserve: ReserveSpace | None = None, *, eps: float = 1e-5,
        mode: str | int = "spatial_persistent", out: TensorLike | None = None,
        stream: StreamLike | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients of `batch_norm_add_relu_forward_training`.

    With the reserve of a fused forward pass this is one fused cuDNN call
    (``cudnnBatchNormalizationBackwardEx`` with ``CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION``);
    with ``reserve=None`` (the forward pass composed its steps) it is ReLU's backward from ``y``,
    then the batch norm backward.

    Args:
        x: the forward pass's input.
        y: the forward pass's output.
        dy: the gradient with respect to ``y``.
        weight: the forward pass's scale.
        bias: the forward pass's shift (the fused kernel recomputes the ReLU's input with it).
        save_mean: the forward pass's ``save_mean``.
        save_invstd: the forward pass's ``save_invstd``.
        reserve: the forward pass's ``reserve`` (None when it composed its steps).
        eps: the forward pass's ``eps``.
        mode: the forward pass's ``mode``.
        out: optional output for ``dx``.
        stream: the CUDA stream to run on.

    Returns:
        ``(dx, dz, dweight, dbias)``: ``dz`` is the gradient for the residual ``z``.
    """
    fn = "batch_norm_add_relu_backward"
    prev = callers_device()
    try:
        call = _prologue(fn, x, mode, stream, training=True)
        e = _eps(eps, fn)
        yt = _as_tensor(y, stream)
        _check_like(yt, "y", call.x, fn)
        dyt = _as_tensor(dy, stream)
        _check_like(dyt, "grad_output", call.x, fn)
        w = _param(weight, "weight", call.x, call.mode, fn, stream)
        b = _param(bias, "bias", call.x, call.mode, fn, stream)
        sm, si = _check_saved(fn, save_mean, save_invstd, call, stream)
        res = _check_reserve(fn, reserve, call, _OPS_ADD_RELU)
        reads: list[tuple[str, Tensor | None]] = [("input", call.x), ("y", yt),
                                                  ("grad_output", dyt), ("weight", w),
                                                  ("bias", b), ("save_mean", sm),
                                                  ("save_invstd", si)]
        o = _check_out(out, "out", call.x, fn, stream, reads) if out is not None else None
        call.start()
        y4 = _like(call.handle, _as4d(yt), call.x4, call.s, call.sref)
        dy4 = _like(call.handle, _as4d(dyt), call.x4, call.s, call.sref)
        dx4, target = call.output(o)
        dz4 = _alloc_like(call.x4, call.s, call.sref)
        dw, db = call.new_params(2)
        if res is not None:
            _run_backward(call, _OPS_ADD_RELU, y4, dy4, dz4, dx4, w, b, dw, db, sm, si, e, res)
        else:
            _relu_backward(call.handle, y4, dy4, dz4)
            _run_backward(call, _OPS_BN, None, dz4, None, dx4, w, None, dw, db, sm, si, e, None)
        return call.finish_output(dx4, target), _from4d(dz4, call.x.shape), dw, db
    finally:
        restore_device(prev)


def _query_runtime_error(handle: int) -> int:
    """cudnnQueryRuntimeError (blocking): the status a persistent batch norm left (0: none)."""
    status = ctypes.c_int()
    st = _lib.lib().cudnnQueryRuntimeError(handle, byref(status), 2, None)
    if st:
        _lib.raise_status(st, "cudnnQueryRuntimeError")
    return status.value
