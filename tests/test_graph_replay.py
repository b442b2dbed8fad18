"""When a repeated launch is captured (pycudnn.runtime.memory.replay.Replays), without a GPU:
the count per argument tuple, the settings and their checks, a refused plan, the build limit.
The captures themselves are tested on a GPU (test_graph_replay_gpu.py)."""

from __future__ import annotations

import pytest

from pycudnn.runtime.memory import replay


@pytest.fixture(autouse=True)
def _settings():
    before = replay.settings()
    yield
    replay.configure(**before)


def test_a_key_is_due_after_its_plain_launches():
    replay.configure(enabled=True, after=2)
    r = replay.Replays()
    assert [r.due(("a",)) for _ in range(4)] == [False, False, True, True]
    assert r.due(("b",)) is False  # counted apart


def test_after_zero_captures_the_first_launch():
    replay.configure(enabled=True, after=0)
    assert replay.Replays().due("k") is True


def test_nothing_is_due_when_off_or_refused():
    replay.configure(enabled=False, after=0)
    assert replay.Replays().due("k") is False
    replay.configure(enabled=True)
    r = replay.Replays()
    r.refused = "the capture failed"
    assert r.due("k") is False


def test_a_plan_stops_capturing_at_max_builds(monkeypatch):
    replay.configure(enabled=True, after=0, max_builds=2, capacity=1)
    made = []
    monkeypatch.setattr(replay, "capture", lambda run, device: made.append(run) or object())
    r = replay.Replays()
    for key in ("a", "b"):
        assert r.due(key)
        assert r.build(key, lambda s: None, 0) is not None
    assert list(r.graphs) == ["b"]  # capacity 1: the older graph dropped
    assert r.due("c") is False and len(made) == 2


def test_a_failed_capture_refuses_the_plan_and_says_why(monkeypatch):
    replay.configure(enabled=True, after=0)

    def fails(run, device):
        raise RuntimeError("cuStreamBeginCapture: CUDA_ERROR_NOT_SUPPORTED")

    monkeypatch.setattr(replay, "capture", fails)
    r = replay.Replays()
    refused = replay.stats()["refused"]
    assert r.build("k", lambda s: None, 0) is None
    assert "CUDA_ERROR_NOT_SUPPORTED" in r.refused
    assert replay.stats()["refused"] == refused + 1
    assert r.due("k") is False and not r.graphs


def test_counts_of_pointers_that_never_repeat_stay_bounded():
    replay.configure(enabled=True, after=2)
    r = replay.Replays()
    for i in range(1000):
        r.due(i)
    assert r.counted <= 64


@pytest.mark.parametrize("name,value", [("after", -1), ("capacity", 0), ("max_builds", 0),
                                        ("after", 1.5), ("capacity", True)])
def test_configure_refuses_bad_values_naming_them(name, value):
    with pytest.raises(ValueError, match=name):
        replay.configure(**{name: value})


def test_clear_forgets_graphs_in_place():
    r = replay.Replays()
    graphs = r.graphs
    graphs["k"] = object()
    r.clear()
    assert r.graphs is graphs and not graphs


@pytest.mark.parametrize("value,enabled", [(None, False), ("1", True), ("0", False)])
def test_replay_is_off_unless_the_environment_asks(value, enabled):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYCUDNN_GRAPH_REPLAY"}
    if value is not None:
        env["PYCUDNN_GRAPH_REPLAY"] = value
    code = "from pycudnn.runtime.memory import replay; print(replay.settings()['enabled'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == str(enabled)


class _CaptureDriver:
    """Stands in for libcuda (absent here) in the capture's bookkeeping: which calls were made,
    in order, and what the captured graph holds."""

    def __init__(self, node_types):
        self.calls = []
        self.node_types = node_types

    def _ok(self, name, *args):
        self.calls.append(name)
        return 0

    def cuStreamCreate(self, out, flags):
        out._obj.value = 0x5000
        return self._ok("cuStreamCreate")

    def cuStreamBeginCapture(self, stream, mode):
        assert mode == replay._driver.CAPTURE_MODE_THREAD_LOCAL
        return self._ok("cuStreamBeginCapture")

    def cuStreamEndCapture(self, stream, out):
        out._obj.value = 0x6000
        return self._ok("cuStreamEndCapture")

    def cuGraphGetNodes(self, graph, nodes, count):
        if nodes is not None:
            for i in range(len(self.node_types)):
                nodes[i] = 0x7000 + i
        count._obj.value = len(self.node_types)
        return self._ok("cuGraphGetNodes")

    def cuGraphNodeGetType(self, node, out):
        out._obj.value = self.node_types[node - 0x7000]
        return 0

    def cuGraphInstantiateWithFlags(self, out, graph, flags):
        out._obj.value = 0x8000
        return self._ok("cuGraphInstantiate")

    def cuThreadExchangeStreamCaptureMode(self, mode):
        return 0

    def cuGraphDestroy(self, graph):
        return self._ok("cuGraphDestroy")

    def cuGraphExecDestroy(self, exec_handle):
        return self._ok("cuGraphExecDestroy")

    def cuStreamDestroy(self, stream):
        return 0

    def error_text(self, code):
        return f"CUresult {code}"


@pytest.fixture
def capture_driver(monkeypatch):
    import threading

    def make(node_types):
        drv = _CaptureDriver(node_types)
        monkeypatch.setattr(replay._driver, "loaded", drv)
        monkeypatch.setattr(replay, "_tls", threading.local())
        return drv
    return make


def test_a_launch_that_raises_during_capture_ends_the_capture_and_frees_the_graph(capture_driver):
    drv = capture_driver([replay._driver.GRAPH_NODE_KERNEL])

    def run(stream):
        raise ValueError("the launch failed")

    with pytest.raises(ValueError, match="the launch failed"):
        replay.capture(run, 0)
    assert drv.calls == ["cuStreamCreate", "cuStreamBeginCapture", "cuStreamEndCapture",
                         "cuGraphDestroy"]


def test_a_graph_with_a_copy_node_is_refused_and_freed(capture_driver):
    drv = capture_driver([replay._driver.GRAPH_NODE_KERNEL, 1])  # 1: CU_GRAPH_NODE_TYPE_MEMCPY
    with pytest.raises(RuntimeError, match="node of type 1"):
        replay.capture(lambda stream: None, 0)
    assert "cuGraphInstantiate" not in drv.calls and drv.calls[-1] == "cuGraphDestroy"


def test_a_captured_kernel_is_instantiated_and_its_graph_freed(capture_driver):
    drv = capture_driver([replay._driver.GRAPH_NODE_KERNEL, replay._driver.GRAPH_NODE_MEMSET])
    seen = []
    graph = replay.capture(seen.append, 0)
    assert seen == [0x5000]  # run got the private stream
    assert graph.exec == 0x8000
    assert drv.calls[-2:] == ["cuGraphInstantiate", "cuGraphDestroy"]
    del graph
    assert drv.calls[-1] == "cuGraphExecDestroy"
