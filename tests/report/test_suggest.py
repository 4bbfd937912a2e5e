"""``pytest-mla suggest``: rule edits for a matrix that no longer describes its engine.

The edits are checked two ways that do not use the code under test: the
expected rules are written out by hand, and the patched matrix is run
again on the engine, where every cell must now pass.
"""

import json
import re
import subprocess
import sys

import pytest

pytest_plugins = ["pytester"]

MATRIX = '''
[engine]
name = "reference"

[axes]
model   = ["deepseek-v3", "llama-3.1-8b"]
backend = ["triton", "trtllm_mla", "cutlass_mla"]
dcp     = [1, 2]
spec    = ["none", "eagle-1x3"]
arch    = ["sm90", "sm100"]

# ---- the engine's arch checks
[[rule]]
name = "trtllm_mla needs Blackwell"
when = { backend = "trtllm_mla", arch = "sm90" }
reject = { error = "ValueError", message = "TRTLLM MLA needs Blackwell." }

[[rule]]
when = { backend = "cutlass_mla", arch = "sm90" }
reject = { error = "ValueError", match = "^Cutlass MLA backend is only supported on Blackwell" }

[[rule]]
when = { backend = ["trtllm_mla", "cutlass_mla"], "model.mla" = false }
reject = { error = "ValueError", message = "{backend} backend can only be used with MLA models." }

[[rule]]
when = { dcp = ">1", "model.mla" = false }
reject = { error = "ValueError", match = "^Decode context parallelism needs an MLA model" }

[[rule]]
name = "wrong on purpose"
when = { backend = "triton", dcp = 2, spec = "eagle-1x3" }
reject = { error = "ValueError", match = "nothing like this" }
'''

TRTLLM = "TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x). Please use a different backend."
CUTLASS_DCP = ("cutlass_mla cannot serve decode context parallelism: its decode kernel returns no rank-local LSE "
               "for the cross-rank merge.")
TRTLLM_DCP_SPEC = ("trtllm_mla cannot serve decode context parallelism with speculative decoding: it does not "
                   "forward the cyclic DCP metadata to its decode kernel and returns no rank-local LSE for the "
                   "cross-rank merge. Select cutedsl_mla.")


def _cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "pytest_mla.cli", *args], capture_output=True, text=True,
                          input=stdin)


def _apply(text, diff):
    """A unified diff of one file, applied (hunks in order, context checked)."""
    old = text.splitlines(keepends=True)
    out, i = [], 0
    lines = diff.splitlines(keepends=True)
    for n, line in enumerate(lines):
        head = re.match(r"@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@", line)
        if head:
            start = int(head.group(1)) - 1
            out += old[i:start]
            i = start
        elif line.startswith(("---", "+++")) and n < 2 or line.startswith("\\ No newline"):
            continue
        elif line.startswith("+"):
            out.append(line[1:])
        elif line.startswith("-"):
            assert old[i].rstrip("\n") == line[1:].rstrip("\n"), (old[i], line)
            i += 1
        elif line.startswith(" "):
            assert old[i].rstrip("\n") == line[1:].rstrip("\n"), (old[i], line)
            out.append(old[i])
            i += 1
    return "".join(out + old[i:])


@pytest.fixture
def failed_run(pytester):
    pytester.makefile(".toml", m=MATRIX)
    result = pytester.runpytest("--mla-matrix=m.toml", "--mla-kernel=off", "-p", "no:xdist")
    # Failing: trtllm_mla on sm90 (8, the message changed), the planted rule (2: deepseek-v3
    # triton dcp2 eagle), and what the matrix forgot: trtllm_mla DCP + spec (1), cutlass_mla DCP (2).
    result.assert_outcomes(passed=35, failed=13)
    return pytester


def _rule_line(path, name):
    lines = path.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line == f'name = "{name}"') - 1


def test_suggest_prints_the_rules_and_where_they_go(failed_run, monkeypatch):
    monkeypatch.chdir(failed_run.path)
    proc = _cli("suggest", "reports/m.json", "--format", "rules")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ("pytest-mla suggest: 4 rule(s) for 13 failing cell(s); review before applying "
                           "(nothing was changed)\n")
    blocks = [b for b in proc.stdout.split("\n\n") if b.strip()]
    trtllm = _rule_line(failed_run.path / "m.toml", "trtllm_mla needs Blackwell")
    planted = _rule_line(failed_run.path / "m.toml", "wrong on purpose")
    first = next(b for b in blocks if f"line {trtllm}," in b)
    assert first.splitlines()[-1] == f'reject = {{ error = "ValueError", message = "{TRTLLM}" }}'
    assert "(8 cell(s): " in first
    rules = [b.splitlines()[-2:] for b in blocks if "[[rule]]" in b]
    assert ['when = { backend = "trtllm_mla", dcp = 2, spec = "eagle-1x3" }',
            f'reject = {{ error = "ValueError", message = "{TRTLLM_DCP_SPEC}" }}'] in rules
    assert ['when = { backend = "cutlass_mla", dcp = 2 }',
            f'reject = {{ error = "ValueError", message = "{CUTLASS_DCP}" }}'] in rules
    wrong = next(b for b in blocks if f"line {planted}," in b)
    assert wrong.splitlines()[0] == f"# in the rule at line {planted}, replace its outcome with:"
    assert wrong.splitlines()[-1] == "accept = true"
    assert len(rules) == 2 and len(blocks) == 4


def test_the_patched_matrix_describes_the_engine(failed_run, monkeypatch):
    monkeypatch.chdir(failed_run.path)
    proc = _cli("suggest", "reports/m.json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("--- a/m.toml\n+++ b/m.toml\n")
    before = (failed_run.path / "m.toml").read_text()
    assert (failed_run.path / "m.toml").read_text() == before  # nothing was written
    (failed_run.path / "fixed.toml").write_text(_apply(before, proc.stdout))
    result = failed_run.runpytest("--mla-matrix=fixed.toml", "--mla-kernel=off", "-p", "no:xdist")
    result.assert_outcomes(passed=48)


def test_nothing_to_suggest_for_a_green_run(pytester, monkeypatch):
    pytester.makefile(".toml", m=MATRIX.split("# ---- the engine's arch checks")[0].replace(
        '["triton", "trtllm_mla", "cutlass_mla"]', '["triton"]').replace('["deepseek-v3", "llama-3.1-8b"]',
                                                                          '["deepseek-v3"]'))
    pytester.runpytest("--mla-matrix=m.toml", "--mla-kernel=off", "-p", "no:xdist").assert_outcomes(passed=8)
    monkeypatch.chdir(pytester.path)
    proc = _cli("suggest", "reports/m.json")
    assert proc.returncode == 0 and proc.stdout == ""
    assert "nothing to suggest" in proc.stderr


def test_a_message_with_braces_stays_literal():
    from pytest_mla.report.suggest import suggest

    doc = {"run": {"axes": {"backend": ["a", "b"]}}, "cells": [
        {"id": "a", "coords": {"backend": "a"}, "verdict": "fail", "expectation": {"kind": "accept"},
         "outcome": {"kind": "rejected", "error": "ValueError", "message": "bad {x}"}},
        {"id": "b", "coords": {"backend": "b"}, "verdict": "pass", "expectation": {"kind": "accept"},
         "outcome": {"kind": "accepted"}},
    ]}
    (only,) = suggest(doc)
    assert only.toml().splitlines()[-2:] == ['when = { backend = "a" }',
                                             'reject = { error = "ValueError", message = "bad {{x}}" }']


def test_suggest_refuses_what_is_not_a_result(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"cells": []}))
    proc = _cli("suggest", str(bad))
    assert proc.returncode == 2 and "not a pytest-mla result file" in proc.stderr
