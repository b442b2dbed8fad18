"""Argument checks shared by the public functions' full path and by prepared calls.

Each check names the parameter and the expected value (PyTorch's wording where it has one) and
runs before anything is launched, so a refused call leaves every buffer as it was.
"""

from __future__ import annotations

from typing import Any, Sequence

from .importers import as_tensor
from .view import Tensor, check_writable, views_overlap

__all__ = ["check_no_broadcast", "check_match", "check_size", "check_dtype", "check_device",
           "check_pair", "check_bias", "check_z", "check_out_reads"]


def check_no_broadcast(t: Tensor, name: str, fn: str) -> None:
    """cuDNN cannot read a dim of several elements with stride 0 (an expanded/broadcast view)."""
    if t.size == 0:
        return  # nothing is read
    for i, (size, stride) in enumerate(zip(t.shape, t.strides)):
        if stride == 0 and size > 1:
            raise ValueError(f"{fn}: expected {name} without broadcast dims, but dim {i} of "
                             f"{name} (size {size}) has stride 0 (strides {list(t.strides)}); make "
                             f"a contiguous copy first")


def check_match(a: Tensor, a_name: str, b: Tensor, b_name: str, fn: str = "") -> None:
    """``b`` has ``a``'s dtype and device (PyTorch's wording); the errors name ``fn`` where
    given."""
    if a.dtype == b.dtype and a.device == b.device:
        return
    where = f"{fn}: " if fn else ""
    if a.dtype != b.dtype:
        raise TypeError(f"{where}{a_name} type ({a.dtype.name}) and {b_name} type "
                        f"({b.dtype.name}) should be the same")
    raise ValueError(f"{where}expected {a_name} and {b_name} to be on the same device, but got "
                     f"{a_name} on cuda:{a.device} and {b_name} on cuda:{b.device}")


# The three checks below word an argument against what it must match: ``note`` follows the
# expected value (" (the input's)", say), and ``got_name`` repeats the argument's name after
# "but got". Callers on a per-call path test the three conditions inline first, so that an
# argument that passes costs no call.

def check_size(t: Tensor, name: str, shape: Sequence[int], fn: str, note: str = "",
               got_name: bool = True) -> None:
    """``t`` has the size ``shape`` (ValueError)."""
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{fn}: expected {name} of size {list(shape)}{note}, but got "
                         + (f"{name} of size " if got_name else "") + f"{list(t.shape)}")


def check_dtype(t: Tensor, name: str, dtype: Any, fn: str, note: str = "") -> None:
    """``t`` has the dtype ``dtype`` (TypeError)."""
    if t.dtype != dtype:
        raise TypeError(f"{fn}: expected {name} to have dtype {dtype.name}{note}, but got "
                        f"{t.dtype.name}")


def check_device(t: Tensor, name: str, device: int, fn: str, note: str = "",
                 got_name: bool = False) -> None:
    """``t`` is on the CUDA device ``device`` (ValueError)."""
    if t.device != device:
        raise ValueError(f"{fn}: expected {name} on cuda:{device}{note}, but got "
                         + (f"{name} on " if got_name else "") + f"cuda:{t.device}")


def check_pair(a: Tensor, a_name: str, b: Tensor, b_name: str) -> None:
    if a.dtype != b.dtype or a.device != b.device:
        check_match(a, a_name, b, b_name)
    if a.ndim != b.ndim:
        raise ValueError(f"expected {b_name} to have {a.ndim} dims like {a_name} "
                         f"(size {list(a.shape)}), but got {b_name} of size {list(b.shape)}")
    check_no_broadcast(a, a_name, "convolution")
    check_no_broadcast(b, b_name, "convolution")


def check_bias(bias: Any, k: int, ref: Tensor, stream: Any = None) -> Tensor:
    """``bias`` as a Tensor after the checks every path applies to it (the full path and
    `PreparedConvolution` alike): K elements in one dim, the
    input's dtype and device. Any stride is fine: fused epilogues read a copy
    (`pycudnn.cudnn.tensor_ops.contiguous_bias()`)."""
    bias = as_tensor(bias, stream=stream)
    if bias.ndim != 1 or bias.shape[0] != k:
        raise ValueError(f"expected bias to be 1-dimensional with {k} elements, but got bias of size {list(bias.shape)}")
    if bias.dtype != ref.dtype:
        raise TypeError(f"bias type ({bias.dtype.name}) and input type ({ref.dtype.name}) should be the same")
    if bias.device != ref.device:
        raise ValueError(f"expected bias to be on the input's device (cuda:{ref.device}), but got "
                         f"bias on cuda:{bias.device}")
    return bias


def check_z(z: Any, shape: Sequence[int], ref: Tensor, fn: str, stream: Any = None) -> Tensor:
    """``z`` (the residual of convolution_add_relu) as a Tensor after the checks every path applies
    to it: the input's dtype, device and rank, no broadcast dims, and the output's ``shape``."""
    if z is None:
        raise ValueError(f"{fn}: expected z of size {list(shape)} (the output's), but got None")
    z = as_tensor(z, stream=stream)
    check_pair(ref, "input", z, "z")
    if tuple(z.shape) != tuple(shape):
        raise ValueError(f"{fn}: expected z of size {list(shape)} (the output's), but got {list(z.shape)}")
    return z


def check_out_reads(out: Tensor, reads: Sequence[tuple[str, Tensor | None]], fn: str = "",
                    in_place: Tensor | None = None, name: str = "out",
                    in_place_name: str = "the input") -> None:
    """Refuse an ``out`` that is read-only or shares memory with a tensor the call reads (or
    writes: any of ``reads``; None entries are skipped). ``in_place`` (an input cuDNN may
    overwrite) may be ``out`` exactly, same address and strides, but not partly. The errors name
    ``fn`` (where given) and ``name``."""
    where = f"{fn}: {name}" if fn else name
    if out.readonly:
        check_writable(out, where)
    if in_place is not None and views_overlap(out, in_place) and not (
            out.ptr == in_place.ptr and out.strides == in_place.strides):
        raise ValueError(f"{where} partially overlaps {in_place_name}, which it may replace in "
                         f"place: pass {in_place_name} itself (same address and strides) or an "
                         f"output that shares no memory with it")
    for read, t in reads:
        if t is not None and views_overlap(out, t):
            raise ValueError(f"{where} overlaps {read}, which the call reads or writes: cuDNN "
                             f"does not compute in place, the result would be wrong; pass an "
                             f"output that shares no memory with the other arguments")
