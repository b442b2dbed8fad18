"""The docs in the code stay short and say why the code is as it is: module docstrings of at most
15 lines, and no comment, docstring or test name that tells the project's history instead."""

from __future__ import annotations

import ast
import pathlib
import re
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pycudnn"
TESTS = ROOT / "tests"
MAX_MODULE_DOCSTRING_LINES = 15

#: phrases that point at when or where something was decided rather than at why it holds
HISTORY = re.compile(r"\bround \d|\bissue[ -]?\d|\(issue|\bdefects? \d|earlier name|was renamed",
                     re.IGNORECASE)
HISTORY_TEST_NAME = re.compile(r"^test_\w*(issue|round_?\d|defect)", re.IGNORECASE)


def _sources(*roots: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for root in roots for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _module_docstring_lines(path: pathlib.Path) -> int:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    return 0 if doc is None else len(doc.splitlines())


def test_module_docstrings_are_at_most_15_lines():
    sources = _sources(PACKAGE)
    assert len(sources) > 50, "the walk found too few modules to mean anything"
    lengths = {p.relative_to(ROOT).as_posix(): _module_docstring_lines(p) for p in sources}
    assert sum(1 for n in lengths.values() if n) > 50, "most modules should have a docstring"
    too_long = {name: n for name, n in lengths.items() if n > MAX_MODULE_DOCSTRING_LINES}
    assert not too_long, (f"module docstrings over {MAX_MODULE_DOCSTRING_LINES} lines (move "
                          f"essays to docs/architecture.md, figures to docs/benchmarks.md): {too_long}")


def test_the_docstring_line_count_counts_what_a_reader_sees(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""One.\n\n' + "line\n" * 14 + '"""\nX = 1\n')
    assert _module_docstring_lines(module) == 16
    module.write_text("X = 1\n")
    assert _module_docstring_lines(module) == 0


def _comment_and_docstring_text(path: pathlib.Path) -> list[tuple[int, str]]:
    """Comments and string constants (docstrings, messages, reasons) with their line numbers."""
    out = []
    with open(path, "rb") as f:
        for tok in tokenize.tokenize(f.readline):
            if tok.type in (tokenize.COMMENT, tokenize.STRING):
                for offset, line in enumerate(tok.string.splitlines()):
                    out.append((tok.start[0] + offset, line))
    return out


def test_no_comment_or_string_narrates_history():
    this = pathlib.Path(__file__).resolve()
    hits = [f"{p.relative_to(ROOT).as_posix()}:{n}: {line.strip()}"
            for p in _sources(PACKAGE, TESTS) if p.resolve() != this
            for n, line in _comment_and_docstring_text(p) if HISTORY.search(line)]
    assert not hits, "say why the code is as it is, not when it changed:\n" + "\n".join(hits)


@pytest.mark.parametrize("text, narrates", [
    ("# refused up front (round 3, defect 6)", True),
    ("# the fix for issue 27", True),
    ('reason="open (issue 27)"', True),
    ("# a stream that no longer exists", False),
    ("# round the size up to 16 bytes", False),
])
def test_the_history_pattern_tells_narration_from_description(text, narrates):
    assert bool(HISTORY.search(text)) is narrates


def test_test_modules_and_functions_are_named_for_what_they_test():
    bad = [p.name for p in TESTS.glob("test_*.py") if HISTORY_TEST_NAME.match(p.stem)]
    for path in _sources(TESTS):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    HISTORY_TEST_NAME.match(node.name):
                bad.append(f"{path.name}::{node.name}")
    assert not bad, f"name these after what they test: {bad}"
    assert HISTORY_TEST_NAME.match("test_round3_gpu") and HISTORY_TEST_NAME.match("test_issue_27")
    assert not HISTORY_TEST_NAME.match("test_round_trip_covers_every_field")
