"""Drop-in replacements for CuPy 13's ``cupyx.cudnn`` convolution functions.

CuPy 14 removed ``cupyx.cudnn``. Code written for CuPy 13 keeps working by changing one import::

    from cupyx import cudnn                      # CuPy <= 13
    from pycudnn import cupy_compat as cudnn     # CuPy 14 + pycudnn

The three functions keep CuPy 13's names, positional parameters, keyword-only parameters and
defaults, and its semantics: the result is written into the preallocated array the caller passes
(``y``, or ``gW``), an optional bias ``b`` (one value per channel) is added, and nothing is
returned. They run on CuPy's current stream (more precisely: the current stream of the framework
the data array comes from, see
[`pycudnn.current_stream()`][pycudnn.runtime.interop.current_stream]), and accept any array pycudnn
accepts (CuPy, PyTorch, Numba, [`pycudnn.Tensor`][pycudnn.runtime.tensor.Tensor]), without copies.

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
13 copied inputs and refused non-contiguous outputs), bfloat16 works, and errors are Python
exceptions naming the bad argument (``ValueError`` / ``TypeError``) instead of assertion errors or
cuDNN status errors.
"""

from __future__ import annotations

from typing import Any, Sequence

from .api import conv as _conv
from .runtime.tensor import Tensor, as_tensor, tensor_from_pointer

__all__ = ["convolution_forward", "convolution_backward_data", "convolution_backward_filter",
           "get_max_workspace_size", "set_max_workspace_size", "CUDNN_TENSOR_NCHW",
           "CUDNN_TENSOR_NHWC"]

CUDNN_TENSOR_NCHW = 0
"""``cudnnTensorFormat_t`` channels-first, as ``cupy.cuda.cudnn.CUDNN_TENSOR_NCHW``."""
CUDNN_TENSOR_NHWC = 1
"""``cudnnTensorFormat_t`` channels-last, as ``cupy.cuda.cudnn.CUDNN_TENSOR_NHWC``: data arrays
shaped ``(N, H, W, C)``, filters ``(K, R, S, C)``."""

_LAYOUT_NAMES = {CUDNN_TENSOR_NCHW: "CUDNN_TENSOR_NCHW", CUDNN_TENSOR_NHWC: "CUDNN_TENSOR_NHWC"}
_TENSOR_CORE_MODES = ("always", "auto", "never")

_max_workspace_size: int | None = None


def get_max_workspace_size() -> int | None:
    """The workspace bound set by `set_max_workspace_size()`, in bytes.

    ``None`` (the default) means no bound beyond the device's free memory; CuPy 13's default was
    8 MiB.
    """
    return _max_workspace_size


def set_max_workspace_size(size: int | None) -> None:
    """Bound the workspace the functions of this module may use (bytes; ``None``: no bound).

    Only this module's functions are affected; pycudnn's own functions take
    ``workspace_limit=`` (or [`pycudnn.config`][pycudnn.configuration.config]).
    """
    global _max_workspace_size
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise ValueError(f"set_max_workspace_size: expected None or a non-negative int, got {size!r}")
    _max_workspace_size = size


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


def _stream_of(arr: Any) -> int:
    from .runtime.interop import current_stream

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
    xv, yv = _data_view(x, d, s), _data_view(y, d, s)
    wv = _filter_view(W, w, s)
    bv = _bias_view(b, s)
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
    gyv, gxv = _data_view(x, d, s), _data_view(y, d, s)
    wv = _filter_view(W, w, s)
    bv = _bias_view(b, s)
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
    xv, gyv = _data_view(x, d, s), _data_view(gy, d, s)
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
    if isinstance(value, bool) or not isinstance(value, int) or value not in table:
        choices = ", ".join(f"{v} ({n})" for v, n in table.items())
        raise ValueError(f"{fn}: {name} must be a {c_type} value, one of {choices}, but got "
                         f"{name}={value!r}")
    return table[value]


def _activation_mode(mode: Any, coef: Any, fn: str) -> str:
    """The pycudnn name of an activation mode, ``coef`` checked (before anything is allocated)."""
    from .ops import activation as _act
    from .ops._common import check_coef

    name = _constant(mode, "mode", _ACTIVATION_NAMES, "cudnnActivationMode_t", fn)
    _act._check_mode(name, fn)
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
    from .tensor import empty

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
    from .ops._common import staged
    from .handle import get_handle
    from .tensor import contiguous_strides

    pad = max(0, 3 - t.ndim)  # tensor descriptors take 3 to 8 dims
    v = tensor_from_pointer(t.ptr, t.shape + (1,) * pad, t.dtype, strides=t.strides + (1,) * pad,
                            device=t.device, owner=t)
    copy = staged(get_handle(t.device, stream), v, contiguous_strides(v.shape), stream)
    return tensor_from_pointer(copy.ptr, t.shape, t.dtype, device=t.device, owner=copy)


def _activation_views(fn: str, *named: tuple[str, Tensor]) -> list[Tensor]:
    """The tensors as cuDNN takes them: as they are up to 5 dims, else C-contiguous ones as 4-D
    ``(n, size / n, 1, 1)``, CuPy 13's view."""
    ts = [t for _, t in named]
    if all(t.ndim <= 5 for t in ts):
        return ts
    out = []
    for name, t in named:
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
    from .ops import activation as _act
    from ._types import NanPropagation

    fn = "activation_forward"
    name = _activation_mode(mode, coef, fn)
    s = _stream_of(x)
    xt = as_tensor(x, stream=s)
    result, yt = _new_result(x, xt, xt.shape, s)
    xv, yv = _activation_views(fn, ("x", xt), ("y", yt))
    _act._forward(xv, name, coef, yv, s, NanPropagation.NOT_PROPAGATE_NAN, fn)
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
    from .ops import activation as _act
    from ._types import NanPropagation

    fn = "activation_backward"
    name = _activation_mode(mode, coef, fn)
    s = _stream_of(x)
    xt, yt, gyt = as_tensor(x, stream=s), as_tensor(y, stream=s), as_tensor(gy, stream=s)
    for t, n in ((yt, "y"), (gyt, "gy")):
        if t.shape != xt.shape:
            raise ValueError(f"{fn}: expected {n} of size {list(xt.shape)} (the shape of x), but "
                             f"got {n} of size {list(t.shape)}")
    result, gxt = _new_result(x, xt, xt.shape, s)
    xv, yv, gyv, gxv = _activation_views(fn, ("x", xt), ("y", yt), ("gy", gyt), ("gx", gxt))
    _act._backward(yv, gyv, xv, name, coef, gxv, s, NanPropagation.NOT_PROPAGATE_NAN, fn)
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
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"{fn}: axis must be an int, but got {type(axis).__name__} {axis!r}")
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
    from .ops import softmax as _softmax

    fn = "softmax_forward"
    algo = _constant(algorithm, "algorithm", _SOFTMAX_NAMES, "cudnnSoftmaxAlgorithm_t", fn)
    s = _stream_of(x)
    xt = as_tensor(x, stream=s)
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
    from .ops import softmax as _softmax

    fn = "softmax_backward"
    algo = _constant(algorithm, "algorithm", _SOFTMAX_NAMES, "cudnnSoftmaxAlgorithm_t", fn)
    s = _stream_of(y)
    yt, gyt = as_tensor(y, stream=s), as_tensor(gy, stream=s)
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


def pooling_forward(x: Any, y: Any, ksize: Sequence[int], stride: Sequence[int],
                    pad: Sequence[int], mode: int) -> Any:
    """Pooling of ``x`` into the preallocated ``y``: CuPy 13's ``cupyx.cudnn.pooling_forward``.

    Args:
        x: ``(N, C, H, W)`` or ``(N, C, D, H, W)``, any strides.
        y: the preallocated, C-contiguous output ``(N, C, *out)`` with
            ``out = (i + 2 * pad - ksize) // stride + 1``; overwritten.
        ksize: the window, one int per spatial dim.
        stride: one int per spatial dim.
        pad: one int per spatial dim, smaller than ``ksize`` (every window holds an input
            element).
        mode: a ``CUDNN_POOLING_*`` constant.

    Returns:
        ``y``.
    """
    from .ops import pooling as _pooling
    from ._types import NanPropagation

    fn = "pooling_forward"
    s = _stream_of(x)
    xt, yt = as_tensor(x, stream=s), as_tensor(y, stream=s)
    k, st, p, name = _pooling_args(xt, ksize, stride, pad, mode, fn)
    if not yt.is_contiguous():
        raise ValueError(f"{fn}: pooling_forward supports c-contiguous y only, but got y with "
                         f"strides {list(yt.strides)} (in elements) for size {list(yt.shape)}")
    if xt.ndim in (4, 5) and len(k) == xt.ndim - 2 and all(
            isinstance(v, int) and v > 0 for v in k + st):
        expected = xt.shape[:2] + _pooling.output_size(xt.shape[2:], k, st, p)
        if yt.shape != expected and min(expected) > 0:
            raise ValueError(f"{fn}: expected y of size {list(expected)} for x {list(xt.shape)}, "
                             f"ksize={k}, stride={st}, pad={p}, but got y of size "
                             f"{list(yt.shape)}")
    _pooling._forward(xt, k, st, p, name, yt, s, NanPropagation.NOT_PROPAGATE_NAN, "window", fn,
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
    from .ops import pooling as _pooling
    from ._types import NanPropagation

    fn = "pooling_backward"
    s = _stream_of(x)
    xt, yt, gyt = as_tensor(x, stream=s), as_tensor(y, stream=s), as_tensor(gy, stream=s)
    k, st, p, name = _pooling_args(xt, ksize, stride, pad, mode, fn)
    if yt.shape != gyt.shape:
        raise ValueError(f"{fn}: expected gy of size {list(yt.shape)} (the shape of y), but got "
                         f"gy of size {list(gyt.shape)}")
    result, gxt = _new_result(x, xt, xt.shape, s)
    _pooling._backward(yt, gyt, xt, k, st, p, name, gxt, s, NanPropagation.NOT_PROPAGATE_NAN,
                       "window", fn)
    return result
