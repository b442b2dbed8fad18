"""CuPy 13's ``batch_normalization_*`` functions on `pycudnn.ops.batchnorm`.

CuPy 13 returned new arrays here (unlike the convolutions): the results are CuPy arrays when x is
one (zero-copy views of pycudnn's memory), else pycudnn.Tensors. Its rules are kept: ``decay``
weighs the old running value (pycudnn's momentum is ``1 - decay``), ``is_for_conv2d=False``
treats the last axis as the channels and every other axis as the batch, and scale, bias and
statistics of another dtype than cuDNN's (float32 for float16 input) are converted for the call
and back."""

from __future__ import annotations

import numbers
import warnings
from typing import Any

import numpy as np

from ..cudnn.tensor_ops import transform
from ..ops import batchnorm
from ..ops.batchnorm.training import query_runtime_error
from ..runtime.handle import get_handle
from ..runtime.tensor import Tensor, as_tensor, tensor_from_pointer
from .arrays import (CUDNN_TENSOR_NCHW, check_layout, data_view, input_view, new_tensor,
                     result_like, stream_of)


CUDNN_BATCHNORM_PER_ACTIVATION = 0
"""``cudnnBatchNormMode_t``: statistics per activation (over the batch only)."""
CUDNN_BATCHNORM_SPATIAL = 1
"""``cudnnBatchNormMode_t``: statistics per channel (over the batch and the spatial dims)."""
CUDNN_BATCHNORM_SPATIAL_PERSISTENT = 2
"""``cudnnBatchNormMode_t``: spatial, with cuDNN's faster persistent kernels."""
CUDNN_BATCHNORM_OPS_BN = 0
"""``cudnnBatchNormOps_t``: batch normalization only."""
CUDNN_BATCHNORM_OPS_BN_ACTIVATION = 1
"""``cudnnBatchNormOps_t``: batch normalization, then activation."""
CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION = 2
"""``cudnnBatchNormOps_t``: batch normalization, add, then activation."""

__all__ = ["batch_normalization_forward_training", "batch_normalization_forward_training_ex",
           "batch_normalization_forward_inference", "batch_normalization_backward",
           "CUDNN_BATCHNORM_PER_ACTIVATION", "CUDNN_BATCHNORM_SPATIAL",
           "CUDNN_BATCHNORM_SPATIAL_PERSISTENT", "CUDNN_BATCHNORM_OPS_BN",
           "CUDNN_BATCHNORM_OPS_BN_ACTIVATION", "CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION"]


def bn_module() -> Any:
    """`pycudnn.ops.batchnorm` (a function, so that tests can stand in for it).
    Public as a seam for tests and tooling."""
    return batchnorm


def bn_copy(src: Tensor, dst: Tensor, stream: int) -> None:
    """``dst = src`` (any strides; dtypes converted) through cudnnTransformTensor.
    Public as a seam for tests and tooling."""

    def as3(t: Tensor) -> Tensor:
        pad = max(0, 3 - t.ndim)
        return tensor_from_pointer(t.ptr, (1,) * pad + t.shape, t.dtype,
                                   strides=(t.size or 1,) * pad + t.strides, device=t.device,
                                   owner=t)

    if src.size:
        transform(get_handle(src.device, stream), as3(src), as3(dst))


def _bn_data(x: Any, is_for_conv2d: Any, d_layout: Any, stream: int,
             name: str = "x") -> tuple[Tensor, tuple[int, ...]]:
    """(the data as pycudnn's (N, C, ...) view, the array's own shape). With ``is_for_conv2d``
    the array is (N, C, ...) ((N, H, W, C) for NHWC); without, the last axis holds the channels
    and the others are one batch axis, as CuPy 13 described it to cuDNN."""
    t = as_tensor(x, stream=stream)
    if is_for_conv2d:
        return data_view(t, check_layout(d_layout, "d_layout"), stream), t.shape
    if t.ndim < 1:
        raise ValueError(f"{name}: expected an array with the channels on its last axis, got a "
                         f"0-d array")
    c = t.shape[-1]
    rows = t.size // c if c else 0
    if t.ndim == 2:
        return t, t.shape
    if not t.is_contiguous():
        tmp = new_tensor(t.shape, t.dtype, t, stream)
        bn_copy(t, tmp, stream)
        t = tmp
    return tensor_from_pointer(t.ptr, (rows, c), t.dtype, strides=(c, 1), device=t.device,
                               owner=t, readonly=t.readonly), t.shape


def _bn_param(arr: Any, dtype: Any, stream: int) -> tuple[Tensor, Tensor | None]:
    """(a 1-D parameter in cuDNN's dtype, the caller's array when that is a converted copy).
    CuPy 13 passed parameters by pointer whatever their shape: any shape with the right count."""
    t = as_tensor(arr, stream=stream)
    flat = t
    if t.ndim != 1:
        if t.is_contiguous():
            flat = tensor_from_pointer(t.ptr, (t.size,), t.dtype, device=t.device, owner=t,
                                       readonly=t.readonly)
        else:
            flat = new_tensor((t.size,), t.dtype, t, stream)
            bn_copy(t, tensor_from_pointer(flat.ptr, t.shape, t.dtype, device=t.device,
                                            owner=flat), stream)
            if t.dtype == dtype:
                return flat, t  # written back like a converted copy
    if flat.dtype == dtype:
        return flat, None
    conv = new_tensor((t.size,), dtype, t, stream)
    bn_copy(flat, conv, stream)
    return conv, t


def _bn_param_dtype(x: Tensor) -> Any:
    """The dtype cuDNN keeps scale, bias and statistics in for ``x``."""
    return np.dtype(np.float64) if x.dtype.name == "float64" else np.dtype(np.float32)


def _bn_write_back(tmp: Tensor, original: Tensor, stream: int) -> None:
    bn_copy(tensor_from_pointer(tmp.ptr, original.shape, tmp.dtype, device=tmp.device,
                                 owner=tmp), original, stream)


def _bn_flags(eps: Any, decay: Any | None, is_for_conv2d: Any, cudnn_mode: Any) -> None:
    if decay is not None:
        if (isinstance(decay, (bool, np.bool_)) or not isinstance(decay, numbers.Real)
            or not 0 <= float(decay) <= 1):
            raise ValueError(f"decay: expected a number in [0, 1] (the weight of the running "
                             f"value; pycudnn's momentum is 1 - decay), got {decay!r}")
    if cudnn_mode not in (CUDNN_BATCHNORM_PER_ACTIVATION, CUDNN_BATCHNORM_SPATIAL,
                          CUDNN_BATCHNORM_SPATIAL_PERSISTENT) or isinstance(cudnn_mode, bool):
        raise ValueError(f"cudnn_mode: expected CUDNN_BATCHNORM_PER_ACTIVATION (0), "
                         f"CUDNN_BATCHNORM_SPATIAL (1) or CUDNN_BATCHNORM_SPATIAL_PERSISTENT (2), "
                         f"got {cudnn_mode!r}")


def _bn_debug(debug: Any, cudnn_mode: int, device: int, stream: int) -> None:
    """CuPy 13's ``debug``: after a persistent batch norm, ask cuDNN whether it overflowed."""
    if not (debug and cudnn_mode == CUDNN_BATCHNORM_SPATIAL_PERSISTENT):
        return


    status = query_runtime_error(get_handle(device, stream))
    if status:
        warnings.warn(f"A numerical overflow might have happened in cuDNN batch normalization "
                      f"(status:{status})", stacklevel=3)  # a UserWarning, as CuPy 13's


def _bn_forward_training(x: Any, gamma: Any, beta: Any, running_mean: Any, running_var: Any,
                         mean: Any, inv_std: Any, eps: float, decay: float, is_for_conv2d: bool,
                         cudnn_mode: int, debug: bool, d_layout: int) -> tuple[Any, ...]:
    if (mean is None) != (inv_std is None):
        raise ValueError("Both mean and inv_std must be None if one is.")
    _bn_flags(eps, decay, is_for_conv2d, cudnn_mode)
    bn = bn_module()
    s = stream_of(x)
    xv, shape = _bn_data(input_view(x, s), is_for_conv2d, d_layout, s)
    pdt = _bn_param_dtype(xv)
    g, _ = _bn_param(input_view(gamma, s), pdt, s)
    b, _ = _bn_param(input_view(beta, s), pdt, s)
    rm, rm_orig = _bn_param(running_mean, pdt, s)
    rv, rv_orig = _bn_param(running_var, pdt, s)
    sm = si = sm_orig = si_orig = None
    if mean is not None:
        # a float16 or non-contiguous multi-dim mean / inv_std is computed into a converted
        # copy: written back below, as the running statistics are (CuPy 13 wrote them)
        sm, sm_orig = _bn_param(mean, pdt, s)
        si, si_orig = _bn_param(inv_std, pdt, s)
    y = new_tensor(shape, xv.dtype, xv, s)
    yv, _ = _bn_data(y, is_for_conv2d, d_layout, s, "y")
    result = bn.batch_norm_forward_training(
        xv, g, b, rm, rv, momentum=1.0 - float(decay), eps=eps, mode=int(cudnn_mode), out=yv,
        save_mean=sm, save_invstd=si, stream=s)
    for tmp, orig in ((rm, rm_orig), (rv, rv_orig), (sm, sm_orig), (si, si_orig)):
        if tmp is not None and orig is not None:
            _bn_write_back(tmp, orig, s)
    _bn_debug(debug, cudnn_mode, xv.device, s)
    if mean is not None:
        return result.reserve, result_like(y, x)
    g_shape = as_tensor(gamma, stream=s).shape  # CuPy 13 shaped them like gamma
    saved = [tensor_from_pointer(t.ptr, g_shape, t.dtype, device=t.device, owner=t)
             for t in result[1:]]
    return (result.reserve, result_like(y, x), result_like(saved[0], x), result_like(saved[1], x))


def batch_normalization_forward_training(
        x: Any, gamma: Any, beta: Any, running_mean: Any, running_var: Any, mean: Any,
        inv_std: Any, eps: float, decay: float, is_for_conv2d: bool, cudnn_mode: int,
        debug: bool, d_layout: int = CUDNN_TENSOR_NCHW) -> Any:
    """CuPy 13's ``cupyx.cudnn.batch_normalization_forward_training``.

    Normalizes ``x`` with its batch statistics, updates ``running_mean`` and ``running_var`` in
    place (``running = decay * running + (1 - decay) * batch``, the variance unbiased), and
    returns ``y``, or ``(y, mean, inv_std)`` when ``mean`` and ``inv_std`` are None (else the
    batch mean and ``1 / sqrt(var + eps)`` are written into them).

    Args:
        x: the input: ``(N, C, ...)`` (``(N, H, W, C)`` with ``d_layout=CUDNN_TENSOR_NHWC``) when
            ``is_for_conv2d``, else any shape with the channels on the last axis.
        gamma: scale, one value per channel (per activation for PER_ACTIVATION mode).
        beta: shift, like ``gamma``.
        running_mean: updated in place.
        running_var: updated in place.
        mean: None, or an array to receive the batch mean.
        inv_std: None, or an array to receive ``1 / sqrt(var + eps)``.
        eps: added to the variance.
        decay: the weight of the running value in the update.
        is_for_conv2d: see ``x``.
        cudnn_mode: a ``CUDNN_BATCHNORM_*`` mode.
        debug: after SPATIAL_PERSISTENT, check for an overflow (a RuntimeWarning if one
            happened).
        d_layout: ``CUDNN_TENSOR_NCHW`` or ``CUDNN_TENSOR_NHWC`` (4-D ``x`` with
            ``is_for_conv2d``).
    """
    out = _bn_forward_training(x, gamma, beta, running_mean, running_var, mean, inv_std, eps,
                               decay, is_for_conv2d, cudnn_mode, debug, d_layout)
    if out[0] is not None:

        try:
            from cupy._util import PerformanceWarning as category
        except Exception:  # CuPy's class when it is there, else its base
            category = RuntimeWarning
        warnings.warn("Could be faster by calling batch_normalization_forward_training_ex() "
                      "instead of batch_normalization_forward_training().", category,
                      stacklevel=2)
    return out[1] if mean is not None else out[1:]


def batch_normalization_forward_training_ex(
        x: Any, gamma: Any, beta: Any, running_mean: Any, running_var: Any, mean: Any,
        inv_std: Any, eps: float, decay: float, is_for_conv2d: bool, cudnn_mode: int,
        debug: bool, d_layout: int = CUDNN_TENSOR_NCHW) -> Any:
    """CuPy 13's ``cupyx.cudnn.batch_normalization_forward_training_ex``: as
    `batch_normalization_forward_training` (the same arguments), with the reserve space first in
    the result: ``(reserve_space, y)`` or ``(reserve_space, y, mean, inv_std)``.
    ``reserve_space`` is None unless cuDNN asked for one (its NHWC persistent kernels); pass it
    to `batch_normalization_backward`.
    """
    out = _bn_forward_training(x, gamma, beta, running_mean, running_var, mean, inv_std, eps,
                               decay, is_for_conv2d, cudnn_mode, debug, d_layout)
    return out if mean is None else out[:2]


def batch_normalization_forward_inference(
        x: Any, gamma: Any, beta: Any, mean: Any, var: Any, eps: float, is_for_conv2d: bool,
        cudnn_mode: int, d_layout: int = CUDNN_TENSOR_NCHW) -> Any:
    """CuPy 13's ``cupyx.cudnn.batch_normalization_forward_inference``:
    ``y = gamma * (x - mean) / sqrt(var + eps) + beta``, a new array.

    Args:
        x: as in batch_normalization_forward_training.
        gamma: scale.
        beta: shift.
        mean: the stored mean.
        var: the stored variance.
        eps: added to the variance.
        is_for_conv2d: whether x is (N, C, ...) data (else channels last).
        cudnn_mode: a ``CUDNN_BATCHNORM_*`` mode (SPATIAL_PERSISTENT runs as SPATIAL).
        d_layout: ``CUDNN_TENSOR_NCHW`` or ``CUDNN_TENSOR_NHWC``.
    """
    _bn_flags(eps, None, is_for_conv2d, cudnn_mode)
    bn = bn_module()
    s = stream_of(x)
    xv, shape = _bn_data(input_view(x, s), is_for_conv2d, d_layout, s)
    pdt = _bn_param_dtype(xv)
    g, b = _bn_param(input_view(gamma, s), pdt, s)[0], _bn_param(input_view(beta, s), pdt, s)[0]
    m, v = _bn_param(input_view(mean, s), pdt, s)[0], _bn_param(input_view(var, s), pdt, s)[0]
    y = new_tensor(shape, xv.dtype, xv, s)
    yv, _ = _bn_data(y, is_for_conv2d, d_layout, s, "y")
    bn.batch_norm_forward_inference(xv, g, b, m, v, eps=eps, mode=int(cudnn_mode), out=yv,
                                    stream=s)
    return result_like(y, x)


def batch_normalization_backward(
        x: Any, gamma: Any, gy: Any, mean: Any, inv_std: Any, eps: float, is_for_conv2d: bool,
        cudnn_mode: int, debug: bool, d_layout: int = CUDNN_TENSOR_NCHW, *,
        reserve_space: Any = None) -> tuple[Any, Any, Any]:
    """CuPy 13's ``cupyx.cudnn.batch_normalization_backward``: ``(gx, ggamma, gbeta)``, new
    arrays; ``ggamma`` and ``gbeta`` have ``gamma``'s shape, and cuDNN's parameter dtype (float32,
    or float64 for float64 ``x``) when ``gamma`` has it, else ``x``'s dtype, as CuPy 13 gave.

    Args:
        x: the forward input.
        gamma: the forward scale.
        gy: the gradient with respect to the forward output (x's shape and layout).
        mean: the batch mean the forward pass returned.
        inv_std: the ``inv_std`` the forward pass returned.
        eps: the forward pass's ``eps``.
        is_for_conv2d: whether x is (N, C, ...) data (else channels last).
        cudnn_mode: the forward pass's ``CUDNN_BATCHNORM_*`` mode.
        debug: check for an overflow after SPATIAL_PERSISTENT.
        d_layout: ``CUDNN_TENSOR_NCHW`` or ``CUDNN_TENSOR_NHWC``.
        reserve_space: what `batch_normalization_forward_training_ex` returned first.
    """
    _bn_flags(eps, None, is_for_conv2d, cudnn_mode)
    bn = bn_module()
    s = stream_of(x)
    xv, shape = _bn_data(input_view(x, s), is_for_conv2d, d_layout, s)
    gyv, _ = _bn_data(input_view(gy, s), is_for_conv2d, d_layout, s, "gy")
    pdt = _bn_param_dtype(xv)
    g, g_orig = _bn_param(input_view(gamma, s), pdt, s)
    m, v = _bn_param(input_view(mean, s), pdt, s)[0], _bn_param(input_view(inv_std, s), pdt, s)[0]
    gx = new_tensor(shape, xv.dtype, xv, s)
    gxv, _ = _bn_data(gx, is_for_conv2d, d_layout, s, "gx")
    _, dg, db = bn.batch_norm_backward(xv, gyv, g, m, v, eps=eps, mode=int(cudnn_mode), out=gxv,
                                       reserve=reserve_space, stream=s)
    _bn_debug(debug, cudnn_mode, xv.device, s)
    g_t = as_tensor(gamma, stream=s)
    # CuPy 13: cuDNN's parameter dtype, or x's where gamma came in another dtype
    g_dtype = pdt if g_t.dtype == pdt else xv.dtype
    outs = []
    for d in (dg, db):
        r = new_tensor(g_t.shape, g_dtype, g_t, s)
        _bn_write_back(d, r, s)
        outs.append(result_like(r, x))
    return result_like(gx, x), outs[0], outs[1]
