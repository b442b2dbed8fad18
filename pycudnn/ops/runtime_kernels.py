"""cuDNN's runtime-compiled pointwise kernels (graph API) for the operations, built in the
background once a call signature repeats.

The graph API's runtime-fusion engine runs an activation or a batch-norm inference as one
compiled kernel, faster than cuDNN's legacy kernels, but a plan takes a fraction of a second to
build (cuDNN compiles it with NVRTC). So a signature first runs on the legacy kernel; at its
``after_calls``-th call its plan is built on a worker thread (its own cuDNN handle), and later
calls launch the compiled kernel once it is ready. A one-off call never pays for a build, and a
build that fails (an engine that does not take the layout) leaves the signature on the legacy
kernel for good. Only dense tensors of at least ``min_bytes`` (`MIN_BYTES`) in one shared
layout, at 16-byte-aligned addresses (checked per call), in float32/float16/bfloat16 get a plan.
Settings: `configure()`; `wait()` blocks until the builds asked for are done; `stats()` counts
plans by state. A build runs in CUDA's relaxed capture mode, so the module it loads cannot
invalidate a CUDA-graph capture in global mode (PyTorch's default), another thread's or, for an
inline build, the caller's own.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from typing import Any, Callable, Sequence

import numpy as np

from ..cudnn.graph import (ExecutionPlan, OperationGraph, PointwiseStep, TensorSpec,
                           build_pointwise_graph, engine_configs, filter_candidates, first_plan)
from ..ffi.backend import PointwiseMode
from ..runtime.handle import get_handle
from ..runtime.memory import relaxed_capture_mode
from ..runtime.tensor import Tensor, has_internal_overlap
from ._common import same_layout
from .activation_modes import NAMES, SCALARS, Activation, row

__all__ = ["configure", "wait", "stats", "Promotion", "activation_promotion", "activation_steps",
           "activation_graph", "compiled_plan", "GRAPH_DTYPES",
           "batch_norm_inference_promotion", "flat_layout", "dense", "ALIGNMENT", "MIN_BYTES"]

_log = logging.getLogger("pycudnn")

#: the byte alignment the graphs declare for every tensor; a call whose addresses are not
#: aligned so runs the legacy kernel
ALIGNMENT = 16
#: smaller inputs stay on the legacy kernels: both kernels take a few microseconds there and
#: a launch costs the same host time (5.0 against 5.2 us measured), so a build (0.2-0.9 s of a
#: CPU core) would buy nothing
MIN_BYTES = 1 << 20
_DTYPES = frozenset({np.dtype(np.float32), np.dtype(np.float16)})  # bfloat16 added below
try:
    import ml_dtypes

    _DTYPES = _DTYPES | {np.dtype(ml_dtypes.bfloat16)}
except ImportError:  # pragma: no cover - ml_dtypes is a dependency
    pass
#: the data types the compiled pointwise kernels take
GRAPH_DTYPES = _DTYPES


class _Settings:
    __slots__ = ("enabled", "after_calls", "background", "min_bytes")

    def __init__(self) -> None:
        self.enabled = True
        self.after_calls = 3
        self.background = True
        self.min_bytes = MIN_BYTES


#: background builds queued at most; a signature that asks while the queue is full stays on
#: the legacy kernel and asks again at its next call
MAX_QUEUED_BUILDS = 32

_settings = _Settings()
_executor: concurrent.futures.ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()
_pending: set[concurrent.futures.Future[None]] = set()
_counts = {"ready": 0, "failed": 0, "building": 0}
_counts_lock = threading.Lock()


def configure(*, enabled: bool | None = None, after_calls: int | None = None,
              background: bool | None = None, min_bytes: int | None = None) -> None:
    """Change when the operations switch to runtime-compiled kernels.

    Args:
        enabled: False keeps every call on cuDNN's legacy kernels (signatures already switched
            stay switched; new ones do not build).
        after_calls: the call of a signature (1 = its first) at which its graph plan is built;
            default 3.
        background: True (default) builds on a worker thread while calls keep running on the
            legacy kernel; False builds inside the call that asks for it (that call waits).
        min_bytes: the smallest input, in bytes, whose signature gets a compiled kernel; default
            `MIN_BYTES`. Applies to signatures seen after the change.
    """
    for name, flag in (("enabled", enabled), ("background", background)):
        if flag is not None and not isinstance(flag, bool):
            raise TypeError(f"configure: {name} must be a bool, but got {flag!r}")
    for name, count, least in (("after_calls", after_calls, 1), ("min_bytes", min_bytes, 0)):
        if count is not None and (isinstance(count, bool) or not isinstance(count, int)
                                  or count < least):
            raise ValueError(f"configure: {name} must be an int >= {least}, but got {count!r}")
    if enabled is not None:
        _settings.enabled = enabled
    if after_calls is not None:
        _settings.after_calls = after_calls
    if background is not None:
        _settings.background = background
    if min_bytes is not None:
        _settings.min_bytes = min_bytes


def wait(timeout: float | None = None) -> bool:
    """Block until every build asked for so far is done; False if ``timeout`` seconds passed
    first."""
    with _counts_lock:
        futures = list(_pending)
    if not futures:
        return True
    _, not_done = concurrent.futures.wait(futures, timeout=timeout)
    return not not_done


def stats() -> dict[str, int]:
    """How many signatures have a compiled kernel (``ready``), could not get one (``failed``) or
    are being built (``building``)."""
    with _counts_lock:
        return dict(_counts)


def _count(state: str, delta: int) -> None:
    with _counts_lock:
        _counts[state] += delta


def kernel_worker() -> concurrent.futures.ThreadPoolExecutor:
    """The one thread that compiles runtime kernels in the background, started on first
    use. Public as a seam for tests and tooling: a test keeps it busy to see what a call does
    meanwhile."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="pycudnn-runtime-kernels")
        return _executor


class Promotion:
    """One call signature's way from the legacy kernel to a compiled one.

    The call path reads ``plan``: None while the signature runs on the legacy kernel (it then
    calls `tick()`), else the finalized `ExecutionPlan` to launch (no workspace; an activation
    backward plan takes ``(dy, x, dx)``, or ``(dy, y, dx)`` where ``reads_output``). ``build``
    makes the graph on a handle of the signature's device; the plan is the first heuristic
    candidate that finalizes without needing a workspace.
    """

    __slots__ = ("plan", "calls", "requested", "device", "description", "_build", "error",
                 "reads_output", "retired")

    def __init__(self, device: int, description: str, build: Callable[[int], OperationGraph],
                 reads_output: bool = False) -> None:
        self.plan: ExecutionPlan | None = None
        self.calls = 0
        self.requested = False  # the build was asked for (it runs once per signature)
        self.device = device
        self.description = description
        self._build = build
        self.error = ""
        #: an activation backward plan that reads the forward output ``y`` where the others
        #: read the input ``x``
        self.reads_output = reads_output
        #: the signature's plan left its plan cache: no build, no launch (see `retire`)
        self.retired = False

    def retire(self) -> None:
        """The signature's plan was evicted from its plan cache: a build not yet started is
        skipped, a compiled plan is let go (counted out of ``ready``). A thread that read the
        plan just before keeps its reference until its launch returns; the plan is closed when
        the last reference goes."""
        with _counts_lock:
            if self.retired:
                return
            self.retired = True
            self.requested = True  # never asks again
        if self.plan is not None:
            self.plan = None
            _count("ready", -1)

    def tick(self) -> None:
        """Count a legacy launch; the ``after_calls``-th (or the first after settings that make
        the count enough) asks for the build, once."""
        self.calls += 1
        if self.requested or self.calls < _settings.after_calls or not _settings.enabled:
            return
        with _counts_lock:  # one request, whichever threads tick at once
            if self.requested:
                return
            if _settings.background and len(_pending) >= MAX_QUEUED_BUILDS:
                return  # the queue is full: a later call of the signature asks again
            self.requested = True
        _count("building", 1)
        if _settings.background:
            future = kernel_worker().submit(self._make)
            with _counts_lock:
                _pending.add(future)
            future.add_done_callback(_forget)
        else:
            self._make()

    def launch(self, handle: int, pointers: tuple[int, ...]) -> bool:
        """Launch the compiled plan; False (and back to the legacy kernel for good) if cuDNN
        refuses it."""
        plan = self.plan
        if plan is None:
            return False
        try:
            plan.execute(handle, pointers, 0)
        except Exception as exc:
            self.failed(exc)
            return False
        return True

    def failed(self, exc: BaseException) -> None:
        """A launch of the compiled plan failed: the signature goes back to the legacy kernel."""
        if self.plan is None:  # another thread's launch failed first
            return
        self.plan = None  # requested stays True: never asks again
        self.error = f"{type(exc).__name__}: {exc}"
        _count("ready", -1)
        _count("failed", 1)
        _log.warning("runtime-compiled kernel for %s failed at launch, back to the legacy "
                     "kernel: %s", self.description, self.error)

    def _make(self) -> None:
        # a build queues no GPU work, but finalizing loads a module: in relaxed capture mode
        # that cannot invalidate a CUDA-graph capture, another thread's or (an inline build)
        # this thread's own
        with relaxed_capture_mode():
            self._build_plan()

    def _build_plan(self) -> None:
        if self.retired:  # evicted while queued: nobody would launch it
            _count("building", -1)
            return
        try:
            handle = get_handle(self.device)
            plan = compiled_plan(handle, self._build(handle))
            with _counts_lock:
                if self.retired:  # evicted while it was built
                    retired = True
                else:
                    retired = False
                    self.plan = plan
                    _counts["ready"] += 1
            if retired:
                plan.close()
                return
            _log.debug("runtime-compiled kernel ready for %s: %s", self.description, plan.tag)
        except Exception as exc:  # the signature stays on the legacy kernel
            self.error = f"{type(exc).__name__}: {exc}"
            _count("failed", 1)
            _log.info("no runtime-compiled kernel for %s (legacy kernel kept): %s",
                      self.description, self.error)
        finally:
            _count("building", -1)


def compiled_plan(handle: int, graph: OperationGraph) -> ExecutionPlan:
    """The first heuristic candidate of a pointwise ``graph`` that finalizes and needs no
    workspace (RuntimeError if it needs one; NoAlgorithmError if none finalizes)."""
    candidates = engine_configs(handle, graph, ("A",))
    kept, _ = filter_candidates(candidates, np.float32, True, False)
    plan, _ = first_plan(handle, kept, max_attempts=2)
    if plan.workspace_size:
        plan.close()
        raise RuntimeError(f"the plan needs a workspace ({plan.workspace_size} B)")
    return plan


def _forget(future: concurrent.futures.Future[None]) -> None:
    with _counts_lock:
        _pending.discard(future)


# ---- layouts ------------------------------------------------------------------------------------

def dense(t: Tensor) -> bool:
    """Whether ``t``'s elements fill its span without gaps or overlap (a permutation of a
    contiguous layout)."""
    return t.span_bytes == t.nbytes and not has_internal_overlap(t.shape, t.strides)


def flat_layout(n: int, itemsize: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """``n`` elements of ``itemsize`` bytes as one dense channels-last 4-D block ``(1, C, H, W)``
    with H, W > 1 and C a power of two from 2 to 256, 128 bytes of C where ``n`` allows (the
    runtime-fusion engine takes channels-last tensors only, which these strides say
    unambiguously; measured on the H200, C of 128 bytes ran ReLU forward and backward at
    PyTorch's speed, 8 bytes at half of it, 512 bytes 5-15% slower); None when ``n`` has no such
    shape."""
    best = max(2, min(256, 128 // itemsize))
    sizes = [best >> k for k in range(8) if best >> k >= 2]
    sizes += [best << k for k in range(1, 8) if best << k <= 256]
    for c in sizes:
        if n % c:
            continue
        rows = n // c
        h = int(rows ** 0.5)
        while h > 1 and rows % h:
            h -= 1
        if h > 1 and rows // h > 1:
            w = rows // h
            return (1, c, h, w), (c * h * w, 1, c * w, c)
    return None


def _spec(uid: int, layout: tuple[tuple[int, ...], tuple[int, ...]], dtype: Any,
          virtual: bool = False) -> TensorSpec:
    return TensorSpec(uid, layout[0], layout[1], dtype if not virtual else np.float32,
                      virtual=virtual, alignment=ALIGNMENT)


# ---- activations --------------------------------------------------------------------------------

def activation_steps(act: Activation, coef: float, backward: bool
                     ) -> tuple[list[PointwiseStep], tuple[str, ...], tuple[str, ...]]:
    """The pointwise steps of mode ``act``'s forward or backward graph: ``(steps, the real
    tensors in the order `ExecutionPlan.execute()` takes their pointers, the virtual ones)``;
    the host scalars the steps read (`SCALARS`) are neither.

    Forward reads ``x`` and writes ``y``; backward reads ``(dy, x)`` (``(dy, y)`` for a mode
    with ``from_output`` steps) and writes ``dx``, by PyTorch's formula where the row has
    ``pytorch_backward`` steps.
    """
    params = tuple((attr, coef) for attr in act.params) + act.fixed
    if not backward:
        assert act.forward is not None
        return [PointwiseStep(act.forward, x="x", y="y", params=params)], ("x", "y"), ()
    real: tuple[str, ...] = ("dy", "x", "dx")
    if act.pytorch_backward:
        steps = list(act.pytorch_backward)
    elif act.from_output:
        steps = list(act.from_output)
        real = ("dy", "y", "dx")
    else:
        assert act.backward is not None
        steps = [PointwiseStep(act.backward, x="x", dy="dy", dx="dx", params=params)]
    names: list[str] = []
    for st in steps:
        for n in (st.x, st.b, st.dy, st.y, st.dx):
            if n and n not in real and n not in names and n not in SCALARS:
                names.append(n)
    return steps, real, tuple(names)


def activation_graph(act: Activation, coef: float, layout: tuple[tuple[int, ...], tuple[int, ...]],
                     dtype: Any, backward: bool, description: str
                     ) -> Callable[[int], OperationGraph]:
    """A function of a handle that builds mode ``act``'s graph on tensors of ``layout`` (all
    operands alike; intermediates and host scalars float32)."""
    steps, real, virtual = activation_steps(act, coef, backward)
    tensors = {name: _spec(uid, layout, dtype) for uid, name in enumerate(real, 1)}
    tensors.update({name: _spec(uid, layout, dtype, True)
                    for uid, name in enumerate(virtual, 10)})
    read = {n for st in steps for n in (st.x, st.b)}
    values = {name: value(coef) for name, value in SCALARS.items() if name in read}
    ones = (1,) * len(layout[0])
    tensors.update({name: TensorSpec(uid, ones, ones, np.float32, by_value=True)
                    for uid, name in enumerate(values, 10 + len(virtual))})

    def build(handle: int) -> OperationGraph:
        return build_pointwise_graph(handle, tensors, steps, description, values=values)

    return build


def activation_promotion(mode: str, coef: float, x: Tensor, strides: Sequence[tuple[int, ...]],
                         backward: bool, propagate_nan: bool) -> Promotion | None:
    """The promotion of an activation signature, or None when the graph cannot take it.

    ``x`` is the input; ``strides`` are those of every other operand the compiled kernel reads
    or writes (``y`` forward; ``dy``, ``dx`` and, for sigmoid and tanh, ``y`` backward), which
    must address the elements as ``x``'s do, ``x`` being dense.
    """
    if not propagate_nan or mode not in NAMES:
        return None
    act = row(mode)
    if act.legacy is None or act.forward is None:
        return None  # graph-only modes run their graph from the first call (activation.py)
    if backward and act.pytorch_backward:
        return None  # runs its graph from the first call where PyTorch's values are asked for
    if backward and not act.compiles_backward(coef):
        # a signature keeps one convention at the kinks and edges: where the compiled kernel's
        # values there are not the legacy kernel's, it stays on the legacy kernel
        return None
    if (x.dtype not in _DTYPES or x.size == 0 or x.nbytes < _settings.min_bytes
            or not dense(x)):
        return None
    if not all(same_layout(x.shape, st, x.strides) for st in strides):
        return None
    layout = flat_layout(x.size, x.dtype.itemsize)
    if layout is None:
        return None
    direction = "backward" if backward else "forward"
    description = f"{mode} {direction} of {x.size} {x.dtype.name} elements"
    build = activation_graph(act, coef, layout, x.dtype, backward, description)
    return Promotion(x.device, description, build, backward and bool(act.from_output))


# ---- batch-norm inference -----------------------------------------------------------------------

def batch_norm_inference_promotion(x: Tensor, param_dtype: Any, eps: float) -> Promotion | None:
    """The promotion of a spatial batch-norm inference signature: ``y = (x - mean) *
    rsqrt(var + eps) * weight + bias`` as one compiled kernel, for a dense channels-last 4-D
    ``x`` (the output in its layout) and float32 parameters of shape ``(C,)``."""
    if (x.ndim != 4 or x.dtype not in _DTYPES or x.size == 0
            or x.nbytes < _settings.min_bytes or np.dtype(param_dtype) !=
            np.float32 or not x.is_contiguous("channels_last") or x.shape[2] * x.shape[3] == 1):
        return None  # (1x1 spatial: the strides would not say channels-last to cuDNN)
    n, c, h, w = x.shape
    xl = (x.shape, (c * h * w, 1, w * c, c))
    vec = ((1, c, 1, 1), (c, 1, c, c))
    dtype = x.dtype
    description = f"batch-norm inference of {list(x.shape)} {dtype.name} channels-last"

    def build(handle: int) -> OperationGraph:
        tensors = {
            "x": _spec(1, xl, dtype), "mean": _spec(2, vec, np.float32),
            "var": _spec(3, vec, np.float32), "weight": _spec(4, vec, np.float32),
            "bias": _spec(5, vec, np.float32), "y": _spec(6, xl, dtype),
            "eps": TensorSpec(7, (1, 1, 1, 1), (1, 1, 1, 1), np.float32, by_value=True),
            "centered": _spec(10, xl, dtype, virtual=True),
            "var_eps": _spec(11, vec, dtype, virtual=True),
            "invstd": _spec(12, vec, dtype, virtual=True),
            "normalized": _spec(13, xl, dtype, virtual=True),
            "scaled": _spec(14, xl, dtype, virtual=True),
        }
        steps = [PointwiseStep(PointwiseMode.SUB, x="x", b="mean", y="centered"),
                 PointwiseStep(PointwiseMode.ADD, x="var", b="eps", y="var_eps"),
                 PointwiseStep(PointwiseMode.RSQRT, x="var_eps", y="invstd"),
                 PointwiseStep(PointwiseMode.MUL, x="centered", b="invstd", y="normalized"),
                 PointwiseStep(PointwiseMode.MUL, x="normalized", b="weight", y="scaled"),
                 PointwiseStep(PointwiseMode.ADD, x="scaled", b="bias", y="y")]
        return build_pointwise_graph(handle, tensors, steps, description, values={"eps": eps})

    return Promotion(x.device, description, build)
