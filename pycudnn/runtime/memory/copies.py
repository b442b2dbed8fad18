"""Copies between host and device and fills of device memory (used by
`pycudnn.runtime.tensor`)."""

from __future__ import annotations

from typing import Any

from .errors import check_driver
from .devices import require_driver
from .streams import resolve_stream

def copy_host_to_device(dst_ptr: int, array: Any, stream: Any = None) -> None:
    """Copy a host numpy array's bytes (made C-contiguous first) to ``dst_ptr``, then wait for the
    copy on ``stream`` (the host array may be pageable and temporary)."""
    import numpy as np

    a = np.ascontiguousarray(array)
    n = a.nbytes
    if not n:
        return
    drv = require_driver("cuMemcpyHtoDAsync")
    handle = resolve_stream(stream)
    check_driver(drv.cuMemcpyHtoDAsync(dst_ptr, a.ctypes.data, n, handle),
                 f"cuMemcpyHtoDAsync ({n} bytes)")
    check_driver(drv.cuStreamSynchronize(handle), "cuStreamSynchronize")


def copy_device_to_host(array: Any, src_ptr: int, stream: Any = None) -> None:
    """Copy ``array.nbytes`` bytes from ``src_ptr`` into a C-contiguous, writable numpy ``array``,
    and wait for the copy on ``stream``."""
    if not (array.flags.c_contiguous and array.flags.writeable):
        raise ValueError("array: expected a C-contiguous, writable numpy array")
    n = array.nbytes
    if not n:
        return
    drv = require_driver("cuMemcpyDtoHAsync")
    handle = resolve_stream(stream)
    check_driver(drv.cuMemcpyDtoHAsync(array.ctypes.data, src_ptr, n, handle),
                 f"cuMemcpyDtoHAsync ({n} bytes)")
    check_driver(drv.cuStreamSynchronize(handle), "cuStreamSynchronize")


def memset(ptr: int, nbytes: int, stream: Any = None, value: int = 0) -> None:
    """Fill ``nbytes`` bytes at ``ptr`` with the byte ``value``, ordered on ``stream`` (no sync)."""
    if not nbytes:
        return
    handle = resolve_stream(stream)
    check_driver(require_driver("cuMemsetD8Async").cuMemsetD8Async(ptr, value, nbytes, handle),
                 f"cuMemsetD8Async ({nbytes} bytes)")
