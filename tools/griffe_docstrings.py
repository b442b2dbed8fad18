"""A griffe extension for the API reference (mkdocs.yml loads it): docstrings written for
readers of the source become Markdown that mkdocstrings renders well.

* Sphinx roles (``:func:`~pycudnn.search.iterate.try_all```) that some docstrings still use become inline
  code (`try_all()`), so the reference never shows a raw role.
* A parameter line that documents several parameters at once (``stride, padding, dilation: ...``)
  becomes one entry per parameter, so each gets its type and default from the signature instead
  of one entry marked "required".
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(func|meth|class|mod|attr|data|exc|obj|const|ref):`([^`]+)`")
_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Keyword Args|Keyword Arguments|Other Parameters):\s*$")
_SHARED = re.compile(r"^(\s+)(\*{0,2}\w+(?:\s*,\s*\*{0,2}\w+)+)(\s*(?:\([^)]*\))?\s*:\s.*)$")


def _role(match: re.Match[str]) -> str:
    role, target = match.groups()
    explicit = re.fullmatch(r"(.+?)\s*<(.+)>", target)
    if explicit:
        text = explicit.group(1)
    else:
        target = target.lstrip("~!")
        text = target.rsplit(".", 1)[-1] if match.group(2).startswith("~") else target
        if role in ("func", "meth") and not text.endswith(")"):
            text += "()"
    return f"`{text}`"


def convert(text: str) -> str:
    """The docstring with roles as inline code and shared parameter lines split."""
    text = _ROLE.sub(_role, text)
    lines = text.split("\n")
    out: list[str] = []
    in_args, i = False, 0
    while i < len(lines):
        line = lines[i]
        if _SECTION.match(line):
            in_args = True
        elif line.strip() and not line.startswith((" ", "\t")):
            in_args = False
        shared = _SHARED.match(line) if in_args else None
        if shared is None:
            out.append(line)
            i += 1
            continue
        indent, names, rest = shared.groups()
        block = [rest]
        i += 1
        while i < len(lines) and lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) > len(indent):
            block.append("\n" + lines[i])
            i += 1
        for name in re.split(r"\s*,\s*", names):
            out.append(indent + name + "".join(block))
    return "\n".join(out)


class ReaderDocstrings(griffe.Extension):
    """Rewrites each docstring once, as griffe loads it."""

    def on_instance(self, *, node: Any, obj: griffe.Object, agent: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = convert(obj.docstring.value)
