"""conftest.py's end-of-run summary: GPU skips in one line, other skips once per reason, and
skipped modules (collection reports) handled too."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

from conftest import has_gpu

HERE = pathlib.Path(__file__).resolve().parent


def test_skip_summary(tmp_path):
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a GPU\n")
    (tmp_path / "test_gpu.py").write_text(
        "import pytest\npytestmark = pytest.mark.gpu\n"
        "@pytest.mark.parametrize('i', range(5))\ndef test_on_gpu(i):\n    pass\n")
    (tmp_path / "test_other.py").write_text(
        "import pytest\ndef test_skipped():\n    pytest.skip('no widget here')\n"
        "def test_ok():\n    pass\n")
    (tmp_path / "test_module_skip.py").write_text(
        "import pytest\npytest.importorskip('no_such_module_anywhere')\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-rfExX", str(tmp_path)], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "INTERNALERROR" not in out and "SKIPPED [" not in out
    assert "1 skipped: no widget here" in out
    assert "1 skipped: could not import 'no_such_module_anywhere'" in out
    if has_gpu():
        assert "GPU tests skipped" not in out
    else:
        lines = [line for line in out.splitlines() if "GPU tests skipped" in line]
        assert len(lines) == 1 and lines[0].startswith("5 GPU tests skipped (needs a CUDA GPU: ")
