"""CUDA graph capture: whether a stream is being captured (`stream_is_capturing()`; its hot-path
form `is_capturing()`), and a block in relaxed capture mode (`relaxed_capture_mode()`) for code
that builds but queues no work."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from ctypes import byref, c_int

from . import driver as _driver
from .errors import check_driver
from .devices import require_driver
from .streams import resolve_stream

def stream_is_capturing(stream: Any) -> bool:
    """Whether ``stream`` is being captured into a CUDA graph (``cuStreamIsCapturing``; an
    invalidated capture counts as capturing)."""
    handle = resolve_stream(stream)
    status = c_int()
    err = require_driver("cuStreamIsCapturing").cuStreamIsCapturing(handle, byref(status))
    if err:
        check_driver(err, "cuStreamIsCapturing")
    return status.value != 0


def is_capturing(stream: int) -> bool:
    """`stream_is_capturing` for a hot path: ``stream`` already a handle, the driver loaded,
    and True also when the driver cannot say (the caller then launches as it would inside a
    capture) rather than an error."""
    status = c_int()
    if _driver.loaded.cuStreamIsCapturing(stream, byref(status)):
        return True
    return status.value != 0


@contextlib.contextmanager
def relaxed_capture_mode() -> Iterator[None]:
    """A block in which the calling thread is in CUDA's relaxed stream-capture mode.

    While a thread captures a CUDA graph in global mode (PyTorch's default), CUDA refuses calls
    it deems unsafe (a module load, some allocations) from every thread in global mode, that
    one included, and such a call invalidates the capture. Code that only builds (cuDNN's
    runtime-compiled plans load a module when they are finalized) and queues no work runs in
    this block so it cannot break someone's capture. The thread's earlier mode is restored at
    the end. Without a driver the block runs as it is.
    """
    drv = _driver.loaded or _driver.driver()
    mode = c_int(_driver.CAPTURE_MODE_RELAXED)
    # the call swaps: ``mode`` holds the thread's earlier mode afterwards
    swapped = bool(drv) and not drv.cuThreadExchangeStreamCaptureMode(byref(mode))
    try:
        yield
    finally:
        if swapped:
            drv.cuThreadExchangeStreamCaptureMode(byref(mode))
