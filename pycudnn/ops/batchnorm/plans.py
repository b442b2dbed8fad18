"""Plans: what a repeated call that needs no copy keeps (`Plan`), keyed by its arguments' layouts,
dtypes, devices and options (`train_key`, `infer_key`, `backward_key`), in one bounded cache per
function; a planned call's sizes, outputs and launch errors; `clear_cache`."""

from __future__ import annotations

import math
from typing import Any, Sequence

from ...ffi import library as _lib
from ...runtime.memory import allocate_fast
from ...runtime.tensor import Tensor
from .. import runtime_kernels
from .._common import PlanCache, c_function, scalars_of
from .arguments import MODE_NAMES, OPS_BN, as4d, memory_format_of, param_view
from .call import Call
from .descriptors import clear_layouts, layout_of, sizes_of
from .staging import contiguous


class Plan:
    """What a repeated call needs besides its pointers, for a call that runs without copies (the
    input dense in its memory format, the parameters dense, ``grad_output`` and ``out`` in the
    input's layout): descriptors, sizes, the new tensors' layouts, the checked scalars and the C
    function. Keyed by everything the full checks read but the addresses (and read-only flags),
    which each call checks itself: a repeated call is one dict lookup, allocations and the
    launch."""

    __slots__ = ("mode", "entry", "xd", "pd", "one", "zero", "launch", "momentum", "eps",
                 "nbytes", "pshape", "pstrides", "pdt", "p_nbytes", "reserve_key", "sizes",
                 "fast")

    def __init__(self, call: Call, function: str, momentum: float, eps: float) -> None:
        x4 = call.x4
        self.mode = call.mode
        self.entry = layout_of(x4, call.mode, call.p4, call.pdt)  # what call.start() would find
        self.xd, self.pd = self.entry.x_desc.handle, self.entry.p_desc.handle
        self.one, self.zero = scalars_of(x4.dtype)
        self.launch = c_function(function)
        self.momentum, self.eps = momentum, eps
        self.nbytes = x4.size * x4.dtype.itemsize  # the output's, in the input's strides
        self.pshape, self.pstrides, self.pdt = call.pshape, contiguous(call.pshape), call.pdt
        self.p_nbytes = math.prod(call.pshape) * call.pdt.itemsize  # one parameter's
        self.reserve_key = (x4.shape, x4.strides, x4.dtype, call.mode, OPS_BN)
        self.sizes: tuple[int, int, int] | None = None  # asked of cuDNN at the first launch
        # inference: the signature's runtime-compiled kernel, once built (see runtime_kernels)
        self.fast: runtime_kernels.Promotion | None = None


TRAIN = PlanCache(128)
INFER = PlanCache(128)
BACKWARD = PlanCache(128)


def plan_of(call: Call, function: str, params: Sequence[Tensor | None],
            likes: Sequence[Tensor | None], momentum: float, eps: float) -> Plan | None:
    """The plan of a validated call, or None when it needs a copy (such calls take the full path
    every time): ``params`` must be dense, ``likes`` (out, grad_output) in the input's strides."""
    x4 = call.x4
    if x4.size == 0 or not x4.is_contiguous(memory_format_of(x4)):
        return None
    if any(t is not None and as4d(t).strides != x4.strides for t in likes):
        return None
    if any(t is not None and not param_view(t, call.p4).is_contiguous() for t in params):
        return None
    return Plan(call, function, momentum, eps)


def _sig(t: Tensor | None) -> tuple[Any, ...] | None:
    return None if t is None else (t.shape, t.strides, t.dtype, t.device)


# the keys: the arguments as given (with their types, so that True never stands for 1) and the
# tensors' layouts; built the same way by the fast path and by the full checks that store a plan

def train_key(mode: Any, momentum: Any, eps: Any, x: Tensor, w: Tensor, b: Tensor,
              rm: Tensor | None, rv: Tensor | None, o: Tensor | None, sm: Tensor | None,
              si: Tensor | None) -> tuple:
    return (mode, type(mode), momentum, type(momentum), eps, type(eps), x.shape, x.strides,
            x.dtype, x.device, w.shape, w.strides, w.dtype, w.device, b.shape, b.strides,
            b.dtype, b.device, _sig(rm), _sig(rv), _sig(o), _sig(sm), _sig(si))


def infer_key(mode: Any, eps: Any, x: Tensor, w: Tensor, b: Tensor, rm: Tensor, rv: Tensor,
              o: Tensor | None) -> tuple:
    return (mode, type(mode), eps, type(eps), x.shape, x.strides, x.dtype, x.device, w.shape,
            w.strides, w.dtype, w.device, _sig(b), _sig(rm), _sig(rv), _sig(o))


def backward_key(mode: Any, eps: Any, x: Tensor, dy: Tensor, w: Tensor, sm: Tensor | None,
                 si: Tensor | None, o: Tensor | None) -> tuple:
    return (mode, type(mode), eps, type(eps), x.shape, x.strides, x.dtype, x.device, dy.shape,
            dy.strides, dy.dtype, dy.device, w.shape, w.strides, w.dtype, w.device, _sig(sm),
            _sig(si), _sig(o))


def new_pair(plan: Plan, device: int, s: int, sref: Any) -> tuple[Tensor, Tensor]:
    """Two new parameter-shaped tensors in one allocation (`Call.new_params` from a plan)."""
    n = plan.p_nbytes
    buf = allocate_fast(2 * n, device, s, sref)
    shape, strides, dt = plan.pshape, plan.pstrides, plan.pdt
    return (Tensor._make(buf.ptr, shape, strides, dt, device, buf),
            Tensor._make(buf.ptr + n, shape, strides, dt, device, buf))


def planned_sizes(plan: Plan, handle: int, device: int) -> tuple[int, int, int]:
    """The plan's (forward workspace, reserve, backward workspace) sizes, asked of cuDNN at its
    first launch."""
    sizes = plan.sizes = sizes_of(plan.entry, handle, device, plan.mode, OPS_BN)
    return sizes


def planned_output(plan: Plan, x: Tensor, s: int, sref: Any) -> Tensor:
    """A new output of a planned call: ``x``'s shape, strides and dtype, on its device."""
    owner = allocate_fast(plan.nbytes, x.device, s, sref)
    return Tensor._make(owner.ptr, x.shape, x.strides, x.dtype, x.device, owner)


def launch_failed(st: int, function: str, plan: Plan, more: str = "") -> None:
    """Raise for a failed launch of a planned call, as the full path words it."""
    _lib.raise_status(st, function, f"  x: {plan.entry.x_desc!r}",
                      f"  parameters: {plan.entry.p_desc!r}",
                      f"  mode: {MODE_NAMES[plan.mode]}{more}")


def clear_cache() -> None:
    """Forget the cached descriptors and plans (descriptors are freed once no call uses them)."""
    clear_layouts()
    for plans in (TRAIN, INFER, BACKWARD):
        plans.clear()
