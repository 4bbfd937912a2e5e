"""HTML rendering: self-contained, escaped, and working in a real browser."""

from __future__ import annotations

import json
import re

import pytest

from pytest_mla.report.html import esc, render_html, script_json

from .helpers import chromium, dump_dom, find, make_document

EVIL = "<script>alert(1)</script> \"quoted\" & 'single' </script><!--"


def evil_document():
    doc = make_document()
    cell = find(doc, "deepseek-v3/trtllm_mla/dcp1/none/sm90")
    cell["outcome"]["message"] = EVIL
    cell["expectation"]["message"] = EVIL
    doc["run"]["title"] = EVIL
    doc["run"]["host"]["hostname"] = EVIL
    return doc


def test_self_contained():
    page = render_html(make_document())
    assert page.startswith("<!doctype html>")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<link" not in page and "@import" not in page
    assert "Do not edit" in page


def test_engine_strings_are_text_everywhere():
    page = render_html(evil_document())
    assert "<script>alert(1)" not in page
    assert page.count("<script") == 2  # the JSON blob and the page's own script
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # title and facts
    blob = page.split('<script type="application/json" id="mla-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in blob and ">" not in blob and "&" not in blob
    data = json.loads(blob)
    assert EVIL in data["strings"] or any(EVIL in s for s in data["strings"])


def test_escaping_helpers():
    assert esc('<a href="x">\'&') == "&lt;a href=&quot;x&quot;&gt;&#x27;&amp;"
    assert esc(None) == ""
    assert script_json({"m": "</script>\u2028&"}) == '{"m":"\\u003c/script\\u003e\\u2028\\u0026"}'


def test_embedded_data_has_every_cell():
    doc = make_document()
    page = render_html(doc)
    blob = page.split('id="mla-data">', 1)[1].split("</script>", 1)[0]
    data = json.loads(blob)
    assert len(data["cells"]) == len(doc["cells"])
    assert [a["name"] for a in data["axes"]] == ["model", "backend", "dcp", "spec", "arch"]


browser = chromium()
needs_browser = pytest.mark.skipif(browser is None, reason="chromium not installed (apt-get install -y chromium)")


@needs_browser
def test_browser_builds_the_matrix_and_filters(tmp_path):
    doc = evil_document()
    page = tmp_path / "report.html"
    page.write_text(render_html(doc), encoding="utf-8")
    dom = dump_dom(browser, page.as_uri())
    ids = re.findall(r'<span class="chip s-[a-z]+[^"]*" data-id="([^"]+)"', dom)
    assert sorted(ids) == sorted(c["id"] for c in doc["cells"])
    assert 'data-id="deepseek-v3/trtllm_mla/dcp2/eagle-1x3/sm100" data-state="rejected"' in dom
    assert 'data-id="deepseek-v3/triton/dcp1/none/sm90" data-state="verified"' in dom
    assert f'{len(doc["cells"])} of {len(doc["cells"])} cells shown' in dom
    # the engine's message is a title attribute, never markup
    assert "<script>alert" not in dom
    assert len(re.findall(r"<script", dom)) == 2

    filtered = dump_dom(browser, page.as_uri() + "#backend=triton&arch=sm100&state=accepted,verified")
    ids = re.findall(r'data-id="([^"]+)"', filtered)
    expected = [c["id"] for c in doc["cells"] if c["coords"]["backend"] == "triton" and c["coords"]["arch"] == "sm100"]
    assert ids and sorted(ids) == sorted(expected)
    assert f"{len(expected)} of {len(doc['cells'])} cells shown" in filtered

    pivot = dump_dom(browser, page.as_uri() + "#rows=backend&cols=arch,dcp&state=bad")
    assert "No cell matches the filters." in pivot


def hundred_thousand_cells():
    """100,000 cells (10 models × 10 backends × 4 DCP × 5 spec × 5 archs × 10 page sizes), few bodies."""
    import itertools

    axes = {"model": [f"m{i}" for i in range(10)], "backend": [f"be{i}" for i in range(10)], "dcp": [1, 2, 4, 8],
            "spec": ["none", "eagle-1x1", "eagle-1x3", "eagle-2x2", "eagle-4x3"],
            "arch": ["sm80", "sm86", "sm89", "sm90", "sm100"], "page_size": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]}
    doc = make_document()
    accepted = {"kind": "accept", "error": None, "message": None, "match": None, "xfail": None, "rule": None,
                "rule_line": None}
    cells = []
    for m, b, d, s, a, p in itertools.product(*axes.values()):
        refused = (int(b[2:]) + d) % 3 == 0
        cell_id = f"{m}/{b}/dcp{d}/{s}/{a}/page{p}"
        cells.append({"id": cell_id, "matrix": "t", "coords": {"model": m, "backend": b, "dcp": d, "spec": s,
                                                               "arch": a, "page_size": p},
                      "expectation": accepted, "outcome": {"kind": "rejected", "error": "ValueError",
                                                           "message": f"{b} refuses dcp{d}"} if refused else
                      {"kind": "accepted", "error": None, "message": None},
                      "verdict": "pass", "reason": None, "kernel": None})
    doc["cells"] = cells
    doc["run"].update(axes=axes, cells_total=len(cells), cells_reported=len(cells))
    return doc


@needs_browser
def test_a_hundred_thousand_cells_page_builds_rows_as_they_scroll_into_view(tmp_path):
    doc = hundred_thousand_cells()
    page = tmp_path / "big.html"
    page.write_text(render_html(doc), encoding="utf-8")
    dom = dump_dom(browser, page.as_uri(), timeout=180)
    assert "100000 of 100000 cells shown" in dom
    chips = len(re.findall(r'<span class="chip ', dom))
    assert 0 < chips <= 5000  # the first rows only: the page is usable at once
    assert re.search(r"\d+ more rows load as you scroll\.", dom)

    last = doc["cells"][-1]["id"]
    linked = dump_dom(browser, page.as_uri() + "#cell=" + last, timeout=180)
    assert f'<h2>✓ {last}</h2>' in linked  # the linked cell's row was built and its details shown
    assert f'data-id="{last}" data-state="accepted"' in linked

    refused = sum(1 for c in doc["cells"] if c["coords"]["backend"] == "be2" and c["outcome"]["kind"] == "rejected")
    filtered = dump_dom(browser, page.as_uri() + "#backend=be2&state=rejected", timeout=180)
    assert f"{refused} of 100000 cells shown" in filtered

    wide = dump_dom(browser, page.as_uri() + "#rows=model&cols=arch", timeout=180)  # 2,000 cells per table cell
    assert '<button class="more" type="button" data-more="60">+1940 more</button>' in wide
