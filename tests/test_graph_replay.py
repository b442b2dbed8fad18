"""Graph replay without a GPU (pycudnn.runtime.memory.replay): when a repeated launch is
captured (the count per argument tuple, the settings and their checks, a refused plan, the build
limit, the environment switch), the capture's bookkeeping with a libcuda stand-in, and the graph
engine's launcher dispatch over a stand-in plan. Real captures are tested on a GPU
(test_graph_replay_gpu.py)."""

from __future__ import annotations

import pytest

from pycudnn.runtime.memory import driver as DRV
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
        assert mode == DRV.CAPTURE_MODE_THREAD_LOCAL
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
    def make(node_types):
        drv = _CaptureDriver(node_types)
        monkeypatch.setattr(DRV, "loaded", drv)
        return drv
    return make


def _in_new_thread(fn):
    """``fn()`` on a thread of its own (its own private capture stream), its result or error."""
    import threading

    out = {}

    def body():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            out["error"] = exc
    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_a_launch_that_raises_during_capture_ends_the_capture_and_frees_the_graph(capture_driver):
    drv = capture_driver([DRV.GRAPH_NODE_KERNEL])

    def run(stream):
        raise ValueError("the launch failed")

    with pytest.raises(ValueError, match="the launch failed"):
        _in_new_thread(lambda: replay.capture(run, 0))
    assert drv.calls == ["cuStreamCreate", "cuStreamBeginCapture", "cuStreamEndCapture",
                         "cuGraphDestroy"]


def test_a_graph_with_a_copy_node_is_refused_and_freed(capture_driver):
    drv = capture_driver([DRV.GRAPH_NODE_KERNEL, 1])  # 1: CU_GRAPH_NODE_TYPE_MEMCPY
    with pytest.raises(RuntimeError, match="node of type 1"):
        _in_new_thread(lambda: replay.capture(lambda stream: None, 0))
    assert "cuGraphInstantiate" not in drv.calls and drv.calls[-1] == "cuGraphDestroy"


def test_a_captured_kernel_is_instantiated_and_its_graph_freed(capture_driver):
    drv = capture_driver([DRV.GRAPH_NODE_KERNEL, DRV.GRAPH_NODE_MEMSET])
    seen = []
    graph = _in_new_thread(lambda: replay.capture(seen.append, 0))
    assert seen == [0x5000]  # run got the private stream
    assert graph.exec == 0x8000
    assert drv.calls[-2:] == ["cuGraphInstantiate", "cuGraphDestroy"]
    del graph
    assert drv.calls[-1] == "cuGraphExecDestroy"


# ---- the graph engine's launcher, dispatching between plain launches and replays ------------

class _Graph:
    def __init__(self, log):
        self.log = log

    def launch(self, stream):
        self.log.append(("graph", stream))
        return True


@pytest.fixture
def launcher_parts(monkeypatch):
    """A graph engine launcher over a stand-in plan (the launch logic only; no cuDNN call)."""
    from types import SimpleNamespace

    from pycudnn.engines import graph as G

    log = []
    capturing = {"now": False}
    monkeypatch.setattr(G, "is_capturing", lambda stream: capturing["now"])
    monkeypatch.setattr(G, "thread_workspace", lambda nbytes, device, stream: 0xAA00)
    monkeypatch.setattr(G, "set_handle_stream", lambda h, s: log.append(("stream", s)))
    # a launch's own workspace (the one a capture needs): a stand-in pointer
    monkeypatch.setattr(G, "workspace", lambda nbytes, device, stream, cached: (0xBB00, None))

    def fake_capture(run, device):
        run(0xCA)  # the private stream
        return _Graph(log)

    monkeypatch.setattr(replay, "capture", fake_capture)

    def make(workspace):
        plan = SimpleNamespace(workspace_size=workspace, replays=replay.Replays(),
                               execute=lambda h, p, ws: log.append(("execute", ws)))
        record = SimpleNamespace(plan=plan)
        return G.GraphEngine().launcher(SimpleNamespace(device=0), record), plan
    return make, log, capturing


def test_with_replay_off_every_launch_is_plain_and_nothing_is_counted(launcher_parts):
    make, log, _ = launcher_parts
    replay.configure(enabled=False)
    launch, plan = make(0)
    for _ in range(5):
        launch(7, (1, 2, 3), 9)
    assert log == [("execute", 0)] * 5 and plan.replays.counted == 0 and not plan.replays.graphs


@pytest.mark.parametrize("workspace", [0, 4096])
def test_with_replay_on_the_third_launch_is_captured_and_later_ones_replayed(launcher_parts,
                                                                             workspace):
    make, log, _ = launcher_parts
    replay.configure(enabled=True, after=2)
    launch, plan = make(workspace)
    ws = 0xAA00 if workspace else 0
    for _ in range(4):
        launch(7, (1, 2, 3), 9)
    assert log == [("execute", ws), ("execute", ws),
                   ("stream", 0xCA), ("execute", ws), ("stream", 9),  # the capture
                   ("graph", 9),  # its graph does the third call's work
                   ("graph", 9)]
    assert len(plan.replays.graphs) == 1


def test_with_replay_on_a_captured_stream_gets_plain_launches(launcher_parts):
    make, log, capturing = launcher_parts
    replay.configure(enabled=True, after=0)
    launch, plan = make(4096)
    launch(7, (1, 2, 3), 9)  # captured and replayed
    log.clear()
    capturing["now"] = True  # the caller's own capture
    launch(7, (1, 2, 3), 9)
    assert log == [("execute", 0xBB00)]  # on a workspace of its own, no replay
    launch, plan = make(0)
    launch(7, (1, 2, 3), 9)
    assert log[-1] == ("execute", 0) and not plan.replays.graphs
