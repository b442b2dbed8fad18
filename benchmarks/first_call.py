"""The first call of a new shape with the search on, pycudnn against PyTorch.

    PYTHONPATH=. python3 benchmarks/first_call.py --json $OUT/first_call.json

What is measured: wall-clock milliseconds from the call to its result being ready on the GPU
(``torch.cuda.synchronize()`` before and after) for the first call of each of ResNet-50's 23
distinct layers x forward / backward data / backward filter x the configs, with
``torch.backends.cudnn.benchmark = True`` and pycudnn ``benchmark=True``: the search by
measurement, plan building and CUDA's lazy loading of the chosen kernels, everything a training
loop waits for at its first step. Both sides get the same torch tensors.

How: each pycudnn setting runs in its own fresh process with an empty tuning database
(``PYCUDNN_CACHE_DIR`` a new temporary directory, so no record from an earlier run is found).
In that process both libraries first run a tiny unrelated convolution in all three directions
(loading cuDNN's sub-libraries: one-time costs, reported apart; the very first of them is each
library's first result in a fresh process, reported with the ``cuda.core`` / ``cuda.bindings``
modules pycudnn's first call imported), then each cell is called once by
each library; which library goes first alternates from cell to cell, because kernels loaded
lazily by one library's call may serve the other's (the same libcudnn). A second call of each is
timed too, so the search's share shows as first minus second.

pycudnn settings (rows): its defaults (the ``benchmark_limit`` in force is reported), an
exhaustive row (``benchmark_limit=None``) when the default limits the search, and any
``--limits``. PyTorch is measured in each of those processes; its row is the first process's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Sequence

import gpu_timing  # this script's folder is on sys.path
from conv_vs_torch import CONFIGS, DEFAULT_CONFIGS, DIRECTIONS, parse_list, resnet50_layers, select_layers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD_TIMEOUT_S = 600
WARMUP_SHAPE = (2, 16, 12, 12, 16, 3)  # N, C, H, W, K, R: in no model; loads cuDNN's sub-libraries


# ---- settings and summaries (no GPU) --------------------------------------------------------------

def pycudnn_settings(default_limit: Any, has_limit_flag: bool, extra_limits: Sequence[int]
                     ) -> list[dict[str, Any]]:
    """The pycudnn rows: ``{"name", "flags"}`` for the defaults, an exhaustive row where the
    default limits the search, and one per extra limit (the flag permitting)."""
    rows = [{"name": f"pycudnn defaults (benchmark_limit={default_limit!r})" if has_limit_flag
             else "pycudnn defaults", "flags": {}}]
    if not has_limit_flag:
        return rows
    if default_limit is not None:
        rows.append({"name": "pycudnn exhaustive (benchmark_limit=None)", "flags": {"benchmark_limit": None}})
    for k in extra_limits:
        if k != default_limit:
            rows.append({"name": f"pycudnn benchmark_limit={k}", "flags": {"benchmark_limit": k}})
    return rows


def parse_limits(text: str) -> list[int]:
    """``--limits``: comma-separated non-negative ints (empty: none)."""
    out: list[int] = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        if not item.isdigit():
            raise ValueError(f"--limits: expected comma-separated non-negative ints, got {item!r}")
        if int(item) not in out:
            out.append(int(item))
    return out


def summarize_side(cells: Sequence[dict[str, Any]], side: str) -> dict[str, Any]:
    """Median, sum and max of ``side``'s first calls (ms), the cells timed and failed."""
    v = [c[f"{side}_first_ms"] for c in cells if c.get(f"{side}_first_ms") is not None]
    second = [c[f"{side}_second_ms"] for c in cells if c.get(f"{side}_second_ms") is not None]
    return {"median_ms": gpu_timing.median(v), "sum_ms": sum(v) if v else float("nan"),
            "max_ms": max(v) if v else float("nan"), "second_call_median_ms": gpu_timing.median(second),
            "cells": len(v), "errors": sum(1 for c in cells if c.get(f"{side}_error"))}


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| library / setting | median ms | sum s | max ms | second call median ms | cells | errors |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        s = r["summary"]
        if "error" in r:
            lines.append(f"| {r['name']} | {r['error']} | | | | | |")
            continue
        lines.append(f"| {r['name']} | {s['median_ms']:.1f} | {s['sum_ms'] / 1e3:.2f} | {s['max_ms']:.1f} | "
                     f"{s['second_call_median_ms']:.2f} | {s['cells']} | {s['errors']} |")
    return "\n".join(lines)


# ---- the child process (GPU) ----------------------------------------------------------------------

def child(opts: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    import torch
    import torch.nn.functional as F

    t_torch_import = time.perf_counter() - t0
    t0 = time.perf_counter()
    import pycudnn

    t_pycudnn_import = time.perf_counter() - t0
    torch.backends.cudnn.benchmark = True
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream()
    pflags = {"benchmark": True, **opts["flags"]}

    def sides(x: Any, w: Any, dy: Any, s: int, p: int, d: str) -> dict[str, Any]:
        xs, ws = tuple(x.shape), tuple(w.shape)
        if d == "fwd":
            return {"torch": lambda: F.conv2d(x, w, None, s, p),
                    "pycudnn": lambda: pycudnn.convolution(x, w, stride=s, padding=p, stream=stream, **pflags)}
        mask = [True, False, False] if d == "dgrad" else [False, True, False]
        tfn = lambda: torch.ops.aten.convolution_backward(  # noqa: E731
            dy, x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], 1, mask)
        if d == "dgrad":
            pfn = lambda: pycudnn.convolution_backward_data(  # noqa: E731
                dy, w, xs, stride=s, padding=p, stream=stream, **pflags)
        else:
            pfn = lambda: pycudnn.convolution_backward_filter(  # noqa: E731
                x, dy, ws, stride=s, padding=p, stream=stream, **pflags)
        return {"torch": tfn, "pycudnn": pfn}

    def timed(fn: Any) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) * 1e3

    # one-time costs: a tiny unrelated shape in every direction and config, each library; the
    # first call of each is its first result in this process
    warm: dict[str, float] = {"torch": 0.0, "pycudnn": 0.0}
    first_result: dict[str, Any] = {}
    n, c, h, wd, k, r = WARMUP_SHAPE
    for cname in opts["configs"]:
        dtype_name, channels_last, tf32 = CONFIGS[cname]
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        pflags["allow_tf32"] = tf32
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        dt = getattr(torch, dtype_name)
        x = torch.randn(n, c, h, wd, device="cuda", dtype=dt).to(memory_format=fmt)
        w = torch.randn(k, c, r, r, device="cuda", dtype=dt).to(memory_format=fmt)
        dy = torch.randn(n, k, h, wd, device="cuda", dtype=dt).to(memory_format=fmt)
        for d in DIRECTIONS:
            for side, fn in sides(x, w, dy, 1, 1, d).items():
                before = set(sys.modules)
                try:
                    ms = timed(fn)
                    warm[side] += ms
                except Exception as exc:  # noqa: BLE001
                    warm[f"{side}_error"] = gpu_timing.error_text(exc)  # type: ignore[assignment]
                    ms = float("nan")
                if f"{side}_ms" not in first_result:
                    first_result[f"{side}_ms"] = ms
                    first_result[f"{side}_call"] = f"{cname} {d}"
                    first_result[f"{side}_cuda_python_imports"] = sorted(
                        m for m in set(sys.modules) - before
                        if m.startswith(("cuda.core", "cuda.bindings")))
    cells: list[dict[str, Any]] = []
    layers = select_layers(resnet50_layers(opts["batch"]), opts["layers"])
    for cname in opts["configs"]:
        dtype_name, channels_last, tf32 = CONFIGS[cname]
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        pflags["allow_tf32"] = tf32
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        dt = getattr(torch, dtype_name)
        for layer in layers:
            try:
                x = torch.randn(layer.x_shape, device="cuda", dtype=dt).to(memory_format=fmt)
                w = (torch.randn(layer.w_shape, device="cuda", dtype=dt) * 0.05).to(memory_format=fmt)
                dy = torch.randn(layer.y_shape, device="cuda", dtype=dt).to(memory_format=fmt)
            except Exception as exc:  # noqa: BLE001
                why = f"inputs: {gpu_timing.error_text(exc)}"
                cells += [{"config": cname, "layer": layer.name, "direction": d, "torch_error": why,
                           "pycudnn_error": why} for d in opts["directions"]]
                continue
            for d in opts["directions"]:
                cell: dict[str, Any] = {"config": cname, "layer": layer.name, "direction": d,
                                        "shape": layer.shape_string()}
                fns = sides(x, w, dy, layer.stride, layer.pad, d)
                order = ["torch", "pycudnn"] if len(cells) % 2 == 0 else ["pycudnn", "torch"]
                cell["first"] = order[0]
                for side in order:
                    try:
                        cell[f"{side}_first_ms"] = timed(fns[side])
                        cell[f"{side}_second_ms"] = timed(fns[side])
                    except Exception as exc:  # noqa: BLE001 - reported, the run goes on
                        cell[f"{side}_error"] = gpu_timing.error_text(exc)
                        torch.cuda.synchronize()
                cells.append(cell)
                print(f"  [{len(cells)}] {cname} {layer.name} {d}: torch "
                      f"{cell.get('torch_first_ms', float('nan')):.1f} ms, pycudnn "
                      f"{cell.get('pycudnn_first_ms', float('nan')):.1f} ms", file=sys.stderr, flush=True)
            del x, w, dy
    from pycudnn import configuration

    info: dict[str, Any] = {"config": repr(pycudnn.config), "flags": sorted(configuration.FLAG_NAMES)}
    try:
        from pycudnn.engines import graph

        info["benchmark_time_budget_s"] = getattr(graph, "BENCHMARK_TIME_BUDGET_S", None)
    except Exception:  # noqa: BLE001 - informational only
        pass
    return {"torch_import_ms": t_torch_import * 1e3, "pycudnn_import_ms": t_pycudnn_import * 1e3,
            "warmup_ms": warm, "first_result": first_result, "cells": cells, "pycudnn_settings": info,
            "cache_dir": os.environ.get("PYCUDNN_CACHE_DIR"), "torch": torch.__version__,
            "device": torch.cuda.get_device_name(), "pycudnn_cudnn": pycudnn.cudnn_version(),
            "torch_cudnn": torch.backends.cudnn.version()}


def run_child(opts: dict[str, Any]) -> dict[str, Any]:
    """``child(opts)`` in a fresh interpreter with an empty tuning database."""
    with tempfile.TemporaryDirectory(prefix="pycudnn-first-call-") as tmp:
        env = dict(os.environ)
        env["PYCUDNN_CACHE_DIR"] = os.path.join(tmp, "cache")
        env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        out = os.path.join(tmp, "result.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(opts), "--child-out", out]
        try:
            proc = subprocess.run(cmd, env=env, timeout=CHILD_TIMEOUT_S, stdout=subprocess.PIPE, text=True)
        except subprocess.TimeoutExpired:
            return {"error": f"the process ran past {CHILD_TIMEOUT_S} s"}
        if proc.returncode != 0 or not os.path.exists(out):
            tail = (proc.stdout or "").strip().splitlines()[-1:] or [""]
            return {"error": f"the process exited with status {proc.returncode} {tail[0]}".strip()}
        with open(out) as f:
            return json.load(f)


# ---- the parent -----------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS))
    ap.add_argument("--directions", default=",".join(DIRECTIONS))
    ap.add_argument("--layers", default="all")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--limits", default="", help="extra pycudnn rows with benchmark_limit=K, comma-separated")
    ap.add_argument("--quick", action="store_true", help="bf16-nhwc forward only")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    return ap


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.child is not None:
        return args
    try:
        if args.quick:
            args.configs, args.directions = "bf16-nhwc", "fwd"
        args.configs = parse_list(args.configs, list(CONFIGS), "--configs")
        args.directions = parse_list(args.directions, list(DIRECTIONS), "--directions")
        args.limits = parse_limits(args.limits)
        gpu_timing.check_positive_int("--batch", args.batch)
        select_layers(resnet50_layers(args.batch), args.layers)
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
    import pycudnn
    from pycudnn import configuration

    has_limit = "benchmark_limit" in configuration.FLAG_NAMES
    default_limit = pycudnn.config.benchmark_limit if has_limit else None
    settings = pycudnn_settings(default_limit, has_limit, args.limits)
    base = {"configs": args.configs, "directions": args.directions, "layers": args.layers,
            "batch": args.batch}
    report: dict[str, Any] = {
        "what": "ms from the first call of a new shape (search on) to its result on the GPU; one "
                "fresh process per pycudnn setting, empty tuning database, libraries warmed on an "
                "unrelated shape; which library goes first alternates per cell",
        "default_benchmark_limit": default_limit, "has_benchmark_limit_flag": has_limit,
        "options": base, "processes": []}
    rows: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    for i, setting in enumerate(settings):
        print(f"{setting['name']}: a fresh process ({time.perf_counter() - t_start:.0f} s)", file=sys.stderr)
        res = run_child(dict(base, flags=setting["flags"]))
        res["setting"] = setting
        report["processes"].append(res)
        if "error" in res:
            print(f"  error: {res['error']}", file=sys.stderr)
            rows.append({"name": setting["name"], "error": res["error"], "summary": {}})
            continue
        if i == 0:
            rows.append({"name": "PyTorch (benchmark=True)", "summary": summarize_side(res["cells"], "torch")})
        rows.append({"name": setting["name"], "summary": summarize_side(res["cells"], "pycudnn")})
        if i > 0:
            rows.append({"name": "  PyTorch in that process",
                         "summary": summarize_side(res["cells"], "torch")})
    report["rows"] = rows
    report["seconds"] = time.perf_counter() - t_start
    print(format_table(rows))
    for p in report["processes"]:
        if "first_result" in p:
            fr = p["first_result"]
            print(f"{p['setting']['name']}: first result in the process ({fr.get('pycudnn_call')}): "
                  f"torch {fr.get('torch_ms', float('nan')):.0f} ms, pycudnn "
                  f"{fr.get('pycudnn_ms', float('nan')):.0f} ms (torch's call first); CUDA Python "
                  f"modules pycudnn's first call imported: "
                  f"{', '.join(fr.get('pycudnn_cuda_python_imports', [])) or 'none'}")
        if "warmup_ms" in p:
            print(f"{p['setting']['name']}: one-time warm-up torch {p['warmup_ms'].get('torch', 0):.0f} ms, "
                  f"pycudnn {p['warmup_ms'].get('pycudnn', 0):.0f} ms; imports torch "
                  f"{p['torch_import_ms']:.0f} ms, pycudnn {p['pycudnn_import_ms']:.0f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
