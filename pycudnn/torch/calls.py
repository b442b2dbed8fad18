"""A call signature's remembered launch: what ``pycudnn.torch`` does on every convolution call.

The first call with a new signature (shapes, strides, dtype, device, geometry, flags) runs
pycudnn's public function, which validates, chooses the algorithm and prepares it; the prepared
launcher is kept under that signature in a bounded dict here. Every later call is: build the key
from the torch tensors' attributes, one dict lookup, ``torch.empty`` for the output, the device
pointers, one launch. Also here: PyTorch's flag readers, its argument checks (first call of a
signature only) and the normalization of the geometry arguments.

The remembered path is the same for 2-D and 3-D convolutions (4-D and 5-D tensors): the number
of spatial dims is the length of the geometry's stride. 1-D convolutions reach it as 2-D ones of
unit height, as PyTorch's cuDNN path runs them.
"""

from __future__ import annotations

import functools
import math
import operator
import threading
from typing import Any, Callable

import numpy as np

import torch
import torch.autograd.forward_ad as _forward_ad
import torch.nn.functional as F

from pycudnn.api import conv as _conv
from pycudnn.configuration import config, override_token
from pycudnn.runtime.handle import get_handle
from pycudnn.runtime.memory import callers_device, restore_device
from pycudnn.runtime.tensor import Tensor, tensor_from_pointer
from pycudnn.runtime.tensor.geometry import strides_like_channels_last

from . import routing


#: bound of each map from call signatures to prepared launches (oldest entries go first)
CACHE_MAX = 4096


class ConvolutionValueError(ValueError, RuntimeError):
    """An argument value PyTorch's convolutions refuse: a ``ValueError``, as pycudnn's checks
    raise, and a ``RuntimeError``, as PyTorch's do (code written for either catches it)."""


class ConvolutionTypeError(TypeError, RuntimeError):
    """An argument type PyTorch's convolutions refuse: a ``TypeError`` and a ``RuntimeError``."""


#: the dtypes the convolutions take, by pycudnn name
DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
               torch.float64: "float64"}
_CL = torch.channels_last
_CL3D = torch.channels_last_3d
_CONTIG = torch.contiguous_format
#: PyTorch's own convolution by number of spatial dims (routing and the routed calls)
_TORCH_CONV: dict[int, Callable[..., Any]] = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}

# PyTorch's flag readers: the C functions behind torch.backends.cudnn's properties (those
# properties cost several times more per read)
_C = torch._C
_legacy_tf32: Callable[[], bool] = getattr(_C, "_get_cudnn_allow_tf32",
                                           lambda: bool(torch.backends.cudnn.allow_tf32))
_precision_getter = getattr(_C, "_get_fp32_precision_getter", None)


def _tf32() -> bool:
    """Whether PyTorch lets cuDNN's float32 convolutions use TF32. The legacy reader answers
    unless PyTorch's per-operator ``fp32_precision`` settings (2.9 and later) give convolutions
    and RNNs different answers; then it raises, and the convolutions' own setting decides."""
    try:
        return _legacy_tf32()
    except RuntimeError:
        if _precision_getter is None:
            raise
        return bool(_precision_getter("cuda", "conv") == "tf32")


_det: Callable[[], bool] = getattr(_C, "_get_cudnn_deterministic",
                                   lambda: bool(torch.backends.cudnn.deterministic))
_det_algos: Callable[[], bool] = getattr(_C, "_get_deterministic_algorithms",
                                         torch.are_deterministic_algorithms_enabled)
_bench: Callable[[], bool] = getattr(_C, "_get_cudnn_benchmark",
                                     lambda: bool(torch.backends.cudnn.benchmark))
grad_enabled = torch.is_grad_enabled
_tracing_state = _C._get_tracing_state
_functorch_active: Callable[[], bool] = getattr(_C, "_are_functorch_transforms_active",
                                               lambda: False)


def pytorch_only() -> bool:
    """Whether a call must run through PyTorch's own convolution: under ``torch.jit.trace``
    (a launch through raw pointers would leave the traced graph without the convolution),
    ``torch.func`` transforms (``grad``, ``vmap``, ``jacrev``: wrapped tensors have no
    pointers) and forward-mode AD (a dual level is open: tangents must flow)."""
    return (_forward_ad._current_level >= 0 or _functorch_active()
            or _tracing_state() is not None)


def c_apply(cls: Any) -> Any:
    """``cls.apply`` (an autograd function) without its Python wrapper, which unwraps
    ``torch.func`` tensors: pycudnn's functions never run under ``torch.func`` (`pytorch_only`
    sends those calls to PyTorch's own operators), and the wrapper costs microseconds a call."""
    try:
        return torch._C._FunctionBase.__dict__["apply"].__get__(None, cls)
    except (AttributeError, KeyError, TypeError):  # another PyTorch: the public entry
        return cls.apply


def _autocast_readers() -> tuple[Callable[[], bool], Callable[[], Any]]:
    """Whether autocast is on for CUDA, and its dtype (PyTorch 2.4 takes the device type)."""
    try:
        torch.is_autocast_enabled("cuda")
    except TypeError:  # before PyTorch 2.4: the CUDA state without an argument
        return torch.is_autocast_enabled, torch.get_autocast_gpu_dtype
    return (functools.partial(torch.is_autocast_enabled, "cuda"),
            functools.partial(torch.get_autocast_dtype, "cuda"))


autocast_enabled, autocast_dtype = _autocast_readers()
threshold_backward = torch.ops.aten.threshold_backward.default
convolution_backward = torch.ops.aten.convolution_backward.default
_override_get = override_token.get  # bound once: read on every call
#: more than one GPU visible: launches give the caller's current device back (set on first calls)
_multi_gpu = False


def _stream_fn() -> Callable[[int], int]:
    raw = getattr(_C, "_cuda_getCurrentRawStream", None)  # an int, without a Stream object
    if raw is not None:
        return raw  # type: ignore[no-any-return,unused-ignore]
    return lambda device: int(torch.cuda.current_stream(device).cuda_stream)


#: the caller's current stream on a device, as an int. Public as a seam for tests and tooling: a
#: CPU run stands in for it.
caller_stream = _stream_fn()


def _flags_key() -> tuple[Any, ...]:
    """What decides the flags of a call: pycudnn's (``config.token({})``, spelt out: one call
    less on every launch) and PyTorch's."""
    return ((config.generation, _override_get()), _tf32(), _det() or _det_algos(), _bench())


def _flags(fkey: tuple[Any, ...]) -> dict[str, Any]:
    """The pycudnn flags for a key from `_flags_key()`: the stricter of PyTorch's and pycudnn's."""
    flags: dict[str, Any] = {}
    if not fkey[1]:
        flags["allow_tf32"] = False
    if fkey[2]:
        flags["deterministic"] = True
    if fkey[3]:
        flags["benchmark"] = True
    return flags


# ---- the caches -----------------------------------------------------------------------------------
# key -> entry. An entry is a tuple (launch, out_shape, memory_format, device, zero_bias_ptr),
# or (None, kind) where kind is _DENSE (make the inputs dense in the memory format first, as
# PyTorch does, and look again), _PUBLIC (not replayable as one launch: call the public
# function each time) or _TORCH (measured faster through PyTorch's own convolution).

_DENSE = "dense"
_PUBLIC = "public"
_TORCH = "torch"  # routed to PyTorch's own operations (see routing.py); forward entry (None, _TORCH, fmt)
_FWD: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_BWD: dict[tuple[Any, ...], tuple[Any, ...]] = {}
#: transposed convolutions' forward signatures that passed the checks (see `transposed_call`)
_TRANSPOSED: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_lock = threading.Lock()
_zero_biases: dict[tuple[Any, ...], Any] = {}


def _remember(table: dict[tuple[Any, ...], tuple[Any, ...]], key: tuple[Any, ...],
              entry: tuple[Any, ...]) -> None:
    with _lock:
        table[key] = entry
        while len(table) > CACHE_MAX:
            del table[next(iter(table))]


def _forget(table: dict[tuple[Any, ...], tuple[Any, ...]], key: tuple[Any, ...]) -> None:
    with _lock:
        table.pop(key, None)


def clear_cache() -> None:
    """Forget every remembered call signature of this module, and the fused training blocks'
    routing decisions (``pycudnn.clear_caches()`` clears pycudnn's own caches; call both to
    start from nothing)."""
    with _lock:
        _FWD.clear()
        _BWD.clear()
        _TRANSPOSED.clear()
        torch_layers.clear()
    for forget in _clear_hooks:
        forget()


#: what else `clear_cache` clears: the modules that build on this one add theirs (`on_clear`)
_clear_hooks: list[Callable[[], None]] = []


def on_clear(forget: Callable[[], None]) -> None:
    """Have `clear_cache` call ``forget`` too."""
    if forget not in _clear_hooks:
        _clear_hooks.append(forget)


def remembered_signatures() -> dict[str, dict[tuple[Any, ...], tuple[Any, ...]]]:
    """Copies of the remembered call signatures, key -> entry (see the caches' comment above), by
    table: ``"forward"``, ``"backward"`` and ``"transposed"``. A seam for tests and tooling: what
    the calls so far left behind."""
    with _lock:
        return {"forward": dict(_FWD), "backward": dict(_BWD), "transposed": dict(_TRANSPOSED)}


def _zero_bias(k: int, dtype: Any, device: Any) -> Any:
    """A bias of ``k`` zeros (kept: a remembered launch reads its address)."""
    key = (k, dtype, device)
    z = _zero_biases.get(key)
    if z is None:
        z = _zero_biases[key] = torch.zeros(k, dtype=dtype, device=device)
    return z


# ---- checks (first call of a signature only) ------------------------------------------------------

def check_tensor(fn: str, name: str, t: Any, dims: tuple[int, ...] | None = None) -> None:
    """A ``ConvolutionTypeError`` or ``ValueError`` unless ``t`` is a CUDA tensor pycudnn takes
    (``dims``: the ranks allowed). Public as a seam for tests and tooling: a CPU run replaces it
    to let CPU tensors through."""
    if not isinstance(t, torch.Tensor):
        raise ConvolutionTypeError(
            f"{fn}: expected {name} to be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise ConvolutionTypeError(
            f"{fn}: expected {name} on a CUDA device, but got {name} on {t.device} "
            f"(pycudnn runs on NVIDIA GPUs; move it with .cuda())")
    if t.layout is not torch.strided:
        raise ConvolutionTypeError(
            f"{fn}: expected a strided (dense) {name}, got layout {t.layout}")
    if t.dtype not in DTYPE_NAMES:
        raise ConvolutionTypeError(
            f"{fn}: expected {name} of dtype torch.float32, torch.float16, "
            f"torch.bfloat16 or torch.float64, but got {t.dtype}")
    if dims is not None and t.dim() not in dims:
        if fn in _FUNCTION_NAMES and name == "input":
            # PyTorch's wording (unbatched input was unsqueezed before the checks)
            raise ConvolutionValueError(f"Expected {dims[0] - 1}D (unbatched) or {dims[0]}D "
                                        f"(batched) input to {fn}, but got input of size: "
                                        f"{list(t.shape)}")
        want = " or ".join(f"{d}-D" for d in dims)
        raise ConvolutionValueError(f"{fn}: expected {want} {name}, but got {name} of size "
                                    f"{list(t.shape)}")


#: PyTorch's convolution functions, whose wrong-rank input error pycudnn's checks word as theirs
_FUNCTION_NAMES = frozenset(("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                             "conv_transpose3d"))


def _check_same(fn: str, x: Any, name: str, t: Any) -> None:
    if t.dtype != x.dtype:
        raise ConvolutionTypeError(
            f"{fn}: expected input and {name} to have the same dtype, but got input "
            f"of dtype {x.dtype} and {name} of dtype {t.dtype}")
    if t.device != x.device:
        raise ConvolutionValueError(
            f"{fn}: expected input and {name} on the same device, but got input on "
            f"{x.device} and {name} on {t.device}")


def _check_operands(fn: str, x: Any, w: Any, geom: tuple[Any, ...]) -> None:
    """The checks a convolution and a transposed one share first: the input's and the weight's
    tensors (as many spatial dims as ``geom`` has strides), then the weight's groups."""
    stride, _, _, groups = geom
    dims = (len(stride) + 2,)
    check_tensor(fn, "input", x, dims)
    check_tensor(fn, "weight", w, dims)
    _check_same(fn, x, "weight", w)
    if w.shape[0] % groups:
        raise ConvolutionValueError(
            f"{fn}: given groups={groups}, expected weight to be divisible by {groups} "
            f"at dimension 0, but got weight of size {list(w.shape)} instead")


def _check_bias(fn: str, x: Any, w: Any, b: Any, k: int, given: str = "") -> None:
    """A bias of ``k`` elements, refused in PyTorch's words (``given`` what they name before
    the weight: ``"transposed=1, "`` for a transposed convolution)."""
    check_tensor(fn, "bias", b)
    _check_same(fn, x, "bias", b)
    if tuple(b.shape) != (k,):
        raise ConvolutionValueError(
            f"{fn}: given {given}weight of size {list(w.shape)}, expected bias to be "
            f"1-dimensional with {k} elements, but got bias of size "
            f"{list(b.shape)} instead")


def check_conv(fn: str, x: Any, w: Any, b: Any, z: Any, geom: tuple[Any, ...]) -> tuple[int, ...]:
    """PyTorch's checks of a convolution (2-D or 3-D: as many spatial dims as ``geom`` has
    strides); the output's shape."""
    stride, padding, dilation, groups = geom
    _check_operands(fn, x, w, geom)
    n, c = x.shape[:2]
    k, cg = w.shape[:2]
    if c != cg * groups:
        raise ConvolutionValueError(
            f"{fn}: given groups={groups}, weight of size {list(w.shape)}, expected "
            f"input{list(x.shape)} to have {cg * groups} channels, but got {c} "
            f"channels instead")
    if min(w.shape) < 1:
        raise ConvolutionValueError(
            f"{fn}: expected weight to have positive sizes, got {list(w.shape)}")
    out = [(i + 2 * p - d * (kk - 1) - 1) // st + 1
           for i, kk, st, p, d in zip(x.shape[2:], w.shape[2:], stride, padding, dilation)]
    if min(out) < 1:
        padded = " x ".join(str(i + 2 * p) for i, p in zip(x.shape[2:], padding))
        kernel = " x ".join(str(d * (kk - 1) + 1) for kk, d in zip(w.shape[2:], dilation))
        raise ConvolutionValueError(
            f"{fn}: calculated padded input size per channel: ({padded}). Kernel size: "
            f"({kernel}). Kernel size can't be greater than actual input size")
    shape = (n, k, *out)
    if b is not None:
        _check_bias(fn, x, w, b, k)
    if z is not None:
        check_tensor(fn, "z", z)
        _check_same(fn, x, "z", z)
        if tuple(z.shape) != shape:
            raise ConvolutionValueError(
                f"{fn}: expected z of the output's size {list(shape)}, but got z of "
                f"size {list(z.shape)}")
    return shape


#: the checks of a convolution under their public name (the N-d functions' error paths)
check_convolution = check_conv


def check_transposed(fn: str, x: Any, w: Any, b: Any, geom: tuple[Any, ...],
                     output_padding: tuple[int, ...]) -> tuple[int, ...]:
    """PyTorch's checks of a transposed convolution's tensors (weight ``(C_in, C_out / groups,
    *kernel)``; the geometry is checked where it is normalized); the output's shape ``(N, C_out,
    *o)``, ``o = (i - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding +
    1``."""
    stride, padding, dilation, groups = geom
    _check_operands(fn, x, w, geom)
    if x.shape[1] != w.shape[0]:
        raise ConvolutionValueError(
            f"{fn}: given transposed=1, weight of size {list(w.shape)}, expected "
            f"input{list(x.shape)} to have {w.shape[0]} channels, but got {x.shape[1]} "
            f"channels instead")
    if min(w.shape) < 1:
        raise ConvolutionValueError(
            f"{fn}: expected weight to have positive sizes, got {list(w.shape)}")
    k = w.shape[1] * groups
    out = [(i - 1) * st - 2 * p + d * (kk - 1) + op + 1 for i, kk, st, p, d, op
           in zip(x.shape[2:], w.shape[2:], stride, padding, dilation, output_padding)]
    if min(out) < 1:
        raise ConvolutionValueError(
            f"{fn}: given input size per channel: ({' x '.join(map(str, x.shape[2:]))}). "
            f"Calculated output size per channel: ({' x '.join(map(str, out))}). Output size "
            f"is too small")
    if b is not None:
        _check_bias(fn, x, w, b, k, "transposed=1, ")
    return (x.shape[0], k, *out)


def spatial_ints(name: str, value: Any, minimum: int, what: str, nd: int = 2,
                 fn: str = "conv2d") -> tuple[int, ...]:
    """An int or a sequence of one or ``nd`` ints (NumPy integers and 0-d tensors too, as
    PyTorch takes them) as a tuple of ``nd`` Python ints; ``what`` is the error below
    ``minimum``."""
    if isinstance(value, (tuple, list, torch.Size)):
        values = tuple(value)
        if len(values) == 1:  # nn.Conv2d(stride=(2,)) keeps (2,); F.conv2d expands it
            values *= nd
    else:
        values = (value,) * nd
    try:
        if any(isinstance(v, (bool, np.bool_)) for v in values):
            raise TypeError
        ints = tuple(operator.index(v) for v in values)
    except TypeError:
        raise ConvolutionTypeError(f"{fn}: expected {name} to be an int or a tuple of {nd} ints, "
                                   f"got {type(value).__name__} {value!r}") from None
    if len(ints) != nd:
        raise ConvolutionValueError(f"expected {name} to be a single integer value or a list of "
                                    f"{nd} values to match the convolution dimensions, but got "
                                    f"{name}={list(values)}")
    if min(ints) < minimum:
        raise ConvolutionValueError(f"{what}, but got {name}={list(ints)}")
    return ints


_GEOM: dict[tuple[Any, ...], tuple[tuple[Any, ...], Any]] = {}


def geometry(stride: Any, padding: Any, dilation: Any, groups: Any, weight: Any, nd: int = 2,
             fn: str = "conv2d") -> tuple[tuple[Any, ...], Any]:
    """``((stride, padding, dilation, groups), pre_pad)`` normalized for ``nd`` spatial dims
    (``pre_pad``: the extra padding after the input's end that ``F.pad`` adds first for
    ``padding="same"`` with an odd total, or None)."""
    try:
        key: tuple[Any, ...] = (stride, padding, dilation, groups, type(stride), type(padding),
                                type(dilation), type(groups), nd, fn)
        if type(padding) is str:
            key += (tuple(weight.shape[2:]),)
        hit = _GEOM.get(key)
    except TypeError:  # a list somewhere: normalize without caching
        key, hit = (), None
    if hit is not None:
        return hit
    result = normalize_geometry(stride, padding, dilation, groups,
                                None if weight is None else weight.shape[2:], nd, fn)
    if key:
        with _lock:
            if len(_GEOM) > CACHE_MAX:
                _GEOM.clear()
            _GEOM[key] = result
    return result


def normalize_geometry(stride: Any, padding: Any, dilation: Any, groups: Any, kernel_size: Any,
                       nd: int = 2, fn: str = "conv2d") -> tuple[tuple[Any, ...], Any]:
    """`geometry` without its cache, for a kernel of ``kernel_size``: what code that
    ``torch.compile`` traces calls (dynamo would guard on the contents of a global cache, and
    every new entry would recompile)."""
    st = spatial_ints("stride", stride, 1, "non-positive stride is not supported", nd, fn)
    dil = spatial_ints("dilation", dilation, 1, "dilation should be greater than zero", nd, fn)
    try:
        if isinstance(groups, (bool, np.bool_)):
            raise TypeError
        groups = operator.index(groups)
    except TypeError:
        raise ConvolutionTypeError(
            f"{fn}: expected groups to be an int, got {groups!r}") from None
    if groups < 1:
        raise ConvolutionValueError(
            f"non-positive groups is not supported, but got groups={groups}")
    pre_pad = None
    if isinstance(padding, str):
        if padding == "valid":
            pad = (0,) * nd
        elif padding == "same":
            if any(s != 1 for s in st):
                raise ConvolutionValueError(
                    "padding='same' is not supported for strided convolutions")
            total = [d * (k - 1) for d, k in zip(dil, kernel_size)]
            pad = tuple(t // 2 for t in total)
            extra = [t - 2 * (t // 2) for t in total]
            if any(extra):  # F.pad: last dim first, (before, after) each
                pre_pad = tuple(v for e in reversed(extra) for v in (0, e))
        else:
            raise ConvolutionValueError(
                f"Invalid padding string {padding!r}, should be one of "
                f"['valid', 'same']")
    else:
        pad = spatial_ints("padding", padding, 0, "negative padding is not supported", nd, fn)
    return (st, pad, dil, groups), pre_pad


def memory_format(x: Any, w: Any) -> Any:
    """PyTorch's ``cudnn_conv_suggest_memory_format``: channels_last (channels_last_3d for 5-D
    tensors) when the input's or the weight's strides look channels-last, except for float64."""
    if x.dtype is torch.float64:
        return _CONTIG
    if (strides_like_channels_last(tuple(x.shape), x.stride())
            or strides_like_channels_last(tuple(w.shape), w.stride())):
        return _CL3D if x.dim() == 5 else _CL
    return _CONTIG


def describe_signature(x: Any, w: Any, geom: tuple[Any, ...], fmt: Any, bias: bool = False) -> str:
    """A readable name of a convolution for reports and routing keys: shapes, dtype, the memory
    format ``fmt`` it is computed in (a transposed convolution's input is a stand-in whose
    strides say nothing), geometry, and a bias where one is added.
    Public as a seam for tests and tooling."""
    layout = "contiguous" if fmt is _CONTIG else "channels_last"
    st, pad, dil, g = geom
    return (f"x{list(x.shape)} w{list(w.shape)} {DTYPE_NAMES[x.dtype]} {layout} stride={st} "
            f"padding={pad} dilation={dil} groups={g}" + (" bias" if bias else ""))


#: forward keys of layers whose forward and backward were both measured faster through PyTorch:
#: conv2d calls F.conv2d for them directly (no pycudnn autograd function)
torch_layers: dict[tuple[Any, ...], bool] = {}


def route_layer_to_torch(key: tuple[Any, ...]) -> None:
    with _lock:
        torch_layers[key] = True
        while len(torch_layers) > CACHE_MAX:
            del torch_layers[next(iter(torch_layers))]


def _note_devices() -> None:
    global _multi_gpu
    _multi_gpu = torch.cuda.device_count() > 1


def _view(t: Any) -> Tensor:
    """A pycudnn view of a (checked) torch CUDA tensor; ``t`` is kept as its owner."""
    return tensor_from_pointer(t.data_ptr(), tuple(t.shape), DTYPE_NAMES[t.dtype],
                               strides=tuple(t.stride()), device=t.get_device(), owner=t)


def _aligned(*tensors: Any) -> bool:
    m = 0
    for t in tensors:
        if t is not None:
            m |= t.data_ptr()
    return not m & 15


# ---- forward: conv, conv + bias + relu, conv + alpha * z + bias + relu ----------------------------

def forward_key(op: str, x: Any, w: Any, b: Any, z: Any, alpha: float,
                geom: tuple[Any, ...]) -> tuple[Any, ...]:
    """The call signature of a forward op (AttributeError when an argument is not a tensor)."""
    return (op, x.shape, x.stride(), w.shape, w.stride(), x.dtype, w.dtype, x.get_device(),
            w.get_device(), None if b is None else (b.shape, b.stride(), b.dtype, b.get_device()),
            None if z is None else (z.shape, z.stride(), z.dtype, z.get_device()), alpha, geom,
            _flags_key())


def run_forward(op: str, x: Any, w: Any, b: Any, z: Any, alpha: float,
                geom: tuple[Any, ...]) -> tuple[Any, Any, Any, Any, Any]:
    """Run forward op ``op`` ("conv", "bias_relu", "add_relu"); returns ``(y, x, w, fmt, key)``:
    the output, the (dense) input and weight it read, the memory format it computed in, and the
    signature's key when PyTorch's convolution ran it (routing), else None."""
    try:
        key = forward_key(op, x, w, b, z, alpha, geom)
    except AttributeError:  # not a tensor: the checks name it
        check_conv(_op_name(op, geom), x, w, b, z, geom)
        raise
    e = _FWD.get(key)
    if e is None:
        return _forward_first(key, op, x, w, b, z, alpha, geom)
    launch = e[0]
    if launch is None:
        if e[1] is _TORCH:
            y = _TORCH_CONV[len(geom[0])](x, w, b, *geom)
            if op != "conv":
                y = _torch_epilogue(y, z, alpha)
            return y, x, w, e[2], key
        return _forward_other(e[1], key, op, x, w, b, z, alpha, geom)
    dev = e[3].index
    y = torch.empty(e[1], dtype=x.dtype, device=e[3], memory_format=e[2])
    xp, wp, yp = x.data_ptr(), w.data_ptr(), y.data_ptr()
    bp = b.data_ptr() if b is not None else e[4]
    if z is None:
        ptrs: tuple[int, ...] = (xp, wp, yp) if bp == 0 else (xp, wp, yp, bp)
        m = xp | wp | bp
    else:
        zp = z.data_ptr()
        ptrs = (xp, wp, yp, zp, bp)
        m = xp | wp | bp | zp
    if m & 15:  # a view not 16-byte aligned: the prepared plan promised 16
        return forward_public(op, x, w, b, z, alpha, geom, y, key[-1]), x, w, e[2], None
    prev = callers_device() if _multi_gpu else None  # a device guard where one is needed
    try:
        s = caller_stream(dev)
        launch(get_handle(dev, s), ptrs, s)
    except Exception:
        # out of memory, a cuDNN error...: forget it, the public function has every fallback
        _forget(_FWD, key)
        forward_public(op, x, w, b, z, alpha, geom, y, key[-1])
    finally:
        if prev is not None:
            restore_device(prev)
    return y, x, w, e[2], None


def _forward_other(kind: str, key: tuple[Any, ...], op: str, x: Any, w: Any, b: Any, z: Any,
                   alpha: float, geom: tuple[Any, ...]) -> tuple[Any, Any, Any, Any, Any]:
    if kind == _DENSE:
        fmt = memory_format(x, w)
        return run_forward(op, x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt),
                        None if b is None else b.contiguous(),
                        None if z is None else z.contiguous(memory_format=fmt), alpha, geom)
    shape = check_conv(_op_name(op, geom), x, w, b, z, geom)
    fmt = memory_format(x, w)
    y = torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=fmt)
    forward_public(op, x, w, b, z, alpha, geom, y, key[-1])
    return y, x, w, fmt, None


_OP_NAMES = {"conv": "conv2d", "bias_relu": "conv2d_bias_relu", "add_relu": "conv2d_add_relu"}


def _torch_epilogue(y: Any, z: Any, alpha: float) -> Any:
    """A fused op's epilogue on PyTorch's fresh convolution output ``y`` (bias included), in
    place: ``relu(y + alpha * z)``, or ``relu(y)`` without ``z``."""
    if z is not None:
        y.add_(z, alpha=alpha)
    return y.relu_()


def torch_forward(op: str, x: Any, w: Any, b: Any, z: Any, alpha: float,
                  geom: tuple[Any, ...]) -> Any:
    """Forward op ``op`` through PyTorch's own operations (what a routed signature runs): its
    convolution (and bias), then the epilogue in place on that fresh output."""
    y = _TORCH_CONV[len(geom[0])](x, w, b, *geom)
    return y if op == "conv" else _torch_epilogue(y, z, alpha)


def _op_name(op: str, geom: tuple[Any, ...]) -> str:
    """The PyTorch function a forward op stands for, for its errors ("conv3d" for 3-D)."""
    nd = len(geom[0])
    return _OP_NAMES[op] if nd == 2 else f"conv{nd}d"


def _forward_first(key: tuple[Any, ...], op: str, x: Any, w: Any, b: Any, z: Any, alpha: float,
                   geom: tuple[Any, ...]) -> tuple[Any, Any, Any, Any, Any]:
    fn = _op_name(op, geom)
    shape = check_conv(fn, x, w, b, z, geom)
    _note_devices()
    fmt = memory_format(x, w)
    if (not x.is_contiguous(memory_format=fmt) or not w.is_contiguous(memory_format=fmt)
            or (b is not None and not b.is_contiguous())
            or (z is not None and not z.is_contiguous(memory_format=fmt))):
        _remember(_FWD, key, (None, _DENSE))
        return _forward_other(_DENSE, key, op, x, w, b, z, alpha, geom)
    tdev = x.device
    fk = key[-1]
    replayable = _aligned(x, w, b, z) and 0 not in shape and x.numel() > 0
    # the fused ops too: an inference model's fused block whose PyTorch operations run faster
    # (a host-bound layer, a kernel cuDNN's fusion runs slower) must not cost the model time
    measure = replayable and routing.should_measure(fk[3], fk[1], fk[2])
    verdict = None
    if measure:
        dev = tdev.index
        signature = describe_signature(x, w, geom, fmt, b is not None)
        if op != "conv":
            signature = f"{_op_name(op, geom)} {signature}"
        theirs = lambda: torch_forward(op, x, w, b, z, alpha, geom)
        verdict = routing.prejudge(signature, "forward", theirs, dev, caller_stream(dev), fk[1:3])
        if verdict == "torch":  # decided before pycudnn's search: none runs
            _remember(_FWD, key, (None, _TORCH, fmt))
            return theirs(), x, w, fmt, key
    y = torch.empty(shape, dtype=x.dtype, device=tdev, memory_format=fmt)
    zero = 0
    if b is None and op != "conv":
        zb = _zero_bias(shape[1], x.dtype, tdev)
        zero = zb.data_ptr()
    prepared = None
    if replayable:
        prepared = forward_public(op, x, w, b, z, alpha, geom, y, fk, want_prepared=True)
    else:
        forward_public(op, x, w, b, z, alpha, geom, y, fk)
    if prepared is not None:
        _remember(_FWD, key, (prepared.launcher, shape, fmt, tdev, zero))
        # a plain convolution is what convert's autograd node runs; the fused ops' PyTorch side
        # is several calls, which the back-to-back timing already charges
        if measure and verdict is None and not routing.pycudnn_wins(
                signature, "forward", lambda: run_forward(op, x, w, b, z, alpha, geom),
                theirs, dev, caller_stream(dev), fk[1:3],
                routing.HOST_ALLOWANCE_US if op == "conv" else 0.0):
            _remember(_FWD, key, (None, _TORCH, fmt))
    else:
        _remember(_FWD, key, (None, _PUBLIC))
    return y, x, w, fmt, None


def forward_public(op: str, x: Any, w: Any, b: Any, z: Any, alpha: float, geom: tuple[Any, ...],
                   y: Any, fkey: tuple[Any, ...], want_prepared: bool = False) -> Any:
    """The op through pycudnn's public path into ``y`` (validation, search, every fallback);
    returns what it prepared when ``want_prepared``, else ``y``.
    Public as a seam for tests and tooling."""
    stride, padding, dilation, groups = geom
    s = caller_stream(x.get_device())
    flags = _flags(fkey)
    X, W, Y = _view(x), _view(w), _view(y)
    B = _view(b) if b is not None else None
    if B is None and op != "conv":
        B = _view(_zero_bias(w.shape[0], x.dtype, x.device))
    if op == "add_relu":
        _, prepared = _conv.convolution_add_relu_and_prepared(
            X, W, _view(z), alpha, B, stride, padding, dilation, groups, Y, s, flags)
    else:
        _, prepared = _conv.convolution_and_prepared(
            X, W, B, stride, padding, dilation, groups, "relu" if op == "bias_relu" else None, Y,
            s, flags)
    return prepared if want_prepared else y


# ---- backward data and backward filter ------------------------------------------------------------

def _backward_key(direction: str, a: Any, b: Any, other: Any, fmt: Any, geom: tuple[Any, ...],
                  fk: tuple[Any, ...]) -> tuple[Any, ...]:
    """The call signature of a backward direction (``a, b, other`` as in `_backward_first`)."""
    return (direction, a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.get_device(),
            other.shape, fmt, geom, fk)


def _backward(key: tuple[Any, ...], direction: str, a: Any, b: Any, other: Any, fmt: Any,
              geom: tuple[Any, ...]) -> tuple[Any, bool]:
    """``(gradient, through_torch)`` of one backward direction: the remembered launch of ``key``
    where there is one, else `_backward_first`. ``a, b``: ``gy, w`` for data, ``x, gy`` for
    filter (the forward roles of the pointers: ``(dx, w, gy)`` and ``(x, dw, gy)``)."""
    e = _BWD.get(key)
    if e is None or e[0] is None:
        return _backward_first(key, direction, a, b, other, fmt, geom)
    out = torch.empty(e[1], dtype=a.dtype, device=e[3], memory_format=fmt)
    ap, bp = a.data_ptr(), b.data_ptr()
    if (ap | bp) & 15:
        return backward_public(direction, a, b, out, geom, key[-1]), False
    dev = key[7]
    prev = callers_device() if _multi_gpu else None  # a device guard where one is needed
    try:
        s = caller_stream(dev)
        launch = e[0]
        launch(get_handle(dev, s),
               (out.data_ptr(), bp, ap) if direction == "data" else (ap, out.data_ptr(), bp), s)
    except Exception:
        _forget(_BWD, key)
        backward_public(direction, a, b, out, geom, key[-1])
    finally:
        if prev is not None:
            restore_device(prev)
    return out, False


def run_backward_data(gy: Any, w: Any, x: Any, fmt: Any, geom: tuple[Any, ...]) -> tuple[Any, bool]:
    """``(grad_x, through_torch)``: the input's gradient for ``gy`` (``x``, the dense input the
    forward read, gives its shape: only its shape is read, so a transposed convolution's forward
    passes `transposed_call`'s stand-in), and whether PyTorch's convolution computed it
    (routing)."""
    return _backward(_backward_key("data", gy, w, x, fmt, geom, _flags_key()), "data", gy, w, x,
                     fmt, geom)


def run_backward_filter(x: Any, gy: Any, w: Any, fmt: Any, geom: tuple[Any, ...]) -> tuple[Any, bool]:
    """``(grad_w, through_torch)``: the weight's gradient for ``gy`` (``w`` gives its shape)."""
    return _backward(_backward_key("filter", x, gy, w, fmt, geom, _flags_key()), "filter", x, gy,
                     w, fmt, geom)


def run_backward(gy: Any, x: Any, w: Any, fmt: Any, geom: tuple[Any, ...], need_x: bool,
                 need_w: bool) -> tuple[Any, Any, bool]:
    """``(grad_x, grad_w, through_torch)`` for the gradients asked for: one call of PyTorch's
    ``convolution_backward`` for both where both directions were measured faster there (as
    PyTorch's own autograd node makes it), else one backward launch per direction."""
    fk = _flags_key()
    kd = _backward_key("data", gy, w, x, fmt, geom, fk) if need_x else None
    kf = _backward_key("filter", x, gy, w, fmt, geom, fk) if need_w else None
    if kd is not None and kf is not None:
        ed, ef = _BWD.get(kd), _BWD.get(kf)
        if ed is not None and ef is not None and ed[1] is _TORCH and ef[1] is _TORCH:
            stride, padding, dilation, groups = geom
            gx, gw, _ = convolution_backward(gy, x, w, None, list(stride), list(padding),
                                             list(dilation), False, [0, 0], groups,
                                             [True, True, False])
            return gx, gw, True
    gx, tx = _backward(kd, "data", gy, w, x, fmt, geom) if kd is not None else (None, True)
    gw, tw = _backward(kf, "filter", x, gy, w, fmt, geom) if kf is not None else (None, True)
    return gx, gw, tx and tw


def torch_runs_signature(x: Any, w: Any, b: Any, geom: tuple[Any, ...], need_x: bool,
                         need_w: bool) -> bool:
    """Whether PyTorch's convolution runs this plain convolution signature in every direction
    asked for (forward, and backward data / filter where ``need_x`` / ``need_w``), as routing
    decided it: the signature is run (twice: a first call searches, prepares and times both
    sides in benchmark mode) on ``x``, ``w`` and ``b``, which are only read. False where routing does not apply (benchmark mode off,
    ``set_routing("pycudnn")``, pycudnn's flags stricter than PyTorch's)."""
    run_forward("conv", x, w, b, None, 1.0, geom)
    y, xd, wd, fmt, key = run_forward("conv", x, w, b, None, 1.0, geom)
    if key is None:
        return False
    if not (need_x or need_w):
        return True
    gy = torch.randn_like(y)
    run_backward(gy, xd, wd, fmt, geom, need_x, need_w)
    return run_backward(gy, xd, wd, fmt, geom, need_x, need_w)[2]


def torch_backward(direction: str, a: Any, b: Any, other: Any, geom: tuple[Any, ...]) -> Any:
    """One direction through PyTorch's ``convolution_backward`` (``a, b, other`` as in
    `_backward_first`). Public as a seam for tests and tooling."""
    stride, padding, dilation, groups = geom
    zeros = [0] * len(stride)  # output_padding (a convolution's, not a transposed one's)
    if direction == "data":  # a, b = gy, w; other = x
        return convolution_backward(a, other, b, None, list(stride), list(padding), list(dilation),
                                    False, zeros, groups, [True, False, False])[0]
    # a, b = x, gy; other = w
    return convolution_backward(b, a, other, None, list(stride), list(padding), list(dilation),
                                False, zeros, groups, [False, True, False])[1]


def _backward_first(key: tuple[Any, ...], direction: str, a: Any, b: Any, other: Any, fmt: Any,
                    geom: tuple[Any, ...]) -> tuple[Any, bool]:
    """First call of a backward signature (``a, b``: ``gy, w`` for data, ``x, gy`` for filter;
    ``other``: the input x for data, the weight for filter, whose shape the result has), or one
    that is not replayable as one launch."""
    e = _BWD.get(key)
    if e is not None and e[1] is _TORCH:
        return torch_backward(direction, a, b, other, geom), True
    _note_devices()
    shape = other.shape
    fk = key[-1]
    if e is not None:  # (None, _PUBLIC)
        out = torch.empty(shape, dtype=a.dtype, device=a.device, memory_format=fmt)
        backward_public(direction, a, b, out, geom, fk)
        return out, False
    replayable = _aligned(a, b) and math.prod(shape) > 0 and a.numel() > 0 and b.numel() > 0
    measure = replayable and routing.should_measure(fk[3], fk[1], fk[2])
    verdict = None
    if measure:
        dev = a.get_device()
        x, w = (other, b) if direction == "data" else (a, other)
        signature, what = describe_signature(x, w, geom, fmt), f"backward {direction}"
        theirs = lambda: torch_backward(direction, a, b, other, geom)
        verdict = routing.prejudge(signature, what, theirs, dev, caller_stream(dev), fk[1:3])
        if verdict == "torch":  # decided before pycudnn's search: none runs
            _remember(_BWD, key, (None, _TORCH))
            return theirs(), True
    out = torch.empty(shape, dtype=a.dtype, device=a.device, memory_format=fmt)
    prepared = None
    if replayable:
        prepared = backward_public(direction, a, b, out, geom, fk, want_prepared=True)
    else:
        backward_public(direction, a, b, out, geom, fk)
    if prepared is None:
        _remember(_BWD, key, (None, _PUBLIC))
        return out, False
    _remember(_BWD, key, (prepared.launcher, tuple(shape), fmt, a.device, 0))
    if measure and verdict is None:
        if direction == "data":
            ours: Callable[[], Any] = lambda: run_backward_data(a, w, x, fmt, geom)
        else:
            ours = lambda: run_backward_filter(x, b, w, fmt, geom)
        if not routing.pycudnn_wins(signature, what, ours, theirs, dev, caller_stream(dev),
                                    fk[1:3], routing.HOST_ALLOWANCE_US):
            _remember(_BWD, key, (None, _TORCH))
    return out, False


def backward_public(direction: str, a: Any, b: Any, out: Any, geom: tuple[Any, ...],
                    fkey: tuple[Any, ...], want_prepared: bool = False) -> Any:
    """One backward direction (``"data"`` or ``"filter"``) through the public functions,
    the prepared convolution returned when ``want_prepared``. Public as a seam for tests and
    tooling: a CPU run stands in for it."""
    stride, padding, dilation, groups = geom
    s = caller_stream(a.get_device())
    A, B, O = _view(a), _view(b), _view(out)
    core = (_conv.backward_data_and_prepared if direction == "data"
            else _conv.backward_filter_and_prepared)
    _, prepared = core(A, B, tuple(out.shape), stride, padding, dilation, groups, O, s,
                       _flags(fkey))
    return prepared if want_prepared else out


def dense_grad(gy: Any, fmt: Any) -> Any:
    # autograd may hand over an expanded (stride-0) or otherwise strided gradient
    return gy if gy.is_contiguous(memory_format=fmt) else gy.contiguous(memory_format=fmt)


# ---- transposed convolutions: the forward is a backward data ------------------------------------

def transposed_call(fn: str, x: Any, w: Any, b: Any, geom: tuple[Any, ...],
                    output_padding: tuple[int, ...]) -> tuple[Any, ...]:
    """What the forward of a transposed convolution needs beyond its tensors, checked on the
    first call of a signature: ``(shape_of, fmt, x_dense, w_dense, bias_shape)``.

    ``shape_of`` stands for the convolution's input in `run_backward_data`: a tensor of the
    output's shape, dtype and device that holds one element (a stride-0 expansion: only its
    shape is read, and PyTorch's ``convolution_backward``, where routing sends the call, reads
    no more of an input whose gradient alone is asked for); ``fmt`` the memory format PyTorch
    computes in (``cudnn_conv_suggest_memory_format`` of the input and the weight); whether
    the input and the weight are dense in it already; the shape the bias is viewed as."""
    try:
        key = (x.shape, x.stride(), w.shape, w.stride(), x.dtype, w.dtype, x.get_device(),
               w.get_device(), None if b is None else (b.shape, b.dtype, b.get_device()), geom,
               output_padding)
    except AttributeError:  # not a tensor: the checks name it
        check_transposed(fn, x, w, b, geom, output_padding)
        raise
    e = _TRANSPOSED.get(key)
    if e is None:
        shape = check_transposed(fn, x, w, b, geom, output_padding)
        fmt = memory_format(x, w)
        shape_of = torch.empty((), dtype=x.dtype, device=x.device).expand(shape)
        e = (shape_of, fmt, x.is_contiguous(memory_format=fmt), w.is_contiguous(memory_format=fmt),
             (-1,) + (1,) * len(geom[0]))
        _remember(_TRANSPOSED, key, e)
    return e
