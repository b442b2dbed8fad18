"""Operation graphs: tensors as the graph API describes them (`TensorSpec`), convolution graphs
(forward, backward data, backward filter) with their fused epilogues (`Epilogue`: bias, add,
ReLU), and graphs of pointwise steps only (`build_pointwise_graph`).
"""

from __future__ import annotations

import ctypes
import itertools
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy.typing as npt

from ...errors import CudnnError
from ...ffi.backend import (
    Attr,
    BackendDescriptor,
    ConvMode,
    DescriptorType,
    PointwiseMode,
    to_data_type,
)

DIRECTIONS = ("forward", "backward_data", "backward_filter")
DT_FLOAT = 0   # cudnnDataType_t values used for compute / intermediates
_DT_DOUBLE = 1


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
        with d.closed_if_failed():
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


class OperationGraph:
    """A finalized operation graph and every descriptor it must keep alive.

    Attributes:
        descriptor: the finalized CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR.
        direction: ``"forward"``, ``"backward_data"`` or ``"backward_filter"`` (a convolution),
            ``"pointwise"`` (`build_pointwise_graph`), or a batch-norm fusion graph's kind
            (``"conv_genstats"``, ``"bn_finalize"``, ``"sbr_wgrad"``, ``"dgrad_drelu_dbn"``).
        uid: ``{"x": .., "w": .., "y": .., ["z": ..], ["b": ..]}`` (x/w/y keep their forward
            meaning in every direction: for backward_data x is dx, for backward_filter w is dw).
        uids: the order of pointers `ExecutionPlan.execute()` takes: x, w, y, then z, b.
        specs: the TensorSpecs by the same names.
    """

    def __init__(self, descriptor: BackendDescriptor, direction: str, specs: dict[str, TensorSpec],
                 keep: list[BackendDescriptor],
                 by_value: Sequence[tuple[int, ctypes.c_double | ctypes.c_float | ctypes.c_int64]],
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


def spatial_tuple(v: int | Sequence[int], n: int, name: str) -> tuple[int, ...]:
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


def check_conv_shapes(x: TensorSpec, w: TensorSpec, y: TensorSpec, pre: tuple[int, ...],
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


def finalized_graph(handle: int, ops: Sequence[BackendDescriptor]) -> BackendDescriptor:
    """The finalized operation-graph descriptor of ``ops`` (closed again if cuDNN refuses it)."""
    g = BackendDescriptor(DescriptorType.OPERATIONGRAPH)
    with g.closed_if_failed():
        g.set_handle(Attr.OPERATIONGRAPH_HANDLE, handle)
        g.set_descriptors(Attr.OPERATIONGRAPH_OPS, ops)
        g.finalize()
    return g


def convolution_descriptor(compute_dtype: int, pre: Sequence[int], post: Sequence[int],
                           stride: Sequence[int], dilation: Sequence[int]) -> BackendDescriptor:
    """A finalized cross-correlation descriptor (what every framework calls a convolution)."""
    conv = BackendDescriptor(DescriptorType.CONVOLUTION)
    with conv.closed_if_failed():
        conv.set_data_type(Attr.CONVOLUTION_COMP_TYPE, compute_dtype)
        conv.set_enum(Attr.CONVOLUTION_CONV_MODE, ConvMode.CROSS_CORRELATION)
        conv.set_int64(Attr.CONVOLUTION_SPATIAL_DIMS, len(pre))
        conv.set_int64s(Attr.CONVOLUTION_DILATIONS, dilation)
        conv.set_int64s(Attr.CONVOLUTION_FILTER_STRIDES, stride)
        conv.set_int64s(Attr.CONVOLUTION_PRE_PADDINGS, pre)
        conv.set_int64s(Attr.CONVOLUTION_POST_PADDINGS, post)
        conv.finalize()
    return conv


#: per direction: the operation, and its attributes for x, w and y (forward roles: dx, w, dy for
#: backward data; x, dw, dy for backward filter), the convolution descriptor, alpha and beta
CONVOLUTION_OPERATIONS: dict[str, tuple[DescriptorType, tuple[Attr, Attr, Attr, Attr, Attr, Attr]]] = {
    "forward": (DescriptorType.OPERATION_CONVOLUTION_FORWARD, (
        Attr.OPERATION_CONVOLUTION_FORWARD_X, Attr.OPERATION_CONVOLUTION_FORWARD_W,
        Attr.OPERATION_CONVOLUTION_FORWARD_Y, Attr.OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
        Attr.OPERATION_CONVOLUTION_FORWARD_ALPHA, Attr.OPERATION_CONVOLUTION_FORWARD_BETA)),
    "backward_data": (DescriptorType.OPERATION_CONVOLUTION_BACKWARD_DATA, (
        Attr.OPERATION_CONVOLUTION_BWD_DATA_DX, Attr.OPERATION_CONVOLUTION_BWD_DATA_W,
        Attr.OPERATION_CONVOLUTION_BWD_DATA_DY, Attr.OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
        Attr.OPERATION_CONVOLUTION_BWD_DATA_ALPHA, Attr.OPERATION_CONVOLUTION_BWD_DATA_BETA)),
    "backward_filter": (DescriptorType.OPERATION_CONVOLUTION_BACKWARD_FILTER, (
        Attr.OPERATION_CONVOLUTION_BWD_FILTER_X, Attr.OPERATION_CONVOLUTION_BWD_FILTER_DW,
        Attr.OPERATION_CONVOLUTION_BWD_FILTER_DY, Attr.OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
        Attr.OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, Attr.OPERATION_CONVOLUTION_BWD_FILTER_BETA)),
}


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
    pre = spatial_tuple(padding, ns, "padding")
    post = pre if post_padding is None else spatial_tuple(post_padding, ns, "post_padding")
    strd = spatial_tuple(stride, ns, "stride")
    dil = spatial_tuple(dilation, ns, "dilation")
    groups = check_conv_shapes(x, w, y, pre, post, strd, dil)
    if epilogue is not None and epilogue.empty:
        epilogue = None
    if epilogue is not None and direction != "forward":
        raise ValueError("an epilogue (bias / z / relu) is only fused into a forward convolution")
    if compute_dtype is None:
        compute_dtype = _DT_DOUBLE if x.dtype == _DT_DOUBLE else DT_FLOAT
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

        conv = track(convolution_descriptor(comp, pre, post, strd, dil))

        inter_dt = _DT_DOUBLE if comp == _DT_DOUBLE else DT_FLOAT

        def virtual_like(t: TensorSpec) -> tuple[TensorSpec, BackendDescriptor]:
            s = TensorSpec(next(next_uid), t.shape, t.strides, inter_dt, virtual=True)
            return s, track(s.build())

        # the tensor the convolution writes: y itself, or a virtual one the epilogue reads
        if epilogue is None:
            conv_out = ty
        else:
            _, conv_out = virtual_like(y)

        set_scalar = BackendDescriptor.set_double if scalar_double else BackendDescriptor.set_float
        op_type, (a_x, a_w, a_y, a_conv, a_alpha, a_beta) = CONVOLUTION_OPERATIONS[direction]
        op = track(BackendDescriptor(op_type))
        op.set_descriptor(a_x, tx)
        op.set_descriptor(a_w, tw)
        op.set_descriptor(a_y, conv_out)  # ty unless a (forward-only) epilogue reads it
        op.set_descriptor(a_conv, conv)
        set_scalar(op, a_alpha, alpha)
        set_scalar(op, a_beta, beta)
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

        g = finalized_graph(handle, ops)
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
        math_dtype = _DT_DOUBLE if any(t.dtype == _DT_DOUBLE for t in real.values()) else DT_FLOAT
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
        g = finalized_graph(handle, ops)
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
