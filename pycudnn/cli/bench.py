"""``pycudnn bench``: time convolution layers with a measured search, against PyTorch's cuDNN path
when it is installed, and report them as a table, JSON, CSV or a plot.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import math
import sys
from typing import Any

from ..ffi import library as _lib
from ..tuning import db as tuning_db
from .environment import cuda_text, dist_version, list_devices, require_gpu, version_text
from .errors import UsageError
from .models import SHORT, Layer, layers_from_args, parse_directions
from .options import DTYPES, options_from_args
from .report import check_output_path, first_line, format_bytes, format_number, text_table
from .timing import ROW_FIELDS, run_all


def torch_available(args: argparse.Namespace) -> tuple[bool, str | None]:
    """(whether the run compares against PyTorch, why not). Public as a seam for tests and
    tooling."""
    if args.no_torch:
        return False, "--no-torch"
    if importlib.util.find_spec("torch") is None:
        return False, "PyTorch is not installed"
    try:
        import torch
    except Exception as exc:  # noqa: BLE001
        return False, f"import torch failed: {first_line(exc)}"
    if not torch.cuda.is_available():
        return False, "torch.cuda.is_available() is False"
    torch.cuda.set_device(args.device)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.deterministic = False
    tf32 = DTYPES[args.dtype][1]
    torch.backends.cudnn.allow_tf32 = True if tf32 is None else tf32
    return True, None


def cmd_bench(args: argparse.Namespace) -> int:
    """Time layers with benchmark=True (and PyTorch's cuDNN path when installed)."""

    layers = layers_from_args(args)
    directions = parse_directions(args.direction)
    for option in ("json", "csv", "plot"):
        check_output_path(f"--{option}", getattr(args, option))
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib, which is not installed (pip install matplotlib)")
    require_gpu("bench", args.device)
    opts = options_from_args(args)
    torch_on, torch_why = torch_available(args)
    meta = bench_meta(args, opts, layers, directions)
    meta["torch"] = dist_version("torch") if torch_on else None
    meta["torch_skipped"] = torch_why
    if not args.quiet:
        print(_header(meta), file=sys.stderr)
    rows = run_all(layers, directions, opts, args.device, torch_on, args.quiet, "bench", True)
    meta["tuning_db_entries"] = len(tuning_db.entries()) if opts["use_db"] else None
    print(_bench_table(rows, torch_on, args.all_candidates))
    print(_summary(rows, meta, torch_on))
    result = dict(meta, rows=rows)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    if args.csv:
        _write_csv(args.csv, rows)
    if args.plot:
        _plot(args.plot, rows, meta, torch_on)
    failed = [r for r in rows if r["error"]]
    if failed:
        print(f"pycudnn bench: {len(failed)} of {len(rows)} measurements failed (see the table)",
              file=sys.stderr)
        return 1
    return 0


def bench_meta(args: argparse.Namespace, opts: dict[str, Any], layers: list[Layer],
               directions: list[str]) -> dict[str, Any]:
    """What the report says about the run: devices, versions, options, layers. Public as a seam
    for tests and tooling."""
    import pycudnn


    devices, _ = list_devices()
    dev = next((d for d in devices if d.get("index") == args.device), {})
    return {"pycudnn": pycudnn.__version__, "cudnn": version_text(_lib.version()),
            "cuda_runtime": cuda_text(_lib.cudart_version()), "device": dev,
            "settings": {"model": args.model or ("resnet50" if not (args.shape or getattr(args, "shapes_file", None)) else None),
                         "dtype": args.dtype, "layout": args.layout, "engine": opts["engine"],
                         "directions": [SHORT[d] for d in directions],
                         "batch": args.batch, "layers": len(layers),
                         "tuning_db": opts["use_db"], "fresh": opts["fresh"]},
            "tuning_db": tuning_db.path()}


def _header(meta: dict[str, Any]) -> str:
    d, s = meta["device"], meta["settings"]
    cc = ".".join(map(str, d.get("compute_capability", [])))
    torch = f"torch {meta['torch']}" if meta.get("torch") else f"no torch column ({meta['torch_skipped']})"
    return (f"pycudnn {meta['pycudnn']}, cuDNN {meta['cudnn']}, GPU {d.get('index')}: {d.get('name')} "
            f"(cc {cc}, {d.get('sm_count')} SMs); {s['dtype']} {s['layout'].upper()}, engine "
            f"{s['engine']}, {s['layers']} layers x {'/'.join(s['directions'])}; {torch}")


def _bench_table(rows: list[dict[str, Any]], torch_on: bool, candidates: bool) -> str:
    headers = ["layer", "dir", "ms", "TFLOP/s"]
    if torch_on:
        headers += ["torch ms", "torch TFLOP/s", "torch/pycudnn"]
    headers += ["choice", "workspace", "source", "1st call ms"]
    body = []
    for r in rows:
        line = [r["layer"], SHORT[r["direction"]], format_number(r["ms"], 4), format_number(r["tflops"], 1)]
        if torch_on:
            line += [format_number(r["torch_ms"], 4), format_number(r["torch_tflops"], 1),
                     format_number(r["torch_over_pycudnn"], 2)]
        choice = r["choice"] or "-"
        if r["error"]:
            choice = "ERROR " + r["error"]
        line += [choice, format_bytes(r["workspace"]), r["source"] or "-",
                 format_number(r["first_call_ms"], 1)]
        body.append(line)
    right = {2, 3} | ({4, 5, 6} if torch_on else set())
    right.add(len(headers) - 1)
    text = text_table(headers, body, right)
    if candidates:
        parts = [text]
        for r in rows:
            cands = r.get("candidates")
            if not cands:
                continue
            parts.append(f"\n{r['layer']} {SHORT[r['direction']]}: {len(cands)} candidates")
            parts.append(text_table(["#", "choice", "ms", "workspace", "notes"], [
                [i + 1, c["choice"],
                 format_number(c["time_ms"], 4) if c["time_ms"] is not None else "untimed",
                 format_bytes(c["workspace"]), ",".join(c["notes"])] for i, c in enumerate(cands)],
                {0, 2}))
        text = "\n".join(parts)
    return text


def _summary(rows: list[dict[str, Any]], meta: dict[str, Any], torch_on: bool) -> str:
    ok = [r for r in rows if r["ms"]]
    lines = []
    if ok:
        total = sum(r["ms"] for r in ok)
        lines.append(f"\n{len(ok)} measurements, {total:.3f} ms in all (sum of per-call times)")
    ratios = [r["torch_over_pycudnn"] for r in rows if r.get("torch_over_pycudnn")]
    if torch_on and ratios:
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        lines.append(f"torch/pycudnn geometric mean {geo:.3f} (above 1: pycudnn is faster)")
    if meta.get("tuning_db_entries") is not None:
        lines.append(f"tuning database: {meta['tuning_db']} ({meta['tuning_db_entries']} records)")
    return "\n".join(lines)


_CSV_FIELDS = [f for f in ROW_FIELDS if f != "choice_detail"]


def _write_csv(file: str, rows: list[dict[str, Any]]) -> None:
    with open(file, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=_CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(dict(r, shape=r["shape"]["shape"]))


def _plot(file: str, rows: list[dict[str, Any]], meta: dict[str, Any], torch_on: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['layer']} {SHORT[r['direction']]}" for r in rows]
    ours = [r["tflops"] or 0.0 for r in rows]
    theirs = [r["torch_tflops"] or 0.0 for r in rows]
    width = 0.4 if torch_on else 0.8
    fig, ax = plt.subplots(figsize=(max(8.0, 0.35 * len(rows) + 2), 5))
    xs = range(len(rows))
    ax.bar([x - (width / 2 if torch_on else 0) for x in xs], ours, width, label="pycudnn")
    if torch_on:
        ax.bar([x + width / 2 for x in xs], theirs, width, label=f"torch {meta.get('torch')}")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=75, ha="right", fontsize=7)
    ax.set_ylabel("TFLOP/s")
    d, s = meta["device"], meta["settings"]
    ax.set_title(f"{d.get('name')}: {s['dtype']} {s['layout'].upper()}, engine {s['engine']}, "
                 f"cuDNN {meta['cudnn']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(file, dpi=120)
    plt.close(fig)
