"""What a new user trips over in the first hour (issue 23), each as the user runs it."""

import json

import pytest

from .helpers import matrix, read_report, verdicts

pytest_plugins = ["pytester"]


def _two_folders(pytester):
    for folder, backends in (("a", ["lenient", "strict"]), ("b", ["lenient"])):
        pytester.mkdir(folder)
        (pytester.path / folder / "x.toml").write_text(matrix(backends))


# -- 23.3: two files with the same name both run and keep their reports ---------------------------

@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_a_repeated_option_runs_both_same_named_matrices_each_with_its_own_cells(liar, workers):
    if workers:
        pytest.importorskip("xdist")
    _two_folders(liar)
    result = liar.runpytest_subprocess("--mla-matrix=a/x.toml", "--mla-matrix=b/x.toml", *workers)
    result.assert_outcomes(passed=4, failed=2)
    a, b = read_report(liar, "a-x"), read_report(liar, "b-x")
    assert a["run"]["complete"] and b["run"]["complete"]
    assert verdicts(a) == {"deepseek-v3/lenient/dcp1/none/sm90": "pass", "deepseek-v3/lenient/dcp1/none/sm100": "pass",
                           "deepseek-v3/strict/dcp1/none/sm90": "fail", "deepseek-v3/strict/dcp1/none/sm100": "fail"}
    assert verdicts(b) == {"deepseek-v3/lenient/dcp1/none/sm90": "pass", "deepseek-v3/lenient/dcp1/none/sm100": "pass"}
    assert {c["nodeid"].split("::")[0] for c in b["cells"]} == {"b/x.toml"}
    assert not (liar.path / "reports" / "x.json").exists()


# -- 23.4: a bare --mla-matrix takes the next word ----------------------------------------------

def test_two_paths_after_a_bare_option_say_what_happened_and_the_fix(liar):
    _two_folders(liar)
    result = liar.runpytest("--mla-matrix", "a/x.toml", "b/x.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: b/x.toml: a .toml file given as a test path is not run as a matrix "
                                 "(--mla-matrix takes one value, written with '='): to run it, write "
                                 "--mla-matrix=a/x.toml --mla-matrix=b/x.toml"])
    assert not (liar.path / "reports").exists()


def test_a_test_folder_after_a_bare_option_says_the_option_took_it(liar):
    liar.mkdir("tests")
    liar.makepyfile(**{"tests/test_one": "def test_one():\n    pass\n"})
    result = liar.runpytest("--mla-matrix", "tests")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --mla-matrix: no *.toml matrix files in tests (--mla-matrix written without "
                                 "'=' takes the next word, 'tests', as its matrix files: write --mla-matrix=PATH, "
                                 "repeated for more files, and give test paths before the option: "
                                 "pytest tests --mla-matrix)"])


def test_the_fix_the_message_gives_works(liar):
    liar.makefile(".toml", m=matrix(["lenient"]))
    liar.makeini("[pytest]\nmla_matrix_files = m.toml\n")
    liar.mkdir("tests")
    liar.makepyfile(**{"tests/test_one": "def test_one():\n    pass\n"})
    liar.runpytest("tests", "--mla-matrix").assert_outcomes(passed=3)


# -- 23.2: a file named explicitly must have its engine ------------------------------------------

@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_a_named_matrix_whose_engine_is_missing_fails_naming_the_engine_and_the_install(pytester, workers):
    if workers:
        pytest.importorskip("xdist")
    pytester.makeconftest("import sys\nsys.modules['sglang'] = None\n")
    pytester.makefile(".toml", sglang=matrix(["triton"], engine="sglang"))
    result = pytester.runpytest_subprocess("--mla-matrix=sglang.toml", *workers)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["sglang.toml: engine.name: engine 'sglang' is not available here: *; install it with: "
                                 "pip install sglang *; a matrix file named with --mla-matrix must run (files found "
                                 "through mla_matrix_files or a folder skip instead)"])
    assert "skipped" not in result.stdout.lines[-1]


def test_files_found_through_the_ini_skip_with_one_line_each(pytester):
    pytester.makeconftest("import sys\nsys.modules['sglang'] = None\nsys.modules['vllm'] = None\n")
    pytester.mkdir("matrix")
    (pytester.path / "matrix" / "sglang.toml").write_text(matrix(["triton"], engine="sglang"))
    (pytester.path / "matrix" / "vllm.toml").write_text(matrix(["TRITON_MLA"], engine="vllm"))
    result = pytester.runpytest_subprocess("--mla-matrix", "-p", "no:xdist")
    assert result.ret == 0
    result.assert_outcomes(skipped=4)
    result.stdout.fnmatch_lines(["mla: matrix/sglang.toml: every cell skipped: engine 'sglang' is not available here: "
                                 "*; install it with: pip install sglang *",
                                 "mla: matrix/vllm.toml: every cell skipped: engine 'vllm' is not available here: "
                                 "*; install it with: pip install vllm *"])


# -- 23.6: the main command shows the table -------------------------------------------------------

@pytest.mark.parametrize("quiet, shown", [([], True), (["-q"], True), (["-qq"], False)])
def test_the_matrix_sketch_shows_with_q_as_make_matrix_runs_it(liar, quiet, shown):
    liar.makefile(".toml", m=matrix(["lenient", "strict"]))
    result = liar.runpytest("--mla-matrix=m.toml", *quiet)
    sketch = ["m: 4 cells, 2 pass, 2 fail", "backend  sm90  sm100", "lenient  ☑️    ☑️", "strict   ❌    ❌"]
    if shown:
        result.stdout.fnmatch_lines(sketch)
    else:
        assert "backend  sm90  sm100" not in result.stdout.str()
    assert ("mla: host" in result.stdout.str()) is not bool(quiet)  # -q drops the header only


# -- 23.8: a module:attr adapter in the repo root, under the pytest command ------------------------

MINE = '''
from pytest_mla.engines.protocol import Configured


class Mine:
    name = "mine"
    version = "0.1"
    refusal_errors = (ValueError,)

    def configure(self, cell, model):
        return Configured({"decode": cell.backend})
'''


def test_a_root_module_adapter_under_the_pytest_command_says_how_to_import_it(pytester):
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytester.makepyfile(myengine=MINE)
    pytester.makefile(".toml", m=matrix(["lenient"], engine="myengine:Mine"))
    pytester.makeini("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # pytester's own runs add the folder

    def run(*command):
        return subprocess.run([*command, "--mla-matrix=m.toml", "-p", "no:cacheprovider"], cwd=pytester.path,
                              env=env, capture_output=True, text=True, timeout=120)

    script = str(Path(sys.executable).parent / "pytest")  # the console script, as a user types it
    result = run(script)
    assert result.returncode == pytest.ExitCode.INTERRUPTED
    assert ("m.toml: engine.name: engine 'myengine:Mine': cannot import module 'myengine': ModuleNotFoundError: "
            f"No module named 'myengine' (myengine is in the rootdir {pytester.path}, which the pytest command does "
            "not put on sys.path: run python -m pytest, or set pythonpath = . in the pytest ini)") in result.stdout
    assert run(sys.executable, "-m", "pytest").returncode == 0
    pytester.makeini("[pytest]\npythonpath = .\n")
    assert run(script).returncode == 0
