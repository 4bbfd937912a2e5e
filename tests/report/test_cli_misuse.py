"""``pytest-mla``: the drift gate for every format and view, and misuse answered with one line."""

from __future__ import annotations

import json

import pytest

from pytest_mla.cli import main

from .helpers import find, make_document

pytest_plugins = ["pytester"]


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.fixture
def result(tmp_path):
    doc = make_document()
    doc["run"]["probes"] = {"dcp": [4]}
    return write(tmp_path, "r.json", json.dumps(doc))


def one_char_edit(text: str) -> tuple[str, int]:
    """``text`` with one character of a table row changed, and the 1-based line of the change."""
    lines = text.split("\n")
    rows = [i for i, line in enumerate(lines) if "triton" in line and ("|" in line or "<tr>" in line)]
    i = rows[0] if rows else next(i for i, line in enumerate(lines) if '"triton"' in line)  # the grid page's data
    col = lines[i].index("triton")
    lines[i] = lines[i][:col] + "T" + lines[i][col + 1:]
    return "\n".join(lines), i + 1


@pytest.mark.parametrize("suffix, view", [(s, v) for s in ("md", "html") for v in ("all", "backends", "grid")])
def test_check_passes_on_the_rendering_and_fails_after_a_one_character_edit(tmp_path, capsys, result, suffix, view):
    doc = tmp_path / f"published.{suffix}"
    assert main(["render", result, "--view", view, "-o", str(doc)]) == 0
    assert main(["check", str(doc), "--from", result]) == 0  # view and format read from the file itself
    assert "is up to date" in capsys.readouterr().out
    edited, line = one_char_edit(doc.read_text(encoding="utf-8"))
    doc.write_text(edited, encoding="utf-8")
    assert main(["check", str(doc), "--from", result]) == 1
    err = capsys.readouterr().err
    assert f"is stale: first difference at line {line}, column " in err
    assert "Triton" not in err or "published:" in err
    assert f"--format {suffix}" in err and (f"--view {view}" in err) == (view != "all")
    # the regeneration command it prints makes the file current again
    command = err.split("regenerate it with:\n  pytest-mla ")[1].split()
    assert main(command) == 0 and main(["check", str(doc), "--from", result]) == 0


def test_check_of_a_view_against_another_view_is_stale(tmp_path, capsys, result):
    doc = tmp_path / "published.md"
    assert main(["render", result, "--view", "backends", "-o", str(doc)]) == 0
    assert main(["check", str(doc), "--from", result, "--view", "grid"]) == 1
    assert main(["check", str(doc), "--from", result, "--view", "backends"]) == 0


def test_check_ignores_a_byte_order_mark_and_crlf(tmp_path, capsys, result):
    doc = tmp_path / "published.md"
    assert main(["render", result, "-o", str(doc)]) == 0
    doc.write_bytes(b"\xef\xbb\xbf" + doc.read_bytes().replace(b"\n", b"\r\n"))
    assert main(["check", str(doc), "--from", result]) == 0


def test_renderings_are_deterministic(tmp_path, result):
    for fmt in ("md", "html", "terminal"):
        a, b = tmp_path / f"a.{fmt}", tmp_path / f"b.{fmt}"
        assert main(["render", result, "-f", fmt, "-o", str(a)]) == 0
        assert main(["render", result, "-f", fmt, "-o", str(b)]) == 0
        assert a.read_bytes() == b.read_bytes()


MISUSES = {
    "unknown output extension": (["render", "{r}", "-o", "{t}/out.pdf"], "-o {t}/out.pdf: cannot tell the format from its extension '.pdf'"),
    "no output extension": (["render", "{r}", "-o", "{t}/out"], "cannot tell the format from a file name without an extension"),
    "suffix against --format": (["render", "{r}", "-f", "md", "-o", "{t}/out.html"], "a .html file, but --format md"),
    "view of json": (["render", "{r}", "--view", "backends", "-f", "json"], "--format json writes the result document as is"),
    "rows of html": (["render", "{r}", "-f", "html", "--rows", "model"], "--rows/--cols apply to Markdown"),
    "unwritable output": (["render", "{r}", "-o", "{t}/r.json/out.md"], "{t}/r.json/out.md: cannot write:"),
    "a directory as result": (["render", "{t}"], "{t}: is a directory, not a result file"),
    "check of a json file": (["check", "{r}", "--from", "{r}", "-f", "md"], "{t}/r.json: not a document pytest-mla rendered"),
    "check of a hand-written page": (["check", "{t}/readme.md", "--from", "{r}"], "{t}/readme.md: not a document pytest-mla rendered"),
    "a cell twice": (["render", "{t}/dup.json"], "{t}/dup.json: cells[1] repeats cell 'deepseek-v3/triton/dcp1/none/sm90' of cells[0]"),
    "merge one file twice": (["merge", "{r}", "{r}", "-o", "{t}/m.json"], "{t}/r.json is given twice"),
    "diff of two matrices": (["diff", "{r}", "{t}/other.json"], "is a result of matrix 't', {t}/other.json of matrix 'u'"),
    "check of a missing doc": (["check", "{t}/nope.md", "--from", "{r}"], "{t}/nope.md: cannot read"),
    "another schema": (["render", "{t}/junit.json"], "{t}/junit.json: not a pytest-mla result file"),
    "bad cell coords": (["merge", "{r}", "{t}/badcell.json", "-o", "{t}/m.json"], "{t}/badcell.json: malformed cell record at cells[0]: \"coords\" must be an object"),
    "bad run.probes": (["render", "{t}/badprobes.json"], "{t}/badprobes.json: malformed run.probes"),
}


@pytest.mark.parametrize("name", sorted(MISUSES))
def test_misuse_is_one_clear_line(tmp_path, capsys, result, name):
    doc = make_document()
    write(tmp_path, "other.json", json.dumps({**doc, "run": {**doc["run"], "matrix": "u"}}))
    write(tmp_path, "junit.json", json.dumps({"created": 1.0, "tests": [], "summary": {}}))
    write(tmp_path, "badcell.json", json.dumps({**doc, "cells": [{**doc["cells"][0], "coords": "deepseek"}]}))
    write(tmp_path, "badprobes.json", json.dumps({**doc, "run": {**doc["run"], "probes": ["dcp"]}}))
    write(tmp_path, "dup.json", json.dumps({**doc, "cells": [doc["cells"][0], doc["cells"][0]]}))
    write(tmp_path, "readme.md", "# My engine\n\n| backend | works |\n|---|---|\n| triton | yes |\n")
    argv, expected = MISUSES[name]
    t = str(tmp_path)
    code = main([a.format(r=result, t=t) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("pytest-mla: error: ") and err.count("\n") == 1, err
    assert expected.format(t=t) in err and "Traceback" not in err


def test_render_reads_standard_input(tmp_path, capsys, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(make_document())))
    assert main(["render", "-", "-f", "terminal"]) == 0
    assert capsys.readouterr().out.startswith("t: ")
    monkeypatch.setattr("sys.stdin", io.StringIO("not json"))
    assert main(["render", "-"]) == 2
    assert capsys.readouterr().err == "pytest-mla: error: <stdin>: not a pytest-mla result file (not JSON)\n"


def test_a_result_file_with_a_byte_order_mark_reads(tmp_path, capsys):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(make_document()).encode("utf-8"))
    assert main(["render", str(path), "-f", "terminal"]) == 0
    assert capsys.readouterr().out.startswith("t: ")


def test_diff_regression_lines_carry_the_expectation_and_the_engine_text(tmp_path, capsys):
    old = make_document()
    new = json.loads(json.dumps(old))
    find(new, "deepseek-v3/triton/dcp1/none/sm90").update(
        verdict="fail", reason="wrong message:\n  expected: a b c\n  raised:   a b d\n              ^ first difference at character 4")
    po, pn = write(tmp_path, "old.json", json.dumps(old)), write(tmp_path, "new.json", json.dumps(new))
    assert main(["diff", po, pn]) == 1
    out = capsys.readouterr().out
    assert ("REGRESSION deepseek-v3/triton/dcp1/none/sm90: pass ✅ verified → fail ❌ bad: wrong message: "
            "expected: a b c; raised: a b d (first difference at character 4)") in out


@pytest.mark.parametrize("argv", [
    ["render", "{r}", "-o", "{blocked}/out.md"],
    ["render", "{r}", "-f", "json", "-o", "{blocked}/out.json"],
    ["merge", "{r}", "-o", "{blocked}/out.json"],
    ["diff", "{r}", "{r}", "-o", "{blocked}/out.txt"],
    ["init", "sglang", "-o", "{blocked}/sglang.toml"],
], ids=["render", "render-json", "merge", "diff", "init"])
def test_an_output_path_that_cannot_be_written_is_one_line_naming_what_is_in_the_way(tmp_path, capsys, result, argv):
    blocked = tmp_path / "taken"
    blocked.write_text("a file where a folder should be")
    assert main([a.format(r=result, blocked=blocked) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pytest-mla: error: ")
    assert err.rstrip().endswith(f"cannot write: {blocked} is a file, not a folder")


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "0", "1e400", "ten"])
def test_repro_refuses_a_timeout_that_is_not_a_positive_finite_number(result, capsys, value):
    with pytest.raises(SystemExit) as exc:
        main(["repro", result, "deepseek-v3/triton/dcp1/none/sm90", "--engines", "auto", "--timeout", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("pytest-mla repro: error: argument --timeout: expected ")
    assert repr(value) in err
