"""The ``pycudnn`` command line (also ``python -m pycudnn``).

Subcommands, a module each: ``pycudnn info`` (`info`), ``pycudnn bench`` (`bench`),
``pycudnn tune`` (`tune`) and ``pycudnn cache show [FILE]|clear|export FILE|import FILE
[--replace]`` (`cache`). What they share: the layer sets (`models`), the options (`options`),
running and timing a layer (`timing`), the machine's description (`environment`), terminal text
(`report`), the failures (`errors`); `program` holds the parser and `main`.

User mistakes (a bad ``--shape``, an unknown model, a missing file) print one line on stderr and
exit with status 2; a machine that cannot run the command (no GPU, no libcudnn) prints one line
and exits with status 1. Never a traceback, except with ``--debug``.
"""

from .program import main

__all__ = ["main"]
