"""PyTorch integration: cuDNN convolutions through pycudnn inside PyTorch models.

``import pycudnn.torch`` imports PyTorch (``import pycudnn`` never does). It gives:

* `conv2d`: ``torch.nn.functional.conv2d``'s signature and semantics
  (memory formats, float32/float16/bfloat16/float64, ``padding="same"``/``"valid"``, unbatched
  input) as a ``torch.autograd.Function`` whose forward, backward-data and backward-filter
  convolutions run in pycudnn;
* `conv1d`, `conv3d`, `conv_transpose1d`, `conv_transpose2d` and `conv_transpose3d`:
  ``torch.nn.functional``'s other convolutions, differentiable the same way (a transposed
  convolution's forward is cuDNN's backward data; 1-D convolutions run as 2-D ones of unit
  height, as PyTorch's cuDNN path runs them);
* `Conv2d`: a drop-in ``torch.nn.Conv2d`` subclass (same constructor,
  parameters and ``state_dict``), and likewise `Conv1d`, `Conv3d`, `ConvTranspose1d`,
  `ConvTranspose2d` and `ConvTranspose3d`; `convert`, which turns every ``torch.nn``
  convolution of a model into pycudnn's in place, `revert`, which turns them back, and
  `conversion_report`, which lists what was converted and what was left to PyTorch, and why;
* `conv2d_bias_relu` and
  `conv2d_add_relu`: one fused cuDNN graph each
  (``relu(conv(x) + b)`` and ``relu(conv(x) + alpha * z + b)``), with their backward;
* `fuse_for_inference`: BatchNorm folded into the
  convolutions before it and Conv-BN-ReLU / Conv-BN-add-ReLU turned into those fused calls;
* `fuse_for_training`: Conv-BN, Conv-BN-ReLU and Conv-BN-add-ReLU as one autograd node each
  (`ConvBn2d`, `ConvBnReLU2d`, `ConvBnAddReLU2d`), with cuDNN's fused batch-norm + ReLU (+ add)
  training kernels forward and backward.

Under ``torch.compile`` and ``torch.export`` the functions are custom operators
(``torch.ops.pycudnn.*``, registered by `pycudnn.torch.library` on PyTorch 2.4 and later): dynamo
traces converted and fused models without graph breaks, and eager calls do not go through them.

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

try:
    import torch  # noqa: F401 - the check that PyTorch imports, with a message that says what to do
except ImportError as _exc:  # pragma: no cover - exercised in a process without PyTorch
    raise ImportError(
        "pycudnn.torch needs PyTorch, which is not installed or does not import "
        f"({_exc}); install a CUDA build of PyTorch for the same CUDA major as pycudnn's "
        "extra (cu12 or cu13). The rest of pycudnn works without it.") from _exc

from .calls import CACHE_MAX, ConvolutionTypeError, ConvolutionValueError, clear_cache
from .functional import conv2d, conv2d_add_relu, conv2d_bias_relu
from .functional_nd import conv1d, conv3d, conv_transpose1d, conv_transpose2d, conv_transpose3d
from .fusion import fold_batchnorm, fuse_for_inference
from .modules import (Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d,
                      FusedConv2d, conversion_report, convert, revert)
from .routing import report as routing_report
from .routing import set_routing
from .training import ConvBn2d, ConvBnAddReLU2d, ConvBnReLU2d, fuse_for_training

__all__ = ["conv2d", "conv2d_bias_relu", "conv2d_add_relu", "Conv2d", "FusedConv2d", "convert",
           "revert", "fuse_for_inference", "fold_batchnorm", "clear_cache", "CACHE_MAX",
           "ConvolutionValueError", "ConvolutionTypeError", "set_routing", "routing_report",
           "conversion_report", "fuse_for_training", "ConvBn2d", "ConvBnReLU2d", "ConvBnAddReLU2d",
           "conv1d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "Conv1d",
           "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"]
