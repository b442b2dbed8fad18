"""Layer 6, choosing a record: the benchmark caches, the iterator that tries candidates in order
(with the tuning database looked up before a search and written after it), and preloading the
tuning database's records before the first call."""
