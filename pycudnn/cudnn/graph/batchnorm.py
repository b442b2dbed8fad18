"""Operation graphs that fuse batch normalization into the convolutions around it, as NVIDIA's
ResNet training does: a convolution that also sums its output per channel (`conv_genstats`,
optionally reading its input through the previous batch norm's scale, bias and ReLU), the step
that turns those sums into the batch norm's statistics (`bn_finalize`), and the backward graphs
that read the input the same way (`sbr_wgrad`, `dgrad_drelu_dbn`). The data flow is in
docs/architecture.md ("Batch norm fused into the convolutions").
"""

from __future__ import annotations

import ctypes
import itertools
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import numpy.typing as npt

from ...errors import CudnnError
from ...ffi.backend import (
    Attr,
    BackendDescriptor,
    BnFinalizeStatsMode,
    DescriptorType,
    GenStatsMode,
    PointwiseMode,
    to_data_type,
)
from .build import (
    CONVOLUTION_OPERATIONS,
    DT_FLOAT,
    OperationGraph,
    TensorSpec,
    check_conv_shapes,
    convolution_descriptor,
    finalized_graph,
    spatial_tuple,
    bias_spec,
)

__all__ = ["ScaleBiasRelu", "FusionDtypes", "PROLOGUE_DTYPES", "WGRAD_DTYPES", "PLAIN_DTYPES",
           "channel_spec", "build_conv_genstats_graph", "build_bn_finalize_graph",
           "build_sbr_wgrad_graph", "build_dgrad_drelu_dbn_graph"]

_DT_INT64 = 10


def channel_spec(uid: int, channels: int, ndim: int = 4,
                 dtype: int | npt.DTypeLike = DT_FLOAT) -> TensorSpec:
    """A per-channel float32 tensor (1 x C x 1 x 1): sums, statistics, scales and biases."""
    return bias_spec(uid, channels, ndim, dtype)


class FusionDtypes(NamedTuple):
    """One combination of data types for a graph with the scale-bias-ReLU prologue: cuDNN's
    engines for these patterns take only some, and which depends on the GPU and the version,
    so a caller tries `PROLOGUE_DTYPES` in turn. Each field is ``"io"`` (the input's data
    type) or ``"float32"``: ``operands`` the prologue's scale and bias, ``read`` what the
    convolution reads (the ReLU's output), ``stats`` the statistics' math precision."""
    operands: str
    read: str
    stats: str

    def resolve(self, io: str) -> "FusionDtypes":
        """These data types with ``"io"`` replaced by ``io`` (a dtype name)."""
        return FusionDtypes(*(io if v == "io" else v for v in self))

    def prologue(self, io: str, uid: int, channels: int) -> "ScaleBiasRelu":
        """The prologue over ``channels`` channels, its scale and bias at uids ``uid`` and
        ``uid + 1``, for an input of data type ``io``."""
        r = self.resolve(io)
        return ScaleBiasRelu(channel_spec(uid, channels, dtype=r.operands),
                             channel_spec(uid + 1, channels, dtype=r.operands), dtype=r.read)


#: the combinations to try with the prologue, in order: those that got an engine on an H100 with
#: cuDNN 9.19 (benchmarks/probes/bn_fusion_dtypes.py), the most engine configs first. In fp16
#: the engines that take all four graphs want the scale and bias in the input's type; in bf16
#: one engine (eng3) takes the forward graphs, with float32 statistics, and the backward graphs
#: have engines at some shapes only
PROLOGUE_DTYPES = (FusionDtypes("io", "io", "float32"), FusionDtypes("io", "float32", "float32"),
                   FusionDtypes("io", "io", "io"), FusionDtypes("float32", "io", "float32"))
#: the weight gradient through the prologue: the same, its statistics' precision unused
WGRAD_DTYPES = tuple(dict.fromkeys(d._replace(stats="float32") for d in PROLOGUE_DTYPES))
#: without the prologue only the statistics' precision varies (float32 takes fp16 and bf16)
PLAIN_DTYPES = (FusionDtypes("float32", "float32", "float32"),
                FusionDtypes("float32", "float32", "io"))


@dataclass(frozen=True)
class ScaleBiasRelu:
    """``relu(x * scale + bias)`` per channel, computed as a convolution reads its input: a
    batch norm applied through its equivalent scale and bias (what `build_bn_finalize_graph`
    writes), then ReLU (``relu=False`` leaves it out). ``dtype`` is the type of the values the
    convolution reads (default: the input's)."""
    scale: TensorSpec
    bias: TensorSpec
    relu: bool = True
    dtype: int | npt.DTypeLike | None = None


class _Assembler:
    """The descriptors of one graph being built: its real tensors by name (in the order
    `ExecutionPlan.execute()` takes their pointers), virtual tensors, operations and by-value
    scalars; everything is closed again if building fails."""

    def __init__(self, real: dict[str, TensorSpec]) -> None:
        uids = [s.uid for s in real.values()]
        if len(set(uids)) != len(uids):
            raise ValueError(f"tensor uids must be distinct, got "
                             f"{ {k: s.uid for k, s in real.items()} }")
        for name, s in real.items():
            if s.virtual or s.by_value:
                raise ValueError(f"{name} must be a real (non-virtual, non-by-value) tensor")
        self.real = real
        self.keep: list[BackendDescriptor] = []
        self.ops: list[BackendDescriptor] = []
        self.by_value: list[tuple[int, ctypes.c_double | ctypes.c_float | ctypes.c_int64]] = []
        self._built: dict[int, BackendDescriptor] = {}
        self._uid = itertools.count(max(uids) + 1)

    def track(self, d: BackendDescriptor) -> BackendDescriptor:
        self.keep.append(d)
        return d

    def tensor(self, spec: TensorSpec) -> BackendDescriptor:
        d = self._built.get(spec.uid)
        if d is None:
            d = self._built[spec.uid] = self.track(spec.build())
        return d

    def virtual(self, like: TensorSpec, dtype: int | npt.DTypeLike = DT_FLOAT) -> TensorSpec:
        return TensorSpec(next(self._uid), like.shape, like.strides, dtype, virtual=True)

    def alias(self, name: str, of: TensorSpec) -> TensorSpec:
        """A second real tensor over the memory of ``of`` (an operand read and written in place:
        cuDNN names input and output apart), its pointer taken after the others."""
        spec = of.like(next(self._uid))
        self.real[name] = spec
        return spec

    def scalar(self, value: float | int, dtype: int) -> TensorSpec:
        """A by-value host scalar (an epsilon, a count) held by the graph."""
        spec = TensorSpec(next(self._uid), (1, 1, 1, 1), (1, 1, 1, 1), dtype, by_value=True)
        buf = (ctypes.c_int64(int(value)) if dtype == _DT_INT64 else ctypes.c_float(float(value)))
        self.by_value.append((spec.uid, buf))
        return spec

    def operation(self, kind: DescriptorType,
                  tensors: Sequence[tuple[Attr, TensorSpec]]) -> BackendDescriptor:
        op = self.track(BackendDescriptor(kind))
        for attr, spec in tensors:
            op.set_descriptor(attr, self.tensor(spec))
        return op

    def add(self, op: BackendDescriptor) -> None:
        op.finalize()
        self.ops.append(op)

    def pointwise(self, mode: PointwiseMode, x: TensorSpec, out: TensorSpec,
                  b: TensorSpec | None = None) -> None:
        pw = self.track(BackendDescriptor(DescriptorType.POINTWISE))
        pw.set_enum(Attr.POINTWISE_MODE, mode)
        pw.set_data_type(Attr.POINTWISE_MATH_PREC, DT_FLOAT)
        pw.finalize()
        if mode == PointwiseMode.RELU_BWD:  # x is the gradient in, b the forward input
            assert b is not None
            roles = [(Attr.OPERATION_POINTWISE_DYDESC, x), (Attr.OPERATION_POINTWISE_XDESC, b),
                     (Attr.OPERATION_POINTWISE_DXDESC, out)]
        else:
            roles = [(Attr.OPERATION_POINTWISE_XDESC, x)]
            if b is not None:
                roles.append((Attr.OPERATION_POINTWISE_BDESC, b))
            roles.append((Attr.OPERATION_POINTWISE_YDESC, out))
        op = self.operation(DescriptorType.OPERATION_POINTWISE, roles)
        op.set_descriptor(Attr.OPERATION_POINTWISE_PW_DESCRIPTOR, pw)
        self.add(op)

    def scale_bias_relu(self, x: TensorSpec, sbr: ScaleBiasRelu) -> TensorSpec:
        """The virtual tensor ``relu(x * scale + bias)``."""
        dtype = x.dtype if sbr.dtype is None else sbr.dtype
        scaled = self.virtual(x, DT_FLOAT)
        self.pointwise(PointwiseMode.MUL, x, scaled, sbr.scale)
        shifted = self.virtual(x, DT_FLOAT if sbr.relu else dtype)
        self.pointwise(PointwiseMode.ADD, scaled, shifted, sbr.bias)
        if not sbr.relu:
            return shifted
        out = self.virtual(x, dtype)
        self.pointwise(PointwiseMode.RELU_FWD, shifted, out)
        return out

    def convolution(self, direction: str, x: TensorSpec, w: TensorSpec, y: TensorSpec,
                    geometry: "_Geometry") -> None:
        """One convolution op on the given tensors (any may be virtual), in forward roles."""
        conv = self.track(convolution_descriptor(DT_FLOAT, geometry.padding, geometry.padding,
                                                 geometry.stride, geometry.dilation))
        kind, a = CONVOLUTION_OPERATIONS[direction]
        op = self.operation(kind, [(a[0], x), (a[1], w), (a[2], y)])
        op.set_descriptor(a[3], conv)
        op.set_float(a[4], 1.0)
        op.set_float(a[5], 0.0)
        self.add(op)

    def finish(self, handle: int, direction: str, description: str) -> OperationGraph:
        graph = finalized_graph(handle, self.ops)
        return OperationGraph(graph, direction, dict(self.real), self.keep, self.by_value,
                              None, description)

    def close(self) -> None:
        for d in self.keep:
            d.close()


@dataclass(frozen=True)
class _Geometry:
    padding: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int

    def __str__(self) -> str:
        return (f"pad={self.padding} stride={self.stride} dil={self.dilation} "
                f"groups={self.groups}")


def _geometry(x: TensorSpec, w: TensorSpec, y: TensorSpec, padding: int | Sequence[int],
              stride: int | Sequence[int], dilation: int | Sequence[int]) -> _Geometry:
    """The convolution's geometry, checked against the real x, w and y (forward roles)."""
    ns = len(x.shape) - 2
    if ns not in (2, 3):
        raise ValueError(f"tensors must be 4-D or 5-D, got {x.shape}")
    pre = spatial_tuple(padding, ns, "padding")
    strd = spatial_tuple(stride, ns, "stride")
    dil = spatial_tuple(dilation, ns, "dilation")
    return _Geometry(pre, strd, dil, check_conv_shapes(x, w, y, pre, pre, strd, dil))


def _check_channels(name: str, spec: TensorSpec, channels: int, ndim: int) -> None:
    want = (1, channels) + (1,) * (ndim - 2)
    if spec.shape != want:
        raise ValueError(f"{name} shape {spec.shape} must be {want} (one value per channel)")


def _build(handle: int, real: dict[str, TensorSpec], direction: str, describe: str,
           body: Callable[[_Assembler], str]) -> OperationGraph:
    asm = _Assembler(real)
    try:
        geometry = body(asm)
        return asm.finish(handle, direction, f"{describe} {geometry}".strip())
    except CudnnError as exc:
        asm.close()
        raise exc.add_context(f"graph: {describe} "
                              + " ".join(f"{k}{s.shape}/{s.strides}" for k, s in real.items()))
    except BaseException:
        asm.close()
        raise


def build_conv_genstats_graph(handle: int, x: TensorSpec, w: TensorSpec, y: TensorSpec,
                              sums: TensorSpec, sqsums: TensorSpec,
                              padding: int | Sequence[int] = 0, stride: int | Sequence[int] = 1,
                              dilation: int | Sequence[int] = 1,
                              prologue: ScaleBiasRelu | None = None,
                              stats_precision: int | npt.DTypeLike | None = None
                              ) -> OperationGraph:
    """``y = conv(prologue(x), w)`` and, in the same graph, ``sums`` and ``sqsums``: y's sum and
    sum of squares per output channel (float32, 1 x K x 1 x 1), the statistics a batch norm of
    y needs (`build_bn_finalize_graph` turns them into its mean and variance).

    The pointers `ExecutionPlan.execute()` takes, in order: x, w, y, sums, sqsums, then the
    prologue's scale and bias. ``stats_precision`` is the statistics op's math precision
    (default: y's data type, as NVIDIA's frontend sets it).
    """
    real = {"x": x, "w": w, "y": y, "sums": sums, "sqsums": sqsums}
    if prologue is not None:
        real.update(scale=prologue.scale, bias=prologue.bias)
    nd = len(x.shape)
    for name in ("sums", "sqsums"):
        _check_channels(name, real[name], y.shape[1], nd)
    if prologue is not None:
        for name in ("scale", "bias"):
            _check_channels(f"prologue {name}", real[name], x.shape[1], nd)
    geometry = _geometry(x, w, y, padding, stride, dilation)

    def body(asm: _Assembler) -> str:
        conv_in = x if prologue is None else asm.scale_bias_relu(x, prologue)
        asm.convolution("forward", conv_in, w, y, geometry)
        op = asm.operation(DescriptorType.OPERATION_GEN_STATS, [
            (Attr.OPERATION_GENSTATS_XDESC, y), (Attr.OPERATION_GENSTATS_SUMDESC, sums),
            (Attr.OPERATION_GENSTATS_SQSUMDESC, sqsums)])
        op.set_enum(Attr.OPERATION_GENSTATS_MODE, GenStatsMode.SUM_SQSUM)
        op.set_data_type(Attr.OPERATION_GENSTATS_MATH_PREC,
                         y.dtype if stats_precision is None else to_data_type(stats_precision))
        asm.add(op)
        return str(geometry)

    what = "scale-bias-relu conv genstats" if prologue is not None else "conv genstats"
    return _build(handle, real, "conv_genstats", what, body)


def build_bn_finalize_graph(handle: int, sums: TensorSpec, sqsums: TensorSpec,
                            weight: TensorSpec, bias: TensorSpec, running_mean: TensorSpec,
                            running_var: TensorSpec, saved_mean: TensorSpec,
                            saved_inv_std: TensorSpec, eq_scale: TensorSpec, eq_bias: TensorSpec,
                            *, count: int, eps: float, momentum: float) -> OperationGraph:
    """A batch norm's training statistics from the sums a `build_conv_genstats_graph` wrote:
    the batch mean and inverse standard deviation (saved for the backward pass), the running
    statistics updated in place (``running = (1 - momentum) * running + momentum * batch``,
    the variance unbiased, as PyTorch's), and the equivalent ``eq_scale`` / ``eq_bias`` that
    apply the batch norm as one multiply-add (a `ScaleBiasRelu` prologue reads them).

    ``count`` is the number of values summed per channel (N x H x W). The pointers, in order:
    sums, sqsums, weight, bias, running_mean, running_var, saved_mean, saved_inv_std,
    eq_scale, eq_bias, then running_mean and running_var once more (cuDNN names the updated
    statistics apart from the ones it reads; pass the same memory to update in place). All per
    channel (1 x C x 1 x 1), float32.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be the number of values summed per channel (an int >= 1), "
                         f"got {count!r}")
    for name, v in (("eps", eps), ("momentum", momentum)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= float(v) < float("inf"):
            raise ValueError(f"{name} must be a finite float >= 0, got {v!r}")
    real = {"sums": sums, "sqsums": sqsums, "weight": weight, "bias": bias,
            "running_mean": running_mean, "running_var": running_var, "saved_mean": saved_mean,
            "saved_inv_std": saved_inv_std, "eq_scale": eq_scale, "eq_bias": eq_bias}
    for name, spec in real.items():
        _check_channels(name, spec, sums.shape[1], len(sums.shape))

    def body(asm: _Assembler) -> str:
        new_mean = asm.alias("running_mean_out", running_mean)
        new_var = asm.alias("running_var_out", running_var)
        a = Attr
        op = asm.operation(DescriptorType.OPERATION_BN_FINALIZE_STATISTICS, [
            (a.OPERATION_BN_FINALIZE_Y_SUM_DESC, sums),
            (a.OPERATION_BN_FINALIZE_Y_SQ_SUM_DESC, sqsums),
            (a.OPERATION_BN_FINALIZE_SCALE_DESC, weight),
            (a.OPERATION_BN_FINALIZE_BIAS_DESC, bias),
            (a.OPERATION_BN_FINALIZE_PREV_RUNNING_MEAN_DESC, running_mean),
            (a.OPERATION_BN_FINALIZE_PREV_RUNNING_VAR_DESC, running_var),
            (a.OPERATION_BN_FINALIZE_UPDATED_RUNNING_MEAN_DESC, new_mean),
            (a.OPERATION_BN_FINALIZE_UPDATED_RUNNING_VAR_DESC, new_var),
            (a.OPERATION_BN_FINALIZE_SAVED_MEAN_DESC, saved_mean),
            (a.OPERATION_BN_FINALIZE_SAVED_INV_STD_DESC, saved_inv_std),
            (a.OPERATION_BN_FINALIZE_EQ_SCALE_DESC, eq_scale),
            (a.OPERATION_BN_FINALIZE_EQ_BIAS_DESC, eq_bias),
            (a.OPERATION_BN_FINALIZE_ACCUM_COUNT_DESC, asm.scalar(count, _DT_INT64)),
            (a.OPERATION_BN_FINALIZE_EPSILON_DESC, asm.scalar(eps, DT_FLOAT)),
            (a.OPERATION_BN_FINALIZE_EXP_AVERATE_FACTOR_DESC, asm.scalar(momentum, DT_FLOAT)),
        ])
        op.set_enum(a.OPERATION_BN_FINALIZE_STATS_MODE, BnFinalizeStatsMode.TRAINING)
        op.set_data_type(a.OPERATION_BN_FINALIZE_MATH_PREC, DT_FLOAT)
        asm.add(op)
        return f"count={count} eps={eps:g} momentum={momentum:g}"

    return _build(handle, real, "bn_finalize", "bn finalize", body)


def build_sbr_wgrad_graph(handle: int, x: TensorSpec, dy: TensorSpec, dw: TensorSpec,
                          prologue: ScaleBiasRelu, padding: int | Sequence[int] = 0,
                          stride: int | Sequence[int] = 1,
                          dilation: int | Sequence[int] = 1) -> OperationGraph:
    """``dw = wgrad(prologue(x), dy)``: the weight gradient of a convolution whose input was
    read through a `ScaleBiasRelu`, recomputing that input instead of storing it.

    The pointers, in order: x, dy, dw, the prologue's scale and bias.
    """
    real = {"x": x, "dy": dy, "dw": dw, "scale": prologue.scale, "bias": prologue.bias}
    for name in ("scale", "bias"):
        _check_channels(f"prologue {name}", real[name], x.shape[1], len(x.shape))
    geometry = _geometry(x, dw, dy, padding, stride, dilation)

    def body(asm: _Assembler) -> str:
        asm.convolution("backward_filter", asm.scale_bias_relu(x, prologue), dw, dy, geometry)
        return str(geometry)

    return _build(handle, real, "sbr_wgrad", "scale-bias-relu wgrad", body)


def build_dgrad_drelu_dbn_graph(handle: int, dy: TensorSpec, w: TensorSpec, x: TensorSpec,
                                dx_relu: TensorSpec, mean: TensorSpec, inv_std: TensorSpec,
                                weight: TensorSpec, bias: TensorSpec, dweight: TensorSpec,
                                dbias: TensorSpec, eq_scale_dy: TensorSpec,
                                eq_scale_x: TensorSpec, eq_bias: TensorSpec,
                                padding: int | Sequence[int] = 0, stride: int | Sequence[int] = 1,
                                dilation: int | Sequence[int] = 1) -> OperationGraph:
    """The backward pass through ``conv(relu(batch_norm(x)), w)`` up to the batch norm's own
    gradient, in one graph: the data gradient of the convolution, through the ReLU (its mask
    recomputed from x, the batch's ``mean`` and ``inv_std``, ``weight`` and ``bias``) into
    ``dx_relu``, and from it the batch norm's ``dweight`` and ``dbias`` and the coefficients of
    its input gradient: ``dx = eq_scale_dy * dx_relu + eq_scale_x * x + eq_bias`` (one
    pointwise step, left to the caller).

    The pointers, in order: dy, w, x, dx_relu, mean, inv_std, weight, bias, dweight, dbias,
    eq_scale_dy, eq_scale_x, eq_bias. The per-channel tensors are float32, 1 x C x 1 x 1.
    """
    real = {"dy": dy, "w": w, "x": x, "dx_relu": dx_relu, "mean": mean, "inv_std": inv_std,
            "weight": weight, "bias": bias, "dweight": dweight, "dbias": dbias,
            "eq_scale_dy": eq_scale_dy, "eq_scale_x": eq_scale_x, "eq_bias": eq_bias}
    if dx_relu.shape != x.shape:
        raise ValueError(f"dx_relu shape {dx_relu.shape} must equal x shape {x.shape}")
    for name in ("mean", "inv_std", "weight", "bias", "dweight", "dbias", "eq_scale_dy",
                 "eq_scale_x", "eq_bias"):
        _check_channels(name, real[name], x.shape[1], len(x.shape))
    geometry = _geometry(x, w, dy, padding, stride, dilation)

    def body(asm: _Assembler) -> str:
        dgrad = asm.virtual(x)
        asm.convolution("backward_data", dgrad, w, dy, geometry)
        centred = asm.virtual(x)
        asm.pointwise(PointwiseMode.SUB, x, centred, mean)
        normed = asm.virtual(x)
        asm.pointwise(PointwiseMode.MUL, centred, normed, inv_std)
        scaled = asm.virtual(x)
        asm.pointwise(PointwiseMode.MUL, normed, scaled, weight)
        shifted = asm.virtual(x)
        asm.pointwise(PointwiseMode.ADD, scaled, shifted, bias)
        asm.pointwise(PointwiseMode.RELU_BWD, dgrad, dx_relu, shifted)
        a = Attr
        op = asm.operation(DescriptorType.OPERATION_BN_BWD_WEIGHTS, [
            (a.OPERATION_BN_BWD_WEIGHTS_DY_DESC, dx_relu), (a.OPERATION_BN_BWD_WEIGHTS_X_DESC, x),
            (a.OPERATION_BN_BWD_WEIGHTS_MEAN_DESC, mean),
            (a.OPERATION_BN_BWD_WEIGHTS_INVSTD_DESC, inv_std),
            (a.OPERATION_BN_BWD_WEIGHTS_BN_SCALE_DESC, weight),
            (a.OPERATION_BN_BWD_WEIGHTS_DBN_SCALE_DESC, dweight),
            (a.OPERATION_BN_BWD_WEIGHTS_DBN_BIAS_DESC, dbias),
            (a.OPERATION_BN_BWD_WEIGHTS_EQ_DY_SCALE_DESC, eq_scale_dy),
            (a.OPERATION_BN_BWD_WEIGHTS_EQ_X_SCALE_DESC, eq_scale_x),
            (a.OPERATION_BN_BWD_WEIGHTS_EQ_BIAS, eq_bias)])
        op.set_data_type(a.OPERATION_BN_BWD_WEIGHTS_MATH_PREC, DT_FLOAT)
        asm.add(op)
        return str(geometry)

    return _build(handle, real, "dgrad_drelu_dbn", "dgrad drelu dbn", body)
