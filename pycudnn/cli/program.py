"""The ``pycudnn`` program: the argument parser of every command, and `main` (exit statuses, one
line instead of a traceback).
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn, Sequence

from .bench import cmd_bench
from .cache import cmd_cache
from .errors import ParseError, RunError, UsageError
from .info import cmd_info
from .models import SHAPE_FORMAT
from .options import add_layer_options
from .report import first_line
from .tune import cmd_tune


class _Parser(argparse.ArgumentParser):
    """argparse that reports a mistake as one line (UsageError) instead of usage + exit."""

    def error(self, message: str) -> NoReturn:
        raise ParseError(f"{self.prog}: error: {message} (see '{self.prog} --help')")


def _own_version() -> str:
    import pycudnn

    return pycudnn.__version__


def build_parser() -> argparse.ArgumentParser:
    """The ``pycudnn`` argument parser."""
    parser = _Parser(prog="pycudnn", description="pycudnn: cuDNN convolutions for any Python GPU "
                     "stack. Start with `pycudnn info`, then `pycudnn bench` on a GPU.")
    parser.add_argument("--version", action="version", version=f"pycudnn {_own_version()}",
                        help="print pycudnn's version and exit (`pycudnn info` shows cuDNN's)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of unexpected errors")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log pycudnn's choices (-v: info, -vv: debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("info", help="versions, libcudnn, devices, tuning database (no GPU needed)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("bench", help="time convolution layers (default: ResNet-50, bf16 NHWC)",
                       description="Time convolution layers with benchmark=True: the built-in "
                       "ResNet-50 layer set in bf16 NHWC on device 0 unless told otherwise, "
                       "against PyTorch's cuDNN path (torch.backends.cudnn.benchmark=True, same "
                       "data) when PyTorch is installed. Times are per call, CUDA events around "
                       "back-to-back calls, median of 7 trials. The choices go to the tuning "
                       "database.")
    add_layer_options(p, "fwd")
    p.add_argument("--all-candidates", action="store_true",
                   help="search again and list every algorithm or plan with its time, workspace "
                        "and notes, not just the winner")
    p.add_argument("--fresh", action="store_true",
                   help="search again instead of reusing the tuning database (the new choice is stored)")
    p.add_argument("--no-tuning-db", action="store_true", help="neither read nor write the tuning database")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch column")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument("--csv", metavar="FILE", help="write the results as CSV")
    p.add_argument("--plot", metavar="FILE.png", help="draw TFLOP/s per layer (needs matplotlib)")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("tune", help="fill the tuning database for a list of layers ahead of time",
                       description="Run a measured search (benchmark=True) for each layer and "
                       "direction so that later processes start without searching. The records "
                       "match programs that use the same dtype, layout, engine and flags.")
    add_layer_options(p, "all", default_model=False)
    p.add_argument("--shapes-file", metavar="FILE",
                   help=f"one {SHAPE_FORMAT} per line ('#' starts a comment)")
    p.add_argument("--fresh", action="store_true",
                   help="search again even where the database already has a record")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("cache", help="show, clear, export or import the tuning database",
                       description="Show, clear, export or import the tuning database. An import "
                       "checks every entry (those that do not validate are refused and counted) "
                       "and only adds records for keys this database lacks: a record measured "
                       "here is never replaced by one from elsewhere unless --replace is given.")
    p.add_argument("action", choices=["show", "clear", "export", "import"])
    p.add_argument("file", nargs="?", help="show: list this file's records instead of the "
                   "database's; export: the file to write; import: the file to merge")
    p.add_argument("--json", action="store_true", help="show: print the entries as JSON")
    p.add_argument("--replace", action="store_true",
                   help="import: imported records replace local ones for the same key (default: "
                        "local records win)")
    p.set_defaults(func=cmd_cache)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 failed or cannot run here, 2 usage)."""
    parser = build_parser()
    debug = "--debug" in (sys.argv[1:] if argv is None else argv)
    command = "pycudnn"
    try:
        args = parser.parse_args(argv)
        debug = args.debug
        if not args.command:  # asked for nothing: say what there is
            parser.print_help(sys.stdout)
            return 0
        command = f"pycudnn {args.command}"
        if args.verbose:
            import logging

            logging.basicConfig(format="%(name)s: %(message)s", stream=sys.stderr)
            logging.getLogger("pycudnn").setLevel(logging.DEBUG if args.verbose > 1 else logging.INFO)
        return int(args.func(args) or 0)
    except ParseError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except UsageError as exc:
        print(f"{command}: error: {exc}", file=sys.stderr)
        return 2
    except RunError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback; --debug shows it
        if debug:
            raise
        print(f"{command}: {type(exc).__name__}: {first_line(exc)} (run with --debug for the "
              f"traceback)", file=sys.stderr)
        return 1
