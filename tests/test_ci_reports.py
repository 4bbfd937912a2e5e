"""tools/ci_reports.py: when CI may trust a committed report's kernel column, and the cell-by-cell
validation check it then makes instead of recomputing the report."""

from __future__ import annotations

import copy
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_mla.report.results import read_results, write_results

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "ci_reports.py"


@pytest.fixture(scope="module")
def ci_reports():
    spec = importlib.util.spec_from_file_location("ci_reports", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path):
    for name, text in {"pytest_mla/a.py": "A = 1\n", "matrix/m.toml": "[matrix]\n", "tools/locks/x.txt": "pin\n",
                       "docs/readme.md": "docs\n"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    return tmp_path


def test_the_source_hash_follows_every_source_file_and_nothing_else(ci_reports, repo):
    before = ci_reports.source_hash(repo)
    assert len(before) == 64 and before == ci_reports.source_hash(repo)
    (repo / "docs" / "readme.md").write_text("other docs\n")  # not a source of any report
    (repo / ".gitignore").write_text("__pycache__/\n")
    (repo / "pytest_mla" / "__pycache__").mkdir()
    (repo / "pytest_mla" / "__pycache__" / "a.pyc").write_bytes(b"\0")  # ignored: never a source
    assert ci_reports.source_hash(repo) == before
    # a new module not yet added is hashed: a run made before `git add` hashes as the commit that adds it
    (repo / "pytest_mla" / "new.py").write_text("B = 2\n")
    with_new = ci_reports.source_hash(repo)
    assert with_new != before
    _git(repo, "add", "pytest_mla/new.py")
    assert ci_reports.source_hash(repo) == with_new
    (repo / "pytest_mla" / "new.py").unlink()
    _git(repo, "rm", "-q", "--cached", "pytest_mla/new.py")
    assert ci_reports.source_hash(repo) == before
    (repo / "pytest_mla" / "a.py").write_text("A = 2\n")
    changed = ci_reports.source_hash(repo)
    assert changed != before
    (repo / "pytest_mla" / "a.py").write_text("A = 1\n")
    (repo / "tools" / "locks" / "x.txt").write_text("other pin\n")
    assert ci_reports.source_hash(repo) not in (before, changed)


def test_the_source_hash_names_each_file_so_that_moving_content_changes_it(ci_reports, repo):
    before = ci_reports.source_hash(repo)
    _git(repo, "mv", "pytest_mla/a.py", "pytest_mla/b.py")
    assert ci_reports.source_hash(repo) != before


def _cell(cid, *, outcome="accepted", message=None, verdict="pass", kernel=None, reason=None):
    return {"id": cid, "matrix": "m", "coords": {"backend": cid.split("/")[0]},
            "expectation": {"kind": "accept" if outcome == "accepted" else "reject"},
            "outcome": {"kind": outcome, "message": message}, "verdict": verdict, "reason": reason,
            "kernel": kernel, "nodeid": f"m.toml::{cid}"}


COMMITTED = {"cells": [
    _cell("triton/a", kernel={"status": "verified", "level": "backend"}),
    _cell("flashmla/a", kernel={"status": "failed", "level": "emulated"}, verdict="xfail"),
    _cell("fa3/a", outcome="rejected", message="fa3 needs SM90"),
    _cell("aiter/a", outcome="skipped", verdict="skip", reason="needs 'aiter'"),
]}


def test_a_validation_only_run_matches_its_committed_report_whatever_its_kernel_column(ci_reports):
    fresh = copy.deepcopy(COMMITTED)
    for cell in fresh["cells"]:  # --mla-kernel=off: no kernel record, and a cell that ran nothing passes
        if cell["kernel"]:
            cell["kernel"], cell["verdict"] = None, "pass"
    assert ci_reports.outcome_differences(COMMITTED, fresh) == []


QUICK_REASON = "quick tier: validated only, outside the covering sample (...)"


def _quick(cells):
    """A quick run of COMMITTED's matrix: triton/a in the sample (checked again), flashmla/a outside it."""
    cells[1]["kernel"], cells[1]["verdict"] = {"status": "not-run", "reason": QUICK_REASON}, "pass"


def test_a_quick_run_matches_its_committed_report_on_every_check_it_made_again(ci_reports):
    fresh = copy.deepcopy(COMMITTED)
    _quick(fresh["cells"])
    assert ci_reports.outcome_differences(COMMITTED, fresh) == []


@pytest.mark.parametrize("change, expected", [
    (lambda k: k.update(status="failed"), ["triton/a: kernel.status was 'verified', now 'failed'"]),
    (lambda k: k.update(level="emulated"), ["triton/a: kernel.level was 'backend', now 'emulated'"]),
    (lambda k: k.update(errors={"out": {"max_abs_err": 0.5, "ok": False}}),
     ["triton/a: kernel outputs within tolerance were {}, now {'out': False}"]),
])
def test_a_check_the_quick_run_made_again_must_give_the_committed_result(ci_reports, change, expected):
    fresh = copy.deepcopy(COMMITTED)
    _quick(fresh["cells"])
    change(fresh["cells"][0]["kernel"])
    lines = ci_reports.outcome_differences(COMMITTED, fresh)
    assert [line[:len(e)] for line, e in zip(lines, expected)] == expected and len(lines) == len(expected), lines


@pytest.mark.parametrize("change, expected", [
    (lambda cells: cells[2]["outcome"].update(message="fa3 needs SM90 or SM100"), "fa3/a: outcome was"),
    (lambda cells: cells[0]["outcome"].update(kind="rejected"), "triton/a: outcome was"),
    (lambda cells: cells[3].update(reason="needs 'aiter' and 'hip'"), "aiter/a: reason was"),
    (lambda cells: cells[3].update(verdict="pass"), "aiter/a: verdict was 'skip', now 'pass'"),
    (lambda cells: cells[1]["expectation"].update(kind="reject"), "flashmla/a: expectation was"),
    (lambda cells: cells.pop(0), "triton/a: in the committed report only"),
    (lambda cells: cells.append(_cell("wave/a")), "wave/a: in the fresh run only"),
])
def test_each_validation_difference_is_named_with_its_cell(ci_reports, change, expected):
    fresh = copy.deepcopy(COMMITTED)
    change(fresh["cells"])
    lines = ci_reports.outcome_differences(COMMITTED, fresh)
    assert len(lines) == 1 and lines[0].startswith(expected), lines


def test_the_command_reads_result_files_and_exits_1_naming_what_differs(tmp_path):
    document = read_results(ROOT / "reports" / "reference.json")
    committed = tmp_path / "committed.json"
    write_results(committed, document["run"], document["cells"])

    def outcomes(fresh):
        return subprocess.run([sys.executable, str(SCRIPT), "outcomes", str(committed), str(fresh)],
                              capture_output=True, text=True, cwd=tmp_path)

    same = outcomes(committed)
    assert same.returncode == 0 and "every cell's validation is as in" in same.stdout, same.stdout + same.stderr
    cells = copy.deepcopy(document["cells"])
    refused = next(c for c in cells if c["outcome"] and c["outcome"]["kind"] == "rejected")
    refused["outcome"] = {**refused["outcome"], "message": "another message"}  # the codec shares equal dicts
    fresh = tmp_path / "fresh.json"
    write_results(fresh, document["run"], cells)
    result = outcomes(fresh)
    assert result.returncode == 1, result.stdout
    assert f"1 differences from {committed}" in result.stdout
    assert f"{refused['id']}: outcome was" in result.stdout and "'another message'" in result.stdout


def test_the_command_without_arguments_prints_its_usage(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2 and "source-hash" in result.stderr and "outcomes" in result.stderr


def test_the_numbers_of_a_check_made_again_may_differ_in_their_last_digits(ci_reports):
    committed = copy.deepcopy(COMMITTED)
    committed["cells"][0]["kernel"]["errors"] = {"out": {"max_abs_err": 0.0009824, "ok": True}}
    fresh = copy.deepcopy(committed)
    _quick(fresh["cells"])
    fresh["cells"][0]["kernel"]["errors"] = {"out": {"max_abs_err": 0.0009982, "ok": True}}
    assert ci_reports.outcome_differences(committed, fresh) == []
