"""The command line's own version, its answer to no command, and `pycudnn info`'s CUDA lines:
cuDNN, cuda-bindings and the driver from CUDA majors that do not work together are named, with
what to do."""

from __future__ import annotations

import json
import sys

import pytest

import pycudnn
from pycudnn.cli import environment, program


def call(capsys, *args):
    rc = program.main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_version_is_pycudnns_own(capsys):
    with pytest.raises(SystemExit) as exc:
        program.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"pycudnn {pycudnn.__version__}"


def test_one_source_for_the_version():
    from importlib.metadata import PackageNotFoundError, version

    try:
        assert version("pycudnn-ctypes") == pycudnn.__version__
    except PackageNotFoundError:  # run from a tree that is not installed
        pytest.skip("pycudnn-ctypes is not installed here")


def test_cudnn_version_has_one_name_and_version_means_nothing_else():
    major, minor, patch = pycudnn.cudnn_version_tuple()
    assert pycudnn.cudnn_version() == major * 10000 + minor * 100 + patch >= 90000
    assert {"cudnn_version", "cudnn_version_tuple"} <= set(pycudnn.__all__) & set(dir(pycudnn))
    # a bare "version" would read as pycudnn's own, which is __version__ alone
    for name in ("version", "version_tuple"):
        assert name not in pycudnn.__all__ and name not in dir(pycudnn)
        with pytest.raises(AttributeError, match=name):
            getattr(pycudnn, name)


def test_no_command_prints_help_and_succeeds(capsys):
    rc, out, err = call(capsys)
    assert rc == 0 and err == ""
    assert out.startswith("usage: pycudnn") and "info" in out and "bench" in out


def test_info_names_the_driver_state(capsys):
    rc, out, _ = call(capsys, "info")
    assert rc == 0
    line = next(x for x in out.splitlines() if x.startswith("CUDA "))
    assert "CUDA -" not in line and "(no driver)" not in line
    assert "driver supports CUDA " in line or "no NVIDIA driver found" in line
    rc, out, _ = call(capsys, "info", "--json")
    assert rc == 0 and isinstance(json.loads(out)["cuda_mismatch"], list)


def info(cudnn=None, bindings=None, driver=None, **packages):
    return {"cudnn": {"cuda_runtime": cudnn} if cudnn else {"error": "not found"},
            "cuda_python_runtime": bindings, "cuda_driver": driver,
            "packages": {k.replace("_", "-"): v for k, v in packages.items()}}


def test_matching_majors_say_nothing():
    assert environment.cuda_mismatches(info("12.9", "12.9", "13.0")) == []
    assert environment.cuda_mismatches(info("13.0", "13.0", "13.1")) == []
    assert environment.cuda_mismatches(info("12.9", "12.9", None)) == []  # no driver: the GPU line says so
    assert environment.cuda_mismatches(info(None, "12.9", "12.4")) == []


def test_cudnn_from_another_major_than_cuda_bindings():
    (line,) = environment.cuda_mismatches(info("13.0", "12.9", "13.0"))
    assert "cuDNN is built for CUDA 13 but cuda-bindings is for CUDA 12" in line
    assert "[cu13]" in line and "[cu12]" in line


def test_driver_older_than_the_libraries():
    (line,) = environment.cuda_mismatches(info("13.0", "13.0", "12.8"))
    assert "driver supports CUDA 12.8, older than CUDA 13 that cuDNN needs" in line
    assert "update the NVIDIA driver" in line and "[cu12]" in line


def test_both_cudnn_wheels_installed():
    lines = environment.cuda_mismatches(info("13.0", "12.9", "13.0", nvidia_cudnn_cu12="9.1",
                                      nvidia_cudnn_cu13="9.1"))
    assert len(lines) == 2
    assert "nvidia-cudnn-cu12 and nvidia-cudnn-cu13 are both installed" in lines[0]


def test_the_install_command_fits_where_pycudnn_comes_from(monkeypatch):
    import os

    text = environment.pip_install_command("cu12")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(environment.__file__))))
    if os.path.isfile(os.path.join(root, "pyproject.toml")):
        assert text == f'pip install -e "{root}[cu12]"'
    monkeypatch.setattr(os.path, "isfile", lambda p: False)
    # an installed pycudnn: the extra's own requirements, which resolve without pycudnn on an index
    text = environment.pip_install_command("cu13")
    assert "pycudnn-ctypes" not in text
    assert '"nvidia-cudnn-cu13' in text and '"cuda-python' in text and "<14" in text
    assert '"nvidia-cudnn-cu12' in environment.pip_install_command("cu12")
    with pytest.raises(ValueError, match="unknown extra 'cu99'"):
        environment.pip_install_command("cu99")


@pytest.mark.parametrize("extra", ["cu12", "cu13"])
def test_the_known_extras_are_pyprojects(monkeypatch, extra):
    """Without installed metadata, the requirements an install hint names are pyproject's own."""
    import os
    from importlib import metadata

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "requires", missing)
    assert environment.extra_requirements(extra) == extras[extra]


def test_python_m_pycudnn_version():
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "pycudnn", "--version"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("pycudnn ")


class _TwoGpuDriver:
    """The driver calls `pycudnn info` makes for its GPU lines, answering for two devices; the
    second one's memory query fails."""

    init_status = 0

    def cuDriverGetVersion(self, out):
        out._obj.value = 12080
        return 0

    def cuDeviceGetCount(self, out):
        out._obj.value = 2
        return 0

    def cuDeviceGet(self, out, ordinal):
        out._obj.value = ordinal
        return 0 if ordinal in (0, 1) else 101

    def cuDeviceGetName(self, buf, size, dev):
        buf.value = f"Scripted GPU {dev}".encode()
        return 0

    def cuDeviceGetAttribute(self, out, attr, dev):
        out._obj.value = {75: 9, 76: 0, 16: 132}[attr]  # CC major, CC minor, SM count
        return 0

    def cuDeviceTotalMem(self, out, dev):
        if dev == 1:
            return 999  # CUDA_ERROR_UNKNOWN
        out._obj.value = 80 << 30
        return 0

    def error_text(self, code):
        return f"CUDA_ERROR {code}"


def test_info_reads_the_gpus_and_the_driver_version_from_the_driver(monkeypatch, driver_library_found):
    from pycudnn.runtime.memory import devices, driver

    monkeypatch.setattr(driver, "loaded", _TwoGpuDriver())
    monkeypatch.setattr(devices, "visible_devices", None)
    got, reason = environment.list_devices()
    assert reason is None
    assert got[0] == {"index": 0, "name": "Scripted GPU 0", "compute_capability": [9, 0],
                      "sm_count": 132, "memory_bytes": 80 << 30}
    assert got[1] == {"index": 1, "error": "cuDeviceTotalMem(1) failed: CUDA_ERROR 999"}
    assert devices.driver_version() == 12080
