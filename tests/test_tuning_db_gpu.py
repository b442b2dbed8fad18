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
