"""One convolution call after validation (`ConvolutionCall`): its tensors in forward roles, the
memory format it runs in, staging through dense copies, batch pieces above 2^31 - 1 elements,
the search of each piece through `try_all()`, and the fused epilogue with its fallback; the
output it writes (`output`), the zero or dense bias a fused epilogue reads, and the
`PreparedConvolution` of a call that ran as one launch (`prepare_call`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Sequence

import numpy as np

from ..cudnn.tensor_ops import add_tensor, contiguous_bias, is_contiguous_bias, transform
from ..cudnn.tensor_ops import unsqueeze_1d as _unsqueeze
from ..engines.problem import DIRECTION, ConvolutionArgs, ConvolutionParams, EpilogueKind
from ..engines.registry import engine_for
from ..errors import CudnnError, NoAlgorithmError, OutOfMemoryError
from ..ffi import library as _lib
from ..runtime.handle import get_handle
from ..runtime.memory import resolve_stream
from ..runtime.memory.workspaces import shared_zeros
from ..runtime.tensor import (Tensor, as_tensor, check_writable, empty, has_internal_overlap,
                              spans_overlap, tensor_from_pointer, zeros)
from ..runtime.tensor.checks import check_out_reads
from ..search.iterate import try_all
from .arguments import INT_MAX, check_sample_size, suggest_memory_format
from .prepared import PreparedConvolution
from .repro import repro_lines

__all__ = ["ConvolutionCall", "output", "prepare_call", "contiguous_bias_for", "zero_bias"]

log = logging.getLogger("pycudnn")


def output(out: Any, shape: tuple[int, ...], like: Tensor, fmt: str, stream: int,
           reads: Sequence[tuple[str, Tensor | None]] = (), name: str = "out",
           in_place: Tensor | None = None, fn: str = "") -> Tensor:
    """The tensor to write: ``out`` checked (shape, dtype, device, no overlap with itself or with
    the tensors the call ``reads``), or a new one. ``in_place`` may be ``out`` itself exactly (the
    residual of convolution_add_relu), but not partly."""
    if out is None:
        return empty(shape, like.dtype, memory_format=fmt, device=like.device, stream=stream)
    out = as_tensor(out)
    check_writable(out, name)
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(out.shape)}")
    if out.dtype != like.dtype:
        raise TypeError(f"{name}: expected dtype {like.dtype.name}, got {out.dtype.name}")
    if out.device != like.device:
        raise ValueError(f"{name}: expected a tensor on cuda:{like.device}, got cuda:{out.device}")
    if out.size:
        if has_internal_overlap(out.shape, out.strides):
            raise ValueError(f"{name}: its elements overlap each other (strides {list(out.strides)}): "
                             f"more than one element of the written-to tensor refers to a single "
                             f"memory location; pass an output without overlapping elements")
        check_out_reads(out, reads, fn, in_place, name, in_place_name="z")
    return out


class ConvolutionCall:
    """One convolution call after validation: tensors in forward roles and the geometry.

    What the public functions build once their arguments are checked, and what the context of
    their errors is made from (`repro_lines()`): ``api`` (the
    function's name, e.g. ``"conv2d"``), ``direction``, the tensors ``x, w, y`` (the written one
    may be None until it is allocated), ``stride, padding, dilation, groups`` as validated,
    ``flags`` (resolved by ``pycudnn.config.resolve()``) and ``stream``; ``fmt`` is the memory
    format the call runs in. Nothing touches the GPU until it runs.
    """

    def __init__(self, api: str, direction: str, x: Tensor | None, w: Tensor | None,
                 y: Tensor | None, stride: tuple[int, ...], padding: tuple[int, ...],
                 dilation: tuple[int, ...], groups: int, flags: dict[str, Any], stream: Any,
                 epilogue: str = "", z: Tensor | None = None, bias: Tensor | None = None,
                 alpha: float = 1.0) -> None:

        self.api, self.direction = api, direction
        self.x, self.w, self.y = x, w, y
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.flags = flags
        self.stream = resolve_stream(stream)
        # The tensors given so far (the written one is attached after allocation): x and w for
        # forward, dy and w for backward data, x and dy for backward filter.
        given = [t for t in (x, w, y) if t is not None]
        self.device = given[0].device
        self._handle: int | None = None
        self.fmt = suggest_memory_format(*given)
        self.epilogue, self.z, self.bias, self.alpha = epilogue, z, bias, float(alpha)
        self.engine = engine_for(flags["engine"])
        # what ran, for the prepared fast path: one piece, nothing staged -> reusable as is
        self.staged = False
        self.pieces: list[tuple[ConvolutionParams, Any]] = []

    @property
    def handle(self) -> int:
        """This thread's cuDNN handle for the device, with the call's stream set (on first use,
        so that validation never needs a GPU)."""
        if self._handle is None:

            self._handle = get_handle(self.device, self.stream)
        return self._handle

    # -- layout helpers --
    def _dense(self, t: Tensor) -> bool:
        return t.is_contiguous(self.fmt)

    def _copy(self, src: Tensor, dst: Tensor) -> None:
        """dst <- src through cudnnTransformTensor (any strides, same shape and dtype)."""
        transform(self.handle, src, dst)

    def run(self) -> None:
        # the written tensor, None when the call was built, is attached before the call runs
        assert self.x is not None and self.w is not None and self.y is not None
        written = DIRECTION[self.direction].written
        roles = {"x": self.x, "w": self.w, "y": self.y}
        user_out = roles[written]
        staged: list[Tensor] = []
        for role in ("x", "w", "y"):
            t = roles[role]
            if self._dense(t):
                continue
            tmp = empty(t.shape, t.dtype, memory_format=self.fmt, device=t.device, stream=self.stream)
            staged.append(tmp)
            if role != written:
                self._copy(t, tmp)
            roles[role] = tmp
        z = self.z
        if z is not None and not self._dense(z):
            z = empty(z.shape, z.dtype, memory_format=self.fmt, device=z.device, stream=self.stream)
            staged.append(z)
            assert self.z is not None  # z was self.z until the line above
            self._copy(self.z, z)
        self.staged = self.staged or bool(staged)
        self._run_split(roles["x"], roles["w"], roles["y"], z)
        if roles[written] is not user_out:
            self._copy(roles[written], user_out)

    def _run_split(self, x: Tensor, w: Tensor, y: Tensor, z: Tensor | None) -> None:
        """split_batch_dim_to_32bit_out: pieces along N when a tensor exceeds 2^31 - 1 elements."""
        ni, no = x.size, y.size
        if ni <= INT_MAX and no <= INT_MAX:
            self._run_one(x, w, y, z)
            return
        n = x.shape[0]
        inner = max(ni, no) // n
        check_sample_size(self.api, x.shape, y.shape)  # done up front already; kept as a guard
        # The reference's heuristic: pieces of 256M (512M for backward filter) elements at most.
        budget = (1 << 29) if self.direction == "backward_filter" else (1 << 28)
        split = max(budget // inner, 1)
        log.debug("%s: splitting the batch of %d into pieces of %d (tensors above 2^31-1 elements)",
                  self.api, n, split)
        if self.direction == "backward_filter":
            self._run_filter_split(x, w, y, split)
            return
        for start in range(0, n, split):
            length = min(split, n - start)
            self._run_one(x.narrow(0, start, length), w, y.narrow(0, start, length),
                          z.narrow(0, start, length) if z is not None else None)

    def _run_filter_split(self, x: Tensor, w: Tensor, dy: Tensor, split: int) -> None:
        """Backward filter over batch pieces, summed in float32 for half and bfloat16, cast once."""

        n = x.shape[0]
        acc_dtype = np.dtype("float32") if w.dtype.name in ("float16", "bfloat16") else w.dtype
        acc = zeros(w.shape, acc_dtype, memory_format=self.fmt, device=w.device, stream=self.stream)
        piece = empty(w.shape, w.dtype, memory_format=self.fmt, device=w.device, stream=self.stream)
        piece_acc = (empty(w.shape, acc_dtype, memory_format=self.fmt, device=w.device, stream=self.stream)
                     if acc_dtype != w.dtype else None)
        for start in range(0, n, split):
            length = min(split, n - start)
            self._run_one(x.narrow(0, start, length), piece, dy.narrow(0, start, length), None)
            if piece_acc is not None:  # cudnnAddTensor wants one dtype: widen the piece first
                transform(self.handle, piece, piece_acc)
            add_tensor(self.handle, piece_acc if piece_acc is not None else piece, acc, beta=1.0)
        transform(self.handle, acc, w)  # cast back once

    def params_for(self, x: Tensor, w: Tensor, y: Tensor, z: Tensor | None) -> ConvolutionParams:
        """The `ConvolutionParams` (the cache key of
        the search) of this call run on ``x, w, y`` (and the residual ``z``): the whole tensors or
        one batch piece of them; a 1-D convolution is described as a 2-D one of unit height."""
        f = self.flags
        x4, w4, y4 = _unsqueeze(x), _unsqueeze(w), _unsqueeze(y)
        stride, padding, dilation = self.stride, self.padding, self.dilation
        if x.ndim == 3:
            stride, padding, dilation = (1,) + stride, (0,) + padding, (1,) + dilation
        return ConvolutionParams(
            direction=self.direction, device=self.device, cudnn_version=_lib.version(),
            dtype=x.dtype.name, input_shape=x4.shape, input_strides=x4.strides,
            weight_shape=w4.shape, weight_format="NHWC" if self.fmt == "channels_last" else "NCHW",
            output_shape=y4.shape, output_strides=y4.strides, padding=padding, stride=stride,
            dilation=dilation, groups=self.groups, deterministic=f["deterministic"],
            allow_tf32=f["allow_tf32"], workspace_limit=f["workspace_limit"], engine=f["engine"],
            epilogue=self.epilogue,
            z_strides=_unsqueeze(z).strides if z is not None else None,
            alpha=self.alpha if self.epilogue == EpilogueKind.ADD_RELU else 1.0,
            alignments=self._alignments(x, w, y, z) if f["engine"] == "graph" else (),
            # only a graph-engine measurement can be cut short by it
            benchmark_limit=(f.get("benchmark_limit") if f["benchmark"] and f["engine"] == "graph"
                             else None))

    def _alignments(self, x: Tensor, w: Tensor, y: Tensor, z: Tensor | None) -> tuple[int, ...]:
        ptrs = [x.ptr, w.ptr, y.ptr]
        if z is not None:
            ptrs.append(z.ptr)
        if self.bias is not None:
            ptrs.append(self.bias.ptr)
        return tuple(16 if p == 0 else min(16, p & -p) for p in ptrs)

    def run_fused(self) -> bool:
        """Run with the fused epilogue; False (and remembered) when no engine takes it."""
        # the written tensor, None when the call was built, is attached before the call runs
        assert self.x is not None and self.w is not None and self.y is not None
        key = (self.params_for(self.x, self.w, self.y, self.z), self.api)
        if key in _UNFUSABLE:
            return False
        try:
            self.run()
            return True
        except NoAlgorithmError as exc:
            log.info("%s: no engine takes the fused %s graph (%s); running separate operations "
                     "from now on for these parameters", self.api, self.epilogue,
                     str(exc).split("\n", 1)[0])
            with _UNFUSABLE_LOCK:
                _UNFUSABLE.add(key)
                if len(_UNFUSABLE) > 4096:
                    _UNFUSABLE.pop()
            return False

    def _run_one(self, x: Tensor, w: Tensor, y: Tensor, z: Tensor | None) -> None:
        params = self.params_for(x, w, y, z)
        roles = {"x": x, "w": w, "y": y}
        written = roles.pop(DIRECTION[self.direction].written)
        reads = list(roles.values()) + ([z] if z is not None else [])
        args = ConvolutionArgs(
            params=params, handle=self.handle, stream=self.stream, x=x.ptr, w=w.ptr, y=y.ptr,
            benchmark=self.flags["benchmark"], z=z.ptr if z is not None else 0,
            bias=self.bias.ptr if self.bias is not None else 0,
            out_may_hold_data=any(spans_overlap(written, t) for t in reads),
            tuning_db=self.flags.get("tuning_db", True))
        try:
            record = try_all(args, self.engine)
        except (CudnnError, NoAlgorithmError, OutOfMemoryError) as exc:
            raise exc.add_context(*self._context(params)) from None
        self.pieces.append((params, record))
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: %s -> %s", self.api, params.short(), record.describe())

    def _context(self, params: ConvolutionParams) -> list[str]:

        return repro_lines(self, params)


#: fused (params, api) that no engine took: later calls go straight to separate operations
_UNFUSABLE: set = set()
_UNFUSABLE_LOCK = threading.Lock()


def prepare_call(call: "ConvolutionCall") -> "PreparedConvolution | None":
    """A PreparedConvolution for what ``call`` just ran, when it can be replayed as is: one piece
    (no batch split), nothing staged through copies, and no separate epilogue step."""
    if len(call.pieces) != 1 or call.staged:
        return None
    params, record = call.pieces[0]
    assert call.x is not None and call.w is not None and call.y is not None  # all attached once it ran
    shapes = {"x": call.x.shape, "w": call.w.shape, "y": call.y.shape}
    strides = {"x": call.x.strides, "w": call.w.strides, "y": call.y.strides}
    if call.z is not None:
        shapes["z"], strides["z"] = call.z.shape, call.z.strides
    if call.bias is not None:
        shapes["b"], strides["b"] = call.bias.shape, call.bias.strides
    written = {"x": call.x, "w": call.w, "y": call.y}[DIRECTION[call.direction].written]
    return PreparedConvolution(
        params, record, call.engine, call.x.dtype if call.x is not None else call.y.dtype,
        shapes, strides, None, has_bias=call.bias is not None, has_z=call.z is not None,
        out_size_bytes=written.span_bytes)


def contiguous_bias_for(b: Tensor, stream: int, call: "ConvolutionCall") -> Tensor:
    """`contiguous_bias()` for a call: a copy it makes
    marks the call as staged (not replayable by a prepared convolution)."""
    if is_contiguous_bias(b):
        return b
    call.staged = True
    return contiguous_bias(b, stream, call.handle)


def zero_bias(call: "ConvolutionCall", k: int, like: Tensor) -> Tensor:
    """A zero bias of ``k`` elements for a fused epilogue called without one.

    A view of the device's shared zeros (`pycudnn.runtime.memory.workspaces.shared_zeros()`): complete before
    any launch reads it and never freed, so a remembered call may replay it on any stream. While
    the stream is being captured and those are not made yet: zeros made for this call on its
    stream, and the call is not replayable."""

    ptr = shared_zeros(k * like.dtype.itemsize, like.device, call.stream)
    if ptr is None:
        call.staged = True
        return zeros((k,), like.dtype, device=like.device, stream=call.stream)
    return tensor_from_pointer(ptr, (k,), like.dtype, device=like.device)
