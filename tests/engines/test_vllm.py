"""The real vLLM adapter, run inside .venv-vllm (skipped when that venv is absent)."""

from __future__ import annotations

import json
import re

from ._venv import ROOT, run_matrix, venv_python

MATRIX = ROOT / "matrix" / "vllm.toml"
NARROW = ("--mla-select=model=deepseek-v3,mla-64", "--mla-select=backend=TOKENSPEED_MLA,FLASHMLA",
          "--mla-select=dcp=1", "--mla-select=spec=none", "--mla-select=page_size=64")


def test_narrow_matrix_passes_against_the_real_engine(tmp_path):
    python = venv_python(".venv-vllm")
    result = run_matrix(python, MATRIX, tmp_path, *NARROW)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "24 passed" in result.stdout  # 2 models x 2 backends x 3 archs x 2 KV dtypes


def test_compiled_extension_reasons_never_reach_a_verdict(tmp_path):
    """FLASHMLA on SM90 is accepted on this CPU machine: the _flashmla_C check is isolated."""
    python = venv_python(".venv-vllm")
    result = run_matrix(python, MATRIX, tmp_path, *NARROW, "--mla-select=arch=sm90", "-rA")
    assert result.returncode == 0, result.stdout
    assert "is not available" not in result.stdout


def test_one_changed_reason_fails_exactly_the_affected_cells(tmp_path):
    python = venv_python(".venv-vllm")
    old = "Reason: ['FlashMLA Dense is only supported on Hopper devices.']\" }"
    text = MATRIX.read_text()
    assert text.count(old) == 1
    changed = tmp_path / "vllm.toml"
    changed.write_text(text.replace(old, old.replace("Hopper devices", "Hopper GPUs")))
    result = run_matrix(python, changed, tmp_path / "reports", *NARROW)
    out = result.stdout
    assert result.returncode == 1, out
    failed = sorted(set(re.findall(r"^FAILED \S*::(\S+)", out, re.M)))
    # That rule decides FLASHMLA on SM100 for every MLA model with a 64-multiple block.
    assert failed == [f"{m}-FLASHMLA-dcp1-none-sm100-{kv}-page64"
                      for m in ("deepseek-v3", "mla-64") for kv in ("kv-auto", "kv-fp8")], out
    assert "4 failed, 20 passed" in out, out
    assert "expected: Selected backend" in out and "raised:   Selected backend" in out


def test_config_layer_and_priority_walk(tmp_path):
    """GQA + DCP is refused by vLLM's config layer; `auto` walks the priority list and can find nothing."""
    python = venv_python(".venv-vllm")
    result = run_matrix(python, MATRIX, tmp_path, "--mla-select=model=qwen2.5-7b,mqa-96,deepseek-v3",
                        "--mla-select=backend=auto", "--mla-select=dcp=2", "--mla-select=spec=none",
                        "--mla-select=arch=sm80", "--mla-select=kv_dtype=fp8", "--mla-select=page_size=64")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(next(tmp_path.glob("vllm-*.json")).read_text())
    outcomes = {c["id"]: c["outcome"] for c in report["cells"]}
    gqa = outcomes["qwen2.5-7b/auto/dcp2/none/sm80/kv-fp8/page64"]
    assert gqa["message"].startswith("Decode context parallelism for GQA/MQA requires `--tensor-parallel-size` (2) "
                                     "to be greater than the model's total number of KV heads (4).")
    walk = outcomes["mqa-96/auto/dcp2/none/sm80/kv-fp8/page64"]
    assert walk["message"].startswith("No valid attention backend found for cuda with AttentionSelectorConfig(")
    assert "TRITON_ATTN: [DCP not supported]" in walk["message"]
    mla = outcomes["deepseek-v3/auto/dcp2/none/sm80/kv-fp8/page64"]  # TRITON_MLA: returns its LSE under DCP
    assert mla["kind"] == "accepted", mla
