"""Layer 4, the problem and its engines: the direction table and cache key, the engine
contract, the legacy (v7) and graph engines, the search iterator and the tuning database."""
