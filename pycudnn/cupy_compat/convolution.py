"""CuPy 13's ``cupyx.cudnn`` convolutions: `convolution_forward`, `convolution_backward_data`,
`convolution_backward_filter` (results written into the caller's array, an optional bias added)
mapped onto pycudnn's public functions, and the workspace bound (`set_max_workspace_size`)."""

from __future__ import annotations

import numbers
from typing import Any, Sequence

import numpy as np

from ..api import conv as _conv
from ..runtime.tensor import Tensor, as_tensor, tensor_from_pointer
from ..runtime.tensor.geometry import conv_output_size
from .arrays import (CUDNN_TENSOR_NCHW, check_layout, data_view, filter_view,
                     input_view, stream_of)


__all__ = ["convolution_forward", "convolution_backward_data", "convolution_backward_filter",
           "get_max_workspace_size", "set_max_workspace_size", "UNBOUNDED_WORKSPACE"]


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


def _prologue(x: Any, pad: Any, stride: Any, dilation: Any, d_layout: Any, w_layout: Any,
              auto_tune: Any, tensor_core: Any, deterministic: Any = False
              ) -> tuple[dict[str, Any], int, int, tuple[tuple[int, ...], ...], int]:
    """What every convolution here checks first, in CuPy's order: the flags, the layouts, the
    geometry; then the stream of ``x``. Returns ``(flags, d, w, (pad, stride, dilation), s)``."""
    flags = _flags(auto_tune, tensor_core, deterministic)
    d, w = check_layout(d_layout, "d_layout"), check_layout(w_layout, "w_layout")
    geometry = _geometry(pad, stride, dilation)
    return flags, d, w, geometry, stream_of(x)


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
    flags, d, w, (pad_t, stride_t, dil_t), s = _prologue(
        x, pad, stride, dilation, d_layout, w_layout, auto_tune, tensor_core)
    xv, yv = data_view(input_view(x, s), d, s), data_view(y, d, s)
    wv = filter_view(input_view(W, s), w, s)
    bv = _bias_view(None if b is None else input_view(b, s), s)
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
        pad, stride, dilation, groups, auto_tune, tensor_core, w_layout: as in
            `convolution_forward`.
        deterministic: only deterministic algorithms.
        d_layout: layout of ``x`` and ``y``.
    """
    flags, d, w, (pad_t, stride_t, dil_t), s = _prologue(
        x, pad, stride, dilation, d_layout, w_layout, auto_tune, tensor_core, deterministic)
    gyv, gxv = data_view(input_view(x, s), d, s), data_view(y, d, s)
    wv = filter_view(input_view(W, s), w, s)
    bv = _bias_view(None if b is None else input_view(b, s), s)
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
    expected = conv_output_size(gxv.shape[2:], wv.shape[2:], stride_t, pad_t, dil_t)
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
        pad, stride, dilation, groups, auto_tune, tensor_core: as in `convolution_forward`.
        deterministic: only deterministic algorithms.
        d_layout: layout of ``x`` and ``gy``.
        w_layout: layout of ``gW``.
    """
    flags, d, w, (pad_t, stride_t, dil_t), s = _prologue(
        x, pad, stride, dilation, d_layout, w_layout, auto_tune, tensor_core, deterministic)
    xv, gyv = data_view(input_view(x, s), d, s), data_view(input_view(gy, s), d, s)
    gwv = filter_view(gW, w, s)
    _conv.convolution_backward_filter(xv, gyv, gwv.shape, stride=stride_t, padding=pad_t,
                                      dilation=dil_t, groups=groups, out=gwv, stream=s, **flags)
