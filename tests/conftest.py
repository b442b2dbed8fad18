"""Shared test set-up: the ``gpu`` marker skips cleanly where no CUDA device is usable, and the
run's summary counts those skips in one line instead of listing each."""

from __future__ import annotations

import functools
import os
import tempfile

import pytest

# Tests must not read or write the user's tuning database (~/.cache/pycudnn): a record left by an
# earlier run would let a later run skip the searches it means to test.
os.environ.setdefault("PYCUDNN_CACHE_DIR", tempfile.mkdtemp(prefix="pycudnn-test-cache-"))


@functools.lru_cache(maxsize=None)
def gpu_reason() -> str | None:
    """None when a CUDA device is usable, else why not (shown in the skip reason)."""
    try:
        from cuda.bindings import runtime as rt
    except Exception as exc:  # pragma: no cover - cuda-python is a dependency
        return f"cuda.bindings not importable: {exc}"
    try:
        err, count = rt.cudaGetDeviceCount()
    except Exception as exc:
        return f"cudaGetDeviceCount raised {type(exc).__name__}: {exc}"
    if int(err) != 0:
        return f"no usable CUDA driver/device ({err.name})"
    if count < 1:
        return "no CUDA device"
    return None


def has_gpu() -> bool:
    return gpu_reason() is None


GPU_SKIP = "needs a CUDA GPU: "


def pytest_collection_modifyitems(config, items):
    reason = gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=GPU_SKIP + reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """One line for the tests skipped for want of a GPU, one per other reason (pyproject's
    ``-r`` options leave skips out of pytest's own summary, which lists each test's reason)."""
    reasons: dict[str, int] = {}
    gpu = 0
    no_gpu = gpu_reason() is not None
    for report in terminalreporter.stats.get("skipped", []):
        reason = _skip_reason(report)
        if no_gpu and ("gpu" in getattr(report, "keywords", ()) or reason.startswith(GPU_SKIP)):
            gpu += 1
        else:
            reasons[reason] = reasons.get(reason, 0) + 1
    if not gpu and not reasons:
        return
    terminalreporter.section("skipped", sep="-")
    if gpu:
        terminalreporter.write_line(f"{gpu} GPU tests skipped ({GPU_SKIP}{gpu_reason()}); they "
                                    f"run on a machine with one")
    for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{n} skipped: {reason}")
