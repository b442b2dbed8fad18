"""Kernel time of pycudnn's convolutions against PyTorch's, in one process, on the same stream.

    PYTHONPATH=. python3 benchmarks/conv_vs_torch.py --json $OUT/conv_vs_torch.json

What is measured: **GPU time per call with the host far ahead** (see ``gpu_timing.py``). Each batch
of calls is queued behind a gate that the host opens only after the last call is queued, so the
GPU runs them back to back and no host launch gap is in the figure; host cost per call is
``host_per_call.py``'s business, the first call of a shape ``first_call.py``'s.

What each side gets, the same for both: torch tensors in, its own outputs allocated per call,
torch's current stream, a search by measurement (``torch.backends.cudnn.benchmark = True``;
pycudnn ``benchmark=True`` with its tuning database off, so neither starts from choices stored by
an earlier run), TF32 allowed on both for float32 (``torch.backends.cudnn.allow_tf32``,
``torch.backends.cuda.matmul.allow_tf32``, pycudnn ``allow_tf32=True``).

* PyTorch: ``F.conv2d(x, w, stride=, padding=)`` (forward);
  ``torch.ops.aten.convolution_backward(dy, x, w, None, stride, padding, dilation, False, [0, 0],
  1, mask)`` with mask ``[True, False, False]`` (backward data) or ``[False, True, False]``
  (backward filter), what autograd calls.
* pycudnn: ``pycudnn.convolution(x, w, ...)``, ``pycudnn.convolution_backward_data(dy, w,
  x.shape, ...)``, ``pycudnn.convolution_backward_filter(x, dy, w.shape, ...)``, no ``out=``.

Layers: ResNet-50's 23 distinct convolutions (``pycudnn.cli.models.MODELS["resnet50"]``) at batch 32;
configs ``bf16-nhwc`` (channels_last) and ``fp32-nchw-tf32`` by default (also ``fp16-nhwc``,
``fp32-nchw``); forward, backward data, backward filter. Batches of the two sides alternate and
each round the other side goes first. After warm-up, ``torch.profiler`` records one call of each
side: the kernels each ran are in the JSON, and the table marks the cells where they differ.

Ratios are torch / pycudnn: above 1 means pycudnn's kernels are faster. A failing cell prints its
error and the run goes on. ``zoo.py --parts kernels`` times the torchvision models' convolutions
(rectangular kernels, dilation and groups too) through this script's ``_calls`` and
``measure_cell``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any, Callable, Sequence

import gpu_timing  # this script's folder is on sys.path
from gpu_timing import error_text, geomean, ratio

CONFIGS = {
    # name: (torch dtype name, channels_last, allow_tf32)
    "bf16-nhwc": ("bfloat16", True, True),
    "fp32-nchw-tf32": ("float32", False, True),
    "fp16-nhwc": ("float16", True, True),
    "fp32-nchw": ("float32", False, False),
}
DEFAULT_CONFIGS = ("bf16-nhwc", "fp32-nchw-tf32")
DIRECTIONS = ("fwd", "dgrad", "wgrad")
BELOW = 0.90  # a cell under this ratio is listed in the summary
QUICK = {"reps": 40, "batches": 4}
FULL = {"reps": 100, "batches": 6}


def resnet50_layers(batch: int) -> list[Any]:
    """ResNet-50's 23 distinct convolution layers (``pycudnn.cli.models.Layer``) at ``batch``."""
    from pycudnn.cli.models import model_layers

    return model_layers("resnet50", batch)


def select_layers(layers: Sequence[Any], spec: str) -> list[Any]:
    """``spec``: ``all``, or comma-separated layer names and/or indexes (0-based)."""
    if spec.strip() == "all":
        return list(layers)
    by_name = {layer.name: layer for layer in layers}
    out = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if item in by_name:
            out.append(by_name[item])
        elif item.isdigit() and int(item) < len(layers):
            out.append(layers[int(item)])
        else:
            raise ValueError(f"--layers: unknown layer {item!r}; expected 'all', a name "
                             f"({', '.join(by_name)}) or an index 0-{len(layers) - 1}")
    if not out:
        raise ValueError("--layers: no layer named")
    return out


def parse_list(text: str, allowed: Sequence[str], option: str) -> list[str]:
    """Comma-separated choices (``all`` for every one), in the order given, duplicates dropped."""
    if text.strip() == "all":
        return list(allowed)
    items: list[str] = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        if item not in allowed:
            raise ValueError(f"{option}: unknown value {item!r}; expected 'all' or a comma-separated "
                             f"list of {', '.join(allowed)}")
        if item not in items:
            items.append(item)
    if not items:
        raise ValueError(f"{option}: expected at least one of {', '.join(allowed)}")
    return items


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                    help=f"comma-separated, or 'all' ({', '.join(CONFIGS)}); default %(default)s")
    ap.add_argument("--directions", default=",".join(DIRECTIONS), help="fwd,dgrad,wgrad or a subset")
    ap.add_argument("--layers", default="all", help="'all', or layer names / indexes, comma-separated")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--engine", default="graph", choices=("graph", "v7"), help="pycudnn's engine")
    ap.add_argument("--reps", type=int, default=None,
                    help=f"calls per gated batch (capped by the launch queue; default {FULL['reps']})")
    ap.add_argument("--batches", type=int, default=None,
                    help=f"gated batches per side and cell (default {FULL['batches']})")
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK['reps']} calls x {QUICK['batches']} batches, no kernel names")
    ap.add_argument("--no-kernel-names", action="store_true", help="skip the torch.profiler pass")
    ap.add_argument("--gate", default="auto", choices=("auto", "wait", "spin"),
                    help="how batches are held: stream wait on a host word, or a spin kernel")
    ap.add_argument("--json", default=None, help="write every figure here (rewritten after each config)")
    return ap


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parsed and checked arguments (``configs``, ``directions`` as lists; ``reps``/``batches``
    filled in); a usage error exits with status 2."""
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        args.configs = parse_list(args.configs, list(CONFIGS), "--configs")
        args.directions = parse_list(args.directions, list(DIRECTIONS), "--directions")
        base = QUICK if args.quick else FULL
        args.reps = base["reps"] if args.reps is None else args.reps
        args.batches = base["batches"] if args.batches is None else args.batches
        gpu_timing.check_positive_int("--reps", args.reps)
        gpu_timing.check_positive_int("--batches", args.batches)
        gpu_timing.check_positive_int("--batch", args.batch)
        if args.layers.strip() != "all":
            select_layers(resnet50_layers(args.batch), args.layers)
    except (TypeError, ValueError) as exc:
        ap.error(str(exc))
    if args.quick:
        args.no_kernel_names = True
    return args


# ---- summary and table (no GPU) -------------------------------------------------------------------

def cell_label(row: dict[str, Any]) -> str:
    return f"{row['config']} {row['layer']} {row['direction']}"


def kernels_differ(row: dict[str, Any]) -> bool | None:
    """Whether the two sides ran different kernels (memsets and copies ignored); None if unknown."""
    t, p = row.get("torch_kernels"), row.get("pycudnn_kernels")
    if t is None or p is None:
        return None
    strip = lambda names: [n for n in names if not n.startswith("[")]  # noqa: E731
    return strip(t) != strip(p)


def summarize(rows: Sequence[dict[str, Any]], configs: Sequence[str] | None = None) -> dict[str, Any]:
    """Geomean of torch/pycudnn per config and overall, the min cell, the cells below 0.90 and the
    failed cells."""
    configs = list(configs) if configs is not None else list(dict.fromkeys(r["config"] for r in rows))
    ok = [r for r in rows if isinstance(r.get("ratio"), float) and math.isfinite(r["ratio"])]
    out: dict[str, Any] = {
        "geomean": geomean(r["ratio"] for r in ok),
        "per_config": {c: geomean(r["ratio"] for r in ok if r["config"] == c) for c in configs},
        "cells": len(rows), "timed": len(ok),
        "errors": [f"{cell_label(r)}: {r['error']}" for r in rows if r.get("error")],
        "below": [f"{cell_label(r)} {r['ratio']:.3f}" for r in sorted(ok, key=lambda r: r["ratio"])
                  if r["ratio"] < BELOW],
        "kernels_differ": sum(1 for r in rows if kernels_differ(r)),
    }
    if ok:
        worst = min(ok, key=lambda r: r["ratio"])
        out["min"] = {"ratio": worst["ratio"], "cell": cell_label(worst)}
    else:
        out["min"] = None
    return out


def _fmt(v: Any, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The per-cell table (Markdown)."""
    lines = ["| config | layer | shape | dir | torch us | pycudnn us | torch/pycudnn | kernels |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        diff = kernels_differ(r)
        kern = "-" if diff is None else ("differ" if diff else "same")
        note = f" ({r['error']})" if r.get("error") else ""
        lines.append(f"| {r['config']} | {r['layer']} | {r.get('shape', '')} | {r['direction']} | "
                     f"{_fmt(r.get('torch_us'), '.2f')} | {_fmt(r.get('pycudnn_us'), '.2f')} | "
                     f"{_fmt(r.get('ratio'), '.3f')}{note} | {kern} |")
    return "\n".join(lines)


def format_kernel_differences(rows: Sequence[dict[str, Any]]) -> str:
    """The cells whose kernels differ, with both sides' kernel names."""
    out = []
    for r in rows:
        if kernels_differ(r):
            out.append(f"- {cell_label(r)} (torch/pycudnn {_fmt(r.get('ratio'), '.3f')}):\n"
                       f"  torch:   {'; '.join(r['torch_kernels']) or '(none)'}\n"
                       f"  pycudnn: {'; '.join(r['pycudnn_kernels']) or '(none)'}")
    return "\n".join(out)


def format_summary(summary: dict[str, Any]) -> str:
    per = ", ".join(f"{c} {_fmt(v, '.3f')}" for c, v in summary["per_config"].items())
    mn = summary["min"]
    lines = [f"geomean torch/pycudnn {_fmt(summary['geomean'], '.3f')} over {summary['timed']} of "
             f"{summary['cells']} cells ({per})",
             f"min {_fmt(mn['ratio'], '.3f')} ({mn['cell']})" if mn else "min -",
             f"cells below {BELOW:.2f}: {len(summary['below'])}"
             + (": " + ", ".join(summary["below"]) if summary["below"] else ""),
             f"cells whose kernels differ: {summary['kernels_differ']}",
             f"failed cells: {len(summary['errors'])}"]
    lines += [f"  {e}" for e in summary["errors"]]
    return "\n".join(lines)


# ---- measurement (GPU) ----------------------------------------------------------------------------

def _pair(value: Any) -> list[int]:
    """An int or a (height, width) pair as a [height, width] list."""
    return [int(value)] * 2 if isinstance(value, int) else [int(v) for v in value]


def _calls(torch: Any, F: Any, pycudnn: Any, layer: Any, direction: str, x: Any, w: Any, dy: Any,
           flags: dict[str, Any], stream: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """The PyTorch and pycudnn calls of one cell: ``layer`` has ``stride`` and ``pad`` (an int or
    one per spatial dim), ``dilation`` and ``groups`` (as `pycudnn.cli.models.Layer`; both
    default to 1 where absent); the kernel's size is ``w``'s."""
    st, pd = _pair(layer.stride), _pair(layer.pad)
    dl, g = _pair(getattr(layer, "dilation", 1)), int(getattr(layer, "groups", 1))
    geometry = {"stride": st, "padding": pd, "dilation": dl, "groups": g}
    if direction == "fwd":
        tfn = lambda: F.conv2d(x, w, None, st, pd, dl, g)  # noqa: E731
        pfn = lambda: pycudnn.convolution(x, w, stream=stream, **geometry, **flags)  # noqa: E731
    elif direction == "dgrad":
        mask = [True, False, False]
        xs = tuple(x.shape)
        tfn = lambda: torch.ops.aten.convolution_backward(  # noqa: E731
            dy, x, w, None, st, pd, dl, False, [0, 0], g, mask)
        pfn = lambda: pycudnn.convolution_backward_data(  # noqa: E731
            dy, w, xs, stream=stream, **geometry, **flags)
    elif direction == "wgrad":
        mask = [False, True, False]
        ws = tuple(w.shape)
        tfn = lambda: torch.ops.aten.convolution_backward(  # noqa: E731
            dy, x, w, None, st, pd, dl, False, [0, 0], g, mask)
        pfn = lambda: pycudnn.convolution_backward_filter(  # noqa: E731
            x, dy, ws, stream=stream, **geometry, **flags)
    else:
        raise ValueError(f"direction: expected one of {', '.join(DIRECTIONS)}, got {direction!r}")
    return tfn, pfn


def measure_cell(torch: Any, pycudnn: Any, row: dict[str, Any], tfn: Callable[[], Any],
                 pfn: Callable[[], Any], args: argparse.Namespace, gate: Any, first: str) -> None:
    """Fill ``row`` with one cell's figures (errors recorded in ``row["error"]``)."""
    stream = torch.cuda.current_stream().cuda_stream
    sides = {"torch": tfn, "pycudnn": pfn}
    order = [first] + [s for s in sides if s != first]
    for side in order:  # the search (benchmark on) happens here, outside any timing
        try:
            sides[side]()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a failing side is reported, the run goes on
            row["error"] = f"{side} first call: {error_text(exc)}"
            torch.cuda.synchronize()
            return
    launches = {"torch": 1, "pycudnn": 1}
    if not args.no_kernel_names:
        try:
            names = gpu_timing.kernel_names(torch, [sides[s] for s in order])
            for side, n in zip(order, names):
                row[f"{side}_kernels"] = n
                launches[side] = gpu_timing.device_launch_count(n)
        except Exception as exc:  # noqa: BLE001
            row["kernel_names_error"] = error_text(exc)
    try:
        samples = gpu_timing.compare_gated({s: sides[s] for s in order}, stream, args.reps, args.batches,
                                           gate=gate, launches_per_call=launches,
                                           synchronize=torch.cuda.synchronize)
    except Exception as exc:  # noqa: BLE001
        row["error"] = f"timing: {error_text(exc)}"
        torch.cuda.synchronize()
        return
    for side in sides:
        sp = gpu_timing.spread(samples[side])
        row[f"{side}_us"] = sp["median"]
        row[f"{side}_samples_us"] = samples[side]
        row[f"{side}_rel_iqr"] = sp["rel_iqr"]
    row["ratio"] = ratio(row["torch_us"], row["pycudnn_us"])
    for side in sides:  # GFLOP / us * 1e3 = TFLOP/s
        us = row[f"{side}_us"]
        row[f"{side}_tflops"] = row["gflop"] / us * 1e3 if math.isfinite(us) and us > 0 else None


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    import pycudnn

    if not torch.cuda.is_available():
        raise SystemExit("conv_vs_torch.py: needs a CUDA GPU and PyTorch built with CUDA")
    torch.backends.cudnn.benchmark = True
    gate = gpu_timing.get_gate(torch.cuda.current_device(), torch, args.gate)
    layers = select_layers(resnet50_layers(args.batch), args.layers)
    report: dict[str, Any] = {
        "what": "GPU time per call, host far ahead (gated batches); torch tensors in, outputs "
                "allocated by each library; ratio = torch_us / pycudnn_us",
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "torch_cudnn": torch.backends.cudnn.version(), "pycudnn": pycudnn.__version__,
        "pycudnn_cudnn": pycudnn.cudnn_version(), "pycudnn_config": repr(pycudnn.config),
        "engine": args.engine, "batch": args.batch, "reps": args.reps, "batches": args.batches,
        "gate": gate.describe(), "configs": args.configs, "directions": args.directions,
        "cells": [],
    }
    print(f"gate: {gate.mode} ({gate.reason})", file=sys.stderr)
    rows: list[dict[str, Any]] = report["cells"]
    total = len(args.configs) * len(layers) * len(args.directions)
    t_start = time.perf_counter()
    for cname in args.configs:
        dtype_name, channels_last, tf32 = CONFIGS[cname]
        dtype = getattr(torch, dtype_name)
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        flags = {"benchmark": True, "allow_tf32": tf32, "engine": args.engine, "tuning_db": False}
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        for layer in layers:
            try:
                x = torch.randn(layer.x_shape, device="cuda", dtype=dtype).to(memory_format=fmt)
                w = (torch.randn(layer.w_shape, device="cuda", dtype=dtype) * 0.05).to(memory_format=fmt)
                dy = torch.randn(layer.y_shape, device="cuda", dtype=dtype).to(memory_format=fmt)
            except Exception as exc:  # noqa: BLE001
                for d in args.directions:
                    rows.append({"config": cname, "layer": layer.name, "direction": d,
                                 "shape": layer.shape_string(), "error": f"inputs: {error_text(exc)}"})
                continue
            for d in args.directions:
                row: dict[str, Any] = {"config": cname, "layer": layer.name, "direction": d,
                                       "shape": layer.shape_string(), "gflop": layer.flops / 1e9}
                first = "torch" if len(rows) % 2 == 0 else "pycudnn"
                row["first"] = first
                print(f"[{len(rows) + 1}/{total}] {cname} {layer.name} {d} "
                      f"({time.perf_counter() - t_start:.0f} s)", file=sys.stderr, flush=True)
                try:
                    stream = torch.cuda.current_stream()
                    tfn, pfn = _calls(torch, F, pycudnn, layer, d, x, w, dy, flags, stream)
                    measure_cell(torch, pycudnn, row, tfn, pfn, args, gate, first)
                except Exception as exc:  # noqa: BLE001
                    row["error"] = error_text(exc)
                if row.get("error"):
                    print(f"  error: {row['error']}", file=sys.stderr)
                else:
                    diff = kernels_differ(row)
                    print(f"  torch {row['torch_us']:.2f} us, pycudnn {row['pycudnn_us']:.2f} us, "
                          f"torch/pycudnn {row['ratio']:.3f}"
                          + ("" if diff is None else (", kernels differ" if diff else ", same kernels")),
                          file=sys.stderr)
                rows.append(row)
            del x, w, dy
        report["summary"] = summarize(rows, args.configs)
        report["seconds"] = time.perf_counter() - t_start
        if args.json:
            write_json(args.json, report)
    return report


def write_json(path: str, report: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(report, f, indent=1, default=str)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    rows = report["cells"]
    print(format_table(rows))
    diffs = format_kernel_differences(rows)
    if diffs:
        print("\nCells whose kernels differ:\n" + diffs)
    report["summary"] = summarize(rows, args.configs)
    print("\n" + format_summary(report["summary"]))
    print(f"({report.get('seconds', 0):.0f} s)")
    if args.json:
        write_json(args.json, report)
    return 0


# Older scripts imported this; it times back-to-back calls with host launch gaps included.
time_calls = gpu_timing.back_to_back_ms

if __name__ == "__main__":
    sys.exit(main())
