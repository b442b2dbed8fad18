"""PyTorch integration: cuDNN convolutions through pycudnn inside PyTorch models.

``import pycudnn.torch`` imports PyTorch (``import pycudnn`` never does). It gives:

* [`conv2d`][pycudnn.torch.conv2d]: ``torch.nn.functional.conv2d``'s signature and semantics
  (memory formats, float32/float16/bfloat16/float64, ``padding="same"``/``"valid"``, unbatched
  input) as a ``torch.autograd.Function`` whose forward, backward-data and backward-filter
  convolutions run in pycudnn;
* [`Conv2d`][pycudnn.torch.Conv2d]: a drop-in ``torch.nn.Conv2d`` subclass (same constructor,
  parameters and ``state_dict``), and [`convert`][pycudnn.torch.convert], which turns every
  ``torch.nn.Conv2d`` of a model into one;
* [`conv2d_bias_relu`][pycudnn.torch.conv2d_bias_relu] and
  [`conv2d_add_relu`][pycudnn.torch.conv2d_add_relu]: one fused cuDNN graph each
  (``relu(conv(x) + b)`` and ``relu(conv(x) + alpha * z + b)``), with their backward;
* [`fuse_for_inference`][pycudnn.torch.fuse_for_inference]: BatchNorm folded into the
  convolutions before it and Conv-BN-ReLU / Conv-BN-add-ReLU turned into those fused calls.

How a call stays cheap: every output is a torch tensor from PyTorch's caching allocator
(``torch.empty``), and the work runs on PyTorch's current stream. The first call with a new
signature (shapes, strides, dtype, device, geometry, flags) runs pycudnn's public function, which
validates, chooses the algorithm and prepares it; the prepared launcher is kept under that
signature in a bounded dict here. Every later call is: build the key from the torch tensors'
attributes, one dict lookup, ``torch.empty`` for the output, the device pointers, one launch
(no ``pycudnn.Tensor`` is built, nothing is validated again: the key fixes every shape and
stride the prepared convolution was made for).

Numerical flags follow PyTorch's: TF32 only where ``torch.backends.cudnn.allow_tf32`` (and
pycudnn's ``allow_tf32``) allow it, deterministic algorithms when
``torch.backends.cudnn.deterministic`` or ``torch.use_deterministic_algorithms(True)`` asks,
and measured choices (``benchmark``) when ``torch.backends.cudnn.benchmark`` or pycudnn's
``benchmark`` flag is on.

Mixed precision: under ``torch.autocast("cuda")`` the functions cast their floating-point
tensors (float64 excepted) to the autocast dtype, as PyTorch's convolutions do.

Higher-order gradients: a backward pass that autograd records to differentiate again
(``create_graph=True``: gradient penalties, Hessian-vector products) computes the convolution's
gradients with PyTorch's ``convolution_backward``, which has a derivative; every other backward
pass runs pycudnn's backward-data and backward-filter convolutions.
"""

from __future__ import annotations

import copy
import functools
import operator
import threading
from typing import Any, Callable

import numpy as np

try:
    import torch
    import torch.autograd.forward_ad as _forward_ad
    import torch.nn.functional as F
except ImportError as _exc:  # pragma: no cover - exercised in a process without PyTorch
    raise ImportError(
        "pycudnn.torch needs PyTorch, which is not installed or does not import "
        f"({_exc}); install a CUDA build of PyTorch for the same CUDA major as pycudnn's "
        "extra (cu12 or cu13). The rest of pycudnn works without it.") from _exc

from pycudnn.api import conv as _conv
from pycudnn.configuration import config
from pycudnn.runtime.handle import get_handle
from pycudnn.runtime.memory import callers_device, restore_device
from pycudnn.runtime.tensor import Tensor, tensor_from_pointer

__all__ = ["conv2d", "conv2d_bias_relu", "conv2d_add_relu", "Conv2d", "FusedConv2d", "convert",
           "revert", "fuse_for_inference", "clear_cache", "CACHE_MAX", "ConvolutionValueError",
           "ConvolutionTypeError"]

#: bound of each map from call signatures to prepared launches (oldest entries go first)
CACHE_MAX = 4096


class ConvolutionValueError(ValueError, RuntimeError):
    """An argument value PyTorch's convolutions refuse: a ``ValueError``, as pycudnn's checks
    raise, and a ``RuntimeError``, as PyTorch's do (code written for either catches it)."""


class ConvolutionTypeError(TypeError, RuntimeError):
    """An argument type PyTorch's convolutions refuse: a ``TypeError`` and a ``RuntimeError``."""


_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
                torch.float64: "float64"}
_CL = torch.channels_last
_CONTIG = torch.contiguous_format

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
_grad_enabled = torch.is_grad_enabled
_tracing_state = _C._get_tracing_state
_functorch_active: Callable[[], bool] = getattr(_C, "_are_functorch_transforms_active",
                                               lambda: False)


def _pytorch_only() -> bool:
    """Whether a call must run through PyTorch's own convolution: under ``torch.jit.trace``
    (a launch through raw pointers would leave the traced graph without the convolution),
    ``torch.func`` transforms (``grad``, ``vmap``, ``jacrev``: wrapped tensors have no
    pointers) and forward-mode AD (a dual level is open: tangents must flow)."""
    return (_forward_ad._current_level >= 0 or _functorch_active()
            or _tracing_state() is not None)


def _autocast_readers() -> tuple[Callable[[], bool], Callable[[], Any]]:
    """Whether autocast is on for CUDA, and its dtype (PyTorch 2.4 takes the device type)."""
    try:
        torch.is_autocast_enabled("cuda")
    except TypeError:  # before PyTorch 2.4: the CUDA state without an argument
        return torch.is_autocast_enabled, torch.get_autocast_gpu_dtype
    return (functools.partial(torch.is_autocast_enabled, "cuda"),
            functools.partial(torch.get_autocast_dtype, "cuda"))


_autocast_enabled, _autocast_dtype = _autocast_readers()
_threshold_backward = torch.ops.aten.threshold_backward.default
_convolution_backward = torch.ops.aten.convolution_backward.default
_token = config.token
_NO_FLAGS: dict[str, Any] = {}
#: more than one GPU visible: launches give the caller's current device back (set on first calls)
_multi_gpu = False


def _stream_fn() -> Callable[[int], int]:
    raw = getattr(_C, "_cuda_getCurrentRawStream", None)  # an int, without a Stream object
    if raw is not None:
        return raw  # type: ignore[no-any-return,unused-ignore]
    return lambda device: int(torch.cuda.current_stream(device).cuda_stream)


_stream = _stream_fn()


def _flags_key() -> tuple[Any, ...]:
    """What decides the flags of a call: pycudnn's (``config.token``) and PyTorch's."""
    return (_token(_NO_FLAGS), _tf32(), _det() or _det_algos(), _bench())


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
# PyTorch does, and look again) or _PUBLIC (not replayable as one launch: call the public
# function each time).

_DENSE = "dense"
_PUBLIC = "public"
_FWD: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_BWD: dict[tuple[Any, ...], tuple[Any, ...]] = {}
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
    """Forget every remembered call signature of this module (``pycudnn.clear_caches()`` clears
    pycudnn's own caches; call both to start from nothing)."""
    with _lock:
        _FWD.clear()
        _BWD.clear()


def _zero_bias(k: int, dtype: Any, device: Any) -> Any:
    """A bias of ``k`` zeros (kept: a remembered launch reads its address)."""
    key = (k, dtype, device)
    z = _zero_biases.get(key)
    if z is None:
        z = _zero_biases[key] = torch.zeros(k, dtype=dtype, device=device)
    return z


# ---- checks (first call of a signature only) ------------------------------------------------------

def _check_tensor(fn: str, name: str, t: Any, dims: tuple[int, ...] | None = None) -> None:
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
    if t.dtype not in _DTYPE_NAMES:
        raise ConvolutionTypeError(
            f"{fn}: expected {name} of dtype torch.float32, torch.float16, "
            f"torch.bfloat16 or torch.float64, but got {t.dtype}")
    if dims is not None and t.dim() not in dims:
        if fn == "conv2d" and name == "input":  # PyTorch's wording (3-D input was unsqueezed)
            raise ConvolutionValueError(f"Expected 3D (unbatched) or 4D (batched) input to "
                                        f"conv2d, but got input of size: {list(t.shape)}")
        want = " or ".join(f"{d}-D" for d in dims)
        raise ConvolutionValueError(f"{fn}: expected {want} {name}, but got {name} of size "
                                    f"{list(t.shape)}")


def _check_same(fn: str, x: Any, name: str, t: Any) -> None:
    if t.dtype != x.dtype:
        raise ConvolutionTypeError(
            f"{fn}: expected input and {name} to have the same dtype, but got input "
            f"of dtype {x.dtype} and {name} of dtype {t.dtype}")
    if t.device != x.device:
        raise ConvolutionValueError(
            f"{fn}: expected input and {name} on the same device, but got input on "
            f"{x.device} and {name} on {t.device}")


def _check_conv(fn: str, x: Any, w: Any, b: Any, z: Any, geom: tuple[Any, ...]) -> tuple[int, ...]:
    """PyTorch's checks of a 2-D convolution; the output's shape."""
    _check_tensor(fn, "input", x, (4,))
    _check_tensor(fn, "weight", w, (4,))
    _check_same(fn, x, "weight", w)
    stride, padding, dilation, groups = geom
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    if w.shape[0] % groups:
        raise ConvolutionValueError(
            f"{fn}: given groups={groups}, expected weight to be divisible by {groups} "
            f"at dimension 0, but got weight of size {list(w.shape)} instead")
    if c != cg * groups:
        raise ConvolutionValueError(
            f"{fn}: given groups={groups}, weight of size {list(w.shape)}, expected "
            f"input{list(x.shape)} to have {cg * groups} channels, but got {c} "
            f"channels instead")
    if min(w.shape) < 1:
        raise ConvolutionValueError(
            f"{fn}: expected weight to have positive sizes, got {list(w.shape)}")
    out = [(i + 2 * p - d * (kk - 1) - 1) // st + 1
           for i, kk, st, p, d in zip((h, wd), (r, s), stride, padding, dilation)]
    if min(out) < 1:
        raise ConvolutionValueError(
            f"{fn}: calculated padded input size per channel: ({h + 2 * padding[0]} x "
            f"{wd + 2 * padding[1]}). Kernel size: ({dilation[0] * (r - 1) + 1} x "
            f"{dilation[1] * (s - 1) + 1}). Kernel size can't be greater than actual input size")
    shape = (n, k, out[0], out[1])
    if b is not None:
        _check_tensor(fn, "bias", b)
        _check_same(fn, x, "bias", b)
        if tuple(b.shape) != (k,):
            raise ConvolutionValueError(
                f"{fn}: given weight of size {list(w.shape)}, expected bias to be "
                f"1-dimensional with {k} elements, but got bias of size "
                f"{list(b.shape)} instead")
    if z is not None:
        _check_tensor(fn, "z", z)
        _check_same(fn, x, "z", z)
        if tuple(z.shape) != shape:
            raise ConvolutionValueError(
                f"{fn}: expected z of the output's size {list(shape)}, but got z of "
                f"size {list(z.shape)}")
    return shape


def _pair(name: str, value: Any, minimum: int, what: str) -> tuple[int, int]:
    """An int or a sequence of one or two ints (NumPy integers and 0-d tensors too, as PyTorch
    takes them) as a pair of Python ints."""
    if isinstance(value, (tuple, list, torch.Size)):
        values = tuple(value)
        if len(values) == 1:  # nn.Conv2d(stride=(2,)) keeps (2,); F.conv2d expands it
            values *= 2
    else:
        values = (value, value)
    try:
        if any(isinstance(v, (bool, np.bool_)) for v in values):
            raise TypeError
        ints = tuple(operator.index(v) for v in values)
    except TypeError:
        raise ConvolutionTypeError(f"conv2d: expected {name} to be an int or a tuple of 2 ints, "
                                   f"got {type(value).__name__} {value!r}") from None
    if len(ints) != 2:
        raise ConvolutionValueError(f"expected {name} to be a single integer value or a list of 2 "
                                    f"values to match the convolution dimensions, but got "
                                    f"{name}={list(values)}")
    if min(ints) < minimum:
        raise ConvolutionValueError(f"{what}, but got {name}={list(ints)}")
    return ints[0], ints[1]


_GEOM: dict[tuple[Any, ...], tuple[tuple[Any, ...], Any]] = {}


def _geometry(stride: Any, padding: Any, dilation: Any, groups: Any,
              weight: Any) -> tuple[tuple[Any, ...], Any]:
    """``((stride, padding, dilation, groups), pre_pad)`` normalized (``pre_pad``: the extra
    right/bottom padding ``F.pad`` adds first for ``padding="same"`` with an odd total)."""
    try:
        key: tuple[Any, ...] = (stride, padding, dilation, groups, type(stride), type(padding),
                                type(dilation), type(groups))
        if type(padding) is str:
            key += (tuple(weight.shape[2:]),)
        hit = _GEOM.get(key)
    except TypeError:  # a list somewhere: normalize without caching
        key, hit = (), None
    if hit is not None:
        return hit
    st = _pair("stride", stride, 1, "non-positive stride is not supported")
    dil = _pair("dilation", dilation, 1, "dilation should be greater than zero")
    try:
        if isinstance(groups, (bool, np.bool_)):
            raise TypeError
        groups = operator.index(groups)
    except TypeError:
        raise ConvolutionTypeError(
            f"conv2d: expected groups to be an int, got {groups!r}") from None
    if groups < 1:
        raise ConvolutionValueError(
            f"non-positive groups is not supported, but got groups={groups}")
    pre_pad = None
    if isinstance(padding, str):
        if padding == "valid":
            pad = (0, 0)
        elif padding == "same":
            if st != (1, 1):
                raise ConvolutionValueError(
                    "padding='same' is not supported for strided convolutions")
            total = [d * (k - 1) for d, k in zip(dil, weight.shape[2:])]
            pad = (total[0] // 2, total[1] // 2)
            extra = [t - 2 * (t // 2) for t in total]
            if any(extra):
                pre_pad = (0, extra[1], 0, extra[0])  # F.pad: last dim first, (left, right)
        else:
            raise ConvolutionValueError(
                f"Invalid padding string {padding!r}, should be one of "
                f"['valid', 'same']")
    else:
        pad = _pair("padding", padding, 0, "negative padding is not supported")
    result = ((st, pad, dil, groups), pre_pad)
    if key:
        with _lock:
            if len(_GEOM) > CACHE_MAX:
                _GEOM.clear()
            _GEOM[key] = result
    return result


def _memory_format(x: Any, w: Any) -> Any:
    """PyTorch's ``cudnn_conv_suggest_memory_format``: channels_last when the input's or the
    weight's strides look channels-last, except for float64."""
    if x.dtype is torch.float64:
        return _CONTIG
    if _strides_like_cl(tuple(x.shape), x.stride()) or _strides_like_cl(tuple(w.shape), w.stride()):
        return _CL
    return _CONTIG


def _strides_like_cl(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """c10's ``is_channels_last_strides_2d_s4`` (strides ordered C < W < H < N)."""
    if strides[1] == 0:
        return False
    minimum = 0
    for d in (1, 3, 2, 0):
        if shape[d] == 0 or strides[d] < minimum:
            return False
        if d == 0 and minimum == strides[1]:
            return False
        minimum = strides[d]
        if shape[d] > 1:
            minimum *= shape[d]
    return True


def _note_devices() -> None:
    global _multi_gpu
    _multi_gpu = torch.cuda.device_count() > 1


def _view(t: Any) -> Tensor:
    """A pycudnn view of a (checked) torch CUDA tensor; ``t`` is kept as its owner."""
    return tensor_from_pointer(t.data_ptr(), tuple(t.shape), _DTYPE_NAMES[t.dtype],
                               strides=tuple(t.stride()), device=t.get_device(), owner=t)


def _aligned(*tensors: Any) -> bool:
    m = 0
    for t in tensors:
        if t is not None:
            m |= t.data_ptr()
    return not m & 15


# ---- forward: conv, conv + bias + relu, conv + alpha * z + bias + relu ----------------------------

def _forward(op: str, x: Any, w: Any, b: Any, z: Any, alpha: float,
             geom: tuple[Any, ...]) -> tuple[Any, Any, Any, Any]:
    """Run forward op ``op`` ("conv", "bias_relu", "add_relu"); returns ``(y, x, w, fmt)``: the
    output, the (dense) input and weight it read, and the memory format it computed in."""
    try:
        dev = x.get_device()
        key = (op, x.shape, x.stride(), w.shape, w.stride(), x.dtype, w.dtype, dev, w.get_device(),
               None if b is None else (b.shape, b.stride(), b.dtype, b.get_device()),
               None if z is None else (z.shape, z.stride(), z.dtype, z.get_device()), alpha, geom,
               _flags_key())
    except AttributeError:  # not a tensor: the checks name it
        _check_conv(_OP_NAMES[op], x, w, b, z, geom)
        raise
    e = _FWD.get(key)
    if e is None:
        return _forward_first(key, op, x, w, b, z, alpha, geom)
    launch = e[0]
    if launch is None:
        return _forward_other(e[1], key, op, x, w, b, z, alpha, geom)
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
        return _forward_public(op, x, w, b, z, alpha, geom, y, key[-1]), x, w, e[2]
    prev = callers_device() if _multi_gpu else None  # a device guard where one is needed
    try:
        s = _stream(dev)
        launch(get_handle(dev, s), ptrs, s)
    except Exception:
        # out of memory, a cuDNN error...: forget it, the public function has every fallback
        _forget(_FWD, key)
        _forward_public(op, x, w, b, z, alpha, geom, y, key[-1])
    finally:
        restore_device(prev)
    return y, x, w, e[2]


def _forward_other(kind: str, key: tuple[Any, ...], op: str, x: Any, w: Any, b: Any, z: Any,
                   alpha: float, geom: tuple[Any, ...]) -> tuple[Any, Any, Any, Any]:
    if kind == _DENSE:
        fmt = _memory_format(x, w)
        return _forward(op, x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt),
                        None if b is None else b.contiguous(),
                        None if z is None else z.contiguous(memory_format=fmt), alpha, geom)
    shape = _check_conv(_OP_NAMES[op], x, w, b, z, geom)
    fmt = _memory_format(x, w)
    y = torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=fmt)
    _forward_public(op, x, w, b, z, alpha, geom, y, key[-1])
    return y, x, w, fmt


_OP_NAMES = {"conv": "conv2d", "bias_relu": "conv2d_bias_relu", "add_relu": "conv2d_add_relu"}


def _forward_first(key: tuple[Any, ...], op: str, x: Any, w: Any, b: Any, z: Any, alpha: float,
                   geom: tuple[Any, ...]) -> tuple[Any, Any, Any, Any]:
    fn = _OP_NAMES[op]
    shape = _check_conv(fn, x, w, b, z, geom)
    _note_devices()
    fmt = _memory_format(x, w)
    if (not x.is_contiguous(memory_format=fmt) or not w.is_contiguous(memory_format=fmt)
            or (b is not None and not b.is_contiguous())
            or (z is not None and not z.is_contiguous(memory_format=fmt))):
        _remember(_FWD, key, (None, _DENSE))
        return _forward_other(_DENSE, key, op, x, w, b, z, alpha, geom)
    tdev = x.device
    y = torch.empty(shape, dtype=x.dtype, device=tdev, memory_format=fmt)
    zero = 0
    if b is None and op != "conv":
        zb = _zero_bias(shape[1], x.dtype, tdev)
        zero = zb.data_ptr()
    prepared = None
    if _aligned(x, w, y, b, z) and 0 not in shape and x.numel():
        prepared = _forward_public(op, x, w, b, z, alpha, geom, y, key[-1], want_prepared=True)
    else:
        _forward_public(op, x, w, b, z, alpha, geom, y, key[-1])
    if prepared is not None:
        _remember(_FWD, key, (prepared.launcher, shape, fmt, tdev, zero))
    else:
        _remember(_FWD, key, (None, _PUBLIC))
    return y, x, w, fmt


def _forward_public(op: str, x: Any, w: Any, b: Any, z: Any, alpha: float, geom: tuple[Any, ...],
                    y: Any, fkey: tuple[Any, ...], want_prepared: bool = False) -> Any:
    """The op through pycudnn's public path into ``y`` (validation, search, every fallback);
    returns what it prepared when ``want_prepared``, else ``y``."""
    stride, padding, dilation, groups = geom
    s = _stream(x.get_device())
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

def _backward_data(gy: Any, w: Any, x_shape: Any, fmt: Any, geom: tuple[Any, ...]) -> Any:
    dev = gy.get_device()
    key = ("data", gy.shape, gy.stride(), w.shape, w.stride(), gy.dtype, dev, x_shape, fmt, geom,
           _flags_key())
    e = _BWD.get(key)
    if e is None or e[0] is None:
        return _backward_first(key, "data", gy, w, x_shape, fmt, geom)
    dx = torch.empty(e[1], dtype=gy.dtype, device=e[3], memory_format=fmt)
    gp, wp = gy.data_ptr(), w.data_ptr()
    if (gp | wp) & 15:
        return _backward_public("data", gy, w, dx, geom, key[-1])
    prev = callers_device() if _multi_gpu else None  # a device guard where one is needed
    try:
        s = _stream(dev)
        launch = e[0]
        launch(get_handle(dev, s), (dx.data_ptr(), wp, gp), s)  # forward roles: x, w, y
    except Exception:
        _forget(_BWD, key)
        _backward_public("data", gy, w, dx, geom, key[-1])
    finally:
        restore_device(prev)
    return dx


def _backward_filter(x: Any, gy: Any, w_shape: Any, fmt: Any, geom: tuple[Any, ...]) -> Any:
    dev = gy.get_device()
    key = ("filter", x.shape, x.stride(), gy.shape, gy.stride(), gy.dtype, dev, w_shape, fmt, geom,
           _flags_key())
    e = _BWD.get(key)
    if e is None or e[0] is None:
        return _backward_first(key, "filter", x, gy, w_shape, fmt, geom)
    dw = torch.empty(e[1], dtype=gy.dtype, device=e[3], memory_format=fmt)
    xp, gp = x.data_ptr(), gy.data_ptr()
    if (xp | gp) & 15:
        return _backward_public("filter", x, gy, dw, geom, key[-1])
    prev = callers_device() if _multi_gpu else None  # a device guard where one is needed
    try:
        s = _stream(dev)
        launch = e[0]
        launch(get_handle(dev, s), (xp, dw.data_ptr(), gp), s)
    except Exception:
        _forget(_BWD, key)
        _backward_public("filter", x, gy, dw, geom, key[-1])
    finally:
        restore_device(prev)
    return dw


def _backward_first(key: tuple[Any, ...], direction: str, a: Any, b: Any, shape: Any, fmt: Any,
                    geom: tuple[Any, ...]) -> Any:
    """First call of a backward signature (``a, b``: ``gy, w`` for data, ``x, gy`` for filter),
    or one that is not replayable as one launch."""
    _note_devices()
    out = torch.empty(shape, dtype=a.dtype, device=a.device, memory_format=fmt)
    e = _BWD.get(key)
    if e is not None:  # (None, _PUBLIC)
        _backward_public(direction, a, b, out, geom, key[-1])
        return out
    prepared = None
    if _aligned(a, b, out) and out.numel() and a.numel() and b.numel():
        prepared = _backward_public(direction, a, b, out, geom, key[-1], want_prepared=True)
    else:
        _backward_public(direction, a, b, out, geom, key[-1])
    if prepared is not None:
        _remember(_BWD, key, (prepared.launcher, tuple(shape), fmt, a.device, 0))
    else:
        _remember(_BWD, key, (None, _PUBLIC))
    return out


def _backward_public(direction: str, a: Any, b: Any, out: Any, geom: tuple[Any, ...],
                     fkey: tuple[Any, ...], want_prepared: bool = False) -> Any:
    stride, padding, dilation, groups = geom
    s = _stream(a.get_device())
    A, B, O = _view(a), _view(b), _view(out)
    core = (_conv.backward_data_and_prepared if direction == "data"
            else _conv.backward_filter_and_prepared)
    _, prepared = core(A, B, tuple(out.shape), stride, padding, dilation, groups, O, s,
                       _flags(fkey))
    return prepared if want_prepared else out


def _dense_grad(gy: Any, fmt: Any) -> Any:
    # autograd may hand over an expanded (stride-0) or otherwise strided gradient
    return gy if gy.is_contiguous(memory_format=fmt) else gy.contiguous(memory_format=fmt)


# ---- autograd -------------------------------------------------------------------------------------

def _differentiable_backward(gy: Any, x: Any, w: Any, geom: tuple[Any, ...], need_x: bool,
                             need_w: bool) -> tuple[Any, Any]:
    """``(grad_x, grad_w)`` through PyTorch's ``convolution_backward``, which autograd can
    differentiate again: the backward pass of a graph built with ``create_graph=True``
    (gradient penalties, Hessian-vector products). pycudnn's own launches would return
    gradients with no history, and the second derivative would silently be left out."""
    stride, padding, dilation, groups = geom
    gx, gw, _ = _convolution_backward(gy, x, w, None, list(stride), list(padding),
                                      list(dilation), False, [0, 0], groups,
                                      [need_x, need_w, False])
    return gx, gw


class _Conv2dFunction(torch.autograd.Function):
    """conv2d with pycudnn's forward, backward-data and backward-filter convolutions."""

    @staticmethod
    def forward(ctx: Any, x: Any, w: Any, b: Any, geom: tuple[Any, ...]) -> Any:
        y, xd, wd, fmt = _forward("conv", x, w, b, None, 1.0, geom)
        # the inputs themselves too (the same tensors unless a dense copy was made): a backward
        # that is differentiated again must reach them
        ctx.save_for_backward(xd, wd, x, w)
        ctx.geom, ctx.fmt = geom, fmt
        return y

    @staticmethod
    def backward(ctx: Any, gy: Any) -> tuple[Any, ...]:
        xd, wd, x, w = ctx.saved_tensors
        geom, fmt = ctx.geom, ctx.fmt
        need_x, need_w, need_b, _ = ctx.needs_input_grad
        gb = gy.sum((0, 2, 3)) if need_b else None
        if _grad_enabled():  # create_graph=True
            gx, gw = _differentiable_backward(gy, x, w, geom, need_x, need_w)
            return gx, gw, gb, None
        gy = _dense_grad(gy, fmt)
        gx = _backward_data(gy, wd, xd.shape, fmt, geom) if need_x else None
        gw = _backward_filter(xd, gy, wd.shape, fmt, geom) if need_w else None
        return gx, gw, gb, None


class _FusedFunction(torch.autograd.Function):
    """relu(conv(x, w) + alpha * z + b): one fused launch forward; backward through the ReLU's
    mask (``y > 0``), then the convolution's backward."""

    @staticmethod
    def forward(ctx: Any, x: Any, w: Any, b: Any, z: Any, alpha: float,
                geom: tuple[Any, ...]) -> Any:
        op = "bias_relu" if z is None else "add_relu"
        y, xd, wd, fmt = _forward(op, x, w, b, z, alpha, geom)
        ctx.save_for_backward(xd, wd, y, x, w)
        ctx.geom, ctx.alpha, ctx.fmt = geom, alpha, fmt
        return y

    @staticmethod
    def backward(ctx: Any, gy: Any) -> tuple[Any, ...]:
        xd, wd, y, x, w = ctx.saved_tensors
        geom, fmt = ctx.geom, ctx.fmt
        d = _threshold_backward(gy, y, 0)  # grad * (y > 0)
        need_x, need_w, need_b, need_z, _, _ = ctx.needs_input_grad
        gb = d.sum((0, 2, 3)) if need_b else None
        gz = (d if ctx.alpha == 1.0 else d * ctx.alpha) if need_z else None
        if _grad_enabled():  # create_graph=True
            gx, gw = _differentiable_backward(d, x, w, geom, need_x, need_w)
            return gx, gw, gb, gz, None, None
        d = _dense_grad(d, fmt)
        gx = _backward_data(d, wd, xd.shape, fmt, geom) if need_x else None
        gw = _backward_filter(xd, d, wd.shape, fmt, geom) if need_w else None
        return gx, gw, gb, gz, None, None


def _autocast(*tensors: Any) -> tuple[Any, ...]:
    """The tensors as ``F.conv2d`` gets them under ``torch.autocast("cuda")``: floating-point
    CUDA tensors other than float64 cast to the autocast dtype (a differentiable cast)."""
    dtype = _autocast_dtype()
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.is_cuda
                 and t.is_floating_point() and t.dtype is not torch.float64
                 and t.dtype is not dtype else t for t in tensors)


def _needs_grad(*tensors: Any) -> bool:
    if not _grad_enabled():
        return False
    try:
        for t in tensors:
            if t is not None and t.requires_grad:
                return True
    except AttributeError:  # not a tensor: the forward's checks say so
        pass
    return False


# ---- public functions -----------------------------------------------------------------------------

def conv2d(input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1) -> Any:
    """``torch.nn.functional.conv2d`` with the convolutions in pycudnn (differentiable).

    Same signature and semantics as PyTorch's: input ``(N, C, H, W)`` or unbatched ``(C, H, W)``,
    weight ``(K, C/groups, R, S)``, optional bias ``(K,)``; ``stride``, ``padding`` (an int, a
    pair, ``"valid"`` or ``"same"``), ``dilation`` and ``groups`` as in PyTorch. CUDA tensors of
    float32, float16, bfloat16 or float64. The output is channels_last when the input or the
    weight is (PyTorch's rule), and is allocated by PyTorch's caching allocator; the work runs on
    PyTorch's current stream (CUDA-graph capture included, once the signature has run outside
    it). Under ``torch.autocast("cuda")`` the tensors are cast to the autocast dtype first, as
    ``F.conv2d``'s are. Backward computes only the gradients autograd asks for; the bias
    gradient is ``grad.sum((0, 2, 3))``. Twice differentiable: a backward recorded with
    ``create_graph=True`` runs through PyTorch's ``convolution_backward``.

    Returns:
        The output, a torch tensor.

    Raises:
        ConvolutionTypeError: a tensor that is not on a CUDA device, or of an unsupported dtype
            (a ``TypeError`` and a ``RuntimeError``, as PyTorch raises).
        ConvolutionValueError: shapes, groups or geometry that do not fit (PyTorch's wording;
            a ``ValueError`` and a ``RuntimeError``).
    """
    if _pytorch_only():
        return F.conv2d(input, weight, bias, stride, padding, dilation, groups)
    if _autocast_enabled():
        input, weight, bias = _autocast(input, weight, bias)
    geom, pre_pad = _geometry(stride, padding, dilation, groups, weight)
    if isinstance(input, torch.Tensor) and input.dim() == 3:
        return conv2d(input.unsqueeze(0), weight, bias, stride, padding, dilation, groups).squeeze(0)
    if pre_pad is not None:
        input = F.pad(input, pre_pad)
    if _needs_grad(input, weight, bias):
        return _Conv2dFunction.apply(input, weight, bias, geom)
    return _forward("conv", input, weight, bias, None, 1.0, geom)[0]


def conv2d_bias_relu(input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
                     dilation: Any = 1, groups: int = 1) -> Any:
    """``relu(conv2d(input, weight, bias, ...))`` as one fused cuDNN graph (differentiable).

    Arguments as [`conv2d`][pycudnn.torch.conv2d] (4-D input; ``bias=None`` adds nothing).
    Backward masks the gradient with ``y > 0`` and runs the convolution's backward.
    """
    if _pytorch_only():
        return torch.relu(F.conv2d(input, weight, bias, stride, padding, dilation, groups))
    if _autocast_enabled():
        input, weight, bias = _autocast(input, weight, bias)
    geom, pre_pad = _geometry(stride, padding, dilation, groups, weight)
    if pre_pad is not None:
        input = F.pad(input, pre_pad)
    if _needs_grad(input, weight, bias):
        return _FusedFunction.apply(input, weight, bias, None, 1.0, geom)
    return _forward("bias_relu", input, weight, bias, None, 1.0, geom)[0]


def conv2d_add_relu(input: Any, weight: Any, z: Any, bias: Any = None, alpha: float = 1.0,
                    stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Any:
    """``relu(conv2d(input, weight, bias, ...) + alpha * z)`` as one fused cuDNN graph: the
    residual block's add and ReLU (differentiable, ``z`` included).

    ``z`` has the output's shape. Other arguments as [`conv2d`][pycudnn.torch.conv2d] (4-D input).
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(f"conv2d_add_relu: expected alpha to be a real number, got {alpha!r}")
    if _pytorch_only():
        y = F.conv2d(input, weight, bias, stride, padding, dilation, groups)
        return torch.relu(y + z if alpha == 1.0 else y + alpha * z)
    if _autocast_enabled():
        input, weight, z, bias = _autocast(input, weight, z, bias)
    geom, pre_pad = _geometry(stride, padding, dilation, groups, weight)
    if pre_pad is not None:
        input = F.pad(input, pre_pad)
    alpha = float(alpha)
    if _needs_grad(input, weight, bias, z):
        return _FusedFunction.apply(input, weight, bias, z, alpha, geom)
    return _forward("add_relu", input, weight, bias, z, alpha, geom)[0]


# ---- modules --------------------------------------------------------------------------------------

class Conv2d(torch.nn.Conv2d):
    """``torch.nn.Conv2d`` whose convolutions run in pycudnn ([`conv2d`][pycudnn.torch.conv2d]).

    The same constructor, parameters, ``state_dict`` and ``padding_mode`` (modes other than
    ``"zeros"`` pad with ``F.pad`` first, as PyTorch does). Input that is not on a CUDA device
    runs through PyTorch's own convolution, so a converted model still runs on the CPU.
    """

    def _conv_forward(self, input: Any, weight: Any, bias: Any) -> Any:
        if not input.is_cuda:
            return super()._conv_forward(input, weight, bias)
        if self.padding_mode != "zeros":
            return conv2d(F.pad(input, self._reversed_padding_repeated_twice,
                                mode=self.padding_mode),
                          weight, bias, self.stride, 0, self.dilation, self.groups)
        return conv2d(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)


def convert(module: Any) -> Any:
    """Make every ``torch.nn.Conv2d`` in ``module`` (itself included) a
    [`pycudnn.torch.Conv2d`][pycudnn.torch.Conv2d], in place, and return ``module``.

    Only modules whose type is exactly ``torch.nn.Conv2d`` change (subclasses may compute
    something else); they stay the same objects, so their parameters, buffers, hooks and an
    optimizer that holds them are unaffected.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"convert: expected a torch.nn.Module, got {type(module).__name__}")
    for m in module.modules():
        if type(m) is torch.nn.Conv2d:
            m.__class__ = Conv2d
    return module


def revert(module: Any) -> Any:
    """Undo [`convert`][pycudnn.torch.convert]: every [`pycudnn.torch.Conv2d`][pycudnn.torch.Conv2d]
    in ``module`` (itself included) becomes a ``torch.nn.Conv2d`` again, in place; returns
    ``module``. For tools that test for ``torch.nn.Conv2d`` exactly (quantization's module
    fusion, ``torch.fx.experimental.optimization.fuse``)."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"revert: expected a torch.nn.Module, got {type(module).__name__}")
    for m in module.modules():
        if type(m) is Conv2d:
            m.__class__ = torch.nn.Conv2d
    return module


class FusedConv2d(torch.nn.Module):
    """An inference convolution with its epilogue: ``conv + bias``, ``relu(conv + bias)`` or
    ``relu(conv + bias + z)`` (``residual=True``: ``forward(x, z)``), made by
    [`fuse_for_inference`][pycudnn.torch.fuse_for_inference].

    Runs through [`conv2d_bias_relu`][pycudnn.torch.conv2d_bias_relu] /
    [`conv2d_add_relu`][pycudnn.torch.conv2d_add_relu] on CUDA tensors, and through PyTorch's own
    operations elsewhere (or when ``z`` does not have the output's shape).
    """

    def __init__(self, weight: Any, bias: Any, stride: Any = 1, padding: Any = 0,
                 dilation: Any = 1, groups: int = 1, relu: bool = False,
                 residual: bool = False) -> None:
        super().__init__()
        if residual and not relu:
            raise ValueError("FusedConv2d: residual=True needs relu=True (conv + z + relu)")
        self.weight = torch.nn.Parameter(weight.detach(), requires_grad=False)
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach(),
                                                                  requires_grad=False)
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.relu, self.residual = relu, residual

    def extra_repr(self) -> str:
        k, c, r, s = self.weight.shape
        return (f"{c * self.groups}, {k}, kernel_size=({r}, {s}), stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
                f"bias={self.bias is not None}, relu={self.relu}, residual={self.residual}")

    def forward(self, x: Any, z: Any = None) -> Any:
        w, b = self.weight, self.bias
        args = (self.stride, self.padding, self.dilation, self.groups)
        if x.is_cuda and x.dim() == 4:
            if self.residual:
                if z is not None and z.shape == self.out_shape(x):
                    return conv2d_add_relu(x, w, z, b, 1.0, *args)
            elif self.relu:
                return conv2d_bias_relu(x, w, b, *args)
            else:
                return conv2d(x, w, b, *args)
        y = F.conv2d(x, w, b, *args)
        if self.residual:
            y = y + z
        return torch.relu(y) if self.relu else y

    def out_shape(self, x: Any) -> tuple[int, ...]:
        geom, pre_pad = _geometry(self.stride, self.padding, self.dilation, self.groups,
                                  self.weight)
        st, pad, dil, _ = geom
        k, _, r, s = self.weight.shape
        extra = (pre_pad[3], pre_pad[1]) if pre_pad is not None else (0, 0)
        return (x.shape[0], k) + tuple(
            (i + e + 2 * p - d * (kk - 1) - 1) // t + 1
            for i, e, kk, t, p, d in zip(x.shape[2:], extra, (r, s), st, pad, dil))


# ---- inference fusion -----------------------------------------------------------------------------

def fold_batchnorm(conv: Any, bn: Any) -> tuple[Any, Any]:
    """``(weight, bias)`` of one convolution equal to ``bn(conv(x))`` with ``bn`` in eval mode
    (its running statistics), computed in float64 and returned in the convolution's dtype and
    memory format."""
    if bn.running_mean is None or bn.running_var is None:
        raise ValueError("fold_batchnorm: the BatchNorm keeps no running statistics "
                         "(track_running_stats=False); it cannot be folded")
    w = conv.weight.detach()
    scale = bn.running_var.detach().double().add(bn.eps).rsqrt()
    if bn.weight is not None:
        scale = scale * bn.weight.detach().double()
    shift = -bn.running_mean.detach().double() * scale
    if conv.bias is not None:
        shift = shift + conv.bias.detach().double() * scale
    if bn.bias is not None:
        shift = shift + bn.bias.detach().double()
    folded = torch.empty_like(w)  # keeps the weight's memory format
    folded.copy_(w.double() * scale.view(-1, 1, 1, 1))
    return folded, shift.to(w.dtype)


def fuse_for_inference(model: Any) -> Any:
    """A copy of ``model`` (in eval mode) for inference, with BatchNorm folded into the
    convolutions before it and fused pycudnn calls for the epilogues.

    The model is traced with ``torch.fx``; these patterns are recognised (``conv`` a
    ``torch.nn.Conv2d`` or [`pycudnn.torch.Conv2d`][pycudnn.torch.Conv2d] with
    ``padding_mode="zeros"``, ``bn`` a ``torch.nn.BatchNorm2d`` with running statistics, each
    output used only by the next step; ReLU as ``nn.ReLU``, ``F.relu``, ``torch.relu`` or
    ``.relu()``; the add as ``+``, ``+=``, ``torch.add`` or ``.add`` without ``alpha``):

    * ``conv -> [bn] -> relu``: one [`conv2d_bias_relu`][pycudnn.torch.conv2d_bias_relu];
    * ``conv -> [bn] -> add(other) -> relu``: one [`conv2d_add_relu`][pycudnn.torch.conv2d_add_relu]
      with ``z = other`` (a ResNet block's last convolution and its shortcut);
    * ``conv -> [bn]`` otherwise: one convolution with the folded bias.

    A part of the model that fx cannot trace is searched module by module instead; what matches
    no pattern stays as it is. The result is a copy (``model`` itself when nothing matched): a
    ``torch.fx.GraphModule``, or a copy of ``model``'s own class where fx could not trace it as
    a whole; the original model is not modified and shares no parameters with it. A convolution
    module called more than once is fused separately for each call.

    Raises:
        ValueError: the model is in training mode (BatchNorm's batch statistics cannot be folded).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"fuse_for_inference: expected a torch.nn.Module, got "
                        f"{type(model).__name__}")
    if model.training:
        raise ValueError("fuse_for_inference: the model is in training mode; call model.eval() "
                         "first (BatchNorm is folded with its running statistics)")
    # a copy: the parts fx cannot trace are rewritten in place, and the fused modules must not
    # share weights with a model that may go on training
    fused = _fuse(copy.deepcopy(model))
    return model if fused is None else fused


_RELU_FUNCTIONS = {F.relu, F.relu_, torch.relu, torch.relu_}
_ADD_FUNCTIONS = {operator.add, operator.iadd, torch.add}


def _fuse(module: Any) -> Any | None:
    """``module`` with its patterns fused: a GraphModule, or ``module`` itself with fused
    children where fx cannot trace it; None where nothing matched."""
    import torch.fx

    class Tracer(torch.fx.Tracer):
        """fx's tracer, with pycudnn's modules as leaves (like torch.nn's own): tracing into
        ``Conv2d._conv_forward`` would stop at its device test."""

        def is_leaf_module(self, m: Any, qualname: str) -> bool:
            return isinstance(m, (Conv2d, FusedConv2d)) or super().is_leaf_module(m, qualname)

    try:
        gm = torch.fx.GraphModule(module, Tracer().trace(module), type(module).__name__)
    except Exception:  # dynamic control flow, ...: look inside its children instead
        changed = False
        for name, child in list(module.named_children()):
            fused = _fuse(child)
            if fused is not None:
                setattr(module, name, fused)
                changed = True
        return module if changed else None
    return gm if _rewrite(gm) else None


def _users(node: Any) -> list[Any]:
    return list(node.users)


def _is_relu(node: Any, modules: dict[str, Any]) -> bool:
    if node.op == "call_module":
        return type(modules.get(node.target)) is torch.nn.ReLU
    if node.op == "call_function":  # F.relu(x, inplace=...) included
        return (node.target in _RELU_FUNCTIONS and len(node.args) + len(node.kwargs) <= 2
                and all(type(a) is bool for a in node.args[1:]) and set(node.kwargs) <= {"inplace"})
    return node.op == "call_method" and node.target in ("relu", "relu_") and len(node.args) == 1


def _is_add(node: Any) -> bool:
    if node.op == "call_function":
        return node.target in _ADD_FUNCTIONS and len(node.args) == 2 and not node.kwargs
    return node.op == "call_method" and node.target in ("add", "add_") and len(node.args) == 2 \
        and not node.kwargs


def _rewrite(gm: Any) -> bool:
    """Fuse the patterns in ``gm``'s graph (in place); whether anything changed."""
    import torch.fx

    modules = dict(gm.named_modules())
    graph = gm.graph
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_module":
            continue
        conv = modules.get(node.target)
        if conv is None or type(conv) not in (torch.nn.Conv2d, Conv2d) \
                or conv.padding_mode != "zeros":
            continue
        if len(node.args) != 1 or node.kwargs:
            continue
        weight, bias = conv.weight.detach(), None if conv.bias is None else conv.bias.detach()
        tail = node
        users = _users(node)
        if (len(users) == 1 and users[0].op == "call_module"
                and type(modules.get(users[0].target)) is torch.nn.BatchNorm2d
                and modules[users[0].target].running_mean is not None):
            weight, bias = fold_batchnorm(conv, modules[users[0].target])
            tail = users[0]
        users = _users(tail)
        relu_node = add_node = z = None
        if len(users) == 1 and _is_relu(users[0], modules):
            relu_node = users[0]
        elif len(users) == 1 and _is_add(users[0]):
            add = users[0]
            other = add.args[1] if add.args[0] is tail else add.args[0]
            after = _users(add)
            if (isinstance(other, torch.fx.Node) and other is not tail and len(after) == 1
                    and _is_relu(after[0], modules)):
                add_node, relu_node, z = add, after[0], other
        if tail is node and relu_node is None:
            continue  # a lone convolution: nothing to fuse
        fused = FusedConv2d(weight, bias, conv.stride, conv.padding, conv.dilation, conv.groups,
                            relu=relu_node is not None, residual=add_node is not None)
        name = base = f"{node.target}_fused"  # beside the convolution it replaces
        again = 1
        while name in modules:  # the same convolution called again: a name per call
            again += 1
            name = f"{base}{again}"
        modules[name] = fused
        gm.add_submodule(name, fused)
        last = relu_node if relu_node is not None else tail
        with graph.inserting_after(last):
            args = (node.args[0],) if z is None else (node.args[0], z)
            new = graph.call_module(name, args)
        last.replace_all_uses_with(new)
        for dead in dict.fromkeys((relu_node, add_node, tail, node)):  # last first, once each
            if dead is not None:
                graph.erase_node(dead)
        changed = True
    if changed:
        graph.lint()
        gm.delete_all_unused_submodules()
        gm.recompile()
    return changed
