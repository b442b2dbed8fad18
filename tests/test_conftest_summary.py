"""conftest.py's end-of-run summary: one block, GPU skips in one line, other skips once per reason
and in one spelling, skipped modules (collection reports) handled too, and the lines of plugins
with a ``summary_lines()`` method (the fuzz counts) folded in."""

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
    (tmp_path / "test_own_skip.py").write_text(  # the suite's own spelling of the same reason
        "import pytest\n@pytest.mark.skipif(True, reason=\"could not import 'no_such_module_anywhere'"
        " (not installed)\")\ndef test_needs_it():\n    pass\n")
    (tmp_path / "test_counts.py").write_text(  # a plugin with summary lines, as test_fuzz.py's
        "import pytest\nclass Counts:\n    def summary_lines(self):\n        return ['fuzz: 3 cases']\n"
        "@pytest.fixture(autouse=True)\ndef _register(request):\n"
        "    pm = request.config.pluginmanager\n"
        "    if not pm.has_plugin('counts'):\n        pm.register(Counts(), 'counts')\n"
        "def test_counted():\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-rfExX", str(tmp_path)], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "INTERNALERROR" not in out and "SKIPPED [" not in out
    assert "1 skipped: no widget here" in out
    assert "2 skipped: could not import 'no_such_module_anywhere' (not installed)" in out
    assert "No module named" not in out
    block = out[out.index(" pycudnn summary "):]
    assert out.count(" pycudnn summary ") == 1 and "fuzz: 3 cases" in block
    assert "1 skipped: no widget here" in block
    if has_gpu():
        assert "GPU tests skipped" not in out
    else:
        lines = [line for line in out.splitlines() if "GPU tests skipped" in line]
        assert len(lines) == 1 and lines[0].startswith("5 GPU tests skipped (needs a CUDA GPU: ")
        assert lines[0] in block
