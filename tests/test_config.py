"""Flags: global defaults, per-block overrides, nesting, threads and validation."""

from __future__ import annotations

import threading

import pytest

import pycudnn
from pycudnn.configuration import config, flags


@pytest.fixture(autouse=True)
def _reset():
    config.reset()
    yield
    config.reset()


def test_defaults_match_pytorch():
    assert config.benchmark is False
    assert config.deterministic is False
    assert config.allow_tf32 is True
    assert config.workspace_limit is None


def test_global_setting_and_block_override_nesting():
    config.benchmark = True
    with pycudnn.flags(benchmark=False, allow_tf32=False):
        assert config.benchmark is False and config.allow_tf32 is False
        with flags(allow_tf32=True, deterministic=True):
            assert config.allow_tf32 is True and config.deterministic is True
            assert config.benchmark is False
        assert config.allow_tf32 is False and config.deterministic is False
    assert config.benchmark is True and config.allow_tf32 is True


def test_block_restores_on_exception():
    with pytest.raises(RuntimeError):
        with flags(deterministic=True):
            raise RuntimeError("boom")
    assert config.deterministic is False


def test_block_is_per_thread():
    seen = {}
    inside = threading.Event()
    done = threading.Event()

    def other():
        inside.wait()
        seen["other"] = config.benchmark
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with flags(benchmark=True):
        inside.set()
        done.wait()
        seen["mine"] = config.benchmark
    t.join()
    assert seen == {"other": False, "mine": True}


def test_call_arguments_beat_flags_and_globals():
    config.allow_tf32 = False
    with flags(benchmark=True):
        got = config.resolve({"benchmark": False, "workspace_limit": 1024})
    assert got["benchmark"] is False and got["allow_tf32"] is False and got["workspace_limit"] == 1024


@pytest.mark.parametrize("name,value,exc,words", [
    ("benchmark", 1, TypeError, "benchmark: expected a bool"),
    ("allow_tf32", "yes", TypeError, "allow_tf32: expected a bool"),
    ("workspace_limit", -1, ValueError, "workspace_limit: expected None or a non-negative int"),
    ("engine", "fast", ValueError, "engine: expected one of"),
    ("benchmrk", True, TypeError, "unknown flag 'benchmrk'"),
])
def test_bad_flags_are_refused_with_the_name(name, value, exc, words):
    with pytest.raises(exc, match=words):
        with flags(**{name: value}):
            pass
    with pytest.raises(exc, match=words):
        config.resolve({name: value})
    if name != "benchmrk":
        with pytest.raises(exc, match=words):
            setattr(config, name, value)


def test_unknown_attribute():
    with pytest.raises(AttributeError, match="no flag"):
        config.speed  # noqa: B018
