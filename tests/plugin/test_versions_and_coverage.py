"""Engine versions a matrix does not describe stop the run; --mla-assume-version; backend coverage."""

from __future__ import annotations


import pytest

from pytest_mla.report.results import read_results

from .helpers import LIAR_CONFTEST, matrix, read_report, verdicts

COVERAGE_CONFTEST = LIAR_CONFTEST + '''

class ListingEngine(LiarEngine):
    name = "listing"

    def registered_backends(self):
        return {"lenient": True, "other": True, "fast_mla": True, "gqa_only": False}


def pytest_mla_engines(config):
    return {"liar": LiarEngine, "listing": ListingEngine}
'''

GATED = """
[[rule]]
engine_version = ">=2"
when = { backend = "strict" }
reject = { error = "ValueError", message = "strict refuses {arch}." }
"""


def versioned(spec, **kw):
    return matrix(["lenient", "strict"], rules=GATED, **kw).replace('name = "liar"', f'name = "liar"\nversion = "{spec}"')


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_a_version_the_matrix_does_not_describe_stops_at_collection(liar, xdist):
    liar.makefile(".toml", m=versioned(">=2,<3"))
    result = liar.runpytest("--mla-matrix=m.toml", *xdist)
    assert result.ret in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.TESTS_FAILED)  # xdist: 1
    result.stdout.fnmatch_lines(["*m.toml: engine.version: describes liar <3,>=2, but liar 1.2.0 is installed "
                                 "(--mla-assume-version=V evaluates its rules as if V were installed)*"])
    assert "passed" not in result.stdout.str() and "skipped" not in result.stdout.str()


def test_assume_version_runs_every_cell_and_reports_both_versions(liar):
    liar.makefile(".toml", m=versioned(">=2,<3"))
    result = liar.runpytest("--mla-matrix=m.toml", "--mla-assume-version=2.1")
    result.assert_outcomes(passed=4)  # 1.2.0 refuses `strict` exactly as the >=2 rule says
    result.stdout.fnmatch_lines(["mla: m.toml: engine liar 1.2.0 (rules of 2.1), 4 cells"])
    run = read_report(liar)["run"]
    assert run["engine"]["version"] == "1.2.0" and run["engine"]["assumed_version"] == "2.1"
    assert run["complete"] is True


def test_assumed_version_changes_which_rules_apply(liar):
    """The gated rule applies only from 2.0: assuming 1.5, the refusal of `strict` is unexpected."""
    liar.makefile(".toml", m=versioned("*"))
    result = liar.runpytest("--mla-matrix=m.toml", "--mla-assume-version=liar=1.5")
    result.assert_outcomes(passed=2, failed=2)
    assert verdicts(read_report(liar)) == {
        "deepseek-v3/lenient/dcp1/none/sm90": "pass", "deepseek-v3/lenient/dcp1/none/sm100": "pass",
        "deepseek-v3/strict/dcp1/none/sm90": "fail", "deepseek-v3/strict/dcp1/none/sm100": "fail"}
    # Scoped to another engine, the installed version's rules apply.
    liar.runpytest("--mla-matrix=m.toml", "--mla-assume-version=vllm=1.5").assert_outcomes(passed=2, failed=2)
    assert read_report(liar)["run"]["engine"]["assumed_version"] is None


def test_an_assumed_version_the_matrix_does_not_describe_is_refused(liar):
    liar.makefile(".toml", m=versioned(">=2,<3"))
    result = liar.runpytest("--mla-matrix=m.toml", "--mla-assume-version=3.0")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*describes liar <3,>=2, but --mla-assume-version asks for 3.0 (1.2.0 is installed)*"])


@pytest.mark.parametrize("value", ["banana", "liar=", "=x.y"])
def test_bad_assume_version_is_a_usage_error(liar, value):
    liar.makefile(".toml", m=versioned("*"))
    result = liar.runpytest("--mla-matrix=m.toml", f"--mla-assume-version={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--mla-assume-version: expected [[]ENGINE=[]]VERSION*got {value!r}*"])


def test_uncovered_backends_are_named_in_the_header_and_the_json(pytester):
    pytester.makeconftest(COVERAGE_CONFTEST)
    pytester.makefile(".toml", m=matrix(["lenient", "other+lenient"], engine="listing"))
    result = pytester.runpytest("--mla-matrix=m.toml")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["mla: m.toml: not covered: 1 MLA-capable backends the engine registers: fast_mla"])
    coverage = read_report(pytester)["run"]["engine"]["coverage"]
    assert coverage == {"registered": ["fast_mla", "gqa_only", "lenient", "other"],
                        "mla_capable": ["fast_mla", "lenient", "other"], "uncovered_mla": ["fast_mla"]}
    assert result.ret == 0


@pytest.mark.parametrize("how", [["--mla-strict-coverage"], ["-o", "mla_strict_coverage=true"]], ids=["flag", "ini"])
def test_strict_coverage_fails_the_session(pytester, how):
    pytester.makeconftest(COVERAGE_CONFTEST)
    pytester.makefile(".toml", m=matrix(["lenient", "other"], engine="listing"))
    result = pytester.runpytest("--mla-matrix=m.toml", *how)
    result.assert_outcomes(passed=4)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["--mla-strict-coverage: m.toml does not cover the MLA-capable backends fast_mla"])
    pytester.makefile(".toml", m=matrix(["lenient", "other", "fast_mla"], engine="listing"))
    covered = pytester.runpytest("--mla-matrix=m.toml", *how)
    assert covered.ret == 0
    covered.stdout.fnmatch_lines(["mla: m.toml: covers every MLA-capable backend the engine registers (3)"])


def test_engines_without_a_listing_have_no_coverage(liar):
    liar.makefile(".toml", m=matrix(["lenient"]))
    result = liar.runpytest("--mla-matrix=m.toml")
    result.assert_outcomes(passed=2)
    assert result.ret == 0
    assert read_results(liar.path / "reports" / "m.json")["run"]["engine"]["coverage"] is None


def test_strict_coverage_that_cannot_be_checked_fails_and_says_why(liar):
    # Asked for, strict coverage must not pass having checked nothing (issue 23.8).
    liar.makefile(".toml", m=matrix(["lenient"]))
    result = liar.runpytest("--mla-matrix=m.toml", "--mla-strict-coverage")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["--mla-strict-coverage: cannot check m.toml: its adapter 'liar' has no "
                                 "registered_backends()"])
PLATFORM_CONFTEST = LIAR_CONFTEST + '''

class PlatformEngine(LiarEngine):
    name = "platforms"

    def known_archs(self):
        return ("smNN", "gfx942", "cpu")


def pytest_mla_engines(config):
    return {"platforms": PlatformEngine}
'''


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_an_arch_the_release_has_no_platform_for_stops_at_collection(pytester, xdist):
    pytester.makeconftest(PLATFORM_CONFTEST)
    text = matrix(["lenient"], engine="platforms", archs=("sm90", "gfx942", "gfx950", "npu"))
    text = text.replace('arch = ["sm90", "gfx942", "gfx950", "npu"]',
                        'arch = [\n    "sm90",\n    "gfx942",\n    "gfx950",\n    "npu",\n]')
    lines = pytester.makefile(".toml", m=text).read_text().splitlines()
    gfx950, npu = lines.index('    "gfx950",') + 1, lines.index('    "npu",') + 1
    result = pytester.runpytest("--mla-matrix=m.toml", *xdist)
    assert result.ret in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.TESTS_FAILED)  # xdist: 1
    result.stdout.fnmatch_lines([
        f"*m.toml:{gfx950}: axes.arch: platforms 1.2.0 has no platform for arch 'gfx950' (known: smNN, gfx942, cpu)*",
        f"*m.toml:{npu}: axes.arch: platforms 1.2.0 has no platform for arch 'npu' (known: smNN, gfx942, cpu)*"])
    assert "passed" not in result.stdout.str()


def test_archs_the_release_knows_run(pytester):
    pytester.makeconftest(PLATFORM_CONFTEST)
    pytester.makefile(".toml", m=matrix(["lenient"], engine="platforms", archs=("sm80", "sm100", "gfx942", "cpu")))
    pytester.runpytest("--mla-matrix=m.toml").assert_outcomes(passed=4)
