"""User tests over the cells of a matrix (marker + fixture), and their place in the report."""

import pytest

from .helpers import LIAR_CONFTEST, matrix, read_report

pytest_plugins = ["pytester"]

USER_TEST = '''
import pytest

@pytest.mark.mla_matrix("m.toml", select={"backend": ["lenient", "strict"]}, expect="accept")
def test_end_to_end(mla_cell):
    assert mla_cell.expectation.kind == "accept"
    assert mla_cell.model.mla is True
    assert mla_cell.cell.arch != "sm90" or mla_cell.cell.backend != "lenient", "planted failure"
'''


def test_marker_parametrizes_over_selected_cells(pytester):
    pytester.makeconftest(LIAR_CONFTEST)
    pytester.makefile(".toml", m=matrix(["lenient", "strict", "other"], rules="""
        [[rule]]
        when = { backend = "strict", arch = "sm100" }
        reject = { error = "ValueError", message = "strict refuses sm100." }
    """))
    pytester.makepyfile(test_user=USER_TEST)
    result = pytester.runpytest("test_user.py", "-v")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "*test_end_to_end?deepseek-v3-lenient-dcp1-none-sm90? FAILED*",
        "*test_end_to_end?deepseek-v3-lenient-dcp1-none-sm100? PASSED*",
        "*test_end_to_end?deepseek-v3-strict-dcp1-none-sm90? PASSED*",
    ])


def test_user_outcomes_join_the_cell_records(pytester):
    pytester.makeconftest(LIAR_CONFTEST)
    pytester.makefile(".toml", m=matrix(["lenient", "strict"], rules="""
        [[rule]]
        when = { backend = "strict" }
        reject = { error = "ValueError", message = "strict refuses {arch}." }
    """))
    pytester.makepyfile(test_user=USER_TEST)
    result = pytester.runpytest("test_user.py", "--mla-matrix=m.toml")
    result.assert_outcomes(passed=5, failed=1)  # 4 matrix cells, 2 user tests (one planted failure)
    cells = {c["id"]: c for c in read_report(pytester)["cells"]}
    assert cells["deepseek-v3/lenient/dcp1/none/sm90"]["user_tests"] == {"test_end_to_end": "failed"}
    assert cells["deepseek-v3/lenient/dcp1/none/sm100"]["user_tests"] == {"test_end_to_end": "passed"}
    assert "user_tests" not in cells["deepseek-v3/strict/dcp1/none/sm100"]


@pytest.mark.parametrize("marker, message", [
    ('@pytest.mark.mla_matrix("m.toml", select={"colour": "red"})', "select: unknown axis 'colour'"),
    ('@pytest.mark.mla_matrix("m.toml", expect="maybe")', "expect must be 'accept', 'reject' or None"),
    ('@pytest.mark.mla_matrix("m.toml", where=1)', "unknown argument 'where'"),
])
def test_marker_mistakes_are_usage_errors(pytester, marker, message):
    pytester.makefile(".toml", m=matrix(["triton"], engine="reference"))
    pytester.makepyfile(test_user=f"import pytest\n\n{marker}\ndef test_x(mla_cell):\n    pass\n")
    result = pytester.runpytest("test_user.py")
    assert result.ret != 0
    assert message in result.stdout.str() + result.stderr.str()


def test_fixture_without_marker_says_what_is_missing(pytester):
    pytester.makepyfile(test_user="def test_x(mla_cell):\n    pass\n")
    result = pytester.runpytest("test_user.py")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*mla_cell needs @pytest.mark.mla_matrix*"])
