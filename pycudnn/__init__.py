"""pycudnn: NVIDIA cuDNN convolutions for any Python GPU stack, through ctypes.

Importing pycudnn is cheap: no submodule with heavy imports and no libcudnn is loaded until a
name that needs it is first used (PEP 562 module ``__getattr__``).

Two versions: ``pycudnn.__version__`` is pycudnn's own (the one place it is written; the package
metadata reads it), and [`cudnn_version()`][pycudnn.cudnn_version] is the loaded cuDNN library's.
"""

from __future__ import annotations

import importlib
import os as _os
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"  # the only place pycudnn's version is written (pyproject.toml reads it)

# public name -> submodule that defines it
_EXPORTS: dict[str, str] = {
    # library
    "version": "_lib", "version_tuple": "_lib", "library_path": "_lib", "cudart_version": "_lib",
    # errors
    "PycudnnError": "errors", "CudnnError": "errors", "CudnnBadParamError": "errors",
    "CudnnNotSupportedError": "errors", "CudnnInternalError": "errors",
    "CudnnExecutionError": "errors", "CudnnAllocationError": "errors",
    "CudnnNotInitializedError": "errors", "OutOfMemoryError": "errors",
    "CudnnNotFoundError": "errors", "NoDeviceError": "errors", "NoAlgorithmError": "errors",
    "StreamCaptureError": "errors",
    # descriptors
    "TensorDescriptor": "descriptors", "FilterDescriptor": "descriptors",
    "ConvolutionDescriptor": "descriptors", "ActivationDescriptor": "descriptors",
    # tensors
    "Tensor": "tensor", "as_tensor": "tensor", "tensor_from_pointer": "tensor", "empty": "tensor",
    "zeros": "tensor", "from_numpy": "tensor",
    # handles and streams
    "get_handle": "handle", "device_count": "handle", "current_stream": "interop",
    # configuration
    "config": "configuration", "flags": "configuration",
    # algorithm search and caches
    "benchmark_cache": "engines", "clear_caches": "engines", "set_cache_limit": "engines",
    "ConvolutionParams": "problem",
    # the tuning database's records made ready ahead of the first call
    "preload": "preloading", "PreloadReport": "preloading",
    # prepared convolutions
    "prepare_convolution": "conv", "PreparedConvolution": "prepared",
    # convolutions
    "convolution": "conv", "conv_transpose": "conv", "convolution_backward_data": "conv",
    "convolution_backward_filter": "conv", "convolution_add_relu": "conv",
}

__all__ = sorted([*_EXPORTS, "cudnn_version"]) + ["__version__"]

if _os.environ.get("PYCUDNN_LOG"):  # a stderr handler on the "pycudnn" logger (see _logging)
    from ._logging import configure_from_env as _configure_logging

    _configure_logging()
    del _configure_logging


def cudnn_version() -> int:
    """The loaded cuDNN library's version as an int: 91900 for cuDNN 9.19.0.

    Loads libcudnn on the first call (no GPU needed). `pycudnn.version()` is the same function
    under its older name; pycudnn's own version is `pycudnn.__version__`.

    Raises:
        CudnnNotFoundError: no usable libcudnn was found.
    """
    from ._lib import version

    return version()


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pycudnn' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from ._lib import cudart_version, library_path, version, version_tuple
    from .engines import benchmark_cache, clear_caches, set_cache_limit
    from .problem import ConvolutionParams
    from .configuration import config, flags
    from .conv import (conv_transpose, convolution, convolution_add_relu,
                       convolution_backward_data, convolution_backward_filter)
    from .descriptors import (ActivationDescriptor, ConvolutionDescriptor, FilterDescriptor,
                              TensorDescriptor)
    from .errors import *  # noqa: F403
    from .handle import device_count, get_handle
    from .preloading import PreloadReport, preload
    from .conv import prepare_convolution
    from .prepared import PreparedConvolution
    from .interop import current_stream
    from .tensor import Tensor, as_tensor, empty, from_numpy, tensor_from_pointer, zeros
