"""Activation functions: cuDNN's ``cudnnActivationForward`` / ``cudnnActivationBackward`` for the
legacy modes, a pointwise graph from the first call for the graph-only ones (``"gelu"``,
``"gelu_tanh"``) and for PyTorch's tanh and swish gradients. The modes and their parameters are
the rows of `activation_modes`.

Tensors of 0 to 5 dims are taken with any strides (fewer than 4 dims are viewed as 4-D with
trailing unit dims); NaN propagates (``CUDNN_PROPAGATE_NAN``) and the values at the edges are
PyTorch's (docs/operations.md). A repeated call with the same layouts, dtype and mode reuses its
descriptors or its compiled graph (one dict lookup).
"""

from __future__ import annotations

import ctypes
from typing import Any

import threading

import numpy as np

from .._types import ActivationMode, NanPropagation, OpTensorOp
from ..cudnn.descriptors import ActivationDescriptor, OpTensorDescriptor, TensorDescriptor
from ..cudnn.graph import ExecutionPlan, OperationGraph
from ..cudnn.tensor_ops import transform
from ..ffi import library as _lib
from ..ops import runtime_kernels
from ..ops.activation_modes import ACTIVATIONS, NAMES, Activation, row
from ..ops._common import (FLOAT32, HALF_DTYPES, PlanCache, c_function, cached_plan, check_choice,
                           check_coef, check_input, check_operands, check_out_reads, checked_out,
                           layout_strides, plans_clearer, prologue, raise_launch, restore_device,
                           result, same_layout, scalars_of, signature, staged, stream_pair,
                           tensor_arg)
from ..ops.runtime_kernels import ALIGNMENT
from ..runtime.memory import StreamLike, relaxed_capture_mode
from ..runtime.tensor import Tensor, TensorLike, as_tensor, contiguous_strides, empty, from_numpy

__all__ = ["activation_forward", "activation_backward", "MODES"]

#: the modes the functions take, and cuDNN's ``cudnnActivationMode_t`` for each (None: the
#: graph API alone runs it)
MODES: dict[str, ActivationMode | None] = {a.name: a.legacy for a in ACTIVATIONS
                                           if not a.refused}
_RANKS = (0, 1, 2, 3, 4, 5)
_WHAT = "0 to 5 dims"

_FORWARD = PlanCache()
_BACKWARD = PlanCache()
clear_plans = plans_clearer(_FORWARD, _BACKWARD)

# the keys hold whether NaN propagates as a bool: hashing the IntEnum member is a Python call
_PROPAGATE = int(NanPropagation.PROPAGATE_NAN)


def _as4d(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[tuple[int, ...],
                                                                     tuple[int, ...]]:
    """A tensor of fewer than 4 dims as 4-D, with trailing unit dims (a view)."""
    if len(shape) >= 4:
        return shape, strides
    pad = 4 - len(shape)
    return shape + (1,) * pad, strides + (1,) * pad


def _view4(t: Tensor) -> Tensor:
    """``t`` as a view of at least 4 dims (trailing unit dims), as the descriptors see it."""
    if t.ndim >= 4:
        return t
    shape4, strides4 = _as4d(t.shape, t.strides)
    return Tensor._make(t.ptr, shape4, strides4, t.dtype, t.device, t, t.readonly)


def _descriptor(shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any) -> TensorDescriptor:
    shape4, strides4 = _as4d(shape, strides)
    return TensorDescriptor(shape4, dtype, strides4)


def activation_descriptor(mode: str, coef: float, nan: NanPropagation) -> ActivationDescriptor:
    """A new legacy activation descriptor for ``mode``; ``coef`` is the ceiling (clipped_relu),
    alpha (elu) or beta (swish, also set through the row's ``legacy_setter``)."""
    act = row(mode)
    assert act.legacy is not None
    desc = ActivationDescriptor(act.legacy, nan, coef)
    if act.legacy_setter:
        status = getattr(_lib.lib(), act.legacy_setter)(desc.handle, ctypes.c_double(coef))
        if status:
            desc.close()
            _lib.raise_status(status, act.legacy_setter, f"  coef: {coef!r}")
    return desc


def check_mode(mode: Any, fn: str) -> str:
    """``mode`` as a mode name of the table; a refused mode's message says why."""
    if type(mode) is str and mode not in NAMES:
        for act in ACTIVATIONS:
            if act.name == mode and act.refused:
                raise ValueError(f"{fn}: mode {mode!r} is not supported: {act.refused}")
    return check_choice(mode, "mode", NAMES, fn)


def below(coef: float, dtype: Any) -> float:
    """The largest value of ``dtype`` below ``coef`` (> 0), or 0.0 when there is none above 0:
    a test ``x <= below(coef)`` is PyTorch's ``x < coef`` for every ``x`` of that dtype."""
    dt = np.dtype(dtype)
    with np.errstate(over="ignore"):  # a coef above the dtype's range rounds to inf
        v = np.array(coef).astype(dt)
    if float(v) < coef:
        return float(v)
    if float(v) <= 0.0:
        return 0.0
    bits = v.view(f"u{dt.itemsize}")
    return float((bits - 1).astype(bits.dtype).view(dt))


class _EdgeFix:
    """The extra operation that gives PyTorch's values where cuDNN's legacy backward kernel
    gives others (`Activation.edges`), for one backward signature.

    ``nan_passes`` (ReLU): the kernel passes dy where its input is > 0 (0 at +-0 and -inf);
    PyTorch passes it where y is not <= 0, NaN included. ``min(y, +inf)`` with NaN not
    propagated is y with NaN turned into +inf, and the kernel is given that as y and x.
    """

    __slots__ = ("kind", "op", "scalar", "scalar_desc", "one", "keep")

    def __init__(self, kind: str, compute: Any) -> None:
        self.kind = kind
        wide = "float64" if np.dtype(compute).name == "float64" else "float32"
        self.op = OpTensorDescriptor(OpTensorOp.MIN, wide, NanPropagation.NOT_PROPAGATE_NAN)
        self.scalar_desc = TensorDescriptor((1, 1, 1, 1), compute, (1, 1, 1, 1))
        self.scalar: Tensor | None = None  # +inf on the device, made at the first call
        c = ctypes.c_double if wide == "float64" else ctypes.c_float
        self.keep = (c(1.0), c(0.0))
        self.one = ctypes.addressof(self.keep[0])

    def before(self, handle: int, y: Tensor, d: int, stream: int) -> Tensor:
        """ReLU: ``y`` with NaN as +inf, in a new dense tensor of ``y``'s layout."""
        if self.scalar is None:
            self.scalar = from_numpy(np.array([np.inf]), dtype=y.dtype, device=y.device)
        t = empty(y.shape, y.dtype, device=y.device, stream=stream)
        t = Tensor._make(t.ptr, y.shape, y.strides, y.dtype, y.device, t.owner)
        zero = ctypes.addressof(self.keep[1])
        status = c_function("cudnnOpTensor")(handle, self.op.handle, self.one, d, y.ptr, self.one,
                                          self.scalar_desc.handle, self.scalar.ptr, zero, d,
                                          t.ptr)
        if status:
            _lib.raise_status(status, "cudnnOpTensor", "  op: MIN (NaN to +inf)")
        return t


class GraphKernel:
    """A graph-only mode's compiled plan for one call signature, built at its first call.

    ``direct``: the operands are dense in one layout, which the graph addresses as a flat block
    (`runtime_kernels.flat_layout`), so aligned pointers go to the plan as they are; otherwise
    (and for unaligned pointers) the operands are copied to and from dense buffers of
    ``padded`` elements (a count that has such a block).
    """

    __slots__ = ("build", "plan", "error", "direct", "padded", "lock", "description")

    def __init__(self, build: Any, direct: bool, padded: int, description: str) -> None:
        self.build = build
        self.plan: ExecutionPlan | None = None
        self.error: BaseException | None = None
        self.direct = direct
        self.padded = padded
        self.lock = threading.Lock()
        self.description = description

    def compiled(self, handle: int) -> ExecutionPlan:
        plan = self.plan
        if plan is not None:
            return plan
        with self.lock:
            if self.error is not None:
                raise self.error
            if self.plan is None:
                try:
                    # finalizing loads a module: relaxed capture mode keeps a CUDA-graph
                    # capture valid
                    with relaxed_capture_mode():
                        graph: OperationGraph = self.build(handle)
                        self.plan = runtime_kernels.compiled_plan(handle, graph)
                except Exception as exc:
                    self.error = exc
                    raise
            return self.plan

    def run(self, handle: int, reads: tuple[Tensor, ...], out: Tensor, stream: int) -> None:
        """Launch on ``reads`` (the graph's inputs in order) into ``out``."""
        plan = self.compiled(handle)
        ptrs = tuple(t.ptr for t in reads) + (out.ptr,)
        aligned = not any(p % ALIGNMENT for p in ptrs)
        if self.direct and aligned:
            plan.execute(handle, ptrs, 0)
            return
        shape, dt, dev = out.shape, out.dtype, out.device
        flat = contiguous_strides(shape)

        def buffer(t: Tensor | None) -> Tensor:
            b = empty((self.padded,), dt, device=dev, stream=stream)
            v = Tensor._make(b.ptr, shape, flat, dt, dev, b.owner)
            if t is not None:
                transform(handle, _view4(t), _view4(v))
            return v

        staged_reads = tuple(buffer(t) for t in reads)
        target = buffer(None)
        plan.execute(handle, tuple(t.ptr for t in staged_reads) + (target.ptr,), 0)
        transform(handle, _view4(target), _view4(out))


def graph_kernel(act: Activation, coef: float, x: Tensor, strides: tuple[tuple[int, ...], ...],
                  backward: bool, fn: str) -> GraphKernel:
    """The graph kernel of a graph-only mode for a signature whose operands other than ``x``
    have ``strides``."""
    if x.dtype not in runtime_kernels.GRAPH_DTYPES:
        raise TypeError(f"{fn}: mode {act.name!r} runs on cuDNN's graph API, which takes "
                        f"float32, float16 or bfloat16 data, but got x of dtype {x.dtype.name}")
    n = x.size
    layout = runtime_kernels.flat_layout(n, x.dtype.itemsize)
    direct = (layout is not None and runtime_kernels.dense(x)
              and all(same_layout(x.shape, st, x.strides) for st in strides))
    padded = n
    if layout is None:
        padded = max(8, -(-n // 8) * 8)  # a multiple of 8 always has a (1, 2, 2, n / 4) block
        layout = runtime_kernels.flat_layout(padded, x.dtype.itemsize)
    assert layout is not None
    direction = "backward" if backward else "forward"
    description = f"{act.name} {direction} of {padded} {x.dtype.name} elements"
    build = runtime_kernels.activation_graph(act, coef, layout, x.dtype, backward, description)
    return GraphKernel(build, direct, padded, description)


class _Plan:
    """What a call needs besides its pointers: descriptors, the output's layout and size, the
    scaling constants and the bound C function."""

    __slots__ = ("act", "x", "y", "dy", "dx", "shape", "strides", "nbytes", "dense", "stage",
                 "one", "zero", "launch", "keep", "fast", "wide", "graph", "fix")

    def __init__(self) -> None:
        self.act = self.x = self.y = self.dy = self.dx = 0
        self.shape: tuple[int, ...] = ()
        self.strides: tuple[int, ...] = ()  # the output's
        self.nbytes = 0  # a new output's
        self.dense: tuple[int, ...] = ()  # the layout cuDNN is given, when operands are staged
        self.stage = False
        self.one = self.zero = 0
        self.launch: Any = None
        self.keep: tuple[Any, ...] = ()
        # the signature's runtime-compiled kernel, once built (see runtime_kernels); None when
        # the graph API cannot take its layouts
        self.fast: runtime_kernels.Promotion | None = None
        #: backward: the dtype the legacy kernel computes in when it is not the operands'
        #: (float32 for ELU on float16/bfloat16), staged through copies
        self.wide: Any = None
        #: a graph-only mode's compiled graph (the only kernel it has)
        self.graph: GraphKernel | None = None
        #: backward: what gives PyTorch's edge values on the legacy kernel
        self.fix: _EdgeFix | None = None


# ---- forward --------------------------------------------------------------------------------------

def activation_forward(x: TensorLike, mode: str = "relu", *, coef: float = 0.0,
                       out: TensorLike | None = None, stream: StreamLike | None = None) -> Tensor:
    """``y = activation(x)`` element by element (cuDNN's ``cudnnActivationForward``).

    Args:
        x: the input, anything `pycudnn.as_tensor()` accepts: 0 to 5
            dims, any strides (no broadcast dims); float32, float16, bfloat16 or float64.
        mode: ``"relu"``, ``"sigmoid"``, ``"tanh"``, ``"clipped_relu"``, ``"elu"``,
            ``"swish"``, ``"gelu"`` (``x * Phi(x)``, PyTorch's ``F.gelu``) or ``"gelu_tanh"``
            (its tanh approximation, ``F.gelu(x, approximate="tanh")``). The GELU modes run a
            cuDNN graph built at a signature's first call (float32, float16, bfloat16 only).
            (``"identity"`` is refused: cuDNN runs it only fused into a convolution.)
        coef: the ceiling of ``"clipped_relu"``, the alpha of ``"elu"``, the beta of ``"swish"``;
            ignored by the other modes. The default 0.0 is cuDNN's: pass ``coef=1.0`` for
            PyTorch's ``F.elu`` and ``F.silu``, ``coef=6.0`` for ``F.relu6``.
        out: optional output of ``x``'s shape, dtype and device, any strides; ``x`` itself (the
            same view) computes in place, an output that overlaps ``x`` partly is refused.
        stream: the CUDA stream to run on (int handle, cuda.core Stream, or an object with
            ``__cuda_stream__``); default the legacy default stream.

    Returns:
        The result as a `pycudnn.Tensor` in ``x``'s memory format
            (channels-last when ``x`` is), or ``out`` when it is given.
    """
    return run_forward(x, mode, coef, out, stream, NanPropagation.PROPAGATE_NAN,
                       "activation_forward")


def run_forward(x: Any, mode: Any, coef: Any, out: Any, stream: Any, nan: NanPropagation,
                fn: str) -> Tensor:
    s, s_ref = (0, None) if stream is None else stream_pair(stream)
    if type(x) is not Tensor:
        x = as_tensor(x, stream=stream)
    o = None if out is None else tensor_arg(out, stream)
    # the signature, flat: everything the checks and the descriptors depend on but the pointers
    key = (mode, coef, type(coef), nan == _PROPAGATE, x.shape, x.strides, x.dtype, x.device,
           signature(o))
    plan: _Plan = cached_plan(_FORWARD, key, forward_plan, x, mode, coef, o, nan, fn)
    if o is not None:
        check_out_reads(o, (), fn, in_place=x)
    if not plan.nbytes:  # no element
        return result(o, plan, x, s, s_ref)
    prev, handle, y = prologue(o, plan.nbytes, plan.shape, plan.strides, x, s, s_ref)
    try:
        if plan.graph is not None:
            plan.graph.run(handle, (x,), y, s)
            return y
        fast = plan.fast
        if fast is not None and fast.plan is not None and not (x.ptr | y.ptr) % ALIGNMENT \
                and fast.launch(handle, (x.ptr, y.ptr)):
            return y
        status = plan.launch(handle, plan.act, plan.one, plan.x, x.ptr, plan.zero, plan.y, y.ptr)
        if status:
            raise_launch(status, "cudnnActivationForward", fn, activation=plan.keep[0],
                         x=plan.keep[1], y=plan.keep[2])
        if fast is not None and fast.plan is None:
            fast.tick()
        return y
    finally:
        restore_device(prev)


def _new_plan(x: Tensor, mode: Any, coef: Any, o: Tensor | None,
              fn: str) -> tuple[str, float, Tensor | None, _Plan]:
    """The checks of both plans after the operands' (``mode``, ``coef``, ``out``, in that order),
    and a new plan of an output of ``x``'s size: ``(mode, coef, out, plan)``."""
    mode = check_mode(mode, fn)
    c = check_coef(coef, fn)
    if o is not None:
        o = checked_out(o, x.shape, x, fn, None)
    plan = _Plan()
    plan.shape = x.shape
    plan.nbytes = x.size * x.dtype.itemsize
    return mode, c, o, plan


def forward_plan(x: Tensor, mode: Any, coef: Any, o: Tensor | None, nan: NanPropagation,
                 fn: str) -> _Plan:
    """The full checks of a forward call, then its descriptors.
    Public as a seam for tests and tooling."""
    check_input(x, "x", fn, _RANKS, _WHAT)
    mode, c, o, plan = _new_plan(x, mode, coef, o, fn)
    plan.strides = layout_strides(x.shape, x) if o is None else o.strides
    if x.size == 0:
        return plan
    act_row = row(mode)
    if act_row.legacy is None:
        plan.graph = graph_kernel(act_row, c, x, (plan.strides,), False, fn)
        return plan
    plan.one, plan.zero = scalars_of(x.dtype)
    plan.launch = c_function("cudnnActivationForward")
    act = activation_descriptor(mode, c, nan)
    xd = _descriptor(x.shape, x.strides, x.dtype)
    # in place (or the same layout): one descriptor for both, as cuDNN asks of in-place calls
    yd = xd if same_layout(x.shape, plan.strides, x.strides) else _descriptor(x.shape, plan.strides, x.dtype)
    plan.act, plan.x, plan.y = act.handle, xd.handle, yd.handle
    plan.keep = (act, xd, yd)
    plan.fast = runtime_kernels.activation_promotion(mode, c, x, (plan.strides,), False,
                                                     nan == _PROPAGATE)
    return plan


# ---- backward -------------------------------------------------------------------------------------

def activation_backward(y: TensorLike, dy: TensorLike, x: TensorLike, mode: str = "relu", *,
                        coef: float = 0.0, out: TensorLike | None = None,
                        stream: StreamLike | None = None) -> Tensor:
    """The gradient ``dx`` of an activation, from its output ``y``, the gradient ``dy`` of ``y``
    and its input ``x`` (cuDNN's ``cudnnActivationBackward``).

    Args:
        y: the forward output (``activation_forward(x, mode, coef=coef)``).
        dy: the gradient with respect to ``y``.
        x: the forward input. ``y``, ``dy`` and ``x`` have one shape, dtype and device; any
            strides (cuDNN needs ``y``/``dy`` and ``x``/``dx`` laid out alike: operands that are
            not dense in ``x``'s memory format are staged through dense copies).
        mode: as for `activation_forward()`; the GELU modes read ``dy`` and ``x`` only.
        coef: as for `activation_forward()`.
        out: optional output of ``x``'s shape, dtype and device, any strides, sharing no memory
            with ``y``, ``dy`` or ``x``.
        stream: the CUDA stream to run on; default the legacy default stream.

    Returns:
        ``dx`` as a `pycudnn.Tensor` in ``x``'s memory format, or ``out``.
    """
    return run_backward(y, dy, x, mode, coef, out, stream, NanPropagation.PROPAGATE_NAN,
                        "activation_backward")


def run_backward(y: Any, dy: Any, x: Any, mode: Any, coef: Any, out: Any, stream: Any,
                 nan: NanPropagation, fn: str, pytorch_edges: bool = True) -> Tensor:
    """`activation_backward` with the NaN mode given; ``pytorch_edges=False`` skips the edge
    corrections (for a caller whose operands hold no value they change, or CuPy's calls)."""
    s, s_ref = (0, None) if stream is None else stream_pair(stream)
    y, dy, x = tensor_arg(y, stream), tensor_arg(dy, stream), tensor_arg(x, stream)
    o = None if out is None else tensor_arg(out, stream)
    edges = pytorch_edges and nan == _PROPAGATE  # CuPy 13's calls keep cuDNN's own values
    key = (mode, coef, type(coef), nan == _PROPAGATE, edges, y.shape, y.strides, y.dtype,
           y.device, dy.shape, dy.strides, dy.dtype, dy.device, x.shape, x.strides, x.dtype,
           x.device, signature(o))
    plan: _Plan = cached_plan(_BACKWARD, key, backward_plan, y, dy, x, mode, coef, o, nan, fn,
                              edges)
    if o is not None:
        check_out_reads(o, (("y", y), ("dy", dy), ("x", x)), fn)
    if not plan.nbytes:  # no element
        return result(o, plan, x, s, s_ref)
    prev, handle, dx = prologue(o, plan.nbytes, plan.shape, plan.strides, x, s, s_ref)
    try:
        if plan.graph is not None:
            plan.graph.run(handle, (dy, x), dx, s)
            return dx
        fast = plan.fast
        if fast is not None and fast.plan is not None:
            src = y if fast.reads_output else x
            if not (dy.ptr | src.ptr | dx.ptr) % ALIGNMENT \
                    and fast.launch(handle, (dy.ptr, src.ptr, dx.ptr)):
                return dx
        target = dx
        if plan.stage or plan.wide is not None:
            # operands not in the one dense layout (or the dtype) cuDNN is given; as 4-D views,
            # the fewest dims cudnnTransformTensor takes
            st, wd = _as4d(x.shape, plan.dense)[1], plan.wide
            y, dy, x, dx4 = _view4(y), _view4(dy), _view4(x), _view4(dx)
            y, dy = staged(handle, y, st, s, dtype=wd), staged(handle, dy, st, s, dtype=wd)
            x = staged(handle, x, st, s, dtype=wd)
            target = staged(handle, dx4, st, s, copy=False, dtype=wd)
            if target is dx4:
                target = dx
        d = plan.x
        if plan.wide is not None:
            # y again from x in float32, into its float32 copy: cuDNN's ELU gradient reads y
            # (y + alpha where x < 0), and the half y's rounding, amplified where y + alpha is
            # small, was most of the error against PyTorch's float32 gradient from x
            status = c_function("cudnnActivationForward")(handle, plan.act, plan.one, d, x.ptr,
                                                          plan.zero, d, y.ptr)
            if status:
                raise_launch(status, "cudnnActivationForward", fn, activation=plan.keep[0],
                             tensors=plan.keep[1])
        fix = plan.fix
        if fix is not None and fix.kind == "nan_passes":
            y = x = fix.before(handle, y, d, s)
        status = plan.launch(handle, plan.act, plan.one, d, y.ptr, d, dy.ptr, d, x.ptr, plan.zero,
                             d, target.ptr)
        if status:
            raise_launch(status, "cudnnActivationBackward", fn, activation=plan.keep[0],
                         tensors=plan.keep[1])
        if target is not dx:
            transform(handle, target, _view4(dx))
        if fast is not None and fast.plan is None:
            fast.tick()
        return dx
    finally:
        restore_device(prev)


def backward_plan(y: Tensor, dy: Tensor, x: Tensor, mode: Any, coef: Any, o: Tensor | None,
                  nan: NanPropagation, fn: str, pytorch_edges: bool = True) -> _Plan:
    """The full checks of a backward call, then its plan; nothing is launched. Public as a seam
    for tests and tooling."""
    check_input(x, "x", fn, _RANKS, _WHAT)
    check_operands(x, "x", ((y, "y"), (dy, "dy")), x.shape, "the shape of x", fn, _RANKS, _WHAT)
    mode, c, o, plan = _new_plan(x, mode, coef, o, fn)
    plan.dense = dense = layout_strides(x.shape, x)
    plan.strides = dense if o is None else o.strides
    if x.size == 0:
        return plan
    act_row = row(mode)
    pytorch_edges = pytorch_edges and nan == _PROPAGATE
    if act_row.legacy is None or (pytorch_edges and act_row.pytorch_backward
                                  and x.dtype in runtime_kernels.GRAPH_DTYPES):
        plan.graph = graph_kernel(act_row, c, x, (dy.strides, plan.strides), True, fn)
        return plan
    # cuDNN's float16/bfloat16 ELU backward is wrong for a one-element tensor (0.198 off in
    # float16, 1.0 in bfloat16, against float64; float32 exact): its legacy kernel computes ELU
    # on float32 copies (PyTorch computes half ELU gradients in float32 too)
    compute = FLOAT32 if mode == "elu" and x.dtype.name in HALF_DTYPES else x.dtype
    plan.wide = compute if compute != x.dtype else None
    plan.one, plan.zero = scalars_of(compute)
    plan.launch = c_function("cudnnActivationBackward")
    # cuDNN wants y and dy, x and dx laid out alike: one dense layout for all four, and operands
    # in another staged through copies
    plan.stage = not all(same_layout(x.shape, t, dense)
                         for t in (y.strides, dy.strides, x.strides, plan.strides))
    if pytorch_edges and act_row.edges == "open_ceiling" and c > 0:
        # the legacy kernel passes dy at x == coef (PyTorch: 0 from x >= coef on): its
        # ceiling one value of the dtype lower makes its test PyTorch's x < coef
        c = below(c, x.dtype)
    act = activation_descriptor(mode, c, nan)
    if pytorch_edges and act_row.edges == "nan_passes":
        plan.fix = _EdgeFix(act_row.edges, compute)
    d = _descriptor(x.shape, dense, compute)
    plan.act = act.handle
    plan.x = plan.y = plan.dy = plan.dx = d.handle
    plan.keep = (act, d)
    if not plan.stage:
        plan.fast = runtime_kernels.activation_promotion(
            mode, c, x, (y.strides, dy.strides, plan.strides), True, nan == _PROPAGATE)
    return plan
