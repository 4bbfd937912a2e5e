"""A compact plain-text matrix for ``pytest_terminal_summary``.

A few lines per matrix: one count line, then backends as rows and GPU archs
as columns, each cell summarising every other axis with the symbols of the
Markdown legend (``◐ k/n``: accepted in k of n cells).
"""

from __future__ import annotations

import unicodedata
from typing import Any, Mapping

from .model import SYMBOLS, Notes, ReportModel, format_key


def display_width(text: str) -> int:
    """Columns a terminal gives ``text``: wide and emoji-presentation characters take two."""
    width = 0
    for ch in text:
        if ch == "\ufe0f":  # emoji presentation selector: the previous character is wide
            width += 1
        elif unicodedata.combining(ch) or ch == "\u200d":
            continue
        elif unicodedata.east_asian_width(ch) in ("W", "F"):
            width += 2
        else:
            width += 1
    return width


def _pad(text: str, width: int) -> str:
    return text + " " * max(0, width - display_width(text))


def render_terminal(document: Mapping[str, Any], width: int = 100) -> str:
    """The matrix of one result document in a few plain-text lines (no trailing newline)."""
    model = ReportModel(document)
    run = model.run
    counts = model.counts()
    parts = [f"{counts[v]} {v}" for v in ("pass", "fail", "error", "skip", "xfail", "xpass") if counts.get(v)]
    kernels = model.kernel_counts()
    head = f"{run.get('matrix') or 'matrix'}: {len(model.cells)} cells, " + ", ".join(parts or ["none"])
    if kernels.get("verified") or kernels.get("failed"):
        head += f"; kernels {kernels.get('verified', 0)} verified, {kernels.get('failed', 0)} failed"
    lines = [head]
    if not model.cells:
        return head
    rows = ["backend"] if "backend" in model.axes else [next(iter(model.axes))]
    cols = [a for a in ("arch",) if a in model.axes and a not in rows]
    tables, _, r_axes, c_axes, hidden = model.tables(rows, cols, tables=[])
    table = tables[0]
    notes = Notes()  # terminal shows symbols and counts, not notes
    label_w = max([display_width(format_key(r_axes, rk)) for rk in table.row_keys] + [len(r_axes[0])]) + 2
    grid: list[list[str]] = []
    for rk in table.row_keys:
        row = []
        for ck in table.col_keys:
            s = model.summarise(table.groups.get((rk, ck), []), hidden, notes)
            row.append(f"{s.symbol} {s.accepted}/{s.total}" if s.state == "partial" else s.symbol)
        grid.append(row)
    col_heads = [format_key(c_axes, ck) for ck in table.col_keys]
    col_w = [max([display_width(h) for h in col_heads[i:i + 1]] + [display_width(r[i]) for r in grid]) + 2
             for i in range(len(col_heads))]
    budget = max(1, (width - label_w) // (max(col_w) if col_w else 1))
    shown = min(len(col_heads), budget)
    lines.append(_pad(" · ".join(r_axes), label_w) + "".join(_pad(h, w) for h, w in zip(col_heads[:shown], col_w)).rstrip()
                 + (f"  (+{len(col_heads) - shown} columns)" if shown < len(col_heads) else ""))
    for rk, row in zip(table.row_keys, grid):
        lines.append((_pad(format_key(r_axes, rk), label_w)
                      + "".join(_pad(c, w) for c, w in zip(row[:shown], col_w))).rstrip())
    legend = " ".join(f"{SYMBOLS[s]} {s}" for s in ("verified", "accepted", "rejected", "xfail", "bad"))
    lines.append(f"({legend}; ◐ k/n accepted in k of n; over {', '.join(hidden) or 'nothing'})")
    return "\n".join(lines)


__all__ = ["render_terminal", "display_width"]
