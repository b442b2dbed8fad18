"""The convolution functions' argument checks: geometry (an int or one int per spatial dim),
groups, ranks, channels, the output size, string padding, shape arguments, the activation, and
the memory format a call runs in (``cudnn_conv_suggest_memory_format``).

Each check names the parameter and the expected value, in PyTorch's wording where it has one,
and runs before anything is allocated or launched.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..runtime.tensor import Tensor
from ..runtime.tensor.geometry import conv_output_size

__all__ = ["INT_MAX", "spatial_arg", "geometry_args", "groups_arg", "check_sample_size",
           "check_rank", "check_output_positive", "check_grad_y", "check_channels",
           "suggest_memory_format", "activation_arg", "string_padding", "shape_arg"]

#: cuDNN takes sizes and geometry as C ints
INT_MAX = 2**31 - 1


def spatial_arg(name: str, value: Any, nd: int, minimum: int, what: str) -> tuple[int, ...]:
    """An int or one int per spatial dim, each >= minimum; PyTorch-style errors otherwise."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        values = (int(value),) * nd
    elif isinstance(value, (tuple, list)):
        if len(value) != nd or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in value):
            raise ValueError(
                f"expected {name} to be a single integer value or a list of {nd} values to match "
                f"the convolution dimensions, but got {name}={list(value)}")
        values = tuple(int(v) for v in value)
    else:
        raise TypeError(f"{name}: expected an int or a tuple of {nd} ints, got {type(value).__name__} {value!r}")
    if any(v < minimum for v in values):
        raise ValueError(f"{what}, but got {name}={list(values)}")
    if any(v > INT_MAX for v in values):
        raise ValueError(f"{name}: expected every value to be at most {INT_MAX} (cuDNN takes C "
                         f"ints), but got {name}={list(values)}")
    return values


def geometry_args(stride: Any, padding: Any, dilation: Any,
                  nd: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    return (spatial_arg("stride", stride, nd, 1, "non-positive stride is not supported"),
            spatial_arg("padding", padding, nd, 0, "negative padding is not supported"),
            spatial_arg("dilation", dilation, nd, 1, "dilation should be greater than zero"))


def groups_arg(groups: Any) -> int:
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)):
        raise TypeError(f"groups: expected a positive int, got {groups!r}")
    if groups < 1:
        raise ValueError(f"non-positive groups is not supported, but got groups={int(groups)}")
    if groups > INT_MAX:
        raise ValueError(f"groups: expected at most {INT_MAX} (cuDNN takes a C int), but got "
                         f"groups={int(groups)}")
    return int(groups)


def check_sample_size(fn: str, *shapes: Sequence[int]) -> None:
    """cuDNN indexes within one sample with 32 bits: refuse a sample above 2^31 - 1 elements before
    anything is allocated (larger batches are split into pieces; a larger sample cannot be)."""
    if any(0 in tuple(shape) for shape in shapes):
        return  # nothing runs
    inner = max(math.prod(shape[1:]) for shape in shapes)
    if inner > INT_MAX:
        raise ValueError(
            f"{fn}: one sample holds {inner} elements ({' and '.join(str(list(sh[1:])) for sh in shapes)}), "
            f"more than cuDNN's 32-bit indexing allows (2^31 - 1); split the channels or spatial dims yourself")


def check_rank(t: Tensor, name: str, fn: str) -> int:
    if t.ndim not in (3, 4, 5):
        raise ValueError(f"{fn}: expected {name} to have 3, 4 or 5 dims (batch, channels and 1 to 3 "
                         f"spatial dims), but got {name} of size {list(t.shape)}")
    return t.ndim - 2


def check_output_positive(x_shape: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
                          padding: Sequence[int], dilation: Sequence[int], fn: str) -> tuple[int, ...]:
    spatial = conv_output_size(x_shape[2:], kernel, stride, padding, dilation)
    if any(o < 1 for o in spatial):
        padded = " x ".join(str(i + 2 * p) for i, p in zip(x_shape[2:], padding))
        eff = " x ".join(str(d * (k - 1) + 1) for k, d in zip(kernel, dilation))
        raise ValueError(f"{fn}: calculated padded input size per channel: ({padded}). Kernel size "
                         f"(dilated): ({eff}). Kernel size can't be greater than actual input size "
                         f"(output size would be {list(spatial)})")
    return spatial


def check_grad_y(fn: str, grad_y: Tensor, x_shape: Sequence[int], w_shape: Sequence[int],
                 stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
                 x_name: str, w_name: str) -> None:
    """A backward pass's grad_y must have the forward output's shape."""
    expected = (x_shape[0], w_shape[0]) + check_output_positive(x_shape, w_shape[2:], stride,
                                                                padding, dilation, fn)
    if tuple(grad_y.shape) != expected:
        raise ValueError(f"{fn}: expected grad_y of size {list(expected)} for {x_name} "
                         f"{list(x_shape)} and {w_name} {list(w_shape)}, but got {list(grad_y.shape)}")


def check_channels(x_shape: Sequence[int], w_shape: Sequence[int], groups: int, fn: str,
                   x_name: str = "input", w_name: str = "weight") -> None:
    if w_shape[0] % groups != 0:
        raise ValueError(f"{fn}: expected {w_name} of size {list(w_shape)} to have a first dim "
                         f"(output channels) divisible by groups={groups}, but got {w_shape[0]}")
    if x_shape[1] != w_shape[1] * groups:
        raise ValueError(f"{fn}: given groups={groups}, {w_name} of size {list(w_shape)}, expected "
                         f"{x_name}{list(x_shape)} to have {w_shape[1] * groups} channels, but got "
                         f"{x_shape[1]} channels instead")
    if any(k < 1 for k in w_shape):
        raise ValueError(f"{fn}: expected {w_name} to have positive sizes, got {list(w_shape)}")


def suggest_memory_format(*tensors: Tensor) -> str:
    """``cudnn_conv_suggest_memory_format``: channels_last when input or weight is channels_last,
    except for float64, which cuDNN runs only in NCHW (PyTorch disables NHWC for double too)."""
    if tensors[0].ndim in (4, 5) and tensors[0].dtype.name != "float64":
        for t in tensors:
            if t.memory_format == "channels_last":
                return "channels_last"
    return "contiguous"


def activation_arg(activation: Any) -> bool:
    if activation is None:
        return False
    if activation == "relu":
        return True
    raise ValueError(f"activation: expected None or 'relu', got {activation!r}")


def string_padding(padding: Any, stride: tuple[int, ...], dilation: tuple[int, ...],
                   kernel: Sequence[int], fn: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """PyTorch's ``padding='valid'`` / ``'same'``: (padding on both sides, the extra zero on
    the far side of the dims whose total padding ``dilation * (kernel - 1)`` is odd)."""
    nd = len(stride)
    if padding == "valid":
        return (0,) * nd, (0,) * nd
    if padding != "same":
        raise ValueError(f"{fn}: Invalid padding string '{padding}', should be one of "
                         f"['valid', 'same']")
    if any(s != 1 for s in stride):
        raise ValueError(f"{fn}: padding='same' is not supported for strided convolutions, but "
                         f"got stride={list(stride)}")
    totals = [d * (k - 1) for d, k in zip(dilation, kernel)]
    return tuple(t // 2 for t in totals), tuple(t % 2 for t in totals)


def shape_arg(name: str, shape: Any, ndim: int) -> tuple[int, ...]:
    if not isinstance(shape, (tuple, list)) or any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) for s in shape):
        raise TypeError(f"{name}: expected a tuple of {ndim} ints, got {shape!r}")
    if len(shape) != ndim:
        raise ValueError(f"{name}: expected {ndim} sizes, got {len(shape)}: {list(shape)}")
    if any(s < 0 for s in shape):
        raise ValueError(f"{name}: expected non-negative sizes, got {list(shape)}")
    return tuple(int(s) for s in shape)
