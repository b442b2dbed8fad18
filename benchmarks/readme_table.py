"""Write README.md's model tables from ``benchmarks/zoo.py`` results files.

    python3 benchmarks/readme_table.py benchmarks/results/2026-12-01/zoo.json   # rewrite README
    python3 benchmarks/readme_table.py --training zoo_resnet50.json             # the training table
    python3 benchmarks/readme_table.py --first zoo_first.json                   # the first-step table
    python3 benchmarks/readme_table.py --check                                  # 1 if stale

Four tables, each between its markers in README.md: the model table (`render`: converted
training and fused inference per zoo model, inference also against ``torch.compile``), the
training table (`render_training`: converted and fused training, eager and in a CUDA graph, per
model and batch; the ``train,graph`` parts), the compile table (`render_compile`: the fused
model compiled against the plain model compiled, default and reduce-overhead; the ``train``
part's compiled sides) and the first-step table (`render_first`: the first training step of a
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
COMPILE_BEGIN, COMPILE_END = "<!-- compile-table:begin -->", "<!-- compile-table:end -->"


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
             "| model | training step, batch 64: convert | fused inference, batch 128 | fused inference over torch.compile's |",
             "|---|---|---|---|"]
    columns: list[list[float]] = [[], [], []]
    for name, row in data["models"].items():
        t = row.get("train", {}).get("batch64", {})
        i = row.get("infer", {})
        cells = (t.get("pycudnn_over_torch"), i.get("fused_over_torch"), i.get("fused_over_compile"))
        for col, v in zip(columns, cells):
            if v is not None:
                col.append(v)
        lines.append(f"| {name} | " + " | ".join(_x(v) for v in cells) + " |")
    if any(columns):
        lines.append("| geomean | " + " | ".join(
            _x(statistics.geometric_mean(c) if c else None) for c in columns) + " |")
    lines += ["", _measured(data).replace("PyTorch eager (", "PyTorch eager (the last column: "
                                          "than the plain model under torch.compile; "), END]
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
        for batch in _batches(train, graph):
            t, g = train.get(batch, {}), graph.get(batch, {})
            lines.append(
                f"| {name}, {batch[5:]} | {_rate(t)} | {_x(t.get('pycudnn_over_torch'))} | "
                f"{_x(t.get('fused_over_torch'))} | {_rate(g)} | "
                f"{_x(g.get('pycudnn_over_torch'))} | {_x(g.get('fused_over_torch'))} |")
    lines += ["", _measured(data).replace("PyTorch eager (", "PyTorch's same kind of step ("),
              TRAIN_END]
    return "\n".join(lines)


def render_compile(results_file: str) -> str:
    """The compile table's README block for ``results_file``: per model and batch size, the
    plain model under ``torch.compile`` (steps/s) and the fused model under it, by default and
    with ``mode="reduce-overhead"``, each against the plain model in the same mode."""
    if results_file == NONE:
        return _no_figures(COMPILE_BEGIN, COMPILE_END, "No torch.compile figures measured at the current code yet.")
    data = json.loads((ROOT / results_file).read_text())
    lines = [*_head(COMPILE_BEGIN, results_file),
             "| model, batch | torch.compile steps/s | fused, torch.compile | fused eager | reduce-overhead steps/s | fused, reduce-overhead |",
             "|---|---|---|---|---|---|"]
    for name, row in data["models"].items():
        train = row.get("train", {})
        for batch in _batches(train):
            t = train[batch]
            if "compile" not in t and "compile_ro" not in t:
                continue
            lines.append(
                f"| {name}, {batch[5:]} | {_rate(t, 'compile')} | "
                f"{_x(t.get('fused_compile_over_compile'))} | {_x(t.get('fused_over_compile'))} | "
                f"{_rate(t, 'compile_ro')} | {_x(t.get('fused_compile_ro_over_compile_ro'))} |")
    lines += ["", _measured(data).replace("PyTorch eager (", "the plain model compiled in the same "
                                          "mode ("), COMPILE_END]
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


def _batches(*parts: dict) -> list[str]:
    """The ``batchN`` keys of a model's parts, by batch size (not as text)."""
    return sorted({k for part in parts for k in part if k.startswith("batch")},
                  key=lambda k: int(k[5:]))


def _rate(row: dict, side: str = "torch") -> str:
    r = row.get(side, {}).get("steps_per_s")
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
          ((COMPILE_BEGIN, COMPILE_END), render_compile, "compile"),
          ((FIRST_BEGIN, FIRST_END), render_first, "first"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="?",
                    help=f"zoo.py results file for the model table, or {NONE!r} for none "
                         f"(default: the one README names)")
    ap.add_argument("--training", help="zoo.py results file (train,graph parts) for the "
                                       "training table (default: the one README names)")
    ap.add_argument("--compile", help="zoo.py results file (train part with the compiled "
                                      "sides) for the compile table (default: the one README "
                                      "names)")
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
