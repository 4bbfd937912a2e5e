"""Merging hosts, diffing nights, the baseline gate and the step summary."""

from __future__ import annotations

import copy
import json

import pytest

from pytest_mla.cli import main
from pytest_mla.report.baseline import append_step_summary, check_baseline
from pytest_mla.report.diff import diff_documents
from pytest_mla.report.markdown import render_markdown
from pytest_mla.report.merge import MergeConflictError, MergeError, merge_documents
from pytest_mla.report.results import check_document, read_results

from .helpers import find, make_document, verified


def hosts():
    """Two nightly jobs: an H100 host runs the sm90 column, a B200 host the sm100 column."""
    return (make_document(host_arch="sm90", hostname="h100", only_arch="sm90"),
            make_document(host_arch="sm100", hostname="b200", only_arch="sm100"))


def write(tmp_path, name, doc):
    path = tmp_path / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return str(path)


def test_merge_two_arch_hosts_into_one_table():
    a, b = hosts()
    merged = merge_documents([a, b], names=["h100.json", "b200.json"])
    check_document(merged)
    assert len(merged["cells"]) == len(a["cells"]) + len(b["cells"])
    assert merged["run"]["axes"]["arch"] == ["sm90", "sm100"]
    assert merged["run"]["complete"] and merged["run"]["cells_total"] == len(merged["cells"])
    assert merged["run"]["host"]["arch"] == "sm100+sm90"
    assert [m["file"] for m in merged["run"]["merged_from"]] == ["h100.json", "b200.json"]
    cell = find(merged, "deepseek-v3/triton/dcp1/none/sm100")
    assert cell["kernel"]["status"] == "verified" and cell["kernel"]["where"] == "sm100"
    assert cell["kernel_runs"][0]["host"].startswith("sm100")
    md = render_markdown(merged, view="grid")
    triton = next(line for line in md.splitlines() if line.startswith("| triton"))
    assert "sm90 · none" in md and "sm100 · none" in md and triton.count("✅") == 4
    assert "merged from 2 runs (host archs: sm100, sm90)" in md


def test_a_cell_seen_on_two_hosts_keeps_both_kernel_results():
    a = make_document(host_arch="sm90", hostname="h100")
    b = make_document(host_arch="sm100", hostname="b200")
    merged = merge_documents([a, b])
    cell = find(merged, "deepseek-v3/triton/dcp1/none/sm90")
    statuses = [(k["host"].split()[0], k["status"]) for k in cell["kernel_runs"]]
    assert statuses == [("sm90", "verified"), ("sm100", "not-run")]
    assert cell["kernel"]["status"] == "verified" and "host" not in cell["kernel"]
    assert len(merged["cells"]) == len(a["cells"])


def test_kernel_failure_on_one_host_is_not_a_conflict_but_wins():
    a = make_document(host_arch="sm90", hostname="h100")
    b = make_document(host_arch="sm90", hostname="h200")
    cell = find(b, "deepseek-v3/triton/dcp1/none/sm90")
    cell.update(verdict="fail", reason="kernel out of tolerance",
                kernel={**verified(), "status": "failed", "message": "out: max_abs_err 0.3"})
    merged = merge_documents([a, b])
    out = find(merged, "deepseek-v3/triton/dcp1/none/sm90")
    assert out["verdict"] == "fail" and out["kernel"]["status"] == "failed"


def test_planted_contradiction_is_a_conflict(tmp_path, capsys):
    a, b = make_document(hostname="a"), make_document(hostname="b")
    cell = find(b, "deepseek-v3/flashmla/dcp1/none/sm90")
    cell["outcome"] = {"kind": "rejected", "error": "ValueError", "message": "flashmla refuses"}
    cell.update(verdict="fail", reason="expected accept, but the engine rejected it")
    with pytest.raises(MergeConflictError) as info:
        merge_documents([a, b])
    assert [c["id"] for c in info.value.conflicts] == ["deepseek-v3/flashmla/dcp1/none/sm90"]

    pa, pb, out = write(tmp_path, "a.json", a), write(tmp_path, "b.json", b), tmp_path / "all.json"
    assert main(["merge", pa, pb, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "CONFLICT deepseek-v3/flashmla/dcp1/none/sm90" in err and "flashmla refuses" in err
    assert not out.exists()
    assert main(["merge", pa, pb, "-o", str(out), "--allow-conflicts"]) == 0
    merged = read_results(out)
    assert find(merged, "deepseek-v3/flashmla/dcp1/none/sm90")["verdict"] == "error"
    assert merged["run"]["conflicts"][0]["id"] == "deepseek-v3/flashmla/dcp1/none/sm90"


def test_merge_refuses_different_matrices(tmp_path, capsys):
    a, b = make_document(), make_document()
    b["run"]["matrix"] = "other"
    with pytest.raises(MergeError, match="different matrices: other, t"):
        merge_documents([a, b])
    assert main(["merge", write(tmp_path, "a.json", a), write(tmp_path, "b.json", b), "-o",
                 str(tmp_path / "x.json")]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0


def test_skip_gives_way_to_a_run():
    a, b = make_document(), make_document()
    for c in a["cells"]:
        c.update(verdict="skip", reason="engine not installed", kernel=None)
    merged = merge_documents([a, b])
    assert merged["run"]["counts"]["skip"] == 0


def regressed():
    old = make_document()
    new = copy.deepcopy(old)
    find(new, "deepseek-v3/flashmla/dcp2/none/sm100").update(
        verdict="fail", reason="expected accept, but the engine rejected it:\n  raised: ValueError: x")
    find(new, "deepseek-v3/triton/dcp1/none/sm90")["kernel"]["status"] = "failed"
    find(old, "deepseek-v3/triton/dcp2/none/sm90").update(verdict="error", reason="crashed")
    new["cells"] = [c for c in new["cells"] if c["id"] != "llama-3.1-8b/triton/dcp4/eagle-1x3/sm100"]
    return old, new


def test_diff_sorts_changes():
    old, new = regressed()
    d = diff_documents(old, new)
    assert [c.id for c in d.regressions] == ["deepseek-v3/triton/dcp1/none/sm90", "deepseek-v3/flashmla/dcp2/none/sm100"]
    assert [c.id for c in d.fixes] == ["deepseek-v3/triton/dcp2/none/sm90"]
    assert [c.id for c in d.gone] == ["llama-3.1-8b/triton/dcp4/eagle-1x3/sm100"]
    # the expectation and the engine's raised text, not a line that ends at the colon (issue 13)
    assert d.regressions[1].reason == "expected accept, but the engine rejected it: raised: ValueError: x"
    assert "| `deepseek-v3/flashmla/dcp2/none/sm100` |" in d.markdown()
    back = diff_documents(new, old)
    assert [c.id for c in back.new] == ["llama-3.1-8b/triton/dcp4/eagle-1x3/sm100"]
    assert not diff_documents(old, copy.deepcopy(old)).has_regressions


def test_cli_diff_exit_code_names_the_cell(tmp_path, capsys):
    old, new = regressed()
    po, pn = write(tmp_path, "old.json", old), write(tmp_path, "new.json", new)
    assert main(["diff", po, pn]) == 1
    out = capsys.readouterr().out
    assert ("REGRESSION deepseek-v3/flashmla/dcp2/none/sm100: pass ☑️ accepted → fail ❌ bad: "
            "expected accept, but the engine rejected it: raised: ValueError: x") in out
    assert main(["diff", po, pn, "--format", "md"]) == 1
    assert "#### Regressions (2)" in capsys.readouterr().out
    assert main(["diff", po, po]) == 0


def test_check_baseline_and_step_summary(tmp_path, monkeypatch):
    old, new = regressed()
    regressions, md = check_baseline(old, new)
    assert {c.id for c in regressions} == {"deepseek-v3/triton/dcp1/none/sm90", "deepseek-v3/flashmla/dcp2/none/sm100"}
    assert md.startswith("### ❌ pytest-mla: 2 regression(s)")
    assert check_baseline(old, old)[0] == []

    summary = tmp_path / "summary.md"
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    assert append_step_summary(md) is False
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert append_step_summary(md) is True
    assert summary.read_text(encoding="utf-8") == md


def test_step_summary_respects_the_limit(tmp_path):
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n", encoding="utf-8")
    big = "".join(f"| row {i} | ✅ ünïcödé |\n" for i in range(5000))
    assert append_step_summary(big, summary, limit=20_000)
    data = summary.read_bytes()
    assert len(data) <= 20_000
    text = data.decode("utf-8")  # cut on a character (and line) boundary
    assert text.startswith("earlier step\n| row 0 |")
    assert "1 MiB step-summary limit" in text and "bytes left out" in text
    full = tmp_path / "full.md"
    full.write_bytes(b"x" * 20_000)
    assert append_step_summary("more", full, limit=20_000) is False


def _cut(doc, keep, *, interrupted):
    cut = copy.deepcopy(doc)
    cut["cells"] = cut["cells"][:keep]
    cut["run"].update(complete=False, interrupted=interrupted, cells_reported=keep, cells_total=len(doc["cells"]))
    return cut


def test_diff_against_an_interrupted_run_fails_the_gate_and_says_so(tmp_path, capsys):
    good = make_document()
    total = len(good["cells"])
    po, pn = write(tmp_path, "good.json", good), write(tmp_path, "died.json", _cut(good, 10, interrupted=True))
    assert main(["diff", po, pn]) == 1
    captured = capsys.readouterr()
    assert f"{pn} is incomplete (interrupted: 10 of {total} cells reported): the gate fails" in captured.err
    assert f"0 gone, {total - 10} not reported, 10 unchanged" in captured.out
    assert "  GONE" not in captured.out and "  UNREPORTED " in captured.out
    assert main(["diff", po, pn, "--format", "md"]) == 1
    md = capsys.readouterr().out
    assert md.startswith("### ❌ pytest-mla: 0 regression(s)") and "> ⚠️" in md and "#### Not reported" in md


def test_diff_against_a_shard_compares_what_ran_and_passes(tmp_path, capsys):
    good = make_document()
    po, pn = write(tmp_path, "good.json", good), write(tmp_path, "shard.json", _cut(good, 10, interrupted=False))
    assert main(["diff", po, pn]) == 0
    captured = capsys.readouterr()
    assert f"{pn} is incomplete (10 of {len(good['cells'])} cells reported): its other cells are not compared" \
        in captured.err
    assert ", 0 gone, " in captured.out


def test_an_incomplete_old_run_is_named_and_its_missing_cells_are_new(tmp_path, capsys):
    good = make_document()
    po, pn = write(tmp_path, "died.json", _cut(good, 10, interrupted=True)), write(tmp_path, "good.json", good)
    assert main(["diff", po, pn]) == 0
    captured = capsys.readouterr()
    assert f"{po} is incomplete (interrupted: 10 of {len(good['cells'])} cells reported): cells it lacks show as new" \
        in captured.err


def test_step_summary_refuses_what_is_not_a_regular_file(tmp_path):
    """A FIFO with no reader is refused at once (an append would wait forever), a folder too; the
    summary of a regular file next to them still lands."""
    import os
    import threading

    fifo = tmp_path / "summary.fifo"
    os.mkfifo(fifo)
    outcome = {}

    def append():
        try:
            append_step_summary("x\n", fifo)
        except OSError as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=append, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "appending to a FIFO blocked"
    assert "not a regular file (a FIFO)" in str(outcome.get("error"))
    with pytest.raises(OSError):
        append_step_summary("x\n", tmp_path)
    plain = tmp_path / "plain.md"
    assert append_step_summary("ok\n", plain) and plain.read_text(encoding="utf-8") == "ok\n"
