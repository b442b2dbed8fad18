"""Which library runs a convolution call signature: pycudnn's prepared launch or PyTorch's own.

A converted model must never be slower than the model it came from. pycudnn and PyTorch call the
same cuDNN, and their searches mostly find the same kernels; what differs is the host time of a
call (PyTorch's convolution and its autograd node are C++, a pycudnn launch goes through Python)
and, for some layers, which kernel each search finds. So in benchmark mode (PyTorch's
``torch.backends.cudnn.benchmark`` or pycudnn's ``benchmark`` flag) the first call of a
signature, once pycudnn has searched and prepared it, times both sides on the caller's tensors:

* the GPU time per call, with the stream held behind pycudnn's gate (no host launch gap counted);
* the time per call back to back, which counts the host's cost where it exceeds the GPU's.

pycudnn keeps the signature when its GPU time is lower by at least `MARGIN` and it is not slower
back to back; otherwise the signature runs through PyTorch's convolution from then on (the same
cuDNN, a cheaper call). A layer whose forward and backward both went to PyTorch skips pycudnn's
autograd function altogether. `report()` lists every decision with its figures.

Routing applies to plain convolutions (with or without bias), not to the fused ones, which are
pycudnn's to run; and only where PyTorch would honour the same numerical flags (pycudnn's own
``deterministic=True`` or ``allow_tf32=False`` beyond PyTorch's keep the signature in pycudnn).
``set_routing("pycudnn")`` (or ``PYCUDNN_TORCH_ROUTING=pycudnn``) turns routing off.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

from pycudnn.configuration import config
from pycudnn.runtime.gate import MAX_QUEUED, gate_for

__all__ = ["MARGIN", "RouteDecision", "set_routing", "routing", "report", "clear_report"]

#: how much lower pycudnn's GPU time per call must be to keep a signature (a tie goes to PyTorch,
#: whose call costs less host time)
MARGIN = 0.03
#: the back-to-back timing of one side runs about this long (seconds), 3 to `_MAX_RUNS` calls
_TARGET_S = 0.002
_MAX_RUNS = 40
_MODES = ("auto", "pycudnn")

_mode = os.environ.get("PYCUDNN_TORCH_ROUTING", "auto").strip().lower() or "auto"
if _mode not in _MODES:
    _mode = "auto"
_lock = threading.Lock()
_decisions: collections.deque[RouteDecision] = collections.deque(maxlen=4096)


@dataclass(frozen=True)
class RouteDecision:
    """One measured choice: which side runs ``signature`` in ``direction``, and the figures."""

    signature: str
    direction: str  #: "forward" or "backward" (data and filter together, as autograd runs them)
    winner: str  #: "pycudnn" or "torch"
    pycudnn_gpu_us: float
    torch_gpu_us: float
    pycudnn_call_us: float
    torch_call_us: float
    reason: str


def set_routing(mode: str) -> None:
    """``"auto"`` (the default: measured per signature in benchmark mode) or ``"pycudnn"``
    (every convolution through pycudnn). Signatures already decided keep their side until
    ``pycudnn.torch.clear_cache()``."""
    global _mode
    if mode not in _MODES:
        raise ValueError(f"set_routing: expected mode to be one of {list(_MODES)}, got {mode!r}")
    _mode = mode


def routing() -> str:
    """The routing mode (see `set_routing`)."""
    return _mode


def report() -> list[dict[str, Any]]:
    """Every routing decision of this process, oldest first, as dicts (`RouteDecision`'s fields)."""
    with _lock:
        return [asdict(d) for d in _decisions]


def clear_report() -> None:
    with _lock:
        _decisions.clear()


def should_measure(benchmark: bool, torch_tf32: bool, torch_deterministic: bool) -> bool:
    """Whether a new signature is timed against PyTorch: routing on, benchmark mode, no capture
    under way, and PyTorch's flags at least as strict as pycudnn's."""
    if _mode != "auto" or not (benchmark or config.benchmark):
        return False
    if config.deterministic and not torch_deterministic:
        return False
    if torch_tf32 and not config.allow_tf32:
        return False
    return not torch.cuda.is_current_stream_capturing()


def _time(fn: Callable[[], Any], device: int, stream: int) -> tuple[float, float]:
    """(GPU us per call with the stream held, us per call back to back) of ``fn``."""
    cs = torch.cuda.current_stream(device)  # the tensors' device, whichever device is current
    sync = cs.synchronize
    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    single = time.perf_counter() - t0
    n = max(3, min(_MAX_RUNS, int(_TARGET_S / max(single, 1e-6))))
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    call_us = (time.perf_counter() - t0) / n * 1e6
    gate = gate_for(device)
    if gate is None:  # no gate on this GPU: the back-to-back time is all there is
        return call_us, call_us
    n = min(n, MAX_QUEUED // 4)  # a backward call launches up to two kernels, plus memsets
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    generation = None
    timer = None
    try:
        generation = gate.hold(stream)
        timer = gate.watchdog(generation)
        start.record(cs)
        for _ in range(n):
            fn()
        end.record(cs)
    finally:
        if generation is not None:
            gate.open(generation)
        if timer is not None:
            timer.cancel()
    end.synchronize()
    return start.elapsed_time(end) / n * 1e3, call_us


def pycudnn_wins(signature: str, direction: str, ours: Callable[[], Any],
                 theirs: Callable[[], Any], device: int, stream: int) -> bool:
    """Time ``ours`` (pycudnn's launch) and ``theirs`` (PyTorch's call) twice each, alternating;
    record the decision; whether pycudnn keeps the signature."""
    try:
        theirs()  # PyTorch's own search for this signature (benchmark mode), outside the timing
    except Exception as exc:  # noqa: BLE001 - PyTorch refuses what pycudnn runs: pycudnn's then
        _record(RouteDecision(signature, direction, "pycudnn", 0.0, 0.0, 0.0, 0.0,
                              f"PyTorch's call failed: {type(exc).__name__}"))
        return True
    o1, t1, o2, t2 = (_time(ours, device, stream), _time(theirs, device, stream),
                      _time(theirs, device, stream), _time(ours, device, stream))
    og, oc = min(o1[0], o2[0]), min(o1[1], o2[1])
    tg, tc = min(t1[0], t2[0]), min(t1[1], t2[1])
    if og > (1 - MARGIN) * tg:
        win, reason = False, f"GPU time not {MARGIN:.0%} below PyTorch's"
    elif oc > tc:
        win, reason = False, "slower back to back (host time)"
    else:
        win, reason = True, "faster on the GPU and back to back"
    _record(RouteDecision(signature, direction, "pycudnn" if win else "torch", og, tg, oc, tc,
                          reason))
    return win


def _record(decision: RouteDecision) -> None:
    with _lock:
        _decisions.append(decision)
