"""The driver's stream-ordered allocation and free (``cuMemAllocAsync`` / ``cuMemFreeAsync``)
through ctypes, the cheapest there is from Python: `driver_memory()` loads it (False where libcuda
cannot be loaded), and `free_async()` frees ordered on a stream with the right device current.
The hot paths read the loaded one as ``driver.loaded``."""

from __future__ import annotations

from ctypes import addressof as _addressof
from ctypes import c_uint64 as _c_uint64
from typing import Any

from . import bindings as _bindings
from . import devices as _devices
from .devices import device_guard

class _DriverMemory:
    """``cuMemAllocAsync`` / ``cuMemFreeAsync`` from libcuda through ctypes: the cheapest
    stream-ordered allocation there is from Python (a cuda.bindings call converts its arguments
    and builds result objects, about a microsecond more per call). The CUDA driver library is
    loaded when first needed; when it cannot be, callers use cuda.bindings instead."""

    def __init__(self) -> None:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        # CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream); the
        # out-parameter is passed as its address (an int): cheaper to convert than a byref
        self.alloc = lib.cuMemAllocAsync
        self.alloc.restype = ctypes.c_int
        self.alloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        # CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
        self.free = lib.cuMemFreeAsync
        self.free.restype = ctypes.c_int
        self.free.argtypes = [ctypes.c_uint64, ctypes.c_void_p]

        # CUresult cuStreamGetId(CUstream hStream, unsigned long long *streamId): unique per
        # stream for the process's lifetime (CUDA 12.0), unlike the handle, which the driver
        # hands out again once a stream is destroyed
        self.stream_id = getattr(lib, "cuStreamGetId", None)
        if self.stream_id is not None:
            self.stream_id.restype = ctypes.c_int
            self.stream_id.argtypes = [ctypes.c_void_p, ctypes.c_void_p]

    def allocate(self, nbytes: int, stream: int) -> int:
        """A device pointer, or 0 when the driver refused (the caller takes the careful path)."""
        # an out-parameter per call: no lock, and safe when a finalizer or a signal handler
        # allocates on this thread between the call and the read
        out = _c_uint64()
        if self.alloc(_addressof(out), nbytes, stream):
            return 0
        return out.value


loaded: Any = None  # a _DriverMemory once loaded, False where libcuda cannot be; None: not tried


def driver_memory() -> Any:
    global loaded
    if loaded is None:
        try:
            loaded = _DriverMemory()
        except (OSError, AttributeError):
            loaded = False
    return loaded



def free_async(ptr: int, s: int, device: int) -> None:
    """``cuMemFreeAsync(ptr, s)`` with ``device`` current where the handle does not say the device.

    0, 1 and 2 name a stream of the current device: freeing a device-0 buffer on them while
    device 1 is current would order the free on device 1's stream, after none of the work that
    uses the buffer. A created stream belongs to its own device; and with one device visible
    there is no other, so those cases skip the device check (one retry with the device made
    current covers a thread on which no context was ever current). Takes no lock.
    """
    drv = loaded
    if s > 2 or _devices.visible_devices == 1:
        if drv:
            err = drv.free(ptr, s)
        else:
            err = (_bindings.rt or _bindings.runtime()).cudaFreeAsync(ptr, s)[0]
        if not err:
            return
    free_guarded(ptr, s, device)


def free_guarded(ptr: int, s: int, device: int) -> None:
    """The free of `free_async()` with ``device`` made current first (and back after)."""
    drv = loaded
    rt = _bindings.rt or _bindings.runtime()
    with device_guard(device):
        if drv:
            drv.free(ptr, s)
        else:
            rt.cudaFreeAsync(ptr, s)
