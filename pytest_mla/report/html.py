"""HTML rendering (placeholder until the full renderer lands)."""

from __future__ import annotations

import html
from typing import Any


def render_html(document: dict[str, Any]) -> str:
    rows = "".join(f"<li>{html.escape(c['id'])}: {html.escape(c['verdict'])}</li>" for c in document["cells"])
    return f"<!doctype html><meta charset=utf-8><ul>{rows}</ul>\n"
