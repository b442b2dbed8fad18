"""Python mirrors of the cuDNN C enums and structures pycudnn uses (values from cuDNN 9 headers).

Nothing here loads the library: these are plain values and ctypes layouts.
"""

from __future__ import annotations

import ctypes
from enum import IntEnum
from typing import Any, Protocol, Union

import numpy as np
import numpy.typing as npt

__all__ = [
    "Status", "DataType", "TensorFormat", "ConvolutionMode", "MathType", "Determinism",
    "NanPropagation", "ActivationMode", "PoolingMode", "SoftmaxAlgorithm", "SoftmaxMode",
    "OpTensorOp", "FwdAlgo", "BwdDataAlgo", "BwdFilterAlgo",
    "ConvolutionFwdAlgoPerf", "ConvolutionBwdDataAlgoPerf", "ConvolutionBwdFilterAlgoPerf",
    "LibraryProperty", "dtype_to_cudnn", "normalize_dtype", "SUPPORTED_DTYPES",
    "DTypeLike", "SupportsDType",
]


class Status(IntEnum):
    """cudnnStatus_t (cuDNN 9 numbering: families 1xxx..5xxx)."""
    SUCCESS = 0
    NOT_INITIALIZED = 1001
    SUBLIBRARY_VERSION_MISMATCH = 1002
    SERIALIZATION_VERSION_MISMATCH = 1003
    DEPRECATED = 1004
    LICENSE_ERROR = 1005
    RUNTIME_IN_PROGRESS = 1006
    RUNTIME_FP_OVERFLOW = 1007
    SUBLIBRARY_LOADING_FAILED = 1008
    BAD_PARAM = 2000
    INVALID_VALUE = 2001
    BAD_PARAM_NULL_POINTER = 2002
    BAD_PARAM_MISALIGNED_POINTER = 2003
    BAD_PARAM_NOT_FINALIZED = 2004
    BAD_PARAM_OUT_OF_BOUND = 2005
    BAD_PARAM_SIZE_INSUFFICIENT = 2006
    BAD_PARAM_STREAM_MISMATCH = 2007
    BAD_PARAM_SHAPE_MISMATCH = 2008
    BAD_PARAM_DUPLICATED_ENTRIES = 2009
    BAD_PARAM_ATTRIBUTE_TYPE = 2010
    BAD_PARAM_CUDA_GRAPH_MISMATCH = 2011
    BAD_PARAM_DESCRIPTOR_TYPE = 2012
    NOT_SUPPORTED = 3000
    NOT_SUPPORTED_GRAPH_PATTERN = 3001
    NOT_SUPPORTED_SHAPE = 3002
    NOT_SUPPORTED_DATA_TYPE = 3003
    NOT_SUPPORTED_LAYOUT = 3004
    NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER = 3005
    NOT_SUPPORTED_INCOMPATIBLE_CUDART = 3006
    NOT_SUPPORTED_ARCH_MISMATCH = 3007
    NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING = 3008
    NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE = 3009
    NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT = 3010
    NOT_SUPPORTED_PADDING = 3011
    NOT_SUPPORTED_BAD_LAUNCH_PARAM = 3012
    NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API = 3013
    NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE = 3014
    INTERNAL_ERROR = 4000
    INTERNAL_ERROR_COMPILATION_FAILED = 4001
    INTERNAL_ERROR_UNEXPECTED_VALUE = 4002
    INTERNAL_ERROR_HOST_ALLOCATION_FAILED = 4003
    INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED = 4004
    INTERNAL_ERROR_BAD_LAUNCH_PARAM = 4005
    INTERNAL_ERROR_TEXTURE_CREATION_FAILED = 4006
    EXECUTION_FAILED = 5000
    EXECUTION_FAILED_CUDA_DRIVER = 5001
    EXECUTION_FAILED_CUBLAS = 5002
    EXECUTION_FAILED_CUDART = 5003
    EXECUTION_FAILED_CURAND = 5004

    @property
    def symbol(self) -> str:
        return "CUDNN_STATUS_" + self.name


class DataType(IntEnum):
    """cudnnDataType_t (the members pycudnn uses)."""
    FLOAT = 0
    DOUBLE = 1
    HALF = 2
    INT8 = 3
    INT32 = 4
    UINT8 = 6
    BFLOAT16 = 9
    INT64 = 10
    BOOLEAN = 11


class TensorFormat(IntEnum):
    NCHW = 0
    NHWC = 1
    NCHW_VECT_C = 2


class ConvolutionMode(IntEnum):
    CONVOLUTION = 0
    CROSS_CORRELATION = 1


class MathType(IntEnum):
    DEFAULT_MATH = 0
    TENSOR_OP_MATH = 1
    TENSOR_OP_MATH_ALLOW_CONVERSION = 2
    FMA_MATH = 3


class Determinism(IntEnum):
    NON_DETERMINISTIC = 0
    DETERMINISTIC = 1


class NanPropagation(IntEnum):
    NOT_PROPAGATE_NAN = 0
    PROPAGATE_NAN = 1


class ActivationMode(IntEnum):
    SIGMOID = 0
    RELU = 1
    TANH = 2
    CLIPPED_RELU = 3
    ELU = 4
    IDENTITY = 5
    SWISH = 6


class PoolingMode(IntEnum):
    """``cudnnPoolingMode_t``"""
    MAX = 0
    AVERAGE_COUNT_INCLUDE_PADDING = 1
    AVERAGE_COUNT_EXCLUDE_PADDING = 2
    MAX_DETERMINISTIC = 3


class SoftmaxAlgorithm(IntEnum):
    """``cudnnSoftmaxAlgorithm_t``"""
    FAST = 0
    ACCURATE = 1
    LOG = 2


class SoftmaxMode(IntEnum):
    """``cudnnSoftmaxMode_t``"""
    INSTANCE = 0
    CHANNEL = 1


class OpTensorOp(IntEnum):
    ADD = 0
    MUL = 1
    MIN = 2
    MAX = 3
    SQRT = 4
    NOT = 5


class FwdAlgo(IntEnum):
    """cudnnConvolutionFwdAlgo_t"""
    IMPLICIT_GEMM = 0
    IMPLICIT_PRECOMP_GEMM = 1
    GEMM = 2
    DIRECT = 3
    FFT = 4
    FFT_TILING = 5
    WINOGRAD = 6
    WINOGRAD_NONFUSED = 7


class BwdDataAlgo(IntEnum):
    """cudnnConvolutionBwdDataAlgo_t"""
    ALGO_0 = 0
    ALGO_1 = 1
    FFT = 2
    FFT_TILING = 3
    WINOGRAD = 4
    WINOGRAD_NONFUSED = 5


class BwdFilterAlgo(IntEnum):
    """cudnnConvolutionBwdFilterAlgo_t"""
    ALGO_0 = 0
    ALGO_1 = 1
    FFT = 2
    ALGO_3 = 3
    WINOGRAD = 4
    WINOGRAD_NONFUSED = 5
    FFT_TILING = 6


class LibraryProperty(IntEnum):
    MAJOR_VERSION = 0
    MINOR_VERSION = 1
    PATCH_LEVEL = 2


class _AlgoPerfBase(ctypes.Structure):
    """Common layout of the three cudnnConvolution*AlgoPerf_t structures."""
    _fields_ = [
        ("algo", ctypes.c_int),
        ("status", ctypes.c_int),
        ("time", ctypes.c_float),
        ("memory", ctypes.c_size_t),
        ("determinism", ctypes.c_int),
        ("mathType", ctypes.c_int),
        ("reserved", ctypes.c_int * 3),
    ]


class ConvolutionFwdAlgoPerf(_AlgoPerfBase):
    """cudnnConvolutionFwdAlgoPerf_t"""


class ConvolutionBwdDataAlgoPerf(_AlgoPerfBase):
    """cudnnConvolutionBwdDataAlgoPerf_t"""


class ConvolutionBwdFilterAlgoPerf(_AlgoPerfBase):
    """cudnnConvolutionBwdFilterAlgoPerf_t"""


# ---- dtypes -------------------------------------------------------------------------------------

def _bfloat16() -> np.dtype:
    import ml_dtypes  # imported lazily: only needed when bfloat16 is asked for

    return np.dtype(ml_dtypes.bfloat16)


_DTYPE_NAMES = {"float32": "float32", "float": "float32", "float16": "float16", "half": "float16",
                "bfloat16": "bfloat16", "float64": "float64", "double": "float64"}

#: names of the data types pycudnn's convolutions take
SUPPORTED_DTYPES = ("float32", "float16", "bfloat16", "float64")

_TO_CUDNN = {"float32": DataType.FLOAT, "float16": DataType.HALF, "bfloat16": DataType.BFLOAT16,
             "float64": DataType.DOUBLE}


class SupportsDType(Protocol):
    """An object with a numpy ``.dtype`` (a numpy array, a `pycudnn.Tensor`): ``numpy.dtype()``
    reads that attribute."""

    @property
    def dtype(self) -> np.dtype[Any]: ...


DTypeLike = Union[str, np.dtype[Any], type[np.generic], type[float], SupportsDType]
"""What `normalize_dtype()`, and so every pycudnn ``dtype=`` parameter, accepts: a name
(``"float32"``, ``"float"``, ``"half"``, ``"bfloat16"``, ...), a numpy dtype, a numpy scalar type
(``numpy.float16``, ``ml_dtypes.bfloat16``), Python's ``float`` (float64), or an object with a
``.dtype``. Each must name one of `SUPPORTED_DTYPES` (TypeError otherwise, at run time)."""


def normalize_dtype(dtype: npt.DTypeLike, parameter: str = "dtype") -> np.dtype:
    """Return the numpy dtype for a numpy dtype, a type or a name; refuse what cuDNN convs lack.

    Raises:
        TypeError: with the parameter name, the value given and the accepted names; also for
            ``None`` (numpy would read it as float64) and for a non-native byte order (cuDNN
            reads device memory in the machine's order).
    """
    if dtype is None:
        raise TypeError(f"{parameter}: expected a dtype (one of {', '.join(SUPPORTED_DTYPES)}), got None")
    if isinstance(dtype, str):
        name = _DTYPE_NAMES.get(dtype.lower())
        if name is None:
            raise TypeError(f"{parameter}: unsupported dtype {dtype!r}; expected one of "
                            f"{', '.join(SUPPORTED_DTYPES)}")
        return _bfloat16() if name == "bfloat16" else np.dtype(name)
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{parameter}: unsupported dtype {dtype!r}; expected one of "
                        f"{', '.join(SUPPORTED_DTYPES)}") from None
    if dt.name not in _TO_CUDNN:
        raise TypeError(f"{parameter}: unsupported dtype {dt.name!r}; expected one of "
                        f"{', '.join(SUPPORTED_DTYPES)}")
    if not dt.isnative and dt.itemsize > 1:
        raise TypeError(f"{parameter}: dtype {dt.str!r} has non-native byte order; device memory "
                        f"is read in the machine's order: use {dt.newbyteorder('=').name}")
    return dt


def dtype_to_cudnn(dtype: npt.DTypeLike) -> DataType:
    """cuDNN data type of a dtype (numpy dtype or name)."""
    return _TO_CUDNN[normalize_dtype(dtype).name]
