"""Allocation through cuda.core: `allocate()` returns a `DeviceBuffer` from the stream-ordered
memory resource of the device (``Device(i).memory_resource``, the driver's memory pool), with the
1 TiB guard (`MAX_ALLOCATION`), one retry after a synchronize when memory runs out and a
message that names the device's free and total memory; a graph allocation while a stream is
being captured. `empty_cache()` gives the pools' memory back to the driver."""

from __future__ import annotations

import operator
import threading
import weakref
from typing import Any

from ...errors import OutOfMemoryError, PycudnnError
from . import bindings as _bindings
from .capture import stream_is_capturing
from .devices import current_device, device_count, device_guard, mem_get_info, normalize_device
from .errors import CudaError, check_cuda
from .pool import release_kept_blocks
from .streams import LEGACY, resolve_stream, thread_token

#: Allocations from this size up are refused as out of memory without asking the driver: cuDNN
#: sometimes reports workspace sizes near 2^64 (PyTorch's Conv_v7.cpp applies the same 1 TiB rule).
MAX_ALLOCATION = 1 << 40


def _fmt_bytes(n: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


_core_streams: dict[int, Any] = {}
_memory_resources: dict[int, Any] = {}
_core_lock = threading.Lock()


def _core_stream(handle: int) -> Any:
    """A cuda.core ``Stream`` for a raw handle (cached: ``Stream.from_handle`` costs ~16 us).

    0 and 1 map to cuda.core's ``LEGACY_DEFAULT_STREAM``, 2 to ``PER_THREAD_DEFAULT_STREAM``.
    A cached wrapper only borrows the handle: it never destroys the stream.
    """
    s = _core_streams.get(handle)
    if s is None:
        cc = _bindings.core()
        if handle <= 1:
            s = getattr(cc, "LEGACY_DEFAULT_STREAM", None)
        elif handle == 2:
            s = getattr(cc, "PER_THREAD_DEFAULT_STREAM", None)
        if s is None:
            s = cc.Stream.from_handle(handle)
        with _core_lock:
            if len(_core_streams) >= 64:
                _core_streams.clear()
            _core_streams[handle] = s
    return s


def _memory_resource(device: int) -> Any:
    mr = _memory_resources.get(device)
    if mr is None:
        Device = _bindings.core().Device
        with _core_lock:
            mr = _memory_resources.get(device)
            if mr is None:
                mr = _memory_resources[device] = Device(device).memory_resource
    return mr


def empty_cache(device: Any = None) -> None:
    """Return the memory that the device's stream-ordered pool keeps for reuse to the driver
    (with the blocks pycudnn keeps for reuse on the legacy default stream).

    cuda.core raises the release threshold of the device's current memory pool to the maximum, so
    memory freed by pycudnn stays reserved in that pool, where allocators that do not use it
    (PyTorch's caching allocator, CuPy's default pool) cannot reach it. Call this before handing a
    large amount of memory over to them. Memory still in use is not touched. Does nothing before
    pycudnn's first allocation on the device.
    """
    dev = normalize_device(device)
    release_kept_blocks(dev)
    mr = _memory_resources.get(dev)
    if mr is None:
        return
    with device_guard(dev):
        check_cuda((_bindings.rt or _bindings.runtime()).cudaDeviceSynchronize(), "cudaDeviceSynchronize")
        if not isinstance(mr, _bindings.core().DeviceMemoryResource):  # no memory-pool support: nothing is kept
            return
        from cuda.bindings import driver

        err, = driver.cuMemPoolTrimTo(mr.handle, 0)
        if int(err):
            raise CudaError(int(err), "cuMemPoolTrimTo", str(err))


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    text = str(exc)
    return ("OUT_OF_MEMORY" in text or "cudaErrorMemoryAllocation" in text
            or "out of memory" in text.lower())


def _oom(nbytes: int, device: int, reason: str) -> OutOfMemoryError:
    try:
        free, total = mem_get_info(device)
        mem = f"device {device} has {_fmt_bytes(free)} free of {_fmt_bytes(total)} total"
    except Exception:
        mem = f"free/total memory of device {device} unknown"
    return OutOfMemoryError(f"out of memory: could not allocate {nbytes} bytes ({_fmt_bytes(nbytes)}) "
                            f"on device {device}: {reason}; {mem}")


def _check_nbytes(nbytes: Any) -> int:
    if type(nbytes) is not int:
        if isinstance(nbytes, bool):
            raise TypeError("nbytes: expected a non-negative int, got bool")
        try:
            nbytes = operator.index(nbytes)
        except TypeError:
            raise TypeError(f"nbytes: expected a non-negative int, got {type(nbytes).__name__}") from None
    if nbytes < 0:
        raise ValueError(f"nbytes: expected a non-negative int, got {nbytes}")
    return nbytes



#: buffers `DeviceBuffer.free_synchronously` could not free safely (lost at worst, never reused)
_unfreed: list[Any] = []


def _release(buffer: Any, device: int, stream_ref: Any = None, sync: bool = False,
             thread: Any = None, legacy: Any = None) -> None:
    """Finalizer of a DeviceBuffer: free stream-ordered on the stream recorded at allocation
    (``thread``: the allocating thread's token for a per-thread-stream allocation, freed on
    ``legacy``, the cuda.core legacy stream, when another thread drops it).

    Binds everything it needs as arguments (``stream_ref`` keeps the caller's stream object alive
    until the free is queued): it never refers to the DeviceBuffer, and takes no lock.
    """
    if _bindings.shutting_down:  # interpreter exit: the driver reclaims the memory; touch nothing
        return
    try:
        with device_guard(device):
            if sync:  # the allocation stream was a raw handle that may be destroyed by now
                if (_bindings.rt or _bindings.runtime()).cudaDeviceSynchronize()[0]:
                    return  # work may still use the memory: losing it is the safe choice
                buffer.close()
            elif thread is not None and thread is not thread_token():
                buffer.close(legacy)
            else:
                buffer.close()
    except Exception:  # a finalizer must not raise; the memory is lost at worst
        pass


class DeviceBuffer:
    """Device memory from `allocate()`.

    Attributes:
        ptr: the device address (0 for an empty buffer); reading it after `close()` raises.
        nbytes: its size in bytes.
        device: the device ordinal.

    Freed stream-ordered on `close()` (on the stream given, else on the allocation stream) or,
    when it is garbage-collected, on the allocation stream by a ``weakref.finalize`` that holds no
    reference to the object, with its device current. Memory allocated on the per-thread default
    stream and dropped by another thread is freed on the legacy default stream, which waits for
    every thread's per-thread stream. Nothing is freed at interpreter exit (the driver reclaims it).
    The stream an allocation was made on must outlive the buffer unless ``close(stream=...)`` names
    another one (when ``stream`` was an object, the buffer keeps a reference to it).
    """

    __slots__ = ("_ptr", "nbytes", "device", "_buffer", "_finalizer", "_stream_ref", "_thread",
                 "__weakref__")

    def __init__(self, ptr: int, nbytes: int, device: int, buffer: Any = None,
                 stream_ref: Any = None, sync_release: bool = False, thread: Any = None) -> None:
        self._ptr: int | None = ptr
        self.nbytes = nbytes
        self.device = device
        self._buffer = buffer
        self._stream_ref = stream_ref
        self._thread = thread  # the allocating thread's token when allocated on the per-thread stream
        if buffer is not None:
            legacy = _core_stream(LEGACY) if thread is not None else None
            self._finalizer: Any = weakref.finalize(self, _release, buffer, device, stream_ref,
                                                    sync_release, thread, legacy)
            self._finalizer.atexit = False
        else:
            self._finalizer = None

    @property
    def ptr(self) -> int:
        ptr = self._ptr
        if ptr is None:
            raise ValueError("DeviceBuffer: used after close()")
        return ptr

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def close(self, stream: Any = None) -> None:
        """Free the memory now, ordered on ``stream`` (default: the stream it was allocated on).
        Closing twice is harmless."""
        if self._ptr is None:
            return
        buffer = self._buffer
        self._ptr = None
        self._buffer = None
        self._stream_ref = None
        if buffer is None:
            return
        self._finalizer.detach()
        with device_guard(self.device):
            if stream is not None:
                buffer.close(_core_stream(resolve_stream(stream)))
            elif self._thread is not None and self._thread is not thread_token():
                buffer.close(_core_stream(LEGACY))  # see LEGACY
            else:
                buffer.close()

    def free_synchronously(self) -> None:
        """Free now, after waiting for all work on the device: for memory whose allocation stream
        may no longer exist (the twin of `StreamAllocation.free_synchronously`, so a per-thread
        workspace of either kind is evicted alike). Idempotent. Nothing is freed when the device
        cannot be synchronized (another thread capturing a CUDA graph): the memory is kept for
        the rest of the process, never handed to the next allocation while work may use it."""
        if self._ptr is None:
            return
        buffer = self._buffer
        self._ptr = None
        self._buffer = None
        self._stream_ref = None
        if buffer is None:
            return
        self._finalizer.detach()
        with device_guard(self.device):
            if (_bindings.rt or _bindings.runtime()).cudaDeviceSynchronize()[0]:
                _unfreed.append(buffer)  # cuda.core frees a collected Buffer: keep it alive
                return
            # nothing is queued any more, so the legacy stream (which always exists) will do
            buffer.close(_core_stream(LEGACY))

    def __enter__(self) -> "DeviceBuffer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._ptr is None else f"ptr={self._ptr:#x}"
        return f"DeviceBuffer({state}, nbytes={self.nbytes}, device={self.device})"


def allocate(nbytes: int, device: Any = None, stream: Any = None, *,
             what: str = "allocate") -> DeviceBuffer:
    """Allocate ``nbytes`` of device memory, stream-ordered on ``stream``, through cuda.core.

    Args:
        nbytes: size in bytes; 0 gives a buffer with ``ptr == 0`` without touching the device.
        device: device ordinal (default: the current device).
        stream: anything `resolve_stream()` accepts (default: the legacy default stream).
        what: the public call on whose behalf this allocates (``"from_numpy"``): a missing
            device is reported under that name.

    On a stream being captured into a CUDA graph, cuda.core's pool refuses to allocate; the
    allocation then goes through cuda.core's ``GraphMemoryResource`` (a graph allocation node),
    which must be freed (``close(stream)``) before the capture ends.

    Raises:
        OutOfMemoryError: ``nbytes >= 1 TiB`` (refused up front: cuDNN sometimes reports sizes near
            2^64), or the driver could not allocate (after one retry following a device
            synchronize); the message names the bytes asked, the device and its free/total memory.
        NoDeviceError: no usable device (with the driver's reason).
    """
    n = _check_nbytes(nbytes)
    if n == 0:
        if device is None:
            dev = current_device() if device_count() else 0
        else:
            dev = normalize_device(device, what=what) if device_count() else operator.index(device)
        return DeviceBuffer(0, 0, dev)
    if n >= MAX_ALLOCATION:
        where = device if device is not None else "current"
        raise OutOfMemoryError(
            f"out of memory: refusing a workspace/allocation of {n} bytes ({_fmt_bytes(n)}) on "
            f"device {where}: sizes from 1 TiB up are treated as out of memory (cuDNN sometimes "
            "reports sizes near 2^64)")
    dev = normalize_device(device, what=what)
    handle = stream if type(stream) is int else resolve_stream(stream)
    stream_ref = None if stream is None or type(stream) is int else stream
    s = _core_stream(handle)
    with device_guard(dev):
        mr = _memory_resource(dev)
        try:
            buf = mr.allocate(n, stream=s)
        except Exception as exc:
            buf = _allocate_slow(exc, mr, n, dev, handle, s)
    # A raw handle of a user's stream (not 0/1/2, no object to keep alive) may be destroyed before
    # the buffer is collected: freeing on it then would crash the driver. Such buffers are freed,
    # when collected, on the legacy default stream after a device synchronization.
    sync_release = stream_ref is None and handle > 2
    if sync_release:
        buf.set_deallocation_stream(_core_stream(0))
    return DeviceBuffer(int(buf.handle), n, dev, buf, stream_ref, sync_release,
                        thread_token() if handle == 2 else None)


def _allocate_slow(exc: Exception, mr: Any, n: int, dev: int, handle: int, s: Any) -> Any:
    """The failure path of `allocate()` (the device is current)."""
    if _is_oom(exc):
        try:
            _free, total = mem_get_info(dev)
        except Exception:
            total = 0
        if n <= total and not stream_is_capturing(handle):
            # Frees still pending on other streams return to the pool once they complete; the
            # blocks kept for reuse on the legacy stream go back to it too.
            release_kept_blocks(dev)
            rt = _bindings.rt or _bindings.runtime()
            check_cuda(rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
            try:
                return mr.allocate(n, stream=s)
            except Exception as again:
                if not _is_oom(again):
                    raise _wrap(again, n, dev) from again
                exc = again
        raise _oom(n, dev, str(exc) or type(exc).__name__) from exc
    if not isinstance(exc, PycudnnError) and stream_is_capturing(handle):
        try:
            return _bindings.core().GraphMemoryResource(dev).allocate(n, stream=s)
        except Exception as graph_exc:
            if _is_oom(graph_exc):
                raise _oom(n, dev, str(graph_exc)) from graph_exc
            raise _wrap(graph_exc, n, dev) from graph_exc
    raise _wrap(exc, n, dev) from exc


def _wrap(exc: Exception, n: int, dev: int) -> Exception:
    if isinstance(exc, PycudnnError):
        return exc
    return CudaError(-1, f"allocating {n} bytes on device {dev} through cuda.core",
                     f"{type(exc).__name__}: {exc}")
