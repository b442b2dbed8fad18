"""Context for errors raised from a convolution: the parameters, the tensors and a runnable repro.

PyTorch prints a repro snippet on cuDNN failures but gets bfloat16 and channels_last wrong; the
snippet here recreates both (random data of the same shapes, dtype and memory format, the same
geometry and flags) with pycudnn alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["repro_lines", "repro_snippet"]

_FLAG_ORDER = ("benchmark", "deterministic", "allow_tf32", "workspace_limit", "engine")


def _tensor_line(name: str, t: Any) -> str:
    return (f"  {name}: shape={list(t.shape)} strides={list(t.strides)} dtype={t.dtype.name} "
            f"format={t.memory_format} device=cuda:{t.device} ptr=0x{t.ptr:x}")


def _make(name: str, shape: Sequence[int], dtype: str, fmt: str) -> str:
    mf = f", memory_format={fmt!r}" if fmt == "channels_last" else ""
    return (f"{name} = pycudnn.from_numpy(rng.standard_normal({tuple(shape)!r}, dtype=np.float32), "
            f"dtype={dtype!r}{mf})")


def repro_snippet(call: Any) -> str:
    """Python that reproduces ``call`` (a `pycudnn.api.call.ConvolutionCall`) on random data with pycudnn."""
    dtype = (call.x if call.x is not None else call.y).dtype.name
    fmt = call.fmt
    flags = ", ".join(f"{k}={call.flags[k]!r}" for k in _FLAG_ORDER if k in call.flags)
    geo = (f"stride={call.stride!r}, padding={call.padding!r}, dilation={call.dilation!r}, "
           f"groups={call.groups}")
    lines = ["import numpy as np", "import pycudnn", "rng = np.random.default_rng(0)"]
    if call.direction == "forward":
        lines += [_make("x", call.x.shape, dtype, fmt), _make("w", call.w.shape, dtype, fmt)]
        if call.epilogue == "add_relu":
            lines += [_make("z", call.y.shape, dtype, fmt),
                      _make("b", (call.w.shape[0],), dtype, "contiguous")]
            lines.append(f"y = pycudnn.convolution_add_relu(x, w, z, alpha={call.alpha!r}, bias=b, "
                         f"{geo}, {flags})")
        else:
            lines.append(f"y = pycudnn.convolution(x, w, {geo}, {flags})")
    elif call.direction == "backward_data":
        lines += [_make("grad_y", call.y.shape, dtype, fmt), _make("w", call.w.shape, dtype, fmt)]
        lines.append(f"grad_x = pycudnn.convolution_backward_data(grad_y, w, {tuple(call.x.shape)!r}, "
                     f"{geo}, {flags})")
    else:
        lines += [_make("x", call.x.shape, dtype, fmt), _make("grad_y", call.y.shape, dtype, fmt)]
        lines.append(f"grad_w = pycudnn.convolution_backward_filter(x, grad_y, {tuple(call.w.shape)!r}, "
                     f"{geo}, {flags})")
    return "\n".join(lines)


def repro_lines(call: Any, params: Any) -> list[str]:
    """Context lines attached to an error: what ran, on which tensors, and how to reproduce it."""
    lines = [f"while running {call.api} ({call.direction}{' + ' + call.epilogue if call.epilogue else ''}, "
             f"engine {call.flags.get('engine')}) with:",
             f"  params: {params.short()}"]
    for name in ("x", "w", "y", "z", "bias"):
        t = getattr(call, name, None)
        if t is not None:
            lines.append(_tensor_line(name, t))
    describe = getattr(call.engine, "describe_params", None)
    if describe is not None:
        try:
            lines.extend("  " + d for d in describe(params))
        except Exception:  # context must never hide the original error
            pass
    lines.append("reproduce with:")
    lines.extend("    " + line for line in repro_snippet(call).split("\n"))
    return lines
