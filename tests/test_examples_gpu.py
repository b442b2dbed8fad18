"""Every example runs on a GPU and prints its check (each in a fresh interpreter)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(path):
    needs = {"conv2d_cupy": ("cupy",), "train_digits_cnn": ("cupy", "sklearn"),
             "torch_autograd": ("torch",), "numba_interop": ("numba",), "cuda_graph": ()}
    for mod in needs.get(path.stem, ()):
        pytest.importorskip(mod)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300,
                          env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK" in proc.stdout, proc.stdout
    print(proc.stdout)
