"""Max and average pooling through ``cudnnPoolingForward`` / ``cudnnPoolingBackward``; the
window's descriptor `PoolingDescriptor` (`pycudnn.cudnn.descriptors`) and `PoolingMode` are
importable from here too.

2-D pooling takes 4-D tensors ``(N, C, H, W)``, 3-D pooling 5-D ones, with any strides. Modes:
``"max"``, ``"max_deterministic"`` (the same forward result; a backward pass with the same bits
on every run), ``"average_include_padding"`` and ``"average_exclude_padding"``. The geometry is
PyTorch's: ``floor((i + 2 * padding - kernel) / stride) + 1`` per spatial dim, ``ceil_mode=True``
rounding up (cuDNN is given the larger output; PyTorch's divisors of its partial windows by
scaling the edges, `ceil_divisors`), ``divisor_override`` through cuDNN's scaling factor,
dilated max pooling (cuDNN has none) as plain poolings on strided views (`dilated_classes`).

cuDNN 9 counts windows wholly in the padding (negative padding, padding as large as the window);
pycudnn refuses those: the public functions take PyTorch's rule (padding at most half the
kernel), the CuPy 13 drop-in padding smaller than the kernel.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from .._types import NanPropagation, PoolingMode
from ..cudnn.descriptors import INT32_MAX, PoolingDescriptor, TensorDescriptor
from ..cudnn.tensor_ops import transform
from ..ops._common import (PlanCache, Staging, c_function, cached_plan, check_choice, check_input,
                           check_operands, check_out_reads, checked_out, layout_strides, output,
                           prologue, raise_launch, restore_device, result, same_layout, scalars_of,
                           signature, staged, stream_pair, tensor_arg)
from ..runtime.memory import StreamLike
from ..runtime.tensor import Tensor, TensorLike, as_tensor

__all__ = ["pooling_forward", "pooling_backward", "PoolingDescriptor", "PoolingMode", "MODES",
           "output_size", "ceil_output_size", "windows_hold_input", "dilated_classes"]


#: the ``mode`` names the functions take
MODES: dict[str, PoolingMode] = {
    "max": PoolingMode.MAX, "max_deterministic": PoolingMode.MAX_DETERMINISTIC,
    "average_include_padding": PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING,
    "average_exclude_padding": PoolingMode.AVERAGE_COUNT_EXCLUDE_PADDING,
}


# ---- geometry -------------------------------------------------------------------------------------

def output_size(input_size: Sequence[int], kernel_size: Sequence[int], stride: Sequence[int],
                padding: Sequence[int], cover_all: bool = False) -> tuple[int, ...]:
    """Spatial output sizes of a pooling: ``(i + 2p - k) // s + 1`` per dim; with
    ``cover_all`` (Chainer's rule, for the CuPy 13 drop-in) ``(i + 2p - k + s - 1) // s + 1``,
    one more window where the last one would otherwise leave input elements out."""
    extra = 1 if cover_all else 0
    return tuple((i + 2 * p - k + (s - 1) * extra) // s + 1
                 for i, k, s, p in zip(input_size, kernel_size, stride, padding))


def windows_hold_input(input_size: Sequence[int], stride: Sequence[int],
                       padding: Sequence[int], out_size: Sequence[int]) -> bool:
    """Whether every window of an ``out_size`` pooling starts inside the input (with padding
    below the window, each then holds an input element): PyTorch's ``ceil_mode`` rule, which
    drops a last window that would start in the right padding or past it."""
    return all((o - 1) * s - p < i
               for i, s, p, o in zip(input_size, stride, padding, out_size))


def _spatial(name: str, value: Any, nd: int, fn: str) -> tuple[int, ...]:
    if type(value) is int:
        return (value,) * nd
    if isinstance(value, (tuple, list)) and len(value) == 1:  # PyTorch's (3,) for every dim
        value = tuple(value) * nd
    if isinstance(value, (tuple, list)) and len(value) == nd and all(
            type(v) is int or (not isinstance(v, bool) and hasattr(v, "__index__")
                               and type(v).__module__ == "numpy") for v in value):
        return tuple(int(v) for v in value)
    if not isinstance(value, bool) and hasattr(value, "__index__") and \
            type(value).__module__ == "numpy":
        return (int(value),) * nd
    raise (ValueError if isinstance(value, (tuple, list)) else TypeError)(
        f"{fn}: {name} must be a single int or a tuple of {nd} ints (one per spatial dim), but "
        f"got {name}={value!r}")


#: the CuPy 13 drop-in's rule for an output one window larger (Chainer's ``cover_all=True``):
#: padding smaller than the window, ``output_size(..., cover_all=True)``
_COVER_ALL = "window_cover_all"
#: PyTorch's ``ceil_mode=True``: padding at most half the kernel, the output size rounded up,
#: less a last window that would start in the right padding (`ceil_output_size`)
HALF_CEIL = "half_ceil"


def ceil_output_size(input_size: Sequence[int], kernel_size: Sequence[int],
                     stride: Sequence[int], padding: Sequence[int]) -> tuple[int, ...]:
    """PyTorch's ``pooling_output_shape`` with ``ceil_mode=True``: ``ceil((i + 2p - k) / s) + 1``
    windows, one fewer where the last would start past the input (in the right padding)."""
    out = []
    for i, k, s, p in zip(input_size, kernel_size, stride, padding):
        o = (i + 2 * p - k + s - 1) // s + 1
        if (o - 1) * s >= i + p:
            o -= 1
        out.append(o)
    return tuple(out)


def pooling_geometry(x: Tensor, kernel_size: Any, stride: Any, padding: Any, fn: str,
                     padding_rule: str) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...],
                                          tuple[int, ...]]:
    """(kernel, stride, padding, output shape) after PyTorch's checks (``padding_rule``:
    ``"half"``, PyTorch's; ``"window"``, CuPy 13's; ``_COVER_ALL``, CuPy 13's with Chainer's
    larger output). Public as a seam for tests and tooling."""
    nd = x.ndim - 2
    if min(x.shape[2:]) < 1:
        raise ValueError(f"{fn}: expected x to have non-zero spatial sizes (only the batch and "
                         f"channel dims may be 0), but got x of size {list(x.shape)}")
    k = _spatial("kernel_size", kernel_size, nd, fn)
    # stride None or empty: the kernel size (PyTorch's default)
    s = k if stride is None or (isinstance(stride, (tuple, list)) and not stride) else \
        _spatial("stride", stride, nd, fn)
    p = _spatial("padding", padding, nd, fn)
    if min(k) < 1:
        raise ValueError(f"{fn}: kernel size should be greater than zero, but got "
                         f"kernel_size={k}")
    if min(s) < 1:
        raise ValueError(f"{fn}: stride should be greater than zero, but got stride={s}")
    if min(p) < 0:
        raise ValueError(f"{fn}: pad must be non-negative, but got padding={p}")
    if max(k + s + p) > INT32_MAX:
        raise ValueError(f"{fn}: expected kernel_size, stride and padding to be at most "
                         f"{INT32_MAX} (cuDNN takes C ints), but got kernel_size={k}, "
                         f"stride={s}, padding={p}")
    half = padding_rule in ("half", HALF_CEIL)
    if half and any(2 * pi > ki for pi, ki in zip(p, k)):
        raise ValueError(f"{fn}: pad should be at most half of kernel size, but got "
                         f"padding={p} and kernel_size={k}")
    if not half and any(pi >= ki for pi, ki in zip(p, k)):
        raise ValueError(f"{fn}: pad should be smaller than kernel size (every window must hold "
                         f"an input element), but got padding={p} and kernel_size={k}")
    if padding_rule == HALF_CEIL:
        out = ceil_output_size(x.shape[2:], k, s, p)
    else:
        out = output_size(x.shape[2:], k, s, p, padding_rule == _COVER_ALL)
    if min(out) < 1:
        given = "x".join(map(str, x.shape[1:]))
        calc = "x".join(map(str, (x.shape[1],) + out))
        raise ValueError(f"{fn}: Given input size: ({given}). Calculated output size: ({calc}). "
                         f"Output size is too small")
    return k, s, p, (x.shape[0], x.shape[1]) + out


def _options(ceil_mode: Any, dilation: Any, divisor_override: Any, mode: Any, nd: int,
             fn: str) -> tuple[str, int | None, tuple[int, ...]]:
    """(the geometry rule, the divisor, the dilation) of PyTorch's ``ceil_mode``,
    ``dilation`` and ``divisor_override`` after their checks."""
    if not isinstance(ceil_mode, bool):
        raise TypeError(f"{fn}: ceil_mode must be a bool, but got {ceil_mode!r}")
    d = _spatial("dilation", dilation, nd, fn)
    if min(d) < 1:
        raise ValueError(f"{fn}: dilation should be greater than zero, but got dilation={d}")
    if max(d) > 1 and mode not in ("max", "max_deterministic"):
        raise ValueError(f"{fn}: dilation={d} applies to max pooling (PyTorch's avg_pool has "
                         f"none), but got mode={mode!r}")
    if max(d) > 1 and INT32_MAX < max(d):
        raise ValueError(f"{fn}: expected dilation to be at most {INT32_MAX}, but got "
                         f"dilation={d}")
    divisor = None
    if divisor_override is not None:
        if isinstance(divisor_override, bool) or not isinstance(divisor_override, int):
            raise TypeError(f"{fn}: divisor_override must be an int, but got "
                            f"{divisor_override!r}")
        if divisor_override == 0:
            raise ValueError(f"{fn}: divisor must be not zero, but got divisor_override=0")
        if mode not in ("average_include_padding", "average_exclude_padding"):
            raise ValueError(f"{fn}: divisor_override applies to average pooling, but got "
                             f"mode={mode!r}")
        divisor = divisor_override
    return (HALF_CEIL if ceil_mode else "half"), divisor, d


def _plain(ceil_mode: Any, dilation: Any, divisor_override: Any) -> bool:
    """Whether a call leaves PyTorch's extra pooling options at their defaults (one test)."""
    return (ceil_mode is False and type(dilation) is int and dilation == 1
            and divisor_override is None)


def ceil_divisors(x: Tensor, k: tuple[int, ...], st: tuple[int, ...], p: tuple[int, ...],
                  shape: tuple[int, ...], m: PoolingMode, divisor: int | None
                  ) -> tuple[float, tuple[tuple[int, int, float], ...]] | None:
    """PyTorch's divisors where cuDNN's are not: ``(alpha, slices)`` that turn cuDNN's
    exclude-padding average into PyTorch's include-padding (or ``divisor_override``) one, or
    None where cuDNN's own mode already computes PyTorch's.

    cuDNN computes ceil_mode's extra window as a window of an output one window larger, whose
    include-padding divisor counts the whole window; PyTorch's stops at the right padding
    (``min(start + k, i + p) - start``). Both divisors are products over the spatial dims, and
    the exclude-padding one (the input elements a window holds) is PyTorch's, so the exact
    average is cuDNN's exclude-padding average times ``alpha`` times, per dim, the factor
    ``valid / wanted`` of each output index: 1 but at the edges, where ``slices`` lists
    ``(dim, index, factor)``. The backward is the same sum, taken by dy scaled alike. Public as
    a seam for tests."""
    if m != PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING:
        return None
    if all((o - 1) * si - pi + ki <= i + pi
           for i, ki, si, pi, o in zip(x.shape[2:], k, st, p, shape[2:])):
        return None  # no window past the padding: cuDNN's divisor is PyTorch's
    alpha = 1.0 if divisor is None else math.prod(k) / divisor
    slices = []
    for d, (i, ki, si, pi, o) in enumerate(zip(x.shape[2:], k, st, p, shape[2:])):
        for j in range(o):
            start = j * si - pi
            valid = min(start + ki, i) - max(start, 0)
            wanted = ki if divisor is not None else min(start + ki, i + pi) - start
            if valid != wanted:
                slices.append((d, j, valid / wanted))
    return alpha, tuple(slices)


def _slice_scales(t_shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any,
                  slices: tuple[tuple[int, int, float], ...], keep: list[Any]
                  ) -> tuple[tuple[int, int, int], ...]:
    """``(descriptor, byte offset, factor address)`` per slice of `ceil_divisors`: the
    ``cudnnScaleTensor`` calls that multiply index ``j`` of spatial dim ``d`` by its factor in a
    tensor of ``t_shape`` and ``strides`` (the descriptors and factors kept alive in ``keep``)."""
    out = []
    for d, j, factor in slices:
        shape = list(t_shape)
        shape[2 + d] = 1
        desc = TensorDescriptor(tuple(shape), dtype, strides)
        keep.append(desc)
        out.append((desc.handle, j * strides[2 + d] * dtype.itemsize, _alpha(dtype, factor, keep)))
    return tuple(out)


def _scaled_copy(handle: int, dy: Tensor, plan: _Plan, stream: int, fn: str) -> Tensor:
    """A copy of ``dy`` in the plan's dense layout with its edge slices scaled."""
    tmp = plan.dy_copy.load(handle, dy, stream)
    _scale(handle, plan, tmp.ptr, fn)
    return tmp


def _scale(handle: int, plan: _Plan, ptr: int, fn: str) -> None:
    """Multiply the edge slices of the tensor at ``ptr`` by their factors (`ceil_divisors`)."""
    for desc, offset, factor in plan.slices:
        status = plan.scale(handle, desc, ptr + offset, factor)
        if status:
            raise_launch(status, "cudnnScaleTensor", fn, pooling=plan.keep[0])


def _edge_plan(plan: _Plan, x: Tensor, k: tuple[int, ...], m: PoolingMode,
               divisor: int | None,
               edges: tuple[float, tuple[tuple[int, int, float], ...]] | None,
               pooled: tuple[int, ...], strides: tuple[int, ...], keep: list[Any]
               ) -> PoolingMode:
    """Set ``plan``'s alpha (and edge slices, in a tensor of the pooled shape and ``strides``)
    for ``divisor`` and `ceil_divisors`' ``edges``; the pooling mode cuDNN then runs."""
    if edges is not None:
        alpha, slices = edges
        if alpha != 1.0:
            plan.one = _alpha(x.dtype, alpha, keep)
        plan.slices = _slice_scales(pooled, strides, x.dtype, slices, keep)
        plan.scale = c_function("cudnnScaleTensor")
        return PoolingMode.AVERAGE_COUNT_EXCLUDE_PADDING
    if divisor is not None:  # cuDNN divides by the window's size: y = alpha * that
        plan.one = _alpha(x.dtype, math.prod(k) / divisor, keep)
    return m


def _alpha(dtype: Any, scale: float, keep: list[Any]) -> int:
    """The address of cuDNN's scaling factor ``scale`` for ``dtype`` (kept alive in ``keep``)."""
    import ctypes

    value = ctypes.c_double(scale) if dtype.name == "float64" else ctypes.c_float(scale)
    keep.append(value)
    return ctypes.addressof(value)


def _geo_key(v: Any) -> Any:
    """``v`` when it is a plain int, tuple of ints or None (a valid cache key as is); else a
    marker that keeps the call off the cache (a bool would hash like an int)."""
    if v is None or type(v) is int:
        return v
    if type(v) is tuple and all(type(e) is int for e in v):
        return v
    return _NO_KEY


_NO_KEY = object()


# ---- calls ----------------------------------------------------------------------------------------

_FORWARD = PlanCache()
_BACKWARD = PlanCache()
_RANKS = (4, 5)
_WHAT = "4 dims (N, C, H, W) for 2-D pooling or 5 dims (N, C, D, H, W) for 3-D pooling"


# the keys hold whether NaN propagates as a bool: hashing the IntEnum member is a Python call
_PROPAGATE = int(NanPropagation.PROPAGATE_NAN)


class _Plan:
    __slots__ = ("pool", "x", "y", "shape", "strides", "nbytes", "y_dense", "x_dense", "stage",
                 "one", "zero", "launch", "keep", "slices", "scale", "dy_copy")

    def __init__(self) -> None:
        self.pool = self.x = self.y = 0
        self.shape: tuple[int, ...] = ()  # the output's
        self.strides: tuple[int, ...] = ()
        self.nbytes = 0  # a new output's
        self.one = self.zero = 0
        self.launch: Any = None
        self.y_dense: tuple[int, ...] = ()  # layouts cuDNN is given when operands are staged
        self.x_dense: tuple[int, ...] = ()
        self.stage = False
        self.keep: tuple[Any, ...] = ()
        # PyTorch's divisors at the edges (`ceil_divisors`): cudnnScaleTensor calls, each
        # (descriptor, byte offset, factor address), on y forward and on a copy of dy backward
        self.slices: tuple[tuple[int, int, int], ...] = ()
        self.scale: Any = None
        self.dy_copy: Any = None  # backward: the `Staging` of dy's scaled copy


def _key(kernel_size: Any, stride: Any, padding: Any, mode: Any, nan: NanPropagation,
         rule: str, *sigs: Any) -> Any:
    """The plan key: the geometry as given (None where a value would hash like another, which
    keeps the call off the cache) and the operands' signatures."""
    k, s, p = _geo_key(kernel_size), _geo_key(stride), _geo_key(padding)
    if k is _NO_KEY or s is _NO_KEY or p is _NO_KEY:
        return None
    return (k, s, p, mode, nan == _PROPAGATE, rule) + sigs


def pooling_forward(x: TensorLike, kernel_size: int | Sequence[int], *,
                    stride: int | Sequence[int] | None = None, padding: int | Sequence[int] = 0,
                    mode: str = "max", ceil_mode: bool = False, dilation: int | Sequence[int] = 1,
                    divisor_override: int | None = None, out: TensorLike | None = None,
                    stream: StreamLike | None = None) -> Tensor:
    """Max or average pooling of ``x`` (cuDNN's ``cudnnPoolingForward``).

    Args:
        x: ``(N, C, H, W)`` for 2-D or ``(N, C, D, H, W)`` for 3-D pooling, anything
            `pycudnn.as_tensor()` accepts, any strides; float32,
            float16, bfloat16 or float64.
        kernel_size: the window: an int, or one int per spatial dim (a one-element sequence
            counts for every dim, as in PyTorch).
        stride: the step between windows: like ``kernel_size``; default (None or an empty
            sequence) ``kernel_size``.
        padding: added on both sides of each spatial dim (never part of a maximum; counted by
            ``"average_include_padding"``): an int or one per spatial dim, at most half the
            kernel.
        mode: ``"max"``, ``"max_deterministic"``, ``"average_include_padding"`` or
            ``"average_exclude_padding"``.
        ceil_mode: PyTorch's: the output size rounded up (a last window may be partial), less
            a window that would start in the right padding. A partial window's
            ``"average_include_padding"`` divisor is PyTorch's too (the padding it covers,
            not the part past it).
        dilation: the spacing of a window's elements, max pooling only (PyTorch's): cuDNN's
            pooling has none, so a dilated one runs as ``d / gcd(stride, d)`` plain poolings
            per dim on strided views of ``x`` (exact: a maximum ignores the views' padding).
        divisor_override: average pooling only: the divisor of every window's sum, as
            PyTorch's (``count_include_pad`` then does not matter).
        out: optional output of the pooled shape, ``x``'s dtype and device, any strides, sharing
            no memory with ``x``.
        stream: the CUDA stream to run on; default the legacy default stream.

    Returns:
        ``(N, C, *out_spatial)`` as a `pycudnn.Tensor` in ``x``'s memory
            format, or ``out``.
    """
    fn = "pooling_forward"
    if _plain(ceil_mode, dilation, divisor_override):  # the common call
        rule, divisor = "half", None
    else:
        nd = getattr(x, "ndim", 4) - 2
        rule, divisor, d = _options(ceil_mode, dilation, divisor_override, mode, max(nd, 1), fn)
        if max(d) > 1:
            return _dilated_forward(x, kernel_size, stride, padding, d, mode, out, stream,
                                    NanPropagation.PROPAGATE_NAN, rule, fn)
    return run_forward(x, kernel_size, stride, padding, mode, out, stream,
                       NanPropagation.PROPAGATE_NAN, rule, fn, divisor=divisor)


def run_forward(x: Any, kernel_size: Any, stride: Any, padding: Any, mode: Any, out: Any,
                stream: Any, nan: NanPropagation, rule: str, fn: str,
                out_name: str = "out", divisor: int | None = None) -> Tensor:
    s, s_ref = (0, None) if stream is None else stream_pair(stream)
    if type(x) is not Tensor:
        x = as_tensor(x, stream=stream)
    o = None if out is None else tensor_arg(out, stream)
    # the common geometry (ints, or tuples of ints, as PyTorch's calls pass) keys the plan as it
    # is; other values go through _key, which keeps what would hash like an int off the cache
    if (type(kernel_size) is int and (stride is None or type(stride) is int)
            and type(padding) is int):
        key = (kernel_size, stride, padding, mode, nan == _PROPAGATE, rule, x.shape, x.strides,
               x.dtype, x.device, signature(o), divisor)
    else:
        key = _key(kernel_size, stride, padding, mode, nan, rule, x.shape, x.strides, x.dtype,
                   x.device, signature(o), divisor)
    plan: _Plan = cached_plan(_FORWARD, key, forward_plan, x, kernel_size, stride, padding, mode,
                              o, nan, rule, fn, out_name, divisor)
    if o is not None:
        check_out_reads(o, (("x", x),), fn, name=out_name)
    if not plan.x:
        return result(o, plan, x, s, s_ref)
    prev, handle, y = prologue(o, plan.nbytes, plan.shape, plan.strides, x, s, s_ref)
    try:
        status = plan.launch(handle, plan.pool, plan.one, plan.x, x.ptr, plan.zero, plan.y, y.ptr)
        if status:
            raise_launch(status, "cudnnPoolingForward", fn, pooling=plan.keep[0],
                         x=plan.keep[1], y=plan.keep[2])
        if plan.slices:
            _scale(handle, plan, y.ptr, fn)
        return y
    finally:
        restore_device(prev)


def forward_plan(x: Tensor, kernel_size: Any, stride: Any, padding: Any, mode: Any,
                 o: Tensor | None, nan: NanPropagation, rule: str, fn: str,
                 out_name: str = "out", divisor: int | None = None) -> _Plan:
    """The full checks of a forward call, then its plan (descriptors, output shape);
    nothing is launched. Public as a seam for tests and tooling: what a call would run, read
    without a device."""
    check_input(x, "x", fn, _RANKS, _WHAT)
    k, st, p, shape = pooling_geometry(x, kernel_size, stride, padding, fn, rule)
    m = _mode(mode, divisor, fn)
    edges = ceil_divisors(x, k, st, p, shape, m, divisor) if rule == HALF_CEIL else None
    if o is not None:
        o = checked_out(o, shape, x, fn, None, out_name)
    plan = _Plan()
    plan.shape = shape
    plan.strides = layout_strides(shape, x) if o is None else o.strides
    plan.nbytes = math.prod(shape) * x.dtype.itemsize
    if x.size == 0:
        return plan
    plan.one, plan.zero = scalars_of(x.dtype)
    scale: list[Any] = []
    m = _edge_plan(plan, x, k, m, divisor, edges, shape, plan.strides, scale)
    plan.launch = c_function("cudnnPoolingForward")
    pool = PoolingDescriptor(k, p, st, m, nan)
    xd = TensorDescriptor(x.shape, x.dtype, x.strides)
    yd = TensorDescriptor(shape, x.dtype, plan.strides)
    # (the windows past cuDNN's own output size, of ceil_mode and cover_all, are computed in y's
    # larger size, which cuDNN takes)
    if rule not in (_COVER_ALL, HALF_CEIL) and pool.output_shape(xd) != shape:  # pragma: no cover
        raise ValueError(f"{fn}: cuDNN computes the output size {list(pool.output_shape(xd))} "
                         f"for x {list(x.shape)}, where the pooling gives {list(shape)}")
    plan.pool, plan.x, plan.y = pool.handle, xd.handle, yd.handle
    plan.keep = (pool, xd, yd, *scale)
    return plan


def _mode(mode: Any, divisor: int | None, fn: str) -> PoolingMode:
    m = MODES[check_choice(mode, "mode", tuple(MODES), fn)]
    # PyTorch's divisor_override replaces the divisor whatever count_include_pad says: cuDNN
    # divides each sum by the full window (include padding), which alpha then rescales
    return PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING if divisor is not None else m


def pooling_backward(y: TensorLike, dy: TensorLike, x: TensorLike, kernel_size: int | Sequence[int],
                     *, stride: int | Sequence[int] | None = None, padding: int | Sequence[int] = 0,
                     mode: str = "max", ceil_mode: bool = False, dilation: int | Sequence[int] = 1,
                     divisor_override: int | None = None, out: TensorLike | None = None,
                     stream: StreamLike | None = None) -> Tensor:
    """The gradient ``dx`` of a pooling from its output ``y``, the gradient ``dy`` of ``y`` and
    its input ``x`` (cuDNN's ``cudnnPoolingBackward``).

    Max pooling sends each gradient to the window's maximum (several gradients add up where
    windows overlap); ``"max"`` may add them in any order, ``"max_deterministic"`` always in the
    same one. Average pooling spreads each gradient over its window.

    Args:
        y: the forward output (``pooling_forward(x, kernel_size, ...)`` with the same geometry).
        dy: the gradient with respect to ``y``: ``y``'s shape.
        x: the forward input. ``y``, ``dy`` and ``x`` have one dtype and device; any strides
            (cuDNN needs ``y``/``dy`` and ``x``/``dx`` laid out alike: operands that are not dense
            in ``x``'s memory format are staged through dense copies).
        kernel_size: as for `pooling_forward()`.
        stride: as for `pooling_forward()`.
        padding: as for `pooling_forward()`.
        mode: as for `pooling_forward()`.
        ceil_mode: as for `pooling_forward()`.
        dilation: as for `pooling_forward()`.
        divisor_override: as for `pooling_forward()`.
        out: optional output of ``x``'s shape, dtype and device, any strides, sharing no memory
            with ``y``, ``dy`` or ``x``.
        stream: the CUDA stream to run on; default the legacy default stream.

    Returns:
        ``dx`` as a `pycudnn.Tensor` in ``x``'s memory format, or ``out``.
    """
    fn = "pooling_backward"
    if _plain(ceil_mode, dilation, divisor_override):
        rule, divisor = "half", None
    else:
        nd = getattr(x, "ndim", 4) - 2
        rule, divisor, d = _options(ceil_mode, dilation, divisor_override, mode, max(nd, 1), fn)
        if max(d) > 1:
            return _dilated_backward(y, dy, x, kernel_size, stride, padding, d, mode, out,
                                     stream, NanPropagation.PROPAGATE_NAN, rule, fn)
    return run_backward(y, dy, x, kernel_size, stride, padding, mode, out, stream,
                        NanPropagation.PROPAGATE_NAN, rule, fn, divisor=divisor)


def run_backward(y: Any, dy: Any, x: Any, kernel_size: Any, stride: Any, padding: Any, mode: Any,
                 out: Any, stream: Any, nan: NanPropagation, rule: str, fn: str,
                 divisor: int | None = None) -> Tensor:
    s, s_ref = (0, None) if stream is None else stream_pair(stream)
    y, dy, x = tensor_arg(y, stream), tensor_arg(dy, stream), tensor_arg(x, stream)
    o = None if out is None else tensor_arg(out, stream)
    key = _key(kernel_size, stride, padding, mode, nan, rule, signature(y), signature(dy),
               signature(x), signature(o), divisor)
    plan: _Plan = cached_plan(_BACKWARD, key, backward_plan, y, dy, x, kernel_size, stride,
                              padding, mode, o, nan, rule, fn, divisor)
    if o is not None:
        check_out_reads(o, (("y", y), ("dy", dy), ("x", x)), fn)
    if not plan.x:
        return result(o, plan, x, s, s_ref)
    prev, handle, dx = prologue(o, plan.nbytes, plan.shape, plan.strides, x, s, s_ref)
    try:
        target = dx
        if plan.slices:  # dy times PyTorch's edge factors, in a copy: the caller's dy stays
            dy = _scaled_copy(handle, dy, plan, s, fn)
        if plan.stage:  # cuDNN reads y and dy in one layout, x and dx in one layout
            yl, xl = plan.y_dense, plan.x_dense
            y, dy, x = staged(handle, y, yl, s), staged(handle, dy, yl, s), staged(handle, x, xl, s)
            target = staged(handle, dx, xl, s, copy=False)
        status = plan.launch(handle, plan.pool, plan.one, plan.y, y.ptr, plan.y, dy.ptr, plan.x,
                             x.ptr, plan.zero, plan.x, target.ptr)
        if status:
            raise_launch(status, "cudnnPoolingBackward", fn, pooling=plan.keep[0],
                         y=plan.keep[1], x=plan.keep[2])
        if target is not dx:
            transform(handle, target, dx)
        return dx
    finally:
        restore_device(prev)


def backward_plan(y: Tensor, dy: Tensor, x: Tensor, kernel_size: Any, stride: Any, padding: Any,
                  mode: Any, o: Tensor | None, nan: NanPropagation, rule: str,
                  fn: str, divisor: int | None = None) -> _Plan:
    """The full checks of a backward call, then its plan; nothing is launched. Public as a seam
    for tests and tooling."""
    check_input(x, "x", fn, _RANKS, _WHAT)
    k, st, p, y_shape = pooling_geometry(x, kernel_size, stride, padding, fn, rule)
    check_operands(x, "x", ((y, "y"), (dy, "dy")), y_shape,
                   f"the pooled size of x {list(x.shape)}", fn, _RANKS, _WHAT)
    m = _mode(mode, divisor, fn)
    edges = ceil_divisors(x, k, st, p, y_shape, m, divisor) if rule == HALF_CEIL else None
    if o is not None:
        o = checked_out(o, x.shape, x, fn, None)
    plan = _Plan()
    plan.shape = x.shape
    plan.x_dense = layout_strides(x.shape, x)
    plan.y_dense = layout_strides(y_shape, x)
    plan.strides = plan.x_dense if o is None else o.strides
    plan.nbytes = x.size * x.dtype.itemsize
    if x.size == 0:
        return plan
    plan.one, plan.zero = scalars_of(x.dtype)
    scale: list[Any] = []
    m = _edge_plan(plan, x, k, m, divisor, edges, y_shape, plan.y_dense, scale)  # dy alike
    if plan.slices:  # always a copy (the caller's dy stays), its descriptors made once
        plan.dy_copy = Staging(y_shape, dy.strides, x.dtype, plan.y_dense, x.dtype)
    plan.launch = c_function("cudnnPoolingBackward")
    plan.stage = not (same_layout(y_shape, y.strides, plan.y_dense)
                      and same_layout(y_shape, dy.strides, plan.y_dense)
                      and same_layout(x.shape, x.strides, plan.x_dense)
                      and same_layout(x.shape, plan.strides, plan.x_dense))
    pool = PoolingDescriptor(k, p, st, m, nan)
    yd = TensorDescriptor(y_shape, x.dtype, plan.y_dense)
    xd = TensorDescriptor(x.shape, x.dtype, plan.x_dense)
    plan.pool, plan.x, plan.y = pool.handle, xd.handle, yd.handle
    plan.keep = (pool, yd, xd, *scale)
    return plan


# ---- dilated max pooling ------------------------------------------------------------------------
# cuDNN's pooling has no dilation. A dilated window reads x at start + j * d: per spatial dim the
# outputs o = c, c + P, c + 2P, ... (P = d / gcd(s, d)) read only x's elements of one residue
# modulo d, as plain windows of k consecutive elements of that residue's strided view, stepping
# s * P / d of them. So a dilated max pooling is P (per dim) plain cuDNN max poolings, each on a
# strided view of x (padded on the left where its first window starts before the view) into a
# strided view of y. Distinct c read distinct residues: the views of x are disjoint, and the
# backward passes write disjoint views of dx. A maximum ignores padding, so the views' own
# padding and sizes change nothing: each pooling is exact.

def dilated_classes(i: int, k: int, s: int, p: int, d: int,
                    o: int) -> list[tuple[int, int, int, int, int, int]]:
    """For one spatial dim of a dilated pooling (input ``i``, kernel ``k``, stride ``s``,
    padding ``p``, dilation ``d``, ``o`` outputs), the plain poolings it splits into:
    ``(c, n, start, length, pad, stride)``: outputs ``c, c + P, ...`` (``n`` of them) are the
    windows of a pooling with kernel ``k``, ``stride`` and left padding ``pad`` over the
    ``length`` elements ``x[start::d]``."""
    period = d // math.gcd(s, d)
    step = s * period // d
    out = []
    for c in range(min(period, o)):
        n = (o - c + period - 1) // period
        first = c * s - p  # x index of output c's window's first element
        r, q = first % d, first // d  # its residue and its place in that residue's view
        pad = max(0, -q)
        start = r + (q + pad) * d
        length = (i - start + d - 1) // d if start < i else 0
        out.append((c, n, start, length, pad, step))
    return out


def _dilated_output(x: Tensor, k: tuple[int, ...], st: tuple[int, ...], p: tuple[int, ...],
                    d: tuple[int, ...], rule: str, fn: str) -> tuple[int, ...]:
    """PyTorch's output size with the dilated (effective) kernel ``d * (k - 1) + 1``."""
    ke = tuple(di * (ki - 1) + 1 for ki, di in zip(k, d))
    out = (ceil_output_size(x.shape[2:], ke, st, p) if rule == HALF_CEIL
           else output_size(x.shape[2:], ke, st, p))
    if min(out) < 1:
        given = "x".join(map(str, x.shape[1:]))
        calc = "x".join(map(str, (x.shape[1],) + out))
        raise ValueError(f"{fn}: Given input size: ({given}). Calculated output size: ({calc}). "
                         f"Output size is too small")
    return out


def _view(t: Tensor, starts: Sequence[int], steps: Sequence[int],
          sizes: Sequence[int]) -> Tensor:
    """The view of ``t``'s spatial dims from ``starts``, every ``steps``-th element, ``sizes``
    of them (N and C whole)."""
    offset = sum(a * t.strides[2 + j] for j, a in enumerate(starts))
    strides = t.strides[:2] + tuple(t.strides[2 + j] * b for j, b in enumerate(steps))
    return Tensor._make(t.ptr + offset * t.dtype.itemsize, t.shape[:2] + tuple(sizes), strides,
                        t.dtype, t.device, t, t.readonly)


def _pieces(x: Tensor, k: tuple[int, ...], st: tuple[int, ...], p: tuple[int, ...],
            d: tuple[int, ...], out: tuple[int, ...], fn: str) -> list[tuple[Any, ...]]:
    """Every plain pooling of a dilated one: (x view starts, lengths, y view starts, counts,
    paddings, strides), over the product of each dim's classes."""
    import itertools

    per_dim = [dilated_classes(i, ki, si, pi, di, oi)
               for i, ki, si, pi, di, oi in zip(x.shape[2:], k, st, p, d, out)]
    pieces = []
    for combo in itertools.product(*per_dim):
        if any(length == 0 for _, _, _, length, _, _ in combo):
            raise ValueError(f"{fn}: a dilated window holds no input element (x "
                             f"{list(x.shape)}, kernel_size={k}, stride={st}, padding={p}, "
                             f"dilation={d})")
        pieces.append(tuple(tuple(c[j] for c in combo) for j in (2, 3, 0, 1, 4, 5)))
    return pieces


def _dilated_forward(x: Any, kernel_size: Any, stride: Any, padding: Any, d: tuple[int, ...],
                     mode: Any, out: Any, stream: Any, nan: NanPropagation, rule: str,
                     fn: str) -> Tensor:
    s, s_ref = (0, None) if stream is None else stream_pair(stream)
    xt = tensor_arg(x, stream)
    check_input(xt, "x", fn, _RANKS, _WHAT)
    k, st, p, _ = pooling_geometry(xt, kernel_size, stride, padding, fn, rule)
    m = MODES[check_choice(mode, "mode", tuple(MODES), fn)]
    shape = xt.shape[:2] + _dilated_output(xt, k, st, p, d, rule, fn)
    pieces = _pieces(xt, k, st, p, d, shape[2:], fn)
    o = None if out is None else checked_out(out, shape, xt, fn, stream)
    if o is not None:
        check_out_reads(o, (("x", xt),), fn)
    strides = layout_strides(shape, xt) if o is None else o.strides
    nbytes = math.prod(shape) * xt.dtype.itemsize
    if nbytes == 0:  # N or C is 0
        return o if o is not None else output(0, shape, strides, xt.dtype, xt.device, s, s_ref)
    prev, handle, y = prologue(o, nbytes, shape, strides, xt, s, s_ref)
    try:
        one, zero = scalars_of(xt.dtype)
        launch = c_function("cudnnPoolingForward")
        periods = _periods(st, d)
        for x_starts, lengths, y_starts, counts, pads, steps in pieces:
            xv = _view(xt, x_starts, d, lengths)
            yv = _view(y, y_starts, periods, counts)
            with PoolingDescriptor(k, pads, steps, m, nan) as pool, \
                    TensorDescriptor(xv.shape, xv.dtype, xv.strides) as xd, \
                    TensorDescriptor(yv.shape, yv.dtype, yv.strides) as yd:
                status = launch(handle, pool.handle, one, xd.handle, xv.ptr, zero, yd.handle,
                                yv.ptr)
                if status:
                    raise_launch(status, "cudnnPoolingForward", fn, pooling=pool, x=xd, y=yd)
        return y
    finally:
        restore_device(prev)


def _periods(st: tuple[int, ...], d: tuple[int, ...]) -> tuple[int, ...]:
    """Per dim, the step between the outputs of one plain pooling: ``d / gcd(s, d)``."""
    return tuple(di // math.gcd(si, di) for si, di in zip(st, d))


def _dilated_backward(y: Any, dy: Any, x: Any, kernel_size: Any, stride: Any, padding: Any,
                      d: tuple[int, ...], mode: Any, out: Any, stream: Any, nan: NanPropagation,
                      rule: str, fn: str) -> Tensor:
    s, s_ref = (0, None) if stream is None else stream_pair(stream)
    yt, dyt, xt = tensor_arg(y, stream), tensor_arg(dy, stream), tensor_arg(x, stream)
    check_input(xt, "x", fn, _RANKS, _WHAT)
    k, st, p, _ = pooling_geometry(xt, kernel_size, stride, padding, fn, rule)
    y_shape = xt.shape[:2] + _dilated_output(xt, k, st, p, d, rule, fn)
    check_operands(xt, "x", ((yt, "y"), (dyt, "dy")), y_shape,
                   f"the pooled size of x {list(xt.shape)}", fn, _RANKS, _WHAT)
    m = MODES[check_choice(mode, "mode", tuple(MODES), fn)]
    pieces = _pieces(xt, k, st, p, d, y_shape[2:], fn)
    o = None if out is None else checked_out(out, xt.shape, xt, fn, stream)
    if o is not None:
        check_out_reads(o, (("y", yt), ("dy", dyt), ("x", xt)), fn)
    x_dense = layout_strides(xt.shape, xt)
    y_dense = layout_strides(y_shape, xt)
    nbytes = xt.size * xt.dtype.itemsize
    if nbytes == 0:
        return o if o is not None else output(0, xt.shape, x_dense, xt.dtype, xt.device, s, s_ref)
    prev, handle, dx = prologue(o, nbytes, xt.shape, x_dense, xt, s, s_ref)
    try:
        from ..cudnn.tensor_ops import fill_zero

        # cuDNN reads y with dy and x with dx in one layout: dense copies where they differ
        ys, dys = staged(handle, yt, y_dense, s), staged(handle, dyt, y_dense, s)
        xs = staged(handle, xt, x_dense, s)
        target = staged(handle, dx, x_dense, s, copy=False)
        fill_zero(target, s, handle)  # the residues no window reads get no gradient
        one, zero = scalars_of(xt.dtype)
        launch = c_function("cudnnPoolingBackward")
        periods = _periods(st, d)
        for x_starts, lengths, y_starts, counts, pads, steps in pieces:
            xv, dxv = _view(xs, x_starts, d, lengths), _view(target, x_starts, d, lengths)
            yv, dyv = _view(ys, y_starts, periods, counts), _view(dys, y_starts, periods, counts)
            with PoolingDescriptor(k, pads, steps, m, nan) as pool, \
                    TensorDescriptor(xv.shape, xv.dtype, xv.strides) as xd, \
                    TensorDescriptor(yv.shape, yv.dtype, yv.strides) as yd:
                status = launch(handle, pool.handle, one, yd.handle, yv.ptr, yd.handle, dyv.ptr,
                                xd.handle, xv.ptr, zero, xd.handle, dxv.ptr)
                if status:
                    raise_launch(status, "cudnnPoolingBackward", fn, pooling=pool, y=yd, x=xd)
        if target is not dx:
            transform(handle, target, dx)
        return dx
    finally:
        restore_device(prev)
