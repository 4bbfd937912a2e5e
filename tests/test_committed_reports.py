"""The committed reports/ match the matrix, the engine and the renderers (else: run `make matrix`).

Kernel numbers are not re-measured here (that is `make matrix`'s job); what
is checked is that each committed cell is what the current matrix, engine
and check-shape derivation produce, and that the Markdown and HTML are what
the current renderers make of the committed JSON.
"""

from pathlib import Path

import pytest

from pytest_mla.core.matrix import load_matrix
from pytest_mla.core.verdicts import ACCEPTED, Outcome, judge
from pytest_mla.engines.reference import ReferenceEngine
from pytest_mla.report.html import render_html
from pytest_mla.report.markdown import render_markdown
from pytest_mla.report.results import read_results

ROOT = Path(__file__).resolve().parents[1]
STALE = "reports/ is stale: run `make matrix` and commit reports/"


@pytest.fixture(scope="module")
def document():
    return read_results(ROOT / "reports" / "reference.json")


@pytest.fixture(scope="module")
def matrix():
    return load_matrix(ROOT / "matrix" / "reference.toml", display_path="matrix/reference.toml")


def test_the_run_was_complete_and_green(document, matrix):
    run = document["run"]
    assert run["complete"] and run["cells_reported"] == matrix.size == len(document["cells"]), STALE
    assert {c["verdict"] for c in document["cells"]} <= {"pass", "xfail"}, STALE
    assert [c["id"] for c in document["cells"]] == [c.id for c in matrix.cells()], STALE


def test_each_cell_is_what_the_matrix_and_engine_say_now(document, matrix):
    engine = ReferenceEngine()
    assert document["run"]["engine"]["version"] == engine.version, STALE
    stale = []
    for record, cell in zip(document["cells"], matrix.cells()):
        expect = matrix.expectation(cell, engine.version)
        try:
            engine.configure(cell, matrix.model(cell))
            outcome = Outcome(ACCEPTED)
        except engine.refusal_errors as exc:
            outcome = Outcome.from_exception(exc)
        recorded = record["outcome"]
        if (record["expectation"] != expect.as_dict() or recorded["kind"] != outcome.kind
                or recorded["error"] != outcome.error or recorded["message"] != outcome.message
                or record["verdict"] != judge(expect, outcome)[0]):
            stale.append(cell.id)
    assert not stale, f"{STALE}: {len(stale)} cells differ, first {stale[:3]}"


def test_every_accepted_triton_cell_has_verified_numbers_for_todays_check_shape(document, matrix):
    from pytest_mla.kernels.harness import case_for

    checked = 0
    for record, cell in zip(document["cells"], matrix.cells()):
        if cell.backend != "triton" or record["outcome"]["kind"] != "accepted":
            continue
        kernel = record["kernel"]
        assert kernel["status"] == "verified", f"{cell.id}: {kernel}"
        assert kernel["where"] == "interpreter" or kernel["where"].startswith("sm"), kernel["where"]
        case = case_for(cell.coords, matrix.model(cell), seed=document["run"]["seed"], dtype=matrix.kernel_dtype)
        assert kernel["case"] == case.as_dict(), f"{STALE}: {cell.id} was checked on another shape"
        assert kernel["errors"]["out"]["ok"] and kernel["errors"]["lse"]["ok"]
        checked += 1
    assert checked >= 100


@pytest.mark.parametrize("suffix, render", [(".md", render_markdown), (".html", render_html)])
def test_renderings_are_what_the_renderers_make_of_the_json(document, suffix, render):
    committed = (ROOT / "reports" / f"reference{suffix}").read_text(encoding="utf-8")
    assert committed == render(document), STALE
