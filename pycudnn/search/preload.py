"""Preloading: the tuning database's choices for one GPU, made ready before the first call.

A later process finds each layer's stored choice on its first call and skips the search
(`pycudnn.tuning.db`), but that first call still pays for rebuilding the choice
(graph and plan, about 1 ms) and for CUDA loading the chosen kernels on their first launch (CUDA
loads modules lazily: 40-100 ms for the first kernel of an engine family, a few ms for each further
one; PyTorch pays the same). `preload()` pays both at a moment the
program chooses: at start-up, in a thread while data loads, or before capturing a CUDA graph (where
a search is not allowed). Every record of the database that applies to the device (same GPU model
and cuDNN version) is rebuilt, run once on scratch buffers (which loads its kernels), and put in the
in-memory benchmark cache, so the first convolution with those parameters is a cache hit.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from .._types import normalize_dtype
from ..errors import OutOfMemoryError
from ..ffi import library as _lib
from ..runtime.handle import get_handle
from ..runtime.memory import (DeviceLike, allocate, callers_device, ensure_device, mem_get_info,
                              normalize_device, restore_device, stream_synchronize)
from ..runtime.tensor import span_elements
from ..tuning import db as tuning_db
from ..tuning import records as tuning_records
from .cache import caches
from ..engines.problem import ConvolutionArgs, ConvolutionParams, role_bytes
from ..engines.registry import engine_for

__all__ = ["preload", "PreloadReport", "params_from_dict"]

log = logging.getLogger("pycudnn")

#: at most this many bytes of scratch for the launches (also at most a quarter of free memory);
#: records needing more are rebuilt but not launched (their kernels load on their first call)
DEFAULT_MAX_BYTES = 1 << 30

_FIELDS = {f.name: f for f in dataclasses.fields(ConvolutionParams)}


@dataclasses.dataclass(frozen=True)
class PreloadReport:
    """What `preload()` did (counts of tuning database records)."""

    device: int
    #: records stored for this GPU model and cuDNN version (the others are left alone)
    applicable: int = 0
    #: rebuilt and placed in the benchmark cache (launched or not)
    restored: int = 0
    #: of the restored, run once on scratch buffers (their kernels are loaded)
    launched: int = 0
    #: already in the benchmark cache of this process (left as they were)
    already_cached: int = 0
    #: no longer rebuild here: removed from the database, as a call would (logged)
    dropped: int = 0
    #: unreadable, or out of memory while rebuilding: left for the first call
    skipped: int = 0
    seconds: float = 0.0

    def __str__(self) -> str:
        return (f"preloaded {self.restored} of {self.applicable} tuning records for device "
                f"{self.device} ({self.launched} launched, {self.already_cached} already cached, "
                f"{self.dropped} dropped, {self.skipped} skipped) in {self.seconds * 1e3:.0f} ms")


def params_from_dict(data: dict[str, Any], device: int) -> ConvolutionParams:
    """The `ConvolutionParams` of a database entry's ``params``
    (the inverse of `pycudnn.tuning.records.params_to_dict()`), on device ``device``.

    The entry is untrusted input: every field is parsed as strictly as a call's arguments are,
    and only values a call can produce are accepted (see
    `pycudnn.tuning.records.params_from_dict()`), so scratch sizes and launches never rest on a
    value no call would give (``"double"`` for ``"float64"``, a negative size, an output shape
    the geometry does not give, ...).

    Raises:
        TypeError, ValueError: a field is missing, unknown, of the wrong kind or out of range.
    """
    return tuning_records.params_from_dict(data, device)


def _scratch_bytes(p: ConvolutionParams) -> list[int]:
    """Bytes of each pointer role the engines read: x, w, y, z, bias (z and bias 0 if unused)."""
    x, w, y = (role_bytes(p, role) for role in ("x", "w", "y"))
    z = 0
    if p.epilogue == "add_relu" and p.z_strides:
        z = span_elements(p.output_shape, p.z_strides) * normalize_dtype(p.dtype).itemsize
    bias = p.output_shape[1] * 8 if p.epilogue else 0  # 8 bytes an element: any bias dtype fits
    return [x, w, y, z, bias]


class _Scratch:
    """One device buffer per pointer role, grown on demand and reused across records."""

    def __init__(self, device: int) -> None:
        self.device = device
        self.buffers: list[Any] = [None] * 5

    def pointers(self, sizes: list[int]) -> list[int]:
        ptrs = []
        for i, n in enumerate(sizes):
            buf = self.buffers[i]
            if n and (buf is None or buf.nbytes < n):
                if buf is not None:
                    self.buffers[i] = None
                    buf.close()
                buf = self.buffers[i] = allocate(n, self.device, 0)
            ptrs.append(buf.ptr if n else 0)
        return ptrs

    def close(self) -> None:
        for buf in self.buffers:
            if buf is not None:
                buf.close()
        self.buffers = [None] * 5


def preload(device: DeviceLike | None = None, *, launch: bool = True, max_bytes: int | None = None) -> PreloadReport:
    """Rebuild the tuning database's records for ``device`` and put them in the benchmark cache.

    After it, the first ``benchmark=True`` call with stored parameters runs the stored choice from
    the in-memory cache, with its kernels already loaded: no search, no rebuild, no lazy loading.
    Safe to call from a background thread and while other threads convolve (each record is
    rebuilt under its key's search lock; records already cached are left alone), but not while a
    CUDA graph is being captured: it launches work and allocates on the legacy default stream,
    which a capture in another thread does not allow (preload before capturing). Nothing happens
    when the tuning database is off. Records that no longer rebuild are dropped from the database
    and logged, as a convolution would; nothing raises for a record.

    Args:
        device: the device (ordinal or cuda.core ``Device``; default the current device).
        launch: run each record once on scratch buffers so CUDA loads its kernels now (the costly
            part); False only rebuilds the plans.
        max_bytes: scratch memory for the launches (default the smaller of 1 GiB and a quarter of
            the free memory); records that need more are rebuilt but not launched.

    Returns:
        A `PreloadReport` (counts and seconds; ``str()`` gives
        one line).

    Raises:
        TypeError, ValueError: ``device`` is not a device of this machine, or ``launch`` /
            ``max_bytes`` are not what is described above.
        NoDeviceError: no usable CUDA device.
    """
    if type(launch) is not bool:
        raise TypeError(f"launch: expected a bool, got {type(launch).__name__}")
    if max_bytes is not None and (type(max_bytes) is not int or max_bytes < 0):
        raise ValueError(f"max_bytes: expected an int >= 0 or None, got {max_bytes!r}")
    dev = normalize_device(device, "device", "pycudnn.preload")
    t0 = time.perf_counter()
    if not tuning_db.enabled():
        return PreloadReport(dev)
    prev = callers_device()
    counts = dict(applicable=0, restored=0, launched=0, already_cached=0, dropped=0, skipped=0)
    scratch = _Scratch(dev)
    try:
        ensure_device(dev)
        ident = tuning_db.device_identity(dev)
        version = _lib.version()
        if max_bytes is None:
            max_bytes = min(DEFAULT_MAX_BYTES, mem_get_info(dev)[0] // 4)
        handle = get_handle(dev, 0)
        for entry in tuning_db.entries():
            if (entry.get("schema") != tuning_records.SCHEMA_VERSION or entry.get("gpu") != ident
                    or entry.get("cudnn_version") != version):
                continue
            counts["applicable"] += 1
            outcome = _preload_one(entry, dev, handle, scratch, launch, max_bytes)
            for key in outcome:
                counts[key] += 1
        stream_synchronize(0)
    finally:
        scratch.close()
        restore_device(prev)
    report = PreloadReport(dev, seconds=time.perf_counter() - t0, **counts)
    log.info("%s", report)
    return report


def _preload_one(entry: dict[str, Any], dev: int, handle: int, scratch: _Scratch, launch: bool,
                 max_bytes: int) -> tuple[str, ...]:
    """Rebuild (and launch) one entry; returns the report counters it adds to."""
    try:
        params = params_from_dict(entry["params"], dev)
        engine = engine_for(params.engine)
        cache = caches[params.direction]
        sizes = _scratch_bytes(params)
    except Exception as exc:  # noqa: BLE001 - a record from disk may be hand-edited or newer
        log.info("preload: skipping an unreadable tuning record (%s: %s)", type(exc).__name__, exc)
        return ("skipped",)
    if cache.get(params) is not None:
        return ("already_cached",)
    with cache.search_lock(params):
        if cache.get(params) is not None:  # a convolution got there first
            return ("already_cached",)
        run = launch and sum(sizes) <= max_bytes
        x = w = y = z = bias = 0
        if run:
            try:
                x, w, y, z, bias = scratch.pointers(sizes)
            except OutOfMemoryError:
                run = False  # rebuild it all the same; its kernels load on the first call
        try:
            args = ConvolutionArgs(params=params, handle=handle, stream=0, x=x, w=w, y=y,
                                   benchmark=True, z=z, bias=bias)
            record = engine.restore(args, dict(entry["record"]))
        except OutOfMemoryError:
            return ("skipped",)
        except Exception as exc:  # noqa: BLE001 - stale record: drop it as a call would
            return _drop(params, exc)
        launched = False
        if run:
            try:
                engine.run(args, record)
                launched = True
            except OutOfMemoryError:
                pass  # the record is fine; its kernels load on the first call instead
            except Exception as exc:  # noqa: BLE001
                return _drop(params, exc)
        cache.insert(params, record)
    return ("restored", "launched") if launched else ("restored",)


def _drop(params: ConvolutionParams, exc: BaseException) -> tuple[str, ...]:
    """Forget a record that no longer rebuilds or runs here (logged, as a convolution would)."""
    log.warning("tuning database: dropping the record for %s (%s: %s)", params.short(),
                type(exc).__name__, str(exc).split("\n", 1)[0])
    tuning_db.drop(params)
    return ("dropped",)
