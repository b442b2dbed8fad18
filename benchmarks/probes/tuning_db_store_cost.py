"""What one tuning-database store costs the host (no GPU needed): 300 distinct records stored
one after another into a fresh database, with the GPU's identity stood in; ms per store at a
few points of the file's growth, the mean, and a cProfile of the last 100 stores.

    PYTHONPATH=.:tests python3 benchmarks/probes/tuning_db_store_cost.py
"""
import cProfile
import os
import pstats
import tempfile
import time

os.environ["PYCUDNN_CACHE_DIR"] = tempfile.mkdtemp(prefix="pycudnn-store-cost-")

from pycudnn.configuration import config  # noqa: E402
from pycudnn.tuning import db  # noqa: E402
from test_tuning_db import H200, V7_RECORD, wide  # noqa: E402 - tests/ on PYTHONPATH

db.device_identity = lambda device: H200
config.reset()
db.forget()
params = [wide(i) for i in range(300)]
spent = []
prof = cProfile.Profile()
for i, p in enumerate(params):
    if i == 200:
        prof.enable()
    t0 = time.perf_counter()
    db.store(p, dict(V7_RECORD))
    spent.append(time.perf_counter() - t0)
prof.disable()
for i in (0, 10, 50, 100, 200, 299):
    print(f"store {i:3}: {spent[i] * 1e3:.3f} ms")
print(f"mean over {len(spent)}: {sum(spent) / len(spent) * 1e3:.3f} ms")
pstats.Stats(prof).sort_stats("tottime").print_stats(8)
