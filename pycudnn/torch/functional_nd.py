"""The differentiable convolutions beside `conv2d`: ``conv1d``, ``conv3d`` and
``conv_transpose1d/2d/3d``, with ``torch.nn.functional``'s signatures and semantics.

* ``conv1d`` is `conv2d` on views with a unit height (``unsqueeze(2)``), as PyTorch's cuDNN path
  runs 1-D convolutions: the same remembered launches, routing, autograd function and double
  backward as 2-D ones; ``conv_transpose1d`` runs as ``conv_transpose2d`` alike;
* ``conv3d`` runs the remembered launches of `calls` on 5-D tensors, through `_ConvNdFunction`;
* a transposed convolution's forward is the backward data of the convolution whose input has the
  transposed one's output shape; its input gradient is that convolution's forward, and its
  weight gradient the convolution's backward filter with the roles swapped (the gradient is the
  convolution's input, the transposed input its output gradient).

An ``output_padding`` at least the stride (PyTorch allows it below the dilation) has no cuDNN
backward-data size: such calls run PyTorch's own transposed convolution.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from ._types import IntOrInts, Padding

from .calls import (CACHE_MAX, ConvolutionTypeError, ConvolutionValueError, autocast_enabled,
                    c_apply, check_convolution, check_transposed, convolution_backward, dense_grad,
                    forward_key, geometry, grad_enabled, pytorch_only, route_layer_to_torch,
                    run_backward_data, run_backward_filter, run_forward, spatial_ints, torch_layers,
                    transposed_call)
from .functional import ConvFunction, autocast_tensors, conv2d, differentiable_backward, needs_grad

_CHECKED = (ConvolutionValueError, ConvolutionTypeError, AttributeError)


def _bias_dims(nd: int) -> tuple[int, ...]:
    return (0,) + tuple(range(2, nd + 2))


# ---- autograd -------------------------------------------------------------------------------------

class _ConvNdFunction(ConvFunction):
    """A convolution of any rank the remembered launches take (3-D here) with pycudnn's forward,
    backward-data and backward-filter convolutions."""

    @staticmethod
    def backward(ctx: Any, gy: Any) -> tuple[Any, ...]:
        xd, wd, x, w = ctx.saved_tensors
        geom, fmt = ctx.geom, ctx.fmt
        need_x, need_w, need_b, _ = ctx.needs_input_grad
        gb = gy.sum(_bias_dims(len(geom[0]))) if need_b else None
        if grad_enabled():  # create_graph=True: a backward autograd can differentiate again
            gx, gw = differentiable_backward(gy, x, w, geom, need_x, need_w)
            return gx, gw, gb, None
        gy = dense_grad(gy, fmt)
        gx, torch_x = run_backward_data(gy, wd, xd, fmt, geom) if need_x else (None, True)
        gw, torch_w = run_backward_filter(xd, gy, wd, fmt, geom) if need_w else (None, True)
        if ctx.torch_key is not None and torch_x and torch_w:
            route_layer_to_torch(ctx.torch_key)  # all three measured faster in PyTorch
        return gx, gw, gb, None


def _transposed_forward(x: Any, w: Any, b: Any, geom: tuple[Any, ...],
                        call: tuple[Any, ...]) -> tuple[Any, Any, Any]:
    """``(y, x, w)``: the transposed convolution's output and the dense input and weight it
    read (``call`` from `transposed_call`)."""
    shape_of, fmt, x_dense, w_dense, bias_shape = call
    if not x_dense:
        x = x.contiguous(memory_format=fmt)
    if not w_dense:
        w = w.contiguous(memory_format=fmt)
    y = run_backward_data(x, w, shape_of, fmt, geom)[0]
    if b is not None:
        y.add_(b.reshape(bias_shape))  # PyTorch adds a transposed convolution's bias so too
    return y, x, w


class _ConvTransposeFunction(torch.autograd.Function):
    """A transposed convolution: forward through backward data; the input's gradient through
    the forward convolution, the weight's through backward filter."""

    @staticmethod
    def forward(ctx: Any, x: Any, w: Any, b: Any, geom: tuple[Any, ...],
                output_padding: tuple[int, ...], call: tuple[Any, ...]) -> Any:
        y, xd, wd = _transposed_forward(x, w, b, geom, call)
        ctx.save_for_backward(xd, wd, x, w)
        ctx.geom, ctx.output_padding, ctx.fmt = geom, output_padding, call[1]
        return y

    @staticmethod
    def backward(ctx: Any, gy: Any) -> tuple[Any, ...]:
        xd, wd, x, w = ctx.saved_tensors
        geom, fmt = ctx.geom, ctx.fmt
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        stride, padding, dilation, groups = geom
        gb = gy.sum(_bias_dims(len(stride))) if need_b else None
        if grad_enabled():  # create_graph=True
            gx, gw, _ = convolution_backward(gy, x, w, None, list(stride), list(padding),
                                             list(dilation), True, list(ctx.output_padding),
                                             groups, [need_x, need_w, False])
            return gx, gw, gb, None, None, None
        gy = dense_grad(gy, fmt)
        # the convolution whose backward data the forward was: gy is its input, x its output's
        # gradient
        gx = run_forward("conv", gy, wd, None, None, 1.0, geom)[0] if need_x else None
        gw = run_backward_filter(gy, xd, wd, fmt, geom)[0] if need_w else None
        return gx, gw, gb, None, None, None


_convnd_apply = c_apply(_ConvNdFunction)
_transposed_apply = c_apply(_ConvTransposeFunction)


# ---- geometry -------------------------------------------------------------------------------------

_TGEOM: dict[tuple[Any, ...], Any] = {}


def _transposed_geometry(fn: str, nd: int, stride: Any, padding: Any, output_padding: Any,
                         groups: Any, dilation: Any) -> tuple[tuple[Any, ...], tuple[int, ...], bool]:
    """``(geom, output_padding, pytorch_runs_it)`` normalized; the last is True where an
    output_padding is at least its stride (no cuDNN backward data has that output size)."""
    try:
        key: tuple[Any, ...] = (fn, stride, padding, output_padding, groups, dilation,
                                type(stride), type(padding), type(output_padding), type(groups),
                                type(dilation))
        hit = _TGEOM.get(key)
    except TypeError:  # a list somewhere: normalize without caching
        key, hit = (), None
    if hit is not None:
        return hit
    if isinstance(padding, str):  # PyTorch's transposed convolutions take no padding strings
        raise ConvolutionTypeError(f"{fn}: expected padding to be an int or a tuple of {nd} "
                                   f"ints, got str {padding!r}")
    geom, _ = geometry(stride, padding, dilation, groups, None, nd, fn)
    op = spatial_ints("output_padding", output_padding, 0,
                      "negative output_padding is not supported", nd, fn)
    stride_t, _, dilation_t, _ = geom
    if any(o >= s and o >= d for o, s, d in zip(op, stride_t, dilation_t)):
        raise ConvolutionValueError(
            f"{fn}: output padding must be smaller than either stride or dilation, but got "
            f"output_padding={list(op)}, stride={list(stride_t)}, dilation={list(dilation_t)}")
    result = (geom, op, any(o >= s for o, s in zip(op, geom[0])))
    if key:
        if len(_TGEOM) > CACHE_MAX:
            _TGEOM.clear()
        _TGEOM[key] = result
    return result


# ---- public functions -----------------------------------------------------------------------------

def conv1d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           stride: IntOrInts = 1, padding: Padding = 0, dilation: IntOrInts = 1,
           groups: int = 1) -> torch.Tensor:
    """``torch.nn.functional.conv1d`` with the convolutions in pycudnn (differentiable).

    Input ``(N, C, L)`` or unbatched ``(C, L)``, weight ``(K, C/groups, k)``, optional bias
    ``(K,)``; ``stride``, ``padding`` (an int, a 1-tuple, ``"valid"`` or ``"same"``, an odd
    total padded after the input as PyTorch does), ``dilation`` and ``groups`` as in PyTorch.
    Runs as `conv2d` on views of unit height (PyTorch's cuDNN path does the same, and makes the
    input contiguous first): dtypes, autocast, routing, backward and double backward as
    `conv2d`'s.
    """
    if pytorch_only():
        return F.conv1d(input, weight, bias, stride, padding, dilation, groups)
    if isinstance(input, torch.Tensor) and input.dim() == 2:
        return conv1d(input.unsqueeze(0), weight, bias, stride, padding, dilation, groups).squeeze(0)
    geom, pre_pad = _geometry_of("conv1d", 1, stride, padding, dilation, groups, input, weight,
                                 bias)
    st, pad, dil, g = geom
    try:
        x = input.contiguous()  # a permuted 3-D input must not select NHWC (PyTorch's rule)
        if pre_pad is not None:
            x = F.pad(x, pre_pad)
        y = conv2d(x.unsqueeze(2), weight.unsqueeze(2), bias, (1, st[0]), (0, pad[0]),
                   (1, dil[0]), g)
    except _CHECKED:  # said in conv1d's terms where its own checks find the fault
        check_convolution("conv1d", input, weight, bias, None, geom)
        raise
    return y.squeeze(2)


def conv3d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           stride: IntOrInts = 1, padding: Padding = 0, dilation: IntOrInts = 1,
           groups: int = 1) -> torch.Tensor:
    """``torch.nn.functional.conv3d`` with the convolutions in pycudnn (differentiable).

    Input ``(N, C, D, H, W)`` or unbatched ``(C, D, H, W)``, weight ``(K, C/groups, kd, kh,
    kw)``, optional bias; ``stride``, ``padding`` (ints, triples, ``"valid"`` or ``"same"``),
    ``dilation`` and ``groups`` as in PyTorch. channels_last_3d when the input or the weight
    is (PyTorch's rule). The remembered launches of `conv2d`, on 5-D tensors; dtypes, autocast,
    routing, backward and double backward as `conv2d`'s.
    """
    if pytorch_only():
        return F.conv3d(input, weight, bias, stride, padding, dilation, groups)
    if autocast_enabled():
        input, weight, bias = autocast_tensors(input, weight, bias)
    if isinstance(input, torch.Tensor) and input.dim() == 4:
        return conv3d(input.unsqueeze(0), weight, bias, stride, padding, dilation, groups).squeeze(0)
    geom, pre_pad = _geometry_of("conv3d", 3, stride, padding, dilation, groups, input, weight,
                                 bias)
    if pre_pad is not None:
        input = F.pad(input, pre_pad)
    if needs_grad(input, weight, bias):
        if torch_layers and forward_key("conv", input, weight, bias, None, 1.0, geom) in torch_layers:
            return F.conv3d(input, weight, bias, *geom)
        return _convnd_apply(input, weight, bias, geom)
    return run_forward("conv", input, weight, bias, None, 1.0, geom)[0]


def _geometry_of(fn: str, nd: int, stride: Any, padding: Any, dilation: Any, groups: Any,
                 input: Any, weight: Any, bias: Any) -> tuple[tuple[Any, ...], Any]:
    try:
        return geometry(stride, padding, dilation, groups, weight, nd, fn)
    except AttributeError:  # padding="same" reads the weight's shape: not a tensor
        check_convolution(fn, input, weight, bias, None, ((1,) * nd,) * 3 + (1,))
        raise


def conv_transpose1d(input: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor | None = None, stride: IntOrInts = 1,
                     padding: IntOrInts = 0, output_padding: IntOrInts = 0, groups: int = 1,
                     dilation: IntOrInts = 1) -> torch.Tensor:
    """``torch.nn.functional.conv_transpose1d`` with the convolutions in pycudnn
    (differentiable); runs as `conv_transpose2d` on views of unit height.

    Input ``(N, C_in, L)`` or unbatched ``(C_in, L)``, weight ``(C_in, C_out/groups, k)``
    (PyTorch's order: ``groups`` before ``dilation``).
    """
    if pytorch_only():
        return F.conv_transpose1d(input, weight, bias, stride, padding, output_padding, groups,
                                  dilation)
    if isinstance(input, torch.Tensor) and input.dim() == 2:
        return conv_transpose1d(input.unsqueeze(0), weight, bias, stride, padding,
                                output_padding, groups, dilation).squeeze(0)
    geom, op, torch_runs = _transposed_geometry("conv_transpose1d", 1, stride, padding,
                                                output_padding, groups, dilation)
    if torch_runs:
        return F.conv_transpose1d(input, weight, bias, geom[0], geom[1], op, geom[3], geom[2])
    (st,), (pad,), (dil,), g = geom
    try:
        x = input.contiguous()  # as conv1d: PyTorch's rule for 3-D input
        y = conv_transpose2d(x.unsqueeze(2), weight.unsqueeze(2), bias, (1, st), (0, pad),
                             (0, op[0]), g, (1, dil))
    except _CHECKED:  # said in conv_transpose1d's terms where its own checks find the fault
        check_transposed("conv_transpose1d", input, weight, bias, geom, op)
        raise
    return y.squeeze(2)


def conv_transpose2d(input: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor | None = None, stride: IntOrInts = 1,
                     padding: IntOrInts = 0, output_padding: IntOrInts = 0, groups: int = 1,
                     dilation: IntOrInts = 1) -> torch.Tensor:
    """``torch.nn.functional.conv_transpose2d`` with the convolutions in pycudnn
    (differentiable): the gradient of a convolution with respect to its input.

    Input ``(N, C_in, H, W)`` or unbatched ``(C_in, H, W)``, weight ``(C_in, C_out/groups, kh,
    kw)``, optional bias ``(C_out,)``; the output is ``(N, C_out, *o)`` with ``o = (i - 1) *
    stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1``. ``output_padding``
    must be smaller than the stride or the dilation (PyTorch's rule); one at least the stride
    runs PyTorch's own transposed convolution. The output is channels_last when the input or
    the weight is. The forward is cuDNN's backward data (the bias added after it, as PyTorch
    does); backward computes only the gradients asked for: the input's with a forward
    convolution, the weight's with a backward filter, the bias's as a sum. Dtypes, autocast
    and double backward as `conv2d`'s.
    """
    return _transposed("conv_transpose2d", 2, F.conv_transpose2d, input, weight, bias, stride,
                       padding, output_padding, groups, dilation)


def conv_transpose3d(input: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor | None = None, stride: IntOrInts = 1,
                     padding: IntOrInts = 0, output_padding: IntOrInts = 0, groups: int = 1,
                     dilation: IntOrInts = 1) -> torch.Tensor:
    """``torch.nn.functional.conv_transpose3d`` with the convolutions in pycudnn
    (differentiable); as `conv_transpose2d`, with 5-D input (4-D unbatched) and weight
    ``(C_in, C_out/groups, kd, kh, kw)``."""
    return _transposed("conv_transpose3d", 3, F.conv_transpose3d, input, weight, bias, stride,
                       padding, output_padding, groups, dilation)


def _transposed(fn: str, nd: int, torch_fn: Callable[..., Any], input: Any, weight: Any,
                bias: Any, stride: Any, padding: Any, output_padding: Any, groups: Any,
                dilation: Any) -> Any:
    if pytorch_only():
        return torch_fn(input, weight, bias, stride, padding, output_padding, groups, dilation)
    if autocast_enabled():
        input, weight, bias = autocast_tensors(input, weight, bias)
    if isinstance(input, torch.Tensor) and input.dim() == nd + 1:
        return _transposed(fn, nd, torch_fn, input.unsqueeze(0), weight, bias, stride, padding,
                           output_padding, groups, dilation).squeeze(0)
    geom, op, torch_runs = _transposed_geometry(fn, nd, stride, padding, output_padding, groups,
                                                dilation)
    if torch_runs:
        return torch_fn(input, weight, bias, geom[0], geom[1], op, geom[3], geom[2])
    call = transposed_call(fn, input, weight, bias, geom, op)
    if needs_grad(input, weight, bias):
        return _transposed_apply(input, weight, bias, geom, op, call)
    return _transposed_forward(input, weight, bias, geom, call)[0]
