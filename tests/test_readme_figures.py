"""README's model table is generated from a benchmarks/zoo.py results file and must say what that
file says (benchmarks/readme_table.py writes it; this checks it, with no GPU)."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _table_module():
    spec = importlib.util.spec_from_file_location("readme_table", ROOT / "benchmarks" / "readme_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("which", [0, 1, 2, 3],
                         ids=["model-table", "training-table", "compile-table", "first-step-table"])
def test_readme_table_matches_its_results_file(which):
    mod = _table_module()
    (begin, end), make, _ = mod.BLOCKS[which]
    found = mod.current((ROOT / "README.md").read_text(), begin, end)
    assert found is not None, f"README.md lost its generated table {begin}"
    block, results = found
    if results == mod.NONE:
        assert block == make(results)
        return
    if not (ROOT / results).is_file() and not (ROOT / ".git").exists():
        pytest.skip("the measured results stay in the repository (the sdist does not carry them)")
    assert (ROOT / results).is_file(), f"README's table names {results}, which is not here"
    assert block == make(results), (
        f"README.md's table {begin} is stale: run python3 benchmarks/readme_table.py --check")


def test_render_states_every_model_its_commit_and_missing_figures(tmp_path):
    mod = _table_module()
    data = {"commit": "abc1234", "device": "NVIDIA H200", "torch": "2.11", "cudnn": 91900,
            "command": "benchmarks/zoo.py", "models": {
                "resnet50": {"train": {"batch64": {"pycudnn_over_torch": 1.25,
                                                   "fused_over_torch": 1.5}},
                             "infer": {"fused_over_torch": 2.0, "fused_over_compile": 1.2}},
                "densenet121": {"train": {"error": "RuntimeError: boom"}}}}
    f = tmp_path / "zoo.json"
    f.write_text(json.dumps(data))
    text = mod.render(str(f))
    assert "| resnet50 | 1.25x | 2.00x | 1.20x |" in text
    assert "| densenet121 | not measured | not measured | not measured |" in text
    assert "| geomean | 1.25x | 2.00x | 1.20x |" in text
    assert "commit abc1234" in text and "`benchmarks/zoo.py`" in text


def test_render_training_states_each_batch_eager_and_in_a_cuda_graph(tmp_path):
    mod = _table_module()
    data = {"commit": "abc1234", "device": "NVIDIA H200", "torch": "2.11", "cudnn": 91900,
            "command": "benchmarks/zoo.py --parts train,graph", "models": {
                "resnet50": {
                    "train": {"batch64": {"torch": {"steps_per_s": 60.0},
                                          "pycudnn_over_torch": 0.9, "fused_over_torch": 1.1},
                              "batch256": {"torch": {"steps_per_s": 18.0},
                                           "pycudnn_over_torch": 1.0}},
                    "graph": {"batch64": {"torch": {"steps_per_s": 65.0},
                                          "pycudnn_over_torch": 1.0, "fused_over_torch": 1.3}}}}}
    f = tmp_path / "zoo.json"
    f.write_text(json.dumps(data))
    text = mod.render_training(str(f))
    assert "| resnet50, 64 | 60.0 | 0.90x | 1.10x | 65.0 | 1.00x | 1.30x |" in text
    assert ("| resnet50, 256 | 18.0 | 1.00x | not measured | not measured | not measured | "
            "not measured |") in text
    assert text.index("resnet50, 64") < text.index("resnet50, 256")  # by batch, not as text
    assert "commit abc1234" in text and text.startswith(mod.TRAIN_BEGIN)


def test_render_compile_compares_each_compiled_mode_with_the_plain_models(tmp_path):
    mod = _table_module()
    data = {"commit": "abc1234", "device": "NVIDIA H200", "torch": "2.11", "cudnn": 91900,
            "command": "benchmarks/zoo.py --parts train", "models": {
                "resnet50": {"train": {
                    "batch64": {"compile": {"steps_per_s": 70.0}, "fused_compile_over_compile": 1.2,
                                "fused_over_compile": 0.8, "compile_ro": {"steps_per_s": 90.0},
                                "fused_compile_ro_over_compile_ro": 1.25},
                    "batch256": {"torch": {"steps_per_s": 18.0}}}},
                "densenet121": {"train": {"batch64": {"compile": {"steps_per_s": 40.0}}}}}}
    f = tmp_path / "zoo.json"
    f.write_text(json.dumps(data))
    text = mod.render_compile(str(f))
    assert "| resnet50, 64 | 70.0 | 1.20x | 0.80x | 90.0 | 1.25x |" in text
    assert "resnet50, 256" not in text  # no compiled side at that batch
    assert ("| densenet121, 64 | 40.0 | not measured | not measured | not measured | "
            "not measured |") in text
    assert "commit abc1234" in text and text.startswith(mod.COMPILE_BEGIN)


def test_render_first_gives_seconds_and_shares_of_pytorchs(tmp_path):
    mod = _table_module()
    data = {"commit": "abc1234", "device": "NVIDIA H200", "torch": "2.11", "cudnn": 91900,
            "command": "benchmarks/zoo.py --parts first", "models": {
                "resnet50": {"first": {"torch": 12.0, "pycudnn": 4.0, "pycudnn_filled_db": 3.0}},
                "convnext_tiny": {"first": {"error": "RuntimeError: boom"}}}}
    f = tmp_path / "zoo.json"
    f.write_text(json.dumps(data))
    text = mod.render_first(str(f))
    assert "| resnet50 | 12.0 s | 4.0 s (0.33x) | 3.0 s (0.25x) |" in text
    assert "| convnext_tiny | not measured | not measured | not measured |" in text
    assert "commit abc1234" in text and text.startswith(mod.FIRST_BEGIN)


def test_render_of_no_results_says_so():
    mod = _table_module()
    text = mod.render(mod.NONE)
    assert text.startswith(mod.BEGIN) and text.endswith(mod.END)
    assert "No figures measured at the current code" in text and "|" not in text
    assert mod.current(f"x\n{text}\ny") == (text, mod.NONE)
