"""Bad input and bad luck: each ends in one precise message, and no finished cell is lost."""

import json
import os

import pytest

from pytest_mla.report.results import read_results

from .helpers import matrix, read_report, verdicts

pytest_plugins = ["pytester"]

#: An engine whose backend name picks the misbehaviour.
MISBEHAVING_CONFTEST = '''
import os, signal, time
from pytest_mla.engines.protocol import Configured, KernelSpec


class Misbehaving:
    name = "misbehaving"
    version = "2.0"
    refusal_errors = (ValueError,)

    def configure(self, cell, model):
        if cell.backend == "hang" and cell.arch == "sm90":
            try:
                time.sleep(120)
            except Exception:  # an engine's broad except must not swallow the timeout
                pass
        if cell.backend == "sigterm" and cell.arch == "sm100":
            # The signal goes to the controller, as a CI runner sends it (under xdist: the parent).
            to_parent = os.path.exists(os.path.join(os.path.dirname(__file__), "kill-the-parent"))
            if to_parent:
                time.sleep(2)  # let the other worker's finished cells reach the controller first
            os.kill(os.getppid() if to_parent else os.getpid(), signal.SIGTERM)
            time.sleep(30)
        if cell.backend == "dict":
            return {"decode": "dict"}
        return Configured({"decode": cell.backend}, kernel_reason="no kernel in this test engine")

    def metadata(self):
        return {"handle": object(), 3: {"b", "a"}, "nan": float("nan"), "path": __import__("pathlib").Path("/x")}


def pytest_mla_engines(config):
    return {"misbehaving": Misbehaving}
'''


@pytest.fixture
def bad(pytester):
    pytester.makeconftest(MISBEHAVING_CONFTEST)
    return pytester


def _matrix(backends, **kw):
    return matrix(backends, engine="misbehaving", **kw)


# -- 1. validation-only installs ---------------------------------------------------------------

def test_without_torch_accepted_cells_are_not_run_and_say_why(pytester):
    # No torch or triton to be found: what `pip install pytest-mla` alone gives.
    pytester.makeconftest("import sys\nsys.modules['torch'] = None\nsys.modules['triton'] = None\n")
    pytester.makefile(".toml", m=matrix(["triton", "trtllm_mla"], engine="reference", rules="""
        [[rule]]
        when = { backend = "trtllm_mla", arch = "sm90" }
        reject = { error = "ValueError", match = "only supported on Blackwell" }
    """))
    result = pytester.runpytest_subprocess("--mla-matrix=m.toml", "-p", "no:xdist")
    assert result.ret == 0
    # the hint names the CPU wheel first: 'pytest-mla[kernels]' alone pulls a CUDA torch on a CPU machine
    missing = ("torch/triton not installed (without a GPU: pip install torch --index-url "
               "https://download.pytorch.org/whl/cpu && pip install triton numpy; with one: "
               "pip install 'pytest-mla[kernels]')")
    assert f"mla: host cpu; kernel checks unavailable: {missing}; dcp mode in-process" in result.stdout.lines
    assert "Traceback" not in result.stdout.str()
    doc = read_report(pytester)
    accepted = [c for c in doc["cells"] if c["outcome"]["kind"] == "accepted"]
    assert accepted and all(c["verdict"] == "pass" for c in doc["cells"])
    assert {c["kernel"]["reason"] for c in accepted} == {missing}


# -- 2. the gate always gates ------------------------------------------------------------------

def _baseline_where_everything_passed(pytester, name="m"):
    pytester.runpytest("--mla-matrix=m.toml")
    doc = read_report(pytester, name)
    for cell in doc["cells"]:
        cell.update(verdict="pass", reason=None)
    path = pytester.path / "old.json"
    path.write_text(json.dumps(doc))
    return path


def test_the_baseline_gates_even_when_no_report_is_written(liar):
    liar.makefile(".toml", m=matrix(["lenient", "strict"]))
    old = _baseline_where_everything_passed(liar)
    (liar.path / "reports").rename(liar.path / "first-reports")
    result = liar.runpytest("--mla-matrix=m.toml", f"--mla-baseline={old}", "--mla-report-dir=none")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["2 regression(s) against *old.json:",
                                 "  REGRESSION m: deepseek-v3/strict/dcp1/none/sm90: pass * -> fail * "
                                 "(expected accept, but the engine rejected it: raised: ValueError: strict refuses sm90.)",
                                 "  REGRESSION m: deepseek-v3/strict/dcp1/none/sm100: *"])
    assert not (liar.path / "reports").exists()


def test_a_baseline_of_another_matrix_is_a_usage_error(liar):
    liar.makefile(".toml", other=matrix(["lenient"]))
    liar.runpytest("--mla-matrix=other.toml")
    liar.makefile(".toml", m=matrix(["lenient", "strict"]))
    result = liar.runpytest("--mla-matrix=m.toml", "--mla-baseline=reports/other.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --mla-baseline: reports/other.json is a result of matrix 'other', "
                                 "not of 'm': compare runs of the same matrix"])


def test_a_baseline_that_is_not_a_result_is_a_usage_error(liar):
    liar.makefile(".toml", m=matrix(["lenient"]))
    (liar.path / "old.json").write_text('{"cells": []}')
    result = liar.runpytest("--mla-matrix=m.toml", "--mla-baseline=old.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--mla-baseline: old.json: not a pytest-mla result file*"])


# -- 3. nothing finished is lost ---------------------------------------------------------------

def test_a_report_folder_that_is_a_file_stops_before_the_first_cell(liar):
    liar.makefile(".toml", m=matrix(["lenient"]))
    (liar.path / "reports").write_text("not a folder")
    result = liar.runpytest("--mla-matrix=m.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --mla-report-dir: cannot write reports to {liar.path / 'reports'}: "
                                 "it is a file, not a folder"])
    assert "passed" not in result.stdout.str()


def test_a_failed_final_write_leaves_the_results_in_a_temporary_file(liar):
    from .helpers import LIAR_CONFTEST

    # The JSON's path is taken by a folder after the start-up check (which refuses one), before the end.
    liar.makeconftest(LIAR_CONFTEST + """
def pytest_sessionfinish(session):
    os.makedirs(os.path.join(str(session.config.rootpath), "reports", "m.json"))
""")
    liar.makefile(".toml", m=matrix(["lenient"]))
    result = liar.runpytest("--mla-matrix=m.toml")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR  # the report is not where it was asked for
    line = next(ln for ln in result.stdout.lines if ln.startswith("mla report: cannot write"))
    assert line.startswith(f"mla report: cannot write {liar.path / 'reports' / 'm.json'}: not a regular file "
                           "(a folder); ")
    fallback = line.rsplit("the results are in ", 1)[1]
    try:
        doc = read_results(fallback)
        assert list(verdicts(doc).values()) == ["pass", "pass"]
    finally:
        os.unlink(fallback)
    assert sorted(p.name for p in (liar.path / "reports").iterdir()) == ["m.json"]  # no side file, no lock


def test_a_renderer_that_breaks_leaves_the_json_and_says_so(liar):
    from .helpers import LIAR_CONFTEST

    liar.makeconftest(LIAR_CONFTEST + """
import pytest_mla.report.html

def _broken(document, **kwargs):
    raise KeyError("no such column")

pytest_mla.report.html.render_html = _broken
""")
    liar.makefile(".toml", m=matrix(["lenient"]))
    result = liar.runpytest_subprocess("--mla-matrix=m.toml")  # the patch must not outlive this session
    result.assert_outcomes(passed=2)
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines([f"mla report: cannot render the reports of {liar.path / 'reports' / 'm.json'}: "
                                 "KeyError: 'no such column' (the results are written; render them with: "
                                 "pytest-mla render *m.json)"])
    doc = read_results(liar.path / "reports" / "m.json")
    assert list(verdicts(doc).values()) == ["pass", "pass"]
    assert (liar.path / "reports" / "m.md").exists() and not (liar.path / "reports" / "m.html").exists()


@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_sigterm_writes_the_finished_cells_like_ctrl_c(bad, workers):
    if workers:
        pytest.importorskip("xdist")
    bad.makefile(".toml", m=_matrix(["lenient", "sigterm", "late"]))
    if workers:
        (bad.path / "kill-the-parent").write_text("")
    result = bad.runpytest_subprocess("--mla-matrix=m.toml", *workers, timeout=120)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    doc = read_report(bad)
    assert doc["run"]["complete"] is False and doc["run"]["interrupted"] is True
    done = verdicts(doc)
    assert done["deepseek-v3/lenient/dcp1/none/sm90"] == "pass"
    assert done["deepseek-v3/lenient/dcp1/none/sm100"] == "pass"


def test_adapter_metadata_that_is_not_json_loses_nothing(bad):
    bad.makefile(".toml", m=_matrix(["lenient"]))
    bad.runpytest("--mla-matrix=m.toml").assert_outcomes(passed=2)
    doc = read_report(bad)
    meta = doc["run"]["engine"]["metadata"]
    assert meta["handle"].startswith("<object object at") and meta["3"] == ["a", "b"]
    assert meta["nan"] == "nan" and meta["path"] == "/x"
    assert len(doc["cells"]) == 2


def test_same_named_matrices_in_two_folders_get_two_reports(liar):
    for folder in ("a", "b"):
        liar.mkdir(folder)
        (liar.path / folder / "x.toml").write_text(matrix(["lenient"]))
    result = liar.runpytest("--mla-matrix=a/x.toml,b/x.toml")
    result.assert_outcomes(passed=4)
    assert read_report(liar, "a-x")["run"]["matrix_file"].endswith("a/x.toml")
    assert read_report(liar, "b-x")["run"]["matrix_file"].endswith("b/x.toml")
    assert not (liar.path / "reports" / "x.json").exists()


# -- 4. bounded cells --------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_a_hung_configure_ends_as_an_error_and_the_rest_run(bad, workers):
    if workers:
        pytest.importorskip("xdist")
    bad.makefile(".toml", m=_matrix(["hang", "lenient"]))
    result = bad.runpytest_subprocess("--mla-matrix=m.toml", "--mla-cell-timeout=1", *workers, timeout=100)
    result.assert_outcomes(passed=3, failed=1)
    cells = {c["id"]: c for c in read_report(bad)["cells"]}
    hung = cells["deepseek-v3/hang/dcp1/none/sm90"]
    assert hung["verdict"] == "error"
    assert hung["reason"] == "timed out after 1 s in configure (--mla-cell-timeout)"
    assert cells["deepseek-v3/hang/dcp1/none/sm100"]["verdict"] == "pass"


def test_a_hung_kernel_check_ends_as_an_error(pytester):
    pytester.makepyfile(sleepy="import time\n\ndef run(*args, **kwargs):\n    time.sleep(120)\n")
    pytester.makeconftest('''
import os, sys
sys.path.insert(0, os.path.dirname(__file__))
from pytest_mla.engines.protocol import KernelSpec

def pytest_mla_kernel(config, cell, spec):
    if spec is not None:
        return KernelSpec("sleepy", "sleepy:run")
''')
    pytester.makefile(".toml", m=matrix(["triton"], engine="reference", archs=("sm90",)))
    pytester.makeini("[pytest]\nmla_cell_timeout = 2\n")
    result = pytester.runpytest_subprocess("--mla-matrix=m.toml", "-p", "no:xdist", timeout=100)
    result.assert_outcomes(failed=1)
    cell = read_report(pytester)["cells"][0]
    assert cell["verdict"] == "error" and cell["outcome"]["kind"] == "accepted"
    assert cell["reason"] == "timed out after 2 s in the kernel check (--mla-cell-timeout)"


@pytest.mark.parametrize("value", ["-1", "soon", "nan"])
def test_a_bad_cell_timeout_is_a_usage_error(liar, value):
    liar.makefile(".toml", m=matrix(["lenient"]))
    result = liar.runpytest("--mla-matrix=m.toml", f"--mla-cell-timeout={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --mla-cell-timeout: expected seconds (0: no limit), got '{value}'"])


# -- 5. misuse is an error ---------------------------------------------------------------------

def test_an_engine_module_that_cannot_be_imported_is_an_error(pytester):
    pytester.makefile(".toml", m=matrix(["triton"], engine="nosuchmodule:Engine"))
    result = pytester.runpytest("--mla-matrix=m.toml")
    assert result.ret == pytest.ExitCode.INTERRUPTED  # a collection error
    result.stdout.fnmatch_lines(["m.toml: engine.name: engine 'nosuchmodule:Engine': cannot import module "
                                 "'nosuchmodule': ModuleNotFoundError: No module named 'nosuchmodule'"])


def test_an_optional_engine_not_installed_skips_and_says_why(pytester):
    # Found through mla_matrix_files (not named with --mla-matrix=FILE): its cells may skip.
    pytester.makeconftest("import sys\nsys.modules['vllm'] = None\n")
    pytester.makefile(".toml", m=matrix(["TRITON_MLA"], engine="vllm"))
    pytester.makeini("[pytest]\nmla_matrix_files = m.toml\n")
    result = pytester.runpytest_subprocess("--mla-matrix", "-p", "no:xdist")
    assert result.ret == 0
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["mla: m.toml: every cell skipped: engine 'vllm' is not available here: *"])


@pytest.mark.parametrize("args, message", [
    (["--mla-select=backend=lenient,typo"],
     "ERROR: --mla-select backend=lenient,typo: 'typo' is not a backend of the matrix (known: lenient, strict)"),
    (["--mla-select=dcp=3"], "ERROR: --mla-select dcp=3: 3 is not a dcp of the matrix (known: 1)"),
    (["--mla-select=kv_dtype=auto"], "ERROR: --mla-select kv_dtype=auto: the matrix has no kv_dtype axis"),
    (["--mla-arch=sm80"], "ERROR: --mla-arch: 'sm80' is not an arch of the matrix (known: sm90, sm100)"),
    (["--mla-arch=sm95x"], "ERROR: --mla-arch: unknown arch 'sm95x': 'auto', or an NVIDIA arch sm50/*"),
    (["--mla-max-cells=0"], "ERROR: --mla-max-cells: expected a positive number of cells, got '0'"),
])
@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_selections_that_select_nothing_are_usage_errors(liar, args, message, workers):
    if workers:
        pytest.importorskip("xdist")
    liar.makefile(".toml", m=matrix(["lenient", "strict"]))
    result = liar.runpytest("--mla-matrix=m.toml", *args, *workers)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_an_arch_typo_in_a_matrix_is_an_error_of_the_file(liar):
    liar.makefile(".toml", m=matrix(["lenient"], archs=("sm90", "sm9x")))
    result = liar.runpytest("--mla-matrix=m.toml")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["m.toml:*: axes.arch: unknown arch 'sm9x' (expected an NVIDIA arch sm50/*"])


def test_a_matrix_above_max_cells_stops_at_collection_with_its_size(liar):
    liar.makefile(".toml", m=matrix([f"b{i}" for i in range(40)], archs=("sm80", "sm90", "sm100")))
    result = liar.runpytest("--mla-matrix=m.toml", "--mla-max-cells=100")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["m.toml:*: axes: the matrix expands to 120 cells (1 model x 40 backend x 1 dcp "
                                 "x 1 spec x 3 arch), above --mla-max-cells=100: narrow the axes, or raise the limit"])


# -- 6. short, precise failures ----------------------------------------------------------------

def test_an_adapter_breaking_the_protocol_gets_one_paragraph(bad):
    bad.makefile(".toml", m=_matrix(["dict"], archs=("sm90",)))
    # (in an xdist worker that imported pytest_mla first, pytest warns it cannot rewrite it: not ours)
    result = bad.runpytest("--mla-matrix=m.toml", "-W", "ignore::pytest.PytestAssertRewriteWarning")
    result.assert_outcomes(failed=1)
    cell = read_report(bad)["cells"][0]
    assert cell["verdict"] == "error"
    assert cell["reason"] == ("adapter error: Misbehaving.configure() must return pytest_mla.engines.protocol."
                              "Configured (or raise the engine's refusal), got dict")
    out = result.stdout.str()
    assert "site-packages" not in out and "Traceback" not in out and len(out.splitlines()) < 40


#: An adapter that keeps the protocol; each case below breaks one step of it.
_GOOD_ADAPTER = """
from pytest_mla.engines.protocol import Configured, KernelSpec


class Eng:
    name = "eng"
    version = "1.0"
    refusal_errors = (ValueError,)

    def configure(self, cell, model):
        return Configured({"decode": cell.backend}, kernel_reason="no kernel in this test adapter")

    def metadata(self):
        return {}
"""


@pytest.mark.parametrize("source, message", [
    ("raise RuntimeError('no GPU driver')",
     "engine 'eng:Eng': importing module 'eng' raised RuntimeError: no GPU driver"),
    ("import sys; sys.exit(0)", "engine 'eng:Eng': importing module 'eng' raised SystemExit: sys.exit(0) was called"),
    ("import sys; sys.exit('bye')",
     "engine 'eng:Eng': importing module 'eng' raised SystemExit: sys.exit('bye') was called"),
    (_GOOD_ADAPTER + "    def __init__(self):\n        raise OSError('no cache folder')\n",
     "engine 'eng:Eng' (eng:Eng): constructing the adapter raised OSError: no cache folder"),
    (_GOOD_ADAPTER + "    def __init__(self):\n        raise SystemExit(1)\n",
     "engine 'eng:Eng' (eng:Eng): constructing the adapter raised SystemExit: sys.exit(1) was called"),
    (_GOOD_ADAPTER + "    refusal_errors = 'ValueError'\n",
     "engine 'eng:Eng' (eng:Eng): 'refusal_errors' must be an exception class or a tuple of them, got 'ValueError'"),
    (_GOOD_ADAPTER + "    version = None\n", "engine 'eng:Eng' (eng:Eng): 'version' must be non-empty text, got None"),
    (_GOOD_ADAPTER + "    configure = 3\n", "engine 'eng:Eng' (eng:Eng): 'configure' must be callable, got int"),
    (_GOOD_ADAPTER + "    @property\n    def name(self):\n        raise KeyError('name')\n",
     "engine 'eng:Eng' (eng:Eng): reading its 'name' raised KeyError: 'name'"),
    (_GOOD_ADAPTER + "    def known_archs(self):\n        raise RuntimeError('no platforms')\n",
     "adapter step 'known_archs' failed on eng 1.0: RuntimeError: no platforms"),
], ids=["import-raises", "import-exit-0", "import-exit-text", "constructor-raises", "constructor-exits",
        "refusal-errors-text", "version-none", "configure-not-callable", "name-raises", "known-archs-raises"])
@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_an_adapter_failing_at_load_is_one_line_and_a_failed_run(pytester, source, message, workers):
    if workers:
        pytest.importorskip("xdist")
    pytester.makepyfile(eng=source)
    pytester.makefile(".toml", m=matrix(["lenient"], engine="eng:Eng"))
    result = pytester.runpytest_subprocess("--mla-matrix=m.toml", "-p", "no:cacheprovider", *workers)
    assert result.ret not in (pytest.ExitCode.OK, pytest.ExitCode.INTERNAL_ERROR)
    result.stdout.fnmatch_lines([f"m.toml: engine.name: {message}"])
    out = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in out and "INTERNALERROR" not in out
    assert "which the pytest command does not put on sys.path" not in out  # it imported: no path hint


def test_a_make_engine_hook_that_raises_is_one_line(pytester):
    pytester.makeconftest("def pytest_mla_make_engine(config, name):\n    raise SystemExit(4)\n")
    pytester.makefile(".toml", m=matrix(["lenient"], engine="eng"))
    result = pytester.runpytest_subprocess("--mla-matrix=m.toml", "-p", "no:xdist")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["m.toml: engine.name: engine 'eng': the pytest_mla_make_engine hook raised "
                                 "SystemExit: sys.exit(4) was called"])
    assert "Traceback" not in result.stdout.str()


@pytest.mark.parametrize("method, reason", [
    ("    def configure(self, cell, model):\n        raise SystemExit(0)\n",
     "engine crashed: SystemExit: sys.exit(0) was called in Eng.configure()"),
    ("    def configure(self, cell, model):\n        return Configured('triton')\n",
     "adapter error: Eng.configure() returned a Configured whose backends is not a mapping of role to backend "
     "name: 'triton'"),
    ("    def configure(self, cell, model):\n        return Configured({'decode': 'x'}, notes='forced')\n",
     "adapter error: Eng.configure() returned a Configured whose notes is not a sequence of text: 'forced'"),
], ids=["configure-exits", "backends-text", "notes-text"])
@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_an_adapter_failing_in_a_cell_is_that_cells_error_and_the_run_fails(pytester, method, reason, workers):
    if workers:
        pytest.importorskip("xdist")
    pytester.makepyfile(eng=_GOOD_ADAPTER + method)
    pytester.makefile(".toml", m=matrix(["lenient"], engine="eng:Eng"))
    result = pytester.runpytest_subprocess("--mla-matrix=m.toml", "-p", "no:cacheprovider", *workers)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=2)
    cells = read_report(pytester)["cells"]
    assert [(c["verdict"], c["reason"]) for c in cells] == [("error", reason)] * 2
    out = result.stdout.str()
    assert "INTERNALERROR" not in out and len(out.splitlines()) < 80


def test_an_adapter_run_check_that_raises_is_an_adapter_error_of_the_kernel(pytester):
    pytester.makepyfile(eng=_GOOD_ADAPTER.replace(
        'kernel_reason="no kernel in this test adapter"',
        'kernel=KernelSpec("own", "eng:nothing", protocol="engine", level="backend", package="eng")') + """
    def run_check(self, case, spec, *, where, dcp_mode, timeout_s):
        raise SystemExit(9)
""")
    pytester.makefile(".toml", m=matrix(["lenient"], engine="eng:Eng", archs=("sm90",)))
    result = pytester.runpytest_subprocess("--mla-matrix=m.toml", "-p", "no:xdist")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    (cell,) = read_report(pytester)["cells"]
    assert cell["verdict"] == "error"
    assert cell["kernel"]["status"] == "failed" and cell["kernel"]["crashed"] is True
    assert cell["reason"] == "adapter step 'run_check' failed on eng 1.0: SystemExit: sys.exit(9) was called"


# -- 8. small things ----------------------------------------------------------------------------

def test_the_report_names_the_adapter_not_its_import_string(pytester):
    pytester.makepyfile(myengine='''
from pytest_mla.engines.protocol import Configured

class Mine:
    name = "mine"
    version = "0.3"
    refusal_errors = (ValueError,)

    def configure(self, cell, model):
        return Configured({"decode": cell.backend})
''')
    pytester.makefile(".toml", m=matrix(["lenient"], engine="myengine:Mine"))
    result = pytester.runpytest_subprocess("--mla-matrix=m.toml", "-p", "no:xdist")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["mla: m.toml: engine mine 0.3, 2 cells"])
    doc = read_report(pytester)
    assert doc["run"]["engine"]["name"] == "mine" and doc["run"]["engine"]["adapter"] == "myengine:Mine"
    assert "myengine:Mine" not in (pytester.path / "reports" / "m.md").read_text()
