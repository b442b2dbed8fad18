"""Which library runs a convolution call signature: pycudnn's prepared launch or PyTorch's own.

A converted model must never be slower than the model it came from. Both call the same cuDNN;
what differs is a call's host cost (PyTorch's convolution is C++) and, for some layers, the
kernel each search finds. So in benchmark mode the first call of a signature, once pycudnn has
prepared it, times both sides on the caller's tensors: GPU time behind pycudnn's gate, and time
back to back. pycudnn keeps the signature when its GPU time is lower by at least `MARGIN` (and,
for a plain convolution, `HOST_ALLOWANCE_US`) and it is not slower back to back; otherwise
PyTorch runs it from then on, and a layer whose forward and backward both went to PyTorch skips
pycudnn's autograd function. `report()` lists the decisions. A decision is stored for the next
process (`pycudnn.tuning.routes`), and `prejudge` sends a new signature to PyTorch unsearched
where PyTorch's call alone costs less than pycudnn's host floor (`host_floor`). Convolutions, the
fused inference ops (their PyTorch side the convolution, then the add and ReLU in place) and,
through `block_routing`, the fused training blocks are routed, where PyTorch honours the same
numerical flags; ``set_routing("pycudnn")`` (``PYCUDNN_TORCH_ROUTING=pycudnn``) turns it off.
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
from pycudnn.tuning import routes as route_store

__all__ = ["MARGIN", "HOST_ALLOWANCE_US", "RouteDecision", "set_routing", "routing", "report",
           "clear_report", "measuring", "prejudge", "pycudnn_wins", "host_floor", "time_call"]

#: how much lower pycudnn's GPU time per call must be to keep a signature (a tie goes to PyTorch,
#: whose call costs less host time)
MARGIN = 0.03
#: how many us of GPU time per call a plain convolution (forward or backward, what convert's
#: autograd node runs) must save to stay in pycudnn: that Python node costs host time PyTorch's
#: C++ node does not, which a host-bound training step pays in full while a layer's own
#: back-to-back timing hides it (at 1646727, kept on 3% wins, 20 of ResNet-50's 68 signatures
#: made its eager step 0.77x PyTorch's). Inference calls of the same signature share the decision.
HOST_ALLOWANCE_US = 15.0
#: the back-to-back timing of one side runs about this long (seconds), 3 to `_MAX_RUNS` calls
_TARGET_S = 0.002
_MAX_RUNS = 40
_MODES = ("auto", "pycudnn")

_mode = os.environ.get("PYCUDNN_TORCH_ROUTING", "auto").strip().lower() or "auto"
if _mode not in _MODES:
    _mode = "auto"
#: a pycudnn launch whose GPU time is below this share of its back-to-back time is host-bound:
#: its back-to-back time is what a pycudnn call costs the host (see `host_floor`)
_HOST_BOUND_SHARE = 0.5
_lock = threading.Lock()
_decisions: collections.deque[RouteDecision] = collections.deque(maxlen=4096)
_host_floor: dict[str, float] = {}  # direction -> least back-to-back us of a host-bound launch


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
    """Forget this process's decisions and what it learnt of pycudnn's host cost."""
    with _lock:
        _decisions.clear()
        _host_floor.clear()


def host_floor(direction: str) -> float | None:
    """The least time per call (us) a pycudnn launch of ``direction`` took back to back where the
    host, not the GPU, bound it; None until such a launch has been timed in this process."""
    return _host_floor.get(direction)


def measuring(benchmark: bool) -> bool:
    """Whether routing measures anything: routing on, and benchmark mode (PyTorch's
    ``benchmark``, or pycudnn's)."""
    return _mode == "auto" and (benchmark or config.benchmark)


def should_measure(benchmark: bool, torch_tf32: bool, torch_deterministic: bool) -> bool:
    """Whether a new signature is timed against PyTorch: `measuring`, no capture under way, and
    PyTorch's flags at least as strict as pycudnn's."""
    if not measuring(benchmark):
        return False
    if config.deterministic and not torch_deterministic:
        return False
    if torch_tf32 and not config.allow_tf32:
        return False
    return not torch.cuda.is_current_stream_capturing()


def time_call(fn: Callable[[], Any], device: int, stream: int,
              launches: int = 4) -> tuple[float, float]:
    """(GPU us per call with the stream held, us per call back to back) of ``fn``, which
    launches up to ``launches`` kernels and memsets a call (no more than `MAX_QUEUED` are queued
    behind the hold). Public as a seam for tests and tooling."""
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
    n = max(1, min(n, MAX_QUEUED // launches))
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


def stored_key(signature: str, direction: str, device: int,
               flags: tuple[bool, bool] | None) -> dict[str, Any] | None:
    """The route store's key of a decision (None without flags, or where the key cannot
    be made). Public as a seam for tests and tooling."""
    if flags is None:
        return None
    try:
        return route_store.decision_key(signature, direction, device, *flags, torch.__version__,
                                        torch.backends.cudnn.version() or 0,
                                        cudnn_enabled=bool(torch.backends.cudnn.enabled))
    except Exception:  # noqa: BLE001 - no identity for this device: decide in this process only
        return None


def prejudge(signature: str, direction: str, theirs: Callable[[], Any], device: int,
             stream: int, flags: tuple[bool, bool] | None = None,
             launches: int = 4) -> str | None:
    """What is known of a new signature before pycudnn searches it: ``"torch"`` or
    ``"pycudnn"`` where a stored decision (for PyTorch's ``flags``: allow_tf32, deterministic)
    says so, ``"torch"`` where PyTorch's call ``theirs`` runs back to back in less time than a
    pycudnn call costs the host (`host_floor`), else None (the duel decides, `pycudnn_wins`).
    ``theirs`` runs (PyTorch's own search, benchmark mode) only in the second case."""
    key = stored_key(signature, direction, device, flags)
    stored = route_store.lookup(key) if key is not None else None
    if stored is not None:
        _record(RouteDecision(signature, direction, stored["winner"], stored["pycudnn_gpu_us"],
                              stored["torch_gpu_us"], stored["pycudnn_call_us"],
                              stored["torch_call_us"], f"stored: {stored['reason']}"))
        return str(stored["winner"])
    floor = _host_floor.get(direction)
    if floor is None:
        return None
    try:
        theirs()
    except Exception:  # noqa: BLE001 - the duel records PyTorch's refusal
        return None
    tg, tc = time_call(theirs, device, stream, launches)
    if tc >= floor:
        return None
    decision = RouteDecision(signature, direction, "torch", 0.0, tg, floor, tc,
                             f"PyTorch's call {tc:.1f} us back to back, below pycudnn's host cost "
                             f"{floor:.1f} us: not searched")
    _record(decision)
    if key is not None:
        route_store.store(key, "torch", asdict(decision), decision.reason)
    return "torch"


def pycudnn_wins(signature: str, direction: str, ours: Callable[[], Any],
                 theirs: Callable[[], Any], device: int, stream: int,
                 flags: tuple[bool, bool] | None = None, allowance_us: float = 0.0,
                 launches: int = 4) -> bool:
    """Time ``ours`` (pycudnn's launch) and ``theirs`` (PyTorch's call) twice each, alternating;
    record the decision (and store it, given PyTorch's ``flags``: allow_tf32, deterministic);
    whether pycudnn keeps the signature: its GPU time at least `MARGIN` and ``allowance_us``
    below PyTorch's (`HOST_ALLOWANCE_US` for a plain convolution), and not slower back to
    back. ``launches``: the most kernels and memsets one call of either side launches
    (`time_call`)."""
    try:
        theirs()  # PyTorch's own search for this signature (benchmark mode), outside the timing
    except Exception as exc:  # noqa: BLE001 - PyTorch refuses what pycudnn runs: pycudnn's then
        _record(RouteDecision(signature, direction, "pycudnn", 0.0, 0.0, 0.0, 0.0,
                              f"PyTorch's call failed: {type(exc).__name__}"))
        return True
    # ABBA: each side once before and once after the other's pair
    o1, t1, t2, o2 = (time_call(ours, device, stream, launches),
                      time_call(theirs, device, stream, launches),
                      time_call(theirs, device, stream, launches),
                      time_call(ours, device, stream, launches))
    og, oc = min(o1[0], o2[0]), min(o1[1], o2[1])
    tg, tc = min(t1[0], t2[0]), min(t1[1], t2[1])
    if og > (1 - MARGIN) * tg:
        win, reason = False, f"GPU time not {MARGIN:.0%} below PyTorch's"
    elif tg - og < allowance_us:
        win, reason = False, (f"GPU time {tg - og:.1f} us below PyTorch's, less than the "
                              f"{allowance_us:.0f} us its autograd node costs the host")
    elif oc > tc:
        win, reason = False, "slower back to back (host time)"
    else:
        win, reason = True, "faster on the GPU and back to back"
    decision = RouteDecision(signature, direction, "pycudnn" if win else "torch", og, tg, oc, tc,
                             reason)
    _record(decision)
    if og < _HOST_BOUND_SHARE * oc:
        with _lock:
            _host_floor[direction] = min(oc, _host_floor.get(direction, oc))
    key = stored_key(signature, direction, device, flags)
    if key is not None:
        route_store.store(key, decision.winner, asdict(decision), reason)
    return win


def _record(decision: RouteDecision) -> None:
    with _lock:
        _decisions.append(decision)
