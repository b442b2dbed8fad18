"""CuPy 13's ``DropoutStates`` on `pycudnn.ops.dropout.DropoutState`."""

from __future__ import annotations

from typing import Any

from ..ops.dropout import DropoutState, dropout_backward, dropout_forward
from .arrays import input_view, new_tensor, result_like, stream_of


__all__ = ["DropoutStates"]


class DropoutStates:
    """CuPy 13's ``cupyx.cudnn.DropoutStates``: cuDNN's dropout state, seeded.

    ``handle`` is accepted for compatibility and not used (pycudnn keeps one cuDNN handle per
    thread and device). The dropout ratio is given with each call, as in CuPy; a new ratio keeps
    the random state (no re-initialisation). Built on
    `pycudnn.ops.dropout.DropoutState`.

    Args:
        handle: ignored (CuPy 13's cuDNN handle, or None).
        seed: the random seed.
    """

    def __init__(self, handle: Any, seed: int) -> None:

        self._state = DropoutState(0.0, seed)

    def set_dropout_ratio(self, dropout_ratio: float) -> None:
        """The probability of dropping an element for the next calls."""
        self._state.p = dropout_ratio

    def forward(self, handle: Any, x: Any, dropout_ratio: float) -> tuple[Any, Any]:
        """``(reserve_space, y)``: ``y`` is ``x`` with elements dropped with probability
        ``dropout_ratio`` and the others scaled by ``1 / (1 - dropout_ratio)``, a new array;
        ``reserve_space`` holds the mask for `backward`."""

        self._state.p = dropout_ratio
        s = stream_of(x)
        xv = input_view(x, s)
        y = new_tensor(xv.shape, xv.dtype, xv, s)
        _, reserve = dropout_forward(xv, self._state, out=y, stream=s)
        return reserve, result_like(y, x)

    def backward(self, handle: Any, dy: Any, dropout_ratio: float, reserve_space: Any) -> Any:
        """``dx``: ``dy`` through the mask of the `forward` call that returned
        ``reserve_space``, scaled as that call scaled (its ratio), a new array."""

        self._state.p = dropout_ratio
        s = stream_of(dy)
        dyv = input_view(dy, s)
        dx = new_tensor(dyv.shape, dyv.dtype, dyv, s)
        dropout_backward(dyv, self._state, reserve_space, out=dx, stream=s)
        return result_like(dx, dy)
