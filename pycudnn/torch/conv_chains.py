"""Batch norms fused into the convolutions on either side of them, for ``Conv -> BN -> ReLU ->
Conv`` chains (`fuse_for_training(model, into_convolutions=True)`): `ConvStats2d` runs the
first convolution and sums its output per channel in the same kernel; `BnReLUConv2d` finalizes
the batch norm from those sums and runs the next convolution reading its input through the
batch norm's scale, bias and ReLU, so the normalized activation is never written. The graphs
are `pycudnn.cudnn.graph.batchnorm`'s; the data flow is in docs/architecture.md.

A chain module passes ``(y, sums, sqsums)`` to the next; where a call does not fit the fused
graphs (eval mode, CPU, full precision, a traced call, a shape cuDNN has no engine for) the sums
are None and each module runs the model's own modules.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, NamedTuple, Sequence

import torch

from pycudnn.cudnn import graph as G
from pycudnn.errors import CudnnError, NoAlgorithmError
from pycudnn.runtime.handle import get_handle
from pycudnn.runtime.memory import callers_device, relaxed_capture_mode, restore_device
from pycudnn.runtime.tensor.geometry import channels_last_strides, conv_output_size

from . import calls as _calls
from .calls import (DTYPE_NAMES, autocast_dtype, autocast_enabled, c_apply, grad_enabled,
                    pytorch_only)
from .library import compiler, dynamo_compiling
from .training import caller_stream, has_hooks, workspace_pointer

__all__ = ["ConvStats2d", "BnReLUConv2d", "CHAIN_BLOCKS", "REFERENCE_KERNELS", "KernelRefused",
           "clear_cache", "use_kernels"]

_HALF = (torch.float16, torch.bfloat16)
_CL = torch.channels_last


class Geometry(NamedTuple):
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]


def _geometry(conv: torch.nn.Conv2d) -> Geometry:
    def pair(v: Any) -> tuple[int, int]:
        return int(v[0]), int(v[1])

    return Geometry(pair(conv.stride), pair(conv.padding), pair(conv.dilation))


# ---- the kernels: cuDNN's graphs, and the same arithmetic in PyTorch operations ------------------

class KernelRefused(Exception):
    """Raised by a kernel set where it cannot take a call (cuDNN has no engine for one of its
    graphs): raised in the forward, before any state changes, the call runs the model's
    modules; in the backward, PyTorch's operations compute that piece."""


class ReferenceKernels:
    """The fused graphs' arithmetic in PyTorch operations, on any device and dtype: what the
    chain's autograd functions compute, for tests on the CPU in float64 (cuDNN's graphs are
    checked against float64 apart, in test_graph_batchnorm_gpu.py)."""

    @staticmethod
    def _prologue(x: Any, scale: Any, bias: Any) -> Any:
        """``relu(x * scale + bias)`` per channel in the statistics' precision, read back in
        x's type (as the convolution reads it)."""
        return torch.relu(x.to(scale.dtype) * scale.view(1, -1, 1, 1)
                          + bias.view(1, -1, 1, 1)).to(x.dtype)

    def prepare_backward(self, x: Any, w: Any, g: Geometry) -> None:
        """Nothing to build: every shape has these operations."""

    def conv_stats(self, x: Any, w: Any, g: Geometry, scale: Any = None,
                   bias: Any = None) -> tuple[Any, Any, Any]:
        if scale is not None:
            x = self._prologue(x, scale, bias)
        y = torch.nn.functional.conv2d(x, w, None, g.stride, g.padding, g.dilation)
        yf = y.to(torch.promote_types(y.dtype, torch.float32))
        return y, yf.sum((0, 2, 3)), (yf * yf).sum((0, 2, 3))

    def finalize(self, sums: Any, sqsums: Any, gamma: Any, beta: Any, rm: Any, rv: Any,
                 count: int, eps: float, momentum: float) -> tuple[Any, Any, Any, Any]:
        mean = sums / count
        var = (sqsums / count - mean * mean).clamp_min(0)
        inv_std = (var + eps).rsqrt()
        scale = gamma * inv_std
        rm.mul_(1 - momentum).add_(mean.to(rm.dtype), alpha=momentum)
        rv.mul_(1 - momentum).add_((var * (count / max(count - 1, 1))).to(rv.dtype),
                                   alpha=momentum)
        return mean, inv_std, scale, beta - mean * scale

    def sbr_wgrad(self, x: Any, dy: Any, scale: Any, bias: Any, w: Any, g: Geometry) -> Any:
        return torch.ops.aten.convolution_backward(
            dy, self._prologue(x, scale, bias), w, None, g.stride, g.padding, g.dilation, False, [0, 0], 1,
            [False, True, False])[1]

    def dgrad_drelu_dbn(self, dy: Any, w: Any, x: Any, mean: Any, inv_std: Any, gamma: Any,
                        beta: Any, g: Geometry) -> tuple[Any, ...]:
        shape = [1, -1, 1, 1]
        gx = torch.ops.aten.convolution_backward(
            dy, x, w, None, g.stride, g.padding, g.dilation, False, [0, 0], 1,
            [True, False, False])[0]
        xf = x.to(mean.dtype)
        normed = (xf - mean.view(shape)) * inv_std.view(shape)
        dxr = torch.where(normed * gamma.view(shape) + beta.view(shape) > 0, gx,
                          gx.new_zeros(())).to(x.dtype)
        df = dxr.to(mean.dtype)
        dgamma, dbeta = (df * normed).sum((0, 2, 3)), df.sum((0, 2, 3))
        count = x.numel() // x.shape[1]
        eq_dy = gamma * inv_std
        eq_x = -gamma * inv_std * inv_std * dgamma / count
        eq_b = -eq_dy * dbeta / count - eq_x * mean
        return dxr, dgamma, dbeta, eq_dy, eq_x, eq_b

    def dx_apply(self, dxr: Any, x: Any, eq_dy: Any, eq_x: Any, eq_b: Any) -> Any:
        shape = [1, -1, 1, 1]
        out = (dxr.to(eq_dy.dtype) * eq_dy.view(shape) + x.to(eq_x.dtype) * eq_x.view(shape)
               + eq_b.view(shape))
        return out.to(x.dtype).contiguous(memory_format=_suggest(x))


def _suggest(t: Any) -> Any:
    return _CL if t.dim() == 4 and t.is_contiguous(memory_format=_CL) else torch.contiguous_format


REFERENCE_KERNELS = ReferenceKernels()


#: a tensor's shape, strides and dtype: what a plan is built for
_Layout = tuple[tuple[int, ...], tuple[int, ...], Any]


def _layout(t: Any) -> _Layout:
    return (tuple(t.shape), tuple(t.stride()), t.dtype)


def _layout_spec(uid: int, layout: _Layout) -> G.TensorSpec:
    return G.TensorSpec(uid, layout[0], layout[1], DTYPE_NAMES[layout[2]])


def _spec(uid: int, t: Any) -> G.TensorSpec:
    return _layout_spec(uid, _layout(t))


class _Plan(NamedTuple):
    plan: G.ExecutionPlan
    workspace: int
    #: the data type the prologue's scale and bias are passed in (None: float32, as given)
    operand_dtype: Any = None


def _operands(p: _Plan, scale: Any, bias: Any) -> tuple[Any, Any]:
    """The prologue's scale and bias in the type ``p`` takes them."""
    if p.operand_dtype is None:
        return scale, bias
    return scale.to(p.operand_dtype), bias.to(p.operand_dtype)


def _first_plan(h: int, build: Any, operand_dtype: Any) -> _Plan | None:
    """The first engine config of ``build(h)``'s graph that finalizes, or None (cuDNN refused
    the graph or has no engine for it)."""
    graph = None
    cands: list[Any] = []
    p = None
    try:
        graph = build(h)
        cands = G.engine_configs(h, graph, ("A", "FALLBACK"))
        plan, _ = G.first_plan(h, cands, max_attempts=8)
        p = _Plan(plan, plan.workspace_size or 0, operand_dtype)
    except (CudnnError, NoAlgorithmError):
        if graph is not None:
            graph.close()
    for c in cands:
        if p is None or c is not p.plan.config:
            c.close()
    return p


class CudnnKernels:
    """The same kernels as cuDNN graphs: one plan per graph and tensor layout, built on first use
    (the first data types of `G.PROLOGUE_DTYPES` and engine config that finalize, in relaxed
    capture mode so a caller's CUDA-graph capture survives it); a layout cuDNN has no engine
    for is remembered and refused."""

    def __init__(self) -> None:
        self._plans: dict[tuple[Any, ...], _Plan | None] = {}
        #: the (x, w, geometry, device) calls whose backward plans are built: one lookup a call
        self._prepared: set[tuple[Any, ...]] = set()
        self._lock = threading.Lock()

    def counts(self) -> dict[str, tuple[int, int]]:
        """Per graph kind, how many layouts have a plan and how many cuDNN refused. Public as a
        seam for tests and tooling."""
        out: dict[str, tuple[int, int]] = {}
        for key, p in list(self._plans.items()):
            built, refused = out.get(key[0], (0, 0))
            out[key[0]] = (built + (p is not None), refused + (p is None))
        return out

    def clear(self) -> None:
        with self._lock:
            for p in self._plans.values():
                if p is not None:
                    p.plan.close()
            self._plans.clear()
            self._prepared.clear()

    def _plan(self, key: tuple[Any, ...], builds: Sequence[tuple[Any, Any]],
              device: int) -> _Plan:
        """The plan for ``key``: the first of ``builds`` (``(build(handle) -> graph,
        operand_dtype)``, in order) whose graph has an engine config that finalizes."""
        p = self._plans.get(key, False)
        if p is False:
            with self._lock, relaxed_capture_mode():
                p = self._plans.get(key, False)
                if p is False:
                    h = get_handle(device, caller_stream(device))
                    p = None
                    for build, operand_dtype in builds:
                        p = _first_plan(h, build, operand_dtype)
                        if p is not None:
                            break
                    self._plans[key] = p
        if p is None:
            raise KernelRefused
        return p  # type: ignore[return-value]

    def _run(self, p: _Plan, device: Any, ptrs: tuple[int, ...]) -> None:
        d = device.index
        ws = workspace_pointer(p.workspace, device) or 0
        p.plan.execute(get_handle(d, caller_stream(d)), ptrs, ws)

    def conv_stats(self, x: Any, w: Any, g: Geometry, scale: Any = None,
                   bias: Any = None) -> tuple[Any, Any, Any]:
        k = w.shape[0]
        spatial = conv_output_size(x.shape[2:], w.shape[2:], g.stride, g.padding, g.dilation)
        y = torch.empty((x.shape[0], k, *spatial), dtype=x.dtype, device=x.device,
                        memory_format=_CL)
        # zeroed: NVIDIA's samples zero the sums before a launch. Two tensors, not views of
        # one: they are outputs of an autograd function
        sums = torch.zeros(k, dtype=torch.float32, device=x.device)
        sqsums = torch.zeros(k, dtype=torch.float32, device=x.device)
        sbr = scale is not None
        key = ("conv_stats", _layout(x), _layout(w), g, sbr, x.device.index)
        io = DTYPE_NAMES[x.dtype]

        def builder(st: G.FusionDtypes) -> tuple[Any, Any]:
            def build(h: int) -> G.OperationGraph:
                pro = st.prologue(io, 6, x.shape[1]) if sbr else None
                return G.build_conv_genstats_graph(
                    h, _spec(1, x), _spec(2, w), _spec(3, y), G.channel_spec(4, k),
                    G.channel_spec(5, k), g.padding, g.stride, g.dilation, pro,
                    st.resolve(io).stats)
            return build, x.dtype if st.operands == "io" else None

        p = self._plan(key, [builder(st) for st in (G.PROLOGUE_DTYPES if sbr
                                                    else G.PLAIN_DTYPES)], x.device.index)
        ptrs: tuple[int, ...] = (x.data_ptr(), w.data_ptr(), y.data_ptr(), sums.data_ptr(),
                                 sqsums.data_ptr())
        if sbr:
            scale, bias = _operands(p, scale, bias)
            ptrs += (scale.data_ptr(), bias.data_ptr())
        self._run(p, x.device, ptrs)
        return y, sums, sqsums

    def finalize(self, sums: Any, sqsums: Any, gamma: Any, beta: Any, rm: Any, rv: Any,
                 count: int, eps: float, momentum: float) -> tuple[Any, Any, Any, Any]:
        c = sums.shape[0]
        out = torch.empty((4, c), dtype=torch.float32, device=sums.device)
        key = ("finalize", c, count, eps, momentum, sums.device.index)

        def build(h: int) -> G.OperationGraph:
            specs = [G.channel_spec(i, c) for i in range(1, 11)]
            return G.build_bn_finalize_graph(h, *specs, count=count, eps=eps, momentum=momentum)

        p = self._plan(key, [(build, None)], sums.device.index)
        o = out.data_ptr()
        self._run(p, sums.device, (sums.data_ptr(), sqsums.data_ptr(), gamma.data_ptr(),
                                   beta.data_ptr(), rm.data_ptr(), rv.data_ptr(), o, o + 4 * c,
                                   o + 8 * c, o + 12 * c, rm.data_ptr(), rv.data_ptr()))
        return out[0], out[1], out[2], out[3]

    def _sbr_wgrad_plan(self, lx: _Layout, ldy: _Layout, ldw: _Layout, g: Geometry,
                        device: int) -> _Plan:
        io = DTYPE_NAMES[lx[2]]

        def builder(st: G.FusionDtypes) -> tuple[Any, Any]:
            def build(h: int) -> G.OperationGraph:
                return G.build_sbr_wgrad_graph(h, _layout_spec(1, lx), _layout_spec(2, ldy),
                                               _layout_spec(3, ldw),
                                               st.prologue(io, 4, lx[0][1]), g.padding,
                                               g.stride, g.dilation)
            return build, lx[2] if st.operands == "io" else None

        return self._plan(("sbr_wgrad", lx, ldy, ldw, g, device),
                          [builder(st) for st in G.WGRAD_DTYPES], device)

    def _dgrad_plan(self, ldy: _Layout, lw: _Layout, lx: _Layout, g: Geometry,
                    device: int) -> _Plan:
        c = lx[0][1]

        def build(h: int) -> G.OperationGraph:
            mean_, inv_std_, gamma_, beta_, dgamma_, dbeta_, eq_dy_, eq_x_, eq_b_ = (
                G.channel_spec(i, c) for i in range(5, 14))
            return G.build_dgrad_drelu_dbn_graph(
                h, _layout_spec(1, ldy), _layout_spec(2, lw), _layout_spec(3, lx),
                _layout_spec(4, lx), mean_, inv_std_, gamma_, beta_, dgamma_, dbeta_, eq_dy_,
                eq_x_, eq_b_, g.padding, g.stride, g.dilation)

        return self._plan(("dgrad_drelu_dbn", ldy, lw, lx, g, device), [(build, None)], device)

    def prepare_backward(self, x: Any, w: Any, g: Geometry) -> None:
        """Build the backward graphs' plans for an input ``x`` read through the prologue and a
        weight ``w``, the output's gradient channels-last as the backward makes it; raises
        `KernelRefused` where cuDNN has no engine for one (so the forward runs the model's modules
        and the backward never meets a refusal)."""
        d = x.device.index
        seen = (x.shape, x.stride(), x.dtype, w.shape, w.stride(), w.dtype, g, d)
        if seen in self._prepared:
            return
        lx, lw = _layout(x), _layout(w)
        spatial = conv_output_size(x.shape[2:], w.shape[2:], g.stride, g.padding, g.dilation)
        shape = (x.shape[0], w.shape[0], *spatial)
        ldy = (shape, channels_last_strides(shape), x.dtype)
        self._sbr_wgrad_plan(lx, ldy, lw, g, d)
        self._dgrad_plan(ldy, lw, lx, g, d)
        self._prepared.add(seen)  # once both have plans (a refusal is remembered with the plans)

    def sbr_wgrad(self, x: Any, dy: Any, scale: Any, bias: Any, w: Any, g: Geometry) -> Any:
        dw = torch.empty_like(w)
        p = self._sbr_wgrad_plan(_layout(x), _layout(dy), _layout(dw), g, x.device.index)
        scale, bias = _operands(p, scale, bias)
        self._run(p, x.device, (x.data_ptr(), dy.data_ptr(), dw.data_ptr(), scale.data_ptr(),
                                bias.data_ptr()))
        return dw

    def dgrad_drelu_dbn(self, dy: Any, w: Any, x: Any, mean: Any, inv_std: Any, gamma: Any,
                        beta: Any, g: Geometry) -> tuple[Any, ...]:
        c = x.shape[1]
        dxr = torch.empty_like(x)
        out = torch.zeros((5, c), dtype=torch.float32, device=x.device)
        p = self._dgrad_plan(_layout(dy), _layout(w), _layout(x), g, x.device.index)
        o = out.data_ptr()
        self._run(p, x.device, (dy.data_ptr(), w.data_ptr(), x.data_ptr(), dxr.data_ptr(),
                                mean.data_ptr(), inv_std.data_ptr(), gamma.data_ptr(),
                                beta.data_ptr(), o, o + 4 * c, o + 8 * c, o + 12 * c,
                                o + 16 * c))
        return dxr, out[0], out[1], out[2], out[3], out[4]

    def dx_apply(self, dxr: Any, x: Any, eq_dy: Any, eq_x: Any, eq_b: Any) -> Any:
        # three per-channel multiply-adds: PyTorch's elementwise kernels (one cuDNN pointwise
        # graph would save two passes; left until the graphs above are measured)
        return REFERENCE_KERNELS.dx_apply(dxr, x, eq_dy, eq_x, eq_b)


CUDNN_KERNELS = CudnnKernels()


def clear_cache() -> None:
    """Forget the chains' plans (`pycudnn.torch.clear_cache()` calls this)."""
    CUDNN_KERNELS.clear()


_calls.on_clear(clear_cache)


# ---- the autograd functions ---------------------------------------------------------------------

class _ConvStatsFunction(torch.autograd.Function):
    """``y = conv(x, w)`` with y's per-channel sums (not differentiable: the batch norm that
    reads them gives y's whole gradient, the path through its statistics included)."""

    @staticmethod
    def forward(ctx: Any, x: Any, w: Any, block: ConvStats2d, kernels: Any) -> Any:
        g = block.geometry
        y, sums, sqsums = kernels.conv_stats(x, w, g)
        ctx.mark_non_differentiable(sums, sqsums)
        ctx.save_for_backward(x, w)
        ctx.g = g
        return y, sums, sqsums

    @staticmethod
    def backward(ctx: Any, gy: Any, *unused: Any) -> tuple[Any, ...]:
        x, w = ctx.saved_tensors
        g = ctx.g
        need_x, need_w = ctx.needs_input_grad[:2]
        if grad_enabled():  # create_graph=True: PyTorch's differentiable operators
            y = torch.nn.functional.conv2d(x, w, None, g.stride, g.padding, g.dilation)
            return (*_grads(y, (x, w), gy, (need_x, need_w)), None, None)
        gx, gw, _ = torch.ops.aten.convolution_backward(
            gy.contiguous(memory_format=_suggest(x)), x, w, None, g.stride, g.padding,
            g.dilation, False, [0, 0], 1, [need_x, need_w, False])
        return gx, gw, None, None


class _BnReLUConvFunction(torch.autograd.Function):
    """``conv(relu(batch_norm(y_prev)), w)`` from y_prev's sums (batch statistics, the running
    statistics updated in place), with the output's own sums; backward gives y_prev's whole
    gradient and the batch norm's and convolution's weight gradients."""

    @staticmethod
    def forward(ctx: Any, yp: Any, sums: Any, sqsums: Any, gamma: Any, beta: Any, w: Any,
                block: BnReLUConv2d, kernels: Any) -> Any:
        bn, g = block.bn, block.geometry
        count = yp.numel() // yp.shape[1]
        mean, inv_std, scale, shift = kernels.finalize(
            sums, sqsums, gamma, beta, bn.running_mean, bn.running_var, count, bn.eps,
            bn.momentum)
        if bn.num_batches_tracked is not None:
            bn.num_batches_tracked.add_(1)
        y, ysums, ysq = kernels.conv_stats(yp, w, g, scale, shift)
        ctx.mark_non_differentiable(ysums, ysq)
        ctx.save_for_backward(yp, w, gamma, beta, mean, inv_std, scale, shift)
        ctx.g, ctx.kernels, ctx.eps = g, kernels, bn.eps
        return y, ysums, ysq

    @staticmethod
    def backward(ctx: Any, gy: Any, *unused: Any) -> tuple[Any, ...]:
        yp, w, gamma, beta, mean, inv_std, scale, shift = ctx.saved_tensors
        k, g = ctx.kernels, ctx.g
        needs = ctx.needs_input_grad
        if grad_enabled():  # create_graph=True: the same function in differentiable operators
            a = torch.relu(torch.nn.functional.batch_norm(yp, None, None, gamma, beta, True, 0.0,
                                                          ctx.eps))
            out = torch.nn.functional.conv2d(a, w, None, g.stride, g.padding, g.dilation)
            dyp, dgamma, dbeta, dw = _grads(out, (yp, gamma, beta, w), gy,
                                            (needs[0], needs[3], needs[4], needs[5]))
            return dyp, None, None, dgamma, dbeta, dw, None, None
        gy = gy.contiguous(memory_format=_suggest(yp))
        dw = (_or_reference(k, "sbr_wgrad", yp, gy, scale, shift, w, g) if needs[5]
              else None)
        dxr, dgamma, dbeta, eq_dy, eq_x, eq_b = _or_reference(
            k, "dgrad_drelu_dbn", gy, w, yp, mean, inv_std, gamma, beta, g)
        dyp = k.dx_apply(dxr, yp, eq_dy, eq_x, eq_b)
        return (dyp if needs[0] else None, None, None, dgamma if needs[3] else None,
                dbeta if needs[4] else None, dw, None, None)


def _or_reference(kernels: Any, name: str, *args: Any) -> Any:
    """``kernels.<name>(*args)``, or the same arithmetic in PyTorch operations where cuDNN
    refuses a layout the forward did not prepare (a gradient with other strides): a backward
    never fails for want of an engine."""
    try:
        return getattr(kernels, name)(*args)
    except KernelRefused:
        return getattr(REFERENCE_KERNELS, name)(*args)


def _grads(out: Any, inputs: tuple[Any, ...], gy: Any, needs: tuple[bool, ...]) -> list[Any]:
    """``out``'s gradients for the ``inputs`` that ``needs`` asks for, themselves
    differentiable (None for the others)."""
    wanted = [t for t, n in zip(inputs, needs) if n]
    got = iter(torch.autograd.grad(out, wanted, gy, create_graph=True) if wanted else ())
    return [next(got) if n else None for n in needs]


_apply_conv_stats = c_apply(_ConvStatsFunction)
_apply_bn_relu_conv = c_apply(_BnReLUConvFunction)


# ---- the modules --------------------------------------------------------------------------------

_forced: Any = None  # kernels `use_kernels` gives every call, whatever its device and dtype


@contextlib.contextmanager
def use_kernels(kernels: Any) -> Iterator[None]:
    """Within the block, every chain call whose batch norm trains runs the fused functions with
    ``kernels`` (`REFERENCE_KERNELS`: PyTorch operations, on the CPU and in float64 too).
    Public as a seam for tests and tooling."""
    global _forced
    before, _forced = _forced, kernels
    try:
        yield
    finally:
        _forced = before


def _traced() -> bool:
    return dynamo_compiling() or compiler._is_compiling_flag


def _half_channels_last(t: Any) -> bool:
    return (t.is_cuda and t.dtype in _HALF and t.dim() == 4
            and t.is_contiguous(memory_format=_CL) and t.data_ptr() % 16 == 0)


def _bn_trains(bn: Any) -> bool:
    """A batch norm whose training step the fused functions compute: training, affine, with
    running statistics and a fixed momentum (the cumulative average reads a count)."""
    return (bn.training and bn.track_running_stats and bn.momentum is not None
            and bn.running_mean is not None and bn.weight is not None)


def _bn_fits(bn: Any) -> bool:
    """`_bn_trains`, with float32 parameters and statistics, as cuDNN's graphs take them."""
    return _bn_trains(bn) and all(t.dtype is torch.float32 for t in (
        bn.weight, bn.bias, bn.running_mean, bn.running_var))


def chainable(conv: Any) -> bool:
    """Whether ``conv`` can be a chain's convolution (the graphs have no groups and no bias:
    the statistics must see the convolution's whole output)."""
    return (isinstance(conv, torch.nn.Conv2d) and conv.groups == 1 and conv.bias is None
            and conv.padding_mode == "zeros" and not isinstance(conv.padding, str))


class _ChainBase(torch.nn.Module):
    """The model's own modules held as plain attributes (they stay where they were, so
    ``state_dict`` keys are unchanged), and the convolution's geometry."""

    conv: torch.nn.Conv2d
    bn: torch.nn.BatchNorm2d

    def __init__(self, conv: torch.nn.Conv2d, conv_name: str) -> None:
        super().__init__()
        if not chainable(conv):
            raise TypeError(f"{type(self).__name__}: expected a torch.nn.Conv2d with groups=1, "
                            f"bias=False, numeric padding and padding_mode='zeros', "
                            f"got {conv!r}")
        object.__setattr__(self, "conv", conv)
        self.conv_name = conv_name

    @property
    def geometry(self) -> Geometry:
        return _geometry(self.conv)

    def _weight(self, x: Any) -> tuple[Any, Any] | None:
        """The input and weight as the fused graphs take them, or None where they do not."""
        w = self.conv.weight
        if autocast_enabled():
            dt = autocast_dtype()
            x, w = x.to(dt), w.to(dt)
        if not _half_channels_last(x) or w.dtype is not x.dtype:
            return None
        if not w.is_contiguous(memory_format=_CL):
            w = w.contiguous(memory_format=_CL)  # the fused engines read NHWC filters
        return (x, w) if w.data_ptr() % 16 == 0 else None


class ConvStats2d(_ChainBase):
    """A chain's first convolution: ``conv(x)`` and, when the batch norm after it (``bn``, the
    next block's) trains, its output's per-channel sums for that batch norm. Returns
    ``(y, sums, sqsums)``, the sums None where the call runs the plain convolution (made by
    `fuse_for_training` with ``into_convolutions=True``)."""

    def __init__(self, conv: torch.nn.Conv2d, bn: torch.nn.BatchNorm2d, conv_name: str = ""
                 ) -> None:
        super().__init__(conv, conv_name)
        object.__setattr__(self, "bn", bn)

    def extra_repr(self) -> str:
        return f"conv={self.conv_name or self.conv!r}"

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, Any, Any]:
        conv = self.conv
        if _forced is not None and _bn_trains(self.bn) and not _traced():
            with contextlib.suppress(KernelRefused):
                return chain_call(self, x, kernels=_forced)
        elif (x.is_cuda and _bn_fits(self.bn) and not _traced() and not pytorch_only()
                and not has_hooks(conv)):
            xw = self._weight(x)
            if xw is not None:
                prev = callers_device() if _calls._multi_gpu else None
                try:
                    return _apply_conv_stats(*xw, self, CUDNN_KERNELS)
                except KernelRefused:
                    pass
                finally:
                    restore_device(prev)
        return conv(x), None, None


class BnReLUConv2d(_ChainBase):
    """``conv(relu(bn(y)))`` for the ``(y, sums, sqsums)`` of the chain module before it: with
    the sums, the batch norm's statistics come from them and the convolution reads ``y``
    through the batch norm and the ReLU in one kernel. Returns ``(out, sums, sqsums)`` when
    ``stats`` (another chain module follows), else ``out`` (made by `fuse_for_training` with
    ``into_convolutions=True``)."""

    def __init__(self, bn: torch.nn.BatchNorm2d, conv: torch.nn.Conv2d, stats: bool,
                 bn_name: str = "", conv_name: str = "") -> None:
        super().__init__(conv, conv_name)
        if type(bn) is not torch.nn.BatchNorm2d or bn.num_features != conv.in_channels:
            raise TypeError(f"BnReLUConv2d: expected a torch.nn.BatchNorm2d of "
                            f"{conv.in_channels} features, got {bn!r}")
        object.__setattr__(self, "bn", bn)
        self.stats, self.bn_name = stats, bn_name

    def extra_repr(self) -> str:
        return (f"bn={self.bn_name or self.bn!r}, conv={self.conv_name or self.conv!r}, "
                f"stats={self.stats}")

    def _prepare(self, kernels: Any, y: Any, w: Any) -> None:
        """Where this call on ``y`` and the weight ``w`` (as the kernels get them) will be
        differentiated, the backward's plans built first: a refusal (`KernelRefused`) comes
        before the forward changes any state."""
        bn = self.bn
        if torch.is_grad_enabled() and (y.requires_grad or w.requires_grad
                                        or bn.weight.requires_grad or bn.bias.requires_grad):
            kernels.prepare_backward(y, w, self.geometry)

    def forward(self, prev: tuple[torch.Tensor, Any, Any]
                ) -> torch.Tensor | tuple[torch.Tensor, Any, Any]:
        y, sums, sqsums = prev
        out = ysums = ysq = None
        bn, conv = self.bn, self.conv
        if _forced is not None and sums is not None and _bn_trains(bn) and not _traced():
            try:
                self._prepare(_forced, y, conv.weight)
                out, ysums, ysq = chain_call(self, y, sums, sqsums, kernels=_forced)
            except KernelRefused:
                out = None
        elif sums is not None and _bn_fits(bn) and not _traced() and not pytorch_only() \
                and not has_hooks(bn) and not has_hooks(conv):
            xw = self._weight(y)
            if xw is not None:
                prev_dev = callers_device() if _calls._multi_gpu else None
                try:
                    self._prepare(CUDNN_KERNELS, *xw)
                    out, ysums, ysq = _apply_bn_relu_conv(xw[0], sums, sqsums, bn.weight,
                                                          bn.bias, xw[1], self, CUDNN_KERNELS)
                except KernelRefused:
                    out = None
                finally:
                    restore_device(prev_dev)
        if out is None:
            out = conv(torch.relu(bn(y)))
        return (out, ysums, ysq) if self.stats else out


def chain_call(block: Any, *args: Any, kernels: Any = REFERENCE_KERNELS) -> Any:
    """``block``'s fused autograd function on ``args`` with ``kernels`` (`REFERENCE_KERNELS` by
    default: PyTorch operations on any device). Public as a seam for tests and tooling."""
    if isinstance(block, ConvStats2d):
        x, = args
        return _ConvStatsFunction.apply(x, block.conv.weight, block, kernels)
    y, sums, sqsums = args
    bn = block.bn
    return _BnReLUConvFunction.apply(y, sums, sqsums, bn.weight, bn.bias, block.conv.weight,
                                     block, kernels)


#: the chain modules (what `fuse_for_training` puts in a model with ``into_convolutions=True``)
CHAIN_BLOCKS = (ConvStats2d, BnReLUConv2d)
