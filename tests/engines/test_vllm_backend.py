"""vLLM's own attention backends in kernel checks: verified cells and faults injected into vLLM.

The checks run inside the vLLM venvs (0.34.0 and 0.33.0; skipped when one is
absent) through ``tests/engines/vllm_faults.py``, which replaces one of the
installed vLLM's functions at run time (never the venv's files): a fault in
vLLM's MLA decode kernel or its DCP merge must turn the cells it touches
from verified into failed, and leave the others verified.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from pytest_mla.report.results import read_results

from ._venv import ROOT, run_matrix, venv_python

MATRIX = ROOT / "matrix" / "vllm.toml"
DRIVER = ROOT / "tests" / "engines" / "vllm_faults.py"
VENVS = [".venv-vllm", ".venv-vllm-0.33.0"]
DECODE = "vllm.v1.attention.ops.triton_decode_attention:decode_attention_fwd"
MERGE = "vllm.v1.attention.ops.dcp:cp_lse_ag_out_rs"


def drive(venv: str, *scenarios: str, dcp_mode: str = "in-process", timeout: float = 900) -> dict[str, dict]:
    python = venv_python(venv)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    result = subprocess.run([os.fspath(python), os.fspath(DRIVER), *scenarios, "--dcp-mode", dcp_mode],
                            cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return {row["scenario"]: row for row in rows}


@pytest.mark.parametrize("venv", VENVS)
def test_vllm_backends_verify_and_injected_faults_fail(venv):
    rows = drive(
        venv,
        "none:v2lite-decode", "none:v2lite-chain", "none:v2lite-decode-dcp2", "none:v2lite-decode-fp8",
        "none:llama-decode",
        "decode-drops-last-token:v2lite-decode", "decode-drops-last-token:v2lite-decode-dcp2",
        "decode-drops-last-token:llama-decode",
        "merge-ignores-lse:v2lite-decode-dcp2", "merge-ignores-lse:v2lite-decode",
    )
    status = {k: v["status"] for k, v in rows.items()}
    # vLLM's own TRITON_MLA layer and TRITON_ATTN layer compute within tolerance
    for scenario in ("none:v2lite-decode", "none:v2lite-chain", "none:v2lite-decode-dcp2",
                     "none:v2lite-decode-fp8", "none:llama-decode"):
        assert status[scenario] == "verified", rows[scenario]
    assert DECODE in rows["none:v2lite-decode"]["functions"]
    assert MERGE in rows["none:v2lite-decode-dcp2"]["functions"]
    assert rows["none:v2lite-decode"]["function"] == "vllm.v1.attention.backends.mla.triton_mla:TritonMLAImpl.forward_mqa"
    # each fault fails the cells whose path it is on, and only those
    for scenario in ("decode-drops-last-token:v2lite-decode", "decode-drops-last-token:v2lite-decode-dcp2",
                     "merge-ignores-lse:v2lite-decode-dcp2"):
        assert status[scenario] == "failed" and not rows[scenario]["finding"], rows[scenario]
        assert rows[scenario]["message"].startswith("out: "), rows[scenario]
    assert status["decode-drops-last-token:llama-decode"] == "verified"  # TRITON_ATTN runs unified_attention
    assert status["merge-ignores-lse:v2lite-decode"] == "verified"  # no DCP, no merge


def test_merge_fault_reaches_distributed_ranks():
    """With --mla-dcp-mode=distributed each rank is its own process, the merge over real gloo collectives."""
    rows = drive(".venv-vllm", "none:v2lite-decode-dcp2", "merge-ignores-lse:v2lite-decode-dcp2",
                 dcp_mode="distributed")
    assert rows["none:v2lite-decode-dcp2"]["status"] == "verified", rows
    assert rows["merge-ignores-lse:v2lite-decode-dcp2"]["status"] == "failed", rows


def test_matrix_kernel_checks_against_the_real_engine(tmp_path):
    """Through pytest: TRITON_MLA cells verified, GPU backends not-run with what they need."""
    python = venv_python(".venv-vllm")
    result = run_matrix(python, MATRIX, tmp_path, "--mla-kernel=auto", "--mla-select=model=deepseek-v2-lite",
                        "--mla-select=backend=TRITON_MLA,FLASHMLA", "--mla-select=arch=sm90",
                        "--mla-select=page_size=64", "--mla-select=kv_dtype=auto")
    assert result.returncode == 0, result.stdout + result.stderr
    cells = {c["id"]: c for c in read_results(next(tmp_path.glob("vllm-*.json")))["cells"]}
    triton = [c for c in cells.values() if c["coords"]["backend"] == "TRITON_MLA" and c["outcome"]["kind"] == "accepted"]
    verified = [c for c in triton if c["kernel"]["status"] == "verified"]
    assert verified and all(c["kernel"]["level"] == "backend" for c in verified)
    assert {c["kernel"]["status"] for c in triton} <= {"verified", "not-run"}
    assert any(c["coords"]["dcp"] > 1 for c in verified)
    for c in triton:
        if c["kernel"]["status"] == "not-run":  # verify rows vLLM's builder sends to its (CUDA) prefill path
            assert "as prefills" in c["kernel"]["reason"], c
    flashmla = [c for c in cells.values() if c["coords"]["backend"] == "FLASHMLA" and c["kernel"]]
    assert flashmla and all(c["kernel"]["status"] == "not-run" and "needs an sm90 GPU" in c["kernel"]["reason"]
                            for c in flashmla)
