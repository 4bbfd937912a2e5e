"""``[probes]`` and ``skip = "reason"`` rules through real pytest sessions."""

import json

import pytest

from pytest_mla.cli import main as pytest_mla_cli

from .helpers import matrix, read_report, verdicts

pytest_plugins = ["pytester"]

#: An engine that writes down every cell it is asked about, so a test can see which ones it never saw.
COUNTING_CONFTEST = '''
import os
from pytest_mla.engines.protocol import Configured


class CountingEngine:
    name = "counting"
    version = "2.0"
    refusal_errors = (ValueError,)

    def configure(self, cell, model):
        with open(os.environ["ASKED_LOG"], "a") as f:
            f.write(cell.id + "\\n")
        if cell.dcp < 1:
            raise ValueError(f"dcp must be >= 1, got {cell.dcp}")
        if cell.backend == "nope":
            raise ValueError(f"unknown backend {cell.backend}")
        if cell.backend == "fast" and cell.arch == "sm90":
            raise ValueError("fast needs sm100")
        return Configured({"decode": cell.backend}, kernel_reason="no kernel here")


def pytest_mla_engines(config):
    return {"counting": CountingEngine}
'''

PROBES_MATRIX = """
[engine]
name = "counting"

[axes]
model = ["deepseek-v3"]
backend = ["triton", "fast", "nope"]
dcp = [0, 1]
spec = ["none"]
arch = ["sm90", "sm100"]

[probes]
dcp = [0]
backend = ["nope"]

[[rule]]
when = { dcp = 0 }
reject = { error = "ValueError", message = "dcp must be >= 1, got 0" }

[[rule]]
when = { backend = "nope" }
reject = { error = "ValueError", message = "unknown backend nope" }

[[rule]]
when = { backend = "fast", arch = "sm90" }
reject = { error = "ValueError", message = "fast needs sm100" }
"""


@pytest.fixture
def counting(pytester, monkeypatch):
    pytester.makeconftest(COUNTING_CONFTEST)
    log = pytester.path / "asked.log"
    monkeypatch.setenv("ASKED_LOG", str(log))
    return pytester, log


@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_probe_cells_run_and_are_judged_and_the_json_names_the_probes(counting, workers):
    pytester, log = counting
    pytester.makefile(".toml", m=PROBES_MATRIX)
    result = pytester.runpytest("--mla-matrix=m.toml", "-p", "no:cacheprovider", *workers)
    result.assert_outcomes(passed=12)
    assert len(log.read_text().splitlines()) == 12  # the probe cells ran like the others
    doc = read_report(pytester)
    assert doc["run"]["probes"] == {"backend": ["nope"], "dcp": [0]}
    assert doc["run"]["models"]["deepseek-v3"]["mla"] is True
    md = (pytester.path / "reports" / "m.md").read_text(encoding="utf-8")
    tables = md[:md.index("## Input validation")]
    assert "| fast " in tables and "nope" not in tables and "dcp must be" not in tables
    validation = md[md.index("## Input validation"):md.index("## Full matrix")]
    rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in validation.splitlines()
            if line.startswith("| ")][1:]  # after the header (the separator starts "|-")
    assert rows == [
        ["backend = nope", "2", "with DCP 0", "⛔ ValueError: dcp must be &gt;= 1, got 0"],
        ["", "2", "without DCP", "⛔ ValueError: unknown backend nope"],
        ["dcp = 0", "6", "", "⛔ ValueError: dcp must be &gt;= 1, got 0"],
    ]


def test_a_probe_whose_refusal_the_matrix_misdescribes_fails_like_any_cell(counting):
    pytester, _ = counting
    pytester.makefile(".toml", m=PROBES_MATRIX.replace('message = "unknown backend nope"', 'message = "x"'))
    result = pytester.runpytest("--mla-matrix=m.toml", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=10, failed=2)
    result.stdout.fnmatch_lines(["*FAIL  deepseek-v3/nope/dcp1/none/sm90: wrong message: expected: x; raised: "
                                 "unknown backend nope (first difference at character 0)*"])


@pytest.mark.parametrize("probes, expected", [
    ("gpu = [1]", "probes.gpu: unknown axis 'gpu'"),
    ("dcp = [3]", "probes.dcp: 3 is not a value of axis 'dcp' (known: 0, 1)"),
    ("dcp = [0, 1]", "probes.dcp: every value of axis 'dcp' is a probe"),
    ("dcp = 0", "probes.dcp: probes of 'dcp' must be a non-empty list of its values, got 0"),
    ("dcp = [0, 0]", "probes.dcp: duplicate probe value 0"),
])
def test_bad_probes_are_matrix_errors_with_their_line(counting, probes, expected):
    pytester, _ = counting
    text = PROBES_MATRIX.replace('dcp = [0]\nbackend = ["nope"]', probes)
    path = pytester.makefile(".toml", m=text)
    written = path.read_text().splitlines()
    line = written.index(probes, written.index("[probes]")) + 1
    result = pytester.runpytest("--mla-matrix=m.toml", "-p", "no:cacheprovider")
    assert result.ret != 0
    errors = [line for line in result.stdout.lines if line.startswith("m.toml:")]
    assert len(errors) == 1 and errors[0].startswith(f"m.toml:{line}: {expected}"), errors


SKIP_RULES = """
[[rule]]
when = { backend = "fast", arch = "sm90" }
skip = "fast has no sm90 build in this release"
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_a_skip_rule_never_asks_the_engine_and_records_skip_with_its_reason(counting, workers):
    pytester, log = counting
    pytester.makefile(".toml", m=matrix(["triton", "fast"], engine="counting", rules=SKIP_RULES))
    result = pytester.runpytest("--mla-matrix=m.toml", "-p", "no:cacheprovider", "-rs", *workers)
    result.assert_outcomes(passed=3, skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*fast has no sm90 build in this release*"])
    asked = log.read_text().splitlines()
    assert "deepseek-v3/fast/dcp1/none/sm90" not in asked and len(asked) == 3
    doc = read_report(pytester)
    cell = next(c for c in doc["cells"] if c["id"] == "deepseek-v3/fast/dcp1/none/sm90")
    assert cell["verdict"] == "skip" and cell["reason"] == "fast has no sm90 build in this release"
    assert cell["outcome"] is None and cell["kernel"] is None
    assert cell["expectation"]["kind"] == "skip" and cell["expectation"]["rule"] == 0
    md = (pytester.path / "reports" / "m.md").read_text(encoding="utf-8")
    row = next(line for line in md.splitlines() if line.startswith("| fast")).replace("\u00a0", " ")
    assert row.split("|")[2].strip().startswith("➖ [")  # sm90: not applicable
    assert "not applicable: fast has no sm90 build in this release" in md


def test_skip_rule_in_explain_and_first_match_wins(counting, capsys):
    pytester, _ = counting
    path = pytester.makefile(".toml", m=matrix(["triton", "fast"], engine="counting", rules=SKIP_RULES + """
[[rule]]
when = { backend = "fast" }
reject = { error = "ValueError", message = "never reached on sm90" }
"""))
    assert pytest_mla_cli(["explain", str(path), "deepseek-v3/fast/dcp1/none/sm90"]) == 0
    out = capsys.readouterr().out
    assert "→ rule[0] (line" in out and "skip (not applicable: fast has no sm90 build in this release)" in out
    assert out.rstrip().endswith("expectation: skip: fast has no sm90 build in this release")


@pytest.mark.parametrize("rule, expected", [
    ('skip = "x"\naccept = true', "rule[0]: a rule has one of 'reject', 'accept' or 'skip', not 'accept' and 'skip'"),
    ('skip = ""', "rule[0].skip: skip must be a reason string"),
    ('skip = true', "rule[0].skip: skip must be a reason string"),
    ('skip = "x"\nxfail = "bug"', "rule[0].xfail: a skipped cell is never run: it cannot be xfail as well"),
])
def test_bad_skip_rules(counting, rule, expected):
    pytester, _ = counting
    pytester.makefile(".toml", m=matrix(["triton"], engine="counting", rules=f"""
[[rule]]
when = {{ backend = "triton" }}
{rule}
"""))
    result = pytester.runpytest("--mla-matrix=m.toml", "-p", "no:cacheprovider")
    assert result.ret != 0
    errors = [line for line in result.stdout.lines if line.startswith("m.toml:")]
    assert len(errors) == 1 and expected in errors[0], errors


def test_a_matrix_saved_with_a_byte_order_mark_loads(counting):
    pytester, _ = counting
    (pytester.path / "m.toml").write_bytes(b"\xef\xbb\xbf" + PROBES_MATRIX.encode("utf-8"))
    result = pytester.runpytest("--mla-matrix=m.toml", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=12)
    assert verdicts(read_report(pytester))["deepseek-v3/fast/dcp1/none/sm90"] == "pass"
    # its line numbers are those of the file as an editor shows it
    (pytester.path / "m.toml").write_bytes(b"\xef\xbb\xbf" + PROBES_MATRIX.replace("[0]\nbackend", "[7]\nbackend")
                                           .encode("utf-8"))
    line = PROBES_MATRIX.splitlines().index("dcp = [0]") + 1  # the text starts with a newline: line 1 is empty
    result = pytester.runpytest("--mla-matrix=m.toml", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines([f"*m.toml:{line}: probes.dcp: 7 is not a value*"])
    json.dumps(read_report(pytester))  # the earlier report is untouched and plain JSON


UNREACHABLE_CONFTEST = '''
from pytest_mla.engines.protocol import Configured, UnreachableError


class PlatformEngine:
    name = "platforms"
    version = "1.0"
    refusal_errors = (ValueError,)

    def configure(self, cell, model):
        if cell.backend == "rocm_only" and cell.arch == "sm90":
            raise ValueError("rocm_only needs a ROCm GPU")
        if cell.backend == "rocm_only":
            raise UnreachableError("construct", "RocmImpl.__init__ imports 'aiter' (rocm.py:12), which does not "
                                   "exist for this host", engine="platforms", version="1.0")
        return Configured({"decode": cell.backend}, kernel_reason="no kernel here")

    def metadata(self):
        return {}


def pytest_mla_engines(config):
    return {"platforms": PlatformEngine}
'''


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_a_cell_the_engine_cannot_reach_here_is_skipped_naming_the_import(pytester, xdist):
    """Unreachable is neither the engine's refusal nor a crash: skip, with the import in the reason; a refusal
    raised before it is still judged."""
    pytester.makeconftest(UNREACHABLE_CONFTEST)
    pytester.makefile(".toml", m=matrix(["rocm_only", "plain"], engine="platforms", archs=("sm90", "gfx942"), rules="""
        [[rule]]
        when = { backend = "rocm_only", arch = "sm90" }
        reject = { error = "ValueError", message = "rocm_only needs a ROCm GPU" }
    """))
    result = pytester.runpytest("--mla-matrix=m.toml", "-rs", *xdist)
    result.assert_outcomes(passed=3, skipped=1)
    result.stdout.fnmatch_lines(["*unreachable on this host: adapter step 'construct' failed on platforms 1.0: "
                                 "RocmImpl.__init__ imports 'aiter' (rocm.py:12)*"])
    doc = read_report(pytester)
    assert verdicts(doc) == {"deepseek-v3/rocm_only/dcp1/none/sm90": "pass",
                             "deepseek-v3/rocm_only/dcp1/none/gfx942": "skip",
                             "deepseek-v3/plain/dcp1/none/sm90": "pass",
                             "deepseek-v3/plain/dcp1/none/gfx942": "pass"}
    skipped = next(c for c in doc["cells"] if c["verdict"] == "skip")
    assert skipped["outcome"]["error"] == "UnreachableError" and "'aiter'" in skipped["outcome"]["message"]


NOT_SERVED_CONFTEST = '''
from pytest_mla.engines.protocol import Configured, NotServedError


class FamiliesEngine:
    name = "families"
    version = "2.1"
    refusal_errors = (ValueError,)

    def configure(self, cell, model):
        if cell.model == "minicpm3-4b":
            raise NotServedError(cell.model, "its model class builds standard Attention layers (minicpm3.py)",
                                 engine="families", version="2.1")
        if cell.backend == "mla_only" and not model.mla:
            raise ValueError("mla_only needs an MLA model")
        return Configured({"decode": cell.backend}, kernel_reason="no kernel here")

    def metadata(self):
        return {}


def pytest_mla_engines(config):
    return {"families": FamiliesEngine}
'''


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_a_model_the_engine_serves_without_mla_is_skipped_naming_its_decision(pytester, xdist):
    """Neither a refusal nor a crash: every cell of the model is a skip whose reason says the engine does not
    serve it with MLA, and the report holds them (the family is reported, not silently absent)."""
    pytester.makeconftest(NOT_SERVED_CONFTEST)
    text = matrix(["mla_only"], engine="families", archs=("sm90",)).replace(
        'model = ["deepseek-v3"]', 'model = ["deepseek-v3", "minicpm3-4b", "llama-3.1-8b"]')
    pytester.makefile(".toml", m=text + '''
        [[rule]]
        when = { backend = "mla_only", "model.mla" = false }
        reject = { error = "ValueError", message = "mla_only needs an MLA model" }
    ''')
    result = pytester.runpytest("--mla-matrix=m.toml", "-rs", *xdist)
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["*not served: families 2.1 does not serve minicpm3-4b with MLA: its model class "
                                 "builds standard Attention layers (minicpm3.py)*"])
    doc = read_report(pytester)
    assert verdicts(doc) == {"deepseek-v3/mla_only/dcp1/none/sm90": "pass",
                             "minicpm3-4b/mla_only/dcp1/none/sm90": "skip",
                             "llama-3.1-8b/mla_only/dcp1/none/sm90": "pass"}
    skipped = next(c for c in doc["cells"] if c["verdict"] == "skip")
    assert skipped["outcome"]["error"] == "NotServedError"
