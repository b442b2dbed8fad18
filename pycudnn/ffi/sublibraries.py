"""cuDNN's sub-libraries opened ahead of their first use, on a background thread.

libcudnn.so opens its sub-libraries (the graph API, the heuristics, the engines) the first time a
call needs them. ``import pycudnn.torch`` and ``import pycudnn.cupy_compat`` call `start()`, which
opens them on a daemon thread (libc's ``dlopen``, called without the GIL) while the program
builds its model and data. It touches no CUDA context, device or stream; a ``fork`` waits for
it; ``PYCUDNN_PRELOAD=0`` turns it off.
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
_opened: list[int] = []  # dlopen handles, never closed: the libraries stay open for the process


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
        # libc's dlopen through a ctypes call, which releases the GIL (ctypes.CDLL's own dlopen
        # holds it: the caller's imports would wait for every library)
        dlopen = ctypes.CDLL(None).dlopen
    except Exception:  # noqa: BLE001 - the calls' own load raises what went wrong
        return
    dlopen.restype = ctypes.c_void_p
    dlopen.argtypes = [ctypes.c_char_p, ctypes.c_int]
    folder = os.path.dirname(path)
    for name in SUBLIBRARIES:
        file = os.path.join(folder, f"{name}.so.{major}")
        if os.path.exists(file):
            # RTLD_NOW: the symbols are bound here, not in the first call; a library that does
            # not open (NULL) is reported by cuDNN when a call needs it
            handle = dlopen(os.fsencode(file), os.RTLD_NOW | os.RTLD_LOCAL)
            if handle:
                _opened.append(handle)


# a child forked while the thread holds the dynamic loader's lock would never get it back
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=wait)
