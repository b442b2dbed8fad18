"""The tuning database with the real engines on a GPU: a later "process" (caches and the
database's memory cleared, the file kept) reuses the measured choice without searching, from the
plan's JSON where a record carries one, and a record whose JSON no longer loads is rebuilt from
its engine id and knobs instead of being searched again."""

from __future__ import annotations

import numpy as np
import pytest

import reference as R

pytestmark = pytest.mark.gpu


@pytest.fixture
def db(tmp_path, monkeypatch):
    import pycudnn
    from pycudnn import tuning_db
    from pycudnn.configuration import config

    monkeypatch.setenv("PYCUDNN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PYCUDNN_TUNING_DB", raising=False)
    config.reset()
    pycudnn.clear_caches()
    tuning_db._reset_for_tests()
    yield tuning_db
    pycudnn.clear_caches()
    tuning_db._reset_for_tests()
    config.reset()


def _new_process(tuning_db) -> None:
    import pycudnn

    pycudnn.clear_caches()
    tuning_db._reset_for_tests()


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
    from pycudnn import algos

    items = algos.caches["forward"].items()
    assert len(items) == 1
    return items[0]


def test_later_process_reuses_the_measured_plan(db):
    from pycudnn import algos

    x, w, ref = _case()
    assert _err(_run(x, w), ref) < 2e-5
    params, first = _only_entry()
    data = db.lookup(params)
    assert data is not None and data["engine_id"] == first.plan.engine_id
    assert ("plan_json" in data) == first.plan.runtime_compiled

    _new_process(db)
    assert _err(_run(x, w), ref) < 2e-5
    _, again = _only_entry()
    assert algos.caches["forward"].searches == 0
    assert again.source == "tuning-db" and again.plan.key == first.plan.key


def test_record_with_plan_json_finalizes_from_it(db):
    from pycudnn import algos

    x, w, ref = _case(1)
    _run(x, w)
    params, first = _only_entry()
    data = db.lookup(params)
    data["plan_json"] = first.plan.json()  # as stored for a runtime-compiled plan
    db.store(params, data)

    _new_process(db)
    assert _err(_run(x, w), ref) < 2e-5
    _, again = _only_entry()
    assert algos.caches["forward"].searches == 0
    assert again.source == "tuning-db" and again.plan.config.mode == "json"
    assert again.plan.engine_id == first.plan.engine_id


def test_plan_json_that_does_not_load_is_rebuilt_from_the_engine_id(db, caplog):
    from pycudnn import algos

    x, w, ref = _case(2)
    _run(x, w)
    params, first = _only_entry()
    data = db.lookup(params)
    data["plan_json"] = '{"not": "a plan"}'
    db.store(params, data)

    _new_process(db)
    with caplog.at_level("INFO", logger="pycudnn"):
        assert _err(_run(x, w), ref) < 2e-5
    _, again = _only_entry()
    assert algos.caches["forward"].searches == 0  # rebuilt, not searched
    assert again.source == "tuning-db" and again.plan.config.mode != "json"
    assert again.plan.key == first.plan.key
    assert "did not load" in caplog.text
    assert db.lookup(params) is not None  # the record is kept


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
    from pycudnn import algos

    return sum(c.searches for c in algos.caches.values())


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
    data.pop("plan_json", None)
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
