"""The modules: ``Conv2d`` (a ``torch.nn.Conv2d`` drop-in), ``convert``/``revert`` and the
inference block ``FusedConv2d``."""

from __future__ import annotations

import logging
from typing import Any, cast

import torch
import torch.nn.functional as F

from .calls import geometry
from .functional import conv2d, conv2d_add_relu, conv2d_bias_relu

log = logging.getLogger("pycudnn")


# ---- modules --------------------------------------------------------------------------------------

class Conv2d(torch.nn.Conv2d):
    """``torch.nn.Conv2d`` whose convolutions run in pycudnn (`conv2d`).

    The same constructor, parameters, ``state_dict`` and ``padding_mode`` (modes other than
    ``"zeros"`` pad with ``F.pad`` first, as PyTorch does). Input that is not on a CUDA device
    runs through PyTorch's own convolution, so a converted model still runs on the CPU.
    """

    def _conv_forward(self, input: Any, weight: Any, bias: Any) -> Any:
        if not input.is_cuda:
            return super()._conv_forward(input, weight, bias)
        if self.padding_mode != "zeros":
            return conv2d(F.pad(input, self._reversed_padding_repeated_twice,
                                mode=self.padding_mode),
                          weight, bias, self.stride, 0, self.dilation, self.groups)
        return conv2d(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)


def convert(module: Any) -> Any:
    """Make every ``torch.nn.Conv2d`` in ``module`` (itself included) a
    `pycudnn.torch.Conv2d`, in place, and return ``module``.

    Only modules whose type is exactly ``torch.nn.Conv2d`` change (subclasses may compute
    something else); they stay the same objects, so their parameters, buffers, hooks and an
    optimizer that holds them are unaffected. What was converted and what was left to PyTorch,
    and why, is logged on the ``pycudnn`` logger (INFO) and listed by
    `conversion_report`.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"convert: expected a torch.nn.Module, got {type(module).__name__}")
    for m in module.modules():
        if type(m) is torch.nn.Conv2d:
            m.__class__ = Conv2d
    if log.isEnabledFor(logging.INFO):
        rows = conversion_report(module)
        left: dict[str, int] = {}
        for r in rows:
            if not r["converted"]:
                left[r["reason"]] = left.get(r["reason"], 0) + 1
        log.info("pycudnn.torch.convert: %d of %d convolution modules run in pycudnn%s",
                 sum(r["converted"] for r in rows), len(rows),
                 "".join(f"; {n} left to PyTorch: {why}" for why, n in left.items()))
    return module


#: why convert leaves a convolution module to PyTorch, by type
_NOT_CONVERTED = {
    torch.nn.Conv1d: "Conv1d: pycudnn.torch converts 2-D convolutions only",
    torch.nn.Conv3d: "Conv3d: pycudnn.torch converts 2-D convolutions only",
    torch.nn.ConvTranspose1d: "ConvTranspose1d: transposed convolutions stay in PyTorch",
    torch.nn.ConvTranspose2d: "ConvTranspose2d: transposed convolutions stay in PyTorch",
    torch.nn.ConvTranspose3d: "ConvTranspose3d: transposed convolutions stay in PyTorch",
}


def conversion_report(module: Any) -> list[dict[str, Any]]:
    """Every convolution module of ``module`` (``torch.nn`` convolutions and their subclasses,
    in ``named_modules`` order): ``{"name", "type", "converted", "reason"}``, where ``reason``
    says why one is left to PyTorch ("" for those `convert` made
    pycudnn's)."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"conversion_report: expected a torch.nn.Module, got "
                        f"{type(module).__name__}")
    rows = []
    for name, m in module.named_modules():
        if not isinstance(m, torch.nn.modules.conv._ConvNd):
            continue
        t = type(m)
        if t is Conv2d:
            converted, reason = True, ""
        elif t is torch.nn.Conv2d:
            converted, reason = False, "not converted yet (call convert)"
        elif t in _NOT_CONVERTED:
            converted, reason = False, _NOT_CONVERTED[t]
        else:
            converted, reason = False, (f"{t.__name__}: a subclass of a torch.nn convolution "
                                        "(it may compute something else)")
        rows.append({"name": name, "type": f"{t.__module__}.{t.__qualname__}",
                     "converted": converted, "reason": reason})
    return rows


def revert(module: Any) -> Any:
    """Undo `convert`: every `pycudnn.torch.Conv2d`
    in ``module`` (itself included) becomes a ``torch.nn.Conv2d`` again, in place; returns
    ``module``. For tools that test for ``torch.nn.Conv2d`` exactly (quantization's module
    fusion, ``torch.fx.experimental.optimization.fuse``)."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"revert: expected a torch.nn.Module, got {type(module).__name__}")
    for m in module.modules():
        if type(m) is Conv2d:
            cast(Any, m).__class__ = torch.nn.Conv2d
    return module


class FusedConv2d(torch.nn.Module):
    """An inference convolution with its epilogue: ``conv + bias``, ``relu(conv + bias)`` or
    ``relu(conv + bias + z)`` (``residual=True``: ``forward(x, z)``), made by
    `fuse_for_inference`.

    Runs through `conv2d_bias_relu` /
    `conv2d_add_relu` on CUDA tensors, and through PyTorch's own
    operations elsewhere (or when ``z`` does not have the output's shape).
    """

    def __init__(self, weight: Any, bias: Any, stride: Any = 1, padding: Any = 0,
                 dilation: Any = 1, groups: int = 1, relu: bool = False,
                 residual: bool = False) -> None:
        super().__init__()
        if residual and not relu:
            raise ValueError("FusedConv2d: residual=True needs relu=True (conv + z + relu)")
        self.weight = torch.nn.Parameter(weight.detach(), requires_grad=False)
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach(),
                                                                  requires_grad=False)
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.relu, self.residual = relu, residual
        # normalized once: out_shape runs on every residual call, and torch.compile would guard on
        # the contents of geometry()'s cache
        self._geometry = geometry(stride, padding, dilation, groups, self.weight)

    def extra_repr(self) -> str:
        k, c, r, s = self.weight.shape
        return (f"{c * self.groups}, {k}, kernel_size=({r}, {s}), stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
                f"bias={self.bias is not None}, relu={self.relu}, residual={self.residual}")

    def forward(self, x: Any, z: Any = None) -> Any:
        w, b = self.weight, self.bias
        args = (self.stride, self.padding, self.dilation, self.groups)
        if x.is_cuda and x.dim() == 4:
            if self.residual:
                if z is not None and z.shape == self.out_shape(x):
                    return conv2d_add_relu(x, w, z, b, 1.0, *args)
            elif self.relu:
                return conv2d_bias_relu(x, w, b, *args)
            else:
                return conv2d(x, w, b, *args)
        y = F.conv2d(x, w, b, *args)
        if self.residual:
            y = y + z
        return torch.relu(y) if self.relu else y

    def out_shape(self, x: Any) -> tuple[int, ...]:
        geom, pre_pad = self._geometry
        st, pad, dil, _ = geom
        k, _, r, s = self.weight.shape
        extra = (pre_pad[3], pre_pad[1]) if pre_pad is not None else (0, 0)
        return (x.shape[0], k) + tuple(
            (i + e + 2 * p - d * (kk - 1) - 1) // t + 1
            for i, e, kk, t, p, d in zip(x.shape[2:], extra, (r, s), st, pad, dil))

