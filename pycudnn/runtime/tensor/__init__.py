"""The device tensor view, its allocation, and interop in and out.

One module per part: `geometry` (shapes, strides, memory formats, overlap), `view` (`Tensor`
and its export), `dlpack` (DLPack's C structures), `importers` (`as_tensor`), `factories`
(`empty`, `zeros`, `from_numpy`). This package hands their public names on.

A `Tensor` is a view of device memory: pointer, shape, strides (in elements), dtype, device, and
an optional ``owner`` that keeps the memory alive; building one needs no GPU. pycudnn's
functions take anything `as_tensor()` accepts (a `Tensor`, a PyTorch tensor, the CUDA array
interface, DLPack, checked in that order) and never copy it; host arrays are refused with a
TypeError pointing at `from_numpy()`. Read-only memory stays read-only through views and
exports, and no function writes to it (`check_writable()`). The rules of each import and export
(streams, bfloat16, DLPack's deleters, memory formats) are in docs/architecture.md ("Tensors in
and out").
"""

from .factories import empty, from_numpy, zeros
from .geometry import (MEMORY_FORMATS, channels_last_strides, contiguous_strides,
                       has_internal_overlap, span_elements)
from .dlpack import dlpack_managed
from .importers import SupportsCudaArrayInterface, SupportsDLPack, TensorLike, as_tensor
from .view import Tensor, check_writable, spans_overlap, tensor_from_pointer, views_overlap

__all__ = ["Tensor", "as_tensor", "TensorLike", "SupportsCudaArrayInterface", "SupportsDLPack", "tensor_from_pointer", "empty", "zeros", "from_numpy",
           "span_elements", "contiguous_strides", "channels_last_strides", "MEMORY_FORMATS",
           "has_internal_overlap", "spans_overlap", "views_overlap", "check_writable",
           "dlpack_managed"]
