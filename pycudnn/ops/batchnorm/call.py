"""The full path every function shares: one validated call (`Call`: the input as cuDNN sees it, the
handle, the descriptors), the checks of statistics, saved outputs and the reserve, and the
``...TrainingEx`` / ``BackwardEx`` launches with their staging (`run_training`, `run_backward`)."""

from __future__ import annotations

import math
from typing import Any, Sequence

from ...cudnn.tensor_ops import relu_descriptor, scalar_pointers, transform
from ...ffi import library as _lib
from ...runtime.handle import get_handle
from ...runtime.memory import allocate_fast, callers_device, restore_device, stream_pair
from ...runtime.tensor import Tensor, views_overlap
from ...runtime.tensor.checks import check_out_reads
from .arguments import (MODES, MODE_NAMES, OPS_ADD_RELU, OPS_BN, as4d, check_eps, check_like,
                        check_mode, check_momentum, check_param, check_x, from4d, param_dtype,
                        param_shape, tensor_of)
from .descriptors import Layout, layout_of, sizes_of
from .results import ReserveSpace
from .staging import (Params, alloc_like, contiguous, dense_input, dense_strides,
                      launch_with_workspace)


class Call:
    """One validated batch-norm call: the input as cuDNN sees it and what the call writes."""

    __slots__ = ("fn", "x", "x4", "mode", "p4", "pshape", "pdt", "s", "sref", "device",
                 "handle", "entry")

    def __init__(self, fn: str, x: Tensor, mode: int, stream: Any) -> None:
        self.fn = fn
        self.x = x
        self.x4 = as4d(x)
        self.mode = mode
        self.pshape, self.p4 = param_shape(x, mode)
        self.pdt = param_dtype(x)
        self.s, self.sref = stream_pair(stream)
        self.device = x.device
        self.handle = 0
        self.entry: Layout | None = None

    def start(self) -> None:
        """After validation: the handle (the device made current) and the input made dense."""
        self.handle = get_handle(self.device, self.s)
        self.x4 = dense_input(self.handle, self.x4, self.s, self.sref)
        self.entry = layout_of(self.x4, self.mode, self.p4, self.pdt)

    def same_as_x(self, value: Any, name: str, stream: Any) -> Tensor:
        """``value`` as a Tensor that must match the input: same shape, dtype and device."""
        t = tensor_of(value, stream)
        check_like(t, name, self.x, self.fn)
        return t

    def new_params(self, count: int) -> list[Tensor]:
        """``count`` new parameter-shaped tensors in one allocation (in the caller's shape)."""
        n = math.prod(self.pshape)
        buf = allocate_fast(count * n * self.pdt.itemsize, self.device, self.s, self.sref)
        base = buf.ptr
        strides = contiguous(self.pshape)
        return [Tensor._make(base + i * n * self.pdt.itemsize, self.pshape, strides, self.pdt,
                             self.device, buf) for i in range(count)]

    def saved_statistics(self, sm: Tensor | None,
                         si: Tensor | None) -> tuple[Tensor, Tensor]:
        """``save_mean`` and ``save_invstd``: the caller's, or new ones where none was given."""
        if sm is None or si is None:
            new = self.new_params(2)
            sm = sm if sm is not None else new[0]
            si = si if si is not None else new[1]
        return sm, si

    def output(self, out: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """(the 4-D tensor cuDNN writes, the caller's out to copy it into afterwards or None)."""
        if out is not None:
            o4 = as4d(out)
            if o4.strides == self.x4.strides:
                return o4, None
            return alloc_like(self.x4, self.s, self.sref), o4
        return alloc_like(self.x4, self.s, self.sref), None

    def finish_output(self, y4: Tensor, target: Tensor | None) -> Tensor:
        if target is not None:
            transform(self.handle, y4, target)
            return from4d(target, self.x.shape)
        return from4d(y4, self.x.shape)


def prologue(fn: str, x: Any, mode: Any, stream: Any, training: bool) -> Call:
    xt = tensor_of(x, stream)
    check_x(xt, fn)
    m = check_mode(mode, fn)
    if training:
        if 0 in xt.shape[1:]:
            raise ValueError(f"{fn}: expected input with positive channel and spatial sizes, but "
                             f"got input of size {list(xt.shape)}")
        n = xt.shape[0]
        per_channel = n * math.prod(xt.shape[2:]) if m != MODES["per_activation"] else n
        if per_channel <= 1:
            raise ValueError(f"{fn}: expected more than 1 value per channel when training, got "
                             f"input size {list(xt.shape)}")
    return Call(fn, xt, m, stream)


def begin_full(fn: str, x: Any, mode: Any, stream: Any, eps: Any,
               training: bool = True) -> tuple[Call, float]:
    """The full path's first checks: the validated call, then ``eps``."""
    call = prologue(fn, x, mode, stream, training)
    return call, check_eps(eps, fn)


def begin_training(fn: str, x: Any, mode: Any, stream: Any, momentum: Any,
                   eps: Any) -> tuple[Call, float, float]:
    """A forward training full path's first checks: the validated call, ``momentum``, ``eps``."""
    call = prologue(fn, x, mode, stream, True)
    return call, check_momentum(momentum, fn), check_eps(eps, fn)


def begin_launch(stream: Any, x: Tensor) -> tuple[int, int, Any, int | None, int]:
    """A planned call's set-up: ``(x's device, stream, what keeps the stream alive, the caller's
    device, handle)``, x's device made current by the handle. The caller restores the caller's
    device when its launch is done; when no handle can be had, it is restored here."""
    s, sref = stream_pair(stream)
    device = x.device
    prev = callers_device()
    try:
        return device, s, sref, prev, get_handle(device, s)
    except BaseException:
        restore_device(prev)
        raise


def _neither(fn: str, a: Any, a_name: str, b: Any, b_name: str, note: str) -> bool:
    """Whether neither of a pair that goes together is given; one without the other is refused
    (``note`` says what their absence means)."""
    if (a is None) != (b is None):
        missing = b_name if b is None else a_name
        raise ValueError(f"{fn}: expected {a_name} and {b_name} both given or both None{note}, "
                         f"but {missing} is None")
    return a is None


def check_stats(fn: str, running_mean: Any, running_var: Any, call: Call, stream: Any,
                reads: Sequence[tuple[str, Tensor | None]]) -> tuple[Tensor | None,
                                                                     Tensor | None]:
    if _neither(fn, running_mean, "running_mean", running_var, "running_var", ""):
        return None, None
    rm = check_param(running_mean, "running_mean", call.x, call.mode, fn, stream, writable=True)
    rv = check_param(running_var, "running_var", call.x, call.mode, fn, stream, writable=True)
    if rm.size and views_overlap(rm, rv):
        raise ValueError(f"{fn}: running_mean and running_var overlap; pass separate tensors")
    # updated in place: sharing memory with what the call reads (one ``ones`` tensor as weight
    # and running_var, say) would change that input mid-call
    check_out_reads(rm, reads, fn, name="running_mean")
    check_out_reads(rv, reads, fn, name="running_var")
    return rm, rv


def save_outputs(fn: str, save_mean: Any, save_invstd: Any, call: Call, stream: Any,
                 reads: list[tuple[str, Tensor | None]]) -> tuple[Tensor | None, Tensor | None]:
    sm = si = None
    if save_mean is not None:
        sm = check_param(save_mean, "save_mean", call.x, call.mode, fn, stream, writable=True)
        check_out_reads(sm, reads, name="save_mean")
    if save_invstd is not None:
        si = check_param(save_invstd, "save_invstd", call.x, call.mode, fn, stream, writable=True)
        check_out_reads(si, reads + [("save_mean", sm)], name="save_invstd")
    return sm, si


def run_training(call: Call, ops: int, z4: Tensor | None, y4: Tensor, w: Tensor, b: Tensor,
                 rm: Tensor | None, rv: Tensor | None, sm: Tensor, si: Tensor,
                 momentum: float, eps: float, sizes: tuple[int, int, int],
                 key: tuple) -> ReserveSpace | None:
    entry = call.entry
    assert entry is not None
    p = Params(call.handle, call.s, call.sref, call.p4)
    wp, bp = p.read(w), p.read(b)
    rmp, rvp = p.inout(rm), p.inout(rv)
    smp, sip = p.inout(sm, read=False), p.inout(si, read=False)
    ws_size, res_size, _ = sizes
    reserve = None
    res_ptr = None
    if res_size:
        buf = allocate_fast(res_size, call.device, call.s, call.sref)
        reserve = ReserveSpace(buf, res_size, call.device, ops == OPS_ADD_RELU, key)
        res_ptr = buf.ptr
    one, zero = scalar_pointers(call.x.dtype.name)
    xd = entry.x_desc.handle
    act = relu_descriptor().handle if ops != OPS_BN else None
    st = launch_with_workspace(
        _lib.lib().cudnnBatchNormalizationForwardTrainingEx, ws_size, call.device, call.s,
        res_ptr, res_size, call.handle, call.mode, ops, one, zero, xd, call.x4.ptr, xd,
        z4.ptr if z4 is not None else None, xd, y4.ptr, entry.p_desc.handle, wp, bp, momentum,
        rmp, rvp, eps, smp, sip, act)
    if st:
        _lib.raise_status(st, "cudnnBatchNormalizationForwardTrainingEx",
                          f"  x: {entry.x_desc!r}", f"  parameters: {entry.p_desc!r}",
                          f"  mode: {MODE_NAMES[call.mode]}, ops: {ops}")
    p.finish()
    return reserve


def reserve_key(call: Call, ops: int) -> tuple:
    return (call.x4.shape, call.x4.strides, call.x4.dtype, call.mode, ops)


def check_saved(fn: str, save_mean: Any, save_invstd: Any, call: Call,
                stream: Any) -> tuple[Tensor | None, Tensor | None]:
    if _neither(fn, save_mean, "save_mean", save_invstd, "save_invstd",
                " (cuDNN then recomputes them from the input)"):
        return None, None
    return (check_param(save_mean, "save_mean", call.x, call.mode, fn, stream),
            check_param(save_invstd, "save_invstd", call.x, call.mode, fn, stream))


def check_reserve(fn: str, reserve: Any, call: Call, ops: int) -> ReserveSpace | None:
    if reserve is None:
        return None
    if not isinstance(reserve, ReserveSpace):
        raise TypeError(f"{fn}: expected reserve to be the ReserveSpace a training forward pass "
                        f"returned (or None), but got {type(reserve).__name__}")
    if reserve.device != call.device:
        raise ValueError(f"{fn}: expected reserve on cuda:{call.device} (the input's device), but "
                         f"got cuda:{reserve.device}")
    if ops == OPS_ADD_RELU and not reserve.fused:
        raise ValueError(f"{fn}: reserve comes from a batch norm without the fused add + ReLU;"
                         f" pass the reserve batch_norm_add_relu_forward_training returned")
    x4 = call.x4  # as call.start() will make it
    if reserve._key != (x4.shape, dense_strides(x4), x4.dtype, call.mode, ops):
        raise ValueError(f"{fn}: reserve was made by a forward pass of another shape, layout, "
                         f"dtype, mode or kind (fused add + ReLU or not) than this call's; pass "
                         f"the reserve of the forward pass of this input")
    return reserve


def run_backward(call: Call, ops: int, y4: Tensor | None, dy4: Tensor, dz4: Tensor | None,
                 dx4: Tensor, w: Tensor, b: Tensor | None, dw: Tensor, db: Tensor,
                 sm: Tensor | None, si: Tensor | None, eps: float,
                 reserve: ReserveSpace | None) -> None:
    entry = call.entry
    assert entry is not None
    _, res_needed, ws_size = sizes_of(entry, call.handle, call.device, call.mode, ops)
    res_ptr, res_size = None, 0
    if reserve is not None:
        if reserve._key != reserve_key(call, ops):
            raise ValueError(f"{call.fn}: reserve was made by a forward pass of another shape, "
                             f"layout, dtype or mode than this input's; pass the reserve of the "
                             f"forward pass of this input")
        res_ptr, res_size = reserve.ptr, reserve.nbytes
    p = Params(call.handle, call.s, call.sref, call.p4)
    wp, bp = p.read(w), p.read(b)
    smp, sip = p.read(sm), p.read(si)
    dwp, dbp = p.inout(dw, read=False), p.inout(db, read=False)
    one, zero = scalar_pointers(call.x.dtype.name)
    xd = entry.x_desc.handle
    act = relu_descriptor().handle if ops != OPS_BN else None
    st = launch_with_workspace(
        _lib.lib().cudnnBatchNormalizationBackwardEx, ws_size, call.device, call.s, res_ptr,
        res_size, call.handle, call.mode, ops, one, zero, one, zero, xd, call.x4.ptr, xd,
        y4.ptr if y4 is not None else None, xd, dy4.ptr, xd,
        dz4.ptr if dz4 is not None else None, xd, dx4.ptr, entry.p_desc.handle, wp, bp, dwp,
        dbp, eps, smp, sip, act)
    if st:
        _lib.raise_status(st, "cudnnBatchNormalizationBackwardEx",
                          f"  x: {entry.x_desc!r}", f"  parameters: {entry.p_desc!r}",
                          f"  mode: {MODE_NAMES[call.mode]}, ops: {ops}, reserve: "
                          f"{res_size} bytes given, {res_needed} asked")
    p.finish()
