"""RAII wrappers of cuDNN's legacy descriptors: tensor, filter, convolution, activation, op-tensor.

Each class owns one C descriptor, destroyed by a `weakref.finalize()` whose callback holds only
the destroy function and the integer handle, never the Python object: when it is collected, at
`close()` or at the end of a ``with`` block, never from ``__del__`` at shutdown. After close,
`handle` raises `ValueError`: a dead pointer is never passed to C. A failed ``cudnnSet*Descriptor``
can leave the descriptor half-written, so a descriptor whose set fails is destroyed at once.

Arguments are validated in Python first, with messages that name the parameter, the value and
what was expected; ``validate=False`` skips those value checks so that cuDNN's own reason can be
seen. What only cuDNN checks comes back as the `CudnnError` subclass for the status, with
cuDNN's reason from ``cudnnGetLastErrorString`` where it records one. What cuDNN 9 itself checks
and leaves unchecked, which these checks follow, is listed in docs/architecture.md ("What cuDNN
checks, and what pycudnn checks first").
"""

from __future__ import annotations

import functools
import math
import operator
from ctypes import byref, c_double, c_int, c_void_p
from typing import Any, Callable, NoReturn, Sequence, TypeVar

import numpy as np

from .._live import LiveCounter, finalizer
from .._types import (ActivationMode, DTypeLike, ConvolutionMode, DataType, MathType, NanPropagation,
                      OpTensorOp, PoolingMode, TensorFormat, dtype_to_cudnn, normalize_dtype)
from ..ffi.library import lib, raise_status
from ..runtime.tensor.geometry import conv_output_size

__all__ = [
    "TensorDescriptor", "FilterDescriptor", "ConvolutionDescriptor", "ActivationDescriptor",
    "OpTensorDescriptor", "PoolingDescriptor", "live_descriptor_count", "MIN_DIMS", "MAX_DIMS", "MAX_SPATIAL_DIMS",
    "INT32_MAX",
]

#: fewest dims a tensor or filter descriptor takes here (N, C and one spatial dim)
MIN_DIMS = 3
#: most dims cuDNN takes (``CUDNN_DIM_MAX``)
MAX_DIMS = 8
#: most spatial dims of a convolution (``CUDNN_DIM_MAX - 2``)
MAX_SPATIAL_DIMS = MAX_DIMS - 2
#: cuDNN's legacy descriptors take sizes, strides and parameters as C ``int``
INT32_MAX = 2**31 - 1


# ---- live-descriptor accounting and the finalizer ----------------------------------------------

_LIVE = LiveCounter()


def live_descriptor_count() -> int:
    """How many C descriptors made by this module are alive now (for leak tests)."""
    return _LIVE.total()


def _destroy(destroy_fn: Callable[[int], int], handle: int, counter: LiveCounter) -> None:
    # Finalizer callback: everything is bound up front (no globals, no imports, no ``self``), so it
    # is safe from any thread and at any time. A destroy status cannot be acted upon here.
    destroy_fn(handle)
    counter.remove()


# ---- argument checking --------------------------------------------------------------------------

_DTYPE_CACHE: dict[Any, tuple[np.dtype, int]] = {}


def _dtype_info(dtype: DTypeLike, parameter: str = "dtype") -> tuple[np.dtype, int]:
    """(numpy dtype, cudnnDataType_t) of a dtype given as numpy dtype, type or name; cached."""
    try:
        return _DTYPE_CACHE[dtype]
    except (KeyError, TypeError):  # TypeError: unhashable input
        pass
    dt = normalize_dtype(dtype, parameter)  # TypeError naming the parameter for unsupported ones
    info = (dt, int(dtype_to_cudnn(dt)))
    try:
        _DTYPE_CACHE[dtype] = info
    except TypeError:
        pass
    return info


_index = operator.index


def int_tuple(values: Any, name: str) -> tuple[int, ...]:
    """``values`` as a tuple of Python ints; TypeError for a non-sequence, a bool or a non-int."""
    if type(values) not in (tuple, list):
        try:
            if isinstance(values, (str, bytes)):
                raise TypeError
            values = tuple(values)  # iterators are read once; numpy arrays become scalars
        except TypeError:
            raise TypeError(f"{name}: expected a sequence of ints, got {type(values).__name__} "
                            f"{values!r}") from None
    types = set(map(type, values))  # bool is an int subclass and NumPy < 2.3's bool_ has
    if bool not in types and np.bool_ not in types:  # __index__: neither is ever a size here
        try:
            return tuple(map(_index, values))  # fast path, at C speed
        except TypeError:
            pass
    for i, v in enumerate(values):
        if isinstance(v, (bool, np.bool_)):
            raise TypeError(f"{name}: expected ints, got bool {v!r} at index {i} of {values!r}")
        try:
            _index(v)
        except TypeError:
            raise TypeError(f"{name}: expected ints, got {type(v).__name__} {v!r} at index {i} "
                            f"of {values!r}") from None
    raise AssertionError("unreachable")  # pragma: no cover


def check_int32(values: tuple[int, ...], name: str, what: str = "value") -> None:
    """ValueError naming ``name`` unless every value fits a C int (cuDNN's descriptor fields)."""
    if values and (max(values) > INT32_MAX or min(values) < -INT32_MAX - 1):
        raise ValueError(f"{name}: expected every {what} to fit in int32 (<= {INT32_MAX}), "
                         f"got {values}")


def _check_ndim(values: tuple[int, ...], name: str) -> None:
    if not MIN_DIMS <= len(values) <= MAX_DIMS:
        raise ValueError(f"{name}: expected {MIN_DIMS} to {MAX_DIMS} dims (N, C and 1 to "
                         f"{MAX_SPATIAL_DIMS} spatial dims), got {len(values)}: {values}")


def _check_positive_sizes(shape: tuple[int, ...], name: str) -> None:
    if min(shape) <= 0:
        raise ValueError(f"{name}: expected every size to be positive, got {shape}")


@functools.lru_cache(maxsize=1024)
def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = [1] * len(shape)
    acc = 1
    for i in range(len(shape) - 1, 0, -1):
        acc *= shape[i]
        strides[i - 1] = acc
    return tuple(strides)


def enum_member(enum_cls: Any, value: Any, name: str) -> Any:
    """``value`` as a member of ``enum_cls`` (accepts members, ints and member names)."""
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, str):
        key = value.upper()
        for prefix in ("CUDNN_DATA_", "CUDNN_TENSOR_", "CUDNN_ACTIVATION_", "CUDNN_OP_TENSOR_",
                       "CUDNN_"):
            if key.startswith(prefix) and key[len(prefix):] in enum_cls.__members__:
                key = key[len(prefix):]
                break
        if key in enum_cls.__members__:
            return enum_cls[key]
    elif not isinstance(value, (bool, np.bool_)):
        try:
            return enum_cls(operator.index(value))
        except (TypeError, ValueError):
            pass
    choices = ", ".join(m.name for m in enum_cls)
    raise ValueError(f"{name}: expected one of {enum_cls.__name__}'s members ({choices}), "
                     f"got {value!r}")


# cuDNN's C spelling of enum values, for repr()
def _data_type_name(v: int) -> str:
    try:
        return "CUDNN_DATA_" + DataType(v).name
    except ValueError:
        return f"<cudnnDataType_t {v}>"


def c_enum_name(enum_cls: type, prefix: str, v: int) -> str:
    """The C spelling of an enum value (``prefix`` + member name), or the number when unknown."""
    try:
        return prefix + enum_cls(v).name
    except ValueError:
        return f"<{enum_cls.__name__} {v}>"


def fail_fresh(status: int, function: str, destroy_fn: Callable[[int], int], handle: int,
               *context: str) -> None:
    """Raise the error for a failed set of a fresh descriptor, destroying it first (no leak)."""
    try:
        raise_status(status, function, *context)  # reads cuDNN's reason before anything else runs
    finally:
        _destroy(destroy_fn, handle, _LIVE)


# ---- base class ---------------------------------------------------------------------------------

_D = TypeVar("_D", bound="Descriptor")


class Descriptor:
    """Owns one C descriptor; see the module docstring for the lifetime rules."""

    __slots__ = ("_handle", "_finalizer", "__weakref__")
    _handle: int | None
    _finalizer: Any

    _create_name = ""
    _destroy_name = ""

    def _create(self) -> tuple[Any, Callable[[int], int], Any]:
        """Create the C descriptor: (library, destroy function, handle). Counts it as live."""
        self._handle = None
        self._finalizer = None
        L = lib()
        p = c_void_p()
        getattr(L.checked, self._create_name)(byref(p))
        _LIVE.add()
        return L, getattr(L, self._destroy_name), p.value

    def _adopt(self, destroy_fn: Callable[[int], int], handle: int) -> None:
        """Take ownership of a created and set descriptor: register its finalizer."""
        self._finalizer = finalizer(self, _destroy, destroy_fn, handle, _LIVE)
        self._handle = handle

    @property
    def handle(self) -> int:
        """The C descriptor as an int (``cudnn*Descriptor_t``). Raises ValueError once closed."""
        h = self._handle
        if h is None:
            raise ValueError(f"{type(self).__name__} is closed: its cuDNN descriptor was "
                             f"destroyed; create a new {type(self).__name__}")
        return h

    # ctypes calls with c_void_p argtypes accept the descriptor object itself
    _as_parameter_ = handle

    @property
    def closed(self) -> bool:
        """Whether the C descriptor has been destroyed."""
        return self._handle is None

    def close(self) -> None:
        """Destroy the C descriptor now. A second call does nothing."""
        self._handle = None
        fin = self._finalizer
        if fin is not None:
            fin()  # runs at most once, also when racing with garbage collection

    def __enter__(self: _D) -> _D:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __reduce__(self) -> NoReturn:
        # A copy would share the C pointer without owning it, and outlive it.
        raise TypeError(f"cannot pickle or copy a {type(self).__name__}: it owns a cuDNN "
                        f"descriptor; create a new one from the same arguments")

    def __repr__(self) -> str:
        if self._handle is None:
            return f"{type(self).__name__}(<closed>)"
        return f"{type(self).__name__}({self._describe()})"

    def query(self) -> tuple[Any, ...]:
        """The descriptor as cuDNN holds it, read back through its ``cudnnGet*Descriptor``
        function: plain ints (cuDNN's enum values) and lists, in that function's order, e.g.
        ``(data_type, dims, strides)`` for a `TensorDescriptor`.
        For checking what was set; the repr shows the same with names.

        Raises:
            ValueError: the descriptor is closed.
        """
        return self._query()

    def _query(self) -> tuple[Any, ...]:  # pragma: no cover - every queryable subclass overrides
        raise NotImplementedError(f"{type(self).__name__} cannot be read back")

    def _describe(self) -> str:  # pragma: no cover - every subclass overrides
        raise NotImplementedError


# ---- tensor -------------------------------------------------------------------------------------

class _Shaped(Descriptor):
    """A descriptor of sizes and a dtype (a tensor's or a filter's)."""

    __slots__ = ("_shape", "_dtype")
    _shape: tuple[int, ...]
    _dtype: np.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        """Sizes as given: (N, C, *spatial) for a tensor, (K, C / groups, *kernel) for a filter."""
        return self._shape

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def dtype(self) -> np.dtype:
        return self._dtype


class TensorDescriptor(_Shaped):
    """An N-d tensor (3 to 8 dims) of float32, float16, bfloat16 or float64.

    Args:
        shape: sizes, outermost first (N, C, spatial...); each positive and at most 2**31 - 1.
        dtype: numpy dtype, type or name ("float32", "float16", "bfloat16", "float64").
        strides: per-dim strides in *elements* (not bytes); default contiguous row-major. Each must
            be >= 0, and 0 only for a dim of size 1 (cuDNN's rule).
        validate: when False, skip the Python checks of sizes and strides so that cuDNN's own
            checks (and reasons) apply; types, dims and int32 ranges are always checked.

    Raises:
        TypeError: a non-int size/stride, a bool, or an unsupported dtype.
        ValueError: wrong number of dims or strides, non-positive size, bad stride, int32 overflow.
        CudnnError: cuDNN refused the descriptor (e.g. NOT_SUPPORTED for a tensor spanning 2**31
            elements or more); the message carries cuDNN's reason where it gives one.
    """

    __slots__ = ("_strides",)
    _create_name = "cudnnCreateTensorDescriptor"
    _destroy_name = "cudnnDestroyTensorDescriptor"

    def __init__(self, shape: Sequence[int], dtype: DTypeLike, strides: Sequence[int] | None = None,
                 *, validate: bool = True) -> None:
        shape_t = int_tuple(shape, "shape")
        _check_ndim(shape_t, "shape")
        check_int32(shape_t, "shape", "size")
        if validate:
            _check_positive_sizes(shape_t, "shape")
        np_dtype, data_type = _dtype_info(dtype)
        nd = len(shape_t)
        if strides is None:
            strides_t = _contiguous_strides(shape_t)
            if max(strides_t) > INT32_MAX or min(strides_t) < -INT32_MAX - 1:
                raise ValueError(f"shape: {shape_t} is too large for cuDNN's int32 strides: "
                                 f"its contiguous strides are {strides_t}")
        else:
            strides_t = int_tuple(strides, "strides")
            if len(strides_t) != nd:
                raise ValueError(f"strides: expected {nd} values (one per dim), got "
                                 f"{len(strides_t)}: {strides_t}")
            check_int32(strides_t, "strides", "stride")
            if validate and min(strides_t) <= 0:
                for i, (size, st) in enumerate(zip(shape_t, strides_t)):
                    if st < 0:
                        raise ValueError(f"strides: expected every stride to be >= 0, got "
                                         f"{strides_t}")
                    if st == 0 and size != 1:
                        raise ValueError(f"strides: a stride of 0 is only valid for a dim of "
                                         f"size 1, got stride 0 for dim {i} of size {size} "
                                         f"(shape {shape_t}, strides {strides_t})")
        L, destroy, h = self._create()
        status = L.cudnnSetTensorNdDescriptor(h, data_type, nd, (c_int * nd)(*shape_t),
                                              (c_int * nd)(*strides_t))
        if status:
            context = [f"while setting TensorDescriptor(dtype={_data_type_name(data_type)}, "
                       f"dims={list(shape_t)}, strides={list(strides_t)})"]
            span = 1 + sum((d - 1) * abs(s) for d, s in zip(shape_t, strides_t))
            if span > INT32_MAX:
                context.append(
                    f"the tensor spans {span} elements (1 + sum((size - 1) * stride)); cuDNN's "
                    f"legacy descriptors refuse 2**31 or more: split the batch")
            fail_fresh(status, "cudnnSetTensorNdDescriptor", destroy, h, *context)
        self._shape = shape_t
        self._strides = strides_t
        self._dtype = np_dtype
        self._adopt(destroy, h)

    @property
    def strides(self) -> tuple[int, ...]:
        """Strides in elements."""
        return self._strides

    def _query(self) -> tuple[int, list[int], list[int]]:
        """(cudnnDataType_t, dims, strides) as cuDNN holds them."""
        L = lib()
        dt, nb = c_int(), c_int()
        dims, strides = (c_int * MAX_DIMS)(), (c_int * MAX_DIMS)()
        L.checked.cudnnGetTensorNdDescriptor(self.handle, MAX_DIMS, byref(dt), byref(nb), dims,
                                             strides)
        n = nb.value
        return dt.value, list(dims[:n]), list(strides[:n])

    def _describe(self) -> str:
        dt, dims, strides = self._query()
        return f"dtype={_data_type_name(dt)}, dims={dims}, strides={strides}"


# ---- filter -------------------------------------------------------------------------------------

_FORMATS = {"NCHW": TensorFormat.NCHW, "NHWC": TensorFormat.NHWC}


def _filter_format(format: Any) -> TensorFormat:
    fmt = None
    if isinstance(format, str):
        fmt = _FORMATS.get(format.upper())
    elif not isinstance(format, (bool, np.bool_)):
        try:
            fmt = TensorFormat(operator.index(format))
        except (TypeError, ValueError):
            pass
    # NCHW_VECT_C needs vectorised int8 types, which pycudnn's convolutions do not take
    if fmt not in (TensorFormat.NCHW, TensorFormat.NHWC):
        raise ValueError(f"format: expected 'NCHW' or 'NHWC' (or TensorFormat.NCHW / "
                         f"TensorFormat.NHWC), got {format!r}")
    return fmt


class FilterDescriptor(_Shaped):
    """Convolution weights: 3 to 8 dims, (K, C / groups, spatial...).

    The dims are given in that order whatever the format; ``format`` says how they lie in memory:
    "NCHW" (K, C, spatial contiguous) or "NHWC" (channels last: K, spatial, C).

    Args:
        shape: (K, C / groups, *kernel); each positive and at most 2**31 - 1.
        dtype: numpy dtype, type or name ("float32", "float16", "bfloat16", "float64").
        format: "NCHW", "NHWC" or a `TensorFormat` of those two.
        validate: when False, skip the positivity check so that cuDNN's own check applies.
    """

    __slots__ = ("_format",)
    _create_name = "cudnnCreateFilterDescriptor"
    _destroy_name = "cudnnDestroyFilterDescriptor"

    def __init__(self, shape: Sequence[int], dtype: DTypeLike,
                 format: str | TensorFormat = "NCHW", *, validate: bool = True) -> None:
        shape_t = int_tuple(shape, "shape")
        _check_ndim(shape_t, "shape")
        check_int32(shape_t, "shape", "size")
        if validate:
            _check_positive_sizes(shape_t, "shape")
        np_dtype, data_type = _dtype_info(dtype)
        fmt = _filter_format(format)
        nd = len(shape_t)
        L, destroy, h = self._create()
        status = L.cudnnSetFilterNdDescriptor(h, data_type, int(fmt), nd, (c_int * nd)(*shape_t))
        if status:
            fail_fresh(status, "cudnnSetFilterNdDescriptor", destroy, h,
                       f"while setting FilterDescriptor(dtype={_data_type_name(data_type)}, "
                       f"dims={list(shape_t)}, format=CUDNN_TENSOR_{fmt.name})")
        self._shape = shape_t
        self._dtype = np_dtype
        self._format = fmt
        self._adopt(destroy, h)

    @property
    def format(self) -> TensorFormat:
        return self._format

    def _query(self) -> tuple[int, int, list[int]]:
        """(cudnnDataType_t, cudnnTensorFormat_t, dims) as cuDNN holds them."""
        L = lib()
        dt, fmt, nb = c_int(), c_int(), c_int()
        dims = (c_int * MAX_DIMS)()
        L.checked.cudnnGetFilterNdDescriptor(self.handle, MAX_DIMS, byref(dt), byref(fmt),
                                             byref(nb), dims)
        return dt.value, fmt.value, list(dims[:nb.value])

    def _describe(self) -> str:
        dt, fmt, dims = self._query()
        return (f"dtype={_data_type_name(dt)}, dims={dims}, "
                f"format={c_enum_name(TensorFormat, 'CUDNN_TENSOR_', fmt)}")


# ---- convolution --------------------------------------------------------------------------------

def _compute_type(data_type: int) -> int:
    # PyTorch's rule: half and bfloat16 accumulate in float; float and double in themselves.
    return int(DataType.DOUBLE) if data_type == DataType.DOUBLE else int(DataType.FLOAT)


def _initial_math_type(data_type: int, allow_tf32: bool) -> MathType:
    # PyTorch's rule (ConvolutionDescriptor::set): tensor cores for half/bfloat16; float32 may use
    # them (TF32) only when allowed; DEFAULT_MATH lets cuDNN choose otherwise.
    if data_type in (DataType.HALF, DataType.BFLOAT16):
        return MathType.TENSOR_OP_MATH
    if data_type == DataType.FLOAT and not allow_tf32:
        return MathType.FMA_MATH
    return MathType.DEFAULT_MATH


class ConvolutionDescriptor(Descriptor):
    """Padding, stride, dilation and groups of a 1-D to 6-D convolution, its compute and math type.

    Args:
        padding: zero padding per spatial dim, each >= 0.
        stride: per spatial dim, each >= 1; same length as ``padding``.
        dilation: per spatial dim, each >= 1; same length as ``padding``.
        groups: number of groups, >= 1.
        dtype: data type of the input and weights; the compute type is float for float16,
            bfloat16 and float32, double for float64.
        allow_tf32: for float32, whether tensor cores (TF32) may be used. Initial math type:
            TENSOR_OP_MATH for float16/bfloat16, FMA_MATH for float32 without TF32, DEFAULT_MATH
            otherwise (PyTorch's rule). `math_type` changes it later.
        mode: CROSS_CORRELATION (what deep-learning frameworks call convolution) or CONVOLUTION.
        validate: when False, skip the Python sign checks so that cuDNN's own checks apply.
    """

    __slots__ = ("_padding", "_stride", "_dilation", "_groups", "_dtype", "_compute_type",
                 "_mode", "_allow_tf32")
    _create_name = "cudnnCreateConvolutionDescriptor"
    _destroy_name = "cudnnDestroyConvolutionDescriptor"

    def __init__(self, padding: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
                 groups: int = 1, dtype: DTypeLike = "float32", allow_tf32: bool = True,
                 mode: ConvolutionMode | int = ConvolutionMode.CROSS_CORRELATION, *,
                 validate: bool = True) -> None:
        pad_t = int_tuple(padding, "padding")
        stride_t = int_tuple(stride, "stride")
        dil_t = int_tuple(dilation, "dilation")
        n = len(pad_t)
        if not 1 <= n <= MAX_SPATIAL_DIMS:
            raise ValueError(f"padding: expected 1 to {MAX_SPATIAL_DIMS} values (one per "
                             f"spatial dim), got {n}: {pad_t}")
        for name, vals in (("stride", stride_t), ("dilation", dil_t)):
            if len(vals) != n:
                raise ValueError(f"{name}: expected {n} values (one per spatial dim, as in "
                                 f"padding={pad_t}), got {len(vals)}: {vals}")
        if isinstance(groups, (bool, np.bool_)):  # bools index as 0 and 1: never a count
            raise TypeError(f"groups: expected an int, got bool {groups!r}")
        try:
            groups = operator.index(groups)
        except TypeError:
            raise TypeError(f"groups: expected an int, got {type(groups).__name__} "
                            f"{groups!r}") from None
        check_int32(pad_t, "padding")
        check_int32(stride_t, "stride")
        check_int32(dil_t, "dilation")
        check_int32((groups,), "groups")
        if validate:
            if any(p < 0 for p in pad_t):
                raise ValueError(f"padding: expected every value to be >= 0, got {pad_t}")
            if any(s < 1 for s in stride_t):
                raise ValueError(f"stride: expected every value to be >= 1, got {stride_t}")
            if any(d < 1 for d in dil_t):
                raise ValueError(f"dilation: expected every value to be >= 1, got {dil_t}")
            if groups < 1:
                raise ValueError(f"groups: expected a positive int, got {groups}")
        np_dtype, data_type = _dtype_info(dtype)
        mode_e = enum_member(ConvolutionMode, mode, "mode")
        allow_tf32 = bool(allow_tf32)
        compute = _compute_type(data_type)
        math_type = _initial_math_type(data_type, allow_tf32)

        L, destroy, h = self._create()
        status = L.cudnnSetConvolutionNdDescriptor(h, n, (c_int * n)(*pad_t),
                                                   (c_int * n)(*stride_t), (c_int * n)(*dil_t),
                                                   int(mode_e), compute)
        fname = "cudnnSetConvolutionNdDescriptor"
        if not status:
            fname = "cudnnSetConvolutionGroupCount"
            status = L.cudnnSetConvolutionGroupCount(h, groups)
        if not status:
            fname = "cudnnSetConvolutionMathType"
            status = L.cudnnSetConvolutionMathType(h, int(math_type))
        if status:
            fail_fresh(status, fname, destroy, h,
                       f"while setting ConvolutionDescriptor(padding={list(pad_t)}, "
                       f"stride={list(stride_t)}, dilation={list(dil_t)}, groups={groups}, "
                       f"compute={_data_type_name(compute)}, math=CUDNN_{math_type.name})")
        self._padding = pad_t
        self._stride = stride_t
        self._dilation = dil_t
        self._groups = groups
        self._dtype = np_dtype
        self._compute_type = DataType(compute)
        self._mode = mode_e
        self._allow_tf32 = allow_tf32
        self._adopt(destroy, h)

    @property
    def padding(self) -> tuple[int, ...]:
        return self._padding

    @property
    def stride(self) -> tuple[int, ...]:
        return self._stride

    @property
    def dilation(self) -> tuple[int, ...]:
        return self._dilation

    @property
    def groups(self) -> int:
        return self._groups

    @property
    def spatial_dims(self) -> int:
        """Number of spatial dims (1 to 6)."""
        return len(self._padding)

    @property
    def dtype(self) -> np.dtype:
        """Data type of input and weights."""
        return self._dtype

    @property
    def compute_type(self) -> DataType:
        """cuDNN compute (accumulation) type: FLOAT, or DOUBLE for float64 data."""
        return self._compute_type

    @property
    def mode(self) -> ConvolutionMode:
        return self._mode

    @property
    def allow_tf32(self) -> bool:
        return self._allow_tf32

    @property
    def math_type(self) -> MathType:
        """The math type cuDNN holds now (cudnnGetConvolutionMathType)."""
        v = c_int()
        lib().checked.cudnnGetConvolutionMathType(self.handle, byref(v))
        return MathType(v.value)

    @math_type.setter
    def math_type(self, value: MathType | int) -> None:
        # Algorithm records carry a math type; apply it before running (see DESIGN habit 5).
        m = enum_member(MathType, value, "math_type")
        lib().checked.cudnnSetConvolutionMathType(self.handle, int(m))

    def output_shape(self, x_desc: TensorDescriptor, w_desc: FilterDescriptor, *,
                     validate: bool = True) -> tuple[int, ...]:
        """Shape of the forward output (cudnnGetConvolutionNdForwardOutputDim).

        With ``validate`` (default) the dims, channel counts against ``groups`` and kernel extent
        are checked in Python first, with messages naming what is wrong; with ``validate=False``
        only cuDNN checks (and it does not check that K is divisible by groups).

        Raises:
            TypeError: arguments of the wrong class.
            ValueError: a closed descriptor, or (validate) inconsistent shapes.
            CudnnBadParamError: cuDNN refused the combination; its reason is in the message.
        """
        if not isinstance(x_desc, TensorDescriptor):
            raise TypeError(f"x_desc: expected a TensorDescriptor, got {type(x_desc).__name__}")
        if not isinstance(w_desc, FilterDescriptor):
            raise TypeError(f"w_desc: expected a FilterDescriptor, got {type(w_desc).__name__}")
        conv_h, x_h, w_h = self.handle, x_desc.handle, w_desc.handle  # ValueError if closed
        xs, ws = x_desc._shape, w_desc._shape
        nd = len(xs)
        if validate:
            self._check_shapes(xs, ws)
        out = (c_int * nd)()
        status = lib().cudnnGetConvolutionNdForwardOutputDim(conv_h, x_h, w_h, nd, out)
        if status:
            raise_status(status, "cudnnGetConvolutionNdForwardOutputDim",
                         f"input: {x_desc!r}", f"weight: {w_desc!r}", f"convolution: {self!r}")
        shape = tuple(out)
        exact = (xs[0], ws[0]) + conv_output_size(xs[2:], ws[2:], self._stride, self._padding,
                                                  self._dilation)
        if shape != exact or any(n < 1 for n in shape):
            # cuDNN computes in 32-bit ints: a huge dilation or padding wraps around unchecked
            raise ValueError(f"output_shape: cuDNN reports the output {shape} for input {xs}, weight "
                             f"{ws}, padding {self._padding}, stride {self._stride}, dilation "
                             f"{self._dilation}, where the sizes are {exact}: the kernel's dilated "
                             f"extent exceeds the padded input, or cuDNN's 32-bit arithmetic overflowed")
        return shape

    def _check_shapes(self, xs: tuple[int, ...], ws: tuple[int, ...]) -> None:
        n = len(self._padding)
        if len(xs) != n + 2:
            raise ValueError(f"x_desc: expected {n + 2} dims for a {n}-d convolution, got "
                             f"{len(xs)}: {xs}")
        if len(ws) != n + 2:
            raise ValueError(f"w_desc: expected {n + 2} dims for a {n}-d convolution, got "
                             f"{len(ws)}: {ws}")
        g = self._groups
        if xs[1] != ws[1] * g:
            raise ValueError(f"groups: given groups={g} and weight of shape {ws}, expected input "
                             f"{xs} to have {ws[1] * g} channels (weight C {ws[1]} * groups {g}), "
                             f"but got {xs[1]} channels")
        if ws[0] % g:
            raise ValueError(f"groups: given groups={g}, expected weight's output channels "
                             f"{ws[0]} (dim 0 of {ws}) to be divisible by {g}")
        padded = tuple(i + 2 * p for i, p in zip(xs[2:], self._padding))
        kernel = tuple(d * (k - 1) + 1 for k, d in zip(ws[2:], self._dilation))
        if any(p < k for p, k in zip(padded, kernel)):
            raise ValueError(f"x_desc: padded input size per channel {padded} is smaller than "
                             f"the dilated kernel size {kernel} (input {xs}, weight {ws}, padding "
                             f"{self._padding}, dilation {self._dilation}): the kernel can't be "
                             f"larger than the padded input")

    def _query(self) -> tuple[list[int], list[int], list[int], int, int, int, int]:
        """(padding, stride, dilation, mode, compute type, groups, math type) as cuDNN holds."""
        L = lib()
        h = self.handle
        n = MAX_SPATIAL_DIMS
        nb, mode, ct, groups, math_t = c_int(), c_int(), c_int(), c_int(), c_int()
        pad, stride, dil = (c_int * n)(), (c_int * n)(), (c_int * n)()
        L.checked.cudnnGetConvolutionNdDescriptor(h, n, byref(nb), pad, stride, dil,
                                                  byref(mode), byref(ct))
        L.checked.cudnnGetConvolutionGroupCount(h, byref(groups))
        L.checked.cudnnGetConvolutionMathType(h, byref(math_t))
        k = nb.value
        return (list(pad[:k]), list(stride[:k]), list(dil[:k]), mode.value, ct.value,
                groups.value, math_t.value)

    def _describe(self) -> str:
        pad, stride, dil, mode, ct, groups, math_t = self._query()
        text = (f"padding={pad}, stride={stride}, dilation={dil}, groups={groups}, "
                f"compute={_data_type_name(ct)}, math={c_enum_name(MathType, 'CUDNN_', math_t)}")
        if mode != ConvolutionMode.CROSS_CORRELATION:
            text += f", mode={c_enum_name(ConvolutionMode, 'CUDNN_', mode)}"
        return text


# ---- activation ---------------------------------------------------------------------------------

class ActivationDescriptor(Descriptor):
    """An activation function (for cudnnActivationForward and fused convolution + bias + act).

    Args:
        mode: an `ActivationMode` (or its name or value).
        nan_propagation: `NanPropagation`.
        coef: ceiling for CLIPPED_RELU, alpha for ELU; a real number, not NaN.
    """

    __slots__ = ("_mode", "_nan", "_coef")
    _create_name = "cudnnCreateActivationDescriptor"
    _destroy_name = "cudnnDestroyActivationDescriptor"

    def __init__(self, mode: ActivationMode | int | str = ActivationMode.RELU,
                 nan_propagation: NanPropagation | int | str = NanPropagation.NOT_PROPAGATE_NAN,
                 coef: float = 0.0) -> None:
        mode_e = enum_member(ActivationMode, mode, "mode")
        nan_e = enum_member(NanPropagation, nan_propagation, "nan_propagation")
        if isinstance(coef, (bool, np.bool_)) or not isinstance(coef, (int, float, np.number)) \
                or isinstance(coef, np.complexfloating):
            raise TypeError(f"coef: expected a real number, got {type(coef).__name__} {coef!r}")
        coef = float(coef)
        if math.isnan(coef):
            raise ValueError(f"coef: expected a number, got {coef!r}")
        L, destroy, h = self._create()
        status = L.cudnnSetActivationDescriptor(h, int(mode_e), int(nan_e), coef)
        if status:
            fail_fresh(status, "cudnnSetActivationDescriptor", destroy, h)
        self._mode = mode_e
        self._nan = nan_e
        self._coef = coef
        self._adopt(destroy, h)

    @property
    def mode(self) -> ActivationMode:
        return self._mode

    @property
    def nan_propagation(self) -> NanPropagation:
        return self._nan

    @property
    def coef(self) -> float:
        return self._coef

    def _query(self) -> tuple[int, int, float]:
        mode, nan, coef = c_int(), c_int(), c_double()
        lib().checked.cudnnGetActivationDescriptor(self.handle, byref(mode), byref(nan),
                                                   byref(coef))
        return mode.value, nan.value, coef.value

    def _describe(self) -> str:
        mode, nan, coef = self._query()
        return (f"mode={c_enum_name(ActivationMode, 'CUDNN_ACTIVATION_', mode)}, "
                f"nan={c_enum_name(NanPropagation, 'CUDNN_', nan)}, coef={coef!r}")


# ---- op-tensor ----------------------------------------------------------------------------------

class OpTensorDescriptor(Descriptor):
    """An element-wise operation for cudnnOpTensor.

    Args:
        op: an `OpTensorOp` (or its name or value).
        compute_dtype: data type of the operands; computed in float for float16, bfloat16 and
            float32, in double for float64.
        nan_propagation: `NanPropagation`.
    """

    __slots__ = ("_op", "_compute_type", "_nan")
    _create_name = "cudnnCreateOpTensorDescriptor"
    _destroy_name = "cudnnDestroyOpTensorDescriptor"

    def __init__(self, op: OpTensorOp | int | str = OpTensorOp.ADD,
                 compute_dtype: DTypeLike = "float32",
                 nan_propagation: NanPropagation | int | str = NanPropagation.NOT_PROPAGATE_NAN
                 ) -> None:
        op_e = enum_member(OpTensorOp, op, "op")
        nan_e = enum_member(NanPropagation, nan_propagation, "nan_propagation")
        _, data_type = _dtype_info(compute_dtype, "compute_dtype")
        compute = _compute_type(data_type)
        L, destroy, h = self._create()
        status = L.cudnnSetOpTensorDescriptor(h, int(op_e), compute, int(nan_e))
        if status:
            fail_fresh(status, "cudnnSetOpTensorDescriptor", destroy, h)
        self._op = op_e
        self._compute_type = DataType(compute)
        self._nan = nan_e
        self._adopt(destroy, h)

    @property
    def op(self) -> OpTensorOp:
        return self._op

    @property
    def compute_type(self) -> DataType:
        return self._compute_type

    @property
    def nan_propagation(self) -> NanPropagation:
        return self._nan

    def _query(self) -> tuple[int, int, int]:
        op, ct, nan = c_int(), c_int(), c_int()
        lib().checked.cudnnGetOpTensorDescriptor(self.handle, byref(op), byref(ct), byref(nan))
        return op.value, ct.value, nan.value

    def _describe(self) -> str:
        op, ct, nan = self._query()
        return (f"op={c_enum_name(OpTensorOp, 'CUDNN_OP_TENSOR_', op)}, "
                f"compute={_data_type_name(ct)}, nan={c_enum_name(NanPropagation, 'CUDNN_', nan)}")


class PoolingDescriptor(Descriptor):
    """A pooling window: size, padding and stride per spatial dim (1 to 6), and the mode.

    Args:
        window: the window's size per spatial dim, each >= 1.
        padding: per spatial dim, each >= 0 (cuDNN itself accepts negative padding).
        stride: per spatial dim, each >= 1.
        mode: a `PoolingMode` (or its name, any case, or value).
        nan_propagation: whether max pooling propagates NaN (`NanPropagation`).
        validate: when False, skip the Python sign checks so that cuDNN's own apply.

    Raises:
        TypeError / ValueError: naming the parameter.
        CudnnError: cuDNN refused the descriptor; its reason is in the message.
    """

    __slots__ = ("_window", "_padding", "_stride", "_mode", "_nan")
    _create_name = "cudnnCreatePoolingDescriptor"
    _destroy_name = "cudnnDestroyPoolingDescriptor"

    def __init__(self, window: Sequence[int], padding: Sequence[int], stride: Sequence[int],
                 mode: PoolingMode | int | str = PoolingMode.MAX,
                 nan_propagation: NanPropagation | int | str = NanPropagation.NOT_PROPAGATE_NAN,
                 *, validate: bool = True) -> None:
        win_t = int_tuple(window, "window")
        pad_t = int_tuple(padding, "padding")
        stride_t = int_tuple(stride, "stride")
        n = len(win_t)
        if not 1 <= n <= MAX_SPATIAL_DIMS:
            raise ValueError(f"window: expected 1 to {MAX_SPATIAL_DIMS} values (one per spatial "
                             f"dim), got {n}: {win_t}")
        for name, vals in (("padding", pad_t), ("stride", stride_t)):
            if len(vals) != n:
                raise ValueError(f"{name}: expected {n} values (one per spatial dim, as in "
                                 f"window={win_t}), got {len(vals)}: {vals}")
        check_int32(win_t, "window")
        check_int32(pad_t, "padding")
        check_int32(stride_t, "stride")
        if validate:
            if min(win_t) < 1:
                raise ValueError(f"window: expected every value to be >= 1, got {win_t}")
            if min(pad_t) < 0:
                raise ValueError(f"padding: expected every value to be >= 0, got {pad_t}")
            if min(stride_t) < 1:
                raise ValueError(f"stride: expected every value to be >= 1, got {stride_t}")
        mode_e = enum_member(PoolingMode, mode, "mode")
        nan_e = enum_member(NanPropagation, nan_propagation, "nan_propagation")
        L, destroy, h = self._create()
        status = L.cudnnSetPoolingNdDescriptor(h, int(mode_e), int(nan_e), n, (c_int * n)(*win_t),
                                               (c_int * n)(*pad_t), (c_int * n)(*stride_t))
        if status:
            fail_fresh(status, "cudnnSetPoolingNdDescriptor", destroy, h,
                       f"while setting PoolingDescriptor(mode=CUDNN_POOLING_{mode_e.name}, "
                       f"window={list(win_t)}, padding={list(pad_t)}, stride={list(stride_t)})")
        self._window, self._padding, self._stride = win_t, pad_t, stride_t
        self._mode, self._nan = mode_e, nan_e
        self._adopt(destroy, h)

    @property
    def window(self) -> tuple[int, ...]:
        return self._window

    @property
    def padding(self) -> tuple[int, ...]:
        return self._padding

    @property
    def stride(self) -> tuple[int, ...]:
        return self._stride

    @property
    def mode(self) -> PoolingMode:
        return self._mode

    @property
    def nan_propagation(self) -> NanPropagation:
        return self._nan

    def output_shape(self, x_desc: TensorDescriptor) -> tuple[int, ...]:
        """The forward output's shape for an input (``cudnnGetPoolingNdForwardOutputDim``).

        Raises:
            TypeError: ``x_desc`` is not a TensorDescriptor.
            ValueError: its number of spatial dims is not the window's.
            CudnnBadParamError: cuDNN refused (for instance a window larger than the padded
                input, which cuDNN refuses without a reason).
        """
        if not isinstance(x_desc, TensorDescriptor):
            raise TypeError(f"x_desc: expected a TensorDescriptor, got {type(x_desc).__name__}")
        nd = x_desc.ndim
        if nd != len(self._window) + 2:
            raise ValueError(f"x_desc: expected {len(self._window) + 2} dims for a "
                             f"{len(self._window)}-d pooling window, got {nd}: {x_desc.shape}")
        out = (c_int * nd)()
        status = lib().cudnnGetPoolingNdForwardOutputDim(self.handle, x_desc.handle, nd, out)
        if status:
            raise_status(status, "cudnnGetPoolingNdForwardOutputDim", f"input: {x_desc!r}",
                              f"pooling: {self!r}")
        return tuple(out)

    def _query(self) -> tuple[int, int, list[int], list[int], list[int]]:
        n = MAX_SPATIAL_DIMS
        mode, nan, nb = c_int(), c_int(), c_int()
        win, pad, stride = (c_int * n)(), (c_int * n)(), (c_int * n)()
        lib().checked.cudnnGetPoolingNdDescriptor(self.handle, n, byref(mode), byref(nan),
                                                       byref(nb), win, pad, stride)
        k = nb.value
        return mode.value, nan.value, list(win[:k]), list(pad[:k]), list(stride[:k])

    def _describe(self) -> str:
        mode, nan, win, pad, stride = self._query()
        return (f"mode={c_enum_name(PoolingMode, 'CUDNN_POOLING_', mode)}, "
                f"nan={c_enum_name(NanPropagation, 'CUDNN_', nan)}, window={win}, padding={pad}, "
                f"stride={stride}")
