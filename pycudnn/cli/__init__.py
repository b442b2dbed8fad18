"""The ``pycudnn`` command line (also ``python -m pycudnn``).

Subcommands, a module each:

* ``pycudnn info`` (`info`): versions, where libcudnn came from, devices, the tuning database;
* ``pycudnn bench`` (`bench`): time convolution layers (built-in ResNet-50 by default), against
  PyTorch when it is installed; results go to the tuning database;
* ``pycudnn tune`` (`tune`): fill the tuning database for a list of layers ahead of time;
* ``pycudnn cache show [FILE]|clear|export FILE|import FILE [--replace]`` (`cache`): the tuning
  database.

What they share: the layer sets (`models`), the options (`options`), running and timing a layer
(`timing`), the machine's description (`environment`), terminal text (`report`), the failures
(`errors`); `program` holds the parser and `main`.

User mistakes (a bad ``--shape``, an unknown model, a missing file) print one line on stderr and
exit with status 2; a machine that cannot run the command (no GPU, no libcudnn) prints one line
and exits with status 1. Never a traceback, except with ``--debug``.
"""

from .program import main

__all__ = ["main"]
