"""The types `pycudnn.torch`'s public signatures name beside ``torch.Tensor`` and
``torch.nn.Module``: the geometry arguments, as ``torch.nn.functional``'s convolutions take
them."""

from __future__ import annotations

from typing import TypeVar, Union

import torch

__all__ = ["IntOrInts", "Padding", "ModuleT"]

IntOrInts = Union[int, tuple[int, ...], list[int]]
"""``stride``, ``dilation``, a transposed convolution's ``padding`` and ``output_padding``: an
int for every spatial dimension, or one int each (``torch.Size`` is a tuple)."""

Padding = Union[IntOrInts, str]
"""A convolution's ``padding``: as `IntOrInts`, or ``"valid"`` or ``"same"``."""

ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)
"""The module a function changes in place and returns, typed as given."""
