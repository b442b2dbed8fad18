"""The hot path's allocations: `allocate_fast()` returns a `StreamAllocation`, plain
``cuMemAllocAsync`` on the caller's stream (a block of the same size kept for that stream
first), kept for its stream or freed with ``cuMemFreeAsync`` when dropped; anything unusual goes
through `pycudnn.runtime.memory.buffers.allocate()`, which retries and explains.
`allocate_kept_first()` is `allocate()`'s interface with the legacy stream's kept blocks first
(the tensor factories')."""

from __future__ import annotations

from typing import Any

from . import bindings as _bindings
from . import devices as _devices
from . import driver as _driver
from .buffers import MAX_ALLOCATION, allocate, pool_ready
from .capture import is_capturing
from .devices import device_guard, normalize_device
from .pool import (block_bytes, blocks, free_async, free_guarded, keep_block,
                   release_kept_blocks, stream_blocks)
from .streams import LEGACY, resolve_stream, stream_identity, thread_token

class StreamAllocation:
    """Device memory from ``cuMemAllocAsync`` on a stream, freed with ``cuMemFreeAsync``.

    The lean twin of `DeviceBuffer` for the convolution hot path (about 2 us for an
    allocate/free pair against about 7 us through cuda.core's Buffer). Same interface: ``ptr``,
    ``nbytes``, ``device``, ``close(stream=None)``. When collected its block is kept for reuse
    on its stream where `pycudnn.runtime.memory.pool` takes it, else it frees itself on the stream
    it was allocated on, with its device current (0, 1 and 2 name a stream of the *current*
    device), so that stream must still exist: when the stream was given as an object (cuda.core,
    CuPy, PyTorch), the allocation keeps a reference to it; a raw int handle is the caller's
    promise. Memory allocated on the per-thread default stream and dropped by another thread is
    freed on the legacy default stream, which waits for every thread's per-thread stream (see
    ``LEGACY``). ``sync_free`` allocations (per-thread workspaces, collected when their thread
    ends, long after the stream may be gone) are freed by `free_synchronously()` instead.
    After interpreter shutdown has begun nothing is freed (the driver reclaims memory at exit).
    """

    __slots__ = ("ptr", "nbytes", "device", "stream", "stream_ref", "sync_free", "thread", "ident")

    def __init__(self, ptr: int, nbytes: int, device: int, stream: int, stream_ref: Any = None,
                 sync_free: bool = False) -> None:
        self.ptr, self.nbytes, self.device, self.stream = ptr, nbytes, device, stream
        self.stream_ref, self.sync_free = stream_ref, sync_free
        #: the allocating thread's token when allocated on the per-thread default stream
        self.thread = thread_token() if stream == 2 else None
        #: the created stream's driver id when the block is kept for it once dropped, else -1
        self.ident = -1

    def close(self, stream: Any = None) -> None:
        """Free now, ordered on ``stream`` (default: the allocation stream). Idempotent."""
        ptr = self.ptr
        if not ptr:
            return
        self.ptr = 0
        if stream is not None:
            s = resolve_stream(stream)
        else:
            s = self.stream
            if s == 2 and self.thread is not thread_token():
                s = LEGACY  # another thread's per-thread stream: see LEGACY
        free_async(ptr, s, self.device)
        self.stream_ref = None

    def free_synchronously(self) -> None:
        """Free now, after waiting for all work on the device: for memory whose stream may no
        longer exist. ``cuMemFree`` alone does not wait for work still using stream-ordered memory.
        Nothing is freed when the device cannot be synchronized (the memory is lost at worst)."""
        ptr = self.ptr
        if not ptr:
            return
        self.ptr = 0
        self.stream_ref = None
        drv = _driver.loaded
        if not drv:
            return
        with device_guard(self.device):
            if drv.cuCtxSynchronize():
                # e.g. another thread is capturing a CUDA graph: freeing now could hand memory
                # still in use to the next allocation, so it is kept (lost at worst), never raised
                # into the call that happened to evict it
                return
            drv.cuMemFree(ptr)

    def __del__(self) -> None:
        # no lock taken here (a finalizer may run on any thread, at any point)
        ptr = self.ptr
        if ptr and not _bindings.shutting_down:
            try:
                if self.ident >= 0 and keep_block(ptr, self.nbytes, self.device, self.ident):
                    self.ptr = 0
                    self.stream_ref = None
                    return
                if self.sync_free:
                    self.free_synchronously()
                    return
                s = self.stream
                # close() inlined for the hot path (every output dropped frees here), including
                # free_async's common case: the driver's free, no device check needed
                if s == 2 and self.thread is not thread_token():
                    s = LEGACY  # another thread's per-thread stream: see LEGACY
                self.ptr = 0
                if s < 2 and keep_block(ptr, self.nbytes, self.device):
                    return
                drv = _driver.loaded
                if drv and (s > 2 or _devices.visible_devices == 1):
                    if drv.free(ptr, s):
                        free_guarded(ptr, s, self.device)
                else:
                    free_async(ptr, s, self.device)
            except Exception:  # a finalizer must not raise; the memory is lost at worst
                pass

    def __repr__(self) -> str:
        return f"StreamAllocation(ptr={self.ptr:#x}, nbytes={self.nbytes}, device={self.device})"



def allocate_fast(nbytes: int, device: int, stream: int, stream_ref: Any = None,
                  sync_free: bool = False) -> Any:
    """`allocate()` for trusted arguments on the hot path (``device`` current, ``stream`` an
    int handle; ``stream_ref`` the stream object it came from, kept alive until the free): a
    block kept for the stream first (see `pycudnn.runtime.memory.pool`; none while the stream
    is captured, and none for a ``sync_free`` caller's memory), else plain ``cuMemAllocAsync``;
    anything unusual (0 or huge sizes, an error such as out of memory) goes through
    `allocate()`, which retries and explains."""
    ident = -1
    if stream > 2:
        if not sync_free and (_driver.loaded or _driver.driver()) and not is_capturing(stream):
            ident = stream_identity(stream)
        if stream_ref is None:
            # a raw handle of a user's stream may be destroyed before this memory is collected:
            # free it synchronously then (unless it is kept), never ordered on a stream that
            # may no longer exist
            sync_free = True
    if 0 < nbytes < MAX_ALLOCATION:
        if stream < 2 or ident >= 0:
            kept = blocks.get((device, nbytes)) if stream < 2 else stream_blocks.get(
                (device, ident, nbytes))
            if kept:
                try:
                    ptr = kept.pop()
                except IndexError:  # another thread took the last one
                    ptr = 0
                if ptr:
                    block_bytes[0] -= nbytes
                    a = _new(StreamAllocation)
                    a.ptr, a.nbytes, a.device, a.stream = ptr, nbytes, device, stream
                    a.stream_ref, a.sync_free, a.thread, a.ident = stream_ref, sync_free, None, ident
                    return a
        drv = _driver.loaded or _driver.driver()
        ptr = drv.allocate(nbytes, stream) if drv else 0
        if not ptr and (blocks or stream_blocks) and drv:
            # out of memory, maybe: give the kept blocks back first
            release_kept_blocks(device)
            ptr = drv.allocate(nbytes, stream)
        if ptr:
            # StreamAllocation.__init__ inlined: this is every output of a remembered call
            a = _new(StreamAllocation)
            a.ptr = ptr
            a.nbytes = nbytes
            a.device = device
            a.stream = stream
            a.stream_ref = stream_ref
            a.sync_free = sync_free
            a.thread = thread_token() if stream == 2 else None
            a.ident = ident
            return a
    return allocate(nbytes, device, stream if stream_ref is None else stream_ref)


def allocate_kept_first(nbytes: int, device: Any = None, stream: Any = None, *,
                        what: str = "allocate") -> Any:
    """`allocate()` with its arguments and errors, for any caller: on the legacy default stream a
    kept block of the size first (`allocate_fast()`), so that a tensor made and dropped each call
    (a full-path output, a staged copy) puts no allocation work in the stream between kernels
    (1.2 us of GPU time a call on a 7 us convolution); anything else is `allocate()`."""
    if type(nbytes) is int and 0 < nbytes < MAX_ALLOCATION:
        s = resolve_stream(stream)
        if s < 2:
            dev = normalize_device(device, what=what)
            if pool_ready(dev):  # else allocate() prepares it (the first allocation on dev)
                with device_guard(dev):
                    return allocate_fast(nbytes, dev, s)
    return allocate(nbytes, device, stream, what=what)


_new = object.__new__
