"""Hostile input and an unlucky night (issue 26): each ends in one precise line, never a traceback,
and no finished cell is lost. Built for the families, not the examples: every value written to
disk from an engine or a user, every option and variable at its extremes, every regex a matrix
author writes, characters a reader cannot see, every output path that cannot be written."""

import json
import os

import pytest

from pytest_mla.report.results import read_results

from .helpers import matrix, read_report, verdicts

pytest_plugins = ["pytester"]

#: An engine whose refusals carry what a hostile or unlucky engine prints.
SHADY_CONFTEST = r'''
from pytest_mla.engines.protocol import Configured


class Shady:
    name = "shady"
    version = "1.0"
    refusal_errors = (ValueError,)

    def configure(self, cell, model):
        if cell.backend == "nbsp":
            raise ValueError("nbsp refuses\u00a0" + cell.arch)
        if cell.backend == "ansi":
            raise ValueError("ansi \x1b[2J\x1b[31mrefuses\x1b[0m " + cell.arch)
        if cell.backend == "surrogate":
            raise ValueError("bytes \udcff from a bad decode")
        return Configured({"decode": cell.backend}, kernel_reason="no kernel in this test engine",
                          notes=("note\u202eevil",))


def pytest_mla_engines(config):
    return {"shady": Shady}
'''


@pytest.fixture
def shady(pytester):
    pytester.makeconftest(SHADY_CONFTEST)
    return pytester


def _no_traceback(result):
    text = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in text and "INTERNALERROR" not in text, text


# -- a malformed matrix value: file, line, exit 2 -----------------------------------------------

@pytest.mark.parametrize("value", ['[["x"]]', '[{ name = "x" }]'])
@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_a_malformed_axis_value_is_an_error_of_the_file_with_its_line(liar, value, workers):
    if workers:
        pytest.importorskip("xdist")
    text = matrix(["lenient"]).replace('backend = ["lenient"]', f"backend = {value}")
    path = liar.makefile(".toml", m=text)
    line = next(i for i, ln in enumerate(path.read_text().splitlines(), start=1) if ln.startswith("backend ="))
    result = liar.runpytest_subprocess("--mla-matrix=m.toml", *workers)
    # a collection error, as every other matrix mistake (xdist reports those as failures)
    assert result.ret == (pytest.ExitCode.TESTS_FAILED if workers else pytest.ExitCode.INTERRUPTED)
    result.stdout.fnmatch_lines([f"m.toml:{line}: axes.backend: backend values must be non-empty strings, got *"])
    _no_traceback(result)
    assert "unhashable" not in result.stdout.str()


# -- characters a reader cannot see ------------------------------------------------------------

def test_a_message_that_differs_by_an_invisible_character_names_it(shady):
    shady.makefile(".toml", m=matrix(["nbsp"], engine="shady", archs=("sm90",), rules="""
        [[rule]]
        when = { backend = "nbsp" }
        reject = { error = "ValueError", message = "nbsp refuses {arch}" }
    """))
    result = shady.runpytest("--mla-matrix=m.toml")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*expected: nbsp refuses sm90",
                                 "*raised:   nbsp refuses\\xa0sm90",
                                 "  *^ first difference at character 12 (expected U+0020 SPACE, "
                                 "raised U+00A0 NO-BREAK SPACE)"])


def test_terminal_escapes_and_bidi_overrides_from_an_engine_are_shown_not_obeyed(shady):
    shady.makefile(".toml", m=matrix(["ansi", "fine"], engine="shady", archs=("sm90",)))
    result = shady.runpytest("--mla-matrix=m.toml")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "\x1b[2J" not in out and "\\x1b[2J\\x1b[31mrefuses\\x1b[0m" in out
    md = (shady.path / "reports" / "m.md").read_text(encoding="utf-8")
    html = (shady.path / "reports" / "m.html").read_text(encoding="utf-8")
    for text in (md, html):
        assert "\x1b" not in text and "\u202e" not in text
    assert "\\u202e" in html  # the accepted cell's note, escaped where the reader sees it


def test_a_lone_surrogate_in_an_engine_message_loses_no_cell(shady):
    shady.makefile(".toml", m=matrix(["surrogate", "fine"], engine="shady", archs=("sm90",)))
    result = shady.runpytest("--mla-matrix=m.toml")
    result.assert_outcomes(passed=1, failed=1)
    _no_traceback(result)
    doc = read_report(shady)
    assert verdicts(doc) == {"deepseek-v3/surrogate/dcp1/none/sm90": "fail", "deepseek-v3/fine/dcp1/none/sm90": "pass"}
    assert "\\udcff" in doc["cells"][0]["outcome"]["message"]
    assert (shady.path / "reports" / "m.md").exists() and (shady.path / "reports" / "m.html").exists()


# -- every variable the plugin reads, checked before the first cell ------------------------------

@pytest.mark.parametrize("name, value, message", [
    ("PYTEST_MLA_HOST_GPUS", "abc", "PYTEST_MLA_HOST_GPUS: expected a number of GPUs (0 or more), got 'abc'"),
    ("PYTEST_MLA_HOST_GPUS", "-1", "PYTEST_MLA_HOST_GPUS: expected a number of GPUs (0 or more), got '-1'"),
    ("PYTEST_MLA_HOST_GPUS", "99999999999999999999", "PYTEST_MLA_HOST_GPUS: expected a number of GPUs *"),
    ("PYTEST_MLA_HOST_ARCH", "sm95", "PYTEST_MLA_HOST_ARCH: expected 'cpu' or a GPU arch such as sm90, got 'sm95' *"),
    ("TRITON_INTERPRET", "maybe", "TRITON_INTERPRET: expected 1 or 0 (or true/false, yes/no, on/off), got 'maybe'"),
    ("GITHUB_STEP_SUMMARY", "{tmp}/no/such/folder/summary.md",
     "GITHUB_STEP_SUMMARY: cannot append the run's summary to '{tmp}/no/such/folder/summary.md': "
     "no folder '{tmp}/no/such/folder'"),
    ("GITHUB_STEP_SUMMARY", "{tmp}", "GITHUB_STEP_SUMMARY: cannot append the run's summary to '{tmp}': it is a folder"),
    ("GITHUB_STEP_SUMMARY", "{tmp}/summary.fifo",  # made below: an append would wait for a reader forever
     "GITHUB_STEP_SUMMARY: cannot append the run's summary to '{tmp}/summary.fifo': it is not a regular file"),
])
@pytest.mark.parametrize("verbose", [[], ["-v"]])
def test_a_garbage_environment_variable_is_one_line_before_any_cell(liar, monkeypatch, name, value, message, verbose):
    liar.makefile(".toml", m=matrix(["lenient"]))
    if name != "PYTEST_MLA_HOST_ARCH":
        monkeypatch.setenv("PYTEST_MLA_HOST_ARCH", "sm90")  # what the GPU count goes with
    monkeypatch.setenv(name, value.format(tmp=liar.path))
    if value.endswith(".fifo"):
        (liar.path / "summary.fifo").unlink(missing_ok=True)
        os.mkfifo(value.format(tmp=liar.path))
    result = liar.runpytest_subprocess("--mla-matrix=m.toml", *verbose, timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: " + message.format(tmp=liar.path)])
    _no_traceback(result)
    assert "passed" not in result.stdout.str() and not (liar.path / "reports").exists()


def test_the_variables_accept_what_triton_and_github_set(liar, monkeypatch):
    liar.makefile(".toml", m=matrix(["lenient"]))
    monkeypatch.setenv("PYTEST_MLA_HOST_ARCH", "sm90")
    monkeypatch.setenv("PYTEST_MLA_HOST_GPUS", "2")
    monkeypatch.setenv("TRITON_INTERPRET", "Y")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(liar.path / "summary.md"))
    result = liar.runpytest_subprocess("--mla-matrix=m.toml")
    result.assert_outcomes(passed=2)
    assert "| lenient   | ☑️" in (liar.path / "summary.md").read_text(encoding="utf-8")


# -- matrices outside the rootdir --------------------------------------------------------------

@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_matrices_outside_the_rootdir_keep_their_cells_apart(liar, tmp_path_factory, workers):
    if workers:
        pytest.importorskip("xdist")
    far, other = tmp_path_factory.mktemp("elsewhere") / "a", tmp_path_factory.mktemp("elsewhere") / "b"
    far.mkdir()
    other.mkdir()
    (far / "far.toml").write_text(matrix(["lenient", "strict"]))
    (other / "other.toml").write_text(matrix(["lenient"]))
    result = liar.runpytest_subprocess(f"--mla-matrix={far / 'far.toml'}", f"--mla-matrix={other / 'other.toml'}",
                                       "-v", *workers)
    result.assert_outcomes(passed=4, failed=2)
    result.stdout.fnmatch_lines([f"*{(far / 'far.toml').as_posix()}::deepseek-v3-lenient-dcp1-none-sm90*"])
    first, second = read_report(liar, "far"), read_report(liar, "other")
    assert first["run"]["complete"] and second["run"]["complete"]
    assert sorted(verdicts(first).values()) == ["fail", "fail", "pass", "pass"]
    assert verdicts(second) == {"deepseek-v3/lenient/dcp1/none/sm90": "pass",
                                "deepseek-v3/lenient/dcp1/none/sm100": "pass"}


def test_a_crashed_worker_on_a_matrix_outside_the_rootdir_is_recovered(liar, tmp_path_factory):
    pytest.importorskip("xdist")
    far = tmp_path_factory.mktemp("elsewhere")
    (far / "far.toml").write_text(matrix(["lenient", "crash", "late"]))
    result = liar.runpytest_subprocess(f"--mla-matrix={far / 'far.toml'}", "-n", "2")
    doc = read_report(liar, "far")
    assert len(doc["cells"]) == 6
    assert verdicts(doc)["deepseek-v3/crash/dcp1/none/sm100"] == "error"
    assert doc["run"]["counts"]["error"] == 1
    assert result.ret == pytest.ExitCode.TESTS_FAILED


# -- an impatient second Ctrl-C ------------------------------------------------------------------

#: The first Ctrl-C comes while cell "stop" runs; the second ``MLA_TEST_GAP`` seconds later, as a
#: person pressing twice. Under xdist both go to the controller, as a terminal sends them.
TWICE_CONFTEST = '''
import os, signal, threading, time
from pytest_mla.engines.protocol import Configured

# A terminal's Ctrl-C reaches a process whose SIGINT is the default. A job a non-interactive shell put in
# the background inherits SIGINT ignored (and Python then never raises KeyboardInterrupt): where this test
# runs so, its pytest (the controller under xdist) takes the default back, as an interactive one has it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN and "PYTEST_XDIST_WORKER" not in os.environ:
    signal.signal(signal.SIGINT, signal.default_int_handler)


class Twice:
    name = "twice"
    version = "1.0"
    refusal_errors = (ValueError,)

    def configure(self, cell, model):
        if cell.backend == "stop" and cell.arch == "sm90":
            to_parent = os.environ["MLA_TEST_TARGET"] == "parent"
            if to_parent:
                time.sleep(1)  # the other worker's finished cells reach the controller first
            target = os.getppid() if to_parent else os.getpid()
            threading.Timer(float(os.environ["MLA_TEST_GAP"]), os.kill, (target, signal.SIGINT)).start()
            os.kill(target, signal.SIGINT)
            time.sleep(5)
        return Configured({"decode": cell.backend}, kernel_reason="no kernel in this test engine")


def pytest_mla_engines(config):
    return {"twice": Twice}
'''


@pytest.mark.parametrize("gap", [0.01, 0.05, 0.1, 0.2])
@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_a_second_ctrl_c_soon_after_the_first_keeps_the_report_and_its_word(pytester, monkeypatch, gap, workers):
    if workers:
        pytest.importorskip("xdist")
    pytester.makeconftest(TWICE_CONFTEST)
    pytester.makefile(".toml", m=matrix(["early", "stop", "late"], engine="twice"))
    monkeypatch.setenv("MLA_TEST_GAP", str(gap))
    monkeypatch.setenv("MLA_TEST_TARGET", "parent" if workers else "self")
    result = pytester.runpytest_subprocess("--mla-matrix=m.toml", *workers, timeout=60)
    _no_traceback(result)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    doc = read_report(pytester)
    assert doc["run"]["interrupted"] is True and doc["run"]["complete"] is False
    done = verdicts(doc)
    assert done["deepseek-v3/early/dcp1/none/sm90"] == "pass"
    result.stdout.fnmatch_lines([f"INTERRUPTED after {len(done)} of 6 cells: the report is incomplete *"])


def test_diff_against_a_run_that_was_interrupted_fails_the_gate(liar):
    import subprocess
    import sys

    liar.makefile(".toml", m=matrix(["lenient", "interrupt", "late"]))
    liar.runpytest_subprocess("--mla-matrix=m.toml", "--mla-select=backend=lenient,late")
    (liar.path / "reports" / "m.json").rename(liar.path / "good.json")
    liar.runpytest_subprocess("--mla-matrix=m.toml", "-p", "no:xdist")
    assert read_report(liar)["run"]["interrupted"] is True
    diff = subprocess.run([sys.executable, "-m", "pytest_mla.cli", "diff", "good.json", "reports/m.json"],
                          cwd=liar.path, capture_output=True, text=True)
    assert diff.returncode == 1
    assert "reports/m.json is incomplete (interrupted: " in diff.stderr and "the gate fails" in diff.stderr
    assert " gone," in diff.stdout and "not reported" in diff.stdout


# -- every option at its extremes --------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--mla-cell-timeout=inf"], "--mla-cell-timeout: expected seconds (0: no limit), got 'inf' "
                                 "(at most 31536000; 0 means no limit)"),
    (["--mla-cell-timeout=1e20"], "--mla-cell-timeout: expected seconds (0: no limit), got '1e20' *"),
    (["--mla-cell-timeout=-0.5"], "--mla-cell-timeout: expected seconds (0: no limit), got '-0.5'"),
    (["-o", "mla_cell_timeout=nan"], "mla_cell_timeout (ini): expected seconds (0: no limit), got 'nan'"),
    (["--mla-dcp-timeout=nan"], "--mla-dcp-timeout: expected a positive number of seconds up to 31536000, got 'nan'"),
    (["--mla-dcp-timeout=inf"], "--mla-dcp-timeout: expected a positive number of seconds up to 31536000, got 'inf'"),
    (["--mla-dcp-timeout=0"], "--mla-dcp-timeout: expected a positive number of seconds up to 31536000, got '0'"),
    (["--mla-report-name=a\x01b"], "--mla-report-name: 'a\\x01b' has an invisible character, U+0001 control "
                                   "character, at character 1: a file name must show what it is"),
    (["--mla-report-name=" + "x" * 300],
     "--mla-report-name: 300 bytes is too long for a file name stem (at most 150)*"),
    (["--mla-report-name=.."], "--mla-report-name: expected a file name stem such as '{engine}-{version}', got '..'"),
    # a format spec or conversion that cannot format text: refused before the first cell, not after it
    (["--mla-report-name={matrix:d}"],
     "--mla-report-name: bad template '{matrix:d}': Unknown format code 'd' for object of type 'str'"),
    (["--mla-report-name={engine!x}"], "--mla-report-name: bad template '{engine!x}': *"),
    (["--mla-report-name={matrix:/>12}"],
     "--mla-report-name: expected a file name stem such as '{engine}-{version}', got '{matrix:/>12}'"),
    (["--mla-report-name={version:.0}"],
     "--mla-report-name: expected a file name stem such as '{engine}-{version}', got '{version:.0}'"),
    # an empty value (an unset CI variable) is an error, never a silent default: only 'none' turns reports off
    (["--mla-report-dir="], "--mla-report-dir: empty value (an unset variable?): expected a folder, or 'none' "
                            "to write no report"),
    (["--mla-report-dir= "], "--mla-report-dir: empty value (an unset variable?): *"),
    (["-o", "mla_report_dir="], "mla_report_dir (ini): empty value (an unset variable?): *"),
    (["--mla-report-name="], "--mla-report-name: empty value (an unset variable?): *"),
    (["--mla-report-format="], "--mla-report-format: empty value (an unset variable?): *"),
    (["--mla-baseline="], "--mla-baseline: empty value (an unset variable?): expected an earlier result file *"),
    (["--mla-seed="], "--mla-seed: empty value (an unset variable?): expected a non-negative integer"),
    (["--mla-shard="], "--mla-shard: empty value (an unset variable?): expected I/N such as 2/3"),
    (["--mla-dcp-timeout="], "--mla-dcp-timeout: empty value (an unset variable?): expected seconds such as 120"),
    (["--mla-cell-timeout="], "--mla-cell-timeout: expected seconds (0: no limit), got ''"),
    (["--mla-max-cells="], "--mla-max-cells: expected a positive number of cells, got ''"),
    (["-o", "mla_tier=fast"], "mla_tier (ini): expected one of full, quick, got 'fast'"),
])
def test_absurd_option_values_are_one_line_before_any_cell(liar, args, message):
    liar.makefile(".toml", m=matrix(["lenient"]))
    result = liar.runpytest_subprocess("--mla-matrix=m.toml", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: " + message])
    _no_traceback(result)


def test_an_empty_report_dir_writes_nothing_and_none_still_means_no_report(liar):
    liar.makefile(".toml", m=matrix(["lenient"]))
    assert liar.runpytest_subprocess("--mla-matrix=m.toml", "--mla-report-dir=").ret == pytest.ExitCode.USAGE_ERROR
    assert not (liar.path / "reports").exists()
    liar.runpytest("--mla-matrix=m.toml", "--mla-report-dir=none").assert_outcomes(passed=2)
    assert not (liar.path / "reports").exists()


def test_the_largest_cell_timeout_still_runs(liar):
    liar.makefile(".toml", m=matrix(["lenient"]))
    liar.runpytest("--mla-matrix=m.toml", "--mla-cell-timeout=31536000").assert_outcomes(passed=2)


# -- what an engine supplies never decides where files go --------------------------------------

ODD_NAMES_CONFTEST = '''
from pytest_mla.engines.protocol import Configured


class Odd:
    name = "../../escaped\\u200b"
    version = "1.0/../../../etc/x" + "9" * 400

    refusal_errors = (ValueError,)

    def configure(self, cell, model):
        return Configured({"decode": cell.backend})


def pytest_mla_engines(config):
    return {"odd": Odd}
'''


def test_an_engines_name_and_version_cannot_steer_the_report_files(pytester):
    pytester.makeconftest(ODD_NAMES_CONFTEST)
    pytester.makefile(".toml", m=matrix(["lenient"], engine="odd"))
    result = pytester.runpytest("--mla-matrix=m.toml", "--mla-report-name={engine}-{version}")
    result.assert_outcomes(passed=2)
    _no_traceback(result)
    reports = pytester.path / "reports"
    written = sorted(p.name for p in reports.iterdir())  # .docs.md, .html, .json, .md and the run facts (.run.json)
    assert len(written) == 5 and all(len(name.encode()) <= 210 for name in written)
    assert all("/" not in name and "\u200b" not in name and not name.startswith(".") for name in written)
    assert written[0].startswith("escaped-1.0_.._.._.._etc_x9999")  # separators and the invisible one: _
    assert not (pytester.path.parent / "escaped").exists()
    doc = read_results(reports / next(n for n in written if n.endswith(".json") and not n.endswith(".run.json")))
    assert doc["run"]["engine"]["name"] == "../../escaped\u200b"  # the JSON keeps what the adapter said


def test_results_that_cannot_go_anywhere_are_said_lost_in_one_line(liar):
    from .helpers import LIAR_CONFTEST

    liar.makeconftest(LIAR_CONFTEST + '''
import tempfile

def _no_room(*args, **kwargs):
    raise OSError(28, "No space left on device")

def pytest_configure(config):
    tempfile.mkstemp = _no_room  # every fallback folder is full from the start

def pytest_sessionfinish(session):  # the JSON's own path is taken (a folder, after the start-up check)
    os.makedirs(os.path.join(str(session.config.rootpath), "reports", "m.json"))
''')
    liar.makefile(".toml", m=matrix(["lenient"]))
    result = liar.runpytest_subprocess("--mla-matrix=m.toml")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    _no_traceback(result)
    result.stdout.fnmatch_lines(["mla report: cannot write *m.json: *; nor anywhere else (*No space left on device*"
                                 "No space left on device): the results are lost"])


# -- matrix values at their extremes -----------------------------------------------------------

def test_absurd_axis_sizes_end_in_one_line_each_not_hours(pytester):
    pytester.makefile(".toml", m=matrix(["triton"], engine="reference", archs=("sm90",)).replace(
        "dcp = [1]", "dcp = [1, 100000]\ntp = [1, 9223372036854775807]"))
    result = pytester.runpytest_subprocess("--mla-matrix=m.toml", "-p", "no:xdist", timeout=300)
    _no_traceback(result)
    cells = {c["id"]: c for c in read_report(pytester)["cells"]}
    huge_dcp = cells["deepseek-v3/triton/dcp100000/none/sm90/tp1"]
    assert huge_dcp["verdict"] == "pass" and huge_dcp["kernel"] == {
        "status": "not-run", "where": None, "reason": "a kernel check simulates at most 256 DCP ranks, not 100000"}
    odd_tp = cells["deepseek-v3/triton/dcp1/none/sm90/tp9223372036854775807"]
    assert odd_tp["verdict"] == "error"
    assert odd_tp["reason"] == ("cannot build a kernel check for this cell: deepseek-v3: 128 heads do not split over "
                                "tp=9223372036854775807")
    assert len(result.stdout.str().splitlines()) < 80
