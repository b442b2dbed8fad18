"""Render the JSON the benchmark scripts write as Markdown (each file by what it holds).

    python3 benchmarks/report.py $OUT/conv_vs_torch.json $OUT/host_per_call.json $OUT/first_call.json ...

Kinds recognised: ``conv_vs_torch.py`` (kernel time, per cell), ``host_per_call.py`` (call cost),
``first_call.py`` (first call of a new shape), ``fused_vs_torch.py``, and the earlier
``conv_vs_torch.py`` format (``graph_ms``/``v7_ms`` cells, ``host_overhead``), whose figures timed
back-to-back calls with host launch cost included.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Sequence

import conv_vs_torch  # this script's folder is on sys.path
import first_call
import host_per_call
from gpu_timing import geomean


def kind(d: dict[str, Any]) -> str:
    """Which script wrote ``d``."""
    cells = d.get("cells")
    if isinstance(cells, list) and (not cells or "graph_ms" not in cells[0]) and "summary" in d:
        return "kernel"
    if isinstance(cells, list) or "host_overhead" in d or isinstance(d.get("F.conv2d"), float):
        return "legacy"
    if "columns" in d:
        return "host"
    if "processes" in d:
        return "first_call"
    if "rows" in d and "summary" in d:
        return "fused"
    return "unknown"


def render_kernel(d: dict[str, Any]) -> list[str]:
    rows = d["cells"]
    summary = conv_vs_torch.summarize(rows)
    out = [f"### Kernel time per call, torch / pycudnn (batch {d.get('batch')}, gate: "
           f"{d.get('gate', {}).get('mode', '?')})\n",
           "GPU time with the host far ahead; torch tensors in, outputs allocated by each library.\n",
           "```", conv_vs_torch.format_summary(summary), "```", "", conv_vs_torch.format_table(rows)]
    diffs = conv_vs_torch.format_kernel_differences(rows)
    if diffs:
        out += ["", "Cells whose kernels differ:", "", diffs]
    return out + [""]


def render_host(d: dict[str, Any]) -> list[str]:
    return ["### Host cost per call, tiny convolution (1x8x8x8, eight 3x3 filters, fp32)\n",
            f"{d.get('calls')} calls per column in {d.get('rounds')} interleaved rounds; median us "
            "per call.\n", host_per_call.format_table(d["columns"]), ""]


def render_first_call(d: dict[str, Any]) -> list[str]:
    return ["### First call of a new shape, benchmark on (empty tuning database)\n",
            f"Configs {', '.join(d['options']['configs'])}; directions "
            f"{', '.join(d['options']['directions'])}; pycudnn's default benchmark_limit: "
            f"{d.get('default_benchmark_limit')!r}.\n", first_call.format_table(d["rows"]), ""]


def render_fused(d: dict[str, Any]) -> list[str]:
    s = d["summary"]
    out = [f"### Fused conv + bias + residual + relu (alpha={d.get('alpha', 1.0)})\n",
           f"{s.get('what', 'back-to-back calls, host launch cost included')}. Geometric means: "
           f"eager / fused = {s['eager_over_fused_geomean']:.2f}, torch.compile / fused = "
           f"{s['compile_over_fused_geomean']:.2f}, conv+bias+relu eager / pycudnn = "
           f"{s['bias_relu_eager_over_pycudnn_geomean']:.2f}, conv+bias eager / pycudnn = "
           f"{s['bias_eager_over_pycudnn_geomean']:.2f}. {s.get('compile_note', '')}\n",
           "| dtype | layer N,C,H,W,K,R,s,p | fused ms | eager ms | eager/fused | compile ms | "
           "compile/fused | bias+relu eager/pycudnn | max rel err vs fp64 |",
           "|---|---|---|---|---|---|---|---|---|"]
    nan = float("nan")
    for r in d["rows"]:
        layer = ",".join(map(str, r["layer"]))
        if "error" in r:
            out.append(f"| {r['dtype']} | {layer} | {r['error']} | | | | | | |")
            continue
        out.append(f"| {r['dtype']} | {layer} | {r['fused_ms']:.4f} | {r['eager_ms']:.4f} | "
                   f"{r['eager_over_fused']:.2f} | {r.get('compile_ms', nan):.4f} | "
                   f"{r.get('compile_over_fused', nan):.2f} | {r['bias_relu_eager_over_pycudnn']:.2f} | "
                   f"{r.get('max_rel_err', nan):.1e} |")
    return out + [""]


def render_legacy(d: dict[str, Any]) -> list[str]:
    out = ["### (earlier format: back-to-back calls, host launch cost included)\n"]
    cells = d.get("cells") or []
    if cells:
        out.append("| engine | geomean torch/pycudnn | min | cells < 0.90 |")
        out.append("|---|---|---|---|")
        for e in ("graph", "v7"):
            ratios = [r[f"{e}_ratio"] for r in cells if f"{e}_ratio" in r]
            if ratios:
                out.append(f"| {e} | {geomean(ratios):.3f} | {min(ratios):.3f} | "
                           f"{sum(v < 0.9 for v in ratios)} of {len(ratios)} |")
    host = d.get("host_overhead") or {k: v for k, v in d.items() if isinstance(v, float)}
    if host:
        out.append("")
        out.append("| path | us per call |")
        out.append("|---|---|")
        for k, v in host.items():
            if isinstance(v, float):
                out.append(f"| {k} | {v:.2f} |")
    return out + [""]


RENDER = {"kernel": render_kernel, "host": render_host, "first_call": render_first_call,
          "fused": render_fused, "legacy": render_legacy}


def main(paths: Sequence[str]) -> int:
    if not paths or paths[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if paths else 2
    out: list[str] = []
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        k = kind(d)
        if k == "unknown":
            out.append(f"<!-- {p}: not a benchmark result this script knows -->")
            continue
        out.append(f"<!-- {p} -->")
        out += RENDER[k](d)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
