"""The graph engine's heuristic candidates, on scripted heuristics (no GPU).

cuDNN's heuristics need a handle, so here each mode's engine configs come from a scripted source
in place of `iter_engine_configs`; the engine's deduplication across modes, the note filter, the
cache of records per key and the order are pycudnn's real ones. Checked: the order and the
dropped configs are those of the rule (modes A, B, FALLBACK; a config an earlier mode offered is
skipped; notes refuse the rest), a config is described only when a caller reaches it, and a later
search of the key (or another thread) gets the same records.
"""

from __future__ import annotations

import threading
import types

import pytest

from pycudnn.cudnn.graph.plan import EngineConfig
from pycudnn.engines import graph as GE
from pycudnn.engines.problem import ConvolutionArgs, ConvolutionParams
from pycudnn.errors import NoAlgorithmError
from pycudnn.ffi.backend import NumericalNote

DOWN, NONDET, TC = (NumericalNote.DOWN_CONVERT_INPUTS, NumericalNote.NONDETERMINISTIC,
                    NumericalNote.TENSOR_CORE)
_GRAPH = types.SimpleNamespace(uids=(1, 2, 3), alignments=(16, 16, 16), specs={"x": 0, "w": 0, "y": 0},
                               epilogue=None, description="scripted graph")


class _Descriptor:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _config(engine_id: int, *notes: int) -> EngineConfig:
    return EngineConfig(_Descriptor(), _GRAPH, engine_id, ((0, engine_id % 3),), tuple(notes), (),
                        "", 0)


class _Source:
    """One mode's configs, handed out one at a time; counts how many were described."""

    def __init__(self, configs: list[EngineConfig], problems: list[str]) -> None:
        self._configs = list(configs)
        self.problems: list[str] = []
        self._later_problems = list(problems)
        self.described = 0

    def __iter__(self) -> "_Source":
        return self

    def __next__(self) -> EngineConfig:
        self.problems.extend(self._later_problems)  # a mode's failure shows up when it is asked
        self._later_problems = []
        if not self._configs:
            raise StopIteration
        self.described += 1
        return self._configs.pop(0)


class _Heuristics:
    """The scripted answers per mode, and the sources the engine asked for."""

    def __init__(self, by_mode: dict[str, list[EngineConfig]],
                 problems: dict[str, list[str]] | None = None) -> None:
        self.by_mode = by_mode
        self.problems = problems or {}
        self.asked: list[str] = []
        self.sources: dict[str, _Source] = {}
        self.lock = threading.Lock()

    def __call__(self, handle: int, g: object, modes: tuple[str, ...]) -> _Source:
        (mode,) = modes
        with self.lock:
            self.asked.append(mode)
            src = self.sources[mode] = _Source(self.by_mode.get(mode, []),
                                               self.problems.get(mode, []))
        return src


def _params(**over: object) -> ConvolutionParams:
    base = dict(direction="forward", device=0, cudnn_version=91900, dtype="float32",
                input_shape=(2, 4, 8, 8), input_strides=(256, 64, 8, 1),
                weight_shape=(8, 4, 3, 3), weight_format="NCHW",
                output_shape=(2, 8, 8, 8), output_strides=(512, 64, 8, 1),
                padding=(1, 1), stride=(1, 1), dilation=(1, 1), groups=1,
                deterministic=False, allow_tf32=True, workspace_limit=None, engine="graph",
                alignments=(16, 16, 16))
    base.update(over)
    return ConvolutionParams(**base)  # type: ignore[arg-type]


@pytest.fixture
def scripted(monkeypatch):
    def install(by_mode, problems=None):
        heur = _Heuristics(by_mode, problems)
        monkeypatch.setattr(GE, "iter_engine_configs", heur)

        def graphs(self, args, prep):
            prep.graphs = [_GRAPH]
            return prep.graphs

        monkeypatch.setattr(GE.GraphEngine, "_graphs", graphs)
        return heur
    return install


def _args(**over: object) -> ConvolutionArgs:
    return ConvolutionArgs(params=_params(**over), handle=0, stream=0, x=0, w=0, y=0)


def test_heuristic_candidates_follow_the_modes_skip_repeats_and_drop_by_notes(scripted):
    a = [_config(1), _config(2, DOWN), _config(3, TC)]
    b = [_config(3, TC), _config(4, NONDET), _config(5)]
    fb = [_config(1), _config(6)]
    scripted({"A": a, "B": b, "FALLBACK": fb})
    engine = GE.GraphEngine()
    got = list(engine.candidates(_args(deterministic=True, allow_tf32=False)))
    assert [r.plan.engine_id for r in got] == [1, 5, 6]
    assert [r.mode for r in got] == ["A", "B", "FALLBACK"]
    prep = engine.key_graphs(_args(deterministic=True, allow_tf32=False))
    assert prep.dropped == [(a[1].tag, "DOWN_CONVERT_INPUTS"),
                            (a[2].tag, "TENSOR_CORE with float32 and allow_tf32=False"),
                            (b[1].tag, "NONDETERMINISTIC with deterministic=True")]
    # refused and repeated configs are freed; the offered ones are kept by their plans
    assert [c.descriptor.closed for c in a + b + fb] == [False, True, True, True, True, False,
                                                        True, False]


def test_a_heuristics_search_describes_configs_only_up_to_the_first_usable_one(scripted):
    heur = scripted({"A": [_config(2, DOWN), _config(1), _config(3)], "B": [_config(4)]})
    first = next(iter(GE.GraphEngine().candidates(_args())))
    assert first.plan.engine_id == 1
    assert heur.asked == ["A"]  # mode B's heuristics never queried
    assert heur.sources["A"].described == 2


def test_a_later_search_of_the_key_gets_the_same_records_and_goes_on_where_it_stopped(scripted):
    heur = scripted({"A": [_config(1), _config(2)], "B": [_config(3)]})
    engine = GE.GraphEngine()
    first = next(iter(engine.candidates(_args())))
    again = list(engine.candidates(_args()))
    assert again[0] is first
    assert [r.plan.engine_id for r in again] == [1, 2, 3]
    assert heur.asked == ["A", "B", "FALLBACK"]  # each mode asked once for the key
    assert heur.sources["A"].described == 2  # each config described once
    assert [r.plan.engine_id for r in engine.candidates(_args())] == [1, 2, 3]


def test_threads_searching_one_key_see_one_order_and_describe_each_config_once(scripted):
    heur = scripted({"A": [_config(i) for i in range(1, 30)],
                     "B": [_config(i) for i in range(20, 45)]})
    engine = GE.GraphEngine()
    barrier = threading.Barrier(4)
    seen: list[list[int]] = []

    def search() -> None:
        barrier.wait()
        seen.append([r.plan.engine_id for r in engine.candidates(_args())])

    threads = [threading.Thread(target=search) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [list(range(1, 45))] * 4
    assert heur.asked == ["A", "B", "FALLBACK"]
    assert heur.sources["A"].described == 29 and heur.sources["B"].described == 25


def test_a_failed_mode_is_reported_and_no_usable_config_raises_naming_the_drops(scripted):
    a = [_config(1, DOWN)]
    scripted({"A": a, "B": []}, problems={"B": ["heuristics mode B: CUDNN_STATUS_NOT_SUPPORTED"]})
    engine = GE.GraphEngine()
    with pytest.raises(NoAlgorithmError) as info:
        list(engine.candidates(_args()))
    assert "heuristics mode B: CUDNN_STATUS_NOT_SUPPORTED" in str(info.value)
    assert a[0].tag in str(info.value) and "DOWN_CONVERT_INPUTS" in str(info.value)
    lines = engine.describe_params(_params())
    assert "heuristics: heuristics mode B: CUDNN_STATUS_NOT_SUPPORTED" in lines
