"""The CUDA driver prototype table (`pycudnn.runtime.memory.driver`) and what runs on it.

* Every row's argtypes and restype match the C signature in the comment above it, and its symbol
  is the one cuda.h names (the function, or its ``_v2``); with libcuda present, every row
  resolves and is bound with those types.
* The device bookkeeping (current device, making a device current, device guards, a pointer's
  device) is checked against a made-up driver that keeps a current context per thread, as
  libcuda does.
* A fresh interpreter that imports the modules of a first convolution and runs it as far as it
  goes (to the first device call without a GPU; to the result with one), with heuristics and
  with ``benchmark=True``, imports neither cuda.core nor cuda.bindings; the call path's imports
  leave out the tuning database, the gate and statistics, which only a measured search loads.
"""

from __future__ import annotations

import ctypes
import inspect
import json
import os
import re
import subprocess
import sys
import threading

import pytest

from pycudnn.runtime import memory as M
from pycudnn.runtime.memory import devices as D
from pycudnn.runtime.memory import driver as DRV

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- the table -----------------------------------------------------------------------------------

def _signature_comments() -> dict[str, str]:
    src = inspect.getsource(DRV)
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


_HANDLES = {"CUcontext", "CUstream", "CUevent", "CUmemoryPool", "CUgraph", "CUgraphExec",
            "CUgraphNode"}
_SCALARS = {"unsigned int": ctypes.c_uint, "unsigned long long": ctypes.c_ulonglong, "int": ctypes.c_int, "size_t": ctypes.c_size_t,
            "unsigned char": ctypes.c_ubyte, "cuuint32_t": ctypes.c_uint32,
            "CUdeviceptr": ctypes.c_uint64, "CUdevice": ctypes.c_int, "CUresult": ctypes.c_int}


def _expected(c_type: str) -> object:
    t = " ".join(c_type.replace("const", " ").split())
    if "*" in t:
        return "pointer"
    if t in _HANDLES:
        return ctypes.c_void_p
    if t in _SCALARS:
        return _SCALARS[t]
    assert re.fullmatch(r"CU\w+", t), f"unknown C type {c_type!r}"
    return ctypes.c_int  # a C enum


def _params(text: str) -> list[str]:
    text = text.strip()
    if text in ("", "void"):
        return []
    out = []
    for p in text.split(","):
        words = p.replace("*", " * ").split()
        idx = max(i for i, w in enumerate(words) if w != "*")  # drop the parameter's name
        out.append(" ".join(words[:idx] + words[idx + 1:]))
    return out


def test_every_driver_row_has_its_c_signature_above_it():
    assert set(_signature_comments()) == set(DRV.PROTOTYPES)


@pytest.mark.parametrize("name", sorted(DRV.PROTOTYPES))
def test_driver_row_matches_its_c_signature(name):
    symbol, restype, argtypes = DRV.PROTOTYPES[name]
    assert symbol in (name, name + "_v2"), symbol
    m = re.fullmatch(r"CUresult (\w+)\s*\((.*)\)", _signature_comments()[name])
    assert m and m.group(1) == name, _signature_comments()[name]
    assert restype is ctypes.c_int  # CUresult, never ctypes' default
    params = _params(m.group(2))
    assert len(params) == len(argtypes), (params, argtypes)
    for c_type, declared in zip(params, argtypes):
        want = _expected(c_type)
        if want == "pointer":
            text = c_type.startswith("char")
            assert (declared is (ctypes.c_char_p if text else ctypes.c_void_p)
                    or issubclass(declared, ctypes._Pointer)), (c_type, declared)
        else:
            assert declared is want, (name, c_type, declared)


def _libcuda_loads() -> bool:
    try:
        ctypes.CDLL(DRV.LIBRARY)
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _libcuda_loads(), reason="libcuda.so.1 is absent here (no NVIDIA driver)")
@pytest.mark.parametrize("name", sorted(DRV.PROTOTYPES))
def test_driver_row_resolves_in_libcuda(name):
    drv = DRV.driver()
    assert drv, DRV.problem
    symbol, restype, argtypes = DRV.PROTOTYPES[name]
    fn = getattr(drv, name)
    assert fn.__name__ == symbol
    assert fn.restype is restype and list(fn.argtypes) == list(argtypes)


def test_a_name_outside_the_table_is_refused():
    drv = object.__new__(DRV.Driver)
    with pytest.raises(AttributeError, match="not in pycudnn's CUDA driver prototype table"):
        drv.cuSomethingNotInTheTable  # noqa: B018


# ---- device bookkeeping on a made-up driver ------------------------------------------------------

class _FakeDriver:
    """Per-thread current contexts and primary contexts of ``n`` devices, as libcuda keeps them
    (context handles 0x1000 + device); out-parameters arrive as ``byref`` objects or addresses."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.tls = threading.local()
        self.retained: list[int] = []
        self.set_calls: list[int] = []
        self.memory: dict[int, tuple[int, int]] = {}  # pointer -> (memory type, device)
        self.init_status = 0

    @staticmethod
    def _out(ref, ctype):
        if isinstance(ref, int):
            return ctype.from_address(ref)
        return ref._obj

    def cuCtxGetCurrent(self, out):
        self._out(out, ctypes.c_void_p).value = getattr(self.tls, "ctx", None)
        return 0

    def cuCtxGetDevice(self, out):
        ctx = getattr(self.tls, "ctx", None)
        if not ctx:
            return 201  # CUDA_ERROR_INVALID_CONTEXT
        self._out(out, ctypes.c_int).value = ctx - 0x1000
        return 0

    def cuDeviceGetCount(self, out):
        self._out(out, ctypes.c_int).value = self.n
        return 0

    def cuDeviceGet(self, out, ordinal):
        if not 0 <= ordinal < self.n:
            return 101
        self._out(out, ctypes.c_int).value = ordinal
        return 0

    def cuDevicePrimaryCtxRetain(self, out, dev):
        self.retained.append(dev)
        self._out(out, ctypes.c_void_p).value = 0x1000 + dev
        return 0

    def cuCtxSetCurrent(self, ctx):
        self.set_calls.append(ctx - 0x1000)
        self.tls.ctx = ctx
        return 0

    def cuPointerGetAttributes(self, count, attrs, data, ptr):
        mtype, dev = self.memory.get(ptr, (0, 0))
        ctypes.c_uint.from_address(data[0]).value = mtype
        ctypes.c_int.from_address(data[1]).value = dev
        return 0

    def error_text(self, code):
        return f"CUresult {code}"


@pytest.fixture
def fake_driver(monkeypatch):
    drv = _FakeDriver(2)
    monkeypatch.setattr(DRV, "loaded", drv)
    monkeypatch.setattr(D, "visible_devices", 2)
    monkeypatch.setattr(D, "_primary", {})
    monkeypatch.setattr(D, "_tls", threading.local())
    return drv


def _in_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


def test_current_device_is_0_where_no_context_is_current_else_its_device(fake_driver):
    assert _in_thread(D.current_device) == 0
    fake_driver.tls.ctx = 0x1001
    assert D.current_device() == 1


def test_making_a_device_current_retains_its_primary_context_once(fake_driver):
    assert D.ensure_device(1) == 0  # no context was current: the runtime's answer is 0
    assert D.current_device() == 1
    assert D.ensure_device(1) == 1 and fake_driver.set_calls == [1]  # already current: no set
    assert D.ensure_device(0) == 1
    assert D.ensure_device(1) == 0
    assert fake_driver.retained == [1, 0]  # each device's primary context retained once
    assert fake_driver.set_calls == [1, 0, 1]


def test_device_guard_gives_the_previous_device_back(fake_driver):
    D.ensure_device(1)
    with D.device_guard(0):
        assert D.current_device() == 0
        with D.device_guard(0):
            assert D.current_device() == 0
    assert D.current_device() == 1
    with pytest.raises(RuntimeError, match="inside"):
        with D.device_guard(0):
            raise RuntimeError("inside")
    assert D.current_device() == 1


def test_restore_device_switches_back_only_when_needed(fake_driver):
    D.ensure_device(1)
    n = len(fake_driver.set_calls)
    D.restore_device(1)
    assert len(fake_driver.set_calls) == n
    D.ensure_device(0)
    D.restore_device(1)
    assert D.current_device() == 1
    D.restore_device(None)
    assert D.current_device() == 1


def test_an_invalid_device_raises_no_device_error_naming_the_call(fake_driver, monkeypatch, driver_library_found):
    from pycudnn.errors import NoDeviceError

    with pytest.raises(NoDeviceError) as info:
        D.set_device(5)
    assert "cuDeviceGet(5)" in str(info.value) and "2 CUDA device(s)" in str(info.value)


def test_pointer_device_reads_the_owner_and_refuses_host_memory(fake_driver):
    fake_driver.memory[0x7000] = (2, 1)  # CU_MEMORYTYPE_DEVICE on device 1
    assert D.pointer_device(0x7000) == 1
    with pytest.raises(TypeError, match="host memory"):
        D.pointer_device(0x9000)  # unknown to CUDA: plain host memory


def test_a_device_is_named_by_the_driver_when_none_is_usable(monkeypatch, driver_library_found):
    drv = _FakeDriver(0)
    drv.init_status = 100
    drv.error_text = lambda code: "CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected"
    monkeypatch.setattr(DRV, "loaded", drv)
    monkeypatch.setattr(D, "visible_devices", None)
    assert D.device_count() == 0
    assert D.no_device_reason() == ("cuInit failed: CUDA_ERROR_NO_DEVICE: no CUDA-capable device "
                                    "is detected")


def test_driver_statuses_become_the_runtime_layers_exceptions(monkeypatch, driver_library_found):
    from pycudnn.errors import NoDeviceError, OutOfMemoryError

    monkeypatch.setattr(DRV, "loaded", _FakeDriver(1))
    M.check_driver(0, "nothing")
    with pytest.raises(OutOfMemoryError, match="cuMemAlloc: out of device memory"):
        M.check_driver(2, "cuMemAlloc")
    with pytest.raises(NoDeviceError, match="cuInit: no usable CUDA device"):
        M.check_driver(100, "cuInit")
    with pytest.raises(M.CudaError, match="cuMemcpy failed") as info:
        M.check_driver(1, "cuMemcpy")
    assert info.value.code == 1


# ---- a first call in a fresh interpreter ---------------------------------------------------------

_FIRST_CALL = r"""
import json, sys
import numpy as np
import pycudnn
from pycudnn.runtime.memory import device_count

benchmark = sys.argv[1] == "benchmark"

class Array:  # a CUDA array interface with a made-up pointer: only used where no GPU is
    def __init__(self, shape):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f4", "data": (0x7000, False),
                                         "version": 3, "strides": None, "stream": None}

import pycudnn.api.conv  # what a first call imports before it runs
out = {"gpu": bool(device_count()),
       "imported": sorted(m for m in sys.modules if m.startswith("pycudnn") or m == "statistics")}
if out["gpu"]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    y = pycudnn.convolution(pycudnn.from_numpy(x), pycudnn.from_numpy(w), padding=1,
                            allow_tf32=False, benchmark=benchmark).numpy()
    out["y"] = y.astype(np.float64).tolist()
    out["x"], out["w"] = x.tolist(), w.tolist()
else:
    try:
        pycudnn.convolution(Array((2, 3, 8, 8)), Array((4, 3, 3, 3)), padding=1,
                            benchmark=benchmark)
    except pycudnn.NoDeviceError as exc:
        out["error"] = str(exc)
out["cuda_modules"] = sorted(m for m in sys.modules if m.startswith(("cuda.core", "cuda.bindings")))
out["pycudnn_modules"] = sorted(m for m in sys.modules if m.startswith("pycudnn"))
out["statistics"] = "statistics" in sys.modules
if out["gpu"]:  # read after the modules were listed: this imports the database
    from pycudnn.tuning import db as tuning_db
    out["stored"] = len(tuning_db.entries(set_aside=False))
print(json.dumps(out))
"""

#: imported only by a measured search (benchmark mode), never by a heuristics first call
_BENCHMARK_ONLY = ("pycudnn.tuning.db", "pycudnn.tuning.files", "pycudnn.tuning.records",
                   "pycudnn.runtime.gate", "statistics")


def _run_first_call(mode: str, cache_dir: str) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYCUDNN_CACHE_DIR=cache_dir)  # an empty tuning database: the search measures
    env.pop("PYCUDNN_TUNING_DB", None)
    proc = subprocess.run([sys.executable, "-c", _FIRST_CALL, mode], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["heuristics", "benchmark"])
def test_a_first_convolution_imports_neither_cuda_core_nor_cuda_bindings(mode, tmp_path):
    out = _run_first_call(mode, str(tmp_path))
    assert out["cuda_modules"] == []
    assert "pycudnn.api.conv" in out["pycudnn_modules"]  # the call path was imported and run
    # the call path's own imports leave the tuning database, the gate and statistics out
    assert not set(_BENCHMARK_ONLY) & set(out["imported"]), out["imported"]
    if not out["gpu"]:  # the path ran to its first device call, which said why it cannot go on
        error = out["error"]
        assert re.search(r"no NVIDIA driver found|no usable CUDA device", error), error


def _check_result(out: dict) -> None:
    import numpy as np

    import reference as R

    assert out["gpu"]
    ref = R.conv_forward(np.asarray(out["x"]), np.asarray(out["w"]), (1, 1), (1, 1), (1, 1), 1)
    got = np.asarray(out["y"])
    assert np.abs(got - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())


@pytest.mark.gpu
def test_a_first_convolution_on_a_gpu_is_right_and_imports_no_cuda_python_module(tmp_path):
    out = _run_first_call("heuristics", str(tmp_path))
    _check_result(out)
    assert out["cuda_modules"] == []
    # a heuristics call reads no tuning database and times nothing
    loaded = set(out["pycudnn_modules"]) | ({"statistics"} if out["statistics"] else set())
    assert not set(_BENCHMARK_ONLY) & loaded, sorted(loaded)
    assert out["stored"] == 0


@pytest.mark.gpu
def test_a_measured_first_convolution_on_a_gpu_is_right_and_imports_no_cuda_python_module(
        tmp_path):
    out = _run_first_call("benchmark", str(tmp_path))
    _check_result(out)
    # the search timed its candidates behind the gate, looked up and stored its winner in the
    # tuning database (the GPU's identity included), all without cuda.core or cuda.bindings
    assert out["cuda_modules"] == []
    assert {"pycudnn.runtime.gate", "pycudnn.tuning.db"} <= set(out["pycudnn_modules"])
    assert out["stored"] == 1
