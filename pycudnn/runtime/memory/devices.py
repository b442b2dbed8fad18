"""Devices: how many there are (`device_count()`, 0 without a driver; never raises), why none is
usable (`no_device_reason()`), the calling thread's current device (`current_device()`,
`ensure_device()`, `device_guard`, `callers_device()` / `restore_device()`), validating a device
argument (`normalize_device()`), the device that owns a pointer, a device's name and figures,
device-wide waits and memory figures, and the driver's CUDA version, all through the CUDA
driver by ctypes (`driver`).

The current device is the runtime's notion of it (what ``cudaGetDevice`` answers: the device of
the thread's current context, 0 where none is current), so it agrees with PyTorch, CuPy and
cuDNN; making a device current makes its primary context current, as ``cudaSetDevice`` does,
and is skipped when the device already is. `visible_devices` is read by the hot paths (as
``devices.visible_devices``: it is set on the first count) to skip device bookkeeping when
there is only one.
"""

from __future__ import annotations

import operator
import threading
from ctypes import addressof, byref, c_int, c_size_t, c_uint, c_uint64, c_void_p, create_string_buffer
from typing import Any, Protocol, SupportsIndex, Union

from ...errors import NoDeviceError
from . import driver as _driver
from .errors import NO_DRIVER, NO_DRIVER_ADVICE, check_driver, driver_error_text, driver_found

#: how many devices this process sees, once known (None before the first ask); cached once
#: positive: the set of visible devices never changes. The hot paths read it to skip device
#: bookkeeping when there is only one.
visible_devices: int | None = None


class HasDeviceId(Protocol):
    """An object with an integer ``.device_id`` (a cuda.core ``Device``)."""

    @property
    def device_id(self) -> int: ...


DeviceLike = Union[SupportsIndex, HasDeviceId]
"""What `normalize_device()`, and so every pycudnn ``device=`` parameter, accepts (``None``
aside, the current device): a device ordinal as an ``int`` or anything with ``__index__``, or an
object with an integer ``.device_id`` (a cuda.core ``Device``)."""


def _probe_devices() -> tuple[int, str | None]:
    if not driver_found():
        return 0, NO_DRIVER
    drv = _driver.loaded or _driver.driver()
    if not drv:
        return 0, _driver.problem
    if drv.init_status:
        return 0, f"cuInit failed: {driver_error_text(drv.init_status)}"
    n = c_int()
    err = drv.cuDeviceGetCount(byref(n))
    if err:
        return 0, f"cuDeviceGetCount failed: {driver_error_text(err)}"
    if not n.value:
        return 0, "no CUDA-capable device is detected (cuDeviceGetCount returned 0)"
    return n.value, None


def require_driver(what: str) -> Any:
    """The loaded driver (`driver.Driver`), or the NoDeviceError for ``what`` (a driver call)
    where there is none."""
    drv = _driver.loaded
    if drv:
        return drv
    drv = _driver.driver()
    if not drv:
        if not driver_found():
            raise NoDeviceError(f"{what}: {NO_DRIVER}\n{NO_DRIVER_ADVICE}")
        raise NoDeviceError(f"{what}: no usable CUDA device: {_driver.problem}")
    return drv


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
    no NVIDIA driver at all, else the driver's reason (e.g. ``"cuInit failed:
    CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected"``)."""
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
    """The calling thread's current device: that of its current context (``cuCtxGetDevice``),
    0 where no context is current (what ``cudaGetDevice`` answers then)."""
    drv = require_driver("cuCtxGetCurrent")
    ctx = c_void_p()
    err = drv.cuCtxGetCurrent(byref(ctx))
    if err:
        check_driver(err, "cuCtxGetCurrent")
    if not ctx.value:
        return 0
    dev = c_int()
    err = drv.cuCtxGetDevice(byref(dev))
    if err:
        check_driver(err, "cuCtxGetDevice")
    return dev.value


#: device -> its retained primary context (retained once per process and never released, as the
#: CUDA runtime does)
_primary: dict[int, int] = {}
_primary_lock = threading.Lock()


def _primary_context(drv: Any, device: int) -> int:
    ctx = _primary.get(device)
    if ctx is None:
        with _primary_lock:
            ctx = _primary.get(device)
            if ctx is None:
                handle, out = c_int(), c_void_p()
                check_driver(drv.cuDeviceGet(byref(handle), device), f"cuDeviceGet({device})")
                check_driver(drv.cuDevicePrimaryCtxRetain(byref(out), handle.value),
                             f"cuDevicePrimaryCtxRetain({device})")
                ctx = _primary[device] = int(out.value or 0)
    return ctx


def set_device(device: int) -> None:
    """Make ``device``'s primary context current on this thread (what ``cudaSetDevice`` does)."""
    drv = require_driver("cuCtxSetCurrent")
    err = drv.cuCtxSetCurrent(_primary_context(drv, device))
    if err:
        check_driver(err, f"cuCtxSetCurrent(device {device})")


def normalize_device(device: DeviceLike | None, parameter: str = "device", what: str = "pycudnn") -> int:
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
    given: Any = device  # checked here: callers without a type checker pass anything
    if type(given) is int:
        device = given
    else:
        if isinstance(given, bool):
            raise TypeError(f"{parameter}: expected a device ordinal (int), got bool")
        try:
            device = operator.index(given)
        except TypeError:
            dev_id = getattr(given, "device_id", None)
            if type(dev_id) is not int:
                raise TypeError(f"{parameter}: expected a device ordinal (int) or a cuda.core Device, "
                                f"got {type(given).__name__}") from None
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

    Cheap when it is already current: two driver queries. The first call on each thread also
    makes the primary context current once, because 0 is answered on a thread where no context
    was ever made current, and driver-API work (allocations) needs a current context.
    No validation: callers pass an ordinal checked by `normalize_device()`.

    With one device visible, once this thread has bound it there is nothing to ask: it is the
    current device (the hot path of every call skips the driver queries that way).
    """
    if device == 0 and visible_devices == 1:
        try:
            if _tls.bound:
                return 0
        except AttributeError:  # the thread's first call
            pass
    cur = current_device()
    if cur != device or not getattr(_tls, "bound", False):
        set_device(device)
        _tls.bound = True
    return cur


class device_guard:
    """Context manager: ``device`` is current inside, and the previous device is restored after.

    ``with device_guard(1): ...`` costs two driver queries when device 1 is already current.
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
            try:
                set_device(prev)
            except Exception:
                if exc[0] is None:
                    raise


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
    try:
        if current_device() != prev:
            set_device(prev)
    except Exception:  # the call's own result or error matters more than restoring the device
        pass


def pointer_device(ptr: int) -> int:
    """The device that owns the memory at ``ptr`` (``cuPointerGetAttributes``).

    ``ptr == 0`` (an empty array) gives the current device. Where no device is usable at all this
    returns 0 instead of raising: such a tensor cannot be used by any operation anyway, which will
    raise `NoDeviceError` itself. Raises TypeError for plain
    (unregistered) host memory.
    """
    if not visible_devices and not device_count():
        return 0
    if not ptr:
        return current_device()
    drv = require_driver("cuPointerGetAttributes")
    # the plural call answers 0 (not an error) for memory CUDA does not know: plain host memory
    mtype, dev = c_uint(0), c_int(-1)
    attrs = (c_int * 2)(_driver.POINTER_MEMORY_TYPE, _driver.POINTER_DEVICE_ORDINAL)
    data = (c_void_p * 2)(addressof(mtype), addressof(dev))
    err = drv.cuPointerGetAttributes(2, attrs, data, ptr)
    if err:
        check_driver(err, f"cuPointerGetAttributes({ptr:#x})")
    if mtype.value == 0:  # not registered with CUDA: ordinary host memory
        raise TypeError(f"pointer {ptr:#x} is host memory, not CUDA device memory")
    return dev.value


def synchronize(device: DeviceLike | None = None) -> None:
    """Wait for all work on ``device`` (default: the current device)."""
    dev = normalize_device(device)
    with device_guard(dev):
        check_driver(require_driver("cuCtxSynchronize").cuCtxSynchronize(), "cuCtxSynchronize")



def mem_get_info(device: DeviceLike | None = None) -> tuple[int, int]:
    """``(free, total)`` bytes of ``device`` (default: the current device), ``cuMemGetInfo``."""
    dev = normalize_device(device)
    free, total = c_size_t(), c_size_t()
    with device_guard(dev):
        err = require_driver("cuMemGetInfo").cuMemGetInfo(byref(free), byref(total))
        check_driver(err, "cuMemGetInfo")
    return free.value, total.value


def device_identity(device: int) -> dict[str, Any]:
    """``{"name", "compute_capability", "sm_count"}`` of ``device`` (an ordinal checked by
    `normalize_device()`), from the driver's attributes.

    Raises:
        NoDeviceError, CudaError: the driver could not answer.
    """
    drv = require_driver("cuDeviceGetAttribute")
    handle = c_int()
    check_driver(drv.cuDeviceGet(byref(handle), device), f"cuDeviceGet({device})")
    name = create_string_buffer(256)
    check_driver(drv.cuDeviceGetName(name, 256, handle.value), f"cuDeviceGetName({device})")
    values = []
    for attr in (_driver.ATTR_CC_MAJOR, _driver.ATTR_CC_MINOR, _driver.ATTR_MULTIPROCESSOR_COUNT):
        v = c_int()
        check_driver(drv.cuDeviceGetAttribute(byref(v), attr, handle.value),
                     f"cuDeviceGetAttribute({attr}, device {device})")
        values.append(v.value)
    text = name.value.decode("utf-8", "replace").strip()
    return {"name": text, "compute_capability": [values[0], values[1]], "sm_count": values[2]}


def memory_in_use(device: DeviceLike | None = None) -> int:
    """Bytes of device memory this process holds from ``device``'s current stream-ordered
    memory pool (default: the current device), where pycudnn's allocations come from (`allocate`,
    the hot path's ``cuMemAllocAsync``, the blocks kept for reuse): pycudnn's own device memory,
    unlike `mem_get_info`, which other processes on the GPU change. Memory the pool keeps after
    a free is not counted, nor plain ``cuMemAlloc`` blocks on a device without pools. For leak
    checks and monitoring."""
    dev = normalize_device(device)
    drv = require_driver("cuMemPoolGetAttribute")
    handle, pool, used = c_int(), c_void_p(), c_uint64()
    check_driver(drv.cuDeviceGet(byref(handle), dev), f"cuDeviceGet({dev})")
    check_driver(drv.cuDeviceGetMemPool(byref(pool), handle.value), "cuDeviceGetMemPool")
    check_driver(drv.cuMemPoolGetAttribute(pool, _driver.MEMPOOL_USED_MEM_CURRENT, byref(used)),
                 "cuMemPoolGetAttribute(CU_MEMPOOL_ATTR_USED_MEM_CURRENT)")
    return used.value


def device_total_memory(device: int) -> int:
    """Bytes of memory ``device`` (an ordinal checked by `normalize_device()`) has
    (``cuDeviceTotalMem``; makes no context).

    Raises:
        NoDeviceError, CudaError: the driver could not answer.
    """
    drv = require_driver("cuDeviceTotalMem")
    handle, total = c_int(), c_size_t()
    check_driver(drv.cuDeviceGet(byref(handle), device), f"cuDeviceGet({device})")
    check_driver(drv.cuDeviceTotalMem(byref(total), handle.value), f"cuDeviceTotalMem({device})")
    return total.value


def driver_version() -> int | None:
    """The newest CUDA version the installed driver supports (``cuDriverGetVersion``: 1000 *
    major + 10 * minor, e.g. 12080), or None where there is no driver or it cannot say."""
    drv = _driver.loaded or _driver.driver()
    if not drv:
        return None
    v = c_int()
    if drv.cuDriverGetVersion(byref(v)) or not v.value:
        return None
    return v.value
