"""``python -m pycudnn``: the command line (see `pycudnn.cli`)."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
