"""The ``pytest-mla`` command: round trip from a real run, check, explain, malformed input."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from pytest_mla.cli import main

from .helpers import SMALL_MATRIX, make_document

pytest_plugins = ["pytester"]


@pytest.fixture
def run_dir(pytester):
    """A small matrix run by the plugin itself: reports/m.{json,md,html}."""
    pytester.makefile(".toml", m=SMALL_MATRIX)
    result = pytester.runpytest("--mla-matrix=m.toml", "--mla-kernel=off", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=48)
    reports = pytester.path / "reports"
    assert sorted(p.name for p in reports.iterdir()) == ["m.docs.md", "m.html", "m.json", "m.md", "m.run.json"]
    return reports


def test_round_trip_render_equals_what_the_run_wrote(run_dir, tmp_path, capsys):
    result = str(run_dir / "m.json")
    for fmt in ("md", "html"):
        out = tmp_path / f"out.{fmt}"
        assert main(["render", result, "--format", fmt, "-o", str(out)]) == 0
        assert out.read_text(encoding="utf-8") == (run_dir / f"m.{fmt}").read_text(encoding="utf-8"), fmt
    assert main(["render", result, "-o", str(tmp_path / "again.json")]) == 0
    assert (tmp_path / "again.json").read_bytes() == (run_dir / "m.json").read_bytes()
    md = (run_dir / "m.md").read_text(encoding="utf-8")
    assert "## deepseek-v3" in md and "## llama-3.1-8b" in md
    assert "Decode context parallelism needs an MLA model" in md
    assert main(["render", result, "--format", "terminal"]) == 0
    assert capsys.readouterr().out.startswith("m: 48 cells, 48 pass")


def test_check_passes_then_catches_a_stale_table(run_dir, capsys):
    doc, result = run_dir / "m.md", str(run_dir / "m.json")
    assert main(["check", str(doc), "--from", result]) == 0
    capsys.readouterr()
    lines = doc.read_text(encoding="utf-8").splitlines(keepends=True)
    grid = lines.index("## Full matrix\n")
    row = next(i for i, line in enumerate(lines) if i > grid and line.startswith("| trtllm"))
    lines[row] = lines[row].replace("⛔", "✅", 1)  # a hand edit of the published grid
    doc.write_text("".join(lines), encoding="utf-8")
    assert main(["check", str(doc), "--from", result]) == 1
    captured = capsys.readouterr()
    assert "--- " in captured.out and "+++ " in captured.out and "-| " in captured.out
    assert "is stale" in captured.err and f"first difference at line {row + 1}, column " in captured.err
    # another layout is its own document: its banner says how it was rendered, and check follows it
    assert main(["render", result, "--rows", "backend", "--cols", "arch,dcp", "-o", str(doc)]) == 0
    assert "--rows backend --cols arch,dcp" in doc.read_text(encoding="utf-8").splitlines()[0]
    assert main(["check", str(doc), "--from", result]) == 0
    assert main(["check", str(doc), "--from", result, "--rows", "backend", "--cols", "arch,spec"]) == 1


def test_check_is_stable_across_reruns(pytester, run_dir):
    first = (run_dir / "m.md").read_text(encoding="utf-8")
    pytester.runpytest("--mla-matrix=m.toml", "--mla-kernel=off", "-p", "no:cacheprovider")
    assert (run_dir / "m.md").read_text(encoding="utf-8") == first


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


MALFORMED = {
    "truncated": (lambda: json.dumps(make_document())[:500], "invalid JSON (truncated?)"),
    "newer-version": (lambda: json.dumps({**make_document(), "schema_version": 3}),
                      "schema version 3 is newer than this pytest-mla reads (versions 1 and 2)"),
    "unknown-version": (lambda: json.dumps({**make_document(), "schema_version": 0}),
                        "schema version 0 is not supported (this pytest-mla reads versions 1 and 2)"),
    "not-a-report": (lambda: json.dumps({"tests": []}), "not a pytest-mla result file"),
    "toml": (lambda: SMALL_MATRIX, "not a pytest-mla result file (not JSON)"),
    "bad-cell": (lambda: json.dumps({**make_document(), "cells": [{"id": 3}]}), "malformed cell record at cells[0]"),
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
@pytest.mark.parametrize("command", ["render", "diff", "merge", "check"])
def test_malformed_input_is_one_line_exit_2(tmp_path, capsys, kind, command):
    text, expected = MALFORMED[kind]
    bad = write(tmp_path, "bad.json", text())
    good = write(tmp_path, "good.json", json.dumps(make_document()))
    argv = {"render": ["render", bad], "diff": ["diff", good, bad], "merge": ["merge", good, bad, "-o", str(tmp_path / "o.json")],
            "check": ["check", write(tmp_path, "doc.md", "x"), "--from", bad]}[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("pytest-mla: error: ") and err.count("\n") == 1, err
    assert expected in err and "Traceback" not in err


def test_missing_file_and_bad_axis(tmp_path, capsys):
    assert main(["render", str(tmp_path / "nope.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    good = write(tmp_path, "good.json", json.dumps(make_document()))
    assert main(["render", good, "--rows", "gpu"]) == 2
    assert "unknown axis 'gpu'" in capsys.readouterr().err


def test_explain_marks_the_deciding_rule(tmp_path, capsys):
    matrix = write(tmp_path, "m.toml", SMALL_MATRIX)
    assert main(["explain", matrix, "deepseek-v3/trtllm_mla/dcp2/eagle-1x3/sm100"]) == 0
    out = capsys.readouterr().out
    decided = [line for line in out.splitlines() if line.startswith("→")]
    assert len(decided) == 1 and decided[0].startswith("→ rule[3]") and "MATCHES → decides: reject" in decided[0]
    assert "✗ arch = 'sm90'   (cell: 'sm100')" in out
    assert "✓ dcp > 1   (cell: 2)" in out
    assert out.rstrip().endswith("cross-rank merge. Select cutedsl_mla.")
    assert main(["explain", matrix, "deepseek-v3/triton/dcp1/none/sm90"]) == 0
    out = capsys.readouterr().out
    assert "no rule decides" in out and out.rstrip().endswith("expectation: accept")


def test_explain_lists_each_reason_and_decides_only_when_one_holds(tmp_path, capsys):
    listed = SMALL_MATRIX.replace("[[rule]]", """[[rule]]
when = { backend = "flashmla" }
reject = { error = "ValueError", message = "flashmla: {reasons}" }
reasons = [
  { when = { arch = "sm100" }, text = "compute capability not supported" },
  { when = { dcp = ">1" }, text = "DCP not supported" },
]

[[rule]]""", 1)
    matrix = write(tmp_path, "m.toml", listed)
    assert main(["explain", matrix, "deepseek-v3/flashmla/dcp2/none/sm100"]) == 0
    out = capsys.readouterr().out
    assert "reason ✓ 'compute capability not supported'" in out and "reason ✓ 'DCP not supported'" in out
    assert out.rstrip().endswith("flashmla: ['compute capability not supported', 'DCP not supported']")
    assert main(["explain", matrix, "deepseek-v3/flashmla/dcp1/none/sm90"]) == 0
    out = capsys.readouterr().out
    assert "reason ✗ 'DCP not supported'" in out and re.search(r"rule\[0\] \(line \d+\): no match", out)
    assert out.rstrip().endswith("expectation: accept")


def test_explain_engine_version_gate(tmp_path, capsys):
    gated = SMALL_MATRIX + """
[[rule]]
when = { backend = "triton" }
engine_version = ">=2.0"
reject = { error = "ValueError", message = "triton removed" }
"""
    matrix = write(tmp_path, "m.toml", gated)
    assert main(["explain", matrix, "deepseek-v3/triton/dcp1/none/sm90", "--engine-version", "1.0"]) == 0
    assert "not for this engine version" in capsys.readouterr().out
    assert main(["explain", matrix, "deepseek-v3/triton/dcp1/none/sm90", "--engine-version", "2.1"]) == 0
    assert "expectation: reject with ValueError: triton removed" in capsys.readouterr().out


@pytest.mark.parametrize("cell, expected", [
    ("deepseek-v3/triton/dcp1/none/sm95", "arch 'sm95' is not in the matrix"),
    ("deepseek-v3/triton", "has 2 parts"),
    ("deepseek-v3/triton/dcp1/none/sm90/tp8", "the matrix has no tp axis"),
])
def test_explain_bad_cell(tmp_path, capsys, cell, expected):
    matrix = write(tmp_path, "m.toml", SMALL_MATRIX)
    assert main(["explain", matrix, cell]) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1


def test_explain_broken_matrix(tmp_path, capsys):
    broken = write(tmp_path, "m.toml", SMALL_MATRIX.replace('"llama-3.1-8b"]', '"llama-3.1-8b", "no-such-model"]').replace("[engine]", "[engine]\nbogus = 1"))
    assert main(["explain", broken, "deepseek-v3/triton/dcp1/none/sm90"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "m.toml:" in err and "more problems" in err
    assert main(["explain", write(tmp_path, "t.toml", "axes = [unclosed"), "a/b/dcp1/none/sm90"]) == 2
    assert "invalid TOML" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["render", "merge", "diff", "check", "explain"])
def test_help(capsys, command):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    assert f"pytest-mla {command}" in capsys.readouterr().out


def test_console_script_runs(tmp_path):
    good = write(tmp_path, "good.json", json.dumps(make_document()))
    res = subprocess.run([sys.executable, "-c", "import sys; from pytest_mla.cli import main; sys.exit(main())",
                          "render", good, "-f", "terminal"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.startswith("t: ")


@pytest.mark.parametrize("given", ["deepseek-v3-trtllm_mla-dcp2-eagle-1x3-sm100",
                                   "m.toml::deepseek-v3-trtllm_mla-dcp2-eagle-1x3-sm100",
                                   "deepseek-v3/trtllm_mla/dcp2/eagle-1x3/sm100"])
def test_explain_takes_the_ids_pytest_prints(tmp_path, capsys, given):
    matrix = write(tmp_path, "m.toml", SMALL_MATRIX)
    assert main(["explain", matrix, given]) == 0
    out = capsys.readouterr().out
    assert out.startswith("cell deepseek-v3/trtllm_mla/dcp2/eagle-1x3/sm100\n")
    assert "→ rule[3]" in out


@pytest.mark.parametrize("given, nearest", [
    ("deepseek-v3-fastmla-dcp2-eagle-1x3-sm90", "deepseek-v3/flashmla/dcp2/eagle-1x3/sm90"),
    ("deepseek-v3/flashmlaa/dcp2/eagle-1x3/sm90", "deepseek-v3/flashmla/dcp2/eagle-1x3/sm90"),
])
def test_explain_suggests_the_nearest_cell(tmp_path, capsys, given, nearest):
    matrix = write(tmp_path, "m.toml", SMALL_MATRIX)
    assert main(["explain", matrix, given]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.rstrip().endswith(f"; did you mean {nearest}?")


def test_render_writes_several_formats_from_one_read(run_dir, tmp_path, capsys):
    result = str(run_dir / "m.json")
    md, page = tmp_path / "both.md", tmp_path / "both.html"
    assert main(["render", result, "-o", str(md), "-o", str(page)]) == 0
    assert md.read_text(encoding="utf-8") == (run_dir / "m.md").read_text(encoding="utf-8")
    assert page.read_text(encoding="utf-8") == (run_dir / "m.html").read_text(encoding="utf-8")
    assert main(["render", result, "-o", str(md), "-o", str(page), "--format", "md"]) == 2
    assert "several -o: each file's format comes from its suffix; drop --format" in capsys.readouterr().err
    assert main(["render", result, "-o", str(md), "-o", "-"]) == 2
    assert "several -o: each must be a file" in capsys.readouterr().err
