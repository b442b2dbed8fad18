"""Stream helpers for working inside another framework's program.

pycudnn runs every operation on the stream it is given (``stream=``), and on the legacy default
stream when it is given none. A PyTorch or CuPy program usually runs on *its* current stream,
which may be a side stream the user chose with ``torch.cuda.stream(s)`` or ``with cupy_stream:``;
pycudnn cannot know it, so pass it::

    y = pycudnn.convolution(x, w, stream=pycudnn.current_stream(x))      # x: a torch tensor
    y = pycudnn.convolution(x, w, stream=pycudnn.current_stream("cupy"))

`current_stream()` asks the framework for its current stream and
returns the raw ``cudaStream_t`` handle (an ``int``), which every pycudnn function accepts. It
imports nothing that is not already imported: asking for ``"torch"`` in a process without PyTorch
raises.
"""

from __future__ import annotations

import sys
from typing import Any

from .memory import StreamLike, resolve_stream
from .tensor import TensorLike

__all__ = ["current_stream", "framework_of", "FRAMEWORKS"]

FRAMEWORKS = ("torch", "cupy", "numba", "cuda.core", "pycudnn")
"""The framework names `current_stream()` accepts."""


def framework_of(obj: Any) -> str | None:
    """The framework an array (or stream) object comes from: ``"torch"``, ``"cupy"``,
    ``"numba"``, ``"jax"``, ``"cuda.core"``, ``"pycudnn"``, or None when unknown."""
    mod = type(obj).__module__ or ""
    root = mod.split(".", 1)[0]
    if root in ("torch", "cupy", "numba", "pycudnn"):
        return root
    if root in ("cupy_backends", "cupyx"):
        return "cupy"
    if root == "numba_cuda":  # the numba-cuda package, which provides numba.cuda
        return "numba"
    if root in ("jax", "jaxlib"):
        return "jax"
    if mod.startswith("cuda.core"):
        return "cuda.core"
    return None


def _module(name: str) -> Any:
    module = sys.modules.get(name)
    if module is None:
        try:
            module = __import__(name)
        except ImportError as exc:
            raise ValueError(f"current_stream({name!r}): {name} is not installed ({exc})") from None
    return module


def _torch_stream(device: Any = None) -> int:
    torch = _module("torch")
    return int(torch.cuda.current_stream(device).cuda_stream)


def _cupy_stream(device: int | None = None) -> int:
    cupy = _module("cupy")
    if device is None:
        return int(cupy.cuda.get_current_stream().ptr)
    with cupy.cuda.Device(device):
        return int(cupy.cuda.get_current_stream().ptr)


def _numba_handle(stream: Any) -> int:
    """The handle of a Numba stream (or the ``0`` Numba uses for the default stream)."""

    if stream is None:
        return 0
    if isinstance(stream, int) and not isinstance(stream, bool):
        return resolve_stream(stream)
    if getattr(stream, "__cuda_stream__", None) is not None:
        return resolve_stream(stream)
    handle = getattr(stream, "handle", None)
    if handle is None:
        return resolve_stream(stream)
    value = getattr(handle, "value", handle)  # ctypes c_void_p, or a cuda.bindings CUstream
    return int(value or 0)


def _numba_stream() -> int:
    _module("numba")
    from numba import cuda

    return _numba_handle(cuda.default_stream())


def current_stream(obj: str | TensorLike | StreamLike | None) -> int:
    """The ``cudaStream_t`` handle (an int) that work on ``obj`` should be ordered on.

    Args:
        obj: a framework name or an object from one:

            * ``"torch"``: ``torch.cuda.current_stream().cuda_stream`` (the current device);
            * ``"cupy"``: ``cupy.cuda.get_current_stream().ptr``;
            * ``"numba"``: Numba's default stream (``numba.cuda.default_stream()``);
            * ``"cuda.core"`` / ``"pycudnn"``: ``0``, the legacy default stream (neither has a
              notion of a current stream: pass the stream you launch on);
            * a PyTorch tensor: its device's current PyTorch stream;
            * a CuPy array: CuPy's current stream on the array's device;
            * a Numba device array: the stream it was created with (``array.stream``);
            * a `pycudnn.Tensor`: ``0`` (pycudnn records no stream on its
              tensors);
            * a stream object (PyTorch, CuPy, Numba, cuda.core, anything with
              ``__cuda_stream__``) or an int handle: its handle;
            * any other object with ``__cuda_array_interface__`` version 3: the ``stream`` it
              reports (``0`` when it reports none).

    Returns:
        The raw handle; ``0`` and ``1`` both mean the legacy default stream, ``2`` the
        per-thread default stream.

    Raises:
        ValueError: an unknown framework name, or a framework that is not installed.
        TypeError: an object whose stream cannot be determined (JAX arrays, for instance: JAX
            does not expose its streams; pass ``stream=`` yourself).
    """

    if isinstance(obj, str):
        name = obj.strip().lower()
        if name in ("torch", "pytorch"):
            return _torch_stream()
        if name == "cupy":
            return _cupy_stream()
        if name == "numba":
            return _numba_stream()
        if name in ("cuda.core", "pycudnn", "default", "legacy"):
            return 0
        raise ValueError(f"current_stream: unknown framework {obj!r}; expected one of "
                         f"{', '.join(map(repr, FRAMEWORKS))} or an array or stream object")
    if obj is None:
        return 0
    if isinstance(obj, bool):
        raise TypeError("current_stream: expected a framework name, an array or a stream, got bool")
    if isinstance(obj, int):
        return resolve_stream(obj)
    return _stream_of_object(obj)


def _stream_of_object(obj: Any) -> int:
    """`current_stream` of an array or stream object (duck-typed: tried, not trusted)."""
    fw = framework_of(obj)
    if fw == "torch":
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            if not obj.is_cuda:
                raise TypeError(f"current_stream: the torch tensor is on {obj.device}, not a CUDA "
                                "device")
            return _torch_stream(obj.device)
        return resolve_stream(obj)  # torch.cuda.Stream / ExternalStream
    if fw == "cupy":
        if hasattr(obj, "__cuda_array_interface__") and hasattr(obj, "device"):
            return _cupy_stream(int(obj.device.id))
        return resolve_stream(obj)  # cupy.cuda.Stream / ExternalStream
    if fw == "numba":
        if hasattr(obj, "__cuda_array_interface__"):
            return _numba_handle(getattr(obj, "stream", 0))
        return _numba_handle(obj)  # a numba Stream
    if fw == "pycudnn":
        if hasattr(obj, "__cuda_array_interface__"):
            return 0
        return resolve_stream(obj)
    if fw == "jax":
        raise TypeError("current_stream: JAX does not expose the stream its arrays are produced "
                        "on; synchronise them (block_until_ready()) and pass stream= yourself")
    if getattr(obj, "__cuda_stream__", None) is not None:
        return resolve_stream(obj)
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:
        cai = None
    if isinstance(cai, dict):
        producer = cai.get("stream") if cai.get("version", 0) >= 3 else None
        return resolve_stream(int(producer)) if producer is not None else 0
    try:
        return resolve_stream(obj)
    except TypeError:
        pass
    raise TypeError(f"current_stream: cannot tell the stream of a {type(obj).__module__}."
                    f"{type(obj).__qualname__}; pass a framework name ('torch', 'cupy', 'numba'), "
                    "a tensor of one, or a stream")
