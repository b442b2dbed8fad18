"""Write README.md's model table from a ``benchmarks/zoo.py`` results file.

    python3 benchmarks/readme_table.py benchmarks/results/2026-12-01/zoo.json   # rewrite README
    python3 benchmarks/readme_table.py --check                                  # 1 if stale

The table sits between the two markers below in README.md; the first line inside names the
results file it was made from, so ``--check`` (and the CPU test that runs it) can tell whether the
README still says what that file says.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- zoo-table:begin -->", "<!-- zoo-table:end -->"


#: the results "file" of a README that quotes no figure (none measured at its code)
NONE = "none"


def render(results_file: str) -> str:
    """The README block (markers included) for ``results_file`` (a path relative to the root),
    or, for `NONE`, a block that says no figure is measured at the current code."""
    if results_file == NONE:
        return "\n".join([BEGIN, f"<!-- made by benchmarks/readme_table.py from {NONE} -->", "",
                           "No figures measured at the current code yet: the code under the last "
                           "ones changed after they were measured. They are kept, with their "
                           "commit, in CHANGELOG.md.", END])
    data = json.loads((ROOT / results_file).read_text())
    lines = [BEGIN, f"<!-- made by benchmarks/readme_table.py from {results_file} -->", "",
             "| model | training step, batch 64: convert | convert + fuse_for_training | fused inference, batch 128 | first training step of a fresh process, pycudnn / PyTorch |",
             "|---|---|---|---|---|"]
    train, fused, infer = [], [], []
    for name, row in data["models"].items():
        t = row.get("train", {}).get("batch64", {})
        i = row.get("infer", {})
        tr = t.get("pycudnn_over_torch")
        fr = t.get("fused_over_torch")
        ir = i.get("fused_over_torch")
        if tr is not None:
            train.append(tr)
        if fr is not None:
            fused.append(fr)
        if ir is not None:
            infer.append(ir)
        f = row.get("first", {})
        first = (f"{f['pycudnn']:.1f} s / {f['torch']:.1f} s" if "pycudnn" in f and "torch" in f
                 else "not measured")
        lines.append(f"| {name} | {_x(tr)} | {_x(fr)} | {_x(ir)} | {first} |")
    if train or fused or infer:
        lines.append(f"| geomean | {_x(statistics.geometric_mean(train) if train else None)} | "
                     f"{_x(statistics.geometric_mean(fused) if fused else None)} | "
                     f"{_x(statistics.geometric_mean(infer) if infer else None)} | |")
    lines += ["", f"x faster than PyTorch eager (above 1 is better), bf16 channels_last, "
              f"{data['device']}, PyTorch {data['torch']}, cuDNN {data['cudnn']}; measured at "
              f"commit {data['commit']} by `{data['command']}`.", END]
    return "\n".join(lines)


def _x(ratio: float | None) -> str:
    return "not measured" if ratio is None else f"{ratio:.2f}x"


def current(readme: str) -> tuple[str, str] | None:
    """(the README's block, the results file it names), or None when it has none."""
    m = re.search(re.escape(BEGIN) + r".*?" + re.escape(END), readme, flags=re.S)
    if not m:
        return None
    src = re.search(r"made by benchmarks/readme_table.py from (\S+) -->", m.group(0))
    return m.group(0), src.group(1) if src else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="?",
                    help=f"zoo.py results file, or {NONE!r} for none (default: the one README names)")
    ap.add_argument("--check", action="store_true", help="exit 1 if README's table is stale")
    args = ap.parse_args(argv)
    readme_path = ROOT / "README.md"
    readme = readme_path.read_text()
    found = current(readme)
    if found is None:
        sys.exit(f"README.md has no {BEGIN} ... {END} block")
    block, named = found
    results = args.results or named
    fresh = render(results)
    if args.check:
        if fresh != block:
            print(f"README.md's model table differs from {results}: run "
                  f"python3 benchmarks/readme_table.py {results}", file=sys.stderr)
            return 1
        return 0
    readme_path.write_text(readme.replace(block, fresh))
    return 0


if __name__ == "__main__":
    sys.exit(main())
