"""Blocks kept for reuse on the stream they were dropped on.

A stream-ordered free and the next allocation each put work in the stream (1.2-1.4 us of GPU
time between two kernels, measured on a 7 us convolution). Memory dropped on a stream is kept
here instead and handed to the next allocation of the same size on that stream
(`pycudnn.runtime.memory.stream_allocation.allocate_fast()`): both are ordered on that one stream,
so the block is free once the earlier work is done, as with PyTorch's caching allocator. The
legacy stream's (0 or 1) are keyed by device and size (`blocks`; it is never destroyed); a created
stream's by its driver id as well (`stream_blocks`): a destroyed stream's handle can come back for
a new stream, whose id no earlier stream had, so a block never goes to a stream its last use is
not ordered before. Those are freed only after a device synchronize (their stream may be gone).
Nothing allocated or reused while a stream is captured. Bounded (`KEEP_BYTES_MAX`, both kinds
together); `empty_cache()` and an allocation that fails give the blocks back. Lists, not locks:
finalizers append here from any thread. `free_async()` is every stream-ordered free, with the
right device current.
"""

from __future__ import annotations

from typing import Any

from . import devices as _devices
from . import driver as _driver
from .devices import device_guard

#: bytes kept at most, and the largest block kept
KEEP_BYTES_MAX = 256 << 20
KEEP_BLOCK_MAX = 32 << 20
blocks: dict[tuple[int, int], list[int]] = {}
#: (device, stream id, bytes) -> pointers kept for that created stream
stream_blocks: dict[tuple[int, int, int], list[int]] = {}
block_bytes = [0]  # approximate under threads (no lock); recounted when blocks are given back


def keep_block(ptr: int, nbytes: int, device: int, ident: int = -1) -> bool:
    """Keep a block dropped on the legacy stream (``ident`` -1), or on the created stream whose
    driver id is ``ident``, for reuse (False: free it as usual)."""
    if nbytes > KEEP_BLOCK_MAX or block_bytes[0] + nbytes > KEEP_BYTES_MAX:
        return False
    table: dict[Any, list[int]] = blocks if ident < 0 else stream_blocks
    key = (device, nbytes) if ident < 0 else (device, ident, nbytes)
    kept = table.get(key)
    if kept is None:
        kept = table.setdefault(key, [])
    kept.append(ptr)
    block_bytes[0] += nbytes
    return True


def release_kept_blocks(device: int | None = None) -> int:
    """Free the blocks kept for reuse (of one device, or all); the bytes freed. A created
    stream's are freed after a device synchronize, and kept where the device cannot be
    synchronized now (another thread capturing a graph)."""
    freed = 0
    for (dev, nbytes), kept in list(blocks.items()):
        if device is not None and dev != device:
            continue
        with device_guard(dev):
            while True:
                try:
                    ptr = kept.pop()
                except IndexError:
                    break
                free_async(ptr, 0, dev)
                freed += nbytes
    drv = _driver.loaded
    for (dev, _, nbytes), kept in list(stream_blocks.items()):
        if not drv or (device is not None and dev != device) or not kept:
            continue
        with device_guard(dev):
            if drv.cuCtxSynchronize():
                continue
            while True:
                try:
                    ptr = kept.pop()
                except IndexError:
                    break
                drv.cuMemFree(ptr)
                freed += nbytes
    block_bytes[0] = (sum(n * len(k) for (_, n), k in blocks.items())
                      + sum(n * len(k) for (_, _, n), k in stream_blocks.items()))
    return freed


def free_async(ptr: int, s: int, device: int) -> None:
    """``cuMemFreeAsync(ptr, s)`` with ``device`` current where the handle does not say the device.

    0, 1 and 2 name a stream of the current device: freeing a device-0 buffer on them while
    device 1 is current would order the free on device 1's stream, after none of the work that
    uses the buffer. A created stream belongs to its own device; and with one device visible
    there is no other, so those cases skip the device check (one retry with the device made
    current covers a thread on which no context was ever current). Takes no lock.
    """
    drv = _driver.loaded
    if not drv:
        return  # nothing was allocated through a driver that never loaded
    if s > 2 or _devices.visible_devices == 1:
        if not drv.free(ptr, s):
            return
    free_guarded(ptr, s, device)


def free_guarded(ptr: int, s: int, device: int) -> None:
    """The free of `free_async()` with ``device`` made current first (and back after)."""
    drv = _driver.loaded
    if not drv:
        return
    with device_guard(device):
        drv.free(ptr, s)
