"""Write README.md's model tables from ``benchmarks/zoo.py`` results files.

    python3 benchmarks/readme_table.py benchmarks/results/2026-12-01/zoo.json   # rewrite README
    python3 benchmarks/readme_table.py --training zoo_resnet50.json             # the training table
    python3 benchmarks/readme_table.py --first zoo_first.json                   # the first-step table
    python3 benchmarks/readme_table.py --check                                  # 1 if stale

Three tables, each between its markers in README.md: the model table (`render`: converted
training and fused inference per zoo model), the training table (`render_training`:
converted and fused training, eager and in a CUDA graph, per model and batch; the
``train,graph`` parts) and the first-step table (`render_first`: the first training step of a
fresh process, with an empty and with a filled tuning database; the ``first`` part). The first line inside each names the results file it was made from, so
``--check`` (and the CPU test that runs it) can tell whether the README still says what that
file says; the two may come from different runs (each figure's commit is in its table).
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
TRAIN_BEGIN, TRAIN_END = "<!-- training-table:begin -->", "<!-- training-table:end -->"
FIRST_BEGIN, FIRST_END = "<!-- first-step-table:begin -->", "<!-- first-step-table:end -->"


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
             "| model | training step, batch 64: convert | fused inference, batch 128 |",
             "|---|---|---|"]
    train, infer = [], []
    for name, row in data["models"].items():
        t = row.get("train", {}).get("batch64", {})
        i = row.get("infer", {})
        tr = t.get("pycudnn_over_torch")
        ir = i.get("fused_over_torch")
        if tr is not None:
            train.append(tr)
        if ir is not None:
            infer.append(ir)
        lines.append(f"| {name} | {_x(tr)} | {_x(ir)} |")
    if train or infer:
        lines.append(f"| geomean | {_x(statistics.geometric_mean(train) if train else None)} | "
                     f"{_x(statistics.geometric_mean(infer) if infer else None)} |")
    lines += ["", _measured(data), END]
    return "\n".join(lines)


def _measured(data: dict) -> str:
    return (f"x faster than PyTorch eager (above 1 is better), bf16 channels_last, "
            f"{data['device']}, PyTorch {data['torch']}, cuDNN {data['cudnn']}; measured at "
            f"commit {data['commit']} by `{data['command']}`.")


def _head(begin: str, results_file: str) -> list[str]:
    """A block's first lines: its marker and the results file it is made from."""
    return [begin, f"<!-- made by benchmarks/readme_table.py from {results_file} -->", ""]


def _no_figures(begin: str, end: str, text: str) -> str:
    return "\n".join([*_head(begin, NONE), text, end])


def render_training(results_file: str) -> str:
    """The training table's README block for ``results_file``: per model and batch size, the
    converted model and the converted + `fuse_for_training` one, eager and with the whole step
    in a CUDA graph, each against PyTorch's eager / CUDA-graph step."""
    if results_file == NONE:
        return _no_figures(TRAIN_BEGIN, TRAIN_END, "No training figures measured at the current code yet.")
    data = json.loads((ROOT / results_file).read_text())
    lines = [*_head(TRAIN_BEGIN, results_file),
             "| model, batch | PyTorch eager steps/s | convert | convert + fuse_for_training | PyTorch in a CUDA graph, steps/s | convert, CUDA graph | fused, CUDA graph |",
             "|---|---|---|---|---|---|---|"]
    for name, row in data["models"].items():
        train, graph = row.get("train", {}), row.get("graph", {})
        for batch in sorted({k for k in (*train, *graph) if k.startswith("batch")},
                            key=lambda k: int(k[5:])):
            t, g = train.get(batch, {}), graph.get(batch, {})
            lines.append(
                f"| {name}, {batch[5:]} | {_rate(t)} | {_x(t.get('pycudnn_over_torch'))} | "
                f"{_x(t.get('fused_over_torch'))} | {_rate(g)} | "
                f"{_x(g.get('pycudnn_over_torch'))} | {_x(g.get('fused_over_torch'))} |")
    lines += ["", _measured(data).replace("PyTorch eager (", "PyTorch's same kind of step ("),
              TRAIN_END]
    return "\n".join(lines)


def render_first(results_file: str) -> str:
    """The first-step table's README block for ``results_file``: per model, PyTorch's first
    training step in a fresh process and pycudnn's, with an empty and with a filled tuning
    database, as seconds and as a share of PyTorch's."""
    if results_file == NONE:
        return _no_figures(FIRST_BEGIN, FIRST_END, "No first-step figures measured at the current code yet.")
    data = json.loads((ROOT / results_file).read_text())
    lines = [*_head(FIRST_BEGIN, results_file),
             "| model | PyTorch | pycudnn, empty tuning database | pycudnn, filled tuning database |",
             "|---|---|---|---|"]
    for name, row in data["models"].items():
        f = row.get("first", {})
        torch_s = f.get("torch")

        def cell(key: str) -> str:
            s = f.get(key)
            if s is None or not torch_s:
                return "not measured"
            return f"{s:.1f} s ({s / torch_s:.2f}x)"

        lines.append(f"| {name} | {'not measured' if torch_s is None else f'{torch_s:.1f} s'} | "
                     f"{cell('pycudnn')} | {cell('pycudnn_filled_db')} |")
    lines += ["", f"Seconds of the first training step of a fresh process (below 1x is better), "
              f"batch 64, bf16 channels_last, benchmark mode, {data['device']}, PyTorch "
              f"{data['torch']}, cuDNN {data['cudnn']}; measured at commit {data['commit']} by "
              f"`{data['command']}`.", FIRST_END]
    return "\n".join(lines)


def _rate(row: dict) -> str:
    r = row.get("torch", {}).get("steps_per_s")
    return "not measured" if r is None else f"{r:.1f}"


def _x(ratio: float | None) -> str:
    return "not measured" if ratio is None else f"{ratio:.2f}x"


def current(readme: str, begin: str = BEGIN, end: str = END) -> tuple[str, str] | None:
    """(the README's block between ``begin`` and ``end``, the results file it names), or None
    when it has none."""
    m = re.search(re.escape(begin) + r".*?" + re.escape(end), readme, flags=re.S)
    if not m:
        return None
    src = re.search(r"made by benchmarks/readme_table.py from (\S+) -->", m.group(0))
    return m.group(0), src.group(1) if src else ""


#: the generated blocks: (markers, renderer, the option that names its results file)
BLOCKS = (((BEGIN, END), render, "results"),
          ((TRAIN_BEGIN, TRAIN_END), render_training, "training"),
          ((FIRST_BEGIN, FIRST_END), render_first, "first"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="?",
                    help=f"zoo.py results file for the model table, or {NONE!r} for none "
                         f"(default: the one README names)")
    ap.add_argument("--training", help="zoo.py results file (train,graph parts) for the "
                                       "training table (default: the one README names)")
    ap.add_argument("--first", help="zoo.py results file (first part) for the first-step table "
                                    "(default: the one README names)")
    ap.add_argument("--check", action="store_true", help="exit 1 if a README table is stale")
    args = ap.parse_args(argv)
    readme_path = ROOT / "README.md"
    readme = readme_path.read_text()
    for (begin, end), make, option in BLOCKS:
        found = current(readme, begin, end)
        if found is None:
            sys.exit(f"README.md has no {begin} ... {end} block")
        block, named = found
        results = getattr(args, option) or named
        fresh = make(results)
        if args.check:
            if fresh != block:
                flag = "" if option == "results" else f"--{option} "
                print(f"README.md's table {begin} differs from {results}: run "
                      f"python3 benchmarks/readme_table.py {flag}{results}", file=sys.stderr)
                return 1
            continue
        readme = readme.replace(block, fresh)
    if not args.check:
        readme_path.write_text(readme)
    return 0


if __name__ == "__main__":
    sys.exit(main())
