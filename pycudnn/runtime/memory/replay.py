"""Launches replayed from CUDA graphs: a launch that repeats with the same arguments is captured
once into a CUDA graph on a private stream (`Replays`), and later calls launch that graph with
one ``cuGraphLaunch`` on the caller's stream instead of making the launch again."""

from __future__ import annotations

import logging
import os
import threading
from ctypes import byref, c_int, c_size_t, c_void_p
from typing import Any, Callable, Hashable

from . import bindings as _bindings
from . import driver as _driver
from .capture import relaxed_capture_mode

__all__ = ["Replays", "LaunchGraph", "configure", "settings", "stats"]

log = logging.getLogger("pycudnn")

#: node types a replayed launch may hold: kernels, fills and empty nodes read no host memory,
#: so a graph of them does on every replay what the captured launch did
_REPLAYABLE_NODES = frozenset({_driver.GRAPH_NODE_KERNEL, _driver.GRAPH_NODE_MEMSET,
                               _driver.GRAPH_NODE_EMPTY})

_settings: dict[str, Any] = {
    # off unless asked (PYCUDNN_GRAPH_REPLAY=1): while a capture is open, a device-wide
    # synchronize on another thread (torch.cuda.synchronize()) fails with "operation not
    # permitted when stream is capturing" (measured: 82 of 49,445 such calls beside captures)
    "enabled": os.environ.get("PYCUDNN_GRAPH_REPLAY", "0") == "1",
    "after": 2,        # plain launches of one argument tuple before it is captured
    "capacity": 16,    # graphs kept per plan (the oldest built dropped first)
    "max_builds": 32,  # captures per plan before it stops capturing (pointers that never settle)
}
_stats = {"built": 0, "refused": 0}
_lock = threading.Lock()


def configure(enabled: bool | None = None, after: int | None = None,
              capacity: int | None = None, max_builds: int | None = None) -> None:
    """Change when repeated launches are replayed from CUDA graphs (None keeps a setting).

    Args:
        enabled: replay at all (default False; ``PYCUDNN_GRAPH_REPLAY=1`` makes it True).
            Turn it on only where no other thread synchronizes the whole device
            (``torch.cuda.synchronize()``, ``cudaDeviceSynchronize``) while pycudnn calls run:
            CUDA refuses such a synchronize while a capture is open on any stream of the
            device, and a capture is open for some microseconds each time a repeated launch
            is captured (the capture is then given up and that plan launches plainly).
            A convolution's launcher is made when its call signature is first prepared: turn
            replay on before the calls it should serve, or call ``pycudnn.clear_caches()`` (and
            ``pycudnn.torch.clear_cache()``) after. Turning it off stops new captures at once;
            graphs already made keep replaying until the caches are cleared.
        after: plain launches of one argument tuple before it is captured (default 2: the
            third call with the same pointers replays).
        capacity: graphs kept per plan (default 16).
        max_builds: captures per plan before it captures no more (default 32), which bounds
            what pointers that never repeat for long can cost.

    Raises:
        ValueError: ``after`` below 0, ``capacity`` or ``max_builds`` below 1.
    """
    for name, value, least in (("after", after, 0), ("capacity", capacity, 1),
                               ("max_builds", max_builds, 1)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < least):
            raise ValueError(f"configure: {name} must be an int >= {least}, got {value!r}")
    for name, value in (("enabled", enabled), ("after", after), ("capacity", capacity),
                        ("max_builds", max_builds)):
        if value is not None:
            _settings[name] = bool(value) if name == "enabled" else value


def settings() -> dict[str, Any]:
    """The current settings (a copy)."""
    return dict(_settings)


def stats() -> dict[str, int]:
    """Graphs built and captures refused since the process started (a copy)."""
    return dict(_stats)


def _destroy(function: str, handle: int) -> None:
    """A finalizer's ``function(handle)`` through the driver: nothing once the interpreter exits
    (the driver reclaims it) or where the modules are already torn down."""
    try:
        if handle and not _bindings.shutting_down and _driver.loaded:
            getattr(_driver.loaded, function)(handle)
    except Exception:
        pass


class LaunchGraph:
    """An instantiated CUDA graph of one captured launch (``exec``, a ``CUgraphExec``),
    destroyed when the last reference goes (a graph still running is freed when it ends)."""

    __slots__ = ("exec",)

    def __init__(self, exec_handle: int) -> None:
        self.exec = exec_handle

    def launch(self, stream: int) -> bool:
        """Launch on ``stream``; False when the driver refused (nothing was queued)."""
        return _driver.loaded.cuGraphLaunch(self.exec, stream) == 0

    # _destroy bound as a default: at interpreter exit this module's globals may be gone first
    def __del__(self, _destroy: Callable[[str, int], None] = _destroy) -> None:
        _destroy("cuGraphExecDestroy", self.exec)
        self.exec = 0


class _CaptureStream:
    """This thread's private stream on one device, which captures are made on."""

    __slots__ = ("handle",)

    def __init__(self) -> None:
        out = c_void_p()
        err = _driver.loaded.cuStreamCreate(byref(out), _driver.STREAM_NON_BLOCKING)
        if err:
            raise RuntimeError(f"cuStreamCreate: {_driver.loaded.error_text(err)}")
        self.handle = int(out.value or 0)

    def __del__(self, _destroy: Callable[[str, int], None] = _destroy) -> None:
        _destroy("cuStreamDestroy", self.handle)
        self.handle = 0


_tls = threading.local()


def _capture_stream(device: int) -> int:
    streams = getattr(_tls, "streams", None)
    if streams is None:
        streams = _tls.streams = {}
    s = streams.get(device)
    if s is None:
        s = streams[device] = _CaptureStream()
    return s.handle


def capture(run: Callable[[int], None], device: int) -> LaunchGraph:
    """``run(stream)`` captured on this thread's private stream of ``device`` (current) in
    thread-local capture mode, instantiated. ``run`` queues the launch on the stream it is
    given and nothing else.

    Raises:
        RuntimeError: the capture or the instantiation failed, or the graph holds a node that
            could read host memory (a copy, a host function), which a replay would read again.
        Whatever ``run`` raises.
    """
    drv = _driver.loaded
    stream = _capture_stream(device)
    err = drv.cuStreamBeginCapture(stream, _driver.CAPTURE_MODE_THREAD_LOCAL)
    if err:
        raise RuntimeError(f"cuStreamBeginCapture: {drv.error_text(err)}")
    graph = c_void_p()
    try:
        run(stream)
    except BaseException:
        # always ended: a stream left capturing would take this thread's next launches
        if not drv.cuStreamEndCapture(stream, byref(graph)) and graph.value:
            drv.cuGraphDestroy(graph.value)
        raise
    err = drv.cuStreamEndCapture(stream, byref(graph))
    if err or not graph.value:
        raise RuntimeError(f"cuStreamEndCapture: {drv.error_text(err) if err else 'no graph'}")
    try:
        _check_nodes(drv, graph.value)
        exec_handle = c_void_p()
        # instantiating may load modules: never refused for, nor breaking, another thread's
        # capture in global mode
        with relaxed_capture_mode():
            err = drv.cuGraphInstantiateWithFlags(byref(exec_handle), graph.value, 0)
        if err or not exec_handle.value:
            raise RuntimeError(f"cuGraphInstantiateWithFlags: "
                               f"{drv.error_text(err) if err else 'no executable graph'}")
        return LaunchGraph(int(exec_handle.value))
    finally:
        drv.cuGraphDestroy(graph.value)


def _check_nodes(drv: Any, graph: int) -> None:
    count = c_size_t()
    err = drv.cuGraphGetNodes(graph, None, byref(count))
    if err:
        raise RuntimeError(f"cuGraphGetNodes: {drv.error_text(err)}")
    if not count.value:
        raise RuntimeError("the captured launch queued no work")
    nodes = (c_void_p * count.value)()
    err = drv.cuGraphGetNodes(graph, nodes, byref(count))
    if err:
        raise RuntimeError(f"cuGraphGetNodes: {drv.error_text(err)}")
    kind = c_int()
    for node in nodes[:count.value]:
        err = drv.cuGraphNodeGetType(node, byref(kind))
        if err:
            raise RuntimeError(f"cuGraphNodeGetType: {drv.error_text(err)}")
        if kind.value not in _REPLAYABLE_NODES:
            raise RuntimeError(f"the captured launch holds a graph node of type {kind.value} "
                               "(not a kernel, a fill or an empty node)")


class Replays:
    """One plan's launches replayed from CUDA graphs, keyed by the launch's arguments.

    The hot path reads ``graphs`` (key -> `LaunchGraph`) itself; a key not there is counted by
    `due()`, and once it has been launched plainly ``after`` times `build()` captures it.
    A key holds everything the launch reads that may change between calls (every device
    pointer, the workspace, the cuDNN handle): two calls with equal keys make the same launch,
    so the graph of one does the other's work. A plan whose capture failed once (or that
    reached ``max_builds``) captures no more and keeps launching plainly.
    """

    __slots__ = ("graphs", "_counts", "_builds", "refused", "_lock")

    def __init__(self) -> None:
        self.graphs: dict[Hashable, LaunchGraph] = {}
        self._counts: dict[Hashable, int] = {}
        self._builds = 0
        self.refused: str | None = None  # why this plan is not captured (None: it may be)
        self._lock = threading.Lock()

    def due(self, key: Hashable) -> bool:
        """Count a plain launch of ``key``: True when it should be captured now."""
        if self.refused is not None or not _settings["enabled"]:
            return False
        counts = self._counts
        n = counts.get(key, 0)
        if n >= _settings["after"]:
            return self._builds < _settings["max_builds"]
        if len(counts) >= 64:  # pointers that do not repeat: forget the old counts
            counts.clear()
        counts[key] = n + 1
        return False

    @property
    def counted(self) -> int:
        """How many argument tuples are being counted (at most 64)."""
        return len(self._counts)

    def build(self, key: Hashable, run: Callable[[int], None], device: int) -> LaunchGraph | None:
        """Capture ``run`` (see `capture`) as ``key``'s graph; None (and this plan refused
        from then on) when it cannot be captured."""
        self._counts.pop(key, None)
        try:
            graph = capture(run, device)
        except Exception as exc:
            self.refused = f"{type(exc).__name__}: {exc}"
            with _lock:
                _stats["refused"] += 1
            log.debug("graph replay: a launch was not captured: %s", self.refused)
            return None
        with self._lock:
            self._builds += 1
            graphs = self.graphs
            graphs[key] = graph
            while len(graphs) > _settings["capacity"]:
                graphs.pop(next(iter(graphs)))  # dropped: a thread launching it holds it
        with _lock:
            _stats["built"] += 1
        return graph

    def clear(self) -> None:
        """Forget every graph and count (a plan closing, its buffers reused)."""
        with self._lock:
            self.graphs.clear()  # in place: launchers hold the dict itself
            self._counts.clear()

