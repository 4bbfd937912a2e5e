"""Reproducer templates: which script a finding gets, by engine, kernel level and backend.

A template turns one finding cell (its record, the run it came from, the
model's catalogue entry) into a standalone Python script that rebuilds the
engine's own objects as the cell's check built them and calls the engine's
function. ``registry.TEMPLATES`` is tried in order; the first whose
``applies`` returns None takes the cell. A finding no template takes
(another engine, a CUDA backend, level ``emulated``, whose emulations would
have to be inlined) gets a message that says why each template declined.

To add one: a module beside ``sglang.py`` with a ``Template`` subclass, its
script text as package data (``*.py.tmpl``: never imported by the package),
and an entry in ``registry.TEMPLATES``.
"""

from __future__ import annotations

import dataclasses
import textwrap
from importlib import resources
from typing import Any, Mapping

from ...core.models import ModelConfig

__all__ = ["Context", "Template", "compact_repr", "script_text", "wrap_doc"]


@dataclasses.dataclass(frozen=True)
class Context:
    """What a template reads: the finding cell, its run, the model's catalogue entry and config.json."""

    record: Mapping[str, Any]
    run: Mapping[str, Any]
    model: ModelConfig
    config_json: Mapping[str, Any] | None  # the checkpoint's weightless config.json (None: not shipped)
    result_file: str  # as the user named it, for the command written into the script
    finding: Any  # findings.Finding the cell belongs to

    @property
    def engine(self) -> str:
        return str((self.run.get("engine") or {}).get("name") or "")

    @property
    def version(self) -> str:
        return str((self.run.get("engine") or {}).get("version") or "")

    @property
    def kernel(self) -> Mapping[str, Any]:
        return self.record.get("kernel") or {}

    @property
    def coords(self) -> Mapping[str, Any]:
        return self.record.get("coords") or {}


class Template:
    """One kind of reproducer. Subclasses set ``name`` and implement ``applies`` and ``render``."""

    name = "template"
    describes = ""  # one line: what its scripts build and call (the bug report quotes it)

    def applies(self, ctx: Context) -> str | None:
        """None when this template can reproduce the cell, else why not (one clause)."""
        raise NotImplementedError

    def render(self, ctx: Context, script_name: str = "repro.py") -> str:
        """The script's text (``script_name``: what its docstring tells the reader to run)."""
        raise NotImplementedError


WIDTH = 100


def script_text(resource: str, docstring: str, constants: Mapping[str, tuple[Any, str]]) -> str:
    """A package-data script with its docstring (paragraphs wrapped; lines indented by 4 kept as they
    are) and constants (``NAME = value  # comment``) filled in."""
    body = resources.files(__package__).joinpath(resource).read_text(encoding="utf-8")
    lines = []
    for name, (value, comment) in constants.items():
        if comment:
            lines.append(f"# {comment}")
        lines.append(f"{name} = {compact_repr(value, indent=len(name) + 3)}")
    return body.replace("@DOCSTRING@", doc_safe(wrap_doc(docstring))).replace("@CONSTANTS@", "\n".join(lines))


def wrap_doc(text: str) -> str:
    out = []
    for line in text.split("\n"):
        if line.startswith("    ") or not line.strip():
            out.append(line.rstrip())
        else:
            out += textwrap.wrap(line, WIDTH, break_on_hyphens=False, break_long_words=False) or [""]
    return "\n".join(out)


def compact_repr(value: Any, indent: int = 0) -> str:
    """``repr`` of a constant, a long dict's items packed into lines of at most ``WIDTH`` characters."""
    text = repr(value)
    if not isinstance(value, dict) or indent + len(text) <= WIDTH:
        return text
    items = [f"{k!r}: {v!r}" for k, v in value.items()]
    lines, line = [], "{"
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else "}")
        if len(line) > 1 and indent + len(line) + 1 + len(piece) > WIDTH:
            lines.append(line)
            line = " " + piece
        else:
            line += ("" if line == "{" else " ") + piece
    lines.append(line)
    return ("\n" + " " * (indent - 1)).join(lines)


def doc_safe(text: str) -> str:
    """Text for inside a triple-quoted docstring: backslashes and quote runs escaped."""
    return text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
