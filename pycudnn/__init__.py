"""pycudnn: NVIDIA cuDNN convolutions for any Python GPU stack, through ctypes.

pycudnn runs cuDNN's convolutions (forward, both gradients, transposed, with fused bias, ReLU
and residual) and its CNN operations (activations, softmax, pooling, batch normalization,
dropout) on the device arrays a program already has (CuPy, PyTorch, JAX, Numba or anything with
``__cuda_array_interface__`` or ``__dlpack__``), without copies. It chooses each convolution's
algorithm as PyTorch does (cuDNN's heuristics, or a measured search with ``benchmark=True``,
remembered for each problem and kept on disk for later processes); ``pycudnn.cupy_compat`` is a
drop-in for CuPy 13's ``cupyx.cudnn`` and ``pycudnn.torch`` a PyTorch integration.

Importing pycudnn is cheap: no submodule with heavy imports and no libcudnn is loaded until a
name that needs it is first used (PEP 562 module ``__getattr__``).

Two versions: ``pycudnn.__version__`` is pycudnn's own (written once, in ``pycudnn/_version.py``,
which the package metadata reads), and `cudnn_version()` is the loaded cuDNN library's.
"""

from __future__ import annotations

import importlib
import os as _os
from typing import TYPE_CHECKING, Any

from ._version import __version__

# public name -> module (inside pycudnn) that defines it
_EXPORTS: dict[str, str] = {
    # library
    "library_path": "ffi.library", "cudart_version": "ffi.library",
    # errors
    "PycudnnError": "errors", "CudnnError": "errors", "CudnnBadParamError": "errors",
    "CudnnNotSupportedError": "errors", "CudnnInternalError": "errors",
    "CudnnExecutionError": "errors", "CudnnAllocationError": "errors",
    "CudnnNotInitializedError": "errors", "OutOfMemoryError": "errors",
    "CudnnNotFoundError": "errors", "NoDeviceError": "errors", "NoAlgorithmError": "errors",
    "StreamCaptureError": "errors",
    # descriptors
    "TensorDescriptor": "cudnn.descriptors", "FilterDescriptor": "cudnn.descriptors",
    "ConvolutionDescriptor": "cudnn.descriptors", "ActivationDescriptor": "cudnn.descriptors",
    # the types the public signatures name
    "TensorLike": "runtime.tensor", "StreamLike": "runtime.memory", "ConvolutionFlags": "configuration",
    "DTypeLike": "_types", "DeviceLike": "runtime.memory",
    # tensors
    "Tensor": "runtime.tensor", "as_tensor": "runtime.tensor", "tensor_from_pointer": "runtime.tensor", "empty": "runtime.tensor",
    "zeros": "runtime.tensor", "from_numpy": "runtime.tensor",
    # handles and streams
    "get_handle": "runtime.handle", "device_count": "runtime.handle", "current_stream": "runtime.interop",
    # configuration
    "config": "configuration", "flags": "configuration",
    # algorithm search and caches
    "benchmark_cache": "api.caches", "clear_caches": "api.caches", "set_cache_limit": "api.caches",
    "ConvolutionParams": "engines.problem",
    # the tuning database's records made ready ahead of the first call
    "preload": "search.preload", "PreloadReport": "search.preload",
    # prepared convolutions
    "prepare_convolution": "api.conv", "PreparedConvolution": "api.prepared",
    # convolutions
    "convolution": "api.conv", "conv_transpose": "api.conv", "convolution_backward_data": "api.conv",
    "convolution_backward_filter": "api.conv", "convolution_add_relu": "api.conv",
    "conv_transpose_backward_data": "api.conv", "conv_transpose_backward_filter": "api.conv",
    # operations beside convolutions
    "activation_forward": "ops.activation", "activation_backward": "ops.activation",
    "softmax_forward": "ops.softmax", "softmax_backward": "ops.softmax",
    "hardtanh_forward": "ops.hardtanh", "hardtanh_backward": "ops.hardtanh",
    "pooling_forward": "ops.pooling", "pooling_backward": "ops.pooling",
    "PoolingDescriptor": "cudnn.descriptors",
    "batch_norm_forward_training": "ops.batchnorm", "batch_norm_forward_inference": "ops.batchnorm",
    "batch_norm_backward": "ops.batchnorm", "batch_norm_add_relu_forward_training": "ops.batchnorm",
    "batch_norm_add_relu_backward": "ops.batchnorm", "BatchNormResult": "ops.batchnorm",
    "DropoutState": "ops.dropout", "dropout_forward": "ops.dropout", "dropout_backward": "ops.dropout",
    "DropoutReserve": "ops.dropout",
}

__all__ = sorted([*_EXPORTS, "cudnn_version", "cudnn_version_tuple"]) + ["__version__"]

if _os.environ.get("PYCUDNN_LOG"):  # a stderr handler on the "pycudnn" logger (see _logging)
    from ._logging import configure_from_env as _configure_logging

    _configure_logging()
    del _configure_logging


def cudnn_version() -> int:
    """The loaded cuDNN library's version as an int: 91900 for cuDNN 9.19.0.

    Loads libcudnn on the first call (no GPU needed). pycudnn's own version is
    `pycudnn.__version__`.

    Raises:
        CudnnNotFoundError: no usable libcudnn was found.
    """
    from .ffi.library import version

    return version()


def cudnn_version_tuple() -> tuple[int, int, int]:
    """The loaded cuDNN library's version as ``(major, minor, patch)``: ``(9, 19, 0)``.

    Loads libcudnn on the first call (no GPU needed).

    Raises:
        CudnnNotFoundError: no usable libcudnn was found.
    """
    from .ffi.library import version_tuple

    return version_tuple()


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
    # ``name as name``: a re-export (mypy --strict and pyright read no computed __all__)
    from .ffi.library import cudart_version as cudart_version, library_path as library_path
    from .errors import (CudnnAllocationError as CudnnAllocationError,
                         CudnnBadParamError as CudnnBadParamError, CudnnError as CudnnError,
                         CudnnExecutionError as CudnnExecutionError,
                         CudnnInternalError as CudnnInternalError,
                         CudnnNotFoundError as CudnnNotFoundError,
                         CudnnNotInitializedError as CudnnNotInitializedError,
                         CudnnNotSupportedError as CudnnNotSupportedError,
                         NoAlgorithmError as NoAlgorithmError, NoDeviceError as NoDeviceError,
                         OutOfMemoryError as OutOfMemoryError, PycudnnError as PycudnnError,
                         StreamCaptureError as StreamCaptureError)
    from .cudnn.descriptors import (ActivationDescriptor as ActivationDescriptor,
                                    ConvolutionDescriptor as ConvolutionDescriptor,
                                    FilterDescriptor as FilterDescriptor,
                                    PoolingDescriptor as PoolingDescriptor,
                                    TensorDescriptor as TensorDescriptor)
    from .runtime.tensor import (Tensor as Tensor, TensorLike as TensorLike, as_tensor as as_tensor,
                                 empty as empty, from_numpy as from_numpy,
                                 tensor_from_pointer as tensor_from_pointer, zeros as zeros)
    from .runtime.memory import DeviceLike as DeviceLike, StreamLike as StreamLike
    from ._types import DTypeLike as DTypeLike
    from .configuration import (ConvolutionFlags as ConvolutionFlags, config as config,
                                flags as flags)
    from .runtime.handle import (device_count as device_count, get_handle as get_handle)
    from .runtime.interop import current_stream as current_stream
    from .api.caches import (benchmark_cache as benchmark_cache, clear_caches as clear_caches,
                                   set_cache_limit as set_cache_limit)
    from .engines.problem import ConvolutionParams as ConvolutionParams
    from .search.preload import (PreloadReport as PreloadReport, preload as preload)
    from .api.conv import (conv_transpose as conv_transpose,
                           conv_transpose_backward_data as conv_transpose_backward_data,
                           conv_transpose_backward_filter as conv_transpose_backward_filter,
                           convolution as convolution,
                           convolution_add_relu as convolution_add_relu,
                           convolution_backward_data as convolution_backward_data,
                           convolution_backward_filter as convolution_backward_filter,
                           prepare_convolution as prepare_convolution)
    from .api.prepared import PreparedConvolution as PreparedConvolution
    from .ops.activation import (activation_backward as activation_backward,
                                 activation_forward as activation_forward)
    from .ops.softmax import (softmax_backward as softmax_backward,
                              softmax_forward as softmax_forward)
    from .ops.hardtanh import (hardtanh_backward as hardtanh_backward,
                               hardtanh_forward as hardtanh_forward)
    from .ops.pooling import (pooling_backward as pooling_backward,
                              pooling_forward as pooling_forward)
    from .ops.batchnorm import (BatchNormResult as BatchNormResult,
                                batch_norm_add_relu_backward as batch_norm_add_relu_backward,
                                batch_norm_add_relu_forward_training as batch_norm_add_relu_forward_training,
                                batch_norm_backward as batch_norm_backward,
                                batch_norm_forward_inference as batch_norm_forward_inference,
                                batch_norm_forward_training as batch_norm_forward_training)
    from .ops.dropout import (DropoutReserve as DropoutReserve, DropoutState as DropoutState,
                              dropout_backward as dropout_backward,
                              dropout_forward as dropout_forward)
