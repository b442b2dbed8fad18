"""The modules: drop-ins for ``torch.nn``'s convolutions (``Conv1d``, ``Conv2d``, ``Conv3d``,
``ConvTranspose1d/2d/3d``), ``convert``/``revert``/``conversion_report``, and the inference block
``FusedConv2d``."""

from __future__ import annotations

import logging
from typing import Any, cast

import torch
import torch.nn.functional as F

from ._types import IntOrInts, ModuleT, Padding
from .calls import geometry
from .functional import conv2d, conv2d_add_relu, conv2d_bias_relu
from .functional_nd import conv1d, conv3d, conv_transpose1d, conv_transpose2d, conv_transpose3d
from .training_rewrite import unfuse_training

log = logging.getLogger("pycudnn")

#: the dtypes pycudnn's convolutions take; a module's input of another runs PyTorch's
_DTYPES = frozenset((torch.float32, torch.float16, torch.bfloat16, torch.float64))


def _pycudnn_runs(input: Any) -> bool:
    """Whether a converted module's call runs in pycudnn: CUDA input of a dtype it takes."""
    return bool(input.is_cuda) and input.dtype in _DTYPES


# ---- modules --------------------------------------------------------------------------------------

def _padded_forward(module: Any, fn: Any, input: Any, weight: Any, bias: Any) -> Any:
    """``ConvNd._conv_forward`` through ``fn``: padding modes other than ``"zeros"`` pad with
    ``F.pad`` first, as PyTorch does."""
    if module.padding_mode != "zeros":
        return fn(F.pad(input, module._reversed_padding_repeated_twice, mode=module.padding_mode),
                  weight, bias, module.stride, 0, module.dilation, module.groups)
    return fn(input, weight, bias, module.stride, module.padding, module.dilation, module.groups)


class Conv1d(torch.nn.Conv1d):
    """``torch.nn.Conv1d`` whose convolutions run in pycudnn (`conv1d`): as `Conv2d`."""

    def _conv_forward(self, input: torch.Tensor, weight: torch.Tensor,
                      bias: torch.Tensor | None) -> torch.Tensor:
        if not _pycudnn_runs(input):
            return super()._conv_forward(input, weight, bias)
        return _padded_forward(self, conv1d, input, weight, bias)


class Conv2d(torch.nn.Conv2d):
    """``torch.nn.Conv2d`` whose convolutions run in pycudnn (`conv2d`).

    The same constructor, parameters, ``state_dict`` and ``padding_mode`` (modes other than
    ``"zeros"`` pad with ``F.pad`` first, as PyTorch does). Input that is not on a CUDA device,
    or of a dtype other than float32, float16, bfloat16 and float64, runs through PyTorch's own
    convolution, so a converted model still runs on the CPU.
    """

    def _conv_forward(self, input: torch.Tensor, weight: torch.Tensor,
                      bias: torch.Tensor | None) -> torch.Tensor:
        if not _pycudnn_runs(input):
            return super()._conv_forward(input, weight, bias)
        return _padded_forward(self, conv2d, input, weight, bias)


class Conv3d(torch.nn.Conv3d):
    """``torch.nn.Conv3d`` whose convolutions run in pycudnn (`conv3d`): as `Conv2d`."""

    def _conv_forward(self, input: torch.Tensor, weight: torch.Tensor,
                      bias: torch.Tensor | None) -> torch.Tensor:
        if not _pycudnn_runs(input):
            return super()._conv_forward(input, weight, bias)
        return _padded_forward(self, conv3d, input, weight, bias)


def _transposed_forward(module: Any, pytorch_forward: Any, fn: Any, nd: int, input: Any,
                        output_size: Any) -> Any:
    """``ConvTransposeNd.forward`` through ``fn`` (``output_size`` as PyTorch takes it), or
    through ``pytorch_forward`` where `_pytorch_transposes` says PyTorch's runs the call."""
    if _pytorch_transposes(module, input):
        return pytorch_forward(input, output_size)
    output_padding = module.output_padding if output_size is None else tuple(
        module._output_padding(input, output_size, module.stride, module.padding,
                               module.kernel_size, nd, module.dilation))
    return fn(input, module.weight, module.bias, module.stride, module.padding, output_padding,
              module.groups, module.dilation)


def _pytorch_transposes(module: Any, input: Any) -> bool:
    """Whether PyTorch's own forward runs the call: input pycudnn does not take, or settings
    PyTorch's forward refuses (its error is the one to raise)."""
    return (not _pycudnn_runs(input) or module.padding_mode != "zeros"
            or not isinstance(module.padding, tuple))


class ConvTranspose1d(torch.nn.ConvTranspose1d):
    """``torch.nn.ConvTranspose1d`` whose convolutions run in pycudnn (`conv_transpose1d`): as
    `ConvTranspose2d`."""

    def forward(self, input: torch.Tensor, output_size: list[int] | None = None
                ) -> torch.Tensor:
        return _transposed_forward(self, super().forward, conv_transpose1d, 1, input,
                                   output_size)


class ConvTranspose2d(torch.nn.ConvTranspose2d):
    """``torch.nn.ConvTranspose2d`` whose convolutions run in pycudnn (`conv_transpose2d`).

    The same constructor, parameters, ``state_dict`` and ``forward(input, output_size=None)``.
    Input that is not on a CUDA device, or of a dtype other than float32, float16, bfloat16 and
    float64, runs through PyTorch's own transposed convolution.
    """

    def forward(self, input: torch.Tensor, output_size: list[int] | None = None
                ) -> torch.Tensor:
        return _transposed_forward(self, super().forward, conv_transpose2d, 2, input,
                                   output_size)


class ConvTranspose3d(torch.nn.ConvTranspose3d):
    """``torch.nn.ConvTranspose3d`` whose convolutions run in pycudnn (`conv_transpose3d`): as
    `ConvTranspose2d`."""

    def forward(self, input: torch.Tensor, output_size: list[int] | None = None
                ) -> torch.Tensor:
        return _transposed_forward(self, super().forward, conv_transpose3d, 3, input,
                                   output_size)


#: the class `convert` gives each ``torch.nn`` convolution class, and back (`revert`)
CONVERSIONS: dict[type, type] = {
    torch.nn.Conv1d: Conv1d, torch.nn.Conv2d: Conv2d, torch.nn.Conv3d: Conv3d,
    torch.nn.ConvTranspose1d: ConvTranspose1d, torch.nn.ConvTranspose2d: ConvTranspose2d,
    torch.nn.ConvTranspose3d: ConvTranspose3d,
}
_REVERSIONS: dict[type, type] = {ours: theirs for theirs, ours in CONVERSIONS.items()}


def convert(module: ModuleT) -> ModuleT:
    """Make every ``torch.nn`` convolution in ``module`` (itself included) pycudnn's, in place,
    and return ``module``: ``Conv1d``, ``Conv2d``, ``Conv3d``, ``ConvTranspose1d``,
    ``ConvTranspose2d`` and ``ConvTranspose3d`` become the `pycudnn.torch` class of the same
    name.

    Only modules whose type is exactly one of those change (subclasses may compute something
    else); they stay the same objects, so their parameters, buffers, hooks and an optimizer that
    holds them are unaffected. What was converted and what was left to PyTorch, and why, is
    logged on the ``pycudnn`` logger (INFO) and listed by `conversion_report`. What only a call
    can tell is decided per call: input off CUDA, or of a dtype other than float32, float16,
    bfloat16 and float64, runs PyTorch's convolution.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"convert: expected a torch.nn.Module, got {type(module).__name__}")
    for m in module.modules():
        cls = CONVERSIONS.get(type(m))
        if cls is not None:
            m.__class__ = cls
    if log.isEnabledFor(logging.INFO):
        log.info("%s", _summary(conversion_report(module)))
    return module


def _summary(rows: list[dict[str, Any]]) -> str:
    """convert's logged line: how many modules of which class run in pycudnn, and what was
    left to PyTorch, why."""
    done: dict[str, int] = {}
    left: dict[str, int] = {}
    notes: dict[str, int] = {}
    for r in rows:
        if r["converted"]:
            name = r["type"].rsplit(".", 1)[1]
            done[name] = done.get(name, 0) + 1
            if r["note"]:
                notes[r["note"]] = notes.get(r["note"], 0) + 1
        else:
            left[r["reason"]] = left.get(r["reason"], 0) + 1
    return (f"pycudnn.torch.convert: {sum(done.values())} of {len(rows)} convolution modules run "
            f"in pycudnn" + (" (" + ", ".join(f"{n} {c}" for c, n in done.items()) + ")" if done
                             else "")
            + "".join(f"; {n} left to PyTorch: {why}" for why, n in left.items())
            + "".join(f"; {n} converted but run in PyTorch: {why}" for why, n in notes.items())
            + ("; per call, input off CUDA or of a dtype other than float32, float16, bfloat16 "
               "and float64 runs PyTorch's convolution" if done else ""))


def _left_reason(m: Any) -> str:
    """Why `convert` leaves ``m`` (a convolution module that is not pycudnn's) to PyTorch."""
    t = type(m)
    if t in CONVERSIONS:
        return "not converted yet (call convert)"
    if isinstance(m, torch.nn.modules.lazy.LazyModuleMixin):
        return (f"{t.__name__}: a lazy module not initialized yet (run one forward pass, which "
                f"makes it a torch.nn module, then convert)")
    base = next((c for c in t.__mro__ if c in CONVERSIONS), None)
    if base is not None:
        return (f"{t.__name__}: a subclass of torch.nn.{base.__name__} (it may compute "
                f"something else; convert takes the torch.nn classes themselves)")
    return f"{t.__name__}: a convolution class pycudnn.torch does not know"


def _converted_note(m: Any) -> str:
    """What of a converted module's settings sends its calls to PyTorch anyway ("" if none)."""
    w = getattr(m, "weight", None)
    if isinstance(w, torch.Tensor) and not isinstance(w, torch.nn.parameter.UninitializedParameter) \
            and w.dtype not in _DTYPES:
        return f"weight of dtype {w.dtype} (pycudnn takes float32, float16, bfloat16, float64)"
    if isinstance(m, torch.nn.modules.conv._ConvTransposeNd) and any(
            o >= s for o, s in zip(m.output_padding, m.stride)):
        return (f"output_padding={m.output_padding} at least the stride {m.stride} (cuDNN has no "
                f"such output size)")
    return ""


def conversion_report(module: torch.nn.Module) -> list[dict[str, Any]]:
    """Every convolution module of ``module`` (``torch.nn`` convolutions and their subclasses,
    in ``named_modules`` order): ``{"name", "type", "converted", "reason", "note"}``.

    ``reason`` says why one is left to PyTorch (a subclass, a lazy module not initialized yet,
    a class pycudnn does not know, or not converted yet; "" for those `convert` made
    pycudnn's); ``note``, for a converted one, what of its settings still sends its calls to
    PyTorch's convolution ("" if nothing: a weight dtype pycudnn does not take, a transposed
    convolution's ``output_padding`` at least its stride). Per call, input off CUDA or of a
    dtype other than float32, float16, bfloat16 and float64 runs PyTorch's convolution too;
    that only a call can tell.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"conversion_report: expected a torch.nn.Module, got "
                        f"{type(module).__name__}")
    rows = []
    for name, m in module.named_modules():
        if not isinstance(m, torch.nn.modules.conv._ConvNd):
            continue
        t = type(m)
        converted = t in _REVERSIONS
        rows.append({"name": name, "type": f"{t.__module__}.{t.__qualname__}",
                     "converted": converted, "reason": "" if converted else _left_reason(m),
                     "note": _converted_note(m) if converted else ""})
    return rows


def revert(module: ModuleT) -> ModuleT:
    """Undo `convert` and `fuse_for_training`: every pycudnn convolution module in ``module``
    (itself included) becomes its ``torch.nn`` class again and every training block the plain
    calls of its convolution, batch norm, add and ReLU, in place; returns ``module``. For tools
    that test for ``torch.nn.Conv2d`` and the others exactly (quantization's module fusion,
    ``torch.fx.experimental.optimization.fuse``, ``torch.export`` of real tensors). Batch norm
    parameters that `fuse_for_training` made float32 stay float32."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"revert: expected a torch.nn.Module, got {type(module).__name__}")
    unfuse_training(module)
    for m in module.modules():
        cls = _REVERSIONS.get(type(m))
        if cls is not None:
            cast(Any, m).__class__ = cls
    return module


class FusedConv2d(torch.nn.Module):
    """An inference convolution with its epilogue: ``conv + bias``, ``relu(conv + bias)`` or
    ``relu(conv + bias + z)`` (``residual=True``: ``forward(x, z)``), made by
    `fuse_for_inference`.

    Runs through `conv2d_bias_relu` /
    `conv2d_add_relu` on CUDA tensors, and through PyTorch's own
    operations elsewhere (or when ``z`` does not have the output's shape).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, stride: IntOrInts = 1,
                 padding: Padding = 0, dilation: IntOrInts = 1, groups: int = 1, relu: bool = False,
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

    def forward(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
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
        y = F.conv2d(x, w, b, self.stride, self.padding, self.dilation, self.groups)
        if self.residual:
            if z is None:
                raise TypeError("FusedConv2d: a residual block's forward needs z")
            y = y + z
        return torch.relu(y) if self.relu else y

    def out_shape(self, x: torch.Tensor) -> tuple[int, ...]:
        geom, pre_pad = self._geometry
        st, pad, dil, _ = geom
        k, _, r, s = self.weight.shape
        extra = (pre_pad[3], pre_pad[1]) if pre_pad is not None else (0, 0)
        return (x.shape[0], k) + tuple(
            (i + e + 2 * p - d * (kk - 1) - 1) // t + 1
            for i, e, kk, t, p, d in zip(x.shape[2:], extra, (r, s), st, pad, dil))

