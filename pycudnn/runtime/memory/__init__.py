"""Device memory and CUDA runtime helpers; nothing of cuDNN. Its modules, lowest first:
`bindings` (``cuda.bindings.runtime`` on first use, for status names; the shutdown flag);
`driver` (the CUDA driver by ctypes: the prototype table every call below goes through);
`errors` (`check_driver()` / `check_cuda()`, `CudaError`); `devices` (count, the reason there is
none, the current device and its guards, validation (`DeviceLike`), a pointer's owner,
synchronize, free/total memory, the memory this process holds from the pool); `streams`
(`resolve_stream()`, `stream_pair()`, `StreamLike`, waits, events, thread tokens, stream ids);
`capture` (capture status, the relaxed capture-mode block); `copies` (host/device copies and
fills); `pool` (blocks kept for reuse on the stream they were dropped on; every stream-ordered
free); `buffers` (`allocate()`, `DeviceBuffer`, `empty_cache()`); `stream_allocation` (the hot
path's `allocate_fast()`; `allocate_kept_first()` for the tensor factories); `workspaces`
(per-thread workspaces, zeros every stream may read); `replay` (launches replayed from graphs).

None imports ``cuda.bindings`` or cuda.core (each costs 100-130 ms of a first result). The
names below are the public ones; the rest are imported from their modules.
"""

from .buffers import MAX_ALLOCATION, DeviceBuffer, allocate, empty_cache
from .capture import relaxed_capture_mode, stream_is_capturing
from .copies import copy_device_to_host, copy_host_to_device, memset
from .devices import (DeviceLike, HasDeviceId, callers_device, current_device, device_count, device_guard, device_identity,
                      ensure_device, mem_get_info, memory_in_use, no_device_reason,
                      normalize_device, pointer_device, restore_device, synchronize)
from .errors import CudaError, check_cuda, check_driver
from .stream_allocation import allocate_fast, allocate_kept_first
from .streams import (HasCudaStreamHandle, HasStreamPointer, StreamLike, SupportsCudaStream,
                      event_create, event_destroy, event_elapsed_ms, event_query, event_record,
                      event_synchronize, resolve_stream, stream_pair, stream_synchronize,
                      stream_wait, thread_token)

__all__ = [
    "CudaError", "check_cuda", "check_driver", "DeviceLike", "HasDeviceId", "device_count", "device_identity",
    "no_device_reason", "normalize_device",
    "current_device", "ensure_device", "device_guard", "callers_device", "restore_device",
    "DeviceBuffer", "allocate", "allocate_fast", "allocate_kept_first", "thread_token",
    "mem_get_info", "memory_in_use", "relaxed_capture_mode", "stream_is_capturing", "synchronize",
    "stream_synchronize", "stream_wait", "event_create", "event_record", "event_query",
    "event_synchronize", "event_elapsed_ms", "event_destroy",
    "resolve_stream", "stream_pair", "StreamLike", "SupportsCudaStream", "HasCudaStreamHandle", "HasStreamPointer",
    "copy_host_to_device", "copy_device_to_host", "memset", "pointer_device",
    "empty_cache", "MAX_ALLOCATION",
]
