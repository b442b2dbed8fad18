"""Running and timing one layer: device buffers, pycudnn's and PyTorch's call, CUDA-event timers,
the first call and the steady state, the candidates a search tried, and one result row per
layer and direction (`run_layer`, `run_all`).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from typing import Any, Callable

from .._types import MathType
from ..configuration import flags
from ..engines.registry import engine_for
from ..ffi.backend import BehaviorNote, NumericalNote
from ..runtime.memory import (device_guard, empty_cache, event_create, event_destroy,
                              event_elapsed_ms, event_record, event_synchronize, synchronize)
from ..tuning import db as tuning_db
from ..search.cache import caches
from .models import SHORT, Layer
from .report import Progress, first_line


class _Buffers:
    """Device tensors of one layer, made on first need and shared by the three directions."""

    def __init__(self, layer: Layer, dtype: str, fmt: str, device: int) -> None:
        self.layer, self.dtype, self.fmt, self.device = layer, dtype, fmt, device
        self._t: dict[str, Any] = {}
        self._torch: dict[str, Any] = {}

    def _make(self, shape: tuple[int, ...], fill: bool) -> Any:
        import numpy as np

        import pycudnn

        if not fill:
            return pycudnn.empty(shape, self.dtype, memory_format=self.fmt, device=self.device)
        pool = _random_pool()
        host = np.resize(pool, math.prod(shape)).reshape(shape)
        return pycudnn.from_numpy(host, dtype=self.dtype, memory_format=self.fmt, device=self.device)

    def get(self, name: str) -> Any:
        t = self._t.get(name)
        if t is None:
            lay = self.layer
            shape = {"x": lay.x_shape, "w": lay.w_shape, "dy": lay.y_shape, "y": lay.y_shape,
                     "dx": lay.x_shape, "dw": lay.w_shape}[name]
            t = self._t[name] = self._make(shape, fill=name in ("x", "w", "dy"))
        return t

    def torch(self, name: str) -> Any:
        t = self._torch.get(name)
        if t is None:
            import torch

            t = self._torch[name] = torch.from_dlpack(self.get(name))
        return t


_pool: list[Any] = []


def _random_pool() -> Any:
    if not _pool:
        import numpy as np

        _pool.append((np.random.default_rng(0).random(1 << 20, dtype=np.float32) - 0.5))
    return _pool[0]


def pycudnn_fn(layer: Layer, direction: str, bufs: _Buffers, flags: dict[str, Any]) -> Callable[[], Any]:
    """The pycudnn call that times ``layer`` in ``direction`` on ``bufs``. Public as a seam for
    tests and tooling."""
    import pycudnn

    kw = dict(stride=layer.stride, padding=layer.pad, dilation=layer.dilation, groups=layer.groups,
              **flags)
    if direction == "forward":
        x, w, y = bufs.get("x"), bufs.get("w"), bufs.get("y")
        return lambda: pycudnn.convolution(x, w, out=y, **kw)
    if direction == "backward_data":
        dy, w, dx = bufs.get("dy"), bufs.get("w"), bufs.get("dx")
        return lambda: pycudnn.convolution_backward_data(dy, w, layer.x_shape, out=dx, **kw)
    x, dy, dw = bufs.get("x"), bufs.get("dy"), bufs.get("dw")
    return lambda: pycudnn.convolution_backward_filter(x, dy, layer.w_shape, out=dw, **kw)


def _torch_fn(layer: Layer, direction: str, bufs: _Buffers) -> Callable[[], Any]:
    import torch
    import torch.nn.functional as F

    nd = layer.nd
    s, p, d = [layer.stride] * nd, [layer.pad] * nd, [layer.dilation] * nd
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    x, w = bufs.torch("x"), bufs.torch("w")
    if direction == "forward":
        return lambda: conv(x, w, None, s, p, d, layer.groups)
    dy = bufs.torch("dy")
    mask = [True, False, False] if direction == "backward_data" else [False, True, False]
    op = torch.ops.aten.convolution_backward
    return lambda: op(dy, x, w, None, s, p, d, False, [0] * nd, layer.groups, mask)


class CudaTimer:
    """CUDA events on the legacy default stream (where pycudnn runs without ``stream=``).
    Public as a seam for tests and tooling."""

    def __init__(self) -> None:
        self.ev0 = event_create()
        try:
            self.ev1 = event_create()
        except BaseException:
            event_destroy(self.ev0)
            raise

    def start(self) -> None:
        event_record(self.ev0, 0)

    def stop(self) -> float:
        event_record(self.ev1, 0)
        event_synchronize(self.ev1)
        return event_elapsed_ms(self.ev0, self.ev1)

    def sync(self) -> None:
        synchronize()

    def close(self) -> None:
        event_destroy(self.ev0)
        event_destroy(self.ev1)


class _TorchTimer:
    """CUDA events on PyTorch's current stream."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.ev0 = torch.cuda.Event(enable_timing=True)
        self.ev1 = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        self.ev0.record()

    def stop(self) -> float:
        self.ev1.record()
        self.ev1.synchronize()
        return float(self.ev0.elapsed_time(self.ev1))

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def close(self) -> None:
        pass


def _first_call(fn: Callable[[], Any], timer: CudaTimer | _TorchTimer) -> float:
    """Wall milliseconds until the first call's convolution has finished (search included)."""
    timer.sync()
    t0 = time.perf_counter()
    fn()
    timer.sync()
    return (time.perf_counter() - t0) * 1e3


def _steady(fn: Callable[[], Any], timer: CudaTimer | _TorchTimer, trials: int = 7,
            trial_ms: float = 5.0) -> float:
    """Median over ``trials`` of the mean time per call of back-to-back calls (ms), host cost
    included; each trial runs about ``trial_ms``."""
    fn()
    timer.start()
    fn()
    one = max(timer.stop(), 1e-3)
    reps = max(1, min(200, int(math.ceil(trial_ms / one))))
    samples = []
    for _ in range(trials):
        timer.start()
        for _ in range(reps):
            fn()
        samples.append(timer.stop() / reps)
    return statistics.median(samples)


class _CandidateSpy:
    """Keeps what the engine's ``candidates()`` returned during a measured search (what
    ``--all-candidates`` shows); installed on the engine instance, removed on exit."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.seen: list[Any] = []

    def __enter__(self) -> "_CandidateSpy":
        real = self.engine.candidates

        def spy(args: Any) -> Any:
            got = real(args)
            if args.benchmark:
                got = list(got)
                self.seen.extend(got)
            return got

        self.engine.candidates = spy
        return self

    def __exit__(self, *exc: Any) -> None:
        self.engine.__dict__.pop("candidates", None)


def _note_name(enum: Any, value: Any) -> str:
    try:
        return enum(int(value)).name
    except (ValueError, TypeError):
        return str(value)


def candidate_row(rec: Any) -> dict[str, Any]:
    """Choice, measured time, workspace and notes of one candidate (graph plan or v7 algorithm)."""
    plan = getattr(rec, "plan", None)
    if plan is not None:

        notes = [_note_name(NumericalNote, n) for n in getattr(plan, "notes", ())]
        notes += [_note_name(BehaviorNote, n) for n in getattr(plan, "behavior_notes", ())]
        return {"choice": plan.tag, "time_ms": rec.time_ms if rec.time_ms >= 0 else None,
                "workspace": plan.workspace_size if plan.finalized else None,
                "notes": notes, "source": rec.source, "detail": rec.describe()}

    try:
        math_name = MathType(rec.math_type).name
    except ValueError:
        math_name = str(rec.math_type)
    return {"choice": f"{rec.algo_name.split('.')[-1]} {math_name}",
            "time_ms": rec.time_ms if rec.time_ms >= 0 else None, "workspace": rec.workspace,
            "notes": ["deterministic" if rec.deterministic else "non-deterministic"],
            "source": rec.source, "detail": rec.describe()}


def _store_winners(direction: str, engine: Any) -> None:
    """After a search run with the database off (--fresh/--all-candidates): keep the winner."""

    if not tuning_db.enabled():
        return
    for params, record in caches[direction].items():
        if record.source in ("measured", "find"):
            try:
                tuning_db.store(params, engine.serialize(record))
            except OSError as exc:
                print(f"warning: could not write the tuning database: {exc}", file=sys.stderr)


#: what every result row holds (None until measured)
ROW_FIELDS = ("layer", "shape", "direction", "gflop", "ms", "tflops", "first_call_ms", "choice",
              "choice_detail", "choice_ms", "workspace", "source", "searches", "torch_ms", "torch_tflops",
              "torch_first_call_ms", "torch_over_pycudnn", "error", "torch_error")


def new_row(layer: Layer, direction: str) -> dict[str, Any]:
    """A result row for ``layer`` in ``direction``: every field of `ROW_FIELDS`, unmeasured."""
    row: dict[str, Any] = dict.fromkeys(ROW_FIELDS)
    row.update(layer=layer.name, shape=layer.as_dict(), direction=direction, gflop=layer.flops / 1e9)
    return row


def run_layer(layer: Layer, direction: str, bufs: _Buffers, opts: dict[str, Any],
              torch_on: bool, measure: bool = True) -> dict[str, Any]:
    """Search (or reuse) and time one layer in one direction, with `options_from_args()`'s
    ``opts`` and ``bench``'s device buffers ``bufs``; torch too when ``torch_on``. Returns the
    row (see `new_row()`); a failure is the row's ``error``, not an exception."""
    import pycudnn


    engine = engine_for(opts["engine"])
    row = new_row(layer, direction)
    pycudnn.clear_caches()
    fn = pycudnn_fn(layer, direction, bufs, opts["flags"])
    timer = CudaTimer()
    try:
        fresh = opts["fresh"] or opts["all_candidates"]
        with _CandidateSpy(engine) as spy:
            if fresh:
                with flags(tuning_db=False):
                    row["first_call_ms"] = _first_call(fn, timer)
                if opts["use_db"]:
                    _store_winners(direction, engine)
            else:
                row["first_call_ms"] = _first_call(fn, timer)
        cached = caches[direction].items()
        row["searches"] = caches[direction].searches
        if cached:
            record = cached[-1][1]
            info = candidate_row(record)
            row.update(choice=info["choice"], choice_detail=info["detail"],
                       choice_ms=info["time_ms"], workspace=info["workspace"],
                       source=info["source"])
        if opts["all_candidates"]:
            row["candidates"] = [candidate_row(r) for r in spy.seen]
        if measure:
            row["ms"] = _steady(fn, timer)
            row["tflops"] = layer.flops / (row["ms"] * 1e-3) / 1e12
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - one failing layer must not stop the others
        row["error"] = f"{type(exc).__name__}: {first_line(exc)}"
    finally:
        timer.close()
    if torch_on and measure:
        try:
            tfn = _torch_fn(layer, direction, bufs)
            ttimer = _TorchTimer()
            row["torch_first_call_ms"] = _first_call(tfn, ttimer)
            row["torch_ms"] = _steady(tfn, ttimer)
            row["torch_tflops"] = layer.flops / (row["torch_ms"] * 1e-3) / 1e12
            if row["ms"]:
                row["torch_over_pycudnn"] = row["torch_ms"] / row["ms"]
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # noqa: BLE001
            row["torch_error"] = f"{type(exc).__name__}: {first_line(exc)}"
    return row


def _free_memory(device: int, torch_on: bool) -> None:

    try:
        if torch_on:
            import torch

            torch.cuda.empty_cache()
        empty_cache(device)
    except Exception:  # noqa: BLE001 - best effort
        pass


def run_all(layers: list[Layer], directions: list[str], opts: dict[str, Any], device: int,
             torch_on: bool, quiet: bool, what: str, measure: bool) -> list[dict[str, Any]]:

    rows = []
    progress = Progress(len(layers) * len(directions), what, quiet)
    try:
        with device_guard(device), flags(tuning_db=opts["use_db"]):
            for layer in layers:
                bufs = _Buffers(layer, opts["dtype"], opts["fmt"], device)
                for direction in directions:
                    progress.step(f"{layer.name} {SHORT[direction]}")
                    rows.append(run_layer(layer, direction, bufs, opts, torch_on, measure))
                    progress.done()
                del bufs
                _free_memory(device, torch_on)
    finally:
        progress.close()
    return rows
