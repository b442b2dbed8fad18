"""Streams: `resolve_stream()` and `stream_pair()`, the one conversion of whatever a caller gave
(`StreamLike`) into a ``cudaStream_t`` handle (an ``int``; ``None`` is the legacy default
stream, ``0``), with the object to keep alive where memory is ordered on it; waits on a
stream and between streams; events for timing (`event_create()` ... `event_elapsed_ms()`); the
calling thread's token (`thread_token()`, for memory of the per-thread default stream) and a
stream's driver id (`stream_identity()`, which no later stream reuses). All through the CUDA
driver by ctypes: a runtime handle is a driver handle (0, 1 and 2 included)."""

from __future__ import annotations

import operator
import threading
from ctypes import addressof as _addressof
from ctypes import byref as _byref
from ctypes import c_float as _c_float
from ctypes import c_uint64 as _c_uint64
from ctypes import c_void_p as _c_void_p
from typing import Any, Protocol, SupportsIndex, Union

from . import driver as _driver
from .devices import require_driver
from .errors import check_driver

LEGACY_DEFAULT_STREAM = 0  #: what ``None`` resolves to (``cudaStreamLegacy`` is 1, the same stream)


class SupportsCudaStream(Protocol):
    """An object following the CUDA stream protocol (cuda.core ``Stream``, recent CuPy and
    PyTorch streams, Numba): ``__cuda_stream__()`` gives ``(version, handle)``."""

    def __cuda_stream__(self) -> tuple[int, int]: ...


class HasCudaStreamHandle(Protocol):
    """An object with an integer ``.cuda_stream`` (``torch.cuda.Stream``,
    ``torch.cuda.ExternalStream``)."""

    @property
    def cuda_stream(self) -> int: ...


class HasStreamPointer(Protocol):
    """An object with an integer ``.ptr`` (``cupy.cuda.Stream``)."""

    @property
    def ptr(self) -> int: ...


StreamLike = Union[int, SupportsCudaStream, HasCudaStreamHandle, HasStreamPointer, SupportsIndex]
"""What `resolve_stream()`, and so every pycudnn function's ``stream=``, accepts (``None``
aside, the legacy default stream): a raw ``cudaStream_t`` handle as an int, an object with
``__cuda_stream__``, ``.cuda_stream`` or ``.ptr`` (cuda.core, PyTorch, CuPy, Numba streams), or
anything with ``__index__`` (cuda.bindings ``CUstream`` / ``cudaStream_t``)."""


# Memory allocated on the per-thread default stream (handle 2) is freed on the allocating thread's
# per-thread stream when that thread drops it. Another thread cannot name that stream: handle 2
# there is its own per-thread stream, which is not ordered after the allocating thread's work.
# It frees on the legacy default stream of the device instead: the per-thread default streams are
# blocking streams, which the legacy stream waits for, so the free is ordered after all the work
# queued so far on every thread's per-thread stream; no host synchronization, one async call.
LEGACY = 1  # cudaStreamLegacy: the legacy default stream even where 0 would mean per-thread


def resolve_stream(stream: StreamLike | None) -> int:
    """The ``cudaStream_t`` handle (an int) of ``stream``.

    Accepted, in the order checked:

    * ``None``: the legacy default stream, ``0``;
    * an ``int``: a raw handle (``0``/``1`` legacy default, ``2`` per-thread default);
    * any object with ``__cuda_stream__`` (the CUDA stream protocol: a method or attribute giving
      ``(version, handle)``): cuda.core ``Stream``, recent CuPy and PyTorch streams, Numba;
    * an object with an integer ``.cuda_stream`` (``torch.cuda.Stream``, ``torch.cuda.ExternalStream``);
    * an object with an integer ``.ptr`` (``cupy.cuda.Stream``);
    * a cuda.bindings ``CUstream`` / ``cudaStream_t`` object, or anything with ``__index__``.

    Raises:
        TypeError: naming ``stream`` and what was given.
        ValueError: a handle outside 0 .. 2**64 - 1.
    """
    if stream is None:
        return 0
    if type(stream) is int:
        if stream < 0 or stream >= 1 << 64:
            _stream_int(stream)  # raises, naming the range
        return stream
    return _resolve_stream_object(stream)


def stream_pair(stream: StreamLike | None) -> tuple[int, Any]:
    """``(handle, keep)``: ``stream``'s handle, as `resolve_stream()` gives it, and the object to
    keep alive until memory allocated or freed on the stream is (None for ``None`` and raw ints,
    which own nothing).

    Raises:
        TypeError: naming ``stream`` and what was given.
        ValueError: a handle outside 0 .. 2**64 - 1.
    """
    if stream is None:
        return 0, None
    if type(stream) is int:
        if stream < 0 or stream >= 1 << 64:
            _stream_int(stream)  # raises, naming the range
        return stream, None
    return _resolve_stream_object(stream), stream


def _resolve_stream_object(stream: Any) -> int:
    if isinstance(stream, bool):
        raise TypeError("stream: expected a CUDA stream, got bool")
    # PyTorch's streams: the same handle as their __cuda_stream__, read without building a tuple
    # through a Python property (about 5 us a call)
    handle = getattr(stream, "cuda_stream", None)
    if type(handle) is int and 0 <= handle < 1 << 64:
        return handle
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        info = proto() if callable(proto) else proto
        try:
            _version, handle = info
            return _stream_int(int(handle))
        except (TypeError, ValueError):
            raise TypeError(f"stream: {type(stream).__name__}.__cuda_stream__ returned {info!r}, "
                            "expected (version, handle)") from None
    for attr in ("cuda_stream", "ptr"):
        handle = getattr(stream, attr, None)
        if handle is not None and not isinstance(handle, bool):
            try:
                return _stream_int(operator.index(handle))
            except TypeError:
                pass
    if type(stream).__name__ in ("CUstream", "cudaStream_t"):
        return _stream_int(int(stream))
    try:
        return _stream_int(operator.index(stream))
    except TypeError:
        pass
    raise TypeError(
        f"stream: expected None, an int cudaStream_t handle, a cuda.core Stream, an object with "
        f"__cuda_stream__, .cuda_stream (PyTorch) or .ptr (CuPy); got {type(stream).__module__}."
        f"{type(stream).__qualname__}")


def _stream_int(handle: int) -> int:
    if handle < 0 or handle >= 1 << 64:
        raise ValueError(f"stream: expected a cudaStream_t handle (a non-negative 64-bit value), "
                         f"got {handle}")
    return handle



def stream_synchronize(stream: Any) -> None:
    """Wait for all work on ``stream`` (anything `resolve_stream()` accepts)."""
    handle = resolve_stream(stream)
    err = require_driver("cuStreamSynchronize").cuStreamSynchronize(handle)
    check_driver(err, "cuStreamSynchronize")



def same_stream(a: int, b: int) -> bool:
    return a == b or (a <= 1 and b <= 1)  # 0 and 1 both name the legacy default stream


def stream_wait(waiting: Any, producer: Any) -> None:
    """Make ``waiting`` wait for the work queued so far on ``producer`` (an event, no host sync).

    Nothing is done when both name the same stream.
    """
    w = resolve_stream(waiting)
    p = resolve_stream(producer)
    if same_stream(w, p):
        return
    drv = require_driver("cuEventCreate")
    event = event_create(timing=False)
    try:
        check_driver(drv.cuEventRecord(event, p), "cuEventRecord")
        check_driver(drv.cuStreamWaitEvent(w, event, 0), "cuStreamWaitEvent")
    finally:
        drv.cuEventDestroy(event)


# ---- events ---------------------------------------------------------------------------------------

def event_create(timing: bool = True) -> int:
    """A new event (``cuEventCreate``; ``timing=False``: ``CU_EVENT_DISABLE_TIMING``) as an int
    handle; destroy it with `event_destroy()`."""
    drv = require_driver("cuEventCreate")
    out = _c_void_p()
    check_driver(drv.cuEventCreate(_byref(out), 0 if timing else _driver.EVENT_DISABLE_TIMING),
                 "cuEventCreate")
    return int(out.value or 0)


def event_record(event: int, stream: int) -> None:
    """Record ``event`` on ``stream`` (an int handle)."""
    check_driver(require_driver("cuEventRecord").cuEventRecord(event, stream), "cuEventRecord")


def event_query(event: int) -> bool:
    """Whether the work before ``event`` is complete (``cuEventQuery``; errors raise)."""
    err = require_driver("cuEventQuery").cuEventQuery(event)
    if err == _driver.NOT_READY:
        return False
    check_driver(err, "cuEventQuery")
    return True


def event_synchronize(event: int) -> None:
    """Wait on the host for the work before ``event``."""
    err = require_driver("cuEventSynchronize").cuEventSynchronize(event)
    check_driver(err, "cuEventSynchronize")


def event_elapsed_ms(start: int, end: int) -> float:
    """Milliseconds between two completed timing events."""
    ms = _c_float()
    check_driver(require_driver("cuEventElapsedTime").cuEventElapsedTime(_byref(ms), start, end),
                 "cuEventElapsedTime")
    return float(ms.value)


def event_destroy(event: int) -> None:
    """Destroy an event made by `event_create()` (errors ignored: used in cleanup)."""
    drv = _driver.loaded
    if drv and event:
        drv.cuEventDestroy(event)



_tls = threading.local()


def thread_token() -> object:
    """An object unique to the calling thread (a thread id may be reused by a later thread; this
    object is not while anything holds it): what `DeviceBuffer`'s
    ``thread`` records for memory allocated on the per-thread default stream. Takes no lock: safe
    in finalizers."""
    try:
        return _tls.token
    except AttributeError:
        token = _tls.token = object()
        return token



def stream_identity(stream: int) -> int:
    """The driver's unique id of ``stream`` (``cuStreamGetId``), which no later stream reuses
    (a handle can be: the driver hands a destroyed stream's handle to a new stream); the
    handle itself for the default streams (0, 1, 2), which are never destroyed, and -1 where
    the id cannot be read (the handle alone then tells streams apart, as before)."""
    if stream <= 2:
        return stream
    drv = _driver.loaded or _driver.driver()
    get_id = getattr(drv, "stream_id", None) if drv else None
    if get_id is None:
        return -1
    out = _c_uint64()
    if get_id(stream, _addressof(out)) == 0:
        return int(out.value)
    return -1
