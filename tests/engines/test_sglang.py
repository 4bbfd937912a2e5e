"""The real SGLang adapter, run inside .venv-sglang (skipped when that venv is absent)."""

from __future__ import annotations

import json
import re
import shutil

from ._venv import ROOT, run_matrix, venv_python

MATRIX = ROOT / "matrix" / "sglang.toml"
SEED_0523 = "returns no rank-local LSE for the cross-rank merge. Select cutedsl_mla.\" }"
NARROW = ("--mla-select=model=deepseek-v3", "--mla-select=backend=trtllm_mla", "--mla-select=dcp=1,4",
          "--mla-select=arch=sm100", "--mla-select=kv_dtype=auto")


def test_narrow_matrix_passes_against_the_real_engine(tmp_path):
    python = venv_python(".venv-sglang")
    result = run_matrix(python, MATRIX, tmp_path, *NARROW)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(next(tmp_path.glob("sglang-*.json")).read_text())
    cells = {c["id"]: c for c in report["cells"]} if isinstance(report.get("cells"), list) else report["cells"]
    assert len(cells) == 6  # dcp 1,4 x spec none, eagle-1x3, eagle-4x3
    assert all(c["verdict"] == "pass" for c in cells.values())


def test_one_changed_message_fails_exactly_the_affected_cells(tmp_path):
    """Alter the 0.5.23 DCP + speculative message: only the cells it decides fail, with a readable diff."""
    python = venv_python(".venv-sglang")
    text = MATRIX.read_text()
    assert text.count(SEED_0523) == 1
    changed = tmp_path / "sglang.toml"
    changed.write_text(text.replace(SEED_0523, SEED_0523.replace("Select cutedsl_mla.", "Select flashmla.")))
    shutil.copy(MATRIX, tmp_path / "original.toml")
    result = run_matrix(python, changed, tmp_path / "reports", *NARROW)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    failed = sorted(set(re.findall(r"^FAILED \S*::(\S+)", out, re.M)))
    # Only DCP 4 with EAGLE chains reaches that rule; the draft tree is refused earlier (page size).
    assert failed == ["deepseek-v3-trtllm_mla-dcp4-eagle-1x3-sm100-kv-auto"], out
    assert "5 passed" in out and "1 failed" in out, out
    assert "expected: trtllm_mla cannot serve decode context parallelism" in out, out
    assert "Select flashmla." in out and "raised:   trtllm_mla cannot serve" in out, out
    assert re.search(r"raised:   .*Select cutedsl_mla\.$", out, re.M), out


def test_unknown_backend_and_cross_attention_reach_sglangs_own_checks(tmp_path):
    """`no_such_backend` is outside argparse's choices: built as Engine(**kwargs), refused by the registry lookup.

    The Mllama config is encoder-decoder: the triton factory's cross-attention assert refuses it.
    """
    python = venv_python(".venv-sglang")
    result = run_matrix(python, MATRIX, tmp_path, "--mla-select=model=llama-3.2-11b-vision,deepseek-v3",
                        "--mla-select=backend=triton,no_such_backend", "--mla-select=dcp=1",
                        "--mla-select=spec=none", "--mla-select=arch=sm90", "--mla-select=kv_dtype=auto")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(next(tmp_path.glob("sglang-*.json")).read_text())
    outcomes = {c["id"]: c["outcome"] for c in report["cells"]}
    assert len(outcomes) == 4
    for model in ("llama-3.2-11b-vision", "deepseek-v3"):
        unknown = outcomes[f"{model}/no_such_backend/dcp1/none/sm90/kv-auto"]
        assert (unknown["error"], unknown["message"]) == ("ValueError", "Invalid attention backend: no_such_backend")
    cross = outcomes["llama-3.2-11b-vision/triton/dcp1/none/sm90/kv-auto"]
    assert cross["error"] == "AssertionError"
    assert cross["message"].startswith("Cross attention is not supported in the triton attention backend.")
    assert outcomes["deepseek-v3/triton/dcp1/none/sm90/kv-auto"]["kind"] == "accepted"
