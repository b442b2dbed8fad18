"""Call cost and time to first result: pycudnn against NVIDIA's own Python binding,
``nvidia-cudnn-frontend`` (``import cudnn``), and PyTorch.

    PYTHONPATH=. python3 benchmarks/vs_frontend.py --json $OUT/vs_frontend.json      # ~3-4 min
    PYTHONPATH=. python3 benchmarks/vs_frontend.py --quick --json $OUT/vs_frontend_quick.json
    PYCUDNN_GRAPH_REPLAY=1 PYTHONPATH=. python3 benchmarks/vs_frontend.py --parts calls --json ...

Four parts (``--parts calls,first,breakdown,floor``, all by default):

* **calls** (host time per remembered call, the GPU idle; one process): a tiny convolution
  (1x8x8x8, eight 3x3 filters, padding 1) in ``bf16-nhwc`` and ``fp32-nchw`` (TF32 off, as
  ``allow_tf32=False``), timed as ``host_per_call.py`` times (``gpu_timing.compare_host``: chunks
  of 50 calls, the device synchronized between chunks outside the timing, columns interleaved,
  the order rotated each round; median us per call). Columns: ``F.conv2d``; the frontend's
  ``graph.execute(dict, workspace, handle)`` and, where its version has it, ``execute`` with
  ``tensor_uids`` order; pycudnn with torch tensors, CuPy arrays (when CuPy is installed) and
  pycudnn views in, with and without ``out=``, the flags set as defaults (``pycudnn.config``),
  as keywords and through ``pycudnn.flags()``, ``stream=`` as a torch stream object, looked up
  per call, as an int and as a CuPy stream; ``prepare_convolution`` objects. Backward data and
  backward filter against ``torch.ops.aten.convolution_backward`` (and the frontend's
  ``conv_dgrad`` / ``conv_wgrad`` graphs); the operations (ReLU, softmax, max pooling, batch
  norm training and inference, dropout) against their ``F.*`` calls. Ratios: column / F.conv2d
  (or its torch column), column / the frontend's dict execute.
* **first** (time to first result; a fresh process per side and setting, ``--processes`` of
  each, the sides' order rotated): in a process with torch imported and the CUDA context up, the
  library's import, then its first 3x3 convolution (bf16 NHWC, batch 32, 64 channels at 56x56),
  from the call to the result on the GPU, then the median over further new shapes. pycudnn with
  its heuristics and with ``benchmark=True`` (an empty tuning database each process); the
  frontend with heuristics mode A and with its first 10 buildable plans timed (1 warm-up and 3
  timed executions each, CUDA events, the fastest kept); PyTorch with
  ``torch.backends.cudnn.benchmark`` off and on.
* **breakdown** (where pycudnn's first calls go): the same first call in a fresh process under
  ``cProfile``, and a further new shape's (the first one run before, outside the profile); the
  inclusive time of the functions that load libcudnn and the CUDA driver, probe the devices,
  prepare the memory pool, import cuda.bindings (none should), create the handle, run the gate's
  self-test, read the tuning database, build the operation graph, query heuristics and describe
  their configs, finalize plans, measure candidates (and time them) and execute (nested parts
  are not summed; cProfile adds its own overhead to the Python parts).
* **floor**: ``cudnnBackendExecute``'s own host time: the plan pycudnn chose for the tiny
  convolution executed directly through ctypes with a finalized variant pack, in a loop; beside
  it ``ExecutionPlan.execute`` (the variant pack looked up), the prepared launcher, the same
  execute captured once into a CUDA graph and launched with ``cuGraphLaunch`` (what graph
  replay does) and an empty ctypes call into libcudnn (``cudnnGetVersion``).

The frontend is optional: without it its columns and processes say what is missing. It must
use pycudnn's libcudnn (the same file): the script puts the directory of
``pycudnn.library_path()`` first on ``LD_LIBRARY_PATH`` before ``import cudnn`` (the frontend's
loader tries that path first) and reports both libraries' versions.

Run it with the pycudnn to measure importable (on ``PYTHONPATH``, or installed from a wheel, as
users get it: bytecode compiled at install); the fresh processes import the same copy. ``--json``
writes every figure with the commit (``PYCUDNN_COMMIT`` when set, else ``git rev-parse``).
"""

from __future__ import annotations

import argparse
import contextvars
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

import gpu_timing  # this script's folder is on sys.path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS = ("calls", "first", "breakdown", "floor")
CHILD_TIMEOUT_S = 300
#: the tiny convolution of the call-cost part: N, C, H, W, K, R (padding 1, stride 1)
TINY = (1, 8, 8, 8, 8, 3)
#: config -> (torch dtype name, channels_last, allow_tf32)
CONFIGS: dict[str, tuple[str, bool, bool]] = {"bf16-nhwc": ("bfloat16", True, True),
                                              "fp32-nchw": ("float32", False, False)}
#: the first-result part's layers (N, C, H, K; 3x3, padding 1): the first is the first call
FIRST_SHAPES = [(32, 64, 56, 64), (32, 128, 28, 128), (32, 256, 14, 256), (32, 512, 7, 512),
                (32, 96, 40, 96), (32, 192, 20, 192), (32, 320, 10, 320)]
#: the fresh-process settings of the first-result part
SIDES = ("pycudnn heuristics", "pycudnn benchmark=True", "frontend heuristics",
         "frontend 10 plans timed", "torch benchmark off", "torch benchmark on")
AUTOTUNE_PLANS = 10
#: what is undone after the call-cost columns are timed (the flags() block of each config)
CLEANUPS: list[Callable[[], Any]] = []
#: what the breakdown reports: (label, file suffix, function name); inclusive times
BREAKDOWN = [
    ("libcudnn loaded (ffi.library._load)", "ffi/library.py", "_load"),
    ("CUDA driver loaded and cuInit (driver.driver)", "runtime/memory/driver.py", "driver"),
    ("devices probed (devices._probe_devices)", "runtime/memory/devices.py", "_probe_devices"),
    ("memory pool prepared (buffers._prepare_pool)", "runtime/memory/buffers.py", "_prepare_pool"),
    ("cuda.bindings runtime imported (bindings.runtime)", "runtime/memory/bindings.py", "runtime"),
    ("cuDNN handle created (handle._create)", "runtime/handle.py", "_create"),
    ("the gate made and self-tested (gate.gate_for)", "runtime/gate.py", "gate_for"),
    ("  of which its self-test (StreamGate.self_test)", "runtime/gate.py", "self_test"),
    ("tuning database looked up (tuning_db.lookup)", "tuning/db.py", "lookup"),
    ("tuning database stored (tuning_db.store)", "tuning/db.py", "store"),
    ("GPU identity for the database (tuning_db.device_identity)", "tuning/db.py",
     "device_identity"),
    ("operation graph built (build_convolution_graph)", "graph/build.py", "build_convolution_graph"),
    ("heuristics queried (LazyCandidates._query)", "graph/plan.py", "_query"),
    ("engine configs described (plan._describe)", "graph/plan.py", "_describe"),
    ("plans finalized (ExecutionPlan.finalize)", "graph/plan.py", "finalize"),
    ("candidates measured (GraphEngine._measure)", "engines/graph.py", "_measure"),
    ("  of which timing finalized plans (GraphEngine._time_all)", "engines/graph.py", "_time_all"),
    ("plan executed (ExecutionPlan.execute)", "graph/plan.py", "execute"),
    ("the search iterator (iterate.try_all)", "search/iterate.py", "try_all"),
]


# ---- shared helpers (no GPU) ----------------------------------------------------------------------

def commit() -> str:
    """The measured tree's commit: PYCUDNN_COMMIT (a copy without this tree's git metadata), else
    ``git rev-parse --short HEAD`` in the repository, else "unknown"."""
    if os.environ.get("PYCUDNN_COMMIT"):
        return os.environ["PYCUDNN_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=REPO).stdout.strip()
    except Exception:  # noqa: BLE001 - a copy without git
        return "unknown"


def libcudnn_dir() -> str | None:
    """The directory of the libcudnn pycudnn loads (None when it was found by soname only)."""
    try:
        import pycudnn

        path = pycudnn.library_path()
    except Exception:  # noqa: BLE001 - reported by the caller as a missing library
        return None
    d = os.path.dirname(path)
    return d if d and os.path.isdir(d) else None


def with_libcudnn_first(env: dict[str, str], directory: str | None) -> dict[str, str]:
    """``env`` with ``directory`` first on LD_LIBRARY_PATH (the frontend's loader looks there
    before its own wheel path), so that it opens pycudnn's libcudnn."""
    if not directory:
        return env
    out = dict(env)
    rest = [p for p in out.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p and p != directory]
    out["LD_LIBRARY_PATH"] = os.pathsep.join([directory, *rest])
    return out


def import_frontend() -> tuple[Any, str | None]:
    """``(cudnn module, None)``, or ``(None, why not)``: the frontend is optional."""
    os.environ.update(with_libcudnn_first(dict(os.environ), libcudnn_dir()))
    try:
        import cudnn  # nvidia-cudnn-frontend
    except Exception as exc:  # noqa: BLE001 - ImportError, or its loader failing
        return None, (f"nvidia-cudnn-frontend is not importable ({gpu_timing.error_text(exc)}); "
                      f"install it (pip install nvidia-cudnn-frontend, or the wheel carried in .whl/)")
    if not hasattr(cudnn, "pygraph"):
        return None, f"nvidia-cudnn-frontend {getattr(cudnn, '__version__', '?')} has no cudnn.pygraph"
    return cudnn, None


def ratio_rows(figures: dict[str, dict[str, Any]], refs: dict[str, tuple[str | None, str | None]]
               ) -> dict[str, dict[str, Any]]:
    """Each column's figures with ``vs_torch`` and ``vs_frontend`` (its median over its
    reference columns' medians) where those were measured."""
    out: dict[str, dict[str, Any]] = {}
    for name, fig in figures.items():
        entry = dict(fig)
        torch_ref, fe_ref = refs.get(name, (None, None))
        for key, ref in (("vs_torch", torch_ref), ("vs_frontend", fe_ref)):
            if ("error" not in fig and ref is not None and ref in figures
                    and "error" not in figures[ref]):
                entry[key] = gpu_timing.ratio(fig["median"], figures[ref]["median"])
                entry[key + "_column"] = ref
        out[name] = entry
    return out


def format_calls(table: dict[str, dict[str, Any]]) -> str:
    lines = ["| column | us per call | / torch | / frontend dict |", "|---|---|---|---|"]
    for name, e in table.items():
        if "error" in e:
            lines.append(f"| {name} | {e['error']} | | |")
            continue
        vt, vf = e.get("vs_torch"), e.get("vs_frontend")
        lines.append(f"| {name} | {e['median']:.2f} | {'' if vt is None else f'{vt:.2f}'} | "
                     f"{'' if vf is None else f'{vf:.2f}'} |")
    return "\n".join(lines)


def summarize_first(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One side's fresh processes: the range of import, first call and import + first call, and
    the range of the per-process medians over the further new shapes (ms)."""
    ok = [r for r in results if "error" not in r]
    out: dict[str, Any] = {"processes": len(results), "errors": [r["error"] for r in results if "error" in r]}
    if not ok:
        return out

    def rng(values: Sequence[float]) -> list[float]:
        return [min(values), max(values)]
    out["import_ms"] = rng([r["import_ms"] for r in ok])
    out["first_ms"] = rng([r["first_ms"] for r in ok])
    out["import_plus_first_ms"] = rng([r["import_ms"] + r["first_ms"] for r in ok])
    further = [statistics.median(r["further_ms"]) for r in ok if r.get("further_ms")]
    if further:
        out["further_median_ms"] = rng(further)
    return out


def format_first(summary: dict[str, dict[str, Any]]) -> str:
    def r(v: Any) -> str:
        return "" if v is None else f"{v[0]:.1f}-{v[1]:.1f}"
    lines = ["| side | import ms | first call ms | import + first ms | further new shape, median ms |",
             "|---|---|---|---|---|"]
    for side, s in summary.items():
        if "first_ms" not in s:
            lines.append(f"| {side} | {'; '.join(s.get('errors', [])) or 'not run'} | | | |")
            continue
        lines.append(f"| {side} | {r(s.get('import_ms'))} | {r(s['first_ms'])} | "
                     f"{r(s['import_plus_first_ms'])} | {r(s.get('further_median_ms'))} |")
    return "\n".join(lines)


def breakdown_from_stats(stats: dict[tuple[str, int, str], tuple], total_s: float
                         ) -> list[dict[str, Any]]:
    """The BREAKDOWN rows from ``pstats.Stats(...).stats`` (inclusive seconds of every function
    whose file ends with the suffix and whose name matches), in ms, with the calls counted."""
    rows = []
    for label, suffix, func in BREAKDOWN:
        ct, calls = 0.0, 0
        for (filename, _line, name), (_cc, nc, _tt, cum, _callers) in stats.items():
            if name == func and filename.replace("\\", "/").endswith(suffix):
                ct += cum
                calls += nc
        rows.append({"what": label, "ms": ct * 1e3, "calls": calls,
                     "share": ct / total_s if total_s > 0 else float("nan")})
    return rows


def top_functions(stats: dict[tuple[str, int, str], tuple], n: int = 25) -> list[dict[str, Any]]:
    """The ``n`` functions with the largest inclusive time (pycudnn's, the frontend's, cuda's)."""
    rows = []
    for (filename, line, name), (_cc, nc, _tt, cum, _callers) in stats.items():
        f = filename.replace("\\", "/")
        if "/pycudnn/" in f or "/cuda/" in f or name.startswith("<built-in method _ctypes"):
            rows.append({"function": f"{f.split('/pycudnn/')[-1]}:{line}({name})", "ms": cum * 1e3,
                         "calls": nc})
    rows.sort(key=lambda r: -r["ms"])
    return rows[:n]


# ---- part (a): call cost ----------------------------------------------------------------------------

def _frontend_graph(cudnn: Any, torch: Any, handle: Any, direction: str, tensors: dict[str, Any],
                    dtype: Any, allow_tf32: bool, heuristics: Sequence[Any]) -> tuple[Any, dict[str, Any]]:
    """A frontend graph for one convolution direction on these torch tensors, its plans built
    from ``heuristics`` (the first that builds); returns (graph, {role: graph tensor})."""
    io = {torch.float32: cudnn.data_type.FLOAT, torch.bfloat16: cudnn.data_type.BFLOAT16,
          torch.float16: cudnn.data_type.HALF}[dtype]
    f32 = cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=f32, compute_data_type=f32, handle=handle)

    def t(name: str) -> Any:
        v = tensors[name]
        return g.tensor(name=name, dim=list(v.shape), stride=list(v.stride()), data_type=io)
    geo = {"padding": [1, 1], "stride": [1, 1], "dilation": [1, 1], "compute_data_type": f32}
    if direction == "fwd":
        ins = {"x": t("x"), "w": t("w")}
        out = g.conv_fprop(image=ins["x"], weight=ins["w"], name="conv", **geo)
        role = "y"
    elif direction == "dgrad":
        ins = {"dy": t("dy"), "w": t("w")}
        out = g.conv_dgrad(loss=ins["dy"], filter=ins["w"], name="dgrad", **geo)
        role = "dx"
    else:
        ins = {"x": t("x"), "dy": t("dy")}
        out = g.conv_wgrad(image=ins["x"], loss=ins["dy"], name="wgrad", **geo)
        role = "dw"
    ref = tensors[role]
    out.set_output(True).set_dim(list(ref.shape)).set_stride(list(ref.stride())).set_data_type(io)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans(list(heuristics))
    if dtype == torch.float32 and not allow_tf32:
        g.deselect_numeric_notes([cudnn.numerical_note.TENSOR_CORE])  # no TF32, as pycudnn's filter
    g.check_support()
    g.build_plans()
    return g, {**ins, role: out}


def _frontend_columns(torch: Any, tensors: dict[str, Any], dtype: Any, allow_tf32: bool
                      ) -> tuple[dict[str, Callable[[], Any]], dict[str, str], dict[str, Any]]:
    cudnn, why = import_frontend()
    fns: dict[str, Callable[[], Any]] = {}
    skipped: dict[str, str] = {}
    info: dict[str, Any] = {}
    names = {"fwd": "frontend: execute(dict)", "dgrad": "frontend: backward data execute(dict)",
             "wgrad": "frontend: backward filter execute(dict)"}
    if cudnn is None:
        for n in (*names.values(), "frontend: execute(tensor_uids)"):
            skipped[n] = why or "frontend unavailable"
        return fns, skipped, {"error": why}
    info = {"version": getattr(cudnn, "__version__", "?"), "backend_version": cudnn.backend_version()}
    handle = cudnn.create_handle()
    stream = torch.cuda.current_stream().cuda_stream
    if stream:
        cudnn.set_stream(handle, stream)
    for direction, name in names.items():
        try:
            g, gt = _frontend_graph(cudnn, torch, handle, direction, tensors, dtype, allow_tf32,
                                    [cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            ws = torch.empty(max(1, g.get_workspace_size()), device="cuda", dtype=torch.uint8)
            pack = {gt[r]: tensors[r] for r in gt}
            fns[name] = lambda g=g, pack=pack, ws=ws: g.execute(pack, ws, handle=handle)
            if direction == "fwd":
                uids = tuple(gt[r].get_uid() for r in gt)
                bufs = tuple(tensors[r] for r in gt)
                try:
                    g.execute(bufs, ws, handle=handle, tensor_uids=uids)
                    fns["frontend: execute(tensor_uids)"] = (
                        lambda g=g, bufs=bufs, ws=ws, uids=uids: g.execute(bufs, ws, handle=handle,
                                                                           tensor_uids=uids))
                except TypeError as exc:  # a version without tensor_uids
                    skipped["frontend: execute(tensor_uids)"] = (
                        f"this frontend version has no tensor_uids order: {gpu_timing.error_text(exc)}")
                try:
                    info["fwd_plan"] = g.get_plan_name_at_index(g._plan_index)
                except Exception:  # noqa: BLE001 - informational only
                    pass
        except Exception as exc:  # noqa: BLE001 - reported, the run goes on
            skipped[name] = gpu_timing.error_text(exc)
            if direction == "fwd":
                skipped["frontend: execute(tensor_uids)"] = "no forward graph"
    return fns, skipped, info


def call_columns(config: str, quick: bool = False) -> tuple[dict[str, Callable[[], Any]], dict[str, str],
                                                             dict[str, tuple[str | None, str | None]],
                                                             dict[str, Any]]:
    """The columns of one config: (functions, skipped with why, references, frontend info)."""
    import torch
    import torch.nn.functional as F

    import pycudnn

    dtype_name, channels_last, tf32 = CONFIGS[config]
    dtype = getattr(torch, dtype_name)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    pycudnn.config.allow_tf32 = tf32  # the "defaults" columns; keywords and flags() say it again
    n, c, h, w_, k, r = TINY

    def make(*shape: int) -> Any:
        return torch.randn(*shape, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
    x, w, dy = make(n, c, h, w_), make(k, c, r, r), make(n, k, h, w_)
    y, dx, dw = torch.empty_like(dy), torch.empty_like(x), torch.empty_like(w)
    tensors = {"x": x, "w": w, "y": y, "dy": dy, "dx": dx, "dw": dw}
    X, W, Y, DY, DX, DW = (pycudnn.as_tensor(t) for t in (x, w, y, dy, dx, dw))
    xs, ws = tuple(x.shape), tuple(w.shape)
    kw = {"allow_tf32": tf32}
    # a context with pycudnn.flags(allow_tf32=...) entered, as a block around a loop has it; the
    # block is left in that context once the columns are timed (CLEANUPS)
    ctx = contextvars.copy_context()
    block = pycudnn.flags(**kw)
    ctx.run(block.__enter__)
    CLEANUPS.append(lambda: ctx.run(block.__exit__, None, None, None))
    conv, bd, bf = pycudnn.convolution, pycudnn.convolution_backward_data, pycudnn.convolution_backward_filter
    cur = torch.cuda.current_stream
    s_obj, s_int = cur(), cur().cuda_stream
    aten_bwd = torch.ops.aten.convolution_backward
    T, FE = "F.conv2d", "frontend: execute(dict)"
    fns: dict[str, Callable[[], Any]] = {}
    refs: dict[str, tuple[str | None, str | None]] = {}
    skipped: dict[str, str] = {}

    def add(name: str, fn: Callable[[], Any], torch_ref: str | None = T, fe_ref: str | None = FE) -> None:
        fns[name] = fn
        refs[name] = (torch_ref, fe_ref)

    add(T, lambda: F.conv2d(x, w, None, 1, 1), None, None)
    fe_fns, fe_skipped, fe_info = _frontend_columns(torch, tensors, dtype, tf32)
    skipped.update(fe_skipped)
    for name, fn in fe_fns.items():
        add(name, fn, {"frontend: execute(dict)": T, "frontend: execute(tensor_uids)": T,
                       "frontend: backward data execute(dict)": "torch: backward data",
                       "frontend: backward filter execute(dict)": "torch: backward filter"}[name],
            None if name == FE else (FE if "tensor_uids" in name else None))
    add("torch in (flags as defaults)", lambda: conv(x, w, padding=1))
    add("torch in, out= (flags as defaults)", lambda: conv(x, w, padding=1, out=y))
    add("torch in, flags as keywords", lambda: conv(x, w, padding=1, **kw))
    add("torch in, flags as keywords, out=", lambda: conv(x, w, padding=1, out=y, **kw))
    add("torch in, flags() block", lambda: ctx.run(conv, x, w, padding=1))
    add("torch in, stream=torch stream", lambda: conv(x, w, padding=1, stream=s_obj))
    add("torch in, stream=current_stream() per call", lambda: conv(x, w, padding=1, stream=cur()))
    add("torch in, stream=int", lambda: conv(x, w, padding=1, stream=s_int))
    add("torch in, stream=torch stream, out=", lambda: conv(x, w, padding=1, stream=s_obj, out=y))
    try:
        import cupy

        xc, wc, yc = cupy.from_dlpack(x), cupy.from_dlpack(w), cupy.from_dlpack(y)
        cs = cupy.cuda.get_current_stream()
        add("CuPy in", lambda: conv(xc, wc, padding=1))
        add("CuPy in, out=", lambda: conv(xc, wc, padding=1, out=yc))
        add("CuPy in, stream=CuPy stream", lambda: conv(xc, wc, padding=1, stream=cs))
    except Exception as exc:  # noqa: BLE001 - CuPy is optional; bf16 arrays need a recent CuPy
        for col in ("CuPy in", "CuPy in, out=", "CuPy in, stream=CuPy stream"):
            skipped[col] = f"CuPy: {gpu_timing.error_text(exc)}"
    add("views in", lambda: conv(X, W, padding=1))
    add("views in, out=", lambda: conv(X, W, padding=1, out=Y))
    try:
        prep = pycudnn.prepare_convolution(X, W, padding=1)
        add("prepared, torch in", lambda: prep(x, w))
        add("prepared, torch in, out=", lambda: prep(x, w, out=y))
        add("prepared, views in, out=", lambda: prep(X, W, out=Y))
    except Exception as exc:  # noqa: BLE001
        for col in ("prepared, torch in", "prepared, torch in, out=", "prepared, views in, out="):
            skipped[col] = f"prepare_convolution: {gpu_timing.error_text(exc)}"
    # backward
    TD, TW = "torch: backward data", "torch: backward filter"
    FD, FW = "frontend: backward data execute(dict)", "frontend: backward filter execute(dict)"
    add(TD, lambda: aten_bwd(dy, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                             [True, False, False]), None, None)
    add(TW, lambda: aten_bwd(dy, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                             [False, True, False]), None, None)
    add("backward data, torch in", lambda: bd(dy, w, xs, padding=1), TD, FD)
    add("backward data, torch in, out=", lambda: bd(dy, w, xs, padding=1, out=dx), TD, FD)
    add("backward data, views in, out=", lambda: bd(DY, W, xs, padding=1, out=DX), TD, FD)
    add("backward filter, torch in", lambda: bf(x, dy, ws, padding=1), TW, FW)
    add("backward filter, torch in, out=", lambda: bf(x, dy, ws, padding=1, out=dw), TW, FW)
    add("backward filter, views in, out=", lambda: bf(X, DY, ws, padding=1, out=DW), TW, FW)
    for name in (FD, FW):
        if name in refs:
            refs[name] = (TD if name == FD else TW, None)
    if not quick:
        _op_columns(torch, F, pycudnn, x, y, dtype, add)
    # a column whose first call fails is reported, not timed
    for name in list(fns):
        try:
            fns[name]()
        except Exception as exc:  # noqa: BLE001
            skipped[name] = gpu_timing.error_text(exc)
            del fns[name]
    torch.cuda.synchronize()
    return fns, skipped, refs, fe_info


def _op_columns(torch: Any, F: Any, pycudnn: Any, x: Any, y: Any, dtype: Any,
                add: Callable[..., None]) -> None:
    """The operations beside convolutions on the tiny tensor: each F.* call, pycudnn with torch
    tensors in, and with out= where the function takes one."""
    c = x.shape[1]
    pw = torch.ones(c, device="cuda")  # batch-norm parameters and statistics in float32 (cuDNN's rule)
    pb, rm, rv = torch.zeros(c, device="cuda"), torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
    pooled = torch.empty_like(F.max_pool2d(x, 2))
    state = pycudnn.DropoutState(0.5, seed=0)
    ops = [
        ("relu", lambda: F.relu(x), lambda: pycudnn.activation_forward(x),
         lambda: pycudnn.activation_forward(x, out=y)),
        ("softmax", lambda: F.softmax(x, dim=1), lambda: pycudnn.softmax_forward(x),
         lambda: pycudnn.softmax_forward(x, out=y)),
        ("max pool 2x2", lambda: F.max_pool2d(x, 2), lambda: pycudnn.pooling_forward(x, 2),
         lambda: pycudnn.pooling_forward(x, 2, out=pooled)),
        ("batch norm training", lambda: F.batch_norm(x, rm, rv, pw, pb, training=True),
         lambda: pycudnn.batch_norm_forward_training(x, pw, pb, rm, rv),
         lambda: pycudnn.batch_norm_forward_training(x, pw, pb, rm, rv, out=y)),
        ("batch norm inference", lambda: F.batch_norm(x, rm, rv, pw, pb, training=False),
         lambda: pycudnn.batch_norm_forward_inference(x, pw, pb, rm, rv), None),
        ("dropout", lambda: F.dropout(x, 0.5, training=True),
         lambda: pycudnn.dropout_forward(x, state), None),
    ]
    for name, tfn, pfn, pout in ops:
        add(f"torch: {name}", tfn, None, None)
        add(f"{name}, torch in", pfn, f"torch: {name}", None)
        if pout is not None:
            add(f"{name}, torch in, out=", pout, f"torch: {name}", None)
    try:  # the compiled kernels some operations switch to after a few calls: built before timing
        from pycudnn.ops import runtime_kernels

        for _, _, pfn, _ in ops:
            for _ in range(4):
                pfn()
        runtime_kernels.wait(timeout=120)
    except Exception:  # noqa: BLE001 - a failing op is reported by its first call
        pass


def measure_calls(configs: Sequence[str], calls: int, rounds: int, quick: bool) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {}
    for config in configs:
        print(f"calls: {config}", file=sys.stderr, flush=True)
        fns, skipped, refs, fe_info = call_columns(config, quick)
        figures: dict[str, dict[str, Any]] = dict(
            gpu_timing.compare_host(fns, calls, synchronize=torch.cuda.synchronize, rounds=rounds))
        for name, why in skipped.items():
            figures[name] = {"error": why}
        ordered = {name: figures[name] for name in [*refs, *skipped] if name in figures}
        table = ratio_rows(ordered, refs)
        while CLEANUPS:
            CLEANUPS.pop()()
        out[config] = {"columns": table, "frontend": fe_info, "targets": call_targets(table)}
    return out


def call_targets(table: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Issue 25's targets for the remembered calls, each with the figures it compares: at most
    the frontend's dict execute and 0.9x F.conv2d; out= at most the same call without it; a
    prepared call at most 0.75x F.conv2d."""
    def med(name: str) -> float | None:
        e = table.get(name)
        return None if e is None or "error" in e else e["median"]
    verdicts: dict[str, Any] = {}
    t, fe = med("F.conv2d"), med("frontend: execute(dict)")
    for name, e in table.items():
        m = med(name)
        if m is None or name.startswith(("F.", "torch:", "frontend:")):
            continue
        v: dict[str, Any] = {}
        if name.startswith("prepared"):
            if t is not None:
                v["at most 0.75x torch"] = m <= 0.75 * t
        elif e.get("vs_torch_column") == "F.conv2d":
            if t is not None:
                v["at most 0.9x F.conv2d"] = m <= 0.9 * t
            if fe is not None:
                v["at most the frontend's dict execute"] = m <= fe
        elif e.get("vs_torch") is not None:
            v["at most 0.9x its torch call"] = e["vs_torch"] <= 0.9
        if name.endswith("out=") or ", out=" in name:
            base = med(name.replace(", out=", ""))
            if base is not None:
                v["out= at most without it"] = m <= base
        if v:
            verdicts[name] = v
    return verdicts


# ---- part (d): the floor ----------------------------------------------------------------------------

def measure_floor(configs: Sequence[str], calls: int, rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for config in configs:
        try:
            out[config] = _floor(config, calls, rounds)
        except Exception as exc:  # noqa: BLE001 - reported
            out[config] = {"error": gpu_timing.error_text(exc)}
    return out


def _floor(config: str, calls: int, rounds: int) -> dict[str, Any]:
    """The plan pycudnn chose for the tiny convolution of ``config``, launched five ways."""
    import torch

    import pycudnn
    from pycudnn.ffi import library
    from pycudnn.runtime.memory import replay

    dtype_name, channels_last, tf32 = CONFIGS[config]
    dtype = getattr(torch, dtype_name)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    n, c, h, w_, k, r = TINY
    x = torch.randn(n, c, h, w_, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
    w = torch.randn(k, c, r, r, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
    y = torch.empty(n, k, h, w_, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
    prep = pycudnn.prepare_convolution(x, w, padding=1, engine="graph", allow_tf32=tf32)
    plan = prep.record.plan
    nbytes = plan.workspace_size or 0
    ws_buf = torch.empty(nbytes, device="cuda", dtype=torch.uint8) if nbytes else None
    ws = ws_buf.data_ptr() if ws_buf is not None else 0
    stream = torch.cuda.current_stream().cuda_stream
    handle = pycudnn.get_handle(0, stream)
    ptrs = (x.data_ptr(), w.data_ptr(), y.data_ptr())
    plan.execute(handle, ptrs, ws)  # makes the variant pack
    vp = plan._packs[(ptrs, ws)]
    execute, plan_ptr, vp_ptr = plan._exec, plan._plan_ptr, vp._ptr
    get_version = library.lib().cudnnGetVersion
    fns = {
        "cudnnBackendExecute (ctypes, plan and variant pack made)": lambda: execute(handle, plan_ptr, vp_ptr),
        "ExecutionPlan.execute (variant pack looked up)": lambda: plan.execute(handle, ptrs, ws),
        "prepared launcher (what a remembered call ends in)": lambda: prep.launcher(handle, ptrs, stream),
        "cudnnGetVersion (an empty ctypes call)": lambda: get_version(),
    }
    replay_error = None
    try:  # the same execute captured once into a CUDA graph, as graph replay launches it
        graph = replay.capture(_on_capture_stream(handle, stream, plan, ptrs, ws),
                               torch.cuda.current_device())
        fns["cuGraphLaunch (that execute captured once: graph replay)"] = lambda: graph.launch(stream)
    except Exception as exc:  # noqa: BLE001 - reported beside the other columns
        replay_error = gpu_timing.error_text(exc)
    figs = gpu_timing.compare_host(fns, calls, synchronize=torch.cuda.synchronize, rounds=rounds)
    out = {"plan": plan.tag, "workspace": nbytes, "columns": dict(figs)}
    if replay_error is not None:
        out["graph_replay_error"] = replay_error
    return out


def _on_capture_stream(handle: int, stream: int, plan: Any, ptrs: tuple[int, ...],
                       ws: int) -> Callable[[int], None]:
    """What graph replay captures: the plan's execute, the handle on the capture stream."""
    from pycudnn.runtime.handle import set_handle_stream

    def run(capture_stream: int) -> None:
        set_handle_stream(handle, capture_stream)
        try:
            plan.execute(handle, ptrs, ws)
        finally:
            set_handle_stream(handle, stream)
    return run


# ---- parts (b) and (c): fresh processes ---------------------------------------------------------------

def _layer(torch: Any, shape: tuple[int, int, int, int], dtype: Any, fmt: Any) -> dict[str, Any]:
    n, c, h, k = shape
    x = torch.randn(n, c, h, h, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
    w = (torch.randn(k, c, 3, 3, device="cuda", dtype=dtype) * 0.05).contiguous(memory_format=fmt)
    y = torch.empty(n, k, h, h, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
    return {"x": x, "w": w, "y": y}


def child(opts: dict[str, Any]) -> dict[str, Any]:
    """One fresh process: torch imported and the CUDA context up before anything is timed."""
    import torch
    import torch.nn.functional as F

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    side = opts["side"]
    dtype = getattr(torch, opts["dtype"])
    fmt = torch.channels_last if opts["channels_last"] else torch.contiguous_format
    shapes = [tuple(s) for s in opts["shapes"]]
    layers = [_layer(torch, s, dtype, fmt) for s in shapes]  # made before: not timed
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream()

    def timed(fn: Callable[[], Any]) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3

    result: dict[str, Any] = {"side": side, "shapes": shapes}
    if side.startswith("pycudnn"):
        t0 = time.perf_counter()
        import pycudnn

        result["import_ms"] = (time.perf_counter() - t0) * 1e3
        flags = {"benchmark": side.endswith("benchmark=True")}

        def run(t: dict[str, Any]) -> Callable[[], Any]:
            return lambda: pycudnn.convolution(t["x"], t["w"], padding=1, stream=stream, **flags)
        if opts.get("profile"):
            import cProfile
            import pstats

            if opts["profile"] == "further":  # the first shape outside the profile
                timed(run(layers.pop(0)))
            prof = cProfile.Profile()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            prof.enable()
            run(layers[0])()
            torch.cuda.synchronize()
            prof.disable()
            total = time.perf_counter() - t0
            st = pstats.Stats(prof).stats  # type: ignore[attr-defined]
            result["first_ms"] = total * 1e3
            result["breakdown"] = breakdown_from_stats(st, total)
            result["top"] = top_functions(st)
            return result
        result["first_ms"] = timed(run(layers[0]))
        result["further_ms"] = [timed(run(t)) for t in layers[1:]]
        result["versions"] = {"pycudnn": pycudnn.__version__, "libcudnn": pycudnn.cudnn_version(),
                              "libcudnn_path": pycudnn.library_path()}
    elif side.startswith("frontend"):
        t0 = time.perf_counter()
        try:
            import cudnn
        except Exception as exc:  # noqa: BLE001
            return {"error": f"nvidia-cudnn-frontend is not importable: {gpu_timing.error_text(exc)}"}
        result["import_ms"] = (time.perf_counter() - t0) * 1e3
        autotune = side.endswith("timed")
        state: dict[str, Any] = {}

        def run_fe(t: dict[str, Any]) -> Callable[[], Any]:
            def go() -> None:
                if "handle" not in state:  # the first call makes the handle, as pycudnn's does
                    state["handle"] = cudnn.create_handle()
                    if stream.cuda_stream:
                        cudnn.set_stream(state["handle"], stream.cuda_stream)
                handle = state["handle"]
                tensors = {"x": t["x"], "w": t["w"], "y": t["y"]}
                g, gt = _frontend_unbuilt(cudnn, torch, handle, tensors, dtype)
                if not autotune:
                    g.build_plans()
                    ws = torch.empty(max(1, g.get_workspace_size()), device="cuda", dtype=torch.uint8)
                    g.execute({gt[r]: tensors[r] for r in gt}, ws, handle=handle)
                    return
                pack = {gt[r]: tensors[r] for r in gt}
                best, best_ms, built = None, float("inf"), 0
                for i in range(g.get_execution_plan_count()):
                    if built == AUTOTUNE_PLANS:
                        break
                    try:
                        g.build_plan_at_index(i)
                    except Exception:  # noqa: BLE001 - a plan that does not build is skipped
                        continue
                    built += 1
                    ws = torch.empty(max(1, g.get_workspace_size_plan_at_index(i)), device="cuda",
                                     dtype=torch.uint8)
                    g.execute_plan_at_index(pack, ws, i, handle=handle)  # warm-up
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    for _ in range(3):
                        g.execute_plan_at_index(pack, ws, i, handle=handle)
                    end.record()
                    end.synchronize()
                    ms = start.elapsed_time(end) / 3
                    if ms < best_ms:
                        best, best_ms = i, ms
                if best is None:
                    raise RuntimeError("no plan built")
                g.build_plan_at_index(best)  # selects it
                ws = torch.empty(max(1, g.get_workspace_size()), device="cuda", dtype=torch.uint8)
                g.execute(pack, ws, handle=handle)
            return go
        try:
            result["first_ms"] = timed(run_fe(layers[0]))
            result["further_ms"] = [timed(run_fe(t)) for t in layers[1:]]
        except Exception as exc:  # noqa: BLE001
            return {"error": gpu_timing.error_text(exc)}
        result["versions"] = {"frontend": cudnn.__version__, "libcudnn": cudnn.backend_version()}
    else:
        torch.backends.cudnn.benchmark = side.endswith("on")
        result["import_ms"] = 0.0  # imported before the timing starts (the baseline's own library)
        result["first_ms"] = timed(lambda: F.conv2d(layers[0]["x"], layers[0]["w"], None, 1, 1))
        result["further_ms"] = [timed(lambda t=t: F.conv2d(t["x"], t["w"], None, 1, 1))
                                for t in layers[1:]]
        result["versions"] = {"torch": torch.__version__, "libcudnn": torch.backends.cudnn.version()}
    return result


def _frontend_unbuilt(cudnn: Any, torch: Any, handle: Any, tensors: dict[str, Any], dtype: Any
                      ) -> tuple[Any, dict[str, Any]]:
    """A forward graph with its plan list made from heuristics mode A (not built yet)."""
    g, gt = frontend_described(cudnn, torch, handle, tensors, dtype)
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A])
    g.check_support()
    return g, gt


def frontend_described(cudnn: Any, torch: Any, handle: Any, tensors: dict[str, Any], dtype: Any
                       ) -> tuple[Any, dict[str, Any]]:
    """The first-result layer's forward graph described and validated (no operation graph
    built yet); returns (graph, {"x", "w", "y": graph tensor})."""
    io = {torch.float32: cudnn.data_type.FLOAT, torch.bfloat16: cudnn.data_type.BFLOAT16,
          torch.float16: cudnn.data_type.HALF}[dtype]
    f32 = cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=f32, compute_data_type=f32, handle=handle)
    x, w, y = tensors["x"], tensors["w"], tensors["y"]
    X = g.tensor(name="x", dim=list(x.shape), stride=list(x.stride()), data_type=io)
    W = g.tensor(name="w", dim=list(w.shape), stride=list(w.stride()), data_type=io)
    Y = g.conv_fprop(image=X, weight=W, padding=[1, 1], stride=[1, 1], dilation=[1, 1],
                     compute_data_type=f32, name="conv")
    Y.set_output(True).set_dim(list(y.shape)).set_stride(list(y.stride())).set_data_type(io)
    g.validate()
    return g, {"x": X, "w": W, "y": Y}


def pycudnn_root() -> str:
    """The folder this process imported pycudnn from (the repository, or an installed package's
    site-packages): the fresh processes import the same copy."""
    import pycudnn

    return os.path.dirname(os.path.dirname(os.path.abspath(pycudnn.__file__)))


def run_child(opts: Any, libdir: str | None, script: str | None = None,
              root: str | None = None) -> dict[str, Any]:
    """``child(opts)`` in a fresh interpreter with an empty tuning database and pycudnn's
    libcudnn first on LD_LIBRARY_PATH: ``script`` (this file unless told) run with
    ``--child <opts as JSON> --child-out <file>``, pycudnn imported from ``root`` (this
    process's copy unless told); the JSON the child wrote, or ``{"error": ...}``."""
    with tempfile.TemporaryDirectory(prefix="pycudnn-vs-frontend-") as tmp:
        env = with_libcudnn_first(dict(os.environ), libdir)
        env["PYCUDNN_CACHE_DIR"] = os.path.join(tmp, "cache")
        env["PYTHONPATH"] = (root or pycudnn_root()) + (
            os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        out = os.path.join(tmp, "result.json")
        cmd = [sys.executable, os.path.abspath(script or __file__), "--child", json.dumps(opts),
               "--child-out", out]
        try:
            proc = subprocess.run(cmd, env=env, timeout=CHILD_TIMEOUT_S, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        except subprocess.TimeoutExpired:
            return {"error": f"the process ran past {CHILD_TIMEOUT_S} s"}
        if proc.returncode != 0 or not os.path.exists(out):
            tail = (proc.stdout or "").strip().splitlines()[-1:] or [""]
            return {"error": f"the process exited with status {proc.returncode}: {tail[0]}".strip()}
        with open(out) as f:
            return json.load(f)


def measure_first(processes: int, sides: Sequence[str], shapes: Sequence[Sequence[int]]
                  ) -> dict[str, Any]:
    libdir = libcudnn_dir()
    base = {"dtype": "bfloat16", "channels_last": True, "shapes": [list(s) for s in shapes]}
    raw: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    for p in range(processes):
        order = list(sides[p % len(sides):]) + list(sides[:p % len(sides)])  # rotated each round
        for side in order:
            print(f"first: {side} (process {p + 1}/{processes})", file=sys.stderr, flush=True)
            raw[side].append(run_child(dict(base, side=side), libdir))
    return {"what": "ms from the call to the result on the GPU in a fresh process (torch imported, "
                    "CUDA context up); import timed apart; bf16 NHWC 3x3 padding 1",
            "shapes": [list(s) for s in shapes], "libcudnn_dir": libdir,
            "summary": {s: summarize_first(raw[s]) for s in sides}, "processes": raw}


def measure_breakdown(processes: int, shapes: Sequence[Sequence[int]]) -> dict[str, Any]:
    """cProfile of the first call (``shapes[0]``), and of a further new shape (``shapes[1]``,
    after ``shapes[0]`` ran unprofiled), with heuristics and with ``benchmark=True``."""
    libdir = libcudnn_dir()
    out: dict[str, Any] = {}
    for which in ("first", "further"):
        for side in ("pycudnn heuristics", "pycudnn benchmark=True"):
            runs = [run_child({"side": side, "dtype": "bfloat16", "channels_last": True,
                               "shapes": [list(s) for s in shapes[:2]], "profile": which}, libdir)
                    for _ in range(processes)]
            out[side if which == "first" else f"{side}, a further shape"] = runs
    return out


def format_breakdown(result: dict[str, Any]) -> str:
    lines = []
    for side, runs in result.items():
        ok = [r for r in runs if "breakdown" in r]
        if not ok:
            lines.append(f"{side}: {'; '.join(r.get('error', '?') for r in runs)}")
            continue
        firsts = ", ".join(f"{r['first_ms']:.0f}" for r in ok)
        imports = ", ".join(f"{r['import_ms']:.0f}" for r in ok)
        what = "a further shape's first call" if side.endswith("further shape") else "first call"
        lines.append(f"\n{side}: {what} under cProfile {firsts} ms (import {imports} ms, not included)")
        lines += ["| part (inclusive, nested parts not summed) | ms | calls |", "|---|---|---|"]
        for i, row in enumerate(ok[0]["breakdown"]):
            ms = ", ".join(f"{r['breakdown'][i]['ms']:.1f}" for r in ok)
            lines.append(f"| {row['what']} | {ms} | {row['calls']} |")
    return "\n".join(lines)


# ---- the parent -----------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default=",".join(PARTS), help="calls,first,breakdown,floor")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="call-cost configs: " + ",".join(CONFIGS))
    ap.add_argument("--calls", type=int, default=5000, help="calls per call-cost column, over all rounds")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the call-cost part")
    ap.add_argument("--processes", type=int, default=3, help="fresh processes per first-result side")
    ap.add_argument("--sides", default=",".join(SIDES), help="first-result sides, comma-separated")
    ap.add_argument("--quick", action="store_true",
                    help="1000 calls a column, no operations, 1 process a side, 3 shapes")
    ap.add_argument("--json", default=None, help="write every figure here")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    return ap


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.child is not None:
        return args
    try:
        from conv_vs_torch import parse_list

        args.parts = parse_list(args.parts, list(PARTS), "--parts")
        args.configs = parse_list(args.configs, list(CONFIGS), "--configs")
        args.sides = parse_list(args.sides, list(SIDES), "--sides")
        if args.quick:
            args.calls, args.processes = min(args.calls, 1000), 1
        for name in ("calls", "rounds", "processes"):
            gpu_timing.check_positive_int(f"--{name}", getattr(args, name))
    except (TypeError, ValueError) as exc:
        ap.error(str(exc))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        result = child(json.loads(args.child))
        with open(args.child_out, "w") as f:
            json.dump(result, f, default=str)
        return 0
    import torch

    import pycudnn
    from pycudnn.runtime.memory.replay import settings as replay_settings

    report: dict[str, Any] = {
        "what": "pycudnn against nvidia-cudnn-frontend and PyTorch: call cost, time to "
                "first result, where the first call goes, cudnnBackendExecute's floor",
        "commit": commit(), "pycudnn": pycudnn.__file__, "pycudnn_version": pycudnn.__version__,
        "libcudnn": pycudnn.cudnn_version(), "libcudnn_path": pycudnn.library_path(),
        "torch": torch.__version__, "torch_cudnn": torch.backends.cudnn.version(),
        "device": torch.cuda.get_device_name(), "options": {k: v for k, v in vars(args).items()
                                                            if not k.startswith("child")},
        # PYCUDNN_GRAPH_REPLAY=1 runs every pycudnn column with graph replay (off by default)
        "graph_replay": replay_settings()["enabled"]}
    cudnn, why = import_frontend()
    report["frontend"] = ({"version": cudnn.__version__, "backend_version": cudnn.backend_version(),
                           "file": cudnn.__file__} if cudnn is not None else {"error": why})
    if cudnn is not None and cudnn.backend_version() != pycudnn.cudnn_version():
        print(f"WARNING: the frontend runs libcudnn {cudnn.backend_version()}, pycudnn "
              f"{pycudnn.cudnn_version()}: not the same library", file=sys.stderr)
    if why:
        print(f"frontend: {why}", file=sys.stderr)
    shapes = FIRST_SHAPES[:3] if args.quick else FIRST_SHAPES

    def save() -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1, default=str)
    t0 = time.perf_counter()
    if "calls" in args.parts:
        report["calls"] = measure_calls(args.configs, args.calls, args.rounds, args.quick)
        for config, res in report["calls"].items():
            print(f"\n## call cost, {config} (tiny convolution {TINY}, host us per call)\n")
            print(format_calls(res["columns"]))
        save()
    if "floor" in args.parts:
        report["floor"] = measure_floor(args.configs, args.calls, args.rounds)
        print("\n## the floor: host us per call\n")
        for config, res in report["floor"].items():
            if "error" in res:
                print(f"{config}: {res['error']}")
                continue
            print(f"{config} (plan {res['plan']}, workspace {res['workspace']} B):")
            for name, fig in res["columns"].items():
                print(f"  {name}: {fig['median']:.2f}")
        save()
    if "first" in args.parts:
        report["first"] = measure_first(args.processes, args.sides, shapes)
        print("\n## time to first result (fresh processes)\n")
        print(format_first(report["first"]["summary"]))
        save()
    if "breakdown" in args.parts:
        report["breakdown"] = measure_breakdown(1 if args.quick else 2, shapes)
        print("\n## where pycudnn's first calls go (cProfile, inclusive)")
        print(format_breakdown(report["breakdown"]))
        save()
    report["seconds"] = time.perf_counter() - t0
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
