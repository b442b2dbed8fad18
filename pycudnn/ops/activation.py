"""Activation functions through cuDNN's ``cudnnActivationForward`` / ``cudnnActivationBackward``.

Modes: ``"relu"``, ``"sigmoid"``, ``"tanh"``, ``"clipped_relu"`` (``min(max(x, 0), coef)``),
``"elu"`` (``x`` for ``x > 0``, else ``coef * (exp(x) - 1)``) and ``"swish"``
(``x * sigmoid(coef * x)``, the beta set with ``cudnnSetActivationDescriptorSwishBeta``).
cuDNN's ``CUDNN_ACTIVATION_IDENTITY`` works only fused into
``cudnnConvolutionBiasActivationForward``, so ``"identity"`` is refused here.

Tensors of 0 to 5 dims are taken with any strides (fewer than 4 dims are viewed as 4-D with
trailing unit dims); NaN propagates (``CUDNN_PROPAGATE_NAN``, as PyTorch's activations do).
A repeated call with the same layouts, dtype and mode reuses its descriptors (one dict lookup).
"""

from __future__ import annotations

import ctypes
from typing import Any

from .._types import ActivationMode, NanPropagation
from ..cudnn.descriptors import ActivationDescriptor, TensorDescriptor
from ..cudnn.tensor_ops import transform
from ..ffi import library as _lib
from ..ops import runtime_kernels
from ..ops._common import (
    FLOAT32,
    HALF_DTYPES,
    PlanCache,
    c_function,
    callers_device,
    check_choice,
    check_coef,
    check_input,
    check_match,
    check_out_reads,
    check_shape,
    checked_out,
    layout_strides,
    output,
    raise_launch,
    restore_device,
    same_layout,
    scalars_of,
    staged,
    stream_pair,
    tensor_arg,
)
from ..ops.runtime_kernels import ALIGNMENT
from ..runtime.handle import get_handle
from ..runtime.memory import StreamLike
from ..runtime.tensor import Tensor, TensorLike, as_tensor

__all__ = ["activation_forward", "activation_backward", "MODES"]

#: the modes the functions take, and cuDNN's ``cudnnActivationMode_t`` for each
MODES: dict[str, ActivationMode] = {
    "relu": ActivationMode.RELU, "sigmoid": ActivationMode.SIGMOID, "tanh": ActivationMode.TANH,
    "clipped_relu": ActivationMode.CLIPPED_RELU, "elu": ActivationMode.ELU,
    "swish": ActivationMode.SWISH,
}
_NAMES = tuple(MODES)
_RANKS = (0, 1, 2, 3, 4, 5)
_WHAT = "0 to 5 dims"

_FORWARD = PlanCache()
_BACKWARD = PlanCache()
# the keys hold whether NaN propagates as a bool: hashing the IntEnum member is a Python call
_PROPAGATE = int(NanPropagation.PROPAGATE_NAN)


def _sig(t: Tensor | None) -> tuple[Any, ...] | None:
    return None if t is None else (t.shape, t.strides, t.dtype, t.device)


def _as4d(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[tuple[int, ...],
                                                                     tuple[int, ...]]:
    """A tensor of fewer than 4 dims as 4-D, with trailing unit dims (a view)."""
    if len(shape) >= 4:
        return shape, strides
    pad = 4 - len(shape)
    return shape + (1,) * pad, strides + (1,) * pad


def _view4(t: Tensor) -> Tensor:
    """``t`` as a view of at least 4 dims (trailing unit dims), as the descriptors see it."""
    if t.ndim >= 4:
        return t
    shape4, strides4 = _as4d(t.shape, t.strides)
    return Tensor._make(t.ptr, shape4, strides4, t.dtype, t.device, t, t.readonly)


def _descriptor(shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any) -> TensorDescriptor:
    shape4, strides4 = _as4d(shape, strides)
    return TensorDescriptor(shape4, dtype, strides4)


def activation_descriptor(mode: str, coef: float, nan: NanPropagation) -> ActivationDescriptor:
    """A new activation descriptor for ``mode``; ``coef`` is the ceiling (clipped_relu), alpha
    (elu) or beta (swish, set through ``cudnnSetActivationDescriptorSwishBeta``)."""
    desc = ActivationDescriptor(MODES[mode], nan, coef)
    if mode == "swish":
        status = _lib.lib().cudnnSetActivationDescriptorSwishBeta(desc.handle, ctypes.c_double(coef))
        if status:
            desc.close()
            _lib.raise_status(status, "cudnnSetActivationDescriptorSwishBeta", f"  beta: {coef!r}")
    return desc


def check_mode(mode: Any, fn: str) -> str:
    if mode == "identity":
        raise ValueError(f"{fn}: mode 'identity' is not supported: cuDNN runs its identity "
                         f"activation only fused into a convolution "
                         f"(cudnnConvolutionBiasActivationForward), not on its own; the result "
                         f"would be the input itself")
    return check_choice(mode, "mode", _NAMES, fn)


class _Plan:
    """What a call needs besides its pointers: descriptors, the output's layout and size, the
    scaling constants and the bound C function."""

    __slots__ = ("act", "x", "y", "dy", "dx", "shape", "strides", "nbytes", "dense", "stage",
                 "one", "zero", "launch", "keep", "fast", "wide")

    def __init__(self) -> None:
        self.act = self.x = self.y = self.dy = self.dx = 0
        self.shape: tuple[int, ...] = ()
        self.strides: tuple[int, ...] = ()  # the output's
        self.nbytes = 0  # a new output's
        self.dense: tuple[int, ...] = ()  # the layout cuDNN is given, when operands are staged
        self.stage = False
        self.one = self.zero = 0
        self.launch: Any = None
        self.keep: tuple[Any, ...] = ()
        # the signature's runtime-compiled kernel, once built (see runtime_kernels); None when
        # the graph API cannot take its layouts
        self.fast: runtime_kernels.Promotion | None = None
        #: backward: the dtype the legacy kernel computes in when it is not the operands'
        #: (float32 for ELU on float16/bfloat16), staged through copies
        self.wide: Any = None


# ---- forward --------------------------------------------------------------------------------------

def activation_forward(x: TensorLike, mode: str = "relu", *, coef: float = 0.0,
                       out: TensorLike | None = None, stream: StreamLike | None = None) -> Tensor:
    """``y = activation(x)`` element by element (cuDNN's ``cudnnActivationForward``).

    Args:
        x: the input, anything `pycudnn.as_tensor()` accepts: 0 to 5
            dims, any strides (no broadcast dims); float32, float16, bfloat16 or float64.
        mode: ``"relu"``, ``"sigmoid"``, ``"tanh"``, ``"clipped_relu"``, ``"elu"`` or
            ``"swish"``. (``"identity"`` is refused: cuDNN runs it only fused into a convolution.)
        coef: the ceiling of ``"clipped_relu"``, the alpha of ``"elu"``, the beta of ``"swish"``;
            ignored by the other modes. The default 0.0 is cuDNN's: pass ``coef=1.0`` for
            PyTorch's ``F.elu`` and ``F.silu``, ``coef=6.0`` for ``F.relu6``.
        out: optional output of ``x``'s shape, dtype and device, any strides; ``x`` itself (the
            same view) computes in place, an output that overlaps ``x`` partly is refused.
        stream: the CUDA stream to run on (int handle, cuda.core Stream, or an object with
            ``__cuda_stream__``); default the legacy default stream.

    Returns:
        The result as a `pycudnn.Tensor` in ``x``'s memory format
            (channels-last when ``x`` is), or ``out`` when it is given.
    """
    return run_forward(x, mode, coef, out, stream, NanPropagation.PROPAGATE_NAN,
                       "activation_forward")


def run_forward(x: Any, mode: Any, coef: Any, out: Any, stream: Any, nan: NanPropagation,
                fn: str) -> Tensor:
    s, s_ref = (0, None) if stream is None else stream_pair(stream)
    if type(x) is not Tensor:
        x = as_tensor(x, stream=stream)
    o = None if out is None else tensor_arg(out, stream)
    # the signature, flat: everything the checks and the descriptors depend on but the pointers
    key = (mode, coef, type(coef), nan == _PROPAGATE, x.shape, x.strides, x.dtype, x.device,
           _sig(o))
    try:
        plan = _FORWARD[key]
    except (KeyError, TypeError):  # a new signature, or an unhashable argument the checks refuse
        plan = _forward_plan(x, mode, coef, o, nan, fn)
        _FORWARD.put(key, plan)
    if o is not None:
        check_out_reads(o, (), fn, in_place=x)
    dev = x.device
    if not plan.x:  # no element
        return o if o is not None else output(0, plan.shape, plan.strides, x.dtype, dev, s, s_ref)
    prev = callers_device()
    try:
        handle = get_handle(dev, s)
        y = o if o is not None else output(plan.nbytes, plan.shape, plan.strides, x.dtype, dev, s,
                                           s_ref)
        fast = plan.fast
        if fast is not None and fast.plan is not None and not (x.ptr | y.ptr) % ALIGNMENT \
                and fast.launch(handle, (x.ptr, y.ptr)):
            return y
        status = plan.launch(handle, plan.act, plan.one, plan.x, x.ptr, plan.zero, plan.y, y.ptr)
        if status:
            raise_launch(status, "cudnnActivationForward", fn, activation=plan.keep[0],
                         x=plan.keep[1], y=plan.keep[2])
        if fast is not None and fast.plan is None:
            fast.tick()
        return y
    finally:
        restore_device(prev)


def _forward_plan(x: Tensor, mode: Any, coef: Any, o: Tensor | None, nan: NanPropagation,
                  fn: str) -> _Plan:
    """The full checks of a forward call, then its descriptors."""
    check_input(x, "x", fn, _RANKS, _WHAT)
    mode = check_mode(mode, fn)
    c = check_coef(coef, fn)
    if o is not None:
        o = checked_out(o, x.shape, x, fn, None)
    plan = _Plan()
    plan.shape = x.shape
    plan.strides = layout_strides(x.shape, x) if o is None else o.strides
    plan.nbytes = x.size * x.dtype.itemsize
    if x.size == 0:
        return plan
    plan.one, plan.zero = scalars_of(x.dtype)
    plan.launch = c_function("cudnnActivationForward")
    act = activation_descriptor(mode, c, nan)
    xd = _descriptor(x.shape, x.strides, x.dtype)
    # in place (or the same layout): one descriptor for both, as cuDNN asks of in-place calls
    yd = xd if same_layout(x.shape, plan.strides, x.strides) else _descriptor(x.shape, plan.strides, x.dtype)
    plan.act, plan.x, plan.y = act.handle, xd.handle, yd.handle
    plan.keep = (act, xd, yd)
    plan.fast = runtime_kernels.activation_promotion(mode, c, x, (plan.strides,), False,
                                                     nan == _PROPAGATE)
    return plan


# ---- backward -------------------------------------------------------------------------------------

def activation_backward(y: TensorLike, dy: TensorLike, x: TensorLike, mode: str = "relu", *,
                        coef: float = 0.0, out: TensorLike | None = None,
                        stream: StreamLike | None = None) -> Tensor:
    """The gradient ``dx`` of an activation, from its output ``y``, the gradient ``dy`` of ``y``
    and its input ``x`` (cuDNN's ``cudnnActivationBackward``).

    Args:
        y: the forward output (``activation_forward(x, mode, coef=coef)``).
        dy: the gradient with respect to ``y``.
        x: the forward input. ``y``, ``dy`` and ``x`` have one shape, dtype and device; any
            strides (cuDNN needs ``y``/``dy`` and ``x``/``dx`` laid out alike: operands that are
            not dense in ``x``'s memory format are staged through dense copies).
        mode: as for `activation_forward()`.
        coef: as for `activation_forward()`.
        out: optional output of ``x``'s shape, dtype and device, any strides, sharing no memory
            with ``y``, ``dy`` or ``x``.
        stream: the CUDA stream to run on; default the legacy default stream.

    Returns:
        ``dx`` as a `pycudnn.Tensor` in ``x``'s memory format, or ``out``.
    """
    return run_backward(y, dy, x, mode, coef, out, stream, NanPropagation.PROPAGATE_NAN,
                        "activation_backward")


def run_backward(y: Any, dy: Any, x: Any, mode: Any, coef: Any, out: Any, stream: Any,
                 nan: NanPropagation, fn: str) -> Tensor:
    s, s_ref = (0, None) if stream is None else stream_pair(stream)
    y, dy, x = tensor_arg(y, stream), tensor_arg(dy, stream), tensor_arg(x, stream)
    o = None if out is None else tensor_arg(out, stream)
    key = (mode, coef, type(coef), nan == _PROPAGATE, y.shape, y.strides, y.dtype, y.device,
           dy.shape, dy.strides, dy.dtype, dy.device, x.shape, x.strides, x.dtype, x.device,
           _sig(o))
    try:
        plan = _BACKWARD[key]
    except (KeyError, TypeError):
        plan = _backward_plan(y, dy, x, mode, coef, o, nan, fn)
        _BACKWARD.put(key, plan)
    if o is not None:
        check_out_reads(o, (("y", y), ("dy", dy), ("x", x)), fn)
    dev = x.device
    if not plan.x:
        return o if o is not None else output(0, plan.shape, plan.strides, x.dtype, dev, s, s_ref)
    prev = callers_device()
    try:
        handle = get_handle(dev, s)
        dx = o if o is not None else output(plan.nbytes, plan.shape, plan.strides, x.dtype, dev,
                                            s, s_ref)
        fast = plan.fast
        if fast is not None and fast.plan is not None:
            src = y if fast.reads_output else x
            if not (dy.ptr | src.ptr | dx.ptr) % ALIGNMENT \
                    and fast.launch(handle, (dy.ptr, src.ptr, dx.ptr)):
                return dx
        target = dx
        if plan.stage or plan.wide is not None:
            # operands not in the one dense layout (or the dtype) cuDNN is given; as 4-D views,
            # the fewest dims cudnnTransformTensor takes
            st, wd = _as4d(x.shape, plan.dense)[1], plan.wide
            y, dy, x, dx4 = _view4(y), _view4(dy), _view4(x), _view4(dx)
            y, dy = staged(handle, y, st, s, dtype=wd), staged(handle, dy, st, s, dtype=wd)
            x = staged(handle, x, st, s, dtype=wd)
            target = staged(handle, dx4, st, s, copy=False, dtype=wd)
            if target is dx4:
                target = dx
        d = plan.x
        if plan.wide is not None:
            # y again from x in float32, into its float32 copy: cuDNN's ELU gradient reads y
            # (y + alpha where x < 0), and the half y's rounding, amplified where y + alpha is
            # small, was most of the error against PyTorch's float32 gradient from x
            status = c_function("cudnnActivationForward")(handle, plan.act, plan.one, d, x.ptr,
                                                          plan.zero, d, y.ptr)
            if status:
                raise_launch(status, "cudnnActivationForward", fn, activation=plan.keep[0],
                             tensors=plan.keep[1])
        status = plan.launch(handle, plan.act, plan.one, d, y.ptr, d, dy.ptr, d, x.ptr, plan.zero,
                             d, target.ptr)
        if status:
            raise_launch(status, "cudnnActivationBackward", fn, activation=plan.keep[0],
                         tensors=plan.keep[1])
        if target is not dx:
            transform(handle, target, _view4(dx))
        if fast is not None and fast.plan is None:
            fast.tick()
        return dx
    finally:
        restore_device(prev)


def _backward_plan(y: Tensor, dy: Tensor, x: Tensor, mode: Any, coef: Any, o: Tensor | None,
                   nan: NanPropagation, fn: str) -> _Plan:
    check_input(x, "x", fn, _RANKS, _WHAT)
    for t, name in ((y, "y"), (dy, "dy")):
        check_input(t, name, fn, _RANKS, _WHAT)
        check_match(x, "x", t, name, fn)
        check_shape(t, name, x.shape, fn, "the shape of x")
    mode = check_mode(mode, fn)
    c = check_coef(coef, fn)
    if o is not None:
        o = checked_out(o, x.shape, x, fn, None)
    plan = _Plan()
    plan.shape = x.shape
    plan.dense = dense = layout_strides(x.shape, x)
    plan.strides = dense if o is None else o.strides
    plan.nbytes = x.size * x.dtype.itemsize
    if x.size == 0:
        return plan
    # cuDNN's float16/bfloat16 ELU backward is wrong for a one-element tensor (0.198 off in
    # float16, 1.0 in bfloat16, against float64; float32 exact): its legacy kernel computes ELU
    # on float32 copies (PyTorch computes half ELU gradients in float32 too)
    compute = FLOAT32 if mode == "elu" and x.dtype.name in HALF_DTYPES else x.dtype
    plan.wide = compute if compute != x.dtype else None
    plan.one, plan.zero = scalars_of(compute)
    plan.launch = c_function("cudnnActivationBackward")
    # cuDNN wants y and dy, x and dx laid out alike: one dense layout for all four, and operands
    # in another staged through copies
    plan.stage = not all(same_layout(x.shape, t, dense)
                         for t in (y.strides, dy.strides, x.strides, plan.strides))
    act = activation_descriptor(mode, c, nan)
    d = _descriptor(x.shape, dense, compute)
    plan.act = act.handle
    plan.x = plan.y = plan.dy = plan.dx = d.handle
    plan.keep = (act, d)
    if not plan.stage:
        plan.fast = runtime_kernels.activation_promotion(
            mode, c, x, (y.strides, dy.strides, plan.strides), True, nan == _PROPAGATE)
    return plan
