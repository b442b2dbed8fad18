"""Without a GPU or without its framework, every example stops with one line that says what it
needs (and exit status 1), not a traceback."""

from __future__ import annotations

import ast
import inspect
import os
import pathlib
import re
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


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_help_prints_its_docstring_and_runs_nothing(path, tmp_path):
    """``--help`` works anywhere, framework or GPU or not, and is the script's own docstring."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True,
                          timeout=60, env=env, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", (proc.returncode, proc.stderr)
    doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
    assert proc.stdout.startswith(f"usage: {path.name} [-h]")
    assert doc.strip().splitlines()[0] in proc.stdout and "Needs: " in proc.stdout
    bad = subprocess.run([sys.executable, str(path), "--no-such-option"], capture_output=True,
                         text=True, timeout=60, env=env, cwd=tmp_path)
    assert bad.returncode == 2 and "unrecognized arguments: --no-such-option" in bad.stderr


def test_example_install_hints_work_without_a_checkout():
    """Every install command an example gives installs from outside a clone (no ``-e .``) and
    names extras that pyproject.toml defines."""
    extras = set(re.findall(r"^([\w-]+) = \[", (ROOT / "pyproject.toml").read_text()
                            .split("[project.optional-dependencies]")[1].split("\n[")[0], re.M))
    for path in EXAMPLES:
        text = path.read_text()
        assert "pip install -e" not in text, f"{path.name} gives a checkout-only install"
        for named in re.findall(r"pycudnn-ctypes\[([\w,-]+)\]", text):
            assert set(named.split(",")) <= extras, (path.name, named, extras)
        for named in re.findall(r"\[(cu1\d,examples[\w-]*)\]", text):
            assert set(named.split(",")) <= extras, (path.name, named, extras)


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
