"""examples/engine-repo end to end: its matrix runs green, shards merge back, its kernel verifies.

Each test copies the example into ``pytester.path`` and runs pytest in a
subprocess there, as the example's own CI would.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from pytest_mla.cli import main as pytest_mla_cli
from pytest_mla.report.results import read_results

pytest_plugins = ["pytester"]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "engine-repo"
CELLS = 144  # 3 models x 4 backends x 2 dcp x 3 spec x 2 arch
USER_TESTS = 16  # test_smoke: the accepted tiny-mla/dcp1 cells
TIMINGS = ("duration_s", "started", "finished", "time_s", "args")


@pytest.fixture
def repo(pytester: pytest.Pytester) -> pytest.Pytester:
    shutil.copytree(EXAMPLE, pytester.path, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("reports", "__pycache__", ".pytest_cache"))
    return pytester


def run(repo: pytest.Pytester, *args: str) -> pytest.RunResult:
    return repo.runpytest_subprocess("-p", "no:cacheprovider", *args)


def report(repo: pytest.Pytester, folder: str = "reports") -> dict:
    return read_results(repo.path / folder / "tiny.json")


def without_timings(value):
    """The document minus what differs between two identical runs (and merge's ``kernel_runs``)."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k not in TIMINGS + ("kernel_runs",)}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def test_matrix_and_user_tests_run_green_with_the_conftest_engine_model_and_notes(repo):
    result = run(repo, "tests", "--mla-matrix", "--mla-kernel=off")
    result.assert_outcomes(passed=CELLS + USER_TESTS)
    result.stdout.fnmatch_lines(["*matrix/tiny.toml: engine tinyengine 0.4.1, 144 cells*",
                                 "*144 cells: 144 pass*", "mla report: reports/tiny.json"])
    doc = report(repo)
    run_ = doc["run"]
    assert run_["engine"]["name"] == "tinyengine" and run_["engine"]["version"] == "0.4.1"
    assert run_["engine"]["metadata"] == {"backends": ["triton", "flashinfer", "flashmla", "trtllm_mla"]}
    assert run_["axes"]["model"] == ["deepseek-v2-lite", "tiny-mla", "llama-3.1-8b"]
    assert run_["complete"] is True and run_["counts"]["pass"] == CELLS
    cells = {c["id"]: c for c in doc["cells"]}
    assert sum(c["coords"]["model"] == "tiny-mla" for c in cells.values()) == CELLS // 3

    accepted = cells["tiny-mla/triton/dcp2/eagle-2x2/sm100"]
    assert accepted["outcome"]["kind"] == "accepted" and "notes" not in accepted
    assert accepted["kernel"]["status"] == "not-run" and "--mla-kernel=off" in accepted["kernel"]["reason"]
    assert cells["tiny-mla/triton/dcp1/eagle-1x3/sm90"]["user_tests"] == {"test_smoke": "passed"}

    refused = cells["llama-3.1-8b/flashmla/dcp1/none/sm90"]
    assert refused["outcome"] == {"kind": "rejected", "error": "AttentionConfigError",
                                  "message": "flashmla serves MLA models only; llama-3.1-8b has 8 KV heads."}
    assert refused["notes"] == ["documented in docs/attention-backends.md#flashmla"]  # pytest_mla_cell_record
    assert cells["tiny-mla/trtllm_mla/dcp1/none/sm90"]["expectation"]["match"] == \
        "^trtllm_mla needs compute capability 10\\.0 or newer"
    rejected = [c for c in cells.values() if c["outcome"]["kind"] == "rejected"]
    assert len(rejected) == 72 and all(c.get("notes") for c in rejected)

    # The table the example commits is what this run renders (the PR drift gate).
    doc_md = repo.path / "docs" / "attention-backends.md"
    assert pytest_mla_cli(["check", str(doc_md), "--from", str(repo.path / "reports" / "tiny.json")]) == 0


def test_user_tests_run_without_the_matrix_option(repo):
    run(repo).assert_outcomes(passed=USER_TESTS)


def test_an_engine_change_the_matrix_does_not_describe_fails_its_cells(repo):
    engine = repo.path / "tinyengine" / "attention.py"
    engine.write_text(engine.read_text().replace("serves MLA models only", "is for MLA models"))
    result = run(repo, "--mla-matrix", "--mla-kernel=off")
    result.assert_outcomes(passed=CELLS - 24, failed=24)  # flashmla, trtllm_mla x llama-3.1-8b
    result.stdout.fnmatch_lines(["*FAIL  llama-3.1-8b/flashmla/dcp1/none/sm90: wrong message:*"])
    doc_md = repo.path / "docs" / "attention-backends.md"
    assert pytest_mla_cli(["check", str(doc_md), "--from", str(repo.path / "reports" / "tiny.json")]) == 1


def test_three_shards_merge_into_the_unsharded_run(repo):
    run(repo, "--mla-matrix", "--mla-kernel=off").assert_outcomes(passed=CELLS)
    whole = report(repo)
    shards = []
    for i in (1, 2, 3):
        result = run(repo, "--mla-matrix", "--mla-kernel=off", f"--mla-shard={i}/3", f"--mla-report-dir=shard{i}")
        result.assert_outcomes(passed=CELLS // 3, deselected=CELLS - CELLS // 3)
        shards.append(str(repo.path / f"shard{i}" / "tiny.json"))
    merged_path = repo.path / "merged.json"
    assert pytest_mla_cli(["merge", *shards, "-o", str(merged_path)]) == 0
    merged = read_results(merged_path)

    assert [c["id"] for c in merged["cells"]] == [c["id"] for c in whole["cells"]]
    assert without_timings(merged["cells"]) == without_timings(whole["cells"])
    for key in ("matrix", "matrix_file", "title", "engine", "axes", "counts", "cells_total", "cells_reported",
                "seed", "kernel_dtype", "dcp_mode"):
        assert merged["run"][key] == whole["run"][key], key
    assert len(merged["run"]["merged_from"]) == 3


def test_merged_shards_are_complete(repo):
    shards = []
    for i in (1, 2):
        run(repo, "--mla-matrix", "--mla-kernel=off", f"--mla-shard={i}/2", f"--mla-report-dir=shard{i}")
        shards.append(str(repo.path / f"shard{i}" / "tiny.json"))
    assert pytest_mla_cli(["merge", *shards, "-o", str(repo.path / "merged.json")]) == 0
    assert read_results(repo.path / "merged.json")["run"]["complete"] is True


def test_the_engines_own_kernel_verifies_under_the_interpreter(repo):
    # Look, don't import: torch and triton load in the subprocess, after it decides TRITON_INTERPRET.
    for module in ("torch", "triton", "numpy"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"kernel checks need {module} (pip install 'pytest-mla[kernels]')")
    result = run(repo, "--mla-matrix", "--mla-select", "model=tiny-mla", "--mla-select", "backend=triton",
                 "--mla-select", "dcp=2", "--mla-arch=sm90")
    result.assert_outcomes(passed=3, deselected=0)  # the other cells are not collected
    result.stdout.fnmatch_lines(["*kernels: 3 verified on a kernel (0 reused), 0 with emulated kernels, 0 failed, "
                                 "0 not run*"])
    cells = {c["id"]: c for c in report(repo)["cells"]}
    assert sorted(cells) == [f"tiny-mla/triton/dcp2/{spec}/sm90" for spec in ("eagle-1x3", "eagle-2x2", "none")]
    for cell in cells.values():
        kernel = cell["kernel"]
        assert (kernel["status"], kernel["where"], kernel["kernel"]) == ("verified", "interpreter", "tinyengine-triton")
        assert kernel["case"]["dcp"] == 2 and kernel["case"]["h_q"] == 8 and kernel["case"]["d_qk"] == 160
    assert cells["tiny-mla/triton/dcp2/eagle-2x2/sm90"]["kernel"]["case"]["spec_topk"] == 2
