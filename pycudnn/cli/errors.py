"""The command line's two kinds of failure and their exit statuses: a user's mistake
(`UsageError`, status 2) and a machine that cannot run the command (`RunError`, status 1).
"""

from __future__ import annotations


class UsageError(Exception):
    """A mistake on the command line or in a file it names (exit status 2)."""


class ParseError(UsageError):
    """An argparse mistake; the message already names the (sub)command."""


class RunError(Exception):
    """The command cannot run here (no GPU, no libcudnn) or failed (exit status 1)."""
