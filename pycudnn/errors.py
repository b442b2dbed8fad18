"""The exception hierarchy of pycudnn.

Every error that comes from cuDNN is a `CudnnError` carrying the
status, the C function that returned it, the symbolic status name (cuDNN 9 numbering) and cuDNN's
own reason from ``cudnnGetLastErrorString``. Subclasses group statuses by family, so callers can
catch ``CudnnBadParamError`` or ``CudnnNotSupportedError`` without knowing numbers.

This module imports nothing else from pycudnn.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "PycudnnError",
    "CudnnError",
    "CudnnBadParamError",
    "CudnnNotSupportedError",
    "CudnnInternalError",
    "CudnnExecutionError",
    "CudnnAllocationError",
    "CudnnNotInitializedError",
    "OutOfMemoryError",
    "CudnnNotFoundError",
    "NoDeviceError",
    "NoAlgorithmError",
    "StreamCaptureError",
    "TuningDatabaseWarning",
    "error_class_for_status",
]


class PycudnnError(RuntimeError):
    """Base class of every error pycudnn raises on its own account.

    ``add_context(*lines)`` appends lines (shapes, descriptors, algorithm, a repro snippet) to the
    message, the way CuPy's ``add_infos`` and PyTorch's ``AT_CUDNN_CHECK_WITH_SHAPES`` do.
    """

    def add_context(self, *lines: str) -> "PycudnnError":
        """Attach context lines to the message; returns self so callers can re-raise."""
        context: list[str] | None = getattr(self, "context", None)
        if context is None:
            context = []
            self.context = context
        context.extend(lines)
        base = getattr(self, "_base_message", None)
        if base is None:
            base = self._base_message = str(self.args[0]) if self.args else ""
        self.args = (base + "\n" + "\n".join(context),) + tuple(self.args[1:])
        return self


class CudnnError(PycudnnError):
    """A cuDNN call returned a status other than ``CUDNN_STATUS_SUCCESS``.

    Attributes:
        status: the integer status.
        status_name: its symbolic name, e.g. ``"CUDNN_STATUS_BAD_PARAM"``.
        function: the C function that returned it.
        reason: cuDNN's own explanation (``cudnnGetLastErrorString``), possibly empty.
        context: lines that callers attached (shapes, dtypes, algorithm, repro).
    """

    def __init__(self, status: int, function: str, status_name: str = "", reason: str = "",
                 context: list[str] | None = None) -> None:
        self.status = int(status)
        self.function = function
        self.status_name = status_name or f"status {status}"
        self.reason = reason
        self.context: list[str] = list(context or [])
        super().__init__(self._compose())

    def _compose(self) -> str:
        msg = f"{self.function} failed with {self.status_name} ({self.status})"
        if self.reason:
            msg += f": {self.reason}"
        if self.context:
            msg += "\n" + "\n".join(self.context)
        return msg

    def add_context(self, *lines: str) -> "CudnnError":
        """Attach context lines (CuPy's ``add_infos``); returns self so callers can re-raise."""
        self.context.extend(lines)
        self.args = (self._compose(),)
        return self

    def __str__(self) -> str:  # args may have been refreshed by add_context
        return self.args[0] if self.args else self._compose()

    def __reduce__(self) -> tuple[Any, ...]:  # keep pickling (e.g. multiprocessing) working with our __init__
        return (type(self), (self.status, self.function, self.status_name, self.reason, self.context))


class CudnnNotInitializedError(CudnnError):
    """Statuses 1xxx: cuDNN could not initialise (no driver, no GPU, sub-library missing)."""


class CudnnBadParamError(CudnnError):
    """Statuses 2xxx: cuDNN refused a parameter."""


class CudnnNotSupportedError(CudnnError):
    """Statuses 3xxx: the configuration is valid but no implementation supports it."""


class CudnnInternalError(CudnnError):
    """Statuses 4xxx: an internal failure inside cuDNN."""


class CudnnAllocationError(CudnnInternalError):
    """cuDNN failed to allocate host or device memory (4003, 4004)."""


class CudnnExecutionError(CudnnError):
    """Statuses 5xxx: a kernel launch or a library that cuDNN called failed."""


class OutOfMemoryError(PycudnnError, MemoryError):
    """Device memory could not be allocated (a workspace or a result).

    Also a `MemoryError`, so generic handlers catch it.
    """


class CudnnNotFoundError(PycudnnError, ImportError):
    """libcudnn could not be found or loaded, or is older than cuDNN 9."""


class NoDeviceError(PycudnnError):
    """No CUDA driver or no CUDA device is available; the message says which."""


class NoAlgorithmError(PycudnnError):
    """Every candidate algorithm or plan failed; ``failures`` lists each one and why."""

    def __init__(self, message: str, failures: list[tuple[str, str]] | None = None) -> None:
        self.failures = list(failures or [])
        super().__init__(message)


class StreamCaptureError(PycudnnError):
    """A benchmark (measuring) search was asked for while the stream is being captured."""


class TuningDatabaseWarning(UserWarning):
    """A file of pycudnn's cache (the tuning database or the routing decisions) was unusable
    (set aside) or its directory was refused; the message names which file."""


def error_class_for_status(status: int) -> type[CudnnError]:
    """Map a cuDNN 9 status to the exception class of its family."""
    if status in (4003, 4004):
        return CudnnAllocationError
    family = status // 1000
    return {
        1: CudnnNotInitializedError,
        2: CudnnBadParamError,
        3: CudnnNotSupportedError,
        4: CudnnInternalError,
        5: CudnnExecutionError,
    }.get(family, CudnnError)
