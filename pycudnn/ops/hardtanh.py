"""PyTorch's ``F.hardtanh(x, min_val, max_val)`` for any bounds: ``min(max(x, min_val), max_val)``.

cuDNN's clipped ReLU (`activation_forward` mode ``"clipped_relu"``) has its lower bound at 0,
and its legacy backward kernel takes the upper piece's gradient at ``x == coef`` where PyTorch
gives 0. Here both passes are built from cuDNN operations whose results are exact:

* forward: ``cudnnOpTensor`` MAX with ``min_val``, then MIN with ``max_val`` in place (a maximum
  and a minimum round nothing; NaN propagates, as PyTorch's clamp does);
* backward: PyTorch's rule, ``dx = dy`` where ``min_val < x < max_val`` and 0 elsewhere (0 at the
  bounds, infinite ones included; ``dy`` at NaN), as two ReLU masks: ``x - min_val > 0`` and
  ``max_val - x > 0``, exact in IEEE arithmetic (see `mask_terms` for infinite bounds), computed
  in float32 (float64 for float64 data, PyTorch's opmath). ``dx`` is ``dy`` or 0: exact.

Both take any strides (0 to 5 dims) and refuse what PyTorch refuses (``min_val > max_val``).
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

from .._types import NanPropagation, OpTensorOp
from ..cudnn.descriptors import OpTensorDescriptor, TensorDescriptor
from ..cudnn.tensor_ops import transform
from ..ffi import library as _lib
from ..ops._common import (FLOAT32, callers_device, check_input, check_operands, check_out_reads,
                           checked_out, layout_strides, output, prologue, restore_device,
                           stream_pair, tensor_arg)
from ..runtime.handle import get_handle
from ..runtime.memory import StreamLike
from ..runtime.tensor import Tensor, TensorLike, empty, from_numpy
from .activation import run_backward

__all__ = ["hardtanh_forward", "hardtanh_backward"]

_RANKS = (0, 1, 2, 3, 4, 5)
_WHAT = "0 to 5 dims"


def _bounds(min_val: Any, max_val: Any, fn: str) -> tuple[float, float]:
    for name, v in (("min_val", min_val), ("max_val", max_val)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer,
                                                                 np.floating)):
            raise TypeError(f"{fn}: {name} must be a real number, but got "
                            f"{type(v).__name__} {v!r}")
        if math.isnan(float(v)):
            raise ValueError(f"{fn}: {name} must not be NaN")
    lo, hi = float(min_val), float(max_val)
    if lo > hi:
        raise ValueError(f"{fn}: min_val cannot be greater than max_val, but got "
                         f"min_val={min_val!r} and max_val={max_val!r}")
    return lo, hi


def mask_terms(lo: float, hi: float, wide: Any) -> tuple[tuple[float, float], tuple[float, float]]:
    """``(alpha, b)`` of the two masks of `hardtanh_backward`, each ``alpha * x + b`` in the
    compute dtype ``wide``: the first positive exactly where ``x > lo``, the second exactly where
    ``x < hi``, NaN where x is NaN (and only there, or where the other mask is 0).

    A finite bound gives the exact difference (``x - lo``, ``hi - x``). At an infinite bound the
    difference at that same infinity is ``inf - inf``, a NaN the NaN rule would pass where PyTorch
    gives 0 (``x <= -inf``, ``x >= inf`` hold there), so ``lo = -inf`` uses ``x / 2 + M`` and
    ``hi = inf`` uses ``M - x / 2`` (M the largest finite value of ``wide``): positive for every
    finite x (``|x| / 2 < M``; halving keeps the sign), ``-inf`` at the bound's infinity. A bound
    at the other infinity (``lo = hi = inf``) keeps the difference: its NaN at ``x = inf`` is
    masked by the other bound's term. Public as a seam for tests and tooling."""
    big = float(np.finfo(np.dtype(wide)).max)
    above = (0.5, big) if lo == -math.inf else (1.0, -lo)
    below = (-0.5, big) if hi == math.inf else (-1.0, hi)
    return above, below


def _descriptor(shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any) -> TensorDescriptor:
    """A descriptor of at least 4 dims (fewer are padded with trailing unit dims)."""
    pad = max(0, 4 - len(shape))
    return TensorDescriptor(shape + (1,) * pad, dtype, strides + (1,) * pad)


def _view4(t: Tensor) -> Tensor:
    """``t`` as a view of at least 4 dims (trailing unit dims), for cudnnTransformTensor."""
    pad = max(0, 4 - t.ndim)
    return Tensor._make(t.ptr, t.shape + (1,) * pad, t.strides + (1,) * pad, t.dtype, t.device,
                        t, t.readonly)


def _scalar(dtype: Any, value: float, keep: list[Any]) -> int:
    v = ctypes.c_double(value) if np.dtype(dtype).name == "float64" else ctypes.c_float(value)
    keep.append(v)
    return ctypes.addressof(v)


def op_tensor(handle: int, op: OpTensorOp, a: Tensor, alpha1: float, b: Tensor, c: Tensor,
              nan: NanPropagation = NanPropagation.PROPAGATE_NAN) -> None:
    """``c = op(alpha1 * a, b)``, ``b`` a one-element tensor broadcast over ``a``.
    Public as a seam for tests and tooling."""
    keep: list[Any] = []
    compute = "float64" if c.dtype.name == "float64" else "float32"
    desc = OpTensorDescriptor(op, compute, nan)
    ad = _descriptor(a.shape, a.strides, a.dtype)
    cd = _descriptor(c.shape, c.strides, c.dtype)
    nd = max(4, a.ndim)
    bd = _descriptor((1,) * nd, (1,) * nd, b.dtype)
    try:
        status = _lib.lib().cudnnOpTensor(
            handle, desc.handle, _scalar(compute, alpha1, keep), ad.handle, a.ptr,
            _scalar(compute, 1.0, keep), bd.handle, b.ptr, _scalar(compute, 0.0, keep),
            cd.handle, c.ptr)
        if status:
            _lib.raise_status(status, "cudnnOpTensor", f"  op: {op.name}", f"  a: {ad!r}",
                              f"  c: {cd!r}")
    finally:
        for d in (desc, ad, cd, bd):
            d.close()


def hardtanh_forward(x: TensorLike, min_val: float = -1.0, max_val: float = 1.0, *,
                     out: TensorLike | None = None, stream: StreamLike | None = None) -> Tensor:
    """``min(max(x, min_val), max_val)`` element by element, as ``F.hardtanh``.

    Args:
        x: the input: 0 to 5 dims, any strides; float32, float16, bfloat16 or float64.
        min_val: the lower bound (PyTorch's default -1).
        max_val: the upper bound (default 1), at least ``min_val``.
        out: optional output of ``x``'s shape, dtype and device (``x`` itself: in place).
        stream: the CUDA stream to run on; default the legacy default stream.

    Returns:
        The result in ``x``'s memory format, or ``out``.
    """
    fn = "hardtanh_forward"
    s, s_ref = (0, None) if stream is None else stream_pair(stream)
    xt = tensor_arg(x, stream)
    check_input(xt, "x", fn, _RANKS, _WHAT)
    lo, hi = _bounds(min_val, max_val, fn)
    o = None if out is None else checked_out(out, xt.shape, xt, fn, stream)
    if o is not None:
        check_out_reads(o, (), fn, in_place=xt)
    strides = layout_strides(xt.shape, xt) if o is None else o.strides
    dev, n = xt.device, xt.size
    if n == 0:
        return o if o is not None else output(0, xt.shape, strides, xt.dtype, dev, s, s_ref)
    prev, handle, y = prologue(o, n * xt.dtype.itemsize, xt.shape, strides, xt, s, s_ref)
    try:
        # the bounds in x's dtype (a bound between two of its values compares as PyTorch's
        # float bound does: the maximum and minimum of representable values round to them)
        bounds = from_numpy(np.array([lo, hi]), dtype=xt.dtype, device=dev, stream=s)
        lo_t = Tensor._make(bounds.ptr, (1,), (1,), xt.dtype, dev, bounds)
        hi_t = Tensor._make(bounds.ptr + xt.dtype.itemsize, (1,), (1,), xt.dtype, dev, bounds)
        op_tensor(handle, OpTensorOp.MAX, xt, 1.0, lo_t, y)
        op_tensor(handle, OpTensorOp.MIN, y, 1.0, hi_t, y)
        return y
    finally:
        restore_device(prev)


def hardtanh_backward(dy: TensorLike, x: TensorLike, min_val: float = -1.0, max_val: float = 1.0, *,
                      out: TensorLike | None = None, stream: StreamLike | None = None) -> Tensor:
    """The gradient of `hardtanh_forward`: ``dy`` where ``min_val < x < max_val``, else 0 (at the
    bounds too), as PyTorch's ``hardtanh_backward``.

    Args:
        dy: the gradient with respect to the output: ``x``'s shape, dtype and device.
        x: the forward input.
        min_val: the forward call's lower bound.
        max_val: the forward call's upper bound.
        out: optional output of ``x``'s shape, dtype and device, sharing no memory with ``dy``
            or ``x``.
        stream: the CUDA stream to run on; default the legacy default stream.

    Returns:
        ``dx`` in ``x``'s memory format, or ``out``.
    """
    fn = "hardtanh_backward"
    s, s_ref = (0, None) if stream is None else stream_pair(stream)
    dyt, xt = tensor_arg(dy, stream), tensor_arg(x, stream)
    check_input(xt, "x", fn, _RANKS, _WHAT)
    check_operands(xt, "x", ((dyt, "dy"),), xt.shape, "the shape of x", fn, _RANKS, _WHAT)
    lo, hi = _bounds(min_val, max_val, fn)
    o = None if out is None else checked_out(out, xt.shape, xt, fn, stream)
    if o is not None:
        check_out_reads(o, (("dy", dyt), ("x", xt)), fn)
    strides = layout_strides(xt.shape, xt)
    dev = xt.device
    if xt.size == 0:
        return o if o is not None else output(0, xt.shape, strides, xt.dtype, dev, s, s_ref)
    prev = callers_device()
    try:
        handle = get_handle(dev, s)
        wide = xt.dtype if xt.dtype.name == "float64" else FLOAT32

        def dense(t: Tensor | None = None) -> Tensor:
            new = empty(xt.shape, wide, device=dev, stream=s)
            d = Tensor._make(new.ptr, xt.shape, strides, wide, dev, new)
            if t is not None:
                transform(handle, _view4(t), _view4(d))  # converted to the compute dtype
            return d

        xw, dyw = dense(xt), dense(dyt)
        (a_above, b_above), (a_below, b_below) = mask_terms(lo, hi, wide)
        bounds = from_numpy(np.array([b_above, b_below, math.inf]), dtype=wide, device=dev,
                            stream=s)
        b_above_t, b_below_t, inf = (Tensor._make(bounds.ptr + i * wide.itemsize, (1,), (1,),
                                                  wide, dev, bounds) for i in range(3))
        above, below = dense(), dense()
        op_tensor(handle, OpTensorOp.ADD, xw, a_above, b_above_t, above)  # > 0 where x > min_val
        op_tensor(handle, OpTensorOp.ADD, xw, a_below, b_below_t, below)  # > 0 where x < max_val
        # PyTorch passes dy at NaN (x <= min_val and x >= max_val are both false there): a NaN
        # difference becomes +inf, a minimum that does not propagate NaN keeps every other value
        keep_nan = NanPropagation.NOT_PROPAGATE_NAN
        op_tensor(handle, OpTensorOp.MIN, above, 1.0, inf, above, keep_nan)
        op_tensor(handle, OpTensorOp.MIN, below, 1.0, inf, below, keep_nan)
        # ReLU's gradient passes dy where its input is > 0 and gives 0 at +-0 (both kernels)
        nan = NanPropagation.PROPAGATE_NAN
        # (the guards above left no NaN: ReLU's NaN correction would change nothing)
        g = run_backward(above, dyw, above, "relu", 0.0, None, s, nan, fn, pytorch_edges=False)
        gw = run_backward(below, g, below, "relu", 0.0, None, s, nan, fn, pytorch_edges=False)
        if o is None and wide == xt.dtype:
            return gw
        dx = o if o is not None else output(xt.size * xt.dtype.itemsize, xt.shape, strides,
                                            xt.dtype, dev, s, s_ref)
        transform(handle, _view4(gw), _view4(dx))
        return dx
    finally:
        restore_device(prev)
