"""The cuDNN backend (graph) API: enums and an owning, typed wrapper of backend descriptors.

Every value is taken from cuDNN's header ``cudnn_graph_v9.h`` (``tests/test_backend.py`` parses
the header and compares); only the attribute names pycudnn uses are listed.

`BackendDescriptor` is the only place that deals in raw attribute types: callers use typed
setters and getters (``set_int64s``, ``set_enum``, ``set_descriptors``, ``get_descriptors``...),
which validate their arguments before any C call (a non-descriptor passed where cuDNN expects a
descriptor segfaults) and choose the C element type the attribute needs.

The C object is freed by a ``weakref.finalize`` whose callback never holds ``self``; `close()`
frees it now, and use after close raises `ClosedDescriptorError` instead of handing a dead
pointer to cuDNN. Finalizers do not run at interpreter exit (``atexit = False``): destroying an
execution plan after the CUDA context is gone is not safe (PyTorch leaks its handles alike).
"""

from __future__ import annotations

import contextlib
import ctypes
from ctypes import c_bool, c_char, c_double, c_float, c_int32, c_int64, c_void_p
from enum import IntEnum
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy.typing as npt

from .._live import LiveCounter, finalizer
from .._types import DataType, dtype_to_cudnn
from ..errors import PycudnnError
from . import library as _lib

__all__ = [
    "DescriptorType", "Attr", "AttrType", "HeurMode", "BehaviorNote", "NumericalNote",
    "PointwiseMode", "KnobType", "ConvMode", "GenStatsMode", "BnFinalizeStatsMode",
    "BackendDescriptor", "ClosedDescriptorError",
    "live_count", "live_counts_by_type", "ATTRIBUTE_TYPES", "to_data_type",
]


# ---- enums (values from cudnn_graph_v9.h) ---------------------------------------------------------

class DescriptorType(IntEnum):
    """cudnnBackendDescriptorType_t (prefix ``CUDNN_BACKEND_``, suffix ``_DESCRIPTOR``)."""
    POINTWISE = 0
    CONVOLUTION = 1
    ENGINE = 2
    ENGINECFG = 3
    ENGINEHEUR = 4
    EXECUTION_PLAN = 5
    INTERMEDIATE_INFO = 6
    KNOB_CHOICE = 7
    KNOB_INFO = 8
    LAYOUT_INFO = 9
    OPERATION_CONVOLUTION_FORWARD = 10
    OPERATION_CONVOLUTION_BACKWARD_FILTER = 11
    OPERATION_CONVOLUTION_BACKWARD_DATA = 12
    OPERATION_POINTWISE = 13
    OPERATION_GEN_STATS = 14
    OPERATIONGRAPH = 15
    VARIANT_PACK = 16
    TENSOR = 17
    MATMUL = 18
    OPERATION_MATMUL = 19
    OPERATION_BN_FINALIZE_STATISTICS = 20
    REDUCTION = 21
    OPERATION_REDUCTION = 22
    OPERATION_BN_BWD_WEIGHTS = 23
    KERNEL_CACHE = 34
    DEVICEPROP = 38

    @property
    def symbol(self) -> str:
        return f"CUDNN_BACKEND_{self.name}_DESCRIPTOR"


class Attr(IntEnum):
    """cudnnBackendAttributeName_t (prefix ``CUDNN_ATTR_``): the names pycudnn uses."""
    POINTWISE_MODE = 0
    POINTWISE_MATH_PREC = 1
    POINTWISE_RELU_LOWER_CLIP = 3
    POINTWISE_RELU_UPPER_CLIP = 4
    POINTWISE_RELU_LOWER_CLIP_SLOPE = 5
    POINTWISE_ELU_ALPHA = 6
    POINTWISE_SWISH_BETA = 8
    CONVOLUTION_COMP_TYPE = 100
    CONVOLUTION_CONV_MODE = 101
    CONVOLUTION_DILATIONS = 102
    CONVOLUTION_FILTER_STRIDES = 103
    CONVOLUTION_POST_PADDINGS = 104
    CONVOLUTION_PRE_PADDINGS = 105
    CONVOLUTION_SPATIAL_DIMS = 106
    ENGINEHEUR_MODE = 200
    ENGINEHEUR_OPERATION_GRAPH = 201
    ENGINEHEUR_RESULTS = 202
    ENGINECFG_ENGINE = 300
    ENGINECFG_INTERMEDIATE_INFO = 301
    ENGINECFG_KNOB_CHOICES = 302
    ENGINECFG_WORKSPACE_SIZE = 303
    EXECUTION_PLAN_HANDLE = 400
    EXECUTION_PLAN_ENGINE_CONFIG = 401
    EXECUTION_PLAN_WORKSPACE_SIZE = 402
    EXECUTION_PLAN_COMPUTED_INTERMEDIATE_UIDS = 403
    EXECUTION_PLAN_RUN_ONLY_INTERMEDIATE_UIDS = 404
    EXECUTION_PLAN_JSON_REPRESENTATION = 405
    KNOB_CHOICE_KNOB_TYPE = 600
    KNOB_CHOICE_KNOB_VALUE = 601
    OPERATION_CONVOLUTION_FORWARD_ALPHA = 700
    OPERATION_CONVOLUTION_FORWARD_BETA = 701
    OPERATION_CONVOLUTION_FORWARD_CONV_DESC = 702
    OPERATION_CONVOLUTION_FORWARD_W = 703
    OPERATION_CONVOLUTION_FORWARD_X = 704
    OPERATION_CONVOLUTION_FORWARD_Y = 705
    OPERATION_CONVOLUTION_BWD_DATA_ALPHA = 706
    OPERATION_CONVOLUTION_BWD_DATA_BETA = 707
    OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC = 708
    OPERATION_CONVOLUTION_BWD_DATA_W = 709
    OPERATION_CONVOLUTION_BWD_DATA_DX = 710
    OPERATION_CONVOLUTION_BWD_DATA_DY = 711
    OPERATION_CONVOLUTION_BWD_FILTER_ALPHA = 712
    OPERATION_CONVOLUTION_BWD_FILTER_BETA = 713
    OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC = 714
    OPERATION_CONVOLUTION_BWD_FILTER_DW = 715
    OPERATION_CONVOLUTION_BWD_FILTER_X = 716
    OPERATION_CONVOLUTION_BWD_FILTER_DY = 717
    OPERATION_POINTWISE_PW_DESCRIPTOR = 750
    OPERATION_POINTWISE_XDESC = 751
    OPERATION_POINTWISE_BDESC = 752
    OPERATION_POINTWISE_YDESC = 753
    OPERATION_POINTWISE_ALPHA1 = 754
    OPERATION_POINTWISE_ALPHA2 = 755
    OPERATION_POINTWISE_DXDESC = 756
    OPERATION_POINTWISE_DYDESC = 757
    OPERATION_GENSTATS_MODE = 770
    OPERATION_GENSTATS_MATH_PREC = 771
    OPERATION_GENSTATS_XDESC = 772
    OPERATION_GENSTATS_SUMDESC = 773
    OPERATION_GENSTATS_SQSUMDESC = 774
    OPERATION_BN_FINALIZE_STATS_MODE = 780
    OPERATION_BN_FINALIZE_MATH_PREC = 781
    OPERATION_BN_FINALIZE_Y_SUM_DESC = 782
    OPERATION_BN_FINALIZE_Y_SQ_SUM_DESC = 783
    OPERATION_BN_FINALIZE_SCALE_DESC = 784
    OPERATION_BN_FINALIZE_BIAS_DESC = 785
    OPERATION_BN_FINALIZE_PREV_RUNNING_MEAN_DESC = 786
    OPERATION_BN_FINALIZE_PREV_RUNNING_VAR_DESC = 787
    OPERATION_BN_FINALIZE_UPDATED_RUNNING_MEAN_DESC = 788
    OPERATION_BN_FINALIZE_UPDATED_RUNNING_VAR_DESC = 789
    OPERATION_BN_FINALIZE_SAVED_MEAN_DESC = 790
    OPERATION_BN_FINALIZE_SAVED_INV_STD_DESC = 791
    OPERATION_BN_FINALIZE_EQ_SCALE_DESC = 792
    OPERATION_BN_FINALIZE_EQ_BIAS_DESC = 793
    OPERATION_BN_FINALIZE_ACCUM_COUNT_DESC = 794
    OPERATION_BN_FINALIZE_EPSILON_DESC = 795
    OPERATION_BN_FINALIZE_EXP_AVERATE_FACTOR_DESC = 796  # cuDNN's own spelling
    OPERATIONGRAPH_HANDLE = 800
    OPERATIONGRAPH_OPS = 801
    OPERATIONGRAPH_ENGINE_GLOBAL_COUNT = 802
    TENSOR_BYTE_ALIGNMENT = 900
    TENSOR_DATA_TYPE = 901
    TENSOR_DIMENSIONS = 902
    TENSOR_STRIDES = 903
    TENSOR_VECTOR_COUNT = 904
    TENSOR_VECTORIZED_DIMENSION = 905
    TENSOR_UNIQUE_ID = 906
    TENSOR_IS_VIRTUAL = 907
    TENSOR_IS_BY_VALUE = 908
    VARIANT_PACK_UNIQUE_IDS = 1000
    VARIANT_PACK_DATA_POINTERS = 1001
    VARIANT_PACK_INTERMEDIATES = 1002
    VARIANT_PACK_WORKSPACE = 1003
    KNOB_INFO_TYPE = 1200
    KNOB_INFO_MAXIMUM_VALUE = 1201
    KNOB_INFO_MINIMUM_VALUE = 1202
    KNOB_INFO_STRIDE = 1203
    ENGINE_OPERATION_GRAPH = 1300
    ENGINE_GLOBAL_INDEX = 1301
    ENGINE_KNOB_INFO = 1302
    ENGINE_NUMERICAL_NOTE = 1303
    ENGINE_LAYOUT_INFO = 1304
    ENGINE_BEHAVIOR_NOTE = 1305
    OPERATION_BN_BWD_WEIGHTS_MATH_PREC = 1620
    OPERATION_BN_BWD_WEIGHTS_MEAN_DESC = 1621
    OPERATION_BN_BWD_WEIGHTS_INVSTD_DESC = 1622
    OPERATION_BN_BWD_WEIGHTS_BN_SCALE_DESC = 1623
    OPERATION_BN_BWD_WEIGHTS_X_DESC = 1624
    OPERATION_BN_BWD_WEIGHTS_DY_DESC = 1625
    OPERATION_BN_BWD_WEIGHTS_DBN_SCALE_DESC = 1626
    OPERATION_BN_BWD_WEIGHTS_DBN_BIAS_DESC = 1627
    OPERATION_BN_BWD_WEIGHTS_EQ_DY_SCALE_DESC = 1628
    OPERATION_BN_BWD_WEIGHTS_EQ_X_SCALE_DESC = 1629
    OPERATION_BN_BWD_WEIGHTS_EQ_BIAS = 1630

    @property
    def symbol(self) -> str:
        return f"CUDNN_ATTR_{self.name}"


class AttrType(IntEnum):
    """cudnnBackendAttributeType_t (prefix ``CUDNN_TYPE_``)."""
    HANDLE = 0
    DATA_TYPE = 1
    BOOLEAN = 2
    INT64 = 3
    FLOAT = 4
    DOUBLE = 5
    VOID_PTR = 6
    CONVOLUTION_MODE = 7
    HEUR_MODE = 8
    KNOB_TYPE = 9
    NUMERICAL_NOTE = 11
    LAYOUT_TYPE = 12
    ATTRIB_NAME = 13
    POINTWISE_MODE = 14
    BACKEND_DESCRIPTOR = 15
    GENSTATS_MODE = 16
    BN_FINALIZE_STATS_MODE = 17
    BEHAVIOR_NOTE = 19
    INT32 = 23
    CHAR = 24

    @property
    def symbol(self) -> str:
        return f"CUDNN_TYPE_{self.name}"


class HeurMode(IntEnum):
    """cudnnBackendHeurMode_t (prefix ``CUDNN_HEUR_MODE_``)."""
    INSTANT = 0
    B = 1
    FALLBACK = 2
    A = 3


class BehaviorNote(IntEnum):
    """cudnnBackendBehaviorNote_t (prefix ``CUDNN_BEHAVIOR_NOTE_``)."""
    RUNTIME_COMPILATION = 0
    REQUIRES_FILTER_INT8x32_REORDER = 1
    REQUIRES_BIAS_INT8x32_REORDER = 2
    SUPPORTS_CUDA_GRAPH_NATIVE_API = 3
    CUBLASLT_DEPENDENCY = 4


class NumericalNote(IntEnum):
    """cudnnBackendNumericalNote_t (prefix ``CUDNN_NUMERICAL_NOTE_``)."""
    TENSOR_CORE = 0
    DOWN_CONVERT_INPUTS = 1
    REDUCED_PRECISION_REDUCTION = 2
    FFT = 3
    NONDETERMINISTIC = 4
    WINOGRAD = 5
    WINOGRAD_TILE_4x4 = 6
    WINOGRAD_TILE_6x6 = 7
    WINOGRAD_TILE_13x13 = 8
    STRICT_NAN_PROP = 9


class PointwiseMode(IntEnum):
    """cudnnPointwiseMode_t (prefix ``CUDNN_POINTWISE_``): the modes pycudnn uses."""
    ADD = 0
    MUL = 1
    MIN = 2
    MAX = 3
    SQRT = 4
    DIV = 6
    SUB = 9
    NEG = 16
    RSQRT = 17
    IDENTITY = 21
    RELU_FWD = 100
    TANH_FWD = 101
    SIGMOID_FWD = 102
    ELU_FWD = 103
    GELU_FWD = 104
    SWISH_FWD = 106
    GELU_APPROX_TANH_FWD = 107
    RELU_BWD = 200
    TANH_BWD = 201
    SIGMOID_BWD = 202
    ELU_BWD = 203
    GELU_BWD = 204
    SWISH_BWD = 206
    GELU_APPROX_TANH_BWD = 207


class KnobType(IntEnum):
    """cudnnBackendKnobType_t (prefix ``CUDNN_KNOB_TYPE_``).

    Knob choices read from engines are kept as plain ints when a cuDNN newer than this table
    reports a type it does not list; names here are for display only.
    """
    SPLIT_K = 0
    SWIZZLE = 1
    TILE_SIZE = 2
    USE_TEX = 3
    EDGE = 4
    KBLOCK = 5
    LDGA = 6
    LDGB = 7
    CHUNK_K = 8
    SPLIT_H = 9
    WINO_TILE = 10
    MULTIPLY = 11
    SPLIT_K_BUF = 12
    TILEK = 13
    STAGES = 14
    REDUCTION_MODE = 15
    CTA_SPLIT_K_MODE = 16
    SPLIT_K_SLC = 17
    IDX_MODE = 18
    SLICED = 19
    SPLIT_RS = 20
    SINGLEBUFFER = 21
    LDGC = 22
    SPECFILT = 23
    KERNEL_CFG = 24
    WORKSPACE = 25
    TILE_CGA = 26
    TILE_CGA_M = 27
    TILE_CGA_N = 28
    BLOCK_SIZE = 29
    OCCUPANCY = 30
    ARRAY_SIZE_PER_THREAD = 31
    NUM_C_PER_BLOCK = 32
    SPLIT_COLS = 33
    TILE_ROWS = 34
    TILE_COLS = 35
    LOAD_SIZE = 36
    CTA_COUNT = 37
    STREAM_K = 38
    SPLIT_P_SLC = 39
    TILE_M = 40
    TILE_N = 41
    WARP_SPEC_CFG = 42
    SWAP_AB = 43
    INPUT_TMA_ENABLE = 44
    OUTPUT_TMA_ENABLE = 45


class ConvMode(IntEnum):
    """cudnnConvolutionMode_t."""
    CONVOLUTION = 0
    CROSS_CORRELATION = 1


class GenStatsMode(IntEnum):
    """cudnnGenStatsMode_t (prefix ``CUDNN_GENSTATS_``)."""
    SUM_SQSUM = 0


class BnFinalizeStatsMode(IntEnum):
    """cudnnBnFinalizeStatsMode_t (prefix ``CUDNN_BN_FINALIZE_STATISTICS_``)."""
    TRAINING = 0
    INFERENCE = 1


#: The C element type of every attribute pycudnn sets or gets. Setters refuse an attribute whose
#: type here does not match (a wrong type is a silent memory misread in C). The keys are `Attr`
#: members; the table is typed by int because it is also looked up by raw attribute numbers.
ATTRIBUTE_TYPES: dict[int, AttrType] = {
    Attr.POINTWISE_MODE: AttrType.POINTWISE_MODE,
    Attr.POINTWISE_MATH_PREC: AttrType.DATA_TYPE,
    Attr.CONVOLUTION_COMP_TYPE: AttrType.DATA_TYPE,
    Attr.CONVOLUTION_CONV_MODE: AttrType.CONVOLUTION_MODE,
    Attr.CONVOLUTION_DILATIONS: AttrType.INT64,
    Attr.CONVOLUTION_FILTER_STRIDES: AttrType.INT64,
    Attr.CONVOLUTION_POST_PADDINGS: AttrType.INT64,
    Attr.CONVOLUTION_PRE_PADDINGS: AttrType.INT64,
    Attr.CONVOLUTION_SPATIAL_DIMS: AttrType.INT64,
    Attr.ENGINEHEUR_MODE: AttrType.HEUR_MODE,
    Attr.ENGINEHEUR_OPERATION_GRAPH: AttrType.BACKEND_DESCRIPTOR,
    Attr.ENGINEHEUR_RESULTS: AttrType.BACKEND_DESCRIPTOR,
    Attr.ENGINECFG_ENGINE: AttrType.BACKEND_DESCRIPTOR,
    Attr.ENGINECFG_INTERMEDIATE_INFO: AttrType.BACKEND_DESCRIPTOR,
    Attr.ENGINECFG_KNOB_CHOICES: AttrType.BACKEND_DESCRIPTOR,
    Attr.ENGINECFG_WORKSPACE_SIZE: AttrType.INT64,
    Attr.EXECUTION_PLAN_HANDLE: AttrType.HANDLE,
    Attr.EXECUTION_PLAN_ENGINE_CONFIG: AttrType.BACKEND_DESCRIPTOR,
    Attr.EXECUTION_PLAN_WORKSPACE_SIZE: AttrType.INT64,
    Attr.EXECUTION_PLAN_COMPUTED_INTERMEDIATE_UIDS: AttrType.INT64,
    Attr.EXECUTION_PLAN_RUN_ONLY_INTERMEDIATE_UIDS: AttrType.INT64,
    Attr.EXECUTION_PLAN_JSON_REPRESENTATION: AttrType.CHAR,
    Attr.KNOB_CHOICE_KNOB_TYPE: AttrType.KNOB_TYPE,
    Attr.KNOB_CHOICE_KNOB_VALUE: AttrType.INT64,
    Attr.OPERATION_CONVOLUTION_FORWARD_CONV_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_CONVOLUTION_FORWARD_W: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_CONVOLUTION_FORWARD_X: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_CONVOLUTION_FORWARD_Y: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_CONVOLUTION_BWD_DATA_W: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_CONVOLUTION_BWD_DATA_DX: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_CONVOLUTION_BWD_DATA_DY: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_CONVOLUTION_BWD_FILTER_DW: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_CONVOLUTION_BWD_FILTER_X: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_CONVOLUTION_BWD_FILTER_DY: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_POINTWISE_PW_DESCRIPTOR: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_POINTWISE_XDESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_POINTWISE_BDESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_POINTWISE_YDESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_POINTWISE_DXDESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_POINTWISE_DYDESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATIONGRAPH_HANDLE: AttrType.HANDLE,
    Attr.OPERATIONGRAPH_OPS: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATIONGRAPH_ENGINE_GLOBAL_COUNT: AttrType.INT64,
    Attr.TENSOR_BYTE_ALIGNMENT: AttrType.INT64,
    Attr.TENSOR_DATA_TYPE: AttrType.DATA_TYPE,
    Attr.TENSOR_DIMENSIONS: AttrType.INT64,
    Attr.TENSOR_STRIDES: AttrType.INT64,
    Attr.TENSOR_VECTOR_COUNT: AttrType.INT64,
    Attr.TENSOR_VECTORIZED_DIMENSION: AttrType.INT64,
    Attr.TENSOR_UNIQUE_ID: AttrType.INT64,
    Attr.TENSOR_IS_VIRTUAL: AttrType.BOOLEAN,
    Attr.TENSOR_IS_BY_VALUE: AttrType.BOOLEAN,
    Attr.VARIANT_PACK_UNIQUE_IDS: AttrType.INT64,
    Attr.VARIANT_PACK_DATA_POINTERS: AttrType.VOID_PTR,
    Attr.VARIANT_PACK_INTERMEDIATES: AttrType.VOID_PTR,
    Attr.VARIANT_PACK_WORKSPACE: AttrType.VOID_PTR,
    Attr.KNOB_INFO_TYPE: AttrType.KNOB_TYPE,
    Attr.KNOB_INFO_MAXIMUM_VALUE: AttrType.INT64,
    Attr.KNOB_INFO_MINIMUM_VALUE: AttrType.INT64,
    Attr.KNOB_INFO_STRIDE: AttrType.INT64,
    Attr.ENGINE_OPERATION_GRAPH: AttrType.BACKEND_DESCRIPTOR,
    Attr.ENGINE_GLOBAL_INDEX: AttrType.INT64,
    Attr.ENGINE_KNOB_INFO: AttrType.BACKEND_DESCRIPTOR,
    Attr.ENGINE_NUMERICAL_NOTE: AttrType.NUMERICAL_NOTE,
    Attr.ENGINE_LAYOUT_INFO: AttrType.BACKEND_DESCRIPTOR,
    Attr.ENGINE_BEHAVIOR_NOTE: AttrType.BEHAVIOR_NOTE,
    Attr.OPERATION_GENSTATS_MODE: AttrType.GENSTATS_MODE,
    Attr.OPERATION_GENSTATS_MATH_PREC: AttrType.DATA_TYPE,
    Attr.OPERATION_BN_FINALIZE_STATS_MODE: AttrType.BN_FINALIZE_STATS_MODE,
    Attr.OPERATION_BN_FINALIZE_MATH_PREC: AttrType.DATA_TYPE,
    Attr.OPERATION_BN_BWD_WEIGHTS_MATH_PREC: AttrType.DATA_TYPE,
    Attr.OPERATION_GENSTATS_XDESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_GENSTATS_SUMDESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_GENSTATS_SQSUMDESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_BN_FINALIZE_Y_SUM_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_BN_FINALIZE_Y_SQ_SUM_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_BN_FINALIZE_SCALE_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_BN_FINALIZE_BIAS_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_BN_FINALIZE_PREV_RUNNING_MEAN_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_BN_FINALIZE_PREV_RUNNING_VAR_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_BN_FINALIZE_UPDATED_RUNNING_MEAN_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_BN_FINALIZE_UPDATED_RUNNING_VAR_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_BN_FINALIZE_SAVED_MEAN_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_BN_FINALIZE_SAVED_INV_STD_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_BN_FINALIZE_EQ_SCALE_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_BN_FINALIZE_EQ_BIAS_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_BN_FINALIZE_ACCUM_COUNT_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_BN_FINALIZE_EPSILON_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_BN_FINALIZE_EXP_AVERATE_FACTOR_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_BN_BWD_WEIGHTS_MEAN_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_BN_BWD_WEIGHTS_INVSTD_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_BN_BWD_WEIGHTS_BN_SCALE_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_BN_BWD_WEIGHTS_X_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_BN_BWD_WEIGHTS_DY_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_BN_BWD_WEIGHTS_DBN_SCALE_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_BN_BWD_WEIGHTS_DBN_BIAS_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_BN_BWD_WEIGHTS_EQ_DY_SCALE_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_BN_BWD_WEIGHTS_EQ_X_SCALE_DESC: AttrType.BACKEND_DESCRIPTOR,
    Attr.OPERATION_BN_BWD_WEIGHTS_EQ_BIAS: AttrType.BACKEND_DESCRIPTOR,
}
# alpha/beta/clip scalars are float or double depending on the data: both setters accept them
_SCALAR_ATTRS = frozenset({
    Attr.OPERATION_CONVOLUTION_FORWARD_ALPHA, Attr.OPERATION_CONVOLUTION_FORWARD_BETA,
    Attr.OPERATION_CONVOLUTION_BWD_DATA_ALPHA, Attr.OPERATION_CONVOLUTION_BWD_DATA_BETA,
    Attr.OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, Attr.OPERATION_CONVOLUTION_BWD_FILTER_BETA,
    Attr.OPERATION_POINTWISE_ALPHA1, Attr.OPERATION_POINTWISE_ALPHA2,
    Attr.POINTWISE_RELU_LOWER_CLIP, Attr.POINTWISE_RELU_UPPER_CLIP,
    Attr.POINTWISE_RELU_LOWER_CLIP_SLOPE, Attr.POINTWISE_ELU_ALPHA, Attr.POINTWISE_SWISH_BETA,
})
# 4-byte enum-valued attribute types, and the Python enum each takes
_ENUM_TYPES: dict[AttrType, type | None] = {
    AttrType.DATA_TYPE: None,  # pycudnn._types.DataType (imported lazily below)
    AttrType.CONVOLUTION_MODE: ConvMode,
    AttrType.HEUR_MODE: HeurMode,
    AttrType.KNOB_TYPE: KnobType,
    AttrType.NUMERICAL_NOTE: NumericalNote,
    AttrType.BEHAVIOR_NOTE: BehaviorNote,
    AttrType.POINTWISE_MODE: PointwiseMode,
    AttrType.GENSTATS_MODE: GenStatsMode,
    AttrType.BN_FINALIZE_STATS_MODE: BnFinalizeStatsMode,
    AttrType.LAYOUT_TYPE: None,
}

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _attr_label(attr: int) -> str:
    try:
        return Attr(attr).symbol
    except ValueError:
        return f"attribute {int(attr)}"


def _dtype_label(dtype: int) -> str:
    try:
        return DescriptorType(dtype).symbol
    except ValueError:
        return f"backend descriptor type {int(dtype)}"


def to_data_type(value: int | npt.DTypeLike) -> int:
    """cudnnDataType_t of a `pycudnn._types.DataType`, a numpy dtype or a dtype name."""

    if isinstance(value, DataType):
        return int(value)
    if isinstance(value, bool):
        raise TypeError(f"not a data type: {value!r}")
    if isinstance(value, int):
        return int(DataType(value))  # ValueError for unknown numbers
    if isinstance(value, str):  # names need no ml_dtypes (bfloat16 by name works without it)
        v = _DATA_TYPE_NAMES.get(value.lower())
        if v is not None:
            return v
    return int(dtype_to_cudnn(value))  # TypeError naming accepted dtypes


_DATA_TYPE_NAMES = {"float32": 0, "float": 0, "float64": 1, "double": 1, "float16": 2, "half": 2,
                    "bfloat16": 9}


# ---- live counter ------------------------------------------------------------------------------

_live = LiveCounter()  # kind: the DescriptorType value


def live_count() -> int:
    """Number of backend descriptors created by pycudnn and not yet destroyed."""
    return _live.total()


def live_counts_by_type() -> dict[str, int]:
    """Live backend descriptors per descriptor type name (only types with a non-zero count)."""
    out = {}
    for t, n in _live.counts().items():
        if n:
            try:
                out[DescriptorType(t).name] = n
            except ValueError:
                out[str(t)] = n
    return out


def _destroy(destroy: Callable[[int], object], ptr: int, counter: LiveCounter,
             dtype: int) -> None:
    # Finalizer callback: everything bound up front, no module globals, never the owner.
    destroy(ptr)
    counter.remove(dtype)


class ClosedDescriptorError(PycudnnError, ValueError):
    """A backend descriptor (or an object owning one) was used after ``close()``."""


# ---- the descriptor ----------------------------------------------------------------------------

class BackendDescriptor:
    """An owned ``cudnnBackendDescriptor_t`` of one `DescriptorType`.

    Args:
        dtype: the descriptor type (a `DescriptorType` or its integer).

    Raises:
        CudnnError: when cuDNN refuses to create it (e.g. a sub-library that cannot load).
    """

    __slots__ = ("_ptr", "dtype", "finalized", "_children", "_finalizer", "__weakref__")

    def __init__(self, dtype: DescriptorType | int) -> None:
        if type(dtype) is not DescriptorType:  # the common case skips the enum lookup
            if isinstance(dtype, bool) or not isinstance(dtype, int):
                raise TypeError(f"BackendDescriptor: descriptor type must be a DescriptorType, "
                                f"got {dtype!r}")
            try:
                dtype = DescriptorType(dtype)
            except ValueError:
                dtype = int(dtype)
        L = _lib.lib()
        out = c_void_p()
        idtype = int(dtype)
        status = L.cudnnBackendCreateDescriptor(idtype, ctypes.byref(out))
        if status:
            _lib.raise_status(status, "cudnnBackendCreateDescriptor", f"type: {_dtype_label(dtype)}")
        ptr = out.value
        if not ptr:
            raise PycudnnError(f"cudnnBackendCreateDescriptor returned NULL for {_dtype_label(dtype)}")
        self._ptr: int | None = ptr
        self.dtype = dtype
        self.finalized = False
        # Descriptors set on this one: kept alive as long as it is (children are not freed first).
        self._children: list[BackendDescriptor] = []
        _live.add(idtype)
        self._finalizer = finalizer(self, _destroy, L.cudnnBackendDestroyDescriptor, ptr, _live,
                                    idtype)

    # -- lifetime ----------------------------------------------------------------------------

    @property
    def ptr(self) -> int:
        """The C pointer as an int; raises `ClosedDescriptorError` after close()."""
        p = self._ptr
        if p is None:
            raise ClosedDescriptorError(f"{self._name()} used after close()")
        return p

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def close(self) -> None:
        """Destroy the C descriptor now (idempotent). Children set on it are released too."""
        if self._ptr is None:
            return
        self._ptr = None
        self._finalizer()
        self._children = []

    def __enter__(self) -> "BackendDescriptor":
        self.ptr  # noqa: B018 - refuse a closed descriptor
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def closed_if_failed(self) -> Iterator[BackendDescriptor]:
        """``with d.closed_if_failed():`` around the set-up of a new descriptor: closed when the
        block raises (no half-set descriptor is left behind), left open when it completes."""
        try:
            yield self
        except BaseException:
            self.close()
            raise

    def _name(self) -> str:
        return f"BackendDescriptor({_dtype_label(self.dtype)})"

    def __repr__(self) -> str:
        state = "closed" if self._ptr is None else ("finalized" if self.finalized else "open")
        addr = "" if self._ptr is None else f" at {self._ptr:#x}"
        return f"<{self._name()} {state}{addr}>"

    def finalize(self) -> "BackendDescriptor":
        """``cudnnBackendFinalize``; returns self. Raises CudnnError with cuDNN's reason."""
        status = _lib.lib().cudnnBackendFinalize(self.ptr)
        if status:
            _lib.raise_status(status, "cudnnBackendFinalize", f"descriptor: {_dtype_label(self.dtype)}")
        self.finalized = True
        return self

    # -- raw set/get (private: only this class deals in attribute types) -------------------------

    def _check_attr(self, attr: int, expected: AttrType | tuple[AttrType, ...], setter: str) -> int:
        if isinstance(attr, bool) or not isinstance(attr, int):
            raise TypeError(f"{setter}: attribute must be a backend.Attr, got {attr!r}")
        known = ATTRIBUTE_TYPES.get(attr)
        exp = expected if isinstance(expected, tuple) else (expected,)
        if known is not None and known not in exp:
            raise ValueError(f"{setter}: {_attr_label(attr)} takes {known.symbol}, "
                             f"not {' or '.join(e.symbol for e in exp)}")
        return int(attr)

    def _set(self, attr: int, atype: AttrType, count: int, array: Any) -> None:
        status = _lib.lib().cudnnBackendSetAttribute(self.ptr, attr, int(atype), count, array)
        if status:
            _lib.raise_status(status, "cudnnBackendSetAttribute",
                              f"attribute: {_attr_label(attr)} ({atype.symbol} x {count}) "
                              f"on {_dtype_label(self.dtype)}")

    def _get(self, attr: int, atype: AttrType, requested: int, array: Any) -> int:
        n = c_int64(0)
        status = _lib.lib().cudnnBackendGetAttribute(self.ptr, attr, int(atype), requested,
                                                     ctypes.byref(n), array)
        if status:
            _lib.raise_status(status, "cudnnBackendGetAttribute",
                              f"attribute: {_attr_label(attr)} ({atype.symbol}) "
                              f"on {_dtype_label(self.dtype)}")
        return int(n.value)

    # -- typed setters -----------------------------------------------------------------------

    @staticmethod
    def _as_int(value: object, attr: int, setter: str, lo: int = _INT64_MIN, hi: int = _INT64_MAX) -> int:
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise TypeError(f"{setter}: {_attr_label(attr)} takes integers, got {value!r}")
        v = value.__index__()
        if not lo <= v <= hi:
            raise ValueError(f"{setter}: {_attr_label(attr)} value {v} out of range [{lo}, {hi}]")
        return v

    def set_int64(self, attr: Attr, value: int) -> None:
        """Set a one-element int64 attribute (ids, alignment, spatial dims...)."""
        a = self._check_attr(attr, AttrType.INT64, "set_int64")
        v = c_int64(self._as_int(value, attr, "set_int64"))
        self._set(a, AttrType.INT64, 1, ctypes.byref(v))

    def set_int64s(self, attr: Attr, values: Iterable[int]) -> None:
        """Set an int64 array attribute (dims, strides, paddings, uids...)."""
        a = self._check_attr(attr, AttrType.INT64, "set_int64s")
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
            raise TypeError(f"set_int64s: {_attr_label(attr)} takes a sequence of integers, "
                            f"got {values!r}")
        vals = [self._as_int(v, attr, "set_int64s") for v in values]
        arr = (c_int64 * max(len(vals), 1))(*vals)
        self._set(a, AttrType.INT64, len(vals), arr)

    def set_enum(self, attr: Attr, value: int) -> None:
        """Set a one-element 4-byte enum attribute; the C attribute type comes from the table."""
        self.set_enums(attr, (value,))

    def set_enums(self, attr: Attr, values: Iterable[int]) -> None:
        """Set an array of 4-byte enum values (e.g. numerical notes)."""
        if isinstance(attr, bool) or not isinstance(attr, int):
            raise TypeError(f"set_enums: attribute must be a backend.Attr, got {attr!r}")
        atype = ATTRIBUTE_TYPES.get(attr)
        if atype is None or atype not in _ENUM_TYPES:
            raise ValueError(f"set_enums: {_attr_label(attr)} is not an enum-valued attribute")
        if atype is AttrType.DATA_TYPE:
            vals = [to_data_type(v) for v in values]
        else:
            enum_cls = _ENUM_TYPES[atype]
            vals = []
            for v in values:
                if enum_cls is not None and isinstance(v, IntEnum) and not isinstance(v, enum_cls):
                    raise TypeError(f"set_enum: {_attr_label(attr)} takes a {enum_cls.__name__}, "
                                    f"got {v!r}")
                vals.append(self._as_int(v, attr, "set_enum", -(1 << 31), (1 << 31) - 1))
        arr = (c_int32 * max(len(vals), 1))(*vals)
        self._set(int(attr), atype, len(vals), arr)

    def set_data_type(self, attr: Attr, dtype: int | npt.DTypeLike) -> None:
        """Set a cudnnDataType_t attribute from a DataType, a numpy dtype or a dtype name."""
        a = self._check_attr(attr, AttrType.DATA_TYPE, "set_data_type")
        try:
            v = c_int32(to_data_type(dtype))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"set_data_type: {_attr_label(attr)}: {exc}") from None
        self._set(a, AttrType.DATA_TYPE, 1, ctypes.byref(v))

    def _scalar(self, attr: int, value: float, setter: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            try:
                value = float(value)  # numpy scalars
            except (TypeError, ValueError):
                raise TypeError(f"{setter}: {_attr_label(attr)} takes a real number, "
                                f"got {value!r}") from None
        return float(value)

    def set_double(self, attr: Attr, value: float) -> None:
        """Set a one-element double attribute (alpha/beta for double data)."""
        if attr not in _SCALAR_ATTRS:
            self._check_attr(attr, AttrType.DOUBLE, "set_double")
        v = c_double(self._scalar(attr, value, "set_double"))
        self._set(int(attr), AttrType.DOUBLE, 1, ctypes.byref(v))

    def set_float(self, attr: Attr, value: float) -> None:
        """Set a one-element float attribute (alpha/beta for float, half and bfloat16 data)."""
        if attr not in _SCALAR_ATTRS:
            self._check_attr(attr, AttrType.FLOAT, "set_float")
        v = c_float(self._scalar(attr, value, "set_float"))
        self._set(int(attr), AttrType.FLOAT, 1, ctypes.byref(v))

    def set_bool(self, attr: Attr, value: bool) -> None:
        """Set a one-element 1-byte boolean attribute (virtual, by-value)."""
        a = self._check_attr(attr, AttrType.BOOLEAN, "set_bool")
        if not isinstance(value, bool) and type(value).__name__ != "bool_":
            raise TypeError(f"set_bool: {_attr_label(attr)} takes a bool, got {value!r}")
        v = c_bool(bool(value))
        self._set(a, AttrType.BOOLEAN, 1, ctypes.byref(v))

    def set_handle(self, attr: Attr, handle: int) -> None:
        """Set a cudnnHandle_t attribute; cuDNN takes a *pointer to* the handle."""
        a = self._check_attr(attr, AttrType.HANDLE, "set_handle")
        h = handle.value if isinstance(handle, c_void_p) else handle
        if isinstance(h, bool) or not isinstance(h, int) or not h:
            raise TypeError(f"set_handle: {_attr_label(attr)} takes a non-NULL cudnnHandle_t "
                            f"as an int, got {handle!r}")
        v = c_void_p(h)
        self._set(a, AttrType.HANDLE, 1, ctypes.byref(v))

    def set_void_ptrs(self, attr: Attr, ptrs: Sequence[int]) -> None:
        """Set a void* array attribute (device pointers of a variant pack, workspace)."""
        a = self._check_attr(attr, AttrType.VOID_PTR, "set_void_ptrs")
        if isinstance(ptrs, (str, bytes)) or not hasattr(ptrs, "__iter__"):
            raise TypeError(f"set_void_ptrs: {_attr_label(attr)} takes a sequence of pointers, "
                            f"got {ptrs!r}")
        vals = []
        for p in ptrs:
            if p is None:
                p = 0
            vals.append(self._as_int(p, attr, "set_void_ptrs", 0, (1 << 64) - 1))
        arr = (c_void_p * max(len(vals), 1))(*vals)
        self._set(a, AttrType.VOID_PTR, len(vals), arr)

    def set_descriptors(self, attr: Attr, descs: Sequence["BackendDescriptor"]) -> None:
        """Set a backend-descriptor array attribute; keeps the children alive on this owner.

        Every element is checked before the C call: cuDNN segfaults on a non-descriptor.
        """
        a = self._check_attr(attr, AttrType.BACKEND_DESCRIPTOR, "set_descriptors")
        if isinstance(descs, BackendDescriptor):
            descs = (descs,)
        if not hasattr(descs, "__iter__"):
            raise TypeError(f"set_descriptors: {_attr_label(attr)} takes BackendDescriptors, "
                            f"got {descs!r}")
        descs = list(descs)
        ptrs = []
        for d in descs:
            if not isinstance(d, BackendDescriptor):
                raise TypeError(f"set_descriptors: {_attr_label(attr)} takes BackendDescriptor "
                                f"objects, got {type(d).__name__}: {d!r}")
            ptrs.append(d.ptr)  # ClosedDescriptorError for a closed one
        arr = (c_void_p * max(len(ptrs), 1))(*ptrs)
        self._set(a, AttrType.BACKEND_DESCRIPTOR, len(ptrs), arr)
        self._children.extend(descs)

    def set_descriptor(self, attr: Attr, desc: "BackendDescriptor") -> None:
        """Set a one-element backend-descriptor attribute."""
        if not isinstance(desc, BackendDescriptor):
            raise TypeError(f"set_descriptor: {_attr_label(attr)} takes a BackendDescriptor, "
                            f"got {type(desc).__name__}: {desc!r}")
        self.set_descriptors(attr, (desc,))

    def set_chars(self, attr: Attr, text: str | bytes) -> None:
        """Set a char-array attribute (the JSON of an execution plan), NUL-terminated."""
        a = self._check_attr(attr, AttrType.CHAR, "set_chars")
        if isinstance(text, str):
            text = text.encode("utf-8")
        if not isinstance(text, bytes):
            raise TypeError(f"set_chars: {_attr_label(attr)} takes str or bytes, got {text!r}")
        buf = ctypes.create_string_buffer(text)  # adds the NUL
        self._set(a, AttrType.CHAR, len(text) + 1, buf)

    # -- typed getters -----------------------------------------------------------------------

    def get_count(self, attr: Attr) -> int:
        """Number of elements of an attribute, asked with 0 elements requested.

        Works for heuristic results; knob choices answer 0 this way (MEASURED.md): read those
        with `get_descriptors()` and enough pre-created receivers.
        """
        a = self._check_attr(attr, tuple(AttrType), "get_count")
        atype = ATTRIBUTE_TYPES.get(attr)
        if atype is None:
            raise ValueError(f"get_count: {_attr_label(attr)} has no known attribute type")
        return self._get(a, atype, 0, None)

    def get_int64(self, attr: Attr) -> int:
        a = self._check_attr(attr, AttrType.INT64, "get_int64")
        v = c_int64(0)
        self._get(a, AttrType.INT64, 1, ctypes.byref(v))
        return int(v.value)

    def get_int64s(self, attr: Attr, max_count: int) -> list[int]:
        a = self._check_attr(attr, AttrType.INT64, "get_int64s")
        arr = (c_int64 * max(max_count, 1))()
        n = self._get(a, AttrType.INT64, max_count, arr)
        return [int(arr[i]) for i in range(min(n, max_count))]

    def get_enums(self, attr: Attr, max_count: int) -> list[int]:
        """Read an array of 4-byte enum values; members of the matching IntEnum where known."""
        atype = ATTRIBUTE_TYPES.get(attr)
        if atype is None or atype not in _ENUM_TYPES:
            raise ValueError(f"get_enums: {_attr_label(attr)} is not an enum-valued attribute")
        arr = (c_int32 * max(max_count, 1))()
        n = self._get(int(attr), atype, max_count, arr)
        enum_cls = _ENUM_TYPES[atype]
        out = []
        for i in range(min(n, max_count)):
            v = int(arr[i])
            if enum_cls is not None:
                try:
                    v = enum_cls(v)
                except ValueError:
                    pass
            out.append(v)
        return out

    def get_enum(self, attr: Attr) -> int:
        vals = self.get_enums(attr, 1)
        if not vals:
            raise PycudnnError(f"get_enum: {_attr_label(attr)} has no value")
        return vals[0]

    def get_descriptors(self, attr: Attr, dtype: DescriptorType, count: int
                        ) -> list["BackendDescriptor"]:
        """Read a descriptor array: ``count`` receivers of type ``dtype`` are created first and
        passed in (cuDNN copies into them); the ones it filled are returned, the rest closed."""
        a = self._check_attr(attr, AttrType.BACKEND_DESCRIPTOR, "get_descriptors")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"get_descriptors: count must be an int >= 0, got {count!r}")
        if count == 0:
            return []
        recv = [BackendDescriptor(dtype) for _ in range(count)]
        return self._fill(a, recv)

    def fill_descriptors(self, attr: "Attr | int", receivers: Sequence["BackendDescriptor"]) -> int:
        """Like `get_descriptors()` into caller-owned receivers (a reusable pool); returns
        how many were filled. Nothing is closed."""
        a = self._check_attr(attr, AttrType.BACKEND_DESCRIPTOR, "fill_descriptors")
        for d in receivers:
            if not isinstance(d, BackendDescriptor):
                raise TypeError(f"fill_descriptors: receivers must be BackendDescriptors, got {d!r}")
        arr = (c_void_p * max(len(receivers), 1))(*[d.ptr for d in receivers])
        n = self._get(a, AttrType.BACKEND_DESCRIPTOR, len(receivers), arr)
        return min(n, len(receivers))

    def _fill(self, a: int, recv: list["BackendDescriptor"]) -> list["BackendDescriptor"]:
        try:
            n = self.fill_descriptors(a, recv)
        except BaseException:
            for d in recv:
                d.close()
            raise
        for d in recv[n:]:
            d.close()
        out = recv[:n]
        for d in out:
            d.finalized = True  # cuDNN hands back finalized copies
        return out

    def get_descriptor(self, attr: Attr, dtype: DescriptorType) -> "BackendDescriptor":
        got = self.get_descriptors(attr, dtype, 1)
        if not got:
            raise PycudnnError(f"get_descriptor: {_attr_label(attr)} returned no descriptor")
        return got[0]

    def get_chars(self, attr: Attr) -> str:
        """Read a char-array attribute (asks for the length first)."""
        a = self._check_attr(attr, AttrType.CHAR, "get_chars")
        n = self._get(a, AttrType.CHAR, 0, None)
        if n <= 0:
            return ""
        buf = (c_char * n)()
        n2 = self._get(a, AttrType.CHAR, n, buf)
        return buf.raw[:min(n, n2)].rstrip(b"\0").decode("utf-8", "replace")

    def get_json(self) -> str:
        """The JSON representation of a finalized execution plan (for a tuning database)."""
        if self.dtype != DescriptorType.EXECUTION_PLAN:
            raise ValueError(f"get_json: only execution plans have a JSON representation, "
                             f"not {_dtype_label(self.dtype)}")
        return self.get_chars(Attr.EXECUTION_PLAN_JSON_REPRESENTATION)
