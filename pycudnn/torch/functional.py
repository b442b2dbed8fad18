"""The differentiable convolution functions: ``conv2d`` (``F.conv2d``'s signature), the fused
``conv2d_bias_relu`` and ``conv2d_add_relu``, and the autograd functions behind them."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ._types import IntOrInts, Padding

from .calls import (autocast_dtype, autocast_enabled, c_apply, convolution_backward, dense_grad,
                    forward_key, geometry, grad_enabled, pytorch_only, route_layer_to_torch,
                    run_backward, run_forward, threshold_backward, torch_layers)
from .library import (compiler, dynamo_compiling, traced_conv2d, traced_conv2d_add_relu,
                      traced_conv2d_bias_relu)


# ---- autograd -------------------------------------------------------------------------------------

def differentiable_backward(gy: Any, x: Any, w: Any, geom: tuple[Any, ...], need_x: bool,
                            need_w: bool) -> tuple[Any, Any]:
    """``(grad_x, grad_w)`` through PyTorch's ``convolution_backward``, which autograd can
    differentiate again: the backward pass of a graph built with ``create_graph=True``
    (gradient penalties, Hessian-vector products). pycudnn's own launches would return
    gradients with no history, and the second derivative would silently be left out."""
    stride, padding, dilation, groups = geom
    gx, gw, _ = convolution_backward(gy, x, w, None, list(stride), list(padding),
                                      list(dilation), False, [0] * len(stride), groups,
                                      [need_x, need_w, False])
    return gx, gw


class ConvFunction(torch.autograd.Function):
    """The forward of a convolution's autograd function (any rank the remembered launches
    take): pycudnn's forward convolution; the subclasses give the backward."""

    @staticmethod
    def forward(ctx: Any, x: Any, w: Any, b: Any, geom: tuple[Any, ...]) -> Any:
        y, xd, wd, fmt, torch_key = run_forward("conv", x, w, b, None, 1.0, geom)
        # the inputs themselves too (the same tensors unless a dense copy was made): a backward
        # that is differentiated again must reach them
        ctx.save_for_backward(xd, wd, x, w)
        ctx.geom, ctx.fmt, ctx.torch_key = geom, fmt, torch_key
        return y


class _Conv2dFunction(ConvFunction):
    """conv2d with pycudnn's forward, backward-data and backward-filter convolutions."""

    @staticmethod
    def backward(ctx: Any, gy: Any) -> tuple[Any, ...]:
        xd, wd, x, w = ctx.saved_tensors
        geom, fmt = ctx.geom, ctx.fmt
        need_x, need_w, need_b, _ = ctx.needs_input_grad
        gb = gy.sum((0, 2, 3)) if need_b else None
        if grad_enabled():  # create_graph=True
            gx, gw = differentiable_backward(gy, x, w, geom, need_x, need_w)
            return gx, gw, gb, None
        gy = dense_grad(gy, fmt)
        gx, gw, through_torch = run_backward(gy, xd, wd, fmt, geom, need_x, need_w)
        if ctx.torch_key is not None and through_torch:
            # forward and backward both measured faster in PyTorch: the next calls skip this function
            route_layer_to_torch(ctx.torch_key)
        return gx, gw, gb, None


class _FusedFunction(torch.autograd.Function):
    """relu(conv(x, w) + alpha * z + b): one fused launch forward; backward through the ReLU's
    mask (``y > 0``), then the convolution's backward."""

    @staticmethod
    def forward(ctx: Any, x: Any, w: Any, b: Any, z: Any, alpha: float,
                geom: tuple[Any, ...]) -> Any:
        op = "bias_relu" if z is None else "add_relu"
        y, xd, wd, fmt, _ = run_forward(op, x, w, b, z, alpha, geom)
        ctx.save_for_backward(xd, wd, y, x, w)
        ctx.geom, ctx.alpha, ctx.fmt = geom, alpha, fmt
        return y

    @staticmethod
    def backward(ctx: Any, gy: Any) -> tuple[Any, ...]:
        xd, wd, y, x, w = ctx.saved_tensors
        geom, fmt = ctx.geom, ctx.fmt
        d = threshold_backward(gy, y, 0)  # grad * (y > 0)
        need_x, need_w, need_b, need_z, _, _ = ctx.needs_input_grad
        gb = d.sum((0, 2, 3)) if need_b else None
        gz = (d if ctx.alpha == 1.0 else d * ctx.alpha) if need_z else None
        if grad_enabled():  # create_graph=True
            gx, gw = differentiable_backward(d, x, w, geom, need_x, need_w)
            return gx, gw, gb, gz, None, None
        d = dense_grad(d, fmt)
        gx, gw, _ = run_backward(d, xd, wd, fmt, geom, need_x, need_w)
        return gx, gw, gb, gz, None, None


_conv2d_apply = c_apply(_Conv2dFunction)
_fused_apply = c_apply(_FusedFunction)


def _autocast(*tensors: Any) -> tuple[Any, ...]:
    """The tensors as ``F.conv2d`` gets them under ``torch.autocast("cuda")``: floating-point
    CUDA tensors other than float64 cast to the autocast dtype (a differentiable cast)."""
    dtype = autocast_dtype()
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.is_cuda
                 and t.is_floating_point() and t.dtype is not torch.float64
                 and t.dtype is not dtype else t for t in tensors)


def _needs_grad(*tensors: Any) -> bool:
    if not grad_enabled():
        return False
    try:
        for t in tensors:
            if t is not None and t.requires_grad:
                return True
    except AttributeError:  # not a tensor: the forward's checks say so
        pass
    return False


# ---- public functions -----------------------------------------------------------------------------

def conv2d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           stride: IntOrInts = 1, padding: Padding = 0, dilation: IntOrInts = 1,
           groups: int = 1) -> torch.Tensor:
    """``torch.nn.functional.conv2d`` with the convolutions in pycudnn (differentiable).

    Same signature and semantics as PyTorch's: input ``(N, C, H, W)`` or unbatched ``(C, H, W)``,
    weight ``(K, C/groups, R, S)``, optional bias ``(K,)``; ``stride``, ``padding`` (an int, a
    pair, ``"valid"`` or ``"same"``), ``dilation`` and ``groups`` as in PyTorch. CUDA tensors of
    float32, float16, bfloat16 or float64. The output is channels_last when the input or the
    weight is (PyTorch's rule), and is allocated by PyTorch's caching allocator; the work runs on
    PyTorch's current stream (CUDA-graph capture included, once the signature has run outside
    it). Under ``torch.autocast("cuda")`` the tensors are cast to the autocast dtype first, as
    ``F.conv2d``'s are. Backward computes only the gradients autograd asks for; the bias
    gradient is ``grad.sum((0, 2, 3))``. Twice differentiable: a backward recorded with
    ``create_graph=True`` runs through PyTorch's ``convolution_backward``.

    Returns:
        The output, a torch tensor.

    Raises:
        ConvolutionTypeError: a tensor that is not on a CUDA device, or of an unsupported dtype
            (a ``TypeError`` and a ``RuntimeError``, as PyTorch raises).
        ConvolutionValueError: shapes, groups or geometry that do not fit (PyTorch's wording;
            a ``ValueError`` and a ``RuntimeError``).
    """
    # dynamo or torch.export traces: the custom operator (library.py); an eager call pays ~25 ns
    if dynamo_compiling() or compiler._is_compiling_flag:
        return traced_conv2d(input, weight, bias, stride, padding, dilation, groups)
    if pytorch_only():
        return F.conv2d(input, weight, bias, stride, padding, dilation, groups)
    if autocast_enabled():
        input, weight, bias = _autocast(input, weight, bias)
    geom, pre_pad = geometry(stride, padding, dilation, groups, weight)
    if isinstance(input, torch.Tensor) and input.dim() == 3:
        return conv2d(input.unsqueeze(0), weight, bias, stride, padding, dilation, groups).squeeze(0)
    if pre_pad is not None:
        input = F.pad(input, pre_pad)
    if _needs_grad(input, weight, bias):
        if torch_layers and forward_key("conv", input, weight, bias, None, 1.0, geom) in torch_layers:
            return F.conv2d(input, weight, bias, *geom)
        return _conv2d_apply(input, weight, bias, geom)
    return run_forward("conv", input, weight, bias, None, 1.0, geom)[0]


def conv2d_bias_relu(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                     stride: IntOrInts = 1, padding: Padding = 0, dilation: IntOrInts = 1,
                     groups: int = 1) -> torch.Tensor:
    """``relu(conv2d(input, weight, bias, ...))`` as one fused cuDNN graph (differentiable).

    Arguments as `conv2d` (4-D input; ``bias=None`` adds nothing).
    Backward masks the gradient with ``y > 0`` and runs the convolution's backward.
    """
    if dynamo_compiling() or compiler._is_compiling_flag:  # tracing: as in conv2d
        return traced_conv2d_bias_relu(input, weight, bias, stride, padding, dilation, groups)
    if pytorch_only():
        return torch.relu(F.conv2d(input, weight, bias, stride, padding, dilation, groups))
    if autocast_enabled():
        input, weight, bias = _autocast(input, weight, bias)
    geom, pre_pad = geometry(stride, padding, dilation, groups, weight)
    if pre_pad is not None:
        input = F.pad(input, pre_pad)
    if _needs_grad(input, weight, bias):
        return _fused_apply(input, weight, bias, None, 1.0, geom)
    return run_forward("bias_relu", input, weight, bias, None, 1.0, geom)[0]


def conv2d_add_relu(input: torch.Tensor, weight: torch.Tensor, z: torch.Tensor,
                    bias: torch.Tensor | None = None, alpha: float = 1.0, stride: IntOrInts = 1,
                    padding: Padding = 0, dilation: IntOrInts = 1,
                    groups: int = 1) -> torch.Tensor:
    """``relu(conv2d(input, weight, bias, ...) + alpha * z)`` as one fused cuDNN graph: the
    residual block's add and ReLU (differentiable, ``z`` included).

    ``z`` has the output's shape. Other arguments as `conv2d` (4-D input).
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(f"conv2d_add_relu: expected alpha to be a real number, got {alpha!r}")
    if dynamo_compiling() or compiler._is_compiling_flag:  # tracing: as in conv2d
        return traced_conv2d_add_relu(input, weight, z, bias, alpha, stride, padding, dilation,
                                      groups)
    if pytorch_only():
        y = F.conv2d(input, weight, bias, stride, padding, dilation, groups)
        return torch.relu(y + z if alpha == 1.0 else y + alpha * z)
    if autocast_enabled():
        input, weight, z, bias = _autocast(input, weight, z, bias)
    geom, pre_pad = geometry(stride, padding, dilation, groups, weight)
    if pre_pad is not None:
        input = F.pad(input, pre_pad)
    alpha = float(alpha)
    if _needs_grad(input, weight, bias, z):
        return _fused_apply(input, weight, bias, z, alpha, geom)
    return run_forward("add_relu", input, weight, bias, z, alpha, geom)[0]



# ---- for the other ranks' functions (functional_nd) -------------------------------------------------
#: `_autocast` and `_needs_grad` under public names
autocast_tensors = _autocast
needs_grad = _needs_grad
