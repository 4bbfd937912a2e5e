"""The result file, schema version 2: compact, lossless, written as the run goes, old files still read."""

from __future__ import annotations

import json
import re

import pytest

from pytest_mla.cli import main
from pytest_mla.report.html import render_html
from pytest_mla.report.markdown import render_markdown
from pytest_mla.report.results import (
    ResultFileError, ResultStream, read_results, results_text, split_run, write_results,
)

from .helpers import make_document

LONG = "the engine refused this configuration for a reason that takes a long sentence to say: " * 3
TRACEBACK = "Traceback (most recent call last):\n" + "".join(f'  File "x.py", line {i}, in f\n' for i in range(40))


def exact(value):
    """Text that tells apart what == does not (1, 1.0 and true; 0.0 and -0.0; key order)."""
    return json.dumps(value, ensure_ascii=False)


def odd_records():
    """Records with values of every JSON kind, where a fixed field list would lose them."""
    doc = make_document()
    cells = doc["cells"][:6]
    cells[0]["kernel"] = {"status": "verified", "level": "emulated", "emulated": ["flash_mla", "sgl_kernel"],
                          "power": {"planted": [{"fault": "scale x1.05", "caught": True, "err": 0.0132},
                                                {"fault": "dropped mask", "caught": False, "err": -0.0}],
                                    "n": 2, "share": 1.0, "none": None, "empty": {}, "nothing": []},
                          "big": 2 ** 70, "negative": -3, "one": 1, "one_float": 1.0, "yes": True}
    cells[1]["notes"] = ["ünïcødé ✅ and a line\u2028separator", "1", "", "true", "null"]
    cells[2]["extra"] = {"dotted.key": {"nested": [[1, [2, [3]]], {"a": {"b": {"c": "deep"}}}]}, "": "empty key"}
    cells[3]["traceback"] = TRACEBACK
    cells[4]["reason"] = "1"  # a string that looks like a reference
    cells[5]["coords"] = dict(cells[5]["coords"], tp=8)
    # values that compare equal in Python but are different JSON: each stored as itself
    for c, twin in zip(cells, [{"v": 1}, {"v": True}, {"v": 1.0}, {"v": 0.0}, {"v": -0.0}, {"v": [1, "1"]}]):
        c["twin"] = twin
    return doc["run"], cells


def test_any_json_value_comes_back_exactly(tmp_path):
    run, cells = odd_records()
    path = write_results(tmp_path / "r.json", run, cells)
    back = read_results(path)
    assert exact(back["cells"]) == exact(cells)
    assert exact({k: back["run"][k] for k in run}) == exact(run)
    assert type(back["cells"][0]["kernel"]["one"]) is int and type(back["cells"][0]["kernel"]["one_float"]) is float
    assert back["cells"][0]["kernel"]["yes"] is True
    # written again, the same bytes (what makes a committed report change only when an outcome does)
    assert results_text(back["run"], back["cells"]) == path.read_text(encoding="utf-8")


def test_repeated_values_are_stored_once(tmp_path):
    doc = make_document()
    for c in doc["cells"]:
        c["notes"] = [LONG]
        c["traceback"] = TRACEBACK
        if c["kernel"]:
            c["kernel"]["functions"] = ["sglang.srt.layers.attention.triton_backend:TritonAttnBackend.forward_decode"]
    path = write_results(tmp_path / "r.json", doc["run"], doc["cells"])
    text = path.read_text(encoding="utf-8")
    assert text.count(json.dumps(LONG)[1:-1]) == 1
    assert text.count("line 39, in f") == 1
    assert text.count("TritonAttnBackend.forward_decode") == 1
    assert text.count('"expectation"') == 1  # record keys once, in the cells' shape
    assert doc["cells"][7]["id"] not in text and doc["cells"][7]["nodeid"] not in text  # derived from coords
    plain = json.dumps(doc, indent=1, ensure_ascii=False)  # what version 1 wrote
    assert len(text) < len(plain) / 5
    assert exact(read_results(path)["cells"]) == exact(doc["cells"])


def test_a_version_1_file_renders_merges_diffs_and_checks_like_its_version_2_copy(tmp_path, capsys):
    old = tmp_path / "old.json"
    old.write_text(json.dumps(make_document(), indent=1), encoding="utf-8")  # how version 1 was written
    new = tmp_path / "new.json"
    assert main(["render", str(old), "-o", str(new)]) == 0  # render -f json converts to the current version
    assert json.loads(new.read_text(encoding="utf-8").split("\n", 1)[0] + '"run":{},"cells":[]}')[
        "schema_version"] == 2
    a, b = read_results(old), read_results(new)
    assert a["schema_version"] == 1 and b["schema_version"] == 2
    assert exact(a["cells"]) == exact(b["cells"])
    assert render_markdown(a) == render_markdown(b) and render_html(a) == render_html(b)
    for fmt in ("md", "html"):
        page = tmp_path / f"page.{fmt}"
        assert main(["render", str(old), "-o", str(page)]) == 0
        assert main(["check", str(page), "--from", str(new)]) == 0
    assert main(["diff", str(old), str(new)]) == 0
    assert "0 regression(s), 0 fix(es), 0 changed, 0 new, 0 gone" in capsys.readouterr().out
    other = make_document(host_arch="sm100", hostname="host-b", only_arch="sm100")
    (tmp_path / "b.json").write_text(json.dumps(other), encoding="utf-8")
    doc_a = make_document(only_arch="sm90")
    write_results(tmp_path / "a.json", doc_a["run"], doc_a["cells"])
    assert main(["merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "-o", str(tmp_path / "m.json")]) == 0
    merged = read_results(tmp_path / "m.json")
    assert len(merged["cells"]) == len(doc_a["cells"]) + len(other["cells"]) and merged["schema_version"] == 2


def test_a_future_version_is_refused_in_one_line_naming_both_versions(tmp_path, capsys):
    doc = make_document()
    text = results_text(doc["run"], doc["cells"]).replace('"schema_version":2', '"schema_version":7', 1)
    for name, body in (("whole.json", text), ("cut.json", text[:len(text) // 2])):
        path = tmp_path / name
        path.write_text(body, encoding="utf-8")
        assert main(["render", str(path)]) == 2
        err = capsys.readouterr().err
        assert err == (f"pytest-mla: error: {path}: schema version 7 is newer than this pytest-mla reads "
                       "(versions 1 and 2); upgrade pytest-mla to read it\n")


def stream(path, doc, n=None, *, finish=False):
    head, end = split_run(doc["run"])
    s = ResultStream(path, head)
    for c in doc["cells"][:n]:
        s.add(c)
    if finish:
        return s.finish(end)
    s.close()
    return s.partial  # where a stream that did not finish left its cells


def test_a_file_whose_writer_was_killed_is_read_to_its_last_whole_cell(tmp_path, capsys):
    doc = make_document()
    total = len(doc["cells"])
    doc["run"]["cells_selected"] = total
    path = stream(tmp_path / "r.json", doc, 20)
    text = path.read_text(encoding="utf-8")
    assert not text.rstrip().endswith("}")  # no end: the writer stopped
    cuts = {"after a whole cell": (len(text), 20), "inside a cell": (len(text) - 7, 19)}
    for label, (size, whole) in cuts.items():
        cut = tmp_path / "cut.json"
        cut.write_text(text[:size], encoding="utf-8")
        back = read_results(cut)
        assert exact(back["cells"]) == exact(doc["cells"][:whole]), label
        assert back["run"]["complete"] is False and back["run"]["interrupted"] is True
        assert back["run"]["counts"]["pass"] == sum(c["verdict"] == "pass" for c in doc["cells"][:whole])
        assert back["warnings"] == [f"{cut}: cut short (its writer stopped): read the {whole} whole cell(s) before "
                                    f"the cut; {total - whole} of the {total} cells it was to report are missing"]
        assert main(["render", str(cut), "-o", str(tmp_path / "cut.md")]) == 0
        assert capsys.readouterr().err == f"pytest-mla: warning: {back['warnings'][0]}\n"
        assert "incomplete" in (tmp_path / "cut.md").read_text(encoding="utf-8").lower()
    header_only = tmp_path / "head.json"
    header_only.write_text(text[:text.index('"cells"') - 5], encoding="utf-8")
    with pytest.raises(ResultFileError, match=r"head\.json: cut short in its run facts; no cell to read"):
        read_results(header_only)


def test_a_finished_stream_is_the_same_file_as_one_written_at_once(tmp_path):
    doc = make_document()
    streamed = stream(tmp_path / "s.json", doc, finish=True)
    whole = write_results(tmp_path / "w.json", doc["run"], doc["cells"])
    assert streamed.read_bytes() == whole.read_bytes()
    empty = ResultStream(tmp_path / "e.json", split_run(doc["run"])[0]).finish({"complete": False})
    assert read_results(empty)["cells"] == [] and read_results(empty)["run"]["complete"] is False


def test_cells_of_other_writers_read_the_same(tmp_path):
    """Literals and inline containers where this writer puts references; keys that are derived."""
    doc = make_document()
    text = results_text(doc["run"], doc["cells"][:1])
    head, tail = text.split('"cells":[\n', 1)
    cells = ('{"values":[["id","verdict","coords","notes","ok","nodeid"],1]},\n'  # 0: keys, 1: the integer 1
             '[0,"a/b","pass",{"model":"deepseek-v3","backend":"triton","dcp":1,"spec":"none","arch":"sm90"},'
             '[1.5,null,{"x":[false]}],true,"m.toml::x"],\n'
             '{"values":[[{"derive":"id","join":"/","prefix":""},"verdict",["coords",["model","dcp"]],'
             '{"derive":"nodeid","join":"-","prefix":"m.toml::"}],"pass","k2",7]},\n'
             '[2,3,4,5]\n],' + tail.split("\n],", 1)[1])  # the cells, then this file's "end"
    path = tmp_path / "other.json"
    path.write_text(head + '"cells":[\n' + cells, encoding="utf-8")
    first, second = read_results(path)["cells"]
    assert exact(first) == exact({"id": "a/b", "verdict": "pass", "coords": {"model": "deepseek-v3", "backend": "triton",
                                  "dcp": 1, "spec": "none", "arch": "sm90"}, "notes": [1.5, None, {"x": [False]}],
                                  "ok": True, "nodeid": "m.toml::x"})
    assert exact(second) == exact({"id": "k2/dcp7", "verdict": "pass", "coords": {"model": "k2", "dcp": 7},
                                   "nodeid": "m.toml::k2-dcp7"})


def test_a_reference_to_an_undefined_value_is_one_line(tmp_path):
    doc = make_document()
    text = results_text(doc["run"], doc["cells"][:3])
    last = text.rindex("\n[")
    broken = text[:last + 2] + "999," + text[last + 2 + text[last + 2:].index(",") + 1:]
    path = tmp_path / "bad.json"
    path.write_text(broken, encoding="utf-8")
    with pytest.raises(ResultFileError, match=re.escape(f"{path}: malformed cells[") + r".*values\[999\]"):
        read_results(path)
