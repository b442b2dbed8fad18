"""Run the test suite on one GPU as parallel pytest processes (shards), then the tests that need
the GPU to themselves alone.

    python tools/gpu_tests.py                  # 4 shards of tests/test_*.py
    python tools/gpu_tests.py -n 6 --record tools/gpu_test_durations.json
    python tools/gpu_tests.py tests/test_conv_gpu.py tests/test_ops_gpu.py -- -x

Test files are split into shards of about equal duration: the seconds recorded per file in
``tools/gpu_test_durations.json`` (``--record`` writes them from a run), else an estimate from
the file's size. Each shard runs ``-m "not gpu_exclusive"`` with its own cache directory and
its share of the CPU cores for OpenMP (``OMP_NUM_THREADS``, unless set); the
``gpu_exclusive`` tests (they fill the device's memory or time the host) run afterwards in one
serial shard. Each shard's summary line and the total wall time are printed; the exit status is
1 when any shard failed (its log is kept and named, and its failures gathered with the other
shards' in ``failures.txt`` beside the logs). Arguments after ``--`` go to every pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
DURATIONS = ROOT / "tools" / "gpu_test_durations.json"
EXCLUSIVE = "gpu_exclusive"
#: the file in the logs folder that gathers every failed shard's failures
FAILURES = "failures.txt"
#: seconds per byte of a test file with no recorded duration (about the whole suite's 5-7
#: minutes in one process on an H200 host; GPU files cost more per line)
_EST_S_PER_BYTE = {"gpu": 6e-4, "cpu": 2e-4}
_SUMMARY = re.compile(r"\b\d+ (passed|failed|errors?|skipped|deselected|xfailed|xpassed)\b.* in "
                      r"[\d.]+s")


@dataclass
class Shard:
    """Test files run by one pytest process, and their expected seconds."""

    files: list[str] = field(default_factory=list)
    seconds: float = 0.0


def estimate(file: str, recorded: dict[str, float]) -> float:
    """Expected seconds of ``file``: recorded, else from its size."""
    if file in recorded:
        return recorded[file]
    try:
        size = os.path.getsize(ROOT / file if not os.path.isabs(file) else file)
    except OSError:
        size = 10_000
    kind = "gpu" if Path(file).stem.endswith("_gpu") else "cpu"
    return size * _EST_S_PER_BYTE[kind]


def split(files: Sequence[str], n: int, recorded: dict[str, float]) -> list[Shard]:
    """``files`` in at most ``n`` shards of about equal expected time (longest file first onto
    the least loaded shard); every file in exactly one shard, no shard empty, deterministic."""
    if n < 1:
        raise ValueError(f"n: expected at least 1 shard, got {n}")
    shards = [Shard() for _ in range(min(n, len(files)))]
    for f in sorted(files, key=lambda f: (-estimate(f, recorded), f)):
        target = min(shards, key=lambda s: s.seconds)
        target.files.append(f)
        target.seconds += estimate(f, recorded)
    return shards


def summary_line(output: str) -> str:
    """pytest's final counts line ("3 passed, 1 skipped in 2.10s"), or a note that there is none."""
    for line in reversed(output.splitlines()):
        if _SUMMARY.search(line):
            return line.strip("= \t")
    return "no summary line (pytest did not finish)"


def file_durations(junit_xml: str) -> dict[str, float]:
    """Seconds per test file in a pytest ``--junitxml`` report (the tests' times summed)."""
    out: dict[str, float] = {}
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        file = case.get("file")
        if not file:  # pytest writes classname "tests.test_x" (or "tests.test_x.TestClass")
            parts = (case.get("classname") or "").split(".")
            # the last part named like a test module: a folder above it may be named so too
            mods = [i for i, p in enumerate(parts) if p.startswith("test_")]
            if not mods:
                continue
            file = "/".join(parts[:mods[-1] + 1]) + ".py"
        out[file] = out.get(file, 0.0) + float(case.get("time") or 0.0)
    return out


def exclusive_files(files: Sequence[str]) -> list[str]:
    """The files that mention the ``gpu_exclusive`` marker (the serial shard collects only these)."""
    found = []
    for f in files:
        try:
            if EXCLUSIVE in Path(ROOT / f if not os.path.isabs(f) else f).read_text(encoding="utf-8"):
                found.append(f)
        except OSError:
            continue
    return found


#: seconds one test may take before it is failed with every thread's stack (pytest-timeout, where
#: installed): a test that hangs must fail its shard, not stall the whole run
TEST_TIMEOUT_S = 300


def _command(files: Sequence[str], marker: str, junit: str, extra: Sequence[str]) -> list[str]:
    import importlib.util

    timeout = ([f"--timeout={TEST_TIMEOUT_S}"] if importlib.util.find_spec("pytest_timeout")
               else [])
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", marker,
            f"--junitxml={junit}", *timeout, *extra, *files]


def _env(cache: str, threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env["PYCUDNN_CACHE_DIR"] = cache  # shards never share a tuning database or routing decisions
    # PyTorch's CPU ops (the float64 references, gradcheck) start one OpenMP thread per core in
    # every shard: n shards would spin n times the cores, so each gets its share (unless set)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(name, str(threads))
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def failure_section(text: str) -> str:
    """A pytest log from its failures (or errors) section on, else its last 60 lines."""
    for mark in ("= FAILURES =", "= ERRORS ="):
        i = text.find(mark)
        if i >= 0:
            return text[text.rfind("\n", 0, i) + 1:]
    return "\n".join(text.splitlines()[-60:])


def run(files: Sequence[str], n: int, recorded: dict[str, float], extra: Sequence[str],
        logs: Path, say=print) -> tuple[int, dict[str, float]]:
    """Run the shards (in parallel), then the serial shard; (exit status, seconds per file)."""
    shards = split(files, n, recorded)
    plans = [(f"shard {i + 1}/{len(shards)}", s.files, f"not {EXCLUSIVE}", s.seconds)
             for i, s in enumerate(shards)]
    serial = exclusive_files(files)
    cores = os.cpu_count() or 1
    t0 = time.monotonic()
    failed = False
    measured: dict[str, float] = {}
    # the JUnit files (durations only) stay out of the logs folder, which a device run returns
    junits = Path(tempfile.mkdtemp(prefix="pycudnn-gpu-tests-junit-"))
    failures = logs / FAILURES
    failures.unlink(missing_ok=True)

    def launch(name: str, shard_files: Sequence[str], marker: str, threads: int
               ) -> tuple[subprocess.Popen, Path, Path]:
        slug = name.replace(" ", "-").replace("/", "of")
        log, junit = logs / f"{slug}.log", junits / f"{slug}.xml"
        cache = tempfile.mkdtemp(prefix=f"pycudnn-{slug}-cache-")
        out = open(log, "w", encoding="utf-8")  # noqa: SIM115 - closed once the process ends
        proc = subprocess.Popen(_command(shard_files, marker, str(junit), extra), cwd=ROOT,
                                env=_env(cache, threads), stdout=out, stderr=subprocess.STDOUT, text=True)
        out.close()
        return proc, log, junit

    def finish(name: str, proc: subprocess.Popen, log: Path, junit: Path, started: float) -> None:
        nonlocal failed
        rc = proc.wait()
        text = log.read_text(encoding="utf-8", errors="replace")
        ok = rc in (0, 5)  # 5: nothing collected (every test of the shard deselected)
        failed |= not ok
        say(f"{name}: {summary_line(text)} [exit {rc}, {time.monotonic() - started:.0f} s]"
            + ("" if ok else f"  log: {log}"))
        if not ok:
            with open(failures, "a", encoding="utf-8") as f:
                f.write(f"===== {name} ({log.name}): {summary_line(text)}\n{failure_section(text)}\n")
        if junit.exists():
            try:
                for f, s in file_durations(str(junit)).items():
                    measured[f] = measured.get(f, 0.0) + s
            except ET.ParseError:
                pass

    for name, shard_files, _, seconds in plans:
        say(f"{name}: {len(shard_files)} files, about {seconds:.0f} s expected")
    running = [(name, *launch(name, shard_files, marker, max(1, cores // len(plans))),
                time.monotonic())
               for name, shard_files, marker, _ in plans]
    for name, proc, log, junit, started in running:
        finish(name, proc, log, junit, started)
    if serial:
        say(f"serial ({EXCLUSIVE}): {len(serial)} files")
        proc, log, junit = launch("serial", serial, EXCLUSIVE, cores)
        finish("serial", proc, log, junit, time.monotonic())
    shutil.rmtree(junits, ignore_errors=True)
    say(f"total wall time {time.monotonic() - t0:.0f} s"
        + (" (a shard failed)" if failed else ""))
    return (1 if failed else 0), measured


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in args_in:
        i = args_in.index("--")
        args_in, extra = args_in[:i], args_in[i + 1:]
    p = argparse.ArgumentParser(prog="tools/gpu_tests.py", description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", help="test files (default: tests/test_*.py)")
    p.add_argument("-n", "--shards", type=int, default=4, help="parallel shards (default 4)")
    p.add_argument("--durations", default=str(DURATIONS),
                   help="recorded seconds per file, JSON (default tools/gpu_test_durations.json)")
    p.add_argument("--record", metavar="FILE", help="write this run's seconds per file to FILE")
    p.add_argument("--logs", metavar="DIR", help="where the shards' logs go (default: a new "
                   "temporary directory)")
    p.add_argument("--list", action="store_true", help="print the shards and exit")
    args = p.parse_args(args_in)
    if args.shards < 1:
        p.error(f"--shards: expected at least 1, got {args.shards}")
    files = args.files or sorted(str(f.relative_to(ROOT)) for f in (ROOT / "tests").glob("test_*.py"))
    recorded: dict[str, float] = {}
    if os.path.exists(args.durations):
        recorded = {str(k): float(v) for k, v in json.loads(Path(args.durations).read_text()).items()}
    if args.list:
        for i, s in enumerate(split(files, args.shards, recorded)):
            print(f"shard {i + 1}: about {s.seconds:.0f} s: {' '.join(s.files)}")
        serial = exclusive_files(files)
        if serial:
            print(f"serial ({EXCLUSIVE}): {' '.join(serial)}")
        return 0
    logs = Path(args.logs) if args.logs else Path(tempfile.mkdtemp(prefix="pycudnn-gpu-tests-"))
    logs.mkdir(parents=True, exist_ok=True)
    status, measured = run(files, args.shards, recorded, extra, logs)
    if args.record:
        Path(args.record).write_text(json.dumps(
            {f: round(s, 1) for f, s in sorted(measured.items())}, indent=1) + "\n")
        print(f"recorded the seconds of {len(measured)} files in {args.record}")
    return status


if __name__ == "__main__":
    sys.exit(main())
