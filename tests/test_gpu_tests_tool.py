"""tools/gpu_tests.py, the sharded runner of the suite on one GPU, on the CPU: how it splits test
files by duration, what it reads from pytest's output and reports, and a whole run over small test
files (parallel shards, the serial gpu_exclusive shard, a failure's exit status, recording)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_tests", REPO / "tools" / "gpu_tests.py")
gpu_tests = importlib.util.module_from_spec(_spec)
sys.modules["gpu_tests"] = gpu_tests  # its dataclasses look their module up there
_spec.loader.exec_module(gpu_tests)


def test_every_file_lands_in_exactly_one_shard_and_the_loads_are_balanced():
    recorded = {f"tests/test_{i}.py": float(s) for i, s in enumerate([90, 60, 50, 40, 30, 30, 20,
                                                                       10, 5, 5, 3, 1])}
    shards = gpu_tests.split(sorted(recorded), 4, recorded)
    files = [f for s in shards for f in s.files]
    assert sorted(files) == sorted(recorded) and len(files) == len(set(files))
    assert len(shards) == 4 and all(s.files for s in shards)
    for s in shards:
        assert s.seconds == pytest.approx(sum(recorded[f] for f in s.files))
    total, longest = sum(recorded.values()), max(recorded.values())
    # longest-first onto the least loaded shard: no shard exceeds the mean by more than a file
    assert max(s.seconds for s in shards) <= total / 4 + longest
    assert max(s.seconds for s in shards) == 90.0  # here the longest file alone bounds the run
    assert min(s.seconds for s in shards) >= 80.0
    assert [s.files for s in gpu_tests.split(sorted(recorded, reverse=True), 4, recorded)] == \
        [s.files for s in shards]  # the order given does not matter


def test_fewer_files_than_shards_gives_one_shard_per_file():
    shards = gpu_tests.split(["tests/a.py", "tests/b.py"], 6, {"tests/a.py": 1.0, "tests/b.py": 2.0})
    assert [s.files for s in shards] == [["tests/b.py"], ["tests/a.py"]]
    with pytest.raises(ValueError, match="at least 1"):
        gpu_tests.split(["tests/a.py"], 0, {})


def test_a_file_without_a_recorded_duration_is_estimated_from_its_size(tmp_path):
    cpu, gpu = tmp_path / "test_x.py", tmp_path / "test_x_gpu.py"
    cpu.write_text("#" * 10_000)
    gpu.write_text("#" * 10_000)
    assert gpu_tests.estimate(str(cpu), {}) == pytest.approx(10_000 * gpu_tests._EST_S_PER_BYTE["cpu"])
    assert gpu_tests.estimate(str(gpu), {}) > gpu_tests.estimate(str(cpu), {})  # a GPU file costs more
    assert gpu_tests.estimate(str(cpu), {str(cpu): 42.0}) == 42.0


def test_the_summary_line_is_pytests_last_counts_line():
    out = "...\n---- pycudnn summary ----\n3 skipped: x\n12 passed, 3 skipped in 4.56s\n"
    assert gpu_tests.summary_line(out) == "12 passed, 3 skipped in 4.56s"
    assert gpu_tests.summary_line("==== 1 failed, 2 passed in 0.12s ====") == "1 failed, 2 passed in 0.12s"
    assert gpu_tests.summary_line("Traceback ...\nKilled") == "no summary line (pytest did not finish)"


def test_only_files_that_mention_the_marker_are_collected_serially(tmp_path):
    a, b = tmp_path / "test_a.py", tmp_path / "test_b.py"
    a.write_text("import pytest\n@pytest.mark.gpu_exclusive\ndef test_x(): pass\n")
    b.write_text("def test_y(): pass\n")
    assert gpu_tests.exclusive_files([str(a), str(b)]) == [str(a)]


PASSING = """
import time
def test_one():
    time.sleep(0.2)
def test_two():
    pass
"""
EXCLUSIVE = """
import pytest
def test_shared():
    pass
@pytest.mark.gpu_exclusive
def test_alone():
    pass
"""


def _tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "tools" / "gpu_tests.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_a_run_prints_each_shards_summary_and_the_wall_time(tmp_path):
    files = []
    for i in range(3):
        f = tmp_path / f"test_p{i}.py"
        f.write_text(PASSING)
        files.append(str(f))
    f = tmp_path / "test_excl.py"
    f.write_text(EXCLUSIVE)
    files.append(str(f))
    record = tmp_path / "durations.json"
    proc = _tool("-n", "2", "--logs", str(tmp_path / "logs"), "--record", str(record), *files,
                 "--", "-W", "ignore::pytest.PytestUnknownMarkWarning")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    summaries = [ln for ln in lines if " in " in ln and "exit 0" in ln]
    assert [ln.split(":")[0] for ln in summaries] == ["shard 1/2", "shard 2/2", "serial"]
    shard_passed = sum(int(ln.split(": ")[1].split(" passed")[0]) for ln in summaries[:2])
    assert shard_passed == 3 * 2 + 1  # every test but the exclusive one, in the parallel shards
    assert summaries[2].startswith("serial: 1 passed, 1 deselected")
    assert lines[-2].startswith("total wall time ") and lines[-2].endswith(" s")
    recorded = json.loads(record.read_text())
    assert {Path(k).name for k in recorded} == {Path(f).name for f in files}
    assert recorded[next(k for k in recorded if "test_p0" in k)] >= 0.2


def test_a_failing_shard_fails_the_run_and_names_its_log(tmp_path):
    good, bad = tmp_path / "test_good.py", tmp_path / "test_bad.py"
    good.write_text(PASSING)
    bad.write_text("def test_broken():\n    assert 1 == 2\n")
    proc = _tool("-n", "2", "--logs", str(tmp_path / "logs"), str(good), str(bad))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (failed,) = [ln for ln in proc.stdout.splitlines() if "exit 1" in ln]
    assert "1 failed" in failed and "log: " in failed
    log = Path(failed.split("log: ")[1])
    assert "assert 1 == 2" in log.read_text()
    assert proc.stdout.splitlines()[-1].endswith("(a shard failed)")
    gathered = (tmp_path / "logs" / "failures.txt").read_text()
    assert "1 failed" in gathered and "assert 1 == 2" in gathered and "test_good" not in gathered
    assert not list((tmp_path / "logs").glob("*.xml"))  # only logs come back from a device run


def test_list_names_the_shards_without_running_them(tmp_path):
    proc = _tool("--list", "-n", "3")
    assert proc.returncode == 0, proc.stderr
    shards = [ln for ln in proc.stdout.splitlines() if ln.startswith("shard ")]
    assert len(shards) == 3
    listed = " ".join(shards)
    assert all(f"tests/{p.name}" in listed for p in (REPO / "tests").glob("test_*.py"))
    assert "serial (gpu_exclusive): " in proc.stdout and "tests/test_reliability_gpu.py" in proc.stdout
