"""The command line on a machine without a GPU: info, cache, bench's refusal, usage errors."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import has_gpu
from pycudnn.cli import bench, models, options, program, report, timing
from pycudnn.tuning import db as tuning_db
from pycudnn.configuration import config
from pycudnn.errors import TuningDatabaseWarning
from scripted_engine import ScriptedEngine
from test_algos import make_params

REPO = Path(__file__).resolve().parents[1]
H200 = {"name": "NVIDIA H200", "compute_capability": [9, 0], "sm_count": 132}
needs_no_gpu = pytest.mark.skipif(has_gpu(), reason="checks the behaviour without a GPU")


def run_cli(*args: str, cache: Path | None = None, prelude: str = "", **env_over: str):
    """``python -m pycudnn ARGS`` in a fresh interpreter (``prelude`` runs first when given)."""
    env = dict(os.environ)
    env.pop("PYCUDNN_LIBRARY", None)
    env.pop("PYCUDNN_TUNING_DB", None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if cache is not None:
        env["PYCUDNN_CACHE_DIR"] = str(cache)
    env.update(env_over)
    if prelude:
        cmd = [sys.executable, "-c", prelude + "\nfrom pycudnn.cli import main\n"
               f"sys.exit(main({list(args)!r}))"]
    else:
        cmd = [sys.executable, "-m", "pycudnn", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def one_line_error(proc, code: int) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    return err


@pytest.fixture
def db(tmp_path, monkeypatch):
    monkeypatch.setenv("PYCUDNN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PYCUDNN_TUNING_DB", raising=False)
    monkeypatch.setattr(tuning_db, "device_identity", lambda device: H200)
    config.reset()
    tuning_db.forget()
    yield tuning_db
    tuning_db.forget()
    config.reset()


def call(capsys, *args: str) -> tuple[int, str, str]:
    rc = program.main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


# ---- info -----------------------------------------------------------------------------------------

@needs_no_gpu
def test_info_without_gpu(tmp_path):
    import pycudnn

    proc = run_cli("info", cache=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"pycudnn      {pycudnn.__version__}" in out
    v = pycudnn.cudnn_version_tuple()
    assert f"cuDNN        {v[0]}.{v[1]}.{v[2]} at " in out and "found via" in out
    assert "cuDNN built for CUDA" in out
    assert "no GPU: " in out
    assert f"{tmp_path / tuning_db.FILE_NAME} (0 records)" in out
    assert "Traceback" not in proc.stderr


def test_info_json(tmp_path):
    proc = run_cli("info", "--json", cache=tmp_path)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["cudnn"]["found_via"] and info["cudnn"]["path"]
    assert info["tuning_db"] == {"path": str(tmp_path / tuning_db.FILE_NAME), "enabled": True,
                                 "entries": 0, "routes": {"path": str(tmp_path / "routes-v1.json"),
                                                          "entries": 0, "to_torch": 0}}
    assert (info["devices"] == []) == (info["no_gpu_reason"] is not None)


def test_info_counts_records_and_says_when_off(db, capsys):
    tuning_db.store(make_params(), {"algo": 1, "math_type": 0, "workspace": 0})
    rc, out, _ = call(capsys, "info")
    assert rc == 0 and "(1 records)" in out
    config.tuning_db = False
    rc, out, _ = call(capsys, "info")
    assert "disabled" in out


HIDE_PATHFINDER = "import sys\nsys.modules['cuda.pathfinder'] = None"


def test_info_without_libcudnn_says_what_to_install(tmp_path):
    proc = run_cli("info", cache=tmp_path, prelude=HIDE_PATHFINDER,
                   PYCUDNN_LIBRARY="/nonexistent/dir/libcudnn.so.9", LD_LIBRARY_PATH="")
    if "cuDNN        not found" not in proc.stdout:
        pytest.skip(f"a libcudnn is on the system's default search path:\n{proc.stdout}")
    assert proc.returncode == 1, proc.stderr  # the full report, then: pycudnn cannot run here
    assert "pip install nvidia-cudnn-cu12" in proc.stdout
    assert "tried PYCUDNN_LIBRARY=/nonexistent/dir/libcudnn.so.9" in proc.stdout
    assert "tuning DB" in proc.stdout and "Traceback" not in proc.stderr
    proc = run_cli("info", "--json", cache=tmp_path, prelude=HIDE_PATHFINDER,
                   PYCUDNN_LIBRARY="/nonexistent/dir/libcudnn.so.9", LD_LIBRARY_PATH="")
    assert proc.returncode == 1 and json.loads(proc.stdout)["cudnn"]["error"] == "not found"


@needs_no_gpu
def test_bench_without_libcudnn_is_one_line(tmp_path):
    proc = run_cli("bench", cache=tmp_path, prelude=HIDE_PATHFINDER,
                   PYCUDNN_LIBRARY="/nonexistent/dir/libcudnn.so.9", LD_LIBRARY_PATH="")
    err = one_line_error(proc, 1)
    assert err.startswith("pycudnn bench: ")


# ---- bench and tune without a GPU -------------------------------------------------------------------

@needs_no_gpu
@pytest.mark.parametrize("args", [["bench"], ["bench", "--shape", "8,64,28,28,64,3,3,1,1"],
                                  ["tune", "--model", "resnet50"]])
def test_bench_and_tune_refuse_cleanly_without_gpu(tmp_path, args):
    proc = run_cli(*args, cache=tmp_path)
    err = one_line_error(proc, 1)
    assert err.startswith(f"pycudnn {args[0]}: no usable CUDA GPU")
    assert proc.stdout == ""
    assert not (tmp_path / tuning_db.FILE_NAME).exists()


@pytest.mark.parametrize("shape,why", [
    ("1,2,3", "expected 9 or 11 comma-separated integers"),
    ("8,64,28,28,64,3,3,1", "got 8"),
    ("8,64,28,28,64,3,3,1,1,1", "got 10"),
    ("8,64,28,28,64,3,x,1,1", "expected integers"),
    ("8,64,28,28,64,3,3,0,1", "stride must be >= 1"),
    ("8,64,28,28,64,3,3,1,-1", "pad must be >= 0"),
    ("0,64,28,28,64,3,3,1,1", "N must be >= 1"),
    ("8,64,28,28,64,3,3,1,1,1,3", "divisible by groups=3"),
    ("8,64,2,2,64,5,5,1,0", "output would be"),
    ("8,64,28,28,64,3,3,1,1,0,1", "dilation must be >= 1"),
])
def test_bad_shape_is_one_line_and_exit_2(shape, why, capsys):
    rc, out, err = call(capsys, "bench", "--shape", shape)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and why in err
    assert err.startswith("pycudnn bench: error: shape")


def test_bad_shape_in_a_subprocess_has_no_traceback():
    proc = run_cli("bench", "--shape", "8,64,28")
    err = one_line_error(proc, 2)
    assert "N,C,H,W,K,R,S,stride,pad[,dilation,groups]" in err


@pytest.mark.parametrize("args,why", [
    (["bench", "--model", "alexnet"], "invalid choice: 'alexnet'"),
    (["bench", "--dtype", "int8"], "invalid choice: 'int8'"),
    (["bench", "--batch", "0"], "positive integer"),
    (["bench", "--device", "-1"], "expected a non-negative integer"),
    (["bench", "--direction", "up"], "invalid choice"),
    (["bench", "--nonsense"], "unrecognized arguments"),
    (["tune"], "say what to tune"),
    (["tune", "--shapes-file", "/nonexistent/shapes.txt"], "does not exist"),
    (["cache"], "the following arguments are required"),
    (["cache", "export"], "needs a FILE"),
    (["cache", "import", "/nonexistent/db.json"], "does not exist"),
    (["cache", "explode"], "invalid choice"),
    (["frobnicate"], "invalid choice"),
    (["bench", "--json", "/nonexistent/dir/out.json"], "does not exist"),
])
def test_user_mistakes_are_one_line_and_exit_2(args, why, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PYCUDNN_CACHE_DIR", str(tmp_path))
    rc, out, err = call(capsys, *args)
    assert rc == 2, (out, err)
    assert len(err.strip().splitlines()) == 1 and why in err, err


def test_shapes_file_errors_name_the_line(tmp_path, capsys):
    f = tmp_path / "shapes.txt"
    f.write_text("# ResNet bits\n8,64,28,28,64,3,3,1,1\n\n8,64,28,28,64,3,3,1   # short\n")
    rc, _, err = call(capsys, "tune", "--shapes-file", str(f))
    assert rc == 2 and f"{f}:4: shape" in err and len(err.strip().splitlines()) == 1
    f.write_text("# nothing\n\n")
    rc, _, err = call(capsys, "tune", "--shapes-file", str(f))
    assert rc == 2 and "holds no shape" in err


def test_tune_refuses_when_the_database_is_off(capsys, monkeypatch):
    config.tuning_db = False
    try:
        rc, _, err = call(capsys, "tune", "--model", "vgg16")
    finally:
        config.reset()
    assert rc == 2 and "turned off" in err


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is not None, reason="matplotlib is installed")
def test_plot_without_matplotlib_says_so_before_running(capsys, tmp_path):
    rc, _, err = call(capsys, "bench", "--plot", str(tmp_path / "p.png"))
    assert rc == 2 and "needs matplotlib" in err


@pytest.mark.parametrize("sub", ["info", "bench", "tune", "cache"])
def test_help_of_every_command(sub, capsys):
    with pytest.raises(SystemExit) as exc:
        program.main([sub, "--help"])
    assert exc.value.code == 0
    assert sub in capsys.readouterr().out


def test_unexpected_error_is_one_line_unless_debug(monkeypatch, capsys):
    def boom(args):
        raise RuntimeError("something broke\nsecond line")

    monkeypatch.setattr(program, "cmd_cache", boom)  # build_parser binds it on each main()
    rc, _, err = call(capsys, "cache", "show")
    assert rc == 1 and err.strip() == ("pycudnn cache: RuntimeError: something broke (run with "
                                       "--debug for the traceback)")
    with pytest.raises(RuntimeError):
        program.main(["--debug", "cache", "show"])


# ---- cache ----------------------------------------------------------------------------------------

def test_cache_show_creates_nothing(db, capsys):
    rc, out, _ = call(capsys, "cache", "show")
    assert rc == 0 and out.strip() == f"{db.path()}: 0 records"
    assert not os.path.lexists(os.path.dirname(db.path()))  # no directory, no lock file
    db.store(make_params(), {"algo": 1, "math_type": 0, "workspace": 0})
    os.remove(db.path() + ".lock")  # the store's
    for args in (("cache", "show"), ("cache", "show", "--json"), ("info",)):
        rc, out, _ = call(capsys, *args)
        assert rc == 0
        assert "(1 records)" in out or ": 1 records" in out or len(json.loads(out)["entries"]) == 1
        assert sorted(os.listdir(os.path.dirname(db.path()))) == [os.path.basename(db.path())]


def test_cache_show_leaves_an_unusable_database_where_it_is(db, capsys):
    os.makedirs(os.path.dirname(db.path()), mode=0o700)
    with open(db.path(), "w") as f:
        f.write('{"not json')
    os.chmod(db.path(), 0o600)
    for args in (("cache", "show"), ("info",)):
        rc, out, err = call(capsys, *args)
        assert rc == 0 and "0 records" in out
        assert sorted(os.listdir(os.path.dirname(db.path()))) == [os.path.basename(db.path())]
        with open(db.path()) as f:
            assert f.read() == '{"not json'
    rc, out, err = call(capsys, "cache", "show")
    assert err.startswith(f"pycudnn cache show: pycudnn tuning database {db.path()} is unusable (not "
                          "JSON") and err.rstrip().endswith("left as it is")
    rc, out, _ = call(capsys, "info")
    assert "warning      pycudnn tuning database" in out and "left as it is" in out


def test_cache_show_clear_export_import(db, capsys, tmp_path):
    rc, out, _ = call(capsys, "cache", "show")
    assert rc == 0 and out.strip() == f"{db.path()}: 0 records"
    db.store(make_params(), {"algo": 1, "math_type": 0, "workspace": 0, "time_ms": 0.25})
    db.store(make_params(engine="graph", dtype="bfloat16", groups=2, weight_shape=(8, 2, 3, 3),
                         alignments=(16, 16, 16)),
             {"graph": 0, "engine_id": 7, "knobs": [], "workspace": 2 << 20, "time_ms": 0.0123,
              "tag": "eng7"})
    rc, out, _ = call(capsys, "cache", "show")
    assert rc == 0 and f"{db.path()}: 2 records" in out
    assert "NVIDIA H200 (9.0, 132 SMs)" in out and "eng7" in out and "algo 1 math 0" in out
    assert "2.0 MiB" in out and "0.0123" in out
    rc, out, _ = call(capsys, "cache", "show", "--json")
    assert len(json.loads(out)["entries"]) == 2

    shipped = tmp_path / "shipped.json"
    rc, out, _ = call(capsys, "cache", "export", str(shipped))
    assert rc == 0 and out.strip() == f"exported 2 records to {shipped}"
    rc, out, _ = call(capsys, "cache", "clear")
    assert rc == 0 and out.strip() == f"removed 2 records from {db.path()}"
    assert db.entries() == []
    rc, out, _ = call(capsys, "cache", "import", str(shipped))
    assert rc == 0 and out.strip() == f"merged 2 records from {shipped} into {db.path()}"
    assert len(db.entries()) == 2


def test_cache_import_of_a_broken_file_is_exit_2(db, capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("not json at all")
    rc, _, err = call(capsys, "cache", "import", str(bad))
    assert rc == 2 and "not a pycudnn tuning database" in err and len(err.strip().splitlines()) == 1
    assert bad.read_text() == "not json at all"


def test_cache_commands_in_a_subprocess(tmp_path):
    proc = run_cli("cache", "show", cache=tmp_path)
    assert proc.returncode == 0 and "0 records" in proc.stdout
    proc = run_cli("cache", "export", str(tmp_path / "x.json"), cache=tmp_path)
    assert proc.returncode == 0 and json.loads((tmp_path / "x.json").read_text())["entries"] == []
    proc = run_cli("cache", "import", str(tmp_path / "x.json"), cache=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == (
        f"{tmp_path / 'x.json'} holds no records; {tmp_path / tuning_db.FILE_NAME} is unchanged")
    proc = run_cli("cache", "clear", cache=tmp_path)
    assert proc.returncode == 0 and "removed 0 records" in proc.stdout


# ---- layers ---------------------------------------------------------------------------------------

def test_parse_shape():
    layer = models.parse_shape("8,64,28,28,128,3,3,2,1")
    assert (layer.x_shape, layer.w_shape, layer.y_shape) == ((8, 64, 28, 28), (128, 64, 3, 3), (8, 128, 14, 14))
    assert layer.flops == 2 * 8 * 128 * 64 * 9 * 14 * 14
    g = models.parse_shape(" 8, 32,56,56,32,3,3,1,2,2,32 ")
    assert (g.dilation, g.groups, g.w_shape, g.out_spatial) == (2, 32, (32, 1, 3, 3), (56, 56))
    assert g.flops == 2 * 8 * 32 * 1 * 9 * 56 * 56
    assert dataclasses.replace(models.parse_shape(g.shape_string()), name="") == dataclasses.replace(g, name="")


@pytest.mark.parametrize("model", sorted(models.MODELS))
def test_built_in_models_are_valid_and_distinct(model):
    layers = models.model_layers(model)
    keys = {(l.c, l.spatial, l.k, l.kernel, l.stride, l.pad, l.dilation, l.groups) for l in layers}
    assert len(keys) == len(layers)
    for layer in layers:
        assert layer.n == models.MODEL_BATCH[model]
        assert all(o >= 1 for o in layer.out_spatial) and layer.c % layer.groups == 0
        if layer.nd == 2:
            assert models.parse_shape(layer.shape_string()).x_shape == layer.x_shape
    if model == "mobilenet":
        assert all(l.groups == l.c == l.k for l in layers)
    if model == "resnet50":
        assert len(layers) == 23 and layers[0].out_spatial == (112, 112)
        assert layers[-1].y_shape == (32, 512, 7, 7)
    assert all(l.n == 4 for l in models.model_layers(model, 4))


def test_layer_selection(tmp_path):
    parser = program.build_parser()
    a = parser.parse_args(["bench"])
    assert [l.name for l in models.layers_from_args(a)] == [l.name for l in models.MODELS["resnet50"]]
    a = parser.parse_args(["bench", "--shape", "8,64,28,28,64,3,3,1,1", "--shape", "8,64,28,28,64,3,3,1,1"])
    assert len(models.layers_from_args(a)) == 1  # distinct layers only
    a = parser.parse_args(["bench", "--model", "vgg16", "--shape", "8,64,28,28,64,3,3,1,1", "--batch", "4"])
    layers = models.layers_from_args(a)
    assert len(layers) == 10 and {l.n for l in layers} == {4}
    f = tmp_path / "s.txt"
    f.write_text("8,64,28,28,64,3,3,1,1\n8,64,28,28,64,1,1,1,0  # 1x1\n")
    a = parser.parse_args(["tune", "--shapes-file", str(f)])
    assert [l.kernel for l in models.layers_from_args(a)] == [(3, 3), (1, 1)]


def test_options_map_dtypes_to_flags():
    parser = program.build_parser()
    o = options.options_from_args(parser.parse_args(["bench"]))
    assert o["dtype"] == "bfloat16" and o["fmt"] == "channels_last"
    assert o["flags"] == {"benchmark": True, "engine": config.engine}  # like a default program
    o = options.options_from_args(parser.parse_args(["bench", "--dtype", "float32", "--layout", "nchw", "--engine", "v7"]))
    assert o["flags"] == {"benchmark": True, "engine": "v7", "allow_tf32": False}
    assert o["fmt"] == "contiguous"
    o = options.options_from_args(parser.parse_args(["bench", "--dtype", "tf32", "--no-tuning-db"]))
    assert o["flags"]["allow_tf32"] is True and o["use_db"] is False


@pytest.mark.parametrize("spelling, dtype, tf32", [
    ("fp16", "float16", None), ("half", "float16", None), ("FLOAT16", "float16", None),
    ("bf16", "bfloat16", None), ("BFloat16", "bfloat16", None), ("fp32", "float32", False),
    ("Float32", "float32", False), ("TF32", "float32", True), ("fp64", "float64", None)])
def test_dtype_takes_the_usual_spellings(spelling, dtype, tf32):
    o = options.options_from_args(program.build_parser().parse_args(["bench", "--dtype", spelling]))
    assert o["dtype"] == dtype and o["flags"].get("allow_tf32") is tf32


@pytest.mark.parametrize("spelling, fmt", [("NHWC", "channels_last"), ("nhwc", "channels_last"),
                                           ("NCHW", "contiguous"), ("Nchw", "contiguous")])
def test_layout_in_any_case(spelling, fmt):
    o = options.options_from_args(program.build_parser().parse_args(["tune", "--layout", spelling]))
    assert o["fmt"] == fmt


def test_an_unknown_dtype_or_layout_is_a_usage_error(capsys):
    rc, _, err = call(capsys, "bench", "--dtype", "fp8")
    assert rc == 2 and "argument --dtype: invalid choice: 'fp8'" in err and "bfloat16" in err
    rc, _, err = call(capsys, "bench", "--layout", "NDHWC")
    assert rc == 2 and "argument --layout: invalid choice: 'ndhwc'" in err and "nchw" in err


def test_progress_plain_text(capsys):
    p = report.Progress(2, "bench")
    p._bar = None  # plain text even where tqdm is installed
    p.step("conv1 fwd")
    p.done()
    p.close()
    assert "bench [1/2] conv1 fwd" in capsys.readouterr().err


def test_console_script_is_declared():
    text = (REPO / "pyproject.toml").read_text()
    assert 'pycudnn = "pycudnn.cli:main"' in text and "[project.scripts]" in text


# ---- bench's report, with the GPU work faked --------------------------------------------------------

def test_bench_report_plumbing(db, monkeypatch, capsys, tmp_path):
    """Everything of ``bench`` around the measurement: layers, progress, table, JSON, CSV."""
    import contextlib

    import pycudnn.runtime.memory

    monkeypatch.setattr(bench, "require_gpu", lambda command, device=0: None)
    monkeypatch.setattr(bench, "torch_available", lambda args: (True, None))
    monkeypatch.setattr(bench, "dist_version", lambda name: "9.9")
    monkeypatch.setattr(bench, "bench_meta", lambda args, opts, layers, directions: {
        "pycudnn": "0", "cudnn": "9.28.0", "cuda_runtime": "12.9", "tuning_db": db.path(),
        "device": {"index": 0, "name": "NVIDIA H200", "compute_capability": [9, 0], "sm_count": 132},
        "settings": {"dtype": args.dtype, "layout": args.layout, "engine": opts["engine"],
                     "layers": len(layers), "directions": [models.SHORT[d] for d in directions]}})
    monkeypatch.setattr(timing, "device_guard", lambda device: contextlib.nullcontext())
    seen = []

    def fake_run_layer(layer, direction, bufs, opts, torch_on, measure=True):
        seen.append((layer.name, direction, torch_on, measure, opts["flags"]))
        row = timing.new_row(layer, direction)
        row.update(ms=0.5, tflops=layer.flops / 0.5e-3 / 1e12, first_call_ms=40.0, choice="eng41",
                   workspace=1 << 20, source="measured", searches=1, torch_ms=0.6,
                   torch_tflops=layer.flops / 0.6e-3 / 1e12, torch_over_pycudnn=1.2,
                   candidates=[{"choice": "eng41", "time_ms": 0.5, "workspace": 1 << 20,
                                "notes": ["TENSOR_CORE"], "source": "measured", "detail": "..."},
                               {"choice": "eng0", "time_ms": None, "workspace": None, "notes": [],
                                "source": "measured", "detail": "..."}])
        if direction == "backward_filter":
            row.update(ms=None, tflops=None, error="NoAlgorithmError: nothing fits", torch_over_pycudnn=None)
        return row

    monkeypatch.setattr(timing, "run_layer", fake_run_layer)
    j, c = tmp_path / "out.json", tmp_path / "out.csv"
    rc, out, err = call(capsys, "bench", "--shape", "8,64,28,28,64,3,3,1,1", "--direction", "all",
                        "--json", str(j), "--csv", str(c), "--all-candidates", "--quiet")
    assert rc == 1  # the failed wgrad row
    assert "1 of 3 measurements failed" in err
    assert [s[1] for s in seen] == ["forward", "backward_data", "backward_filter"]
    assert all(s[2] and s[3] and s[4] == {"benchmark": True, "engine": config.engine} for s in seen)
    lines = out.splitlines()
    assert lines[0].split()[:5] == ["layer", "dir", "ms", "TFLOP/s", "torch"]
    assert "ERROR NoAlgorithmError: nothing fits" in out and "untimed" in out
    assert "torch/pycudnn geometric mean 1.200" in out
    result = json.loads(j.read_text())
    assert [r["direction"] for r in result["rows"]] == ["forward", "backward_data", "backward_filter"]
    assert set(timing.ROW_FIELDS) <= set(result["rows"][0])
    assert result["rows"][0]["shape"]["shape"] == "8,64,28,28,64,3,3,1,1"
    rows = c.read_text().splitlines()
    assert rows[0].split(",")[:3] == ["layer", "shape", "direction"] and len(rows) == 4


def test_candidate_row_of_a_v7_record():
    from pycudnn.engines.v7 import AlgoRecord

    row = timing.candidate_row(AlgoRecord(1, 1, 4096, 0.25, True, "forward", "find"))
    assert row["choice"] == "IMPLICIT_PRECOMP_GEMM TENSOR_OP_MATH"
    assert row["time_ms"] == 0.25 and row["workspace"] == 4096 and row["notes"] == ["deterministic"]
    row = timing.candidate_row(AlgoRecord(0, 0, 0, -1.0, False, "backward_filter", "heuristics"))
    assert row["time_ms"] is None and row["notes"] == ["non-deterministic"]


class _FakeTimer:
    def start(self):
        pass

    def stop(self):
        return 0.02

    def sync(self):
        pass

    def close(self):
        pass


class _ScriptedV7(ScriptedEngine):
    """Find-like candidates made of real AlgoRecords; the first one fails to run."""

    name = "scripted"

    def __init__(self):
        from pycudnn.engines.v7 import AlgoRecord

        self.cands = [AlgoRecord(0, 1, 0, 0.10, True, "forward", "find"),
                      AlgoRecord(1, 1, 4096, 0.20, True, "forward", "find")]
        self.ran = []

    def candidates(self, args):
        return list(self.cands) if args.benchmark else self.cands[:1]

    def default_candidates(self, args):
        return self.cands[:1]

    def run(self, args, record):
        from pycudnn.errors import CudnnNotSupportedError

        self.ran.append(record.algo)
        if record.algo == 0:
            raise CudnnNotSupportedError(3000, "cudnnConvolutionForward", "CUDNN_STATUS_NOT_SUPPORTED", "", [])

    def serialize(self, record):
        return {"algo": record.algo, "math_type": record.math_type, "workspace": record.workspace,
                "time_ms": record.time_ms}

    def restore(self, args, data):
        from pycudnn.engines.v7 import AlgoRecord

        return AlgoRecord(data["algo"], data["math_type"], data["workspace"], data["time_ms"], True,
                          "forward", "tuning-db")


@pytest.fixture
def scripted(db, monkeypatch):
    """run_layer against the real caches, iterator and database, with a scripted engine."""
    from pycudnn.api.caches import clear_caches
    from pycudnn.engines import registry
    from pycudnn.search.iterate import try_all
    from pycudnn.engines.problem import ConvolutionArgs

    strategy = _ScriptedV7()
    monkeypatch.setitem(registry.ENGINES, "scripted", strategy)
    monkeypatch.setattr(timing, "CudaTimer", _FakeTimer)
    params = make_params()  # v7 parameters (the database takes the engines it knows only)

    def fake_fn(layer, direction, bufs, flags):
        return lambda: try_all(ConvolutionArgs(params, 0, 0, 0, 0, 0, benchmark=flags["benchmark"]),
                               strategy)

    monkeypatch.setattr(timing, "pycudnn_fn", fake_fn)
    yield strategy, params
    clear_caches()


def _opts(**over):
    o = {"engine": "scripted", "flags": {"benchmark": True, "engine": "scripted"}, "fresh": False,
         "all_candidates": False, "use_db": True, "dtype": "float32", "fmt": "contiguous"}
    o.update(over)
    return o


def test_run_layer_searches_then_reuses_the_database(scripted, db):
    strategy, params = scripted
    layer = models.parse_shape("2,4,8,8,8,3,3,1,1")
    row = timing.run_layer(layer, "forward", None, _opts(), torch_on=False)
    assert row["error"] is None and row["searches"] == 1 and row["source"] == "find"
    assert row["choice"] == "IMPLICIT_PRECOMP_GEMM TENSOR_OP_MATH" and row["workspace"] == 4096
    assert row["choice_ms"] == 0.20 and row["ms"] > 0 and row["tflops"] > 0
    assert db.lookup(params)["algo"] == 1
    db.forget()  # as a later process would
    row = timing.run_layer(layer, "forward", None, _opts(), torch_on=False)
    assert row["searches"] == 0 and row["source"] == "tuning-db" and row["choice_ms"] == 0.20


def test_run_layer_all_candidates_searches_fresh_and_stores_the_winner(scripted, db):
    strategy, params = scripted
    db.store(params, {"algo": 0, "math_type": 1, "workspace": 0, "time_ms": 9.0})  # stale
    layer = models.parse_shape("2,4,8,8,8,3,3,1,1")
    row = timing.run_layer(layer, "forward", None, _opts(all_candidates=True), torch_on=False)
    assert row["searches"] == 1 and row["source"] == "find"
    assert [c["choice"] for c in row["candidates"]] == ["IMPLICIT_GEMM TENSOR_OP_MATH",
                                                         "IMPLICIT_PRECOMP_GEMM TENSOR_OP_MATH"]
    assert [c["time_ms"] for c in row["candidates"]] == [0.10, 0.20]
    assert db.lookup(params)["algo"] == 1  # the fresh winner replaced the stale record
    assert "candidates" not in timing.run_layer(layer, "forward", None, _opts(), torch_on=False)


def test_run_layer_without_the_database(scripted, db):
    strategy, params = scripted
    from pycudnn.configuration import flags

    layer = models.parse_shape("2,4,8,8,8,3,3,1,1")
    with flags(tuning_db=False):
        row = timing.run_layer(layer, "forward", None, _opts(use_db=False, fresh=True), torch_on=False)
    assert row["searches"] == 1 and db.entries() == []


def test_run_layer_reports_a_failure_in_its_row(scripted, db, monkeypatch):
    strategy, _ = scripted
    monkeypatch.setattr(strategy, "run", lambda args, record: (_ for _ in ()).throw(
        __import__("pycudnn").errors.OutOfMemoryError("out of memory\nmore")))
    row = timing.run_layer(models.parse_shape("2,4,8,8,8,3,3,1,1"), "forward", None, _opts(), torch_on=False)
    assert row["error"].startswith("NoAlgorithmError: ") and row["ms"] is None


# ---- cache: untrusted files ------------------------------------------------------------------------

V7 = {"algo": 1, "math_type": 0, "workspace": 0, "time_ms": 0.25}


def _import_file(db, tmp_path, extra_entries) -> Path:
    """An exported database (one valid v7 entry) with ``extra_entries`` appended."""
    db.store(make_params(), V7)
    f = tmp_path / "import.json"
    db.export(f)
    db.clear()
    doc = json.loads(f.read_text())
    doc["entries"] += extra_entries
    f.write_text(json.dumps(doc))
    return f


def test_cache_import_refuses_odd_entries_and_show_escapes_what_it_prints(db, tmp_path):
    params = {"direction": "forward", "dtype": "float32", "input_shape": [1, 1, 4, 4]}
    evil = "\x1b]0;pwned\x07\x1b[2J\x1b[31mNVIDIA H200\u202e"
    f = _import_file(db, tmp_path, [
        {"schema": 1, "gpu": {"name": evil}, "cudnn_version": 92800, "engine": "v7",
         "params": params, "record": {"algo": 1}},
        {"schema": 1, "gpu": {"name": "x"}, "cudnn_version": "9.2", "engine": "v7",
         "params": params, "record": {"algo": 1}},
        # another pycudnn's schema: kept as it is (never used by this one), shown escaped
        {"schema": 2, "gpu": {"name": evil, "compute_capability": "9.0"}, "cudnn_version": "9.2",
         "engine": evil, "params": {"direction": [evil]}, "record": {"tag": evil}},
    ])
    cache = Path(db.path()).parent
    proc = run_cli("cache", "import", str(f), cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (f"merged 2 records from {f} into {db.path()}; refused 2 "
                                   f"entries that did not validate")
    assert "dropping entry 1" in proc.stderr and "dropping entry 2" in proc.stderr
    assert "\x1b" not in proc.stderr
    proc = run_cli("cache", "show", cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert f"{db.path()}: 2 records" in proc.stdout and "NVIDIA H200 (9.0, 132 SMs)" in proc.stdout
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout and "\u202e" not in proc.stdout
    assert "\\x1b]0;pwned\\x07\\x1b[2J" in proc.stdout and "\\u202e" in proc.stdout
    proc = run_cli("cache", "show", "--json", cache=cache)
    assert proc.returncode == 0 and "\x1b" not in proc.stdout
    assert len(json.loads(proc.stdout)["entries"]) == 2


def test_cache_show_survives_an_entry_it_cannot_summarize(db, capsys, tmp_path):
    f = _import_file(db, tmp_path, [{"schema": 7, "gpu": {"compute_capability": 5},
                                     "cudnn_version": [], "engine": 1, "params": {"groups": []},
                                     "record": {"algo": {}}}])
    assert call(capsys, "cache", "import", str(f))[0] == 0
    rc, out, err = call(capsys, "cache", "show")
    assert rc == 0 and f"{db.path()}: 2 records" in out and "algo 1 math 0" in out, err


def test_cache_import_keeps_local_records_unless_replace(db, capsys, tmp_path):
    p = make_params()
    db.store(p, dict(V7, time_ms=0.0, algo=2))  # claims 0 ms
    f = tmp_path / "imported.json"
    db.export(f)
    db.store(p, dict(V7, algo=1))  # measured here
    rc, out, _ = call(capsys, "cache", "import", str(f))
    assert rc == 0 and out.strip() == (f"merged 0 records from {f} into {db.path()}; kept 1 "
                                       f"local record (--replace replaces them)")
    assert db.lookup(p)["algo"] == 1
    rc, out, _ = call(capsys, "cache", "import", str(f), "--replace")
    assert rc == 0 and out.startswith("merged 1 records") and db.lookup(p)["algo"] == 2
    rc, _, err = call(capsys, "cache", "show", "--replace")
    assert rc == 2 and "--replace goes with cache import" in err


def test_cache_show_file_lists_that_file_not_the_database(db, capsys, tmp_path):
    f = _import_file(db, tmp_path, [])  # one v7 entry; the database is left empty
    db.store(make_params(engine="graph", dtype="bfloat16", alignments=(16, 16, 16)),
             {"graph": 0, "engine_id": 7, "knobs": [], "workspace": 0, "time_ms": 0.5, "tag": "eng7"})
    rc, out, err = call(capsys, "cache", "show", str(f))
    assert rc == 0, err
    assert out.splitlines()[0] == f"{f}: 1 records"
    assert "algo 1 math 0" in out and "eng7" not in out and db.path() not in out
    rc, out, _ = call(capsys, "cache", "show", str(f), "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["path"] == str(f) and len(doc["entries"]) == 1
    assert doc["entries"][0]["record"]["algo"] == 1
    rc, out, _ = call(capsys, "cache", "show")
    assert rc == 0 and f"{db.path()}: 1 records" in out and "eng7" in out
    assert len(db.entries()) == 1  # show FILE changed nothing


def test_cache_show_file_validates_and_escapes_the_untrusted_file(db, tmp_path):
    evil = "\x1b]0;pwned\x07\u202e"
    params = {"direction": "forward", "dtype": "float32", "input_shape": [1, 1, 4, 4]}
    f = _import_file(db, tmp_path, [
        {"schema": 1, "gpu": {"name": evil}, "cudnn_version": 92800, "engine": "v7",
         "params": params, "record": {"algo": 1}},  # does not validate: left out
        {"schema": 2, "gpu": {"name": evil}, "cudnn_version": 1, "engine": evil,
         "params": {}, "record": {"tag": evil}},  # another schema: listed, escaped
    ])
    proc = run_cli("cache", "show", str(f), cache=Path(db.path()).parent)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"{f}: 2 records"
    assert "\x1b" not in proc.stdout + proc.stderr and "\u202e" not in proc.stdout
    assert "\\x1b]0;pwned\\x07" in proc.stdout
    assert "dropping entry 1" in proc.stderr
    assert f"pycudnn cache show: {f}: left out 1 entry that did not validate" in proc.stderr
    with pytest.warns(TuningDatabaseWarning, match="left out 1 entry"):
        assert [e["schema"] for e in tuning_db.read_file(f)] == [1, 2]


@pytest.mark.parametrize("content, why", [
    ("not json at all", "not JSON"),
    ('{"format": "other", "entries": []}', "not a version-1 pycudnn-tuning-db document"),
    ('{"format": "pycudnn-tuning-db", "version": 1, "entries": ' + "[" * 100_000, "not JSON"),
])
def test_cache_show_of_a_file_that_is_no_database_is_exit_2(db, capsys, tmp_path, content, why):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    rc, out, err = call(capsys, "cache", "show", str(bad))
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"{bad} is not a pycudnn tuning database: {why}" in err
    assert bad.read_text() == content  # never moved aside: it is not the database
    rc, _, err = call(capsys, "cache", "show", str(tmp_path / "missing.json"))
    assert rc == 2 and "missing.json does not exist" in err
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for odd in (tmp_path, fifo):  # never blocks on the FIFO
        rc, _, err = call(capsys, "cache", "show", str(odd))
        assert rc == 2 and f"{odd} is not a pycudnn tuning database: " in err


def test_cache_import_of_a_file_without_records_changes_nothing(db, capsys, tmp_path):
    db.store(make_params(), V7)
    before = Path(db.path()).read_bytes()
    empty = tmp_path / "empty.json"
    empty.write_text('{"format": "pycudnn-tuning-db", "version": 1, "entries": []}')
    rc, out, _ = call(capsys, "cache", "import", str(empty))
    assert rc == 0 and out.strip() == f"{empty} holds no records; {db.path()} is unchanged"
    assert Path(db.path()).read_bytes() == before
    odd = _import_file(db, tmp_path, [{"schema": 1}])
    odd_doc = json.loads(odd.read_text())
    odd_doc["entries"] = odd_doc["entries"][1:]  # only the entry that does not validate
    odd.write_text(json.dumps(odd_doc))
    db.store(make_params(), V7)
    before = Path(db.path()).read_bytes()  # the store stamps the entry with the current time
    rc, out, _ = call(capsys, "cache", "import", str(odd))
    assert rc == 0 and out.strip() == (f"{odd} holds no records; {db.path()} is unchanged; "
                                       f"refused 1 entry that did not validate")
    assert Path(db.path()).read_bytes() == before


def test_cache_clear_clears_a_file_nested_too_deep(tmp_path):
    f = tmp_path / tuning_db.FILE_NAME
    deep = '{"format": "pycudnn-tuning-db", "version": 1, "entries": [' + "[" * 100_000 + "]" * 100_000 + "]}"
    f.write_text(deep)
    proc = run_cli("cache", "clear", cache=tmp_path)
    assert proc.returncode == 0 and "removed 0 records" in proc.stdout, proc.stderr
    # Python 3.11 cannot parse it (RecursionError); 3.12 can, and the file's depth limit refuses it
    assert ("RecursionError" in proc.stderr or "nested more than 32 deep" in proc.stderr) \
        and "moved it aside" in proc.stderr
    assert not f.exists() or json.loads(f.read_text())["entries"] == []
    [aside] = tmp_path.glob(tuning_db.FILE_NAME + ".corrupt-*")
    assert aside.read_text() == deep


def test_cache_commands_on_a_directory_others_may_write(tmp_path):
    cache = tmp_path / "shared"
    cache.mkdir()
    os.chmod(cache, 0o777)
    proc = run_cli("cache", "show", cache=cache)
    assert proc.returncode == 0 and "0 records (refused:" in proc.stdout
    assert "writable by group or others" in proc.stdout
    proc = run_cli("cache", "clear", cache=cache)
    err = one_line_error(proc, 1)
    assert "was refused" in err and "writable by group or others" in err
    assert not (cache / tuning_db.FILE_NAME).exists()


def test_safe_text_escapes_control_and_invisible_characters():
    assert report.terminal_safe("NVIDIA H200 (9.0)") == "NVIDIA H200 (9.0)"
    assert report.terminal_safe("a\x1b[2Jb\x07\n\u202ec\u00e9") == "a\\x1b[2Jb\\x07\\n\\u202ecé"


# ---- cache clear: what it clears and what it says ------------------------------------------------

ROUTE = {"key": {"gpu": H200, "cudnn": 91000, "torch": "2.11.0", "torch_cudnn": 91000,
                 "signature": "layer", "direction": "forward", "allow_tf32": True,
                 "deterministic": False},
         "winner": "torch", "reason": "r", "pycudnn_gpu_us": 1.0, "torch_gpu_us": 1.0,
         "pycudnn_call_us": 1.0, "torch_call_us": 1.0}


def write_routes(cache: Path, entries=(ROUTE,)) -> Path:
    cache.mkdir(mode=0o700, exist_ok=True)
    f = cache / "routes-v1.json"
    from pycudnn.tuning import routes

    f.write_text(json.dumps({"format": "pycudnn-routes", "version": routes.DOCUMENT[1],
                             "entries": list(entries)}))
    os.chmod(f, 0o600)
    return f


def test_cache_clear_refuses_a_file_argument_and_clears_nothing(tmp_path):
    cache = tmp_path / "cache"
    routes = write_routes(cache)
    extra = tmp_path / "extra.json"
    extra.write_text("{}")
    proc = run_cli("cache", "clear", str(extra), cache=cache)
    err = one_line_error(proc, 2)
    assert "cache clear takes no FILE" in err and str(extra) in err
    assert extra.read_text() == "{}" and len(json.loads(routes.read_text())["entries"]) == 1


def test_cache_clear_removes_and_counts_the_routing_decisions(tmp_path):
    cache = tmp_path / "cache"
    routes = write_routes(cache, [ROUTE, {**ROUTE, "key": {**ROUTE["key"], "signature": "other"}}])
    proc = run_cli("cache", "clear", cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"removed 0 records from {cache / tuning_db.FILE_NAME}",
                                        f"removed 2 routing decisions from {routes}"]
    assert json.loads(routes.read_text())["entries"] == []


def test_cache_clear_fails_when_routing_decisions_stay_on_disk(tmp_path):
    cache = tmp_path / "cache"
    routes = write_routes(cache)
    os.mkfifo(cache / "routes-v1.json.lock", 0o600)  # the store refuses the file
    proc = run_cli("cache", "clear", cache=cache)
    err = one_line_error(proc, 1)
    assert "could not clear the routing decisions" in err and "not a regular file" in err
    assert f"removed 0 records from {cache / tuning_db.FILE_NAME}" in proc.stdout  # the rest is done
    assert len(json.loads(routes.read_text())["entries"]) == 1


def test_cache_clear_names_an_unusable_routes_file_as_such(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    (cache / "routes-v1.json").write_text("not json")
    proc = run_cli("cache", "clear", cache=cache)
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr.strip()
    assert err.startswith(f"pycudnn cache clear: pycudnn routing decisions file {cache}/routes-v1.json"
                          " is unusable (not JSON"), err
    assert "tuning database" not in err and len(err.splitlines()) == 1  # no warning source line
    assert list(cache.glob("routes-v1.json.corrupt-*"))


@pytest.mark.parametrize("make, why", [
    (lambda d: d.symlink_to(d.parent / "missing"), "is a symbolic link to a missing path"),
    (lambda d: d.write_text(""), "is not a directory"),
])
def test_cache_clear_and_show_name_an_unusable_cache_directory(tmp_path, make, why):
    cache = tmp_path / "cache"
    make(cache)
    proc = run_cli("cache", "clear", cache=cache)
    err = one_line_error(proc, 1)
    assert f"the cache directory {cache} {why}; nothing was removed" in err
    assert "FileNotFoundError" not in err and "Errno" not in err
    proc = run_cli("cache", "show", cache=cache)
    assert proc.returncode == 0 and f"0 records (the cache directory {cache} {why})" in proc.stdout


def test_cache_clear_under_a_file_names_the_file(tmp_path):
    (tmp_path / "afile").write_text("")
    cache = tmp_path / "afile" / "cache"
    err = one_line_error(run_cli("cache", "clear", cache=cache), 1)
    assert f"cannot be made: {tmp_path / 'afile'} is not a directory" in err


def test_tune_help_gives_model_no_default_that_tune_refuses(capsys):
    with pytest.raises(SystemExit):
        program.main(["tune", "--help"])
    text = " ".join(capsys.readouterr().out.split()).replace("- ", "-")  # argparse's line breaks
    assert "default: resnet50" not in text
    assert "one of --model, --shape, --shapes-file is needed" in text
    with pytest.raises(SystemExit):
        program.main(["bench", "--help"])
    assert "default: resnet50 when no --shape is given" in " ".join(capsys.readouterr().out.split())
    rc, _, err = call(capsys, "tune")
    assert rc == 2 and "--model" in err


NO_CUDNN_PRELUDE = r"""
import sys
sys.modules["nvidia.cudnn"] = None  # no cuDNN wheel to open by its path
import cuda.pathfinder as pf
def not_found(name):  # what the pathfinder raises with no cuDNN: it looks for a dependency first
    raise pf.DynamicLibNotFoundError('Failure finding "libcublasLt.so": No such file\nmore')
pf.load_nvidia_dynamic_lib = not_found
from pycudnn.ffi import library
library.cudnn_installed = lambda: False
"""


def test_info_without_cudnn_gives_cudnn_not_found_first(tmp_path):
    proc = run_cli("info", cache=tmp_path, prelude=NO_CUDNN_PRELUDE, LD_LIBRARY_PATH="")
    if "not found" not in proc.stdout:
        pytest.skip("a libcudnn is on the system's default search path")
    assert proc.returncode == 1, proc.stderr  # info answers, and says it cannot run convolutions
    tried = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip().startswith("tried ")]
    assert tried[0].startswith("tried the NVIDIA cuDNN wheel"), tried
    assert tried[1].startswith('tried cuda.pathfinder.load_nvidia_dynamic_lib("cudnn"): '
                               "DynamicLibNotFoundError: cuDNN not found"), tried
    assert "libcublasLt" in tried[1]  # where the search stopped is still said, after it


def test_a_missing_cudnn_dependency_stays_the_reason_when_cudnn_is_installed(tmp_path):
    prelude = NO_CUDNN_PRELUDE.replace("lambda: False", "lambda: True")
    proc = run_cli("info", cache=tmp_path, prelude=prelude, LD_LIBRARY_PATH="")
    assert proc.returncode in (0, 1), proc.stderr
    tried = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip().startswith("tried ")]
    if not tried:
        pytest.skip("a libcudnn is on the system's default search path")
    assert 'DynamicLibNotFoundError: Failure finding "libcublasLt.so"' in tried[1]
