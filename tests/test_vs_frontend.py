"""CPU tests of benchmarks/vs_frontend.py's parts that need no GPU: the command line, the
ratios and targets of the call-cost tables, the first-result summaries, the cProfile breakdown,
and how the frontend is pointed at pycudnn's libcudnn. The measurements themselves run on the
GPU machine (the script's docstring gives the command)."""

from __future__ import annotations

import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import vs_frontend as V  # noqa: E402


def test_the_command_line_checks_its_lists_and_quick_shrinks_the_run():
    args = V.parse_args(["--quick", "--parts", "calls,floor", "--configs", "fp32-nchw"])
    assert (args.parts, args.configs, args.calls, args.processes) == (["calls", "floor"], ["fp32-nchw"], 1000, 1)
    with pytest.raises(SystemExit):
        V.parse_args(["--parts", "calls,speed"])
    with pytest.raises(SystemExit):
        V.parse_args(["--processes", "0"])


def test_ratios_name_their_reference_and_skip_missing_or_failed_ones():
    figures = {"F.conv2d": {"median": 10.0}, "frontend: execute(dict)": {"median": 8.0},
               "torch in": {"median": 12.0}, "views in": {"median": 9.0},
               "CuPy in": {"error": "CuPy: not installed"}}
    refs = {"torch in": ("F.conv2d", "frontend: execute(dict)"),
            "views in": ("F.conv2d", "frontend: tensor_uids"),  # not measured
            "CuPy in": ("F.conv2d", "frontend: execute(dict)")}
    out = V.ratio_rows(figures, refs)
    assert out["torch in"]["vs_torch"] == pytest.approx(1.2)
    assert out["torch in"]["vs_frontend"] == pytest.approx(1.5)
    assert out["torch in"]["vs_frontend_column"] == "frontend: execute(dict)"
    assert "vs_frontend" not in out["views in"] and out["views in"]["vs_torch"] == pytest.approx(0.9)
    assert "vs_torch" not in out["CuPy in"] and out["CuPy in"]["error"].startswith("CuPy")
    text = V.format_calls(out)
    assert "| torch in | 12.00 | 1.20 | 1.50 |" in text and "| CuPy in | CuPy: not installed | | |" in text


def test_call_targets_judge_each_row_against_its_reference():
    refs = {"torch in": ("F.conv2d", "frontend: execute(dict)"),
            "torch in, out=": ("F.conv2d", "frontend: execute(dict)"),
            "prepared, torch in": ("F.conv2d", None),
            "relu, torch in": ("torch: relu", None)}
    figures = {"F.conv2d": {"median": 10.0}, "frontend: execute(dict)": {"median": 9.5},
               "torch in": {"median": 8.9}, "torch in, out=": {"median": 9.2},
               "prepared, torch in": {"median": 7.4}, "torch: relu": {"median": 5.0},
               "relu, torch in": {"median": 4.6}}
    verdicts = V.call_targets(V.ratio_rows(figures, refs))
    assert verdicts["torch in"] == {"at most 0.9x F.conv2d": True, "at most the frontend's dict execute": True}
    assert verdicts["torch in, out="]["out= at most without it"] is False
    assert verdicts["torch in, out="]["at most 0.9x F.conv2d"] is False
    assert verdicts["prepared, torch in"] == {"at most 0.75x torch": True}
    assert verdicts["relu, torch in"] == {"at most 0.9x its torch call": False}
    assert "F.conv2d" not in verdicts and "frontend: execute(dict)" not in verdicts


def test_first_result_summary_gives_ranges_over_processes_and_keeps_errors():
    runs = [{"import_ms": 50.0, "first_ms": 100.0, "further_ms": [9.0, 10.0, 30.0]},
            {"import_ms": 60.0, "first_ms": 120.0, "further_ms": [8.0, 11.0, 12.0]},
            {"error": "the process exited with status 1"}]
    s = V.summarize_first(runs)
    assert s["import_ms"] == [50.0, 60.0] and s["first_ms"] == [100.0, 120.0]
    assert s["import_plus_first_ms"] == [150.0, 180.0]
    assert s["further_median_ms"] == [10.0, 11.0]
    assert s["errors"] == ["the process exited with status 1"] and s["processes"] == 3
    text = V.format_first({"frontend heuristics": s, "torch benchmark on": V.summarize_first([{"error": "x"}])})
    assert "| frontend heuristics | 50.0-60.0 | 100.0-120.0 | 150.0-180.0 | 10.0-11.0 |" in text
    assert "| torch benchmark on | x |" in text


def test_breakdown_sums_the_named_functions_of_the_named_files_only():
    stats = {
        ("/x/pycudnn/ffi/library.py", 522, "_load"): (1, 1, 0.01, 0.120, {}),
        ("/x/pycudnn/cudnn/graph/plan.py", 290, "finalize"): (2, 2, 0.0, 0.030, {}),
        ("/x/pycudnn/engines/graph.py", 82, "finalize"): (2, 2, 0.0, 0.031, {}),  # another file
        ("/x/other/library.py", 1, "_load"): (1, 1, 0.0, 5.0, {}),
        ("/x/pycudnn/runtime/memory/driver.py", 194, "driver"): (1, 1, 0.0, 0.002, {}),
    }
    rows = {r["what"]: r for r in V.breakdown_from_stats(stats, 0.3)}
    assert rows["libcudnn loaded (ffi.library._load)"]["ms"] == pytest.approx(120.0)
    assert rows["libcudnn loaded (ffi.library._load)"]["share"] == pytest.approx(0.4)
    assert rows["plans finalized (ExecutionPlan.finalize)"]["ms"] == pytest.approx(30.0)
    assert rows["plans finalized (ExecutionPlan.finalize)"]["calls"] == 2
    assert rows["heuristics queried (LazyCandidates._query)"]["ms"] == 0.0
    assert rows["CUDA driver loaded and cuInit (driver.driver)"]["ms"] == pytest.approx(2.0)
    top = V.top_functions(stats)
    assert top[0]["function"].startswith("ffi/library.py:522(_load)") and len(top) == 4


def test_pycudnns_libcudnn_directory_goes_first_on_the_loader_path_once():
    env = {"LD_LIBRARY_PATH": "/a:/lib/cudnn:/b"}
    assert V.with_libcudnn_first(env, "/lib/cudnn")["LD_LIBRARY_PATH"] == "/lib/cudnn:/a:/b"
    assert V.with_libcudnn_first({}, "/lib/cudnn")["LD_LIBRARY_PATH"] == "/lib/cudnn"
    assert V.with_libcudnn_first(env, None) == env
    assert env == {"LD_LIBRARY_PATH": "/a:/lib/cudnn:/b"}  # not changed in place


def test_the_commit_comes_from_the_environment_when_set(monkeypatch):
    monkeypatch.setenv("PYCUDNN_COMMIT", "abc1234")
    assert V.commit() == "abc1234"


def test_every_breakdown_row_names_a_function_defined_in_its_file():
    import ast
    import pathlib

    package = pathlib.Path(__file__).resolve().parents[1] / "pycudnn"
    for label, suffix, func in V.BREAKDOWN:
        files = [f for f in package.rglob("*.py") if f.as_posix().endswith("/" + suffix)]
        assert len(files) == 1, (label, suffix, files)
        names = {n.name for n in ast.walk(ast.parse(files[0].read_text()))
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        assert func in names, (label, suffix, func)
