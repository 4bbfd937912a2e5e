"""The backends view, rendered from a hand-written result document whose table was worked out by hand.

The document below is what a small engine would produce. Its rules (``decide``)
are written here in plain words, and the expected tables (``EXPECTED_*``) were
derived from those rules on paper, column by column, never by running the
view; see the comments next to each row.
"""

from __future__ import annotations

import copy

import pytest

from pytest_mla.core.cells import Cell, expand_cells
from pytest_mla.report.html import render_html
from pytest_mla.report.markdown import render_markdown
from pytest_mla.report.results import read_results
from pytest_mla.report.terminal import render_terminal

from .helpers import MSG_ARCH, MSG_DCP, not_run, record, table_after, verified

AXES = {
    "model": ["deepseek-v3", "llama-3.1-8b"],
    "backend": ["triton", "flashmla", "trtllm_mla", "bogus"],
    "dcp": [0, 1, 2],
    "spec": ["none", "eagle-1x3", "eagle-2x2"],
    "arch": ["sm90", "sm100"],
    "page_size": [1, 64],
}
PROBES = {"dcp": [0], "backend": ["bogus"]}
MSG_DCP0 = "dcp_size must be >= 1, got 0."
MSG_BOGUS = "Invalid attention backend: bogus"
MSG_PAGE = "flashmla needs page size 64."
MSG_TREE = "draft trees need page size 1."
MSG_DCP_MLA = "decode context parallelism needs an MLA model."
NOTE_DRAFT = "draft worker not constructed"


def decide(cell: Cell) -> str | None:
    """The engine's checks, in its order (None: accepted)."""
    if cell.dcp == 0:
        return MSG_DCP0
    if cell.backend == "bogus":
        return MSG_BOGUS
    if cell.backend == "trtllm_mla" and cell.arch == "sm90":
        return MSG_ARCH
    if cell.backend in ("flashmla", "trtllm_mla") and cell.model == "llama-3.1-8b":
        return f"{cell.backend} backend can only be used with MLA models."
    if cell.backend == "flashmla" and cell.page_size == 1:
        return MSG_PAGE
    if cell.spec == "eagle-2x2" and cell.page_size == 64 and cell.backend != "triton":
        return MSG_TREE
    if cell.backend == "trtllm_mla" and cell.dcp > 1 and cell.spec != "none":
        return MSG_DCP
    if cell.dcp > 1 and cell.model == "llama-3.1-8b":
        return MSG_DCP_MLA
    return None


def document() -> dict:
    cells = []
    for cell in expand_cells(AXES):
        msg = decide(cell)
        if msg:
            cells.append(record(cell, reject=msg))
            continue
        if cell.backend == "triton" and cell.arch == "sm90":
            kernel = {**verified("sm90"), "level": "kernel", "function": "tiny.triton_decode"}
        else:
            kernel = not_run()
        rec = record(cell, kernel=kernel)
        if cell.model == "llama-3.1-8b" and cell.backend == "triton" and cell.spec != "none":
            rec["notes"] = [NOTE_DRAFT]
        cells.append(rec)
    run = {"matrix": "t", "matrix_file": "matrix/t.toml", "title": "Hand-made engine",
           "engine": {"name": "tiny", "version": "1.0"}, "host": {"arch": "sm90"}, "axes": AXES,
           "probes": PROBES, "models": {"deepseek-v3": {"mla": True}, "llama-3.1-8b": {"mla": False}},
           "cells_total": len(cells), "seed": 0, "kernel_dtype": "bf16"}
    return {"schema": "pytest-mla/result", "schema_version": 1, "run": run, "cells": cells}


HEADER = ["backend", "sm90", "sm100", "spec chain", "spec tree", "DCP", "DCP + spec", "page 1", "page 64", "verified on"]
EXPECTED_MLA = [
    # triton accepts everything; kernels verified on the sm90 host only: 12 of the 24 configurations.
    ["triton", "✅", "☑️", "✅", "✅", "✅", "✅", "✅", "✅", "sm90 · 12 of 24 [1]"],
    # flashmla: page 1 refused everywhere (plain configuration too), trees refused with page 64.
    # Feature columns skip the page-1 cells (their plain twin is refused); page 1 is refused where page 64 works.
    # No kernel ran for it here (a GPU is needed): "not run here", never "0 of 8".
    ["flashmla", "◐ [3]", "◐ [3]", "☑️", "⛔ [4]", "☑️", "☑️", "⛔ [2]", "☑️", "not run here: needs a GPU"],
    # trtllm_mla: sm90 refused; on sm100 trees refused with page 64; DCP with speculation refused.
    ["trtllm\\_mla", "⛔ [5]", "☑️", "☑️", "◐ [6]", "☑️", "⛔ [7]", "☑️", "☑️", "not run here: needs a GPU"],
]
EXPECTED_NON_MLA = [
    # triton with Llama: DCP refused; DCP + spec has no counted cell (DCP alone is refused): all its cells count.
    ["triton [8]", "✅", "☑️", "✅", "✅", "⛔ [9]", "⛔ [9]", "✅", "✅", "sm90 · 6 of 12 [1]"],
]
EXPECTED_NOTES = [
    "verified through tiny.triton\\_decode at the kernel level",
    f"ValueError: {MSG_PAGE}",
    "not with page size 1 (refused: \\[2\\])",
    f"ValueError: {MSG_TREE}",
    f"ValueError: {MSG_ARCH}",
    "not with page size 64 (refused: \\[4\\])",
    f"ValueError: {MSG_DCP}".replace("_", "\\_"),
    f"with spec eagle-1x3 or eagle-2x2: the engine noted “{NOTE_DRAFT}”",
    f"ValueError: {MSG_DCP_MLA}",
    "ValueError: flashmla backend can only be used with MLA models.",
    "ValueError: trtllm\\_mla backend can only be used with MLA models.",
]
EXPECTED_PROBES = [
    ["backend = bogus", "24", "with DCP 0", "⛔ ValueError: dcp\\_size must be &gt;= 1, got 0."],
    ["", "48", "with DCP 1 or 2", f"⛔ ValueError: {MSG_BOGUS}"],
    ["dcp = 0", "96", "", "⛔ ValueError: dcp\\_size must be &gt;= 1, got 0."],
]


def section(md: str, heading: str) -> list[str]:
    lines = md.splitlines()
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("#")), len(lines))
    return [ln for ln in lines[start:end] if ln]


def test_the_table_is_the_one_worked_out_by_hand():
    md = render_markdown(document(), view="backends")
    mla = table_after(md, "## MLA models: deepseek-v3")
    assert mla[0] == HEADER and mla[2:] == EXPECTED_MLA
    non_mla = table_after(md, "## Non-MLA models: llama-3.1-8b")
    assert non_mla[0] == HEADER and non_mla[2:] == EXPECTED_NON_MLA
    assert "Refused in every configuration: flashmla [10], trtllm\\_mla [5] [11]." in md.replace("\u00a0", " ")
    notes = section(md, "## Notes")
    assert notes == [f"{n}. {t}" for n, t in enumerate(EXPECTED_NOTES, start=1)]
    probes = table_after(md, "## Input validation")
    assert probes[0] == ["probe", "cells", "where", "the engine's answer"] and probes[2:] == EXPECTED_PROBES


def test_probe_values_never_reach_a_feature_entry():
    md = render_markdown(document(), view="backends")
    tables = md[:md.index("## Input validation")]
    assert "bogus" not in tables and "DCP 0" not in tables and "dcp0" not in tables
    assert "Invalid attention backend" not in tables and "dcp\\_size must be" not in tables


def test_every_partial_entry_and_every_refusal_has_a_note_and_each_refusal_is_quoted_once():
    md = render_markdown(document(), view="backends")
    notes = dict(line.split(". ", 1) for line in section(md, "## Notes"))
    for row in table_after(md, "## MLA models: deepseek-v3")[2:] + table_after(md, "## Non-MLA models: llama-3.1-8b")[2:]:
        for entry in row[1:-1]:
            if entry[0] in "◐⛔":
                refs = [r.strip("[]") for r in entry.split()[1:]]
                assert refs and all(r in notes for r in refs), entry
    for msg in (MSG_PAGE, MSG_TREE, MSG_ARCH, MSG_DCP_MLA):
        assert md.count(msg) == 1, msg


def test_the_published_document_opens_with_the_backends_view_then_the_grid():
    md = render_markdown(document())
    order = [md.index(h) for h in ("## Attention backends", "### MLA models: deepseek-v3", "## Input validation",
                                   "## Full matrix", "### deepseek-v3")]
    assert order == sorted(order)
    # the grid leaves the probes out too: no bogus row, no dcp0 in its summaries
    grid = md[md.index("## Full matrix"):]
    assert "| bogus" not in grid and "summarises dcp (2), page_size (2)" in grid
    assert render_markdown(copy.deepcopy(document())) == md  # same document, same bytes


def test_a_skip_rule_column_is_not_applicable_with_its_reason():
    doc = document()
    reason = "trtllm_mla has no page-1 kernel in this release"
    for c in doc["cells"]:
        co = c["coords"]
        if co["backend"] == "trtllm_mla" and co["page_size"] == 1 and co["dcp"] != 0 and co["arch"] == "sm100":
            c.update(verdict="skip", reason=reason, outcome=None, kernel=None,
                     expectation={**c["expectation"], "kind": "skip", "reason": reason})
    md = render_markdown(doc, view="backends")
    row = next(r for r in table_after(md, "## MLA models: deepseek-v3")[2:] if r[0] == "trtllm\\_mla")
    page1 = row[HEADER.index("page 1")]
    assert page1.startswith("➖ [")
    assert f"{page1.split()[1].strip('[]')}. not applicable: trtllm\\_mla has no page-1 kernel in this release" in md


def test_a_failed_cell_is_flagged_not_hidden():
    doc = document()
    bad = next(c for c in doc["cells"] if c["id"] == "deepseek-v3/flashmla/dcp1/eagle-1x3/sm100/page64")
    bad.update(verdict="fail", reason="expected accept, but the engine rejected it:\n  raised:   ValueError: nope")
    md = render_markdown(doc, view="backends")
    row = next(r for r in table_after(md, "## MLA models: deepseek-v3")[2:] if r[0] == "flashmla")
    assert row[HEADER.index("spec chain")].startswith("❌ [")  # a failure, not a refusal and not a known bug
    # the column counts page 64 only (page 1 is refused in the plain configuration): the note names the arch
    assert "on sm100: fail: expected accept, but the engine rejected it: raised: ValueError: nope" in md
    assert "## Failures" in md


def test_where_start_up_code_stopped_is_said_once_not_per_row():
    doc = document()
    stop = ("[target] FlashMLABackend.__init__ stopped at torch.empty(device='cuda') (flashmla_backend.py:90) "
            "after its checks")
    for c in doc["cells"]:
        if c["coords"]["backend"] == "flashmla":
            c["notes"] = [stop]
    md = render_markdown(doc, view="backends")
    assert "flashmla_backend.py" not in md and "flashmla\\_backend.py" not in md
    assert [r[0] for r in table_after(md, "## MLA models: deepseek-v3")[2:]] == ["triton", "flashmla", "trtllm\\_mla"]
    assert md.count("ran on the test host up to its first GPU step") == 1
    assert "ran on the test host up to its first GPU step" in render_html(doc, view="backends")
    # a cell's details keep them: there they are what the cell did
    assert "flashmla_backend.py:90" in render_html(doc)
    assert "first GPU step" not in render_markdown(document(), view="backends")  # no such note: nothing said


def test_html_and_terminal_show_the_same_entries():
    doc = document()
    page = render_html(doc, view="backends")
    assert "<script" not in page  # the backends page is static
    assert '<li id="note-3">not with page size 1 (refused: <a class="ref" href="#note-2">[2]</a>)</li>' in page
    body = page[page.index("<table"):]
    assert body.count('<span class="entry e-partial">◐</span>') == 3
    full = render_html(doc)
    assert full.index('id="backends-view"') < full.index('id="mla-data"')
    text = render_terminal(doc, view="backends")
    assert "  trtllm_mla  ⛔ [5]" in text and "[6] not with page size 64 (refused: [4])" in text
    assert "probe backend = bogus with DCP 1 or 2: ⛔ ValueError: Invalid attention backend: bogus (48 cells)" in text


@pytest.mark.parametrize("name", ["sglang-0.5.23", "vllm-0.34.0", "reference"])
def test_real_result_files(name):
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "reports" / f"{name}.json"
    doc = read_results(path)
    md = render_markdown(doc, view="backends")
    backends = [b for b in doc["run"]["axes"]["backend"] if b not in (doc["run"].get("probes") or {}).get("backend", [])]
    listed = md[:md.index("## Notes")] if "## Notes" in md else md
    for b in backends:  # one row, or a place among the refused, per non-probe backend and family
        assert f"| {b.replace('_', chr(92) + '_')} " in listed or b.replace("_", "\\_") in listed
    notes = {line.split(". ", 1)[0] for line in md.splitlines() if line[:1].isdigit() and ". " in line}
    for line in listed.splitlines():
        if line.startswith("| ") and "◐" in line:
            for cell in line.split(" | "):
                if "◐" in cell:
                    assert any(r.strip("[]") in notes for r in cell.split()[1:]), line


def test_arch_columns_name_their_platform_when_the_matrix_spans_several():
    """One column per arch either way; with archs of several platforms each title says which (CUDA, ROCm, CPU)."""
    from pytest_mla.report.backends import build_backends_view
    from pytest_mla.report.model import ReportModel

    from .helpers import make_document

    axes = {"model": ["deepseek-v3"], "backend": ["triton"], "dcp": [1], "spec": ["none"],
            "arch": ["sm90", "gfx942", "cpu_amx"]}
    doc = make_document(axes)
    view = build_backends_view(ReportModel(doc))
    assert [c.title for c in view.columns if c.kind == "arch"] == ["CUDA sm90", "ROCm gfx942", "CPU cpu_amx"]
    markdown = render_markdown(doc)
    header = next(line for line in markdown.splitlines() if line.startswith("| backend"))
    assert [part.strip() for part in header.strip("|").split("|")] == [
        "backend", "CUDA sm90", "ROCm gfx942", "CPU cpu\\_amx", "verified on"]
    assert "<th>ROCm gfx942</th>" in render_html(doc)
    single = build_backends_view(ReportModel(make_document({**axes, "arch": ["sm90", "sm100"]})))
    assert [c.title for c in single.columns if c.kind == "arch"] == ["sm90", "sm100"]
