"""Drop-in replacements for CuPy 13's ``cupyx.cudnn`` convolution functions.

CuPy 14 removed ``cupyx.cudnn``. Code written for CuPy 13 keeps working by changing one import::

    from cupyx import cudnn                      # CuPy <= 13
    from pycudnn import cupy_compat as cudnn     # CuPy 14 + pycudnn

The three functions keep CuPy 13's names, positional parameters, keyword-only parameters and
defaults, and its semantics: the result is written into the preallocated array the caller passes
(``y``, or ``gW``), an optional bias ``b`` (one value per channel) is added, and nothing is
returned. They run on CuPy's current stream (more precisely: the current stream of the framework
the data array comes from, see
`pycudnn.current_stream()`), and accept any array pycudnn
accepts (CuPy, PyTorch, Numba, `pycudnn.Tensor`), without copies.

How the parameters map onto pycudnn:

* ``auto_tune=True`` measures the candidates (pycudnn's ``benchmark=True``) and remembers the
  fastest; ``False`` takes cuDNN's heuristics. Both are cached per shape, as in CuPy.
* ``tensor_core``: ``'auto'`` and ``'always'`` allow tensor cores (``allow_tf32=True``: float32
  may run in TF32 on Ampere and later); ``'never'`` sets ``allow_tf32=False`` (float32 is computed
  in full float32). Half precision always may use tensor cores: cuDNN has no other fast path.
* ``deterministic=True`` keeps only deterministic algorithms (pycudnn's ``deterministic``).
* ``d_layout`` / ``w_layout``: `CUDNN_TENSOR_NCHW` (0, default) or
  `CUDNN_TENSOR_NHWC` (1). With NHWC the arrays are shaped the way CuPy 13 wanted them,
  ``(N, H, W, C)`` for data and ``(K, R, S, C)`` for the filter; pycudnn views them as NCHW shapes
  with channels-last strides (no copy). As in CuPy 13 the layouts apply to 4-D arrays; the data
  layout of other ranks is channels-first whatever ``d_layout`` says (CuPy ignored it too).
* The workspace is bounded by `set_max_workspace_size()` when it was called; by default
  (unlike CuPy's 8 MiB) pycudnn lets cuDNN use what the device has free, which allows faster
  algorithms.

Differences that only widen what is accepted: inputs and outputs need not be C-contiguous (CuPy
13 copied inputs and refused non-contiguous outputs; broadcast inputs, e.g. from
``cupy.broadcast_to``, are copied here too), bfloat16 works, and errors are Python exceptions
naming the bad argument (``ValueError`` / ``TypeError``) instead of assertion errors or cuDNN
status errors.
"""

from __future__ import annotations

import numbers
import warnings
from typing import Any, Sequence

import numpy as np

from ._types import NanPropagation
from .api import conv as _conv
from .cudnn.tensor_ops import add_tensor, transform
from .ops import activation as _act
from .ops import batchnorm
from .ops.batchnorm.training import query_runtime_error
from .ops import pooling as _pooling
from .ops import softmax as _softmax
from .ops._common import check_coef, staged
from .ops.dropout import DropoutState, dropout_backward, dropout_forward
from .runtime.handle import get_handle
from .runtime.interop import current_stream
from .runtime.tensor import Tensor, as_tensor, contiguous_strides, empty, tensor_from_pointer

__all__ = ["convolution_forward", "convolution_backward_data", "convolution_backward_filter",
           "get_max_workspace_size", "set_max_workspace_size", "UNBOUNDED_WORKSPACE",
           "CUDNN_TENSOR_NCHW",
           "CUDNN_TENSOR_NHWC"]

CUDNN_TENSOR_NCHW = 0
"""``cudnnTensorFormat_t`` channels-first, as ``cupy.cuda.cudnn.CUDNN_TENSOR_NCHW``."""
CUDNN_TENSOR_NHWC = 1
"""``cudnnTensorFormat_t`` channels-last, as ``cupy.cuda.cudnn.CUDNN_TENSOR_NHWC``: data arrays
shaped ``(N, H, W, C)``, filters ``(K, R, S, C)``."""

_LAYOUT_NAMES = {CUDNN_TENSOR_NCHW: "CUDNN_TENSOR_NCHW", CUDNN_TENSOR_NHWC: "CUDNN_TENSOR_NHWC"}
_TENSOR_CORE_MODES = ("always", "auto", "never")

_max_workspace_size: int | None = None
#: what `get_max_workspace_size()` reports while no bound is set (an int, as CuPy's was)
UNBOUNDED_WORKSPACE = 2**63 - 1


def get_max_workspace_size() -> int:
    """The workspace bound set by `set_max_workspace_size()`, in bytes.

    By default there is no bound beyond the device's free memory, reported as
    `UNBOUNDED_WORKSPACE` (an int, so that CuPy 13 code such as
    ``set_max_workspace_size(get_max_workspace_size() * 4)`` keeps working); CuPy 13's default
    was 8 MiB.
    """
    return UNBOUNDED_WORKSPACE if _max_workspace_size is None else _max_workspace_size


def set_max_workspace_size(size: int | None) -> None:
    """Bound the workspace the functions of this module may use (bytes; ``None`` or
    `UNBOUNDED_WORKSPACE` and above: no bound).

    Only this module's functions are affected; pycudnn's own functions take
    ``workspace_limit=`` (or `pycudnn.config`).
    """
    global _max_workspace_size
    if size is not None and (isinstance(size, (bool, np.bool_))
                             or not isinstance(size, numbers.Integral) or size < 0):
        raise ValueError(f"set_max_workspace_size: expected None or a non-negative int, got {size!r}")
    _max_workspace_size = None if size is None or size >= UNBOUNDED_WORKSPACE else int(size)


def _layout(value: Any, name: str) -> int:
    if isinstance(value, bool) or value not in _LAYOUT_NAMES:
        raise ValueError(f"unknown cudnnTensorFormat: {value!r} ({name}); expected "
                         f"CUDNN_TENSOR_NCHW ({CUDNN_TENSOR_NCHW}) or CUDNN_TENSOR_NHWC "
                         f"({CUDNN_TENSOR_NHWC})")
    return int(value)


def _flags(auto_tune: Any, tensor_core: Any, deterministic: Any = False) -> dict[str, Any]:
    if tensor_core not in _TENSOR_CORE_MODES:
        raise ValueError('tensor_core must be either of "always", "auto", or "never", got '
                         f"{tensor_core!r}")
    flags: dict[str, Any] = {"benchmark": bool(auto_tune), "deterministic": bool(deterministic),
                             "allow_tf32": tensor_core != "never"}
    if _max_workspace_size is not None:
        flags["workspace_limit"] = _max_workspace_size
    return flags


def _geometry(pad: Any, stride: Any, dilation: Any) -> tuple[tuple[int, ...], tuple[int, ...],
                                                              tuple[int, ...]]:
    def as_tuple(value: Any, name: str) -> tuple[int, ...]:
        if not isinstance(value, (tuple, list)):
            raise TypeError(f"{name}: expected a tuple with one int per spatial dimension, got "
                            f"{type(value).__name__} {value!r}")
        return tuple(value)

    pad_t = as_tuple(pad, "pad")
    stride_t = as_tuple(stride, "stride")
    if len(pad_t) != len(stride_t):
        raise ValueError(f"pad and stride must be of same length, got pad={pad!r}, stride={stride!r}")
    dil_t = (1,) * len(pad_t) if dilation is None else as_tuple(dilation, "dilation")
    return pad_t, stride_t, dil_t


def _data_view(arr: Any, layout: int, stream: int) -> Tensor:
    """A pycudnn view of a data array given in ``layout`` (NHWC arrays are (N, H, W, C))."""
    t = as_tensor(arr, stream=stream)
    if layout == CUDNN_TENSOR_NHWC and t.ndim == 4:
        return _channels_last_view(t)
    return t


def _filter_view(arr: Any, layout: int, stream: int) -> Tensor:
    """A pycudnn view of a filter given in ``layout`` (NHWC filters are (K, R, S, C))."""
    t = as_tensor(arr, stream=stream)
    if layout == CUDNN_TENSOR_NHWC:
        if t.ndim != 4:
            raise ValueError(f"w_layout=CUDNN_TENSOR_NHWC needs a 4-D filter (K, R, S, C), got "
                             f"shape {list(t.shape)}; pass 3-D and 5-D filters channels-first "
                             "(CUDNN_TENSOR_NCHW)")
        return _channels_last_view(t)
    return t


def _channels_last_view(t: Tensor) -> Tensor:
    """(N, H, W, C) with any strides -> the (N, C, H, W) view of the same memory."""
    n, h, w, c = t.shape
    sn, sh, sw, sc = t.strides
    return tensor_from_pointer(t.ptr, (n, c, h, w), t.dtype, strides=(sn, sc, sh, sw),
                               device=t.device, owner=t, readonly=t.readonly)


def _bias_view(b: Any, stream: int) -> Tensor | None:
    """The bias as a 1-D view (CuPy 13 reshaped it to one value per channel)."""
    if b is None:
        return None
    t = as_tensor(b, stream=stream)
    if t.ndim == 1:
        return t
    if not t.is_contiguous():
        raise ValueError(f"b: expected a 1-D array or a contiguous array with one value per "
                         f"channel, got shape {list(t.shape)} with strides {list(t.strides)}")
    return tensor_from_pointer(t.ptr, (t.size,), t.dtype, device=t.device, owner=t)


def _input(arr: Any, stream: int) -> Tensor:
    """An input array as a pycudnn view; a broadcast one (stride-0 dims, as ``cupy.broadcast_to``
    makes) as a C-contiguous copy, which cuDNN can read (CuPy 13 copied every input)."""
    t = as_tensor(arr, stream=stream)
    if all(st or n < 2 for n, st in zip(t.shape, t.strides)):
        return t
    if t.ndim > 5:
        raise ValueError(f"an input of {t.ndim} dims with broadcast (stride-0) dims, shape "
                         f"{list(t.shape)} strides {list(t.strides)}: pycudnn expands broadcast "
                         f"inputs of up to 5 dims; pass a contiguous copy")
    pad = (1,) * max(0, 4 - t.ndim)  # cudnnAddTensor takes 4-D and 5-D tensors
    # the source without its broadcast dims (size 1 there), added into a dense array: cuDNN
    # broadcasts size-1 dims of the source over the destination
    src = tensor_from_pointer(
        t.ptr, tuple(1 if st == 0 else n for n, st in zip(t.shape, t.strides)) + pad, t.dtype,
        strides=tuple(st or 1 for st in t.strides) + pad, device=t.device, owner=t)
    dense = empty(t.shape + pad, t.dtype, device=t.device, stream=stream)
    add_tensor(get_handle(t.device, stream), src, dense, alpha=1.0, beta=0.0)
    return tensor_from_pointer(dense.ptr, t.shape, t.dtype, device=t.device, owner=dense)


def _stream_of(arr: Any) -> int:

    try:
        return current_stream(arr)
    except TypeError:
        return 0


def convolution_forward(x: Any, W: Any, b: Any, y: Any, pad: Sequence[int], stride: Sequence[int],
                        dilation: Sequence[int] | None, groups: int, *, auto_tune: bool,
                        tensor_core: str, d_layout: int = CUDNN_TENSOR_NCHW,
                        w_layout: int = CUDNN_TENSOR_NCHW) -> None:
    """``y = conv(x, W) (+ b)``: CuPy 13's ``cupyx.cudnn.convolution_forward``.

    Args:
        x: input, ``(N, C, *spatial)`` (``(N, H, W, C)`` with ``d_layout=CUDNN_TENSOR_NHWC``).
        W: filter, ``(K, C/groups, *kernel)`` (``(K, R, S, C)`` with ``w_layout=CUDNN_TENSOR_NHWC``).
        b: ``None`` or a bias with one value per output channel, added to ``y``.
        y: the preallocated output, ``(N, K, *out)`` (``(N, OH, OW, K)`` with NHWC); overwritten.
        pad: one padding per spatial dimension (a tuple).
        stride: one stride per spatial dimension.
        dilation: one dilation per spatial dimension, or ``None`` for all ones.
        groups: number of channel groups.
        auto_tune: measure the candidate algorithms once per shape and keep the fastest.
        tensor_core: ``'auto'``, ``'always'`` or ``'never'`` (see the module docstring).
        d_layout: layout of ``x`` and ``y``: `CUDNN_TENSOR_NCHW` or `CUDNN_TENSOR_NHWC`.
        w_layout: layout of ``W``.

    Raises:
        ValueError / TypeError: a bad argument (shapes, dtypes, devices, modes), before any work.
    """
    flags = _flags(auto_tune, tensor_core)
    d, w = _layout(d_layout, "d_layout"), _layout(w_layout, "w_layout")
    pad_t, stride_t, dil_t = _geometry(pad, stride, dilation)
    s = _stream_of(x)
    xv, yv = _data_view(_input(x, s), d, s), _data_view(y, d, s)
    wv = _filter_view(_input(W, s), w, s)
    bv = _bias_view(None if b is None else _input(b, s), s)
    _conv.convolution(xv, wv, bv, stride=stride_t, padding=pad_t, dilation=dil_t, groups=groups,
                      out=yv, stream=s, **flags)


def convolution_backward_data(W: Any, x: Any, b: Any, y: Any, pad: Sequence[int],
                              stride: Sequence[int], dilation: Sequence[int] | None, groups: int, *,
                              deterministic: bool, auto_tune: bool, tensor_core: str,
                              d_layout: int = CUDNN_TENSOR_NCHW,
                              w_layout: int = CUDNN_TENSOR_NCHW) -> None:
    """``y = conv_transpose(x, W) (+ b)``: CuPy 13's ``cupyx.cudnn.convolution_backward_data``.

    As in CuPy, ``x`` is the gradient of a convolution's output and ``y`` receives the gradient
    of its input (a transposed convolution).

    Args:
        W: filter of the forward convolution, ``(K, C/groups, *kernel)``.
        x: ``(N, K, *out)``: the gradient with respect to the forward output.
        b: ``None`` or one value per channel of ``y``, added to ``y``.
        y: the preallocated result ``(N, C, *in)``; overwritten.
        pad: one padding per spatial dimension.
        stride: one stride per spatial dimension.
        dilation: one dilation per spatial dimension, or ``None``.
        groups: number of channel groups.
        deterministic: only deterministic algorithms.
        auto_tune: measure the candidate algorithms once per shape and keep the fastest.
        tensor_core: ``'auto'``, ``'always'`` or ``'never'``.
        d_layout: layout of ``x`` and ``y``.
        w_layout: layout of ``W``.
    """
    flags = _flags(auto_tune, tensor_core, deterministic)
    d, w = _layout(d_layout, "d_layout"), _layout(w_layout, "w_layout")
    pad_t, stride_t, dil_t = _geometry(pad, stride, dilation)
    s = _stream_of(x)
    gyv, gxv = _data_view(_input(x, s), d, s), _data_view(y, d, s)
    wv = _filter_view(_input(W, s), w, s)
    bv = _bias_view(None if b is None else _input(b, s), s)
    if bv is None:
        _conv.convolution_backward_data(gyv, wv, gxv.shape, stride=stride_t, padding=pad_t,
                                        dilation=dil_t, groups=groups, out=gxv, stream=s, **flags)
        return
    # With a bias: the transposed convolution, whose output padding is what makes its output
    # exactly y's shape (validated first the way convolution_backward_data validates).
    if not (gyv.ndim == gxv.ndim == wv.ndim) or gxv.ndim not in (3, 4, 5):
        raise ValueError(f"convolution_backward_data: expected W, x and y with the same number of "
                         f"dims (3 to 5), got W {list(wv.shape)}, x {list(gyv.shape)}, "
                         f"y {list(gxv.shape)}")
    if len(pad_t) != gxv.ndim - 2:
        raise ValueError(f"convolution_backward_data: expected pad, stride and dilation with "
                         f"{gxv.ndim - 2} values, got pad={pad!r}")
    expected = _conv.output_size(gxv.shape[2:], wv.shape[2:], stride_t, pad_t, dil_t)
    if tuple(expected) != tuple(gyv.shape[2:]):
        raise ValueError(f"convolution_backward_data: y of size {list(gxv.shape)} (as NCHW) would "
                         f"give a forward output of spatial size {list(expected)}, but x has "
                         f"{list(gyv.shape[2:])} (shape {list(gyv.shape)})")
    output_padding = tuple(
        o - ((i - 1) * st - 2 * p + dl * (k - 1) + 1)
        for o, i, k, st, p, dl in zip(gxv.shape[2:], gyv.shape[2:], wv.shape[2:], stride_t, pad_t,
                                      dil_t))
    _conv.conv_transpose(gyv, wv, bv, stride=stride_t, padding=pad_t,
                         output_padding=output_padding, dilation=dil_t, groups=groups, out=gxv,
                         stream=s, **flags)


def convolution_backward_filter(x: Any, gy: Any, gW: Any, pad: Sequence[int],
                                stride: Sequence[int], dilation: Sequence[int] | None, groups: int,
                                *, deterministic: bool, auto_tune: bool, tensor_core: str,
                                d_layout: int = CUDNN_TENSOR_NCHW,
                                w_layout: int = CUDNN_TENSOR_NCHW) -> None:
    """``gW = dconv/dW``: CuPy 13's ``cupyx.cudnn.convolution_backward_filter``.

    Args:
        x: the forward input, ``(N, C, *in)``.
        gy: the gradient with respect to the forward output, ``(N, K, *out)``.
        gW: the preallocated filter gradient, ``(K, C/groups, *kernel)``; overwritten.
        pad: one padding per spatial dimension.
        stride: one stride per spatial dimension.
        dilation: one dilation per spatial dimension, or ``None``.
        groups: number of channel groups.
        deterministic: only deterministic algorithms.
        auto_tune: measure the candidate algorithms once per shape and keep the fastest.
        tensor_core: ``'auto'``, ``'always'`` or ``'never'``.
        d_layout: layout of ``x`` and ``gy``.
        w_layout: layout of ``gW``.
    """
    flags = _flags(auto_tune, tensor_core, deterministic)
    d, w = _layout(d_layout, "d_layout"), _layout(w_layout, "w_layout")
    pad_t, stride_t, dil_t = _geometry(pad, stride, dilation)
    s = _stream_of(x)
    xv, gyv = _data_view(_input(x, s), d, s), _data_view(_input(gy, s), d, s)
    gwv = _filter_view(gW, w, s)
    _conv.convolution_backward_filter(xv, gyv, gwv.shape, stride=stride_t, padding=pad_t,
                                      dilation=dil_t, groups=groups, out=gwv, stream=s, **flags)


# ==== activation, softmax and pooling: CuPy 13's cupyx.cudnn functions ==========================
# Unlike the convolutions above, CuPy 13 returned new arrays from these (pooling_forward returned
# the y it was given). A CuPy input gets a CuPy result (allocated by CuPy, C-contiguous as CuPy 13
# made it); any other input a pycudnn.Tensor. NaN does not propagate (CuPy 13 set
# CUDNN_NOT_PROPAGATE_NAN), unlike pycudnn's own functions.

__all__ += [
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

_ACTIVATION_NAMES = {CUDNN_ACTIVATION_SIGMOID: "sigmoid", CUDNN_ACTIVATION_RELU: "relu",
                     CUDNN_ACTIVATION_TANH: "tanh", CUDNN_ACTIVATION_CLIPPED_RELU: "clipped_relu",
                     CUDNN_ACTIVATION_ELU: "elu", CUDNN_ACTIVATION_IDENTITY: "identity",
                     CUDNN_ACTIVATION_SWISH: "swish"}
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
    s = _stream_of(x)
    xt = _input(x, s)
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
    s = _stream_of(x)
    xt, yt, gyt = _input(x, s), _input(y, s), _input(gy, s)
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
    s = _stream_of(x)
    xt = _input(x, s)
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
    s = _stream_of(y)
    yt, gyt = _input(y, s), _input(gy, s)
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


def _pooling_rule(xt: Tensor, yt: Tensor, k: tuple[int, ...], st: tuple[int, ...],
                  p: tuple[int, ...], fn: str, name: str) -> str:
    """The padding and output-size rule ``yt``'s size asks for: ``"window"`` for
    ``(i + 2p - k) // s + 1`` (the pooling layers of CuPy 13 era code), ``"window_cover_all"``
    for Chainer's ``cover_all=True`` size ``(i + 2p - k + s - 1) // s + 1`` (``max_pooling_2d``'s
    default), which CuPy 13 passed to cuDNN as given."""
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
    s = _stream_of(x)
    xt, yt = _input(x, s), as_tensor(y, stream=s)
    k, st, p, name = _pooling_args(xt, ksize, stride, pad, mode, fn)
    if not yt.is_contiguous():
        raise ValueError(f"{fn}: pooling_forward supports c-contiguous y only, but got y with "
                         f"strides {list(yt.strides)} (in elements) for size {list(yt.shape)}")
    rule = _pooling_rule(xt, yt, k, st, p, fn, "y")
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
    s = _stream_of(x)
    xt, yt, gyt = _input(x, s), _input(y, s), _input(gy, s)
    k, st, p, name = _pooling_args(xt, ksize, stride, pad, mode, fn)
    if yt.shape != gyt.shape:
        raise ValueError(f"{fn}: expected gy of size {list(yt.shape)} (the shape of y), but got "
                         f"gy of size {list(gyt.shape)}")
    rule = _pooling_rule(xt, yt, k, st, p, fn, "y")
    _refuse_empty_windows(xt, yt, k, st, p, rule, fn)
    result, gxt = _new_result(x, xt, xt.shape, s)
    _pooling.run_backward(yt, gyt, xt, k, st, p, name, gxt, s, NanPropagation.NOT_PROPAGATE_NAN,
                          rule, fn)
    return result


# ==== batch normalization and dropout ===============================================================
# CuPy 13's cupyx.cudnn batch_normalization_* functions and DropoutStates on pycudnn.ops.batchnorm
# and pycudnn.ops.dropout. CuPy 13 returned new arrays here (unlike the convolutions above): the
# results are CuPy arrays when x is one (zero-copy views of pycudnn's memory), else
# pycudnn.Tensors. Its rules are kept: ``decay`` weighs the old running value (pycudnn's momentum
# is ``1 - decay``), ``is_for_conv2d=False`` treats the last axis as the channels and every other
# axis as the batch, and scale, bias and statistics of another dtype than cuDNN's (float32 for
# float16 input) are converted for the call and back.

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

__all__ += ["batch_normalization_forward_training", "batch_normalization_forward_training_ex",
            "batch_normalization_forward_inference", "batch_normalization_backward",
            "DropoutStates", "CUDNN_BATCHNORM_PER_ACTIVATION", "CUDNN_BATCHNORM_SPATIAL",
            "CUDNN_BATCHNORM_SPATIAL_PERSISTENT", "CUDNN_BATCHNORM_OPS_BN",
            "CUDNN_BATCHNORM_OPS_BN_ACTIVATION", "CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION"]


def _bn_module() -> Any:

    return batchnorm


def _bn_result(t: Tensor, like: Any) -> Any:
    """``t`` as the kind of array ``like`` is: a CuPy array for CuPy input (no copy)."""
    if type(like).__module__.split(".")[0] in ("cupy", "cupy_backends"):
        import cupy

        return cupy.asarray(t)
    return t


def _bn_copy(src: Tensor, dst: Tensor, stream: int) -> None:
    """``dst = src`` (any strides; dtypes converted) through cudnnTransformTensor."""

    def as3(t: Tensor) -> Tensor:
        pad = max(0, 3 - t.ndim)
        return tensor_from_pointer(t.ptr, (1,) * pad + t.shape, t.dtype,
                                   strides=(t.size or 1,) * pad + t.strides, device=t.device,
                                   owner=t)

    if src.size:
        transform(get_handle(src.device, stream), as3(src), as3(dst))


def _bn_new(shape: tuple[int, ...], dtype: Any, like: Tensor, stream: int) -> Tensor:

    return empty(shape, dtype, device=like.device, stream=stream)


def _bn_data(x: Any, is_for_conv2d: Any, d_layout: Any, stream: int,
             name: str = "x") -> tuple[Tensor, tuple[int, ...]]:
    """(the data as pycudnn's (N, C, ...) view, the array's own shape). With ``is_for_conv2d``
    the array is (N, C, ...) ((N, H, W, C) for NHWC); without, the last axis holds the channels
    and the others are one batch axis, as CuPy 13 described it to cuDNN."""
    t = as_tensor(x, stream=stream)
    if is_for_conv2d:
        return _data_view(t, _layout(d_layout, "d_layout"), stream), t.shape
    if t.ndim < 1:
        raise ValueError(f"{name}: expected an array with the channels on its last axis, got a "
                         f"0-d array")
    c = t.shape[-1]
    rows = t.size // c if c else 0
    if t.ndim == 2:
        return t, t.shape
    if not t.is_contiguous():
        tmp = _bn_new(t.shape, t.dtype, t, stream)
        _bn_copy(t, tmp, stream)
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
            flat = _bn_new((t.size,), t.dtype, t, stream)
            _bn_copy(t, tensor_from_pointer(flat.ptr, t.shape, t.dtype, device=t.device,
                                            owner=flat), stream)
            if t.dtype == dtype:
                return flat, t  # written back like a converted copy
    if flat.dtype == dtype:
        return flat, None
    conv = _bn_new((t.size,), dtype, t, stream)
    _bn_copy(flat, conv, stream)
    return conv, t


def _bn_param_dtype(x: Tensor) -> Any:

    return np.dtype(np.float64) if x.dtype.name == "float64" else np.dtype(np.float32)


def _bn_write_back(tmp: Tensor, original: Tensor, stream: int) -> None:
    _bn_copy(tensor_from_pointer(tmp.ptr, original.shape, tmp.dtype, device=tmp.device,
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
    bn = _bn_module()
    s = _stream_of(x)
    xv, shape = _bn_data(_input(x, s), is_for_conv2d, d_layout, s)
    pdt = _bn_param_dtype(xv)
    g, _ = _bn_param(_input(gamma, s), pdt, s)
    b, _ = _bn_param(_input(beta, s), pdt, s)
    rm, rm_orig = _bn_param(running_mean, pdt, s)
    rv, rv_orig = _bn_param(running_var, pdt, s)
    sm = si = sm_orig = si_orig = None
    if mean is not None:
        # a float16 or non-contiguous multi-dim mean / inv_std is computed into a converted
        # copy: written back below, as the running statistics are (CuPy 13 wrote them)
        sm, sm_orig = _bn_param(mean, pdt, s)
        si, si_orig = _bn_param(inv_std, pdt, s)
    y = _bn_new(shape, xv.dtype, xv, s)
    yv, _ = _bn_data(y, is_for_conv2d, d_layout, s, "y")
    result = bn.batch_norm_forward_training(
        xv, g, b, rm, rv, momentum=1.0 - float(decay), eps=eps, mode=int(cudnn_mode), out=yv,
        save_mean=sm, save_invstd=si, stream=s)
    for tmp, orig in ((rm, rm_orig), (rv, rv_orig), (sm, sm_orig), (si, si_orig)):
        if tmp is not None and orig is not None:
            _bn_write_back(tmp, orig, s)
    _bn_debug(debug, cudnn_mode, xv.device, s)
    if mean is not None:
        return result.reserve, _bn_result(y, x)
    g_shape = as_tensor(gamma, stream=s).shape  # CuPy 13 shaped them like gamma
    saved = [tensor_from_pointer(t.ptr, g_shape, t.dtype, device=t.device, owner=t)
             for t in result[1:]]
    return (result.reserve, _bn_result(y, x), _bn_result(saved[0], x), _bn_result(saved[1], x))


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
    `batch_normalization_forward_training`, with the reserve space first in the result:
    ``(reserve_space, y)`` or ``(reserve_space, y, mean, inv_std)``. ``reserve_space`` is None
    unless cuDNN asked for one (its NHWC persistent kernels); pass it to
    `batch_normalization_backward`.

    Args:
        x: as in batch_normalization_forward_training.
        gamma: scale.
        beta: shift.
        running_mean: updated in place.
        running_var: updated in place.
        mean: None, or an array to receive the batch mean.
        inv_std: None, or an array to receive ``1 / sqrt(var + eps)``.
        eps: added to the variance.
        decay: the weight of the running value in the update.
        is_for_conv2d: whether x is (N, C, ...) data (else channels last).
        cudnn_mode: a ``CUDNN_BATCHNORM_*`` mode.
        debug: check for an overflow after SPATIAL_PERSISTENT.
        d_layout: ``CUDNN_TENSOR_NCHW`` or ``CUDNN_TENSOR_NHWC``.
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
    bn = _bn_module()
    s = _stream_of(x)
    xv, shape = _bn_data(_input(x, s), is_for_conv2d, d_layout, s)
    pdt = _bn_param_dtype(xv)
    g, b = _bn_param(_input(gamma, s), pdt, s)[0], _bn_param(_input(beta, s), pdt, s)[0]
    m, v = _bn_param(_input(mean, s), pdt, s)[0], _bn_param(_input(var, s), pdt, s)[0]
    y = _bn_new(shape, xv.dtype, xv, s)
    yv, _ = _bn_data(y, is_for_conv2d, d_layout, s, "y")
    bn.batch_norm_forward_inference(xv, g, b, m, v, eps=eps, mode=int(cudnn_mode), out=yv,
                                    stream=s)
    return _bn_result(y, x)


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
    bn = _bn_module()
    s = _stream_of(x)
    xv, shape = _bn_data(_input(x, s), is_for_conv2d, d_layout, s)
    gyv, _ = _bn_data(_input(gy, s), is_for_conv2d, d_layout, s, "gy")
    pdt = _bn_param_dtype(xv)
    g, g_orig = _bn_param(_input(gamma, s), pdt, s)
    m, v = _bn_param(_input(mean, s), pdt, s)[0], _bn_param(_input(inv_std, s), pdt, s)[0]
    gx = _bn_new(shape, xv.dtype, xv, s)
    gxv, _ = _bn_data(gx, is_for_conv2d, d_layout, s, "gx")
    _, dg, db = bn.batch_norm_backward(xv, gyv, g, m, v, eps=eps, mode=int(cudnn_mode), out=gxv,
                                       reserve=reserve_space, stream=s)
    _bn_debug(debug, cudnn_mode, xv.device, s)
    g_t = as_tensor(gamma, stream=s)
    # CuPy 13: cuDNN's parameter dtype, or x's where gamma came in another dtype
    g_dtype = pdt if g_t.dtype == pdt else xv.dtype
    outs = []
    for d in (dg, db):
        r = _bn_new(g_t.shape, g_dtype, g_t, s)
        _bn_write_back(d, r, s)
        outs.append(_bn_result(r, x))
    return _bn_result(gx, x), outs[0], outs[1]


class DropoutStates:
    """CuPy 13's ``cupyx.cudnn.DropoutStates``: cuDNN's dropout state, seeded.

    ``handle`` is accepted for compatibility and not used (pycudnn keeps one cuDNN handle per
    thread and device). The dropout ratio is given with each call, as in CuPy; a new ratio keeps
    the random state (no re-initialisation). Built on
    `pycudnn.ops.dropout.DropoutState`.

    Args:
        handle: ignored (CuPy 13's cuDNN handle, or None).
        seed: the random seed.
    """

    def __init__(self, handle: Any, seed: int) -> None:

        self._state = DropoutState(0.0, seed)

    def set_dropout_ratio(self, dropout_ratio: float) -> None:
        """The probability of dropping an element for the next calls."""
        self._state.p = dropout_ratio

    def forward(self, handle: Any, x: Any, dropout_ratio: float) -> tuple[Any, Any]:
        """``(reserve_space, y)``: ``y`` is ``x`` with elements dropped with probability
        ``dropout_ratio`` and the others scaled by ``1 / (1 - dropout_ratio)``, a new array;
        ``reserve_space`` holds the mask for `backward`."""

        self._state.p = dropout_ratio
        s = _stream_of(x)
        xv = _input(x, s)
        y = _bn_new(xv.shape, xv.dtype, xv, s)
        _, reserve = dropout_forward(xv, self._state, out=y, stream=s)
        return reserve, _bn_result(y, x)

    def backward(self, handle: Any, dy: Any, dropout_ratio: float, reserve_space: Any) -> Any:
        """``dx``: ``dy`` through the mask of the `forward` call that returned
        ``reserve_space``, scaled as that call scaled (its ratio), a new array."""

        self._state.p = dropout_ratio
        s = _stream_of(dy)
        dyv = _input(dy, s)
        dx = _bn_new(dyv.shape, dyv.dtype, dyv, s)
        dropout_backward(dyv, self._state, reserve_space, out=dx, stream=s)
        return _bn_result(dx, dy)
