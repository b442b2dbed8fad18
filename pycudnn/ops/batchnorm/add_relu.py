"""The fused batch norm + add + ReLU of a residual block's tail and its backward: cuDNN's
``BN_ADD_ACTIVATION`` kernel where it has one (`batch_norm_add_relu_forward_training`), else
batch norm, add and ReLU in three steps; the backward fused with the reserve of a fused forward
pass, else ReLU's backward then batch norm's."""

from __future__ import annotations

from ...cudnn.descriptors import TensorDescriptor
from ...cudnn.tensor_ops import add_tensor, relu_, relu_descriptor, scalar_pointers
from ...errors import CudnnBadParamError, CudnnNotSupportedError
from ...ffi import library as _lib
from ...runtime.memory import StreamLike, callers_device, restore_device
from ...runtime.tensor import Tensor, TensorLike
from .arguments import MODES, OPS_ADD_RELU, OPS_BN, as4d, check_out, check_param, from4d
from .call import (Call, begin_full, begin_training, check_reserve, check_saved, check_stats,
                   reserve_key, run_backward, run_training, save_outputs)
from .descriptors import sizes_of
from .results import ReserveSpace
from .staging import alloc_like, like


def _fusable(call: Call) -> bool:
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
        call, m, e = begin_training(fn, x, mode, stream, momentum, eps)
        zt = call.same_as_x(z, "z", stream)
        w = check_param(weight, "weight", call.x, call.mode, fn, stream)
        b = check_param(bias, "bias", call.x, call.mode, fn, stream)
        rm, rv = check_stats(fn, running_mean, running_var, call, stream,
                             [("input", call.x), ("z", zt), ("weight", w), ("bias", b)])
        reads: list[tuple[str, Tensor | None]] = [("input", call.x), ("z", zt), ("weight", w),
                                                  ("bias", b), ("running_mean", rm),
                                                  ("running_var", rv)]
        o = check_out(out, "out", call.x, fn, stream, reads) if out is not None else None
        sm, si = save_outputs(fn, save_mean, save_invstd, call, stream, reads + [("out", o)])
        call.start()
        entry = call.entry
        assert entry is not None
        sm, si = call.saved_statistics(sm, si)
        y4, target = call.output(o)
        z4 = like(call.handle, as4d(zt), call.x4, call.s, call.sref)
        if _fusable(call) and entry.fused_ok is not False:
            try:
                sizes = sizes_of(entry, call.handle, call.device, call.mode, OPS_ADD_RELU)
                reserve = run_training(call, OPS_ADD_RELU, z4, y4, w, b, rm, rv, sm, si, m, e,
                                       sizes, reserve_key(call, OPS_ADD_RELU))
                entry.fused_ok = True
                return call.finish_output(y4, target), sm, si, reserve
            except (CudnnNotSupportedError, CudnnBadParamError):
                if entry.fused_ok:
                    raise  # it ran before for this layout: the failure is not about support
                entry.fused_ok = False  # cuDNN refused before running anything: compose
        sizes = sizes_of(entry, call.handle, call.device, call.mode, OPS_BN)
        run_training(call, OPS_BN, None, y4, w, b, rm, rv, sm, si, m, e, sizes, ())
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
        call, e = begin_full(fn, x, mode, stream, eps)
        yt = call.same_as_x(y, "y", stream)
        dyt = call.same_as_x(dy, "grad_output", stream)
        w = check_param(weight, "weight", call.x, call.mode, fn, stream)
        b = check_param(bias, "bias", call.x, call.mode, fn, stream)
        sm, si = check_saved(fn, save_mean, save_invstd, call, stream)
        res = check_reserve(fn, reserve, call, OPS_ADD_RELU)
        reads: list[tuple[str, Tensor | None]] = [("input", call.x), ("y", yt),
                                                  ("grad_output", dyt), ("weight", w),
                                                  ("bias", b), ("save_mean", sm),
                                                  ("save_invstd", si)]
        o = check_out(out, "out", call.x, fn, stream, reads) if out is not None else None
        call.start()
        y4 = like(call.handle, as4d(yt), call.x4, call.s, call.sref)
        dy4 = like(call.handle, as4d(dyt), call.x4, call.s, call.sref)
        dx4, target = call.output(o)
        dz4 = alloc_like(call.x4, call.s, call.sref)
        dw, db = call.new_params(2)
        if res is not None:
            run_backward(call, OPS_ADD_RELU, y4, dy4, dz4, dx4, w, b, dw, db, sm, si, e, res)
        else:
            _relu_backward(call.handle, y4, dy4, dz4)
            run_backward(call, OPS_BN, None, dz4, None, dx4, w, None, dw, db, sm, si, e, None)
        return call.finish_output(dx4, target), from4d(dz4, call.x.shape), dw, db
    finally:
        restore_device(prev)
