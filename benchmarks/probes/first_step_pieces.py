"""Where the first training step of a fresh process goes: for each model, one fresh process per
side (PyTorch with cudnn.benchmark on, PyTorch with it off, converted with an empty tuning
database, converted again on the database the previous process filled), bf16 channels_last,
batch 64. In the converted processes the time is split into pycudnn's own searches
(`try_all` as `pycudnn.api.conv` calls it, for each direction, plan build and first run
included), PyTorch's search inside the routing duel (its first call of the signature) and the duel's timing.

    PYTHONPATH=. python3 benchmarks/probes/first_step_pieces.py --models resnet50,mobilenet_v3_large
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child(model_name: str, side: str, batch: int) -> None:
    import torch

    sys.path.insert(0, os.path.dirname(HERE))
    import zoo

    torch.backends.cudnn.benchmark = side != "torch_heuristics"
    t_import = time.perf_counter()
    model = zoo.make(model_name, torch.bfloat16)
    pieces = {"pycudnn_search_s": 0.0, "searches": 0, "torch_search_in_duel_s": 0.0,
              "duel_timing_s": 0.0, "duels": 0, "to_torch": 0}
    if side.startswith("pycudnn"):
        import pycudnn.torch as pt
        from pycudnn.api import conv as api_conv
        from pycudnn.torch import calls, routing

        inner_try_all = api_conv.try_all  # the name the convolutions call it by

        def timed_try_all(*a, **k):
            t = time.perf_counter()
            try:
                return inner_try_all(*a, **k)
            finally:
                pieces["pycudnn_search_s"] += time.perf_counter() - t
                pieces["searches"] += 1

        api_conv.try_all = timed_try_all
        inner_wins = routing.pycudnn_wins

        def timed_wins(signature, direction, ours, theirs, device, stream):
            torch.cuda.synchronize()
            t = time.perf_counter()
            try:
                theirs()
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001 - the real call reports it
                pass
            t1 = time.perf_counter()
            won = inner_wins(signature, direction, ours, theirs, device, stream)
            t2 = time.perf_counter()
            pieces["torch_search_in_duel_s"] += t1 - t
            pieces["duel_timing_s"] += t2 - t1
            pieces["duels"] += 1
            pieces["to_torch"] += not won
            return won

        routing.pycudnn_wins = timed_wins
        calls.routing.pycudnn_wins = timed_wins
        pt.convert(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    (x, y), = zoo.data(batch, torch.bfloat16, count=1)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    zoo.step(model, opt, x, y)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    zoo.step(model, opt, x, y)
    torch.cuda.synchronize()
    second = time.perf_counter() - t0
    print(json.dumps({"first_step_s": first, "second_step_s": second,
                      "model_build_s": t0 - t_import - first - second, **pieces}))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet50,mobilenet_v3_large,convnext_tiny")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=int, default=150)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.batch)
        return 0
    out: dict = {"command": " ".join(sys.argv), "models": {}}
    for name in args.models.split(","):
        row: dict = {}
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, PYCUDNN_CACHE_DIR=cache)
            for side in ("torch", "torch_heuristics", "pycudnn", "pycudnn_filled_db"):
                try:
                    r = subprocess.run([sys.executable, __file__, "--child", name, side,
                                        "--batch", str(args.batch)], env=env, capture_output=True,
                                       text=True, timeout=args.timeout)
                    if r.returncode:
                        row[side] = {"error": r.stderr.strip().splitlines()[-3:]}
                    else:
                        row[side] = json.loads(r.stdout.strip().splitlines()[-1])
                except subprocess.TimeoutExpired:
                    row[side] = {"error": f"timeout {args.timeout} s"}
                print(name, side, json.dumps(row[side]), flush=True)
        out["models"][name] = row
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
