"""Softmax through cuDNN's ``cudnnSoftmaxForward`` / ``cudnnSoftmaxBackward``.

``mode="channel"`` normalizes over C (dim 1) for each sample and spatial position, as PyTorch's
``F.softmax(x, dim=1)``; ``mode="instance"`` over all of C and the spatial dims for each sample.
``algorithm="accurate"`` subtracts the maximum first (what PyTorch computes), ``"fast"`` does not
(it overflows for large inputs), ``"log"`` gives the log-softmax (``F.log_softmax``).

Tensors of 2 to 5 dims ``(N, C, *spatial)`` take any strides; cuDNN is given 4-D descriptors:
2-D and 3-D tensors get trailing unit dims, a 5-D one has two spatial dims folded into one
(``D`` and ``H``, or ``H`` and ``W``, adjacent in memory, as in NCDHW and NDHWC). cuDNN's 5-D
descriptors give wrong results for spatial dims that are not packed, and its instance mode reads
each sample's ``C*H*W`` values as one packed block: operands it cannot take as they are (a 5-D
view that does not fold; in instance mode any layout but one dense, sample-major layout shared
by all operands) are staged through dense copies. A repeated call with the same layouts, dtype
and options reuses its descriptors.
"""

from __future__ import annotations

from typing import Any

from .._types import SoftmaxAlgorithm, SoftmaxMode
from ..cudnn.descriptors import TensorDescriptor
from ..ops._common import (FLOAT32, HALF_DTYPES, PlanCache, Staging, c_function, cached_plan,
                           check_choice, check_input, check_operands, check_out_reads, checked_out,
                           layout_strides, plans_clearer, prologue, raise_launch, restore_device,
                           result, same_layout, scalars_of, signature, staging, stream_pair,
                           tensor_arg)
from ..runtime.memory import StreamLike
from ..runtime.tensor import Tensor, TensorLike, as_tensor

__all__ = ["softmax_forward", "softmax_backward", "SoftmaxAlgorithm", "SoftmaxMode", "ALGORITHMS",
           "MODES"]


#: the ``algorithm`` names the functions take
ALGORITHMS: dict[str, SoftmaxAlgorithm] = {"fast": SoftmaxAlgorithm.FAST,
                                           "accurate": SoftmaxAlgorithm.ACCURATE,
                                           "log": SoftmaxAlgorithm.LOG}
#: the ``mode`` names the functions take
MODES: dict[str, SoftmaxMode] = {"channel": SoftmaxMode.CHANNEL,
                                 "instance": SoftmaxMode.INSTANCE}
_RANKS = (2, 3, 4, 5)
_WHAT = "2 to 5 dims (N, C and up to 3 spatial dims)"

_FORWARD = PlanCache()
_BACKWARD = PlanCache()
clear_plans = plans_clearer(_FORWARD, _BACKWARD)


def _merge(shape: tuple[int, ...], strides: tuple[int, ...],
           i: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Dims ``i`` and ``i + 1`` as one, when the strides allow it (else None)."""
    (a, b), (sa, sb) = shape[i:i + 2], strides[i:i + 2]
    if a != 1 and b != 1 and sa != b * sb:
        return None
    return (shape[:i] + (a * b,) + shape[i + 2:],
            strides[:i] + (sb if b != 1 else sa,) + strides[i + 2:])


def _fold4(shape: tuple[int, ...],
           strides: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """``(N, C, *spatial)`` as the 4-D ``(N, C, H, W)`` cuDNN's softmax takes: unit dims appended
    to 2-D and 3-D shapes, two adjacent spatial dims of a 5-D one merged (H and W, else D and H),
    or None when a 5-D layout allows neither."""
    if len(shape) < 4:
        pad = 4 - len(shape)
        return shape + (1,) * pad, strides + (1,) * pad
    if len(shape) == 4:
        return shape, strides
    return _merge(shape, strides, 3) or _merge(shape, strides, 2)


def _sample_packed(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether each sample's ``C*H*W`` values fill one gap-free block, the samples one after the
    other (what cuDNN's instance mode reads)."""
    dims = sorted(((st, n) for n, st in zip(shape, strides) if n != 1), reverse=True)
    expected = 1
    for st, n in reversed(dims):
        if st != expected:
            return False
        expected *= n
    return shape[0] == 1 or not dims or dims[0] == (strides[0], shape[0])


def _no_spatial(shape: tuple[int, ...]) -> bool:
    """Whether every spatial dim is 1: then channel mode and instance mode normalize the same
    values (each sample's C), and cuDNN's instance-mode kernels are the faster ones (H200, cuDNN
    9.19, 32x1000: backward 3.3 us against 42 us in channel mode, float32 forward 3.1 against
    4.2; docs/benchmarks.md)."""
    return all(d == 1 for d in shape[2:])


def _takes(shape: tuple[int, ...], strides: tuple[int, ...], instance: bool) -> bool:
    """Whether cuDNN's softmax reads (or writes) this layout correctly as it is."""
    return _fold4(shape, strides) is not None and (not instance or _sample_packed(shape, strides))


def _descriptor(shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any) -> TensorDescriptor:
    folded = _fold4(shape, strides)
    assert folded is not None  # the plan stages what does not fold
    return TensorDescriptor(folded[0], dtype, folded[1])


def _pad(strides: tuple[int, ...]) -> tuple[int, ...]:
    return strides + (1,) * (4 - len(strides))


def _staging(shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any,
             to_strides: tuple[int, ...] | None, to_dtype: Any) -> Staging | None:
    """The staging copy of an operand (its shape padded to 4-D, as the copies take it) into
    ``to_strides`` (padded), or None where it is not staged."""
    if to_strides is None:
        return None
    return staging(shape + (1,) * (4 - len(shape)), _pad(strides), dtype, to_strides, to_dtype)


def _compute(plan: _Plan, dtype: Any, function: str) -> Any:
    """The dtype cuDNN computes ``dtype`` in (float32 for float16 and bfloat16, staged through
    float32 copies), with the plan's scaling constants and bound C ``function``."""
    compute = FLOAT32 if dtype.name in HALF_DTYPES else dtype
    plan.wide = compute if compute != dtype else None
    plan.one, plan.zero = scalars_of(compute)
    plan.launch = c_function(function)
    return compute


class _Plan:
    __slots__ = ("algo", "mode", "x", "y", "shape", "strides", "nbytes", "dense", "stage",
                 "stage_x", "stage_y", "one", "zero", "launch", "keep", "wide", "copies")

    def __init__(self) -> None:
        self.algo = self.mode = 0
        self.x = self.y = 0
        self.shape: tuple[int, ...] = ()
        self.strides: tuple[int, ...] = ()  # the output's
        self.nbytes = 0  # a new output's
        self.one = self.zero = 0
        self.launch: Any = None
        # the layout (padded to 4-D) operands are staged into for cuDNN, when they are
        self.dense: tuple[int, ...] = ()
        self.stage = False  # backward: y, dy and dx staged into ``dense``
        self.stage_x: tuple[int, ...] | None = None  # forward: x staged into these strides
        self.stage_y: tuple[int, ...] | None = None  # forward: y computed in these, then copied
        self.keep: tuple[Any, ...] = ()
        #: float16/bfloat16 operands computed in float32 copies (the dtype staged in)
        self.wide: Any = None
        #: the staging copies of the operands, None where one is not staged (forward: x, y;
        #: backward: y, dy, dx), their descriptors made with the plan
        self.copies: tuple[Staging | None, ...] = ()


def _options(algorithm: Any, mode: Any, fn: str) -> tuple[int, int]:
    a = check_choice(algorithm, "algorithm", tuple(ALGORITHMS), fn)
    m = check_choice(mode, "mode", tuple(MODES), fn)
    return int(ALGORITHMS[a]), int(MODES[m])


# ---- forward --------------------------------------------------------------------------------------

def softmax_forward(x: TensorLike, *, algorithm: str = "accurate", mode: str = "channel",
                    out: TensorLike | None = None, stream: StreamLike | None = None) -> Tensor:
    """Softmax (or log-softmax) of ``x`` over its channels (cuDNN's ``cudnnSoftmaxForward``).

    Args:
        x: ``(N, C, *spatial)`` with 0 to 3 spatial dims, anything
            `pycudnn.as_tensor()` accepts, any strides; float32,
            float16, bfloat16 or float64.
        algorithm: ``"accurate"`` (the maximum subtracted first), ``"fast"`` (not: may overflow)
            or ``"log"`` (log-softmax).
        mode: ``"channel"``: over C for each sample and position (``F.softmax(x, dim=1)``);
            ``"instance"``: over C and all spatial dims for each sample.
        out: optional output of ``x``'s shape, dtype and device, any strides, sharing no memory
            with ``x``.
        stream: the CUDA stream to run on; default the legacy default stream.

    Returns:
        The result as a `pycudnn.Tensor` in ``x``'s memory format, or
            ``out``.
    """
    fn = "softmax_forward"
    s, s_ref = (0, None) if stream is None else stream_pair(stream)
    if type(x) is not Tensor:
        x = as_tensor(x, stream=stream)
    o = None if out is None else tensor_arg(out, stream)
    key = (algorithm, mode, x.shape, x.strides, x.dtype, x.device, signature(o))
    plan: _Plan = cached_plan(_FORWARD, key, forward_plan, x, algorithm, mode, o, fn)
    if o is not None:
        check_out_reads(o, (("x", x),), fn)
    if not plan.x:
        return result(o, plan, x, s, s_ref)
    prev, handle, y = prologue(o, plan.nbytes, plan.shape, plan.strides, x, s, s_ref)
    try:
        src, target = x, y
        copy_x, copy_y = plan.copies
        if copy_x is not None:
            src = copy_x.load(handle, x, s)
        if copy_y is not None:
            target = copy_y.scratch(y, s)
        status = plan.launch(handle, plan.algo, plan.mode, plan.one, plan.x, src.ptr, plan.zero,
                             plan.y, target.ptr)
        if status:
            raise_launch(status, "cudnnSoftmaxForward", fn, x=plan.keep[0], y=plan.keep[1])
        if copy_y is not None:
            copy_y.store(handle, target, y)
        return y
    finally:
        restore_device(prev)


def forward_plan(x: Tensor, algorithm: Any, mode: Any, o: Tensor | None, fn: str) -> _Plan:
    """The full checks of a forward call, then its plan (descriptors, output layout);
    nothing is launched. Public as a seam for tests and tooling: what a call would run, read
    without a device."""
    check_input(x, "x", fn, _RANKS, _WHAT)
    plan = _Plan()
    plan.algo, plan.mode = _options(algorithm, mode, fn)
    if o is not None:
        o = checked_out(o, x.shape, x, fn, None)
    plan.shape = x.shape
    plan.strides = layout_strides(x.shape, x) if o is None else o.strides
    plan.nbytes = x.size * x.dtype.itemsize
    if x.size == 0:
        return plan
    # float16/bfloat16 in float32 copies, rounded once into y, as PyTorch computes them: the
    # backward amplifies a y that differs from PyTorch's by one rounding step by |dy - sum(y*dy)|
    compute = _compute(plan, x.dtype, "cudnnSoftmaxForward")
    shape, instance = x.shape, plan.mode == SoftmaxMode.INSTANCE
    # the layouts cuDNN computes in: the operands' own where it takes them, else dense copies
    # (instance mode: x in y's layout, both sample-packed)
    ys = plan.strides
    if plan.wide is not None or not _takes(shape, ys, instance):
        ys = layout_strides(shape, x)
        plan.stage_y = _pad(ys)
    xs = x.strides
    if (plan.wide is not None or not _takes(shape, xs, instance)
            or (instance and not same_layout(shape, xs, ys))):
        xs = ys
        plan.stage_x = _pad(ys)
    if (plan.mode == SoftmaxMode.CHANNEL and _no_spatial(shape) and same_layout(shape, xs, ys)
            and _sample_packed(shape, xs)):
        plan.mode = SoftmaxMode.INSTANCE  # the same values, cuDNN's faster kernel (see _no_spatial)
    xd = _descriptor(shape, xs, compute)
    yd = xd if same_layout(shape, xs, ys) else _descriptor(shape, ys, compute)
    plan.x, plan.y = xd.handle, yd.handle
    plan.keep = (xd, yd)
    plan.copies = (_staging(shape, x.strides, x.dtype, plan.stage_x, plan.wide),
                   _staging(shape, plan.strides, x.dtype, plan.stage_y, plan.wide))
    return plan


# ---- backward -------------------------------------------------------------------------------------

def softmax_backward(y: TensorLike, dy: TensorLike, *, algorithm: str = "accurate",
                     mode: str = "channel", out: TensorLike | None = None,
                     stream: StreamLike | None = None) -> Tensor:
    """The gradient ``dx`` of a softmax from its output ``y`` and the gradient ``dy`` of ``y``
    (cuDNN's ``cudnnSoftmaxBackward``).

    Args:
        y: the forward output (``softmax_forward(x, algorithm=..., mode=...)``; with
            ``algorithm="log"`` the log-softmax).
        dy: the gradient with respect to ``y``: ``y``'s shape, dtype and device. Any strides:
            operands not dense in ``y``'s memory format are staged through dense copies.
        algorithm: the forward call's (``"log"`` differentiates the log-softmax; ``"fast"`` and
            ``"accurate"`` the softmax).
        mode: the forward call's.
        out: optional output of ``y``'s shape, dtype and device, any strides, sharing no memory
            with ``y`` or ``dy``.
        stream: the CUDA stream to run on; default the legacy default stream.

    Returns:
        ``dx`` as a `pycudnn.Tensor` in ``y``'s memory format, or ``out``.
    """
    fn = "softmax_backward"
    s, s_ref = (0, None) if stream is None else stream_pair(stream)
    y, dy = tensor_arg(y, stream), tensor_arg(dy, stream)
    o = None if out is None else tensor_arg(out, stream)
    key = (algorithm, mode, y.shape, y.strides, y.dtype, y.device, dy.shape, dy.strides, dy.dtype,
           dy.device, signature(o))
    plan: _Plan = cached_plan(_BACKWARD, key, backward_plan, y, dy, algorithm, mode, o, fn)
    if o is not None:
        check_out_reads(o, (("y", y), ("dy", dy)), fn)
    if not plan.x:
        return result(o, plan, y, s, s_ref)
    prev, handle, dx = prologue(o, plan.nbytes, plan.shape, plan.strides, y, s, s_ref)
    try:
        target = dx
        copy_y, copy_dy, copy_dx = plan.copies
        if copy_y is not None:
            y = copy_y.load(handle, y, s)
        if copy_dy is not None:
            dy = copy_dy.load(handle, dy, s)
        if copy_dx is not None:
            target = copy_dx.scratch(dx, s)
        d = plan.x
        status = plan.launch(handle, plan.algo, plan.mode, plan.one, d, y.ptr, d, dy.ptr,
                             plan.zero, d, target.ptr)
        if status:
            raise_launch(status, "cudnnSoftmaxBackward", fn, tensors=plan.keep[0])
        if copy_dx is not None:
            copy_dx.store(handle, target, dx)
        return dx
    finally:
        restore_device(prev)


def backward_plan(y: Tensor, dy: Tensor, algorithm: Any, mode: Any, o: Tensor | None,
                  fn: str) -> _Plan:
    """The full checks of a backward call, then its plan; nothing is launched. Public as a seam
    for tests and tooling."""
    check_input(y, "y", fn, _RANKS, _WHAT)
    check_operands(y, "y", ((dy, "dy"),), y.shape, "the shape of y", fn, _RANKS, _WHAT)
    plan = _Plan()
    plan.algo, plan.mode = _options(algorithm, mode, fn)
    if o is not None:
        o = checked_out(o, y.shape, y, fn, None)
    plan.shape = y.shape
    dense = layout_strides(y.shape, y)
    plan.dense = _pad(dense)
    plan.strides = dense if o is None else o.strides
    plan.nbytes = y.size * y.dtype.itemsize
    if y.size == 0:
        return plan
    # cuDNN's half backward loses accuracy in its sum of y * dy (measured: 3.3x float16's
    # rounding against float64 in instance mode over 5 elements); PyTorch sums in float32, and
    # so does this call, on float32 copies
    compute = _compute(plan, y.dtype, "cudnnSoftmaxBackward")
    # one dense layout for y, dy and dx, which always folds to 4-D and is sample-packed
    # (operands in another are staged through copies)
    plan.stage = plan.wide is not None or not all(
        same_layout(y.shape, st, dense) for st in (y.strides, dy.strides, plan.strides))
    if plan.mode == SoftmaxMode.CHANNEL and _no_spatial(y.shape):
        plan.mode = SoftmaxMode.INSTANCE  # ``dense`` is sample-packed; see _no_spatial
    d = _descriptor(y.shape, dense, compute)
    plan.x = plan.y = d.handle
    plan.keep = (d,)
    if plan.stage:
        st, wd = plan.dense, plan.wide
        plan.copies = tuple(_staging(y.shape, strides, y.dtype, st, wd)
                            for strides in (y.strides, dy.strides, plan.strides))
    else:
        plan.copies = (None, None, None)
    return plan
