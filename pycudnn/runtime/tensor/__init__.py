"""The device tensor view, allocation through cuda.core, and interop in and out.

One module per part: `geometry` (shapes, strides, memory formats, overlap), `view` (`Tensor`
and its export), `dlpack` (DLPack's C structures), `importers` (`as_tensor`), `factories`
(`empty`, `zeros`, `from_numpy`). This package hands their public names on.

A `Tensor` is a view of device memory: pointer, shape, strides (in
elements), dtype, device, and an optional ``owner`` that keeps the memory alive. Building one needs
no GPU. pycudnn's functions take anything `as_tensor()` accepts and
never copy it.

**In** (`as_tensor()`, zero-copy, checked in this order):

1. a `Tensor`: returned as is;
2. a PyTorch tensor (recognised only when ``torch`` is already imported): its attributes are read
   directly (``data_ptr()``, ``shape``, ``stride()``, ``dtype``, ``get_device()``), which is the
   fastest path and also covers bfloat16 and tensors that require grad (pycudnn does no autograd;
   the result simply is not tracked). No stream synchronisation, as with CAI v2 which PyTorch
   exports: pass PyTorch's current stream to the operation;
3. ``__cuda_array_interface__`` (CuPy, Numba, ...), read once. Version 3's ``stream`` is honoured:
   when it differs from the consumer's stream (``stream=`` of
   `as_tensor()`, default the legacy default stream) the consumer waits
   on it through an event. CAI has no bfloat16 type
   string: ``'<V2'`` is read as bfloat16 (and pycudnn exports bfloat16 as ``'<V2'``). A CuPy
   ``ndarray`` (recognised when ``cupy`` is imported) is read through its attributes instead
   (CuPy builds the interface dictionary on every access), with the interface's stream rule:
   CuPy's current stream, its null stream as the default stream it exports, nothing under
   ``CUPY_CUDA_ARRAY_INTERFACE_EXPORT_VERSION=2``;
4. ``__dlpack__`` / ``__dlpack_device__`` (JAX, PyTorch, CuPy, ...): called with the consumer's
   stream (the legacy default stream is passed as 1, as the DLPack spec requires) and
   ``max_version=(1, 0)``, falling back to a legacy capsule. The producer's deleter runs when the
   Tensor (its owner) is garbage-collected.

Host arrays (numpy, CPU torch tensors, lists) are refused with a TypeError pointing at
`from_numpy()`. Negative strides are refused (cuDNN cannot use them),
and so is a device address that is not an int in ``[0, 2**64)`` (a bool, a float, a negative or too
large number), with the same check as `tensor_from_pointer()`.

**Read-only** memory stays read-only: the flag of CAI (``data[1]``) and of versioned DLPack
(``DLPACK_FLAG_BITMASK_READ_ONLY``) becomes `Tensor.readonly`, views of the tensor inherit
it, and every pycudnn function refuses a read-only tensor where it would write (``out=``) with
a ValueError naming the parameter (`check_writable()`). It is exported again through CAI and
versioned DLPack. Legacy DLPack capsules and PyTorch tensors carry no such flag (writable).

**Out**: ``__cuda_array_interface__`` (version 3, ``stream: None``) and ``__dlpack__``. DLPack
capsules are built with ctypes on top of a numpy-made ``DLManagedTensor``: numpy's C deleter and
capsule destructor own the lifetime (they keep the Tensor alive through the numpy array's base and
save any in-flight Python exception), and pycudnn overwrites the descriptive fields (data, device,
dtype, shape, strides) to describe the device memory. Pure-Python ctypes callbacks as deleters
would break when a consumer frees the tensor while an exception is propagating (CPython then runs
the callback with the exception set and turns it into a SystemError). pycudnn tracks no pending
work: its operations are ordered on the stream the caller passed, so ``__dlpack__(stream=...)``
does not synchronise; order the consumer's stream after pycudnn's yourself (same stream, or an
event) as with any CUDA library.

**memory_format** follows PyTorch's ``suggest_memory_format`` (what ``cudnn_conv_suggest_memory_format``
looks at): a 4-D tensor whose strides are ordered like NHWC (``is_channels_last_strides_2d``) or a
5-D one ordered like NDHWC is ``"channels_last"``; everything else, including ambiguous strides and
non-dense views, is ``"contiguous"``. ``"channels_last_3d"`` is accepted as an input spelling for
5-D tensors. ``channels_last`` for shapes other than 4-D and 5-D is refused (PyTorch has none).
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
