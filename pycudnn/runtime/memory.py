"""Device memory and CUDA runtime helpers. This module knows nothing of cuDNN.

* **Errors.** `check_cuda()` turns a ``cuda.bindings.runtime`` status into a Python exception:
  no driver / no device -> `NoDeviceError` naming the driver's
  reason, ``cudaErrorMemoryAllocation`` -> `OutOfMemoryError`,
  anything else -> `CudaError`.
* **Devices.** `device_count()` (0 where there is no driver; never
  raises), `current_device()`, `ensure_device()` and the `device_guard` context manager. Both use
  the runtime's notion of the current device (``cudaGetDevice`` / ``cudaSetDevice``, as PyTorch
  does), so they agree with PyTorch, CuPy and cuDNN itself, and they skip ``cudaSetDevice`` when the
  device is already current.
* **Streams.** `resolve_stream()` turns whatever the caller gave into a ``cudaStream_t``
  handle (an ``int``); ``None`` is the legacy default stream, ``0``.
* **Memory.** `allocate()` returns a `DeviceBuffer` from cuda.core's stream-ordered
  memory resource of the device (``Device(i).memory_resource``, the driver's memory pool).

Only ``cuda.bindings.runtime`` calls whose signatures are the same in cuda-bindings 12.x and 13.x
are used, and cuda.core is imported on the first allocation (it takes ~0.4 s to import).
"""

from __future__ import annotations

import contextlib
import operator
import threading
import weakref
from ctypes import addressof as _addressof
from ctypes import c_uint64 as _c_uint64
from typing import Any, Callable, Iterator, Protocol, SupportsIndex, Union

from ..errors import NoDeviceError, OutOfMemoryError, PycudnnError

__all__ = [
    "CudaError", "check_cuda", "device_count", "no_device_reason", "normalize_device",
    "current_device", "ensure_device", "device_guard", "callers_device", "restore_device",
    "DeviceBuffer", "allocate", "thread_token",
    "mem_get_info", "relaxed_capture_mode", "stream_is_capturing", "synchronize",
    "stream_synchronize", "stream_wait",
    "resolve_stream", "StreamLike", "SupportsCudaStream", "HasCudaStreamHandle", "HasStreamPointer",
    "copy_host_to_device", "copy_device_to_host", "memset", "pointer_device",
    "empty_cache", "MAX_ALLOCATION",
]

#: Allocations from this size up are refused as out of memory without asking the driver: cuDNN
#: sometimes reports workspace sizes near 2^64 (PyTorch's Conv_v7.cpp applies the same 1 TiB rule).
MAX_ALLOCATION = 1 << 40

LEGACY_DEFAULT_STREAM = 0  #: what ``None`` resolves to (``cudaStreamLegacy`` is 1, the same stream)


class SupportsCudaStream(Protocol):
    """An object following the CUDA stream protocol (cuda.core ``Stream``, recent CuPy and
    PyTorch streams, Numba): ``__cuda_stream__()`` gives ``(version, handle)``."""

    def __cuda_stream__(self) -> tuple[int, int]: ...


class HasCudaStreamHandle(Protocol):
    """An object with an integer ``.cuda_stream`` (``torch.cuda.Stream``,
    ``torch.cuda.ExternalStream``)."""

    @property
    def cuda_stream(self) -> int: ...


class HasStreamPointer(Protocol):
    """An object with an integer ``.ptr`` (``cupy.cuda.Stream``)."""

    @property
    def ptr(self) -> int: ...


StreamLike = Union[int, SupportsCudaStream, HasCudaStreamHandle, HasStreamPointer, SupportsIndex]
"""What `resolve_stream()`, and so every pycudnn function's ``stream=``, accepts (``None``
aside, the legacy default stream): a raw ``cudaStream_t`` handle as an int, an object with
``__cuda_stream__``, ``.cuda_stream`` or ``.ptr`` (cuda.core, PyTorch, CuPy, Numba streams), or
anything with ``__index__`` (cuda.bindings ``CUstream`` / ``cudaStream_t``)."""


class CudaError(PycudnnError):
    """A CUDA runtime call failed for a reason other than "no device" or "out of memory".

    Attributes:
        code: the ``cudaError_t`` value.
        what: the call (or operation) that failed.
    """

    def __init__(self, code: int, what: str, text: str = "") -> None:
        self.code = int(code)
        self.what = what
        super().__init__(f"{what} failed: {text or f'cudaError {code}'}")

    def __reduce__(self) -> tuple[Callable[[int, str, str], CudaError], tuple[int, str, str]]:
        return (_rebuild_cuda_error, (self.code, self.what, str(self)))


def _rebuild_cuda_error(code: int, what: str, message: str) -> "CudaError":
    err = CudaError.__new__(CudaError)
    err.code, err.what = code, what
    PycudnnError.__init__(err, message)
    return err


# ---- the runtime module, imported on first use ----------------------------------------------------

_rt: Any = None


def _runtime() -> Any:
    global _rt
    if _rt is None:
        from cuda.bindings import runtime

        _rt = runtime
    return _rt


_cc: Any = None


def _core() -> Any:
    """The cuda.core namespace (top-level from cuda-core 1.0; ``cuda.core.experimental`` before)."""
    global _cc
    if _cc is None:
        import cuda.core as cc

        if not hasattr(cc, "Device"):  # cuda-core < 1.0 kept everything under .experimental
            import cuda.core.experimental as cc
        _cc = cc
    return _cc


# ---- errors ---------------------------------------------------------------------------------------

_NO_DEVICE_NAMES = (
    "cudaErrorInitializationError", "cudaErrorStubLibrary", "cudaErrorInsufficientDriver",
    "cudaErrorCallRequiresNewerDriver", "cudaErrorDevicesUnavailable", "cudaErrorNoDevice",
    "cudaErrorSystemNotReady", "cudaErrorSystemDriverMismatch",
    "cudaErrorCompatNotSupportedOnDevice", "cudaErrorDeviceUninitialized",
)
_no_device_codes: frozenset[int] | None = None
_OOM_CODE = 2  # cudaErrorMemoryAllocation
_INVALID_DEVICE = 101  # cudaErrorInvalidDevice

_HINTS = {
    35: " (the NVIDIA driver is older than this CUDA runtime: install a newer driver, or the "
        "cuda-python of the driver's CUDA major, e.g. pycudnn-ctypes[cu12] for a 12.x driver)",
    34: " (the process loaded the CUDA driver stub library instead of the real driver)",
}

#: The first line of every "no device" error where the NVIDIA driver library itself is absent (a
#: machine without an NVIDIA GPU, a container started without GPU access): the CUDA runtime's own
#: words for it ("cudaErrorInsufficientDriver: CUDA driver version is insufficient ...") mislead.
NO_DRIVER = "no NVIDIA driver found (libcuda.so.1)"
#: ... and its second line: what to do.
NO_DRIVER_ADVICE = ("this call needs an NVIDIA GPU and its driver: run it on a machine that has "
                    "both (start a container with GPU access, e.g. `docker run --gpus all`); "
                    "descriptors, shapes and argument checks work without a GPU, and "
                    "`pycudnn info` shows what pycudnn found")
_driver_found: bool | None = None


def driver_found() -> bool:
    """Whether the NVIDIA driver library (``libcuda.so.1``) loads in this process (asked once)."""
    global _driver_found
    if _driver_found is None:
        import ctypes

        try:
            ctypes.CDLL("libcuda.so.1")
            _driver_found = True
        except OSError:
            _driver_found = False
    return _driver_found


def _no_device_set() -> frozenset[int]:
    global _no_device_codes
    if _no_device_codes is None:
        rt = _runtime()
        codes = {3, 34, 35, 36, 46, 100, 201, 802, 803, 804}
        for name in _NO_DEVICE_NAMES:
            value = getattr(rt.cudaError_t, name, None)
            if value is not None:
                codes.add(int(value))
        _no_device_codes = frozenset(codes)
    return _no_device_codes


def error_text(code: int) -> str:
    """``"cudaErrorName: description"`` for a ``cudaError_t`` value."""
    try:
        rt = _runtime()
        err = rt.cudaError_t(int(code))
        name = rt.cudaGetErrorName(err)[1]
        desc = rt.cudaGetErrorString(err)[1]
        name = name.decode() if isinstance(name, bytes) else str(name)
        desc = desc.decode() if isinstance(desc, bytes) else str(desc)
        return f"{name}: {desc}"
    except Exception:  # an unknown code, or a runtime that cannot even name errors
        return f"cudaError {int(code)}"


def cuda_error(err: Any, what: str) -> Exception:
    """The exception `check_cuda()` raises for a failed ``err`` (not raised here)."""
    code = int(err)
    text = error_text(code)
    if code in _no_device_set():
        if not driver_found():
            return NoDeviceError(f"{what}: {NO_DRIVER}\n{NO_DRIVER_ADVICE}")
        return NoDeviceError(f"{what}: no usable CUDA device: {text}{_HINTS.get(code, '')}")
    if code == _INVALID_DEVICE:
        return NoDeviceError(f"{what}: {text} (this machine has {device_count()} CUDA device(s))")
    if code == _OOM_CODE:
        return OutOfMemoryError(f"{what}: out of device memory: {text}")
    return CudaError(code, what, text)


def check_cuda(err: Any, what: str) -> None:
    """Raise if ``err`` (a ``cudaError_t``, an int, or a result tuple whose first item is one)
    is not ``cudaSuccess``.

    Raises:
        NoDeviceError: no driver, an old driver, no device, an invalid device ordinal; the message
            carries the runtime's name and description of the error.
        OutOfMemoryError: ``cudaErrorMemoryAllocation``.
        CudaError: anything else.
    """
    if type(err) is tuple:
        err = err[0]
    if int(err):
        raise cuda_error(err, what)


# ---- devices --------------------------------------------------------------------------------------

#: how many devices this process sees, once known (None before the first ask); cached once
#: positive: the set of visible devices never changes. The hot paths read it to skip device
#: bookkeeping when there is only one.
visible_devices: int | None = None


def _probe_devices() -> tuple[int, str | None]:
    if not driver_found():
        return 0, NO_DRIVER
    try:
        err, n = _runtime().cudaGetDeviceCount()
    except Exception as exc:  # e.g. cuda.pathfinder failing to find libcuda
        return 0, f"cudaGetDeviceCount raised {type(exc).__name__}: {exc}"
    if int(err):
        code = int(err)
        return 0, f"{error_text(code)}{_HINTS.get(code, '')}"
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
    err, dev = (_rt or _runtime()).cudaGetDevice()
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
    rt = _rt or _runtime()
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
            err, = (_rt or _runtime()).cudaSetDevice(prev)
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
    rt = _rt or _runtime()
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
    rt = _rt or _runtime()
    err, attrs = rt.cudaPointerGetAttributes(ptr)
    if err:
        check_cuda(err, f"cudaPointerGetAttributes({ptr:#x})")
    mtype = int(attrs.type)
    if mtype == 0:  # cudaMemoryTypeUnregistered: ordinary host memory
        raise TypeError(f"pointer {ptr:#x} is host memory, not CUDA device memory")
    return int(attrs.device)


# ---- streams --------------------------------------------------------------------------------------

def resolve_stream(stream: StreamLike | None) -> int:
    """The ``cudaStream_t`` handle (an int) of ``stream``.

    Accepted, in the order checked:

    * ``None``: the legacy default stream, ``0``;
    * an ``int``: a raw handle (``0``/``1`` legacy default, ``2`` per-thread default);
    * any object with ``__cuda_stream__`` (the CUDA stream protocol: a method or attribute giving
      ``(version, handle)``): cuda.core ``Stream``, recent CuPy and PyTorch streams, Numba;
    * an object with an integer ``.cuda_stream`` (``torch.cuda.Stream``, ``torch.cuda.ExternalStream``);
    * an object with an integer ``.ptr`` (``cupy.cuda.Stream``);
    * a cuda.bindings ``CUstream`` / ``cudaStream_t`` object, or anything with ``__index__``.

    Raises:
        TypeError: naming ``stream`` and what was given.
        ValueError: a handle outside 0 .. 2**64 - 1.
    """
    if stream is None:
        return 0
    if type(stream) is int:
        if stream < 0 or stream >= 1 << 64:
            _stream_int(stream)  # raises, naming the range
        return stream
    return _resolve_stream_object(stream)


def _resolve_stream_object(stream: Any) -> int:
    if isinstance(stream, bool):
        raise TypeError("stream: expected a CUDA stream, got bool")
    # PyTorch's streams: the same handle as their __cuda_stream__, read without building a tuple
    # through a Python property (about 5 us a call)
    handle = getattr(stream, "cuda_stream", None)
    if type(handle) is int and 0 <= handle < 1 << 64:
        return handle
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        info = proto() if callable(proto) else proto
        try:
            _version, handle = info
            return _stream_int(int(handle))
        except (TypeError, ValueError):
            raise TypeError(f"stream: {type(stream).__name__}.__cuda_stream__ returned {info!r}, "
                            "expected (version, handle)") from None
    for attr in ("cuda_stream", "ptr"):
        handle = getattr(stream, attr, None)
        if handle is not None and not isinstance(handle, bool):
            try:
                return _stream_int(operator.index(handle))
            except TypeError:
                pass
    if type(stream).__name__ in ("CUstream", "cudaStream_t"):
        return _stream_int(int(stream))
    try:
        return _stream_int(operator.index(stream))
    except TypeError:
        pass
    raise TypeError(
        f"stream: expected None, an int cudaStream_t handle, a cuda.core Stream, an object with "
        f"__cuda_stream__, .cuda_stream (PyTorch) or .ptr (CuPy); got {type(stream).__module__}."
        f"{type(stream).__qualname__}")


def _stream_int(handle: int) -> int:
    if handle < 0 or handle >= 1 << 64:
        raise ValueError(f"stream: expected a cudaStream_t handle (a non-negative 64-bit value), "
                         f"got {handle}")
    return handle


def stream_is_capturing(stream: Any) -> bool:
    """Whether ``stream`` is being captured into a CUDA graph (``cudaStreamIsCapturing``; an
    invalidated capture counts as capturing)."""
    handle = stream if type(stream) is int else resolve_stream(stream)
    err, status = (_rt or _runtime()).cudaStreamIsCapturing(handle)
    if err:
        check_cuda(err, "cudaStreamIsCapturing")
    return int(status) != 0


@contextlib.contextmanager
def relaxed_capture_mode() -> Iterator[None]:
    """A block in which the calling thread is in CUDA's relaxed stream-capture mode.

    While a thread captures a CUDA graph in global mode (PyTorch's default), CUDA refuses calls
    it deems unsafe (a module load, some allocations) from every thread in global mode, that
    one included, and such a call invalidates the capture. Code that only builds (cuDNN's
    runtime-compiled plans load a module when they are finalized) and queues no work runs in
    this block so it cannot break someone's capture. The thread's earlier mode is restored at
    the end. Without the mode (an old binding) the block runs as it is.
    """
    rt = _rt or _runtime()
    try:
        err, previous = rt.cudaThreadExchangeStreamCaptureMode(
            rt.cudaStreamCaptureMode.cudaStreamCaptureModeRelaxed)
        swapped = not err
    except Exception:  # an old driver or binding: the default mode stays
        swapped = False
    try:
        yield
    finally:
        if swapped:
            rt.cudaThreadExchangeStreamCaptureMode(previous)


def synchronize(device: Any = None) -> None:
    """Wait for all work on ``device`` (default: the current device)."""
    dev = normalize_device(device)
    with device_guard(dev):
        check_cuda((_rt or _runtime()).cudaDeviceSynchronize(), "cudaDeviceSynchronize")


def stream_synchronize(stream: Any) -> None:
    """Wait for all work on ``stream`` (anything `resolve_stream()` accepts)."""
    handle = stream if type(stream) is int else resolve_stream(stream)
    check_cuda((_rt or _runtime()).cudaStreamSynchronize(handle), "cudaStreamSynchronize")


def same_stream(a: int, b: int) -> bool:
    return a == b or (a <= 1 and b <= 1)  # 0 and 1 both name the legacy default stream


def stream_wait(waiting: Any, producer: Any) -> None:
    """Make ``waiting`` wait for the work queued so far on ``producer`` (an event, no host sync).

    Nothing is done when both name the same stream.
    """
    w = waiting if type(waiting) is int else resolve_stream(waiting)
    p = producer if type(producer) is int else resolve_stream(producer)
    if same_stream(w, p):
        return
    rt = _rt or _runtime()
    flags = getattr(rt, "cudaEventDisableTiming", 2)
    err, event = rt.cudaEventCreateWithFlags(flags)
    check_cuda(err, "cudaEventCreateWithFlags")
    try:
        check_cuda(rt.cudaEventRecord(event, p), "cudaEventRecord")
        check_cuda(rt.cudaStreamWaitEvent(w, event, 0), "cudaStreamWaitEvent")
    finally:
        rt.cudaEventDestroy(event)


# ---- copies and fills (used by pycudnn.runtime.tensor) ----------------------------------------------------

def copy_host_to_device(dst_ptr: int, array: Any, stream: Any = None) -> None:
    """Copy a host numpy array's bytes (made C-contiguous first) to ``dst_ptr``, then wait for the
    copy on ``stream`` (the host array may be pageable and temporary)."""
    import numpy as np

    a = np.ascontiguousarray(array)
    n = a.nbytes
    if not n:
        return
    rt = _rt or _runtime()
    handle = stream if type(stream) is int else resolve_stream(stream)
    check_cuda(rt.cudaMemcpyAsync(dst_ptr, a.ctypes.data, n, rt.cudaMemcpyKind.cudaMemcpyHostToDevice,
                                  handle), f"cudaMemcpyAsync (host to device, {n} bytes)")
    check_cuda(rt.cudaStreamSynchronize(handle), "cudaStreamSynchronize")


def copy_device_to_host(array: Any, src_ptr: int, stream: Any = None) -> None:
    """Copy ``array.nbytes`` bytes from ``src_ptr`` into a C-contiguous, writable numpy ``array``,
    and wait for the copy on ``stream``."""
    if not (array.flags.c_contiguous and array.flags.writeable):
        raise ValueError("array: expected a C-contiguous, writable numpy array")
    n = array.nbytes
    if not n:
        return
    rt = _rt or _runtime()
    handle = stream if type(stream) is int else resolve_stream(stream)
    check_cuda(rt.cudaMemcpyAsync(array.ctypes.data, src_ptr, n,
                                  rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, handle),
               f"cudaMemcpyAsync (device to host, {n} bytes)")
    check_cuda(rt.cudaStreamSynchronize(handle), "cudaStreamSynchronize")


def memset(ptr: int, nbytes: int, stream: Any = None, value: int = 0) -> None:
    """Fill ``nbytes`` bytes at ``ptr`` with the byte ``value``, ordered on ``stream`` (no sync)."""
    if not nbytes:
        return
    handle = stream if type(stream) is int else resolve_stream(stream)
    check_cuda((_rt or _runtime()).cudaMemsetAsync(ptr, value, nbytes, handle),
               f"cudaMemsetAsync ({nbytes} bytes)")


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """``(free, total)`` bytes of ``device`` (default: the current device), ``cudaMemGetInfo``."""
    dev = normalize_device(device)
    with device_guard(dev):
        err, free, total = (_rt or _runtime()).cudaMemGetInfo()
        check_cuda(err, "cudaMemGetInfo")
    return int(free), int(total)


# ---- allocation -----------------------------------------------------------------------------------

def _fmt_bytes(n: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


_core_streams: dict[int, Any] = {}
_memory_resources: dict[int, Any] = {}
_core_lock = threading.Lock()


def _core_stream(handle: int) -> Any:
    """A cuda.core ``Stream`` for a raw handle (cached: ``Stream.from_handle`` costs ~16 us).

    0 and 1 map to cuda.core's ``LEGACY_DEFAULT_STREAM``, 2 to ``PER_THREAD_DEFAULT_STREAM``.
    A cached wrapper only borrows the handle: it never destroys the stream.
    """
    s = _core_streams.get(handle)
    if s is None:
        cc = _core()
        if handle <= 1:
            s = getattr(cc, "LEGACY_DEFAULT_STREAM", None)
        elif handle == 2:
            s = getattr(cc, "PER_THREAD_DEFAULT_STREAM", None)
        if s is None:
            s = cc.Stream.from_handle(handle)
        with _core_lock:
            if len(_core_streams) >= 64:
                _core_streams.clear()
            _core_streams[handle] = s
    return s


def _memory_resource(device: int) -> Any:
    mr = _memory_resources.get(device)
    if mr is None:
        Device = _core().Device
        with _core_lock:
            mr = _memory_resources.get(device)
            if mr is None:
                mr = _memory_resources[device] = Device(device).memory_resource
    return mr


def empty_cache(device: Any = None) -> None:
    """Return the memory that the device's stream-ordered pool keeps for reuse to the driver
    (with the blocks pycudnn keeps for reuse on the legacy default stream).

    cuda.core raises the release threshold of the device's current memory pool to the maximum, so
    memory freed by pycudnn stays reserved in that pool, where allocators that do not use it
    (PyTorch's caching allocator, CuPy's default pool) cannot reach it. Call this before handing a
    large amount of memory over to them. Memory still in use is not touched. Does nothing before
    pycudnn's first allocation on the device.
    """
    dev = normalize_device(device)
    release_kept_blocks(dev)
    mr = _memory_resources.get(dev)
    if mr is None:
        return
    with device_guard(dev):
        check_cuda((_rt or _runtime()).cudaDeviceSynchronize(), "cudaDeviceSynchronize")
        if not isinstance(mr, _core().DeviceMemoryResource):  # no memory-pool support: nothing is kept
            return
        from cuda.bindings import driver

        err, = driver.cuMemPoolTrimTo(mr.handle, 0)
        if int(err):
            raise CudaError(int(err), "cuMemPoolTrimTo", str(err))


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    text = str(exc)
    return ("OUT_OF_MEMORY" in text or "cudaErrorMemoryAllocation" in text
            or "out of memory" in text.lower())


def _oom(nbytes: int, device: int, reason: str) -> OutOfMemoryError:
    try:
        free, total = mem_get_info(device)
        mem = f"device {device} has {_fmt_bytes(free)} free of {_fmt_bytes(total)} total"
    except Exception:
        mem = f"free/total memory of device {device} unknown"
    return OutOfMemoryError(f"out of memory: could not allocate {nbytes} bytes ({_fmt_bytes(nbytes)}) "
                            f"on device {device}: {reason}; {mem}")


def _check_nbytes(nbytes: Any) -> int:
    if type(nbytes) is not int:
        if isinstance(nbytes, bool):
            raise TypeError("nbytes: expected a non-negative int, got bool")
        try:
            nbytes = operator.index(nbytes)
        except TypeError:
            raise TypeError(f"nbytes: expected a non-negative int, got {type(nbytes).__name__}") from None
    if nbytes < 0:
        raise ValueError(f"nbytes: expected a non-negative int, got {nbytes}")
    return nbytes


def thread_token() -> object:
    """An object unique to the calling thread (a thread id may be reused by a later thread; this
    object is not while anything holds it): what `DeviceBuffer`'s
    ``thread`` records for memory allocated on the per-thread default stream. Takes no lock: safe
    in finalizers."""
    try:
        return _tls.token
    except AttributeError:
        token = _tls.token = object()
        return token


# Memory allocated on the per-thread default stream (handle 2) is freed on the allocating thread's
# per-thread stream when that thread drops it. Another thread cannot name that stream: handle 2
# there is its own per-thread stream, which is not ordered after the allocating thread's work.
# It frees on the legacy default stream of the device instead: the per-thread default streams are
# blocking streams, which the legacy stream waits for, so the free is ordered after all the work
# queued so far on every thread's per-thread stream; no host synchronization, one async call.
_LEGACY = 1  # cudaStreamLegacy: the legacy default stream even where 0 would mean per-thread


def _release(buffer: Any, device: int, stream_ref: Any = None, sync: bool = False,
             thread: Any = None, legacy: Any = None) -> None:
    """Finalizer of a DeviceBuffer: free stream-ordered on the stream recorded at allocation
    (``thread``: the allocating thread's token for a per-thread-stream allocation, freed on
    ``legacy``, the cuda.core legacy stream, when another thread drops it).

    Binds everything it needs as arguments (``stream_ref`` keeps the caller's stream object alive
    until the free is queued): it never refers to the DeviceBuffer, and takes no lock.
    """
    if _shutting_down:  # interpreter exit: the driver reclaims the memory; touch nothing
        return
    try:
        with device_guard(device):
            if sync:  # the allocation stream was a raw handle that may be destroyed by now
                if (_rt or _runtime()).cudaDeviceSynchronize()[0]:
                    return  # work may still use the memory: losing it is the safe choice
                buffer.close()
            elif thread is not None and thread is not thread_token():
                buffer.close(legacy)
            else:
                buffer.close()
    except Exception:  # a finalizer must not raise; the memory is lost at worst
        pass


class DeviceBuffer:
    """Device memory from `allocate()`.

    Attributes:
        ptr: the device address (0 for an empty buffer); reading it after `close()` raises.
        nbytes: its size in bytes.
        device: the device ordinal.

    Freed stream-ordered on `close()` (on the stream given, else on the allocation stream) or,
    when it is garbage-collected, on the allocation stream by a ``weakref.finalize`` that holds no
    reference to the object, with its device current. Memory allocated on the per-thread default
    stream and dropped by another thread is freed on the legacy default stream, which waits for
    every thread's per-thread stream. Nothing is freed at interpreter exit (the driver reclaims it).
    The stream an allocation was made on must outlive the buffer unless ``close(stream=...)`` names
    another one (when ``stream`` was an object, the buffer keeps a reference to it).
    """

    __slots__ = ("_ptr", "nbytes", "device", "_buffer", "_finalizer", "_stream_ref", "_thread",
                 "__weakref__")

    def __init__(self, ptr: int, nbytes: int, device: int, buffer: Any = None,
                 stream_ref: Any = None, sync_release: bool = False, thread: Any = None) -> None:
        self._ptr: int | None = ptr
        self.nbytes = nbytes
        self.device = device
        self._buffer = buffer
        self._stream_ref = stream_ref
        self._thread = thread  # the allocating thread's token when allocated on the per-thread stream
        if buffer is not None:
            legacy = _core_stream(_LEGACY) if thread is not None else None
            self._finalizer: Any = weakref.finalize(self, _release, buffer, device, stream_ref,
                                                    sync_release, thread, legacy)
            self._finalizer.atexit = False
        else:
            self._finalizer = None

    @property
    def ptr(self) -> int:
        ptr = self._ptr
        if ptr is None:
            raise ValueError("DeviceBuffer: used after close()")
        return ptr

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def close(self, stream: Any = None) -> None:
        """Free the memory now, ordered on ``stream`` (default: the stream it was allocated on).
        Closing twice is harmless."""
        if self._ptr is None:
            return
        buffer = self._buffer
        self._ptr = None
        self._buffer = None
        self._stream_ref = None
        if buffer is None:
            return
        self._finalizer.detach()
        with device_guard(self.device):
            if stream is not None:
                buffer.close(_core_stream(resolve_stream(stream)))
            elif self._thread is not None and self._thread is not thread_token():
                buffer.close(_core_stream(_LEGACY))  # see _LEGACY
            else:
                buffer.close()

    def __enter__(self) -> "DeviceBuffer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._ptr is None else f"ptr={self._ptr:#x}"
        return f"DeviceBuffer({state}, nbytes={self.nbytes}, device={self.device})"


def allocate(nbytes: int, device: Any = None, stream: Any = None, *,
             what: str = "allocate") -> DeviceBuffer:
    """Allocate ``nbytes`` of device memory, stream-ordered on ``stream``, through cuda.core.

    Args:
        nbytes: size in bytes; 0 gives a buffer with ``ptr == 0`` without touching the device.
        device: device ordinal (default: the current device).
        stream: anything `resolve_stream()` accepts (default: the legacy default stream).
        what: the public call on whose behalf this allocates (``"from_numpy"``): a missing
            device is reported under that name.

    On a stream being captured into a CUDA graph, cuda.core's pool refuses to allocate; the
    allocation then goes through cuda.core's ``GraphMemoryResource`` (a graph allocation node),
    which must be freed (``close(stream)``) before the capture ends.

    Raises:
        OutOfMemoryError: ``nbytes >= 1 TiB`` (refused up front: cuDNN sometimes reports sizes near
            2^64), or the driver could not allocate (after one retry following a device
            synchronize); the message names the bytes asked, the device and its free/total memory.
        NoDeviceError: no usable device (with the driver's reason).
    """
    n = _check_nbytes(nbytes)
    if n == 0:
        if device is None:
            dev = current_device() if device_count() else 0
        else:
            dev = normalize_device(device, what=what) if device_count() else operator.index(device)
        return DeviceBuffer(0, 0, dev)
    if n >= MAX_ALLOCATION:
        where = device if device is not None else "current"
        raise OutOfMemoryError(
            f"out of memory: refusing a workspace/allocation of {n} bytes ({_fmt_bytes(n)}) on "
            f"device {where}: sizes from 1 TiB up are treated as out of memory (cuDNN sometimes "
            "reports sizes near 2^64)")
    dev = normalize_device(device, what=what)
    handle = stream if type(stream) is int else resolve_stream(stream)
    stream_ref = None if stream is None or type(stream) is int else stream
    s = _core_stream(handle)
    with device_guard(dev):
        mr = _memory_resource(dev)
        try:
            buf = mr.allocate(n, stream=s)
        except Exception as exc:
            buf = _allocate_slow(exc, mr, n, dev, handle, s)
    # A raw handle of a user's stream (not 0/1/2, no object to keep alive) may be destroyed before
    # the buffer is collected: freeing on it then would crash the driver. Such buffers are freed,
    # when collected, on the legacy default stream after a device synchronization.
    sync_release = stream_ref is None and handle > 2
    if sync_release:
        buf.set_deallocation_stream(_core_stream(0))
    return DeviceBuffer(int(buf.handle), n, dev, buf, stream_ref, sync_release,
                        thread_token() if handle == 2 else None)


def _allocate_slow(exc: Exception, mr: Any, n: int, dev: int, handle: int, s: Any) -> Any:
    """The failure path of `allocate()` (the device is current)."""
    if _is_oom(exc):
        try:
            _free, total = mem_get_info(dev)
        except Exception:
            total = 0
        if n <= total and not stream_is_capturing(handle):
            # Frees still pending on other streams return to the pool once they complete; the
            # blocks kept for reuse on the legacy stream go back to it too.
            release_kept_blocks(dev)
            check_cuda((_rt or _runtime()).cudaDeviceSynchronize(), "cudaDeviceSynchronize")
            try:
                return mr.allocate(n, stream=s)
            except Exception as again:
                if not _is_oom(again):
                    raise _wrap(again, n, dev) from again
                exc = again
        raise _oom(n, dev, str(exc) or type(exc).__name__) from exc
    if not isinstance(exc, PycudnnError) and stream_is_capturing(handle):
        try:
            return _core().GraphMemoryResource(dev).allocate(n, stream=s)
        except Exception as graph_exc:
            if _is_oom(graph_exc):
                raise _oom(n, dev, str(graph_exc)) from graph_exc
            raise _wrap(graph_exc, n, dev) from graph_exc
    raise _wrap(exc, n, dev) from exc


def _wrap(exc: Exception, n: int, dev: int) -> Exception:
    if isinstance(exc, PycudnnError):
        return exc
    return CudaError(-1, f"allocating {n} bytes on device {dev} through cuda.core",
                     f"{type(exc).__name__}: {exc}")


# ---- the hot path: lean stream-ordered allocations and per-thread workspaces ---------------------

_shutting_down = False


def _mark_shutdown() -> None:
    global _shutting_down
    _shutting_down = True


import atexit as _atexit  # noqa: E402  (kept next to its only use)

_atexit.register(_mark_shutdown)


class StreamAllocation:
    """Device memory from ``cudaMallocAsync`` on a stream, freed with ``cudaFreeAsync``.

    The lean twin of `DeviceBuffer` for the convolution hot path (about 2 us for an
    allocate/free pair against about 7 us through cuda.core's Buffer). Same interface: ``ptr``,
    ``nbytes``, ``device``, ``close(stream=None)``. When collected it frees itself on the stream
    it was allocated on, with its device current (0, 1 and 2 name a stream of the *current*
    device), so that stream must still exist: when the stream was given as an object (cuda.core,
    CuPy, PyTorch), the allocation keeps a reference to it; a raw int handle is the caller's
    promise. Memory allocated on the per-thread default stream and dropped by another thread is
    freed on the legacy default stream, which waits for every thread's per-thread stream (see
    ``_LEGACY``). ``sync_free`` allocations (per-thread workspaces, collected when their thread
    ends, long after the stream may be gone) are freed by `free_synchronously()` instead.
    After interpreter shutdown has begun nothing is freed (the driver reclaims memory at exit).
    """

    __slots__ = ("ptr", "nbytes", "device", "stream", "stream_ref", "sync_free", "thread")

    def __init__(self, ptr: int, nbytes: int, device: int, stream: int, stream_ref: Any = None,
                 sync_free: bool = False) -> None:
        self.ptr = ptr
        self.nbytes = nbytes
        self.device = device
        self.stream = stream
        self.stream_ref = stream_ref
        self.sync_free = sync_free
        #: the allocating thread's token when allocated on the per-thread default stream
        self.thread = thread_token() if stream == 2 else None

    def close(self, stream: Any = None) -> None:
        """Free now, ordered on ``stream`` (default: the allocation stream). Idempotent."""
        ptr = self.ptr
        if not ptr:
            return
        self.ptr = 0
        if stream is not None:
            s = stream if type(stream) is int else resolve_stream(stream)
        else:
            s = self.stream
            if s == 2 and self.thread is not thread_token():
                s = _LEGACY  # another thread's per-thread stream: see _LEGACY
        _free_async(ptr, s, self.device)
        self.stream_ref = None

    def free_synchronously(self) -> None:
        """Free now, after waiting for all work on the device: for memory whose stream may no
        longer exist. ``cudaFree`` alone does not wait for work still using stream-ordered memory.
        Nothing is freed when the device cannot be synchronized (the memory is lost at worst)."""
        ptr = self.ptr
        if not ptr:
            return
        self.ptr = 0
        self.stream_ref = None
        rt = _rt or _runtime()
        with device_guard(self.device):
            if rt.cudaDeviceSynchronize()[0]:
                # e.g. another thread is capturing a CUDA graph: freeing now could hand memory
                # still in use to the next allocation, so it is kept (lost at worst), never raised
                # into the call that happened to evict it
                return
            rt.cudaFree(ptr)

    def __del__(self) -> None:
        # no lock taken here (a finalizer may run on any thread, at any point)
        ptr = self.ptr
        if ptr and not _shutting_down:
            try:
                if self.sync_free:
                    self.free_synchronously()
                    return
                s = self.stream
                # close() inlined for the hot path (every output dropped frees here), including
                # _free_async's common case: the driver's free, no device check needed
                if s == 2 and self.thread is not thread_token():
                    s = _LEGACY  # another thread's per-thread stream: see _LEGACY
                self.ptr = 0
                if s < 2 and _keep_block(ptr, self.nbytes, self.device):
                    return
                drv = _driver
                if drv and (s > 2 or visible_devices == 1):
                    if drv.free(ptr, s):
                        _free_guarded(ptr, s, self.device)
                else:
                    _free_async(ptr, s, self.device)
            except Exception:  # a finalizer must not raise; the memory is lost at worst
                pass

    def __repr__(self) -> str:
        return f"StreamAllocation(ptr={self.ptr:#x}, nbytes={self.nbytes}, device={self.device})"


def _free_async(ptr: int, s: int, device: int) -> None:
    """``cuMemFreeAsync(ptr, s)`` with ``device`` current where the handle does not say the device.

    0, 1 and 2 name a stream of the current device: freeing a device-0 buffer on them while
    device 1 is current would order the free on device 1's stream, after none of the work that
    uses the buffer. A created stream belongs to its own device; and with one device visible
    there is no other, so those cases skip the device check (one retry with the device made
    current covers a thread on which no context was ever current). Takes no lock.
    """
    drv = _driver
    if s > 2 or visible_devices == 1:
        err = drv.free(ptr, s) if drv else (_rt or _runtime()).cudaFreeAsync(ptr, s)[0]
        if not err:
            return
    _free_guarded(ptr, s, device)


def _free_guarded(ptr: int, s: int, device: int) -> None:
    """The free of `_free_async()` with ``device`` made current first (and back after)."""
    drv = _driver
    rt = _rt or _runtime()
    with device_guard(device):
        if drv:
            drv.free(ptr, s)
        else:
            rt.cudaFreeAsync(ptr, s)


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


_driver: Any = None  # a _DriverMemory once loaded, False where libcuda cannot be; None: not tried


def _driver_memory() -> Any:
    global _driver
    if _driver is None:
        try:
            _driver = _DriverMemory()
        except (OSError, AttributeError):
            _driver = False
    return _driver


def allocate_fast(nbytes: int, device: int, stream: int, stream_ref: Any = None,
                  sync_free: bool = False) -> Any:
    """`allocate()` for trusted arguments on the hot path (``device`` current, ``stream`` an
    int handle; ``stream_ref`` the stream object it came from, kept alive until the free): plain
    ``cudaMallocAsync``; anything unusual (0 or huge sizes, an error such as out of memory) goes
    through `allocate()`, which retries and explains."""
    if stream > 2 and stream_ref is None:
        # a raw handle of a user's stream may be destroyed before this memory is collected:
        # free it synchronously then, never ordered on a stream that may no longer exist
        sync_free = True
    if 0 < nbytes < MAX_ALLOCATION:
        if stream < 2:
            kept = _blocks.get((device, nbytes))
            if kept:
                try:
                    ptr = kept.pop()
                except IndexError:  # another thread took the last one
                    ptr = 0
                if ptr:
                    _block_bytes[0] -= nbytes
                    a = _new(StreamAllocation)
                    a.ptr, a.nbytes, a.device, a.stream = ptr, nbytes, device, stream
                    a.stream_ref, a.sync_free, a.thread = stream_ref, sync_free, None
                    return a
        drv = _driver or _driver_memory()
        if drv:
            ptr = drv.allocate(nbytes, stream)
        else:
            err, ptr = (_rt or _runtime()).cudaMallocAsync(nbytes, stream)
            ptr = 0 if err else int(ptr)
        if not ptr and _blocks:  # out of memory, maybe: give the kept blocks back first
            release_kept_blocks(device)
            ptr = drv.allocate(nbytes, stream) if drv else 0
        if ptr:
            # StreamAllocation.__init__ inlined: this is every output of a remembered call
            a = _new(StreamAllocation)
            a.ptr = ptr
            a.nbytes = nbytes
            a.device = device
            a.stream = stream
            a.stream_ref = stream_ref
            a.sync_free = sync_free
            a.thread = thread_token() if stream == 2 else None
            return a
    return allocate(nbytes, device, stream if stream_ref is None else stream_ref)


_new = object.__new__

# ---- blocks kept for reuse on the legacy default stream -----------------------------------------
# A stream-ordered free and the next allocation each put work in the stream (about a microsecond
# of GPU time between two kernels: measured on a ~9 us convolution). Memory dropped on the legacy
# default stream is kept here instead and handed to the next allocation of the same size on it:
# both are ordered on that one stream, so the block is free once the earlier work is done, as
# with PyTorch's caching allocator. Only the legacy stream (0 or 1): it is never destroyed, so a
# kept block never outlives its stream. Bounded; `empty_cache()` and an allocation that fails
# give the blocks back. Lists, not locks: finalizers append here from any thread.

#: bytes kept at most, and the largest block kept
KEEP_BYTES_MAX = 256 << 20
KEEP_BLOCK_MAX = 32 << 20
_blocks: dict[tuple[int, int], list[int]] = {}
_block_bytes = [0]  # approximate under threads (no lock); recounted when blocks are given back


def _keep_block(ptr: int, nbytes: int, device: int) -> bool:
    """Keep a block freed on the legacy stream for reuse (False: free it as usual)."""
    if nbytes > KEEP_BLOCK_MAX or _block_bytes[0] + nbytes > KEEP_BYTES_MAX:
        return False
    kept = _blocks.get((device, nbytes))
    if kept is None:
        kept = _blocks.setdefault((device, nbytes), [])
    kept.append(ptr)
    _block_bytes[0] += nbytes
    return True


def release_kept_blocks(device: int | None = None) -> int:
    """Free the blocks kept for reuse on the legacy stream (of one device, or all); the bytes freed."""
    freed = 0
    for (dev, nbytes), kept in list(_blocks.items()):
        if device is not None and dev != device:
            continue
        with device_guard(dev):
            while True:
                try:
                    ptr = kept.pop()
                except IndexError:
                    break
                _free_async(ptr, 0, dev)
                freed += nbytes
    _block_bytes[0] = sum(n * len(k) for (_, n), k in _blocks.items())
    return freed


def stream_identity(stream: int) -> int:
    """The driver's unique id of ``stream`` (``cuStreamGetId``), which no later stream reuses
    (a handle can be: the driver hands a destroyed stream's handle to a new stream); the
    handle itself for the default streams (0, 1, 2), which are never destroyed, and -1 where
    the id cannot be read (the handle alone then tells streams apart, as before)."""
    if stream <= 2:
        return stream
    drv = _driver_memory()
    get_id = getattr(drv, "stream_id", None) if drv else None
    if get_id is None:
        return -1
    out = _c_uint64()
    if get_id(stream, _addressof(out)) == 0:
        return int(out.value)
    return -1


def thread_workspace(nbytes: int, device: int, stream: int) -> int:
    """A workspace pointer of at least ``nbytes`` owned by this thread for (device, stream).

    Reused across calls (uses on one stream are ordered, so reuse is safe) and grown when a larger
    one is asked. Never use it while the stream is being captured into a CUDA graph: the graph
    would keep an address this cache may free later.

    Keyed by the stream's driver id as well as its handle: a destroyed stream's handle can come
    back for a new stream, whose work is not ordered after the old one's, so a workspace of the
    old stream is freed (synchronously: its stream is gone) and a new one made.
    """
    if nbytes == 0:
        return 0
    cache = getattr(_tls, "workspaces", None)
    if cache is None:
        cache = _tls.workspaces = {}
    key = (device, stream)
    entry = cache.get(key)
    ident = stream_identity(stream)
    if entry is not None and entry[0] != ident:
        # the handle of a stream that no longer exists, now another stream's
        del cache[key]
        entry[1].free_synchronously()
        entry = None
    if entry is None or entry[1].nbytes < nbytes:
        if entry is not None:
            entry[1].close()  # on its own stream, which is in use right now
            del cache[key]
        while len(cache) >= THREAD_WORKSPACES_MAX:
            # the stream of an old entry may be gone: free it synchronously, not ordered on it
            cache.pop(next(iter(cache)))[1].free_synchronously()
        ws = allocate_fast(max(nbytes, 1 << 20), device, stream, sync_free=True)
        cache[key] = (ident, ws)
        return int(ws.ptr)
    return int(entry[1].ptr)


#: per thread, workspaces of at most this many (device, stream) pairs are kept
THREAD_WORKSPACES_MAX = 4


# ---- zeros that every stream may read ------------------------------------------------------------

_zeros: dict[int, tuple[int, int]] = {}  # device -> (address, bytes) of its largest zero buffer
_zeros_kept: list[Any] = []  # every zero buffer made: never freed (a launch anywhere may read one)
_zeros_lock = threading.Lock()


def shared_zeros(nbytes: int, device: int, stream: int) -> int | None:
    """The address of at least ``nbytes`` zero bytes on ``device``, readable from any stream.

    Made on first use per device (and again, twice as large, when a larger one is asked): filled
    on ``stream`` and waited for before the address is returned, so the zeros are complete for
    work queued afterwards on any stream; never written again and never freed while the process
    runs, so no launch on any stream can read it freed or refilled. The sizes double, so all of
    them together stay below twice the largest asked for. One dict lookup once made.

    None while ``stream`` is being captured into a CUDA graph and no buffer large enough exists
    (nothing can be waited for during a capture): the caller makes its own zeros for that call.
    """
    entry = _zeros.get(device)
    if entry is not None and entry[1] >= nbytes:
        return entry[0]
    with _zeros_lock:
        entry = _zeros.get(device)
        if entry is not None and entry[1] >= nbytes:
            return entry[0]
        size = max(256, 1 << (max(nbytes, 1) - 1).bit_length())
        with device_guard(device):
            if stream_is_capturing(stream):
                return None
            buf = allocate(size, device, stream)
            memset(buf.ptr, size, stream)
            stream_synchronize(stream)
        _zeros_kept.append(buf)
        _zeros[device] = (buf.ptr, size)
        return buf.ptr
