"""Shared test set-up: the ``gpu`` marker skips cleanly where no CUDA device is usable, and the
run ends with one summary block: those skips counted in one line, the other skips once per
reason, and the fuzz suites' counts."""

from __future__ import annotations

import functools
import os
import re
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
        try:  # pycudnn's own words for it ("no NVIDIA driver found (libcuda.so.1)", ...)
            from pycudnn.runtime.memory import no_device_reason

            reason = no_device_reason()
        except Exception:
            reason = None
        return reason or f"no usable CUDA driver/device ({err.name})"
    if count < 1:
        return "no CUDA device"
    return None


@pytest.fixture
def driver_library_found():
    """`driver_found()` answers True for the test (a faked driver on a machine without one), and
    its own answer again after it."""
    from pycudnn.runtime.memory import errors

    before = errors.driver_found()
    errors.assume_driver_found(True)
    yield
    errors.assume_driver_found(before)


@pytest.fixture
def fresh_torch_calls():
    """pycudnn.torch's remembered call signatures forgotten before the test and after it: what a
    CPU test standing in for the GPU paths remembers does not outlive it."""
    pytest.importorskip("torch")
    from pycudnn.torch import calls

    calls.clear_cache()
    yield
    calls.clear_cache()


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


_NOT_INSTALLED = re.compile(r"could not import '([\w.]+)': No module named '([\w.]+)'$")


def _skip_reason(report) -> str:
    """The reason a test was skipped, one spelling per reason: pytest.importorskip's "could not
    import 'x': No module named 'x'" reads as the suite's own "could not import 'x' (not
    installed)"."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    reason = reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason
    missing = _NOT_INSTALLED.match(reason)
    if missing and missing.group(1) == missing.group(2):
        return f"could not import '{missing.group(1)}' (not installed)"
    return reason


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The run's one summary block: the tests skipped for want of a GPU in one line, the other
    skips once per reason (pyproject's ``-r`` options leave skips out of pytest's own summary,
    which lists each test's reason), then the lines of every plugin that has a
    ``summary_lines()`` method (the fuzz suites' counts, the GPU reliability figures)."""
    reasons: dict[str, int] = {}
    gpu = 0
    no_gpu = gpu_reason() is not None
    for report in terminalreporter.stats.get("skipped", []):
        reason = _skip_reason(report)
        if no_gpu and ("gpu" in getattr(report, "keywords", ()) or reason.startswith(GPU_SKIP)):
            gpu += 1
        else:
            reasons[reason] = reasons.get(reason, 0) + 1
    lines = []
    if gpu:
        lines.append(f"{gpu} GPU tests skipped ({GPU_SKIP}{gpu_reason()}); they run on a machine "
                     f"with one")
    for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        lines.append(f"{n} skipped: {reason}")
    for plugin in config.pluginmanager.get_plugins():
        summary = getattr(plugin, "summary_lines", None)
        if callable(summary) and not isinstance(plugin, type):
            lines.extend(summary())
    if not lines:
        return
    terminalreporter.section("pycudnn summary", sep="-")
    for line in lines:
        terminalreporter.write_line(line)
