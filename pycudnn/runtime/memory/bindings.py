"""``cuda.bindings.runtime``, imported on first use, and whether interpreter shutdown has begun
(when finalizers must touch no CUDA library).

`runtime()` (and `rt` once loaded) is only for naming the statuses of ``cuda.bindings.runtime``
calls made elsewhere (`pycudnn.runtime.memory.errors.check_cuda`): importing it costs ~110 ms,
so nothing on the way to a first result calls it; the runtime layer's own calls go through the
driver by ctypes (`pycudnn.runtime.memory.driver`).
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


#: True once the interpreter has begun to exit: the driver reclaims device memory then, so the
#: finalizers free nothing (the CUDA modules may already be torn down)
shutting_down = False


def _mark_shutdown() -> None:
    global shutting_down
    shutting_down = True


atexit.register(_mark_shutdown)
