"""A compact plain-text matrix for ``pytest_terminal_summary`` and ``pytest-mla render -f terminal``.

View ``grid`` (the default): a few lines per matrix: one count line, then
backends as rows and GPU archs as columns, each cell summarising every other
axis with the symbols every view uses (``symbols.py``; ``◐ k/n``: accepted in k
of n cells); probe values are left out (the Markdown lists them). View
``backends``: the backends view (``backends.py``) as plain text, with its notes.
"""

from __future__ import annotations

import unicodedata
from typing import Any, Mapping

from .backends import BackendsView, build_backends_view
from .model import KERNEL_FAILED, Notes, ReportModel, format_key, kernel_counts_text, verdict_counts
from .symbols import ACCEPTED, BAD, EMULATED, PARTIAL, REJECTED, VERIFIED, XFAIL, emoji

VIEWS = ("grid", "backends", "all")
#: The legend under the sketch: the symbols of ``symbols.py`` in a word each.
TERMINAL_LEGEND = " ".join(f"{emoji(s)} {word}" for s, word in (
    (VERIFIED, "verified"), (EMULATED, "emulated kernels"), (ACCEPTED, "accepted, not run"), (REJECTED, "refused"),
    (XFAIL, "known bug"), (BAD, "failure"))) + f"; {emoji(PARTIAL)} k/n accepted in k of n"


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


def render_terminal(document: Mapping[str, Any], width: int = 100, *, view: str = "grid",
                    model: ReportModel | None = None) -> str:
    """The matrix of one result document in a few plain-text lines (no trailing newline); ``model``:
    the ``ReportModel`` of ``document``, to share the work of the reports written from it."""
    if view not in VIEWS:
        raise ValueError(f"unknown view {view!r} (known: {', '.join(VIEWS)})")
    model = model if model is not None else ReportModel(document)
    if view == "backends":
        return _head(model) + "\n" + render_backends_text(build_backends_view(model))
    grid = _grid(model, width)
    if view == "all":
        return grid + "\n\n" + render_backends_text(build_backends_view(model))
    return grid


def _head(model: ReportModel) -> str:
    run = model.run
    parts = verdict_counts(model.counts())
    kernels = model.kernel_counts()
    head = f"{run.get('matrix') or 'matrix'}: {len(model.cells)} cells, " + ", ".join(parts or ["none"])
    if kernels.get(VERIFIED) or kernels.get(EMULATED) or kernels.get(KERNEL_FAILED):
        head += f"; kernels {kernel_counts_text(kernels)}"
    return head


def render_backends_text(view: BackendsView) -> str:
    """The backends view as aligned plain text: one block per model family, then the notes."""
    lines: list[str] = []
    for family in view.families:
        lines.append(f"{family.title}: {', '.join(family.models)}")
        if family.rows:
            grid = [["backend"] + [c.title for c in view.columns] + ["verified on"]]
            for row in family.rows:
                grid.append([row.backend + "".join(f" [{n}]" for n in row.refs)] + [e.text for e in row.entries]
                            + [row.verified + "".join(f" [{n}]" for n in row.verified_refs)])
            widths = [max(display_width(r[i]) for r in grid) + 2 for i in range(len(grid[0]))]
            lines += ["  " + "".join(_pad(c, w) for c, w in zip(r, widths)).rstrip() for r in grid]
        if family.refused:
            lines.append("  refused in every configuration: " + ", ".join(
                r.backend + "".join(f" [{n}]" for n in r.refs) for r in family.refused))
    for n, text in view.notes.items():
        lines.append(f"[{n}] {text}")
    for p in view.probes:
        where = f" {p.condition}" if p.condition else ""
        lines.append(f"probe {p.axis} = {p.value}{where}: {p.symbol} {p.text} ({p.cells} cells)")
    return "\n".join(lines)


def _grid(model: ReportModel, width: int) -> str:
    head = _head(model)
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
    probes = "; probes left out: " + ", ".join(f"{a} {', '.join(str(v) for v in vals)}"
                                              for a, vals in model.probes.items()) if model.probes else ""
    lines.append(f"({TERMINAL_LEGEND}; over {', '.join(hidden) or 'nothing'}{probes})")
    return "\n".join(lines)


__all__ = ["render_terminal", "render_backends_text", "display_width"]
