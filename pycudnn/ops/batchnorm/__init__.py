"""Batch normalization through cuDNN's legacy batch-norm API: training forward (with the running
statistics updated in place), inference, backward, and the fused batch norm + add + ReLU.

Inputs are anything `pycudnn.as_tensor()` takes, ``(N, C)``, ``(N, C, L)``, ``(N, C, H, W)`` or
``(N, C, D, H, W)`` with any strides; outputs are `pycudnn.Tensor`s or written into ``out=``.
``x`` in float16 or bfloat16 takes float32 ``weight``, ``bias`` and statistics (cuDNN's rule);
float32 takes float32 and float64 all float64.

How a call runs: arguments are checked first (nothing is launched or allocated before that), the
input is used where it lies when it is dense in NCHW or channels-last order and copied there
(``cudnnTransformTensor``) otherwise, the descriptors come from a small cache keyed by shape,
strides, dtype and mode, and the work is one call of
``cudnnBatchNormalizationForwardTrainingEx`` / ``BackwardEx`` (with the workspace and reserve
space cuDNN asks for) or ``cudnnBatchNormalizationForwardInference``. A call that needs no copy
leaves a plan keyed by its arguments' layouts, dtypes, devices and options: the next call of
that signature checks only what the key cannot tell (addresses that must not overlap, read-only
outputs, the reserve) and goes straight to the allocations and the launch.

Why the legacy API and not the graph API: cuDNN's graph API expresses batch norm through the
norm-forward/backward operation nodes and a plan search per shape; the legacy functions run the
same kernels (the semi-persistent NHWC kernels included) in one call without a search, which is
what PyTorch does too. ``benchmarks/bn_dropout_vs_torch.py`` measures the result against PyTorch.

Modules: `arguments` (checks, modes, the 4-D views), `results` (`BatchNormResult`,
`ReserveSpace`), `descriptors` (cached per layout, with cuDNN's sizes), `staging` (working
tensors, dense copies, the workspace around a launch), `call` (the full path's validated call and
launches), `plans` (repeated calls, `clear_cache`), then one module per function family:
`training`, `inference`, `backward`, `add_relu`.
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
