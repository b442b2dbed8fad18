"""CUDA graph capture: whether a stream is being captured (`stream_is_capturing()`), and a block
in relaxed capture mode (`relaxed_capture_mode()`) for code that builds but queues no work."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from . import bindings as _bindings
from .errors import check_cuda
from .streams import resolve_stream

def stream_is_capturing(stream: Any) -> bool:
    """Whether ``stream`` is being captured into a CUDA graph (``cudaStreamIsCapturing``; an
    invalidated capture counts as capturing)."""
    handle = stream if type(stream) is int else resolve_stream(stream)
    err, status = (_bindings.rt or _bindings.runtime()).cudaStreamIsCapturing(handle)
    if err:
        check_cuda(err, "cudaStreamIsCapturing")
    return int(status) != 0


@contextlib.contextmanager
def relaxed_capture_mode() -> Iterator[None]:
    """A block in which the calling thread is in CUDA's relaxed stream-capture mode.

    While a thread captures a CUDA graph in global mode (PyTorch's default), CUDA refuses calls
    it deems unsafe (a module load, some allocations) from every thread in global mode, that
    one included, and such a call invalidates the capture. Code that only builds (cuDNN's
    runtime-compiled plans load a module when they are finalized) and queues no work runs in
    this block so it cannot break someone's capture. The thread's earlier mode is restored at
    the end. Without the mode (an old binding) the block runs as it is.
    """
    rt = _bindings.rt or _bindings.runtime()
    try:
        err, previous = rt.cudaThreadExchangeStreamCaptureMode(
            rt.cudaStreamCaptureMode.cudaStreamCaptureModeRelaxed)
        swapped = not err
    except Exception:  # an old driver or binding: the default mode stays
        swapped = False
    try:
        yield
    finally:
        if swapped:
            rt.cudaThreadExchangeStreamCaptureMode(previous)
