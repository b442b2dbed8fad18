"""cuDNN handles: one per (thread, device), created lazily, pooled across threads.

A handle must not be used by two threads at the same moment (ctypes releases the GIL around
every call) and creating one costs milliseconds, so pycudnn does what PyTorch's
``DeviceThreadHandlePool`` does: each thread keeps its handles in a ``threading.local`` dict
keyed by device; when the thread ends, a ``weakref.finalize`` (which holds the dict, never the
object) puts them back into a global pool; a thread takes a handle from the pool before creating
one. Handles are never destroyed, not at thread end and not at interpreter exit:
``cudnnDestroy`` from an exit handler can run after the CUDA driver began shutting down and
crash the process (PyTorch leaks them on purpose too); the driver reclaims them at exit.

`get_handle()` also makes the device current and sets the caller's stream on the handle with
``cudnnSetStream`` (as PyTorch's ``getCudnnHandle()`` does), skipping the call when the stream is
the one last set on that handle by this thread.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import gc
import threading
import weakref
from typing import Any, Callable, Iterator

from ..errors import CudnnError, NoDeviceError
from ..ffi import library as _lib
from .memory import devices as _devices
from .memory.devices import DeviceLike, device_count
from .memory.streams import StreamLike, resolve_stream

__all__ = ["get_handle", "device_count", "live_handle_count", "pooled_handle_count"]

_pool_lock = threading.Lock()
_pool: dict[int, list[int]] = {}     # device -> handles no thread holds
_RETURNED: collections.deque = collections.deque()  # (device, handle) from finished threads
_created: dict[int, int] = {}        # device -> handles ever created (none is ever destroyed)
_tls = threading.local()
_set_stream_fn: Any = None           # lib().cudnnSetStream, bound on first use

# cuDNN statuses that mean "cannot initialise here" rather than a bug: the NOT_INITIALIZED family
# (1xxx) and the incompatible driver / runtime / architecture / prerequisite ones.
_INIT_FAILURES = frozenset({3005, 3006, 3007, 3008})


def _give_back(handles: dict[int, int], returned: collections.deque) -> None:
    """Finalizer of a thread's handle set: queue its handles for the pool. It refers neither to
    the thread's object nor to module globals (the queue is bound in), and takes no lock: a
    finalizer can run inside any allocation, even one made while this thread holds
    ``_pool_lock`` (see pycudnn._live); ``deque.append`` is atomic."""
    for device, handle in list(handles.items()):
        returned.append((device, handle))
    handles.clear()


def _take_returned() -> None:
    """Move handles queued by finished threads into the pool (``_pool_lock`` held)."""
    while _RETURNED:
        device, handle = _RETURNED.popleft()  # only lock holders pop: never empty here
        _pool.setdefault(device, []).append(handle)


class _ThreadHandles:
    """The calling thread's handles (device -> handle) and the stream last set on each."""

    __slots__ = ("handles", "streams", "__weakref__")

    def __init__(self) -> None:
        self.handles: dict[int, int] = {}
        self.streams: dict[int, int] = {}
        fin = weakref.finalize(self, _give_back, self.handles, _RETURNED)
        fin.atexit = False  # at exit nothing needs pooling, and handles are never destroyed


def _thread_handles() -> _ThreadHandles:
    try:
        return _tls.state
    except AttributeError:
        state = _tls.state = _ThreadHandles()
        return state


def _create(device: int) -> int:
    """``cudnnCreate`` on ``device`` (already current). Raises NoDeviceError when cuDNN cannot
    initialise there, with cuDNN's reason."""

    out = ctypes.c_void_p()
    status = _lib.lib().cudnnCreate(ctypes.byref(out))
    if status:
        try:
            _lib.raise_status(status, "cudnnCreate")
        except CudnnError as err:
            if status // 1000 == 1 or status in _INIT_FAILURES:
                raise NoDeviceError(f"get_handle: cuDNN could not initialise on device {device}: "
                                    f"{err}") from err
            raise
    if not out.value:
        raise NoDeviceError(f"get_handle: cudnnCreate returned a null handle on device {device}")
    with _pool_lock:
        _created[device] = _created.get(device, 0) + 1
    return out.value


def _set_stream(handle: int, stream: int) -> None:
    global _set_stream_fn
    fn = _set_stream_fn
    if fn is None:

        fn = _set_stream_fn = _lib.lib().cudnnSetStream
    status = fn(handle, stream)
    if status:

        _lib.raise_status(status, "cudnnSetStream", f"  stream: {stream:#x}")


def set_handle_stream(handle: int, stream: int) -> None:
    """``cudnnSetStream(handle, stream)`` for a moment: a launch captured on a private stream
    sets the stream `get_handle()` last set (which it does not record) back right after."""
    _set_stream(handle, stream)


def _acquire(device: DeviceLike | None, state: _ThreadHandles) -> tuple[int, int]:
    """Cache miss: validate the device, make it current, take a pooled handle or create one."""
    dev = _devices.normalize_device(device, what="get_handle")  # NoDeviceError before cudnnCreate
    handle = state.handles.get(dev)
    if handle is not None:  # device was given in another spelling (e.g. a cuda.core Device)
        _devices.ensure_device(dev)
        return dev, handle
    _devices.ensure_device(dev)
    with _pool_lock:
        _take_returned()
        free = _pool.get(dev)
        handle = free.pop() if free else None
    if handle is None:
        handle = _create(dev)
    state.handles[dev] = handle
    state.streams.pop(dev, None)  # the stream on a pooled handle is unknown: set it on first use
    return dev, handle


def get_handle(device: DeviceLike | None = None, stream: StreamLike | None = None) -> int:
    """This thread's cuDNN handle for ``device``, with ``stream`` set on it.

    Args:
        device: device ordinal (default: the current device); the device is made current.
        stream: anything `pycudnn.runtime.memory.resolve_stream()` accepts (default: the legacy
            default stream).

    Returns:
        The ``cudnnHandle_t`` as an int.

    Raises:
        NoDeviceError: no driver or no device (the driver's reason is in the message), or cuDNN
            could not initialise (cuDNN's reason).
        ValueError: a device ordinal that does not exist.
    """
    try:
        state = _tls.state
    except AttributeError:
        state = _thread_handles()
    if device is None:
        try:
            device = _devices.current_device()
        except NoDeviceError as exc:
            if _devices.no_device_reason():
                raise _devices.no_device_error("get_handle") from None
            raise NoDeviceError(f"get_handle: {exc}") from None
    handle = None
    if type(device) is int:
        handle = state.handles.get(device)
        if handle is not None:
            _devices.ensure_device(device)
    if handle is None:
        device, handle = _acquire(device, state)
    # the hot callers pass the int handle already set: converted only when it is another stream
    if state.streams.get(device, -1) != stream:
        s = resolve_stream(stream)
        if state.streams.get(device, -1) != s:
            _set_stream(handle, s)
            state.streams[device] = s
    return handle


def live_handle_count(device: int | None = None) -> int:
    """Handles created so far (on ``device``, or on all devices); none is ever destroyed."""
    with _pool_lock:
        if device is None:
            return sum(_created.values())
        return _created.get(device, 0)


def pooled_handle_count(device: int | None = None) -> int:
    """Handles in the pool, waiting for a thread (on ``device``, or on all devices)."""
    with _pool_lock:
        _take_returned()
        if device is None:
            return sum(len(v) for v in _pool.values())
        return len(_pool.get(device, ()))


def thread_handle_count() -> int:
    """Handles the calling thread holds (one per device it used)."""
    state = getattr(_tls, "state", None)
    return len(state.handles) if state is not None else 0


def thread_handles() -> dict[int, int]:
    """The calling thread's handles, device -> handle (a copy). A seam for tests and tooling:
    which devices this thread used."""
    state = getattr(_tls, "state", None)
    return dict(state.handles) if state is not None else {}


def pooled_handles(device: int) -> list[int]:
    """The handles in the pool for ``device``, those of finished threads included (a copy). A seam
    for tests and tooling: whether a thread's handle came back."""
    with _pool_lock:
        _take_returned()
        return list(_pool.get(device, ()))


@contextlib.contextmanager
def isolated_handles(create: Callable[[int], int],
                     set_stream: Callable[[int, int], None]) -> Iterator[None]:
    """A seam for tests and tooling that run the pooling logic without cuDNN. Inside the block
    handles come from ``create(device)`` (counted as created) and ``set_stream(handle, stream)``
    stands for ``cudnnSetStream``; the pool, the creation counts and every thread's handles start
    empty. After it the real ones come back and the block's handles are dropped."""
    global _create, _set_stream, _tls

    def counted(device: int) -> int:
        handle = create(device)
        with _pool_lock:
            _created[device] = _created.get(device, 0) + 1
        return handle

    def stream_set(handle: int, stream: int) -> None:
        set_stream(handle, stream)

    saved = (_create, _set_stream, _tls)
    with _pool_lock:
        _take_returned()  # real handles queued by ended threads belong to the saved pool
        pool = {k: list(v) for k, v in _pool.items()}
        created = dict(_created)
        _pool.clear()
        _created.clear()
    block_tls = threading.local()
    _create, _set_stream, _tls = counted, stream_set, block_tls
    try:
        yield
    finally:
        vars(block_tls).clear()  # this thread's handles are queued now, not after the restore
        gc.collect()
        _create, _set_stream, _tls = saved
        with _pool_lock:
            _take_returned()  # the block's threads' handles: dropped with the block's pool
            _pool.clear()
            _pool.update(pool)
            _created.clear()
            _created.update(created)
