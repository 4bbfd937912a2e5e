"""One symbol set, one meaning, in every view (issue 23.1), and a distinct symbol for cells whose
engine code ran around emulated kernels. The document is written by hand; the expected symbols
are those of the legend (``report/symbols.py``) applied by hand to each row."""

from __future__ import annotations

import re

import pytest

from pytest_mla.core.cells import Cell, expand_cells
from pytest_mla.report.backends import build_backends_view
from pytest_mla.report.html import build_data, render_html
from pytest_mla.report.markdown import render_markdown
from pytest_mla.report.model import ReportModel
from pytest_mla.report.summary import build_summary
from pytest_mla.report.terminal import render_terminal

from .helpers import not_run, record, verified

AXES = {"model": ["deepseek-v3"], "backend": ["real", "emul", "mixed", "nokernel", "refused", "broken", "known"],
        "dcp": [1, 2], "spec": ["none"], "arch": ["sm90", "sm100"]}
REFUSAL = "refused refuses everything."


def emulated_kernel(where="interpreter"):
    return {**verified(where), "level": "emulated", "function": "engine.backend:forward"}


def cell_record(cell: Cell) -> dict:
    if cell.backend == "refused":
        return record(cell, reject=REFUSAL)
    if cell.backend == "broken":
        return record(cell, "fail", reason="expected a rejection, but the engine accepted it:\n  expected: x")
    if cell.backend == "known":
        return record(cell, "xfail", reason="known bug", xfail="crashes on long prompts (#12)")
    if cell.backend == "real":
        return record(cell, kernel={**verified("interpreter"), "level": "kernel"})
    if cell.backend == "emul":
        return record(cell, kernel=emulated_kernel())
    if cell.backend == "mixed":  # a real kernel at DCP 1, emulated ones at DCP 2
        real = {**verified("interpreter"), "level": "kernel"}
        return record(cell, kernel=real if cell.dcp == 1 else emulated_kernel())
    return record(cell, kernel=not_run("needs an sm90 GPU; this host is cpu"))


def document() -> dict:
    cells = [cell_record(c) for c in expand_cells(AXES)]
    run = {"matrix": "s", "matrix_file": "matrix/s.toml", "engine": {"name": "tiny", "version": "1"},
           "host": {"arch": "cpu"}, "axes": AXES, "cells_total": len(cells), "seed": 0, "kernel_dtype": "bf16",
           "models": {"deepseek-v3": {"mla": True}}}
    return {"schema": "pytest-mla/result", "schema_version": 1, "run": run, "cells": cells}


#: backend → the symbol each view shows for its row (both archs alike), by the legend. "mixed" summarises a
#: real kernel (DCP 1) and emulated ones (DCP 2) where a view folds DCP into the arch columns: the weaker shows.
EXPECTED = {"real": "✅", "emul": "🧪", "mixed": "🧪", "nokernel": "☑️", "refused": "⛔", "broken": "❌", "known": "⚠️"}
#: The backends view's arch columns hold DCP 1 (its DCP column holds DCP 2): there "mixed" is ✅ then 🧪.
IN_BACKENDS_VIEW = {**EXPECTED, "mixed": "✅"}
GLYPH = {"✅": "✔", "🧪": "≈", "☑️": "✓", "⛔": "⊘", "❌": "✗", "⚠️": "!"}


def grid_rows(text: str, sep: str) -> dict[str, list[str]]:
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in (line.strip("|").split("|") if sep == "|" else re.split(r"\s{2,}", line.strip()))]
        if cells and cells[0].replace("\\", "") in EXPECTED:
            rows[cells[0].replace("\\", "")] = cells[1:]
    return rows


def test_the_markdown_grid_uses_one_symbol_per_state():
    md = render_markdown(document(), view="grid", cols=["arch"])
    rows = grid_rows(md, "|")
    for backend, symbol in EXPECTED.items():
        assert [c.split()[0] for c in rows[backend]] == [symbol, symbol], backend
    assert "🧪 accepted; the engine's backend code ran around emulated kernels and matched" in md
    assert "⛔ refused by the engine, as documented" in md and "❌ failure: mismatch with the matrix" in md


def test_the_backends_view_uses_the_same_symbols():
    md = render_markdown(document(), view="backends")
    rows = grid_rows(md, "|")
    for backend, symbol in IN_BACKENDS_VIEW.items():
        if backend == "refused":
            continue  # refused everywhere: listed under the table, with its symbol's meaning in words
        assert [c.split()[0].replace("\u00a0", " ") for c in rows[backend][:2]] == [symbol, symbol], backend
    assert rows["mixed"][2] == "🧪" and rows["emul"][2] == "🧪" and rows["real"][2] == "✅"  # the DCP column
    assert "Refused in every configuration: refused" in md
    legend = next(line for line in md.splitlines() if line.startswith("Legend:"))
    for symbol in ("✅", "🧪", "☑️", "⛔", "◐", "⚠️", "❌", "➖"):
        assert legend.count(symbol) == 1, symbol
    verified_on = {b: re.sub(r" \[\d+\]$", "", rows[b][-1].replace("\u00a0", " "))  # without the "through" note
                   for b in ("real", "emul", "mixed", "nokernel")}
    assert verified_on == {"real": "interpreter · 4 of 4", "emul": "interpreter · 4 of 4 with emulated kernels",
                           "mixed": "interpreter · 2 of 4 · 2 with emulated kernels",
                           "nokernel": "not run here: needs a GPU"}


@pytest.mark.parametrize("view", ["grid", "backends"])
def test_the_terminal_uses_the_same_symbols(view):
    text = render_terminal(document(), view=view)
    rows = grid_rows(text, " ")
    for backend, symbol in (EXPECTED if view == "grid" else IN_BACKENDS_VIEW).items():
        if backend == "refused" and view == "backends":
            assert "refused in every configuration: refused" in text
            continue
        assert rows[backend][0].split()[0] == symbol, (backend, rows[backend])
    if view == "grid":
        assert "🧪 emulated kernels" in text and "⛔ refused" in text and "❌ failure" in text
    assert "kernels 6 verified on a kernel, 6 with emulated kernels, 0 failed, 12 not run" in text.splitlines()[0]


def test_html_chips_and_entries_use_the_glyphs_of_the_same_states():
    doc = document()
    data = build_data(ReportModel(doc))
    state_of = {c["coords"]["backend"]: [] for c in doc["cells"]}
    for c, row in zip(doc["cells"], data["cells"]):
        state_of[c["coords"]["backend"]].append(data["states"][data["bodies"][row[len(data["axes"])]][0]])
    assert state_of["emul"] == ["emulated"] * 4 and state_of["real"] == ["verified"] * 4
    assert sorted(set(state_of["mixed"])) == ["emulated", "verified"]
    assert state_of["refused"] == ["rejected"] * 4 and state_of["broken"] == ["bad"] * 4
    symbols = dict(zip(data["states"], data["symbols"]))
    assert symbols["emulated"] == "≈" and symbols["rejected"] != symbols["bad"]
    page = render_html(doc)
    for backend, symbol in IN_BACKENDS_VIEW.items():
        if backend == "refused":
            continue
        state = {"✅": "verified", "🧪": "emulated", "☑️": "accepted", "❌": "bad", "⚠️": "xfail"}[symbol]
        row = re.search(rf"<tr><th>{backend}</th>(.*?)</tr>", page).group(1)
        entries = re.findall(r'<span class="entry (e-\w+)">(.)</span>', row)
        assert entries[:2] == [(f"e-{state}", GLYPH[symbol])] * 2, (backend, row)
    assert '<span class="chip s-emulated">≈</span>' in page and '<span class="entry e-emulated">≈</span>' in page
    assert "e-bug" not in page


def test_the_run_summary_counts_emulated_kernels_apart():
    doc = document()
    lines = [text for text, _ in build_summary(doc["cells"], [], verbosity=-1, baseline=None, regressions=[],
                                               written=[])]
    assert "kernels: 6 verified on a kernel (0 reused), 6 with emulated kernels, 0 failed, 12 not run" in lines
    md = render_markdown(doc)
    assert "- decode kernels: 6 verified on a kernel, 6 with emulated kernels, 0 failed, 12 not run" in md


def test_refusal_and_failure_never_share_a_symbol_in_any_view():
    doc = document()
    md, term = render_markdown(doc), render_terminal(doc, view="all")
    view = build_backends_view(ReportModel(doc))
    entries = [e for f in view.families for r in f.rows for e in r.entries]
    assert not any(e.state == "rejected" and e.symbol == "❌" for e in entries)
    for text in (md, term):
        assert "❌ refused" not in text and "⛔ failure" not in text
