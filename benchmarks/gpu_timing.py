"""Timing for benchmarks that cannot flatter either side: kernel time behind a gate, host cost per
call, kernel names from the profiler, and the statistics the scripts report.

Two different questions, never mixed in one figure:

* **Kernel time** ([`gated_time_us`][], [`compare_gated`][]): how long the GPU takes to run N
  calls back to back with the host far ahead. Before timing, the stream is made to wait on a
  4-byte word of host-mapped memory (``cuStreamWaitValue32``, ``CU_STREAM_WAIT_VALUE_GEQ``);
  then a start event, the N calls and an end event are queued; only then does the host write the
  word, and the GPU runs everything queued with no host launch gap between the calls. Where
  stream memory operations are not supported, a spin kernel (``torch.cuda._sleep``) long enough
  to cover the queueing holds the stream instead; a batch whose start event completed before the
  last call was queued is thrown away and redone with a longer spin. N is capped per batch
  (the driver blocks the host once about 1024 launches are pending, which would deadlock a gate
  the host has not yet opened); a watchdog thread opens the gate after ``timeout_s`` in any case,
  and such a batch is reported as an error, never as a time.
* **Call cost** ([`host_time_us`][]): host microseconds per call (``time.perf_counter``) over
  chunks of back-to-back calls, with the device synchronized between chunks, outside the timed
  part, so the launch queue never fills and the GPU is never what is waited for. Use tiny shapes.

Everything here takes the stream as an int handle (``torch.cuda.current_stream().cuda_stream``);
torch is needed only for the spin fallback and for [`kernel_names`][].
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import statistics
import tempfile
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

#: launches the driver queues per stream before the host blocks (documented as about 1024)
MAX_PENDING_LAUNCHES = 1024
#: launches one gated batch may queue: half the queue, leaving room for what a call adds
LAUNCH_BUDGET = 512
#: calls per gated batch, at most
MAX_CALLS_PER_BATCH = 200
#: seconds after which the watchdog opens a gate the host did not open (a call blocked the host)
DEFAULT_TIMEOUT_S = 5.0


# ---- statistics and argument checks (no GPU) ------------------------------------------------------

def check_positive_int(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum``, else a ValueError/TypeError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int >= {minimum}, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return value


def median(values: Iterable[float]) -> float:
    """The median of the finite values; NaN when there are none."""
    v = [float(x) for x in values if x is not None and math.isfinite(x)]
    return statistics.median(v) if v else float("nan")


def geomean(values: Iterable[float | None]) -> float:
    """Geometric mean of the positive finite values (None, NaN, zeros skipped); NaN if none."""
    v = [float(x) for x in values if x is not None and math.isfinite(x) and x > 0]
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else float("nan")


def spread(values: Sequence[float]) -> dict[str, float]:
    """``{"median", "min", "max", "rel_iqr", "n"}`` of samples; ``rel_iqr`` is the interquartile
    range over the median (how noisy the samples were)."""
    v = sorted(float(x) for x in values if x is not None and math.isfinite(x))
    if not v:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"),
                "rel_iqr": float("nan"), "n": 0}
    med = statistics.median(v)
    if len(v) >= 2:
        q = statistics.quantiles(v, n=4, method="inclusive")
        iqr = q[2] - q[0]
    else:
        iqr = 0.0
    return {"median": med, "min": v[0], "max": v[-1], "rel_iqr": iqr / med if med else float("nan"),
            "n": len(v)}


def calls_per_batch(reps: int, launches_per_call: int = 1, budget: int = LAUNCH_BUDGET,
                    cap: int = MAX_CALLS_PER_BATCH) -> int:
    """Calls one gated batch may hold: ``reps``, at most ``cap`` and at most ``budget`` launches
    (``launches_per_call`` kernels, memsets and copies per call), at least 1."""
    check_positive_int("reps", reps)
    check_positive_int("launches_per_call", launches_per_call)
    check_positive_int("budget", budget)
    check_positive_int("cap", cap)
    if budget > MAX_PENDING_LAUNCHES:
        raise ValueError(f"budget: expected at most {MAX_PENDING_LAUNCHES} pending launches "
                         f"(the driver's queue), got {budget}")
    return max(1, min(reps, cap, budget // launches_per_call))


def alternating_orders(names: Sequence[str], rounds: int) -> list[list[str]]:
    """Which side goes first in each round: the names rotated by one each round, so with two
    sides each goes first in every other round (shared effects such as clocks, caches and lazily
    loaded kernels fall on both alike)."""
    names = list(names)
    if not names:
        raise ValueError("names: expected at least one name")
    if len(set(names)) != len(names):
        raise ValueError(f"names: expected distinct names, got {names}")
    check_positive_int("rounds", rounds)
    k = len(names)
    return [names[i % k:] + names[:i % k] for i in range(rounds)]


def ratio(numerator: float | None, denominator: float | None) -> float:
    """``numerator / denominator``; NaN when either is missing, not finite or not positive."""
    if (numerator is None or denominator is None or not math.isfinite(numerator)
            or not math.isfinite(denominator) or numerator <= 0 or denominator <= 0):
        return float("nan")
    return numerator / denominator


def error_text(exc: BaseException) -> str:
    """One line for a failed cell: the exception type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


# ---- CUDA through cuda.bindings -------------------------------------------------------------------

class GateError(RuntimeError):
    """A gated batch gave no valid time (the gate leaked or the watchdog had to open it)."""


class GateTimeout(GateError):
    """The watchdog opened the gate: something in the timed calls blocked the host (a
    synchronization, or more pending launches than the driver queues)."""


def _rt() -> Any:
    from cuda.bindings import runtime as rt

    return rt


def _drv() -> Any:
    from cuda.bindings import driver as drv

    return drv


def _check(result: Any, what: str) -> Any:
    """Unpack a cuda.bindings result tuple, raising on an error code."""
    if isinstance(result, tuple):
        err, rest = result[0], result[1:]
    else:
        err, rest = result, ()
    if int(err) != 0:
        name = getattr(err, "name", str(int(err)))
        raise RuntimeError(f"{what} failed: {name}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


class _Events:
    """A pair of timing events (cuda.bindings runtime)."""

    def __init__(self) -> None:
        rt = _rt()
        self.start = _check(rt.cudaEventCreate(), "cudaEventCreate")
        self.end = _check(rt.cudaEventCreate(), "cudaEventCreate")

    def record_start(self, stream: int) -> None:
        _check(_rt().cudaEventRecord(self.start, stream), "cudaEventRecord")

    def record_end(self, stream: int) -> None:
        _check(_rt().cudaEventRecord(self.end, stream), "cudaEventRecord")

    def start_done(self) -> bool:
        err = _rt().cudaEventQuery(self.start)[0]
        return int(err) == 0

    def elapsed_ms(self) -> float:
        rt = _rt()
        _check(rt.cudaEventSynchronize(self.end), "cudaEventSynchronize")
        return float(_check(rt.cudaEventElapsedTime(self.start, self.end), "cudaEventElapsedTime"))

    def close(self) -> None:
        rt = _rt()
        for ev in (self.start, self.end):
            rt.cudaEventDestroy(ev)


def _attribute(name: str, device: int) -> int | None:
    """A driver device attribute by name, None where this cuda.bindings lacks it."""
    drv = _drv()
    attr = getattr(drv.CUdevice_attribute, name, None)
    if attr is None:
        return None
    try:
        return int(_check(drv.cuDeviceGetAttribute(attr, device), name))
    except RuntimeError:
        return None


class Gate:
    """Holds a stream until the host opens it: a wait on a host-mapped word (``mode="wait"``) or
    a spin kernel (``mode="spin"``, torch needed).

    ``mode="auto"`` tries the wait, checks that it really holds the stream (an event queued
    behind it must stay pending until the word is written) and falls back to the spin otherwise;
    ``reason`` says why. Each hold waits for a new generation of the word (a cyclic
    greater-or-equal), so a late write for an earlier batch never opens a later one.
    """

    def __init__(self, device: int | None = None, mode: str = "auto", torch: Any = None) -> None:
        if mode not in ("auto", "wait", "spin"):
            raise ValueError(f"mode: expected 'auto', 'wait' or 'spin', got {mode!r}")
        rt = _rt()
        if device is None:
            device = int(_check(rt.cudaGetDevice(), "cudaGetDevice"))
        self.device = device
        _check(rt.cudaSetDevice(device), "cudaSetDevice")
        _check(rt.cudaFree(0), "cudaFree(0)")  # the primary context, current on this thread
        self.torch = torch
        self.info: dict[str, Any] = {
            name: _attribute(name, device) for name in (
                "CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1",
                "CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR",
                "CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR_V1")}
        self._host = 0
        self._word: Any = None
        self._dptr = 0
        self._generation = 0
        self._lock = threading.Lock()
        self.spin_ms = 20.0
        self.mode = "spin"
        self.reason = ""
        if mode in ("auto", "wait"):
            try:
                self._map_word()
                self._self_test()
                self.mode = "wait"
                self.reason = "cuStreamWaitValue32 on a host-mapped word"
            except Exception as exc:  # noqa: BLE001 - reported, then the fallback
                if mode == "wait":
                    raise
                self.reason = f"stream wait unusable ({error_text(exc)}); spin kernel instead"
        if self.mode == "spin":
            if torch is None or not hasattr(torch.cuda, "_sleep"):
                raise GateError("no gate: stream memory operations are unusable here "
                                f"({self.reason or 'spin asked'}) and torch.cuda._sleep is not "
                                "available for the spin fallback")
            if not self.reason:
                self.reason = "spin kernel (torch.cuda._sleep), as asked"
            self._clock_khz = self._clock_rate_khz()

    # -- the word ---------------------------------------------------------------------------
    def _map_word(self) -> None:
        rt = _rt()
        flags = rt.cudaHostAllocMapped | rt.cudaHostAllocPortable
        self._host = int(_check(rt.cudaHostAlloc(4, flags), "cudaHostAlloc(mapped)"))
        self._word = ctypes.c_uint32.from_address(self._host)
        self._word.value = 0
        self._dptr = int(_check(rt.cudaHostGetDevicePointer(self._host, 0), "cudaHostGetDevicePointer"))

    def _wait(self, stream: int, value: int) -> None:
        drv = _drv()
        geq = int(drv.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ)
        _check(drv.cuStreamWaitValue32(stream, self._dptr, value & 0xFFFFFFFF, geq), "cuStreamWaitValue32")

    def _write(self, value: int) -> None:
        self._word.value = value & 0xFFFFFFFF

    def _self_test(self) -> None:
        rt = _rt()
        stream = int(_check(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking), "cudaStreamCreate"))
        ev = _check(rt.cudaEventCreateWithFlags(rt.cudaEventDisableTiming), "cudaEventCreate")
        try:
            self._generation += 1
            g = self._generation
            self._wait(stream, g)
            _check(rt.cudaEventRecord(ev, stream), "cudaEventRecord")
            time.sleep(0.02)
            held = int(rt.cudaEventQuery(ev)[0]) != 0
            self._write(g)
            deadline = time.perf_counter() + 5.0
            while int(rt.cudaEventQuery(ev)[0]) != 0:
                if time.perf_counter() > deadline:
                    raise GateError("the stream stayed blocked 5 s after the word was written")
                time.sleep(0.001)
            if not held:
                raise GateError("the stream did not wait for the word")
        finally:
            rt.cudaEventDestroy(ev)
            rt.cudaStreamSynchronize(stream)
            rt.cudaStreamDestroy(stream)

    def _clock_rate_khz(self) -> float:
        rt = _rt()
        attr = getattr(rt.cudaDeviceAttr, "cudaDevAttrClockRate", None)
        if attr is not None:
            try:
                khz = float(_check(rt.cudaDeviceGetAttribute(attr, self.device), "clock rate"))
                if khz > 0:
                    return khz
            except RuntimeError:
                pass
        return 2.0e6  # 2 GHz: only sizes the spin, which grows when it proves too short

    # -- holding and opening ------------------------------------------------------------------
    def hold(self, stream: int) -> int:
        """Queue the hold on ``stream``; returns the generation to pass to `open()`."""
        with self._lock:
            self._generation += 1
            g = self._generation
        if self.mode == "wait":
            self._wait(stream, g)
        else:
            cur = self.torch.cuda.current_stream()
            if int(cur.cuda_stream) != int(stream):
                raise ValueError(f"stream: the spin gate runs on torch's current stream "
                                 f"({cur.cuda_stream}), got {stream}")
            self.torch.cuda._sleep(int(self.spin_ms * self._clock_khz))
        return g

    def open(self, generation: int) -> None:
        """Let the stream go on past the hold of ``generation`` (the spin ends by itself)."""
        if self.mode == "wait":
            with self._lock:
                self._write(generation)

    def close(self) -> None:
        if self._host:
            _rt().cudaFreeHost(self._host)
            self._host = 0
            self._word = None

    def describe(self) -> dict[str, Any]:
        return {"mode": self.mode, "reason": self.reason, "device": self.device,
                "attributes": self.info, "max_calls_per_batch": MAX_CALLS_PER_BATCH,
                "launch_budget": LAUNCH_BUDGET}


_GATES: dict[int, Gate] = {}


def get_gate(device: int | None = None, torch: Any = None, mode: str = "auto") -> Gate:
    """One gate per device and process (made on first use)."""
    if device is None:
        device = int(_check(_rt().cudaGetDevice(), "cudaGetDevice"))
    gate = _GATES.get(device)
    if gate is None or (mode != "auto" and gate.mode != mode):
        gate = _GATES[device] = Gate(device, mode, torch)
    elif gate.torch is None and torch is not None:
        gate.torch = torch
    return gate


def gated_batch_us(fn: Callable[[], Any], stream: int, calls: int, gate: Gate,
                   timeout_s: float = DEFAULT_TIMEOUT_S) -> float:
    """GPU microseconds per call of ``calls`` calls of ``fn`` queued behind ``gate`` on
    ``stream`` (every call must go to ``stream``).

    Raises:
        GateTimeout: the host was blocked until the watchdog opened the gate.
        GateError: the gate opened before the last call was queued (spin too short).
    """
    check_positive_int("calls", calls)
    if calls > MAX_PENDING_LAUNCHES:
        raise ValueError(f"calls: at most {MAX_PENDING_LAUNCHES} per gated batch, got {calls}")
    events = _Events()
    fired = threading.Event()
    try:
        g = gate.hold(stream)
        events.record_start(stream)

        def watchdog() -> None:
            fired.set()
            gate.open(g)

        timer = threading.Timer(timeout_s, watchdog)
        timer.daemon = True
        timer.start()
        try:
            for _ in range(calls):
                fn()
            events.record_end(stream)
            leaked = events.start_done()
        finally:
            gate.open(g)
            timer.cancel()
        ms = events.elapsed_ms()
        if fired.is_set():
            raise GateTimeout(f"a call blocked the host for more than {timeout_s:g} s with the gate "
                              f"closed ({calls} calls queued): it synchronizes, or queues more "
                              "launches than the driver holds")
        if leaked:
            raise GateError(f"the gate opened before the {calls} calls were queued "
                            f"({gate.mode} gate)")
        return ms * 1e3 / calls
    finally:
        events.close()


def _batch_with_retries(fn: Callable[[], Any], stream: int, calls: int, gate: Gate,
                        timeout_s: float) -> tuple[float, int]:
    """One valid batch: a longer spin after a leak, half the calls after a timeout.
    Returns (us per call, calls used)."""
    for _ in range(6):
        try:
            return gated_batch_us(fn, stream, calls, gate, timeout_s), calls
        except GateTimeout:
            if calls == 1:
                raise
            calls = max(1, calls // 2)
        except GateError:
            if gate.mode != "spin":
                raise
            gate.spin_ms *= 2
    raise GateError(f"no valid gated batch after 6 tries (last: {calls} calls, {gate.mode} gate)")


def gated_samples(fn: Callable[[], Any], stream: int, reps: int = 100, batches: int = 5, *,
                  gate: Gate | None = None, launches_per_call: int = 1, warmup: int = 3,
                  timeout_s: float = DEFAULT_TIMEOUT_S, synchronize: Callable[[], Any] | None = None
                  ) -> list[float]:
    """Microseconds per call of each of ``batches`` gated batches of (up to) ``reps`` calls."""
    return compare_gated({"fn": fn}, stream, reps, batches, gate=gate,
                         launches_per_call={"fn": launches_per_call}, warmup=warmup,
                         timeout_s=timeout_s, synchronize=synchronize)["fn"]


def gated_time_us(fn: Callable[[], Any], stream: int, reps: int = 100, batches: int = 5,
                  **kwargs: Any) -> float:
    """Kernel time of ``fn``: the median over ``batches`` gated batches of the GPU microseconds
    per call, ``reps`` calls per batch (capped: see [`calls_per_batch`][]). Keyword arguments
    are those of [`gated_samples`][]."""
    return median(gated_samples(fn, stream, reps, batches, **kwargs))


def compare_gated(fns: Mapping[str, Callable[[], Any]], stream: int, reps: int = 100,
                  batches: int = 5, *, gate: Gate | None = None,
                  launches_per_call: Mapping[str, int] | None = None, warmup: int = 3,
                  timeout_s: float = DEFAULT_TIMEOUT_S,
                  synchronize: Callable[[], Any] | None = None) -> dict[str, list[float]]:
    """Gated samples (us per call) of several functions, batches interleaved and the order
    rotated each round ([`alternating_orders`][]): round 0 runs a then b, round 1 b then a...

    ``synchronize`` (default: ``cudaDeviceSynchronize``) runs after the warm-up calls and
    between batches, outside the timed part.
    """
    check_positive_int("reps", reps)
    check_positive_int("batches", batches)
    check_positive_int("warmup", warmup, 0)
    if gate is None:
        gate = get_gate()
    sync = synchronize or _device_synchronize
    lpc = dict(launches_per_call or {})
    calls = {name: calls_per_batch(reps, max(1, int(lpc.get(name, 1)))) for name in fns}
    for name, fn in fns.items():
        for _ in range(warmup):
            fn()
    sync()
    out: dict[str, list[float]] = {name: [] for name in fns}
    for order in alternating_orders(list(fns), batches):
        for name in order:
            us, calls[name] = _batch_with_retries(fns[name], stream, calls[name], gate, timeout_s)
            out[name].append(us)
            sync()
    return out


# ---- host cost per call ---------------------------------------------------------------------------

def _device_synchronize() -> None:
    _check(_rt().cudaDeviceSynchronize(), "cudaDeviceSynchronize")


def host_time_us(fn: Callable[[], Any], reps: int = 2000, *,
                 synchronize: Callable[[], Any] | None = None, chunk: int = 50,
                 warmup: int = 100) -> dict[str, float]:
    """Host microseconds per call of ``fn``: chunks of ``chunk`` back-to-back calls timed with
    ``time.perf_counter``, ``synchronize()`` between chunks and outside the timed part (the launch
    queue never fills, so the host never waits for the GPU). Returns [`spread`][] of the
    per-chunk figures (``median`` is the figure to report). ``synchronize`` defaults to
    ``cudaDeviceSynchronize``."""
    synchronize = synchronize or _device_synchronize
    check_positive_int("reps", reps)
    check_positive_int("chunk", chunk)
    check_positive_int("warmup", warmup, 0)
    for _ in range(warmup):
        fn()
    synchronize()
    samples = []
    perf = time.perf_counter
    for _ in range(max(1, reps // chunk)):
        t0 = perf()
        for _ in range(chunk):
            fn()
        samples.append((perf() - t0) * 1e6 / chunk)
        synchronize()
    return spread(samples)


def compare_host(fns: Mapping[str, Callable[[], Any]], reps: int = 2000, *,
                 synchronize: Callable[[], Any] | None = None, chunk: int = 50, rounds: int = 5,
                 warmup: int = 100) -> dict[str, dict[str, float]]:
    """[`host_time_us`][] of several functions in ``rounds`` interleaved rounds, the order
    rotated each round; per function the spread of its per-round medians."""
    synchronize = synchronize or _device_synchronize
    check_positive_int("rounds", rounds)
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    synchronize()
    per_round = max(1, reps // rounds)
    chunks: dict[str, list[float]] = {name: [] for name in fns}
    for order in alternating_orders(list(fns), rounds):
        for name in order:
            s = host_time_us(fns[name], per_round, synchronize=synchronize, chunk=min(chunk, per_round),
                             warmup=0)
            chunks[name].append(s["median"])
    return {name: spread(v) for name, v in chunks.items()}


# ---- stream time of back-to-back calls (host launch gaps included) --------------------------------

def back_to_back_ms(torch: Any, fn: Callable[[], Any], reps: int, trials: int = 5, warmup: int = 1) -> float:
    """Median over ``trials`` of the mean stream time (ms) of ``reps`` back-to-back calls, CUDA
    events around them, no gate: where the host is slower than the GPU this is host time, not
    kernel time. Kept for figures that mean "end to end as a loop sees it"; label them so."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / reps)
    return statistics.median(samples)


# ---- kernel names (torch.profiler, CUPTI: sees every library's launches) --------------------------

SEPARATOR = "spin_kernel"  # torch.cuda._sleep's kernel: marks the boundary between calls
_DEVICE_CATEGORIES = ("kernel", "gpu_memset", "gpu_memcpy")


def device_activities(trace: Mapping[str, Any]) -> list[tuple[float, str, str]]:
    """``(start us, category, name)`` of the device activities in a Chrome trace (what
    ``torch.profiler`` exports), sorted by start."""
    out = []
    for e in trace.get("traceEvents", []):
        cat = str(e.get("cat", "")).lower()
        if e.get("ph") == "X" and cat in _DEVICE_CATEGORIES:
            out.append((float(e.get("ts", 0.0)), cat, str(e.get("name", ""))))
    out.sort()
    return out


def split_at_separators(activities: Sequence[tuple[float, str, str]], calls: int,
                        separator: str = SEPARATOR) -> list[list[str]] | None:
    """The names between separator kernels: ``calls`` groups when the trace holds ``calls + 1``
    separators around them (sep, call 0, sep, call 1, ..., sep), else None."""
    groups: list[list[str]] = []
    current: list[str] | None = None
    for _, cat, name in activities:
        if cat == "kernel" and separator in name:
            if current is not None:
                groups.append(current)
            current = []
        elif current is not None:
            current.append(name if cat == "kernel" else f"[{cat}] {name}")
    return groups if len(groups) == calls else None


def _profile_trace(torch: Any, body: Callable[[], Any]) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        body()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json", prefix="pycudnn-bench-trace-")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)


def kernel_names(torch: Any, fns: Sequence[Callable[[], Any]]) -> list[list[str]]:
    """The device activities (kernel names; memsets and copies marked) of one call of each of
    ``fns``, in order, from one ``torch.profiler`` session with a spin kernel between calls (one
    session per call where that split fails). Call after warm-up: a first call's search would
    show up too."""
    sep = getattr(torch.cuda, "_sleep", None)
    if sep is not None:
        def body() -> None:
            for fn in fns:
                sep(1)
                fn()
            sep(1)

        groups = split_at_separators(device_activities(_profile_trace(torch, body)), len(fns))
        if groups is not None:
            return groups
    out = []
    for fn in fns:
        acts = device_activities(_profile_trace(torch, fn))
        out.append([n if c == "kernel" else f"[{c}] {n}" for _, c, n in acts])
    return out


def device_launch_count(names: Sequence[str]) -> int:
    """Launches one call queues, for [`calls_per_batch`][]: its device activities, at least 1."""
    return max(1, len(names))
