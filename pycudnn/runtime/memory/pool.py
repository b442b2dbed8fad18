"""Blocks kept for reuse on the legacy default stream.

A stream-ordered free and the next allocation each put work in the stream (about a microsecond of
GPU time between two kernels: measured on a ~9 us convolution). Memory dropped on the legacy
default stream is kept here instead and handed to the next allocation of the same size on it
(`pycudnn.runtime.memory.stream_allocation.allocate_fast()`): both are ordered on that one stream,
so the block is free once the earlier work is done, as with PyTorch's caching allocator. Only the
legacy stream (0 or 1): it is never destroyed, so a kept block never outlives its stream. Bounded;
`empty_cache()` and an allocation that fails give the blocks back. Lists, not locks: finalizers
append here from any thread.
"""

from __future__ import annotations

from .devices import device_guard
from .driver import free_async

#: bytes kept at most, and the largest block kept
KEEP_BYTES_MAX = 256 << 20
KEEP_BLOCK_MAX = 32 << 20
blocks: dict[tuple[int, int], list[int]] = {}
block_bytes = [0]  # approximate under threads (no lock); recounted when blocks are given back


def keep_block(ptr: int, nbytes: int, device: int) -> bool:
    """Keep a block freed on the legacy stream for reuse (False: free it as usual)."""
    if nbytes > KEEP_BLOCK_MAX or block_bytes[0] + nbytes > KEEP_BYTES_MAX:
        return False
    kept = blocks.get((device, nbytes))
    if kept is None:
        kept = blocks.setdefault((device, nbytes), [])
    kept.append(ptr)
    block_bytes[0] += nbytes
    return True


def release_kept_blocks(device: int | None = None) -> int:
    """Free the blocks kept for reuse on the legacy stream (of one device, or all); the bytes freed."""
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
    block_bytes[0] = sum(n * len(k) for (_, n), k in blocks.items())
    return freed
