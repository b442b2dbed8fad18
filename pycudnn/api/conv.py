"""The public convolution functions and `prepare_convolution`.

Every function takes one call path (`_call`): its tensors converted, its call signature built,
the remembered `PreparedConvolution` of that signature launched when there is one (the hot
path), else its full path: the arguments checked (`api/arguments.py`), one
`ConvolutionCall` run (`api/call.py`: memory format, staging, batch pieces, the search) and
what it prepared remembered. 1-D convolutions run as 2-D ones of unit height; the transposed
convolution is a backward data. How the search is done is not this module's business.

Nothing is launched before every argument has been checked, so bad input leaves the caller's
buffers untouched.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..configuration import ConvolutionFlags, Unpack, config, override_token
from ..cudnn.tensor_ops import add_bias, add_tensor, relu_, transform
from ..cudnn.tensor_ops import fill_zero
from ..engines.problem import EpilogueKind
from ..runtime.handle import get_handle
from ..runtime.memory import devices as _devices
from ..runtime.memory import StreamLike, callers_device, resolve_stream, restore_device, stream_pair
from ..runtime.tensor import Tensor, TensorLike, as_tensor, empty, spans_overlap, tensor_from_pointer, zeros
from ..runtime.tensor.checks import check_bias as _check_bias
from ..runtime.tensor.checks import check_pair as _check_pair
from ..runtime.tensor.checks import check_z as _check_z
from . import prepared as _prepared
from .arguments import (activation_arg, check_channels, check_grad_y, check_output_positive,
                        check_rank, check_sample_size, geometry_args, groups_arg, shape_arg,
                        spatial_arg, string_padding, suggest_memory_format)
from .call import ConvolutionCall, contiguous_bias_for, prepare_call, zero_bias
from .call import output as _output
from .prepared import PreparedConvolution


__all__ = ["convolution", "conv_transpose", "convolution_backward_data",
           "convolution_backward_filter", "convolution_add_relu", "prepare_convolution",
           "convolution_and_prepared", "convolution_add_relu_and_prepared",
           "backward_data_and_prepared", "backward_filter_and_prepared"]

_CONV_NAMES = {3: "conv1d", 4: "conv2d", 5: "conv3d"}

def _flags(given: Mapping[str, Any]) -> dict[str, Any]:
    return config.resolve(given)


# ---- the one call path ----------------------------------------------------------------------------
# A public function names its op, its two inputs (a, b), its optional residual z and bias, its
# other arguments as one tuple (``geometry``, part of the call signature as given) and its full
# path, which takes ``(a, b, z, bias, geometry, out, stream, flags)`` with a and b as Tensors and
# returns ``(result, PreparedConvolution | None)``.

FullPath = Callable[[Tensor, Tensor, Any, Any, Any, Any, Any, Mapping[str, Any]],
                    "tuple[Tensor, PreparedConvolution | None]"]

#: ``dict.get`` of the remembered calls (TypeError for an unhashable signature)
_fast_get = _prepared.lookup_remembered
# Every call signature ends with the flags part of Config.token(), spelt out in the key (one
# tuple and one call less per call): ``config.generation, _override_get(), tuple(flags.items())
# if flags else None``. Keyword order is kept as given: one call site always passes the same
# order, and another order is only another (equally valid) entry.
_override_get = override_token.get  # bound once: read on every call
#: where ``geometry`` sits in a call signature (`_call` builds the tuple)
_GEOMETRY_AT = 11


def _listless(geometry: tuple[Any, ...]) -> tuple[Any, ...]:
    """``geometry`` with each list (``stride=[1, 1]``...) as a tuple: the same call, hashable."""
    return tuple(tuple(g) if type(g) is list else g for g in geometry)


def _call(op: str, a: Any, b: Any, z: Any, bias: Any, geometry: tuple[Any, ...], out: Any,
          stream: Any, flags: Mapping[str, Any],
          full: FullPath) -> "tuple[Tensor, PreparedConvolution | None]":
    """Run ``op`` on these arguments: the remembered launch of its call signature where there
    is one and ``out`` can be written as is, else ``full``; returns ``(result, prepared)``."""
    # the caller's current device, given back at the end (one device: nothing to give back)
    prev = None if _devices.visible_devices == 1 else callers_device()
    try:
        if type(a) is not Tensor:
            a = as_tensor(a, stream=stream)
        if type(b) is not Tensor:
            b = as_tensor(b, stream=stream)
        if z is not None and type(z) is not Tensor:
            z = as_tensor(z, stream=stream)
        if bias is not None and type(bias) is not Tensor:
            bias = as_tensor(bias, stream=stream)
        key: tuple[Any, ...] = (
            op, a.shape, a.strides, a.dtype, a.device, b.shape, b.strides, b.dtype, b.device,
            None if z is None else (z.shape, z.strides, z.dtype, z.device),
            None if bias is None else (bias.shape, bias.strides, bias.dtype, bias.device),
            geometry, config.generation, _override_get(), tuple(flags.items()) if flags else None)
        # the hot path: the lookup, the out test and the stream inlined
        try:
            prepared = _fast_get(key)
        except TypeError:  # an unhashable argument: a list for stride... keys as its tuple
            key = key[:_GEOMETRY_AT] + (_listless(geometry),) + key[_GEOMETRY_AT + 1:]
            try:
                prepared = _fast_get(key)
            except TypeError:  # something else unhashable: the full path, nothing remembered
                prepared = None
        if prepared is not None:
            o = out
            if o is not None:
                lean = None
                if o.__class__ is prepared._torch_out_class and z is None and bias is None:
                    # a torch out= of the layout accepted before: its own lean test (no as_tensor)
                    lean = prepared._lean_torch_out(o)
                    if lean is not None and prepared.out_may_overlap(lean, a, b):
                        o = False  # the full path refuses it with its message
                if lean is not None and o is not False:
                    o = lean
                elif o is not False:
                    o = prepared.matching_out(o, a, b, bias, z, stream)
            if o is not False:
                s, stream_ref = (0, None) if stream is None else stream_pair(stream)
                # the key matched a, b, z and bias: launch without re-checking them
                return prepared._run(a, b, o, z, bias, s, stream_ref), prepared
        result, prepared = full(a, b, z, bias, geometry, out, stream, flags)
        if prepared is not None:
            _remember(key, prepared, op, geometry, flags, full)
        return result, prepared
    finally:
        if prev is not None:
            restore_device(prev)


def _remember(key: tuple[Any, ...], prepared: PreparedConvolution, op: str,
              geometry: tuple[Any, ...], flags: Mapping[str, Any], full: FullPath) -> None:
    """Keep ``prepared`` for ``key``; a launch of it that fails forgets it and takes the call
    path again with the same arguments (the full path, with its fallbacks)."""

    def fallback(a: Tensor, b: Tensor, out: Any, z: Any = None, bias: Any = None,
                 stream: Any = None) -> Tensor:
        _prepared.forget(key)  # never this entry again: the full path re-prepares
        return _call(op, a, b, z, bias, geometry, out, stream, flags, full)[0]

    prepared.fallback = fallback
    _prepared.remember(key, prepared)


class PrepareKeywords(ConvolutionFlags, total=False):
    """The keyword arguments of `prepare_convolution()`: those of the function its
    ``direction`` names, and that function's flags."""

    stride: int | Sequence[int]
    padding: int | Sequence[int] | str
    dilation: int | Sequence[int]
    groups: int
    activation: str | None
    out: TensorLike | None
    stream: StreamLike | None
    input_shape: Sequence[int]
    weight_shape: Sequence[int]


# ---- public API -----------------------------------------------------------------------------------

def convolution(x: TensorLike, w: TensorLike, bias: TensorLike | None = None, *,
                stride: int | Sequence[int] = 1, padding: int | Sequence[int] | str = 0,
                dilation: int | Sequence[int] = 1, groups: int = 1, activation: str | None = None,
                out: TensorLike | None = None, stream: StreamLike | None = None,
                **flags: Unpack[ConvolutionFlags]) -> Tensor:
    """Convolution (cross-correlation, as PyTorch's ``conv1d/2d/3d``) on device memory.

    Args:
        x: input ``(N, C, *spatial)``, anything `pycudnn.as_tensor()`
            accepts (1 to 3 spatial dims).
        w: weight ``(K, C/groups, *kernel)``.
        bias: optional ``(K,)``, added to the output.
        stride: the step between output positions: an int or one int per spatial dim.
        padding: zeros added on both sides of each spatial dim: an int or one int per spatial
            dim; or PyTorch's ``"valid"`` (none) or ``"same"`` (stride 1: the output has the
            input's size; an odd total ``dilation * (kernel - 1)`` puts the extra zero after
            the input, on a padded copy, as PyTorch does).
        dilation: the spacing between kernel elements: an int or one int per spatial dim.
        groups: number of channel groups.
        activation: ``None`` or ``"relu"`` (applied after the bias). The graph engine fuses
            bias and activation into the convolution when an engine takes the graph.
        out: optional output tensor of the right shape, dtype and device (any strides).
        stream: the CUDA stream to run on, anything `StreamLike` names (an int handle, a
            cuda.core, PyTorch or CuPy stream, an object with ``__cuda_stream__``); default the
            legacy default stream.
        **flags: `ConvolutionFlags`: ``benchmark``, ``deterministic``, ``allow_tf32``,
            ``workspace_limit``, ``engine``, ``benchmark_limit``, ``tuning_db``; defaults from
            `pycudnn.config`.

    Returns:
        The output ``(N, K, *out_spatial)`` as a `pycudnn.Tensor`,
            ``out`` itself when it is given.
    """
    return _call("forward", x, w, None, bias, (stride, padding, dilation, groups, activation), out,
                 stream, flags, _convolution)[0]


def _convolution(x: Tensor, w: Tensor, _z: None, bias: Tensor | None, geometry: tuple[Any, ...],
                 out: Any, stream: Any, flags: Mapping[str, Any],
                 reads_also: Tensor | None = None) -> "tuple[Tensor, PreparedConvolution | None]":
    """The full path of `convolution()`: (output, what it prepared)."""
    stride, padding, dilation, groups, activation = geometry
    fn = _CONV_NAMES.get(x.ndim, "convolution")
    nd = check_rank(x, "input", fn)
    _check_pair(x, "input", w, "weight")
    extra: tuple[int, ...] = ()
    if isinstance(padding, str):
        stride_t, _, dilation_t = geometry_args(stride, 0, dilation, nd)
        padding_t, extra = string_padding(padding, stride_t, dilation_t, w.shape[2:], fn)
    else:
        stride_t, padding_t, dilation_t = geometry_args(stride, padding, dilation, nd)
    groups = groups_arg(groups)
    check_channels(x.shape, w.shape, groups, fn)
    if any(extra):
        # an odd total: PyTorch pads the input's far side with one zero, then pads symmetrically.
        # Everything is checked before the padded copy is made
        padded = x.shape[:2] + tuple(i + e for i, e in zip(x.shape[2:], extra))
        spatial = check_output_positive(padded, w.shape[2:], stride_t, padding_t, dilation_t, fn)
        b = _check_bias(bias, w.shape[0], x) if bias is not None else None
        activation_arg(activation)
        _flags(flags)
        fmt = suggest_memory_format(x, w)
        if out is not None:
            _output(out, (x.shape[0], w.shape[0]) + spatial, x, fmt, 0,
                    reads=(("input", x), ("weight", w), ("bias", b)), fn=fn)
        x_given = x
        x = _padded_input(x, extra, fmt, resolve_stream(stream))
        y, _ = _convolution(x, w, None, bias, (stride_t, padding_t, dilation_t, groups, activation),
                            out, stream, flags, reads_also=x_given)
        return y, None  # a padded copy each call: not replayable as one launch
    spatial = check_output_positive(x.shape, w.shape[2:], stride_t, padding_t, dilation_t, fn)
    b = _check_bias(bias, w.shape[0], x) if bias is not None else None
    relu = activation_arg(activation)
    f = _flags(flags)
    check_sample_size(fn, x.shape, (x.shape[0], w.shape[0]) + spatial)
    call = ConvolutionCall(fn, "forward", x, w, None, stride_t, padding_t, dilation_t, groups, f, stream)
    y = _output(out, (x.shape[0], w.shape[0]) + spatial, x, call.fmt, call.stream,
                reads=(("input", x if reads_also is None else reads_also), ("weight", w),
                       ("bias", b)), fn=fn)
    call.y = y
    y, fused_all = _forward_with_epilogue(call, y, b, relu)
    return y, (prepare_call(call) if fused_all else None)


def _forward_with_epilogue(call: ConvolutionCall, y: Tensor, b: Tensor | None, relu: bool) -> tuple[Tensor, bool]:
    """conv (+ bias) (+ relu) into y: one fused graph where the engine takes it, else steps.

    Returns y and whether everything ran in the convolution itself (no separate step)."""
    assert call.x is not None  # forward: the input is given
    if call.x.size == 0 or y.size == 0:
        fill_zero(y, call.stream)
        if b is not None and y.size:
            add_bias(call.handle, y, b)
        if relu and y.size:
            relu_(call.handle, y)
        return y, False
    if (b is not None or relu) and call.engine.supports(EpilogueKind.BIAS_RELU if relu else EpilogueKind.BIAS):
        b_fused = zero_bias(call, y.shape[1], y) if b is None else contiguous_bias_for(b, call.stream, call)
        call.epilogue, call.bias = ("bias_relu" if relu else "bias"), b_fused
        if call.run_fused():
            return y, b is not None  # a made-up zero bias cannot be replayed by a prepared call
        call.epilogue, call.bias = "", None
        call.pieces.clear()
    call.run()
    if b is not None:
        add_bias(call.handle, y, b)
    if relu:
        relu_(call.handle, y)
    return y, b is None and not relu


def conv_transpose(x: TensorLike, w: TensorLike, bias: TensorLike | None = None, *,
                   stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
                   output_padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1,
                   groups: int = 1, activation: str | None = None, out: TensorLike | None = None,
                   stream: StreamLike | None = None, **flags: Unpack[ConvolutionFlags]) -> Tensor:
    """Transposed convolution (PyTorch's ``conv_transpose1d/2d/3d``): the gradient of a
    convolution with respect to its input.

    ``w`` is ``(C, K/groups, *kernel)``; the output is ``(N, K, *o)`` with
    ``o = (i - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1``.
    ``output_padding`` must be smaller than the stride or the dilation (PyTorch's rule); one
    at least the stride, which cuDNN has no output size for, is computed without padding and
    cropped (a temporary of the unpadded size; such a call is not replayed as one launch).
    """
    return _call("conv_transpose", x, w, None, bias,
                 (stride, padding, output_padding, dilation, groups, activation), out, stream,
                 flags, _transposed)[0]


def _transposed(x: Tensor, w: Tensor, _z: None, bias: Tensor | None, geometry: tuple[Any, ...],
                out: Any, stream: Any, flags: Mapping[str, Any]) -> "tuple[Tensor, PreparedConvolution | None]":
    """The full path of `conv_transpose()`: (output, what it prepared)."""
    stride, padding, output_padding, dilation, groups, activation = geometry
    fn = {3: "conv_transpose1d", 4: "conv_transpose2d", 5: "conv_transpose3d"}.get(x.ndim, "conv_transpose")
    nd = check_rank(x, "input", fn)
    _check_pair(x, "input", w, "weight")
    stride_t, padding_t, dilation_t = geometry_args(stride, padding, dilation, nd)
    output_padding_t = _output_padding(fn, output_padding, stride_t, dilation_t)
    # output_padding >= stride (but < dilation, as PyTorch allows): cuDNN's backward data has
    # no such output size; the call computes the unpadded transposed convolution and crops
    crop = any(op >= s for op, s in zip(output_padding_t, stride_t))
    groups_i = groups_arg(groups)
    if any(k < 1 for k in w.shape):
        raise ValueError(f"{fn}: expected weight of size {list(w.shape)} to have positive sizes "
                         f"(input channels, output channels per group, kernel)")
    if w.shape[0] != x.shape[1]:
        raise ValueError(f"{fn}: given weight of size {list(w.shape)}, expected input{list(x.shape)} to "
                         f"have {w.shape[0]} channels, but got {x.shape[1]} channels instead")
    if w.shape[0] % groups_i:
        raise ValueError(f"{fn}: expected weight of size {list(w.shape)} to have a first dim "
                         f"divisible by groups={groups_i}")
    k_out = w.shape[1] * groups_i
    spatial = tuple((i - 1) * s - 2 * p + d * (k - 1) + op + 1
                    for i, k, s, p, d, op in zip(x.shape[2:], w.shape[2:], stride_t, padding_t, dilation_t,
                                                 output_padding_t))
    if any(o < 1 for o in spatial):
        raise ValueError(f"{fn}: calculated output size {list(spatial)} is too small")
    b = _check_bias(bias, k_out, x) if bias is not None else None
    relu = activation_arg(activation)
    reads = (("input", x), ("weight", w), ("bias", b))
    if crop:
        y = _cropped_transpose(fn, x, w, (x.shape[0], k_out) + spatial, stride_t, padding_t,
                               dilation_t, groups_i, out, stream, flags, reads)
        call = None
    else:
        y, call = _backward_data(fn, x, w, (x.shape[0], k_out) + spatial, stride_t, padding_t,
                                 dilation_t, groups_i, out, stream, flags, reads=reads)
    if (b is not None or relu) and y.size:
        handle = get_handle(y.device, resolve_stream(stream))
        if b is not None:
            add_bias(handle, y, b)
        if relu:
            relu_(handle, y)
        return y, None  # separate epilogue steps: not replayable as one launch
    prepared = prepare_call(call) if call is not None else None
    return y, prepared


def _output_padding(fn: str, output_padding: Any, stride: tuple[int, ...],
                    dilation: tuple[int, ...]) -> tuple[int, ...]:
    """``output_padding`` as a tuple, checked as PyTorch checks it (smaller than the stride or
    the dilation, per dim), refused in PyTorch's words (its per-dim names)."""
    nd = len(stride)
    op = spatial_arg("output_padding", output_padding, nd, 0, "negative output_padding is not supported")
    if any(o >= s and o >= d for o, s, d in zip(op, stride, dilation)):
        names = ("depth", "height", "width")[3 - nd:]
        got = " ".join(f"{what}_{n}: {v}" for what, values in
                       (("output_padding", op), ("stride", stride), ("dilation", dilation))
                       for n, v in zip(names, values))
        raise ValueError(f"{fn}: output padding must be smaller than either stride or dilation, "
                         f"but got {got}")
    return op


def _window(t: Tensor, starts: Sequence[int], sizes: Sequence[int]) -> Tensor:
    """The view of ``t`` whose spatial dims start at ``starts`` with ``sizes`` (N and C whole)."""
    offset = sum(st * t.strides[2 + i] for i, st in enumerate(starts))
    return tensor_from_pointer(t.ptr + offset * t.dtype.itemsize, t.shape[:2] + tuple(sizes),
                               t.dtype, strides=t.strides, device=t.device, owner=t)


def _cropped_transpose(fn: str, x: Tensor, w: Tensor, shape: tuple[int, ...],
                       stride: tuple[int, ...], padding: tuple[int, ...],
                       dilation: tuple[int, ...], groups: int, out: Any, stream: Any,
                       flags: Mapping[str, Any], reads: Sequence[tuple[str, Tensor | None]]) -> Tensor:
    """A transposed convolution whose output_padding is at least its stride (PyTorch allows it
    below the dilation): the transposed convolution without padding, ``(i - 1) * stride +
    dilation * (kernel - 1) + 1`` per dim (a size cuDNN's backward data takes), cropped from
    ``padding`` on; the output positions past it receive no input element and are zero."""
    nd = len(stride)
    full = tuple((i - 1) * s + d * (k - 1) + 1
                 for i, k, s, d in zip(x.shape[2:], w.shape[2:], stride, dilation))
    tmp, _ = _backward_data(fn, x, w, shape[:2] + full, stride, (0,) * nd, dilation, groups,
                            None, stream, flags, reads=reads)
    s = resolve_stream(stream)
    y = _output(out, shape, x, suggest_memory_format(x, w), s, reads=reads)
    if y.size == 0:
        return y
    handle = get_handle(y.device, s)
    # a padding past the unpadded size (a kernel of size 1 in that dim) keeps nothing there:
    # the output is the bias alone
    kept = tuple(max(0, min(o, f - p)) for o, f, p in zip(shape[2:], full, padding))
    if kept != shape[2:]:
        fill_zero(y, s, handle)
    if 0 not in kept:
        transform(handle, _window(tmp, padding, kept), _window(y, (0,) * nd, kept))
    return y


def conv_transpose_backward_data(grad_y: TensorLike, w: TensorLike, input_shape: Sequence[int], *,
                                 stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
                                 output_padding: int | Sequence[int] = 0,
                                 dilation: int | Sequence[int] = 1, groups: int = 1,
                                 out: TensorLike | None = None, stream: StreamLike | None = None,
                                 **flags: Unpack[ConvolutionFlags]) -> Tensor:
    """Gradient of `conv_transpose` with respect to its input, of shape ``input_shape``: the
    convolution of ``grad_y`` with ``w`` (PyTorch's ``convolution_backward`` with
    ``transposed=True``).

    ``grad_y`` has the transposed convolution's output shape. Where ``output_padding`` is at
    least the stride (PyTorch allows it below the dilation), that convolution has
    ``output_padding // stride`` more positions per dim than the input; they are dropped.
    """
    fn = "conv_transpose_backward_data"
    if type(grad_y) is not Tensor:
        grad_y = as_tensor(grad_y, stream=stream)
    if type(w) is not Tensor:
        w = as_tensor(w, stream=stream)
    nd = check_rank(grad_y, "grad_y", fn)
    _check_pair(grad_y, "grad_y", w, "weight")
    input_shape_t = shape_arg("input_shape", input_shape, grad_y.ndim)
    geom, extra = _transposed_grad_geometry(fn, input_shape_t, w.shape, grad_y, "input_shape",
                                            stride, padding, output_padding, dilation, groups)
    st, pad, dil, g = geom
    if not any(extra):
        return convolution(grad_y, w, stride=st, padding=pad, dilation=dil, groups=g, out=out,
                           stream=stream, **flags)
    s = resolve_stream(stream)
    dx = _output(out, input_shape_t, grad_y, suggest_memory_format(grad_y, w), s,
                 reads=(("grad_y", grad_y), ("weight", w)))
    full = convolution(grad_y, w, stride=st, padding=pad, dilation=dil, groups=g, stream=stream,
                       **flags)
    if dx.size:
        transform(get_handle(dx.device, s), _window(full, (0,) * nd, input_shape_t[2:]), dx)
    return dx


def conv_transpose_backward_filter(x: TensorLike, grad_y: TensorLike, weight_shape: Sequence[int], *,
                                   stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
                                   output_padding: int | Sequence[int] = 0,
                                   dilation: int | Sequence[int] = 1, groups: int = 1,
                                   out: TensorLike | None = None, stream: StreamLike | None = None,
                                   **flags: Unpack[ConvolutionFlags]) -> Tensor:
    """Gradient of `conv_transpose` with respect to its weight, of shape ``weight_shape``
    (``(C_in, C_out/groups, *kernel)``): the backward filter of the convolution whose backward
    data the transposed convolution is, its roles swapped (``grad_y`` the input, ``x`` the
    output's gradient).

    Where ``output_padding`` is at least the stride, that convolution's output has
    ``output_padding // stride`` more positions per dim than ``x``: ``x`` is extended with zeros
    there (positions no input element occupies contribute nothing), as PyTorch computes it.
    """
    fn = "conv_transpose_backward_filter"
    if type(x) is not Tensor:
        x = as_tensor(x, stream=stream)
    if type(grad_y) is not Tensor:
        grad_y = as_tensor(grad_y, stream=stream)
    check_rank(x, "input", fn)
    _check_pair(x, "input", grad_y, "grad_y")
    weight_shape_t = shape_arg("weight_shape", weight_shape, x.ndim)
    geom, extra = _transposed_grad_geometry(fn, x.shape, weight_shape_t, grad_y, "input", stride,
                                            padding, output_padding, dilation, groups)
    st, pad, dil, g = geom
    if any(extra):
        x = _padded_input(x, extra, suggest_memory_format(x, grad_y), resolve_stream(stream))
    return convolution_backward_filter(grad_y, x, weight_shape_t, stride=st, padding=pad,
                                       dilation=dil, groups=g, out=out, stream=stream, **flags)


def _transposed_grad_geometry(fn: str, x_shape: tuple[int, ...], w_shape: tuple[int, ...],
                              grad_y: Tensor, x_name: str, stride: Any, padding: Any,
                              output_padding: Any, dilation: Any, groups: Any
                              ) -> tuple[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int],
                                         tuple[int, ...]]:
    """The checked geometry of a transposed convolution's gradient, and per dim how many more
    positions the convolution of its ``grad_y`` has than its input (``output_padding //
    stride``); ``grad_y`` must have the transposed convolution's output shape."""
    nd = len(x_shape) - 2
    stride_t, padding_t, dilation_t = geometry_args(stride, padding, dilation, nd)
    op = _output_padding(fn, output_padding, stride_t, dilation_t)
    g = groups_arg(groups)
    if any(k < 1 for k in w_shape):
        raise ValueError(f"{fn}: expected weight of size {list(w_shape)} to have positive sizes "
                         f"(input channels, output channels per group, kernel)")
    if w_shape[0] != x_shape[1]:
        raise ValueError(f"{fn}: given weight of size {list(w_shape)}, expected {x_name}"
                         f"{list(x_shape)} to have {w_shape[0]} channels, but got {x_shape[1]} "
                         f"channels instead")
    if w_shape[0] % g:
        raise ValueError(f"{fn}: expected weight of size {list(w_shape)} to have a first dim "
                         f"divisible by groups={g}")
    spatial = tuple((i - 1) * s - 2 * p + d * (k - 1) + o + 1 for i, k, s, p, d, o in
                    zip(x_shape[2:], w_shape[2:], stride_t, padding_t, dilation_t, op))
    if any(o < 1 for o in spatial):
        raise ValueError(f"{fn}: calculated output size {list(spatial)} is too small")
    expected = (x_shape[0], w_shape[1] * g) + spatial
    if tuple(grad_y.shape) != expected:
        raise ValueError(f"{fn}: expected grad_y of size {list(expected)} for {x_name} "
                         f"{list(x_shape)} and weight {list(w_shape)}, but got "
                         f"{list(grad_y.shape)}")
    return (stride_t, padding_t, dilation_t, g), tuple(o // s for o, s in zip(op, stride_t))


def _padded_input(x: Tensor, extra: tuple[int, ...], fmt: str, stream: int) -> Tensor:
    """``x`` with ``extra`` zeros after the last element of each spatial dim (PyTorch pads the
    input explicitly so for an odd 'same' padding), a new tensor in ``fmt``."""
    shape = x.shape[:2] + tuple(i + e for i, e in zip(x.shape[2:], extra))
    xp = zeros(shape, x.dtype, memory_format=fmt, device=x.device, stream=stream)
    if x.size:
        transform(get_handle(x.device, stream), x, _window(xp, (0,) * len(extra), x.shape[2:]))
    return xp


def convolution_backward_data(grad_y: TensorLike, w: TensorLike, input_shape: Sequence[int], *,
                              stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
                              dilation: int | Sequence[int] = 1, groups: int = 1,
                              out: TensorLike | None = None, stream: StreamLike | None = None,
                              **flags: Unpack[ConvolutionFlags]) -> Tensor:
    """Gradient of a convolution with respect to its input, of shape ``input_shape``."""
    return backward_data_and_prepared(grad_y, w, input_shape, stride, padding, dilation, groups,
                                      out, stream, flags)[0]


def _backward_data_full(grad_y: Tensor, w: Tensor, _z: None, _bias: None,
                        geometry: tuple[Any, ...], out: Any, stream: Any,
                        flags: Mapping[str, Any]) -> "tuple[Tensor, PreparedConvolution | None]":
    """The full path of `convolution_backward_data()`: (output, what it prepared)."""
    fn = "convolution_backward_data"
    input_shape_t, stride_t, padding_t, dilation_t, groups_i = _backward_args(
        fn, grad_y, w, geometry, of_input=True)
    dx, call = _backward_data(fn, grad_y, w, input_shape_t, stride_t, padding_t, dilation_t,
                              groups_i, out, stream, flags)
    prepared = prepare_call(call) if call is not None else None
    return dx, prepared


def _backward_args(fn: str, a: Tensor, b: Tensor, geometry: tuple[Any, ...], of_input: bool
                   ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], int]:
    """The checked arguments of a backward convolution: ``(shape, stride, padding, dilation,
    groups)``, ``shape`` the gradient's. The input's gradient (``of_input``) takes
    ``(grad_y, weight)`` as ``a, b`` and ``input_shape``, the weight's ``(input, grad_y)`` and
    ``weight_shape``."""
    shape, stride, padding, dilation, groups = geometry
    names = ("grad_y", "weight", "input_shape") if of_input else ("input", "grad_y", "weight_shape")
    nd = check_rank(a, names[0], fn)
    _check_pair(a, names[0], b, names[1])
    stride_t, padding_t, dilation_t = geometry_args(stride, padding, dilation, nd)
    groups_i = groups_arg(groups)
    shape_t = shape_arg(names[2], shape, a.ndim)
    if of_input:
        grad_y, x_shape, w_shape, names_xw = a, shape_t, b.shape, ("input_shape", "weight")
    else:
        grad_y, x_shape, w_shape, names_xw = b, a.shape, shape_t, ("input", "weight_shape")
    check_channels(x_shape, w_shape, groups_i, fn)
    check_grad_y(fn, grad_y, x_shape, w_shape, stride_t, padding_t, dilation_t, *names_xw)
    return shape_t, stride_t, padding_t, dilation_t, groups_i


def _backward_data(fn: str, dy: Tensor, w: Tensor, input_shape: Sequence[int],
                   stride: tuple[int, ...], padding: tuple[int, ...], dilation: tuple[int, ...],
                   groups: int, out: Any, stream: Any, flags: Mapping[str, Any],
                   reads: Sequence[tuple[str, Tensor | None]] | None = None) -> tuple[Tensor, "ConvolutionCall | None"]:
    f = _flags(flags)
    check_sample_size(fn, dy.shape, tuple(input_shape))
    call = ConvolutionCall(fn, "backward_data", None, w, dy, stride, padding, dilation, groups, f, stream)
    dx = _output(out, tuple(input_shape), dy, call.fmt, call.stream,
                 reads=reads if reads is not None else (("grad_y", dy), ("weight", w)), fn=fn)
    call.x = dx
    if dx.size == 0:
        return dx, None
    if dy.size == 0:
        fill_zero(dx, call.stream)
        return dx, None
    call.run()
    return dx, call


def convolution_backward_filter(x: TensorLike, grad_y: TensorLike, weight_shape: Sequence[int], *,
                                stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
                                dilation: int | Sequence[int] = 1, groups: int = 1,
                                out: TensorLike | None = None, stream: StreamLike | None = None,
                                **flags: Unpack[ConvolutionFlags]) -> Tensor:
    """Gradient of a convolution with respect to its weight, of shape ``weight_shape``."""
    return backward_filter_and_prepared(x, grad_y, weight_shape, stride, padding, dilation,
                                        groups, out, stream, flags)[0]


def _backward_filter_full(x: Tensor, grad_y: Tensor, _z: None, _bias: None,
                          geometry: tuple[Any, ...], out: Any, stream: Any,
                          flags: Mapping[str, Any]) -> "tuple[Tensor, PreparedConvolution | None]":
    """The full path of `convolution_backward_filter()`: (output, what it prepared)."""
    fn = "convolution_backward_filter"
    weight_shape_t, stride_t, padding_t, dilation_t, groups_i = _backward_args(
        fn, x, grad_y, geometry, of_input=False)
    f = _flags(flags)
    check_sample_size(fn, x.shape, grad_y.shape)
    call = ConvolutionCall(fn, "backward_filter", x, None, grad_y, stride_t, padding_t, dilation_t, groups_i, f, stream)
    dw = _output(out, weight_shape_t, x, call.fmt, call.stream,
                 reads=(("input", x), ("grad_y", grad_y)), fn=fn)
    call.w = dw
    if x.size == 0 or grad_y.size == 0:
        fill_zero(dw, call.stream)  # an empty batch contributes nothing to the gradient
        return dw, None
    call.run()
    prepared = prepare_call(call)
    return dw, prepared


def convolution_add_relu(x: TensorLike, w: TensorLike, z: TensorLike, *, alpha: float = 1.0,
                         bias: TensorLike | None = None, stride: int | Sequence[int] = 1,
                         padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1,
                         groups: int = 1, out: TensorLike | None = None,
                         stream: StreamLike | None = None,
                         **flags: Unpack[ConvolutionFlags]) -> Tensor:
    """``relu(conv(x, w) + alpha * z + bias)``, fused where cuDNN can, else in separate steps.

    ``z`` has the output's shape; ``out`` may be ``z`` itself (an in-place residual).
    """
    return convolution_add_relu_and_prepared(x, w, z, alpha, bias, stride, padding, dilation,
                                             groups, out, stream, flags)[0]


def _add_relu(x: Tensor, w: Tensor, z: Tensor, bias: Tensor | None, geometry: tuple[Any, ...],
              out: Any, stream: Any, flags: Mapping[str, Any]) -> "tuple[Tensor, PreparedConvolution | None]":
    """The full path of `convolution_add_relu()`: (output, what it prepared)."""
    alpha, stride, padding, dilation, groups = geometry
    if z is None:  # required: refused as any other argument that is not a tensor
        z = as_tensor(z, stream=stream)
    fn = "convolution_add_relu"
    nd = check_rank(x, "input", fn)
    _check_pair(x, "input", w, "weight")
    _check_pair(x, "input", z, "z")
    stride_t, padding_t, dilation_t = geometry_args(stride, padding, dilation, nd)
    groups_i = groups_arg(groups)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating, np.integer)):
        raise TypeError(f"alpha: expected a real number, got {alpha!r}")
    check_channels(x.shape, w.shape, groups_i, fn)
    spatial = check_output_positive(x.shape, w.shape[2:], stride_t, padding_t, dilation_t, fn)
    shape = (x.shape[0], w.shape[0]) + spatial
    z = _check_z(z, shape, x, fn)
    b = _check_bias(bias, w.shape[0], x) if bias is not None else None
    f = _flags(flags)
    check_sample_size(fn, x.shape, shape)
    call = ConvolutionCall(fn, "forward", x, w, None, stride_t, padding_t, dilation_t, groups_i, f, stream,
                           epilogue="add_relu", z=z, alpha=float(alpha))
    y = _output(out, shape, x, call.fmt, call.stream,
                reads=(("input", x), ("weight", w), ("bias", b)), in_place=z, fn=fn)
    if y.size == 0:
        return y, None
    if x.size == 0:
        fill_zero(y, call.stream)
        _epilogue_steps(call.handle, y, z, float(alpha), b)
        return y, None
    b_full = zero_bias(call, w.shape[0], x) if b is None else contiguous_bias_for(b, call.stream, call)
    call.y, call.bias = y, b_full
    if call.run_fused():
        prepared = prepare_call(call)
        if prepared is not None and b is None:
            # the shared zeros (complete, never freed): replays on any stream may read them
            prepared.default_bias = b_full
        return y, prepared
    # Fallback (the reference's raw_cudnn_convolution_add_relu_fallback_out): conv, then add, relu.
    target = y if not spans_overlap(y, z) else empty(shape, x.dtype, memory_format=call.fmt,
                                                     device=x.device, stream=call.stream)
    convolution(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups, out=target,
                stream=call.stream, **flags)
    _epilogue_steps(call.handle, target, z, float(alpha), b)
    if target is not y:
        transform(call.handle, target, y)
    return y, None


def prepare_convolution(x: TensorLike, w: TensorLike, bias: TensorLike | None = None, *,
                        direction: str = "forward",
                        **kwargs: Unpack[PrepareKeywords]) -> PreparedConvolution:
    """Run a convolution once (searching and caching its algorithm) and return it prepared.

    ``direction="forward"`` takes ``(x, w)`` like
    `pycudnn.convolution()` (``bias`` and ``activation`` allowed);
    ``"backward_data"`` takes ``(grad_y, w)`` and ``input_shape=``; ``"backward_filter"`` takes
    ``(x, grad_y)`` and ``weight_shape=``. Other keyword arguments (stride, padding, dilation,
    groups, out, stream, flags) are those of the matching function.

    Example::

        conv = pycudnn.prepare_convolution(x, w, stride=1, padding=1)
        for batch in batches:
            conv(batch, w, out=y)
    """
    k = dict(kwargs)
    stride, padding = k.pop("stride", 1), k.pop("padding", 0)
    dilation, groups = k.pop("dilation", 1), k.pop("groups", 1)
    if direction == "forward":
        activation, out, stream = k.pop("activation", None), k.pop("out", None), k.pop("stream", None)
        _, prepared = convolution_and_prepared(x, w, bias, stride, padding, dilation, groups,
                                               activation, out, stream, k)
    elif direction in ("backward_data", "backward_filter"):
        if bias is not None:
            raise ValueError("prepare_convolution: bias applies to direction='forward' only")
        shape_name = "input_shape" if direction == "backward_data" else "weight_shape"
        if shape_name not in k:
            raise TypeError(f"prepare_convolution: direction={direction!r} needs {shape_name}=")
        shape = k.pop(shape_name)
        out, stream = k.pop("out", None), k.pop("stream", None)
        core = (backward_data_and_prepared if direction == "backward_data"
                else backward_filter_and_prepared)
        _, prepared = core(x, w, shape, stride, padding, dilation, groups, out, stream, k)
    else:
        raise ValueError(f"direction: expected 'forward', 'backward_data' or 'backward_filter', "
                         f"got {direction!r}")
    if prepared is None:
        raise ValueError("prepare_convolution: this call cannot be prepared (it needs staging "
                         "copies, batch splitting or separate epilogue steps); call the function "
                         "directly instead")
    return prepared


def _epilogue_steps(handle: int, y: Tensor, z: Tensor, alpha: float, bias: Tensor | None) -> None:
    add_tensor(handle, z, y, alpha=alpha, beta=1.0)
    if bias is not None:
        add_bias(handle, y, bias)
    relu_(handle, y)


# ---- for integrations -------------------------------------------------------------------------
# The public functions with their arguments in order (flags as one dict), returning
# ``(result, PreparedConvolution | None)``, what was prepared for the call, so that an integration
# (pycudnn.torch) can replay it with device pointers alone (`PreparedConvolution.launcher`).
# None: the call did not run as one launch.

def convolution_and_prepared(x: Any, w: Any, bias: Any, stride: Any, padding: Any, dilation: Any,
                             groups: Any, activation: Any, out: Any, stream: Any,
                             flags: Mapping[str, Any]) -> "tuple[Tensor, PreparedConvolution | None]":
    """`convolution()`, returning what it prepared too."""
    return _call("forward", x, w, None, bias, (stride, padding, dilation, groups, activation), out,
                 stream, flags, _convolution)


def convolution_add_relu_and_prepared(x: Any, w: Any, z: Any, alpha: Any, bias: Any, stride: Any,
                                      padding: Any, dilation: Any, groups: Any, out: Any,
                                      stream: Any, flags: Mapping[str, Any]) -> "tuple[Tensor, PreparedConvolution | None]":
    """`convolution_add_relu()`, returning what it prepared too."""
    return _call("add_relu", x, w, z, bias, (alpha, stride, padding, dilation, groups), out, stream,
                 flags, _add_relu)


def backward_data_and_prepared(grad_y: Any, w: Any, input_shape: Any, stride: Any, padding: Any,
                               dilation: Any, groups: Any, out: Any, stream: Any,
                               flags: Mapping[str, Any]) -> "tuple[Tensor, PreparedConvolution | None]":
    """`convolution_backward_data()`, returning what it prepared too."""
    # a list shape as a tuple: the signature stays hashable
    shape = tuple(input_shape) if isinstance(input_shape, list) else input_shape
    return _call("backward_data", grad_y, w, None, None, (shape, stride, padding, dilation, groups),
                 out, stream, flags, _backward_data_full)


def backward_filter_and_prepared(x: Any, grad_y: Any, weight_shape: Any, stride: Any, padding: Any,
                                 dilation: Any, groups: Any, out: Any, stream: Any,
                                 flags: Mapping[str, Any]) -> "tuple[Tensor, PreparedConvolution | None]":
    """`convolution_backward_filter()`, returning what it prepared too."""
    shape = tuple(weight_shape) if isinstance(weight_shape, list) else weight_shape
    return _call("backward_filter", x, grad_y, None, None, (shape, stride, padding, dilation, groups),
                 out, stream, flags, _backward_filter_full)
