"""Fused training blocks: Conv-BN, Conv-BN-ReLU and Conv-BN-add-ReLU as one autograd node each.

`fuse_for_training` rewrites a model's ``Conv2d -> BatchNorm2d [-> (+ residual)] [-> ReLU]``
chains (traced with ``torch.fx``) into `ConvBn2d`, `ConvBnReLU2d` and `ConvBnAddReLU2d`. A
block in training mode runs the routed convolution, then one
``cudnnBatchNormalizationForwardTrainingEx`` (batch statistics, running statistics updated in
place, the residual add and the ReLU in one kernel); backward is one
``cudnnBatchNormalizationBackwardEx``, then the convolution's backward data and filter. cuDNN
fuses these only for its persistent NHWC kernels (float16 or bfloat16 channels-last input,
channels a multiple of 4, float32 batch-norm state): a call that does not fit runs the original
modules one after another, exactly as the model did.

The model is fused in place: its class becomes a subclass whose ``forward`` is the rewritten
graph's code, and the blocks, which own no parameters, sit beside the modules they replace, so
``state_dict`` keys, an optimizer and ``.to()`` keep working; `revert` turns the blocks back.
"""

from __future__ import annotations

import logging
import os
import threading
from ctypes import byref, c_size_t
from typing import Any

import torch
import torch.nn.functional as F

from pycudnn.cudnn.descriptors import TensorDescriptor
from pycudnn.cudnn.tensor_ops import relu_descriptor, scalar_pointers
from pycudnn.errors import CudnnBadParamError, CudnnNotSupportedError
from pycudnn.ffi import library as _lib
from pycudnn.runtime.handle import get_handle
from pycudnn.runtime.memory import callers_device, restore_device
from pycudnn.runtime.tensor.geometry import conv_output_size

from . import calls as _calls
from .calls import (DTYPE_NAMES, autocast_dtype, autocast_enabled, c_apply, geometry,
                    grad_enabled, normalize_geometry, pytorch_only, run_backward, run_forward,
                    threshold_backward)
from .block_routing import fused_keeps
from .library import AVAILABLE, compiler, define, dynamo_compiling, traced_conv2d

__all__ = ["ConvBn2d", "ConvBnReLU2d", "ConvBnAddReLU2d", "set_traced_blocks", "traced_blocks"]

_PERSISTENT = 2  # CUDNN_BATCHNORM_SPATIAL_PERSISTENT: PyTorch's mode for channels-last training
OPS_BN, OPS_RELU, OPS_ADD_RELU = 0, 1, 2  # cudnnBatchNormOps_t
_HALF = (torch.float16, torch.bfloat16)
_CL = torch.channels_last
_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
log = logging.getLogger("pycudnn")
_TRACED_MODES = ("modules", "operators")
_traced = os.environ.get("PYCUDNN_TORCH_TRACED_BLOCKS", "modules").strip().lower() or "modules"
if _traced not in _TRACED_MODES:
    _traced = "modules"


def set_traced_blocks(mode: str) -> None:
    """What ``torch.compile`` and ``torch.export`` see of a fused training block.

    ``"modules"`` (the default; ``PYCUDNN_TORCH_TRACED_BLOCKS``): the original convolution and
    batch norm, which inductor fuses with the add and the ReLU by itself, in less GPU and host
    time than cuDNN's fused batch norm takes as an operator (docs/torch.md has the figures).
    ``"operators"``: the convolution, then ``pycudnn::batch_norm_train`` (cuDNN's fused batch
    norm, add and ReLU), for a backend that does not fuse batch norm, or to export each block's
    batch norm as one operator. A compiled model recompiles when this changes."""
    global _traced
    if mode not in _TRACED_MODES:
        raise ValueError(f"set_traced_blocks: expected mode to be one of {list(_TRACED_MODES)}, "
                         f"got {mode!r}")
    _traced = mode


def traced_blocks() -> str:
    """The tracing mode of fused training blocks (see `set_traced_blocks`)."""
    return _traced


def caller_stream(device: int) -> int:
    """The caller's current stream on ``device``, as an int. Public as a seam for tests and
    tooling: a CPU run stands in for it."""
    if _raw_stream is not None:
        return int(_raw_stream(device))
    return int(torch.cuda.current_stream(device).cuda_stream)


class _Unfusable(Exception):
    """cuDNN refused the fused batch norm for this layout before running anything."""


# ---- the batch-norm launches of one layout ------------------------------------------------------

class _BnLayout:
    """The descriptors, sizes and C functions of the fused batch norm of one layout of the
    convolution's output (shape, strides, dtype, device) and one cudnnBatchNormOps_t."""

    __slots__ = ("x_desc", "p_desc", "xd", "pd", "act", "fwd_ws", "reserve", "bwd_ws", "forward",
                 "backward", "one", "zero", "ops", "channels", "stats_bytes", "saved_bytes")

    def __init__(self, c: Any, ops: int) -> None:
        self.x_desc = TensorDescriptor(tuple(c.shape), _DTYPE_NAMES[c.dtype], tuple(c.stride()))
        self.channels = int(c.shape[1])
        self.p_desc = TensorDescriptor((1, self.channels, 1, 1), "float32")
        self.xd, self.pd = self.x_desc.handle, self.p_desc.handle
        self.ops = ops
        self.act = relu_descriptor().handle if ops != OPS_BN else None
        self.one, self.zero = scalar_pointers("float32")
        L = _lib.lib()
        self.forward = L.cudnnBatchNormalizationForwardTrainingEx
        self.backward = L.cudnnBatchNormalizationBackwardEx
        dev = c.get_device()
        handle = get_handle(dev, caller_stream(dev))
        xd, pd = self.xd, self.pd
        fwd, res, bwd = c_size_t(), c_size_t(), c_size_t()
        for name, args in (
                ("cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize",
                 (handle, _PERSISTENT, ops, xd, xd, xd, pd, self.act, byref(fwd))),
                ("cudnnGetBatchNormalizationTrainingExReserveSpaceSize",
                 (handle, _PERSISTENT, ops, self.act, xd, byref(res))),
                ("cudnnGetBatchNormalizationBackwardExWorkspaceSize",
                 (handle, _PERSISTENT, ops, xd, xd, xd, xd, xd, pd, self.act, byref(bwd)))):
            st = getattr(L, name)(*args)
            if st:
                _lib.raise_status(st, name, f"  x: {self.x_desc!r}")
        self.fwd_ws, self.reserve, self.bwd_ws = fwd.value, res.value, bwd.value
        # what the forward leaves for the backward, in one allocation: the batch's mean and
        # 1/std (float32, C each), then cuDNN's reserve at a 256-byte boundary
        self.stats_bytes = -(-8 * self.channels // 256) * 256
        self.saved_bytes = self.stats_bytes + self.reserve


_LAYOUTS: dict[tuple[Any, ...], _BnLayout | None] = {}  # None: cuDNN refused this layout
_LAYOUTS_MAX = 1024
_lock = threading.Lock()


def bn_layout(c: Any, ops: int) -> _BnLayout | None:
    """cuDNN's fused batch norm for a convolution output like ``c`` (its reserve size and
    plans, remembered per layout), or None where cuDNN refuses that layout. Public as a seam for
    tests and tooling."""
    key = (c.shape, c.stride(), c.dtype, c.get_device(), ops)
    try:
        return _LAYOUTS[key]
    except KeyError:
        pass
    try:
        entry: _BnLayout | None = _BnLayout(c, ops)
    except (CudnnNotSupportedError, CudnnBadParamError):
        entry = None
    with _lock:
        while len(_LAYOUTS) >= _LAYOUTS_MAX:
            del _LAYOUTS[next(iter(_LAYOUTS))]
        _LAYOUTS[key] = entry
    return entry


def _refused(c: Any, ops: int) -> None:
    with _lock:
        _LAYOUTS[(c.shape, c.stride(), c.dtype, c.get_device(), ops)] = None


def remembered_layouts() -> list[_BnLayout]:
    """The fused batch norms remembered per output layout, those cuDNN took (the objects
    themselves). A seam for tests and tooling that count their launches."""
    return [e for e in list(_LAYOUTS.values()) if e is not None]


def clear_cache() -> None:
    """Forget the fused batch norm's descriptors (freed once no block uses them)."""
    with _lock:
        _LAYOUTS.clear()
        _outgrown.extend(_scratches.values())  # a captured graph may still point at them
        _scratches.clear()


_scratches: dict[tuple[int, int], Any] = {}
_outgrown: list[Any] = []  # replaced buffers, kept: a captured CUDA graph may still point at one


def workspace_pointer(n: int, device: Any) -> int | None:
    """The address of a workspace of at least ``n`` bytes for the current stream of ``device``:
    one kept buffer per stream (kernels on one stream run in order, so they can share it)."""
    if not n:
        return None
    d = device.index
    key = (d, caller_stream(d))
    buf = _scratches.get(key)
    if buf is None or buf.numel() < n:
        size = max(n, 1 << 20)
        if buf is not None:
            _outgrown.append(buf)
            size = max(n, 2 * buf.numel())
        buf = _scratches[key] = torch.empty(size, dtype=torch.uint8, device=device)
    return int(buf.data_ptr())


# ---- the autograd function ----------------------------------------------------------------------

class _ConvBnFunction(torch.autograd.Function):
    """``[relu](batch_norm(conv(x, w) + conv_bias) [+ z])`` with the batch's statistics, and its
    backward through cuDNN's fused batch-norm backward and the convolution's dgrad and wgrad."""

    @staticmethod
    def forward(ctx: Any, x: Any, w: Any, cb: Any, gamma: Any, beta: Any, z: Any,
                block: _ConvBnBase) -> Any:
        c, xd, wd, fmt, _ = run_forward("conv", x, w, cb, None, 1.0, block.geometry[0])
        # get_handle makes the tensors' device current: give the caller's back, as every other
        # entry point does (read after run_forward, which notes how many devices there are)
        prev = callers_device() if _calls._multi_gpu else None
        try:
            return _forward(ctx, c, xd, wd, fmt, x, w, cb, gamma, beta, z, block)
        finally:
            restore_device(prev)

    @staticmethod
    def backward(ctx: Any, gy: Any) -> tuple[Any, ...]:
        prev = callers_device() if _calls._multi_gpu else None
        try:
            return _backward(ctx, gy)
        finally:
            restore_device(prev)


def _forward(ctx: Any, c: Any, xd: Any, wd: Any, fmt: Any, x: Any, w: Any, cb: Any, gamma: Any,
             beta: Any, z: Any, block: _ConvBnBase) -> Any:
    ops = block.ops
    e = bn_layout(c, ops)
    if e is None or not c.is_contiguous(memory_format=_CL) or (
            z is not None and (z.stride() != c.stride() or z.shape != c.shape)):
        raise _Unfusable
    bn = block.bn
    dev = c.device
    y = torch.empty_like(c)
    saved = torch.empty(e.saved_bytes, dtype=torch.uint8, device=dev)
    mean = saved.data_ptr()
    ws = workspace_pointer(e.fwd_ws, dev)
    buffers = bn._buffers  # (nn.Module.__getattr__ costs a microsecond a name)
    rm: Any = buffers["running_mean"]
    rv: Any = buffers["running_var"]
    nbt: Any = buffers["num_batches_tracked"]
    factor = 0.0
    if bn.track_running_stats and rm is not None:
        # nn.BatchNorm2d's rule; momentum=None is the cumulative average (reads the count)
        factor = bn.momentum if bn.momentum is not None else 1.0 / (float(nbt) + 1.0)
    else:
        rm = rv = nbt = None
    d = dev.index
    st = e.forward(
        get_handle(d, caller_stream(d)), _PERSISTENT, ops, e.one, e.zero, e.xd, c.data_ptr(), e.xd,
        None if z is None else z.data_ptr(), e.xd, y.data_ptr(), e.pd, gamma.data_ptr(),
        beta.data_ptr(), factor, None if rm is None else rm.data_ptr(),
        None if rv is None else rv.data_ptr(), bn.eps, mean, mean + 4 * e.channels, e.act, ws,
        e.fwd_ws, mean + e.stats_bytes if e.reserve else None, e.reserve)
    if st:
        try:
            _lib.raise_status(st, "cudnnBatchNormalizationForwardTrainingEx",
                              f"  x: {e.x_desc!r}")
        except (CudnnNotSupportedError, CudnnBadParamError):
            _refused(c, ops)  # refused before running: nothing was written
            raise _Unfusable from None
    if nbt is not None:
        nbt.add_(1)
    # saved only what the backward reads, as PyTorch's unfused operators do, so that an input
    # changed in place after the block breaks no backward the unfused model runs: y only for
    # the ReLU's mask (a plain batch norm's output may be changed by an in-place activation);
    # the shift only where cuDNN's activation backward reads it; never z (its gradient is the
    # masked gradient) nor the convolution's bias (the batch norm takes its mean away); the
    # dense input and weight the convolution read only where they are copies
    relu = ops != OPS_BN
    dense = xd is not x or wd is not w
    ctx.save_for_backward(c, y if relu else None, saved, gamma, beta if relu else None, x, w,
                          xd if dense else None, wd if dense else None)
    # for the differentiable recomputation only, where their values do not change a gradient
    ctx.cb, ctx.beta, ctx.has_z = cb, beta, z is not None
    ctx.e, ctx.fmt, ctx.block = e, fmt, block
    return y


def _backward(ctx: Any, gy: Any) -> tuple[Any, ...]:
    c, y, saved, gamma, beta, x, w, xd, wd = ctx.saved_tensors
    block, e = ctx.block, ctx.e
    need_x, need_w, need_cb, need_gamma, need_beta, need_z, _ = ctx.needs_input_grad
    if grad_enabled():  # create_graph=True: through PyTorch's differentiable operators
        return recomputed_backward(block, gy, y, (x, w, ctx.cb, gamma, ctx.beta),
                                    ctx.needs_input_grad, ctx.has_z)
    if xd is None:
        xd, wd = x, w
    if not gy.is_contiguous(memory_format=_CL) or gy.stride() != c.stride():
        gy = gy.contiguous(memory_format=_CL)
    dev = c.device
    dc = torch.empty_like(c)
    dz = torch.empty_like(c) if e.ops == OPS_ADD_RELU else None
    dgamma = torch.empty(e.channels, dtype=torch.float32, device=dev)
    dbeta = torch.empty(e.channels, dtype=torch.float32, device=dev)
    ws = workspace_pointer(e.bwd_ws, dev)
    d = dev.index
    mean = saved.data_ptr()
    st = e.backward(
        get_handle(d, caller_stream(d)), _PERSISTENT, e.ops, e.one, e.zero, e.one, e.zero, e.xd,
        c.data_ptr(), e.xd, None if y is None else y.data_ptr(), e.xd, gy.data_ptr(), e.xd,
        None if dz is None else dz.data_ptr(), e.xd, dc.data_ptr(), e.pd, gamma.data_ptr(),
        None if beta is None else beta.data_ptr(), dgamma.data_ptr(), dbeta.data_ptr(),
        block.bn.eps, mean, mean + 4 * e.channels, e.act, ws, e.bwd_ws,
        mean + e.stats_bytes if e.reserve else None, e.reserve)
    if st:
        _lib.raise_status(st, "cudnnBatchNormalizationBackwardEx", f"  x: {e.x_desc!r}")
    geom, fmt = block.geometry[0], ctx.fmt
    gx, gw, _ = run_backward(dc, xd, wd, fmt, geom, need_x, need_w)
    gcb = dc.sum((0, 2, 3)) if need_cb else None
    return (gx, gw, gcb, dgamma if need_gamma else None, dbeta if need_beta else None,
            dz if need_z else None, None)


def recomputed_backward(block: _ConvBnBase, gy: Any, y: Any, inputs: tuple[Any, ...],
                        needs: tuple[bool, ...], has_z: bool) -> tuple[Any, ...]:
    """The gradients of a block's training forward, recomputed from its inputs with PyTorch's
    differentiable operators (batch statistics; the running statistics are left alone): the
    backward of a graph built with ``create_graph=True`` can then be differentiated again.

    The ReLU's mask is the forward's output ``y`` (as PyTorch's ReLU takes it), so z is not
    needed: its gradient is the masked gradient. Public as a seam for tests and tooling."""
    x, w, cb, gamma, beta = inputs
    c = F.conv2d(x, w, cb, *block.geometry[0])
    yb = F.batch_norm(c, None, None, gamma, beta, True, 0.0, block.bn.eps)
    g = gy if block.ops == OPS_BN else torch.where(y.detach() > 0, gy, gy.new_zeros(()))
    wanted = [t for t, n in zip(inputs, needs) if n and t is not None]
    grads = iter(torch.autograd.grad(yb, wanted, g, create_graph=True) if wanted else ())
    out = [next(grads) if n and t is not None else None for t, n in zip(inputs, needs)]
    return (*out, g if has_z and needs[5] else None, None)


apply_block = c_apply(_ConvBnFunction)


def fused_call(block: _ConvBnBase, x: Any, w: Any, cb: Any, z: Any) -> Any:
    """``block``'s fused node on these tensors and weights, with its batch norm's parameters;
    raises `_Unfusable` where cuDNN refuses them. Public as a seam for tests and tooling."""
    return apply_block(x, w, cb, block.bn.weight, block.bn.bias, z, block)


# ---- the blocks as custom operators: what torch.compile and torch.export see ---------------------
# A launch through raw pointers is opaque to dynamo and impossible on fake tensors. Traced, a
# block is its convolution (library.traced_conv2d: pycudnn's operator or, where routing gave the
# signature to PyTorch, F.conv2d), then pycudnn::batch_norm_train: cuDNN's fused batch norm [+ z]
# [+ ReLU] kernel as a functional operator returning the output, the batch's mean and 1/std and
# cuDNN's reserve, which its registered backward, pycudnn::batch_norm_train_backward (cuDNN's
# fused backward), reads. An operator with registered autograd cannot mutate its arguments, so
# the running statistics are updated from the returned statistics by PyTorch operations on the
# batch norm's buffers in the traced code: dynamo models that mutation and inductor fuses it.
# Both operators also run with PyTorch's own batch norm (``native_batch_norm`` and its
# backward, the same math): on CPU tensors, and on CUDA ones with ``reserve_size=-1``.

def _acc(input: Any, weight: Any) -> Any:
    dtype = torch.promote_types(input.dtype, weight.dtype)
    return torch.float32 if dtype in _HALF else dtype


def _empty_cl(like: Any) -> Any:
    return torch.empty(like.shape, dtype=like.dtype, device=like.device, memory_format=_CL)


def _dense_cl(t: Any) -> Any:
    """``t`` with the strides of ``torch.empty(..., memory_format=channels_last)`` (the layout
    the fused batch norm's descriptors are made for), copied only where it has others."""
    _, c, h, w = t.shape
    return t if t.stride() == (h * w * c, 1, w * c, c) else _empty_cl(t).copy_(t)


def _bn_check(fn: str, input: Any, weight: Any, bias: Any, z: Any, relu: bool,
              reserve_size: int) -> None:
    if input.dim() != 4:
        raise ValueError(f"{fn}: expected a 4-D input (N, C, H, W), got {input.dim()}-D")
    c = input.shape[1]
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and (t.dim() != 1 or t.shape[0] != c):
            raise ValueError(f"{fn}: expected {name} of shape [{c}] (the input's channels), got "
                             f"{list(t.shape)}")
    if z is not None:
        if not relu:
            raise ValueError(f"{fn}: z (the residual add) needs relu=True: cuDNN fuses the add "
                             f"only before a ReLU")
        if z.shape != input.shape or z.dtype != input.dtype:
            raise ValueError(f"{fn}: expected z of the input's shape {list(input.shape)} and "
                             f"dtype {input.dtype}, got {list(z.shape)} and {z.dtype}")
    if reserve_size < -1:
        raise ValueError(f"{fn}: expected reserve_size >= -1, got {reserve_size}")


def _ops_of(relu: bool, add: bool) -> int:
    return OPS_ADD_RELU if add else OPS_RELU if relu else OPS_BN


def _cudnn_layout(fn: str, c: Any, weight: Any, bias: Any, ops: int,
                  reserve_size: int) -> _BnLayout:
    """The fused batch norm's layout for the dense channels-last ``c``, checked against what
    the graph was traced with (a new layout takes a handle: the caller restores the device)."""
    dtypes = (weight.dtype, torch.float32 if bias is None else bias.dtype)
    if c.dtype not in _HALF or dtypes != (torch.float32, torch.float32):
        raise ValueError(f"{fn}: cuDNN's fused batch norm (reserve_size >= 0) takes float16 or "
                         f"bfloat16 input with float32 weight and bias, got {c.dtype}, "
                         f"{dtypes[0]} and {dtypes[1]}; reserve_size=-1 computes with "
                         f"PyTorch's operators")
    e = bn_layout(c, ops)
    if e is None:
        raise ValueError(f"{fn}: cuDNN's fused batch norm refuses this layout ({list(c.shape)}, "
                         f"{c.dtype}); reserve_size=-1 computes with PyTorch's operators")
    if e.reserve != reserve_size:
        raise ValueError(f"{fn}: expected reserve_size={e.reserve} (cuDNN's reserve for this "
                         f"layout) or -1, got {reserve_size}")
    return e


def _bn_train_reference(input: Any, weight: Any, bias: Any, z: Any, relu: bool, eps: float,
                        reserve_size: int) -> tuple[Any, Any, Any, Any]:
    _bn_check("pycudnn::batch_norm_train", input, weight, bias, z, relu, reserve_size)
    acc = _acc(input, weight)
    out, mean, invstd = torch.ops.aten.native_batch_norm(
        input.to(acc), weight.to(acc), bias.to(acc), None, None, True, 0.0, eps)
    if z is not None:
        out = out + z
    if relu:
        out = torch.relu(out)
    reserve = torch.zeros(max(reserve_size, 0), dtype=torch.uint8, device=input.device)
    return (_empty_cl(input).copy_(out), mean.to(weight.dtype), invstd.to(weight.dtype),
            reserve)


def _bn_train_cuda(input: Any, weight: Any, bias: Any, z: Any, relu: bool, eps: float,
                   reserve_size: int) -> tuple[Any, Any, Any, Any]:
    if reserve_size < 0:
        return _bn_train_reference(input, weight, bias, z, relu, eps, reserve_size)
    fn = "pycudnn::batch_norm_train"
    _bn_check(fn, input, weight, bias, z, relu, reserve_size)
    prev = callers_device() if _calls._multi_gpu else None
    try:
        c = _dense_cl(input)
        e = _cudnn_layout(fn, c, weight, bias, _ops_of(relu, z is not None), reserve_size)
        zc = None if z is None else _dense_cl(z)
        weight, bias = weight.contiguous(), bias.contiguous()
        dev = c.device
        d = dev.index
        y = torch.empty_like(c)
        mean = torch.empty(e.channels, dtype=torch.float32, device=dev)
        invstd = torch.empty(e.channels, dtype=torch.float32, device=dev)
        reserve = torch.empty(e.reserve, dtype=torch.uint8, device=dev)
        # a workspace per call from PyTorch's allocator: a buffer kept across calls would be
        # one a CUDA-graph tree's memory pool check refuses
        ws = torch.empty(e.fwd_ws, dtype=torch.uint8, device=dev) if e.fwd_ws else None
        # no running statistics: the traced code updates them from mean and invstd
        st = e.forward(
            get_handle(d, caller_stream(d)), _PERSISTENT, e.ops, e.one, e.zero, e.xd, c.data_ptr(),
            e.xd, None if zc is None else zc.data_ptr(), e.xd, y.data_ptr(), e.pd,
            weight.data_ptr(), bias.data_ptr(), 0.0, None, None, eps, mean.data_ptr(),
            invstd.data_ptr(), e.act, None if ws is None else ws.data_ptr(), e.fwd_ws,
            reserve.data_ptr() if e.reserve else None, e.reserve)
        if st:
            _lib.raise_status(st, "cudnnBatchNormalizationForwardTrainingEx",
                              f"  x: {e.x_desc!r}")
    finally:
        restore_device(prev)
    return y, mean, invstd, reserve


def _bn_train_fake(input: Any, weight: Any, bias: Any, z: Any, relu: bool, eps: float,
                   reserve_size: int) -> tuple[Any, Any, Any, Any]:
    _bn_check("pycudnn::batch_norm_train", input, weight, bias, z, relu, reserve_size)
    dev = input.device
    return (_empty_cl(input), torch.empty(input.shape[1], dtype=weight.dtype, device=dev),
            torch.empty(input.shape[1], dtype=weight.dtype, device=dev),
            torch.empty(max(reserve_size, 0), dtype=torch.uint8, device=dev))


def _bn_backward_check(fn: str, grad_output: Any, input: Any, output: Any, relu: bool) -> None:
    if grad_output.shape != input.shape:
        raise ValueError(f"{fn}: expected grad_output of the input's shape {list(input.shape)}, "
                         f"got {list(grad_output.shape)}")
    if relu and (output is None or output.shape != input.shape):
        raise ValueError(f"{fn}: relu=True needs the forward's output (its mask), of the "
                         f"input's shape {list(input.shape)}")


def _bn_backward_reference(grad_output: Any, input: Any, output: Any, weight: Any, bias: Any,
                           save_mean: Any, save_invstd: Any, reserve: Any, relu: bool, add: bool,
                           eps: float, reserve_size: int) -> tuple[Any, Any, Any, Any]:
    _bn_backward_check("pycudnn::batch_norm_train_backward", grad_output, input, output, relu)
    acc = _acc(input, weight)
    g = threshold_backward(grad_output, output, 0) if relu else grad_output
    gx, gw, gb = torch.ops.aten.native_batch_norm_backward(
        g.to(acc), input.to(acc), weight.to(acc), None, None, save_mean.to(acc),
        save_invstd.to(acc), True, eps, [True, True, True])
    gz = _empty_cl(input).copy_(g) if add else input.new_empty(0)
    return _empty_cl(input).copy_(gx), gw.to(weight.dtype), gb.to(weight.dtype), gz


def _bn_backward_cuda(grad_output: Any, input: Any, output: Any, weight: Any, bias: Any,
                      save_mean: Any, save_invstd: Any, reserve: Any, relu: bool, add: bool,
                      eps: float, reserve_size: int) -> tuple[Any, Any, Any, Any]:
    if reserve_size < 0:
        return _bn_backward_reference(grad_output, input, output, weight, bias, save_mean,
                                      save_invstd, reserve, relu, add, eps, reserve_size)
    fn = "pycudnn::batch_norm_train_backward"
    _bn_backward_check(fn, grad_output, input, output, relu)
    prev = callers_device() if _calls._multi_gpu else None
    try:
        c = _dense_cl(input)
        e = _cudnn_layout(fn, c, weight, bias, _ops_of(relu, add), reserve_size)
        if reserve.numel() != e.reserve:
            raise ValueError(f"{fn}: expected a reserve of {e.reserve} bytes (the forward's), "
                             f"got {reserve.numel()}")
        gy = _dense_cl(grad_output)
        y = _dense_cl(output) if relu else None
        gamma = weight.contiguous()
        beta = bias.contiguous() if relu and bias is not None else None
        dev = c.device
        d = dev.index
        dc = torch.empty_like(c)
        dz = torch.empty_like(c) if add else c.new_empty(0)
        dgamma = torch.empty(e.channels, dtype=torch.float32, device=dev)
        dbeta = torch.empty(e.channels, dtype=torch.float32, device=dev)
        ws = torch.empty(e.bwd_ws, dtype=torch.uint8, device=dev) if e.bwd_ws else None
        st = e.backward(
            get_handle(d, caller_stream(d)), _PERSISTENT, e.ops, e.one, e.zero, e.one, e.zero, e.xd,
            c.data_ptr(), e.xd, None if y is None else y.data_ptr(), e.xd, gy.data_ptr(), e.xd,
            dz.data_ptr() if add else None, e.xd, dc.data_ptr(), e.pd,
            gamma.data_ptr(), None if beta is None else beta.data_ptr(),
            dgamma.data_ptr(), dbeta.data_ptr(), eps, save_mean.data_ptr(),
            save_invstd.data_ptr(), e.act, None if ws is None else ws.data_ptr(), e.bwd_ws,
            reserve.data_ptr() if e.reserve else None, e.reserve)
        if st:
            _lib.raise_status(st, "cudnnBatchNormalizationBackwardEx", f"  x: {e.x_desc!r}")
    finally:
        restore_device(prev)
    return dc, dgamma, dbeta, dz


def _bn_backward_fake(grad_output: Any, input: Any, output: Any, weight: Any, bias: Any,
                      save_mean: Any, save_invstd: Any, reserve: Any, relu: bool, add: bool,
                      eps: float, reserve_size: int) -> tuple[Any, Any, Any, Any]:
    _bn_backward_check("pycudnn::batch_norm_train_backward", grad_output, input, output, relu)
    dev = input.device
    return (_empty_cl(input), torch.empty(input.shape[1], dtype=weight.dtype, device=dev),
            torch.empty(input.shape[1], dtype=weight.dtype, device=dev),
            _empty_cl(input) if add else input.new_empty(0))


def _bn_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
    c, w, b, z, relu, eps, reserve_size = inputs
    y, mean, invstd, reserve = output
    # the output only for the ReLU's mask, the shift only where cuDNN's activation backward
    # reads it, never z (its gradient is the masked gradient), as the eager block saves
    ctx.save_for_backward(c, y if relu else None, w, b if relu else None, mean, invstd, reserve)
    ctx.relu, ctx.add, ctx.eps, ctx.reserve_size = relu, z is not None, eps, reserve_size
    ctx.mark_non_differentiable(mean, invstd, reserve)


def _bn_backward(ctx: Any, gy: Any, *unused: Any) -> tuple[Any, ...]:
    c, y, w, b, mean, invstd, reserve = ctx.saved_tensors
    need_c, need_w, need_b, need_z = ctx.needs_input_grad[:4]
    if torch.is_grad_enabled():  # create_graph=True: through PyTorch's differentiable operators
        gc, gw, gb, gz = _bn_recomputed_backward(ctx, gy, c, y, w)
    else:
        gc, gw, gb, gz = torch.ops.pycudnn.batch_norm_train_backward(
            gy, c, y, w, b, mean, invstd, reserve, ctx.relu, ctx.add, ctx.eps, ctx.reserve_size)
    return (gc if need_c else None, gw if need_w else None, gb if need_b else None,
            gz if ctx.add and need_z else None, None, None, None)


def _bn_recomputed_backward(ctx: Any, gy: Any, c: Any, y: Any, w: Any) -> tuple[Any, ...]:
    """The operator's gradients through PyTorch's batch norm on the saved input (batch
    statistics), which autograd can differentiate again; the ReLU's mask is the output's."""
    g = torch.where(y.detach() > 0, gy, gy.new_zeros(())) if ctx.relu else gy
    acc = _acc(c, w)
    wanted = [t for t in (c, w) if t.requires_grad]
    grads: tuple[Any, ...] = ()
    if wanted:
        yb = F.batch_norm(c.to(acc), None, None, w.to(acc), None, True, 0.0, ctx.eps)
        grads = torch.autograd.grad(yb, wanted, g.to(acc), create_graph=True)
    got = iter(grads)
    gc, gw = (next(got).to(t.dtype) if t.requires_grad else None for t in (c, w))
    return gc, gw, g.sum((0, 2, 3)).to(w.dtype), g


if AVAILABLE:
    define("batch_norm_train", _bn_train_cuda, _bn_train_fake, _bn_backward,
           _bn_setup).register_kernel("cpu", _bn_train_reference)
    define("batch_norm_train_backward", _bn_backward_cuda,
           _bn_backward_fake).register_kernel("cpu", _bn_backward_reference)


class _OutputSpec:
    """What `bn_layout` reads of a tensor, for a dense channels-last output not made yet."""

    __slots__ = ("device", "dtype", "shape")

    def __init__(self, shape: tuple[int, ...], dtype: Any, device: int) -> None:
        self.shape, self.dtype, self.device = torch.Size(shape), dtype, device

    def stride(self) -> tuple[int, ...]:
        _, c, h, w = self.shape
        return (h * w * c, 1, w * c, c)

    def get_device(self) -> int:
        return self.device


def reserve_size_for(signature: tuple[Any, ...]) -> int:
    """cuDNN's reserve size for the fused batch norm of a dense channels-last output
    ``(shape, dtype name, device index, ops)``, or -1 where cuDNN refuses that layout. dynamo
    calls this while it traces (``assume_constant_result``: run once, its answer baked into the
    graph), outside the fake-tensor mode. Public as a seam for tests and tooling."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    shape, dtype, device, ops = signature
    with unset_fake_temporarily():
        e = bn_layout(_OutputSpec(shape, getattr(torch, dtype), device), ops)
    return -1 if e is None else int(e.reserve)


if AVAILABLE:
    reserve_size_for = torch._dynamo.assume_constant_result(reserve_size_for)


def traced_block(block: _ConvBnBase, x: Any, z: Any) -> Any:
    """A training-mode block as dynamo or ``torch.export`` traces it: the convolution, then
    ``pycudnn::batch_norm_train`` and the running statistics' update; or None, to trace the
    original modules: a CUDA call that cuDNN's fused kernels do not take (as in eager), with
    shapes that are not static (cuDNN's reserve is sized at trace time), or without
    ``torch.library.custom_op``. CPU calls take the operator with PyTorch's batch norm."""
    if not AVAILABLE or not isinstance(z, (torch.Tensor, type(None))) or x.dim() != 4:
        return None
    bn, conv = block.bn, block.conv
    w, cb = conv.weight, conv.bias
    if x.is_cuda and torch.is_autocast_enabled("cuda"):
        dt = torch.get_autocast_dtype("cuda")
        x, w = x.to(dt), w.to(dt)
        cb = None if cb is None else cb.to(dt)
    gamma, beta = bn.weight, bn.bias
    if gamma is None or beta is None:
        return None
    geom, pre_pad = normalize_geometry(conv.stride, conv.padding, conv.dilation, conv.groups,
                                       w.shape[2:])
    out = _conv_out_shape(x, w, geom)
    if pre_pad is not None or (z is not None and (list(z.shape) != out or z.dtype != x.dtype)):
        return None
    reserve = -1
    if x.is_cuda:
        if not _fits(bn, x, w, z) or not all(isinstance(n, int) for n in out):
            return None
        reserve = reserve_size_for((tuple(out), DTYPE_NAMES[x.dtype], x.device.index, block.ops))
        if reserve < 0:
            return None
    if x.shape[0] == 1:
        check_values_per_channel(x, w, geom)
    c = traced_conv2d(x, w, cb, *geom) if x.is_cuda else F.conv2d(x, w, cb, *geom)
    y, mean, invstd, _ = torch.ops.pycudnn.batch_norm_train(c, gamma, beta, z,
                                                            block.ops != OPS_BN, bn.eps, reserve)
    _update_running_stats(bn, mean, invstd, out[0] * out[2] * out[3])
    return y


def _update_running_stats(bn: Any, mean: Any, invstd: Any, count: Any) -> None:
    """nn.BatchNorm2d's training update of ``bn``'s buffers from the batch's mean and 1/std
    (the unbiased variance for ``running_var``), as PyTorch operations the graph holds."""
    rm, rv, nbt = bn.running_mean, bn.running_var, bn.num_batches_tracked
    if not bn.track_running_stats or rm is None or rv is None:
        return
    factor: Any = 0.0 if bn.momentum is None else bn.momentum
    if nbt is not None:
        nbt.add_(1)
        if bn.momentum is None:  # the cumulative average
            factor = 1.0 / nbt.to(rm.dtype)
    var = (invstd.to(rv.dtype).pow(-2) - bn.eps) * (count / (count - 1))
    rm.mul_(1 - factor).add_(mean.to(rm.dtype) * factor)
    rv.mul_(1 - factor).add_(var * factor)


# ---- the modules --------------------------------------------------------------------------------

class _ConvBnBase(torch.nn.Module):
    """A convolution and the batch norm after it (both the model's own modules, not registered
    here: they stay where they were), with the epilogue that ``ops`` names."""

    ops = OPS_BN
    conv: torch.nn.Conv2d
    bn: torch.nn.BatchNorm2d
    #: (call key, whether the fused node runs it): `block_routing.fused_keeps`'s last decision
    _route: tuple[Any, bool] | None = None

    def __init__(self, conv: torch.nn.Conv2d, bn: torch.nn.BatchNorm2d, conv_name: str = "",
                 bn_name: str = "") -> None:
        super().__init__()
        if type(bn) is not torch.nn.BatchNorm2d:
            raise TypeError(f"{type(self).__name__}: expected bn to be a torch.nn.BatchNorm2d, "
                            f"got {type(bn).__name__}")
        if not isinstance(conv, torch.nn.Conv2d) or conv.padding_mode != "zeros":
            raise TypeError(f"{type(self).__name__}: expected conv to be a torch.nn.Conv2d with "
                            f"padding_mode='zeros', got {conv!r}")
        if conv.out_channels != bn.num_features:
            raise ValueError(f"{type(self).__name__}: the convolution has {conv.out_channels} "
                             f"output channels but the batch norm {bn.num_features} features")
        # plain attributes, not submodules: the model keeps them under their own names
        object.__setattr__(self, "conv", conv)
        object.__setattr__(self, "bn", bn)
        self.conv_name, self.bn_name = conv_name, bn_name
        self._geom: tuple[Any, ...] | None = None

    @property
    def geometry(self) -> tuple[tuple[Any, ...], Any]:
        """``(geom, pre_pad)`` of the convolution, normalized once per setting."""
        conv = self.conv
        key = (conv.stride, conv.padding, conv.dilation, conv.groups)
        cached = self._geom
        if cached is None or cached[0] != key:
            cached = self._geom = (key, *geometry(conv.stride, conv.padding, conv.dilation,
                                                  conv.groups, conv.weight))
        return cached[1], cached[2]

    def extra_repr(self) -> str:
        return f"conv={self.conv_name or self.conv!r}, bn={self.bn_name or self.bn!r}"

    def _fused(self, x: Any, z: Any) -> Any:
        """The fused call, or None where this call does not fit cuDNN's fused kernels."""
        bn, conv = self.bn, self.conv
        if not bn.training or pytorch_only() or has_hooks(conv) or has_hooks(bn):
            return None  # hooks (prune, weight_norm, ...) run where the modules are called
        if dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile, torch.export
            return traced_block(self, x, z) if _traced == "operators" else None
        if not x.is_cuda:
            return None
        w, cb = conv.weight, conv.bias
        if autocast_enabled():
            dt = autocast_dtype()
            x, w = x.to(dt), w.to(dt)
            cb = None if cb is None else cb.to(dt)
            if z is not None and z.dtype is not dt:
                return None
        if not _fits(bn, x, w, z) or self.geometry[1] is not None:
            return None
        gamma, beta = bn.weight, bn.bias
        if x.shape[0] == 1:
            check_values_per_channel(x, w, self.geometry[0])
        if z is not None and not z.is_contiguous(memory_format=_CL):
            z = z.contiguous(memory_format=_CL)
        if not fused_keeps(self, x, w, cb, z, fused_call):
            return None  # measured: the original modules run this block faster
        try:
            return apply_block(x, w, cb, gamma, beta, z, self)
        except _Unfusable:
            return None

    def _plain(self, x: Any, z: Any) -> Any:
        y = self.bn(self.conv(x))
        if z is not None:
            y = y + z
        return torch.relu(y) if self.ops != OPS_BN else y


def _fits(bn: Any, x: Any, w: Any, z: Any) -> bool:
    """Whether cuDNN's fused kernels take these tensors (the input and weight as the convolution
    gets them, the shortcut ``z``): float16/bfloat16 channels-last data, float32 batch-norm
    parameters and statistics, channels a multiple of 4 (the layout itself is cuDNN's to
    accept)."""
    gamma, beta = bn.weight, bn.bias
    return not (x.dtype not in _HALF or x.dim() != 4 or gamma is None or beta is None
                or gamma.dtype is not torch.float32 or beta.dtype is not torch.float32
                or w.dtype is not x.dtype or bn.num_features % 4
                or (bn.running_mean is not None and bn.running_mean.dtype is not torch.float32)
                or (z is not None and z.dtype is not x.dtype)
                or not (x.is_contiguous(memory_format=_CL) or w.is_contiguous(memory_format=_CL)))


def _conv_out_shape(x: Any, w: Any, geom: tuple[Any, ...]) -> list[Any]:
    stride, padding, dilation, _ = geom
    return [x.shape[0], w.shape[0],
            *conv_output_size(x.shape[2:], w.shape[2:], stride, padding, dilation)]


def check_values_per_channel(x: Any, w: Any, geom: tuple[Any, ...]) -> None:
    """nn.BatchNorm2d's refusal of one value per channel in training (the unbiased variance for
    ``running_var`` would divide by zero), made before the convolution runs.
    Public as a seam for tests and tooling."""
    size = _conv_out_shape(x, w, geom)
    if size[0] * size[2] * size[3] == 1:
        raise ValueError(f"Expected more than 1 value per channel when training, got input size "
                         f"{torch.Size(size)}")


class ConvBn2d(_ConvBnBase):
    """``bn(conv(x))`` as one node (made by `fuse_for_training`)."""

    ops = OPS_BN

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._fused(x, None)
        return self._plain(x, None) if y is None else y


class ConvBnReLU2d(_ConvBnBase):
    """``relu(bn(conv(x)))`` as one node (made by `fuse_for_training`)."""

    ops = OPS_RELU

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._fused(x, None)
        return self._plain(x, None) if y is None else y


class ConvBnAddReLU2d(_ConvBnBase):
    """``relu(bn(conv(x)) + z)`` as one node: a residual block's last convolution, its batch norm,
    the shortcut's add and the ReLU (made by `fuse_for_training`)."""

    ops = OPS_ADD_RELU

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        y = self._fused(x, z) if isinstance(z, torch.Tensor) else None
        return self._plain(x, z) if y is None else y


#: the fused training blocks (what `fuse_for_training` puts in a model)
BLOCKS = (ConvBn2d, ConvBnReLU2d, ConvBnAddReLU2d)


def has_hooks(module: Any) -> bool:
    """Whether ``module`` has forward, forward pre- or backward hooks (torch.nn.utils.prune and
    the old weight_norm / spectral_norm are forward pre-hooks): a fused block calls no module, so
    these modules must run as they are."""
    d = module.__dict__
    return bool(d.get("_forward_hooks") or d.get("_forward_pre_hooks")
                or d.get("_backward_hooks") or d.get("_backward_pre_hooks"))
