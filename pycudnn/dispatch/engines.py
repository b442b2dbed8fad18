"""The engines by name, and what acts on every engine and cache at once.

`strategy_for` gives the engine a call's ``engine`` flag names
(``"v7"``: ``pycudnn.search.algos.V7Search``, ``"graph"``:
``pycudnn.search.graph_engine.GraphSearch``); `clear_caches`,
`set_cache_limit` and
`benchmark_cache` act on every engine's state, the benchmark
caches and the remembered calls. This module sits above both engines, so neither imports the other.
"""

from __future__ import annotations

from typing import Any

from ..search.algos import V7Search, caches
from ..search.engine import Engine
from ..search.graph_engine import GraphSearch
from . import prepared

__all__ = ["strategy_for", "register_strategy", "clear_caches", "set_cache_limit",
           "benchmark_cache", "ENGINES"]

#: the engines by the name the ``engine`` flag uses
ENGINES: dict[str, Engine] = {"v7": V7Search(), "graph": GraphSearch()}


def register_strategy(engine: Engine) -> None:
    """Make an engine available under ``engine.name`` (the ``engine`` flag's value)."""
    ENGINES[engine.name] = engine


def strategy_for(engine: str) -> Engine:
    """The engine the ``engine`` flag names."""
    found = ENGINES.get(engine)
    if found is None:
        raise ValueError(f"engine: expected one of {sorted(ENGINES)}, got {engine!r}")
    return found


def benchmark_cache() -> list[dict[str, Any]]:
    """The cached choices of every direction, one dict per entry (for display and debugging)."""
    rows = []
    for direction, cache in caches.items():
        for params, record in cache.items():
            rows.append({
                "direction": direction,
                "engine": params.engine,
                "fused": bool(params.epilogue),
                "epilogue": params.epilogue,
                "params": params,
                "choice": record.describe(),
                "workspace": record.workspace,
            })
    return rows


def set_cache_limit(entries: int | None) -> None:
    """Bound every benchmark cache to ``entries`` records per direction (LRU; None: unbounded),
    and the map of remembered call signatures to as many prepared convolutions."""
    if entries is not None and (isinstance(entries, bool) or not isinstance(entries, int) or entries < 1):
        raise ValueError(f"entries: expected None or a positive int, got {entries!r}")
    for cache in caches.values():
        cache.set_maxsize(entries)
    prepared.set_limit(entries)


def clear_caches() -> None:
    """Forget every cached choice, every engine's per-key state and every remembered call."""
    for cache in caches.values():
        cache.clear()
    for engine in ENGINES.values():
        engine.clear()
    prepared.clear_fast_calls()
