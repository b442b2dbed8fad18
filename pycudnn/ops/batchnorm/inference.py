"""`batch_norm_forward_inference`: a planned call (the signature's runtime-compiled kernel once
built, else cuDNN's inference kernel) or the full path that stores the plan."""

from __future__ import annotations

from typing import Any

from ...cudnn.tensor_ops import scalar_pointers
from ...ffi import library as _lib
from ...runtime.handle import get_handle
from ...runtime.memory import StreamLike, callers_device, restore_device
from ...runtime.tensor import Tensor, TensorLike
from ...runtime.tensor.checks import check_out_reads
from .. import runtime_kernels
from ..runtime_kernels import ALIGNMENT
from .arguments import MODES, MODE_NAMES, check_out, check_param, from4d, tensor_of
from .call import begin_full, begin_launch
from .plans import INFER, infer_key, launch_failed, plan_of, planned_output
from .staging import Params, alloc_like


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
        xt, w, b = tensor_of(x, stream), tensor_of(weight, stream), tensor_of(bias, stream)
        rm, rv = tensor_of(running_mean, stream), tensor_of(running_var, stream)
        o = None if out is None else tensor_of(out, stream)
        plan = INFER[infer_key(mode, eps, xt, w, b, rm, rv, o)]
    except Exception:  # a new signature, or arguments the full checks refuse (in their order)
        return inference_full(x, weight, bias, running_mean, running_var, eps, mode, out, stream)
    if o is not None:  # its read-only flag, and memory shared with what the call reads
        check_out_reads(o, [("input", xt), ("weight", w), ("bias", b), ("running_mean", rm),
                            ("running_var", rv)])
    _, s, sref, prev, handle = begin_launch(stream, xt)
    try:
        o = o if o is not None else planned_output(plan, xt, s, sref)
        fast = plan.fast
        if fast is not None and fast.plan is not None \
                and not (xt.ptr | rm.ptr | rv.ptr | w.ptr | b.ptr | o.ptr) % ALIGNMENT \
                and fast.launch(handle, (xt.ptr, rm.ptr, rv.ptr, w.ptr, b.ptr, o.ptr)):
            return o
        xd = plan.xd
        st = plan.launch(handle, plan.mode, plan.one, plan.zero, xd, xt.ptr, xd, o.ptr, plan.pd,
                         w.ptr, b.ptr, rm.ptr, rv.ptr, plan.eps)
        if st:
            launch_failed(st, "cudnnBatchNormalizationForwardInference", plan)
        if fast is not None and fast.plan is None:
            fast.tick()
        return o
    finally:
        restore_device(prev)


def inference_full(x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any, eps: Any,
                   mode: Any, out: Any, stream: Any) -> Tensor:
    """`batch_norm_forward_inference` the long way, as `training.training_full` takes it.
    Public as a seam for tests and tooling."""
    fn = "batch_norm_forward_inference"
    prev = callers_device()
    try:
        call, e = begin_full(fn, x, mode, stream, eps, training=False)
        if call.mode == MODES["spatial_persistent"]:
            call.mode = MODES["spatial"]
        w = check_param(weight, "weight", call.x, call.mode, fn, stream)
        b = check_param(bias, "bias", call.x, call.mode, fn, stream)
        if running_mean is None or running_var is None:
            raise ValueError(f"{fn}: expected running_mean and running_var (inference normalizes "
                             f"with stored statistics), but got None")
        rm = check_param(running_mean, "running_mean", call.x, call.mode, fn, stream)
        rv = check_param(running_var, "running_var", call.x, call.mode, fn, stream)
        reads: list[tuple[str, Tensor | None]] = [("input", call.x), ("weight", w), ("bias", b),
                                                  ("running_mean", rm), ("running_var", rv)]
        o = check_out(out, "out", call.x, fn, stream, reads) if out is not None else None
        if call.x.size == 0:
            if o is not None:
                return o
            get_handle(call.device, call.s)
            return from4d(alloc_like(call.x4, call.s, call.sref), call.x.shape)
        plan = plan_of(call, "cudnnBatchNormalizationForwardInference", (w, b, rm, rv), (o,), 0.0, e)
        if plan is not None:
            if call.mode == MODES["spatial"]:
                plan.fast = runtime_kernels.batch_norm_inference_promotion(call.x4, call.pdt, e)
            INFER.put(infer_key(mode, eps, call.x, w, b, rm, rv, o), plan)
        call.start()
        entry = call.entry
        assert entry is not None
        y4, target = call.output(o)
        p = Params(call.handle, call.s, call.sref, call.p4)
        wp, bp, rmp, rvp = p.read(w), p.read(b), p.read(rm), p.read(rv)
        one, zero = scalar_pointers(call.x.dtype.name)
        xd = entry.x_desc.handle
        st = _lib.lib().cudnnBatchNormalizationForwardInference(
            call.handle, call.mode, one, zero, xd, call.x4.ptr, xd, y4.ptr, entry.p_desc.handle,
            wp, bp, rmp, rvp, e)
        if st:
            _lib.raise_status(st, "cudnnBatchNormalizationForwardInference",
                              f"  x: {entry.x_desc!r}", f"  parameters: {entry.p_desc!r}",
                              f"  mode: {MODE_NAMES[call.mode]}")
        return call.finish_output(y4, target)
    finally:
        restore_device(prev)
