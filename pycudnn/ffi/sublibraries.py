"""cuDNN's sub-libraries opened ahead of their first use, on a background thread.

libcudnn.so opens its sub-libraries (the graph API, the heuristics, the engines) the first time a
call needs them: most of a first convolution's time. `start()`, called where a program first
reaches pycudnn's calls, opens them on a daemon thread (``dlopen`` releases the GIL) while the
caller imports pycudnn's modules. It touches no CUDA context, device or stream; a ``fork`` waits
for it; ``PYCUDNN_PRELOAD=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import os
import threading

__all__ = ["SUBLIBRARIES", "enabled", "start", "wait"]

#: the sub-libraries opened, in the order a first convolution needs them (graph API, heuristics,
#: engines), then those of the legacy API and the CNN operations
SUBLIBRARIES = ("libcudnn_graph", "libcudnn_heuristic", "libcudnn_engines_precompiled",
                "libcudnn_engines_runtime_compiled", "libcudnn_engines_tensor_ir", "libcudnn_ops",
                "libcudnn_cnn")

_lock = threading.Lock()
_thread: threading.Thread | None = None
_opened: list[ctypes.CDLL] = []  # kept: the libraries stay open for the process anyway


def enabled() -> bool:
    """Whether `start()` opens anything (``PYCUDNN_PRELOAD`` is not ``0``)."""
    return os.environ.get("PYCUDNN_PRELOAD", "1").strip() != "0"


def start() -> None:
    """Open libcudnn and its sub-libraries on a daemon thread, once per process; returns at
    once. Cheap when already started. A failure is left for the calls to report: they open
    libcudnn themselves and raise what went wrong."""
    global _thread
    if _thread is not None or not enabled():
        return
    with _lock:
        if _thread is not None:
            return
        thread = threading.Thread(target=_open_all, name="pycudnn-sublibraries", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # no thread can start: cuDNN opens them when it needs them
            return
        _thread = thread


def wait(timeout: float | None = None) -> None:
    """Wait for the thread `start()` started (if any) to finish."""
    thread = _thread
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout)


def _open_all() -> None:
    from . import library

    try:
        path = library.lib().path  # the libcudnn the calls use: its own sub-libraries
        major = library.version() // 10000
    except Exception:  # noqa: BLE001 - the calls' own load raises what went wrong
        return
    folder = os.path.dirname(path)
    for name in SUBLIBRARIES:
        file = os.path.join(folder, f"{name}.so.{major}")
        if os.path.exists(file):
            try:
                _opened.append(ctypes.CDLL(file))
            except OSError:  # cuDNN reports it when a call needs that library
                pass


# a child forked while the thread holds the dynamic loader's lock would never get it back
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=wait)
