"""The iterator that tries candidates in order: the reference's ``AlgoIterator::try_all``.

`try_all()` runs the cached record first (searched again when it runs out of memory), else the
tuning database's record for the key, else every candidate of the engine in order, skipping those
that run out of memory or fail inside cuDNN, caching the first that succeeds (and keeping a
measured one in the tuning database); when all fail it raises `NoAlgorithmError` listing each
candidate and why.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

from ..engines.contract import Engine
from ..engines.problem import ConvolutionArgs
from ..errors import CudnnError, NoAlgorithmError, OutOfMemoryError
from .cache import BenchmarkCache, caches

__all__ = ["try_all"]

log = logging.getLogger("pycudnn")


def try_all(args: ConvolutionArgs, engine: Engine, cache: BenchmarkCache | None = None) -> Any:
    """Run the convolution with the first record that works; return that record.

    Order: the cached record (on out-of-memory, search again); else the engine's candidates
    (defaults only when deterministic without benchmark), skipping candidates above the workspace
    limit, those that run out of memory, and those that fail inside cuDNN. The first success is
    cached. One search per key at a time.
    """
    params = args.params
    if cache is None:
        cache = caches[params.direction]
    # Conv_v7's rule: deterministic without benchmark runs only the default algorithm (uncached).
    only_default = params.deterministic and not args.benchmark and engine.deterministic_uses_default
    failed_cached = None
    if not only_default:
        record = cache.get(params)
        if record is not None:
            try:
                engine.run(args, record)
                return record
            except OutOfMemoryError:
                failed_cached = record  # search again: the next candidate may need less memory

    failures: list[tuple[str, str]] = []
    with cache.search_lock(params):
        if not only_default:
            # Another thread may have finished the search while this one waited for the lock.
            record = cache.get(params)
            if record is not None and record is not failed_cached:
                try:
                    engine.run(args, record)
                    return record
                except OutOfMemoryError as exc:
                    failures.append((record.describe(), f"OutOfMemoryError: {exc}"))
            if args.benchmark and failed_cached is None:
                record = _from_tuning_db(args, engine)
                if record is not None:
                    cache.insert(params, record)
                    return record
        if only_default:
            candidates: Iterable[Any] = engine.default_candidates(args)
        else:
            cache.searches += 1
            log.debug("searching (%s, %s): %s", engine.name,
                      "benchmark" if args.benchmark else "heuristics", params.short())
            candidates = engine.candidates(args)
        limit = params.workspace_limit
        for record in candidates:
            if limit is not None and record.workspace > limit:
                failures.append((record.describe(),
                                 f"needs a workspace of {record.workspace} B, above workspace_limit={limit}"))
                continue
            try:
                engine.run(args, record)
            except (OutOfMemoryError, CudnnError) as exc:
                failures.append((record.describe(), f"{type(exc).__name__}: {_first_line(exc)}"))
                log.debug("candidate failed, trying the next: %s: %s", record.describe(),
                          failures[-1][1])
                continue
            if not only_default:
                cache.insert(params, record)
                if args.benchmark:
                    to_tuning_db(args, engine, record)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("chose %s for %s%s", record.describe(), params.short(),
                          f" after {len(failures)} failed candidate(s)" if failures else "")
            return record
    lines = [f"  - {what}: {why}" for what, why in failures] or ["  (no candidate was offered)"]
    raise NoAlgorithmError(
        f"unable to find a valid cuDNN algorithm to run the convolution ({params.short()}); "
        f"candidates tried:\n" + "\n".join(lines), failures)


# ---- the persistent tuning database hooks ---------------------------------------------------------
# pycudnn.tuning.db owns the file; the engines own what a record is (serialize / restore). Only a
# measured search reads or writes it, so it is imported then: a heuristics call never loads the
# database's modules (file locking, JSON, hashing).

def _database(args: ConvolutionArgs) -> Any:
    """``pycudnn.tuning.db`` when this call may use the database and it is on, else None."""
    if not args.tuning_db:
        return None
    from ..tuning import db as tuning_db

    return tuning_db if tuning_db.enabled() else None


def _from_tuning_db(args: ConvolutionArgs, engine: Engine) -> Any:
    """A record measured by an earlier process for this key, rebuilt and run once; else None.

    A record that does not check out for this key, no longer rebuilds or fails to run (driver or
    library changed, hand-edited, imported from elsewhere) is dropped and logged, and the search
    runs as if it had never been there.
    """
    tuning_db = _database(args)
    if tuning_db is None:
        return None
    data = tuning_db.lookup(args.params)
    if data is None:
        return None
    try:
        record = engine.restore(args, data)
        engine.run(args, record)
    except OutOfMemoryError:
        return None  # memory is short now: search this time, keep the record for later
    except Exception as exc:  # a record from disk may be stale or hand-edited: never fatal
        log.warning("tuning database: dropping the record for %s (%s: %s); searching again",
                    args.params.short(), type(exc).__name__, _first_line(exc))
        tuning_db.drop(args.params)
        return None
    log.debug("tuning database: reused %s for %s", record.describe(), args.params.short())
    return record


def to_tuning_db(args: ConvolutionArgs, engine: Engine, record: Any) -> None:
    """Store the record a measured search chose in the tuning database, where one is on.
    Public as a seam for tests and tooling."""
    tuning_db = _database(args)
    if tuning_db is None:
        return
    try:
        tuning_db.store(args.params, engine.serialize(record))
    except Exception as exc:  # noqa: BLE001 - a read-only disk or a bad file must not fail the call
        log.warning("tuning database: could not store a record (%s: %s)", type(exc).__name__,
                    _first_line(exc))


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.split("\n", 1)[0]
