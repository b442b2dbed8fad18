"""Whether a fused training block runs fused or as its original modules, measured per block.

A fused block saves GPU time but its Python autograd node costs more host time than PyTorch's
three C++ nodes; where a step is host-bound it can be the slower. So in benchmark mode, with
routing on, the first training call of a block signature times the block's forward and backward
both ways, on the caller's tensors and on copies of the block's modules (the model's parameters,
gradients and running statistics are not touched): the fused node keeps the signature where
`routing.pycudnn_wins` says so (GPU time 3% lower and not slower back to back), else the
original modules run it from then on. Decisions are recorded with the convolutions' (direction
``"block"``, `pycudnn.torch.routing_report`) and stored for later processes.
"""

from __future__ import annotations

import copy
import threading
from typing import Any, Callable

import torch

from . import calls as _calls
from . import routing
from .calls import DTYPE_NAMES, caller_stream

__all__ = ["fused_keeps", "block_signature", "clear_cache"]

_lock = threading.Lock()
#: (block signature, device, allow_tf32, deterministic) -> whether the fused node keeps it
_decided: dict[tuple[str, int, bool, bool], bool] = {}
_MAX_DECIDED = 4096
_NAMES = {0: "conv_bn", 1: "conv_bn_relu", 2: "conv_bn_add_relu"}
#: kernels and memsets one forward and backward of a block launch at most, either way (the
#: convolution's three directions, batch norm's kernels and memsets, the ReLU, the add, the
#: gradients' accumulation)
_LAUNCHES = 32

#: the block's fused call on given tensors and weights: (block, x, w, conv_bias, z) -> output
FusedCall = Callable[[Any, Any, Any, Any, Any], Any]


def clear_cache() -> None:
    """Forget this process's block decisions (stored ones are read again); part of
    ``pycudnn.torch.clear_cache()``."""
    global _generation
    with _lock:
        _decided.clear()
        _generation += 1  # the decisions blocks keep for themselves are stale


_generation = 0
_calls.on_clear(clear_cache)


def block_signature(block: Any, x: Any, w: Any, z: Any) -> str:
    """A readable, stable name of a block call for reports and stored decisions.
    Public as a seam for tests and tooling."""
    st, pad, dil, g = block.geometry[0]
    bn = block.bn
    return (f"{_NAMES.get(block.ops, block.ops)} x{list(x.shape)} w{list(w.shape)} "
            f"{DTYPE_NAMES[x.dtype]} stride={st} padding={pad} dilation={dil} groups={g}"
            + (" bias" if block.conv.bias is not None else "") + f" eps={bn.eps}"
            + ("" if z is None else " add"))


def fused_keeps(block: Any, x: Any, w: Any, cb: Any, z: Any, fused: FusedCall) -> bool:
    """Whether ``block``'s call on these tensors runs its fused node (True) or its original
    modules (False). ``x``, ``w`` and ``cb`` are the tensors the fused node takes (cast under
    autocast). Decided once per block signature; before a decision, and where none can be
    measured (benchmark mode off, routing off, a capture under way), True."""
    key = (x.shape, x.dtype, w.dtype, z is None, x.get_device(), _generation)
    got = block._route
    if got is not None and got[0] == key:
        return bool(got[1])
    if not routing.measuring(_calls._bench()):
        return True  # not remembered: decided once benchmark mode is on (a cheap test first)
    fk = _calls._flags_key()
    if not routing.should_measure(fk[3], fk[1], fk[2]):
        return True
    signature = block_signature(block, x, w, z)
    decided = (signature, key[4], fk[1], fk[2])  # the device and PyTorch's numerical flags too
    with _lock:
        win = _decided.get(decided)
    if win is None:
        win = _duel(block, signature, x, w, cb, z, fused, fk)
        if win is None:  # the fused node failed on its copy: the call shows how, unmeasured
            block._route = (key, True)  # and the duel is not tried again on every call
            return True
        with _lock:
            if len(_decided) >= _MAX_DECIDED:
                del _decided[next(iter(_decided))]
            _decided[decided] = win
    block._route = (key, win)
    return win


def _same(t: Any) -> Any:
    return t


def _duel(block: Any, signature: str, x: Any, w: Any, cb: Any, z: Any, fused: FusedCall,
          fk: tuple[Any, ...]) -> bool | None:
    """The decision for ``signature``: stored, or measured (None: the fused node raised on the
    copies). The copies are made only when a side runs: a stored decision needs none."""
    copies: list[Any] = []

    def shadow() -> Any:
        if not copies:
            copies.append(type(block)(copy.deepcopy(block.conv), copy.deepcopy(block.bn)))
        return copies[0]

    xi = x.detach().requires_grad_(x.requires_grad)
    zi = None if z is None else z.detach().requires_grad_(z.requires_grad)
    grad: list[Any] = []

    def backward(y: Any) -> None:
        if not grad:  # one gradient for both sides, drawn from no generator (the caller's
            grad.append(torch.ones_like(y))  # random streams stay where they were)
        if y.requires_grad:
            torch.autograd.backward(y, grad[0])

    def cast(t: Any) -> Any:
        return None if t is None else t.to(w.dtype)

    def own_graph() -> Any:
        # the caller may be inside a checkpointed region, whose saved-tensor hooks would
        # recompute that region when this graph's backward unpacks: identity hooks on top
        return torch.autograd.graph.saved_tensors_hooks(_same, _same)

    def ours() -> None:
        b = shadow()
        with torch.enable_grad(), own_graph():
            backward(fused(b, xi, cast(b.conv.weight),
                           cast(b.conv.bias) if cb is not None else None, zi))

    def theirs() -> None:
        with torch.enable_grad(), own_graph():
            backward(shadow()._plain(xi, zi))

    dev = x.device.index
    stream = caller_stream(dev)
    verdict = routing.prejudge(signature, "block", theirs, dev, stream, fk[1:3], _LAUNCHES)
    if verdict is not None:
        return verdict == "pycudnn"
    try:
        ours()
    except Exception:  # noqa: BLE001 - cuDNN refused these tensors: the real call falls back
        return None
    return routing.pycudnn_wins(signature, "block", ours, theirs, dev, stream, fk[1:3],
                                launches=_LAUNCHES)
