"""Shapes, strides and memory formats: contiguous and channels-last strides, the span of a view,
overlap within a view, PyTorch's memory-format rules, the checks of shape and format arguments,
and a convolution's output size.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Sequence

import numpy as np

#: memory_format spellings accepted by `empty()`,
#: `from_numpy()` and ``is_contiguous``
MEMORY_FORMATS = ("contiguous", "channels_last", "channels_last_3d")


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """C-order (row-major) strides in elements (a size-0 dim counts as 1, as in PyTorch)."""
    out = []
    acc = 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n or 1
    out.reverse()
    return tuple(out)


def channels_last_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Strides (in elements) of a 4-D NCHW shape stored NHWC, or a 5-D NCDHW shape stored NDHWC."""
    nd = len(shape)
    if nd not in (4, 5):
        raise ValueError(f"memory_format: 'channels_last' needs a 4-D (N, C, H, W) or 5-D "
                         f"(N, C, D, H, W) shape, got {nd}-D {tuple(shape)}")
    strides = [0] * nd
    acc = 1
    for d in [1] + list(range(nd - 1, 1, -1)) + [0]:  # C fastest, then W, H, (D), N
        strides[d] = acc
        acc *= max(shape[d], 1)
    return tuple(strides)


def conv_output_size(input_size: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
                     padding: Sequence[int], dilation: Sequence[int]) -> tuple[int, ...]:
    """Spatial output sizes of a convolution: ``(i + 2p - d*(k-1) - 1) // s + 1`` per dim."""
    return tuple((i + 2 * p - d * (k - 1) - 1) // s + 1
                 for i, k, s, p, d in zip(input_size, kernel, stride, padding, dilation))


def span_elements(shape: Sequence[int], strides: Sequence[int]) -> int:
    """Elements spanned in memory by a strided view (0 when it has no element)."""
    span = 1
    for n, s in zip(shape, strides):
        if n == 0:
            return 0
        span += (n - 1) * s
    return span


#: views of at most this many elements are checked for overlap element by element when the quick
#: rules cannot tell; larger exotic layouts are let through, as PyTorch does ("too hard")
OVERLAP_EXACT_MAX = 1 << 16


def element_offsets(shape: Sequence[int], strides: Sequence[int]) -> np.ndarray:
    """Every element's offset (in elements) from the view's start, sorted."""
    off: np.ndarray = np.zeros((), np.int64)
    for n, s in zip(shape, strides):
        off = np.add.outer(off, np.arange(n, dtype=np.int64) * s)
    return np.sort(off, axis=None)


def has_internal_overlap(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether two elements of a view share memory (an output like that is undefined).

    Exact for every layout a view can be made of a dense buffer (permuted, padded, sliced); a
    zero stride on a dim of size > 1, or more elements than the span has places, always is one.
    Other interleaved layouts are checked element by element up to ``OVERLAP_EXACT_MAX`` elements
    and let through above (never a false refusal)."""
    dims = sorted((s, n) for n, s in zip(shape, strides) if n > 1)
    reach = 0  # the largest offset the smaller-stride dims reach
    for s, n in dims:
        if s <= reach:
            break
        reach += (n - 1) * s
    else:
        return False  # each dim steps past everything the smaller ones span
    if any(s == 0 for s, _ in dims):
        return True
    count = math.prod(n for _, n in dims)
    if count > span_elements(shape, strides):
        return True  # more elements than places
    if count > OVERLAP_EXACT_MAX:
        return False
    off = element_offsets(shape, strides)
    return bool(np.any(off[1:] == off[:-1]))


def is_contiguous_strides(shape: tuple, strides: tuple) -> bool:
    expected = 1
    for i in range(len(shape) - 1, -1, -1):
        n = shape[i]
        if n == 0:
            return True
        if n != 1:
            if strides[i] != expected:
                return False
            expected *= n
    return True


def is_channels_last_contiguous(shape: tuple, strides: tuple) -> bool:
    """PyTorch's compute_channels_last_contiguous_2d / _3d (size-1 dims are ignored)."""
    order = (1, 3, 2, 0) if len(shape) == 4 else (1, 4, 3, 2, 0)
    expected = 1
    for d in order:
        n = shape[d]
        if n != 1:
            if strides[d] != expected:
                return False
            expected *= n
    return True


def strides_like_channels_last(shape: tuple, strides: tuple) -> bool:
    """PyTorch's is_channels_last_strides_2d_s4 / 3d_s5: strides ordered C < W < H (< D) < N."""
    order = (1, 3, 2, 0) if len(shape) == 4 else (1, 4, 3, 2, 0)
    if strides[1] == 0:  # trivial C dimension: default to contiguous
        return False
    minimum = 0
    for d in order:
        if shape[d] == 0:
            return False
        if strides[d] < minimum:
            return False
        # N111 with identical strides, or N11W sliced on W: ambiguous, default to contiguous
        if d == 0 and minimum == strides[1]:
            return False
        minimum = strides[d]
        if shape[d] > 1:
            minimum *= shape[d]
    return True


def type_name(obj: Any) -> str:
    t = type(obj)
    mod = t.__module__
    return t.__qualname__ if mod == "builtins" else f"{mod}.{t.__qualname__}"


def int_tuple(value: Any, parameter: str, what: str) -> tuple[int, ...]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (value,)
    try:
        items = tuple(value)
    except TypeError:
        raise TypeError(f"{what}: {parameter} must be a sequence of ints, got "
                        f"{type(value).__name__}") from None
    out = []
    for v in items:
        try:
            if isinstance(v, (bool, np.bool_)):  # NumPy < 2.3's bool_ has __index__: never a size
                raise TypeError
            v = operator.index(v)
        except TypeError:
            raise TypeError(f"{what}: {parameter} must be a sequence of ints, got {value!r}") from None
        if v < 0:
            raise ValueError(f"{what}: {parameter} must be non-negative, got {tuple(items)}")
        out.append(v)
    return tuple(out)


def check_format(memory_format: Any, ndim: int, what: str) -> str:
    if memory_format == "contiguous":
        return "contiguous"
    if memory_format == "channels_last":
        if ndim not in (4, 5):
            raise ValueError(f"{what}: memory_format='channels_last' needs a 4-D (N, C, H, W) or 5-D "
                             f"(N, C, D, H, W) shape, got {ndim}-D; PyTorch has no channels_last for "
                             "other ranks; use memory_format='contiguous'")
        return "channels_last"
    if memory_format == "channels_last_3d":
        if ndim != 5:
            raise ValueError(f"{what}: memory_format='channels_last_3d' needs a 5-D (N, C, D, H, W) "
                             f"shape, got {ndim}-D")
        return "channels_last"
    raise ValueError(f"{what}: memory_format must be one of {', '.join(map(repr, MEMORY_FORMATS))}, "
                     f"got {memory_format!r}")
