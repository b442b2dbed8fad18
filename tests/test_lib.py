"""The loader, the prototype table and the error hierarchy, against the real libcudnn (no GPU)."""

from __future__ import annotations

import ctypes
import inspect
import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pycudnn.ffi import library as _lib
from pycudnn import errors
from pycudnn._types import LibraryProperty, Status
from pycudnn.errors import (CudnnAllocationError, CudnnBadParamError, CudnnError,
                            CudnnExecutionError, CudnnInternalError, CudnnNotFoundError,
                            CudnnNotInitializedError, CudnnNotSupportedError, NoAlgorithmError,
                            OutOfMemoryError, PycudnnError, error_class_for_status)

REPO = Path(__file__).resolve().parents[1]


def run_python(code: str, **env_overrides: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter that imports this checkout's pycudnn."""
    env = dict(os.environ)
    env.pop("PYCUDNN_LIBRARY", None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_overrides)
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


# ---- lazy loading -------------------------------------------------------------------------------

IMPORT_PROBE = r"""
import json, time
t0 = time.perf_counter()
import pycudnn
import_s = time.perf_counter() - t0
dir(pycudnn)
import pycudnn.ffi.library as L
import pycudnn.cudnn.descriptors, pycudnn.errors, pycudnn._types  # still no library
def mapped():
    with open("/proc/self/maps") as f:
        return "libcudnn" in f.read()
state = {"import_s": import_s, "loaded_after_import": L.is_loaded(),
         "mapped_after_import": mapped()}
pycudnn.cudnn_version()  # positive control: now the library is open and mapped
state.update(loaded_after_call=L.is_loaded(), mapped_after_call=mapped())
print(json.dumps(state))
"""


def test_import_loads_no_libcudnn_and_is_fast():
    best = None
    for _ in range(3):  # a cold file cache can slow the first import; keep the best of three
        proc = run_python(IMPORT_PROBE)
        assert proc.returncode == 0, proc.stderr
        state = json.loads(proc.stdout.strip().splitlines()[-1])
        assert state["loaded_after_import"] is False
        assert state["mapped_after_import"] is False
        assert state["loaded_after_call"] is True
        assert state["mapped_after_call"] is True
        best = state["import_s"] if best is None else min(best, state["import_s"])
    assert best < 0.2, f"import pycudnn took {best:.3f} s"


def test_versions_are_sane():
    v = _lib.version()
    assert v >= _lib.MIN_VERSION == 90000
    major, minor, patch = _lib.version_tuple()
    assert major >= 9 and 0 <= minor < 100 and 0 <= patch < 100
    assert major * 10000 + minor * 100 + patch == v
    # cross-check against cudnnGetProperty, a different entry point
    for prop, expected in ((LibraryProperty.MAJOR_VERSION, major),
                           (LibraryProperty.MINOR_VERSION, minor),
                           (LibraryProperty.PATCH_LEVEL, patch)):
        out = ctypes.c_int(-1)
        _lib.check(_lib.lib().cudnnGetProperty(int(prop), ctypes.byref(out)), "cudnnGetProperty")
        assert out.value == expected
    path = _lib.library_path()
    assert os.path.basename(path).startswith("libcudnn") and os.path.exists(path)
    cudart = _lib.cudart_version()
    assert 11000 <= cudart < 100000  # e.g. 12090 for CUDA 12.9
    assert _lib.is_loaded()


def test_pycudnn_library_points_at_the_real_file(monkeypatch):
    real = _lib.library_path()
    monkeypatch.setenv("PYCUDNN_LIBRARY", real)
    with _lib.fresh_load():  # the loaded one is back afterwards
        library = _lib.lib()
    assert library.found_via == f"PYCUDNN_LIBRARY={real}"
    assert library.path == real
    assert int(library.cudnnGetVersion()) == _lib.version()


WHEEL_PROBE = r"""
import json, sys
from pycudnn.ffi import library as _lib
from pycudnn.cudnn.descriptors import TensorDescriptor
library = _lib.lib()
d = TensorDescriptor((2, 3, 4, 5), "float32")  # its sub-libraries load: a descriptor is made
print(json.dumps({"via": library.found_via, "path": library.path,
                  "wheel": _lib.wheel_library_path(),
                  "cuda_python": sorted(m for m in sys.modules if m.startswith("cuda."))}))
"""


def test_the_cudnn_wheel_is_opened_by_its_path_without_cuda_python():
    try:
        _lib.wheel_library_path()
    except FileNotFoundError:
        pytest.skip("no NVIDIA cuDNN wheel here")
    proc = run_python(WHEEL_PROBE)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["via"] == "the NVIDIA cuDNN wheel (nvidia/cudnn/lib/libcudnn.so.9)"
    assert out["path"] == out["wheel"] and out["path"].endswith("nvidia/cudnn/lib/libcudnn.so.9")
    assert out["cuda_python"] == []  # cuda.pathfinder's imports (~40-50 ms) are not paid


NOT_FOUND_PROBE = r"""
import sys
# as on a machine without the NVIDIA wheels: no nvidia.cudnn package, and the pathfinder step
# cannot even be imported
sys.modules["nvidia.cudnn"] = None
sys.modules["cuda.pathfinder"] = None
from pycudnn.ffi import library as _lib
from pycudnn import errors
try:
    _lib.lib()
except errors.CudnnNotFoundError as exc:
    assert isinstance(exc, ImportError)
    assert not _lib.is_loaded()
    print("NOT-FOUND")
    print(exc)
else:
    print("LOADED", _lib.library_path())
"""


def test_missing_library_error_lists_every_place_tried():
    proc = run_python(NOT_FOUND_PROBE, LD_LIBRARY_PATH="")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    if out.startswith("LOADED"):
        pytest.skip(f"a libcudnn is on the system's default search path: {out.strip()}")
    assert out.startswith("NOT-FOUND"), out
    lines = out.splitlines()
    tried = [line for line in lines if line.startswith("  - ")]
    assert len(tried) == 4, out
    assert tried[0].startswith("  - the NVIDIA cuDNN wheel (nvidia/cudnn/lib/libcudnn.so.9): "
                               "FileNotFoundError: no NVIDIA cuDNN wheel"), tried[0]
    assert tried[1].startswith('  - cuda.pathfinder.load_nvidia_dynamic_lib("cudnn"): ')
    assert "ImportError" in tried[1] or "ModuleNotFoundError" in tried[1]
    assert tried[2].startswith("  - libcudnn.so.9: OSError")
    assert tried[3].startswith("  - libcudnn.so: OSError")
    assert "could not load libcudnn; tried, in order:" in out
    assert "pip install nvidia-cudnn-cu12" in out and "set PYCUDNN_LIBRARY" in out


# ---- PYCUDNN_LIBRARY is the only place tried when set -------------------------------------------

ENV_LIBRARY_PROBE = r"""
import json
import pycudnn
import pycudnn.ffi.library as L
state = {"loaded_after_import": L.is_loaded()}
for attempt in range(2):  # the second call must not pick up another cuDNN either
    try:
        path = pycudnn.library_path()
    except pycudnn.CudnnNotFoundError as exc:
        state[f"error{attempt}"] = str(exc)
    else:
        state[f"loaded{attempt}"] = path
print(json.dumps(state))
"""


def _env_library_error(monkeypatch, value: str) -> str:
    """The CudnnNotFoundError message of loading with PYCUDNN_LIBRARY=value (in this process)."""
    monkeypatch.setenv("PYCUDNN_LIBRARY", value)
    with _lib.fresh_load():  # the loaded one is back afterwards
        with pytest.raises(CudnnNotFoundError) as info:
            _lib.lib()
        assert not _lib.is_loaded()
    return str(info.value)


def test_pycudnn_library_that_does_not_load_is_an_error_not_a_fallback():
    # Another cuDNN (the wheel's) loads in this environment: a missing PYCUDNN_LIBRARY must not be
    # passed over silently in favour of it, or the user runs a cuDNN they did not ask for.
    assert _lib.library_path()
    missing = "/nonexistent/cudnn-9.1.0/lib/libcudnn.so.9"
    proc = run_python(ENV_LIBRARY_PROBE, PYCUDNN_LIBRARY=missing)
    assert proc.returncode == 0, proc.stderr
    state = json.loads(proc.stdout.strip().splitlines()[-1])
    assert state["loaded_after_import"] is False  # import stays lazy
    assert "loaded0" not in state and "loaded1" not in state, state
    for message in (state["error0"], state["error1"]):
        lines = message.splitlines()
        assert lines[0] == (f"could not load the libcudnn that PYCUDNN_LIBRARY names ({missing}); "
                            "pycudnn does not fall back to another cuDNN while it is set:")
        assert lines[1] == (f"  - PYCUDNN_LIBRARY={missing}: OSError: {missing}: cannot open "
                            "shared object file: No such file or directory")
        assert lines[2].startswith("fix the path, or unset PYCUDNN_LIBRARY")
        assert len(lines) == 3  # nothing else was tried
    # the fixed parts are quoted in the troubleshooting page
    trouble = (REPO / "docs" / "troubleshooting.md").read_text()
    assert lines[0].replace(missing, "/opt/cudnn/libcudnn.so.9") in trouble
    assert lines[2] in trouble


def test_relative_pycudnn_library_is_refused_naming_the_absolute_path(monkeypatch, tmp_path):
    real = _lib.library_path()
    # a real libcudnn at the relative path: refused all the same, without being opened
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libcudnn.so.9").symlink_to(real)
    monkeypatch.chdir(tmp_path)
    message = _env_library_error(monkeypatch, "lib/libcudnn.so.9")
    assert (f"  - PYCUDNN_LIBRARY=lib/libcudnn.so.9: refused: not an absolute path (relative to "
            f"the current directory it would be {tmp_path}/lib/libcudnn.so.9); set "
            "PYCUDNN_LIBRARY to the absolute path of libcudnn.so.9") in message.splitlines()
    # a bare name is relative too (it would go through the loader's search path)
    assert "refused: not an absolute path" in _env_library_error(monkeypatch, "libcudnn.so.9")


def test_pycudnn_library_that_is_not_cudnn_is_an_error(monkeypatch):
    import _ctypes  # a shared object that loads and has no cudnnGetVersion

    message = _env_library_error(monkeypatch, _ctypes.__file__)
    assert f"  - PYCUDNN_LIBRARY={_ctypes.__file__}: loaded {_ctypes.__file__} but it has no " \
           "cudnnGetVersion" in message.splitlines()


def test_empty_pycudnn_library_means_unset(monkeypatch):
    real = _lib.library_path()
    monkeypatch.setenv("PYCUDNN_LIBRARY", "")
    with _lib.fresh_load():
        assert _lib.lib().path == real


# ---- the prototype table ------------------------------------------------------------------------

def _signature_comments() -> dict[str, str]:
    """name -> the C signature in the comment above its PROTOTYPES row."""
    src = inspect.getsource(_lib)
    body = src[src.index("PROTOTYPES: dict"):]
    body = body[:body.index("\n}\n")]
    comment: list[str] = []
    out: dict[str, str] = {}
    for line in body.splitlines()[1:]:
        s = line.strip()
        if s.startswith("#"):
            text = s[1:].strip()
            if not text.startswith("---"):
                comment.append(text)
            continue
        m = re.match(r'"(\w+)":', s)
        if m:
            out[m.group(1)] = " ".join(comment)
            comment = []
    return out


_HANDLES = ("cudnnHandle_t", "cudaStream_t")


def _expected_ctype(c_type: str, is_return: bool):
    """The ctypes type(s) a C type must be declared as."""
    t = c_type.replace("const", " ").split()
    t = " ".join(t)
    pointer = "*" in t or "[]" in t
    words = t.replace("*", " ").replace("[]", " ").split()
    base = ("unsigned long long" if words[:3] == ["unsigned", "long", "long"]
            else words[0] if words else "")
    if pointer:
        if base == "char":
            return (ctypes.c_char_p,)
        return ("pointer",)
    if base.endswith("Descriptor_t") or base in _HANDLES:
        return (ctypes.c_void_p,)
    if base == "void":
        return (None,) if is_return else ()
    simple = {"size_t": ctypes.c_size_t, "int64_t": ctypes.c_int64, "double": ctypes.c_double,
              "float": ctypes.c_float, "int": ctypes.c_int, "unsigned long long": ctypes.c_ulonglong}
    if base in simple:
        return (simple[base],)
    assert base.endswith("_t") or base == "libraryPropertyType", f"unknown C type {c_type!r}"
    return (ctypes.c_int,)  # C enums, including cudnnStatus_t


def _split_params(params: str) -> list[str]:
    params = params.strip()
    if params in ("", "void"):
        return []
    out = []
    for p in params.split(","):
        words = p.replace("[]", " []").replace("*", " * ").split()
        # drop the parameter's name (the last word that is not [] or *)
        idx = max(i for i, w in enumerate(words) if w not in ("[]", "*"))
        out.append(" ".join(words[:idx] + words[idx + 1:]))
    return out


def _matches(declared, expected) -> bool:
    if expected == ("pointer",):
        return declared in (ctypes.c_void_p, ctypes.c_char_p) or (
            isinstance(declared, type) and issubclass(declared, ctypes._Pointer))
    return declared in expected


def test_every_prototype_has_a_signature_comment():
    sigs = _signature_comments()
    assert set(sigs) == set(_lib.PROTOTYPES)


@pytest.mark.parametrize("name", sorted(_lib.PROTOTYPES))
def test_prototype_row_resolves_and_matches_its_c_signature(name):
    restype, argtypes = _lib.PROTOTYPES[name]
    fn = getattr(_lib.lib(), name)  # AttributeError if libcudnn lacks the symbol
    assert fn.restype is restype
    assert list(fn.argtypes) == list(argtypes)
    assert getattr(_lib.lib(), name) is fn  # bound once, then cached

    sig = _signature_comments()[name]
    m = re.fullmatch(r"(.+?)\b(\w+)\s*\((.*)\)", sig)
    assert m and m.group(2) == name, f"comment above {name!r} is not its signature: {sig!r}"
    ret, params = m.group(1), _split_params(m.group(3))
    expected_ret = _expected_ctype(ret, is_return=True)
    # never ctypes' default int for a function returning size_t or a pointer
    assert _matches(restype, expected_ret), f"{name}: restype {restype} for C {ret.strip()!r}"
    assert len(params) == len(argtypes), f"{name}: {len(argtypes)} argtypes for {params}"
    for i, (c_type, declared) in enumerate(zip(params, argtypes)):
        expected = _expected_ctype(c_type, is_return=False)
        assert _matches(declared, expected), f"{name} argument {i}: {declared} for C {c_type!r}"


def test_unknown_function_is_refused():
    with pytest.raises(AttributeError, match="not in pycudnn's prototype table"):
        _lib.lib().cudnnSomethingThatDoesNotExist


# ---- errors -------------------------------------------------------------------------------------

@pytest.mark.parametrize("status, cls", [
    (1001, CudnnNotInitializedError), (1008, CudnnNotInitializedError),
    (2000, CudnnBadParamError), (2002, CudnnBadParamError), (2012, CudnnBadParamError),
    (3000, CudnnNotSupportedError), (3007, CudnnNotSupportedError),
    (4000, CudnnInternalError), (4001, CudnnInternalError), (4005, CudnnInternalError),
    (4003, CudnnAllocationError), (4004, CudnnAllocationError),
    (5000, CudnnExecutionError), (5003, CudnnExecutionError),
    (0, CudnnError), (9999, CudnnError), (-1, CudnnError),
])
def test_error_class_for_status(status, cls):
    assert error_class_for_status(status) is cls


def test_every_status_maps_to_its_family():
    families = {1: CudnnNotInitializedError, 2: CudnnBadParamError, 3: CudnnNotSupportedError,
                4: CudnnInternalError, 5: CudnnExecutionError}
    for s in Status:
        if s == Status.SUCCESS:
            continue
        cls = error_class_for_status(int(s))
        assert issubclass(cls, families[int(s) // 1000]), s
        assert _lib.status_name(int(s)) == "CUDNN_STATUS_" + s.name
    assert issubclass(CudnnAllocationError, CudnnInternalError)
    assert _lib.status_name(7777) == "CUDNN_STATUS_UNKNOWN_7777"
    assert issubclass(CudnnNotFoundError, ImportError)
    assert issubclass(OutOfMemoryError, MemoryError)
    assert issubclass(CudnnError, PycudnnError) and issubclass(PycudnnError, RuntimeError)


def test_real_failure_message_has_function_status_and_reason():
    L = _lib.lib()
    h = ctypes.c_void_p()
    _lib.check(L.cudnnCreateConvolutionDescriptor(ctypes.byref(h)), "cudnnCreateConvolutionDescriptor")
    try:
        status = L.cudnnSetConvolutionGroupCount(h, 0)
        assert status == Status.BAD_PARAM
        with pytest.raises(CudnnBadParamError) as info:
            _lib.check(status, "cudnnSetConvolutionGroupCount", "groups: 0")
    finally:
        L.cudnnDestroyConvolutionDescriptor(h)
    e = info.value
    assert e.status == 2000 and e.status_name == "CUDNN_STATUS_BAD_PARAM"
    assert e.function == "cudnnSetConvolutionGroupCount"
    # cudnnGetLastErrorString: "group count must be >= 1 ..." (9.28) or "groupCount < 1" (9.19)
    assert "group count must be >= 1" in e.reason or "groupCount < 1" in e.reason
    assert str(e).startswith("cudnnSetConvolutionGroupCount failed with CUDNN_STATUS_BAD_PARAM "
                             "(2000): " + e.reason.split("\n")[0])
    assert str(e).endswith("\ngroups: 0")
    # cuDNN clears its message once read: the next failure does not inherit a stale reason
    assert _lib.last_error_string() == ""


def test_checked_calls_raise_naming_the_function_and_pass_success_through():
    L = _lib.lib()
    h = ctypes.c_void_p()
    assert L.checked.cudnnCreateConvolutionDescriptor(ctypes.byref(h)) is None and h.value
    try:
        with pytest.raises(CudnnBadParamError) as info:
            L.checked.cudnnSetConvolutionGroupCount(h, 0)
        assert L.checked.cudnnSetConvolutionGroupCount(h, 2) is None
    finally:
        L.cudnnDestroyConvolutionDescriptor(h)
    e = info.value
    assert e.function == "cudnnSetConvolutionGroupCount" and e.status == Status.BAD_PARAM
    assert "group count must be >= 1" in e.reason or "groupCount < 1" in e.reason
    assert L.checked.cudnnSetConvolutionGroupCount is L.checked.cudnnSetConvolutionGroupCount


def test_checked_calls_exist_only_for_table_functions_that_return_a_status():
    L = _lib.lib()
    with pytest.raises(AttributeError, match="returns no cudnnStatus_t"):
        L.checked.cudnnGetVersion  # noqa: B018 - the attribute access is the test
    with pytest.raises(AttributeError, match="not in pycudnn's prototype table"):
        L.checked.cudnnNoSuchFunction  # noqa: B018


def test_check_passes_success_through():
    assert _lib.check(0, "cudnnAnything") is None


def test_cudnn_error_message_and_add_context():
    e = CudnnBadParamError(2000, "cudnnFoo", "CUDNN_STATUS_BAD_PARAM", "x <= 0")
    assert str(e) == "cudnnFoo failed with CUDNN_STATUS_BAD_PARAM (2000): x <= 0"
    assert e.add_context("input: (1, 2, 3)", "algo: 1") is e
    assert e.add_context("repro: conv(...)") is e
    assert str(e) == ("cudnnFoo failed with CUDNN_STATUS_BAD_PARAM (2000): x <= 0\n"
                      "input: (1, 2, 3)\nalgo: 1\nrepro: conv(...)")
    assert e.context == ["input: (1, 2, 3)", "algo: 1", "repro: conv(...)"]
    # no reason: no dangling colon; no symbolic name given: the status number stands in
    assert (str(CudnnError(3000, "cudnnBar", "CUDNN_STATUS_NOT_SUPPORTED"))
            == "cudnnBar failed with CUDNN_STATUS_NOT_SUPPORTED (3000)")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is CudnnBadParamError and str(back) == str(e)
    assert (back.status, back.function, back.reason) == (2000, "cudnnFoo", "x <= 0")


def test_add_context_on_other_pycudnn_errors():
    e = NoAlgorithmError("every algorithm failed", failures=[("ALGO_1", "NOT_SUPPORTED")])
    assert e.add_context("input: (1, 3, 8, 8)") is e
    e.add_context("weight: (4, 3, 3, 3)")
    assert str(e) == "every algorithm failed\ninput: (1, 3, 8, 8)\nweight: (4, 3, 3, 3)"
    assert e.failures == [("ALGO_1", "NOT_SUPPORTED")]


def test_raise_status_uses_the_family_class():
    with pytest.raises(CudnnNotSupportedError, match=r"^cudnnX failed with "
                                                     r"CUDNN_STATUS_NOT_SUPPORTED \(3000\)"):
        _lib.raise_status(3000, "cudnnX")
    with pytest.raises(CudnnAllocationError, match="CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED"):
        _lib.raise_status(4003, "cudnnY")
    assert errors.error_class_for_status(4003) is CudnnAllocationError
