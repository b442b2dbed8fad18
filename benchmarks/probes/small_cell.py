"""The small cell the allocation probes time: ResNet-50's layer1.0.conv1 forward, bf16 NHWC
32x64x56x56 with 64 1x1 filters (shared by ``small_cell_gap.py`` and
``alloc_between_kernels.py``)."""
import torch

#: bytes of the cell's output (and input)
NBYTES = 32 * 64 * 56 * 56 * 2


def tensors() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input, weights, an output buffer), channels_last on the current CUDA device."""
    cl = torch.channels_last
    x = torch.randn(32, 64, 56, 56, device="cuda", dtype=torch.bfloat16).to(memory_format=cl)
    w = torch.randn(64, 64, 1, 1, device="cuda", dtype=torch.bfloat16).to(memory_format=cl)
    out = torch.empty(32, 64, 56, 56, device="cuda", dtype=torch.bfloat16).to(memory_format=cl)
    return x, w, out
