"""CUDA status codes as Python exceptions: `check_cuda()` turns a ``cuda.bindings.runtime``
status, and `check_driver()` a driver ``CUresult``, into `NoDeviceError` (no driver, an old
driver, no device, an invalid ordinal: the message names the driver's reason),
`OutOfMemoryError` (out of memory) or `CudaError` (anything else)."""

from __future__ import annotations

import ctypes
from typing import Any, Callable

from ...errors import NoDeviceError, OutOfMemoryError, PycudnnError
from . import bindings as _bindings
from . import driver as _driver

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


_NO_DEVICE_NAMES = (
    "cudaErrorInitializationError", "cudaErrorStubLibrary", "cudaErrorInsufficientDriver",
    "cudaErrorCallRequiresNewerDriver", "cudaErrorDevicesUnavailable", "cudaErrorNoDevice",
    "cudaErrorSystemNotReady", "cudaErrorSystemDriverMismatch",
    "cudaErrorCompatNotSupportedOnDevice", "cudaErrorDeviceUninitialized",
)
_no_device_codes: frozenset[int] | None = None
_OOM_CODE = 2  # cudaErrorMemoryAllocation
_INVALID_DEVICE = 101  # cudaErrorInvalidDevice

DRIVER_HINTS = {
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
        try:
            ctypes.CDLL("libcuda.so.1")
            _driver_found = True
        except OSError:
            _driver_found = False
    return _driver_found


def assume_driver_found(found: bool | None) -> None:
    """Take ``found`` as what `driver_found()` answers from now on (None: ask again on the next
    call). A seam for tests and tooling that fake a driver on a machine without one."""
    global _driver_found
    _driver_found = found


def _no_device_set() -> frozenset[int]:
    global _no_device_codes
    if _no_device_codes is None:
        rt = _bindings.runtime()
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
        rt = _bindings.runtime()
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
    return _status_error(code, what, error_text(code), code in _no_device_set(),
                         DRIVER_HINTS.get(code, ""))


def _status_error(code: int, what: str, text: str, no_device: bool, hint: str = "") -> Exception:
    """The exception for a failed runtime or driver status ``code`` (``text`` names it;
    ``no_device``: a status that means no usable device, ``hint`` what to do about it)."""
    if no_device:
        if not driver_found():
            return NoDeviceError(f"{what}: {NO_DRIVER}\n{NO_DRIVER_ADVICE}")
        return NoDeviceError(f"{what}: no usable CUDA device: {text}{hint}")
    if code == _INVALID_DEVICE:
        return NoDeviceError(f"{what}: {text} (this machine has {_device_count()} CUDA device(s))")
    if code == _OOM_CODE:
        return OutOfMemoryError(f"{what}: out of device memory: {text}")
    return CudaError(code, what, text)


def _device_count() -> int:
    """What `pycudnn.runtime.memory.devices.device_count()` answers, asked here directly (that
    module reads this one): the visible devices, 0 where the driver cannot say."""
    drv: Any = (_driver.loaded or _driver.driver()) if driver_found() else False
    if not drv or drv.init_status:
        return 0
    n = ctypes.c_int()
    return 0 if drv.cuDeviceGetCount(ctypes.byref(n)) else n.value


#: ``CUresult`` values that mean "no usable device" (not initialised, the stub library, devices
#: unavailable, no device, system not ready, driver mismatch, compat unsupported)
DRIVER_NO_DEVICE = frozenset({3, 34, 46, 100, 802, 803, 804})


def driver_error_text(code: int) -> str:
    """``"CUDA_ERROR_NAME: description"`` for a driver ``CUresult``."""
    drv = _driver.loaded or _driver.driver()
    return drv.error_text(int(code)) if drv else f"CUresult {int(code)}"


def driver_error(code: int, what: str) -> Exception:
    """The exception `check_driver()` raises for a failed ``code`` (not raised here)."""
    code = int(code)
    return _status_error(code, what, driver_error_text(code), code in DRIVER_NO_DEVICE)


def check_driver(code: int, what: str) -> None:
    """Raise if the driver's ``code`` (a ``CUresult``) is not ``CUDA_SUCCESS``: the exceptions of
    `check_cuda()`, with the driver's name and description of the error."""
    if code:
        raise driver_error(code, what)


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
