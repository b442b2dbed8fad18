"""Without a GPU or without its framework, every example stops with one line that says what it
needs (and exit status 1), not a traceback."""

from __future__ import annotations

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
