"""The benchmark scripts' timing helpers, argument parsing, statistics and tables (benchmarks/).

Everything here but the ``gpu`` tests runs without a GPU and without PyTorch: the scripts import
torch and pycudnn's GPU parts only when they measure. No test asserts a timing.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import conv_vs_torch  # noqa: E402
import first_call  # noqa: E402
import gpu_timing  # noqa: E402
import host_per_call  # noqa: E402
import report  # noqa: E402


# ---- gpu_timing: statistics and arguments ---------------------------------------------------------

def test_check_positive_int_names_the_parameter():
    assert gpu_timing.check_positive_int("reps", 3) == 3
    assert gpu_timing.check_positive_int("warmup", 0, 0) == 0
    with pytest.raises(ValueError, match=r"reps: expected an int >= 1, got 0"):
        gpu_timing.check_positive_int("reps", 0)
    with pytest.raises(TypeError, match=r"batches: expected an int >= 1, got bool True"):
        gpu_timing.check_positive_int("batches", True)
    with pytest.raises(TypeError, match=r"reps: .* got float 2.0"):
        gpu_timing.check_positive_int("reps", 2.0)


def test_geomean_skips_missing_and_non_positive_values():
    assert gpu_timing.geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert gpu_timing.geomean([2.0, None, float("nan"), 0.0, -1.0, 8.0]) == pytest.approx(4.0)
    assert math.isnan(gpu_timing.geomean([]))
    assert math.isnan(gpu_timing.geomean([None, 0.0]))


def test_median_and_spread():
    assert gpu_timing.median([3.0, 1.0, float("nan"), 2.0]) == 2.0
    assert math.isnan(gpu_timing.median([]))
    s = gpu_timing.spread([4.0, 1.0, 2.0, 3.0, 5.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (3.0, 1.0, 5.0, 5)
    assert s["rel_iqr"] == pytest.approx((4.0 - 2.0) / 3.0)  # inclusive quartiles 2 and 4
    one = gpu_timing.spread([7.0])
    assert (one["median"], one["rel_iqr"], one["n"]) == (7.0, 0.0, 1)
    assert gpu_timing.spread([])["n"] == 0


def test_ratio_is_nan_unless_both_sides_were_measured():
    assert gpu_timing.ratio(3.0, 2.0) == 1.5
    for a, b in ((None, 1.0), (1.0, None), (0.0, 1.0), (1.0, 0.0), (float("nan"), 1.0), (1.0, float("inf"))):
        assert math.isnan(gpu_timing.ratio(a, b))


def test_calls_per_batch_respects_the_launch_queue():
    assert gpu_timing.calls_per_batch(50) == 50
    assert gpu_timing.calls_per_batch(1000) == gpu_timing.MAX_CALLS_PER_BATCH
    assert gpu_timing.calls_per_batch(1000, launches_per_call=4) == gpu_timing.LAUNCH_BUDGET // 4
    assert gpu_timing.calls_per_batch(1000, launches_per_call=10_000) == 1
    for reps in (1, 7, 200, 5000):
        for launches in (1, 2, 3, 5, 9):
            n = gpu_timing.calls_per_batch(reps, launches)
            assert 1 <= n <= reps and (n == 1 or n * launches <= gpu_timing.LAUNCH_BUDGET)
    with pytest.raises(ValueError, match="budget: expected at most 1024"):
        gpu_timing.calls_per_batch(10, budget=2048)
    with pytest.raises(ValueError, match="launches_per_call"):
        gpu_timing.calls_per_batch(10, launches_per_call=0)


def test_alternating_orders_give_each_side_the_first_place_in_turn():
    orders = gpu_timing.alternating_orders(["torch", "pycudnn"], 4)
    assert orders == [["torch", "pycudnn"], ["pycudnn", "torch"]] * 2
    three = gpu_timing.alternating_orders(["a", "b", "c"], 6)
    firsts = [o[0] for o in three]
    assert all(firsts.count(n) == 2 for n in "abc")
    assert all(sorted(o) == ["a", "b", "c"] for o in three)
    with pytest.raises(ValueError, match="distinct"):
        gpu_timing.alternating_orders(["a", "a"], 2)
    with pytest.raises(ValueError, match="at least one"):
        gpu_timing.alternating_orders([], 2)
    with pytest.raises(ValueError, match="rounds"):
        gpu_timing.alternating_orders(["a"], 0)


def test_error_text_is_one_line():
    assert gpu_timing.error_text(ValueError("bad shape\nsecond line")) == "ValueError: bad shape"
    assert gpu_timing.error_text(RuntimeError()) == "RuntimeError"


def test_host_time_us_synchronizes_between_chunks_outside_the_timing():
    calls, syncs, pending = [], [], []

    def fn():
        calls.append(1)
        pending.append(1)
        assert len(pending) <= 10  # never more than one chunk queued between synchronizations

    def sync():
        syncs.append(1)
        pending.clear()

    s = gpu_timing.host_time_us(fn, reps=100, synchronize=sync, chunk=10, warmup=5)
    assert len(calls) == 5 + 100 and len(syncs) == 1 + 10
    assert s["n"] == 10 and s["median"] > 0 and s["min"] <= s["median"] <= s["max"]


def test_compare_host_interleaves_the_functions():
    log = []
    fns = {name: (lambda name=name: log.append(name)) for name in ("a", "b", "c")}
    out = gpu_timing.compare_host(fns, reps=30, synchronize=lambda: None, chunk=5, rounds=3, warmup=2)
    assert set(out) == {"a", "b", "c"} and all(v["n"] == 3 for v in out.values())
    timed = log[6:]  # after 2 warm-up calls each
    assert [timed[i] for i in (0, 10, 20)] == ["a", "b", "c"]  # round r starts with the r-th name
    assert timed[30] == "b" and timed[60] == "c"


# ---- gpu_timing: kernel names from a Chrome trace --------------------------------------------------

def _trace(events):
    return {"traceEvents": [{"ph": "X", "cat": c, "name": n, "ts": ts, "dur": 1} for ts, c, n in events]
            + [{"ph": "X", "cat": "cpu_op", "name": "aten::conv2d", "ts": 0},
               {"ph": "i", "cat": "kernel", "name": "not a span", "ts": 1}]}


def test_device_activities_sorted_by_start():
    acts = gpu_timing.device_activities(_trace([(30, "kernel", "b"), (10, "kernel", "a"),
                                                (20, "gpu_memset", "Memset (Device)")]))
    assert acts == [(10.0, "kernel", "a"), (20.0, "gpu_memset", "Memset (Device)"), (30.0, "kernel", "b")]


def test_split_at_separators():
    sep = "void at::cuda::(anonymous namespace)::spin_kernel(long)"
    acts = gpu_timing.device_activities(_trace([
        (0, "kernel", sep), (1, "kernel", "torch_conv"), (2, "kernel", sep),
        (3, "gpu_memset", "Memset (Device)"), (4, "kernel", "cudnn_conv"), (5, "kernel", "cudnn_reduce"),
        (6, "kernel", sep)]))
    assert gpu_timing.split_at_separators(acts, 2) == [
        ["torch_conv"], ["[gpu_memset] Memset (Device)", "cudnn_conv", "cudnn_reduce"]]
    assert gpu_timing.split_at_separators(acts, 3) is None
    assert gpu_timing.split_at_separators(acts[:-1], 2) is None  # the last separator is missing
    assert gpu_timing.device_launch_count([]) == 1
    assert gpu_timing.device_launch_count(["a", "b", "c"]) == 3


# ---- conv_vs_torch.py ------------------------------------------------------------------------------

def test_conv_vs_torch_defaults():
    a = conv_vs_torch.parse_args([])
    assert a.configs == ["bf16-nhwc", "fp32-nchw-tf32"] and a.directions == ["fwd", "dgrad", "wgrad"]
    assert (a.reps, a.batches, a.batch, a.layers) == (100, 6, 32, "all")
    assert not a.no_kernel_names and a.json is None
    q = conv_vs_torch.parse_args(["--quick", "--json", "x.json"])
    assert (q.reps, q.batches, q.no_kernel_names, q.json) == (40, 4, True, "x.json")
    r = conv_vs_torch.parse_args(["--quick", "--reps", "7", "--configs", "all", "--directions", "wgrad,fwd"])
    assert r.reps == 7 and r.configs == list(conv_vs_torch.CONFIGS) and r.directions == ["wgrad", "fwd"]


@pytest.mark.parametrize("argv, message", [
    (["--configs", "bf16-nchw"], "--configs: unknown value 'bf16-nchw'"),
    (["--directions", "fwd,bwd"], "--directions: unknown value 'bwd'"),
    (["--reps", "0"], "--reps: expected an int >= 1, got 0"),
    (["--batches", "-1"], "--batches: expected an int >= 1"),
    (["--layers", "layer9.conv1"], "--layers: unknown layer 'layer9.conv1'"),
    (["--layers", "23"], "--layers: unknown layer '23'"),
])
def test_conv_vs_torch_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        conv_vs_torch.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_resnet50_layers_and_selection():
    layers = conv_vs_torch.resnet50_layers(32)
    assert len(layers) == 23 and len({l.shape_string() for l in layers}) == 23
    assert all(l.n == 32 for l in layers)
    assert layers[0].x_shape == (32, 3, 224, 224) and layers[0].w_shape == (64, 3, 7, 7)
    picked = conv_vs_torch.select_layers(layers, "conv1, 22,layer3.1.conv2")
    assert [l.name for l in picked] == ["conv1", "layer4.1.conv2", "layer3.1.conv2"]
    assert conv_vs_torch.select_layers(layers, "all") == layers


def _cell(config, layer, d, torch_us=None, pycudnn_us=None, **kw):
    row = {"config": config, "layer": layer, "direction": d, "shape": "32,64,56,56,64,3,3,1,1",
           "torch_us": torch_us, "pycudnn_us": pycudnn_us}
    if torch_us and pycudnn_us:
        row["ratio"] = torch_us / pycudnn_us
    row.update(kw)
    return row


def test_summary_geomean_min_and_cells_below():
    rows = [_cell("bf16-nhwc", "a", "fwd", 10.0, 10.0), _cell("bf16-nhwc", "a", "dgrad", 8.0, 10.0),
            _cell("fp32-nchw-tf32", "a", "fwd", 20.0, 10.0), _cell("fp32-nchw-tf32", "a", "wgrad", 10.0, 5.0),
            _cell("fp32-nchw-tf32", "b", "fwd", error="pycudnn first call: CudnnError: bad")]
    s = conv_vs_torch.summarize(rows)
    assert s["per_config"]["bf16-nhwc"] == pytest.approx(math.sqrt(0.8))
    assert s["per_config"]["fp32-nchw-tf32"] == pytest.approx(2.0)
    assert s["geomean"] == pytest.approx((1.0 * 0.8 * 2.0 * 2.0) ** 0.25)
    assert s["min"] == {"ratio": pytest.approx(0.8), "cell": "bf16-nhwc a dgrad"}
    assert s["below"] == ["bf16-nhwc a dgrad 0.800"]
    assert (s["cells"], s["timed"]) == (5, 4)
    assert s["errors"] == ["fp32-nchw-tf32 b fwd: pycudnn first call: CudnnError: bad"]
    text = conv_vs_torch.format_summary(s)
    assert "geomean torch/pycudnn 1.337 over 4 of 5 cells" in text
    assert "cells below 0.90: 1: bf16-nhwc a dgrad 0.800" in text and "failed cells: 1" in text


def test_kernel_differences_ignore_memsets():
    same = _cell("bf16-nhwc", "a", "fwd", 1.0, 1.0, torch_kernels=["k1"],
                 pycudnn_kernels=["[gpu_memset] Memset (Device)", "k1"])
    differ = _cell("bf16-nhwc", "a", "wgrad", 1.0, 2.0, torch_kernels=["nvjet_x"], pycudnn_kernels=["cutlass_y"])
    unknown = _cell("bf16-nhwc", "a", "dgrad", 1.0, 1.0)
    assert conv_vs_torch.kernels_differ(same) is False
    assert conv_vs_torch.kernels_differ(differ) is True
    assert conv_vs_torch.kernels_differ(unknown) is None
    table = conv_vs_torch.format_table([same, differ, unknown, _cell("x", "b", "fwd", error="E: e")])
    lines = table.splitlines()
    assert lines[0].startswith("| config | layer | shape | dir | torch us | pycudnn us | torch/pycudnn")
    assert lines[2].endswith("| 1.00 | 1.00 | 1.000 | same |")
    assert lines[3].endswith("| 0.500 | differ |") and lines[4].endswith("| - |")
    assert "| - | - | - (E: e) | - |" in lines[5]
    listing = conv_vs_torch.format_kernel_differences([same, differ])
    assert "bf16-nhwc a wgrad (torch/pycudnn 0.500)" in listing
    assert "torch:   nvjet_x" in listing and "pycudnn: cutlass_y" in listing


def test_conv_vs_torch_keeps_the_old_timer_name():
    assert conv_vs_torch.time_calls is gpu_timing.back_to_back_ms


# ---- host_per_call.py -------------------------------------------------------------------------------

def test_host_columns_compare_like_with_like():
    cols = host_per_call.columns(["graph", "v7"])
    assert cols["F.conv2d"][1] is None
    for e in ("graph", "v7"):
        assert cols[f"{e}: torch in"][1] == "F.conv2d"
        assert cols[f"{e}: CuPy in"][1] == "F.conv2d"
        assert cols[f"{e}: views, out="][1] is None  # less work per call: not divided by F.conv2d
        assert cols[f"{e}: torch in, out="][1] is None
        assert cols[f"{e}: backward data, torch in"][1] == "torch: backward data"
        assert cols[f"{e}: backward filter, torch in"][1] == "torch: backward filter"
    assert all(vs is None or vs in cols for _, vs in cols.values())
    assert all("{e}" not in name for name in cols)


def test_host_ratios_and_table():
    cols = host_per_call.columns(["graph"])
    figs = {"F.conv2d": {"median": 10.0}, "graph: torch in": {"median": 15.0},
            "graph: views, out=": {"median": 8.0}, "graph: CuPy in": {"error": "CuPy unavailable: x"},
            "graph: backward data, torch in": {"median": 12.0}}
    out = host_per_call.with_ratios(figs, cols)
    assert out["graph: torch in"]["ratio"] == 1.5 and out["graph: torch in"]["vs"] == "F.conv2d"
    assert "ratio" not in out["graph: views, out="] and "ratio" not in out["F.conv2d"]
    assert "ratio" not in out["graph: backward data, torch in"]  # its PyTorch column is missing
    table = host_per_call.format_table(out)
    assert "| graph: torch in | 15.00 | 1.50 | F.conv2d |" in table
    assert "| graph: views, out= | 8.00 |  | not comparable (less work per call) |" in table
    assert "| graph: CuPy in | CuPy unavailable: x | | |" in table


def test_host_per_call_arguments(capsys):
    a = host_per_call.parse_args(["--engines", "graph", "--quick"])
    assert a.engines == ["graph"] and a.calls == 1000
    with pytest.raises(SystemExit):
        host_per_call.parse_args(["--engines", "cudnn"])
    assert "--engines: unknown value 'cudnn'" in capsys.readouterr().err


# ---- first_call.py ---------------------------------------------------------------------------------

def test_first_call_settings():
    rows = first_call.pycudnn_settings(None, True, [])
    assert rows == [{"name": "pycudnn defaults (benchmark_limit=None)", "flags": {}}]
    rows = first_call.pycudnn_settings(8, True, [4, 8])
    assert [r["flags"] for r in rows] == [{}, {"benchmark_limit": None}, {"benchmark_limit": 4}]
    assert first_call.pycudnn_settings(None, False, [4]) == [{"name": "pycudnn defaults", "flags": {}}]
    assert first_call.parse_limits(" 4, 8,4,") == [4, 8]
    with pytest.raises(ValueError, match="--limits"):
        first_call.parse_limits("4,x")


def test_first_call_summary_and_table():
    cells = [{"torch_first_ms": 50.0, "torch_second_ms": 0.1, "pycudnn_first_ms": 200.0},
             {"torch_first_ms": 30.0, "pycudnn_first_ms": 100.0, "pycudnn_second_ms": 0.2},
             {"torch_first_ms": 40.0, "pycudnn_error": "E: e"}]
    t, p = first_call.summarize_side(cells, "torch"), first_call.summarize_side(cells, "pycudnn")
    assert (t["median_ms"], t["sum_ms"], t["max_ms"], t["cells"], t["errors"]) == (40.0, 120.0, 50.0, 3, 0)
    assert (p["median_ms"], p["sum_ms"], p["cells"], p["errors"]) == (150.0, 300.0, 2, 1)
    table = first_call.format_table([{"name": "PyTorch", "summary": t},
                                     {"name": "pycudnn x", "error": "crashed", "summary": {}}])
    assert "| PyTorch | 40.0 | 0.12 | 50.0 | 0.10 | 3 | 0 |" in table
    assert "| pycudnn x | crashed |" in table


def test_first_call_arguments():
    a = first_call.parse_args(["--quick", "--limits", "4"])
    assert a.configs == ["bf16-nhwc"] and a.directions == ["fwd"] and a.limits == [4]
    b = first_call.parse_args([])
    assert b.configs == ["bf16-nhwc", "fp32-nchw-tf32"] and b.directions == ["fwd", "dgrad", "wgrad"]


# ---- report.py --------------------------------------------------------------------------------------

def test_report_recognises_each_kind(tmp_path, capsys):
    kernel = {"cells": [_cell("bf16-nhwc", "a", "fwd", 2.0, 1.0)], "summary": {}, "batch": 32,
              "gate": {"mode": "wait"}}
    host = {"columns": host_per_call.with_ratios({"F.conv2d": {"median": 10.0}}, host_per_call.columns(["graph"])),
            "calls": 10, "rounds": 2}
    legacy = {"cells": [{"graph_ms": 1.0, "graph_ratio": 1.1}], "summary": {}}
    first = {"processes": [], "rows": [], "options": {"configs": ["bf16-nhwc"], "directions": ["fwd"]}}
    assert report.kind(kernel) == "kernel" and report.kind(host) == "host"
    assert report.kind(legacy) == "legacy" and report.kind(first) == "first_call"
    assert report.kind({"rows": [], "summary": {}}) == "fused" and report.kind({}) == "unknown"
    paths = []
    for i, d in enumerate((kernel, host, legacy, first)):
        p = tmp_path / f"{i}.json"
        p.write_text(json.dumps(d))
        paths.append(str(p))
    assert report.main(paths) == 0
    text = capsys.readouterr().out
    assert "geomean torch/pycudnn 2.000 over 1 of 1 cells" in text
    assert "| F.conv2d | 10.00 |" in text and "earlier format" in text and "First call" in text


# ---- on the GPU -------------------------------------------------------------------------------------

def _stream_and_buffer(nbytes):
    from cuda.bindings import runtime as rt

    gpu_timing._check(rt.cudaSetDevice(0), "cudaSetDevice")
    stream = int(gpu_timing._check(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking), "stream"))
    ptr = int(gpu_timing._check(rt.cudaMalloc(nbytes), "cudaMalloc"))
    return rt, stream, ptr


@pytest.mark.gpu
def test_gate_holds_the_stream_until_opened():
    rt, stream, ptr = _stream_and_buffer(1 << 20)
    try:
        gate = gpu_timing.get_gate(0)
        if gate.mode != "wait":
            pytest.skip(f"stream wait unusable here: {gate.reason}")
        ev = gpu_timing._check(rt.cudaEventCreate(), "event")
        g = gate.hold(stream)
        rt.cudaMemsetAsync(ptr, 1, 1 << 20, stream)
        rt.cudaEventRecord(ev, stream)
        time.sleep(0.05)
        assert int(rt.cudaEventQuery(ev)[0]) != 0, "work behind a closed gate ran"
        gate.open(g)
        gpu_timing._check(rt.cudaEventSynchronize(ev), "cudaEventSynchronize")
        rt.cudaEventDestroy(ev)
        # a gated measurement of stream work gives one positive figure per batch
        samples = gpu_timing.gated_samples(lambda: rt.cudaMemsetAsync(ptr, 0, 1 << 20, stream), stream,
                                           reps=50, batches=3, gate=gate)
        assert len(samples) == 3 and all(s > 0 and math.isfinite(s) for s in samples)
    finally:
        rt.cudaStreamSynchronize(stream)
        rt.cudaFree(ptr)
        rt.cudaStreamDestroy(stream)


@pytest.mark.gpu
def test_watchdog_opens_a_gate_the_host_cannot_open():
    rt, stream, ptr = _stream_and_buffer(4096)
    try:
        gate = gpu_timing.get_gate(0)
        if gate.mode != "wait":
            pytest.skip(f"stream wait unusable here: {gate.reason}")

        def blocks_the_host():
            rt.cudaMemsetAsync(ptr, 0, 4096, stream)
            time.sleep(0.4)  # stands in for a call that waits for the GPU

        with pytest.raises(gpu_timing.GateTimeout, match="blocked the host"):
            gpu_timing.gated_batch_us(blocks_the_host, stream, 2, gate, timeout_s=0.2)
        gpu_timing._check(rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
    finally:
        rt.cudaFree(ptr)
        rt.cudaStreamDestroy(stream)


@pytest.mark.gpu
def test_kernel_names_of_each_call():
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    x = torch.randn(2, 8, 16, 16, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    F.conv2d(x, w, padding=1)
    torch.cuda.synchronize()
    names = gpu_timing.kernel_names(torch, [lambda: F.conv2d(x, w, padding=1), lambda: torch.relu(x)])
    assert len(names) == 2 and all(names)
    assert not any(gpu_timing.SEPARATOR in n for group in names for n in group)
    assert any("elementwise" in n or "relu" in n.lower() for n in names[1])


@pytest.fixture
def torch_flags_restored():
    """The scripts set PyTorch's global cuDNN/TF32 flags; other tests must not see them."""
    torch = pytest.importorskip("torch")
    saved = (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32,
             torch.backends.cuda.matmul.allow_tf32)
    yield torch
    (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32,
     torch.backends.cuda.matmul.allow_tf32) = saved


@pytest.mark.gpu
def test_conv_vs_torch_runs_one_cell(tmp_path, torch_flags_restored):
    out = tmp_path / "k.json"
    assert conv_vs_torch.main(["--configs", "bf16-nhwc", "--layers", "layer4.1.conv2", "--directions",
                               "wgrad", "--reps", "20", "--batches", "2", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    (cell,) = d["cells"]
    assert "error" not in cell, cell.get("error")
    assert cell["torch_us"] > 0 and cell["pycudnn_us"] > 0 and len(cell["pycudnn_samples_us"]) == 2
    assert cell["ratio"] == pytest.approx(cell["torch_us"] / cell["pycudnn_us"])
    assert cell["torch_kernels"] and cell["pycudnn_kernels"]
    assert d["gate"]["mode"] in ("wait", "spin")


@pytest.mark.gpu
def test_host_per_call_runs(tmp_path, torch_flags_restored):
    out = tmp_path / "h.json"
    assert host_per_call.main(["--calls", "200", "--rounds", "2", "--engines", "graph", "--json", str(out)]) == 0
    cols = json.loads(out.read_text())["columns"]
    assert cols["F.conv2d"]["median"] > 0
    assert cols["graph: torch in"]["vs"] == "F.conv2d" and cols["graph: torch in"]["ratio"] > 0
    assert "error" not in cols["graph: backward filter, torch in"]


@pytest.mark.gpu
@pytest.mark.slow
def test_first_call_runs_one_layer(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "f.json"
    assert first_call.main(["--quick", "--layers", "layer4.1.conv2", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    (proc,) = d["processes"][:1]
    assert "error" not in proc, proc.get("error")
    (cell,) = proc["cells"]
    assert cell["torch_first_ms"] > 0 and cell["pycudnn_first_ms"] > 0
    assert d["rows"][0]["name"].startswith("PyTorch")
