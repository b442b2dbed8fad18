"""The tuning database with the real engines on a GPU: a later "process" (caches and the
database's memory cleared, the file kept) reuses the measured choice without searching, rebuilt
from its engine id and knobs on the local graph. A record is untrusted input: a plan's JSON in it
(which carries its own tensors) is never deserialized, and a record that does not check out for
its key is dropped and searched again, with the memory after the output left unchanged."""

from __future__ import annotations

import numpy as np
import pytest

import reference as R

pytestmark = pytest.mark.gpu


@pytest.fixture
def db(tmp_path, monkeypatch):
    import pycudnn
    from pycudnn.tuning import db as tuning_db
    from pycudnn.configuration import config

    monkeypatch.setenv("PYCUDNN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PYCUDNN_TUNING_DB", raising=False)
    config.reset()
    pycudnn.clear_caches()
    tuning_db.forget()
    yield tuning_db
    pycudnn.clear_caches()
    tuning_db.forget()
    config.reset()


def _new_process(tuning_db) -> None:
    import pycudnn

    pycudnn.clear_caches()
    tuning_db.forget()


def _case(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 16, 12, 12)).astype(np.float32)
    w = rng.standard_normal((24, 16, 3, 3)).astype(np.float32)
    return x, w, R.conv_forward(x.astype(np.float64), w.astype(np.float64), (1, 1), (1, 1), (1, 1), 1)


def _run(x, w):
    import pycudnn

    y = pycudnn.convolution(pycudnn.from_numpy(x), pycudnn.from_numpy(w), padding=1, engine="graph",
                            benchmark=True, allow_tf32=False)
    return y.numpy()


def _err(got, ref):
    return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())


def _only_entry():
    from pycudnn.search.cache import caches

    items = caches["forward"].items()
    assert len(items) == 1
    return items[0]


def test_later_process_reuses_the_measured_plan(db):
    from pycudnn.search.cache import caches

    x, w, ref = _case()
    assert _err(_run(x, w), ref) < 2e-5
    params, first = _only_entry()
    data = db.lookup(params)
    assert data is not None and data["engine_id"] == first.plan.engine_id
    assert "plan_json" not in data  # plans are rebuilt from engine id and knobs, never from JSON

    _new_process(db)
    assert _err(_run(x, w), ref) < 2e-5
    _, again = _only_entry()
    assert caches["forward"].searches == 0
    assert again.source == "tuning-db" and again.plan.key == first.plan.key


CANARY = 12345.0


def _guarded_run(x, w):
    """The convolution of ``_run`` with ``out=`` at the front of a buffer whose tail holds a
    canary (a redzone, as TensorFlow's autotuner keeps): returns (output, canary values changed)."""
    import pycudnn
    from pycudnn.runtime import memory
    from pycudnn.runtime.tensor import tensor_from_pointer

    n_out = x.shape[0] * w.shape[0] * x.shape[2] * x.shape[3]
    guard = pycudnn.from_numpy(np.full(n_out * 5, CANARY, np.float32))
    y = tensor_from_pointer(guard.ptr, (x.shape[0], w.shape[0]) + x.shape[2:], "float32", owner=guard)
    pycudnn.convolution(pycudnn.from_numpy(x), pycudnn.from_numpy(w), out=y, padding=1,
                        engine="graph", benchmark=True, allow_tf32=False)
    memory.synchronize()
    got = guard.numpy()
    return got[:n_out].reshape(y.shape), int(np.count_nonzero(got[n_out:] != CANARY))


def test_plan_json_of_another_convolution_is_never_run(db):
    """A record whose plan JSON (and engine id) are those of a 4x larger convolution, stored
    under a small convolution's key: the plan is not deserialized, nothing is written past the
    output, and the result is the small convolution's."""
    import pycudnn
    from pycudnn import get_handle

    rng = np.random.default_rng(5)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    big = rng.standard_normal((1, 8, 64, 64)).astype(np.float32)
    small = rng.standard_normal((1, 8, 32, 32)).astype(np.float32)
    _run(big, w)
    _, big_rec = _only_entry()
    big_rec.finalize(get_handle(0, 0))
    try:
        big_json = big_rec.plan.json()
    except pycudnn.CudnnError:
        big_json = '{"not": "a plan"}'  # this engine has no JSON form: the forged field still is one
    pycudnn.clear_caches()
    _run(small, w)
    params, _ = _only_entry()
    data = db.lookup(params)
    data.update(engine_id=big_rec.plan.engine_id, knobs=[list(k) for k in big_rec.plan.key[1]],
                plan_json=big_json, time_ms=0.0)
    db.store(params, data)

    _new_process(db)
    ref = R.conv_forward(small.astype(np.float64), w.astype(np.float64), (1, 1), (1, 1), (1, 1), 1)
    out, changed = _guarded_run(small, w)
    assert changed == 0
    assert _err(out, ref) < 2e-5
    _, rec = _only_entry()
    assert rec.plan.config.mode != "json"
    assert tuple(rec.plan.graph.specs["y"].shape) == (1, 8, 32, 32)  # built on this call's graph


@pytest.mark.parametrize("field, value", [
    ("engine_id", 100000), ("engine_id", -1), ("engine_id", "7"), ("graph", 5), ("graph", -1),
    ("knobs", [[1]]), ("knobs", "x"), ("knobs", [[10**30, 1]]),
])
def test_records_that_do_not_check_out_are_dropped_and_searched_again(db, field, value):
    from pycudnn.search.cache import caches

    import json

    x, w, ref = _case(6)
    _run(x, w)
    params, _ = _only_entry()
    # edit the file itself, as another machine or user could (store() refuses malformed records)
    with open(db.path()) as f:
        doc = json.load(f)
    assert len(doc["entries"]) == 1
    doc["entries"][0]["record"][field] = value
    with open(db.path(), "w") as f:
        json.dump(doc, f)

    _new_process(db)
    out, changed = _guarded_run(x, w)
    assert changed == 0 and _err(out, ref) < 2e-5
    _, rec = _only_entry()
    assert rec.source != "tuning-db" and caches["forward"].searches == 1
    stored = db.lookup(params)
    assert stored is None or stored.get(field) != value  # dropped (or replaced by the new search)


def test_a_nondeterministic_record_is_not_used_for_a_deterministic_key(db):
    """Whatever a v7 record claims, determinism is what cuDNN's heuristics say of the algorithm."""
    import pycudnn
    from pycudnn.search.cache import caches
    from pycudnn._types import BwdFilterAlgo

    rng = np.random.default_rng(8)
    x = rng.standard_normal((4, 16, 14, 14)).astype(np.float32)
    dy = rng.standard_normal((4, 16, 14, 14)).astype(np.float32)
    ref = R.conv_backward_filter(x.astype(np.float64), dy.astype(np.float64), (16, 16, 3, 3),
                                 (1, 1), (1, 1), (1, 1), 1)
    t = pycudnn.from_numpy

    def run():
        return pycudnn.convolution_backward_filter(t(x), t(dy), (16, 16, 3, 3), padding=1,
                                                   engine="v7", benchmark=True, deterministic=True,
                                                   allow_tf32=False).numpy()
    assert _err(run(), ref) < 2e-5
    params, _ = caches["backward_filter"].items()[0]
    db.store(params, {"algo": int(BwdFilterAlgo.ALGO_0), "math_type": 3, "workspace": 0,
                      "time_ms": 0.0, "deterministic": True})  # ALGO_0 uses atomics
    _new_process(db)
    assert _err(run(), ref) < 2e-5
    _, rec = caches["backward_filter"].items()[0]
    assert rec.algo != BwdFilterAlgo.ALGO_0 and rec.source == "find"


def test_plans_run_from_several_threads_at_once(db):
    """One finalized plan (shared through the benchmark cache) executed by 8 threads at the same
    moment, each on its own stream and handle, gives every thread its own right result."""
    import threading

    import pycudnn
    from pycudnn.search.cache import caches
    from pycudnn.runtime import memory

    rng = np.random.default_rng(9)
    w = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    xs = [rng.standard_normal((4, 16, 24, 24)).astype(np.float32) for _ in range(8)]
    refs = [R.conv_forward(x.astype(np.float64), w.astype(np.float64), (1, 1), (1, 1), (1, 1), 1)
            for x in xs]
    pycudnn.convolution(pycudnn.from_numpy(xs[0]), pycudnn.from_numpy(w), padding=1,
                        engine="graph", benchmark=True, allow_tf32=False)  # the one search
    wd = pycudnn.from_numpy(w)
    xds = [pycudnn.from_numpy(x) for x in xs]
    memory.synchronize()
    barrier = threading.Barrier(len(xs))
    errors: list = []
    results: dict = {}

    # imported here, once: eight threads importing cuda.core for the first time at once can see
    # its package half initialized (pycudnn itself no longer imports it)
    from cuda.core import Device

    def worker(i):
        try:
            dev = Device(0)
            dev.set_current()
            s = dev.create_stream()
            barrier.wait(timeout=120)  # a worker that failed before it must not hang the rest
            outs = [pycudnn.convolution(xds[i], wd, padding=1, engine="graph", benchmark=True,
                                        allow_tf32=False, stream=s) for _ in range(50)]
            s.sync()
            results[i] = [o.numpy() for o in outs[::10]]
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    memory.synchronize()
    assert not errors, errors
    assert caches["forward"].searches == 1  # every thread replayed the same plan
    assert len(results) == len(xs)
    for i, outs in results.items():
        for o in outs:
            assert _err(o, refs[i]) < 2e-5, i


# ---- preload: the database's records made ready before the first call ------------------------------

def _calls():
    """Convolutions of several kinds (both engines, three directions, a fused epilogue) and their
    float64 references: (name, run() -> numpy result, reference, tolerance)."""
    import pycudnn

    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 8, 10, 10)).astype(np.float32)
    w = rng.standard_normal((12, 8, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((2, 12, 10, 10)).astype(np.float32)
    z = rng.standard_normal((2, 12, 10, 10)).astype(np.float32)
    b = rng.standard_normal(12).astype(np.float32)
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
    geo = ((1, 1), (1, 1), (1, 1), 1)
    fwd = R.conv_forward(x64, w64, *geo)
    t = pycudnn.from_numpy
    flags = dict(padding=1, benchmark=True, allow_tf32=False)
    cases = []
    for engine in ("graph", "v7"):
        cases += [
            (f"{engine} fwd", lambda e=engine: pycudnn.convolution(t(x), t(w), engine=e, **flags).numpy(),
             fwd, 2e-5),
            (f"{engine} dgrad", lambda e=engine: pycudnn.convolution_backward_data(
                t(dy), t(w), x.shape, engine=e, **flags).numpy(),
             R.conv_backward_data(dy64, w64, x.shape, *geo), 2e-5),
            (f"{engine} wgrad", lambda e=engine: pycudnn.convolution_backward_filter(
                t(x), t(dy), w.shape, engine=e, **flags).numpy(),
             R.conv_backward_filter(x64, dy64, w.shape, *geo), 2e-5),
        ]
    # the fused epilogue in half precision, channels-last (what cuDNN's fused engines take)
    h = lambda a: pycudnn.from_numpy(a, dtype="float16", memory_format="channels_last")  # noqa: E731
    q = lambda a: a.astype(np.float16).astype(np.float64)  # noqa: E731
    fused_ref = np.maximum(R.conv_forward(q(x), q(w), *geo) + 0.5 * q(z) + q(b).reshape(1, -1, 1, 1), 0)
    cases.append(("graph add_relu", lambda: pycudnn.convolution_add_relu(
        h(x), h(w), h(z), alpha=0.5, bias=t(b.astype(np.float16)), engine="graph",
        **flags).numpy(), fused_ref, 5e-3))
    return cases


def _searches():
    from pycudnn.search.cache import caches

    return sum(c.searches for c in caches.values())


def test_preload_makes_the_first_calls_cache_hits(db, monkeypatch):
    import pycudnn

    cases = _calls()
    for name, run, ref, tol in cases:
        assert _err(run(), ref) < tol, name
    stored = len(db.entries())
    assert stored == len(cases)

    _new_process(db)
    report = pycudnn.preload()
    assert isinstance(report, pycudnn.PreloadReport)
    assert (report.applicable, report.restored, report.launched) == (stored, stored, stored), report
    assert report.dropped == report.skipped == report.already_cached == 0
    assert "preloaded" in str(report)

    # the first calls now neither search nor read the database: every record is in the cache
    def no_lookup(params):
        raise AssertionError(f"looked up the database for {params.short()}")
    monkeypatch.setattr(db, "lookup", no_lookup)
    for name, run, ref, tol in cases:
        assert _err(run(), ref) < tol, name
    assert _searches() == 0

    again = pycudnn.preload()  # everything is cached already: nothing is rebuilt twice
    assert (again.already_cached, again.restored) == (stored, 0)


def test_preload_without_launching_and_within_a_memory_budget(db):
    import pycudnn

    cases = _calls()[:3]
    for _, run, _, _ in cases:
        run()
    _new_process(db)
    report = pycudnn.preload(max_bytes=0)  # no scratch: rebuilt, not launched
    assert (report.restored, report.launched) == (3, 0), report
    for name, run, ref, tol in cases:
        assert _err(run(), ref) < tol, name
    assert _searches() == 0

    _new_process(db)
    report = pycudnn.preload(launch=False)
    assert (report.restored, report.launched) == (3, 0), report
    with pytest.raises(ValueError, match="max_bytes"):
        pycudnn.preload(max_bytes=-1)


def test_preload_drops_stale_records_and_leaves_other_gpus_alone(db, tmp_path, caplog):
    import json

    import pycudnn

    x, w, ref = _case(3)
    _run(x, w)
    params, _ = _only_entry()
    data = db.lookup(params)
    # a second record for another GPU model (as merged from a team's file) ...
    exported = tmp_path / "other.json"
    db.export(exported)
    doc = json.loads(exported.read_text())
    doc["entries"][0]["gpu"]["name"] = "Some Other GPU"
    exported.write_text(json.dumps(doc))
    assert db.merge(exported) == 1
    # ... and this GPU's record made stale (an engine this cuDNN does not have)
    data["engine_id"] = 100000
    db.store(params, data)
    assert len(db.entries()) == 2

    _new_process(db)
    with caplog.at_level("WARNING", logger="pycudnn"):
        report = pycudnn.preload()
    assert (report.applicable, report.dropped, report.restored) == (1, 1, 0), report
    assert "dropping the record" in caplog.text
    names = [e["gpu"]["name"] for e in db.entries()]
    assert names == ["Some Other GPU"]  # the stale record is gone, the other GPU's is kept
    assert _err(_run(x, w), ref) < 2e-5  # and the call searches again
    assert _searches() == 1


def test_preload_does_nothing_with_the_database_off(db):
    import pycudnn

    x, w, _ = _case(4)
    _run(x, w)
    _new_process(db)
    with pycudnn.flags(tuning_db=False):
        report = pycudnn.preload()
    assert report.applicable == report.restored == 0


def test_preload_in_a_thread_while_the_main_thread_convolves(db):
    import threading

    import pycudnn

    cases = _calls()
    for _, run, _, _ in cases:
        run()
    _new_process(db)
    reports = []
    t = threading.Thread(target=lambda: reports.append(pycudnn.preload()))
    t.start()
    for name, run, ref, tol in cases:  # races the preload for the same keys
        assert _err(run(), ref) < tol, name
    t.join()
    r = reports[0]
    assert r.restored + r.already_cached == len(cases) and r.dropped == r.skipped == 0, r
    assert _searches() == 0


def test_device_identity_agrees_with_the_cuda_runtimes_device_properties(db):
    from cuda.bindings import runtime as rt

    from pycudnn.runtime.memory import device_count

    for device in range(device_count()):
        err, prop = rt.cudaGetDeviceProperties(device)
        assert int(err) == 0, err
        name = prop.name
        if isinstance(name, (bytes, bytearray)):
            name = bytes(name).split(b"\0", 1)[0].decode("utf-8", "replace")
        ident = db.device_identity(device)
        assert ident == {"name": str(name).strip(),
                         "compute_capability": [int(prop.major), int(prop.minor)],
                         "sm_count": int(prop.multiProcessorCount)}
        assert db.device_identity(device) is ident  # asked of the driver once per device
