"""Layer 5, choosing a record: the benchmark caches, the iterator that tries candidates in order,
and the tuning database that keeps measured choices across processes."""
