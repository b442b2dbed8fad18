"""`batch_norm_forward_training`: a planned call (one lookup, the checks its key cannot make, the
allocations and the launch) or the full path that stores the plan; `query_runtime_error` for
what a persistent-mode kernel left."""

from __future__ import annotations

import ctypes
from ctypes import byref
from typing import Any

from ...ffi import library as _lib
from ...runtime.memory import StreamLike, allocate_fast, callers_device, restore_device
from ...runtime.tensor import Tensor, TensorLike, check_writable
from ...runtime.tensor.checks import check_out_reads
from .._common import meet
from .arguments import OPS_BN, check_out, check_param, check_written, tensor_of
from .call import (begin_launch, begin_training, check_stats, reserve_key, run_training,
                   save_outputs)
from .descriptors import sizes_of
from .plans import TRAIN, launch_failed, new_pair, plan_of, planned_output, planned_sizes, train_key
from .results import BatchNormResult, ReserveSpace
from .staging import launch_with_workspace


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
        xt, w, b = tensor_of(x, stream), tensor_of(weight, stream), tensor_of(bias, stream)
        rm = None if running_mean is None else tensor_of(running_mean, stream)
        rv = None if running_var is None else tensor_of(running_var, stream)
        o = None if out is None else tensor_of(out, stream)
        sm = None if save_mean is None else tensor_of(save_mean, stream)
        si = None if save_invstd is None else tensor_of(save_invstd, stream)
        plan = TRAIN[train_key(mode, momentum, eps, xt, w, b, rm, rv, o, sm, si)]
    except Exception:  # a new signature, or arguments the full checks refuse (in their order)
        return training_full(x, weight, bias, running_mean, running_var, momentum, eps, mode,
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
                        check_out_reads(t, ((read, r),), "batch_norm_forward_training", name=name)
    if o is not None or sm is not None or si is not None:
        check_written("batch_norm_forward_training", o, sm, si,
                      [("input", xt), ("weight", w), ("bias", b), ("running_mean", rm),
                       ("running_var", rv)])
    dev, s, sref, prev, handle = begin_launch(stream, xt)
    try:
        ws_size, res_size, _ = plan.sizes or planned_sizes(plan, handle, dev)
        if sm is None or si is None:
            new = new_pair(plan, dev, s, sref)
            sm = sm if sm is not None else new[0]
            si = si if si is not None else new[1]
        o = o if o is not None else planned_output(plan, xt, s, sref)
        reserve, res_ptr = None, None
        if res_size:
            buf = allocate_fast(res_size, dev, s, sref)
            reserve = ReserveSpace(buf, res_size, dev, False, plan.reserve_key)
            res_ptr = buf.ptr
        xd = plan.xd
        st = launch_with_workspace(plan.launch, ws_size, dev, s, res_ptr, res_size,
                                   handle, plan.mode, OPS_BN, plan.one, plan.zero, xd, xt.ptr, xd,
                                   None, xd, o.ptr, plan.pd, w.ptr, b.ptr, plan.momentum,
                                   None if rm is None else rm.ptr, None if rv is None else rv.ptr,
                                   plan.eps, sm.ptr, si.ptr, None)
        if st:
            launch_failed(st, "cudnnBatchNormalizationForwardTrainingEx", plan,
                          f", ops: {OPS_BN}")
        return BatchNormResult(o, sm, si, reserve)
    finally:
        restore_device(prev)


def training_full(x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                  momentum: Any, eps: Any, mode: Any, out: Any, save_mean: Any,
                  save_invstd: Any, stream: Any) -> BatchNormResult:
    """`batch_norm_forward_training` the long way: the full checks, in the order they name the
    parameters, then a call that copies what cuDNN cannot take as it is. Stores the plan of a
    call that needs no copy, which the next call of its signature takes.
    Public as a seam for tests and tooling."""
    fn = "batch_norm_forward_training"
    prev = callers_device()
    try:
        call, m, e = begin_training(fn, x, mode, stream, momentum, eps)
        w = check_param(weight, "weight", call.x, call.mode, fn, stream)
        b = check_param(bias, "bias", call.x, call.mode, fn, stream)
        rm, rv = check_stats(fn, running_mean, running_var, call, stream,
                             [("input", call.x), ("weight", w), ("bias", b)])
        reads: list[tuple[str, Tensor | None]] = [("input", call.x), ("weight", w), ("bias", b),
                                                  ("running_mean", rm), ("running_var", rv)]
        o = check_out(out, "out", call.x, fn, stream, reads) if out is not None else None
        sm, si = save_outputs(fn, save_mean, save_invstd, call, stream,
                              reads + [("out", o)])
        plan = plan_of(call, "cudnnBatchNormalizationForwardTrainingEx", (w, b, rm, rv, sm, si),
                       (o,), m, e)
        if plan is not None:
            TRAIN.put(train_key(mode, momentum, eps, call.x, w, b, rm, rv, o, sm, si), plan)
        call.start()
        entry = call.entry
        assert entry is not None
        sm, si = call.saved_statistics(sm, si)
        y4, target = call.output(o)
        sizes = sizes_of(entry, call.handle, call.device, call.mode, OPS_BN)
        reserve = run_training(call, OPS_BN, None, y4, w, b, rm, rv, sm, si, m, e, sizes,
                               reserve_key(call, OPS_BN))
        return BatchNormResult(call.finish_output(y4, target), sm, si, reserve)
    finally:
        restore_device(prev)


def query_runtime_error(handle: int) -> int:
    """cudnnQueryRuntimeError (blocking): the status a persistent batch norm left (0: none)."""
    status = ctypes.c_int()
    _lib.lib().checked.cudnnQueryRuntimeError(handle, byref(status), 2, None)
    return status.value
