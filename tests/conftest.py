"""Shared test set-up: the ``gpu`` marker skips cleanly where no CUDA device is usable."""

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


def pytest_collection_modifyitems(config, items):
    reason = gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"gpu test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
