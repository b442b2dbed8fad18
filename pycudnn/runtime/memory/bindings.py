"""The CUDA modules the runtime layer calls, imported on first use, and whether interpreter
shutdown has begun (when finalizers must touch none of them).

``cuda.bindings.runtime`` is `runtime()` (and `rt` once loaded: the hot paths read
``bindings.rt or bindings.runtime()``); cuda.core is `core()` (it takes ~0.4 s to import, so it is
first imported by the first allocation). Tests swap `rt` for a made-up runtime.
"""

from __future__ import annotations

import atexit
from typing import Any

#: ``cuda.bindings.runtime`` once `runtime()` has imported it
rt: Any = None


def runtime() -> Any:
    """``cuda.bindings.runtime``, imported on the first call."""
    global rt
    if rt is None:
        from cuda.bindings import runtime as module

        rt = module
    return rt


_cc: Any = None


def core() -> Any:
    """The cuda.core namespace (top-level from cuda-core 1.0; ``cuda.core.experimental`` before)."""
    global _cc
    if _cc is None:
        import cuda.core as cc

        if not hasattr(cc, "Device"):  # cuda-core < 1.0 kept everything under .experimental
            import cuda.core.experimental as cc
        _cc = cc
    return _cc


#: True once the interpreter has begun to exit: the driver reclaims device memory then, so the
#: finalizers free nothing (the CUDA modules may already be torn down)
shutting_down = False


def _mark_shutdown() -> None:
    global shutting_down
    shutting_down = True


atexit.register(_mark_shutdown)
