"""vLLM's own attention backends in kernel checks: verified cells and faults injected into vLLM.

The checks run inside the vLLM venvs (0.34.0 and 0.33.0; skipped when one is
absent) through ``tests/engines/vllm_faults.py``, which replaces one of the
installed vLLM's functions at run time (never the venv's files): a fault in
vLLM's MLA decode kernel, its DCP merge, its scales or its MLA prefill merge
must turn the cells it touches from verified into failed, and leave the
others verified. The CUDA backends (FLASHMLA, FLASHINFER_MLA, CUTLASS_MLA,
FLASH_ATTN_MLA) run vLLM's code around float64 emulations of their kernels
on this host (level ``emulated``). What 0.34.0 does in a slice of its matrix (a
baseline slice, a platform's cells) is read in its committed report
(``committed_slice``), which CI recomputes and holds to the committed one.
"""

from __future__ import annotations


import pytest

from pytest_mla.report.results import read_results

from ._venv import ROOT, committed_slice, drive_faults, run_matrix, venv_python

MATRIX = ROOT / "matrix" / "vllm.toml"
DRIVER = ROOT / "tests" / "engines" / "vllm_faults.py"
VENVS = [".venv-vllm", ".venv-vllm-0.33.0"]
#: .venv-vllm's release, whose committed report the slice tests read (``committed_slice``: CI recomputes
#: it and fails on any difference) instead of running the slice again.
REPORT = "vllm-0.34.0"
DECODE = "vllm.v1.attention.ops.triton_decode_attention:decode_attention_fwd"
MERGE = "vllm.v1.attention.ops.dcp:cp_lse_ag_out_rs"


def drive(venv: str, *scenarios: str, dcp_mode: str = "in-process", timeout: float = 900) -> dict[str, dict]:
    return drive_faults(DRIVER, venv, *scenarios, dcp_mode=dcp_mode, timeout=timeout)


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


def test_triton_mla_is_verified_past_its_split_threshold_and_a_split_merge_fault_fails():
    """TRITON_MLA splits a request's KV from 2 * _MIN_WORK_PER_SPLIT cached tokens (per DCP rank): a plain
    decode check adds a request past it, and a fault in the merge of the splits, invisible to the short
    lengths (one split), fails the cell: decode and verify (rows flattened to decode rows), under DCP and in
    ROCm's child process alike."""
    rows = drive(".venv-vllm", "none:v2lite-decode", "none:v2lite-decode-dcp2", "none:v2lite-chain",
                 "split-merge-drops-last-split:v2lite-decode", "split-merge-drops-last-split:v2lite-decode-dcp2",
                 "split-merge-drops-last-split:v2lite-decode-gfx942", "split-merge-drops-last-split:v2lite-chain")
    for scenario in ("none:v2lite-decode", "none:v2lite-decode-dcp2", "none:v2lite-chain"):
        row = rows[scenario]
        assert row["status"] == "verified" and row["schedule"]["num_kv_splits"] == [1, 2], row
        assert row["variants"] == ["verified", "verified"], row  # the schedule case, then the short one
    for scenario in ("split-merge-drops-last-split:v2lite-decode", "split-merge-drops-last-split:v2lite-decode-dcp2",
                     "split-merge-drops-last-split:v2lite-decode-gfx942", "split-merge-drops-last-split:v2lite-chain"):
        row = rows[scenario]
        assert row["status"] == "failed" and not row["finding"] and row["message"].startswith("out: "), row
        assert row["variants"] == ["failed", "verified"] and max(row["seqlens"]) >= 1024, row


def test_a_kernel_keeping_only_the_k_scales_exponent_fails_the_calibrated_scale_run_only():
    """An fp8 check runs with k_scale 1 and with a calibrated scale that is not a power of two: a decode
    that rounds the scale to its power of two is right on the first (and on a bf16 cache), wrong on the
    second."""
    rows = drive(".venv-vllm", "triton-mla-k-scale-exponent-only:v2lite-decode-fp8",
                 "triton-mla-k-scale-exponent-only:v2lite-decode")
    row = rows["triton-mla-k-scale-exponent-only:v2lite-decode-fp8"]
    # the schedule case (k_scale 1), the graph-padded run (k_scale 1), the calibrated scale
    assert row["status"] == "failed" and row["variants"] == ["verified", "verified", "failed"], row
    assert row["message"].startswith("out: "), row
    assert rows["triton-mla-k-scale-exponent-only:v2lite-decode"]["status"] == "verified"


def test_a_graph_padded_batch_is_verified_and_a_fault_only_padding_reaches_fails():
    """The check's first run pads the batch as vLLM's runner pads it for a FULL CUDA graph (dummy requests
    with no tokens, the null block): the real rows verify. A builder that counts a decode batch's tokens
    from ``query_start_loc`` is right for every unpadded batch and wrong for a padded one: the cell fails.
    Verify batches are not padded (``batch.graph_padded_size``: decode only), so a verify cell stays verified."""
    rows = drive(".venv-vllm", "none:v2lite-flashmla", "none:v2lite-flashmla-dcp2",
                 "padded-decode-tokens-miscounted:v2lite-decode", "padded-decode-tokens-miscounted:v2lite-chain",
                 "padded-decode-tokens-miscounted:v2lite-flashmla-dcp2",
                 "padded-decode-tokens-miscounted:v2lite-triton-dcp2-chain")
    for scenario in ("none:v2lite-flashmla", "none:v2lite-flashmla-dcp2"):
        row = rows[scenario]
        assert row["status"] == "verified" and row["schedule"] == {"graph_padded_to": [4]}, row  # 3 requests -> 4
    for scenario in ("padded-decode-tokens-miscounted:v2lite-decode",
                     "padded-decode-tokens-miscounted:v2lite-flashmla-dcp2"):
        row = rows[scenario]
        assert row["status"] == "failed" and row["finding"], row
        assert "MLACommonMetadataBuilder.build" in row["function"], row
    for scenario in ("padded-decode-tokens-miscounted:v2lite-chain",
                     "padded-decode-tokens-miscounted:v2lite-triton-dcp2-chain"):
        untouched = rows[scenario]
        assert untouched["status"] == "verified" and "graph_padded_to" not in (untouched["schedule"] or {}), untouched


def test_merge_fault_reaches_distributed_ranks():
    """With --mla-dcp-mode=distributed each rank is its own process, the merge over real gloo collectives."""
    rows = drive(".venv-vllm", "none:v2lite-decode-dcp2", "merge-ignores-lse:v2lite-decode-dcp2",
                 dcp_mode="distributed")
    assert rows["none:v2lite-decode-dcp2"]["status"] == "verified", rows
    assert rows["merge-ignores-lse:v2lite-decode-dcp2"]["status"] == "failed", rows


EMULATED_FAULTS = (
    "library-present:v2lite-flashmla", "library-present:v2lite-flashmla-dcp2-chain",
    "none:v2lite-flashmla", "none:v2lite-flashmla-dcp2", "none:v2lite-flashmla-fp8", "none:v2lite-flashinfer-dcp2",
    "none:v2lite-flashmla-dcp2-chain", "none:v2lite-triton-dcp2-chain",
    "merge-ignores-lse:v2lite-flashmla-dcp2", "merge-lse-base-swapped:v2lite-flashmla-dcp2",
    "merge-lse-base-swapped:v2lite-flashinfer-dcp2", "merge-lse-base-swapped:v2lite-flashmla",
    "flashmla-scale-x1.05:v2lite-flashmla", "flashmla-k-descale-ignored:v2lite-flashmla-fp8",
    "prefill-merge-equal-weights:v2lite-flashmla-dcp2-chain", "prefill-merge-equal-weights:v2lite-triton-dcp2-chain",
    "none:llama-flash-attn-fp8", "none:mqa96-flash-attn-dcp2",
)


def test_faults_in_vllms_code_around_emulated_kernels_fail_the_cells_they_touch():
    rows = drive(".venv-vllm", *EMULATED_FAULTS)
    status = {k: v["status"] for k, v in rows.items()}
    # a finding (matrix/vllm.toml declares it): vLLM's DCP merge kernel needs a power-of-2 head dim
    finding = rows.pop("none:mqa96-flash-attn-dcp2")
    assert finding["status"] == "failed" and finding["finding"], finding
    assert "arange's range must be a power of 2" in finding["message"], finding
    assert finding["function"] == "vllm.v1.attention.ops.dcp:CPTritonContext.call_kernel", finding
    for scenario in rows:
        if scenario.startswith("none:"):
            assert status[scenario] == "verified" and rows[scenario]["level"] == "emulated", rows[scenario]
    assert rows["none:v2lite-flashmla"]["emulated"] == ["torch.ops._flashmla_C:dense_decode_fwd"]
    assert rows["none:v2lite-flashinfer-dcp2"]["emulated"] == ["flashinfer.decode:trtllm_batch_decode_with_kv_cache_mla"]
    assert MERGE in rows["none:v2lite-flashinfer-dcp2"]["functions"]
    # DCP + verify on a backend without DCP support for multi-token decode: vLLM's MLA prefill path
    assert "vllm._custom_ops:cp_gather_cache" in rows["none:v2lite-flashmla-dcp2-chain"]["emulated"]
    assert rows["none:v2lite-flashmla-dcp2-chain"]["function"].endswith("MLACommonBaseImpl.forward_mha")
    assert rows["none:v2lite-flashmla-fp8"]["variants"] == ["verified", "verified"]  # k_scale 1 and != 1
    assert rows["none:llama-flash-attn-fp8"]["function"].endswith("FlashAttentionImpl.forward")
    assert rows["none:llama-flash-attn-fp8"]["variants"] == ["verified", "verified"]
    for scenario in ("merge-ignores-lse:v2lite-flashmla-dcp2", "merge-lse-base-swapped:v2lite-flashmla-dcp2",
                     "merge-lse-base-swapped:v2lite-flashinfer-dcp2", "flashmla-scale-x1.05:v2lite-flashmla",
                     "flashmla-k-descale-ignored:v2lite-flashmla-fp8",
                     "prefill-merge-equal-weights:v2lite-flashmla-dcp2-chain",
                     "prefill-merge-equal-weights:v2lite-triton-dcp2-chain"):
        assert status[scenario] == "failed" and not rows[scenario]["finding"], rows[scenario]
        assert rows[scenario]["message"].startswith("out: "), rows[scenario]
    # only the k_scale != 1 run of an fp8 cache sees a dropped K descale
    assert rows["flashmla-k-descale-ignored:v2lite-flashmla-fp8"]["variants"] == ["verified", "failed"]
    assert status["merge-lse-base-swapped:v2lite-flashmla"] == "verified"  # no DCP, no merge
    # a GPU host's path (the library present, nothing installed): level backend, no emulated callable
    present = rows["library-present:v2lite-flashmla"]
    assert present["status"] == "verified" and present["level"] == "backend" and not present["emulated"], present
    assert rows["library-present:v2lite-flashmla-dcp2-chain"]["level"] == "emulated"  # MLA prefill: 576-wide heads


def test_tokenspeed_mla_runs_around_its_emulated_kernel_and_a_wrong_lse_base_fails_it():
    """TOKENSPEED_MLA + DCP: vLLM's impl, its DCP merge, TokenSpeed's decode emulated (base-2 LSE); an impl that
    declares the LSE natural-log (vLLM PR 47079's bug class) and a merge reading the other base both fail."""
    rows = drive(".venv-vllm", "none:v3-tokenspeed-dcp2", "tokenspeed-lse-natural:v3-tokenspeed-dcp2",
                 "merge-lse-base-swapped:v3-tokenspeed-dcp2")
    clean = rows["none:v3-tokenspeed-dcp2"]
    assert clean["status"] == "verified" and clean["level"] == "emulated", clean
    assert "tokenspeed_mla:tokenspeed_mla_decode" in clean["emulated"], clean
    assert clean["variants"] == ["verified", "verified"]  # k_scale 1 and a calibrated-style k_scale
    assert MERGE in clean["functions"]
    for scenario in ("tokenspeed-lse-natural:v3-tokenspeed-dcp2", "merge-lse-base-swapped:v3-tokenspeed-dcp2"):
        assert rows[scenario]["status"] == "failed" and not rows[scenario]["finding"], rows[scenario]
        assert rows[scenario]["message"].startswith("out: "), rows[scenario]


def test_matrix_kernel_checks_against_the_real_engine(tmp_path):
    """Through pytest: TRITON_MLA cells verified on vLLM's Triton kernels, its DCP + verify and FLASHMLA emulated."""
    python = venv_python(".venv-vllm")
    result = run_matrix(python, MATRIX, tmp_path, "--mla-kernel=auto", "--mla-select=model=deepseek-v2-lite",
                        "--mla-select=backend=TRITON_MLA,FLASHMLA", "--mla-select=arch=sm90",
                        "--mla-select=page_size=64", "--mla-select=kv_dtype=auto")
    assert result.returncode == 0, result.stdout + result.stderr
    cells = {c["id"]: c for c in read_results(next(tmp_path.glob("vllm-*[0-9].json")))["cells"]}
    triton = [c for c in cells.values() if c["coords"]["backend"] == "TRITON_MLA" and c["outcome"]["kind"] == "accepted"]
    prefill = [c for c in triton if c["coords"]["dcp"] > 1 and c["coords"]["spec"] != "none"]
    assert prefill and all(c["kernel"]["status"] == "verified" and c["kernel"]["level"] == "emulated"
                           for c in prefill), prefill  # vLLM's MLA prefill path
    # Triton decode, interpreted (DCP 2 decode exceeds the bf16 bound by ~2 ulps on the issue-20 inputs, on main too)
    decode = [c for c in triton if c not in prefill and c["coords"]["dcp"] == 1]
    assert decode and all(c["kernel"]["status"] == "verified" and c["kernel"]["level"] == "backend" for c in decode)
    flashmla = [c for c in cells.values() if c["coords"]["backend"] == "FLASHMLA" and c["kernel"]]
    assert flashmla and all(c["kernel"]["status"] == "verified" and c["kernel"]["level"] == "emulated"
                            and c["kernel"]["emulated"] for c in flashmla), flashmla


#: A baseline slice of matrix/vllm.toml on vLLM's CUDA MLA backends: page 128 is a block size each takes.
BASELINE = ("--mla-select=model=deepseek-v2-lite", "--mla-select=backend=FLASHMLA,FLASH_ATTN_MLA,FLASHINFER_MLA,CUTLASS_MLA",
            "--mla-select=arch=sm90,sm100", "--mla-select=page_size=128")


def test_baseline_slice_every_accepted_cell_is_verified_emulated_or_a_declared_finding():
    cells = list(committed_slice(REPORT, *BASELINE)[1].values())
    accepted = [c for c in cells if c["outcome"]["kind"] == "accepted"]
    backends = {c["coords"]["backend"] for c in accepted}
    assert backends == {"FLASHMLA", "FLASH_ATTN_MLA", "FLASHINFER_MLA", "CUTLASS_MLA"}, backends
    for c in accepted:
        kernel = c["kernel"]
        if kernel["status"] == "verified":
            assert kernel["level"] == "emulated" and kernel["emulated"], c["id"]
        else:  # a finding the matrix declares (xfail), its note naming the level
            assert c["verdict"] == "xfail" and kernel.get("finding"), (c["id"], kernel)
            assert "level emulated" in c["expectation"]["xfail"], c["id"]
    findings = sorted(c["id"] for c in accepted if c["verdict"] == "xfail")
    assert findings and all("/CUTLASS_MLA/" in f and "/none/" in f and "kv-fp8" in f for f in findings), findings


def test_rocm_and_xpu_cells_run_their_triton_backends_in_their_platform_process():
    """ROCm and XPU cells on TRITON_MLA / TRITON_ATTN: vLLM's layer on that platform (its own child process,
    vLLM imported there on it), the cell's arch; under xdist each worker has its children."""
    _, cells = committed_slice(REPORT, "--mla-select=model=deepseek-v2-lite,llama-3.1-8b",
                               "--mla-select=backend=TRITON_MLA,TRITON_ATTN", "--mla-select=dcp=1",
                               "--mla-select=spec=none", "--mla-select=arch=gfx942,gfx950,xpu",
                               "--mla-select=page_size=16")
    labels = {"gfx942": "ROCm", "gfx950": "ROCm", "xpu": "XPU"}
    verified = ["deepseek-v2-lite/TRITON_MLA/dcp1/none/gfx942/kv-auto/page16",
                "deepseek-v2-lite/TRITON_MLA/dcp1/none/gfx950/kv-auto/page16",
                "deepseek-v2-lite/TRITON_MLA/dcp1/none/gfx950/kv-fp8/page16",
                "deepseek-v2-lite/TRITON_MLA/dcp1/none/xpu/kv-auto/page16",
                "llama-3.1-8b/TRITON_ATTN/dcp1/none/gfx942/kv-auto/page16",
                "llama-3.1-8b/TRITON_ATTN/dcp1/none/gfx950/kv-fp8/page16",
                "deepseek-v2-lite/TRITON_MLA/dcp1/none/gfx942/kv-fp8/page16"]  # e4m3fnuz, KV scales doubled
    for cell_id in verified:
        kernel = cells[cell_id]["kernel"]
        assert kernel["status"] == "verified" and kernel["level"] == "backend", (cell_id, kernel)
        arch = cell_id.split("/")[4]
        assert (f"ran in a process that imported vLLM on its {labels[arch]} platform, answering for {arch}"
                in kernel["notes"]), kernel["notes"]
    assert DECODE in cells[verified[0]]["kernel"]["functions"]
    assert "vllm.v1.attention.ops.triton_unified_attention:unified_attention" in cells[verified[4]]["kernel"]["functions"]
    xpu_attn = cells["llama-3.1-8b/TRITON_ATTN/dcp1/none/xpu/kv-auto/page16"]  # its TD path: a declared finding
    assert xpu_attn["kernel"]["status"] == "failed" and xpu_attn["verdict"] == "xfail", xpu_attn


def test_faults_in_vllms_code_fail_rocm_xpu_and_cpu_cells_in_their_platform_process():
    """TRITON_MLA / TRITON_ATTN pass their Triton kernel, CPU_MLA its (emulated) CPU op, the softmax scale
    × 1.05: the check, run in the platform's child process, fails; the same child then verifies the
    unfaulted cell. CPU_MLA's verify rows run vLLM's CPU SDPA prefill, nothing emulated."""
    rows = drive(".venv-vllm", "triton-mla-scale-x1.05:v2lite-decode-gfx942", "triton-mla-scale-x1.05:v2lite-decode-xpu",
                 "triton-attn-scale-x1.05:llama-decode-gfx950", "none:llama-decode-gfx950",
                 "cpu-mla-scale-x1.05:v2lite-cpu-mla", "none:v2lite-cpu-mla", "none:v2lite-cpu-mla-chain")
    cpu = rows["none:v2lite-cpu-mla"]
    assert cpu["status"] == "verified" and cpu["level"] == "emulated", cpu
    assert cpu["emulated"] == ["torch.ops._C:mla_decode_kvcache"], cpu
    chain = rows["none:v2lite-cpu-mla-chain"]
    assert chain["status"] == "verified" and chain["level"] == "backend" and not chain["emulated"], chain
    assert "vllm.v1.attention.backends.mla.prefill.cpu_sdpa:CPUSDPAMLAPrefillBackend" in chain["functions"], chain
    for scenario in ("triton-mla-scale-x1.05:v2lite-decode-gfx942", "triton-mla-scale-x1.05:v2lite-decode-xpu",
                     "triton-attn-scale-x1.05:llama-decode-gfx950", "cpu-mla-scale-x1.05:v2lite-cpu-mla"):
        row = rows[scenario]
        assert row["status"] == "failed" and not row["finding"] and "beyond abs" in row["message"], row
    assert rows["none:llama-decode-gfx950"]["status"] == "verified", rows["none:llama-decode-gfx950"]


def test_rocm_attn_runs_its_triton_paths_in_the_rocm_process_and_a_scale_fault_fails_them():
    """`auto` on ROCm resolves GQA models to ROCM_ATTN: its decode (Triton ``kernel_paged_attention_2d``) and
    its verify rows (Triton ``context_attention_fwd``, fp8 cache) verify at level backend in the ROCm child; the
    softmax scale × 1.05 into ``chunked_prefill_paged_decode`` fails both. Where vLLM picks ROCm's HIP paged
    attention (128-wide heads, blocks of 16, CDNA) the cell is not-run naming that op."""
    rows = drive(".venv-vllm", "none:llama-rocm-attn-gfx942", "none:mqa96-rocm-attn-fp8-chain-gfx950",
                 "rocm-attn-scale-x1.05:llama-rocm-attn-gfx942", "rocm-attn-scale-x1.05:mqa96-rocm-attn-fp8-chain-gfx950",
                 "none:llama-rocm-attn-page16-gfx942")
    ops = "vllm.v1.attention.ops."
    for case in ("llama-rocm-attn-gfx942", "mqa96-rocm-attn-fp8-chain-gfx950"):
        row = rows[f"none:{case}"]
        assert row["status"] == "verified" and row["level"] == "backend" and not row["emulated"], row
        assert row["function"] == "vllm.v1.attention.backends.rocm_attn:RocmAttentionImpl.forward", row
        assert ops + "chunked_prefill_paged_decode:kernel_paged_attention_2d" in row["functions"], row
        faulted = rows[f"rocm-attn-scale-x1.05:{case}"]
        assert faulted["status"] == "failed" and not faulted["finding"] and "beyond abs" in faulted["message"], faulted
    assert ops + "prefix_prefill:context_attention_fwd" in rows["none:mqa96-rocm-attn-fp8-chain-gfx950"]["functions"]
    hip = rows["none:llama-rocm-attn-page16-gfx942"]
    assert hip["status"] == "not-run", hip
    assert "torch.ops._rocm_C.paged_attention (from vllm._custom_ops:paged_attention_rocm)" in hip["reason"], hip


def test_rocm_and_xpu_mla_prefill_rows_stay_not_run_naming_the_platform_library_calls():
    """TRITON_MLA's DCP verify rows go to vLLM's MLA prefill path; on ROCm it calls the upstream flash-attention
    package's varlen (CK) and HIP ops, on XPU vllm-xpu-kernels' varlen: not-run, each callable named."""
    _, cells = committed_slice(REPORT, "--mla-select=model=deepseek-v2-lite", "--mla-select=backend=TRITON_MLA",
                               "--mla-select=dcp=2", "--mla-select=spec=eagle-1x3", "--mla-select=arch=gfx942,xpu",
                               "--mla-select=page_size=16", "--mla-select=kv_dtype=auto")
    rocm = cells["deepseek-v2-lite/TRITON_MLA/dcp2/eagle-1x3/gfx942/kv-auto/page16"]["kernel"]
    xpu = cells["deepseek-v2-lite/TRITON_MLA/dcp2/eagle-1x3/xpu/kv-auto/page16"]["kernel"]
    assert rocm["status"] == xpu["status"] == "not-run", (rocm, xpu)
    prefill = "its MLA prefill path (vllm.model_executor.layers.attention.mla_attention:MLACommonBaseImpl.forward_mha)"
    assert prefill in rocm["reason"] and prefill in xpu["reason"], (rocm, xpu)
    assert ("calls flash_attn:flash_attn_varlen_func, vllm._custom_ops:cp_gather_cache, "
            "vllm._custom_ops:gather_and_maybe_dequant_cache, vllm._custom_ops:merge_attn_states") in rocm["reason"], rocm
    assert "calls vllm._xpu_ops:xpu_ops.flash_attn_varlen_func" in xpu["reason"], xpu


def test_xpu_triton_attn_runs_its_tensor_descriptor_path_which_reads_past_the_sequence_end():
    """On XPU TRITON_ATTN loads its KV tiles through tensor descriptors (``use_td``): the whole tile of a
    sequence's last block, V rows past its end included, goes into ``P @ V`` unmasked, so the NaN the check
    keeps in unused cache slots reaches the output (0 * NaN) and the cell fails; vLLM's own switch
    ``VLLM_TRITON_USE_TD=0`` (masked pointer loads) verifies the same cell in the same XPU child."""
    rows = drive(".venv-vllm", "none:llama-decode-xpu", "triton-td-off:llama-decode-xpu")
    td = rows["none:llama-decode-xpu"]
    assert td["status"] == "failed" and td["level"] == "backend" and not td["finding"], td
    assert "NaN position(s) differ" in td["message"], td
    assert "vllm.v1.attention.ops.triton_unified_attention:unified_attention" in td["functions"], td
    plain = rows["triton-td-off:llama-decode-xpu"]
    assert plain["status"] == "verified" and plain["level"] == "backend", plain


def test_faults_in_vllms_code_fail_cpu_attn_and_amx_mla_cells_in_the_cpu_process():
    """CPU_ATTN (GQA) and AMX_MLA run vLLM's own impls in the CPU child, their torch.ops._C emulated: verified
    unfaulted; a scale × 1.05 or a wrong row map in vLLM's Python fails them. cpu and cpu_amx take different
    ISAs (vec, amx): cache writes packed for vec are harmless on cpu and a failure on cpu_amx."""
    rows = drive(".venv-vllm", "none:llama-cpu-attn", "none:llama-cpu-attn-amx", "none:qwen-cpu-attn-amx-fp8-chain",
                 "cpu-attn-scale-x1.05:llama-cpu-attn", "cpu-attn-scale-x1.05:qwen-cpu-attn-amx-fp8-chain",
                 "cpu-attn-cache-isa-vec:llama-cpu-attn", "cpu-attn-cache-isa-vec:llama-cpu-attn-amx",
                 "none:v2lite-amx-mla", "none:v2lite-amx-mla-chain", "amx-mla-scale-x1.05:v2lite-amx-mla",
                 "amx-mla-wrong-row:v2lite-amx-mla", "amx-mla-wrong-row:v2lite-amx-mla-chain")
    attn_ops = ["torch.ops._C:cpu_attention_with_kv_cache", "torch.ops._C:cpu_attn_reshape_and_cache",
                "torch.ops._C:get_scheduler_metadata"]
    for scenario in ("none:llama-cpu-attn", "none:llama-cpu-attn-amx", "none:qwen-cpu-attn-amx-fp8-chain",
                     "cpu-attn-cache-isa-vec:llama-cpu-attn"):
        row = rows[scenario]
        assert row["status"] == "verified" and row["level"] == "emulated", row
        assert sorted(row["emulated"]) == attn_ops, row
        assert row["function"] == "vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.forward", row
        assert "vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.do_kv_cache_update" in row["functions"]
    decode, chain = rows["none:v2lite-amx-mla"], rows["none:v2lite-amx-mla-chain"]
    assert decode["status"] == "verified" and decode["level"] == "emulated", decode
    assert sorted(decode["emulated"]) == ["torch.ops._C:bmm_cpu", "torch.ops._C:convert_weight_packed",
                                          "torch.ops._C:decode_attention_cpu"], decode
    assert decode["function"] == "vllm.v1.attention.backends.mla.amx_mla:AMXMLAImpl.forward_mqa", decode
    assert chain["status"] == "verified" and chain["level"] == "emulated", chain
    assert "torch.ops._C:extend_attention_cpu" in chain["emulated"], chain
    assert chain["function"] == "vllm.v1.attention.backends.mla.amx_mla:AMXMLAImpl.forward_mha", chain
    for scenario in ("cpu-attn-scale-x1.05:llama-cpu-attn", "cpu-attn-scale-x1.05:qwen-cpu-attn-amx-fp8-chain",
                     "amx-mla-scale-x1.05:v2lite-amx-mla"):
        row = rows[scenario]
        assert row["status"] == "failed" and not row["finding"] and "beyond abs" in row["message"], row
    for scenario in ("cpu-attn-cache-isa-vec:llama-cpu-attn-amx", "amx-mla-wrong-row:v2lite-amx-mla"):
        row = rows[scenario]  # scrambled tiles / rows of other tokens: NaN or wrong values, never a pass
        assert row["status"] == "failed" and not row["finding"], row
    # the chain's extend reads req_to_token one row past the cache: the kernel would read foreign rows
    wrong = rows["amx-mla-wrong-row:v2lite-amx-mla-chain"]
    assert wrong["status"] == "failed" and "req_to_token" in wrong["message"], wrong


def test_cpu_cells_of_gqa_and_amx_mla_models_verify_in_a_matrix_run():
    """The CPU platform's slice: every accepted CPU_ATTN and AMX_MLA cell is verified at level emulated, its
    record naming the CPU child."""
    _, selected = committed_slice(REPORT, "--mla-select=model=deepseek-v2-lite,llama-3.1-8b",
                                  "--mla-select=backend=auto,FLASHMLA,AMX_MLA", "--mla-select=arch=cpu,cpu_amx",
                                  "--mla-select=page_size=64", "--mla-select=dcp=1")
    cells = [c for c in selected.values() if c["outcome"]["kind"] == "accepted"]
    impls: dict[tuple[str, str], set[str]] = {}
    for c in cells:
        impls.setdefault((c["coords"]["model"], c["coords"]["arch"]), set()).add(
            c["kernel"]["function"].rpartition(":")[2])
    assert impls[("llama-3.1-8b", "cpu")] == impls[("llama-3.1-8b", "cpu_amx")] == {"CPUAttentionBackendImpl.forward"}
    # no AMX: CPU_MLA, its verify rows on vLLM's CPU SDPA prefill; AMX: AMX_MLA's decode and its own forward_mha
    assert impls[("deepseek-v2-lite", "cpu")] == {"CPUMLAImpl.forward_mqa", "MLACommonBaseImpl.forward_mha"}
    assert impls[("deepseek-v2-lite", "cpu_amx")] == {"AMXMLAImpl.forward_mqa", "AMXMLAImpl.forward_mha"}
    for c in cells:
        kernel = c["kernel"]
        plain = kernel["function"].endswith("MLACommonBaseImpl.forward_mha")  # nothing compiled: level backend
        assert kernel["status"] == "verified", (c["id"], kernel)
        assert kernel["level"] == ("backend" if plain else "emulated"), (c["id"], kernel)
        assert any("imported vLLM on its CPU platform" in note for note in kernel["notes"]), kernel["notes"]
    amx = [c for c in cells if c["coords"]["model"] == "deepseek-v2-lite" and c["coords"]["arch"] == "cpu_amx"]
    assert len(amx) == 6, [c["id"] for c in amx]  # auto, FLASHMLA, AMX_MLA x none, eagle-1x3 (bf16 KV only)


def test_xpu_mla_sparse_runs_its_triton_kernels_over_the_selection_and_faults_fail_it():
    """DeepSeek-V3.2 on XPU (any forced backend resolves to XPU_MLA_SPARSE) and XPU_MLA_SPARSE forced on a CUDA
    arch: vLLM's sparse MLA layer reads the check's selection from its top-k buffer (2048 wide, -1 past the
    selection), converts it to cache rows and decodes with its Triton kernel, level backend. A position
    mapped to the next row, a scale × 1.05, or an indexer that leaves out the newest token fails the cell;
    an FP8 cache, which vLLM accepts on XPU, raises in forward_mqa (a declared finding)."""
    rows = drive(".venv-vllm", "sparse-index-next-slot:v32-xpu-sparse", "sparse-index-previous-slot:v32-xpu-sparse-sm90",
                 "sparse-scale-x1.05:v32-xpu-sparse-sm90", "indexer-drops-newest:v32-xpu-sparse",
                 "none:v32-xpu-sparse-fp8", timeout=1500)
    # the fault-free cells of those two cases, as the committed report (which CI recomputes) has them
    _, clean = committed_slice("vllm-0.34.0", "--mla-select=model=deepseek-v3.2", "--mla-select=dcp=1",
                               "--mla-select=spec=none", "--mla-select=kv_dtype=auto", "--mla-select=page_size=64",
                               "--mla-select=backend=TRITON_MLA,XPU_MLA_SPARSE", "--mla-select=arch=xpu,sm90")
    kernels = ("vllm.v1.attention.backends.mla.sparse_utils:triton_convert_req_index_to_global_index",
               "vllm.v1.attention.ops.xpu_mla_sparse:triton_bf16_mla_sparse_interface")
    for cell in ("TRITON_MLA/dcp1/none/xpu", "XPU_MLA_SPARSE/dcp1/none/sm90"):
        kernel = clean[f"deepseek-v3.2/{cell}/kv-auto/page64"]["kernel"]
        assert kernel["status"] == "verified" and kernel["level"] == "backend" and not kernel.get("emulated"), kernel
        assert kernel["function"] == "vllm.v1.attention.backends.mla.xpu_mla_sparse:XPUMLASparseImpl.forward_mqa"
        assert all(k in kernel["functions"] for k in kernels), kernel
    for scenario in ("sparse-index-next-slot:v32-xpu-sparse", "sparse-index-previous-slot:v32-xpu-sparse-sm90",
                     "sparse-scale-x1.05:v32-xpu-sparse-sm90", "indexer-drops-newest:v32-xpu-sparse"):
        row = rows[scenario]
        assert row["status"] == "failed" and not row["finding"] and row["message"].startswith("out: "), row
    # the next row of a request's newest token lies past it (NaN); the previous row is a finite misread
    assert "NaN position(s) differ" in rows["sparse-index-next-slot:v32-xpu-sparse"]["message"]
    assert "beyond abs" in rows["sparse-index-previous-slot:v32-xpu-sparse-sm90"]["message"]
    assert "beyond abs" in rows["sparse-scale-x1.05:v32-xpu-sparse-sm90"]["message"]
    fp8 = rows["none:v32-xpu-sparse-fp8"]
    assert fp8["status"] == "failed" and fp8["finding"], fp8
    assert "FP8 kv is not supported with XPU MLA Sparse yet" in fp8["message"], fp8


def test_flashmla_sparse_runs_vllms_code_around_the_flashmla_sparse_emulation_and_faults_fail_it():
    """DeepSeek-V3.2 on FLASHMLA_SPARSE (SM90, SM100): vLLM's sparse MLA layer packs the query (concat_mla_q),
    converts the check's selection to cache rows (its index group's Triton conversion) and attends with FlashMLA's
    sparse kernels, emulated: the bf16 cache with the sparse prefill kernel (``flash_mla_sparse_fwd`` over a
    ``topk_length``), the FP8 cache (vLLM's 656-byte ``fp8_ds_mla`` records) with the sparse decode kernel. A scale
    x 1.05, a ``topk_length`` one short, a position mapped to the neighbouring row and an indexer that leaves out
    the newest token each fail the cell; under DCP 2, so do a merge reading the LSE in the other base and one
    ignoring it."""
    rows = drive(".venv-vllm", "none:v32-flashmla-sparse", "none:v32-flashmla-sparse-fp8",
                 "flashmla-sparse-scale-x1.05:v32-flashmla-sparse",
                 "flashmla-sparse-topk-length-short:v32-flashmla-sparse",
                 "sparse-index-previous-slot:v32-flashmla-sparse-sm100",
                 "sparse-index-previous-slot:v32-flashmla-sparse-fp8", "flashmla-scale-x1.05:v32-flashmla-sparse-fp8",
                 "indexer-drops-newest:v32-flashmla-sparse-fp8", "sparse-index-next-slot:v32-flashmla-sparse-fp8",
                 "none:v32-flashmla-sparse-dcp2", "merge-lse-base-swapped:v32-flashmla-sparse-dcp2",
                 "merge-ignores-lse:v32-flashmla-sparse-dcp2", timeout=900)
    expected = {"none:v32-flashmla-sparse": "torch.ops._flashmla_C:sparse_prefill_fwd",
                "none:v32-flashmla-sparse-fp8": "torch.ops._flashmla_C:sparse_decode_fwd"}
    for scenario, op in expected.items():
        row = rows[scenario]
        assert row["status"] == "verified" and row["level"] == "emulated", row
        assert row["emulated"] == [op, "vllm._custom_ops:concat_mla_q"], row
        assert row["function"] == "vllm.v1.attention.backends.mla.flashmla_sparse:FlashMLASparseImpl.forward_mqa", row
        assert "vllm.v1.attention.backends.mla.sparse_utils:triton_convert_req_index_to_global_index" in row["functions"]
    # DCP 2: each rank's selection filtered to its own tokens, its partial merged by vLLM's LSE combine; the
    # merge reading the LSE in the other base, or ignoring it, fails the cell
    row = rows["none:v32-flashmla-sparse-dcp2"]
    assert row["status"] == "verified" and row["level"] == "emulated", row
    assert "vllm.v1.attention.backends.mla.sparse_utils:triton_filter_and_convert_dcp_index" in row["functions"], row
    # the row after a request's newest token: a free slot (NaN) or, for the cache's last row, none (the emulated
    # decode refuses to follow it; a GPU reads foreign memory). Which one depends on where the pages landed:
    # the graph-padded run makes block 0 the null block and moves its page.
    row = rows.pop("sparse-index-next-slot:v32-flashmla-sparse-fp8")
    assert row["status"] == "failed", row
    assert "raised OutOfRangeRead: indices: index" in row["message"] or "NaN position(s) differ" in row["message"], row
    for scenario in rows:
        if not scenario.startswith("none:"):
            row = rows[scenario]
            assert row["status"] == "failed" and not row["finding"] and row["message"].startswith("out: "), row
