"""What the operations' public functions share: argument checks, outputs, streams, the scaling
scalars, staging through dense copies, and the bounded cache of call plans.

Every check names the function and the parameter (PyTorch's wording where it has one) and runs
before anything is launched, so a refused call leaves every buffer as it was. The pieces are the
convolutions' own where they fit: `pycudnn.tensor.as_tensor`, `pycudnn.tensor.check_writable`,
`pycudnn.tensor.views_overlap`, `pycudnn.arguments.check_no_broadcast`,
`pycudnn.runtime.memory.stream_pair`, `pycudnn.memory.allocate_fast` and
`pycudnn.tensor_ops.scalar_pointers` / `pycudnn.tensor_ops.transform`.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable, Sequence, Union

import numpy as np

from ..cudnn.tensor_ops import scalar_pointers, transform
from ..runtime.tensor.checks import (check_device, check_dtype, check_match, check_no_broadcast,
                                     check_out_reads, check_size)
from ..ffi import library as _lib
from ..runtime.handle import get_handle
from ..runtime.memory import (DeviceBuffer, allocate_fast, callers_device, restore_device,
                              stream_pair)
from ..runtime.memory.stream_allocation import StreamAllocation
from ..runtime.tensor import (
    Tensor,
    as_tensor,
    channels_last_strides,
    check_writable,
    contiguous_strides,
    empty,
    has_internal_overlap,
    views_overlap,
)

__all__ = ["tensor_arg", "stream_pair", "scalars", "check_match", "check_size", "check_input",
           "check_choice", "check_coef", "layout_strides", "checked_out", "check_out_reads",
           "new_output", "output", "meet", "span_bytes", "same_layout", "staged", "PlanCache",
           "callers_device", "restore_device", "raise_launch", "scalars_of", "c_function",
           "INT32_MAX", "Reserve"]

#: cuDNN's legacy descriptors take sizes and strides as C ``int``
INT32_MAX = 2**31 - 1

DeviceMemory = Union[DeviceBuffer, StreamAllocation]
"""The device memory a reserve keeps: what `allocate()` or `allocate_fast()` returned."""


class Reserve:
    """Device memory a training forward pass fills for its backward pass (cuDNN's reserve
    space): the base of batch norm's `ReserveSpace` and dropout's `DropoutReserve`.

    Attributes:
        nbytes: its size in bytes.
        device: the CUDA device it is on.
    """

    __slots__ = ("_buffer", "nbytes", "device")

    def __init__(self, buffer: DeviceMemory | None, nbytes: int, device: int) -> None:
        self._buffer = buffer  # None for an empty reserve (nothing to keep)
        self.nbytes = nbytes
        self.device = device

    @property
    def ptr(self) -> int:
        """Its device address (0 when it is empty)."""
        return int(self._buffer.ptr) if self._buffer is not None else 0

    @property
    def size(self) -> int:
        """Its size in bytes (as the int8 array CuPy 13 returned)."""
        return self.nbytes


def tensor_arg(obj: Any, stream: Any) -> Tensor:
    """``obj`` as a `Tensor` (zero-copy; a Tensor is returned as is)."""
    return obj if type(obj) is Tensor else as_tensor(obj, stream=stream)


_SCALARS: dict[Any, tuple[int, int]] = {}


def scalars_of(dtype: Any) -> tuple[int, int]:
    """Addresses of alpha = 1 and beta = 0 in the scaling type cuDNN expects for ``dtype`` (a
    dict lookup: NumPy's ``dtype.name`` is Python code, microseconds per read)."""
    try:
        return _SCALARS[dtype]
    except KeyError:
        pair = _SCALARS[dtype] = scalar_pointers(dtype.name)
        return pair


def scalars(t: Tensor) -> tuple[int, int]:
    """Addresses of alpha = 1 and beta = 0 in the scaling type cuDNN expects for ``t``'s dtype."""
    return scalars_of(t.dtype)


def c_function(name: str) -> Any:
    """The bound C function ``name`` of libcudnn, for a plan to keep (one lookup per plan, not
    per call)."""
    return getattr(_lib.lib(), name)


# ---- checks -------------------------------------------------------------------------------------

def check_input(t: Tensor, name: str, fn: str, ranks: Sequence[int], what: str) -> None:
    """``t``'s rank is one of ``ranks`` (``what`` says what the dims are), it has no broadcast
    dims (cuDNN cannot read those) and its sizes fit cuDNN's C ints."""
    if t.ndim not in ranks:
        raise ValueError(f"{fn}: expected {name} to have {what}, but got {name} of size "
                         f"{list(t.shape)}")
    check_no_broadcast(t, name, fn)
    if t.shape and max(t.shape) > INT32_MAX:
        raise ValueError(f"{fn}: expected every size of {name} to be at most {INT32_MAX} (cuDNN "
                         f"takes C ints), but got {name} of size {list(t.shape)}")


def check_choice(value: Any, name: str, choices: Sequence[str], fn: str) -> str:
    """``value`` as one of ``choices`` (exact strings: no aliases, no case folding)."""
    if type(value) is not str or value not in choices:
        raise ValueError(f"{fn}: {name} must be one of {', '.join(map(repr, choices))}, but got "
                         f"{name}={value!r}")
    return value


def check_coef(coef: Any, fn: str) -> float:
    """``coef`` as a float: a real number (an int, a float or a NumPy real scalar; not a bool),
    not NaN."""
    if isinstance(coef, (bool, np.bool_)) or not isinstance(
            coef, (int, float, np.integer, np.floating)):
        raise TypeError(f"{fn}: coef must be a real number, but got {type(coef).__name__} {coef!r}")
    value = float(coef)
    if math.isnan(value):
        raise ValueError(f"{fn}: coef must be a number, but got coef=nan")
    return value


# ---- outputs ------------------------------------------------------------------------------------

def layout_strides(shape: tuple[int, ...], like: Tensor) -> tuple[int, ...]:
    """Dense strides of ``shape`` in ``like``'s memory format (channels_last for a 4-D or 5-D
    tensor whose strides are ordered like NHWC / NDHWC, else contiguous)."""
    if like.ndim in (4, 5) and len(shape) == like.ndim and like.memory_format == "channels_last":
        return channels_last_strides(shape)
    return contiguous_strides(shape)


def checked_out(out: Any, shape: tuple[int, ...], like: Tensor, fn: str, stream: Any,
                name: str = "out") -> Tensor:
    """``out`` as a Tensor after the checks that depend only on its layout (shape, dtype, device,
    writable, no overlapping elements); `check_out_reads` checks its address on every call."""
    t = tensor_arg(out, stream)
    check_writable(t, f"{fn}: {name}")
    if tuple(t.shape) != tuple(shape) or t.dtype != like.dtype or t.device != like.device:
        check_size(t, name, shape, fn)
        check_dtype(t, name, like.dtype, fn)
        check_device(t, name, like.device, fn, " (the inputs' device)", got_name=True)
    if t.size and has_internal_overlap(t.shape, t.strides):
        raise ValueError(f"{fn}: {name} has elements that overlap each other (strides "
                         f"{list(t.strides)}): more than one element of the written-to tensor "
                         f"refers to a single memory location; pass an output without "
                         f"overlapping elements")
    return t


def new_output(shape: tuple[int, ...], strides: tuple[int, ...], like: Tensor, stream: int,
               stream_ref: Any) -> Tensor:
    """A new output (dense in the given strides) on ``like``'s device, allocated stream-ordered on
    ``stream``; the device must be current (`pycudnn.handle.get_handle` made it so)."""
    n = 1
    for d in shape:
        n *= d
    return output(n * like.dtype.itemsize, shape, strides, like.dtype, like.device, stream,
                  stream_ref)


def output(nbytes: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any, device: int,
           stream: int, stream_ref: Any) -> Tensor:
    """`new_output` with the size a plan computed once: a new dense tensor of ``nbytes`` bytes
    (0: no element, no allocation) on the current ``device``."""
    if not nbytes:
        return Tensor._make(0, shape, strides, dtype, device, None)
    owner = allocate_fast(nbytes, device, stream, stream_ref)
    return Tensor._make(owner.ptr, shape, strides, dtype, device, owner)


def meet(a: Tensor, a_span: int, b: Tensor, b_span: int) -> bool:
    """Whether ``a`` and ``b`` share memory, given their spans in bytes (a plan computes them once
    from the layouts): the spans compared first, `views_overlap` only where they meet."""
    return a.ptr < b.ptr + b_span and b.ptr < a.ptr + a_span and views_overlap(a, b)


def span_bytes(t: Tensor) -> int:
    """Bytes from ``t``'s first to one past its last element (0 when it has none)."""
    return t.span_bytes if t.size else 0


def same_layout(shape: Sequence[int], a: Sequence[int], b: Sequence[int]) -> bool:
    """Whether strides ``a`` and ``b`` address the elements of ``shape`` alike (the stride of a
    size-1 dim is never used)."""
    return all(sa == sb for n, sa, sb in zip(shape, a, b) if n != 1)


def staged(handle: int, t: Tensor, strides: tuple[int, ...], stream: int,
           copy: bool = True, dtype: Any = None) -> Tensor:
    """``t`` itself when it has ``strides`` (and ``dtype``, where one is given), else a dense
    temporary with them (holding ``t``'s values, converted, when ``copy``), made on
    ``stream``."""
    dt = t.dtype if dtype is None else np.dtype(dtype)
    if t.size == 0 or (dt == t.dtype and same_layout(t.shape, t.strides, strides)):
        return t
    tmp = empty(t.shape, dt, device=t.device, stream=stream)
    tmp = Tensor._make(tmp.ptr, t.shape, strides, dt, t.device, tmp.owner)
    if copy:
        transform(handle, t, tmp)
    return tmp


#: the dtypes whose reductions and transcendental gradients run in float32 (staged through
#: float32 copies) where cuDNN's own half kernels lose accuracy: PyTorch computes them in float32
HALF_DTYPES = frozenset({"float16", "bfloat16"})
FLOAT32 = np.dtype(np.float32)


def raise_launch(status: int, function: str, fn: str, **descriptors: Any) -> None:
    """Raise the error for a failed launch, with the call's descriptors as context."""
    _lib.raise_status(status, function, f"while running {fn}",
                      *(f"  {name}: {d!r}" for name, d in descriptors.items()))


# ---- the plan cache -----------------------------------------------------------------------------

class PlanCache(dict[Any, Any]):
    """A small bounded map from call signatures to what a call needs besides its pointers
    (descriptors, output layout, bound C function). A repeated call finds its plan with one dict
    lookup (``cache[key]``, C-level: a miss raises KeyError, an unhashable key TypeError) and
    creates no descriptor; the oldest entries go first. Plans are never mutated once stored
    (beyond filling in what a first launch asks of cuDNN, the same for every thread), so threads
    share them."""

    def __init__(self, limit: int = 256) -> None:
        super().__init__()
        self.limit = limit
        self._lock = threading.Lock()

    def put(self, key: Any, plan: Any) -> None:
        try:
            hash(key)
        except TypeError:
            return
        evicted = []
        with self._lock:
            replaced = self.get(key)
            if replaced is not None and replaced is not plan:
                evicted.append(replaced)  # another thread's plan of the same signature
            self[key] = plan
            while len(self) > self.limit:
                old = next(iter(self))
                evicted.append(self.pop(old))
        for p in evicted:
            _retire(p)

    def clear(self) -> None:
        with self._lock:
            evicted = list(self.values())
            super().clear()
        for p in evicted:
            _retire(p)


def plans_clearer(*caches: PlanCache) -> Callable[[], None]:
    """A module's ``clear_plans``: a function that empties ``caches``."""
    def clear_plans() -> None:
        """Forget the remembered forward and backward plans (their descriptors are freed once no
        call uses them). A seam for tests and tooling that count what a first call does."""
        for cache in caches:
            cache.clear()
    return clear_plans


def _retire(plan: Any) -> None:
    """A plan left its cache: its runtime-compiled kernel promotion (``plan.fast``, where it
    has one) builds nothing more and lets its compiled plan go, so that neither the build
    queue nor the ready plans outgrow the caches."""
    fast = getattr(plan, "fast", None)
    if fast is not None:
        fast.retire()


# ---- staging copies a plan keeps ----------------------------------------------------------------

class Staging:
    """One staging copy a plan makes on every call, between an operand (the layout and dtype of
    the plan's signature, 4 dims or more) and a dense temporary: what `staged` and `transform`
    do, with cudnnTransformTensor's two descriptors and scaling constants made once, with the
    plan, so that a repeated call builds no descriptor (each costs microseconds)."""

    __slots__ = ("dtype", "inner", "launch", "outer", "shape", "strides", "to_inner", "to_outer")

    def __init__(self, shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any,
                 to_strides: tuple[int, ...], to_dtype: Any) -> None:
        from ..cudnn.descriptors import TensorDescriptor

        assert len(shape) >= 4  # as cudnnTransformTensor takes them
        self.shape, self.strides, self.dtype = shape, to_strides, np.dtype(to_dtype)
        self.outer = TensorDescriptor(shape, dtype, strides)  # the operand's
        self.inner = TensorDescriptor(shape, self.dtype, to_strides)  # the temporary's
        # transform's scaling constants: those of the destination's dtype
        self.to_inner = scalar_pointers(self.dtype.name)
        self.to_outer = scalar_pointers(np.dtype(dtype).name)
        self.launch = c_function("cudnnTransformTensor")

    def scratch(self, t: Tensor, stream: int) -> Tensor:
        """A new temporary for ``t`` (uninitialised), made on ``stream``."""
        tmp = empty(self.shape, self.dtype, device=t.device, stream=stream)
        return Tensor._make(tmp.ptr, self.shape, self.strides, self.dtype, t.device, tmp.owner)

    def load(self, handle: int, t: Tensor, stream: int) -> Tensor:
        """A new temporary holding ``t``'s values (converted to the temporary's dtype)."""
        tmp = self.scratch(t, stream)
        self._copy(handle, self.outer, t.ptr, self.inner, tmp.ptr, self.to_inner)
        return tmp

    def store(self, handle: int, tmp: Tensor, t: Tensor) -> None:
        """``t = tmp`` (converted to ``t``'s dtype)."""
        self._copy(handle, self.inner, tmp.ptr, self.outer, t.ptr, self.to_outer)

    def _copy(self, handle: int, sd: Any, src: int, dd: Any, dst: int,
              scaling: tuple[int, int]) -> None:
        st = self.launch(handle, scaling[0], sd.handle, src, scaling[1], dd.handle, dst)
        if st:
            _lib.raise_status(st, "cudnnTransformTensor", f"  src: {sd!r}", f"  dst: {dd!r}")


def staging(shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any,
            to_strides: tuple[int, ...], to_dtype: Any = None) -> Staging | None:
    """The `Staging` of an operand of ``shape``, ``strides`` and ``dtype`` into a dense temporary
    of ``to_strides`` (in ``to_dtype``, where one is given), or None where `staged` takes the
    operand as it is (its dtype and layout already)."""
    dt = np.dtype(dtype) if to_dtype is None else np.dtype(to_dtype)
    if dt == np.dtype(dtype) and same_layout(shape, strides, to_strides):
        return None
    return Staging(shape, strides, dtype, to_strides, dt)


def check_operands(ref: Tensor, ref_name: str, operands: Sequence[tuple[Tensor, str]],
                   shape: Sequence[int], because: str, fn: str, ranks: Sequence[int],
                   what: str) -> None:
    """Each of ``operands`` (``(tensor, name)`` pairs, checked in turn) passes `check_input`,
    has ``ref``'s dtype and device and the size ``shape`` (``because`` says why)."""
    for t, name in operands:
        check_input(t, name, fn, ranks, what)
        check_match(ref, ref_name, t, name, fn)
        if tuple(t.shape) != tuple(shape):
            check_size(t, name, shape, fn, f" ({because})")


def cached_plan(cache: PlanCache, key: Any, build: Callable[..., Any], *args: Any) -> Any:
    """The plan of ``key`` in ``cache``; at a miss (or an unhashable key, which the checks in
    ``build`` refuse) ``build(*args)``, kept unless ``key`` is None (a call kept off the
    cache)."""
    try:
        return cache[key]
    except (KeyError, TypeError):
        plan = build(*args)
        if key is not None:
            cache.put(key, plan)
        return plan


def result(o: Tensor | None, plan: Any, like: Tensor, stream: int, stream_ref: Any) -> Tensor:
    """A call's output: ``o`` where the caller gave one, else a new tensor of the plan's layout
    (``plan.shape``, ``plan.strides``, ``plan.nbytes`` bytes: none allocated for 0) in
    ``like``'s dtype on its device (current)."""
    if o is not None:
        return o
    return output(plan.nbytes, plan.shape, plan.strides, like.dtype, like.device, stream,
                  stream_ref)


def prologue(o: Tensor | None, nbytes: int, shape: tuple[int, ...], strides: tuple[int, ...],
             like: Tensor, stream: int, stream_ref: Any) -> tuple[int | None, int, Tensor]:
    """What a call does before its launches: ``(prev, handle, out)``, the caller's device (for
    `restore_device` once the call is done), the cuDNN handle of ``like``'s device on ``stream``
    (which makes that device current) and the call's output, ``o`` where the caller gave one,
    else a new one of ``nbytes`` bytes (as `output` makes it) in ``like``'s dtype. Where either
    step fails the caller's device is current again before the error propagates."""
    prev = callers_device()
    try:
        handle = get_handle(like.device, stream)
        if o is None:
            o = output(nbytes, shape, strides, like.dtype, like.device, stream, stream_ref)
        return prev, handle, o
    except BaseException:
        restore_device(prev)
        raise


def signature(t: Tensor | None) -> tuple[Any, ...] | None:
    """What a plan key holds of an optional operand (its layout, dtype and device; None for none
    given)."""
    return None if t is None else (t.shape, t.strides, t.dtype, t.device)
