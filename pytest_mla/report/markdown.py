"""Markdown rendering (placeholder until the full renderer lands)."""

from __future__ import annotations

from typing import Any


def render_markdown(document: dict[str, Any]) -> str:
    run = document["run"]
    lines = [f"# {run['matrix']}", ""]
    for cell in document["cells"]:
        lines.append(f"- {cell['id']}: {cell['verdict']}")
    return "\n".join(lines) + "\n"
