"""Operation graphs, candidate engine configs and execution plans (the cuDNN graph engine).

The flow, as PyTorch's ``Conv_v8.cpp`` does it through cudnn-frontend::

    g = build_convolution_graph(handle, "forward", x, w, y, padding, stride, dilation, "float32")
    cands = engine_configs(handle, g)                      # heuristics A, B, FALLBACK; deduped
    kept, dropped = filter_candidates(cands, "float32", allow_tf32=False, deterministic=False)
    plan, failures = first_plan(handle, kept)              # finalize until one works
    plan.execute(handle, (x_ptr, w_ptr, y_ptr), workspace_ptr)

Tensors are always described in N, C, spatial order; the strides carry the layout (NHWC is
``strides = (H*W*C, 1, W*C, C)``). Groups are implied by the shapes: x has C channels, w has
C / groups input channels.

Execution is the hot path: `ExecutionPlan.execute()` with pointers seen before is a dict
lookup plus one ctypes call to ``cudnnBackendExecute``. A variant pack holds raw pointers, so it is
reusable only with the same buffers; a small LRU keeps the packs of the last few buffer sets.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Iterable, Mapping, NoReturn, Sequence

import numpy.typing as npt

from ..errors import CudnnError, NoAlgorithmError, PycudnnError
from ..ffi import library as _lib
from ..ffi.backend import (Attr, AttrType, BackendDescriptor, BehaviorNote, ClosedDescriptorError,
                           ConvMode, DescriptorType, HeurMode, KnobType, NumericalNote,
                           PointwiseMode, to_data_type)

__all__ = [
    "TensorSpec", "Epilogue", "OperationGraph", "EngineConfig", "CandidateList", "ExecutionPlan",
    "build_convolution_graph", "engine_configs", "filter_candidates", "first_plan", "fused_plan",
    "nchw_strides", "nhwc_strides", "bias_spec", "DIRECTIONS", "PointwiseStep",
    "build_pointwise_graph",
]

DIRECTIONS = ("forward", "backward_data", "backward_filter")

_DT_FLOAT = 0   # cudnnDataType_t values used for compute / intermediates
_DT_DOUBLE = 1

#: how many knob-choice receivers to pass (cuDNN 9.28 knows 46 knob types)
_KNOB_POOL_SIZE = 64
# variant-pack attributes and their C types, for the prebuilt-array path in ExecutionPlan
_VP_UIDS, _VP_PTRS, _VP_WORKSPACE = (int(Attr.VARIANT_PACK_UNIQUE_IDS),
                                     int(Attr.VARIANT_PACK_DATA_POINTERS),
                                     int(Attr.VARIANT_PACK_WORKSPACE))
_T_INT64, _T_VOID_PTR = int(AttrType.INT64), int(AttrType.VOID_PTR)
_NOTES_MAX = 32


# ---- tensors -----------------------------------------------------------------------------------

def nchw_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Packed strides of an N, C, spatial... tensor stored channels-first."""
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= int(d)
    return tuple(reversed(strides))


def nhwc_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Packed strides of an N, C, spatial... tensor stored channels-last (NHWC / NDHWC)."""
    n, c, *sp = (int(d) for d in shape)
    strides = [0] * len(shape)
    strides[1] = 1
    acc = c
    for i in range(len(shape) - 1, 1, -1):
        strides[i] = acc
        acc *= int(shape[i])
    strides[0] = acc
    return tuple(strides)


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a graph: unique id, dims and strides (N, C, spatial order), data type.

    ``alignment`` is the byte alignment promised for its pointer (a graph property: pointers
    passed to `ExecutionPlan.execute()` are checked against it). ``virtual`` tensors are
    graph intermediates with no memory; ``by_value`` tensors are host scalars.
    """
    uid: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    #: a `pycudnn._types.DataType`, numpy dtype or name; held as the cudnnDataType_t int
    dtype: int | npt.DTypeLike
    virtual: bool = False
    by_value: bool = False
    alignment: int = 16

    def __post_init__(self) -> None:
        if isinstance(self.uid, bool) or not isinstance(self.uid, int) or self.uid < 0:
            raise TypeError(f"TensorSpec.uid must be an int >= 0, got {self.uid!r}")
        try:
            shape = tuple(int(d.__index__()) for d in self.shape)
            strides = tuple(int(s.__index__()) for s in self.strides)
        except (AttributeError, TypeError):
            raise TypeError(f"TensorSpec(uid={self.uid}): shape and strides must be sequences of "
                            f"ints, got {self.shape!r}, {self.strides!r}") from None
        if len(shape) != len(strides) or not 1 <= len(shape) <= 8:
            raise ValueError(f"TensorSpec(uid={self.uid}): shape {shape} and strides {strides} "
                             f"must have the same length (1..8)")
        if any(d <= 0 for d in shape) or any(s <= 0 for s in strides):
            raise ValueError(f"TensorSpec(uid={self.uid}): dims and strides must be positive, "
                             f"got shape {shape} strides {strides}")
        a = self.alignment
        if isinstance(a, bool) or not isinstance(a, int) or a <= 0 or a & (a - 1):
            raise ValueError(f"TensorSpec(uid={self.uid}): alignment must be a power of two, "
                             f"got {a!r}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "strides", strides)
        object.__setattr__(self, "dtype", to_data_type(self.dtype))

    def build(self) -> BackendDescriptor:
        """A finalized backend tensor descriptor."""
        d = BackendDescriptor(DescriptorType.TENSOR)
        try:
            d.set_data_type(Attr.TENSOR_DATA_TYPE, self.dtype)
            d.set_int64s(Attr.TENSOR_DIMENSIONS, self.shape)
            d.set_int64s(Attr.TENSOR_STRIDES, self.strides)
            d.set_int64(Attr.TENSOR_UNIQUE_ID, self.uid)
            d.set_int64(Attr.TENSOR_BYTE_ALIGNMENT, self.alignment)
            if self.virtual:
                d.set_bool(Attr.TENSOR_IS_VIRTUAL, True)
            if self.by_value:
                d.set_bool(Attr.TENSOR_IS_BY_VALUE, True)
            d.finalize()
        except BaseException:
            d.close()
            raise
        return d

    def like(self, uid: int, dtype: int | npt.DTypeLike | None = None,
             virtual: bool | None = None) -> "TensorSpec":
        """Same dims and strides under another uid (and optionally dtype / virtual flag)."""
        return TensorSpec(uid, self.shape, self.strides, self.dtype if dtype is None else dtype,
                          self.virtual if virtual is None else virtual, False, self.alignment)


def bias_spec(uid: int, channels: int, ndim: int, dtype: int | npt.DTypeLike,
              alignment: int = 16) -> TensorSpec:
    """A 1 x K x 1 x 1 (x 1) bias with NHWC-style strides, as engines want it (MEASURED.md 2b)."""
    shape = (1, int(channels)) + (1,) * (ndim - 2)
    strides = (int(channels), 1) + (int(channels),) * (ndim - 2)
    return TensorSpec(uid, shape, strides, dtype, alignment=alignment)


@dataclass(frozen=True)
class Epilogue:
    """What follows a forward convolution in one fused graph:
    ``y = relu(conv(x, w) + alpha * z + bias)`` with any part optional.

    The ops are chained conv -> ADD(z) -> ADD(bias) -> RELU (the only order precompiled fused
    engines accept, MEASURED.md 2b), intermediates virtual float32. ``alpha_mode`` says how an
    alpha != 1 is applied: ``"alpha2"`` on the z-add's ALPHA2 attribute, or ``"mul"`` as a pointwise
    multiply of z by a by-value scalar (kept working by runtime-compiled engines).
    """
    z: TensorSpec | None = None
    alpha: float = 1.0
    bias: TensorSpec | None = None
    relu: bool = False
    alpha_mode: str = "alpha2"

    def __post_init__(self) -> None:
        if self.alpha_mode not in ("alpha2", "mul"):
            raise ValueError(f"Epilogue.alpha_mode must be 'alpha2' or 'mul', got {self.alpha_mode!r}")
        if self.z is None and float(self.alpha) != 1.0:
            raise ValueError("Epilogue: alpha given without z")
        for name in ("z", "bias"):
            t = getattr(self, name)
            if t is not None and not isinstance(t, TensorSpec):
                raise TypeError(f"Epilogue.{name} must be a TensorSpec, got {type(t).__name__}")

    @property
    def empty(self) -> bool:
        return self.z is None and self.bias is None and not self.relu


# ---- the operation graph -----------------------------------------------------------------------

class OperationGraph:
    """A finalized operation graph and every descriptor it must keep alive.

    Attributes:
        descriptor: the finalized CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR.
        direction: ``"forward"``, ``"backward_data"`` or ``"backward_filter"`` (a convolution),
            ``"pointwise"`` (`build_pointwise_graph`).
        uid: ``{"x": .., "w": .., "y": .., ["z": ..], ["b": ..]}`` (x/w/y keep their forward
            meaning in every direction: for backward_data x is dx, for backward_filter w is dw).
        uids: the order of pointers `ExecutionPlan.execute()` takes: x, w, y, then z, b.
        specs: the TensorSpecs by the same names.
    """

    def __init__(self, descriptor: BackendDescriptor, direction: str, specs: dict[str, TensorSpec],
                 keep: list[BackendDescriptor],
                 by_value: list[tuple[int, ctypes.c_double | ctypes.c_float]],
                 epilogue: Epilogue | None, description: str) -> None:
        self.descriptor = descriptor
        self.direction = direction
        self.specs = specs
        self.uid = {k: s.uid for k, s in specs.items()}
        self.uids = tuple(s.uid for s in specs.values())
        self.alignments = tuple(s.alignment for s in specs.values())
        self.epilogue = epilogue
        self.description = description
        self._keep = keep
        # by-value scalars: (uid, ctypes host buffer); their host address goes in variant packs
        self._by_value = by_value
        self.by_value_uids = tuple(u for u, _ in by_value)
        self.by_value_ptrs = tuple(ctypes.addressof(b) for _, b in by_value)
        self._engine_count: int | None = None

    @property
    def engine_count(self) -> int:
        """CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT."""
        if self._engine_count is None:
            self._engine_count = self.descriptor.get_int64(Attr.OPERATIONGRAPH_ENGINE_GLOBAL_COUNT)
        return self._engine_count

    @property
    def closed(self) -> bool:
        return self.descriptor.closed

    def close(self) -> None:
        self.descriptor.close()
        for d in self._keep:
            d.close()
        self._keep = []

    def __enter__(self) -> "OperationGraph":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<OperationGraph {self.description}{' closed' if self.closed else ''}>"


def _spatial_tuple(v: int | Sequence[int], n: int, name: str) -> tuple[int, ...]:
    if isinstance(v, bool):
        raise TypeError(f"{name} must be an int or a sequence of {n} ints, got {v!r}")
    if isinstance(v, int):
        return (v,) * n
    try:
        t = tuple(int(i.__index__()) for i in v)
    except (AttributeError, TypeError):
        raise TypeError(f"{name} must be an int or a sequence of {n} ints, got {v!r}") from None
    if len(t) != n:
        raise ValueError(f"{name} must have {n} values (one per spatial dim), got {t}")
    return t


def _check_conv_shapes(x: TensorSpec, w: TensorSpec, y: TensorSpec, pre: tuple[int, ...],
                       post: tuple[int, ...], stride: tuple[int, ...], dil: tuple[int, ...]) -> int:
    nd = len(x.shape)
    if len(w.shape) != nd or len(y.shape) != nd:
        raise ValueError(f"x, w, y must have the same rank, got {x.shape}, {w.shape}, {y.shape}")
    n, c = x.shape[:2]
    k, cg = w.shape[:2]
    if c % cg:
        raise ValueError(f"x has {c} channels, not a multiple of w's {cg} input channels "
                         f"(groups = x.C / w.C)")
    groups = c // cg
    if k % groups:
        raise ValueError(f"w has {k} filters, not a multiple of groups={groups}")
    if y.shape[0] != n or y.shape[1] != k:
        raise ValueError(f"y shape {y.shape} must be (N={n}, K={k}, ...)")
    for i in range(nd - 2):
        if min(stride[i], dil[i]) < 1 or min(pre[i], post[i]) < 0:
            raise ValueError(f"stride and dilation must be >= 1 and padding >= 0, got "
                             f"stride={stride} dilation={dil} padding={pre}/{post}")
        span = dil[i] * (w.shape[2 + i] - 1) + 1
        o = (x.shape[2 + i] + pre[i] + post[i] - span) // stride[i] + 1
        if o != y.shape[2 + i]:
            raise ValueError(f"spatial dim {i}: x {x.shape[2 + i]}, filter {w.shape[2 + i]}, "
                             f"padding {pre[i]}/{post[i]}, stride {stride[i]}, dilation {dil[i]} "
                             f"give {o}, but y has {y.shape[2 + i]}")
    return groups


def _finalized_graph(handle: int, ops: Sequence[BackendDescriptor]) -> BackendDescriptor:
    """The finalized operation-graph descriptor of ``ops`` (closed again if cuDNN refuses it)."""
    g = BackendDescriptor(DescriptorType.OPERATIONGRAPH)
    try:
        g.set_handle(Attr.OPERATIONGRAPH_HANDLE, handle)
        g.set_descriptors(Attr.OPERATIONGRAPH_OPS, ops)
        g.finalize()
    except BaseException:
        g.close()
        raise
    return g


def build_convolution_graph(handle: int, direction: str, x: TensorSpec, w: TensorSpec,
                            y: TensorSpec, padding: int | Sequence[int],
                            stride: int | Sequence[int], dilation: int | Sequence[int],
                            compute_dtype: int | npt.DTypeLike | None = None,
                            epilogue: Epilogue | None = None, *,
                            post_padding: int | Sequence[int] | None = None,
                            alpha: float = 1.0, beta: float = 0.0) -> OperationGraph:
    """Build and finalize the operation graph of one convolution (plus a fused epilogue).

    Args:
        handle: a cudnnHandle_t (int).
        direction: ``"forward"`` (y = conv(x, w)), ``"backward_data"`` (x = dgrad(y, w)) or
            ``"backward_filter"`` (w = wgrad(x, y)).
        x, w, y: 4-D or 5-D TensorSpecs in N, C, spatial order (layout in the strides).
        padding, stride, dilation: ints or one value per spatial dim; ``post_padding`` defaults
            to ``padding`` (symmetric).
        compute_dtype: the convolution's compute type; default float32 (float64 for double data).
        epilogue: forward only: bias / alpha*z / relu fused into the same graph.
        alpha, beta: the convolution op's own scalars (float, double for double data).
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    for name, t in (("x", x), ("w", w), ("y", y)):
        if not isinstance(t, TensorSpec):
            raise TypeError(f"{name} must be a TensorSpec, got {type(t).__name__}")
        if t.virtual or t.by_value:
            raise ValueError(f"{name} must be a real (non-virtual, non-by-value) tensor")
    nd = len(x.shape)
    if nd not in (4, 5):
        raise ValueError(f"tensors must be 4-D or 5-D (unsqueeze 1-D convolutions), got {x.shape}")
    ns = nd - 2
    pre = _spatial_tuple(padding, ns, "padding")
    post = pre if post_padding is None else _spatial_tuple(post_padding, ns, "post_padding")
    strd = _spatial_tuple(stride, ns, "stride")
    dil = _spatial_tuple(dilation, ns, "dilation")
    groups = _check_conv_shapes(x, w, y, pre, post, strd, dil)
    if epilogue is not None and epilogue.empty:
        epilogue = None
    if epilogue is not None and direction != "forward":
        raise ValueError("an epilogue (bias / z / relu) is only fused into a forward convolution")
    if compute_dtype is None:
        compute_dtype = _DT_DOUBLE if x.dtype == _DT_DOUBLE else _DT_FLOAT
    comp = to_data_type(compute_dtype)
    scalar_double = comp == _DT_DOUBLE or x.dtype == _DT_DOUBLE

    specs: dict[str, TensorSpec] = {"x": x, "w": w, "y": y}
    if epilogue is not None:
        if epilogue.z is not None:
            specs["z"] = epilogue.z
            if epilogue.z.shape != y.shape:
                raise ValueError(f"z shape {epilogue.z.shape} must equal y shape {y.shape}")
        if epilogue.bias is not None:
            specs["b"] = epilogue.bias
            bshape = epilogue.bias.shape
            if len(bshape) != nd or bshape[1] != y.shape[1] or any(
                    d != 1 for i, d in enumerate(bshape) if i != 1):
                raise ValueError(f"bias shape {bshape} must be (1, K={y.shape[1]}, 1, ...)")
    uids = [s.uid for s in specs.values()]
    if len(set(uids)) != len(uids):
        raise ValueError(f"tensor uids must be distinct, got {dict((k, s.uid) for k, s in specs.items())}")
    next_uid = itertools.count(max(uids) + 1)

    keep: list[BackendDescriptor] = []
    by_value: list[tuple[int, ctypes.c_double | ctypes.c_float]] = []

    def track(d: BackendDescriptor) -> BackendDescriptor:
        keep.append(d)
        return d

    try:
        tx, tw, ty = track(x.build()), track(w.build()), track(y.build())

        conv = track(BackendDescriptor(DescriptorType.CONVOLUTION))
        conv.set_data_type(Attr.CONVOLUTION_COMP_TYPE, comp)
        conv.set_enum(Attr.CONVOLUTION_CONV_MODE, ConvMode.CROSS_CORRELATION)
        conv.set_int64(Attr.CONVOLUTION_SPATIAL_DIMS, ns)
        conv.set_int64s(Attr.CONVOLUTION_DILATIONS, dil)
        conv.set_int64s(Attr.CONVOLUTION_FILTER_STRIDES, strd)
        conv.set_int64s(Attr.CONVOLUTION_PRE_PADDINGS, pre)
        conv.set_int64s(Attr.CONVOLUTION_POST_PADDINGS, post)
        conv.finalize()

        inter_dt = _DT_DOUBLE if comp == _DT_DOUBLE else _DT_FLOAT

        def virtual_like(t: TensorSpec) -> tuple[TensorSpec, BackendDescriptor]:
            s = TensorSpec(next(next_uid), t.shape, t.strides, inter_dt, virtual=True)
            return s, track(s.build())

        # the tensor the convolution writes: y itself, or a virtual one the epilogue reads
        if epilogue is None:
            conv_out = ty
        else:
            _, conv_out = virtual_like(y)

        set_scalar = BackendDescriptor.set_double if scalar_double else BackendDescriptor.set_float
        if direction == "forward":
            op = track(BackendDescriptor(DescriptorType.OPERATION_CONVOLUTION_FORWARD))
            op.set_descriptor(Attr.OPERATION_CONVOLUTION_FORWARD_X, tx)
            op.set_descriptor(Attr.OPERATION_CONVOLUTION_FORWARD_W, tw)
            op.set_descriptor(Attr.OPERATION_CONVOLUTION_FORWARD_Y, conv_out)
            op.set_descriptor(Attr.OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv)
            set_scalar(op, Attr.OPERATION_CONVOLUTION_FORWARD_ALPHA, alpha)
            set_scalar(op, Attr.OPERATION_CONVOLUTION_FORWARD_BETA, beta)
        elif direction == "backward_data":
            op = track(BackendDescriptor(DescriptorType.OPERATION_CONVOLUTION_BACKWARD_DATA))
            op.set_descriptor(Attr.OPERATION_CONVOLUTION_BWD_DATA_DX, tx)
            op.set_descriptor(Attr.OPERATION_CONVOLUTION_BWD_DATA_W, tw)
            op.set_descriptor(Attr.OPERATION_CONVOLUTION_BWD_DATA_DY, ty)
            op.set_descriptor(Attr.OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, conv)
            set_scalar(op, Attr.OPERATION_CONVOLUTION_BWD_DATA_ALPHA, alpha)
            set_scalar(op, Attr.OPERATION_CONVOLUTION_BWD_DATA_BETA, beta)
        else:
            op = track(BackendDescriptor(DescriptorType.OPERATION_CONVOLUTION_BACKWARD_FILTER))
            op.set_descriptor(Attr.OPERATION_CONVOLUTION_BWD_FILTER_X, tx)
            op.set_descriptor(Attr.OPERATION_CONVOLUTION_BWD_FILTER_DW, tw)
            op.set_descriptor(Attr.OPERATION_CONVOLUTION_BWD_FILTER_DY, ty)
            op.set_descriptor(Attr.OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, conv)
            set_scalar(op, Attr.OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, alpha)
            set_scalar(op, Attr.OPERATION_CONVOLUTION_BWD_FILTER_BETA, beta)
        op.finalize()
        ops = [op]
        desc_parts = []

        if epilogue is not None:
            def pointwise(mode: PointwiseMode, xin: BackendDescriptor, out: BackendDescriptor,
                          bin: BackendDescriptor | None = None, alpha2: float | None = None
                          ) -> None:
                pw = track(BackendDescriptor(DescriptorType.POINTWISE))
                pw.set_enum(Attr.POINTWISE_MODE, mode)
                pw.set_data_type(Attr.POINTWISE_MATH_PREC, inter_dt)
                pw.finalize()
                pop = track(BackendDescriptor(DescriptorType.OPERATION_POINTWISE))
                pop.set_descriptor(Attr.OPERATION_POINTWISE_PW_DESCRIPTOR, pw)
                pop.set_descriptor(Attr.OPERATION_POINTWISE_XDESC, xin)
                if bin is not None:
                    pop.set_descriptor(Attr.OPERATION_POINTWISE_BDESC, bin)
                pop.set_descriptor(Attr.OPERATION_POINTWISE_YDESC, out)
                if alpha2 is not None:
                    set_scalar(pop, Attr.OPERATION_POINTWISE_ALPHA2, alpha2)
                pop.finalize()
                ops.append(pop)

            steps = []
            if epilogue.z is not None:
                steps.append("z")
            if epilogue.bias is not None:
                steps.append("bias")
            if epilogue.relu:
                steps.append("relu")
            cur = conv_out
            for i, step in enumerate(steps):
                out = ty if i == len(steps) - 1 else virtual_like(y)[1]
                if step == "z":
                    assert epilogue.z is not None  # the "z" step is listed only with a z
                    tz = track(epilogue.z.build())
                    a = float(epilogue.alpha)
                    if a == 1.0:
                        pointwise(PointwiseMode.ADD, cur, out, tz)
                        desc_parts.append("+z")
                    elif epilogue.alpha_mode == "alpha2":
                        pointwise(PointwiseMode.ADD, cur, out, tz, alpha2=a)
                        desc_parts.append(f"+{a:g}*z(alpha2)")
                    else:
                        suid = next(next_uid)
                        sspec = TensorSpec(suid, (1,) * nd, (1,) * nd, inter_dt, by_value=True)
                        tsc = track(sspec.build())
                        buf: ctypes.c_double | ctypes.c_float = (
                            ctypes.c_double(a) if inter_dt == _DT_DOUBLE else ctypes.c_float(a))
                        by_value.append((suid, buf))
                        _, zs = virtual_like(epilogue.z)
                        pointwise(PointwiseMode.MUL, tz, zs, tsc)
                        pointwise(PointwiseMode.ADD, cur, out, zs)
                        desc_parts.append(f"+{a:g}*z(mul)")
                elif step == "bias":
                    assert epilogue.bias is not None  # the "bias" step is listed only with a bias
                    tb = track(epilogue.bias.build())
                    pointwise(PointwiseMode.ADD, cur, out, tb)
                    desc_parts.append("+bias")
                else:
                    pointwise(PointwiseMode.RELU_FWD, cur, out)
                    desc_parts.append("relu")
                cur = out

        g = _finalized_graph(handle, ops)
    except CudnnError as exc:
        for d in keep:
            d.close()
        raise exc.add_context(
            f"graph: {direction} x{x.shape}/{x.strides} w{w.shape}/{w.strides} "
            f"y{y.shape}/{y.strides} dtype={x.dtype} compute={comp} pad={pre}/{post} "
            f"stride={strd} dilation={dil} groups={groups}"
            + (f" epilogue={epilogue}" if epilogue is not None else ""))
    except BaseException:
        for d in keep:
            d.close()
        raise
    desc = (f"{direction} x{x.shape} w{w.shape} y{y.shape} groups={groups} pad={pre} "
            f"stride={strd} dil={dil}" + ("".join(" " + p for p in desc_parts)))
    return OperationGraph(g, direction, specs, keep, by_value, epilogue, desc)


# ---- pointwise graphs --------------------------------------------------------------------------

@dataclass(frozen=True)
class PointwiseStep:
    """One pointwise operation of a graph: its mode, the tensors it reads and writes by name
    (``x`` / ``b`` / ``dy`` in, ``y`` / ``dx`` out: the descriptor attributes cuDNN names them by)
    and the mode's scalar parameters (``Attr.POINTWISE_RELU_UPPER_CLIP``,
    ``Attr.POINTWISE_ELU_ALPHA``, ``Attr.POINTWISE_SWISH_BETA``...)."""
    mode: PointwiseMode
    x: str
    y: str = ""
    b: str = ""
    dy: str = ""
    dx: str = ""
    params: tuple[tuple[Attr, float], ...] = ()


def build_pointwise_graph(handle: int, tensors: Mapping[str, TensorSpec],
                          steps: Sequence[PointwiseStep], description: str,
                          math_dtype: int | npt.DTypeLike | None = None,
                          values: Mapping[str, float] | None = None) -> OperationGraph:
    """Build and finalize a graph of pointwise operations only (activations, their gradients,
    scale-and-shift chains), which cuDNN's runtime-fusion engines compile into one kernel.

    Args:
        handle: a cudnnHandle_t (int).
        tensors: every tensor the steps name; the real ones (not virtual, not by value) in the
            order `ExecutionPlan.execute()` takes their pointers.
        steps: the operations in data-flow order.
        description: what the graph computes, for messages.
        math_dtype: the operations' precision; default float32 (float64 for double data).
        values: the host value of each by-value tensor (a scalar such as an epsilon), by name.
    """
    real = {k: t for k, t in tensors.items() if not t.virtual and not t.by_value}
    by_value: list[tuple[int, ctypes.c_double | ctypes.c_float]] = []
    for name, t in tensors.items():
        if t.by_value:
            if values is None or name not in values:
                raise ValueError(f"build_pointwise_graph: by-value tensor {name!r} has no value")
            by_value.append((t.uid, ctypes.c_double(values[name]) if t.dtype == _DT_DOUBLE
                             else ctypes.c_float(values[name])))
    if math_dtype is None:
        math_dtype = _DT_DOUBLE if any(t.dtype == _DT_DOUBLE for t in real.values()) else _DT_FLOAT
    prec = to_data_type(math_dtype)
    keep: list[BackendDescriptor] = []
    try:
        built = {}
        for name, spec in tensors.items():
            built[name] = spec.build()
            keep.append(built[name])
        ops = []
        roles = (("x", Attr.OPERATION_POINTWISE_XDESC), ("b", Attr.OPERATION_POINTWISE_BDESC),
                 ("y", Attr.OPERATION_POINTWISE_YDESC), ("dy", Attr.OPERATION_POINTWISE_DYDESC),
                 ("dx", Attr.OPERATION_POINTWISE_DXDESC))
        set_scalar = (BackendDescriptor.set_double if prec == _DT_DOUBLE
                      else BackendDescriptor.set_float)
        for step in steps:
            pw = BackendDescriptor(DescriptorType.POINTWISE)
            keep.append(pw)
            pw.set_enum(Attr.POINTWISE_MODE, step.mode)
            pw.set_data_type(Attr.POINTWISE_MATH_PREC, prec)
            for attr, value in step.params:
                set_scalar(pw, attr, value)
            pw.finalize()
            op = BackendDescriptor(DescriptorType.OPERATION_POINTWISE)
            keep.append(op)
            op.set_descriptor(Attr.OPERATION_POINTWISE_PW_DESCRIPTOR, pw)
            for role, attr in roles:
                name = getattr(step, role)
                if name:
                    op.set_descriptor(attr, built[name])
            op.finalize()
            ops.append(op)
        g = _finalized_graph(handle, ops)
    except CudnnError as exc:
        for d in keep:
            d.close()
        raise exc.add_context(f"graph: pointwise {description}")
    except BaseException:
        for d in keep:
            d.close()
        raise
    return OperationGraph(g, "pointwise", dict(real), keep, by_value, None,
                          f"pointwise {description}")


# ---- engine configs ----------------------------------------------------------------------------

def _enum_or_int(cls: type[IntEnum], v: int) -> int:
    try:
        return cls(v)
    except ValueError:
        return int(v)


@dataclass(eq=False)
class EngineConfig:
    """One candidate: a finalized engine-config descriptor and what the engine says about itself.

    ``key`` (engine id + sorted knob choices) identifies it across processes (a tuning database
    can store it and `from_key()` rebuilds it).
    """
    descriptor: BackendDescriptor
    graph: OperationGraph
    engine_id: int
    knobs: tuple[tuple[int, int], ...]
    numerical_notes: tuple[int, ...]
    behavior_notes: tuple[int, ...]
    mode: str = ""
    rank: int = 0

    @property
    def key(self) -> tuple[int, tuple[tuple[int, int], ...]]:
        return self.engine_id, tuple(sorted((int(t), int(v)) for t, v in self.knobs))

    @property
    def tag(self) -> str:
        """cudnn-frontend style name, e.g. ``eng41_k2=3_k13=0``."""
        return f"eng{self.engine_id}" + "".join(f"_k{t}={v}" for t, v in self.key[1])

    @property
    def runtime_compiled(self) -> bool:
        return BehaviorNote.RUNTIME_COMPILATION in self.behavior_notes

    @property
    def tensor_core(self) -> bool:
        return NumericalNote.TENSOR_CORE in self.numerical_notes

    @property
    def nondeterministic(self) -> bool:
        return NumericalNote.NONDETERMINISTIC in self.numerical_notes

    def close(self) -> None:
        self.descriptor.close()

    def __repr__(self) -> str:
        notes = ",".join(getattr(n, "name", str(n)) for n in self.numerical_notes)
        beh = ",".join(getattr(n, "name", str(n)) for n in self.behavior_notes)
        return f"<EngineConfig {self.tag} mode={self.mode} notes=[{notes}] behavior=[{beh}]>"

    @classmethod
    def from_key(cls, graph: OperationGraph, engine_id: int,
                 knobs: Iterable[tuple[int, int]] = ()) -> "EngineConfig":
        """Rebuild a config from its engine id and knob choices (no heuristics)."""
        engine = BackendDescriptor(DescriptorType.ENGINE)
        made: list[BackendDescriptor] = [engine]
        try:
            engine.set_descriptor(Attr.ENGINE_OPERATION_GRAPH, graph.descriptor)
            engine.set_int64(Attr.ENGINE_GLOBAL_INDEX, engine_id)
            engine.finalize()
            choices = []
            knobs = tuple((int(t), int(v)) for t, v in knobs)
            for t, v in knobs:
                kc = BackendDescriptor(DescriptorType.KNOB_CHOICE)
                made.append(kc)
                kc.set_enum(Attr.KNOB_CHOICE_KNOB_TYPE, t)
                kc.set_int64(Attr.KNOB_CHOICE_KNOB_VALUE, v)
                kc.finalize()
                choices.append(kc)
            cfg = BackendDescriptor(DescriptorType.ENGINECFG)
            made.append(cfg)
            cfg.set_descriptor(Attr.ENGINECFG_ENGINE, engine)
            if choices:
                cfg.set_descriptors(Attr.ENGINECFG_KNOB_CHOICES, choices)
            cfg.finalize()
            num = tuple(engine.get_enums(Attr.ENGINE_NUMERICAL_NOTE, _NOTES_MAX))
            beh = tuple(engine.get_enums(Attr.ENGINE_BEHAVIOR_NOTE, _NOTES_MAX))
        except BaseException:
            for d in made:
                d.close()
            raise
        return cls(cfg, graph, int(engine_id),
                   tuple((_enum_or_int(KnobType, t), v) for t, v in knobs), num, beh, "key", 0)


class CandidateList(list[EngineConfig]):
    """A list of `EngineConfig` with ``problems``: what went wrong while collecting it
    (a heuristic mode that failed, a config that could not be read)."""

    def __init__(self, items: Iterable[EngineConfig] = (),
                 problems: Iterable[str] | None = None) -> None:
        super().__init__(items)
        self.problems: list[str] = list(problems or [])


_MODE_NAMES = {"A": HeurMode.A, "B": HeurMode.B, "FALLBACK": HeurMode.FALLBACK,
               "INSTANT": HeurMode.INSTANT}


def _describe(cfg: BackendDescriptor, knob_pool: list[BackendDescriptor]
              ) -> tuple[int, tuple[tuple[int, int], ...], tuple[int, ...], tuple[int, ...]]:
    engine = cfg.get_descriptor(Attr.ENGINECFG_ENGINE, DescriptorType.ENGINE)
    try:
        eid = engine.get_int64(Attr.ENGINE_GLOBAL_INDEX)
        num = tuple(engine.get_enums(Attr.ENGINE_NUMERICAL_NOTE, _NOTES_MAX))
        beh = tuple(engine.get_enums(Attr.ENGINE_BEHAVIOR_NOTE, _NOTES_MAX))
    finally:
        engine.close()
    try:
        n = cfg.fill_descriptors(Attr.ENGINECFG_KNOB_CHOICES, knob_pool)
    except CudnnError:
        # receivers reused from an earlier config refused: retry once with fresh ones
        fresh = [BackendDescriptor(DescriptorType.KNOB_CHOICE) for _ in range(len(knob_pool))]
        for k in knob_pool:
            k.close()
        knob_pool[:] = fresh
        n = cfg.fill_descriptors(Attr.ENGINECFG_KNOB_CHOICES, knob_pool)
    knobs = []
    for kc in knob_pool[:n]:
        t = kc.get_enum(Attr.KNOB_CHOICE_KNOB_TYPE)
        v = kc.get_int64(Attr.KNOB_CHOICE_KNOB_VALUE)
        knobs.append((t, v))
    return eid, tuple(knobs), num, beh


def engine_configs(handle: int, graph: OperationGraph,
                   modes: Sequence[str | HeurMode] = ("A", "B", "FALLBACK")) -> CandidateList:
    """Candidate engine configs from cuDNN's heuristics, in the order of ``modes`` and then of
    each mode's ranking, deduplicated by `EngineConfig.key`.

    A mode that fails is recorded in ``problems`` and skipped (the others still answer).
    """
    if not isinstance(graph, OperationGraph):
        raise TypeError(f"graph must be an OperationGraph, got {type(graph).__name__}")
    if isinstance(modes, str):
        modes = (modes,)
    mode_enums = []
    for m in modes:
        key = m.name if isinstance(m, HeurMode) else str(m).upper()
        if key not in _MODE_NAMES:
            raise ValueError(f"unknown heuristic mode {m!r}; expected one of {sorted(_MODE_NAMES)}")
        mode_enums.append((key, _MODE_NAMES[key]))
    out = CandidateList()
    seen: set = set()
    knob_pool = [BackendDescriptor(DescriptorType.KNOB_CHOICE) for _ in range(_KNOB_POOL_SIZE)]
    try:
        for name, mode in mode_enums:
            heur = BackendDescriptor(DescriptorType.ENGINEHEUR)
            try:
                heur.set_descriptor(Attr.ENGINEHEUR_OPERATION_GRAPH, graph.descriptor)
                heur.set_enum(Attr.ENGINEHEUR_MODE, mode)
                heur.finalize()
                count = heur.get_count(Attr.ENGINEHEUR_RESULTS)
                cfgs = heur.get_descriptors(Attr.ENGINEHEUR_RESULTS, DescriptorType.ENGINECFG, count)
            except CudnnError as exc:
                out.problems.append(f"heuristics mode {name}: {exc}")
                continue
            finally:
                heur.close()
            for rank, cfg in enumerate(cfgs):
                try:
                    eid, knobs, num, beh = _describe(cfg, knob_pool)
                except CudnnError as exc:
                    out.problems.append(f"mode {name} result {rank}: {exc}")
                    cfg.close()
                    continue
                c = EngineConfig(cfg, graph, eid, knobs, num, beh, name, rank)
                if c.key in seen:
                    cfg.close()
                    continue
                seen.add(c.key)
                out.append(c)
    finally:
        for k in knob_pool:
            k.close()
    return out


def filter_candidates(cands: Iterable[EngineConfig], dtype: int | npt.DTypeLike, allow_tf32: bool,
                      deterministic: bool) -> tuple[list[EngineConfig], list[tuple[EngineConfig, str]]]:
    """Drop candidates the way PyTorch's v8 path does: DOWN_CONVERT_INPUTS engines always;
    TENSOR_CORE engines for float32 data when TF32 is not allowed; NONDETERMINISTIC engines when
    determinism is asked for. Returns ``(kept, [(dropped, reason), ...])``."""
    is_float32 = to_data_type(dtype) == _DT_FLOAT
    kept, dropped = [], []
    for c in cands:
        notes = c.numerical_notes
        if NumericalNote.DOWN_CONVERT_INPUTS in notes:
            dropped.append((c, "DOWN_CONVERT_INPUTS"))
        elif is_float32 and not allow_tf32 and NumericalNote.TENSOR_CORE in notes:
            dropped.append((c, "TENSOR_CORE with float32 and allow_tf32=False"))
        elif deterministic and NumericalNote.NONDETERMINISTIC in notes:
            dropped.append((c, "NONDETERMINISTIC with deterministic=True"))
        else:
            kept.append(c)
    return kept, dropped


# ---- execution plans ---------------------------------------------------------------------------

class ExecutionPlan:
    """An execution plan built from an `EngineConfig` (lazily: call `finalize()`).

    After finalize: ``workspace_size`` (bytes), ``finalize_time`` (seconds), ``engine_id``,
    ``knobs``, ``notes`` (numerical), ``behavior_notes``, ``runtime_compiled``.
    """

    def __init__(self, config: EngineConfig, max_packs: int = 8) -> None:
        if not isinstance(config, EngineConfig):
            raise TypeError(f"config must be an EngineConfig, got {type(config).__name__}")
        if max_packs < 1:
            raise ValueError("max_packs must be >= 1")
        self.config = config
        self.graph = config.graph
        self.uids = config.graph.uids
        self._alignments = config.graph.alignments
        self._names = tuple(config.graph.specs)
        self.max_packs = int(max_packs)
        self.descriptor: BackendDescriptor | None = None
        self.workspace_size: int | None = None
        self.finalize_time: float | None = None
        self._plan_ptr: int | None = None
        self._exec: Any = None  # cudnnBackendExecute (a ctypes function) once finalized
        self._packs: OrderedDict[tuple[Sequence[int], int], BackendDescriptor] = OrderedDict()
        self._lock = threading.Lock()

    # -- facts ---------------------------------------------------------------------------------
    engine_id = property(lambda self: self.config.engine_id)
    knobs = property(lambda self: self.config.knobs)
    notes = property(lambda self: self.config.numerical_notes)
    behavior_notes = property(lambda self: self.config.behavior_notes)
    runtime_compiled = property(lambda self: self.config.runtime_compiled)
    tag = property(lambda self: self.config.tag)
    key = property(lambda self: self.config.key)

    @property
    def finalized(self) -> bool:
        return self._plan_ptr is not None

    def __repr__(self) -> str:
        state = (f"workspace={self.workspace_size} finalize={self.finalize_time * 1e3:.2f}ms"
                 if self.finalized and self.finalize_time is not None else "not finalized")
        return f"<ExecutionPlan {self.tag} {state}>"

    # -- building ------------------------------------------------------------------------------

    def finalize(self, handle: int) -> "ExecutionPlan":
        """Build the plan (may compile kernels: see ``runtime_compiled``). Idempotent."""
        if self._plan_ptr is not None:
            return self
        if self.graph.closed:
            raise ClosedDescriptorError("ExecutionPlan.finalize: its operation graph was closed")
        d = BackendDescriptor(DescriptorType.EXECUTION_PLAN)
        try:
            d.set_handle(Attr.EXECUTION_PLAN_HANDLE, handle)
            d.set_descriptor(Attr.EXECUTION_PLAN_ENGINE_CONFIG, self.config.descriptor)
            t0 = time.perf_counter()
            d.finalize()
            self.finalize_time = time.perf_counter() - t0
            self.workspace_size = d.get_int64(Attr.EXECUTION_PLAN_WORKSPACE_SIZE)
        except CudnnError as exc:
            d.close()
            raise exc.add_context(f"plan: {self.tag} for {self.graph.description}")
        except BaseException:
            d.close()
            raise
        self._adopt(d)
        return self

    def _adopt(self, d: BackendDescriptor) -> None:
        L = _lib.lib()
        self.descriptor = d
        self._exec = L.cudnnBackendExecute
        self._setattr = L.cudnnBackendSetAttribute
        self._finalize_fn = L.cudnnBackendFinalize
        all_uids = self.uids + self.graph.by_value_uids
        self._uid_array = (ctypes.c_int64 * len(all_uids))(*all_uids)
        self._plan_ptr = d.ptr

    @classmethod
    def from_json(cls, handle: int, graph: OperationGraph, text: str,
                  max_packs: int = 8) -> "ExecutionPlan":
        """Deserialize a plan saved with `json()` (same cuDNN version and device); ``graph``
        supplies the uids the variant packs use, so it must be the graph the plan was made for.

        Only for JSON this process trusts: the text carries the plan's own tensors, and nothing
        here proves they are ``graph``'s (pycudnn's tuning database never stores or loads plan
        JSON for that reason; it rebuilds plans with `EngineConfig.from_key()`).

        Raises:
            CudnnError: cuDNN does not take the text, or the plan's engine config (and so its
                notes) cannot be read.
        """
        d = BackendDescriptor(DescriptorType.EXECUTION_PLAN)
        try:
            d.set_handle(Attr.EXECUTION_PLAN_HANDLE, handle)
            d.set_chars(Attr.EXECUTION_PLAN_JSON_REPRESENTATION, text)
            t0 = time.perf_counter()
            d.finalize()
            elapsed = time.perf_counter() - t0
            ws = d.get_int64(Attr.EXECUTION_PLAN_WORKSPACE_SIZE)
        except BaseException:
            d.close()
            raise
        cfg_desc = None
        try:  # the engine config the plan carries, to report engine id and notes
            cfg_desc = d.get_descriptor(Attr.EXECUTION_PLAN_ENGINE_CONFIG, DescriptorType.ENGINECFG)
            pool = [BackendDescriptor(DescriptorType.KNOB_CHOICE) for _ in range(_KNOB_POOL_SIZE)]
            try:
                eid, knobs, num, beh = _describe(cfg_desc, pool)
            finally:
                for k in pool:
                    k.close()
            cfg = EngineConfig(cfg_desc, graph, eid, knobs, num, beh, "json", 0)
        except BaseException:
            # no engine config, no notes: nothing to check the plan against (never run it)
            if cfg_desc is not None:
                cfg_desc.close()
            d.close()
            raise
        plan = cls(cfg, max_packs)
        plan.finalize_time = elapsed
        plan.workspace_size = ws
        plan._adopt(d)
        return plan

    def json(self) -> str:
        """The plan's JSON representation (CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION)."""
        if self.descriptor is None:
            raise PycudnnError("ExecutionPlan.json: finalize the plan first")
        return self.descriptor.get_json()

    # -- running -------------------------------------------------------------------------------

    def execute(self, handle: int, ptrs: Sequence[int] | Mapping[int | str, int],
                workspace: int = 0) -> None:
        """Run the plan on ``handle``'s stream.

        Args:
            handle: cudnnHandle_t (int); one per thread.
            ptrs: device pointers as a tuple ordered like `uids` (x, w, y[, z][, b]) -
                the fast path - or a mapping from uid or name ("x", "w", ...) to pointer.
            workspace: device pointer of at least ``workspace_size`` bytes (0 if none needed).
        """
        if ptrs.__class__ is not tuple:
            ptrs = self._order(ptrs)
        key = (ptrs, workspace)
        packs = self._packs
        vp = packs.get(key)
        if vp is None:
            vp = self._new_pack(ptrs, workspace)
        else:
            try:
                packs.move_to_end(key)
            except KeyError:  # evicted by another thread meanwhile; vp stays valid (we hold it)
                pass
        status = self._exec(handle, self._plan_ptr, vp._ptr)
        if status:
            self._raise_exec(status, ptrs, workspace)

    def _order(self, ptrs: Sequence[int] | Mapping[int | str, int]) -> tuple[int, ...]:
        if isinstance(ptrs, Mapping):
            out = []
            for uid, name in zip(self.uids, self._names):
                if uid in ptrs:
                    out.append(ptrs[uid])
                elif name in ptrs:
                    out.append(ptrs[name])
                else:
                    raise KeyError(f"ExecutionPlan.execute: no pointer for tensor {name!r} "
                                   f"(uid {uid}); expected keys {dict(zip(self._names, self.uids))}")
            return tuple(out)
        if isinstance(ptrs, (list, Sequence)) and not isinstance(ptrs, (str, bytes)):
            return tuple(ptrs)
        raise TypeError(f"ExecutionPlan.execute: ptrs must be a tuple ordered like uids "
                        f"{self.uids} or a mapping uid/name -> pointer, got {type(ptrs).__name__}")

    def _new_pack(self, ptrs: Sequence[int], workspace: int) -> BackendDescriptor:
        if self._plan_ptr is None:
            if self.descriptor is not None:
                raise ClosedDescriptorError("ExecutionPlan used after close()")
            raise PycudnnError("ExecutionPlan.execute: call finalize(handle) first")
        if len(ptrs) != len(self.uids):
            raise ValueError(f"ExecutionPlan.execute: {len(ptrs)} pointers given, the graph has "
                             f"{len(self.uids)} tensors {dict(zip(self._names, self.uids))}")
        key = (ptrs, workspace)
        if any(type(p) is not int for p in ptrs):  # numpy integers and other __index__ types
            norm = []
            for name, p in zip(self._names, ptrs):
                if isinstance(p, bool) or not hasattr(p, "__index__"):
                    raise TypeError(f"ExecutionPlan.execute: pointer for {name!r} must be an "
                                    f"int, got {p!r}")
                norm.append(p.__index__())
            ptrs = tuple(norm)
        if type(workspace) is not int and hasattr(workspace, "__index__") \
                and not isinstance(workspace, bool):
            workspace = workspace.__index__()
        for name, p, align in zip(self._names, ptrs, self._alignments):
            if p <= 0 or p >= 1 << 64:
                raise ValueError(f"ExecutionPlan.execute: pointer for {name!r} is not a valid "
                                 f"device address: {p:#x}")
            if p % align:
                raise ValueError(f"ExecutionPlan.execute: pointer for {name!r} ({p:#x}) is not "
                                 f"{align}-byte aligned as the graph declares")
        if isinstance(workspace, bool) or not isinstance(workspace, int) or workspace < 0:
            raise TypeError(f"ExecutionPlan.execute: workspace must be a device pointer (int), "
                            f"got {workspace!r}")
        if self.workspace_size and not workspace:
            raise ValueError(f"ExecutionPlan.execute: plan {self.tag} needs a workspace of "
                             f"{self.workspace_size} bytes")
        vp = BackendDescriptor(DescriptorType.VARIANT_PACK)
        # Arguments were validated above: set the three attributes with prebuilt ctypes arrays
        # (the generic typed setters would re-validate every element).
        all_ptrs = (*ptrs, *self.graph.by_value_ptrs)
        n = len(all_ptrs)
        setattr_ = self._setattr
        p = vp.ptr
        st = setattr_(p, _VP_UIDS, _T_INT64, n, self._uid_array)
        if not st:
            st = setattr_(p, _VP_PTRS, _T_VOID_PTR, n, (ctypes.c_void_p * n)(*all_ptrs))
        if not st:
            st = setattr_(p, _VP_WORKSPACE, _T_VOID_PTR, 1, ctypes.byref(ctypes.c_void_p(workspace)))
        if not st:
            st = self._finalize_fn(p)
        if st:
            try:  # raise first: cuDNN's reason is read before the destroy call
                _lib.raise_status(st, "variant pack (cudnnBackendSetAttribute/Finalize)",
                                  f"plan: {self.tag}",
                                  f"uids: {self.uids + self.graph.by_value_uids}")
            finally:
                vp.close()
        vp.finalized = True
        with self._lock:
            packs = self._packs
            packs[key] = vp  # the caller's key: equal ints hash alike, so later hits find it
            while len(packs) > self.max_packs:
                packs.popitem(last=False)  # dropped, not closed: a thread may still hold it
        return vp

    def _raise_exec(self, status: int, ptrs: Sequence[int], workspace: int) -> NoReturn:
        if self._plan_ptr is None:
            raise ClosedDescriptorError("ExecutionPlan used after close()")
        _lib.raise_status(status, "cudnnBackendExecute",
                          f"plan: {self.tag} for {self.graph.description}",
                          f"pointers: {dict(zip(self._names, (hex(p) for p in ptrs)))} "
                          f"workspace: {workspace:#x} ({self.workspace_size} bytes needed)")

    @property
    def cached_packs(self) -> int:
        """How many variant packs the LRU holds."""
        return len(self._packs)

    def clear_packs(self) -> None:
        """Forget cached variant packs (call when buffers they point to are freed and reused
        for something else is harmless: packs are keyed by the pointers themselves)."""
        with self._lock:
            self._packs = OrderedDict()

    def close(self) -> None:
        """Destroy the plan and its cached variant packs (idempotent)."""
        with self._lock:
            self._plan_ptr = None
            self._packs = OrderedDict()
        if self.descriptor is not None:
            self.descriptor.close()

    def __enter__(self) -> "ExecutionPlan":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def first_plan(handle: int, candidates: Iterable[EngineConfig], max_attempts: int | None = None,
               skip_runtime_compiled: bool = False
               ) -> tuple[ExecutionPlan, list[tuple[str, str]]]:
    """Finalize candidates in order until one works; returns ``(plan, failures)`` where
    failures are ``(tag, reason)`` of the ones that did not. Raises NoAlgorithmError if none."""
    failures: list[tuple[str, str]] = []
    tried = 0
    for c in candidates:
        if skip_runtime_compiled and c.runtime_compiled:
            failures.append((c.tag, "skipped: runtime compiled"))
            continue
        if max_attempts is not None and tried >= max_attempts:
            break
        tried += 1
        plan = ExecutionPlan(c)
        try:
            return plan.finalize(handle), failures
        except CudnnError as exc:
            failures.append((c.tag, f"{exc.status_name}: {exc.reason}"))
    raise NoAlgorithmError(f"no engine config finalized ({len(failures)} tried)", failures)


def fused_plan(handle: int, x: TensorSpec, w: TensorSpec, y: TensorSpec,
               padding: int | Sequence[int], stride: int | Sequence[int],
               dilation: int | Sequence[int], epilogue: Epilogue,
               compute_dtype: int | npt.DTypeLike | None = None, *, allow_tf32: bool = True,
               deterministic: bool = False, modes: Sequence[str] = ("A", "FALLBACK"),
               max_attempts: int | None = None) -> ExecutionPlan:
    """Forward conv + epilogue as one plan; if alpha != 1 on the z-add's ALPHA2 gets no working
    plan, rebuild the graph with alpha as a multiply by a by-value scalar (MEASURED.md 2b)."""
    attempts = [epilogue]
    if epilogue.z is not None and float(epilogue.alpha) != 1.0 and epilogue.alpha_mode == "alpha2":
        attempts.append(Epilogue(epilogue.z, epilogue.alpha, epilogue.bias, epilogue.relu, "mul"))
    all_failures: list[tuple[str, str]] = []
    for ep in attempts:
        g = build_convolution_graph(handle, "forward", x, w, y, padding, stride, dilation,
                                    compute_dtype, ep)
        cands = engine_configs(handle, g, modes)
        kept, dropped = filter_candidates(cands, x.dtype, allow_tf32, deterministic)
        for c, _ in dropped:
            c.close()
        try:
            plan, _ = first_plan(handle, kept, max_attempts)
        except NoAlgorithmError as exc:
            all_failures += [(f"{ep.alpha_mode}:{t}", r) for t, r in exc.failures]
            all_failures += [(f"{ep.alpha_mode}", p) for p in cands.problems]
            for c in kept:
                c.close()
            g.close()
            continue
        for c in kept:
            if c is not plan.config:
                c.close()
        return plan
    raise NoAlgorithmError(f"no fused plan for {epilogue}", all_failures)
