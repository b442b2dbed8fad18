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

# module (inside pycudnn) -> the public names it defines, by topic
_MODULES: dict[str, str] = {
    "ffi.library": "library_path cudart_version",
    "errors": """PycudnnError CudnnError CudnnBadParamError CudnnNotSupportedError
        CudnnInternalError CudnnExecutionError CudnnAllocationError CudnnNotInitializedError
        OutOfMemoryError CudnnNotFoundError NoDeviceError NoAlgorithmError StreamCaptureError""",
    "cudnn.descriptors": """TensorDescriptor FilterDescriptor ConvolutionDescriptor
        ActivationDescriptor PoolingDescriptor""",
    # the types the public signatures name, tensors, handles and streams, configuration
    "runtime.tensor": "TensorLike Tensor as_tensor tensor_from_pointer empty zeros from_numpy",
    "runtime.memory": "StreamLike DeviceLike",
    "_types": "DTypeLike",
    "runtime.handle": "get_handle device_count",
    "runtime.interop": "current_stream",
    "configuration": "ConvolutionFlags config flags",
    # algorithm search and caches; the tuning database's records made ready ahead of the first
    # call
    "api.caches": "benchmark_cache clear_caches set_cache_limit",
    "engines.problem": "ConvolutionParams",
    "search.preload": "preload PreloadReport",
    # convolutions, prepared ones
    "api.conv": """prepare_convolution convolution conv_transpose convolution_backward_data
        convolution_backward_filter convolution_add_relu conv_transpose_backward_data
        conv_transpose_backward_filter""",
    "api.prepared": "PreparedConvolution",
    # operations beside convolutions
    "ops.activation": "activation_forward activation_backward",
    "ops.softmax": "softmax_forward softmax_backward",
    "ops.hardtanh": "hardtanh_forward hardtanh_backward",
    "ops.pooling": "pooling_forward pooling_backward",
    "ops.batchnorm": """batch_norm_forward_training batch_norm_forward_inference
        batch_norm_backward batch_norm_add_relu_forward_training batch_norm_add_relu_backward
        BatchNormResult""",
    "ops.dropout": "DropoutState dropout_forward dropout_backward DropoutReserve",
}
# public name -> module that defines it
_EXPORTS: dict[str, str] = {name: module for module, names in _MODULES.items()
                            for name in names.split()}

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
