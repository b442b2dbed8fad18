"""CuPy 13's activation, softmax and pooling functions and their constants.

Unlike the convolutions, CuPy 13 returned new arrays from these (pooling_forward returned the y it
was given). A CuPy input gets a CuPy result (allocated by CuPy, C-contiguous as CuPy 13 made it);
any other input a pycudnn.Tensor. NaN does not propagate (CuPy 13 set CUDNN_NOT_PROPAGATE_NAN),
unlike pycudnn's own functions."""

from __future__ import annotations

import numbers
from typing import Any, Sequence

import numpy as np

from .._types import NanPropagation
from ..ops import activation as _act
from ..ops.activation_modes import ACTIVATIONS
from ..ops import pooling as _pooling
from ..ops import softmax as _softmax
from ..ops._common import check_coef, staged
from ..runtime.handle import get_handle
from ..runtime.tensor import Tensor, as_tensor, contiguous_strides, empty, tensor_from_pointer
from .arrays import input_view, stream_of


__all__ = [
    "activation_forward", "activation_backward", "softmax_forward", "softmax_backward",
    "pooling_forward", "pooling_backward",
    "CUDNN_ACTIVATION_SIGMOID", "CUDNN_ACTIVATION_RELU", "CUDNN_ACTIVATION_TANH",
    "CUDNN_ACTIVATION_CLIPPED_RELU", "CUDNN_ACTIVATION_ELU", "CUDNN_ACTIVATION_IDENTITY",
    "CUDNN_ACTIVATION_SWISH", "CUDNN_SOFTMAX_FAST", "CUDNN_SOFTMAX_ACCURATE", "CUDNN_SOFTMAX_LOG",
    "CUDNN_SOFTMAX_MODE_INSTANCE", "CUDNN_SOFTMAX_MODE_CHANNEL", "CUDNN_POOLING_MAX",
    "CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING", "CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING",
    "CUDNN_POOLING_MAX_DETERMINISTIC",
]

CUDNN_ACTIVATION_SIGMOID = 0
"""``cudnnActivationMode_t``: ``1 / (1 + exp(-x))``."""
CUDNN_ACTIVATION_RELU = 1
"""``cudnnActivationMode_t``: ``max(x, 0)``."""
CUDNN_ACTIVATION_TANH = 2
"""``cudnnActivationMode_t``: ``tanh(x)``."""
CUDNN_ACTIVATION_CLIPPED_RELU = 3
"""``cudnnActivationMode_t``: ``min(max(x, 0), coef)``."""
CUDNN_ACTIVATION_ELU = 4
"""``cudnnActivationMode_t``: ``x`` for ``x > 0``, else ``coef * (exp(x) - 1)``."""
CUDNN_ACTIVATION_IDENTITY = 5
"""``cudnnActivationMode_t``: cuDNN runs it only fused into a convolution; refused here."""
CUDNN_ACTIVATION_SWISH = 6
"""``cudnnActivationMode_t``: ``x * sigmoid(coef * x)``."""
CUDNN_SOFTMAX_FAST = 0
"""``cudnnSoftmaxAlgorithm_t``: without subtracting the maximum (may overflow)."""
CUDNN_SOFTMAX_ACCURATE = 1
"""``cudnnSoftmaxAlgorithm_t``: the maximum subtracted first."""
CUDNN_SOFTMAX_LOG = 2
"""``cudnnSoftmaxAlgorithm_t``: log-softmax."""
CUDNN_SOFTMAX_MODE_INSTANCE = 0
"""``cudnnSoftmaxMode_t``: over C, H and W for each N (CuPy chose it itself from ``axis``)."""
CUDNN_SOFTMAX_MODE_CHANNEL = 1
"""``cudnnSoftmaxMode_t``: over C for each N, H, W."""
CUDNN_POOLING_MAX = 0
"""``cudnnPoolingMode_t``: the maximum of each window."""
CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING = 1
"""``cudnnPoolingMode_t``: the average, dividing by the window's size."""
CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING = 2
"""``cudnnPoolingMode_t``: the average, dividing by the input elements in the window."""
CUDNN_POOLING_MAX_DETERMINISTIC = 3
"""``cudnnPoolingMode_t``: the maximum, with a deterministic backward pass."""

#: cudnnActivationMode_t value -> pycudnn's mode name, from the activation table's CuPy names
_ACTIVATION_NAMES = {int(a.legacy): a.name for a in ACTIVATIONS
                     if a.cupy and a.legacy is not None}
_SOFTMAX_NAMES = {CUDNN_SOFTMAX_FAST: "fast", CUDNN_SOFTMAX_ACCURATE: "accurate",
                  CUDNN_SOFTMAX_LOG: "log"}
_POOLING_NAMES = {CUDNN_POOLING_MAX: "max",
                  CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING: "average_include_padding",
                  CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING: "average_exclude_padding",
                  CUDNN_POOLING_MAX_DETERMINISTIC: "max_deterministic"}


def _constant(value: Any, name: str, table: dict[int, str], c_type: str, fn: str) -> str:
    """The pycudnn name of a cuDNN enum value given as an int."""
    if (isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral)
        or value not in table):
        choices = ", ".join(f"{v} ({n})" for v, n in table.items())
        raise ValueError(f"{fn}: {name} must be a {c_type} value, one of {choices}, but got "
                         f"{name}={value!r}")
    return table[int(value)]


def _activation_mode(mode: Any, coef: Any, fn: str) -> str:
    """The pycudnn name of an activation mode, ``coef`` checked (before anything is allocated)."""

    name = _constant(mode, "mode", _ACTIVATION_NAMES, "cudnnActivationMode_t", fn)
    _act.check_mode(name, fn)
    check_coef(coef, fn)
    return name


def _is_cupy(arr: Any) -> bool:
    return type(arr).__module__.startswith("cupy")


def _new_result(like: Any, t: Tensor, shape: tuple[int, ...], stream: int) -> tuple[Any, Tensor]:
    """(the array to return, a view of it to write): a C-contiguous array of ``shape`` and
    ``t``'s dtype on ``t``'s device; a CuPy array when the input ``like`` is one."""
    if _is_cupy(like):
        import cupy

        with cupy.cuda.Device(t.device):
            arr = cupy.empty(shape, dtype=like.dtype)
        return arr, as_tensor(arr, stream=stream)

    out = empty(shape, t.dtype, device=t.device, stream=stream)
    return out, out


def _flat(t: Tensor, shape: tuple[int, ...], name: str, fn: str) -> Tensor:
    """A C-contiguous ``t`` viewed with another ``shape`` (as CuPy 13 reshaped its copies)."""
    if not t.is_contiguous():
        raise ValueError(f"{fn}: {name} has {t.ndim} dims and is not C-contiguous: cuDNN takes up "
                         f"to 5 dims, so pycudnn views it as 4-D, which needs a C-contiguous "
                         f"array; pass a contiguous copy")
    return tensor_from_pointer(t.ptr, shape, t.dtype, device=t.device, owner=t,
                               readonly=t.readonly)


def _merged(t: Tensor, groups: Sequence[range]) -> Tensor | None:
    """``t`` with each group of adjacent dims merged into one, as a view (None when its strides
    do not allow it)."""
    shape, strides = [], []
    for g in groups:
        dims = [d for d in g if t.shape[d] != 1]
        size = 1
        for d in g:
            size *= t.shape[d]
        stride = t.strides[dims[-1]] if dims else 1
        for a, b in zip(dims, dims[1:]):
            if t.strides[a] != t.strides[b] * t.shape[b]:
                return None
        shape.append(size)
        strides.append(stride)
    return tensor_from_pointer(t.ptr, tuple(shape), t.dtype, strides=tuple(strides),
                               device=t.device, owner=t, readonly=t.readonly)


def _copy_contiguous(t: Tensor, stream: int) -> Tensor:
    """A C-contiguous copy of ``t`` made on ``stream`` (cudnnTransformTensor)."""

    pad = max(0, 3 - t.ndim)  # tensor descriptors take 3 to 8 dims
    v = tensor_from_pointer(t.ptr, t.shape + (1,) * pad, t.dtype, strides=t.strides + (1,) * pad,
                            device=t.device, owner=t)
    copy = staged(get_handle(t.device, stream), v, contiguous_strides(v.shape), stream)
    return tensor_from_pointer(copy.ptr, t.shape, t.dtype, device=t.device, owner=copy)


def _activation_views(fn: str, stream: int, *named: tuple[str, Tensor]) -> list[Tensor]:
    """The tensors as cuDNN takes them: as they are up to 5 dims, else as 4-D
    ``(n, size / n, 1, 1)``, CuPy 13's view, of C-contiguous copies where they are not (inputs
    only: the outputs here are new C-contiguous arrays)."""
    ts = [t for _, t in named]
    if all(t.ndim <= 5 for t in ts):
        return ts
    out = []
    for name, t in named:
        if not t.is_contiguous():
            t = _copy_contiguous(t, stream)
        n = t.shape[0] if t.ndim else 1
        out.append(_flat(t, (n, t.size // n if n else 0, 1, 1), name, fn))
    return out


def activation_forward(x: Any, mode: int, coef: float = 0.0) -> Any:
    """``y = activation(x)``: CuPy 13's ``cupyx.cudnn.activation_forward``.

    Args:
        x: the input, any shape (up to 5 dims with any strides; more dims C-contiguous).
        mode: a ``CUDNN_ACTIVATION_*`` constant (IDENTITY is refused: cuDNN runs it only fused
            into a convolution).
        coef: the ceiling of CLIPPED_RELU, the alpha of ELU, the beta of SWISH.

    Returns:
        A new C-contiguous array of ``x``'s shape (a CuPy array for a CuPy ``x``).
    """

    fn = "activation_forward"
    name = _activation_mode(mode, coef, fn)
    s = stream_of(x)
    xt = input_view(x, s)
    result, yt = _new_result(x, xt, xt.shape, s)
    xv, yv = _activation_views(fn, s, ("x", xt), ("y", yt))
    _act.run_forward(xv, name, coef, yv, s, NanPropagation.NOT_PROPAGATE_NAN, fn)
    return result


def activation_backward(x: Any, y: Any, gy: Any, mode: int, coef: float = 0.0) -> Any:
    """``gx``, the gradient of an activation: CuPy 13's ``cupyx.cudnn.activation_backward``.

    Args:
        x: the forward input.
        y: the forward output.
        gy: the gradient with respect to ``y``. ``x``, ``y`` and ``gy`` have one shape and dtype.
        mode: the forward call's ``CUDNN_ACTIVATION_*`` constant.
        coef: the forward call's coefficient.

    Returns:
        ``gx``, a new C-contiguous array of ``x``'s shape.
    """

    fn = "activation_backward"
    name = _activation_mode(mode, coef, fn)
    s = stream_of(x)
    xt, yt, gyt = input_view(x, s), input_view(y, s), input_view(gy, s)
    for t, n in ((yt, "y"), (gyt, "gy")):
        if t.shape != xt.shape:
            raise ValueError(f"{fn}: expected {n} of size {list(xt.shape)} (the shape of x), but "
                             f"got {n} of size {list(t.shape)}")
    result, gxt = _new_result(x, xt, xt.shape, s)
    xv, yv, gyv, gxv = _activation_views(fn, s, ("x", xt), ("y", yt), ("gy", gyt), ("gx", gxt))
    _act.run_backward(yv, gyv, xv, name, coef, gxv, s, NanPropagation.NOT_PROPAGATE_NAN, fn)
    return result


def _softmax_view(t: Tensor, axis: int, stream: int, copy: bool = True) -> Tensor:
    """``t`` as CuPy 13's 4-D ``(left, t.shape[axis], right, 1)``: a view when its strides allow,
    else a C-contiguous copy."""
    groups = [range(0, axis), range(axis, axis + 1), range(axis + 1, t.ndim)]
    v = _merged(t, groups)
    if v is None:
        if not copy:
            raise AssertionError("unreachable: results are C-contiguous")  # pragma: no cover
        v = _merged(_copy_contiguous(t, stream), groups)
        assert v is not None
    return tensor_from_pointer(v.ptr, v.shape + (1,), v.dtype, strides=v.strides + (1,),
                               device=v.device, owner=v, readonly=v.readonly)


def _softmax_axis(axis: Any, ndim: int, fn: str) -> int:
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"{fn}: axis must be an int, but got {type(axis).__name__} {axis!r}")
    axis = int(axis)
    if not -ndim <= axis < ndim:
        raise IndexError(f"{fn}: Dimension out of range (expected to be in range of "
                         f"[{-ndim}, {ndim - 1}], but got {axis})")
    return axis + ndim if axis < 0 else axis


def _softmax_mode(t: Tensor) -> str:
    # CuPy 13: INSTANCE when nothing follows the axis and the axis has one element, else CHANNEL
    return "instance" if t.shape[1] == 1 and t.shape[2] == 1 else "channel"


def softmax_forward(x: Any, axis: int, algorithm: int) -> Any:
    """Softmax of ``x`` along ``axis``: CuPy 13's ``cupyx.cudnn.softmax_forward``.

    Args:
        x: the input, any shape with at least one dim (any strides).
        axis: the dim to normalize over (negative counts from the end).
        algorithm: ``CUDNN_SOFTMAX_FAST``, ``CUDNN_SOFTMAX_ACCURATE`` or ``CUDNN_SOFTMAX_LOG``.

    Returns:
        A new C-contiguous array of ``x``'s shape.
    """

    fn = "softmax_forward"
    algo = _constant(algorithm, "algorithm", _SOFTMAX_NAMES, "cudnnSoftmaxAlgorithm_t", fn)
    s = stream_of(x)
    xt = input_view(x, s)
    a = _softmax_axis(axis, xt.ndim, fn)
    result, yt = _new_result(x, xt, xt.shape, s)
    xv = _softmax_view(xt, a, s)
    yv = _softmax_view(yt, a, s, copy=False)
    _softmax.softmax_forward(xv, algorithm=algo, mode=_softmax_mode(xv), out=yv, stream=s)
    return result


def softmax_backward(y: Any, gy: Any, axis: int, algorithm: int) -> Any:
    """The gradient of a softmax along ``axis``: CuPy 13's ``cupyx.cudnn.softmax_backward``.

    Args:
        y: the forward output.
        gy: the gradient with respect to ``y``, ``y``'s shape and dtype.
        axis: the forward call's axis.
        algorithm: the forward call's ``CUDNN_SOFTMAX_*`` algorithm.

    Returns:
        ``gx``, a new C-contiguous array of ``y``'s shape.
    """

    fn = "softmax_backward"
    algo = _constant(algorithm, "algorithm", _SOFTMAX_NAMES, "cudnnSoftmaxAlgorithm_t", fn)
    s = stream_of(y)
    yt, gyt = input_view(y, s), input_view(gy, s)
    a = _softmax_axis(axis, yt.ndim, fn)
    if gyt.shape != yt.shape:
        raise ValueError(f"{fn}: expected gy of size {list(yt.shape)} (the shape of y), but got "
                         f"gy of size {list(gyt.shape)}")
    result, gxt = _new_result(y, yt, yt.shape, s)
    yv, gyv = _softmax_view(yt, a, s), _softmax_view(gyt, a, s)
    gxv = _softmax_view(gxt, a, s, copy=False)
    _softmax.softmax_backward(yv, gyv, algorithm=algo, mode=_softmax_mode(yv), out=gxv, stream=s)
    return result


def _pooling_args(xt: Tensor, ksize: Any, stride: Any, pad: Any, mode: Any,
                  fn: str) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], str]:
    name = _constant(mode, "mode", _POOLING_NAMES, "cudnnPoolingMode_t", fn)
    geo = []
    for value, pname in ((ksize, "ksize"), (stride, "stride"), (pad, "pad")):
        if not isinstance(value, (tuple, list)):
            raise TypeError(f"{fn}: {pname} must be a tuple with one int per spatial dim, but got "
                            f"{type(value).__name__} {value!r}")
        geo.append(tuple(value))
    k, st, p = geo
    if not len(k) == len(st) == len(p):
        raise ValueError(f"{fn}: ksize, stride, and pad must be of same length, but got "
                         f"ksize={k}, stride={st}, pad={p}")
    if xt.ndim in (4, 5) and len(k) != xt.ndim - 2:
        raise ValueError(f"{fn}: expected ksize, stride and pad with {xt.ndim - 2} values (one per "
                         f"spatial dim of x {list(xt.shape)}), but got ksize={k}")
    return k, st, p, name


def pooling_rule(xt: Tensor, yt: Tensor, k: tuple[int, ...], st: tuple[int, ...],
                 p: tuple[int, ...], fn: str, name: str) -> str:
    """The padding and output-size rule ``yt``'s size asks for: ``"window"`` for
    ``(i + 2p - k) // s + 1`` (the pooling layers of CuPy 13 era code), ``"window_cover_all"``
    for Chainer's ``cover_all=True`` size ``(i + 2p - k + s - 1) // s + 1`` (``max_pooling_2d``'s
    default), which CuPy 13 passed to cuDNN as given. Public as a seam for tests and tooling."""
    if not (xt.ndim in (4, 5) and len(k) == xt.ndim - 2
            and all(isinstance(v, int) and v > 0 for v in k + st)):
        return "window"  # the pooling's own checks name what is wrong
    floor = xt.shape[:2] + _pooling.output_size(xt.shape[2:], k, st, p)
    cover = xt.shape[:2] + _pooling.output_size(xt.shape[2:], k, st, p, cover_all=True)
    if yt.shape == floor or min(floor) <= 0:
        return "window"
    if yt.shape == cover:
        if _pooling.windows_hold_input(xt.shape[2:], st, p, cover[2:]):
            return "window_cover_all"
        # cuDNN would write -FLT_MAX (max) or NaN (average) for a window past the input:
        # refused by _refuse_empty_windows, which the callers run next
        return "window"
    sizes = (f"{list(floor)}" if floor == cover
             else f"{list(floor)} (or {list(cover)}, Chainer's cover_all=True)")
    raise ValueError(f"{fn}: expected {name} of size {sizes} for x {list(xt.shape)}, "
                     f"ksize={k}, stride={st}, pad={p}, but got {name} of size {list(yt.shape)}")


def _refuse_empty_windows(xt: Tensor, yt: Tensor, k: tuple[int, ...], st: tuple[int, ...],
                          p: tuple[int, ...], rule: str, fn: str) -> None:
    """Refuse a ``y`` of Chainer's cover_all size whose last window holds no input element
    (``stride > ksize`` can put it past the input and its padding). CuPy 13 handed it to cuDNN,
    which wrote -FLT_MAX (max) or NaN (average) there, values no pooling defines; pycudnn
    refuses instead (docs/operations.md)."""
    if rule != "window" or xt.ndim not in (4, 5) or yt.ndim != xt.ndim:
        return
    floor = xt.shape[:2] + _pooling.output_size(xt.shape[2:], k, st, p)
    if yt.shape == floor:
        return
    dims = [d for d, (i, ki, si, pi, o) in enumerate(zip(xt.shape[2:], k, st, p, yt.shape[2:]))
            if (o - 1) * si - pi >= i]
    raise ValueError(
        f"{fn}: y of size {list(yt.shape)} (Chainer's cover_all=True size) has a last window "
        f"that holds no input element (spatial dim {dims[0] if dims else '?'}: x "
        f"{list(xt.shape)}, ksize={k}, stride={st}, pad={p}); its value is undefined, so "
        f"pycudnn refuses it: pass y of size {list(floor)}, or a stride no larger than ksize")


def pooling_forward(x: Any, y: Any, ksize: Sequence[int], stride: Sequence[int],
                    pad: Sequence[int], mode: int) -> Any:
    """Pooling of ``x`` into the preallocated ``y``: CuPy 13's ``cupyx.cudnn.pooling_forward``.

    Args:
        x: ``(N, C, H, W)`` or ``(N, C, D, H, W)``, any strides.
        y: the preallocated, C-contiguous output ``(N, C, *out)`` with
            ``out = (i + 2 * pad - ksize) // stride + 1``, or Chainer's ``cover_all=True`` size
            ``(i + 2 * pad - ksize + stride - 1) // stride + 1``; overwritten.
        ksize: the window, one int per spatial dim.
        stride: one int per spatial dim.
        pad: one int per spatial dim, smaller than ``ksize`` (every window holds an input
            element).
        mode: a ``CUDNN_POOLING_*`` constant.

    Returns:
        ``y``.
    """

    fn = "pooling_forward"
    s = stream_of(x)
    xt, yt = input_view(x, s), as_tensor(y, stream=s)
    k, st, p, name = _pooling_args(xt, ksize, stride, pad, mode, fn)
    if not yt.is_contiguous():
        raise ValueError(f"{fn}: pooling_forward supports c-contiguous y only, but got y with "
                         f"strides {list(yt.strides)} (in elements) for size {list(yt.shape)}")
    rule = pooling_rule(xt, yt, k, st, p, fn, "y")
    _refuse_empty_windows(xt, yt, k, st, p, rule, fn)
    _pooling.run_forward(xt, k, st, p, name, yt, s, NanPropagation.NOT_PROPAGATE_NAN, rule, fn,
                         out_name="y")
    return y


def pooling_backward(x: Any, y: Any, gy: Any, ksize: Sequence[int], stride: Sequence[int],
                     pad: Sequence[int], mode: int) -> Any:
    """``gx``, the gradient of a pooling: CuPy 13's ``cupyx.cudnn.pooling_backward``.

    Args:
        x: the forward input.
        y: the forward output.
        gy: the gradient with respect to ``y``.
        ksize: the forward call's window.
        stride: the forward call's stride.
        pad: the forward call's padding.
        mode: the forward call's ``CUDNN_POOLING_*`` constant.

    Returns:
        ``gx``, a new C-contiguous array of ``x``'s shape.
    """

    fn = "pooling_backward"
    s = stream_of(x)
    xt, yt, gyt = input_view(x, s), input_view(y, s), input_view(gy, s)
    k, st, p, name = _pooling_args(xt, ksize, stride, pad, mode, fn)
    if yt.shape != gyt.shape:
        raise ValueError(f"{fn}: expected gy of size {list(yt.shape)} (the shape of y), but got "
                         f"gy of size {list(gyt.shape)}")
    rule = pooling_rule(xt, yt, k, st, p, fn, "y")
    _refuse_empty_windows(xt, yt, k, st, p, rule, fn)
    result, gxt = _new_result(x, xt, xt.shape, s)
    _pooling.run_backward(yt, gyt, xt, k, st, p, name, gxt, s, NanPropagation.NOT_PROPAGATE_NAN,
                          rule, fn)
    return result
