"""What a training forward pass returns besides its output: `BatchNormResult` ``(y, save_mean,
save_invstd)`` and the `ReserveSpace` cuDNN fills for its backward pass."""

from __future__ import annotations

from typing import Any

from ...runtime.tensor import Tensor
from .._common import Reserve


class ReserveSpace(Reserve):
    """Device memory that cuDNN fills in a training forward pass and reads in its backward pass
    (for the fused batch norm + add + ReLU: the ReLU mask). Opaque: pass it to the backward
    function of the same call; keep it alive until then.

    Attributes:
        nbytes: its size in bytes (also ``size``, as the int8 array CuPy 13 returned).
        ptr: its device address (0 when cuDNN needs none).
        device: the CUDA device it is on.
        fused: whether the fused batch norm + add + ReLU kernel wrote it.
    """

    __slots__ = ("fused", "_key")

    def __init__(self, buffer: Any, nbytes: int, device: int, fused: bool, key: tuple) -> None:
        super().__init__(buffer, nbytes, device)
        self.fused = fused
        self._key = key

    def __repr__(self) -> str:
        return (f"ReserveSpace(nbytes={self.nbytes}, device={self.device}, "
                f"fused={self.fused})")


class BatchNormResult(tuple[Tensor, Tensor, Tensor]):
    """``(y, save_mean, save_invstd)`` of a training forward pass; unpacks as a 3-tuple.

    Attributes:
        reserve: the `ReserveSpace` cuDNN asked for (its
            fast NHWC kernels), or None; give it to
            `batch_norm_backward` as ``reserve=``.
    """

    reserve: ReserveSpace | None

    def __new__(cls, y: Tensor, save_mean: Tensor, save_invstd: Tensor,
                reserve: ReserveSpace | None) -> "BatchNormResult":
        self = super().__new__(cls, (y, save_mean, save_invstd))
        self.reserve = reserve
        return self
