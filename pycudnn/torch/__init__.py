"""PyTorch integration: cuDNN convolutions through pycudnn inside PyTorch models.

``import pycudnn.torch`` imports PyTorch (``import pycudnn`` never does). It gives
``torch.nn.functional``'s convolutions (`conv2d`, `conv1d`, `conv3d`, `conv_transpose1d`,
`conv_transpose2d`, `conv_transpose3d`) as autograd functions whose forward, backward-data and
backward-filter convolutions run in pycudnn; the drop-in modules (`Conv2d`, `Conv1d`, `Conv3d`,
`ConvTranspose1d/2d/3d`) with `convert`, `revert` and `conversion_report`; the fused
`conv2d_bias_relu` and `conv2d_add_relu`; `fuse_for_inference` and `fuse_for_training`. Under
``torch.compile`` and ``torch.export`` they are custom operators (`pycudnn.torch.library`).

A call stays cheap: outputs come from PyTorch's caching allocator and the work runs on PyTorch's
current stream. A signature's first call runs pycudnn's public function (validation, the
algorithm choice) and keeps the prepared launcher under that signature; a later call is one dict
lookup, ``torch.empty`` and one launch, nothing validated again. Numerical flags (TF32,
determinism, ``benchmark``), autocast and double backward follow PyTorch's.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401 - the check that PyTorch imports, with a message that says what to do
except ImportError as _exc:  # pragma: no cover - exercised in a process without PyTorch
    raise ImportError(
        "pycudnn.torch needs PyTorch, which is not installed or does not import "
        f"({_exc}); install a CUDA build of PyTorch for the same CUDA major as pycudnn's "
        "extra (cu12 or cu13). The rest of pycudnn works without it.") from _exc

from pycudnn.ffi import sublibraries as _sublibraries

_sublibraries.start()  # cuDNN's sub-libraries open while these modules import and the model is made

from .conv_chains import BnReLUConv2d, ConvStats2d
from .calls import CACHE_MAX, ConvolutionTypeError, ConvolutionValueError, clear_cache
from .functional import conv2d, conv2d_add_relu, conv2d_bias_relu
from .functional_nd import conv1d, conv3d, conv_transpose1d, conv_transpose2d, conv_transpose3d
from .fusion import fold_batchnorm, fuse_for_inference
from .modules import (Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d,
                      FusedConv2d, conversion_report, convert, revert)
from .routing import report as routing_report
from .routing import set_routing
from .training import ConvBn2d, ConvBnAddReLU2d, ConvBnReLU2d, set_traced_blocks, traced_blocks
from .training_rewrite import fuse_for_training

__all__ = ["conv2d", "conv2d_bias_relu", "conv2d_add_relu", "Conv2d", "FusedConv2d", "convert",
           "revert", "fuse_for_inference", "fold_batchnorm", "clear_cache", "CACHE_MAX",
           "ConvolutionValueError", "ConvolutionTypeError", "set_routing", "routing_report",
           "conversion_report", "fuse_for_training", "ConvBn2d", "ConvBnReLU2d", "ConvBnAddReLU2d",
           "set_traced_blocks", "traced_blocks", "conv1d", "conv3d", "conv_transpose1d",
           "conv_transpose2d", "conv_transpose3d", "Conv1d", "Conv3d", "ConvTranspose1d",
           "ConvTranspose2d", "ConvTranspose3d", "ConvStats2d", "BnReLUConv2d"]
