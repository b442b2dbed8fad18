"""Batch normalization through cuDNN's legacy batch-norm API: training forward (with the running
statistics updated in place), inference, backward, and the fused batch norm + add + ReLU.

Inputs are ``(N, C)``, ``(N, C, L)``, ``(N, C, H, W)`` or ``(N, C, D, H, W)`` with any strides;
``x`` in float16 or bfloat16 takes float32 ``weight``, ``bias`` and statistics (cuDNN's rule),
float32 takes float32 and float64 all float64. Arguments are checked before anything is launched
or allocated; an input dense in NCHW or channels-last order is used where it lies, anything else
is copied there first. A call that needs no copy leaves a plan keyed by its layouts, dtypes,
devices and options: the next call of that signature checks only what the key cannot tell
(addresses that must not overlap, read-only outputs, the reserve) and launches.

Modules: `arguments` (checks, modes, the 4-D views), `results` (`BatchNormResult`,
`ReserveSpace`), `descriptors` (cached per layout, with cuDNN's sizes), `staging` (working
tensors, dense copies, the workspace), `call` (the full path's validated call and launches),
`plans` (repeated calls, `clear_cache`), then `training`, `inference`, `backward`, `add_relu`.
"""

from .add_relu import batch_norm_add_relu_backward, batch_norm_add_relu_forward_training
from .arguments import BN_OPS, MODES
from .backward import batch_norm_backward
from .inference import batch_norm_forward_inference
from .plans import clear_cache
from .results import BatchNormResult, ReserveSpace
from .training import batch_norm_forward_training

__all__ = ["batch_norm_forward_training", "batch_norm_forward_inference", "batch_norm_backward",
           "batch_norm_add_relu_forward_training", "batch_norm_add_relu_backward",
           "BatchNormResult", "ReserveSpace", "MODES", "BN_OPS", "clear_cache"]
