"""Memory a call borrows: per-thread workspaces (`thread_workspace()`, reused per device and
stream, keyed by the stream's driver id) and the zeros every stream may read
(`shared_zeros()`, never freed)."""

from __future__ import annotations

import threading
from typing import Any

from .buffers import allocate
from .capture import stream_is_capturing
from .copies import memset
from .devices import device_guard
from .stream_allocation import allocate_fast
from .streams import stream_identity, stream_synchronize

_tls = threading.local()


def thread_workspace(nbytes: int, device: int, stream: int) -> int:
    """A workspace pointer of at least ``nbytes`` owned by this thread for (device, stream).

    Reused across calls (uses on one stream are ordered, so reuse is safe) and grown when a larger
    one is asked. Never use it while the stream is being captured into a CUDA graph: the graph
    would keep an address this cache may free later.

    Keyed by the stream's driver id as well as its handle: a destroyed stream's handle can come
    back for a new stream, whose work is not ordered after the old one's, so a workspace of the
    old stream is freed (synchronously: its stream is gone) and a new one made.
    """
    if nbytes == 0:
        return 0
    cache = getattr(_tls, "workspaces", None)
    if cache is None:
        cache = _tls.workspaces = {}
    key = (device, stream)
    entry = cache.get(key)
    ident = stream_identity(stream)
    if entry is not None and entry[0] != ident:
        # the handle of a stream that no longer exists, now another stream's
        del cache[key]
        entry[1].free_synchronously()
        entry = None
    if entry is None or entry[1].nbytes < nbytes:
        if entry is not None:
            entry[1].close()  # on its own stream, which is in use right now
            del cache[key]
        while len(cache) >= THREAD_WORKSPACES_MAX:
            # the stream of an old entry may be gone: free it synchronously, not ordered on it
            cache.pop(next(iter(cache)))[1].free_synchronously()
        ws = allocate_fast(max(nbytes, 1 << 20), device, stream, sync_free=True)
        cache[key] = (ident, ws)
        return int(ws.ptr)
    return int(entry[1].ptr)


#: per thread, workspaces of at most this many (device, stream) pairs are kept
THREAD_WORKSPACES_MAX = 4


# ---- zeros that every stream may read ------------------------------------------------------------

_zeros: dict[int, tuple[int, int]] = {}  # device -> (address, bytes) of its largest zero buffer
_zeros_kept: list[Any] = []  # every zero buffer made: never freed (a launch anywhere may read one)
_zeros_lock = threading.Lock()


def shared_zeros(nbytes: int, device: int, stream: int) -> int | None:
    """The address of at least ``nbytes`` zero bytes on ``device``, readable from any stream.

    Made on first use per device (and again, twice as large, when a larger one is asked): filled
    on ``stream`` and waited for before the address is returned, so the zeros are complete for
    work queued afterwards on any stream; never written again and never freed while the process
    runs, so no launch on any stream can read it freed or refilled. The sizes double, so all of
    them together stay below twice the largest asked for. One dict lookup once made.

    None while ``stream`` is being captured into a CUDA graph and no buffer large enough exists
    (nothing can be waited for during a capture): the caller makes its own zeros for that call.
    """
    entry = _zeros.get(device)
    if entry is not None and entry[1] >= nbytes:
        return entry[0]
    with _zeros_lock:
        entry = _zeros.get(device)
        if entry is not None and entry[1] >= nbytes:
            return entry[0]
        size = max(256, 1 << (max(nbytes, 1) - 1).bit_length())
        with device_guard(device):
            if stream_is_capturing(stream):
                return None
            buf = allocate(size, device, stream)
            memset(buf.ptr, size, stream)
            stream_synchronize(stream)
        _zeros_kept.append(buf)
        _zeros[device] = (buf.ptr, size)
        return buf.ptr
