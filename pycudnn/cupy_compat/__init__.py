"""Drop-in replacements for CuPy 13's ``cupyx.cudnn`` convolution functions.

CuPy 14 removed ``cupyx.cudnn``. Code written for CuPy 13 keeps working by changing one import::

    from cupyx import cudnn                      # CuPy <= 13
    from pycudnn import cupy_compat as cudnn     # CuPy 14 + pycudnn

The three functions keep CuPy 13's names, positional parameters, keyword-only parameters and
defaults, and its semantics: the result is written into the preallocated array the caller passes
(``y``, or ``gW``), an optional bias ``b`` (one value per channel) is added, and nothing is
returned. They run on CuPy's current stream (more precisely: the current stream of the framework
the data array comes from, see
`pycudnn.current_stream()`), and accept any array pycudnn
accepts (CuPy, PyTorch, Numba, `pycudnn.Tensor`), without copies.

How the parameters map onto pycudnn:

* ``auto_tune=True`` measures the candidates (pycudnn's ``benchmark=True``) and remembers the
  fastest; ``False`` takes cuDNN's heuristics. Both are cached per shape, as in CuPy.
* ``tensor_core``: ``'auto'`` and ``'always'`` allow tensor cores (``allow_tf32=True``: float32
  may run in TF32 on Ampere and later); ``'never'`` sets ``allow_tf32=False`` (float32 is computed
  in full float32). Half precision always may use tensor cores: cuDNN has no other fast path.
* ``deterministic=True`` keeps only deterministic algorithms (pycudnn's ``deterministic``).
* ``d_layout`` / ``w_layout``: `CUDNN_TENSOR_NCHW` (0, default) or
  `CUDNN_TENSOR_NHWC` (1). With NHWC the arrays are shaped the way CuPy 13 wanted them,
  ``(N, H, W, C)`` for data and ``(K, R, S, C)`` for the filter; pycudnn views them as NCHW shapes
  with channels-last strides (no copy). As in CuPy 13 the layouts apply to 4-D arrays; the data
  layout of other ranks is channels-first whatever ``d_layout`` says (CuPy ignored it too).
* The workspace is bounded by `set_max_workspace_size()` when it was called; by default
  (unlike CuPy's 8 MiB) pycudnn lets cuDNN use what the device has free, which allows faster
  algorithms.

Differences that only widen what is accepted: inputs and outputs need not be C-contiguous (CuPy
13 copied inputs and refused non-contiguous outputs; broadcast inputs, e.g. from
``cupy.broadcast_to``, are copied here too), bfloat16 works, and errors are Python exceptions
naming the bad argument (``ValueError`` / ``TypeError``) instead of assertion errors or cuDNN
status errors.

The drop-in covers CuPy 13's convolutions (`convolution`), its activation, softmax and pooling
functions (`operations`), batch normalization (`normalization`) and ``DropoutStates``
(`dropout`), with every constant CuPy 13 named; `arrays` holds what they share (the tensor
formats, the views of the caller's arrays, the stream of an array, results like the input).
"""

from . import convolution, dropout, normalization, operations
from .arrays import CUDNN_TENSOR_NCHW, CUDNN_TENSOR_NHWC
# each module's __all__ is the list of its names
from .convolution import *
from .dropout import *
from .normalization import *
from .operations import *

__all__ = (convolution.__all__ + ["CUDNN_TENSOR_NCHW", "CUDNN_TENSOR_NHWC"] + operations.__all__
           + normalization.__all__ + dropout.__all__)
