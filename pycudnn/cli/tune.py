"""``pycudnn tune``: fill the tuning database ahead of time, one measured search per layer and
direction.
"""

from __future__ import annotations

import argparse
import sys

from ..tuning import db as tuning_db
from .environment import require_gpu
from .errors import UsageError
from .models import SHORT, layers_from_args, parse_directions
from .options import options_from_args
from .timing import run_all


def cmd_tune(args: argparse.Namespace) -> int:
    """Fill the tuning database: one measured search per layer and direction."""

    if not (args.model or args.shapes_file or args.shape):
        raise UsageError("say what to tune: --model NAME, --shapes-file FILE or --shape SHAPE")
    layers = layers_from_args(args)
    directions = parse_directions(args.direction)
    if not tuning_db.enabled():
        raise UsageError("the tuning database is turned off (PYCUDNN_TUNING_DB=0): nothing to fill")
    require_gpu("tune", args.device)
    opts = options_from_args(args)
    before = len(tuning_db.entries())
    rows = run_all(layers, directions, opts, args.device, False, args.quiet, "tune", False)
    searched = sum(1 for r in rows if r["searches"])
    reused = sum(1 for r in rows if r["source"] == "tuning-db")
    failed = [r for r in rows if r["error"]]
    after = len(tuning_db.entries())
    for r in failed:
        print(f"pycudnn tune: {r['layer']} {SHORT[r['direction']]}: {r['error']}", file=sys.stderr)
    print(f"tuned {len(layers)} layers x {len(directions)} directions: {searched} searched, "
          f"{reused} already in the database, {len(failed)} failed; "
          f"{tuning_db.path()} holds {after} records ({after - before:+d})")
    return 1 if failed else 0
