"""``pycudnn cache show [FILE]|clear|export FILE|import FILE [--replace]``: the tuning database.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from typing import Any

from ..errors import TuningDatabaseWarning
from ..tuning import db as tuning_db
from ..tuning import routes as route_store
from .environment import version_text
from .errors import RunError, UsageError
from .models import SHORT
from .report import (
    check_output_path,
    first_line,
    format_bytes,
    format_number,
    terminal_safe,
    text_table,
)


def _entry_summary(e: dict[str, Any]) -> list[str]:
    """One row of ``cache show`` (every cell escaped: the entry may come from another machine;
    entries of another pycudnn's schema hold anything, so nothing here assumes a type)."""
    def obj(v: Any) -> dict[str, Any]:
        return v if isinstance(v, dict) else {}

    p, rec, gpu = obj(e.get("params")), obj(e.get("record")), obj(e.get("gpu"))
    cc = gpu.get("compute_capability", [])
    cc = ".".join(map(str, cc)) if isinstance(cc, list) else str(cc)
    choice = rec.get("tag") or (f"algo {rec['algo']} math {rec.get('math_type')}" if "algo" in rec else "?")
    ep = f"+{p['epilogue']}" if p.get("epilogue") else ""
    groups = p.get("groups", 1)
    layer = (f"x{p.get('input_shape')} w{p.get('weight_shape')} s{p.get('stride')} p{p.get('padding')}"
             f"{'' if groups == 1 else ' g' + str(groups)}")
    direction = p.get("direction")
    t = rec.get("time_ms")
    ms = float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else -1.0
    version = e.get("cudnn_version")
    ws = rec.get("workspace")
    row = [f"{gpu.get('name')} ({cc}, {gpu.get('sm_count')} SMs)",
           version_text(version) if type(version) is int else str(version), str(e.get("engine")),
           (SHORT.get(direction, direction) if isinstance(direction, str) else str(direction)) + ep,
           str(p.get("dtype")), str(p.get("weight_format")), layer, str(choice),
           format_number(ms, 4) if ms >= 0 else "-",
           format_bytes(ws) if type(ws) is int else "-", str(e.get("created", ""))]
    return [terminal_safe(c) for c in row]


_CACHE_COLUMNS = ["gpu", "cuDNN", "engine", "dir", "dtype", "fmt", "layer", "choice", "ms",
                  "workspace", "created"]


def _summaries(rows: list[dict[str, Any]]) -> list[list[str]]:
    """The rows of ``cache show``; an entry that cannot be summarized (of another pycudnn's schema)
    shows as such instead of failing the listing."""
    out = []
    for e in rows:
        try:
            out.append(_entry_summary(e))
        except Exception as exc:  # noqa: BLE001 - one odd entry must not hide the others
            out.append([terminal_safe(f"(unreadable entry of schema {e.get('schema')!r}: "
                              f"{type(exc).__name__})")] + ["-"] * (len(_CACHE_COLUMNS) - 1))
    return out


#: the warning of a refused file: the state (``cache show``) or the error (the others) says it
_REFUSED = r"pycudnn (tuning database|routing decisions) .* refused: "


def cmd_cache(args: argparse.Namespace) -> int:
    """show [FILE] | clear | export FILE | import FILE [--replace]."""

    action = args.action
    try:
        with warnings.catch_warnings():  # a refusal is in the output or the error below
            warnings.filterwarnings("ignore", message=_REFUSED, category=TuningDatabaseWarning)
            return _cache_action(args, tuning_db)
    except PermissionError as exc:  # the database was refused: another user's, or open to others
        raise RunError(f"pycudnn cache {action}: {terminal_safe(first_line(exc))}") from None


def _cache_action(args: argparse.Namespace, tuning_db: Any) -> int:
    action = args.action
    if args.replace and action != "import":
        raise UsageError("--replace goes with cache import")
    if action == "show" and args.file:
        return _show_file(args, tuning_db)
    if action == "show":
        return _show_database(args, tuning_db)
    if action == "clear":
        if args.file:
            raise UsageError(f"cache clear takes no FILE (got {terminal_safe(args.file)!r}): it "
                             f"clears {terminal_safe(tuning_db.path())} and "
                             f"{terminal_safe(route_store.path())}; remove another file yourself")
        return _clear()
    if not args.file:
        raise UsageError(f"cache {action} needs a FILE")
    if action == "export":
        check_output_path("cache export", args.file)
        n = tuning_db.export(args.file)
        print(f"exported {n} records to {terminal_safe(args.file)}")
        return 0
    # import
    if not os.path.isfile(args.file):
        raise UsageError(f"{terminal_safe(args.file)} does not exist")
    try:
        with warnings.catch_warnings():  # the count is printed below
            warnings.filterwarnings("ignore", message=r".*: refused \d+ entr",
                                    category=TuningDatabaseWarning)
            report = tuning_db.import_file(args.file, prefer="imported" if args.replace else "local")
    except ValueError as exc:
        raise UsageError(terminal_safe(first_line(exc))) from None
    notes = []
    refused = (f"refused {report.refused} entr{'y' if report.refused == 1 else 'ies'} that did "
               f"not validate")
    if not (report.merged or report.kept):  # nothing valid in it: no merge, no write
        print(terminal_safe(f"{args.file} holds no records; {tuning_db.path()} is unchanged"
                    + (f"; {refused}" if report.refused else "")))
        return 0
    if report.kept:
        notes.append(f"kept {report.kept} local record{'s' if report.kept != 1 else ''} "
                     + ("unchanged" if args.replace else "(--replace replaces them)"))
    if report.refused:
        notes.append(refused)
    print(terminal_safe(f"merged {report.merged} records from {args.file} into {tuning_db.path()}"
                + "".join(f"; {n}" for n in notes)))
    return 0


def _directory_problem() -> str | None:
    """Why the cache directory cannot hold files (a link to nothing, a file, a parent that is a
    file), or None when it can or can be made."""
    d = tuning_db.cache_dir()
    if os.path.lexists(d):
        if os.path.islink(d) and not os.path.exists(d):
            return f"the cache directory {d} is a symbolic link to a missing path"
        if not os.path.isdir(d):
            return f"the cache directory {d} is not a directory"
        return None
    parent = os.path.dirname(d)
    while parent and not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if parent and not os.path.isdir(parent):
        return f"the cache directory {d} cannot be made: {parent} is not a directory"
    return None


def _clear() -> int:
    """``cache clear``: the tuning database, then the routing decisions; each says what it did,
    and a part that could not be cleared fails the command (the other is still cleared)."""
    problem = _directory_problem()
    if problem:
        raise RunError(terminal_safe(f"pycudnn cache clear: {problem}; nothing was removed"))
    failed = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TuningDatabaseWarning)
        warnings.filterwarnings("ignore", message=_REFUSED, category=TuningDatabaseWarning)
        for what, clear, where, unit in (
                ("the tuning database", tuning_db.clear, tuning_db.path, "records"),
                ("the routing decisions", route_store.clear, route_store.path,
                 "routing decisions")):
            try:
                existed = os.path.lexists(where())
                n = clear()
            except OSError as exc:  # refused (PermissionError), or a directory or file unusable
                failed.append(f"{what}: {_os_error(exc)}")
                continue
            if unit == "records" or n or existed:
                print(terminal_safe(f"removed {n} {unit} from {where()}"))
    for w in caught:  # a file set aside, after what was removed
        print(f"pycudnn cache clear: {terminal_safe(w.message)}", file=sys.stderr)
    if failed:
        raise RunError(terminal_safe("pycudnn cache clear: could not clear " + "; ".join(failed)
                                     + " (nothing was removed there)"))
    return 0


def _os_error(exc: OSError) -> str:
    """An OSError as one line without Python's class name: what failed, on which file."""
    name = f" {exc.filename}" if exc.filename else ""
    return f"{exc.strerror or first_line(exc)}{':' if name else ''}{name}"


def _show_database(args: argparse.Namespace, tuning_db: Any) -> int:
    """``cache show``: the database's valid entries, read only (no lock file is made, an unusable
    file is named on stderr and left where it is)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TuningDatabaseWarning)
        warnings.filterwarnings("ignore", message=_REFUSED,
                                category=TuningDatabaseWarning)  # shown as the state
        rows = tuning_db.entries(set_aside=False)
        routes = route_store.entries(set_aside=False)
    if args.json:  # json.dumps escapes every control and non-ASCII character
        print(json.dumps({"path": tuning_db.path(), "entries": rows,
                          "routes_path": route_store.path(), "routes": routes}, indent=1))
    else:
        why = tuning_db.refused()
        problem = _directory_problem()
        state = ("" if tuning_db.enabled() else " (turned off: PYCUDNN_TUNING_DB=0)") + (
            f" (refused: {why})" if why else "") + (f" ({problem})" if problem else "")
        print(terminal_safe(f"{tuning_db.path()}: {len(rows)} records{state}"))
        if rows:
            print(text_table(_CACHE_COLUMNS, _summaries(rows), {8}))
        _show_routes(routes)
        why = route_store.refused()
        if why:
            print(terminal_safe(f"{route_store.path()}: routing decisions refused ({why})"))
    for w in caught:
        print(f"pycudnn cache show: {terminal_safe(w.message)}", file=sys.stderr)
    return 0


_ROUTE_COLUMNS = ["direction", "winner", "layer", "torch us/call", "pycudnn us/call", "why"]


def _show_routes(routes: list[dict[str, Any]]) -> None:
    """The routing decisions of pycudnn.torch (which library runs each signature, and why);
    nothing where there are none."""
    if not routes:
        return
    torch_won = sum(r["winner"] == "torch" for r in routes)
    print(terminal_safe(f"{route_store.path()}: {len(routes)} routing decisions of pycudnn.torch "
                        f"({torch_won} to PyTorch's convolution)"))
    rows = [[terminal_safe(c) for c in (
            r["key"]["direction"], r["winner"], r["key"]["signature"],
            format_number(r["torch_call_us"], 1), format_number(r["pycudnn_call_us"], 1),
            r["reason"])] for r in routes]
    print(text_table(_ROUTE_COLUMNS, rows, {3, 4}))


def _show_file(args: argparse.Namespace, tuning_db: Any) -> int:
    """``cache show FILE``: the valid entries of FILE (an export, say), read as an import reads
    it; nothing is changed. Entries that do not validate are left out (stderr names them)."""
    if not os.path.lexists(args.file):
        raise UsageError(f"{terminal_safe(args.file)} does not exist")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", TuningDatabaseWarning)
            rows = tuning_db.read_file(args.file)
    except (ValueError, FileNotFoundError) as exc:
        raise UsageError(terminal_safe(first_line(exc))) from None
    if args.json:  # json.dumps escapes every control and non-ASCII character
        print(json.dumps({"path": args.file, "entries": rows}, indent=1))
    else:
        print(terminal_safe(f"{args.file}: {len(rows)} records"))
        if rows:
            print(text_table(_CACHE_COLUMNS, _summaries(rows), {8}))
    for w in caught:  # how many entries were left out, after the listing
        print(f"pycudnn cache show: {terminal_safe(w.message)}", file=sys.stderr)
    return 0
