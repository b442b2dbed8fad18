"""Prepared convolutions: everything decided once, then launched with the least host work.

A `PreparedConvolution` holds the cached choice (a
graph-engine plan or a v7 algorithm record) for one set of shapes, strides, dtype, geometry and
flags. Calling it checks that the new tensors match, allocates the output if none is given, and
launches: no validation of geometry, no descriptors, no plan, no search. On the graph engine a
launch with buffers seen before is one dict lookup plus one ``cudnnBackendExecute``.

The public convolution functions keep a bounded map from a cheap call signature to a prepared
convolution, so repeated calls with the same shapes take the same short path; users who call one
convolution many times can hold the object themselves through
`pycudnn.prepare_convolution()`.

If a launch fails (out of memory, a cuDNN error), the call goes back through the full search
iterator, which has the fallbacks.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable

import numpy as np

from ..cudnn.tensor_ops import contiguous_bias
from ..errors import PycudnnError
from ..runtime.handle import get_handle
from ..runtime.memory import devices as _devices
from ..runtime.memory import (StreamLike, allocate_fast, callers_device, restore_device,
                              stream_pair)
from ..runtime.tensor import (Tensor, TensorLike, as_tensor, check_writable, span_elements, spans_overlap,
                              views_overlap)
from ..engines.contract import Engine
from ..engines.problem import DIRECTION, ConvolutionParams
from ..runtime.tensor.checks import check_bias, check_out_reads, check_z

__all__ = ["PreparedConvolution", "remembered_calls", "clear_fast_calls",
           "FAST_CALLS_MAX"]

#: bound of the map from call signatures to prepared convolutions
FAST_CALLS_MAX = 1024

_fast: dict[tuple, "PreparedConvolution"] = {}
_fast_lock = threading.Lock()



class PreparedConvolution:
    """One convolution with its algorithm chosen; call it as ``conv(a, b, out=None, stream=None)``.

    ``a, b`` are the two inputs of the function it was prepared from: ``(x, w)`` for a
    convolution, ``(grad_y, w)`` for backward data, ``(x, grad_y)`` for backward filter; ``z`` and
    ``bias`` for a fused epilogue. They must have the shapes, strides, dtype and device it was
    prepared for (pass ``out=`` to reuse an output buffer). Safe to call from several threads.
    """

    # the torch out= layout remembered for the lean test (see __init__); class defaults too, so
    # that an object made without __init__ (a test's bare layout) has none remembered
    _torch_out_layout: tuple[Any, Any, Any, int] | None = None
    _torch_out_class: type | None = None

    def __init__(self, params: ConvolutionParams, record: Any, engine: Engine, dtype: np.dtype,
                 shapes: dict[str, tuple], strides: dict[str, tuple],
                 slow: Callable[..., Tensor] | None,
                 has_bias: bool = False, has_z: bool = False, out_size_bytes: int = 0) -> None:
        self.params = params
        self.record = record
        self.engine = engine
        self.direction = params.direction
        self.device = params.device
        self.dtype = dtype
        self.shapes = shapes
        self.strides = strides
        self.has_bias = has_bias
        self.has_z = has_z
        #: what a failed launch falls back to: the full path of the public function (the
        #: convolution functions set it when they prepare this)
        self.fallback: Callable[..., Tensor] = slow if slow is not None else _no_fallback
        self._dir = DIRECTION[self.direction]
        self._written = self._dir.written
        self._positions = self._dir.call_positions
        a, b = self._dir.inputs
        self._a_key = (shapes[a], strides[a])
        self._b_key = (shapes[b], strides[b])
        self.out_shape = shapes[self._written]
        self._out_strides = strides[self._written]
        self._out_bytes = out_size_bytes
        # bytes each fixed-layout tensor spans, for the remembered calls' cheap overlap test
        item = dtype.itemsize
        self._a_span = span_elements(*self._a_key) * item
        self._b_span = span_elements(*self._b_key) * item
        self._out_span = span_elements(self.out_shape, self._out_strides) * item
        #: the bias used when a call passes none (a fused epilogue whose first call made one up)
        self.default_bias: Tensor | None = None
        self.launcher = engine.launcher(params, record)
        # forward: (a, b, out) are already in the graph's pointer order, nothing to permute
        self._in_order = self._positions == (0, 1, 2)
        self._plain = not has_bias and not has_z  # no epilogue tensor to take or check
        # out= given as a torch tensor: the class and the layout of the first one accepted, in
        # torch's own terms ``(shape, stride(), dtype, get_device())``. A later torch out= of that
        # layout is read through five accessors and compared once, instead of a full as_tensor
        # and the Tensor's comparisons (set once, class last: a reader that sees the class sees
        # the layout)
        self._torch_out_layout = None
        self._torch_out_class = None

    def __repr__(self) -> str:
        return f"<PreparedConvolution {self.params.short()} -> {self.record.describe()}>"

    def __call__(self, a: TensorLike, b: TensorLike, out: TensorLike | None = None, *,
                 z: TensorLike | None = None, bias: TensorLike | None = None,
                 stream: StreamLike | None = None) -> Tensor:
        # the caller's current device, given back at the end (one device: nothing to give back)
        prev = None if _devices.visible_devices == 1 else callers_device()
        try:
            if type(a) is not Tensor:
                a = as_tensor(a, stream=stream)
            if type(b) is not Tensor:
                b = as_tensor(b, stream=stream)
            s, s_ref = (0, None) if stream is None else stream_pair(stream)
            dt = self.dtype
            a_shape, a_strides = self._a_key
            b_shape, b_strides = self._b_key
            if (a.shape != a_shape or a.strides != a_strides or b.shape != b_shape
                    or b.strides != b_strides
                    or (a.dtype is not dt and a.dtype != dt) or (b.dtype is not dt and b.dtype != dt)
                    or a.device != self.device or b.device != self.device):
                raise ValueError(
                    f"prepared convolution: expected inputs of shapes {self._a_key[0]} and "
                    f"{self._b_key[0]} with strides {self._a_key[1]} and {self._b_key[1]}, dtype "
                    f"{dt.name} on cuda:{self.device}; got {a.shape}/{a.strides} and "
                    f"{b.shape}/{b.strides}, {a.dtype.name}/{b.dtype.name} on cuda:{a.device}/cuda:{b.device}")
            if z is None and bias is None and self._plain:
                zt = bt = None  # nothing to check: no epilogue given, none expected
            else:
                zt, bt = self._epilogue_args(a, z, bias, stream)
            if out is not None:
                lean = self._lean_torch_out(out) if out.__class__ is self._torch_out_class else None
                if lean is not None:
                    out = lean  # the layout is the one checked and remembered before
                elif type(out) is not Tensor:
                    given = out
                    out = as_tensor(out, stream=stream)
                    self._learn_torch_out(given, out)
                if lean is None and (out.shape != self.out_shape or out.strides != self._out_strides
                                     or (out.dtype is not dt and out.dtype != dt)
                                     or out.device != self.device):
                    raise ValueError(f"prepared convolution: out must have shape {self.out_shape}, "
                                     f"strides {self._out_strides}, dtype {dt.name} on "
                                     f"cuda:{self.device}; got {out.shape}/{out.strides} "
                                     f"{out.dtype.name} on cuda:{out.device}")
                if out.readonly:
                    check_writable(out, "prepared convolution: out")
                if self.out_may_overlap(out, a, b) and (views_overlap(out, a) or views_overlap(out, b)):
                    raise ValueError("prepared convolution: out overlaps an input the call reads: "
                                     "cuDNN does not compute in place; pass an output that "
                                     "shares no memory with the inputs")
                if zt is not None or bt is not None:
                    # the full path's rule: out may be z exactly (an in-place residual), not partly
                    check_out_reads(out, (("bias", bt),), "prepared convolution", zt,
                                    in_place_name="z")
            if bt is not None and bt.strides != self.strides["b"]:
                # the fused plan reads K contiguous elements: a strided bias is copied first, on
                # this call's stream, as the full path does (after every check: nothing has run)
                bt = contiguous_bias(bt, s)
            return self._run(a, b, out, zt, bt, s, s_ref)
        finally:
            if prev is not None:
                restore_device(prev)

    def _epilogue_args(self, a: Tensor, z: Any, bias: Any, stream: Any) -> tuple[Any, Any]:
        """``(z, bias)`` as Tensors, checked with the full path's own checks (``a`` is the input x:
        only a forward convolution has an epilogue); None for those this convolution does not
        take. A bias or z it was not prepared for is refused, never dropped."""
        zt = bt = None
        if self.has_z:
            zt = check_z(z, self.shapes["z"], a, "prepared convolution", stream)
            if zt.strides != self.strides["z"]:
                raise ValueError(f"prepared convolution: expected z with strides "
                                 f"{list(self.strides['z'])} (those it was prepared with), but got "
                                 f"z with strides {list(zt.strides)}")
        elif z is not None:
            raise ValueError("prepared convolution: z was given, but this convolution was prepared "
                             "without a residual z; prepare it from convolution_add_relu to add one")
        if self.has_bias:
            if bias is None:
                bias = self.default_bias
                if bias is None:
                    raise ValueError(f"prepared convolution: this convolution was prepared with a "
                                     f"bias; pass bias= (a tensor of size {list(self.shapes['b'])})")
            bt = check_bias(bias, self.shapes["b"][0], a, stream)
        elif bias is not None:
            raise ValueError("prepared convolution: bias was given, but this convolution was "
                             "prepared without a bias; prepare it with one "
                             "(prepare_convolution(x, w, bias)) or call it without bias=")
        return zt, bt

    def out_may_overlap(self, out: Tensor, a: Tensor, b: Tensor) -> bool:
        """Whether ``out``'s span meets ``a``'s or ``b``'s: a cheap test for the hot path, from the
        spans of the fixed layouts (callers check the layouts first)."""
        o0 = out.ptr
        o1 = o0 + self._out_span
        return (a.ptr < o1 and o0 < a.ptr + self._a_span) or (b.ptr < o1 and o0 < b.ptr + self._b_span)

    def matching_out(self, out: TensorLike | None, a: Tensor, b: Tensor, bias: Tensor | None = None,
                     z: Tensor | None = None, stream: StreamLike | None = None
                     ) -> Tensor | None | bool:
        """``out`` as a Tensor when a launch on ``a`` and ``b`` (already known to match) can write
        it as is; None when ``out`` is None (the launch allocates); False when ``out`` is read-only,
        has another layout, dtype or device, or may share memory with an input (``a``, ``b``,
        ``bias``; ``z`` unless it is ``out`` exactly): calling the convolution then checks it
        fully and refuses it with a message. The remembered calls of the public functions test
        ``out=`` with this before they launch."""
        if out is None:
            return None
        if out.__class__ is self._torch_out_class:  # out= of a layout accepted before: lean
            lean = self._lean_torch_out(out)
            if lean is not None:
                if self.out_may_overlap(lean, a, b) or (bias is not None and spans_overlap(lean, bias)):
                    return False
                if z is not None and (z.ptr != lean.ptr or z.strides != lean.strides) and spans_overlap(lean, z):
                    return False
                return lean
        if type(out) is not Tensor:
            given = out
            out = as_tensor(out, stream=stream)
            self._learn_torch_out(given, out)
        if out.readonly:
            return False
        if not (out.shape == self.out_shape and out.strides == self._out_strides
                and out.dtype == self.dtype and out.device == self.device):
            return False
        if self.out_may_overlap(out, a, b) or (bias is not None and spans_overlap(out, bias)):
            return False
        if z is not None and (z.ptr != out.ptr or z.strides != out.strides) and spans_overlap(out, z):
            return False
        return out

    def _learn_torch_out(self, given: Any, view: Tensor) -> None:
        """Remember the torch layout of ``given`` (an out= just read by `as_tensor` into
        ``view``) when it is the first exact ``torch.Tensor`` of the output's layout: later ones
        of that layout take `_lean_torch_out`."""
        if self._torch_out_class is not None:
            return
        torch = sys.modules.get("torch")
        if (torch is None or given.__class__ is not torch.Tensor
                or not hasattr(torch.Tensor, "is_neg")):
            return
        if not (view.shape == self.out_shape and view.strides == self._out_strides
                and view.dtype == self.dtype and view.device == self.device):
            return  # not this convolution's output layout: the call refuses it
        self._torch_out_layout = (given.shape, given.stride(), given.dtype, view.device)
        self._torch_out_class = given.__class__

    def _lean_torch_out(self, out: Any) -> Tensor | None:
        """``out`` (an exact ``torch.Tensor``) as a view when it has the torch layout remembered by
        `_learn_torch_out` and no negative bit, else None (the caller reads it fully).

        The layout names what as_tensor checks: a CPU or meta tensor has ``get_device() == -1``
        (never a remembered device), a sparse one raises in ``stride()`` (read fully then)."""
        layout = self._torch_out_layout
        if layout is None:
            return None
        shape, strides, dtype, device = layout
        try:
            if (out.dtype is not dtype or out.shape != shape or out.stride() != strides
                    or out.get_device() != device or out.is_neg()):
                return None
            ptr = out.data_ptr()
        except Exception:  # noqa: BLE001 - e.g. a sparse layout: as_tensor's own refusal follows
            return None
        t = _new(Tensor)  # Tensor._make inlined, the fields the remembered layout already has
        t.ptr = ptr
        t.shape = self.out_shape
        t.strides = self._out_strides
        t.dtype = self.dtype
        t.device = self.device
        t.owner = out
        t.readonly = False
        return t

    def _run(self, a: Tensor, b: Tensor, out: Tensor | None, zt: Tensor | None,
             bt: Tensor | None, s: int, stream_ref: Any = None) -> Tensor:
        """Launch on tensors already known to match (the convolution functions' remembered-call
        path checks them through its key); allocates ``out`` when None."""
        device = self.device
        handle = get_handle(device, s)  # first: makes the device current for the allocation
        if out is None:
            owner = allocate_fast(self._out_bytes, device, s, stream_ref)
            out = _new(Tensor)  # Tensor._make inlined (one call less per call)
            out.ptr = owner.ptr
            out.shape = self.out_shape
            out.strides = self._out_strides
            out.dtype = self.dtype
            out.device = device
            out.owner = owner
            out.readonly = False
        ptrs: tuple[int, ...]
        if self._in_order:  # forward: the pointers in the graph's order (x, w, y) as they come
            ptrs = (a.ptr, b.ptr, out.ptr)
        else:
            t = (a, b, out)
            i, j, k = self._positions  # the forward roles (x, w, y), whatever the direction
            ptrs = (t[i].ptr, t[j].ptr, t[k].ptr)
        if zt is not None or bt is not None or self.has_bias:  # a fused epilogue's tensors
            if bt is None and self.has_bias:
                bt = self.default_bias
            if zt is not None:
                ptrs += (zt.ptr,)
            if bt is not None:
                ptrs += (bt.ptr,)
        try:
            self.launcher(handle, ptrs, s)
        except Exception:
            # out of memory, a cuDNN error, misaligned pointers...: the full path has the fallbacks
            return self.fallback(a, b, out, z=zt, bias=bt, stream=s)
        return out


_new = object.__new__


def _no_fallback(*args: Any, **kwargs: Any) -> Tensor:
    raise PycudnnError("internal error: a prepared convolution without a fallback failed to launch")




def remember(key: tuple, prepared: PreparedConvolution) -> None:
    """Keep ``prepared`` for a call signature (bounded; oldest entries go first)."""
    try:
        hash(key)
    except TypeError:  # an unhashable argument (a list for stride, ...): nothing to remember
        return
    with _fast_lock:
        _fast[key] = prepared
        while len(_fast) > FAST_CALLS_MAX:
            del _fast[next(iter(_fast))]


#: ``dict.get`` of the map of remembered calls, bound once (the map is cleared in place, never
#: rebound): the public functions' hot path looks a call signature up through it directly
#: (TypeError for an unhashable key)
lookup_remembered = _fast.get


def lookup(key: tuple) -> PreparedConvolution | None:
    try:
        prepared = _fast.get(key)
    except TypeError:  # an unhashable argument (a list for stride, ...): take the full path
        return None
    return prepared


def forget(key: tuple) -> None:
    with _fast_lock:
        _fast.pop(key, None)


def set_limit(entries: int | None) -> None:
    """Bound the map of remembered call signatures (None: the default bound)."""
    global FAST_CALLS_MAX
    with _fast_lock:
        FAST_CALLS_MAX = 1024 if entries is None else entries
        while len(_fast) > FAST_CALLS_MAX:
            del _fast[next(iter(_fast))]


def remembered_calls() -> list[PreparedConvolution]:
    """The convolutions remembered now for repeated calls of the public functions (each a
    `PreparedConvolution`), oldest first."""
    with _fast_lock:
        return list(_fast.values())


def clear_fast_calls() -> None:
    """Forget every remembered call signature (``pycudnn.clear_caches()`` calls this)."""
    with _fast_lock:
        _fast.clear()
