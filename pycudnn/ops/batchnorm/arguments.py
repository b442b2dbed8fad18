"""The argument checks of the batch-norm functions (each error names the function and the
parameter), the modes (`MODES`, `BN_OPS`), and the views cuDNN reads the arguments through: 2-D and
3-D input as 4-D (`as4d`), parameters as ``(1, C, ...)`` (`param_view`)."""

from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

import numpy as np

from ...runtime.tensor.checks import (check_device, check_dtype, check_no_broadcast,
                                      check_out_reads, check_size)
from ...runtime.tensor import Tensor, as_tensor, check_writable, has_internal_overlap


#: ``cudnnBatchNormMode_t`` by name
MODES = {"per_activation": 0, "spatial": 1, "spatial_persistent": 2}
MODE_NAMES = {v: k for k, v in MODES.items()}
#: ``cudnnBatchNormOps_t`` by name
BN_OPS = {"bn": 0, "bn_activation": 1, "bn_add_activation": 2}
OPS_BN, OPS_ADD_RELU = 0, 2


def check_mode(mode: Any, fn: str) -> int:
    if isinstance(mode, str):
        key = mode.lower()
        if key.startswith("cudnn_batchnorm_"):
            key = key[len("cudnn_batchnorm_"):]
        if key in MODES:
            return MODES[key]
    elif isinstance(mode, (int, np.integer)) and not isinstance(mode, (bool, np.bool_)):
        if int(mode) in MODE_NAMES:
            return int(mode)
    raise ValueError(f"{fn}: expected mode to be 'per_activation', 'spatial' or "
                     f"'spatial_persistent' (or CUDNN_BATCHNORM_* 0, 1, 2), but got mode={mode!r}")


def _real(value: Any, name: str, fn: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{fn}: expected {name} to be a real number, but got "
                        f"{type(value).__name__} {value!r}")
    return float(value)


def check_eps(eps: Any, fn: str) -> float:
    e = _real(eps, "eps", fn)
    if not (e >= 0.0 and math.isfinite(e)):  # cuDNN's CUDNN_BN_MIN_EPSILON is 0
        raise ValueError(f"{fn}: expected eps to be a finite number >= 0, but got eps={eps!r}")
    return e


def check_momentum(momentum: Any, fn: str) -> float:
    # any finite weight, as PyTorch's F.batch_norm takes (cuDNN's exponentialAverageFactor is
    # a plain double: running = (1 - m) * running + m * batch, an extrapolation outside [0, 1])
    m = _real(momentum, "momentum", fn)
    if not math.isfinite(m):
        raise ValueError(f"{fn}: expected momentum to be a finite number (the weight of the "
                         f"batch statistics in the running average), but got "
                         f"momentum={momentum!r}")
    return m


def tensor_of(obj: Any, stream: Any) -> Tensor:
    return obj if type(obj) is Tensor else as_tensor(obj, stream=stream)


def as4d(t: Tensor) -> Tensor:
    """(N, C) as (N, C, 1, 1) and (N, C, L) as (N, C, 1, L) views; 4-D and 5-D unchanged."""
    nd = t.ndim
    if nd == 2:
        s0, s1 = t.strides
        return Tensor._make(t.ptr, t.shape + (1, 1), (s0, s1, s1, s1), t.dtype, t.device, t,
                            t.readonly)
    if nd == 3:
        return t.unsqueeze(2)
    return t


def from4d(t4: Tensor, shape: tuple[int, ...]) -> Tensor:
    """The view of a 4-D working tensor in the caller's ``shape`` (the inverse of as4d)."""
    if len(shape) == t4.ndim:
        return t4
    if len(shape) == 2:
        strides: tuple[int, ...] = t4.strides[:2]
    else:
        strides = t4.strides[:2] + t4.strides[3:]
    return Tensor._make(t4.ptr, shape, strides, t4.dtype, t4.device, t4, t4.readonly)


def memory_format_of(x4: Tensor) -> str:
    return "channels_last" if x4.memory_format == "channels_last" else "contiguous"


def check_x(x: Tensor, fn: str, name: str = "input") -> None:
    if x.ndim not in (2, 3, 4, 5):
        raise ValueError(f"{fn}: expected {name} to have 2 to 5 dims (N, C and up to 3 spatial "
                         f"dims), but got {name} of size {list(x.shape)}")
    check_no_broadcast(x, name, fn)


def check_like(t: Tensor, name: str, x: Tensor, fn: str, x_name: str = "input") -> None:
    """A tensor that must match the input: same shape, dtype and device."""
    if tuple(t.shape) != tuple(x.shape) or t.dtype != x.dtype or t.device != x.device:
        check_size(t, name, x.shape, fn, f" ({x_name}'s)")
        check_dtype(t, name, x.dtype, fn, f" ({x_name}'s)")
        check_device(t, name, x.device, fn, f" ({x_name}'s device)")
    check_no_broadcast(t, name, fn)


_F64, _F32 = np.dtype(np.float64), np.dtype(np.float32)


def param_dtype(x: Tensor) -> np.dtype:
    return _F64 if x.dtype == _F64 else _F32


def param_shape(x: Tensor, mode: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the 1-D or per-activation shape the caller passes, cuDNN's 4-D/5-D parameter shape)."""
    x4_shape = _as4d_shape(x.shape)
    if mode == MODES["per_activation"]:
        return tuple(x.shape[1:]), (1,) + x4_shape[1:]
    return (x.shape[1],), (1, x.shape[1]) + (1,) * (len(x4_shape) - 2)


def _as4d_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    if len(shape) == 2:
        return shape + (1, 1)
    if len(shape) == 3:
        return shape[:2] + (1,) + shape[2:]
    return shape


def check_param(obj: Any, name: str, x: Tensor, mode: int, fn: str, stream: Any,
                writable: bool = False) -> Tensor:
    """A scale/bias/statistic: (C,) for spatial modes, (C, *spatial) or its flat (C*spatial,)
    form for per_activation; float32 (float64 for float64 input); on the input's device."""
    t = tensor_of(obj, stream)
    shape, p4 = param_shape(x, mode)
    count = math.prod(shape)
    if tuple(t.shape) != shape and tuple(t.shape) != (count,):
        what = (f"{count} elements, one per channel" if mode != MODES["per_activation"]
                else f"size {list(shape)} (one value per activation) or {count} elements")
        raise ValueError(f"{fn}: expected {name} with {what} for input of size {list(x.shape)} "
                         f"(mode {MODE_NAMES[mode]!r}), but got {name} of size {list(t.shape)}")
    pdt = param_dtype(x)
    if t.dtype != pdt or t.device != x.device:
        why = ("cuDNN keeps scale, bias and statistics in float32 for float16 and bfloat16 input"
               if x.dtype.name in ("float16", "bfloat16") else "the input's precision")
        check_dtype(t, name, pdt, fn, f" ({why})")
        check_device(t, name, x.device, fn, " (the input's device)")
    # refused here, naming the parameter, before a handle is taken or anything is staged
    check_no_broadcast(t, name, fn)
    if writable:
        check_writable(t, name)
        if t.size and has_internal_overlap(t.shape, t.strides):
            raise ValueError(f"{fn}: {name} has overlapping elements (strides {list(t.strides)}); "
                             f"pass a tensor without overlapping elements")
    return t


def param_view(t: Tensor, p4: tuple[int, ...]) -> Tensor:
    """A parameter tensor as cuDNN's (1, C, ...) shape, keeping its strides."""
    if t.ndim == 1:
        s = t.strides[0] if t.strides else 1
        acc, strides = 1, []
        for size in reversed(p4):
            strides.append(acc * s)
            acc *= size
        return Tensor._make(t.ptr, p4, tuple(reversed(strides)), t.dtype, t.device, t, t.readonly)
    return as4d(t.unsqueeze(0))


def check_out(out: Any, name: str, x: Tensor, fn: str, stream: Any,
              reads: Sequence[tuple[str, Tensor | None]]) -> Tensor:
    o = tensor_of(out, stream)
    check_writable(o, name)
    check_like(o, name, x, fn)
    if o.size and has_internal_overlap(o.shape, o.strides):
        raise ValueError(f"{fn}: {name} has overlapping elements (strides {list(o.strides)}): more "
                         f"than one element refers to a single memory location; pass an output "
                         f"without overlapping elements")
    check_out_reads(o, reads, name=name)
    return o


def check_written(fn: str, o: Tensor | None, sm: Tensor | None, si: Tensor | None,
                  reads: list[tuple[str, Tensor | None]]) -> None:
    """The checks of a planned call's optional outputs that its key cannot know (read-only
    flags, memory shared with the other arguments), as `check_out` and `save_outputs` make
    them."""
    if o is not None:
        check_out_reads(o, reads)
    reads = reads + [("out", o)]
    if sm is not None:
        check_out_reads(sm, reads, name="save_mean")
    if si is not None:
        check_out_reads(si, reads + [("save_mean", sm)], name="save_invstd")
