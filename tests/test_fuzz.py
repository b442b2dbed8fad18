"""Property-based fuzzing of pycudnn's argument checking against the real libcudnn (CPU).

Hypothesis throws random invalid and edge-case parameters at the public convolution functions
(``convolution``, ``conv_transpose``, ``convolution_backward_data``,
``convolution_backward_filter``, ``convolution_add_relu``), at the tensor views they take
(``tensor_from_pointer`` and ``__cuda_array_interface__`` objects) and at the descriptor classes
(``TensorDescriptor``, ``FilterDescriptor``, ``ConvolutionDescriptor`` with ``validate=True`` and
``validate=False``, ``ConvolutionDescriptor.output_shape``, ``ActivationDescriptor``).

Every case is judged by an oracle written from first principles here (PyTorch's rules for the
convolutions, cuDNN's documented rules for the descriptors), not by reading pycudnn's code:

* invalid input must raise ``ValueError``, ``TypeError`` or ``CudnnError`` whose message names the
  offending parameter (the oracle lists every violation of the case and the raised error must
  match one of them);
* valid input must pass validation. Tensor views here point at made-up device addresses and this
  machine has no GPU, so a call that passes validation ends in ``NoDeviceError`` (or, for an
  output of 1 TiB or more, ``OutOfMemoryError`` before any device is asked; or a result for empty
  tensors, which needs no GPU); the oracle then checks that the parameters were in fact valid;
* anything else (another exception type, a crash) fails.

Known library bugs found by this fuzzing are listed in ``KNOWN_BUGS``: a case whose only
violations are known bugs and that the library wrongly accepts is counted (and shown in the
summary) instead of failing, and each bug has its own strict-xfail test below, so a fix makes
that test XPASS (fail): then delete the entry from ``KNOWN_BUGS`` and the fuzz enforces it too.

The number of cases is printed in pytest's terminal summary ("pycudnn fuzz summary"), kept in
pytest's cache (``pycudnn/fuzz``), written as JSON to ``$PYCUDNN_FUZZ_REPORT`` when set, and
``test_case_count_floor`` asserts it. ``PYCUDNN_FUZZ_SCALE`` multiplies the number of examples;
``PYCUDNN_FUZZ_RANDOM=1`` explores new random examples instead of the fixed (derandomized) ones.
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

import pycudnn
from pycudnn import errors as E
from pycudnn.runtime import memory as M

# Valid cases here pass validation and would then run on the made-up addresses: on a machine with
# a GPU that is an illegal memory access. There the whole module runs in a subprocess that sees
# no GPU (CUDA_VISIBLE_DEVICES=''), started by test_fuzz_gpu.py::test_cpu_fuzz_without_gpu.
pytestmark = pytest.mark.skipif(
    M.device_count() > 0,
    reason="a GPU is visible: made-up device addresses must never reach it; this module runs in a "
           "subprocess with CUDA_VISIBLE_DEVICES='' (test_fuzz_gpu.py::test_cpu_fuzz_without_gpu)")

# ---- settings ---------------------------------------------------------------------------------------

INT32_MAX = 2**31 - 1
TIB = 1 << 40
BASE = 0x7F00_0000_0000          # made-up device address (2 MiB aligned), never dereferenced
REGION = 1 << 40                 # each role's view starts in its own 1 TiB region
ROLES = ("x", "w", "dy", "z", "bias", "out")
DTYPES = ("float32", "float16", "bfloat16", "float64")
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
FUNCTIONS = ("convolution", "conv_transpose", "backward_data", "backward_filter", "add_relu")

SCALE = float(os.environ.get("PYCUDNN_FUZZ_SCALE", "1") or 1)
RANDOM = os.environ.get("PYCUDNN_FUZZ_RANDOM", "") not in ("", "0")


def examples(n: int) -> int:
    return max(1, int(n * SCALE))


def fuzz_settings(n: int) -> settings:
    return settings(max_examples=examples(n), deadline=None, derandomize=not RANDOM,
                    database=None if not RANDOM else settings.default.database,
                    suppress_health_check=list(HealthCheck), print_blob=True)


# Library bugs found by this fuzzing (see docs/reliability.md, "Known gaps"). A key here lets the
# conv fuzz count a wrongly accepted case instead of failing; remove the key once it is fixed.
KNOWN_BUGS: dict[str, str] = {
    # none open: every bug found so far is fixed, and its test below now enforces it
}


# ---- the report: how many cases ran -------------------------------------------------------------------

class FuzzReport:
    """Counts of cases per suite, their outcomes and the known bugs they hit."""

    def __init__(self, title: str, cache_key: str) -> None:
        self.title = title
        self.cache_key = cache_key
        self.cases: collections.Counter = collections.Counter()
        self.outcomes: collections.Counter = collections.Counter()
        self.bugs: collections.Counter = collections.Counter()
        self.labels: collections.Counter = collections.Counter()

    def record(self, suite: str, outcome: str, bugs=(), labels=()) -> None:
        self.cases[suite] += 1
        self.outcomes[(suite, outcome)] += 1
        for b in bugs:
            self.bugs[b] += 1
        for lab in labels:
            self.labels[lab] += 1

    @property
    def total(self) -> int:
        return sum(self.cases.values())

    def as_dict(self) -> dict[str, Any]:
        return {"total": self.total, "cases": dict(self.cases),
                "outcomes": {f"{s}:{o}": n for (s, o), n in sorted(self.outcomes.items())},
                "known_bug_hits": dict(self.bugs), "mutations": dict(self.labels)}

    def summary(self) -> list[str]:
        """The run summary's lines: totals by outcome over every suite (the per-suite counts are
        in `lines()`, and in the file ``PYCUDNN_FUZZ_REPORT`` names)."""
        by_outcome: collections.Counter = collections.Counter()
        for (_suite, outcome), n in self.outcomes.items():
            by_outcome[outcome] += n
        parts = ", ".join(f"{o}={n}" for o, n in sorted(by_outcome.items()))
        out = [f"{self.title}: {self.total} cases in {len(self.cases)} suites ({parts})"]
        if self.bugs:
            out.append("  known library bugs hit (accepted although invalid; see KNOWN_BUGS): "
                       + ", ".join(f"{b}={n}" for b, n in sorted(self.bugs.items())))
        return out

    def lines(self) -> list[str]:
        out = [f"{self.total} cases ran"]
        for suite, n in sorted(self.cases.items()):
            parts = ", ".join(f"{o}={c}" for (s, o), c in sorted(self.outcomes.items()) if s == suite)
            out.append(f"  {suite}: {n} ({parts})")
        if self.bugs:
            out.append("  known library bugs hit (accepted although invalid; see KNOWN_BUGS): "
                       + ", ".join(f"{b}={n}" for b, n in sorted(self.bugs.items())))
        return out


class _SummaryPlugin:
    def __init__(self, report: FuzzReport) -> None:
        self.report = report

    def summary_lines(self) -> list[str]:
        """Folded into the run's one summary block by conftest.py."""
        return self.report.summary() if self.report.total else []

    def pytest_terminal_summary(self, terminalreporter, config) -> None:
        rep = self.report
        if not rep.total:
            return
        data = rep.as_dict()
        try:
            config.cache.set(rep.cache_key, data)
        except Exception:  # a read-only cache directory must not fail the run
            pass
        target = os.environ.get("PYCUDNN_FUZZ_REPORT")
        if target:
            existing = {}
            try:
                with open(target) as f:
                    existing = json.load(f)
            except (OSError, ValueError):
                pass
            existing[rep.cache_key] = data
            with open(target, "w") as f:
                json.dump(existing, f, indent=1, sort_keys=True)


def register_report(config, report: FuzzReport) -> None:
    name = f"pycudnn-fuzz-summary-{report.cache_key}"
    pm = config.pluginmanager
    if not pm.has_plugin(name):
        pm.register(_SummaryPlugin(report), name)


REPORT = FuzzReport("fuzz (CPU, real libcudnn)", "pycudnn/fuzz")


@pytest.fixture(scope="module", autouse=True)
def _fuzz_report(request):
    register_report(request.config, REPORT)
    yield REPORT


# ---- cases --------------------------------------------------------------------------------------------

class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()


@dataclass(frozen=True)
class TSpec:
    """A tensor view to build: ``via`` is "pointer" (tensor_from_pointer), "cai" (an object with
    ``__cuda_array_interface__``) or "null" (such an object whose data pointer is 0)."""

    shape: tuple
    dtype: Any = "float32"
    strides: tuple | None = None        # elements; None: contiguous
    offset: int = 0                     # bytes from the start of the view's memory
    device: int = 0
    via: str = "pointer"
    alias: str | None = None            # another role whose memory this view starts in
    cai_byte_strides: tuple | None = None
    layout: str = "contiguous"


@dataclass(frozen=True)
class Raw:
    """Something passed where a tensor is expected that is not a device array."""

    value: Any
    label: str

    def __repr__(self) -> str:
        return f"Raw({self.label})"


@dataclass
class Case:
    fn: str
    args: dict                           # role -> TSpec | Raw | None
    kw: dict = field(default_factory=dict)
    shape_arg: Any = MISSING             # input_shape / weight_shape
    labels: tuple = ()

    def describe(self) -> str:
        return f"{self.fn} args={self.args} kw={self.kw} shape_arg={self.shape_arg} labels={self.labels}"


class FakeCAI:
    """A device array known only through ``__cuda_array_interface__`` (as CuPy or Numba give)."""

    def __init__(self, ptr: int, shape: tuple, typestr: str, strides: tuple | None) -> None:
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": tuple(shape),
                                         "typestr": typestr, "strides": strides, "version": 3,
                                         "stream": None}

    def __repr__(self) -> str:
        c = self.__cuda_array_interface__
        return f"FakeCAI({c['data'][0]:#x}, {c['shape']}, {c['typestr']!r}, {c['strides']})"


_TYPESTR = {"float32": "<f4", "float16": "<f2", "float64": "<f8", "bfloat16": "<V2"}
_UNSUPPORTED_TYPESTR = {"int32": "<i4", "uint8": "|u1", "bool": "|b1", "complex64": "<c8",
                        "int64": "<i8", ">f4": ">f4", ">f2": ">f2"}


def typestr(dtype: Any) -> str:
    if isinstance(dtype, str):
        name = dtype
    else:
        try:
            name = np.dtype(dtype).str
        except TypeError:  # not a dtype at all (a generated bad value): no valid typestr
            return repr(dtype)
    return _TYPESTR.get(name, _UNSUPPORTED_TYPESTR.get(name, name))


# ---- strategy objects, cached (building a strategy costs more than drawing from it) ------------------

_STRATEGIES: dict = {}


def _I(lo: int, hi: int):
    key = ("i", lo, hi)
    s = _STRATEGIES.get(key)
    if s is None:
        s = _STRATEGIES[key] = st.integers(lo, hi)
    return s


def _S(values):
    values = list(values)
    key = ("s",) + tuple(map(id, values))
    s = _STRATEGIES.get(key)
    if s is None:
        s = _STRATEGIES[key] = (st.sampled_from(values), values)  # keep the values alive
    return s[0]


def _P(values):
    key = ("p",) + tuple(values)
    s = _STRATEGIES.get(key)
    if s is None:
        s = _STRATEGIES[key] = st.permutations(list(values))
    return s


_B = st.booleans()


# ---- dtypes and layouts ---------------------------------------------------------------------------------

def dtype_info(dtype: Any) -> tuple[str | None, bool]:
    """(canonical name or None when unsupported, native byte order) of a dtype spelling."""
    if isinstance(dtype, str):
        key = dtype.lower()
        names = {"float32": "float32", "float": "float32", "float16": "float16", "half": "float16",
                 "bfloat16": "bfloat16", "float64": "float64", "double": "float64"}
        return names.get(key), True
    try:
        dt = np.dtype(dtype)
    except TypeError:
        return None, True
    if dt.name in ("float32", "float16", "float64", "bfloat16"):
        return dt.name, dt.isnative or dt.itemsize == 1
    return None, True


def contiguous(shape) -> tuple:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def channels_last(shape) -> tuple:
    nd = len(shape)
    strides = [0] * nd
    acc = 1
    for d in [1] + list(range(nd - 1, 1, -1)) + [0]:
        strides[d] = acc
        acc *= max(shape[d], 1)
    return tuple(strides)


def span_elements(shape, strides) -> int:
    if any(n == 0 for n in shape):
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(shape, strides))


def numel(shape) -> int:
    return math.prod(shape) if shape else 1


def self_overlaps(shape, strides) -> bool:
    """Whether two elements of a view share an address (exact for the layouts generated here:
    dims sorted by stride must each step past everything the smaller dims span)."""
    dims = sorted((s, n) for n, s in zip(shape, strides) if n > 1)
    reach = 0  # the largest offset the smaller dims reach
    for s, n in dims:
        if s <= reach:
            return True
        reach += (n - 1) * s
    return False


def strides_of(spec: TSpec) -> tuple:
    return tuple(spec.strides) if spec.strides is not None else contiguous(spec.shape)


@st.composite
def layout(draw, shape: tuple, allow_overlap: bool = True, allow_expanded: bool = True):
    """(layout name, strides in elements or None) for a view of ``shape``."""
    nd = len(shape)
    names = ["contiguous", "contiguous", "padded", "permuted"]
    if nd in (4, 5):
        names += ["channels_last", "channels_last"]
    if allow_overlap and nd >= 2:
        names.append("overlap")
    if allow_expanded:
        names.append("expanded")
    name = draw(_S(names))
    if name == "contiguous":
        return name, (None if draw(_B) else contiguous(shape))
    if name == "channels_last":
        return name, channels_last(shape)
    if name == "padded":
        padded = tuple(n + draw(_I(0, 2)) for n in shape)
        return name, contiguous(padded)
    if name == "permuted":
        order = draw(_P(list(range(nd))))
        strides = [0] * nd
        acc = 1
        for d in reversed(order):
            strides[d] = acc
            acc *= max(shape[d], 1)
        return name, tuple(strides)
    if name == "overlap":
        return name, (1,) * nd
    d = draw(_I(0, nd - 1))
    strides = list(contiguous(shape))
    strides[d] = 0
    return name, tuple(strides)


@st.composite
def tensor(draw, shape: tuple, dtype: str, gpu: bool = False, role: str = "x"):
    """A valid view: inputs may overlap themselves (they are only read) and, on the CPU, be
    expanded (stride 0); an output never overlaps (the "out" mutation makes such outputs)."""
    is_out = role == "out"
    lay, strides = draw(layout(shape, allow_overlap=not is_out, allow_expanded=not is_out and not gpu))
    return TSpec(tuple(shape), dtype, strides, layout=lay)


# ---- base cases (valid) ---------------------------------------------------------------------------------

@st.composite
def geometry(draw, nd: int, gpu: bool):
    kernel = tuple(draw(_I(1, 3)) for _ in range(nd))
    stride = tuple(draw(_I(1, 3)) for _ in range(nd))
    dilation = tuple(draw(_I(1, 2)) for _ in range(nd))
    padding = tuple(draw(_I(0, 4)) for _ in range(nd))   # may exceed the input
    spatial = []
    for k, p, d in zip(kernel, padding, dilation):
        lo = max(1, d * (k - 1) + 1 - 2 * p)
        spatial.append(draw(_I(lo, lo + (4 if gpu else 6))))
    return kernel, stride, padding, dilation, tuple(spatial)


def out_spatial(spatial, kernel, stride, padding, dilation) -> tuple:
    return tuple((i + 2 * p - d * (k - 1) - 1) // s + 1
                 for i, k, s, p, d in zip(spatial, kernel, stride, padding, dilation))


@st.composite
def spatial_kw(draw, value: tuple, default: int):
    """How a caller spells a geometry tuple: omitted (if default), an int, a tuple or a list."""
    choices = ["tuple", "list"]
    if len(set(value)) == 1:
        choices += ["int", "int", "numpy"]
        if value[0] == default:
            choices.append("omit")
    how = draw(_S(choices))
    if how == "omit":
        return MISSING
    if how == "int":
        return value[0]
    if how == "numpy":
        return np.int64(value[0])
    return tuple(value) if how == "tuple" else list(value)


@st.composite
def base_case(draw, fn: str, gpu: bool = False):
    nd = draw(_I(1, 3))
    dtype = draw(_S(DTYPES))
    groups = draw(_S([1, 1, 1, 2, 3, 4]))
    cg, kg = draw(_I(1, 3)), draw(_I(1, 3))
    C, K = cg * groups, kg * groups
    N = draw(_S([0, 1, 1, 2, 2, 3]))
    kernel, stride, padding, dilation, spatial = draw(geometry(nd, gpu))
    kw: dict[str, Any] = {}
    for name, value, default in (("stride", stride, 1), ("padding", padding, 0),
                                 ("dilation", dilation, 1)):
        v = draw(spatial_kw(value, default))
        if v is not MISSING:
            kw[name] = v
    if groups != 1 or draw(_B):
        kw["groups"] = groups
    args: dict[str, Any] = {}
    shape_arg: Any = MISSING
    if fn in ("convolution", "add_relu"):
        o = out_spatial(spatial, kernel, stride, padding, dilation)
        args["x"] = draw(tensor((N, C) + spatial, dtype, gpu, "x"))
        args["w"] = draw(tensor((K, cg) + kernel, dtype, gpu, "w"))
        y_shape = (N, K) + o
        if fn == "add_relu":
            args["z"] = draw(tensor(y_shape, dtype, gpu, "z"))
            if draw(_B):
                kw["alpha"] = draw(_S([1.0, 0.5, -2.0, 0, 3, np.float32(0.25)]))
    elif fn == "conv_transpose":
        # x: (N, C_in, i); w: (C_in, C_out/groups, k); output spatial:
        # (i - 1) * s - 2p + d(k - 1) + op + 1, with output_padding < stride (or < dilation)
        ops = tuple(draw(_I(0, s - 1)) for s in stride)
        o = tuple((i - 1) * s - 2 * p + d * (k - 1) + op + 1
                  for i, k, s, p, d, op in zip(spatial, kernel, stride, padding, dilation, ops))
        if any(v < 1 for v in o):  # pad less so that the output is not empty
            padding = tuple(0 for _ in padding)
            kw["padding"] = 0
            o = tuple((i - 1) * s + d * (k - 1) + op + 1
                      for i, k, s, d, op in zip(spatial, kernel, stride, dilation, ops))
        if any(ops) or draw(_B):
            kw["output_padding"] = ops if draw(_B) else list(ops)
        args["x"] = draw(tensor((N, C) + spatial, dtype, gpu, "x"))
        args["w"] = draw(tensor((C, kg) + kernel, dtype, gpu, "w"))
        y_shape = (N, K) + o
    elif fn == "backward_data":
        o = out_spatial(spatial, kernel, stride, padding, dilation)
        args["dy"] = draw(tensor((N, K) + o, dtype, gpu, "dy"))
        args["w"] = draw(tensor((K, cg) + kernel, dtype, gpu, "w"))
        y_shape = (N, C) + spatial
        shape_arg = y_shape if draw(_B) else list(y_shape)
    else:  # backward_filter
        o = out_spatial(spatial, kernel, stride, padding, dilation)
        args["x"] = draw(tensor((N, C) + spatial, dtype, gpu, "x"))
        args["dy"] = draw(tensor((N, K) + o, dtype, gpu, "dy"))
        y_shape = (K, cg) + kernel
        shape_arg = y_shape if draw(_B) else list(y_shape)
    if fn in ("convolution", "conv_transpose", "add_relu") and draw(_I(0, 2)) == 0:
        nbias = y_shape[1]
        args["bias"] = TSpec((nbias,), dtype)
    if fn in ("convolution", "conv_transpose") and draw(_I(0, 3)) == 0:
        kw["activation"] = "relu"
    if draw(_I(0, 2)) == 0:
        args["out"] = draw(tensor(y_shape, dtype, gpu, "out"))
    return Case(fn, args, kw, shape_arg)


# ---- mutations (each may make the case invalid, or be a valid edge case) ---------------------------

def _tensor_roles(case: Case) -> list[str]:
    return [r for r in ROLES if isinstance(case.args.get(r), TSpec)]


def _input_roles(case: Case) -> list[str]:
    return [r for r in ("x", "w", "dy", "z") if r in case.args]


BAD_GEOMETRY = [0, -1, -3, True, 1.5, None, "1", 2**31, 2**40, (1,), (1, 1, 1, 1), [2, 0],
                (1, None), (1, 2.0), (True, 1), np.array([1, 1]), np.bool_(True), object()]
BAD_GROUPS = [0, -2, True, 1.5, None, "2", 2**31, 2**40, (1,), np.int32(1), np.float64(2.0)]
VALID_FLAGS = [{"benchmark": True, "benchmark_limit": 2}, {"engine": "v7"}, {"engine": "graph"},
               {"deterministic": True}, {"allow_tf32": False}, {"workspace_limit": 0},
               {"workspace_limit": 1 << 20}, {"tuning_db": False},
               {"benchmark": False, "deterministic": False}]
INVALID_FLAGS = [{"benchmark": 1}, {"benchmark": "yes"}, {"deterministic": None},
                 {"allow_tf32": 0}, {"workspace_limit": -1}, {"workspace_limit": 1.5},
                 {"workspace_limit": True}, {"engine": "cudnn8"}, {"engine": None},
                 {"benchmark_limit": -2}, {"bogus": 1}, {"Benchmark": True}, {"tuning_db": "no"}]
BAD_STREAMS = [-1, "default", 1.5, object(), True, 2**64, 2**70]
VALID_STREAMS = [None, 0, 1, 2]
BAD_ALPHA = ["1", None, True, complex(1, 1), [1.0], np.array([1.0])]
EDGE_ALPHA = [float("nan"), float("inf"), -0.0, 1e30, np.float16(2), np.int8(3)]
UNSUPPORTED_DTYPES = ["int32", "uint8", "bool", "complex64", "int64", ">f4", ">f2"]
POINTER_BAD_DTYPES = ["int8", "float128", "f4", "bf16", "float32 ", "complex64", np.dtype(">f4"),
                      np.dtype(">f2"), np.dtype(">f8"), object()]
NOT_TENSORS = [Raw(None, "None"), Raw(3, "int"), Raw("x", "str"), Raw([1.0, 2.0], "list"),
               Raw(np.zeros((2, 4, 8, 8), np.float32), "numpy")]


@st.composite
def mutate(draw, case: Case, gpu: bool = False) -> Case:
    """One random mutation of ``case`` (a new Case)."""
    args = dict(case.args)
    kw = dict(case.kw)
    shape_arg = case.shape_arg
    roles = _tensor_roles(case)
    kinds = ["rank", "dtype_mismatch", "device", "negative_size", "zero_size", "channels",
             "groups", "geometry", "big_padding", "big_dilation", "out", "out", "pointer",
             "not_tensor", "flags", "stream", "cai", "alias_inputs", "unsupported_dtype",
             "valid_flags"]
    if case.fn in ("convolution", "conv_transpose", "add_relu"):
        kinds.append("bias")
    if not gpu:
        kinds += ["huge_size", "huge_geometry", "big_endian"]
    if case.fn in ("convolution", "conv_transpose"):
        kinds.append("activation")
    if case.fn == "add_relu":
        kinds += ["alpha", "z"]
    if case.fn == "conv_transpose":
        kinds.append("output_padding")
    if case.fn in ("backward_data", "backward_filter"):
        kinds += ["shape_arg", "shape_arg"]
    kind = draw(_S(kinds))
    label = kind
    if not roles and kind not in ("geometry", "groups", "flags", "stream", "valid_flags",
                                  "activation", "alpha", "output_padding", "shape_arg",
                                  "huge_geometry", "big_padding", "big_dilation"):
        kind = "flags"
    if kind == "rank":
        role = draw(_S(roles))
        spec = args[role]
        nd = draw(_S([n for n in (1, 2, 3, 4, 5, 6, 7) if n != len(spec.shape)]))
        shape = tuple(spec.shape[i] if i < len(spec.shape) else draw(_I(1, 3))
                      for i in range(nd))
        args[role] = TSpec(shape, spec.dtype, None, device=spec.device)
        label = f"rank:{role}"
    elif kind == "dtype_mismatch":
        role = draw(_S(roles))
        spec = args[role]
        args[role] = replace(spec, dtype=draw(_S([d for d in DTYPES if d != spec.dtype])))
        label = f"dtype:{role}"
    elif kind == "unsupported_dtype":
        role = draw(_S(roles))
        spec = args[role]
        if draw(_B):  # through __cuda_array_interface__
            args[role] = replace(spec, via="cai", dtype=draw(_S(UNSUPPORTED_DTYPES)),
                                 strides=None, alias=None)
        else:  # tensor_from_pointer refuses it when the view is built
            args[role] = replace(spec, dtype=draw(_S(POINTER_BAD_DTYPES)))
        label = f"unsupported_dtype:{role}"
    elif kind == "big_endian":
        role = draw(_S(roles))
        spec = args[role]
        name = dtype_info(spec.dtype)[0] or "float32"
        if name == "bfloat16":
            name = "float16"
        if draw(_B):  # every tensor big-endian: "valid" except for the byte order
            for r in roles:
                args[r] = replace(args[r], dtype=np.dtype(name).newbyteorder(">"))
        else:
            args[role] = replace(spec, dtype=np.dtype(name).newbyteorder(">"))
        label = f"big_endian:{role}"
    elif kind == "device":
        role = draw(_S(roles))
        # with real buffers, only devices this machine lacks: a view that claims another real
        # device than its memory's would make cuDNN read across devices
        fake = [1, 3, 7] if not gpu else [M.device_count(), M.device_count() + 2]
        if draw(_B):
            args[role] = replace(args[role], device=draw(_S(fake[:2])))
        else:
            dev = draw(_S(fake[-2:]))
            for r in roles:
                args[r] = replace(args[r], device=dev)
        label = f"device:{role}"
    elif kind in ("negative_size", "zero_size", "huge_size"):
        role = draw(_S(roles))
        spec = args[role]
        if not spec.shape:
            return case
        i = draw(_I(0, len(spec.shape) - 1))
        value = {"negative_size": draw(_S([-1, -2, -(2**31)])),
                 "zero_size": 0,
                 "huge_size": draw(_S([2**31 - 1, 2**31 + 5, 3 * 2**31, 2**34]))}[kind]
        shape = list(spec.shape)
        shape[i] = value
        args[role] = TSpec(tuple(shape), spec.dtype, None, device=spec.device, via=spec.via)
        label = f"{kind}:{role}[{i}]"
    elif kind == "channels":
        role = draw(_S(roles))
        spec = args[role]
        if len(spec.shape) < 2:
            return case
        i = draw(_S([0, 1]))
        shape = list(spec.shape)
        shape[i] = max(1, shape[i] + draw(_S([-1, 1, 2, 5])))
        args[role] = TSpec(tuple(shape), spec.dtype, None, device=spec.device)
        label = f"channels:{role}[{i}]"
    elif kind == "groups":
        kw["groups"] = draw(_S(BAD_GROUPS + [1, 2, 3, 5, 8]))
    elif kind == "geometry":
        name = draw(_S(["stride", "padding", "dilation"]))
        kw[name] = draw(_S(BAD_GEOMETRY))
        label = f"geometry:{name}"
    elif kind == "huge_geometry":
        name = draw(_S(["stride", "padding", "dilation", "groups"]))
        kw[name] = draw(_S([2**31 - 1, 2**31, 2**32 + 1, 2**40, 2**62]))
        label = f"huge_geometry:{name}"
    elif kind == "big_padding":
        kw["padding"] = draw(_I(3, 12))
    elif kind == "big_dilation":
        kw["dilation"] = draw(_I(3, 9))
    elif kind == "bias":
        like = next((args[r] for r in ("x", "dy") if isinstance(args.get(r), TSpec)), None)
        dtype = like.dtype if like is not None else "float32"
        n = draw(_I(0, 9))
        choice = draw(_S(["size", "rank", "dtype", "device", "strided", "expanded",
                                       "none", "raw"]))
        if choice == "size":
            args["bias"] = TSpec((n,), dtype)
        elif choice == "rank":
            args["bias"] = TSpec((1, n), dtype)
        elif choice == "dtype":
            args["bias"] = TSpec((n,), draw(_S([d for d in DTYPES if d != dtype])))
        elif choice == "device":
            args["bias"] = TSpec((n,), dtype, device=1)
        elif choice in ("strided", "expanded") and not gpu:  # valid views (see the GPU tests)
            k = _out_channels(case)
            if k is None:
                return case
            args["bias"] = TSpec((k,), dtype, (2,) if choice == "strided" else (0,), layout=choice)
        elif choice == "none":
            args.pop("bias", None)
        else:
            args["bias"] = draw(_S(NOT_TENSORS[1:]))  # None means no bias
        label = f"bias:{choice}"
    elif kind == "out":
        choice = draw(_S(["shape", "dtype", "device", "layout", "raw", "alias",
                                       "overlap"]))
        y = _expected_out_shape(case)
        like = next((args[r] for r in ("x", "dy") if isinstance(args.get(r), TSpec)), None)
        if y is None or like is None:
            return case
        dtype = like.dtype
        if choice == "shape":
            bad = list(y)
            j = draw(_I(0, len(bad) - 1))
            bad[j] += draw(_S([-1, 1, 3]))
            if draw(_B):
                bad = bad[:-1]
            args["out"] = TSpec(tuple(max(b, 0) for b in bad), dtype)
        elif choice == "dtype":
            args["out"] = TSpec(tuple(y), draw(_S([d for d in DTYPES if d != dtype])))
        elif choice == "device":
            args["out"] = TSpec(tuple(y), dtype, device=1)
        elif choice == "layout":
            lay, strides = draw(layout(tuple(y), allow_overlap=False, allow_expanded=False))
            args["out"] = TSpec(tuple(y), dtype, strides, layout=lay)
        elif choice == "raw":
            args["out"] = draw(_S(NOT_TENSORS[1:]))
        elif choice == "alias" and not gpu:
            role = draw(_S(_input_roles(case) + (["bias"] if "bias" in args else [])))
            args["out"] = TSpec(tuple(y), dtype, alias=role)
        elif not gpu:  # a view whose elements overlap
            strides = (1,) * len(y) if draw(_B) else (0,) + contiguous(y)[1:]
            args["out"] = TSpec(tuple(y), dtype, strides, layout="overlap")
        label = f"out:{choice}"
    elif kind == "pointer":
        role = draw(_S(roles))
        spec = args[role]
        choice = draw(_S(["misaligned", "misaligned_cai", "null_cai", "aligned_odd"]))
        name, _ = dtype_info(spec.dtype)
        item = ITEMSIZE.get(name or "", 4)
        if choice == "misaligned":
            args[role] = replace(spec, offset=draw(_I(1, item - 1)) if item > 1 else 1)
        elif choice == "misaligned_cai" and not gpu:
            args[role] = replace(spec, via="cai", offset=draw(_I(1, 7)), alias=None)
        elif choice == "null_cai" and not gpu:
            args[role] = replace(spec, via="null", alias=None)
        else:  # aligned to the element but not to 16 bytes: valid
            args[role] = replace(spec, offset=item * draw(_I(1, 3)))
        label = f"pointer:{choice}:{role}"
    elif kind == "cai":
        role = draw(_S(roles))
        spec = args[role]
        name, _ = dtype_info(spec.dtype)
        if name is None:
            return case
        item = ITEMSIZE[name]
        choice = draw(_S(["plain", "byte_strides_bad", "negative_strides"]))
        if choice == "plain":
            args[role] = replace(spec, via="cai", alias=None)
        else:
            bs = [s * item for s in strides_of(spec)]
            if not bs:
                return case
            j = draw(_I(0, len(bs) - 1))
            bs[j] = bs[j] + 1 if choice == "byte_strides_bad" else -max(bs[j], item)
            args[role] = replace(spec, via="cai", cai_byte_strides=tuple(bs), alias=None)
        label = f"cai:{choice}:{role}"
    elif kind == "not_tensor":
        role = draw(_S([r for r in roles if r in ("x", "w", "dy", "z")] or roles))
        args[role] = draw(_S(NOT_TENSORS))
        label = f"not_tensor:{role}"
    elif kind == "alias_inputs":  # two inputs in the same memory: valid (they are only read)
        ins = [r for r in _input_roles(case) if isinstance(args.get(r), TSpec)]
        if len(ins) < 2:
            return case
        a, b = draw(_P(ins))[:2]
        args[b] = replace(args[b], alias=a, offset=0)
        label = f"alias_inputs:{b}->{a}"
    elif kind == "flags":
        kw.update(draw(_S(INVALID_FLAGS)))
    elif kind == "valid_flags":
        kw.update(draw(_S(VALID_FLAGS)))
    elif kind == "stream":
        kw["stream"] = draw(_S(BAD_STREAMS + VALID_STREAMS if not gpu
                                            else [-1, "default", 1.5, object(), True] + VALID_STREAMS))
    elif kind == "activation":
        kw["activation"] = draw(_S(["gelu", "RELU", 1, None, "relu", ("relu",)]))
    elif kind == "alpha":
        kw["alpha"] = draw(_S(BAD_ALPHA + EDGE_ALPHA))
    elif kind == "z":
        choice = draw(_S(["shape", "dtype", "rank", "layout", "alias_out"]))
        z = args.get("z")
        if not isinstance(z, TSpec):
            return case
        if choice == "shape":
            shape = list(z.shape)
            j = draw(_I(0, len(shape) - 1))
            shape[j] += draw(_S([-1, 1, 2]))
            args["z"] = TSpec(tuple(max(v, 0) for v in shape), z.dtype)
        elif choice == "dtype":
            args["z"] = replace(z, dtype=draw(_S([d for d in DTYPES if d != z.dtype])))
        elif choice == "rank":
            args["z"] = TSpec(z.shape[:-1], z.dtype)
        elif choice == "layout":
            lay, strides = draw(layout(z.shape, allow_expanded=not gpu))
            args["z"] = TSpec(z.shape, z.dtype, strides, layout=lay)
        else:  # out is z: the documented in-place residual
            args["out"] = replace(z, alias=None)
            args["z"] = replace(z, alias="out", offset=0)
        label = f"z:{choice}"
    elif kind == "output_padding":
        kw["output_padding"] = draw(_S([-1, 1, 2, 3, 5, (0, 9), [1], True, 1.5]))
    elif kind == "shape_arg":
        target = tuple(shape_arg) if isinstance(shape_arg, (tuple, list)) else None
        choice = draw(_S(["len", "negative", "float", "str", "numpy", "batch",
                                       "channels", "spatial", "bool", "none"]))
        if target is None:
            shape_arg = draw(_S([(2, 4, 8, 8), "2,4"]))
        elif choice == "len":
            shape_arg = target[:-1] if draw(_B) else target + (1,)
        elif choice == "negative":
            shape_arg = (target[0], -target[1]) + target[2:]
        elif choice == "float":
            shape_arg = target[:-1] + (float(target[-1]),)
        elif choice == "str":
            shape_arg = ",".join(map(str, target))
        elif choice == "numpy":
            shape_arg = np.array(target)
        elif choice == "bool":
            shape_arg = (True,) + target[1:]
        elif choice == "none":
            shape_arg = None
        else:
            j = {"batch": 0, "channels": 1, "spatial": len(target) - 1}[choice]
            t = list(target)
            t[j] += draw(_S([1, 2, -1 if t[j] > 0 else 1]))
            shape_arg = tuple(t)
        label = f"shape_arg:{choice}"
    return Case(case.fn, args, kw, shape_arg, case.labels + (label,))


def _out_channels(case: Case) -> int | None:
    y = _expected_out_shape(case)
    return y[1] if y is not None and len(y) > 1 else None


def _expected_out_shape(case: Case) -> tuple | None:
    """The output shape the case's own inputs imply (None when they cannot say)."""
    res = expected_output(case)
    return res


@st.composite
def conv_case(draw, fn: str, gpu: bool = False):
    case = draw(base_case(fn, gpu))
    n = draw(_S([0, 0, 1, 1, 1, 2, 3]))
    for _ in range(n):
        case = draw(mutate(case, gpu))
    return case


# ---- the oracle -----------------------------------------------------------------------------------------

BAD = (ValueError, TypeError)


@dataclass(frozen=True)
class Violation:
    what: str
    pattern: str                         # the raised message must match (re.I)
    types: tuple = BAD
    bug: str | None = None               # a known bug: the library wrongly accepts this
    optional: bool = False               # refusing and accepting are both right

    def matches(self, exc: BaseException) -> bool:
        return isinstance(exc, self.types) and re.search(self.pattern, str(exc), re.I) is not None


@dataclass
class View:
    """What a role is after conversion, as the oracle sees it."""
    shape: tuple
    dtype: Any            # numpy dtype (None when unsupported)
    device: int
    strides: tuple
    ptr: int


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def address(case: Case, role: str, base: Callable[[str], int]) -> int:
    spec = case.args[role]
    root = spec.alias if spec.alias is not None else role
    return base(root) + spec.offset


def cpu_base(role: str) -> int:
    return BASE + ROLES.index(role) * REGION


def view_violations(case: Case, role: str, base: Callable[[str], int], n_devices: int
                    ) -> tuple[list[Violation], View | None]:
    """Violations raised when building or converting the view of ``role``, and the view."""
    spec = case.args[role]
    if isinstance(spec, Raw):
        return [Violation(f"{role} is {spec.label}", r"CUDA device array|from_numpy")], None
    v: list[Violation] = []
    name, native = dtype_info(spec.dtype) if spec.via == "pointer" else (
        dtype_info(spec.dtype)[0] if typestr(spec.dtype) in _TYPESTR.values() else None, True)
    shape = tuple(spec.shape)
    strides = strides_of(spec)
    ptr = 0 if spec.via == "null" else address(case, role, base)
    if spec.via == "pointer":
        if spec.strides is not None and len(spec.strides) != len(shape):
            v.append(Violation(f"{role} strides length", r"strides"))
        if any(n < 0 for n in shape):
            v.append(Violation(f"{role} negative size", r"shape"))
        if any(s < 0 for s in strides):
            v.append(Violation(f"{role} negative stride", r"strides"))
        if name is None:
            v.append(Violation(f"{role} dtype {spec.dtype!r}", r"dtype"))
        else:
            if not native:
                v.append(Violation(f"{role} big-endian dtype", r"dtype|byte order|endian",
                                   bug="big-endian-dtype"))
            if ptr % ITEMSIZE[name]:
                v.append(Violation(f"{role} pointer {ptr:#x} misaligned", r"align"))
    else:
        if name is None:
            v.append(Violation(f"{role} typestr {typestr(spec.dtype)!r}", r"dtype"))
        else:
            item = ITEMSIZE[name]
            if spec.cai_byte_strides is not None:
                if any(b < 0 or b % item for b in spec.cai_byte_strides):
                    v.append(Violation(f"{role} byte strides {spec.cai_byte_strides}", r"strides"))
                strides = tuple(b // item for b in spec.cai_byte_strides)
            if any(n < 0 for n in shape):
                v.append(Violation(f"{role} negative size {shape}", r"shape|size|channels"))
            if spec.via == "null" and numel(shape) > 0:
                v.append(Violation(f"{role} null data pointer", r"null|pointer|ptr"))
            if ptr % item:
                v.append(Violation(f"{role} misaligned data pointer", r"align"))
    if role in ("x", "w", "dy", "z") and numel(shape) > 0 and len(strides) == len(shape) and any(
            st == 0 and n > 1 for n, st in zip(shape, strides)):
        v.append(Violation(f"{role} broadcast (stride 0)", r"broadcast|stride 0"))
    dt = None
    if name is not None:
        dt = np.dtype(spec.dtype) if not isinstance(spec.dtype, str) else None
        if dt is None or dt.name not in ITEMSIZE:
            from pycudnn._types import normalize_dtype
            dt = normalize_dtype(name)
    device = spec.device if spec.via == "pointer" else 0
    return v, View(shape, dt, device, strides, ptr)


def spatial_violations(name: str, value: Any, nd: int, minimum: int
                       ) -> tuple[list[Violation], tuple | None]:
    pat = r"(?<![a-z_])" + name + r"\b" if name != "output_padding" else r"output.padding"
    if value is MISSING:
        return [], (1 if name in ("stride", "dilation") else 0,) * nd
    if _is_int(value):
        values = (int(value),) * nd
    elif isinstance(value, (tuple, list)):
        if len(value) != nd or not all(_is_int(v) for v in value):
            return [Violation(f"{name}={value!r} for {nd} dims", pat)], None
        values = tuple(int(v) for v in value)
    else:
        return [Violation(f"{name} of type {type(value).__name__}", pat)], None
    v = []
    if any(x < minimum for x in values):
        return [Violation(f"{name}={values} < {minimum}", pat)], None
    if any(x > INT32_MAX for x in values):
        v.append(Violation(f"{name}={values} above int32", pat, bug="late-int32-geometry"))
    return v, values


def groups_violations(value: Any) -> tuple[list[Violation], int | None]:
    if value is MISSING:
        return [], 1
    if not _is_int(value):
        return [Violation(f"groups={value!r}", r"groups")], None
    g = int(value)
    if g < 1:
        return [Violation(f"groups={g}", r"groups")], None
    if g > INT32_MAX:
        return [Violation(f"groups={g} above int32", r"groups", bug="late-int32-geometry")], g
    return [], g


def flag_violations(kw: dict) -> list[Violation]:
    v = []
    for name, value in kw.items():
        if name in ("stride", "padding", "dilation", "groups", "output_padding", "activation",
                    "alpha", "stream"):
            continue
        pat = re.escape(name) + r"|unknown flag"
        if name in ("benchmark", "deterministic", "allow_tf32", "tuning_db"):
            if not isinstance(value, bool):
                v.append(Violation(f"flag {name}={value!r}", pat))
        elif name in ("workspace_limit", "benchmark_limit"):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                v.append(Violation(f"flag {name}={value!r}", pat))
        elif name == "engine":
            if value not in ("v7", "graph"):
                v.append(Violation(f"engine={value!r}", pat))
        else:
            v.append(Violation(f"unknown flag {name}", pat))
    return v


def stream_violations(kw: dict) -> list[Violation]:
    if "stream" not in kw:
        return []
    s = kw["stream"]
    if s is None:
        return []
    if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
        return [Violation(f"stream={s!r}", r"stream")]
    if s < 0:
        return [Violation(f"stream={s}", r"stream")]
    if s >= 2**64:
        return [Violation(f"stream={s} is not a 64-bit handle", r"stream", bug="stream-handle-range")]
    return []


def pair_violations(a: View | None, a_name: str, b: View | None, b_name: str) -> list[Violation]:
    if a is None or b is None:
        return []
    v = []
    if a.dtype is not None and b.dtype is not None and a.dtype != b.dtype:
        v.append(Violation(f"{a_name} {a.dtype} vs {b_name} {b.dtype}", rf"{b_name} type|{a_name} type"))
    if a.device != b.device:
        v.append(Violation(f"{a_name} on {a.device}, {b_name} on {b.device}", r"device|cuda:"))
    if len(a.shape) != len(b.shape):
        v.append(Violation(f"{b_name} has {len(b.shape)} dims, {a_name} {len(a.shape)}",
                           rf"{b_name}|{a_name}"))
    return v


def channel_violations(x_shape, w_shape, g, x_name="input", w_name="weight") -> list[Violation]:
    v = []
    if len(x_shape) < 2 or len(w_shape) < 2:
        return v
    if w_shape[0] % g:
        v.append(Violation(f"{w_name}[0]={w_shape[0]} not divisible by groups={g}", r"groups"))
    if x_shape[1] != w_shape[1] * g:
        v.append(Violation(f"{x_name} channels {x_shape[1]} != {w_shape[1]}*{g}", r"channels|groups"))
    if any(k < 1 for k in w_shape):
        v.append(Violation(f"{w_name} sizes {w_shape} not positive", rf"{w_name}"))
    return v


def output_violations(x_shape, kernel, stride, padding, dilation) -> tuple[list[Violation], tuple]:
    o = out_spatial(x_shape[2:], kernel, stride, padding, dilation)
    if any(v < 1 for v in o):
        return [Violation(f"output size {o} < 1", r"kernel size|input size|output size")], o
    return [], o


def bias_violations(bias: View | None, k: int, ref: View | None) -> list[Violation]:
    if bias is None or ref is None:
        return []
    v = []
    if len(bias.shape) != 1 or bias.shape[0] != k:
        v.append(Violation(f"bias shape {bias.shape} for {k} channels", r"bias"))
    if bias.dtype is not None and ref.dtype is not None and bias.dtype != ref.dtype:
        v.append(Violation(f"bias dtype {bias.dtype}", r"bias"))
    if bias.device != ref.device:
        v.append(Violation(f"bias on device {bias.device}", r"bias|device|cuda:"))
    return v


def out_violations(case: Case, out: View | None, shape: tuple, like: View | None,
                   views: dict[str, View | None]) -> list[Violation]:
    if out is None or like is None:
        return []
    v = []
    if tuple(out.shape) != tuple(shape):
        v.append(Violation(f"out shape {out.shape} != {shape}", r"\bout\b"))
    if out.dtype is not None and like.dtype is not None and out.dtype != like.dtype:
        v.append(Violation(f"out dtype {out.dtype}", r"\bout\b"))
    if out.device != like.device:
        v.append(Violation(f"out on device {out.device}", r"\bout\b|device|cuda:"))
    if not v and numel(out.shape) > 0:
        if self_overlaps(out.shape, out.strides):
            v.append(Violation(f"out strides {out.strides} overlap", r"\bout\b.*overlap|overlap.*\bout\b",
                               bug="out-self-overlap"))
        item = out.dtype.itemsize if out.dtype is not None else 1
        o0, o1 = out.ptr, out.ptr + span_elements(out.shape, out.strides) * item
        for role, t in views.items():
            if role in ("out", "z") or t is None or t.dtype is None or numel(t.shape) == 0:
                continue  # add_relu documents out=z (an in-place residual) as fine
            t0, t1 = t.ptr, t.ptr + span_elements(t.shape, t.strides) * t.dtype.itemsize
            if o0 < t1 and t0 < o1:
                v.append(Violation(f"out overlaps {role}", r"\bout\b.*overlap|overlap.*\bout\b",
                                   bug="out-aliases-input"))
    return v


def shape_arg_violations(name: str, value: Any, ndim: int) -> tuple[list[Violation], tuple | None]:
    if not isinstance(value, (tuple, list)) or not all(_is_int(s) for s in value):
        return [Violation(f"{name}={value!r}", name)], None
    if len(value) != ndim:
        return [Violation(f"{name} has {len(value)} sizes, expected {ndim}", name)], None
    if any(s < 0 for s in value):
        return [Violation(f"{name}={tuple(value)} negative", name)], None
    return [], tuple(int(s) for s in value)


def sample_violation(fn_name: str, *shapes) -> list[Violation]:
    """cuDNN indexes one sample with 32 bits: a sample above 2**31 - 1 elements is refused."""
    if any(numel(s) == 0 for s in shapes):
        return []  # nothing runs
    inner = max(numel(s[1:]) for s in shapes)
    if inner > INT32_MAX:
        return [Violation(f"one sample holds {inner} elements", r"sample|2\^31|32-bit",
                          bug="late-sample-size")]
    return []


def oracle(case: Case, base: Callable[[str], int] = cpu_base, n_devices: int = 0
           ) -> tuple[list[Violation], tuple | None]:
    """Every violation of ``case`` and the output shape a valid call gives."""
    v: list[Violation] = []
    views: dict[str, View | None] = {}
    for role, spec in case.args.items():
        if spec is None or (isinstance(spec, Raw) and spec.value is None and role in ("bias", "out")):
            continue  # None for bias / out means "none given"
        vv, view = view_violations(case, role, base, n_devices)
        v += vv
        views[role] = view
    kw = case.kw
    v += flag_violations(kw)
    v += stream_violations(kw)
    if "activation" in kw and kw["activation"] is not None and not (
            isinstance(kw["activation"], str) and kw["activation"] == "relu"):
        v.append(Violation(f"activation={kw['activation']!r}", r"activation"))
    fn = case.fn
    first = views.get("dy") if fn == "backward_data" else views.get("x")
    first_name = "grad_y" if fn == "backward_data" else "input"
    second_role = "dy" if fn == "backward_filter" else "w"
    second = views.get(second_role)
    second_name = "grad_y" if fn == "backward_filter" else "weight"
    out_shape = None
    gv, groups = groups_violations(kw.get("groups", MISSING))
    v += gv
    if first is None:
        return v, None
    nd = len(first.shape) - 2
    if nd not in (1, 2, 3):
        v.append(Violation(f"{first_name} has {len(first.shape)} dims", rf"{first_name}|dims"))
        return v, None
    v += pair_violations(first, first_name, second, second_name)
    geo = {}
    for name, minimum in (("stride", 1), ("padding", 0), ("dilation", 1)):
        sv, geo[name] = spatial_violations(name, kw.get(name, MISSING), nd, minimum)
        v += sv
    op = None
    if fn == "conv_transpose":
        sv, op = spatial_violations("output_padding", kw.get("output_padding", MISSING), nd, 0)
        v += sv
    if fn == "add_relu":
        v += pair_violations(first, "input", views.get("z"), "z")
        a = kw.get("alpha", MISSING)
        if a is not MISSING and (isinstance(a, (bool, np.bool_))
                                 or not isinstance(a, (int, float, np.floating, np.integer))):
            v.append(Violation(f"alpha={a!r}", r"alpha"))
    if second is None or len(second.shape) != len(first.shape) or groups is None \
            or any(g is None for g in geo.values()):
        return v, None
    stride, padding, dilation = geo["stride"], geo["padding"], geo["dilation"]
    if fn in ("convolution", "add_relu"):
        x, w = first, second
        v += channel_violations(x.shape, w.shape, groups)
        ov, o = output_violations(x.shape, w.shape[2:], stride, padding, dilation)
        v += ov
        out_shape = (x.shape[0], w.shape[0]) + o
        v += bias_violations(views.get("bias"), w.shape[0], x)
        if fn == "add_relu":
            z = views.get("z")
            if z is not None and len(z.shape) == len(x.shape) and tuple(z.shape) != out_shape:
                v.append(Violation(f"z shape {z.shape} != {out_shape}", r"\bz\b"))
        v += out_violations(case, views.get("out"), out_shape, x, views)
        if not ov:
            v += sample_violation(fn, x.shape, out_shape)
    elif fn == "conv_transpose":
        x, w = first, second
        if op is not None:
            if any(p >= s and p >= d for p, s, d in zip(op, stride, dilation)):
                v.append(Violation(f"output_padding={op} >= stride and dilation", r"output.padding"))
        if w.shape[0] != x.shape[1]:
            v.append(Violation(f"weight[0]={w.shape[0]} != input channels {x.shape[1]}",
                               r"channels|weight"))
        if w.shape[0] % groups:
            v.append(Violation(f"weight[0] not divisible by groups={groups}", r"groups"))
        if any(k < 1 for k in w.shape):
            v.append(Violation(f"weight sizes {w.shape} not positive", r"weight",
                               bug="conv-transpose-weight-sizes"))
        if op is None:
            return v, None
        k_out = w.shape[1] * groups
        o = tuple((i - 1) * s - 2 * p + d * (k - 1) + q + 1 for i, k, s, p, d, q in
                  zip(x.shape[2:], w.shape[2:], stride, padding, dilation, op))
        if any(t < 1 for t in o):
            v.append(Violation(f"output size {o} < 1", r"output size"))
            return v, None
        out_shape = (x.shape[0], k_out) + o
        v += bias_violations(views.get("bias"), k_out, x)
        v += out_violations(case, views.get("out"), out_shape, x, views)
        v += sample_violation(fn, x.shape, out_shape)
    elif fn == "backward_data":
        dy, w = first, second
        sv, ishape = shape_arg_violations("input_shape", case.shape_arg, len(dy.shape))
        v += sv
        if ishape is None:
            return v, None
        v += channel_violations(ishape, w.shape, groups)
        ov, o = output_violations(ishape, w.shape[2:], stride, padding, dilation)
        v += ov
        expected = (ishape[0], w.shape[0]) + o
        if tuple(dy.shape) != expected:
            v.append(Violation(f"grad_y {dy.shape} != {expected}", r"grad_y"))
        out_shape = ishape
        v += out_violations(case, views.get("out"), out_shape, dy, views)
        if not ov:
            v += sample_violation(fn, ishape, dy.shape)
    else:  # backward_filter
        x, dy = first, second
        sv, wshape = shape_arg_violations("weight_shape", case.shape_arg, len(x.shape))
        v += sv
        if wshape is None:
            return v, None
        v += channel_violations(x.shape, wshape, groups)
        ov, o = output_violations(x.shape, wshape[2:], stride, padding, dilation)
        v += ov
        expected = (x.shape[0], wshape[0]) + o
        if tuple(dy.shape) != expected:
            v.append(Violation(f"grad_y {dy.shape} != {expected}", r"grad_y"))
        out_shape = wshape
        v += out_violations(case, views.get("out"), out_shape, x, views)
        if not ov:
            v += sample_violation(fn, x.shape, dy.shape)
    # tensors on a device this machine lacks (on a CPU machine the answer is NoDeviceError)
    if n_devices and not v:
        devs = {t.device for t in views.values() if t is not None}
        if any(d >= n_devices for d in devs):
            nothing_to_do = out_shape is None or numel(out_shape) == 0 or any(
                numel(t.shape) == 0 for r, t in views.items() if t is not None and r != "out")
            v.append(Violation(f"device {max(devs)} of {n_devices}", r"device",
                               optional=nothing_to_do))
    return v, out_shape


def expected_output(case: Case) -> tuple | None:
    try:
        return oracle(case)[1]
    except Exception:  # a malformed case mid-mutation: no output shape to offer
        return None


# ---- running one case ---------------------------------------------------------------------------------

def build_view(case: Case, role: str, base: Callable[[str], int]) -> Any:
    spec = case.args[role]
    if isinstance(spec, Raw):
        return spec.value
    if spec.via == "pointer":
        return pycudnn.tensor_from_pointer(address(case, role, base), spec.shape, spec.dtype,
                                           spec.strides, device=spec.device)
    name, _ = dtype_info(spec.dtype)
    item = ITEMSIZE.get(name or "")
    if item is None:
        try:
            item = np.dtype(typestr(spec.dtype)).itemsize
        except TypeError:
            item = 1
    if spec.cai_byte_strides is not None:
        bstrides = tuple(spec.cai_byte_strides)
    elif spec.strides is not None:
        bstrides = tuple(s * item for s in spec.strides)
    else:
        bstrides = None
    ptr = 0 if spec.via == "null" else address(case, role, base)
    return FakeCAI(ptr, spec.shape, typestr(spec.dtype), bstrides)


def call_case(case: Case, base: Callable[[str], int] = cpu_base) -> Any:
    """Build the views and call the function under test (errors propagate)."""
    a = {r: build_view(case, r, base) for r, s in case.args.items() if s is not None}
    kw = {k: v for k, v in case.kw.items() if v is not MISSING}
    fn = case.fn
    if fn == "convolution":
        return pycudnn.convolution(a["x"], a["w"], a.get("bias"), out=a.get("out"), **kw)
    if fn == "conv_transpose":
        return pycudnn.conv_transpose(a["x"], a["w"], a.get("bias"), out=a.get("out"), **kw)
    if fn == "add_relu":
        return pycudnn.convolution_add_relu(a["x"], a["w"], a["z"], bias=a.get("bias"),
                                            out=a.get("out"), **kw)
    if fn == "backward_data":
        return pycudnn.convolution_backward_data(a["dy"], a["w"], case.shape_arg,
                                                 out=a.get("out"), **kw)
    return pycudnn.convolution_backward_filter(a["x"], a["dy"], case.shape_arg,
                                               out=a.get("out"), **kw)


def outcome_of(exc: BaseException | None) -> str:
    if exc is None:
        return "ok"
    if isinstance(exc, E.NoDeviceError):
        return "no-device"
    if isinstance(exc, E.OutOfMemoryError):
        return "oom"
    if isinstance(exc, E.CudnnError):
        return "cudnn"
    if isinstance(exc, E.NoAlgorithmError):
        return "no-algorithm"
    if isinstance(exc, (ValueError, TypeError)) and not isinstance(exc, E.PycudnnError):
        return "refused"
    return "unexpected"


def judge(case: Case, violations: list[Violation], exc: BaseException | None,
          accepted: tuple = ("no-device", "oom", "ok")) -> tuple[str, list[str]]:
    """Compare what happened with the oracle; returns (outcome, known bugs hit) or fails."""
    outcome = outcome_of(exc)
    where = f"\ncase: {case.describe()}\nviolations: {[x.what for x in violations]}"
    if outcome == "unexpected":
        raise AssertionError(f"unexpected {type(exc).__name__}: {exc}{where}") from exc
    if outcome in ("refused", "cudnn"):
        if not violations:
            raise AssertionError(f"valid input refused with {type(exc).__name__}: {exc}{where}") from exc
        if not any(x.matches(exc) for x in violations):
            raise AssertionError(f"{type(exc).__name__} names none of the violations: {exc}{where}") from exc
        return f"refused:{type(exc).__name__}", []
    if outcome in accepted:
        if violations:
            if all(x.optional for x in violations):
                return f"valid:{outcome}", []
            bugs = [x.bug for x in violations if not x.optional]
            if all(b in KNOWN_BUGS for b in bugs):
                return f"known-bug:{outcome}", sorted(set(bugs))
            raise AssertionError(f"invalid input accepted ({outcome}: {exc}){where}")
        return f"valid:{outcome}", []
    raise AssertionError(f"{outcome} ({type(exc).__name__}: {exc}){where}")


def run_cpu_case(case: Case) -> str:
    violations, out_shape = oracle(case)
    note(case.describe())
    exc = None
    result = None
    try:
        result = call_case(case)
    except BaseException as e:  # judged below
        exc = e
    outcome, bugs = judge(case, violations, exc)
    if outcome == "valid:ok":  # only calls with nothing to compute return on a CPU machine
        assert isinstance(result, pycudnn.Tensor), result
        assert tuple(result.shape) == tuple(out_shape), (result.shape, out_shape)
        assert numel(result.shape) == 0 or any(numel(case.args[r].shape) == 0
                                               for r in case.args if isinstance(case.args[r], TSpec))
    if outcome == "valid:oom":
        assert "1 TiB" in str(exc) or "TiB" in str(exc), exc
    for lab in case.labels:
        event(lab.split(":")[0])
    REPORT.record(f"conv:{case.fn}", outcome, bugs, case.labels)
    return outcome


# ---- the conv-function fuzz ----------------------------------------------------------------------------

@pytest.mark.parametrize("fn", FUNCTIONS)
def test_conv_functions_fuzz(fn):
    @fuzz_settings(450)
    @given(case=conv_case(fn))
    def run(case):
        run_cpu_case(case)

    run()


# ---- tensor views ---------------------------------------------------------------------------------------

SIZES = st.one_of(_I(0, 4), _I(-3, -1), _S([2**31, 2**40]))
PTRS = st.one_of(st.just(BASE), _I(0, 64).map(lambda o: BASE + o), st.just(0),
                 _S([-1, 2**64, 2**64 - 8, True, 1.5, None, "0x10"]))
VIEW_DTYPES = _S(list(DTYPES) + ["half", "double", "float", "Float32"]
                              + POINTER_BAD_DTYPES[:8] + [np.float32, np.dtype("float16"), None])


@fuzz_settings(500)
@given(ptr=PTRS, shape=st.one_of(st.lists(SIZES, max_size=6).map(tuple), st.just(5),
                                 _S([None, "2,3", 1.5])),
       dtype=VIEW_DTYPES, strides=st.one_of(st.none(), st.lists(_I(-2, 9), max_size=6).map(tuple)),
       device=_S([0, 0, 1, -1, True, 1.0]))
def test_tensor_from_pointer_fuzz(ptr, shape, dtype, strides, device):
    """tensor_from_pointer refuses bad views with the parameter named; good ones keep what was given."""
    v: list[Violation] = []
    if isinstance(ptr, bool) or not _is_int(ptr):
        v.append(Violation("ptr type", r"ptr"))
    elif not 0 <= ptr < 2**64:
        v.append(Violation("ptr range", r"ptr"))
    if _is_int(shape):
        shape_t = (int(shape),)
    elif isinstance(shape, tuple):
        shape_t = shape
    else:
        shape_t = None
        v.append(Violation("shape type", r"shape"))
    if shape_t is not None and any(n < 0 for n in shape_t):
        v.append(Violation("negative size", r"shape"))
    name, native = dtype_info(dtype) if dtype is not None else (None, True)
    if dtype is None:
        v.append(Violation("dtype None", r"dtype", bug="dtype-none"))
        name = "float64"
    elif name is None:
        v.append(Violation("dtype", r"dtype"))
    elif not native:
        v.append(Violation("big-endian", r"dtype|endian|byte order", bug="big-endian-dtype"))
    if strides is not None:
        if any(s < 0 for s in strides):
            v.append(Violation("negative stride", r"strides"))
        if shape_t is not None and len(strides) != len(shape_t):
            v.append(Violation("strides length", r"strides"))
    if isinstance(device, bool) or not _is_int(device):
        v.append(Violation("device type", r"device"))
    elif device < 0:
        v.append(Violation("device < 0", r"device"))
    if name is not None and _is_int(ptr) and not isinstance(ptr, bool) and 0 <= ptr < 2**64:
        if ptr % ITEMSIZE[name]:
            v.append(Violation("misaligned", r"align"))
        if ptr == 0 and shape_t is not None and all(n >= 0 for n in shape_t):
            st_ = strides if strides is not None and len(strides) == len(shape_t) else contiguous(shape_t)
            if span_elements(shape_t, st_) > 0 and all(s >= 0 for s in st_):
                v.append(Violation("null with elements", r"null"))
    exc = None
    try:
        t = pycudnn.tensor_from_pointer(ptr, shape, dtype, strides, device=device)
    except BaseException as e:
        exc = e
    outcome, bugs = judge(Case("tensor_from_pointer", {}, {"ptr": ptr, "shape": shape,
                                                          "dtype": dtype, "strides": strides,
                                                          "device": device}),
                          v, exc, accepted=("ok",))
    if outcome == "valid:ok":
        assert t.ptr == ptr and t.shape == shape_t and t.device == device
        assert t.strides == (tuple(strides) if strides is not None else contiguous(shape_t))
        assert t.dtype.name == name
    REPORT.record("view:tensor_from_pointer", outcome, bugs)


@fuzz_settings(300)
@given(ptr=st.one_of(st.just(BASE), _I(1, 15).map(lambda o: BASE + o), st.just(0)),
       shape=st.lists(_I(0, 4), min_size=1, max_size=5).map(tuple),
       ts=_S(list(_TYPESTR.values()) + list(_UNSUPPORTED_TYPESTR.values()) + ["<f16", "=f4"]),
       strides=st.one_of(st.none(), st.lists(_I(-8, 40), min_size=1, max_size=5).map(tuple)),
       version=_S([0, 2, 3]), mask=_B)
def test_cuda_array_interface_fuzz(ptr, shape, ts, strides, version, mask):
    """as_tensor on __cuda_array_interface__ objects: bad ones refused with the reason named."""
    obj = FakeCAI(ptr, shape, ts, strides)
    obj.__cuda_array_interface__["version"] = version
    if mask:
        obj.__cuda_array_interface__["mask"] = object()
    item = {"<f4": 4, "=f4": 4, "<f2": 2, "<f8": 8, "<V2": 2}.get(ts)
    v: list[Violation] = []
    if item is None:
        v.append(Violation(f"typestr {ts}", r"dtype"))
    else:
        if mask:
            v.append(Violation("mask", r"mask"))
        if strides is not None and any(s < 0 or s % item for s in strides):
            v.append(Violation("byte strides", r"strides"))
        if ptr == 0 and numel(shape) > 0:
            v.append(Violation("null", r"null|ptr|pointer"))
        if ptr % item:
            v.append(Violation("misaligned", r"align"))
        if strides is not None and len(strides) != len(shape):
            v.append(Violation("strides length", r"strides"))
    exc = None
    try:
        t = pycudnn.as_tensor(obj)
    except BaseException as e:
        exc = e
    outcome, bugs = judge(Case("as_tensor(CAI)", {}, {"cai": obj.__cuda_array_interface__}), v,
                          exc, accepted=("ok",))
    if outcome == "valid:ok":
        assert t.shape == shape and t.ptr == ptr
    REPORT.record("view:as_tensor(cai)", outcome, bugs)


# ---- descriptor classes -------------------------------------------------------------------------------

WEIRD_ITEMS = [0, -1, -3, INT32_MAX, INT32_MAX + 1, -(2**31), -(2**31) - 1, 2**40, True, 1.5,
               None, "3", np.int64(2), np.int32(7), np.bool_(True), 2**16]
WEIRD_SEQS = [None, 3, "1,2,3", b"abc", 2.5, object()]
DESC_DTYPES = _S(list(DTYPES) * 4 + ["half", "double", "Float16", "int8", "int32", "float128",
                                     "uint8", None, object(), np.float32, np.dtype("float64"),
                                     "complex64", 3])


@st.composite
def corrupted(draw, base: tuple):
    """``base`` as a caller might pass it (tuple, list, numpy array), or corrupted: an odd item,
    one item too many or too few, or not a sequence at all."""
    how = draw(_S(["clean"] * 5 + ["item", "item", "len", "weird"]))
    items = list(base)
    if how == "item" and items:
        for _ in range(draw(_I(1, 2))):
            items[draw(_I(0, len(items) - 1))] = draw(_S(WEIRD_ITEMS))
    elif how == "len":
        items = items[:-1] if items and draw(_B) else items + [draw(_I(1, 3))]
    elif how == "weird":
        return draw(_S(WEIRD_SEQS))
    container = draw(_S(["tuple", "tuple", "list", "numpy"]))
    if container == "numpy" and all(_is_int(v) and -(2**62) < v < 2**62 for v in items):
        return np.array(items, dtype=np.int64)
    return tuple(items) if container != "list" else items


@st.composite
def desc_shape(draw):
    nd = draw(_S([3, 3, 4, 4, 4, 5, 5, 6, 7, 8, 1, 2, 9]))
    return tuple(draw(_S([1, 1, 2, 3, 4, 5, 1, 2, 3, 2**16, 2**20])) for _ in range(nd))


@st.composite
def desc_strides(draw, shape: tuple):
    """None (contiguous), a valid layout, or zero / negative / huge / overlapping strides."""
    how = draw(_S(["none", "none", "layout", "layout", "zero", "negative", "huge"]))
    if how == "none":
        return None
    lay, strides = draw(layout(shape))
    strides = list(strides if strides is not None else contiguous(shape))
    j = draw(_I(0, len(strides) - 1))
    if how == "zero":
        strides[j] = 0
    elif how == "negative":
        strides[j] = -max(strides[j], 1)
    elif how == "huge":
        strides[j] = draw(_S([2**30, INT32_MAX, INT32_MAX + 1, 2**40]))
    return tuple(strides)


def _seq_violations(value: Any, name: str) -> tuple[list[Violation], tuple | None]:
    """The checks of descriptors.int_tuple: a sequence of ints (not str/bytes), no bools."""
    if isinstance(value, (str, bytes)) or value is None or _is_int(value) or isinstance(value, float):
        return [Violation(f"{name}={value!r}", name)], None
    try:
        items = list(value)
    except TypeError:
        return [Violation(f"{name}={value!r}", name)], None
    if not all(_is_int(v) for v in items):
        return [Violation(f"{name} items {items!r}", name)], None
    return [], tuple(int(v) for v in items)


def _dtype_violation(dtype: Any, name: str = "dtype") -> list[Violation]:
    if dtype is None:
        return [Violation("dtype None", name, bug="dtype-none")]
    n, _ = dtype_info(dtype) if not _is_int(dtype) else (None, True)
    if n is None:
        return [Violation(f"dtype {dtype!r}", name)]
    return []


def _strict(v: list[Violation]) -> list[Violation]:
    """The violations that are not known library bugs (which the library treats as valid)."""
    return [x for x in v if x.bug not in KNOWN_BUGS and not x.optional]


def _descriptor_shape_violations(shape: Any, validate: bool) -> tuple[list[Violation], tuple | None]:
    """What the tensor and filter descriptor classes refuse in a shape: not a sequence of ints,
    fewer than 3 or more than 8 dims, sizes above int32, and (when validating) sizes <= 0."""
    v, shp = _seq_violations(shape, "shape")
    if shp is not None:
        if not 3 <= len(shp) <= 8:
            v.append(Violation(f"{len(shp)} dims", "shape"))
        v += _int32(shp, "shape")
        if validate and shp and min(shp) <= 0:
            v.append(Violation("size <= 0", "shape"))
    return v, shp


def _int32(values, name) -> list[Violation]:
    if values and (max(values) > INT32_MAX or min(values) < -(2**31)):
        return [Violation(f"{name} {values} outside int32", name)]
    return []


def _desc_outcome(suite: str, v: list[Violation], cudnn_reasons: list[str], fn: Callable, check_ok=None):
    """Run a descriptor constructor: Python violations -> ValueError/TypeError naming the
    parameter; else cuDNN's refusals -> CudnnError naming the C function; else it must succeed."""
    from pycudnn.cudnn import descriptors as D

    before = D.live_descriptor_count()
    exc = obj = None
    try:
        obj = fn()
    except BaseException as e:
        exc = e
    strict = [x for x in v if x.bug not in KNOWN_BUGS]
    known = sorted({x.bug for x in v if x.bug in KNOWN_BUGS})
    if strict or (known and any(x.matches(exc) for x in v if exc is not None)):
        outcome, bugs = judge(Case(suite, {}, {}), v, exc, accepted=("ok",))
    elif cudnn_reasons:
        if known:
            note(f"known bugs {known}: accepted by Python, so cuDNN's refusal applies")
        if not isinstance(exc, E.CudnnError):
            raise AssertionError(f"{suite}: expected a CudnnError ({cudnn_reasons}), got "
                                 f"{type(exc).__name__}: {exc}")
        assert re.search(r"cudnn\w+ failed", str(exc)), exc
        outcome, bugs = f"refused:{type(exc).__name__}", known
    else:
        if exc is not None:
            raise AssertionError(f"{suite}: valid input refused: {type(exc).__name__}: {exc}") from exc
        outcome, bugs = ("known-bug:ok", known) if known else ("valid:ok", [])
        if check_ok is not None:
            check_ok(obj)
        repr(obj)  # asks cuDNN what it holds
        obj.close()
        with pytest.raises(ValueError, match="closed"):
            obj.handle
        obj.close()  # twice is harmless
    if obj is not None:
        obj.close()
    del obj
    assert D.live_descriptor_count() == before, "a descriptor leaked (failed set not destroyed?)"
    REPORT.record(suite, outcome, bugs)


@fuzz_settings(500)
@given(data=st.data(), dtype=DESC_DTYPES, validate=_B)
def test_tensor_descriptor_fuzz(data, dtype, validate):
    from pycudnn.cudnn.descriptors import TensorDescriptor

    base = data.draw(desc_shape())
    strides = data.draw(desc_strides(base))
    shape = data.draw(corrupted(base))
    if strides is not None:
        strides = data.draw(corrupted(strides))

    v, shp = _descriptor_shape_violations(shape, validate)
    cud: list[str] = []
    v += _dtype_violation(dtype)
    st_ = None
    if strides is None:
        if shp is not None and 3 <= len(shp) <= 8 and not _int32(shp, "shape"):
            st_ = []
            acc = 1
            for n in reversed(shp):
                st_.append(acc)
                acc *= n
            st_ = tuple(reversed(st_))
            if max(st_) > INT32_MAX or min(st_) < -(2**31):
                v.append(Violation("contiguous strides overflow", "shape"))
    else:
        sv, st_ = _seq_violations(strides, "strides")
        v += sv
        if st_ is not None and shp is not None:
            if len(st_) != len(shp):
                v.append(Violation("strides length", "strides"))
            v += _int32(st_, "strides")
            if validate and any(s < 0 or (s == 0 and n != 1) for n, s in zip(shp, st_)):
                v.append(Violation("bad stride", "strides"))
    if not _strict(v) and shp is not None and st_ is not None:
        if any(n <= 0 for n in shp):
            cud.append("size <= 0")
        if any(s == 0 and n != 1 for n, s in zip(shp, st_)):
            cud.append("stride 0 on a dim of size > 1")
        if 1 + sum((n - 1) * abs(s) for n, s in zip(shp, st_)) > INT32_MAX:
            cud.append("span >= 2**31")

    def check(d):
        assert d.shape == shp and d.strides == st_
        assert d.query()[1] == list(shp) and d.query()[2] == list(st_)

    _desc_outcome(f"desc:TensorDescriptor(validate={validate})", v, cud,
                  lambda: TensorDescriptor(shape, dtype, strides, validate=validate), check)


@fuzz_settings(400)
@given(data=st.data(), dtype=DESC_DTYPES,
       fmt=_S(["NCHW", "NHWC", "nhwc", "NCHW", "NHWC", "NCHW_VECT_C", 0, 1, 2, 7, True, None, 1.0]),
       validate=_B)
def test_filter_descriptor_fuzz(data, dtype, fmt, validate):
    from pycudnn.cudnn.descriptors import FilterDescriptor

    shape = data.draw(corrupted(data.draw(desc_shape())))

    v, shp = _descriptor_shape_violations(shape, validate)
    cud: list[str] = []
    v += _dtype_violation(dtype)
    if not (fmt in ("NCHW", "NHWC", "nhwc") or (_is_int(fmt) and not isinstance(fmt, bool) and fmt in (0, 1))):
        v.append(Violation(f"format {fmt!r}", "format"))
    if not _strict(v) and any(n <= 0 for n in shp):
        cud.append("size <= 0")

    def check(d):
        assert d.shape == shp and d.query()[2] == list(shp)

    _desc_outcome(f"desc:FilterDescriptor(validate={validate})", v, cud,
                  lambda: FilterDescriptor(shape, dtype, fmt, validate=validate), check)


@fuzz_settings(500)
@given(data=st.data(), validate=_B)
def test_convolution_descriptor_fuzz(data, validate):
    from pycudnn.cudnn.descriptors import ConvolutionDescriptor

    n = data.draw(_S([1, 2, 2, 3, 3, 4, 5, 6, 0, 7]))
    pad = tuple(data.draw(_S([0, 0, 1, 2, 5])) for _ in range(n))
    strd = tuple(data.draw(_S([1, 1, 2, 3])) for _ in range(n))
    dil = tuple(data.draw(_S([1, 1, 2, 4])) for _ in range(n))
    padding, stride, dilation = (data.draw(corrupted(t)) for t in (pad, strd, dil))
    groups = data.draw(_S([1, 1, 1, 1, 1, 2, 2, 8, 0, -1, INT32_MAX, INT32_MAX + 1, True, 1.0, None,
                           "2", np.int8(3)]))
    dtype = data.draw(DESC_DTYPES)
    mode = data.draw(_S([1, 1, 1, 1, 1, 1, 0, "CONVOLUTION", "cross_correlation",
                         "CUDNN_CROSS_CORRELATION", 2, -1, None, 1.0, True]))
    allow_tf32 = data.draw(_S([True, False, 0, 1, None]))
    v: list[Violation] = []
    cud: list[str] = []
    pv, pad = _seq_violations(padding, "padding")
    sv, strd = _seq_violations(stride, "stride")
    dv, dil = _seq_violations(dilation, "dilation")
    v += pv + sv + dv
    if pad is not None and not 1 <= len(pad) <= 6:
        v.append(Violation("spatial dims", "padding"))
    for name, vals in (("stride", strd), ("dilation", dil)):
        if vals is not None and pad is not None and len(vals) != len(pad):
            v.append(Violation(f"{name} length", name))
    if isinstance(groups, (bool, np.bool_)) or not _is_int(groups):
        v.append(Violation(f"groups={groups!r}", "groups"))
        g = None
    else:
        g = int(groups)
        v += _int32((g,), "groups")
    for name, vals in (("padding", pad), ("stride", strd), ("dilation", dil)):
        if vals is not None:
            v += _int32(vals, name)
    if validate:
        if pad is not None and any(p < 0 for p in pad):
            v.append(Violation("padding < 0", "padding"))
        if strd is not None and any(s < 1 for s in strd):
            v.append(Violation("stride < 1", "stride"))
        if dil is not None and any(d < 1 for d in dil):
            v.append(Violation("dilation < 1", "dilation"))
        if g is not None and g < 1:
            v.append(Violation("groups < 1", "groups"))
    v += _dtype_violation(dtype)
    if not (mode in (0, 1) and not isinstance(mode, bool) and _is_int(mode)
            or isinstance(mode, str) and mode.upper().replace("CUDNN_", "") in ("CONVOLUTION", "CROSS_CORRELATION")):
        v.append(Violation(f"mode {mode!r}", "mode"))
    if not _strict(v):
        if any(p < 0 for p in pad):
            cud.append("padding < 0")
        if any(s < 1 for s in strd):
            cud.append("stride < 1")
        if any(d < 1 for d in dil):
            cud.append("dilation < 1")
        if g < 1:
            cud.append("groups < 1")

    def check(d):
        assert d.padding == pad and d.stride == strd and d.dilation == dil and d.groups == g
        q = d.query()
        assert (q[0], q[1], q[2], q[5]) == (list(pad), list(strd), list(dil), g)

    _desc_outcome(f"desc:ConvolutionDescriptor(validate={validate})", v, cud,
                  lambda: ConvolutionDescriptor(padding, stride, dilation, groups, dtype,
                                                allow_tf32, mode, validate=validate), check)


@fuzz_settings(500)
@given(data=st.data(), validate=_B)
def test_output_shape_fuzz(data, validate):
    """ConvolutionDescriptor.output_shape against the formula, with mismatched ranks, channels and
    groups, kernels larger than the padded input, and sizes near int32."""
    from pycudnn.cudnn import descriptors as D

    n = data.draw(_I(1, 3))
    pad = tuple(data.draw(_S([0, 0, 1, 2, 3, 0, 1, 2**20, 2**30, INT32_MAX])) for _ in range(n))
    strd = tuple(data.draw(_S([1, 1, 2, 3, 1, 2, 2**20, 2**30, INT32_MAX])) for _ in range(n))
    dil = tuple(data.draw(_S([1, 1, 2, 3, 1, 2, 2**20, 2**30, INT32_MAX])) for _ in range(n))
    g = data.draw(_S([1, 1, 2, 3, 4]))
    xn = data.draw(_S([n + 2] * 6 + [n + 1, n + 3]))
    wn = data.draw(_S([xn] * 6 + [xn + 1, max(3, xn - 1)]))
    cg = data.draw(_I(1, 3))
    k = g * data.draw(_I(1, 3)) + data.draw(_S([0] * 6 + [1]))
    c = cg * g + data.draw(_S([0] * 6 + [1, -1]))
    xs = tuple([data.draw(_I(1, 3)), max(c, 1)]
               + [data.draw(_S(list(range(1, 10)) * 2 + [2**20, 2**30])) for _ in range(xn - 2)])
    ws = tuple([k, cg] + [data.draw(_S([1, 2, 3, 4] * 3 + [2**16])) for _ in range(wn - 2)])
    dtype = data.draw(_S(DTYPES))
    try:
        x_desc = D.TensorDescriptor(xs, dtype)
        w_desc = D.FilterDescriptor(ws, dtype)
        conv = D.ConvolutionDescriptor(pad, strd, dil, g, dtype)
    except (ValueError, E.CudnnError):
        event("descriptor refused (shape too large for int32 strides)")
        return
    wrong_args = data.draw(_I(0, 15)) == 0
    closed = data.draw(_I(0, 15)) == 0
    v: list[Violation] = []
    cud: list[str] = []
    if wrong_args:
        x_arg, w_arg = (w_desc, x_desc) if data.draw(_B) else (x_desc, "w")
        v.append(Violation("descriptor types", r"x_desc|w_desc"))
    else:
        x_arg, w_arg = x_desc, w_desc
    if closed:
        data.draw(_S([x_desc, w_desc, conv])).close()
        v.append(Violation("closed descriptor", r"closed"))
    ok_ranks = len(xs) == n + 2 and len(ws) == n + 2
    if validate:
        if len(xs) != n + 2:
            v.append(Violation("x rank", r"x_desc"))
        if len(ws) != n + 2:
            v.append(Violation("w rank", r"w_desc"))
        if xs[1] != ws[1] * g or ws[0] % g:
            v.append(Violation("channels/groups", r"groups"))
        if ok_ranks:
            padded = [i + 2 * p for i, p in zip(xs[2:], pad)]
            kern = [d * (kk - 1) + 1 for kk, d in zip(ws[2:], dil)]
            if any(p < kk for p, kk in zip(padded, kern)):
                v.append(Violation("kernel larger than padded input", r"x_desc|kernel"))
    else:
        if not ok_ranks or len(xs) != len(ws) or xs[1] != ws[1] * g:
            cud.append("ranks or channels")
    expected = None
    if ok_ranks:
        padded = [i + 2 * p for i, p in zip(xs[2:], pad)]
        kern = [d * (kk - 1) + 1 for kk, d in zip(ws[2:], dil)]
        if any(p < kk for p, kk in zip(padded, kern)):
            cud.append("kernel larger than padded input")
        else:
            expected = (xs[0], ws[0]) + tuple((p - kk) // s + 1 for p, kk, s in zip(padded, kern, strd))
    overflow = ok_ranks and (any(i + 2 * p > INT32_MAX for i, p in zip(xs[2:], pad))
                             or any(d * (kk - 1) + 1 > INT32_MAX for kk, d in zip(ws[2:], dil)))
    exc = res = None
    try:
        res = conv.output_shape(x_arg, w_arg, validate=validate)
    except BaseException as e:
        exc = e
    if v:
        outcome, bugs = judge(Case("output_shape", {}, {}), v, exc, accepted=("ok",))
    elif cud or overflow:
        # int32 overflow inside cuDNN's own arithmetic: mostly refused as BAD_PARAM (no reason),
        # but with validate=False cuDNN can also return a wrapped-around (even negative) shape
        if overflow and exc is None:
            # returned, so it must be the true shape (a wrapped one is refused: ValueError)
            assert res == expected and not cud, \
                f"output_shape returned {res} (expected {expected}; {cud}; int32 overflow)"
            outcome, bugs = "valid:ok", []
            REPORT.record("desc:output_shape", outcome, bugs)
            for d in (x_desc, w_desc, conv):
                d.close()
            return
        else:
            assert isinstance(exc, E.CudnnError) or (overflow and isinstance(exc, ValueError)), \
                f"expected a CudnnError ({cud}, overflow={overflow}), got {type(exc).__name__}: {exc}"
            assert "cudnnGetConvolutionNdForwardOutputDim" in str(exc) or isinstance(exc, ValueError)
            outcome = f"refused:{type(exc).__name__}"
        bugs = []
    else:
        if exc is not None:
            raise AssertionError(f"valid output_shape refused: {type(exc).__name__}: {exc}")
        assert res == expected, (res, expected)
        outcome, bugs = "valid:ok", []
    for d in (x_desc, w_desc, conv):
        d.close()
    REPORT.record("desc:output_shape", outcome, bugs)


@fuzz_settings(200)
@given(mode=_S(["RELU", "relu", "CUDNN_ACTIVATION_SIGMOID", 0, 5, 6, 7, -1, True, None,
                             "gelu", 1.0]),
       nan=_S([0, 1, "PROPAGATE_NAN", "NOT_PROPAGATE_NAN", 2, None, True]),
       coef=_S([0.0, 1, -3.5, 6.0, float("inf"), float("-inf"), float("nan"), True,
                             "1", None, complex(1, 0), np.float32(2.0), np.int8(1), 1e308]))
def test_activation_descriptor_fuzz(mode, nan, coef):
    from pycudnn._types import ActivationMode, NanPropagation
    from pycudnn.cudnn.descriptors import ActivationDescriptor

    v: list[Violation] = []

    def enum_ok(cls, value) -> bool:
        if isinstance(value, str):
            key = value.upper()
            for prefix in ("CUDNN_ACTIVATION_", "CUDNN_"):
                if key.startswith(prefix):
                    key = key[len(prefix):]
            return key in cls.__members__
        return _is_int(value) and int(value) in set(int(m) for m in cls)

    if not enum_ok(ActivationMode, mode):
        v.append(Violation(f"mode {mode!r}", "mode"))
    if not enum_ok(NanPropagation, nan):
        v.append(Violation(f"nan {nan!r}", "nan_propagation"))
    if isinstance(coef, (bool, np.bool_, str, complex)) or coef is None:
        v.append(Violation(f"coef {coef!r}", "coef"))
    elif math.isnan(float(coef)):
        v.append(Violation("coef nan", "coef"))
    _desc_outcome("desc:ActivationDescriptor", v, [],
                  lambda: ActivationDescriptor(mode, nan, coef))


# ---- the known bugs, one precise example each (strict xfail: a fix makes them fail) --------------------

def _t(*shape, dtype="float32", ptr=BASE, strides=None):
    return pycudnn.tensor_from_pointer(ptr, shape, dtype, strides)


def _refused_before_gpu(fn, *args, match: str, **kwargs):
    """The call must raise ValueError/TypeError naming ``match`` (not NoDeviceError / OOM)."""
    with pytest.raises((ValueError, TypeError), match=match):
        fn(*args, **kwargs)


def _xfail(bug: str):
    return pytest.mark.xfail(reason=f"library bug '{bug}': {KNOWN_BUGS[bug]}", strict=True,
                             raises=(AssertionError, pytest.fail.Exception, E.PycudnnError))


X = dict(x=(2, 4, 8, 8), w=(8, 4, 3, 3), y=(2, 8, 6, 6))


def test_bug_null_cuda_array_interface_pointer_is_refused():
    with pytest.raises(ValueError, match="null|pointer|ptr"):
        pycudnn.as_tensor(FakeCAI(0, (2, 4, 8, 8), "<f4", None))


def test_bug_misaligned_cuda_array_interface_pointer_is_refused():
    with pytest.raises(ValueError, match="align"):
        pycudnn.as_tensor(FakeCAI(BASE + 2, (2, 4, 8, 8), "<f4", None))


def test_bug_self_overlapping_out_is_refused():
    _refused_before_gpu(pycudnn.convolution, _t(*X["x"]), _t(*X["w"], ptr=BASE + REGION),
                        out=_t(*X["y"], ptr=BASE + 2 * REGION, strides=(0, 36, 6, 1)), match="out")


def test_bug_out_aliasing_an_input_is_refused():
    _refused_before_gpu(pycudnn.convolution, _t(2, 8, 8, 8), _t(8, 8, 3, 3, ptr=BASE + REGION),
                        padding=1, out=_t(2, 8, 8, 8), match="out")


def test_bug_geometry_above_int32_is_refused_up_front():
    _refused_before_gpu(pycudnn.convolution, _t(*X["x"]), _t(8, 4, 1, 1, ptr=BASE + REGION),
                        stride=2**40, match="stride")


def test_bug_sample_above_int32_is_refused_before_allocating():
    _refused_before_gpu(pycudnn.convolution, _t(1, 1, 50000, 50000),
                        _t(1, 1, 1, 1, ptr=BASE + REGION), match="sample|2\\^31")


def test_bug_conv_transpose_checks_weight_sizes():
    _refused_before_gpu(pycudnn.conv_transpose, _t(2, 4, 5, 5), _t(4, 2, 0, 3, ptr=BASE + REGION),
                        match="weight")


def test_bug_stream_handle_must_fit_64_bits():
    with pytest.raises(ValueError, match="stream"):
        from pycudnn.runtime.memory import resolve_stream
        resolve_stream(2**64)


def test_bug_big_endian_device_views_are_refused():
    with pytest.raises(TypeError, match="dtype"):
        pycudnn.tensor_from_pointer(BASE, (2, 4, 8, 8), np.dtype(">f4"))


def test_bug_dtype_none_is_refused():
    with pytest.raises(TypeError, match="dtype"):
        pycudnn.tensor_from_pointer(BASE, (2, 4, 8, 8), None)


def test_bug_negative_cuda_array_interface_shape_is_refused():
    with pytest.raises(ValueError, match="shape"):
        pycudnn.as_tensor(FakeCAI(BASE, (2, -4, 8, 8), "<f4", None))


def test_bug_cuda_array_interface_strides_length_is_checked():
    with pytest.raises(ValueError, match="strides"):
        pycudnn.as_tensor(FakeCAI(BASE, (2, 4, 8, 8), "<f4", (1024, 256, 32)))


def test_bug_output_shape_never_returns_wrapped_sizes():
    from pycudnn.cudnn.descriptors import ConvolutionDescriptor, FilterDescriptor, TensorDescriptor

    conv = ConvolutionDescriptor((0,), (1,), (2**30,))
    x, w = TensorDescriptor((1, 3, 1), "float32"), FilterDescriptor((3, 3, 3), "float32")
    try:
        shape = conv.output_shape(x, w, validate=False)
    except (ValueError, E.CudnnError):
        return
    assert all(n > 0 for n in shape), f"output_shape returned {shape}"


# ---- valid edge cases (large padding, dilated kernels, groups, 3-D strides), checked explicitly ------------

@pytest.mark.parametrize("kwargs,x,w", [
    (dict(padding=5), (1, 2, 1, 1), (3, 2, 3, 3)),                      # padding larger than the input
    (dict(padding=(4, 0), dilation=(3, 1)), (1, 2, 2, 6), (3, 2, 3, 3)),  # dilated kernel > input, padded
    (dict(groups=4), (2, 8, 5, 5), (4, 2, 3, 3)),                       # depthwise-like groups
    (dict(stride=(3, 1, 2)), (1, 1, 4, 4, 4), (1, 1, 2, 2, 2)),         # 3-D, mixed strides
])
def test_valid_edge_cases_pass_validation(kwargs, x, w):
    with pytest.raises(E.NoDeviceError):
        pycudnn.convolution(_t(*x), _t(*w, ptr=BASE + REGION), **kwargs)


# ---- the count ---------------------------------------------------------------------------------------------

FLOOR = 2000


def test_case_count_floor():
    """Runs last in this file: the fuzz above must have run at least FLOOR cases in all."""
    suites = {"conv:" + f for f in FUNCTIONS}
    missing = [s for s in suites if REPORT.cases[s] == 0]
    if missing:
        pytest.skip(f"the fuzz tests did not all run in this pytest run (missing {missing})")
    total = REPORT.total
    print(f"\npycudnn fuzz: {total} cases ran: {dict(REPORT.cases)}")
    if SCALE >= 1:
        assert total >= FLOOR, f"only {total} fuzz cases ran (floor {FLOOR})"
