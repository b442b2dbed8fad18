"""`batch_norm_backward`: a planned call or the full path that stores the plan."""

from __future__ import annotations

from typing import Any

from ...runtime.memory import StreamLike, callers_device, restore_device
from ...runtime.tensor import Tensor, TensorLike
from ...runtime.tensor.checks import check_out_reads
from .arguments import OPS_BN, as4d, check_out, check_param, tensor_of
from .call import begin_full, begin_launch, check_reserve, check_saved, run_backward
from .plans import (BACKWARD, backward_key, launch_failed, new_pair, plan_of, planned_output,
                    planned_sizes)
from .results import ReserveSpace
from .staging import launch_with_workspace, like


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
        xt, dyt, w = tensor_of(x, stream), tensor_of(dy, stream), tensor_of(weight, stream)
        sm = None if save_mean is None else tensor_of(save_mean, stream)
        si = None if save_invstd is None else tensor_of(save_invstd, stream)
        o = None if out is None else tensor_of(out, stream)
        plan = BACKWARD[backward_key(mode, eps, xt, dyt, w, sm, si, o)]
        # the reserve: of a forward pass of this layout and mode (the full path explains others)
        if reserve is not None and (type(reserve) is not ReserveSpace or reserve.device != xt.device
                                    or reserve._key != plan.reserve_key):
            raise LookupError
    except Exception:  # a new signature, or arguments the full checks refuse (in their order)
        return backward_full(x, dy, weight, save_mean, save_invstd, eps, mode, out, reserve,
                              stream)
    if o is not None:  # its read-only flag, and memory shared with what the call reads
        check_out_reads(o, [("input", xt), ("grad_output", dyt), ("weight", w),
                            ("save_mean", sm), ("save_invstd", si)])
    dev, s, sref, prev, handle = begin_launch(stream, xt)
    try:
        sizes = plan.sizes or planned_sizes(plan, handle, dev)
        ws_size = sizes[2]
        dw, db = new_pair(plan, dev, s, sref)
        o = o if o is not None else planned_output(plan, xt, s, sref)
        res_ptr, res_size = (None, 0) if reserve is None else (reserve.ptr, reserve.nbytes)
        xd, one, zero = plan.xd, plan.one, plan.zero
        st = launch_with_workspace(plan.launch, ws_size, dev, s, res_ptr, res_size,
                                   handle, plan.mode, OPS_BN, one, zero, one, zero, xd, xt.ptr, xd,
                                   None, xd, dyt.ptr, xd, None, xd, o.ptr, plan.pd, w.ptr, None,
                                   dw.ptr, db.ptr, plan.eps, None if sm is None else sm.ptr,
                                   None if si is None else si.ptr, None)
        if st:
            launch_failed(st, "cudnnBatchNormalizationBackwardEx", plan,
                          f", ops: {OPS_BN}, reserve: {res_size} bytes given, {sizes[1]} asked")
        return o, dw, db
    finally:
        restore_device(prev)


def backward_full(x: Any, dy: Any, weight: Any, save_mean: Any, save_invstd: Any, eps: Any,
                  mode: Any, out: Any, reserve: Any,
                  stream: Any) -> tuple[Tensor, Tensor, Tensor]:
    """`batch_norm_backward` the long way, as `training.training_full` takes it.
    Public as a seam for tests and tooling."""
    fn = "batch_norm_backward"
    prev = callers_device()
    try:
        call, e = begin_full(fn, x, mode, stream, eps)
        dyt = call.same_as_x(dy, "grad_output", stream)
        w = check_param(weight, "weight", call.x, call.mode, fn, stream)
        sm, si = check_saved(fn, save_mean, save_invstd, call, stream)
        res = check_reserve(fn, reserve, call, OPS_BN)
        reads: list[tuple[str, Tensor | None]] = [("input", call.x), ("grad_output", dyt),
                                                  ("weight", w), ("save_mean", sm),
                                                  ("save_invstd", si)]
        o = check_out(out, "out", call.x, fn, stream, reads) if out is not None else None
        plan = plan_of(call, "cudnnBatchNormalizationBackwardEx", (w, sm, si), (o, dyt), 0.0, e)
        if plan is not None:
            BACKWARD.put(backward_key(mode, eps, call.x, dyt, w, sm, si, o), plan)
        call.start()
        dy4 = like(call.handle, as4d(dyt), call.x4, call.s, call.sref)
        dx4, target = call.output(o)
        dw, db = call.new_params(2)
        run_backward(call, OPS_BN, None, dy4, None, dx4, w, None, dw, db, sm, si, e, res)
        return call.finish_output(dx4, target), dw, db
    finally:
        restore_device(prev)
