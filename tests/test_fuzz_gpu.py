"""The fuzz of test_fuzz.py with real device buffers (GPU).

The same case generators and oracle as the CPU fuzz, but every tensor view points into a real
device buffer (allocated through pycudnn.runtime.memory, filled with random values of the view's dtype,
with slack bytes around every view). After each call the buffers are copied back and:

* a refused call (ValueError / TypeError naming the parameter) must leave every byte of every
  caller buffer unchanged;
* a valid call must give the float64 reference's result (tests/reference.py), leave its inputs
  unchanged and not write outside the output view (gaps of a strided ``out=`` included); an
  unsupported configuration may raise CudnnError / NoAlgorithmError, with the inputs unchanged;
* the device must have no sticky CUDA error afterwards.

Regions where the library is known (or strongly suspected, from reading it) to misbehave on a GPU
are not generated here but tested one by one below (null and misaligned pointers in a subprocess,
since an illegal address would poison this process's CUDA context).

``PYCUDNN_FUZZ_GPU_EXAMPLES`` sets the number of examples per function (default 25, so 125 cases: some cases build plans that are compiled at run time, seconds each).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, note, settings

import reference as R
import test_fuzz as F

pytestmark = pytest.mark.gpu

EXAMPLES = int(os.environ.get("PYCUDNN_FUZZ_GPU_EXAMPLES", "25") or 25)
SLACK = 256  # bytes before and after every buffer, compared too
REPORT = F.FuzzReport("fuzz (GPU, real buffers)", "pycudnn/fuzz_gpu")


@pytest.fixture(scope="module", autouse=True)
def _report(request):
    F.register_report(request.config, REPORT)
    yield REPORT


def _mem():
    from pycudnn.runtime import memory

    return memory


# ---- real buffers ---------------------------------------------------------------------------------------

def _item(spec) -> int:
    name, _ = F.dtype_info(spec.dtype)
    if name is not None:
        return F.ITEMSIZE[name]
    try:
        return np.dtype(F.typestr(spec.dtype)).itemsize
    except TypeError:
        return 4


def _span_bytes(spec) -> int:
    if any(n < 0 for n in spec.shape):
        return 0
    strides = spec.strides if spec.strides is not None else F.contiguous(spec.shape)
    if len(strides) != len(spec.shape) or any(s < 0 for s in strides):
        return 0
    return F.span_elements(spec.shape, strides) * _item(spec)


def _np_dtype(spec):
    from pycudnn._types import normalize_dtype

    name, native = F.dtype_info(spec.dtype)
    return normalize_dtype(name) if name is not None and native else None


class Buffers:
    """One device buffer per memory root (a role, or the role an alias points into)."""

    def __init__(self, case: F.Case, rng: np.random.Generator) -> None:
        M = _mem()
        need: dict[str, int] = {}
        fill: dict[str, object] = {}
        for role, spec in case.args.items():
            if not isinstance(spec, F.TSpec):
                continue
            root = spec.alias or role
            need[root] = max(need.get(root, 0), spec.offset + _span_bytes(spec) + 16)
            if root not in fill and _np_dtype(spec) is not None:
                fill[root] = _np_dtype(spec)
        self.bufs = {}
        self.host = {}
        for root, n in need.items():
            total = n + 2 * SLACK
            dt = fill.get(root, np.dtype("float32"))
            count = -(-total // dt.itemsize)
            values = rng.uniform(-1, 1, count).astype(np.float32).astype(dt)
            host = np.frombuffer(values.tobytes()[:total], np.uint8).copy()
            buf = M.allocate(total)
            M.copy_host_to_device(buf.ptr, host)
            self.bufs[root] = buf
            self.host[root] = host

    def base(self, root: str) -> int:
        return self.bufs[root].ptr + SLACK

    def snapshot(self) -> dict[str, np.ndarray]:
        M = _mem()
        out = {}
        for root, buf in self.bufs.items():
            a = np.empty_like(self.host[root])
            M.copy_device_to_host(a, buf.ptr)
            out[root] = a
        return out

    def close(self) -> None:
        for buf in self.bufs.values():
            buf.close()


def view_bytes(case: F.Case, role: str, snap: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(the logical array of ``role`` read from a snapshot as float64, the byte mask it covers)."""
    spec = case.args[role]
    root = spec.alias or role
    raw = snap[root]
    dt = _np_dtype(spec)
    item = dt.itemsize
    strides = spec.strides if spec.strides is not None else F.contiguous(spec.shape)
    start = SLACK + spec.offset
    mask = np.zeros(raw.shape, bool)
    if F.numel(spec.shape) == 0:
        return np.zeros(spec.shape), mask
    idx = np.zeros(spec.shape, np.int64)
    for d, (n, s) in enumerate(zip(spec.shape, strides)):
        shape = [1] * len(spec.shape)
        shape[d] = n
        idx = idx + (np.arange(n) * s).reshape(shape)
    flat = np.frombuffer(raw[start:start + (int(idx.max()) + 1) * item].tobytes(), dt)
    arr = flat[idx].astype(np.float64)
    for k in range(item):
        mask[start + idx.ravel() * item + k] = True
    return arr, mask


# ---- the reference ------------------------------------------------------------------------------------------

TOL = {"float64": 1e-9, "float32": 2e-5, "tf32": 5e-3, "float16": 1e-2, "bfloat16": 6e-2}


def _geometry(case: F.Case, nd: int):
    g = {}
    for name, minimum in (("stride", 1), ("padding", 0), ("dilation", 1)):
        _, g[name] = F.spatial_violations(name, case.kw.get(name, F.MISSING), nd, minimum)
    _, groups = F.groups_violations(case.kw.get("groups", F.MISSING))
    return g["stride"], g["padding"], g["dilation"], groups


def reference(case: F.Case, snap, out_shape) -> np.ndarray | None:
    """The float64 result the case must produce (None when it cannot be checked numerically)."""
    arrays = {r: view_bytes(case, r, snap)[0] for r, s in case.args.items()
              if isinstance(s, F.TSpec) and r != "out"}
    fn = case.fn
    first = arrays["dy"] if fn == "backward_data" else arrays["x"]
    second = arrays["dy"] if fn == "backward_filter" else arrays["w"]
    nd = first.ndim - 2
    stride, padding, dilation, groups = _geometry(case, nd)
    if first.size == 0 or second.size == 0 or F.numel(out_shape) == 0:
        y = np.zeros(out_shape)  # nothing to sum: zeros (then the epilogue, for forward)
        if fn in ("backward_data", "backward_filter"):
            return y
    elif fn in ("convolution", "add_relu"):
        y = R.conv_forward(arrays["x"], arrays["w"], stride, padding, dilation, groups)
    elif fn == "conv_transpose":
        _, op = F.spatial_violations("output_padding", case.kw.get("output_padding", F.MISSING), nd, 0)
        y = R.conv_transpose(arrays["x"], arrays["w"], stride, padding, op, dilation, groups)
    elif fn == "backward_data":
        return R.conv_backward_data(arrays["dy"], arrays["w"], tuple(case.shape_arg), stride,
                                    padding, dilation, groups)
    else:
        return R.conv_backward_filter(arrays["x"], arrays["dy"], tuple(case.shape_arg), stride,
                                      padding, dilation, groups)
    if fn == "add_relu":
        alpha = float(case.kw.get("alpha", 1.0))
        if not math.isfinite(alpha) or abs(alpha) > 1e4:
            return None
        y = y + alpha * arrays["z"]
    if "bias" in arrays:
        y = y + arrays["bias"].reshape((1, -1) + (1,) * nd)
    if fn == "add_relu" or case.kw.get("activation") == "relu":
        y = np.maximum(y, 0)
    return y


def tolerance(case: F.Case) -> float:
    spec = case.args.get("x") or case.args.get("dy")
    name = F.dtype_info(spec.dtype)[0]
    if name == "float32" and case.kw.get("allow_tf32", True):
        name = "tf32"
    tol = TOL[name]
    return tol * (2 if case.fn in ("backward_filter", "add_relu") else 1)


def rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    if ref.size == 0:
        return 0.0
    scale = max(float(np.abs(ref).max()), 1e-6)
    return float(np.abs(got - ref).max()) / scale


# ---- one case -----------------------------------------------------------------------------------------------

def _sticky_error() -> str | None:
    from cuda.bindings import runtime as rt

    err, = rt.cudaDeviceSynchronize()
    if int(err):
        return f"cudaDeviceSynchronize: {err}"
    err, = rt.cudaGetLastError()
    return f"cudaGetLastError: {err}" if int(err) else None


def run_gpu_case(case: F.Case, rng: np.random.Generator, repeat: bool = True) -> str:
    import pycudnn

    M = _mem()
    bufs = Buffers(case, rng)
    try:
        violations, out_shape = F.oracle(case, bufs.base, M.device_count())
        strict = F._strict(violations)
        known = sorted({v.bug for v in violations if v.bug in F.KNOWN_BUGS})
        before = bufs.snapshot()
        note(case.describe())
        exc = result = None
        try:
            result = F.call_case(case, bufs.base)
        except BaseException as e:  # judged below
            exc = e
        sticky = _sticky_error()
        assert sticky is None, f"sticky CUDA error after {case.describe()}: {sticky}"
        after = bufs.snapshot()
        outcome = F.outcome_of(exc)
        where = f"\ncase: {case.describe()}\nviolations: {[v.what for v in violations]}"
        if outcome == "unexpected":
            raise AssertionError(f"unexpected {type(exc).__name__}: {exc}{where}") from exc
        if strict or (violations and outcome == "refused"):
            if outcome not in ("refused", "cudnn"):
                raise AssertionError(f"invalid input not refused ({outcome}: {exc!r}){where}")
            outcome, bugs = F.judge(case, violations, exc, accepted=())
            changed = [r for r in before if not np.array_equal(before[r], after[r])]
            assert not changed, f"refused call changed the caller's buffers {changed}{where}"
            REPORT.record(f"gpu:{case.fn}", outcome, bugs, case.labels)
            return outcome
        if known:  # accepted although invalid (a known bug): nothing to check numerically
            REPORT.record(f"gpu:{case.fn}", f"known-bug:{outcome}", known, case.labels)
            return outcome
        # valid
        out_root = None
        if isinstance(case.args.get("out"), F.TSpec):
            out_root = case.args["out"].alias or "out"
        for root in before:
            if root != out_root:
                assert np.array_equal(before[root], after[root]), f"input buffer {root} changed{where}"
        if outcome in ("cudnn", "no-algorithm"):
            event(f"unsupported: {type(exc).__name__}")
            REPORT.record(f"gpu:{case.fn}", f"valid:unsupported:{type(exc).__name__}", (), case.labels)
            return outcome
        if outcome != "ok":
            raise AssertionError(f"valid input gave {type(exc).__name__}: {exc}{where}") from exc
        assert isinstance(result, pycudnn.Tensor)
        assert tuple(result.shape) == tuple(out_shape), (result.shape, out_shape)
        if out_root is not None:
            got, mask = view_bytes(case, "out", after)
            assert result.ptr == bufs.base(out_root) + case.args["out"].offset
            outside = ~mask
            assert np.array_equal(before[out_root][outside], after[out_root][outside]), \
                f"bytes outside the out= view changed{where}"
        else:
            got = np.asarray(result.numpy(), np.float64)
        ref = reference(case, before, out_shape)
        if ref is not None:
            err = rel_error(got, ref)
            assert err <= tolerance(case), f"wrong result: error {err:.3g} > {tolerance(case)}{where}"
        reads_out = any(isinstance(sp, F.TSpec) and r != "out" and (sp.alias or r) == out_root
                        for r, sp in case.args.items())
        if repeat and not reads_out:  # the same call again: through the prepared fast path now
            again = F.call_case(case, bufs.base)
            assert _sticky_error() is None
            got2 = (view_bytes(case, "out", bufs.snapshot())[0] if out_root is not None
                    else np.asarray(again.numpy(), np.float64))
            if ref is not None:
                assert rel_error(got2, ref) <= tolerance(case), f"second call wrong{where}"
        REPORT.record(f"gpu:{case.fn}", "valid:ok", (), case.labels)
        return "ok"
    finally:
        bufs.close()


@pytest.mark.parametrize("fn", F.FUNCTIONS)
def test_gpu_fuzz(fn):
    import pycudnn

    rng = np.random.default_rng(7)

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=not F.RANDOM, database=None,
              suppress_health_check=list(HealthCheck), print_blob=True)
    @given(case=F.conv_case(fn, gpu=True))
    def run(case):
        run_gpu_case(case, rng)

    with pycudnn.flags(tuning_db=False, benchmark_limit=2):
        run()


# ---- regions not generated above, one test each ------------------------------------------------------------

def _dev(a, dtype="float32", memory_format="contiguous"):
    import pycudnn

    return pycudnn.from_numpy(np.asarray(a, np.float32), dtype=dtype, memory_format=memory_format)


def _host(t):
    return np.asarray(t.numpy(), np.float64)


@pytest.mark.parametrize("engine", ["graph", "v7"])
@pytest.mark.parametrize("fn", ["convolution", "add_relu"])
def test_strided_bias_is_read_with_its_strides(engine, fn):
    """A bias view with stride 2 (every other element of a buffer) must be read as such, fused or
    not (graph.bias_spec builds a contiguous bias; V7Descriptors.bias too)."""
    import pycudnn

    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    z = rng.standard_normal((2, 8, 6, 6)).astype(np.float32)
    raw = rng.standard_normal(16).astype(np.float32)
    B = _dev(raw)
    bias = pycudnn.tensor_from_pointer(B.ptr, (8,), "float32", strides=(2,), owner=B)
    ref = R.conv_forward(x, w, (1, 1), (1, 1), (1, 1), 1) + raw[::2].reshape(1, -1, 1, 1)
    kw = dict(padding=1, engine=engine, allow_tf32=False)
    if fn == "convolution":
        y = pycudnn.convolution(_dev(x), _dev(w), bias, activation="relu", **kw)
        ref = np.maximum(ref, 0)
    else:
        y = pycudnn.convolution_add_relu(_dev(x), _dev(w), _dev(z), bias=bias, **kw)
        ref = np.maximum(ref + z, 0)
    assert rel_error(_host(y), ref) <= 5e-5


@pytest.mark.parametrize("engine", ["graph", "v7"])
@pytest.mark.parametrize("role", ["x", "w"])
def test_expanded_input_is_computed_or_refused_up_front(engine, role):
    """An input with a stride of 0 (a broadcast view, as torch.expand makes) must either give the
    right result or be refused before any GPU work with a message naming the input; today it is
    staged and then refused by TensorDescriptor ('strides: a stride of 0 ...')."""
    import pycudnn

    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    if role == "x":
        row = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
        x = np.broadcast_to(row, x.shape)
        base = _dev(row)
        X = pycudnn.tensor_from_pointer(base.ptr, x.shape, "float32", strides=(0, 36, 6, 1), owner=base)
        W = _dev(w)
    else:
        row = rng.standard_normal((1, 4, 3, 3)).astype(np.float32)
        w = np.broadcast_to(row, w.shape)
        base = _dev(row)
        W = pycudnn.tensor_from_pointer(base.ptr, w.shape, "float32", strides=(0, 9, 3, 1), owner=base)
        X = _dev(x)
    try:
        y = pycudnn.convolution(X, W, padding=1, engine=engine, allow_tf32=False)
    except (ValueError, TypeError) as exc:
        name = "input" if role == "x" else "weight"
        assert name in str(exc), f"refused without naming the {name}: {exc}"
        return
    assert rel_error(_host(y), R.conv_forward(x, w, (1, 1), (1, 1), (1, 1), 1)) <= 5e-5


@pytest.mark.parametrize("engine", ["graph", "v7"])
def test_conv_transpose_output_padding_at_least_stride(engine):
    """PyTorch allows output_padding >= stride when it is < dilation; pycudnn passes validation and
    must then compute it (reference: the adjoint) or refuse before GPU work naming output_padding,
    not fail inside cuDNN after allocating the output."""
    import pycudnn

    rng = np.random.default_rng(13)
    x = rng.standard_normal((2, 4, 5, 5)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    geo = dict(stride=1, padding=0, output_padding=1, dilation=2)
    try:
        y = pycudnn.conv_transpose(_dev(x), _dev(w), engine=engine, allow_tf32=False, **geo)
    except (ValueError, TypeError) as exc:
        assert "output_padding" in str(exc) or "output padding" in str(exc), exc
        return
    ref = R.conv_transpose(x, w, (1, 1), (0, 0), (1, 1), (2, 2), 1)
    assert y.shape == ref.shape
    assert rel_error(_host(y), ref) <= 5e-5


def _prepared_pair(engine):
    import pycudnn

    rng = np.random.default_rng(14)
    x = _dev(rng.standard_normal((2, 4, 6, 6)))
    w = _dev(rng.standard_normal((8, 4, 3, 3)))
    b = _dev(rng.standard_normal(8))
    kw = dict(padding=1, engine=engine, allow_tf32=False)
    pycudnn.convolution(x, w, b, **kw)  # prepares the call signature
    pycudnn.convolution(x, w, b, **kw)
    return x, w, b, kw


@pytest.mark.parametrize("engine", ["graph", "v7"])
def test_prepared_path_refuses_like_the_full_path(engine):
    """After a call signature is prepared, the same calls with a bad out=, or a bias or weight on
    another device, must be refused as the full path refuses them, and a valid out= of another
    layout must still be accepted (the fast path's checks are the full path's, not stricter or
    looser; its key holds x's device but not w's or the bias's)."""
    import pycudnn
    from pycudnn.api import prepared as P

    x, w, b, kw = _prepared_pair(engine)
    ref = _host(pycudnn.convolution(x, w, b, **kw))
    outcomes = {}
    for label, make in {
        "out wrong shape": lambda: dict(out=pycudnn.empty((2, 8, 5, 6))),
        "out wrong dtype": lambda: dict(out=pycudnn.empty((2, 8, 6, 6), "float16")),
        "out channels_last": lambda: dict(out=pycudnn.empty((2, 8, 6, 6), memory_format="channels_last")),
        "bias claims device 1": lambda: dict(bias_override=pycudnn.tensor_from_pointer(
            b.ptr, (8,), "float32", device=1, owner=b)),
        "weight claims device 1": lambda: dict(w_override=pycudnn.tensor_from_pointer(
            w.ptr, w.shape, "float32", device=1, owner=w)),
    }.items():
        # (a device-1 claim on memory that is really on device 0 is safe to launch on any machine)
        results = []
        for fast in (True, False):
            if not fast:
                P.clear_fast_calls()
            args = make()
            bias = args.pop("bias_override", b)
            ww = args.pop("w_override", w)
            try:
                y = pycudnn.convolution(x, ww, bias, **kw, **args)
                results.append(("ok", float(rel_error(_host(y), ref))))
            except Exception as exc:  # compared below
                results.append((type(exc).__name__, str(exc).split("\n")[0]))
            if not fast:
                pycudnn.convolution(x, w, b, **kw)  # prepare again for the next variant
                pycudnn.convolution(x, w, b, **kw)
        outcomes[label] = results
    problems = []
    for label, (fast, full) in outcomes.items():
        if fast[0] != full[0]:
            problems.append(f"{label}: prepared path -> {fast}, full path -> {full}")
        elif fast[0] == "ok" and fast[1] > 5e-5:
            problems.append(f"{label}: wrong result through the prepared path ({fast[1]:.3g})")
    assert outcomes["bias claims device 1"][1][0] == "ValueError", outcomes
    assert outcomes["weight claims device 1"][1][0] == "ValueError", outcomes
    assert outcomes["out channels_last"][1][0] == "ok", outcomes
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("fn", ["backward_filter", "convolution"])
def test_nothing_to_compute_zeroes_only_the_out_view(fn):
    """When there is nothing to sum (an empty batch for backward filter; an empty input with
    padding for a forward convolution) the output is zero-filled: only its elements, not the
    memory between them (api.conv's fill_zero memsets the whole span of a strided out=)."""
    import pycudnn

    ones = pycudnn.from_numpy(np.ones(2 * 8 * 4 * 3 * 3, np.float32))
    if fn == "backward_filter":
        out = pycudnn.tensor_from_pointer(ones.ptr, (8, 4, 3, 3), "float32", strides=(72, 18, 6, 2),
                                          owner=ones)
        pycudnn.convolution_backward_filter(pycudnn.empty((0, 4, 5, 5)), pycudnn.empty((0, 8, 3, 3)),
                                            (8, 4, 3, 3), out=out)
    else:  # x has no element (width 0) but padding gives the output (1, 8, 5, 2) elements
        out = pycudnn.tensor_from_pointer(ones.ptr, (1, 8, 5, 2), "float32", strides=(160, 20, 4, 2),
                                          owner=ones)
        pycudnn.convolution(pycudnn.empty((1, 4, 3, 0)), pycudnn.from_numpy(np.ones((8, 4, 1, 1), np.float32)),
                            padding=1, out=out)
    host = ones.numpy()
    n = int(np.prod(out.shape))
    assert np.all(host[0:2 * n:2] == 0), "the out= view was not zero-filled"
    assert np.all(host[1:2 * n:2] == 1), "memory between the out= view's elements was overwritten"


UNSAFE_CHILD = textwrap.dedent(r"""
    import json, sys
    import numpy as np
    import pycudnn
    from cuda.bindings import runtime as rt

    class CAI:
        def __init__(self, ptr, shape):
            self.__cuda_array_interface__ = {"data": (ptr, False), "shape": shape,
                                             "typestr": "<f4", "strides": None, "version": 3}

    kind = sys.argv[1]
    x = pycudnn.from_numpy(np.ones((2, 4, 8, 8), np.float32))
    w = pycudnn.from_numpy(np.ones((8, 4, 3, 3), np.float32))
    buf = pycudnn.from_numpy(np.ones(2 * 4 * 8 * 8 + 8, np.float32))
    args = {"null_x": (CAI(0, (2, 4, 8, 8)), w),
            "null_w": (x, CAI(0, (8, 4, 3, 3))),
            "misaligned_x": (CAI(buf.ptr + 2, (2, 4, 8, 8)), w),
            "misaligned_w": (x, CAI(buf.ptr + 1, (8, 4, 3, 3)))}[kind]
    result = {}
    try:
        pycudnn.convolution(*args, engine=sys.argv[2])
        result["outcome"] = "accepted"
    except Exception as exc:
        result["outcome"] = type(exc).__name__
        result["message"] = str(exc).split("\n")[0][:300]
    err, = rt.cudaDeviceSynchronize()
    result["sticky"] = str(err) if int(err) else None
    print(json.dumps(result))
""")


@pytest.mark.parametrize("engine", ["graph", "v7"])
@pytest.mark.parametrize("kind", ["null_x", "null_w", "misaligned_x", "misaligned_w"])
def test_null_and_misaligned_device_arrays_are_refused(kind, engine):
    """A __cuda_array_interface__ array with a null or misaligned data pointer must be refused with
    a ValueError before any GPU work. Run in a subprocess: if it is not, cuDNN reads through the
    pointer and the illegal address would poison this process's CUDA context."""
    proc = subprocess.run([sys.executable, "-c", UNSAFE_CHILD, kind, engine], capture_output=True,
                          text=True, timeout=300, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert proc.returncode == 0, f"the child crashed (rc {proc.returncode}): {proc.stderr[-2000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["sticky"] is None, f"{kind}: CUDA context poisoned: {result}"
    assert result["outcome"] == "ValueError", f"{kind} ({engine}): {result}"
    assert any(k in result["message"].lower() for k in ("null", "align", "pointer", "ptr")), result


@pytest.mark.skipif(not os.environ.get("PYCUDNN_CPU_FUZZ_ON_GPU"),
                    reason="set PYCUDNN_CPU_FUZZ_ON_GPU=1 to run the CPU fuzz (test_fuzz.py) here, "
                           "in a subprocess that sees no GPU (about a minute)")
def test_cpu_fuzz_without_gpu(tmp_path):
    """test_fuzz.py builds views of made-up addresses, so on a GPU machine it runs where no GPU is
    visible (CUDA_VISIBLE_DEVICES='') and must pass there, against this machine's libcudnn."""
    report = tmp_path / "fuzz.json"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYCUDNN_FUZZ_REPORT=str(report))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           os.path.join("tests", "test_fuzz.py")], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    data = json.loads(report.read_text())["pycudnn/fuzz"]
    print(f"\nCPU fuzz in a subprocess without GPU: {data['total']} cases")
    assert data["total"] >= F.FLOOR
