"""Every reader refuses what is not one sane document, in one line naming the file: data after the
document, nesting past ``MAX_NESTING``, input past the size limit; merge refuses runs of different
settings unless told; a terminal that is not UTF-8 still gets its report."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pytest_mla.cli import main
from pytest_mla.core.errors import MatrixError
from pytest_mla.core.limits import MAX_INPUT_BYTES_ENV, MAX_NESTING, read_bounded
from pytest_mla.core.matrix import load_matrix
from pytest_mla.report.merge import SETTINGS
from pytest_mla.report.results import ResultFileError, read_results, results_text

from .helpers import make_document

DEEP = 100_000  # past any stack: Python's parsers give up with a RecursionError
NESTING = f"nested deeper than {MAX_NESTING} levels of arrays and objects"


def v2_text(doc=None):
    doc = doc or make_document()
    return results_text(doc["run"], doc["cells"])


def v1_text(doc=None):
    return json.dumps(doc or make_document())


def lines_of(text):
    return text.count("\n")


#: Each command that reads a result file, with the file where it reads it ({r}) and a good second one ({g}).
READERS = {
    "render": ["render", "{r}"],
    "merge": ["merge", "{g}", "{r}", "-o", "{t}/out.json"],
    "diff": ["diff", "{g}", "{r}"],
    "check": ["check", "{t}/doc.md", "--from", "{r}"],
    "suggest": ["suggest", "{r}"],
    "repro": ["repro", "{r}", "deepseek-v3/triton/dcp1/none/sm90"],
}


def run_reader(tmp_path, capsys, command, bad_text, env=None):
    good = tmp_path / "good.json"
    good.write_text(v2_text(), encoding="utf-8")
    bad = tmp_path / "bad.json"
    bad.write_text(bad_text, encoding="utf-8")
    assert main(["render", str(good), "-o", str(tmp_path / "doc.md")]) == 0
    capsys.readouterr()
    for name, value in (env or {}).items():  # after the good files are written
        os.environ[name] = value
    argv = [a.format(r=bad, g=good, t=tmp_path) for a in READERS[command]]
    code = main(argv)
    err = capsys.readouterr().err
    return code, err, str(bad)


def assert_one_line(code, err, expected):
    assert code == 2, err  # 2: an unusable input; diff's 1 means a regression
    assert "Traceback" not in err
    assert err == f"pytest-mla: error: {expected}\n"


TRAILING = {  # name → (text, line, column of what follows the document)
    "two v2 files joined": (v2_text() + v2_text(), lines_of(v2_text()) + 1, 1),
    "garbage after v2": (v2_text() + "garbage\n", lines_of(v2_text()) + 1, 1),
    "two v1 files joined": (v1_text() + v1_text(), 1, len(v1_text()) + 1),
    "garbage after v1": (v1_text() + "\n\x00\x01", 2, 1),
}


@pytest.mark.parametrize("command", READERS)
@pytest.mark.parametrize("case", TRAILING)
def test_data_after_the_document_is_refused_naming_its_line(tmp_path, capsys, command, case):
    text, line, col = TRAILING[case]
    code, err, bad = run_reader(tmp_path, capsys, command, text)
    assert_one_line(code, err, f"{bad}:{line}: data after the end of the result document (column {col}); "
                               "one file holds one document")


def test_a_file_cut_short_with_another_after_it_is_not_taken_for_a_cut(tmp_path):
    text = v2_text()
    cut = text[:text.index("\n[", len(text) // 2) + 5]  # inside a cell line, as a killed writer leaves it
    path = tmp_path / "r.json"
    path.write_text(cut, encoding="utf-8")
    assert read_results(path)["warnings"]  # alone: a cut, read to its last whole cell
    path.write_text(cut + "\n" + text, encoding="utf-8")
    line = lines_of(cut) + 1
    with pytest.raises(ResultFileError, match=f"^{path}:{line}: invalid JSON: an entry that does not end on "
                                              f"its line .*; not a file cut short by its writer$"):
        read_results(path)


def deep_metadata(levels):
    text = v2_text()
    return text.replace('"metadata": {}', '"metadata": ' + "[" * levels + "]" * levels, 1)


@pytest.mark.parametrize("command", READERS)
def test_a_json_nesting_bomb_is_one_line_with_its_line(tmp_path, capsys, command):
    text = deep_metadata(DEEP)
    at = text.index("[" * (MAX_NESTING + 1))
    line = text.count("\n", 0, at) + 1
    col = at - text.rfind("\n", 0, at) + MAX_NESTING - 3  # the document, run, engine hold three levels
    code, err, bad = run_reader(tmp_path, capsys, command, text)
    assert_one_line(code, err, f"{bad}:{line}: {NESTING} (column {col})")


@pytest.mark.parametrize("version", [1, 2])
def test_nesting_past_the_limit_that_python_could_parse_is_refused_with_its_path(tmp_path, version):
    doc = make_document()
    doc["run"]["engine"]["metadata"] = json.loads("[" * 150 + "]" * 150)
    path = tmp_path / "r.json"
    path.write_text(v1_text(doc) if version == 1 else v2_text(doc), encoding="utf-8")
    with pytest.raises(ResultFileError, match=f"^{path}: run.engine.metadata\\[0\\]\\[0\\]\\[0\\]\\[0\\]…: {NESTING}$"):
        read_results(path)
    doc["run"]["engine"]["metadata"] = json.loads("[" * 90 + "]" * 90)  # deep, but within the limit
    path.write_text(v1_text(doc) if version == 1 else v2_text(doc), encoding="utf-8")
    assert read_results(path)["run"]["engine"]["metadata"]


def test_references_that_nest_past_the_limit_are_refused(tmp_path):
    """Version 2 nests values by reference, without nesting the text: the reader counts levels."""
    text = v2_text()
    head, tail = text.split('"cells":[\n', 1)
    chain = ",".join(["[]"] + [f"[{i}]" for i in range(2 * MAX_NESTING)])
    path = tmp_path / "r.json"
    path.write_text(head + '"cells":[\n{"values":[' + chain + ']},\n' + tail, encoding="utf-8")
    with pytest.raises(ResultFileError, match=f"^{path}: malformed cells\\[0\\]: values\\[{MAX_NESTING}\\]: {NESTING}$"):
        read_results(path)


@pytest.mark.parametrize("command", ["render", "diff", "merge"])
def test_an_input_past_the_size_limit_is_one_line(tmp_path, capsys, monkeypatch, command):
    monkeypatch.setenv(MAX_INPUT_BYTES_ENV, "")  # restored after the test
    text = v2_text() + " " * 6000  # the bad file is the larger: over the limit, the good one under it
    size = len(text.encode())
    code, err, bad = run_reader(tmp_path, capsys, command, text, env={MAX_INPUT_BYTES_ENV: "8K"})
    assert_one_line(code, err, f"{bad}: is {size / 1024:.3g} KiB past the 8 KiB input limit; not read "
                               f"(set {MAX_INPUT_BYTES_ENV} to read larger files)")


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero here")
@pytest.mark.parametrize("argv", [["render", "/dev/zero"], ["explain", "/dev/zero", "x"],
                                  ["check", "/dev/zero", "--from", "/dev/zero"]])
def test_endless_input_ends_at_the_limit_not_in_memory(capsys, monkeypatch, argv):
    monkeypatch.setenv(MAX_INPUT_BYTES_ENV, "1M")
    code = main(argv)
    err = capsys.readouterr().err
    assert_one_line(code, err, "/dev/zero: goes on past the 1 MiB input limit; not read "
                               f"(set {MAX_INPUT_BYTES_ENV} to read larger files)")


def test_standard_input_is_bounded_too(capsys, monkeypatch):
    import io

    monkeypatch.setenv(MAX_INPUT_BYTES_ENV, "64")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(v2_text().encode())))
    assert main(["render", "-"]) == 2
    assert capsys.readouterr().err == ("pytest-mla: error: <stdin>: goes on past the 64 bytes input limit; not read "
                                       f"(set {MAX_INPUT_BYTES_ENV} to read larger files)\n")


@pytest.mark.parametrize("value", ["lots", "-1", "1T"])
def test_a_limit_that_is_not_a_size_is_one_line(tmp_path, capsys, monkeypatch, value):
    monkeypatch.setenv(MAX_INPUT_BYTES_ENV, "")  # restored after the test
    code, err, bad = run_reader(tmp_path, capsys, "render", v2_text(), env={MAX_INPUT_BYTES_ENV: value})
    assert_one_line(code, err, f"{MAX_INPUT_BYTES_ENV}={value!r}: not a size (bytes, or a number with K, M or G)")


def test_a_regular_file_is_read_whole_at_the_limit(tmp_path, monkeypatch):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 1000)
    monkeypatch.setenv(MAX_INPUT_BYTES_ENV, "1000")
    assert read_bounded(path, "f") == b"x" * 1000


# -- matrix files (TOML) ------------------------------------------------------------------
MATRIX_HEAD = '[engine]\nname = "reference"\n'


@pytest.mark.parametrize("body, line, message", [
    ("x = " + "[" * DEEP + "\n", 3, f"invalid TOML: nested deeper than {MAX_NESTING} levels of arrays and tables "
                                    f"(column {MAX_NESTING + 5})"),
    ("x = " + "{a = " * DEEP + "\n", 3, f"invalid TOML: nested deeper than {MAX_NESTING} levels of arrays and tables "
                                        f"(column {5 * MAX_NESTING + 5})"),
    ("[" + ".".join(["a"] * 150) + "]\nx = 1\n", None,
     f"a.a.a.a.a.a…: nested deeper than {MAX_NESTING} levels of arrays and tables"),
], ids=["arrays", "inline tables", "dotted keys"])
def test_a_toml_nesting_bomb_is_one_line(tmp_path, capsys, body, line, message):
    path = tmp_path / "m.toml"
    path.write_text(MATRIX_HEAD + body, encoding="utf-8")
    with pytest.raises(MatrixError) as info:
        load_matrix(path)
    where = f"{path}:{line}" if line else str(path)
    assert str(info.value) == f"{where}: {message}"
    assert main(["explain", str(path), "x"]) == 2
    err = capsys.readouterr().err
    assert err == f"pytest-mla: error: {where}: {message}\n" and "Traceback" not in err


def test_a_matrix_past_the_size_limit_is_one_line(tmp_path, monkeypatch):
    path = tmp_path / "m.toml"
    path.write_text(MATRIX_HEAD + "#" * 2000 + "\n", encoding="utf-8")
    monkeypatch.setenv(MAX_INPUT_BYTES_ENV, "1K")
    with pytest.raises(MatrixError) as info:
        load_matrix(path)
    assert str(info.value) == (f"{path}: is 1.98 KiB past the 1 KiB input limit; not read "
                               f"(set {MAX_INPUT_BYTES_ENV} to read larger files)")


# -- merge: what ran must agree ---------------------------------------------------------------
MIXES = {
    "engine": (lambda run: run["engine"].update(name="vllm"), "engine 'reference' vs 'vllm'", "reference / vllm"),
    "kernel_dtype": (lambda run: run.update(kernel_dtype="fp32"), "kernel_dtype 'bf16' vs 'fp32'", "bf16 / fp32"),
    "seed": (lambda run: run.update(seed=7), "seed 0 vs 7", "0 / 7"),
    # a file from before tiers was a full run
    "tier": (lambda run: run.update(tier="quick"), "tier 'full' vs 'quick'", "full / quick"),
}


def test_every_setting_merge_compares_is_tested():
    assert set(MIXES) == set(SETTINGS)


@pytest.mark.parametrize("setting", MIXES)
def test_merge_refuses_runs_of_different_settings_unless_told(tmp_path, capsys, setting):
    change, said, joined = MIXES[setting]
    a = make_document(host_arch="sm90", hostname="h100", only_arch="sm90")
    b = make_document(host_arch="sm100", hostname="b200", only_arch="sm100")
    change(b["run"])
    pa, pb, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "all.json"
    pa.write_text(v2_text(a), encoding="utf-8")
    pb.write_text(v2_text(b), encoding="utf-8")
    assert main(["merge", str(pa), str(pb), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (f"pytest-mla: error: {pa} and {pb} ran different settings ({said}): one merged header cannot "
                   "describe both; --allow-mixed merges them, recording each input's\n")
    assert not out.exists()
    assert main(["merge", str(pa), str(pb), "-o", str(out), "--allow-mixed"]) == 0
    run = read_results(out)["run"]
    assert run["mixed_settings"] == [setting]
    header = run["engine"]["name"] if setting == "engine" else run[setting]
    assert header == joined.replace("None", "(none)")
    inputs = [{k: m.get(k) for k in ("file", *SETTINGS)} for m in run["merged_from"]]
    assert inputs == [{"file": str(p), "engine": d["run"]["engine"]["name"], "kernel_dtype": d["run"]["kernel_dtype"],
                       "seed": d["run"]["seed"], "tier": d["run"].get("tier", "full")} for p, d in ((pa, a), (pb, b))]


def test_merge_of_runs_that_agree_records_their_settings_and_no_mix(tmp_path):
    from pytest_mla.report.merge import merge_documents

    a = make_document(host_arch="sm90", hostname="h100", only_arch="sm90")
    b = make_document(host_arch="sm100", hostname="b200", only_arch="sm100")
    merged = merge_documents([a, b], names=["a", "b"])
    assert "mixed_settings" not in merged["run"] and merged["run"]["seed"] == 0
    assert [m["seed"] for m in merged["run"]["merged_from"]] == [0, 0]


# -- output on a terminal that is not UTF-8 --------------------------------------------------
@pytest.mark.parametrize("env", [{"PYTHONIOENCODING": "ascii"}, {"PYTHONIOENCODING": "latin-1"},
                                 {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""}],
                         ids=["ascii", "latin-1", "LANG=C"])
@pytest.mark.parametrize("fmt", ["md", "terminal"])
def test_a_report_prints_on_a_terminal_that_is_not_utf8(tmp_path, env, fmt):
    path = tmp_path / "r.json"
    path.write_text(v2_text(), encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "pytest_mla.cli", "render", str(path), "-f", fmt],
                            capture_output=True, env={**os.environ, **env}, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr == b""
    assert b"\\u2705" in result.stdout  # the symbol the terminal cannot show, escaped
