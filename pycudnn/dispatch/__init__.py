"""Layer 5, between the public functions and the engines: the engine registry and the
caches acting on every engine, prepared (replayed) convolutions, argument checks shared by
full and replayed calls, and preloading the tuning database."""
