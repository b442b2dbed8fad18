"""Host cost per call: pycudnn's call paths against PyTorch's on a tiny convolution, where the GPU
work is negligible and what is measured is the host path of one call.

    PYTHONPATH=. python3 benchmarks/host_per_call.py --json $OUT/host_per_call.json

The convolution: input 1x8x8x8, eight 3x3 filters (8x8x3x3), padding 1, float32, TF32 allowed on
both sides, default (legacy) stream for both (torch's current stream unless a script changes it).
Timing ([`gpu_timing.compare_host`]): chunks of 50 back-to-back calls timed with
``time.perf_counter``, the device synchronized between chunks outside the timed part (the launch
queue never fills, the host never waits for the GPU); the columns run in interleaved rounds, the
order rotated each round; each figure is the median over chunks, in microseconds per call.

Which columns compare with which: the **fair** columns take what the PyTorch column takes (torch
tensors in, the output allocated by the call) and are divided by it; the others do less work per
call (pycudnn views made once, ``out=`` given, a prepared object) and are labelled so.

Run it with the pycudnn to measure on ``PYTHONPATH`` (two checkouts compare a change).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Sequence

import gpu_timing  # this script's folder is on sys.path

ENGINES = ("graph", "v7")

#: column -> (what it is, the PyTorch column it is compared with, or None: not comparable)
FORWARD_COLUMNS: dict[str, tuple[str, str | None]] = {
    "F.conv2d": ("torch.nn.functional.conv2d, torch tensors in, output allocated", None),
    "{e}: torch in": ("pycudnn.convolution(x, w), torch tensors in, output allocated", "F.conv2d"),
    "{e}: torch in, stream=current_stream()": (
        "the same with stream=torch.cuda.current_stream() looked up per call, as glue code does",
        "F.conv2d"),
    "{e}: CuPy in": ("pycudnn.convolution with CuPy arrays in (same memory), output allocated",
                     "F.conv2d"),
    "{e}: torch in, out=": ("torch tensors in, a torch output passed as out= (no allocation)", None),
    "{e}: views, out=": ("pycudnn views (as_tensor made once) in, out= given: no conversion, "
                         "no allocation per call", None),
    "{e}: prepared, torch in": ("a prepare_convolution object called with torch tensors, "
                                "output allocated", "F.conv2d"),
    "{e}: prepared, torch in, out=": ("the prepared object, torch tensors in, out= given", None),
    "{e}: prepared, views, out=": ("the prepared object, pycudnn views in, out= given", None),
}
BACKWARD_COLUMNS: dict[str, tuple[str, str | None]] = {
    "torch: backward data": ("torch.ops.aten.convolution_backward, output_mask [True, False, False]",
                             None),
    "torch: backward filter": ("torch.ops.aten.convolution_backward, output_mask [False, True, False]",
                               None),
    "{e}: backward data, torch in": ("pycudnn.convolution_backward_data, torch tensors in, "
                                     "output allocated", "torch: backward data"),
    "{e}: backward filter, torch in": ("pycudnn.convolution_backward_filter, torch tensors in, "
                                       "output allocated", "torch: backward filter"),
    "{e}: backward data, views, out=": ("pycudnn views in, out= given", None),
    "{e}: backward filter, views, out=": ("pycudnn views in, out= given", None),
}


def columns(engines: Sequence[str]) -> dict[str, tuple[str, str | None]]:
    """Every column name (engine filled in) -> (description, the column it is divided by)."""
    out: dict[str, tuple[str, str | None]] = {}
    for table in (FORWARD_COLUMNS, BACKWARD_COLUMNS):
        for name, (what, vs) in table.items():
            if "{e}" in name:
                for e in engines:
                    out[name.format(e=e)] = (f"{e} engine: {what}", vs)
            else:
                out[name] = (what, vs)
    return out


def with_ratios(figures: dict[str, dict[str, float]], cols: dict[str, tuple[str, str | None]]
                ) -> dict[str, dict[str, Any]]:
    """Each measured column's spread, its description and, for the fair ones, ``ratio`` = its
    median over its PyTorch column's (above 1: pycudnn costs more per call)."""
    out: dict[str, dict[str, Any]] = {}
    for name, fig in figures.items():
        what, vs = cols.get(name, ("", None))
        entry: dict[str, Any] = dict(fig, what=what)
        if "error" not in fig and vs is not None and vs in figures and "error" not in figures[vs]:
            entry["vs"] = vs
            entry["ratio"] = gpu_timing.ratio(fig["median"], figures[vs]["median"])
        out[name] = entry
    return out


def format_table(result: dict[str, dict[str, Any]]) -> str:
    lines = ["| path | us per call | / PyTorch | compared with |", "|---|---|---|---|"]
    for name, e in result.items():
        if "error" in e:
            lines.append(f"| {name} | {e['error']} | | |")
            continue
        r = e.get("ratio")
        lines.append(f"| {name} | {e['median']:.2f} | {'' if r is None else f'{r:.2f}'} | "
                     f"{e.get('vs', 'not comparable (less work per call)')} |")
    return "\n".join(lines)


def per_call(torch: Any, fn: Callable[[], Any], calls: int) -> float:
    """Median host microseconds per call (kept for older callers)."""
    return gpu_timing.host_time_us(fn, calls, synchronize=torch.cuda.synchronize)["median"]


def _fns(engines: Sequence[str]) -> tuple[dict[str, Callable[[], Any]], dict[str, str]]:
    import torch
    import torch.nn.functional as F

    import pycudnn

    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = True
    x = torch.randn(1, 8, 8, 8, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    y = torch.empty(1, 8, 8, 8, device="cuda")
    dw = torch.empty_like(w)
    X, W, Y, DW = (pycudnn.as_tensor(t) for t in (x, w, y, dw))
    dx = torch.empty_like(x)
    DX = pycudnn.as_tensor(dx)
    xs, ws = tuple(x.shape), tuple(w.shape)
    fns: dict[str, Callable[[], Any]] = {}
    skipped: dict[str, str] = {}
    aten_bwd = torch.ops.aten.convolution_backward
    fns["F.conv2d"] = lambda: F.conv2d(x, w, None, 1, 1)
    fns["torch: backward data"] = lambda: aten_bwd(y, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                                   [True, False, False])
    fns["torch: backward filter"] = lambda: aten_bwd(y, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0],
                                                     1, [False, True, False])
    try:
        import cupy

        xc, wc = cupy.from_dlpack(x), cupy.from_dlpack(w)
    except Exception as exc:  # noqa: BLE001
        xc = wc = None
        cupy_reason = gpu_timing.error_text(exc)
    conv, cur = pycudnn.convolution, torch.cuda.current_stream
    for e in engines:
        fns[f"{e}: torch in"] = lambda e=e: conv(x, w, padding=1, engine=e)
        fns[f"{e}: torch in, stream=current_stream()"] = lambda e=e: conv(x, w, padding=1, engine=e,
                                                                            stream=cur())
        if xc is not None:
            fns[f"{e}: CuPy in"] = lambda e=e: conv(xc, wc, padding=1, engine=e)
        else:
            skipped[f"{e}: CuPy in"] = f"CuPy unavailable: {cupy_reason}"
        fns[f"{e}: torch in, out="] = lambda e=e: conv(x, w, padding=1, engine=e, out=y)
        fns[f"{e}: views, out="] = lambda e=e: conv(X, W, padding=1, engine=e, out=Y)
        try:
            prep = pycudnn.prepare_convolution(X, W, padding=1, engine=e)
            fns[f"{e}: prepared, torch in"] = lambda p=prep: p(x, w)
            fns[f"{e}: prepared, torch in, out="] = lambda p=prep: p(x, w, out=y)
            fns[f"{e}: prepared, views, out="] = lambda p=prep: p(X, W, out=Y)
        except Exception as exc:  # noqa: BLE001
            for k in ("prepared, torch in", "prepared, torch in, out=", "prepared, views, out="):
                skipped[f"{e}: {k}"] = f"prepare_convolution: {gpu_timing.error_text(exc)}"
        bd, bf = pycudnn.convolution_backward_data, pycudnn.convolution_backward_filter
        fns[f"{e}: backward data, torch in"] = lambda e=e: bd(y, w, xs, padding=1, engine=e)
        fns[f"{e}: backward filter, torch in"] = lambda e=e: bf(x, y, ws, padding=1, engine=e)
        fns[f"{e}: backward data, views, out="] = lambda e=e: bd(Y, W, xs, padding=1, engine=e, out=DX)
        fns[f"{e}: backward filter, views, out="] = lambda e=e: bf(X, Y, ws, padding=1, engine=e, out=DW)
    # a column whose first call fails is reported, not timed
    for name in list(fns):
        try:
            fns[name]()
        except Exception as exc:  # noqa: BLE001
            skipped[name] = gpu_timing.error_text(exc)
            del fns[name]
    torch.cuda.synchronize()
    return fns, skipped


def measure(calls: int, engines: Sequence[str] = ENGINES, rounds: int = 5) -> dict[str, Any]:
    import torch

    import pycudnn

    fns, skipped = _fns(engines)
    figures: dict[str, dict[str, Any]] = dict(
        gpu_timing.compare_host(fns, calls, synchronize=torch.cuda.synchronize, rounds=rounds))
    for name, why in skipped.items():
        figures[name] = {"error": why}
    cols = columns(engines)
    ordered = {name: figures[name] for name in cols if name in figures}
    return {"what": "host microseconds per call, tiny convolution 1x8x8x8 * 8x8x3x3, padding 1, fp32 "
                    "(TF32 allowed); ratio = column / its PyTorch column (above 1: pycudnn costs more)",
            "pycudnn": pycudnn.__file__, "pycudnn_version": pycudnn.__version__,
            "torch": torch.__version__, "device": torch.cuda.get_device_name(),
            "calls": calls, "rounds": rounds, "engines": list(engines),
            "columns": with_ratios(ordered, cols)}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=5000, help="calls per column, over all rounds")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    ap.add_argument("--engines", default=",".join(ENGINES), help="pycudnn engines: graph,v7 or one")
    ap.add_argument("--quick", action="store_true", help="1000 calls per column")
    ap.add_argument("--json", help="write the figures here")
    return ap


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        if args.quick:
            args.calls = min(args.calls, 1000)
        gpu_timing.check_positive_int("--calls", args.calls)
        gpu_timing.check_positive_int("--rounds", args.rounds)
        from conv_vs_torch import parse_list

        args.engines = parse_list(args.engines, list(ENGINES), "--engines")
    except (TypeError, ValueError) as exc:
        ap.error(str(exc))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = measure(args.calls, args.engines, args.rounds)
    print(format_table(out["columns"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
