"""The ``pycudnn`` logger and ``PYCUDNN_LOG`` (subprocesses, so the environment is fresh)."""

from __future__ import annotations

import io
import logging
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent


def run(code: str, level: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYCUDNN_LOG"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if level is not None:
        env["PYCUDNN_LOG"] = level
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


LOAD = "import pycudnn; pycudnn.cudnn_version(); print('done')"


def test_debug_prints_pycudnn_debug_lines():
    proc = run(LOAD, "debug")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("pycudnn DEBUG")]
    assert any("loaded cuDNN 9." in line and "libcudnn" in line for line in lines), proc.stderr
    assert proc.stdout.strip() == "done"


def test_nothing_without_the_variable():
    proc = run(LOAD + "; import sys; print('pycudnn._logging' in sys.modules)", None)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.split() == ["done", "False"]  # the module is not even imported
    assert run(LOAD, "").stderr == ""


def test_level_filters():
    proc = run(LOAD, "INFO")
    assert proc.returncode == 0 and "DEBUG" not in proc.stderr, proc.stderr
    code = ("import logging, pycudnn; log = logging.getLogger('pycudnn'); "
            "log.info('an info line'); log.warning('a warning line'); log.debug('hidden')")
    err = run(code, "warning").stderr
    assert "pycudnn WARNING" in err and "a warning line" in err
    assert "an info line" not in err and "hidden" not in err


def test_bad_value_warns_and_import_still_works():
    proc = run("import pycudnn; print(pycudnn.__version__)", "loud")
    assert proc.returncode == 0
    assert "PYCUDNN_LOG: unknown level 'loud'" in proc.stderr
    assert proc.stdout.strip()


def test_import_stays_cheap_and_lazy_with_logging_on():
    code = ("import time; t = time.perf_counter(); import pycudnn; dt = time.perf_counter() - t; "
            "import pycudnn.ffi.library as L; print(L.is_loaded(), dt)")
    proc = run(code, "debug")
    assert proc.returncode == 0, proc.stderr
    loaded, seconds = proc.stdout.split()
    assert loaded == "False"  # configuring logging does not open libcudnn
    assert float(seconds) < 0.2


def test_configure_in_process():
    from pycudnn import _logging as L

    logger = logging.getLogger("pycudnn")
    old_level, old_handlers = logger.level, list(logger.handlers)
    buf = io.StringIO()
    try:
        L.configure("debug", stream=buf)
        L.configure(logging.INFO, stream=buf)  # replaces its handler, never adds a second
        assert sum(h is L.handler() for h in logger.handlers) == 1
        assert len(logger.handlers) == len(old_handlers) + 1
        logger.info("hello %d", 42)
        logger.debug("not shown")
        assert "pycudnn INFO" in buf.getvalue() and "hello 42" in buf.getvalue()
        assert "not shown" not in buf.getvalue()
        with pytest.raises(ValueError, match="unknown level 'chatty'"):
            L.configure("chatty")
    finally:
        L.remove_handler()
        assert L.handler() is None
        logger.setLevel(old_level)
        assert logger.handlers == old_handlers
