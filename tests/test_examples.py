"""Without a GPU or without its framework, every example stops with one line that says what it
needs (and exit status 1), not a traceback."""

from __future__ import annotations

import ast
import inspect
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import has_gpu

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def test_every_example_says_what_it_needs_at_the_top():
    for path in EXAMPLES:
        head = path.read_text().split('"""')[1]
        assert "Needs: " in head, f"{path.name}'s docstring does not say what it needs"


@pytest.mark.skipif(has_gpu(), reason="checks what the examples do on a machine without a GPU")
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_without_gpu_or_framework_is_one_line(path):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120,
                          env=env, cwd=ROOT)
    err = proc.stderr.strip()
    assert proc.returncode == 1, (proc.returncode, proc.stdout, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith(f"{path.name} needs "), err


def _pycudnn_calls(path):
    """Every ``pycudnn.NAME(...)`` call in a script: (line, NAME, positional count, keywords)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "pycudnn"
                and not any(isinstance(a, ast.Starred) for a in node.args)
                and all(k.arg is not None for k in node.keywords)):
            yield node.lineno, node.func.attr, len(node.args), [k.arg for k in node.keywords]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_calls_match_pycudnn_signatures(path):
    """The examples run only on a GPU; here, without one, every pycudnn function they call must
    exist and take the arguments they pass (a renamed function or keyword fails here first)."""
    import pycudnn

    for line, name, npos, keywords in _pycudnn_calls(path):
        fn = getattr(pycudnn, name, None)
        assert callable(fn), f"{path.name}:{line}: pycudnn.{name} is not a pycudnn function"
        try:
            inspect.signature(fn).bind(*([None] * npos), **dict.fromkeys(keywords))
        except TypeError as exc:
            raise AssertionError(f"{path.name}:{line}: pycudnn.{name}({npos} positional, "
                                 f"{', '.join(k + '=' for k in keywords)}): {exc}") from None
