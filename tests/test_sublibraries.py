"""cuDNN's sub-libraries opened ahead of time on a background thread (pycudnn.ffi.sublibraries),
each case in a fresh interpreter: what a process has opened is process-wide. libcudnn and its
sub-libraries load here without a GPU."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from pycudnn.ffi import library

ROOT = pathlib.Path(__file__).resolve().parent.parent

try:
    library.lib()
except Exception as exc:  # noqa: BLE001 - no libcudnn: nothing to open
    pytest.skip(f"libcudnn does not load here: {exc}", allow_module_level=True)


def _run(code: str, **env: str) -> str:
    full = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                **env)
    if "PYCUDNN_PRELOAD" not in env:
        full.pop("PYCUDNN_PRELOAD", None)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=full, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


OPENED = """
        def opened():
            with open("/proc/self/maps") as f:
                maps = f.read()
            return sorted({n for n in sublibraries.SUBLIBRARIES if f"/{n}.so." in maps})
"""  # indented as the code it is pasted into


def test_an_integration_import_opens_the_sub_libraries_in_the_background():
    out = _run("""
        import json
        import pycudnn
        from pycudnn.ffi import library, sublibraries
    """ + OPENED + """
        pycudnn.convolution, pycudnn.config, pycudnn.CudnnError
        before = [sublibraries._thread is None, library.is_loaded(), opened()]
        import pycudnn.cupy_compat  # (without CuPy too)
        sublibraries.wait()
        print(json.dumps([before, library.is_loaded(), opened()]))
    """)
    before, loaded, names = json.loads(out)
    assert before == [True, False, []]  # importing pycudnn and reaching its names open nothing
    assert loaded
    for name in ("libcudnn_graph", "libcudnn_heuristic", "libcudnn_engines_precompiled"):
        assert name in names, out


def test_the_variable_turns_it_off():
    out = _run("""
        import pycudnn.cupy_compat
        from pycudnn.ffi import library, sublibraries
    """ + OPENED + """
        sublibraries.wait()
        print(sublibraries._thread, opened())
    """, PYCUDNN_PRELOAD="0")
    assert out == "None []"


def test_a_fork_waits_for_the_thread():
    """The dynamic loader's lock must not be held by the thread when a process forks: the
    child, whose only thread is the forking one, would wait for it forever on its next dlopen."""
    out = _run("""
        import os
        from pycudnn.ffi import sublibraries
        sublibraries.start()
        pid = os.fork()
        if pid == 0:
            import ctypes
            ctypes.CDLL("libm.so.6")  # a dlopen in the child
            os._exit(0)
        print(sublibraries._thread.is_alive(), os.waitpid(pid, 0)[1])
    """)
    assert out == "False 0"
