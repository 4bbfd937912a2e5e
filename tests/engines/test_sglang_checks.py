"""SGLang's own attention backend in kernel checks: verified cells, findings, and faults injected into SGLang.

The checks that drive SGLang run inside each SGLang venv (0.5.20 to 0.5.23;
skipped when one is absent) through ``tests/engines/sglang_faults.py``, which
replaces one of the installed SGLang's functions at run time (never the
venv's files): a fault in SGLang's decode kernel, its verify kernel or its
DCP merge must turn the cells it touches from verified into failed, and
leave the others verified. What 0.5.23 does in a slice of its matrix (a baseline
slice, a platform's cells) is read in its committed report (``committed_slice``),
which CI recomputes and holds to the committed one; one live slice is held to it.
"""

from __future__ import annotations


import pytest

from pytest_mla.core.matrix import load_matrix
from pytest_mla.engines.sglang.checks import kernel_for
from pytest_mla.report.results import read_results

from ._venv import ROOT, committed_slice, drive_faults, run_matrix, venv_python

MATRIX = ROOT / "matrix" / "sglang.toml"
DRIVER = ROOT / "tests" / "engines" / "sglang_faults.py"
VENVS = [".venv-sglang", ".venv-sglang-0.5.22", ".venv-sglang-0.5.21", ".venv-sglang-0.5.20"]
#: .venv-sglang's release, whose committed report the slice tests read (``committed_slice``: CI recomputes
#: it and fails on any difference) instead of running the slice again.
REPORT = "sglang-0.5.23"


def drive(venv: str, *scenarios: str, dcp_mode: str = "in-process", timeout: float = 900) -> dict[str, dict]:
    return drive_faults(DRIVER, venv, *scenarios, dcp_mode=dcp_mode, timeout=timeout)


# ---- inside the SGLang venvs ---------------------------------------------------------------------


@pytest.mark.parametrize("venv", VENVS)
def test_sglang_backend_verifies_and_injected_faults_fail(venv):
    rows = drive(
        venv,
        "none:v2lite-decode", "none:v2lite-tree", "none:llama-decode-dcp4", "none:v2lite-decode-dcp4",
        "decode-drops-first-token:v2lite-decode", "decode-drops-first-token:llama-decode-dcp4",
        "extend-drops-last-prefix-token:v2lite-tree", "extend-drops-last-prefix-token:v2lite-decode",
        "merge-ignores-lse:llama-decode-dcp4", "merge-ignores-lse:v2lite-decode",
    )
    status = {k: v["status"] for k, v in rows.items()}
    # SGLang's own backend computes within tolerance (bf16, Triton interpreter with the dot fix)
    assert status["none:v2lite-decode"] == "verified", rows["none:v2lite-decode"]
    assert status["none:v2lite-tree"] == "verified", rows["none:v2lite-tree"]
    assert status["none:llama-decode-dcp4"] == "verified", rows["none:llama-decode-dcp4"]
    assert "sglang.srt.layers.dcp.comm:cp_lse_ag_out_rs_mha" in rows["none:llama-decode-dcp4"]["functions"]
    assert any("forward_absorb_core" in f for f in rows["none:v2lite-decode"]["functions"])
    # an accepted configuration whose backend raises is a finding, with SGLang's function named
    finding = rows["none:v2lite-decode-dcp4"]
    assert finding["status"] == "failed" and finding["finding"], finding
    assert finding["message"].startswith("engine accepted this configuration, but its backend raised AssertionError")
    assert finding["function"] == "sglang.srt.mem_cache.memory_pool:MLATokenToKVPool.set_kv_buffer", finding
    # each fault fails the cells whose path it is on, and only those
    for scenario in ("decode-drops-first-token:v2lite-decode", "decode-drops-first-token:llama-decode-dcp4",
                     "extend-drops-last-prefix-token:v2lite-tree", "merge-ignores-lse:llama-decode-dcp4"):
        assert status[scenario] == "failed" and not rows[scenario]["finding"], rows[scenario]
        assert rows[scenario]["message"].startswith("out: "), rows[scenario]
    assert status["extend-drops-last-prefix-token:v2lite-decode"] == "verified"
    assert status["merge-ignores-lse:v2lite-decode"] == "verified"


def test_faults_in_scale_and_length_fail_cells_that_used_to_verify():
    """The faults the old, nearly flat inputs let through (issue 20): a scale error of 25% or 5% in
    SGLang's decode or verify kernel, one token short, a base-2 LSE merged as natural log."""
    rows = drive(
        ".venv-sglang",
        "decode-scale-x1.25:v2lite-decode", "decode-scale-x1.05:v2lite-decode", "decode-scale-x1.05:v3-decode",
        "decode-scale-x1.05:llama-decode", "decode-scale-x1.05:llama-decode-dcp4",
        "extend-scale-x1.05:v2lite-chain", "extend-scale-x1.05:v3-chain-fp8", "decode-drops-last-token:v3-decode",
        "merge-lse-base2:llama-decode-dcp4", "decode-scale-x1.05:v2lite-tree",
    )
    for scenario, row in rows.items():
        if scenario == "decode-scale-x1.05:v2lite-tree":  # verify runs the extend kernel: untouched
            assert row["status"] == "verified", row
            continue
        assert row["status"] == "failed" and not row["finding"], row
        assert row["message"].startswith("out: "), row


def test_merge_fault_reaches_distributed_ranks():
    """With --mla-dcp-mode=distributed each rank is its own process running SGLang's own gloo group."""
    rows = drive(".venv-sglang", "none:llama-decode-dcp4", "merge-ignores-lse:llama-decode-dcp4",
                 dcp_mode="distributed")
    assert rows["none:llama-decode-dcp4"]["status"] == "verified", rows
    assert rows["merge-ignores-lse:llama-decode-dcp4"]["status"] == "failed", rows


def test_fi_a2a_exchange_runs_across_ranks_and_faults_in_sglangs_merge_fail_the_cell():
    """On sm100 SGLang exchanges DCP partials through FlashInfer's all-to-all (``--dcp-comm-backend
    fi_a2a``): emulated, the exchange is real across the rank threads and SGLang's own reduce merges
    what arrives, so a wrong LSE base or a lost rank in that reduce fails the cell."""
    rows = drive(".venv-sglang", "none:v2lite-flashinfer-dcp4-sm100", "none:v3-flashinfer-dcp4-sm100",
                 "fi-a2a-lse-base-swapped:v2lite-flashinfer-dcp4-sm100",
                 "fi-a2a-drops-last-rank:v2lite-flashinfer-dcp4-sm100",
                 "fi-a2a-lse-base-swapped:v3-flashinfer-dcp4-sm100",
                 "merge-ignores-lse:v2lite-flashinfer-dcp4-sm100")
    for case in ("v2lite", "v3"):
        ok = rows[f"none:{case}-flashinfer-dcp4-sm100"]
        assert ok["status"] == "verified" and ok["level"] == "emulated", ok
        for name in ("allocate_mnnvl_workspace", "init_workspace", "alltoall"):
            assert f"flashinfer.comm.dcp_alltoall:decode_cp_a2a_{name}" in ok["emulated"], ok
        assert any("fi_a2a" in note for note in ok["notes"]), ok
    for scenario in ("fi-a2a-lse-base-swapped:v2lite-flashinfer-dcp4-sm100",
                     "fi-a2a-drops-last-rank:v2lite-flashinfer-dcp4-sm100",
                     "fi-a2a-lse-base-swapped:v3-flashinfer-dcp4-sm100"):
        assert rows[scenario]["status"] == "failed" and not rows[scenario]["finding"], rows[scenario]
        assert rows[scenario]["message"].startswith("out: "), rows[scenario]
    # a fault in the all-gather merge (ag_rs) is off this path
    assert rows["merge-ignores-lse:v2lite-flashinfer-dcp4-sm100"]["status"] == "verified"


def test_matrix_kernel_checks_against_the_real_engine():
    """Triton cells verified or xfail with the finding; fa3 and flashmla at level emulated."""
    _, cells = committed_slice(REPORT, "--mla-select=model=deepseek-v2-lite",
                               "--mla-select=backend=triton,fa3,flashmla", "--mla-select=arch=sm90",
                               "--mla-select=kv_dtype=auto,fp8_e5m2", "--mla-select=spec=none,eagle-4x3")
    for kv in ("auto", "fp8_e5m2"):
        for spec in ("none", "eagle-4x3"):
            ok = cells[f"deepseek-v2-lite/triton/dcp1/{spec}/sm90/kv-{kv}"]
            assert ok["verdict"] == "pass" and ok["kernel"]["status"] == "verified", ok
            assert ok["kernel"]["level"] == "backend"
            assert ok["kernel"]["function"].startswith("sglang.srt.layers.attention.triton_backend:TritonAttnBackend")
            bug = cells[f"deepseek-v2-lite/triton/dcp4/{spec}/sm90/kv-{kv}"]
            assert bug["verdict"] == "xfail" and bug["kernel"]["status"] == "failed", bug
            assert bug["kernel"]["finding"] and "backend raised" in bug["kernel"]["message"], bug
    fallback = cells["deepseek-v2-lite/fa3/dcp1/none/sm90/kv-fp8_e5m2"]  # SGLang resolves fa3 + fp8_e5m2 to triton
    triton = cells["deepseek-v2-lite/triton/dcp1/none/sm90/kv-fp8_e5m2"]
    assert fallback["kernel"]["status"] == "verified" and fallback["kernel"]["case"] == triton["kernel"]["case"]
    assert fallback["kernel"]["function"] == triton["kernel"]["function"], fallback  # one check, run once
    for backend in ("fa3", "flashmla"):  # SGLang's CUDA backends around emulated kernels
        gpu = cells[f"deepseek-v2-lite/{backend}/dcp1/none/sm90/kv-auto"]
        assert gpu["kernel"]["status"] == "verified" and gpu["kernel"]["level"] == "emulated", gpu
        assert gpu["kernel"]["emulated"] and gpu["kernel"]["function"].startswith("sglang.srt.layers.attention."), gpu
        assert any("kernels emulated in float64" in n for n in gpu["kernel"]["notes"]), gpu


#: A baseline slice of matrix/sglang.toml on SGLang's CUDA MLA backends (sm90: flashinfer, fa3, flashmla).
BASELINE = ("--mla-select=model=deepseek-v2-lite,deepseek-v3", "--mla-select=backend=flashinfer,fa3,flashmla",
            "--mla-select=arch=sm90", "--mla-select=spec=none,eagle-1x3", "--mla-select=kv_dtype=auto,fp8_e4m3")


def test_baseline_slice_every_accepted_cell_is_verified_emulated_or_a_declared_finding():
    cells = list(committed_slice(REPORT, *BASELINE)[1].values())
    accepted = [c for c in cells if c["outcome"]["kind"] == "accepted"]
    assert {c["coords"]["backend"] for c in accepted} == {"flashinfer", "fa3", "flashmla"}
    verified = 0
    for c in accepted:
        kernel = c["kernel"]
        if kernel["status"] == "verified":
            verified += 1
            assert kernel["level"] == "emulated" and kernel["emulated"], c["id"]
        else:  # a finding the matrix declares (xfail), its note naming the level
            assert c["verdict"] == "xfail" and kernel["status"] == "failed", (c["id"], kernel)
            assert "level emulated" in c["expectation"]["xfail"], c["id"]
    assert verified >= len(accepted) // 2, (verified, len(accepted))
    # FP8 caches with k_scale != 1 ran in a write convention the record names
    fp8 = [c for c in accepted if c["coords"]["kv_dtype"] == "fp8_e4m3" and c["coords"]["model"] == "deepseek-v3"
           and c["kernel"]["status"] == "verified"]
    assert fp8 and all(c["kernel"].get("kv_convention") in ("scaled", "raw") for c in fp8), fp8


@pytest.mark.parametrize("release", ["sglang-0.5.23", "sglang-0.5.22"])
def test_trtllm_mha_slice_is_verified_emulated_a_declared_finding_or_not_run_naming_the_flag(release):
    """Llama on trtllm_mha, both archs, DCP 1 and 4, decode and chain verify, a bf16 and an e5m2 cache."""
    _, selected = committed_slice(release, "--mla-select=model=llama-3.1-8b", "--mla-select=backend=trtllm_mha",
                                  "--mla-select=kv_dtype=auto,fp8_e5m2", "--mla-select=spec=none,eagle-1x3",
                                  "--mla-select=dcp=1,4")
    cells = [c for c in selected.values()
             if (c.get("outcome") or {}).get("kind") == "accepted"]  # out-of-scope cells: no outcome
    assert len(cells) == 16, [c["id"] for c in cells]
    for c in cells:
        kernel, coords = c["kernel"], c["coords"]
        if coords["dcp"] > 1:  # no DCP handling in TRTLLMHAAttnBackend: the declared finding
            assert c["verdict"] == "xfail" and kernel["status"] == "failed" and kernel["finding"], (c["id"], kernel)
            assert "level emulated" in c["expectation"]["xfail"], c["id"]
        elif coords["kv_dtype"] == "fp8_e5m2":  # outside FlashInfer's contract: not run, the flag named
            assert kernel["status"] == "not-run" and "kv_cache: torch.float8_e5m2" in kernel["reason"], kernel
        else:
            assert kernel["status"] == "verified" and kernel["level"] == "emulated", (c["id"], kernel)
            assert kernel["emulated"][0] == "flashinfer.decode:trtllm_batch_decode_with_kv_cache", kernel


def test_a_scale_fault_in_sglangs_fa4_decode_fails_its_cell():
    """fa4's MLA decode on sm100 runs SGLang's FlashAttentionBackend and its FA4 wrapper around the emulated
    vendored CuTe interface: the layer's scale ×1.05 handed to it fails the cell, which verifies without it."""
    rows = drive(".venv-sglang", "none:v2lite-decode-fa4-sm100", "fa4-scale-x1.05:v2lite-decode-fa4-sm100")
    ok = rows["none:v2lite-decode-fa4-sm100"]
    assert ok["status"] == "verified" and ok["level"] == "emulated", ok
    assert ok["emulated"] == ["sglang.kernels.ops.attention.flash_attn.cute:flash_attn_varlen_func"], ok
    fault = rows["fa4-scale-x1.05:v2lite-decode-fa4-sm100"]
    assert fault["status"] == "failed" and not fault["finding"] and fault["message"].startswith("out: "), fault


@pytest.mark.parametrize("venv", [".venv-sglang", ".venv-sglang-0.5.22"])  # sgl-flash-mla; sglang-kernel's flash_mla
def test_faults_in_sglangs_code_around_an_emulated_kernel_fail_its_cells(venv):
    """The emulated level checks SGLang's own code: a wrong scale handed to FlashMLA fails the cell,
    and the same check passes again once the fault is gone (one process, the emulations reinstalled)."""
    rows = drive(venv, "none:v2lite-decode-flashmla", "flashmla-scale-x1.05:v2lite-decode-flashmla",
                 "none:v2lite-decode-flashmla")
    assert rows["none:v2lite-decode-flashmla"]["status"] == "verified", rows
    fault = rows["flashmla-scale-x1.05:v2lite-decode-flashmla"]
    assert fault["status"] == "failed" and not fault["finding"] and fault["message"].startswith("out: "), fault


# ---- pure: what a cell runs -----------------------------------------------------------------------


def _cell(**coords):
    matrix = load_matrix(MATRIX)
    full = {"model": "deepseek-v3", "backend": "triton", "dcp": 1, "spec": "none", "arch": "sm90", "kv_dtype": "auto"}
    full.update(coords)
    return next(c for c in matrix.cells() if c.coords == full), matrix.models[full["model"]]


def _spec(cell, model, **kw):
    args = dict(decode_backend="triton", page_size=1, kv_cache_dtype=cell.coords["kv_dtype"], tp=max(cell.dcp, 1),
                num_heads=model.num_heads // max(cell.dcp, 1), num_kv_heads=1, host_arch=None)
    args.update(kw)
    return kernel_for(cell, model, **args)


def test_triton_cells_of_every_arch_and_the_fa3_fallback_share_one_check():
    specs = {_spec(*_cell(arch=arch, kv_dtype="fp8_e5m2"))[0] for arch in ("sm80", "sm90", "sm100")}
    fa3, _ = _spec(*_cell(backend="fa3", kv_dtype="fp8_e5m2"))
    assert len(specs) == 1 and fa3 in specs
    spec = specs.pop()
    assert spec.protocol == "engine" and spec.level == "backend" and spec.package == "sglang"
    assert spec.fp8_dots and not spec.returns_lse


def test_dcp_case_holds_the_heads_of_the_whole_group():
    cell, model = _cell(dcp=4, spec="eagle-1x3")
    spec, _ = _spec(cell, model)
    case = dict(spec.case)
    assert case["h_q"] == model.num_heads  # heads / tp per rank, all-gathered over the 4 DCP ranks
    assert case["min_seqlen"] == 1 and case["page_size"] == 1
    assert spec.function.endswith("TritonAttnBackend.forward_extend")


def test_deepseek_v32_on_a_dense_backend_checks_with_the_dsa_pool_and_qsa_stays_not_run():
    """A DSA checkpoint's dense cells carry the model's top-k (the check builds SGLang's DSA pool and runs its
    indexer's gate); a native CUDA check keeps the cell's arch (SGLang resolves a DSA checkpoint per arch);
    qsa, whose backend answers the indexer with metadata of its own, is not modelled."""
    cell, model = _cell(model="deepseek-v3.2", backend="flex_attention", arch="sm90")
    spec, reason = _spec(cell, model, decode_backend="flex_attention", page_size=64)
    assert spec is not None and spec.level == "backend", reason
    options = dict(spec.options)
    assert options["dsa"] == (2048,) and options["arch"] == "sm90"
    dense, _ = _spec(*_cell(model="deepseek-v3", backend="flex_attention", arch="sm90"), decode_backend="flex_attention")
    assert dict(dense.options)["dsa"] is None and dict(dense.options)["arch"] is None
    qsa, why = _spec(*_cell(model="deepseek-v3.2", backend="qsa", arch="sm90"), decode_backend="qsa", page_size=64)
    assert qsa is None and "indexer metadata of its own" in why, why


def test_qsa_on_a_model_without_a_qsa_indexer_raises_in_its_forward_metadata_a_finding_at_level_emulated():
    """SGLang builds the plain KV pool for a model without a QSA indexer; QwenSparseAttnBackend's forward
    metadata reads the QSA pool's compress ratio: AttributeError, before any kernel (a finding)."""
    row = drive(".venv-sglang", "none:v3-decode-qsa")["none:v3-decode-qsa"]
    assert row["status"] == "failed" and row["finding"] and row["level"] == "emulated", row
    assert "no attribute 'qsa_compress_ratio'" in row["message"], row


def test_a_missing_kernel_library_import_in_an_emulated_run_is_named_never_a_finding():
    """An ImportError whose cause is a kernel library this host lacks (QSA's varlen fallback wraps it) is the
    check's limit (not-run naming the library), whatever SGLang's own wrapper says."""
    from pytest_mla.engines.sglang.support import missing_kernel_library

    try:
        try:
            raise ModuleNotFoundError("No module named 'flash_attn'", name="flash_attn.cute")
        except ImportError as cause:
            raise ImportError("QSA decode requires flash_attn (FA2), flash-attn-4 (FA4 cute)") from cause
    except ImportError as exc:
        assert missing_kernel_library(exc) == "flash_attn.cute"
    assert missing_kernel_library(ModuleNotFoundError("No module named 'yaml'", name="yaml")) is None
    assert missing_kernel_library(ImportError("cannot import name 'x' from 'sglang.srt'")) is None


@pytest.mark.parametrize("backend", ["fa3", "flashinfer", "flashmla", "trtllm_mla"])
def test_cuda_backends_run_at_level_emulated_off_their_gpu(backend):
    cell, model = _cell(backend=backend, arch="sm100" if backend == "trtllm_mla" else "sm90")
    for host in (None, "sm80"):  # no GPU, or a GPU of another arch
        spec, reason = _spec(cell, model, decode_backend=backend, host_arch=host)
        assert spec is not None and spec.level == "emulated", reason
        assert dict(spec.options)["arch"] == cell.arch and dict(spec.options)["emulate"]


def test_trtllm_mha_runs_at_level_emulated_on_its_cells_arch():
    """trtllm_mha's kernel is FlashInfer's trtllm_batch_decode_with_kv_cache: XQA on sm90, trtllm-gen on
    sm100 (chosen by the arch the backend's code is shown), so each arch keeps its own check."""
    specs = {}
    for arch in ("sm90", "sm100"):
        cell, model = _cell(model="llama-3.1-8b", backend="trtllm_mha", arch=arch, spec="eagle-1x3")
        spec, reason = _spec(cell, model, decode_backend="trtllm_mha", page_size=64, num_kv_heads=8)
        assert spec is not None and spec.level == "emulated", reason
        assert dict(spec.options)["arch"] == arch and spec.function.endswith("TRTLLMHAAttnBackend.forward_extend")
        specs[arch] = spec
    assert specs["sm90"] != specs["sm100"]


@pytest.mark.parametrize("venv", [".venv-sglang", ".venv-sglang-0.5.22"])
def test_faults_in_sglangs_trtllm_mha_code_fail_its_cells(venv):
    """Around the emulated FlashInfer decode: a bmm1_scale 5% off fails decode and verify on both archs;
    a verify mask with every bit set fails sm90 (XQA reads SGLang's mask) and not sm100 (trtllm-gen
    takes none), and the same checks verify without the faults."""
    rows = drive(venv, "none:llama-decode-trtllm-mha-sm90", "none:llama-chain-trtllm-mha-sm90",
                 "none:llama-chain-trtllm-mha-sm100", "none:llama-chain-fp8-trtllm-mha-sm100",
                 "trtllm-mha-bmm1-x1.05:llama-decode-trtllm-mha-sm90",
                 "trtllm-mha-bmm1-x1.05:llama-chain-trtllm-mha-sm100",
                 "trtllm-mha-xqa-mask-full:llama-chain-trtllm-mha-sm90",
                 "trtllm-mha-xqa-mask-full:llama-chain-trtllm-mha-sm100")
    for case in ("llama-decode-trtllm-mha-sm90", "llama-chain-trtllm-mha-sm90", "llama-chain-trtllm-mha-sm100",
                 "llama-chain-fp8-trtllm-mha-sm100"):
        ok = rows[f"none:{case}"]
        assert ok["status"] == "verified" and ok["level"] == "emulated", ok
        assert "flashinfer.decode:trtllm_batch_decode_with_kv_cache" in ok["emulated"], ok
    fused = rows["none:llama-chain-fp8-trtllm-mha-sm100"]["emulated"]
    assert "sglang.kernels.ops.kvcache.fused_fp8_qkv_kv_cache:_jit_fused_fp8_qkv_kv_cache_module" in fused
    for scenario in ("trtllm-mha-bmm1-x1.05:llama-decode-trtllm-mha-sm90",
                     "trtllm-mha-bmm1-x1.05:llama-chain-trtllm-mha-sm100",
                     "trtllm-mha-xqa-mask-full:llama-chain-trtllm-mha-sm90"):
        fault = rows[scenario]
        assert fault["status"] == "failed" and not fault["finding"] and fault["message"].startswith("out: "), fault
    assert rows["trtllm-mha-xqa-mask-full:llama-chain-trtllm-mha-sm100"]["status"] == "verified"


def test_eagle_trees_expand_at_most_topk_nodes_per_depth():
    import torch

    from pytest_mla.kernels.inputs import gen_generator, gen_tree_mask

    for topk, steps in ((2, 3), (4, 3), (3, 4)):
        masks = gen_tree_mask(topk, steps, gen_generator(topk * 7 + steps), batch=64)
        for mask in masks:
            depth = mask.sum(-1) - 1
            parent = [max((a for a in range(u) if mask[u, a]), key=lambda a: int(depth[a]), default=-1)
                      for u in range(mask.shape[0])]
            for d in range(steps):
                expanding = {p for u, p in enumerate(parent) if p >= 0 and int(depth[p]) == d}
                assert len(expanding) <= topk
            assert int(depth.max()) <= steps and torch.equal(mask.diagonal(), torch.ones(mask.shape[0], dtype=torch.bool))


def test_min_seqlen_override_keeps_requests_non_empty():
    from pytest_mla.kernels import harness

    cell, model = _cell()
    plain = harness.case_for(cell.coords, model, seed=0)
    engine = harness.case_for(cell.coords, model, seed=0, overrides={"min_seqlen": 1})
    assert 0 in plain.seqlens and min(engine.seqlens) == 1
    assert len(engine.seqlens) == len(plain.seqlens) and engine.seed != plain.seed


# ---- other platforms: the check runs in the child process of the cell's platform -----------------

#: Each release's venv and its committed report.
RELEASE_REPORTS = {".venv-sglang": "sglang-0.5.23", ".venv-sglang-0.5.22": "sglang-0.5.22"}
PLATFORM_RELEASES = [pytest.param(venv, id=report) for venv, report in RELEASE_REPORTS.items()]


@pytest.mark.parametrize("venv", PLATFORM_RELEASES)
def test_faults_in_sglangs_code_fail_rocm_triton_and_cpu_torch_native_cells_in_their_platform_process(venv):
    """A scale x1.05 planted in SGLang's Triton decode (``decode_attention_fwd``) fails a gfx942 cell, one in
    TorchNativeAttnBackend's SDPA call fails a CPU cell: each check ran in its platform's child process (the
    fault put in there); the same children verify the cells without it."""
    rows = drive(venv, "decode-scale-x1.05:v3-decode-gfx942", "none:v3-decode-gfx942",
                 "torch-native-scale-x1.05:llama-decode-torch-native-cpu", "none:llama-decode-torch-native-cpu",
                 "decode-scale-x1.05:v3-decode-xpu")
    for scenario in ("decode-scale-x1.05:v3-decode-gfx942", "torch-native-scale-x1.05:llama-decode-torch-native-cpu",
                     "decode-scale-x1.05:v3-decode-xpu"):
        row = rows[scenario]
        assert row["status"] == "failed" and not row["finding"] and row["message"].startswith("out: "), row
    rocm, cpu = rows["none:v3-decode-gfx942"], rows["none:llama-decode-torch-native-cpu"]
    assert rocm["status"] == "verified" and rocm["level"] == "backend", rocm
    assert "ran in a process that imported SGLang on its ROCm platform, answering for gfx942" in rocm["notes"]
    assert rocm["function"] == "sglang.srt.layers.attention.triton_backend:TritonAttnBackend.forward_decode"
    assert cpu["status"] == "verified" and cpu["level"] == "backend", cpu
    assert "ran in a process that imported SGLang on its CPU platform, answering for cpu" in cpu["notes"]
    assert cpu["function"] == "sglang.srt.layers.attention.torch_native_backend:TorchNativeAttnBackend.forward_decode"


def test_intel_amx_runs_sglangs_backend_around_emulated_sgl_kernel_cpu_attention_ops():
    """On cpu_amx SGLang's IntelAMXAttnBackend decodes with sgl-kernel's ``decode_attention_cpu`` (which also
    writes the new token's K/V): its code runs in the CPU child around the op's float64 emulation, at level
    emulated naming the op; a scale x1.05 planted in its ``forward_decode`` fails the cell."""
    rows = drive(".venv-sglang", "none:v3-decode-intel-amx", "none:llama-decode-intel-amx",
                 "intel-amx-scale-x1.05:v3-decode-intel-amx")
    for scenario in ("none:v3-decode-intel-amx", "none:llama-decode-intel-amx"):
        row = rows[scenario]
        assert row["status"] == "verified" and row["level"] == "emulated", row
        assert "torch.ops.sgl_kernel:decode_attention_cpu" in row["emulated"], row
        assert row["function"] == "sglang.srt.layers.attention.intel_amx_backend:IntelAMXAttnBackend.forward_decode"
        assert "ran in a process that imported SGLang on its CPU platform, answering for cpu_amx" in row["notes"]
    fault = rows["intel-amx-scale-x1.05:v3-decode-intel-amx"]
    assert fault["status"] == "failed" and not fault["finding"] and fault["message"].startswith("out: "), fault


@pytest.mark.parametrize("venv", PLATFORM_RELEASES)
def test_rocm_fp8_cells_use_the_archs_own_fp8_type_and_a_loader_that_forgets_fnuz_fails(venv):
    """SGLang on ROCm stores an fp8 cache in the platform's fp8 type: e4m3fnuz on gfx942 (with a checkpoint's
    KV scales doubled when they load), e4m3fn on gfx950, decided per cell in one ROCm child. Both verify (the
    release's committed report, which CI holds to a fresh run); a KV-scale loader that forgets the doubling
    (kv_cache.py's is_fp8_fnuz answering False) fails gfx942 (live)."""
    rows = drive(venv, "kv-scale-not-doubled-on-fnuz:v3-decode-fp8-gfx942")
    _, cells = committed_slice(RELEASE_REPORTS[venv], "--mla-select=model=deepseek-v3", "--mla-select=backend=triton",
                               "--mla-select=dcp=1", "--mla-select=spec=none", "--mla-select=kv_dtype=fp8_e4m3",
                               "--mla-select=arch=gfx942,gfx950")
    gfx942, gfx950 = (cells[f"deepseek-v3/triton/dcp1/none/{arch}/kv-fp8_e4m3"]["kernel"] for arch in ("gfx942", "gfx950"))
    assert gfx942["status"] == "verified" and gfx942["level"] == "backend", gfx942
    assert any(n.startswith("KV cache stored as float8_e4m3fnuz (SGLang's fp8 type on gfx942): the check's e4m3fn "
                            "tokens halved into it") for n in gfx942["notes"]), gfx942["notes"]
    assert gfx950["status"] == "verified", gfx950
    assert not any(n.startswith("KV cache stored as") for n in gfx950["notes"]), gfx950["notes"]  # e4m3fn there
    fault = rows["kv-scale-not-doubled-on-fnuz:v3-decode-fp8-gfx942"]
    assert fault["status"] == "failed" and not fault["finding"] and fault["message"].startswith("out: "), fault


@pytest.mark.parametrize("release", ["sglang-0.5.23", "sglang-0.5.22"])
def test_gfx950_chain_verify_takes_sglangs_split_kv_kernel_which_gives_nan_without_a_prefix(release):
    """On gfx950 a topk-1 verify of a GQA model takes ``verify_splitkv_fwd`` (``use_verify_splitkv``:
    ``is_gfx95_supported()``); its combine gives NaN for a request with no cached prefix (every split's LSE is
    -inf): the matrix's declared finding. gfx942 runs ``extend_attention_fwd`` on the same case and verifies.
    Read in the committed reports (``committed_slice``)."""
    _, cells = committed_slice(release, "--mla-select=model=llama-3.1-8b", "--mla-select=backend=triton",
                               "--mla-select=dcp=1", "--mla-select=spec=eagle-1x3",
                               "--mla-select=arch=gfx942,gfx950", "--mla-select=kv_dtype=auto")
    gfx950 = cells["llama-3.1-8b/triton/dcp1/eagle-1x3/gfx950/kv-auto"]
    gfx942 = cells["llama-3.1-8b/triton/dcp1/eagle-1x3/gfx942/kv-auto"]
    assert gfx950["verdict"] == "xfail" and gfx950["kernel"]["status"] == "failed", gfx950["kernel"]
    assert "NaN position(s) differ" in gfx950["kernel"]["message"], gfx950["kernel"]
    assert "verify_splitkv_fwd" in gfx950["expectation"]["xfail"], gfx950["expectation"]
    assert gfx942["kernel"]["status"] == "verified" and gfx942["kernel"]["case"] == gfx950["kernel"]["case"]


def test_flex_attention_runs_sglangs_backend_with_torch_compiled_flex_attention_on_this_cpu():
    """SGLang's TorchFlexAttnBackend on a CUDA cell: its own code, torch.compile(flex_attention) compiled by
    Inductor for this CPU (level backend, the note says so); a scale x1.05 in its flex call fails the cell."""
    rows = drive(".venv-sglang", "none:llama-decode-flex", "flex-scale-x1.05:llama-decode-flex",
                 "none:llama-decode-fp8-flex")
    ok = rows["none:llama-decode-flex"]
    assert ok["status"] == "verified" and ok["level"] == "backend", ok
    assert ok["function"] == "sglang.srt.layers.attention.torch_flex_backend:TorchFlexAttnBackend.forward_decode"
    assert any(n.startswith("torch.compile(flex_attention)") for n in ok["notes"]), ok["notes"]
    fault = rows["flex-scale-x1.05:llama-decode-flex"]
    assert fault["status"] == "failed" and not fault["finding"] and fault["message"].startswith("out: "), fault
    fp8 = rows["none:llama-decode-fp8-flex"]  # the fp8 rows reach flex_attention as stored: this CPU refuses them
    assert fp8["status"] == "not-run" and "refuses mixed dtypes" in fp8["reason"], fp8


def test_a_live_slice_under_xdist_checks_each_platforms_cells_in_its_child_as_the_committed_report_says(tmp_path):
    """The slice tests above read the committed report; this one runs a slice as a user does, under -n 2, its
    cells spread over a ROCm and an XPU child per worker, and finds the records CI's full run committed (the
    numbers' last bits aside: float64 sums may round differently on another CPU)."""
    select = ("--mla-select=model=deepseek-v3", "--mla-select=backend=triton", "--mla-select=dcp=1",
              "--mla-select=spec=none", "--mla-select=arch=gfx942,xpu", "--mla-select=kv_dtype=auto")
    result = run_matrix(venv_python(".venv-sglang"), MATRIX, tmp_path, "--mla-kernel=auto", *select, "-n", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    live = {c["id"]: c for c in read_results(next(tmp_path.glob("sglang-*[0-9].json")))["cells"]}
    _, committed = committed_slice(REPORT, *select)
    assert sorted(live) == sorted(committed) and len(live) == 2, sorted(live)
    same = ("status", "level", "where", "function", "functions", "emulated", "seed", "case", "notes")
    for cell_id, cell in live.items():
        kernel = cell["kernel"]
        assert kernel["status"] == "verified" and kernel["level"] == "backend", (cell_id, kernel)
        assert {k: kernel.get(k) for k in same} == {k: committed[cell_id]["kernel"].get(k) for k in same}, cell_id
        assert (cell["verdict"], cell["outcome"]) == (committed[cell_id]["verdict"], committed[cell_id]["outcome"])


def test_rocm_cpu_and_xpu_cells_run_triton_and_torch_native_in_their_platform_process():
    """Every accepted triton / torch_native cell of gfx942, gfx950, cpu, cpu_amx and xpu is verified in its
    platform's process: at level backend, or at level emulated where the path calls a compiled op of the
    platform's sgl_kernel build (a GQA pool's write: ``store_cache_cpu`` on cpu_amx, ``store_cache_xpu`` on
    XPU); not-run naming what its emulation does not model (XPU's fp8 rows as bytes). ROCm's fp8 cells verify
    in the arch's own fp8 type."""
    _, cells = committed_slice(REPORT, "--mla-select=model=deepseek-v3,llama-3.1-8b",
                               "--mla-select=backend=triton,torch_native", "--mla-select=dcp=1",
                               "--mla-select=spec=none", "--mla-select=arch=gfx942,gfx950,cpu,cpu_amx,xpu",
                               "--mla-select=kv_dtype=auto,fp8_e4m3")
    labels = {"gfx942": "ROCm", "gfx950": "ROCm", "cpu": "CPU", "cpu_amx": "CPU", "xpu": "XPU"}
    not_run = {}
    for cell_id, cell in cells.items():
        kernel = cell["kernel"]
        if kernel is None or cell["outcome"]["kind"] != "accepted":
            continue
        if kernel["status"] == "not-run":
            not_run[cell_id] = kernel["reason"]
            continue
        arch = cell_id.split("/")[4]
        if arch in ("cpu_amx", "xpu") and cell_id.startswith("llama-3.1-8b/"):
            op = {"cpu_amx": "torch.ops.sgl_kernel:store_cache_cpu", "xpu": "sgl_kernel:store_cache_xpu"}[arch]
            assert kernel["status"] == "verified" and kernel["level"] == "emulated", (cell_id, kernel)
            assert kernel["emulated"] == [op], (cell_id, kernel)
        else:
            assert kernel["status"] == "verified" and kernel["level"] == "backend", (cell_id, kernel)
        assert (f"ran in a process that imported SGLang on its {labels[arch]} platform, answering for {arch}"
                in kernel["notes"]), (cell_id, kernel["notes"])
    for backend in ("triton", "torch_native"):  # MLA (a checkpoint's KV scales) and GQA on both ROCm targets
        for model in ("deepseek-v3", "llama-3.1-8b"):
            assert cells[f"{model}/{backend}/dcp1/none/gfx942/kv-fp8_e4m3"]["kernel"]["status"] == "verified"
            assert cells[f"{model}/{backend}/dcp1/none/gfx950/kv-fp8_e4m3"]["kernel"]["status"] == "verified"
    for backend in ("triton", "torch_native"):  # an fp8 cache hands store_cache_xpu uint8 rows: not modelled
        reason = not_run.pop(f"llama-3.1-8b/{backend}/dcp1/none/xpu/kv-fp8_e4m3")
        assert "outside its emulation's contract: dtype: uint8 rows" in reason, reason
    assert not not_run, not_run
    verified = [i for i, c in cells.items() if (c["kernel"] or {}).get("status") == "verified"]
    assert {i.split("/")[4] for i in verified} == set(labels), verified


def test_intel_xpu_runs_sglangs_xpu_backend_on_llama_around_emulated_sgl_kernel_xpu_flash_attn():
    """Llama on ``intel_xpu``: SGLang's XPUAttentionBackend in the XPU child, its decode and a chain's verify through
    sgl-kernel-xpu's ``flash_attn_with_kvcache`` (``kernels/emulated/sgl_kernel_xpu_flash_attn.py``, not the CUDA
    FA3 emulation of the same name): verified at level emulated naming it; a scale x1.05 fails the cell."""
    rows = drive(".venv-sglang", "none:llama-decode-intel-xpu", "intel-xpu-scale-x1.05:llama-decode-intel-xpu",
                 "none:llama-chain-intel-xpu", "intel-xpu-extend-scale-x1.05:llama-chain-intel-xpu")
    for name, method in (("llama-decode-intel-xpu", "forward_decode"), ("llama-chain-intel-xpu", "forward_extend")):
        row = rows[f"none:{name}"]
        assert row["status"] == "verified" and row["level"] == "emulated", row
        assert row["function"] == f"sglang.srt.layers.attention.xpu_backend:XPUAttentionBackend.{method}"
        assert "sgl_kernel.flash_attn:flash_attn_with_kvcache" in row["emulated"], row
    for scenario in ("intel-xpu-scale-x1.05:llama-decode-intel-xpu",
                     "intel-xpu-extend-scale-x1.05:llama-chain-intel-xpu"):
        row = rows[scenario]
        assert row["status"] == "failed" and not row["finding"] and row["message"].startswith("out: "), row


def test_intel_xpu_runs_sglangs_xpu_backend_around_emulated_sgl_kernel_xpu_mla_ops():
    """DeepSeek on ``intel_xpu``: SGLang's XPUAttentionBackend in the XPU child, its ``flash_mla_decode`` (decode)
    and ``flash_mla_prefill`` (a chain's verify) emulated (``kernels/emulated/sgl_kernel_xpu_attention.py``):
    verified at level emulated naming the ops; a scale x1.05 in the backend's decode or extend fails the cell."""
    rows = drive(".venv-sglang", "none:v3-decode-intel-xpu", "intel-xpu-scale-x1.05:v3-decode-intel-xpu",
                 "none:v3-chain-intel-xpu", "intel-xpu-extend-scale-x1.05:v3-chain-intel-xpu")
    decode, chain = rows["none:v3-decode-intel-xpu"], rows["none:v3-chain-intel-xpu"]
    assert decode["status"] == "verified" and decode["level"] == "emulated", decode
    assert decode["function"] == "sglang.srt.layers.attention.xpu_backend:XPUAttentionBackend.forward_decode"
    assert "sgl_kernel:flash_mla_decode" in decode["emulated"], decode
    assert "ran in a process that imported SGLang on its XPU platform, answering for xpu" in decode["notes"]
    assert chain["status"] == "verified" and chain["level"] == "emulated", chain
    assert chain["function"] == "sglang.srt.layers.attention.xpu_backend:XPUAttentionBackend.forward_extend"
    assert "sgl_kernel:flash_mla_prefill" in chain["emulated"], chain
    for scenario in ("intel-xpu-scale-x1.05:v3-decode-intel-xpu", "intel-xpu-extend-scale-x1.05:v3-chain-intel-xpu"):
        row = rows[scenario]
        assert row["status"] == "failed" and not row["finding"] and row["message"].startswith("out: "), row


def test_deepseek_v32_on_triton_runs_sglangs_dsa_pool_and_indexer_gate_and_a_planted_fault_fails_it():
    """DeepSeek-V3.2 (a DSA checkpoint) on triton in the ROCm / XPU children: SGLang's DSATokenToKVPool, its
    indexer's own gate (no indexer metadata from a dense backend: no top-k, every token attended) and
    TritonAttnBackend's decode / verify verify at level backend (the matrix's cells, read in the committed
    report that CI recomputes); a scale x1.05 in the Triton decode fails it (live)."""
    rows = drive(".venv-sglang", "decode-scale-x1.05:v32-decode-gfx942", "decode-scale-x1.05:v32-decode-xpu")
    _, cells = committed_slice("sglang-0.5.23", "--mla-select=model=deepseek-v3.2", "--mla-select=backend=triton",
                               "--mla-select=dcp=1", "--mla-select=arch=gfx942,gfx950")
    for cell in ("none/gfx942/kv-auto", "eagle-1x3/gfx950/kv-fp8_e4m3"):
        kernel = cells[f"deepseek-v3.2/triton/dcp1/{cell}"]["kernel"]
        assert kernel["status"] == "verified" and kernel["level"] == "backend", kernel
        assert "sglang.srt.layers.attention.dsa.dsa_indexer:Indexer.forward_cuda" in kernel["functions"], kernel
        assert any(n.startswith("SGLang's DSATokenToKVPool") for n in kernel["notes"]), kernel["notes"]
        assert any(n.startswith("DSA indexer: TritonAttnBackend has no indexer metadata") and "within index_topk 2048"
                   in n for n in kernel["notes"]), kernel["notes"]
    for scenario in ("decode-scale-x1.05:v32-decode-gfx942", "decode-scale-x1.05:v32-decode-xpu"):
        row = rows[scenario]
        assert row["status"] == "failed" and not row["finding"] and row["message"].startswith("out: "), row


def test_a_dense_backend_on_deepseek_v32_attends_past_the_models_top_k_which_the_check_sees_when_requests_outgrow_it():
    """SGLang's dense backends get no top-k from the DSA indexer and attend every cached token: right while a
    request holds at most index_topk (2048) tokens, the matrix's cells. A case whose requests outgrow a
    scaled-down top-k (the reference attending only the selection) fails: the divergence past 2048 tokens
    is observable (noticed in docs/engines.md, not declared in the matrix)."""
    row = drive(".venv-sglang", "requests-outgrow-topk:v32-decode-gfx942")["requests-outgrow-topk:v32-decode-gfx942"]
    assert row["status"] == "failed" and not row["finding"] and row["message"].startswith("out: "), row
