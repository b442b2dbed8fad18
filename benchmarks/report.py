"""Render the JSON written by conv_vs_torch.py and fused_vs_torch.py as Markdown tables.

    python benchmarks/report.py k_bf16-nhwc.json k_fp16-nhwc.json ... host.json fused.json
"""

from __future__ import annotations

import json
import math
import sys


def geomean(v):
    v = [x for x in v if x and x > 0]
    return math.exp(sum(map(math.log, v)) / len(v)) if v else float("nan")


def kernels(rows, out):
    out.append("| config | layer | dir | torch ms | torch TFLOP/s | graph ms | torch/graph | v7 ms | torch/v7 |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        out.append(f"| {r['config']} | {r['layer']} | {r['direction']} | {r['torch_ms']:.4f} | "
                   f"{r['torch_tflops']:.0f} | {r.get('graph_ms', float('nan')):.4f} | "
                   f"{r.get('graph_ratio', float('nan')):.3f} | {r.get('v7_ms', float('nan')):.4f} | "
                   f"{r.get('v7_ratio', float('nan')):.3f} |")


def main(paths):
    cells, host, fused, first = [], None, None, []
    for p in paths:
        d = json.load(open(p))
        cells += d.get("cells", [])
        host = d.get("host_overhead", host)
        first += d.get("first_call", [])
        if "rows" in d:
            fused = d
    out = []
    if cells:
        out.append("### Kernel time per call (ms), torch / pycudnn\n")
        configs = sorted({r["config"] for r in cells}, key=lambda c: [r["config"] for r in cells].index(c))
        out.append("| engine | " + " | ".join(configs) + " | all cells | min | cells < 0.90 |")
        out.append("|---|" + "---|" * (len(configs) + 3))
        for e in ("graph", "v7"):
            ratios = [r[f"{e}_ratio"] for r in cells if f"{e}_ratio" in r]
            per = [geomean([r[f"{e}_ratio"] for r in cells if r["config"] == c and f"{e}_ratio" in r]) for c in configs]
            out.append(f"| {e} | " + " | ".join(f"{v:.3f}" for v in per) +
                       f" | {geomean(ratios):.3f} | {min(ratios):.3f} | {sum(v < 0.9 for v in ratios)} of {len(ratios)} |")
        out.append("")
        kernels(cells, out)
        out.append("")
    if host:
        out.append("### Host time per call, tiny convolution (1x8x8x8, eight 3x3 filters, fp32)\n")
        out.append("| path | us per call | / F.conv2d |")
        out.append("|---|---|---|")
        t = host["torch_F.conv2d_us"]
        for k, name in (("torch_F.conv2d_us", "F.conv2d"), ("pycudnn.convolution_us", "pycudnn.convolution"),
                        ("prepared_us", "prepared, out= given"), ("prepared_new_output_us", "prepared, new output")):
            out.append(f"| {name} | {host[k]:.2f} | {host[k] / t:.2f} |")
        out.append("")
    if first:
        out.append("### First call of a new shape, benchmark on (ms, libraries already loaded)\n")
        out.append("| shape N,C,H,W,K,R,s,p | torch | pycudnn graph |")
        out.append("|---|---|---|")
        for f in first:
            out.append(f"| {','.join(map(str, f['shape']))} | {f['torch_ms']:.1f} | {f['pycudnn_graph_ms']:.1f} |")
        out.append("")
    if fused:
        s = fused["summary"]
        batches = sorted({r["layer"][0] for r in fused.get("rows", [])}) or [32]
        out.append(f"### Fused conv + bias + residual + relu (alpha={fused.get('alpha', 1.0)}), "
                   f"batch {'/'.join(map(str, batches))}, NHWC\n")
        out.append(f"Geometric means: eager / fused = {s['eager_over_fused_geomean']:.2f}, "
                   f"torch.compile / fused = {s['compile_over_fused_geomean']:.2f}, "
                   f"conv+bias+relu eager / pycudnn = {s['bias_relu_eager_over_pycudnn_geomean']:.2f}, "
                   f"conv+bias eager / pycudnn = {s['bias_eager_over_pycudnn_geomean']:.2f}. {s.get('compile_note', '')}\n")
        out.append("| dtype | layer N,C,H,W,K,R,s,p | fused ms | eager ms | eager/fused | compile ms | compile/fused | bias+relu eager/pycudnn | max rel err vs fp64 |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        for r in fused["rows"]:
            out.append(f"| {r['dtype']} | {','.join(map(str, r['layer']))} | {r['fused_ms']:.4f} | {r['eager_ms']:.4f} | "
                       f"{r['eager_over_fused']:.2f} | {r.get('compile_ms', float('nan')):.4f} | "
                       f"{r.get('compile_over_fused', float('nan')):.2f} | {r['bias_relu_eager_over_pycudnn']:.2f} | "
                       f"{r['max_rel_err']:.1e} |")
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1:])
