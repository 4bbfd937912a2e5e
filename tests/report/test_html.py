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
