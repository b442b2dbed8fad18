"""Allocation through the driver: `allocate()` returns a `DeviceBuffer` from ``cuMemAllocAsync``
on the device's current memory pool (a graph allocation node while the stream is captured), with
the 1 TiB guard (`MAX_ALLOCATION`), one retry after a synchronize when memory runs out and a
message that names the device's free and total memory; plain ``cuMemAlloc`` on a device without
memory pools. `empty_cache()` gives the pools' memory back to the driver."""

from __future__ import annotations

import ctypes
import operator
import threading
import weakref
from typing import Any

from ...errors import OutOfMemoryError
from . import bindings as _bindings
from . import driver as _driver
from .capture import stream_is_capturing
from .devices import (current_device, device_count, device_guard, mem_get_info, normalize_device,
                      require_driver)
from .errors import check_driver, driver_error_text
from .pool import release_kept_blocks
from .streams import LEGACY, resolve_stream, stream_pair, thread_token

#: Allocations from this size up are refused as out of memory without asking the driver: cuDNN
#: sometimes reports workspace sizes near 2^64 (PyTorch's Conv_v7.cpp applies the same 1 TiB rule).
MAX_ALLOCATION = 1 << 40


def _fmt_bytes(n: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


#: device -> its memory pool, made ready for pycudnn's allocations (the release threshold raised)
_pools: dict[int, int] = {}
#: devices without stream-ordered allocation (no memory-pool support): plain cuMemAlloc there
_no_pool: set[int] = set()
_pools_lock = threading.Lock()


def _prepare_pool(drv: Any, device: int) -> None:
    """On the first allocation on ``device`` (current): raise its current memory pool's release
    threshold to the maximum, so memory freed stays reserved for the next allocation instead of
    going back to the driver at every synchronize (cuda.core's memory resources do the same);
    note a device without memory pools."""
    with _pools_lock:
        if device in _pools or device in _no_pool:
            return
        supported = ctypes.c_int()
        err = drv.cuDeviceGetAttribute(ctypes.byref(supported), _driver.ATTR_MEMORY_POOLS_SUPPORTED,
                                       device)
        if err or not supported.value:
            _no_pool.add(device)
            return
        pool = ctypes.c_void_p()
        check_driver(drv.cuDeviceGetMemPool(ctypes.byref(pool), device), "cuDeviceGetMemPool")
        threshold = ctypes.c_uint64(2**64 - 1)
        check_driver(drv.cuMemPoolSetAttribute(pool, _driver.MEMPOOL_RELEASE_THRESHOLD,
                                               ctypes.byref(threshold)), "cuMemPoolSetAttribute")
        _pools[device] = int(pool.value or 0)


def pool_ready(device: int) -> bool:
    """Whether `allocate()` has prepared ``device``'s memory pool (so the driver is loaded and
    plain ``cuMemAllocAsync`` may be used on it)."""
    return device in _pools


def empty_cache(device: Any = None) -> None:
    """Return the memory that the device's stream-ordered pool keeps for reuse to the driver
    (with the blocks pycudnn keeps for reuse on the legacy default stream).

    pycudnn raises the release threshold of the device's current memory pool to the maximum (as
    cuda.core does), so memory freed by pycudnn stays reserved in that pool, where allocators that
    do not use it (PyTorch's caching allocator, CuPy's default pool) cannot reach it. Call this
    before handing a large amount of memory over to them. Memory still in use is not touched. Does
    nothing before pycudnn's first allocation on the device.
    """
    dev = normalize_device(device)
    release_kept_blocks(dev)
    pool = _pools.get(dev)
    if pool is None:
        return
    drv = require_driver("cuMemPoolTrimTo")
    with device_guard(dev):
        check_driver(drv.cuCtxSynchronize(), "cuCtxSynchronize")
        check_driver(drv.cuMemPoolTrimTo(pool, 0), "cuMemPoolTrimTo")


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



def _release(ptr: int, device: int, stream: int, stream_ref: Any = None, sync: bool = False,
             thread: Any = None) -> None:
    """Finalizer of a DeviceBuffer: free stream-ordered on the stream recorded at allocation
    (``thread``: the allocating thread's token for a per-thread-stream allocation, freed on the
    legacy stream when another thread drops it); ``sync``: after a device synchronize, for a raw
    stream handle that may be destroyed by now, or memory from plain ``cuMemAlloc``.

    Binds everything it needs as arguments (``stream_ref`` keeps the caller's stream object alive
    until the free is queued): it never refers to the DeviceBuffer, and takes no lock.
    """
    drv = _driver.loaded
    if _bindings.shutting_down or not drv:  # interpreter exit: the driver reclaims the memory
        return
    try:
        with device_guard(device):
            if sync:
                if drv.cuCtxSynchronize():
                    return  # work may still use the memory: losing it is the safe choice
                drv.cuMemFree(ptr)
            elif thread is not None and thread is not thread_token():
                drv.free(ptr, LEGACY)
            else:
                drv.free(ptr, stream)
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

    __slots__ = ("_ptr", "nbytes", "device", "_stream", "_finalizer", "_stream_ref", "_thread",
                 "_plain", "__weakref__")

    def __init__(self, ptr: int, nbytes: int, device: int, stream: int = 0,
                 stream_ref: Any = None, sync_release: bool = False, thread: Any = None,
                 plain: bool = False) -> None:
        self._ptr: int | None = ptr
        self.nbytes = nbytes
        self.device = device
        self._stream = stream
        self._stream_ref = stream_ref
        self._plain = plain  # from cuMemAlloc (a device without memory pools): freed synchronously
        self._thread = thread  # the allocating thread's token (memory of the per-thread stream)
        if ptr:
            self._finalizer: Any = weakref.finalize(self, _release, ptr, device, stream, stream_ref,
                                                    sync_release or plain, thread)
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
        ptr = self._take()
        if ptr is None:
            return
        drv = _driver.loaded
        if not drv:
            return
        with device_guard(self.device):
            if self._plain:
                _release(ptr, self.device, 0, None, True)
            elif stream is not None:
                drv.free(ptr, resolve_stream(stream))
            elif self._thread is not None and self._thread is not thread_token():
                drv.free(ptr, LEGACY)  # see LEGACY
            else:
                drv.free(ptr, self._stream)

    def free_synchronously(self) -> None:
        """Free now, after waiting for all work on the device: for memory whose allocation stream
        may no longer exist (the twin of `StreamAllocation.free_synchronously`, so a per-thread
        workspace of either kind is evicted alike). Idempotent. Nothing is freed when the device
        cannot be synchronized (another thread capturing a CUDA graph): the memory is kept for
        the rest of the process, never handed to the next allocation while work may use it."""
        ptr = self._take()
        if ptr is not None:
            _release(ptr, self.device, 0, None, True)

    def _take(self) -> int | None:
        """Mark the buffer closed and detach its finalizer: the address to free now, or None
        where there is nothing to free (closed already, or an empty buffer)."""
        ptr = self._ptr
        if ptr is None:
            return None
        self._ptr = None
        self._stream_ref = None
        if self._finalizer is None:
            return None
        self._finalizer.detach()
        return ptr

    def __enter__(self) -> "DeviceBuffer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._ptr is None else f"ptr={self._ptr:#x}"
        return f"DeviceBuffer({state}, nbytes={self.nbytes}, device={self.device})"


def allocate(nbytes: int, device: Any = None, stream: Any = None, *,
             what: str = "allocate") -> DeviceBuffer:
    """Allocate ``nbytes`` of device memory, stream-ordered on ``stream`` (``cuMemAllocAsync``).

    Args:
        nbytes: size in bytes; 0 gives a buffer with ``ptr == 0`` without touching the device.
        device: device ordinal (default: the current device).
        stream: anything `resolve_stream()` accepts (default: the legacy default stream).
        what: the public call on whose behalf this allocates (``"from_numpy"``): a missing
            device is reported under that name.

    On a stream being captured into a CUDA graph the allocation is a graph allocation node,
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
    handle, stream_ref = stream_pair(stream)
    drv = require_driver("cuMemAllocAsync")
    with device_guard(dev):
        if dev not in _pools:
            _prepare_pool(drv, dev)
        if dev in _no_pool:
            return DeviceBuffer(_allocate_plain(drv, n, dev), n, dev, plain=True)
        out = ctypes.c_uint64()
        err = drv.cuMemAllocAsync(ctypes.byref(out), n, handle)
        if err:
            _allocate_slow(drv, err, out, n, dev, handle)
    # A raw handle of a user's stream (not 0/1/2, no object to keep alive) may be destroyed before
    # the buffer is collected: freeing on it then would crash the driver. Such buffers are freed,
    # when collected, after a device synchronization.
    sync_release = stream_ref is None and handle > 2
    return DeviceBuffer(int(out.value), n, dev, handle, stream_ref, sync_release,
                        thread_token() if handle == 2 else None)


def _allocate_plain(drv: Any, n: int, dev: int) -> int:
    """``cuMemAlloc`` on a device without memory pools (the device is current)."""
    out = ctypes.c_uint64()
    err = drv.cuMemAlloc(ctypes.byref(out), n)
    if err == _OOM:
        check_driver(drv.cuCtxSynchronize(), "cuCtxSynchronize")
        err = drv.cuMemAlloc(ctypes.byref(out), n)
    if err == _OOM:
        raise _oom(n, dev, driver_error_text(err))
    check_driver(err, f"cuMemAlloc({n} bytes) on device {dev}")
    return int(out.value)


def _allocate_slow(drv: Any, err: int, out: Any, n: int, dev: int, handle: int) -> None:
    """The failure path of `allocate()` (the device is current): one retry after a synchronize
    when memory ran out (not while the stream is captured: nothing can be waited for then)."""
    if err == _OOM:
        try:
            _free, total = mem_get_info(dev)
        except Exception:
            total = 0
        if n <= total and not stream_is_capturing(handle):
            # Frees still pending on other streams return to the pool once they complete; the
            # blocks kept for reuse on the legacy stream go back to it too.
            release_kept_blocks(dev)
            check_driver(drv.cuCtxSynchronize(), "cuCtxSynchronize")
            err = drv.cuMemAllocAsync(ctypes.byref(out), n, handle)
            if not err:
                return
        if err == _OOM:
            raise _oom(n, dev, driver_error_text(err))
    check_driver(err, f"cuMemAllocAsync({n} bytes) on device {dev}")


_OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY
