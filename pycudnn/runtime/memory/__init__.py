"""Device memory and CUDA runtime helpers. This package knows nothing of cuDNN.

Its modules, lowest first:

* `bindings`: ``cuda.bindings.runtime`` and cuda.core, imported on first use; the shutdown flag.
* `errors`: `check_cuda()` and the exceptions a runtime status becomes (`CudaError`).
* `devices`: device count and the reason there is none, the current device and its guards,
  device validation, the owner of a pointer, device-wide synchronize, free/total memory and
  the memory this process holds from the device's pool.
* `driver`: the driver's ``cuMemAllocAsync`` / ``cuMemFreeAsync`` through ctypes.
* `streams`: `resolve_stream()` and `StreamLike`, stream waits, thread tokens, stream ids.
* `capture`: whether a stream is being captured, and the relaxed capture-mode block.
* `copies`: host/device copies and fills.
* `pool`: the blocks kept for reuse on the legacy default stream.
* `buffers`: `allocate()` and `DeviceBuffer` through cuda.core's pool; `empty_cache()`.
* `stream_allocation`: the hot path's `allocate_fast()` and its `StreamAllocation`.
* `workspaces`: per-thread workspaces and the zeros every stream may read.

Only ``cuda.bindings.runtime`` calls whose signatures are the same in cuda-bindings 12.x and 13.x
are used. The names below are the public ones; the rest are imported from their modules.
"""

from .buffers import MAX_ALLOCATION, DeviceBuffer, allocate, empty_cache
from .capture import relaxed_capture_mode, stream_is_capturing
from .copies import copy_device_to_host, copy_host_to_device, memset
from .devices import (callers_device, current_device, device_count, device_guard, ensure_device,
                      mem_get_info, memory_in_use, no_device_reason, normalize_device,
                      pointer_device, restore_device, synchronize)
from .errors import CudaError, check_cuda
from .stream_allocation import allocate_fast
from .streams import (HasCudaStreamHandle, HasStreamPointer, StreamLike, SupportsCudaStream,
                      resolve_stream, stream_synchronize, stream_wait, thread_token)

__all__ = [
    "CudaError", "check_cuda", "device_count", "no_device_reason", "normalize_device",
    "current_device", "ensure_device", "device_guard", "callers_device", "restore_device",
    "DeviceBuffer", "allocate", "allocate_fast", "thread_token",
    "mem_get_info", "memory_in_use", "relaxed_capture_mode", "stream_is_capturing", "synchronize",
    "stream_synchronize", "stream_wait",
    "resolve_stream", "StreamLike", "SupportsCudaStream", "HasCudaStreamHandle", "HasStreamPointer",
    "copy_host_to_device", "copy_device_to_host", "memset", "pointer_device",
    "empty_cache", "MAX_ALLOCATION",
]
