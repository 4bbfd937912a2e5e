"""Findings in the reports: each distinct bug once (Markdown, HTML), cited by the notes; the diff names
findings that appeared, disappeared or changed their error."""

from __future__ import annotations

import copy
import json
import re

import pytest

from pytest_mla.cli import main
from pytest_mla.report.diff import diff_documents
from pytest_mla.report.findings import group_findings, not_a_finding
from pytest_mla.report.html import build_data, render_html
from pytest_mla.report.markdown import render_markdown
from pytest_mla.report.model import ReportModel

from .helpers import chromium, dump_dom, find, make_document

ASSERT_TEXT = "MLATokenToKVPool.set_kv_buffer has no DCP-aware write path."
TYPE_TEXT = "MLATokenToKVPool.set_kv_buffer() got an unexpected keyword argument 'dcp_kv_mask'"
LINK = "https://github.com/example/engine/issues/7"


def raised(error: str, text: str, function: str, *, level: str = "backend", emulated=()) -> dict:
    k = {"status": "failed", "where": "interpreter", "level": level, "case": {"batch": 2, "s_q": 1},
         "finding": True, "function": function, "raised": error, "raised_text": text,
         "frames": ["eng.model:Attention.forward (line 10)", f"{function} (line 99)"],
         "message": f"engine accepted this configuration, but its backend raised {error}: {text} in {function}"}
    if emulated:
        k["emulated"] = list(emulated)
    return k


def make_finding(doc, cell_id, kernel, *, xfail=None, links=()):
    cell = find(doc, cell_id)
    cell["kernel"] = kernel
    cell["verdict"] = "xfail" if xfail else "fail"
    cell["reason"] = kernel.get("message")
    cell["expectation"]["xfail"] = xfail
    if links:
        cell["expectation"]["links"] = list(links)
    return cell


def sglang_document():
    """The small matrix as an SGLang run: triton + DCP 2 decode raises (a known bug, on both archs),
    triton + DCP 2 verify raises another error (not declared), one decode cell is out of tolerance."""
    doc = make_document()
    doc["run"]["engine"]["name"] = "sglang"
    for arch in ("sm90", "sm100"):
        make_finding(doc, f"deepseek-v3/triton/dcp2/none/{arch}",
                     raised("AssertionError", ASSERT_TEXT, "eng.pool:Pool.set_kv_buffer"),
                     xfail="triton + DCP: the KV write asserts", links=(LINK,))
    make_finding(doc, "deepseek-v3/triton/dcp2/eagle-1x3/sm90",
                 raised("TypeError", TYPE_TEXT, "eng.backend:Backend._set_kv_buffer"))
    mismatch = {"status": "failed", "where": "sm90", "level": "backend", "function": "eng.backend:Backend.forward_decode",
                "message": "out: 812 of 4096 elements beyond abs 0.001 / rel 0.0157"}
    make_finding(doc, "deepseek-v3/triton/dcp4/none/sm90", mismatch)
    return doc


def test_cells_that_fail_alike_are_one_finding_numbered_in_matrix_order():
    doc = sglang_document()
    findings = group_findings(doc["cells"], "sglang")
    assert [(f.label, f.facts.title, len(f.records)) for f in findings] == [
        ("F1", "decode raises AssertionError in Pool.set_kv_buffer", 2),
        ("F2", "verify raises TypeError in Backend._set_kv_buffer", 1),
        ("F3", "decode out of tolerance in Backend.forward_decode", 1),
    ]
    assert findings[0].xfail == "triton + DCP: the KV write asserts" and findings[0].links == (LINK,)
    assert findings[1].xfail is None and findings[1].verdicts == {"fail": 1}
    # a number in the text (a shape, a count) does not split a finding; another function does
    a = make_finding(copy.deepcopy(doc), "deepseek-v3/triton/dcp4/eagle-1x3/sm90",
                     raised("TypeError", TYPE_TEXT + " (4 tokens)", "eng.backend:Backend._set_kv_buffer"))
    b = copy.deepcopy(a)
    b["id"] = "deepseek-v3/triton/dcp4/eagle-1x3/sm100"
    b["coords"] = dict(b["coords"], arch="sm100")
    b["kernel"] = raised("TypeError", TYPE_TEXT + " (16 tokens)", "eng.backend:Backend._set_kv_buffer")
    c = copy.deepcopy(b)
    c["kernel"] = raised("TypeError", TYPE_TEXT, "eng.backend:Backend.forward_extend")
    assert len(group_findings([a, b], "sglang")) == 1
    assert len(group_findings([a, b, c], "sglang")) == 2


def test_a_mismatch_only_nan_poisoned_free_slots_show_is_a_hardening_finding_of_its_own():
    """A record whose check matched once the free slots were zero-filled (``free_slot_only``): its own finding,
    never counted as a wrong output, and no claim that a server returns wrong tokens."""
    doc = sglang_document()
    nan = {"status": "failed", "where": "sm90", "level": "backend", "function": "eng.backend:Backend.forward_decode",
           "message": "out: 8192 NaN position(s) differ (first at [0, 0, 0, 0])", "free_slot_only": True}
    make_finding(doc, "deepseek-v3/triton/dcp4/none/sm100", nan)
    findings = group_findings(doc["cells"], "sglang")
    wrong, hardening = findings[2], findings[3]
    assert wrong.facts.title == "decode out of tolerance in Backend.forward_decode"
    assert hardening.facts.title == "decode: a NaN in a free cache slot reaches the output of Backend.forward_decode"
    assert "wrong" in wrong.facts.phase.short and "wrong" not in hardening.facts.phase.short
    assert hardening.facts.phase.short.startswith("hardening") and "zero-filled" in hardening.facts.phase.text
    md = render_markdown(doc, view="docs")
    assert "hardening: a NaN in a free KV slot reaches the output of Backend.forward\\_decode" in md


def test_a_raise_in_the_engines_cache_write_is_one_finding_of_that_step_for_decode_and_verify():
    """The decode and the verify cells met the same raise writing their cached tokens (``kernel.step``): one
    finding, titled by that step, whose server phase is the cache write, not a decode-graph capture."""
    doc = sglang_document()
    for cell_id, rows in (("deepseek-v3/triton/dcp4/none/sm100", 41), ("deepseek-v3/triton/dcp4/eagle-1x3/sm100", 48)):
        kernel = raised("AssertionError", f"{rows} rows for 26 slots", "eng.pool:Pool.set_mla_kv_buffer")
        make_finding(doc, cell_id, {**kernel, "step": "cache write"})
    findings = group_findings(doc["cells"], "sglang")
    (write,) = [f for f in findings if f.facts.step == "cache write"]
    assert write.facts.title == "cache write raises AssertionError in Pool.set_mla_kv_buffer"
    assert len(write.records) == 2
    assert write.facts.phase.when == "cache write" and "start-up" not in write.facts.phase.text
    assert "before its decode or verify step ran" in write.facts.phase.text
    md = render_markdown(doc)
    assert "### F4. cache write raises AssertionError in Pool.set\\_mla\\_kv\\_buffer" in md
    assert "a server fails writing a request's tokens into its KV cache" in md


def test_an_index_the_checks_guard_refused_is_not_claimed_to_raise_on_a_gpu():
    """``OutOfRangeRead`` is the emulated kernel's (or the write guard's) refusal of an index outside the cache:
    a GPU follows it without raising, so the finding says so instead of a server dying at start-up."""
    doc = sglang_document()
    make_finding(doc, "deepseek-v3/triton/dcp4/none/sm100",
                 raised("OutOfRangeRead", "page_table: index 80 at 0 is outside [0, 26): the kernel would read "
                        "unmapped or foreign rows", "eng.fa3:_call_fa3_kernel", level="emulated"))
    (oor,) = [f for f in group_findings(doc["cells"], "sglang") if f.facts.error == "OutOfRangeRead"]
    assert oor.facts.title == "decode indexes outside the cache in _call_fa3_kernel"
    phase = oor.facts.phase
    assert phase.when == "out of range" and "nothing raises where the check stopped" in phase.text
    assert "dies during start-up" not in phase.text and "illegal memory access" in phase.text
    page = render_markdown(doc, view="docs")
    assert "**indexes outside the cache in \\_call\\_fa3\\_kernel**" in page


def test_a_record_without_the_raised_fields_is_read_from_its_message():
    doc = sglang_document()
    cell = find(doc, "deepseek-v3/triton/dcp2/eagle-1x3/sm90")
    for key in ("raised", "raised_text", "frames"):
        del cell["kernel"][key]
    (f,) = [f for f in group_findings(doc["cells"], "sglang") if f.facts.error == "TypeError"]
    assert f.facts.text == TYPE_TEXT and f.facts.function == "eng.backend:Backend._set_kv_buffer"


def test_what_is_not_a_finding_says_why_in_one_line():
    doc = sglang_document()
    assert not_a_finding(find(doc, "deepseek-v3/triton/dcp1/none/sm90")).startswith("it passed: the engine accepted it")
    assert not_a_finding(find(doc, "deepseek-v3/trtllm_mla/dcp1/none/sm90")).startswith(
        "the engine refused it, as the matrix says (ValueError: TRTLLM MLA")
    assert "did not run here" in not_a_finding(find(doc, "deepseek-v3/flashmla/dcp1/none/sm90"))


def test_markdown_lists_each_finding_once_and_the_notes_cite_it():
    md = render_markdown(sglang_document())
    section = md.split("## Findings", 1)[1].split("\n## ", 1)[0]
    assert [line for line in section.splitlines() if line.startswith("### ")] == [
        "### F1. decode raises AssertionError in Pool.set\\_kv\\_buffer",
        "### F2. verify raises TypeError in Backend.\\_set\\_kv\\_buffer",
        "### F3. decode out of tolerance in Backend.forward\\_decode",
    ]
    # the engine's text once, in the Findings section; the notes cite the finding instead
    assert md.count("has no DCP-aware write path") == 1
    assert md.count(f"`AssertionError: {ASSERT_TEXT}`") == 1
    assert md.count("triton + DCP: the KV write asserts") == 1
    notes = [line for line in md.splitlines() if re.match(r"^\d+\. ", line)]
    assert any("known bug (xfail): F1, decode raises AssertionError in Pool.set\\_kv\\_buffer; a server fails at "
               "start-up (CUDA-graph capture) (see Findings)" in n for n in notes), notes
    assert any("fail: F2, verify raises TypeError" in n for n in notes), notes
    assert "- `deepseek-v3/triton/dcp2/eagle-1x3/sm90` **fail**: finding F2 (see Findings)" in md
    f1 = section.split("### F1.", 1)[1].split("### F2.", 1)[0]
    assert "- **known bug** (2 xfail): triton + DCP: the KV write asserts" in f1
    assert "- **cells** (2): model deepseek-v3 · backend triton · dcp 2 · spec none · arch sm90, sm100" in f1
    assert f"- **upstream**: <{LINK}>" in f1
    assert "- **reproduce**: `pytest-mla repro RESULT.json deepseek-v3/triton/dcp2/none/sm90 -o repro.py " \
           "--report bug.md`" in f1
    assert "**engine frames** (outermost first): `eng.model:Attention.forward (line 10)` → " in f1
    assert "at start-up: by default SGLang captures CUDA graphs of decode batches" in f1
    assert "with --disable-cuda-graph it starts and dies at its first decode step" in f1
    f2 = section.split("### F2.", 1)[1].split("### F3.", 1)[0]
    assert "- **not declared in the matrix** (1 fail)" in f2
    assert "CUDA graphs of target-verify batches" in f2 and "its first verify step" in f2
    f3 = section.split("### F3.", 1)[1]
    assert "- **out of tolerance** of the float64 reference: out: 812 of 4096 elements" in f3
    # every view that cites a finding carries the section
    for view in ("backends", "grid"):
        assert "## Findings" in render_markdown(sglang_document(), view=view)
    assert "## Findings" not in render_markdown(make_document())


def test_an_unknown_engine_says_the_server_phase_was_not_traced_and_emulated_says_the_kernel_did_not_run():
    doc = sglang_document()
    doc["run"]["engine"]["name"] = "tinyengine"
    for c in doc["cells"]:
        if c["kernel"] and c["kernel"].get("finding"):
            c["kernel"]["level"] = "emulated"
            c["kernel"]["emulated"] = ["flash_mla:flash_mla_with_kvcache"]
    md = render_markdown(doc)
    assert "- **a server meets it** not traced for tinyengine: at the latest its first decode step" in md
    assert ("- **the kernel itself did not run**: the engine's code ran around float64 emulations of "
            "flash\\_mla:flash\\_mla\\_with\\_kvcache; confirm on the GPU") in md


def test_html_cell_details_carry_the_finding_and_the_reproducer_command():
    doc = sglang_document()
    data = build_data(ReportModel(doc))
    strings, n_axes = data["strings"], len(data["axes"])
    by_id = {c["id"]: row for c, row in zip(doc["cells"], data["cells"])}
    row = by_id["deepseek-v3/triton/dcp2/none/sm100"]
    body = data["bodies"][row[n_axes]]
    finding, command = strings[body[8]], strings[body[9]]
    assert finding.startswith("F1: decode raises AssertionError in Pool.set_kv_buffer (2 cells)")
    assert f"upstream: {LINK}" in finding and "a server meets it at start-up" in finding
    assert command == "pytest-mla repro RESULT.json deepseek-v3/triton/dcp2/none/sm100 -o repro.py --report bug.md"
    plain = by_id["deepseek-v3/triton/dcp1/none/sm90"]
    plain_body = data["bodies"][plain[n_axes]]
    assert strings[plain_body[8]] == strings[plain_body[9]] == ""
    page = render_html(doc)
    assert '<div class="finding" id="finding-1"><h3>F1. decode raises AssertionError in Pool.set_kv_buffer</h3>' in page
    assert f'<a href="{LINK}">{LINK}</a>' in page
    assert page.count('class="finding"') == 3
    static = render_html(doc, view="backends")
    assert 'id="finding-3"' in static


browser = chromium()


@pytest.mark.skipif(browser is None, reason="chromium not installed (apt-get install -y chromium)")
def test_the_page_shows_the_reproducer_command_in_a_cells_details(tmp_path):
    page = tmp_path / "report.html"
    page.write_text(render_html(sglang_document()), encoding="utf-8")
    dom = dump_dom(browser, page.as_uri() + "#cell=deepseek-v3/triton/dcp2/eagle-1x3/sm90")
    aside = dom.split('<aside id="details">', 1)[1].split("</aside>", 1)[0]
    assert "<dt>reproduce</dt>" in aside
    assert ("pytest-mla repro RESULT.json deepseek-v3/triton/dcp2/eagle-1x3/sm90 -o repro.py --report bug.md"
            in aside)
    assert "<dt>finding</dt>" in aside and "F2: verify raises TypeError" in aside
    plain = dump_dom(browser, page.as_uri() + "#cell=deepseek-v3/triton/dcp1/none/sm90")
    assert "<dt>reproduce</dt>" not in plain.split('<aside id="details">', 1)[1]


def test_diff_names_findings_that_appeared_disappeared_and_changed(tmp_path):
    old = sglang_document()
    new = copy.deepcopy(old)
    # F1 fixed upstream on sm100 (the cell now passes and its kernel verifies), still there on sm90
    fixed = find(new, "deepseek-v3/triton/dcp2/none/sm100")
    fixed.update(verdict="xpass", reason=None)
    fixed["kernel"] = {"status": "verified", "where": "sm100", "level": "backend"}
    # F2's cell now fails otherwise: the bug moved
    make_finding(new, "deepseek-v3/triton/dcp2/eagle-1x3/sm90",
                 raised("AssertionError", ASSERT_TEXT, "eng.pool:Pool.set_kv_buffer"))
    # a new finding where the kernel used to verify
    make_finding(new, "deepseek-v3/triton/dcp1/eagle-1x3/sm90",
                 raised("RuntimeError", "CUDA graph capture failed", "eng.runner:Runner.capture"))
    d = diff_documents(old, new, old_name="old.json", new_name="new.json")
    kinds = {(f.kind, f.title): f for f in d.findings}
    gone = kinds[("disappeared", "decode raises AssertionError in Pool.set_kv_buffer")]
    assert gone.cells == ("deepseek-v3/triton/dcp2/none/sm100",) and gone.after == "now xpass ⚠️ xfail"
    assert gone.note == "still a finding in 1 other cell(s)"
    moved = kinds[("changed", "verify raises TypeError in Backend._set_kv_buffer → verify raises AssertionError in "
                              "Pool.set_kv_buffer")]
    assert moved.before == f"TypeError: {TYPE_TEXT}" and moved.after == f"AssertionError: {ASSERT_TEXT}"
    fresh = kinds[("appeared", "verify raises RuntimeError in Runner.capture")]
    assert fresh.cells == ("deepseek-v3/triton/dcp1/eagle-1x3/sm90",) and fresh.before is None
    assert len(d.findings) == 3
    assert d.summary_line().endswith("; findings: 1 appeared, 1 disappeared, 1 changed")
    text = d.text()
    assert "  FINDING DISAPPEARED: decode raises AssertionError in Pool.set_kv_buffer (1 cell(s): " \
           "deepseek-v3/triton/dcp2/none/sm100)" in text
    md = d.markdown()
    assert "#### Findings (3)" in md and "**Disappeared (fixed upstream?)**" in md and "**Appeared**" in md
    assert "**Changed error (the same cells fail otherwise)**" in md
    # through the command, in every format
    a, b = tmp_path / "old.json", tmp_path / "new.json"
    a.write_text(json.dumps(old)), b.write_text(json.dumps(new))
    assert main(["diff", str(a), str(b), "--format", "json", "-o", str(tmp_path / "d.json")]) == 1  # a regression
    data = json.loads((tmp_path / "d.json").read_text())
    assert sorted(f["kind"] for f in data["findings"]) == ["appeared", "changed", "disappeared"]
    # nothing to say when nothing changed
    assert diff_documents(old, copy.deepcopy(old)).findings == []


def test_when_a_server_meets_a_finding_depends_on_how_it_fails():
    """Read from the committed SGLang report: a raise in a decode step dies in start-up graph capture, a raise in
    a backend constructor dies while the server builds the backend (graphs or not), and an output out of
    tolerance never stops a server: it serves wrong tokens, silently."""
    from pathlib import Path

    from pytest_mla.report.results import read_results

    doc = read_results(Path(__file__).resolve().parents[2] / "reports" / "sglang-0.5.23.json")
    phases = {f.facts.title: f.facts.phase for f in group_findings(doc["cells"], "sglang")}
    capture = phases["decode raises AssertionError in MLATokenToKVPool.set_kv_buffer"]
    assert capture.when == "start-up" and "captures CUDA graphs of decode batches" in capture.text
    built = phases["decode raises AttributeError in FlashInferMLAIndicesUpdaterPrefill.__init__"]
    assert built.when == "start-up" and "while the model runner builds its attention backend" in built.text
    assert "--disable-cuda-graph does not avoid it" in built.text
    silent = phases["decode out of tolerance in FlashMLABackend.forward_decode"]
    assert silent.when == "first step" and silent.short == "a server serves wrong outputs, silently"
    assert "nothing raises" in silent.text and "CUDA graph" not in silent.short
