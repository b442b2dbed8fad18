"""Dropout through cuDNN: a seeded random state on the device, a forward pass that zeroes each
element with probability ``p`` and scales the others by ``1 / (1 - p)``, and a backward pass that
applies the forward pass's mask (kept in its reserve) to the gradient.

`DropoutState` owns cuDNN's dropout descriptor and its RNG state buffer, initialised from the
seed by ``cudnnSetDropoutDescriptor`` (a kernel, run once); each forward pass draws new random
numbers from it, so two states with one seed give the same masks. Changing ``p`` keeps the state
(``cudnnRestoreDropoutDescriptor``); `DropoutState.reset` re-initialises it. A state is one RNG
stream: calls that use it must be ordered on the device; its host side is locked, so threads may
share it (their masks then depend on the order of their calls).

A call whose tensors cuDNN takes as they are leaves a plan keyed by their layouts and devices
(the flat descriptor, the reserve size, the C function): the next call of that signature checks
the state, the reserve and the addresses, allocates and launches.
"""

from __future__ import annotations

import math
import numbers
import threading
from ctypes import byref, c_size_t
from typing import Any

import numpy as np

from .._types import DTypeLike, normalize_dtype
from ..cudnn.descriptors import TensorDescriptor, Descriptor
from ..cudnn.tensor_ops import transform
from ..runtime.tensor.checks import (check_device, check_dtype, check_no_broadcast,
                                     check_out_reads, check_size)
from ..ffi import library as _lib
from ..ops._common import DeviceMemory, PlanCache, Reserve, c_function, signature
from ..runtime.handle import get_handle
from ..runtime.memory import (
    DeviceLike,
    StreamLike,
    allocate,
    allocate_fast,
    callers_device,
    current_device,
    restore_device,
    stream_pair,
    stream_synchronize,
)
from ..runtime.tensor import (
    Tensor,
    TensorLike,
    as_tensor,
    check_writable,
    contiguous_strides,
    has_internal_overlap,
)

__all__ = ["DropoutDescriptor", "DropoutState", "DropoutReserve", "dropout_forward",
           "dropout_backward", "dropout_reserve_size"]

INT32_MAX = 2**31 - 1


# ---- the descriptor -------------------------------------------------------------------------------

class DropoutDescriptor(Descriptor):
    """A cuDNN dropout descriptor (``cudnnDropoutDescriptor_t``), freed like the other
    descriptors (see `pycudnn.descriptors`). Created unset: `set` (which initialises an RNG
    state, on a handle's stream) or `restore` gives it a probability and a state."""

    __slots__ = ()
    _create_name = "cudnnCreateDropoutDescriptor"
    _destroy_name = "cudnnDestroyDropoutDescriptor"

    def __init__(self) -> None:
        _, destroy, h = self._create()
        self._adopt(destroy, h)

    def set(self, handle: int, p: float, states: int, states_size: int, seed: int) -> None:
        """``cudnnSetDropoutDescriptor``: probability ``p`` and the state at ``states``
        initialised from ``seed`` (a kernel on the handle's stream)."""
        st = _lib.lib().cudnnSetDropoutDescriptor(self.handle, handle, p, states or None,
                                                  states_size, seed)
        if st:
            _lib.raise_status(st, "cudnnSetDropoutDescriptor", f"  p={p}, seed={seed}, "
                              f"states={states_size} bytes")

    def restore(self, handle: int, p: float, states: int, states_size: int, seed: int) -> None:
        """``cudnnRestoreDropoutDescriptor``: probability ``p`` and an already initialised state."""
        st = _lib.lib().cudnnRestoreDropoutDescriptor(self.handle, handle, p, states or None,
                                                      states_size, seed)
        if st:
            _lib.raise_status(st, "cudnnRestoreDropoutDescriptor", f"  p={p}, seed={seed}")

    def _describe(self) -> str:
        return f"handle={self.handle:#x}"



# ---- argument checks ------------------------------------------------------------------------------

def _probability(p: Any, what: str) -> float:
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, numbers.Real):
        raise TypeError(f"{what}: expected p to be a real number, but got {type(p).__name__} {p!r}")
    try:
        value = float(p)
    except OverflowError:  # an int beyond float's range
        value = math.inf
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{what}: dropout probability has to be in [0, 1) for cuDNN (it scales "
                         f"the kept elements by 1 / (1 - p)), but got p={p!r}")
    if np.float32(value) >= 1.0:  # cuDNN takes p as a C float
        raise ValueError(f"{what}: dropout probability has to be in [0, 1) for cuDNN, and cuDNN "
                         f"takes it as a float32, in which p={p!r} rounds to 1.0; pass "
                         f"p <= {float(np.nextafter(np.float32(1), np.float32(0)))!r}")
    return value


def _seed(seed: Any, what: str) -> int:
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{what}: expected seed to be an int, but got {type(seed).__name__} "
                        f"{seed!r}")
    value = int(seed)
    if not 0 <= value < 2**64:
        raise ValueError(f"{what}: expected seed in [0, 2**64), but got seed={seed!r}")
    return value


# ---- the state ------------------------------------------------------------------------------------

class DropoutState:
    """cuDNN's dropout descriptor and the device RNG state it draws from.

    Args:
        p: the probability of zeroing an element, in [0, 1).
        seed: the RNG seed, an int in [0, 2**64): one seed gives one sequence of masks.
        device: the CUDA device (default: the current one); tensors passed with this state
            must be on it.
        stream: the stream the state is initialised on (the initialisation is waited for, so
            that any stream may use the state afterwards).

    Attributes:
        device: the CUDA device.
        seed: the seed the state was last initialised from.
        states_nbytes: the size of the RNG state buffer.
    """

    def __init__(self, p: float = 0.5, seed: int = 0, *, device: DeviceLike | None = None,
                 stream: StreamLike | None = None) -> None:
        what = "DropoutState"
        self._p = _probability(p, what)
        self.seed = _seed(seed, what)
        self._lock = threading.Lock()
        prev = callers_device()
        try:
            s, sref = stream_pair(stream)
            handle = get_handle(device, s)
            self.device = current_device()
            size = c_size_t()
            _lib.lib().checked.cudnnDropoutGetStatesSize(handle, byref(size))
            self.states_nbytes = int(size.value)
            self._states = allocate(self.states_nbytes, self.device,
                                    sref if sref is not None else s, what=what)
            self._desc = DropoutDescriptor()
            self._desc.set(handle, self._p, self._states.ptr, self.states_nbytes, self.seed)
            stream_synchronize(s)
        finally:
            restore_device(prev)

    @property
    def p(self) -> float:
        """The dropout probability. Setting it keeps the RNG state where it is (cuDNN's
        ``cudnnRestoreDropoutDescriptor``): cheap, with no new initialisation."""
        return self._p

    @p.setter
    def p(self, value: float) -> None:
        p = _probability(value, "DropoutState.p")
        with self._lock:
            self._set_p(p)

    def _set_p(self, p: float, stream: int = 0) -> None:
        if p == self._p:
            return
        handle = get_handle(self.device, stream)
        self._desc.restore(handle, p, self._states.ptr, self.states_nbytes, self.seed)
        self._p = p

    def reset(self, seed: int | None = None, *, stream: StreamLike | None = None) -> None:
        """Initialise the RNG state again from ``seed`` (default: the seed it has), on
        ``stream``, and wait for it: the masks start over as from a new state."""
        new_seed = self.seed if seed is None else _seed(seed, "DropoutState.reset")
        prev = callers_device()
        try:
            s, _ = stream_pair(stream)
            with self._lock:
                handle = get_handle(self.device, s)
                self._desc.set(handle, self._p, self._states.ptr, self.states_nbytes, new_seed)
                self.seed = new_seed
                stream_synchronize(s)
        finally:
            restore_device(prev)

    @property
    def descriptor(self) -> DropoutDescriptor:
        """The cuDNN dropout descriptor (owned by the state)."""
        return self._desc

    @property
    def states_ptr(self) -> int:
        """The device address of the RNG state."""
        return int(self._states.ptr)

    def __repr__(self) -> str:
        return (f"DropoutState(p={self._p}, seed={self.seed}, device={self.device}, "
                f"states_nbytes={self.states_nbytes})")


class DropoutReserve(Reserve):
    """The mask of one dropout forward pass (cuDNN's reserve space), for its backward pass.

    Attributes:
        nbytes: its size in bytes (``cudnnDropoutGetReserveSpaceSize``; also ``size``, as the
            int8 array CuPy 13 returned).
        ptr: its device address (0 for an empty input).
        shape: the forward input's shape.
        dtype: the forward input's dtype.
        device: the CUDA device.
        p: the probability the forward pass used.
    """

    __slots__ = ("shape", "strides", "dtype", "p")

    def __init__(self, buffer: DeviceMemory | None, nbytes: int, shape: tuple[int, ...],
                 strides: tuple[int, ...], dtype: np.dtype, device: int, p: float) -> None:
        super().__init__(buffer, nbytes, device)
        self.shape = shape
        self.strides = strides  # the element order the mask follows
        self.dtype = dtype
        self.p = p

    def __repr__(self) -> str:
        return (f"DropoutReserve(nbytes={self.nbytes}, shape={self.shape}, "
                f"dtype={self.dtype.name}, p={self.p})")


# ---- descriptors of flat tensors, cached ------------------------------------------------------------

_DESCS: dict[tuple[int, np.dtype], tuple[TensorDescriptor, int]] = {}
_DESCS_MAX = 64
_descs_lock = threading.Lock()


def _flat(n: int, dtype: np.dtype) -> tuple[TensorDescriptor, int]:
    """(a descriptor of ``n`` packed elements, the reserve bytes cuDNN asks for it)."""
    key = (n, dtype)
    entry = _DESCS.get(key)
    if entry is None:
        d = TensorDescriptor((1, n, 1, 1), dtype)
        size = c_size_t()
        st = _lib.lib().cudnnDropoutGetReserveSpaceSize(d.handle, byref(size))
        if st:
            _lib.raise_status(st, "cudnnDropoutGetReserveSpaceSize", f"  x: {d!r}")
        entry = (d, int(size.value))
        with _descs_lock:
            while len(_DESCS) >= _DESCS_MAX:
                del _DESCS[next(iter(_DESCS))]
            _DESCS[key] = entry
    return entry


def dropout_reserve_size(shape: tuple[int, ...], dtype: DTypeLike = "float32") -> int:
    """Bytes of reserve space a dropout forward pass of this shape and dtype keeps (asks cuDNN;
    no GPU needed)."""
    n = math.prod(int(s) for s in shape)
    return _flat(n, normalize_dtype(dtype))[1] if n else 0


def _packed_order(t: Tensor) -> bool:
    """Whether the elements of ``t`` fill its span without gaps or overlap (some order of dims)."""
    dims = sorted((st, size) for size, st in zip(t.shape, t.strides) if size > 1)
    expected = 1
    for st, size in dims:
        if st != expected:
            return False
        expected *= size
    return True


def _alloc_strided(shape: tuple[int, ...], strides: tuple[int, ...], dtype: np.dtype, device: int,
                   s: int, sref: Any) -> Tensor:
    n = math.prod(shape)
    buf = allocate_fast(n * dtype.itemsize, device, s, sref)
    return Tensor._make(buf.ptr, shape, strides, dtype, device, buf)


def _view4(t: Tensor) -> Tensor:
    """A 3-to-8-dim view for cudnnTransformTensor (unit dims added in front)."""
    if t.ndim >= 3:
        return t
    pad = 3 - t.ndim
    return Tensor._make(t.ptr, (1,) * pad + t.shape, (t.size or 1,) * pad + t.strides, t.dtype,
                        t.device, t, t.readonly)


def _copy(handle: int, src: Tensor, dst: Tensor) -> None:
    transform(handle, _view4(src), _view4(dst))


# cudnnDropoutForward/Backward answer CUDNN_STATUS_NOT_SUPPORTED for bfloat16 (measured, cuDNN 9.19)
_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def _check_tensor(t: Tensor, name: str, fn: str, state: DropoutState) -> None:
    if t.dtype not in _DTYPES:
        raise TypeError(f"{fn}: expected {name} to have dtype float16, float32 or float64 "
                        f"(cuDNN's dropout has no {t.dtype.name} kernel), but got {t.dtype.name}")
    check_no_broadcast(t, name, fn)
    if t.device != state.device:
        check_device(t, name, state.device, fn, " (the state's device)")
    if t.size > INT32_MAX:
        raise ValueError(f"{fn}: {name} has {t.size} elements; cuDNN's dropout takes at most "
                         f"{INT32_MAX} per call: split it")
    if not _packed_order(t) and t.ndim > 8:
        raise ValueError(f"{fn}: {name} has {t.ndim} dims and is not dense: pass a contiguous "
                         f"tensor (cuDNN copies strided tensors of at most 8 dims)")


def _check_out(out: Any, name: str, like: Tensor, fn: str, stream: Any,
               reads: list[tuple[str, Tensor]]) -> Tensor:
    o = out if type(out) is Tensor else as_tensor(out, stream=stream)
    check_writable(o, name)
    if tuple(o.shape) != tuple(like.shape) or o.dtype != like.dtype or o.device != like.device:
        check_size(o, name, like.shape, fn, got_name=False)
        check_dtype(o, name, like.dtype, fn)
        check_device(o, name, like.device, fn)
    if o.size and has_internal_overlap(o.shape, o.strides):
        raise ValueError(f"{fn}: {name} has overlapping elements (strides {list(o.strides)}); "
                         f"pass an output without overlapping elements")
    check_out_reads(o, reads, name=name)
    return o


def _check_state(state: Any, fn: str) -> DropoutState:
    if not isinstance(state, DropoutState):
        raise TypeError(f"{fn}: expected state to be a DropoutState, but got "
                        f"{type(state).__name__}")
    return state


# ---- plans: repeated calls that need no copy --------------------------------------------------------

class _Plan:
    """What a repeated call of one signature needs besides its pointers and the state: a call
    whose tensors are in an order cuDNN takes as it is (a packed input, out and grad_output in its
    layout). Keyed by the layouts and the devices; the state, the reserve and the addresses are
    checked on every call."""

    __slots__ = ("keep", "d", "res_size", "nbytes", "launch")

    def __init__(self, d: TensorDescriptor, res_size: int, nbytes: int, function: str) -> None:
        self.keep, self.d = d, d.handle  # the flat descriptor, shared with _flat's cache
        self.res_size = res_size
        self.nbytes = nbytes
        self.launch = c_function(function)


_FORWARD = PlanCache(128)
_BACKWARD = PlanCache(128)


def plan_counts() -> tuple[int, int]:
    """(forward, backward) plans remembered now, one per call signature. A seam for tests and
    tooling: whether a call left its plan."""
    return len(_FORWARD), len(_BACKWARD)


# ---- forward and backward -------------------------------------------------------------------------

def dropout_forward(x: TensorLike, state: DropoutState, *, out: TensorLike | None = None,
                    stream: StreamLike | None = None) -> tuple[Tensor, DropoutReserve]:
    """``y = x * mask / (1 - p)`` with a fresh random mask (each element kept with probability
    ``1 - p``), as ``F.dropout(x, p, training=True)``.

    Args:
        x: any CUDA array pycudnn accepts, of any shape and strides.
        state: the `DropoutState` (probability, RNG) to use;
            its RNG advances.
        out: optional output of x's shape, dtype and device (any strides).
        stream: the CUDA stream to run on.

    Returns:
        ``(y, reserve)``: pass ``reserve`` to `dropout_backward`.
    """
    try:
        xt = x if type(x) is Tensor else as_tensor(x, stream=stream)
        o = None if out is None else (out if type(out) is Tensor else as_tensor(out, stream=stream))
        if type(state) is not DropoutState:
            raise LookupError
        plan = _FORWARD[(xt.shape, xt.strides, xt.dtype, xt.device, state.device, signature(o))]
    except Exception:  # a new signature, or arguments the full checks refuse (in their order)
        return forward_full(x, state, out, stream)
    if o is not None:  # what the key cannot know
        check_out_reads(o, (("input", xt),))
    s, sref = stream_pair(stream)
    dev = xt.device
    prev = callers_device()
    try:
        handle = get_handle(dev, s)
        if o is None:
            owner = allocate_fast(plan.nbytes, dev, s, sref)
            o = Tensor._make(owner.ptr, xt.shape, xt.strides, xt.dtype, dev, owner)
        res_size = plan.res_size
        buf = allocate_fast(res_size, dev, s, sref)
        with state._lock:
            reserve = DropoutReserve(buf, res_size, xt.shape, xt.strides, xt.dtype, dev, state._p)
            status = plan.launch(handle, state._desc.handle, plan.d, xt.ptr, plan.d, o.ptr,
                                 buf.ptr or None, res_size)
        if status:
            _lib.raise_status(status, "cudnnDropoutForward", f"  x: {plan.keep!r}",
                              f"  p={state.p}")
        return o, reserve
    finally:
        restore_device(prev)


def forward_full(x: Any, state: Any, out: Any, stream: Any) -> tuple[Tensor, DropoutReserve]:
    """`dropout_forward` the long way: the full checks, in the order they name the
    parameters, then a call that copies what cuDNN cannot take as it is. Stores the plan of a
    call that needs no copy, which the next call of its signature takes.
    Public as a seam for tests and tooling."""
    fn = "dropout_forward"
    st_ = _check_state(state, fn)
    prev = callers_device()
    try:
        xt = x if type(x) is Tensor else as_tensor(x, stream=stream)
        _check_tensor(xt, "input", fn, st_)
        o = _check_out(out, "out", xt, fn, stream, [("input", xt)]) if out is not None else None
        s, sref = stream_pair(stream)
        if xt.size and _packed_order(xt) and (o is None or o.strides == xt.strides):
            # no copy: later calls of this signature take the plan
            d, res_size = _flat(xt.size, xt.dtype)
            _FORWARD.put((xt.shape, xt.strides, xt.dtype, xt.device, st_.device, signature(o)),
                         _Plan(d, res_size, xt.size * xt.dtype.itemsize, "cudnnDropoutForward"))
        handle = get_handle(st_.device, s)
        n = xt.size
        if _packed_order(xt):
            xw = xt
        else:
            xw = _alloc_strided(xt.shape, contiguous_strides(xt.shape), xt.dtype, xt.device, s,
                                sref)
            _copy(handle, xt, xw)
        if o is not None and o.strides == xw.strides:
            yw, target = o, None
        else:
            yw, target = _alloc_strided(xw.shape, xw.strides, xw.dtype, xw.device, s, sref), o
        if n == 0:
            reserve = DropoutReserve(None, 0, xw.shape, xw.strides, xw.dtype, xw.device, st_.p)
            return (o if o is not None else yw), reserve
        d, res_size = _flat(n, xw.dtype)
        buf = allocate_fast(res_size, xw.device, s, sref)
        with st_._lock:
            reserve = DropoutReserve(buf, res_size, xw.shape, xw.strides, xw.dtype, xw.device,
                                     st_.p)
            status = _lib.lib().cudnnDropoutForward(handle, st_._desc.handle, d.handle, xw.ptr,
                                                    d.handle, yw.ptr, buf.ptr or None, res_size)
        if status:
            _lib.raise_status(status, "cudnnDropoutForward", f"  x: {d!r}", f"  p={st_.p}")
        if target is not None:
            _copy(handle, yw, target)
            return target, reserve
        return yw, reserve
    finally:
        restore_device(prev)


def dropout_backward(dy: TensorLike, state: DropoutState, reserve: DropoutReserve, *,
                     out: TensorLike | None = None, stream: StreamLike | None = None) -> Tensor:
    """``dx = dy * mask / (1 - p)`` with the mask of the forward pass that made ``reserve``.

    Args:
        dy: the gradient with respect to the forward output (its shape and dtype).
        state: the state the forward pass used (its RNG does not advance).
        reserve: the forward pass's reserve.
        out: optional output for ``dx`` (any strides).
        stream: the CUDA stream to run on.

    Returns:
        ``dx`` as a `pycudnn.Tensor`, ``out`` itself when given.
    """
    try:
        dyt = dy if type(dy) is Tensor else as_tensor(dy, stream=stream)
        o = None if out is None else (out if type(out) is Tensor else as_tensor(out, stream=stream))
        if (type(state) is not DropoutState or type(reserve) is not DropoutReserve
                or dyt.strides != reserve.strides or dyt.shape != reserve.shape
                or dyt.dtype != reserve.dtype or reserve.device != state.device):
            raise LookupError  # the full checks explain, or copy dy into the mask's order
        plan = _BACKWARD[(dyt.shape, dyt.strides, dyt.dtype, dyt.device, state.device, signature(o))]
    except Exception:  # a new signature, or arguments the full checks refuse (in their order)
        return backward_full(dy, state, reserve, out, stream)
    if o is not None:  # what the key cannot know
        check_out_reads(o, (("grad_output", dyt),))
    s, sref = stream_pair(stream)
    dev = dyt.device
    prev = callers_device()
    try:
        handle = get_handle(dev, s)
        if o is None:
            owner = allocate_fast(plan.nbytes, dev, s, sref)
            o = Tensor._make(owner.ptr, dyt.shape, dyt.strides, dyt.dtype, dev, owner)
        with state._lock:
            p_now = state._p
            if p_now != reserve.p:
                state._set_p(reserve.p, s)  # the forward pass's scale, then the state's again
            try:
                status = plan.launch(handle, state._desc.handle, plan.d, dyt.ptr, plan.d, o.ptr,
                                     reserve.ptr or None, reserve.nbytes)
            finally:
                if p_now != reserve.p:
                    state._set_p(p_now, s)
        if status:
            _lib.raise_status(status, "cudnnDropoutBackward", f"  dy: {plan.keep!r}",
                              f"  p={reserve.p}")
        return o
    finally:
        restore_device(prev)


def backward_full(dy: Any, state: Any, reserve: Any, out: Any, stream: Any) -> Tensor:
    """`dropout_backward` the long way: the full checks, in the order they name the
    parameters, then a call that copies what cuDNN cannot take as it is. Stores the plan of a
    call that needs no copy, which the next call of its signature takes.
    Public as a seam for tests and tooling."""
    fn = "dropout_backward"
    st_ = _check_state(state, fn)
    if not isinstance(reserve, DropoutReserve):
        raise TypeError(f"{fn}: expected reserve to be the DropoutReserve dropout_forward "
                        f"returned, but got {type(reserve).__name__}")
    prev = callers_device()
    try:
        dyt = dy if type(dy) is Tensor else as_tensor(dy, stream=stream)
        _check_tensor(dyt, "grad_output", fn, st_)
        if tuple(dyt.shape) != reserve.shape or dyt.dtype != reserve.dtype:
            check_size(dyt, "grad_output", reserve.shape, fn, " (the forward input's)",
                       got_name=False)
            check_dtype(dyt, "grad_output", reserve.dtype, fn, " (the forward input's)")
        if reserve.device != st_.device:
            raise ValueError(f"{fn}: reserve is on cuda:{reserve.device}, the state on "
                             f"cuda:{st_.device}")
        o = _check_out(out, "out", dyt, fn, stream, [("grad_output", dyt)]) \
            if out is not None else None
        s, sref = stream_pair(stream)
        if dyt.size and dyt.strides == reserve.strides and (o is None or o.strides == dyt.strides):
            # no copy: later calls of this signature take the plan
            d, res_size = _flat(dyt.size, dyt.dtype)
            _BACKWARD.put((dyt.shape, dyt.strides, dyt.dtype, dyt.device, st_.device, signature(o)),
                          _Plan(d, res_size, dyt.size * dyt.dtype.itemsize,
                                "cudnnDropoutBackward"))
        handle = get_handle(st_.device, s)
        n = dyt.size
        # the mask follows the forward input's element order: dy and dx are used in that order
        if dyt.strides == reserve.strides or n == 0:
            dyw = dyt
        else:
            dyw = _alloc_strided(reserve.shape, reserve.strides, dyt.dtype, dyt.device, s, sref)
            _copy(handle, dyt, dyw)
        if o is not None and o.strides == dyw.strides:
            dxw, target = o, None
        else:
            dxw, target = _alloc_strided(dyw.shape, dyw.strides, dyw.dtype, dyw.device, s,
                                         sref), o
        if n == 0:
            return o if o is not None else dxw
        d, res_size = _flat(n, dyw.dtype)
        with st_._lock:
            p_now = st_._p
            if p_now != reserve.p:
                st_._set_p(reserve.p, s)  # the forward pass's scale, then the state's again
            try:
                status = _lib.lib().cudnnDropoutBackward(handle, st_._desc.handle, d.handle,
                                                         dyw.ptr, d.handle, dxw.ptr,
                                                         reserve.ptr or None, reserve.nbytes)
            finally:
                if p_now != reserve.p:
                    st_._set_p(p_now, s)
        if status:
            _lib.raise_status(status, "cudnnDropoutBackward", f"  dy: {d!r}", f"  p={reserve.p}")
        if target is not None:
            _copy(handle, dxw, target)
            return target
        return dxw
    finally:
        restore_device(prev)

