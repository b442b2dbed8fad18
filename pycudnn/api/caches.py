"""What acts on every engine and cache at once.

`clear_caches`, `set_cache_limit` and `benchmark_cache` act on every engine's per-key state
(`pycudnn.engines.registry.ENGINES`), the benchmark caches (`pycudnn.search.cache.caches`)
and the remembered calls (`pycudnn.api.prepared`).
"""

from __future__ import annotations

from typing import Any

from . import prepared
from ..engines.registry import ENGINES
from ..search.cache import caches

__all__ = ["clear_caches", "set_cache_limit", "benchmark_cache"]


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
