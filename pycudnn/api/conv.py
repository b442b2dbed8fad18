"""The public convolution functions.

Each function validates its arguments in Python (PyTorch's wording), chooses the memory format
the way ``cudnn_conv_suggest_memory_format`` does, turns 1-D convolutions into 2-D ones with a
unit height, splits the batch when a tensor exceeds 2^31 - 1 elements, and hands one
`ConvolutionArgs` per piece to the engine through
`try_all()`. How the search is done is not this module's business.

Nothing is launched before every argument has been checked, so bad input leaves the caller's
buffers untouched.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from ..configuration import ConvolutionFlags, config, override_token
from ..cudnn.tensor_ops import (add_bias, add_tensor, contiguous_bias, is_contiguous_bias, relu_,
                                transform)
from ..cudnn.tensor_ops import fill_zero as _fill_zero
from ..cudnn.tensor_ops import unsqueeze_1d as _unsqueeze
from . import prepared as _prepared
from ..runtime.tensor.checks import check_bias as _check_bias
from ..runtime.tensor.checks import check_out_reads as _check_out_reads
from ..runtime.tensor.checks import check_pair as _check_pair
from ..runtime.tensor.checks import check_z as _check_z
from ..engines.registry import engine_for
from .prepared import PreparedConvolution
from ..errors import CudnnError, NoAlgorithmError, OutOfMemoryError
from ..ffi import library as _lib
from ..runtime.memory import devices as _devices
from ..runtime.handle import get_handle
from ..runtime.memory import StreamLike, callers_device, resolve_stream, restore_device
from ..runtime.memory.workspaces import shared_zeros
from ..runtime.tensor import (Tensor, TensorLike, as_tensor, check_writable, empty,
                              has_internal_overlap, spans_overlap, tensor_from_pointer, zeros)
from ..search.iterate import try_all
from ..engines.problem import DIRECTION, ConvolutionArgs, ConvolutionParams, EpilogueKind
from .repro import repro_lines

if sys.version_info >= (3, 11):  # at run time too: typing.get_type_hints() resolves the flags
    from typing import Unpack
elif TYPE_CHECKING:  # Python 3.10: for type checkers only (annotations are strings at run time)
    from typing_extensions import Unpack

__all__ = ["convolution", "conv_transpose", "convolution_backward_data",
           "convolution_backward_filter", "convolution_add_relu", "prepare_convolution",
           "output_size", "suggest_memory_format"]

log = logging.getLogger("pycudnn")

INT_MAX = 2**31 - 1
_CONV_NAMES = {3: "conv1d", 4: "conv2d", 5: "conv3d"}


# ---- validation helpers ---------------------------------------------------------------------------

def _spatial(name: str, value: Any, nd: int, minimum: int, what: str) -> tuple[int, ...]:
    """An int or one int per spatial dim, each >= minimum; PyTorch-style errors otherwise."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        values = (int(value),) * nd
    elif isinstance(value, (tuple, list)):
        if len(value) != nd or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in value):
            raise ValueError(
                f"expected {name} to be a single integer value or a list of {nd} values to match "
                f"the convolution dimensions, but got {name}={list(value)}")
        values = tuple(int(v) for v in value)
    else:
        raise TypeError(f"{name}: expected an int or a tuple of {nd} ints, got {type(value).__name__} {value!r}")
    if any(v < minimum for v in values):
        raise ValueError(f"{what}, but got {name}={list(values)}")
    if any(v > INT_MAX for v in values):
        raise ValueError(f"{name}: expected every value to be at most {INT_MAX} (cuDNN takes C "
                         f"ints), but got {name}={list(values)}")
    return values


def _geometry(stride: Any, padding: Any, dilation: Any,
              nd: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    return (_spatial("stride", stride, nd, 1, "non-positive stride is not supported"),
            _spatial("padding", padding, nd, 0, "negative padding is not supported"),
            _spatial("dilation", dilation, nd, 1, "dilation should be greater than zero"))


def _groups(groups: Any) -> int:
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)):
        raise TypeError(f"groups: expected a positive int, got {groups!r}")
    if groups < 1:
        raise ValueError(f"non-positive groups is not supported, but got groups={int(groups)}")
    if groups > INT_MAX:
        raise ValueError(f"groups: expected at most {INT_MAX} (cuDNN takes a C int), but got "
                         f"groups={int(groups)}")
    return int(groups)


def _check_sample_size(fn: str, *shapes: Sequence[int]) -> None:
    """cuDNN indexes within one sample with 32 bits: refuse a sample above 2^31 - 1 elements before
    anything is allocated (larger batches are split into pieces; a larger sample cannot be)."""
    if any(0 in tuple(shape) for shape in shapes):
        return  # nothing runs
    inner = max(math.prod(shape[1:]) for shape in shapes)
    if inner > INT_MAX:
        raise ValueError(
            f"{fn}: one sample holds {inner} elements ({' and '.join(str(list(sh[1:])) for sh in shapes)}), "
            f"more than cuDNN's 32-bit indexing allows (2^31 - 1); split the channels or spatial dims yourself")


def _check_rank(t: Tensor, name: str, fn: str) -> int:
    if t.ndim not in (3, 4, 5):
        raise ValueError(f"{fn}: expected {name} to have 3, 4 or 5 dims (batch, channels and 1 to 3 "
                         f"spatial dims), but got {name} of size {list(t.shape)}")
    return t.ndim - 2


def output_size(input_size: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
                padding: Sequence[int], dilation: Sequence[int]) -> tuple[int, ...]:
    """Spatial output sizes of a convolution: ``(i + 2p - d*(k-1) - 1) // s + 1``."""
    return tuple((i + 2 * p - d * (k - 1) - 1) // s + 1
                 for i, k, s, p, d in zip(input_size, kernel, stride, padding, dilation))


def _check_output_positive(x_shape: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
                           padding: Sequence[int], dilation: Sequence[int], fn: str) -> tuple[int, ...]:
    spatial = output_size(x_shape[2:], kernel, stride, padding, dilation)
    if any(o < 1 for o in spatial):
        padded = " x ".join(str(i + 2 * p) for i, p in zip(x_shape[2:], padding))
        eff = " x ".join(str(d * (k - 1) + 1) for k, d in zip(kernel, dilation))
        raise ValueError(f"{fn}: calculated padded input size per channel: ({padded}). Kernel size "
                         f"(dilated): ({eff}). Kernel size can't be greater than actual input size "
                         f"(output size would be {list(spatial)})")
    return spatial


def _check_grad_y(fn: str, grad_y: Tensor, x_shape: Sequence[int], w_shape: Sequence[int],
                  stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
                  x_name: str, w_name: str) -> None:
    """A backward pass's grad_y must have the forward output's shape."""
    expected = (x_shape[0], w_shape[0]) + _check_output_positive(x_shape, w_shape[2:], stride,
                                                                 padding, dilation, fn)
    if tuple(grad_y.shape) != expected:
        raise ValueError(f"{fn}: expected grad_y of size {list(expected)} for {x_name} "
                         f"{list(x_shape)} and {w_name} {list(w_shape)}, but got {list(grad_y.shape)}")


def _check_channels(x_shape: Sequence[int], w_shape: Sequence[int], groups: int, fn: str,
                    x_name: str = "input", w_name: str = "weight") -> None:
    if w_shape[0] % groups != 0:
        raise ValueError(f"{fn}: expected {w_name} of size {list(w_shape)} to have a first dim "
                         f"(output channels) divisible by groups={groups}, but got {w_shape[0]}")
    if x_shape[1] != w_shape[1] * groups:
        raise ValueError(f"{fn}: given groups={groups}, {w_name} of size {list(w_shape)}, expected "
                         f"{x_name}{list(x_shape)} to have {w_shape[1] * groups} channels, but got "
                         f"{x_shape[1]} channels instead")
    if any(k < 1 for k in w_shape):
        raise ValueError(f"{fn}: expected {w_name} to have positive sizes, got {list(w_shape)}")


def suggest_memory_format(*tensors: Tensor) -> str:
    """``cudnn_conv_suggest_memory_format``: channels_last when input or weight is channels_last,
    except for float64, which cuDNN runs only in NCHW (PyTorch disables NHWC for double too)."""
    if tensors[0].ndim in (4, 5) and tensors[0].dtype.name != "float64":
        for t in tensors:
            if t.memory_format == "channels_last":
                return "channels_last"
    return "contiguous"


def _output(out: Any, shape: tuple[int, ...], like: Tensor, fmt: str, stream: int,
            reads: Sequence[tuple[str, Tensor | None]] = (), name: str = "out",
            in_place: Tensor | None = None) -> Tensor:
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
        _check_out_reads(out, reads, name, in_place)
    return out


def _flags(given: Mapping[str, Any]) -> dict[str, Any]:
    return config.resolve(given)


# Every call signature ends with the flags part of Config.token(), spelt out in the key (one
# tuple and one call less per call): ``config.generation, _override_get(), tuple(flags.items())
# if flags else None``. Keyword order is kept as given: one call site always passes the same
# order, and another order is only another (equally valid) entry.
_override_get = override_token.get  # bound once: read on every call


def _stream_pair(stream: Any) -> tuple[int, Any]:
    """(handle, the stream object to keep alive until frees ordered on it, or None)."""
    if stream is None:
        return 0, None
    if type(stream) is int:
        return stream, None
    return resolve_stream(stream), stream


# ---- the runner -----------------------------------------------------------------------------------

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
        _check_sample_size(self.api, x.shape, y.shape)  # done up front already; kept as a guard
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


# ---- the one call path ----------------------------------------------------------------------------
# Every public function is: convert its tensors, build the call signature (its key), replay the
# remembered prepared convolution when the signature matches (the hot path), else run its full
# path (validation, search, launch) and remember what that prepared. The steps are shared here;
# each function declares only its signature, its full path and how to call it again.

Again = Callable[[Tensor, Tensor, Any, Any, Any, Any], Tensor]


def _sig(t: Tensor | None) -> tuple[Any, ...] | None:
    """What a call signature holds of an optional tensor (layout, dtype, device)."""
    return None if t is None else (t.shape, t.strides, t.dtype, t.device)


def _replay(key: tuple[Any, ...], a: Tensor, b: Tensor, out: Any, stream: Any,
            z: Tensor | None = None, bias: Tensor | None = None) -> "tuple[Tensor, PreparedConvolution] | None":
    """The remembered call for ``key`` launched on these tensors, or None (take the full path):
    no convolution is remembered for the signature, or ``out`` needs the full path's checks."""
    # the hot path of every remembered call: the lookup, the stream and the out test are inlined
    try:
        prepared = _fast_get(key)
    except TypeError:  # an unhashable argument (a list for stride, ...): take the full path
        return None
    if prepared is None:
        return None
    if out is not None:
        lean = None
        if out.__class__ is prepared._torch_out_class and z is None and bias is None:
            # a torch out= of the layout accepted before: its own lean test (no as_tensor)
            lean = prepared._lean_torch_out(out)
            if lean is not None and prepared.out_may_overlap(lean, a, b):
                return None  # the full path refuses it with its message
        if lean is not None:
            out = lean
        else:
            out = prepared.matching_out(out, a, b, bias, z, stream)
            if out is False:
                return None
    if stream is None:
        s, stream_ref = 0, None
    elif type(stream) is int:
        s, stream_ref = stream, None
    else:
        s, stream_ref = resolve_stream(stream), stream
    # the key matched a, b, z and bias: launch without re-checking them
    return prepared._run(a, b, out, z, bias, s, stream_ref), prepared


_fast_get = _prepared.lookup_remembered


def _remember(key: tuple[Any, ...], prepared: "PreparedConvolution | None", again: Again) -> None:
    """Keep ``prepared`` for ``key``; a launch of it that fails forgets it and calls ``again``
    (the public function with the same arguments: the full path, with its fallbacks)."""
    if prepared is None:
        return

    def fallback(a: Tensor, b: Tensor, out: Any, z: Any = None, bias: Any = None,
                 stream: Any = None) -> Tensor:
        _prepared.forget(key)  # never this entry again: the full path re-prepares
        return again(a, b, out, z, bias, stream)

    prepared.fallback = fallback
    _prepared.remember(key, prepared)


class PrepareKeywords(ConvolutionFlags, total=False):
    """The keyword arguments of `prepare_convolution()`: those of the function its
    ``direction`` names, and that function's flags."""

    stride: int | Sequence[int]
    padding: int | Sequence[int] | str
    dilation: int | Sequence[int]
    groups: int
    activation: str | None
    out: TensorLike | None
    stream: StreamLike | None
    input_shape: Sequence[int]
    weight_shape: Sequence[int]


# ---- public API -----------------------------------------------------------------------------------

def convolution(x: TensorLike, w: TensorLike, bias: TensorLike | None = None, *,
                stride: int | Sequence[int] = 1, padding: int | Sequence[int] | str = 0,
                dilation: int | Sequence[int] = 1, groups: int = 1, activation: str | None = None,
                out: TensorLike | None = None, stream: StreamLike | None = None,
                **flags: Unpack[ConvolutionFlags]) -> Tensor:
    """Convolution (cross-correlation, as PyTorch's ``conv1d/2d/3d``) on device memory.

    Args:
        x: input ``(N, C, *spatial)``, anything `pycudnn.as_tensor()`
            accepts (1 to 3 spatial dims).
        w: weight ``(K, C/groups, *kernel)``.
        bias: optional ``(K,)``, added to the output.
        stride: the step between output positions: an int or one int per spatial dim.
        padding: zeros added on both sides of each spatial dim: an int or one int per spatial
            dim; or PyTorch's ``"valid"`` (none) or ``"same"`` (stride 1: the output has the
            input's size; an odd total ``dilation * (kernel - 1)`` puts the extra zero after
            the input, on a padded copy, as PyTorch does).
        dilation: the spacing between kernel elements: an int or one int per spatial dim.
        groups: number of channel groups.
        activation: ``None`` or ``"relu"`` (applied after the bias). The graph engine fuses
            bias and activation into the convolution when an engine takes the graph.
        out: optional output tensor of the right shape, dtype and device (any strides).
        stream: the CUDA stream to run on, anything `StreamLike` names (an int handle, a
            cuda.core, PyTorch or CuPy stream, an object with ``__cuda_stream__``); default the
            legacy default stream.
        **flags: `ConvolutionFlags`: ``benchmark``, ``deterministic``, ``allow_tf32``,
            ``workspace_limit``, ``engine``, ``benchmark_limit``, ``tuning_db``; defaults from
            `pycudnn.config`.

    Returns:
        The output ``(N, K, *out_spatial)`` as a `pycudnn.Tensor`,
            ``out`` itself when it is given.
    """
    return _forward(x, w, bias, stride, padding, dilation, groups, activation, out, stream, flags)[0]


def _forward(x: Any, w: Any, bias: Any, stride: Any, padding: Any, dilation: Any, groups: Any,
             activation: Any, out: Any, stream: Any,
             flags: Mapping[str, Any]) -> "tuple[Tensor, PreparedConvolution | None]":
    """`convolution()`, returning what it prepared too."""
    # the caller's current device, given back at the end (one device: nothing to give back)
    prev = None if _devices.visible_devices == 1 else callers_device()
    try:
        if type(x) is not Tensor:
            x = as_tensor(x, stream=stream)
        if type(w) is not Tensor:
            w = as_tensor(w, stream=stream)
        if bias is not None and type(bias) is not Tensor:
            bias = as_tensor(bias, stream=stream)
        # the flags part spelt out as the note above _override_get says
        key = ("forward", x.shape, x.strides, x.dtype, x.device, w.shape, w.strides, w.dtype,
               w.device, None if bias is None else (bias.shape, bias.strides, bias.dtype, bias.device),
               stride, padding, dilation, groups, activation,
               config.generation, _override_get(), tuple(flags.items()) if flags else None)
        hit = _replay(key, x, w, out, stream, bias=bias)
        if hit is not None:
            return hit
        y, prepared = _convolution(x, w, bias, stride, padding, dilation, groups, activation, out,
                                   stream, flags)
        _remember(key, prepared, lambda a, b, o, z, bias_, s: convolution(
            a, b, bias_, stride=stride, padding=padding, dilation=dilation, groups=groups,
            activation=activation, out=o, stream=s, **flags))
        return y, prepared
    finally:
        if prev is not None:
            restore_device(prev)


def _convolution(x: Tensor, w: Tensor, bias: Tensor | None, stride: Any, padding: Any, dilation: Any,
                 groups: Any, activation: Any, out: Any, stream: Any,
                 flags: Mapping[str, Any],
                 reads_also: Tensor | None = None) -> "tuple[Tensor, PreparedConvolution | None]":
    """The full path of `convolution()`: (output, what it prepared)."""
    fn = _CONV_NAMES.get(x.ndim, "convolution")
    nd = _check_rank(x, "input", fn)
    _check_pair(x, "input", w, "weight")
    extra: tuple[int, ...] = ()
    if isinstance(padding, str):
        stride_t, _, dilation_t = _geometry(stride, 0, dilation, nd)
        padding_t, extra = _string_padding(padding, stride_t, dilation_t, w.shape[2:], fn)
    else:
        stride_t, padding_t, dilation_t = _geometry(stride, padding, dilation, nd)
    groups = _groups(groups)
    _check_channels(x.shape, w.shape, groups, fn)
    if any(extra):
        # an odd total: PyTorch pads the input's far side with one zero, then pads symmetrically.
        # Everything is checked before the padded copy is made
        padded = x.shape[:2] + tuple(i + e for i, e in zip(x.shape[2:], extra))
        spatial = _check_output_positive(padded, w.shape[2:], stride_t, padding_t, dilation_t, fn)
        b = _check_bias(bias, w.shape[0], x) if bias is not None else None
        _activation(activation)
        _flags(flags)
        fmt = suggest_memory_format(x, w)
        if out is not None:
            _output(out, (x.shape[0], w.shape[0]) + spatial, x, fmt, 0,
                    reads=(("input", x), ("weight", w), ("bias", b)))
        x_given = x
        x = _padded_input(x, extra, fmt, resolve_stream(stream))
        y, _ = _convolution(x, w, bias, stride_t, padding_t, dilation_t, groups, activation,
                            out, stream, flags, reads_also=x_given)
        return y, None  # a padded copy each call: not replayable as one launch
    spatial = _check_output_positive(x.shape, w.shape[2:], stride_t, padding_t, dilation_t, fn)
    b = _check_bias(bias, w.shape[0], x) if bias is not None else None
    relu = _activation(activation)
    f = _flags(flags)
    _check_sample_size(fn, x.shape, (x.shape[0], w.shape[0]) + spatial)
    call = ConvolutionCall(fn, "forward", x, w, None, stride_t, padding_t, dilation_t, groups, f, stream)
    y = _output(out, (x.shape[0], w.shape[0]) + spatial, x, call.fmt, call.stream,
                reads=(("input", x if reads_also is None else reads_also), ("weight", w),
                       ("bias", b)))
    call.y = y
    y, fused_all = _forward_with_epilogue(call, y, b, relu)
    return y, (_prepare(call) if fused_all else None)


def _prepare(call: "ConvolutionCall") -> "PreparedConvolution | None":
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
    return _prepared.PreparedConvolution(
        params, record, call.engine, call.x.dtype if call.x is not None else call.y.dtype,
        shapes, strides, None, has_bias=call.bias is not None, has_z=call.z is not None,
        out_size_bytes=written.span_bytes)


def _contiguous_bias(b: Tensor, stream: int, call: "ConvolutionCall") -> Tensor:
    """`contiguous_bias()` for a call: a copy it makes
    marks the call as staged (not replayable by a prepared convolution)."""
    if is_contiguous_bias(b):
        return b
    call.staged = True
    return contiguous_bias(b, stream, call.handle)


def _zero_bias(call: "ConvolutionCall", k: int, like: Tensor) -> Tensor:
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


def _activation(activation: Any) -> bool:
    if activation is None:
        return False
    if activation == "relu":
        return True
    raise ValueError(f"activation: expected None or 'relu', got {activation!r}")


def _forward_with_epilogue(call: ConvolutionCall, y: Tensor, b: Tensor | None, relu: bool) -> tuple[Tensor, bool]:
    """conv (+ bias) (+ relu) into y: one fused graph where the engine takes it, else steps.

    Returns y and whether everything ran in the convolution itself (no separate step)."""
    assert call.x is not None  # forward: the input is given
    if call.x.size == 0 or y.size == 0:
        _fill_zero(y, call.stream)
        if b is not None and y.size:
            add_bias(call.handle, y, b)
        if relu and y.size:
            relu_(call.handle, y)
        return y, False
    if (b is not None or relu) and call.engine.supports(EpilogueKind.BIAS_RELU if relu else EpilogueKind.BIAS):
        b_fused = _zero_bias(call, y.shape[1], y) if b is None else _contiguous_bias(b, call.stream, call)
        call.epilogue, call.bias = ("bias_relu" if relu else "bias"), b_fused
        if call.run_fused():
            return y, b is not None  # a made-up zero bias cannot be replayed by a prepared call
        call.epilogue, call.bias = "", None
        call.pieces.clear()
    call.run()
    if b is not None:
        add_bias(call.handle, y, b)
    if relu:
        relu_(call.handle, y)
    return y, b is None and not relu


def conv_transpose(x: TensorLike, w: TensorLike, bias: TensorLike | None = None, *,
                   stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
                   output_padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1,
                   groups: int = 1, activation: str | None = None, out: TensorLike | None = None,
                   stream: StreamLike | None = None, **flags: Unpack[ConvolutionFlags]) -> Tensor:
    """Transposed convolution (PyTorch's ``conv_transpose1d/2d/3d``): the gradient of a
    convolution with respect to its input.

    ``w`` is ``(C, K/groups, *kernel)``; the output is ``(N, K, *o)`` with
    ``o = (i - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1``.
    ``output_padding`` must be smaller than the stride or the dilation (PyTorch's rule); one
    at least the stride, which cuDNN has no output size for, is computed without padding and
    cropped (a temporary of the unpadded size; such a call is not replayed as one launch).
    """
    return _transposed(x, w, bias, stride, padding, output_padding, dilation, groups, activation,
                       out, stream, flags)[0]


def _transposed(x: Any, w: Any, bias: Any, stride: Any, padding: Any, output_padding: Any,
                dilation: Any, groups: Any, activation: Any, out: Any, stream: Any,
                flags: Mapping[str, Any]) -> "tuple[Tensor, PreparedConvolution | None]":
    """`conv_transpose()`, returning what it prepared too."""
    # the caller's current device, given back at the end (one device: nothing to give back)
    prev = None if _devices.visible_devices == 1 else callers_device()
    try:
        if type(x) is not Tensor:
            x = as_tensor(x, stream=stream)
        if type(w) is not Tensor:
            w = as_tensor(w, stream=stream)
        if bias is not None and type(bias) is not Tensor:
            bias = as_tensor(bias, stream=stream)
        key = ("conv_transpose", x.shape, x.strides, x.dtype, x.device, w.shape, w.strides, w.dtype,
               w.device, _sig(bias), stride, padding, output_padding, dilation, groups, activation,
               config.generation, _override_get(), tuple(flags.items()) if flags else None)
        hit = _replay(key, x, w, out, stream)
        if hit is not None:
            return hit
        fn = {3: "conv_transpose1d", 4: "conv_transpose2d", 5: "conv_transpose3d"}.get(x.ndim, "conv_transpose")
        nd = _check_rank(x, "input", fn)
        _check_pair(x, "input", w, "weight")
        stride_t, padding_t, dilation_t = _geometry(stride, padding, dilation, nd)
        output_padding_t = _spatial("output_padding", output_padding, nd, 0, "negative output_padding is not supported")
        for op, s, d in zip(output_padding_t, stride_t, dilation_t):
            if op >= s and op >= d:
                raise ValueError(f"{fn}: output padding must be smaller than either stride or dilation, "
                                 f"but got output_padding={list(output_padding_t)}, stride={list(stride_t)}, "
                                 f"dilation={list(dilation_t)}")
        # output_padding >= stride (but < dilation, as PyTorch allows): cuDNN's backward data has
        # no such output size; the call computes the unpadded transposed convolution and crops
        crop = any(op >= s for op, s in zip(output_padding_t, stride_t))
        groups_i = _groups(groups)
        if any(k < 1 for k in w.shape):
            raise ValueError(f"{fn}: expected weight of size {list(w.shape)} to have positive sizes "
                             f"(input channels, output channels per group, kernel)")
        if w.shape[0] != x.shape[1]:
            raise ValueError(f"{fn}: given weight of size {list(w.shape)}, expected input{list(x.shape)} to "
                             f"have {w.shape[0]} channels, but got {x.shape[1]} channels instead")
        if w.shape[0] % groups_i:
            raise ValueError(f"{fn}: expected weight of size {list(w.shape)} to have a first dim "
                             f"divisible by groups={groups_i}")
        k_out = w.shape[1] * groups_i
        spatial = tuple((i - 1) * s - 2 * p + d * (k - 1) + op + 1
                        for i, k, s, p, d, op in zip(x.shape[2:], w.shape[2:], stride_t, padding_t, dilation_t,
                                                       output_padding_t))
        if any(o < 1 for o in spatial):
            raise ValueError(f"{fn}: calculated output size {list(spatial)} is too small")
        b = _check_bias(bias, k_out, x) if bias is not None else None
        relu = _activation(activation)
        reads = (("input", x), ("weight", w), ("bias", b))
        if crop:
            y = _cropped_transpose(fn, x, w, (x.shape[0], k_out) + spatial, stride_t, padding_t,
                                   dilation_t, groups_i, out, stream, flags, reads)
            call = None
        else:
            y, call = _backward_data(fn, x, w, (x.shape[0], k_out) + spatial, stride_t, padding_t,
                                     dilation_t, groups_i, out, stream, flags, reads=reads)
        if (b is not None or relu) and y.size:
            handle = get_handle(y.device, resolve_stream(stream))
            if b is not None:
                add_bias(handle, y, b)
            if relu:
                relu_(handle, y)
            return y, None  # separate epilogue steps: not replayable as one launch
        prepared = _prepare(call) if call is not None else None
        _remember(key, prepared, lambda a, b_, o, z, bias_, s: conv_transpose(
            a, b_, bias_, stride=stride, padding=padding, output_padding=output_padding,
            dilation=dilation, groups=groups, activation=activation, out=o, stream=s, **flags))
        return y, prepared
    finally:
        if prev is not None:
            restore_device(prev)


def _window(t: Tensor, starts: Sequence[int], sizes: Sequence[int]) -> Tensor:
    """The view of ``t`` whose spatial dims start at ``starts`` with ``sizes`` (N and C whole)."""
    offset = sum(st * t.strides[2 + i] for i, st in enumerate(starts))
    return tensor_from_pointer(t.ptr + offset * t.dtype.itemsize, t.shape[:2] + tuple(sizes),
                               t.dtype, strides=t.strides, device=t.device, owner=t)


def _cropped_transpose(fn: str, x: Tensor, w: Tensor, shape: tuple[int, ...],
                       stride: tuple[int, ...], padding: tuple[int, ...],
                       dilation: tuple[int, ...], groups: int, out: Any, stream: Any,
                       flags: Mapping[str, Any], reads: Sequence[tuple[str, Tensor | None]]) -> Tensor:
    """A transposed convolution whose output_padding is at least its stride (PyTorch allows it
    below the dilation): the transposed convolution without padding, ``(i - 1) * stride +
    dilation * (kernel - 1) + 1`` per dim (a size cuDNN's backward data takes), cropped from
    ``padding`` on; the output positions past it receive no input element and are zero."""
    nd = len(stride)
    full = tuple((i - 1) * s + d * (k - 1) + 1
                 for i, k, s, d in zip(x.shape[2:], w.shape[2:], stride, dilation))
    tmp, _ = _backward_data(fn, x, w, shape[:2] + full, stride, (0,) * nd, dilation, groups,
                            None, stream, flags, reads=reads)
    s = resolve_stream(stream)
    y = _output(out, shape, x, suggest_memory_format(x, w), s, reads=reads)
    if y.size == 0:
        return y
    handle = get_handle(y.device, s)
    kept = tuple(min(o, f - p) for o, f, p in zip(shape[2:], full, padding))
    if kept != shape[2:]:
        _fill_zero(y, s, handle)
    transform(handle, _window(tmp, padding, kept), _window(y, (0,) * nd, kept))
    return y


def _string_padding(padding: Any, stride: tuple[int, ...], dilation: tuple[int, ...],
                    kernel: Sequence[int], fn: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """PyTorch's ``padding='valid'`` / ``'same'``: (padding on both sides, the extra zero on
    the far side of the dims whose total padding ``dilation * (kernel - 1)`` is odd)."""
    nd = len(stride)
    if padding == "valid":
        return (0,) * nd, (0,) * nd
    if padding != "same":
        raise ValueError(f"{fn}: Invalid padding string '{padding}', should be one of "
                         f"['valid', 'same']")
    if any(s != 1 for s in stride):
        raise ValueError(f"{fn}: padding='same' is not supported for strided convolutions, but "
                         f"got stride={list(stride)}")
    totals = [d * (k - 1) for d, k in zip(dilation, kernel)]
    return tuple(t // 2 for t in totals), tuple(t % 2 for t in totals)


def _padded_input(x: Tensor, extra: tuple[int, ...], fmt: str, stream: int) -> Tensor:
    """``x`` with ``extra`` zeros after the last element of each spatial dim (PyTorch pads the
    input explicitly so for an odd 'same' padding), a new tensor in ``fmt``."""
    shape = x.shape[:2] + tuple(i + e for i, e in zip(x.shape[2:], extra))
    xp = zeros(shape, x.dtype, memory_format=fmt, device=x.device, stream=stream)
    if x.size:
        transform(get_handle(x.device, stream), x, _window(xp, (0,) * len(extra), x.shape[2:]))
    return xp


def convolution_backward_data(grad_y: TensorLike, w: TensorLike, input_shape: Sequence[int], *,
                              stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
                              dilation: int | Sequence[int] = 1, groups: int = 1,
                              out: TensorLike | None = None, stream: StreamLike | None = None,
                              **flags: Unpack[ConvolutionFlags]) -> Tensor:
    """Gradient of a convolution with respect to its input, of shape ``input_shape``."""
    return _backward_data_call(grad_y, w, input_shape, stride, padding, dilation, groups, out,
                               stream, flags)[0]


def _backward_data_call(grad_y: Any, w: Any, input_shape: Any, stride: Any, padding: Any,
                        dilation: Any, groups: Any, out: Any, stream: Any,
                        flags: Mapping[str, Any]) -> "tuple[Tensor, PreparedConvolution | None]":
    """`convolution_backward_data()`, returning what
    it prepared too."""
    # the caller's current device, given back at the end (one device: nothing to give back)
    prev = None if _devices.visible_devices == 1 else callers_device()
    try:
        if type(grad_y) is not Tensor:
            grad_y = as_tensor(grad_y, stream=stream)
        if type(w) is not Tensor:
            w = as_tensor(w, stream=stream)
        key = ("backward_data", grad_y.shape, grad_y.strides, grad_y.dtype, grad_y.device, w.shape,
               w.strides, w.dtype, w.device, _hashable(input_shape), stride, padding, dilation, groups,
               config.generation, _override_get(), tuple(flags.items()) if flags else None)
        hit = _replay(key, grad_y, w, out, stream)
        if hit is not None:
            return hit
        fn = "convolution_backward_data"
        nd = _check_rank(grad_y, "grad_y", fn)
        _check_pair(grad_y, "grad_y", w, "weight")
        stride_t, padding_t, dilation_t = _geometry(stride, padding, dilation, nd)
        groups_i = _groups(groups)
        input_shape_t = _shape_arg("input_shape", input_shape, grad_y.ndim)
        _check_channels(input_shape_t, w.shape, groups_i, fn)
        _check_grad_y(fn, grad_y, input_shape_t, w.shape, stride_t, padding_t, dilation_t,
                      "input_shape", "weight")
        dx, call = _backward_data(fn, grad_y, w, input_shape_t, stride_t, padding_t, dilation_t,
                                  groups_i, out, stream, flags)
        prepared = _prepare(call) if call is not None else None
        _remember(key, prepared, lambda a, b, o, z, bias, s: convolution_backward_data(
            a, b, input_shape, stride=stride, padding=padding, dilation=dilation, groups=groups,
            out=o, stream=s, **flags))
        return dx, prepared
    finally:
        if prev is not None:
            restore_device(prev)


def _hashable(shape: Any) -> Any:
    return tuple(shape) if isinstance(shape, list) else shape


def _backward_data(fn: str, dy: Tensor, w: Tensor, input_shape: Sequence[int],
                   stride: tuple[int, ...], padding: tuple[int, ...], dilation: tuple[int, ...],
                   groups: int, out: Any, stream: Any, flags: Mapping[str, Any],
                   reads: Sequence[tuple[str, Tensor | None]] | None = None) -> tuple[Tensor, "ConvolutionCall | None"]:
    f = _flags(flags)
    _check_sample_size(fn, dy.shape, tuple(input_shape))
    call = ConvolutionCall(fn, "backward_data", None, w, dy, stride, padding, dilation, groups, f, stream)
    dx = _output(out, tuple(input_shape), dy, call.fmt, call.stream,
                 reads=reads if reads is not None else (("grad_y", dy), ("weight", w)))
    call.x = dx
    if dx.size == 0:
        return dx, None
    if dy.size == 0:
        _fill_zero(dx, call.stream)
        return dx, None
    call.run()
    return dx, call


def convolution_backward_filter(x: TensorLike, grad_y: TensorLike, weight_shape: Sequence[int], *,
                                stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
                                dilation: int | Sequence[int] = 1, groups: int = 1,
                                out: TensorLike | None = None, stream: StreamLike | None = None,
                                **flags: Unpack[ConvolutionFlags]) -> Tensor:
    """Gradient of a convolution with respect to its weight, of shape ``weight_shape``."""
    return _backward_filter_call(x, grad_y, weight_shape, stride, padding, dilation, groups, out,
                                 stream, flags)[0]


def _backward_filter_call(x: Any, grad_y: Any, weight_shape: Any, stride: Any,
                          padding: Any, dilation: Any, groups: Any, out: Any, stream: Any,
                          flags: Mapping[str, Any]) -> "tuple[Tensor, PreparedConvolution | None]":
    """`convolution_backward_filter()`, returning
    what it prepared too."""
    # the caller's current device, given back at the end (one device: nothing to give back)
    prev = None if _devices.visible_devices == 1 else callers_device()
    try:
        if type(x) is not Tensor:
            x = as_tensor(x, stream=stream)
        if type(grad_y) is not Tensor:
            grad_y = as_tensor(grad_y, stream=stream)
        key = ("backward_filter", x.shape, x.strides, x.dtype, x.device, grad_y.shape, grad_y.strides,
               grad_y.dtype, grad_y.device, _hashable(weight_shape), stride, padding, dilation, groups,
               config.generation, _override_get(), tuple(flags.items()) if flags else None)
        hit = _replay(key, x, grad_y, out, stream)
        if hit is not None:
            return hit
        fn = "convolution_backward_filter"
        nd = _check_rank(x, "input", fn)
        _check_pair(x, "input", grad_y, "grad_y")
        stride_t, padding_t, dilation_t = _geometry(stride, padding, dilation, nd)
        groups_i = _groups(groups)
        weight_shape_t = _shape_arg("weight_shape", weight_shape, x.ndim)
        _check_channels(x.shape, weight_shape_t, groups_i, fn)
        _check_grad_y(fn, grad_y, x.shape, weight_shape_t, stride_t, padding_t, dilation_t,
                      "input", "weight_shape")
        f = _flags(flags)
        _check_sample_size(fn, x.shape, grad_y.shape)
        call = ConvolutionCall(fn, "backward_filter", x, None, grad_y, stride_t, padding_t, dilation_t, groups_i, f, stream)
        dw = _output(out, weight_shape_t, x, call.fmt, call.stream,
                     reads=(("input", x), ("grad_y", grad_y)))
        call.w = dw
        if x.size == 0 or grad_y.size == 0:
            _fill_zero(dw, call.stream)  # an empty batch contributes nothing to the gradient
            return dw, None
        call.run()
        prepared = _prepare(call)
        _remember(key, prepared, lambda a, b, o, z, bias, s: convolution_backward_filter(
            a, b, weight_shape, stride=stride, padding=padding, dilation=dilation, groups=groups,
            out=o, stream=s, **flags))
        return dw, prepared
    finally:
        if prev is not None:
            restore_device(prev)


def convolution_add_relu(x: TensorLike, w: TensorLike, z: TensorLike, *, alpha: float = 1.0,
                         bias: TensorLike | None = None, stride: int | Sequence[int] = 1,
                         padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1,
                         groups: int = 1, out: TensorLike | None = None,
                         stream: StreamLike | None = None,
                         **flags: Unpack[ConvolutionFlags]) -> Tensor:
    """``relu(conv(x, w) + alpha * z + bias)``, fused where cuDNN can, else in separate steps.

    ``z`` has the output's shape; ``out`` may be ``z`` itself (an in-place residual).
    """
    return _add_relu(x, w, z, alpha, bias, stride, padding, dilation, groups, out, stream, flags)[0]


def _add_relu(x: Any, w: Any, z: Any, alpha: Any, bias: Any, stride: Any, padding: Any,
              dilation: Any, groups: Any, out: Any, stream: Any,
              flags: Mapping[str, Any]) -> "tuple[Tensor, PreparedConvolution | None]":
    """`convolution_add_relu()`, returning what it
    prepared too."""
    # the caller's current device, given back at the end (one device: nothing to give back)
    prev = None if _devices.visible_devices == 1 else callers_device()
    try:
        if type(x) is not Tensor:
            x = as_tensor(x, stream=stream)
        if type(w) is not Tensor:
            w = as_tensor(w, stream=stream)
        if type(z) is not Tensor:
            z = as_tensor(z, stream=stream)
        if bias is not None and type(bias) is not Tensor:
            bias = as_tensor(bias, stream=stream)
        key = ("add_relu", x.shape, x.strides, x.dtype, x.device, w.shape, w.strides, w.dtype,
               w.device, _sig(z), _sig(bias), alpha, stride, padding, dilation, groups,
               config.generation, _override_get(), tuple(flags.items()) if flags else None)
        hit = _replay(key, x, w, out, stream, z=z, bias=bias)
        if hit is not None:
            return hit
        fn = "convolution_add_relu"
        nd = _check_rank(x, "input", fn)
        _check_pair(x, "input", w, "weight")
        _check_pair(x, "input", z, "z")
        stride_t, padding_t, dilation_t = _geometry(stride, padding, dilation, nd)
        groups_i = _groups(groups)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating, np.integer)):
            raise TypeError(f"alpha: expected a real number, got {alpha!r}")
        _check_channels(x.shape, w.shape, groups_i, fn)
        spatial = _check_output_positive(x.shape, w.shape[2:], stride_t, padding_t, dilation_t, fn)
        shape = (x.shape[0], w.shape[0]) + spatial
        z = _check_z(z, shape, x, fn)
        b = _check_bias(bias, w.shape[0], x) if bias is not None else None
        f = _flags(flags)
        _check_sample_size(fn, x.shape, shape)
        call = ConvolutionCall(fn, "forward", x, w, None, stride_t, padding_t, dilation_t, groups_i, f, stream,
                               epilogue="add_relu", z=z, alpha=float(alpha))
        y = _output(out, shape, x, call.fmt, call.stream,
                    reads=(("input", x), ("weight", w), ("bias", b)), in_place=z)
        if y.size == 0:
            return y, None
        if x.size == 0:
            _fill_zero(y, call.stream)
            _epilogue_steps(call.handle, y, z, float(alpha), b)
            return y, None
        b_full = _zero_bias(call, w.shape[0], x) if b is None else _contiguous_bias(b, call.stream, call)
        call.y, call.bias = y, b_full
        if call.run_fused():
            prepared = _prepare(call)
            if prepared is not None and b is None:
                # the shared zeros (complete, never freed): replays on any stream may read them
                prepared.default_bias = b_full
            _remember(key, prepared, lambda a, b_, o, z_, bias_, s: convolution_add_relu(
                a, b_, z_, alpha=float(alpha), bias=bias_, stride=stride, padding=padding,
                dilation=dilation, groups=groups, out=o, stream=s, **flags))
            return y, prepared
        # Fallback (the reference's raw_cudnn_convolution_add_relu_fallback_out): conv, then add, relu.
        target = y if not spans_overlap(y, z) else empty(shape, x.dtype, memory_format=call.fmt,
                                                     device=x.device, stream=call.stream)
        convolution(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups, out=target,
                    stream=call.stream, **flags)
        _epilogue_steps(call.handle, target, z, float(alpha), b)
        if target is not y:
            transform(call.handle, target, y)
        return y, None
    finally:
        if prev is not None:
            restore_device(prev)


def prepare_convolution(x: TensorLike, w: TensorLike, bias: TensorLike | None = None, *,
                        direction: str = "forward",
                        **kwargs: Unpack[PrepareKeywords]) -> PreparedConvolution:
    """Run a convolution once (searching and caching its algorithm) and return it prepared.

    ``direction="forward"`` takes ``(x, w)`` like
    `pycudnn.convolution()` (``bias`` and ``activation`` allowed);
    ``"backward_data"`` takes ``(grad_y, w)`` and ``input_shape=``; ``"backward_filter"`` takes
    ``(x, grad_y)`` and ``weight_shape=``. Other keyword arguments (stride, padding, dilation,
    groups, out, stream, flags) are those of the matching function.

    Example::

        conv = pycudnn.prepare_convolution(x, w, stride=1, padding=1)
        for batch in batches:
            conv(batch, w, out=y)
    """
    k = dict(kwargs)
    stride, padding = k.pop("stride", 1), k.pop("padding", 0)
    dilation, groups = k.pop("dilation", 1), k.pop("groups", 1)
    if direction == "forward":
        activation, out, stream = k.pop("activation", None), k.pop("out", None), k.pop("stream", None)
        _, prepared = _forward(x, w, bias, stride, padding, dilation, groups, activation, out,
                               stream, k)
    elif direction in ("backward_data", "backward_filter"):
        if bias is not None:
            raise ValueError("prepare_convolution: bias applies to direction='forward' only")
        shape_name = "input_shape" if direction == "backward_data" else "weight_shape"
        if shape_name not in k:
            raise TypeError(f"prepare_convolution: direction={direction!r} needs {shape_name}=")
        shape = k.pop(shape_name)
        out, stream = k.pop("out", None), k.pop("stream", None)
        core = _backward_data_call if direction == "backward_data" else _backward_filter_call
        _, prepared = core(x, w, shape, stride, padding, dilation, groups, out, stream, k)
    else:
        raise ValueError(f"direction: expected 'forward', 'backward_data' or 'backward_filter', "
                         f"got {direction!r}")
    if prepared is None:
        raise ValueError("prepare_convolution: this call cannot be prepared (it needs staging "
                         "copies, batch splitting or separate epilogue steps); call the function "
                         "directly instead")
    return prepared


def _epilogue_steps(handle: int, y: Tensor, z: Tensor, alpha: float, bias: Tensor | None) -> None:
    add_tensor(handle, z, y, alpha=alpha, beta=1.0)
    if bias is not None:
        add_bias(handle, y, bias)
    relu_(handle, y)


def _shape_arg(name: str, shape: Any, ndim: int) -> tuple[int, ...]:
    if not isinstance(shape, (tuple, list)) or any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) for s in shape):
        raise TypeError(f"{name}: expected a tuple of {ndim} ints, got {shape!r}")
    if len(shape) != ndim:
        raise ValueError(f"{name}: expected {ndim} sizes, got {len(shape)}: {list(shape)}")
    if any(s < 0 for s in shape):
        raise ValueError(f"{name}: expected non-negative sizes, got {list(shape)}")
    return tuple(int(s) for s in shape)


# ---- for integrations -------------------------------------------------------------------------
# The public functions' cores under public names: each takes the public function's arguments in
# order (flags as one dict) and returns ``(result, PreparedConvolution | None)``, what was prepared
# for the call, so that an integration (pycudnn.torch) can replay it with device pointers alone
# (`PreparedConvolution.launcher`). None: the call did not run as one launch.
convolution_and_prepared = _forward
convolution_add_relu_and_prepared = _add_relu
backward_data_and_prepared = _backward_data_call
backward_filter_and_prepared = _backward_filter_call
