"""pycudnn's convolutions as PyTorch custom operators (``torch.library``): what ``torch.compile``
and ``torch.export`` see of them.

An eager call never comes here: the public functions run their remembered launches directly and
branch to this module only while dynamo or ``torch.export`` traces them (`dynamo_compiling` or
``compiler._is_compiling_flag``, read on every call). A launch through raw pointers is opaque to
dynamo and impossible on fake tensors; a custom operator is one node of the graph, with a schema
(`OPS`, namespace ``pycudnn``), a fake implementation (the output's shape, dtype, device and
memory format, with PyTorch's argument checks), a CUDA implementation (the eager call's
remembered launch: `calls.run_forward`, `calls.run_backward_data`, `calls.run_backward_filter`)
and autograd whose backward calls the backward operators, one per direction (a custom operator
cannot return the undefined tensor an output mask would need). In benchmark mode a signature
PyTorch runs in every direction the graph needs is traced as ``F.conv2d`` (`traced_conv2d`).
How to add an operator: docs/architecture.md, "Adding a custom operator". Without
``torch.library.custom_op`` (PyTorch before 2.4) nothing is registered and `AVAILABLE` is False.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .calls import (DTYPE_NAMES, check_conv, convolution_backward, dense_grad, memory_format,
                    normalize_geometry, run_backward_data, run_backward_filter, run_forward,
                    threshold_backward, torch_runs_signature)

__all__ = ["AVAILABLE", "NAMESPACE", "OPS", "compiler", "define", "dynamo_compiling",
           "traced_conv2d", "traced_conv2d_add_relu", "traced_conv2d_bias_relu"]

#: whether this PyTorch has ``torch.library.custom_op`` and ``register_autograd`` (2.4 and later)
AVAILABLE = (hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_autograd")
             and hasattr(torch.compiler, "is_dynamo_compiling"))
NAMESPACE = "pycudnn"


def _never() -> bool:
    return False


#: True while dynamo traces (it folds the call to a constant); False in eager code
dynamo_compiling: Callable[[], bool] = (torch.compiler.is_dynamo_compiling if AVAILABLE
                                        else _never)
#: ``compiler._is_compiling_flag``: True while ``torch.export`` traces (non-strict export runs
#: the model's Python on fake tensors, without dynamo), and in PyTorch 2.13 during a
#: ``torch.compile`` session too
compiler: Any = (torch.compiler if AVAILABLE and hasattr(torch.compiler, "_is_compiling_flag")
                 else types.SimpleNamespace(_is_compiling_flag=False))

_GEOMETRY = "int[2] stride, int[2] padding, int[2] dilation, int groups"
#: the schemas, by operator name (``torch.ops.pycudnn.<name>``)
OPS: dict[str, str] = {
    "conv2d": f"(Tensor input, Tensor weight, Tensor? bias, {_GEOMETRY}) -> Tensor",
    "conv2d_bias_relu": f"(Tensor input, Tensor weight, Tensor? bias, {_GEOMETRY}) -> Tensor",
    "conv2d_add_relu": (f"(Tensor input, Tensor weight, Tensor z, Tensor? bias, float alpha, "
                        f"{_GEOMETRY}) -> Tensor"),
    "conv2d_backward_input": (f"(Tensor grad_output, Tensor input, Tensor weight, {_GEOMETRY}) "
                              f"-> Tensor"),
    "conv2d_backward_weight": (f"(Tensor grad_output, Tensor input, Tensor weight, {_GEOMETRY}) "
                               f"-> Tensor"),
    # fuse_for_training's blocks (registered by training.py, beside the kernels they launch)
    "batch_norm_train": ("(Tensor input, Tensor weight, Tensor bias, Tensor? z, bool relu, "
                         "float eps, int reserve_size) -> (Tensor, Tensor, Tensor, Tensor)"),
    "batch_norm_train_backward": ("(Tensor grad_output, Tensor input, Tensor? output, "
                                  "Tensor weight, Tensor? bias, Tensor save_mean, "
                                  "Tensor save_invstd, Tensor reserve, bool relu, bool add, "
                                  "float eps, int reserve_size) "
                                  "-> (Tensor, Tensor, Tensor, Tensor)"),
}


def define(name: str, cuda: Callable[..., Any], fake: Callable[..., Any],
           backward: Callable[..., Any] | None = None,
           setup_context: Callable[..., Any] | None = None) -> Any:
    """Register ``pycudnn::<name>`` (schema ``OPS[name]``): ``cuda`` its CUDA implementation,
    ``fake`` its fake (meta) implementation, ``backward`` and ``setup_context`` its autograd
    (``torch.library.register_autograd``'s); returns the ``CustomOpDef``."""
    op = torch.library.custom_op(f"{NAMESPACE}::{name}", cuda, mutates_args=(),
                                 device_types="cuda", schema=OPS[name])
    op.register_fake(fake)
    if backward is not None:
        op.register_autograd(backward, setup_context=setup_context)
    return op


def _geom(stride: Any, padding: Any, dilation: Any, groups: int) -> tuple[Any, ...]:
    """The dispatcher's lists as the hashable geometry tuple `calls` keys launches by."""
    return tuple(stride), tuple(padding), tuple(dilation), groups


def _dense(t: Any, fmt: Any) -> Any:
    return t if t.is_contiguous(memory_format=fmt) else t.contiguous(memory_format=fmt)


def _empty(shape: Any, like: Any, fmt: Any) -> Any:
    return torch.empty(shape, dtype=like.dtype, device=like.device, memory_format=fmt)


# ---- forward operators ----------------------------------------------------------------------------

def _conv2d_cuda(input: Any, weight: Any, bias: Any, stride: Any, padding: Any, dilation: Any,
                 groups: int) -> Any:
    return run_forward("conv", input, weight, bias, None, 1.0,
                       _geom(stride, padding, dilation, groups))[0]


def _conv2d_fake(input: Any, weight: Any, bias: Any, stride: Any, padding: Any, dilation: Any,
                 groups: int) -> Any:
    shape = check_conv("conv2d", input, weight, bias, None, _geom(stride, padding, dilation, groups))
    return _empty(shape, input, memory_format(input, weight))


def _bias_relu_cuda(input: Any, weight: Any, bias: Any, stride: Any, padding: Any,
                    dilation: Any, groups: int) -> Any:
    return run_forward("bias_relu", input, weight, bias, None, 1.0,
                       _geom(stride, padding, dilation, groups))[0]


def _bias_relu_fake(input: Any, weight: Any, bias: Any, stride: Any, padding: Any,
                    dilation: Any, groups: int) -> Any:
    shape = check_conv("conv2d_bias_relu", input, weight, bias, None,
                        _geom(stride, padding, dilation, groups))
    return _empty(shape, input, memory_format(input, weight))


def _add_relu_cuda(input: Any, weight: Any, z: Any, bias: Any, alpha: float, stride: Any,
                   padding: Any, dilation: Any, groups: int) -> Any:
    return run_forward("add_relu", input, weight, bias, z, alpha,
                       _geom(stride, padding, dilation, groups))[0]


def _add_relu_fake(input: Any, weight: Any, z: Any, bias: Any, alpha: float, stride: Any,
                   padding: Any, dilation: Any, groups: int) -> Any:
    shape = check_conv("conv2d_add_relu", input, weight, bias, z,
                        _geom(stride, padding, dilation, groups))
    return _empty(shape, input, memory_format(input, weight))


# ---- backward operators ---------------------------------------------------------------------------
# The memory format is the forward's: computed from the input and the weight as the forward
# computed it; the gradient and the tensors read are made dense in it first, as eager backward
# passes do.

def _backward_operator(of_input: bool) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The CUDA and the fake implementation of the backward operator giving the input's gradient
    (``of_input``) or the weight's."""

    def cuda(grad_output: Any, input: Any, weight: Any, stride: Any, padding: Any,
             dilation: Any, groups: int) -> Any:
        fmt = memory_format(input, weight)
        grad, geom = dense_grad(grad_output, fmt), _geom(stride, padding, dilation, groups)
        if of_input:
            return run_backward_data(grad, _dense(weight, fmt), input, fmt, geom)[0]
        return run_backward_filter(_dense(input, fmt), grad, weight, fmt, geom)[0]

    def fake(grad_output: Any, input: Any, weight: Any, stride: Any, padding: Any,
             dilation: Any, groups: int) -> Any:
        return _empty((input if of_input else weight).shape, grad_output,
                      memory_format(input, weight))

    return cuda, fake


# ---- autograd -------------------------------------------------------------------------------------

def _conv_grads(d: Any, x: Any, w: Any, geom: tuple[Any, ...], need_x: bool,
                need_w: bool) -> tuple[Any, Any]:
    """``(grad_input, grad_weight)`` for the convolution's output gradient ``d``: through the
    backward operators, or, in a backward pass that autograd records (``create_graph=True``),
    through PyTorch's ``convolution_backward``, which it can differentiate again."""
    stride, padding, dilation, groups = geom
    if torch.is_grad_enabled():
        gx, gw, _ = convolution_backward(d, x, w, None, list(stride), list(padding),
                                          list(dilation), False, [0, 0], groups,
                                          [need_x, need_w, False])
        return gx, gw
    ops = torch.ops.pycudnn
    gx = ops.conv2d_backward_input(d, x, w, stride, padding, dilation, groups) if need_x else None
    gw = ops.conv2d_backward_weight(d, x, w, stride, padding, dilation, groups) if need_w else None
    return gx, gw


def _conv2d_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    x, w, _, stride, padding, dilation, groups = inputs
    ctx.save_for_backward(x, w)
    ctx.geom = (stride, padding, dilation, groups)


def _conv2d_backward(ctx: Any, grad: Any) -> tuple[Any, ...]:
    x, w = ctx.saved_tensors
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    gx, gw = _conv_grads(grad, x, w, ctx.geom, need_x, need_w)
    gb = grad.sum((0, 2, 3)) if need_b else None
    return gx, gw, gb, None, None, None, None


def _bias_relu_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    x, w, _, stride, padding, dilation, groups = inputs
    ctx.save_for_backward(x, w, output)
    ctx.geom = (stride, padding, dilation, groups)


def _bias_relu_backward(ctx: Any, grad: Any) -> tuple[Any, ...]:
    x, w, y = ctx.saved_tensors
    d = threshold_backward(grad, y, 0)  # grad * (y > 0)
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    gx, gw = _conv_grads(d, x, w, ctx.geom, need_x, need_w)
    gb = d.sum((0, 2, 3)) if need_b else None
    return gx, gw, gb, None, None, None, None


def _add_relu_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    x, w, _, _, alpha, stride, padding, dilation, groups = inputs
    ctx.save_for_backward(x, w, output)
    ctx.geom, ctx.alpha = (stride, padding, dilation, groups), alpha


def _add_relu_backward(ctx: Any, grad: Any) -> tuple[Any, ...]:
    x, w, y = ctx.saved_tensors
    d = threshold_backward(grad, y, 0)
    need_x, need_w, need_z, need_b = ctx.needs_input_grad[:4]
    gx, gw = _conv_grads(d, x, w, ctx.geom, need_x, need_w)
    gz = (d if ctx.alpha == 1.0 else d * ctx.alpha) if need_z else None
    gb = d.sum((0, 2, 3)) if need_b else None
    return gx, gw, gz, gb, None, None, None, None, None


if AVAILABLE:
    define("conv2d", _conv2d_cuda, _conv2d_fake, _conv2d_backward, _conv2d_setup)
    define("conv2d_bias_relu", _bias_relu_cuda, _bias_relu_fake, _bias_relu_backward,
           _bias_relu_setup)
    define("conv2d_add_relu", _add_relu_cuda, _add_relu_fake, _add_relu_backward,
           _add_relu_setup)
    define("conv2d_backward_input", *_backward_operator(of_input=True))
    define("conv2d_backward_weight", *_backward_operator(of_input=False))


# ---- what the public functions call while dynamo or torch.export traces ---------------------------
# Traceable Python: the geometry normalized without a cache, autocast's cast made explicit
# (a custom operator has no autocast rule of its own), then the operator. A fused call without a
# bias gets zeros from the graph: the CUDA implementation would otherwise make (and keep) its own
# on the first call, and a tensor kept from a CUDA-graph tree's warm-up run is one its memory
# pool check refuses ("allocated but not accounted for").

def _autocast(*tensors: Any) -> tuple[Any, ...]:
    """``functional._autocast``'s cast, in the form dynamo traces (its readers fold to constants)."""
    if not torch.is_autocast_enabled("cuda"):
        return tensors
    dtype = torch.get_autocast_dtype("cuda")
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.is_cuda
                 and t.is_floating_point() and t.dtype is not torch.float64
                 and t.dtype is not dtype else t for t in tensors)


def _stand_in(shape: tuple[int, ...], stride: tuple[int, ...], dtype: str, device: int) -> Any:
    return torch.empty_strided(shape, stride, dtype=getattr(torch, dtype),
                               device=f"cuda:{device}").normal_()


def routed_to_torch(signature: tuple[Any, ...]) -> bool:
    """Whether routing sends this convolution signature to PyTorch in every direction the graph
    needs, measured now on stand-in tensors where it is new (`calls.torch_runs_signature`).
    dynamo calls this while it traces (``assume_constant_result``: run once, its answer baked
    into the graph), outside the fake-tensor mode. The stand-ins' random draws leave the
    device's generator as they found it: dynamo restores only the current device's.
    Public as a seam for tests and tooling."""
    xs, xst, dtype, dev, ws, wst, wdtype, bias, geom, need_x, need_w = signature
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily(), torch.enable_grad(), torch.random.fork_rng(devices=[dev]):
        x, w = _stand_in(xs, xst, dtype, dev), _stand_in(ws, wst, wdtype, dev)
        b = torch.zeros(ws[0], dtype=getattr(torch, wdtype), device=x.device) if bias else None
        return torch_runs_signature(x, w, b, geom, need_x, need_w)


if AVAILABLE:
    routed_to_torch = torch._dynamo.assume_constant_result(routed_to_torch)


def _static(shape: Any) -> bool:
    return all(isinstance(n, int) for n in shape)


def traced_conv2d(input: Any, weight: Any, bias: Any, stride: Any, padding: Any, dilation: Any,
                  groups: int) -> Any:
    """`pycudnn.torch.conv2d` as ``pycudnn::conv2d`` (unbatched input and ``padding="same"``
    with an odd total handled around it, as the eager function does).

    Under dynamo, a signature that routing gives to PyTorch in every direction the graph needs
    (measured at trace time where it is new, as an eager first call measures it) is traced as
    ``F.conv2d`` instead: the compiler then sees PyTorch's own convolution, as in the plain
    model, and fuses the operations around it (an opaque custom operator would stop that). Only
    static shapes are measured; ``torch.export`` (no dynamo) always gets the custom operator."""
    input, weight, bias = _autocast(input, weight, bias)
    if isinstance(input, torch.Tensor) and input.dim() == 3:
        return traced_conv2d(input.unsqueeze(0), weight, bias, stride, padding, dilation,
                             groups).squeeze(0)
    geom, pre_pad = normalize_geometry(stride, padding, dilation, groups, weight.shape[2:])
    if pre_pad is not None:
        input = F.pad(input, pre_pad)
    if (dynamo_compiling() and input.is_cuda and input.dtype in DTYPE_NAMES
            and weight.dtype in DTYPE_NAMES and _static(input.shape) and _static(weight.shape)
            and _static(input.stride()) and _static(weight.stride())):
        grad = torch.is_grad_enabled()
        if routed_to_torch((tuple(input.shape), tuple(input.stride()), DTYPE_NAMES[input.dtype],
                             input.device.index, tuple(weight.shape), tuple(weight.stride()),
                             DTYPE_NAMES[weight.dtype], bias is not None, geom,
                             grad and input.requires_grad, grad and weight.requires_grad)):
            return F.conv2d(input, weight, bias, *geom)
    return torch.ops.pycudnn.conv2d(input, weight, bias, *geom)


def traced_conv2d_bias_relu(input: Any, weight: Any, bias: Any, stride: Any, padding: Any,
                            dilation: Any, groups: int) -> Any:
    """`pycudnn.torch.conv2d_bias_relu` as ``pycudnn::conv2d_bias_relu``."""
    input, weight, bias = _autocast(input, weight, bias)
    geom, pre_pad = normalize_geometry(stride, padding, dilation, groups, weight.shape[2:])
    if pre_pad is not None:
        input = F.pad(input, pre_pad)
    if bias is None:
        bias = weight.new_zeros(weight.shape[0])
    return torch.ops.pycudnn.conv2d_bias_relu(input, weight, bias, *geom)


def traced_conv2d_add_relu(input: Any, weight: Any, z: Any, bias: Any, alpha: float, stride: Any,
                           padding: Any, dilation: Any, groups: int) -> Any:
    """`pycudnn.torch.conv2d_add_relu` as ``pycudnn::conv2d_add_relu`` (``alpha`` checked by
    the caller)."""
    input, weight, z, bias = _autocast(input, weight, z, bias)
    geom, pre_pad = normalize_geometry(stride, padding, dilation, groups, weight.shape[2:])
    if pre_pad is not None:
        input = F.pad(input, pre_pad)
    if bias is None:
        bias = weight.new_zeros(weight.shape[0])
    return torch.ops.pycudnn.conv2d_add_relu(input, weight, z, bias, float(alpha), *geom)
