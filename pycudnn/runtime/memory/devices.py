"""Devices: how many there are (`device_count()`, 0 without a driver; never raises), why none is
usable (`no_device_reason()`), the calling thread's current device (`current_device()`,
`ensure_device()`, `device_guard`, `callers_device()` / `restore_device()`), validating a device
argument (`normalize_device()`), the device that owns a pointer, and device-wide waits and memory
figures.

Everything uses the runtime's notion of the current device (``cudaGetDevice`` /
``cudaSetDevice``, as PyTorch does), so it agrees with PyTorch, CuPy and cuDNN itself, and skips
``cudaSetDevice`` when the device is already current. `visible_devices` is read by the hot
paths (as ``devices.visible_devices``: it is set on the first count) to skip device bookkeeping
when there is only one.
"""

from __future__ import annotations

import operator
import threading
from typing import Any

from ...errors import NoDeviceError
from . import bindings as _bindings
from .errors import DRIVER_HINTS, NO_DRIVER, NO_DRIVER_ADVICE, check_cuda, driver_found, error_text

#: how many devices this process sees, once known (None before the first ask); cached once
#: positive: the set of visible devices never changes. The hot paths read it to skip device
#: bookkeeping when there is only one.
visible_devices: int | None = None


def _probe_devices() -> tuple[int, str | None]:
    if not driver_found():
        return 0, NO_DRIVER
    try:
        err, n = _bindings.runtime().cudaGetDeviceCount()
    except Exception as exc:  # e.g. cuda.pathfinder failing to find libcuda
        return 0, f"cudaGetDeviceCount raised {type(exc).__name__}: {exc}"
    if int(err):
        code = int(err)
        return 0, f"{error_text(code)}{DRIVER_HINTS.get(code, '')}"
    if not n:
        return 0, "cudaErrorNoDevice: no CUDA-capable device is detected (cudaGetDeviceCount returned 0)"
    return int(n), None


def device_count() -> int:
    """Number of visible CUDA devices; 0 where there is no driver or no device. Never raises."""
    global visible_devices
    if visible_devices is not None:
        return visible_devices
    n, _reason = _probe_devices()
    if n:
        visible_devices = n
    return n


def no_device_reason() -> str | None:
    """None when a CUDA device is usable, else why not, in one line: `NO_DRIVER` where there is
    no NVIDIA driver at all, else the CUDA runtime's reason (e.g. ``"cudaErrorNoDevice: no
    CUDA-capable device is detected"``)."""
    if visible_devices:
        return None
    return _probe_devices()[1]


NO_DEVICE_ADVICE = ("; run `pycudnn info` to see why (descriptors and argument checks work "
                    "without a GPU)")


def no_device_error(what: str) -> NoDeviceError:
    """The error for a GPU call (``what``, the public call the user made) on a machine with no
    usable device: without a driver, `NO_DRIVER` then `NO_DRIVER_ADVICE` on a second line; else
    the runtime's reason and `NO_DEVICE_ADVICE`."""
    reason = no_device_reason()
    if reason == NO_DRIVER:
        return NoDeviceError(f"{what}: {NO_DRIVER}\n{NO_DRIVER_ADVICE}")
    return NoDeviceError(f"{what}: no usable CUDA device: {reason}{NO_DEVICE_ADVICE}")


def require_device(what: str = "pycudnn") -> int:
    """The device count, or `NoDeviceError` naming the driver's
    reason when it is 0.

    ``what`` is the public call the user made; the message starts with it and ends with what to
    do next."""
    n = visible_devices or device_count()
    if not n:
        raise no_device_error(what)
    return n


def current_device() -> int:
    """The calling thread's current device (``cudaGetDevice``)."""
    err, dev = (_bindings.rt or _bindings.runtime()).cudaGetDevice()
    if err:
        check_cuda(err, "cudaGetDevice")
    return dev


def normalize_device(device: Any, parameter: str = "device", what: str = "pycudnn") -> int:
    """Validate a device given by the caller and return its ordinal.

    Accepts ``None`` (the current device), an ``int`` (or anything with ``__index__``), or an
    object with an integer ``device_id`` (a cuda.core ``Device``).

    Raises:
        TypeError: not a device.
        ValueError: a negative ordinal or one past the last device.
        NoDeviceError: no usable device at all (with the driver's reason).
    """
    if device is None:
        require_device(what)
        return current_device()
    if type(device) is not int:
        if isinstance(device, bool):
            raise TypeError(f"{parameter}: expected a device ordinal (int), got bool")
        try:
            device = operator.index(device)
        except TypeError:
            dev_id = getattr(device, "device_id", None)
            if type(dev_id) is not int:
                raise TypeError(f"{parameter}: expected a device ordinal (int) or a cuda.core Device, "
                                f"got {type(device).__name__}") from None
            device = dev_id
    if device < 0:
        raise ValueError(f"{parameter}: expected a device ordinal >= 0, got {device}")
    n = require_device(what)
    if device >= n:
        raise ValueError(f"{parameter}: device {device} does not exist; this machine has {n} CUDA "
                         f"device(s) (0..{n - 1})")
    return device


_tls = threading.local()


def ensure_device(device: int) -> int:
    """Make ``device``'s primary context current on this thread; return the previous device.

    Cheap when it is already current: one ``cudaGetDevice``. The first call on each thread also
    calls ``cudaSetDevice`` once, because ``cudaGetDevice`` answers 0 on a thread where no context
    was ever made current, and driver-API work (cuda.core allocations) needs a current context.
    No validation: callers pass an ordinal checked by `normalize_device()`.

    With one device visible, once this thread has bound it there is nothing to ask: it is the
    current device (the hot path of every call skips ``cudaGetDevice`` that way).
    """
    if device == 0 and visible_devices == 1:
        try:
            if _tls.bound:
                return 0
        except AttributeError:  # the thread's first call
            pass
    rt = _bindings.rt or _bindings.runtime()
    err, cur = rt.cudaGetDevice()
    if err:
        check_cuda(err, "cudaGetDevice")
    if cur != device or not getattr(_tls, "bound", False):
        err, = rt.cudaSetDevice(device)
        if err:
            check_cuda(err, f"cudaSetDevice({device})")
        _tls.bound = True
    return cur


class device_guard:
    """Context manager: ``device`` is current inside, and the previous device is restored after.

    ``with device_guard(1): ...`` costs one ``cudaGetDevice`` when device 1 is already current.
    """

    __slots__ = ("device", "_prev")

    def __init__(self, device: int) -> None:
        self.device = device
        self._prev = device

    def __enter__(self) -> int:
        self._prev = ensure_device(self.device)
        return self.device

    def __exit__(self, *exc: Any) -> None:
        prev = self._prev
        if prev != self.device:
            err, = (_bindings.rt or _bindings.runtime()).cudaSetDevice(prev)
            if err and exc[0] is None:
                check_cuda(err, f"cudaSetDevice({prev})")


def callers_device() -> int | None:
    """The calling thread's current device, to give back after a call that may switch it
    (`pycudnn.get_handle()` makes the tensors' device current): the
    public convolution functions leave the caller's device as they found it, like PyTorch's device
    guard. None where only one device is visible, so that the common case costs no CUDA call."""
    n = visible_devices if visible_devices is not None else device_count()
    return current_device() if n > 1 else None


def restore_device(prev: int | None) -> None:
    """Make ``prev`` (from `callers_device()`) current again if a call switched away from it."""
    if prev is None:
        return
    rt = _bindings.rt or _bindings.runtime()
    err, cur = rt.cudaGetDevice()
    if not err and cur != prev:
        rt.cudaSetDevice(prev)


def pointer_device(ptr: int) -> int:
    """The device that owns the memory at ``ptr`` (``cudaPointerGetAttributes``).

    ``ptr == 0`` (an empty array) gives the current device. Where no device is usable at all this
    returns 0 instead of raising: such a tensor cannot be used by any operation anyway, which will
    raise `NoDeviceError` itself. Raises TypeError for plain
    (unregistered) host memory.
    """
    if not visible_devices and not device_count():
        return 0
    if not ptr:
        return current_device()
    rt = _bindings.rt or _bindings.runtime()
    err, attrs = rt.cudaPointerGetAttributes(ptr)
    if err:
        check_cuda(err, f"cudaPointerGetAttributes({ptr:#x})")
    mtype = int(attrs.type)
    if mtype == 0:  # cudaMemoryTypeUnregistered: ordinary host memory
        raise TypeError(f"pointer {ptr:#x} is host memory, not CUDA device memory")
    return int(attrs.device)



def synchronize(device: Any = None) -> None:
    """Wait for all work on ``device`` (default: the current device)."""
    dev = normalize_device(device)
    with device_guard(dev):
        check_cuda((_bindings.rt or _bindings.runtime()).cudaDeviceSynchronize(), "cudaDeviceSynchronize")



def mem_get_info(device: Any = None) -> tuple[int, int]:
    """``(free, total)`` bytes of ``device`` (default: the current device), ``cudaMemGetInfo``."""
    dev = normalize_device(device)
    with device_guard(dev):
        err, free, total = (_bindings.rt or _bindings.runtime()).cudaMemGetInfo()
        check_cuda(err, "cudaMemGetInfo")
    return int(free), int(total)


def memory_in_use(device: Any = None) -> int:
    """Bytes of device memory this process holds from ``device``'s current stream-ordered
    memory pool (default: the current device), where every pycudnn allocation comes from
    (cuda.core's buffers, the hot path's ``cuMemAllocAsync``, the blocks kept for reuse):
    pycudnn's own device memory, unlike `mem_get_info`, which other processes on the GPU change.
    Memory the pool keeps after a free is not counted. For leak checks and monitoring."""
    dev = normalize_device(device)
    rt = _bindings.rt or _bindings.runtime()
    err, pool = rt.cudaDeviceGetMemPool(dev)
    check_cuda(err, "cudaDeviceGetMemPool")
    err, used = rt.cudaMemPoolGetAttribute(pool, rt.cudaMemPoolAttr.cudaMemPoolAttrUsedMemCurrent)
    check_cuda(err, "cudaMemPoolGetAttribute(cudaMemPoolAttrUsedMemCurrent)")
    return int(used)
