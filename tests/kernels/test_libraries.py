"""Library wrappers (FlashMLA, FlashInfer MLA, TRT-LLM MLA) map our arguments onto the libraries' APIs.

On CPU the libraries are replaced by fakes in ``sys.modules`` that accept only
their library's conventions (page sizes, split q/caches, CSR page lists,
metadata objects), record what they were given, and compute attention in
float64 *on their side of the mapping* (their LSE base, their empty-query
convention). A wrapper is right when wrapper(fake) equals our float64
reference within bf16 tolerance. With CUDA and the real libraries installed,
``test_real_library_matches_reference`` runs them instead.
"""

from __future__ import annotations

import math
import subprocess
import sys
import types

import pytest
import torch

from pytest_mla.core.models import BUILTIN_MODELS
from pytest_mla.core.spec import parse_spec
from pytest_mla.kernels import libraries
from pytest_mla.kernels.compare import TOLERANCES, check_close
from pytest_mla.kernels.harness import case_for, run_kernel_check
from pytest_mla.kernels.inputs import gen_decode_inputs
from pytest_mla.kernels.libraries import KernelUnsupported, flash_mla_decode, flashinfer_mla_decode, trtllm_mla_decode
from pytest_mla.kernels.library_probe import LIBRARY_KERNELS, available_library_kernels
from pytest_mla.kernels.library_hook import library_kernel_for
from pytest_mla.kernels.reference import ref_merge, ref_mla_decode

TOL = TOLERANCES["bf16"]
LOG2E = 1.0 / math.log(2.0)
D_QK, D_V = 576, 512  # the only head dims the libraries take


# --------------------------------------------------------------------------------------------
# The libraries' side: float64 attention over *their* arguments
# --------------------------------------------------------------------------------------------


def lib_attend(q_nope, q_pe, ckv, kpe, scale, causal):
    """``q_* [s_q, h, *]``, ``ckv [n, 512]``, ``kpe [n, 64]`` -> ``(out [s_q, h, 512], lse [h, s_q])`` natural log.

    Causal is bottom-right aligned (query i sees keys ``<= n - s_q + i``), as
    FlashMLA, FlashInfer and TRT-LLM define it; no keys: out 0, lse -inf.
    """
    s_q, n = q_nope.shape[0], ckv.shape[0]
    scores = (torch.einsum("ihd,jd->hij", q_nope.double(), ckv.double())
              + torch.einsum("ihd,jd->hij", q_pe.double(), kpe.double())) * scale  # [h, s_q, n]
    if causal:
        visible = torch.arange(n)[None, :] <= (n - s_q + torch.arange(s_q))[:, None]  # [s_q, n]
        scores = scores.masked_fill(~visible[None], -math.inf)
    lse = torch.logsumexp(scores, -1)  # [h, s_q]
    probs = torch.exp(scores - torch.where(torch.isneginf(lse), 0.0, lse)[..., None])
    return torch.einsum("hij,jd->ihd", probs, ckv.double()), lse


class Recorder(dict):
    def add(self, name, **kw):
        self.setdefault(name, []).append(kw)


def fake_flash_mla(rec: Recorder, *, new_api: bool = True) -> types.ModuleType:
    """FlashMLA: pages of 64, one latent head, (FlashMLASchedMeta, None) or (metadata, num_splits) tensors."""
    mod = types.ModuleType("flash_mla")

    class FlashMLASchedMeta:
        pass

    def get_mla_metadata(*args, **kwargs):
        rec.add("get_mla_metadata", args=args, kwargs=kwargs)
        if new_api:
            return FlashMLASchedMeta(), None
        seqlens = args[0]
        return torch.zeros(8, 8, dtype=torch.int32), torch.zeros(seqlens.shape[0] + 1, dtype=torch.int32)

    def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                               num_splits=None, softmax_scale=None, causal=False):
        rec.add("flash_mla_with_kvcache", q=q, k_cache=k_cache, block_table=block_table,
                cache_seqlens=cache_seqlens, head_dim_v=head_dim_v, softmax_scale=softmax_scale, causal=causal)
        if new_api:
            assert isinstance(tile_scheduler_metadata, FlashMLASchedMeta) and num_splits is None
        else:
            assert isinstance(num_splits, torch.Tensor) and num_splits.shape == (q.shape[0] + 1,)
        assert k_cache.shape[1] == 64, "Currently page_block_size must be 64"
        assert k_cache.shape[2] == 1 and head_dim_v == 512 and q.shape[-1] == 576
        assert q.dtype in (torch.bfloat16, torch.float16) and k_cache.dtype == q.dtype
        assert block_table.dtype == torch.int32 and cache_seqlens.dtype == torch.int32
        b, s_q, h_q, _ = q.shape
        out = torch.empty(b, s_q, h_q, head_dim_v, dtype=q.dtype)
        lse = torch.empty(b, h_q, s_q, dtype=torch.float32)
        for i in range(b):
            n = int(cache_seqlens[i])
            pages = block_table[i, : -(-n // 64)].long()
            rows = k_cache[pages].reshape(-1, 576)[:n]  # [n, 576]
            o, l = lib_attend(q[i, ..., :512], q[i, ..., 512:], rows[:, :512], rows[:, 512:], softmax_scale,
                              causal and s_q > 1)
            out[i], lse[i] = o.to(q.dtype), torch.where(torch.isneginf(l), math.inf, l).float()  # FlashMLA: +inf
        return out, lse

    mod.get_mla_metadata = get_mla_metadata
    mod.flash_mla_with_kvcache = flash_mla_with_kvcache
    return mod


def fake_flashinfer(rec: Recorder, *, lse_api: str = "run-flag", trtllm_lse: bool = True) -> dict[str, types.ModuleType]:
    """``flashinfer`` with ``mla.BatchMLAPagedAttentionWrapper`` and ``decode.trtllm_batch_decode_with_kv_cache_mla``."""
    pkg, mla, decode = (types.ModuleType(n) for n in ("flashinfer", "flashinfer.mla", "flashinfer.decode"))
    pkg.__version__ = "0.0.fake"

    class BatchMLAPagedAttentionWrapper:
        def __init__(self, float_workspace_buffer, use_cuda_graph=False, backend="auto"):
            rec.add("wrapper_init", workspace=float_workspace_buffer, backend=backend)

        def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe,
                 page_size, causal, sm_scale, q_data_type, kv_data_type, use_profiler=False):
            rec.add("plan", qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len_arr=kv_len_arr,
                    num_heads=num_heads, head_dim_ckv=head_dim_ckv, head_dim_kpe=head_dim_kpe, page_size=page_size,
                    causal=causal, sm_scale=sm_scale, q_data_type=q_data_type, kv_data_type=kv_data_type)
            self.p = rec["plan"][-1]

        def _run(self, q_nope, q_pe, ckv_cache, kpe_cache, return_lse, base_e):
            p = self.p
            rec.add("run", q_nope=q_nope, q_pe=q_pe, ckv_cache=ckv_cache, kpe_cache=kpe_cache, base_e=base_e)
            assert q_nope.shape[1:] == (p["num_heads"], p["head_dim_ckv"]) and q_pe.shape[-1] == p["head_dim_kpe"]
            assert ckv_cache.dim() == 3 and ckv_cache.shape[1] == p["page_size"]
            out = torch.empty_like(q_nope)
            lse = torch.empty(q_nope.shape[:2], dtype=torch.float32)
            for i in range(len(p["qo_indptr"]) - 1):
                qs = slice(int(p["qo_indptr"][i]), int(p["qo_indptr"][i + 1]))
                pages = p["kv_indices"][int(p["kv_indptr"][i]): int(p["kv_indptr"][i + 1])].long()
                n = int(p["kv_len_arr"][i])
                o, l = lib_attend(q_nope[qs], q_pe[qs], ckv_cache[pages].reshape(-1, ckv_cache.shape[-1])[:n],
                                  kpe_cache[pages].reshape(-1, kpe_cache.shape[-1])[:n], p["sm_scale"], p["causal"])
                out[qs] = o.to(out.dtype)
                lse[qs] = (l if base_e else l * LOG2E).T.float()  # base 2 unless asked for base e
            return (out, lse) if return_lse else out

    class WrapperWithBaseFlag(BatchMLAPagedAttentionWrapper):
        def run(self, q_nope, q_pe, ckv_cache, kpe_cache, out=None, lse=None, return_lse=False,
                profiler_buffer=None, kv_len=None, page_table=None, return_lse_base_on_e=False):
            return self._run(q_nope, q_pe, ckv_cache, kpe_cache, return_lse, return_lse_base_on_e)

    class WrapperPlanLseMode(BatchMLAPagedAttentionWrapper):  # newest: the LSE base is chosen at plan time
        def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe,
                 page_size, causal, sm_scale, q_data_type, kv_data_type, use_profiler=False, *, lse_mode="none"):
            super().plan(qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe,
                         page_size, causal, sm_scale, q_data_type, kv_data_type)
            self.lse_mode = lse_mode

        def run(self, q_nope, q_pe, ckv_cache, kpe_cache, out=None, lse=None, return_lse=False,
                profiler_buffer=None, kv_len=None, page_table=None):
            assert return_lse and self.lse_mode in ("base2", "basee")
            return self._run(q_nope, q_pe, ckv_cache, kpe_cache, return_lse, self.lse_mode == "basee")

    class WrapperBase2Only(BatchMLAPagedAttentionWrapper):
        def run(self, q_nope, q_pe, ckv_cache, kpe_cache, out=None, lse=None, return_lse=False,
                profiler_buffer=None, kv_len=None, page_table=None):
            return self._run(q_nope, q_pe, ckv_cache, kpe_cache, return_lse, False)

    def trtllm_core(query, kv_cache, workspace_buffer, qk_nope_head_dim, kv_lora_rank, qk_rope_head_dim,
                    block_tables, seq_lens, max_seq_len, sparse_mla_top_k=0, out=None, bmm1_scale=1.0,
                    bmm2_scale=1.0, sinks=None, enable_pdl=None, backend="auto", lse=None, return_lse=False):
        rec.add("trtllm", query=query, kv_cache=kv_cache, workspace=workspace_buffer, block_tables=block_tables,
                seq_lens=seq_lens, max_seq_len=max_seq_len, bmm1_scale=bmm1_scale, bmm2_scale=bmm2_scale,
                backend=backend, qk_nope_head_dim=qk_nope_head_dim, kv_lora_rank=kv_lora_rank,
                qk_rope_head_dim=qk_rope_head_dim)
        assert query.dim() == 4 and query.dtype == torch.bfloat16 and query.shape[-1] == 576
        assert kv_cache.dim() == 4 and kv_cache.shape[1] == 1, "[num_pages, 1, page_size, 576]"
        page_size = kv_cache.shape[2]
        assert page_size in (32, 64), f"Supported block_size are 32 and 64, got {page_size}"
        assert block_tables.shape[1] % (128 // page_size) == 0
        assert (seq_lens > 0).all(), "the fake, like trtllm-gen, leaves seq_lens == 0 rows unwritten"
        assert max_seq_len == int(seq_lens.max())
        b, s_q, h, _ = query.shape
        o_all = torch.empty(b, s_q, h, kv_lora_rank, dtype=torch.bfloat16)
        lse_all = torch.empty(b * s_q, h, dtype=torch.float32)
        for i in range(b):
            n = int(seq_lens[i])
            rows = kv_cache[block_tables[i, : -(-n // page_size)].long(), 0].reshape(-1, 576)[:n]
            o, l = lib_attend(query[i, ..., :512], query[i, ..., 512:], rows[:, :512], rows[:, 512:],
                              bmm1_scale, s_q > 1)  # several query tokens (MTP) are always causal
            o_all[i] = (o * bmm2_scale).to(torch.bfloat16)
            lse_all[i * s_q:(i + 1) * s_q] = (l * LOG2E).T.float()  # trtllm-gen: base 2
        return (o_all, lse_all) if return_lse else o_all

    if trtllm_lse:
        decode.trtllm_batch_decode_with_kv_cache_mla = trtllm_core
    else:
        def trtllm_no_lse(query, kv_cache, workspace_buffer, qk_nope_head_dim, kv_lora_rank, qk_rope_head_dim,
                          block_tables, seq_lens, max_seq_len, sparse_mla_top_k=0, out=None, bmm1_scale=1.0,
                          bmm2_scale=1.0, sinks=None, enable_pdl=None, backend="auto"):
            raise AssertionError("never called: this flashinfer returns no LSE")
        decode.trtllm_batch_decode_with_kv_cache_mla = trtllm_no_lse
    mla.BatchMLAPagedAttentionWrapper = {"run-flag": WrapperWithBaseFlag, "base2-only": WrapperBase2Only,
                                         "plan-lse-mode": WrapperPlanLseMode}[lse_api]
    pkg.mla, pkg.decode = mla, decode
    return {"flashinfer": pkg, "flashinfer.mla": mla, "flashinfer.decode": decode}


@pytest.fixture
def rec():
    return Recorder()


@pytest.fixture
def small_workspace(monkeypatch):
    monkeypatch.setattr(libraries, "WORKSPACE_BYTES", 1024)
    monkeypatch.setattr(libraries, "_WORKSPACES", {})


def install(monkeypatch, modules: dict[str, types.ModuleType]):
    for name, mod in modules.items():
        monkeypatch.setitem(sys.modules, name, mod)


def inputs(seqlens=(1, 70, 0, 5), *, s_q=1, h_q=4, page_size=64, dtype="bf16", seed=0, **kw):
    return gen_decode_inputs(list(seqlens), s_q=s_q, h_q=h_q, d_qk=D_QK, d_v=D_V, page_size=page_size,
                             dtype=dtype, seed=seed, softmax_scale=192 ** -0.5, **kw)


def run_wrapper(wrapper, x, **kw):
    out = torch.full((x.q.shape[0], x.q.shape[1], x.q.shape[2], D_V), math.nan, dtype=x.q.dtype)
    return wrapper(x.q, x.kv_cache, x.block_table, x.cache_seqlens, x.head_dim_v, x.softmax_scale, x.causal,
                   x.kv_scale, out=out, **kw)


def assert_matches_reference(x, out, lse):
    ref_out, ref_lse = ref_mla_decode(**x.ref_args())
    res_out, res_lse = check_close("out", out, ref_out, TOL.out), check_close("lse", lse, ref_lse, TOL.lse)
    assert res_out.ok, res_out.message
    assert res_lse.ok, res_lse.message
    assert lse.dtype == torch.float32 and lse.shape == (x.q.shape[0], x.q.shape[2], x.q.shape[1])


# --------------------------------------------------------------------------------------------
# FlashMLA
# --------------------------------------------------------------------------------------------

FLASHMLA_CASES = [(new_api, s_q, page) for new_api in (True, False) for s_q in (1, 3) for page in (64, 16)]


@pytest.mark.parametrize("new_api,s_q,page_size", FLASHMLA_CASES,
                         ids=[f"{'new' if n else 'old'}-api-sq{s}-page{p}" for n, s, p in FLASHMLA_CASES])
def test_flash_mla_matches_reference(monkeypatch, rec, new_api, s_q, page_size):
    install(monkeypatch, {"flash_mla": fake_flash_mla(rec, new_api=new_api)})
    x = inputs((s_q, 70, 0, s_q + 4) if s_q > 1 else (1, 70, 0, 5), s_q=s_q, page_size=page_size)
    out, lse = run_wrapper(flash_mla_decode, x)
    assert_matches_reference(x, out, lse)
    assert torch.isneginf(lse[2]).all() and (out[2] == 0).all()  # FlashMLA's +inf became -inf
    (meta,) = rec["get_mla_metadata"]
    assert meta["args"][1:] == (s_q * 4, 1)  # s_q * h_q // h_kv, h_kv
    (call,) = rec["flash_mla_with_kvcache"]
    assert call["softmax_scale"] == x.softmax_scale and call["causal"] is True
    assert call["k_cache"].shape[1] == 64
    if page_size == 64:
        assert call["k_cache"] is x.kv_cache and call["block_table"] is x.block_table  # no copy when native


def test_flash_mla_refuses_other_page_sizes_without_repage(monkeypatch, rec):
    install(monkeypatch, {"flash_mla": fake_flash_mla(rec)})
    with pytest.raises(KernelUnsupported, match=r"flashmla: .* pages of 16 tokens \(supports 64"):
        run_wrapper(flash_mla_decode, inputs(page_size=16), repage=False)


def test_flash_mla_dcp_single_query_runs_and_merges(monkeypatch, rec):
    """s_q = 1 under DCP needs no global positions: the harness's shards merge to the reference."""
    install(monkeypatch, {"flash_mla": fake_flash_mla(rec)})
    model = BUILTIN_MODELS["deepseek-v3"]
    case = case_for({"model": "deepseek-v3", "backend": "flashmla", "dcp": 2, "spec": "none", "arch": "sm90",
                     "tp": 32}, model, seed=3)
    result = run_kernel_check(case, "pytest_mla.kernels.libraries:flash_mla_decode",
                              merge="pytest_mla.kernels.reference:ref_merge")
    assert result["status"] == "verified", result["message"]
    assert len(rec["flash_mla_with_kvcache"]) == 2  # one call per rank


# --------------------------------------------------------------------------------------------
# FlashInfer MLA
# --------------------------------------------------------------------------------------------

FLASHINFER_CASES = [(api, s_q, page) for api in ("run-flag", "base2-only", "plan-lse-mode") for s_q in (1, 3)
                    for page in (1, 16, 64) if api == "run-flag" or page == 16]


@pytest.mark.parametrize("lse_api,s_q,page_size", FLASHINFER_CASES,
                         ids=[f"{a}-sq{s}-page{p}" for a, s, p in FLASHINFER_CASES])
def test_flashinfer_mla_matches_reference(monkeypatch, rec, small_workspace, lse_api, s_q, page_size):
    install(monkeypatch, fake_flashinfer(rec, lse_api=lse_api))
    x = inputs((s_q, 70, 0, s_q + 4) if s_q > 1 else (1, 70, 0, 5), s_q=s_q, page_size=page_size)
    out, lse = run_wrapper(flashinfer_mla_decode, x)
    assert_matches_reference(x, out, lse)
    (plan,) = rec["plan"]
    b = x.q.shape[0]
    assert plan["qo_indptr"].tolist() == [i * s_q for i in range(b + 1)]
    assert (plan["num_heads"], plan["head_dim_ckv"], plan["head_dim_kpe"], plan["page_size"]) == (4, 512, 64, page_size)
    assert plan["sm_scale"] == x.softmax_scale and plan["causal"] is (s_q > 1)
    assert plan["kv_len_arr"] is x.cache_seqlens and plan["q_data_type"] == plan["kv_data_type"] == torch.bfloat16
    (run,) = rec["run"]
    assert run["base_e"] is (lse_api != "base2-only")
    assert torch.equal(run["q_nope"], x.q[..., :512].reshape(b * s_q, 4, 512))
    assert torch.equal(run["q_pe"], x.q[..., 512:].reshape(b * s_q, 4, 64))
    assert run["ckv_cache"].data_ptr() == x.kv_cache.data_ptr()  # views of the latent cache, no copy
    assert run["kpe_cache"].data_ptr() == x.kv_cache[..., 512:].data_ptr()


def test_flashinfer_page_list_from_block_table():
    block_table = torch.tensor([[7, 3, 9, 2**30], [4, 2**30, 2**30, 2**30], [2**30] * 4, [1, 5, 2**30, 2**30]],
                               dtype=torch.int32)
    seqlens = torch.tensor([9, 4, 0, 5], dtype=torch.int32)  # page size 4: 3, 1, 0, 2 pages
    indptr, indices = libraries._paged_indices(block_table, seqlens, 4)
    assert indptr.tolist() == [0, 3, 4, 4, 6] and indices.tolist() == [7, 3, 9, 4, 1, 5]
    assert indptr.dtype == indices.dtype == torch.int32


# --------------------------------------------------------------------------------------------
# TRT-LLM MLA
# --------------------------------------------------------------------------------------------

TRTLLM_CASES = [(s_q, page) for s_q in (1, 3) for page in (32, 64, 16)]


@pytest.mark.parametrize("s_q,page_size", TRTLLM_CASES, ids=[f"sq{s}-page{p}" for s, p in TRTLLM_CASES])
def test_trtllm_mla_matches_reference(monkeypatch, rec, small_workspace, s_q, page_size):
    install(monkeypatch, fake_flashinfer(rec))
    x = inputs((s_q, 70, 0, s_q + 4) if s_q > 1 else (1, 70, 0, 5), s_q=s_q, page_size=page_size)
    out, lse = run_wrapper(trtllm_mla_decode, x)
    assert_matches_reference(x, out, lse)
    assert torch.isneginf(lse[2]).all() and (out[2] == 0).all()  # the empty request never reached the kernel
    (call,) = rec["trtllm"]
    assert call["seq_lens"].tolist() == [n for n in x.cache_seqlens.tolist() if n > 0]
    assert call["backend"] == "trtllm-gen" and call["bmm1_scale"] == x.softmax_scale and call["bmm2_scale"] == 1.0
    assert (call["kv_lora_rank"], call["qk_rope_head_dim"]) == (512, 64)
    assert call["kv_cache"].shape[2] == (page_size if page_size in (32, 64) else 64)
    assert not call["workspace"].any()  # zero-initialised, as trtllm-gen's semaphores need


def test_trtllm_all_empty_never_launches(monkeypatch, rec, small_workspace):
    install(monkeypatch, fake_flashinfer(rec))
    x = inputs((0, 0), page_size=64)
    out, lse = run_wrapper(trtllm_mla_decode, x)
    assert "trtllm" not in rec and (out == 0).all() and torch.isneginf(lse).all()


def test_trtllm_through_the_harness_with_dcp(monkeypatch, rec, small_workspace):
    install(monkeypatch, fake_flashinfer(rec))
    case = case_for({"model": "deepseek-v3", "backend": "trtllm_mla", "dcp": 2, "spec": "none", "arch": "sm100",
                     "tp": 32, "page_size": 64}, BUILTIN_MODELS["deepseek-v3"], seed=5)
    result = run_kernel_check(case, "pytest_mla.kernels.libraries:trtllm_mla_decode",
                              merge="pytest_mla.kernels.reference:ref_merge")
    assert result["status"] == "verified", result["message"]


def test_trtllm_without_lse_is_refused(monkeypatch, rec, small_workspace):
    install(monkeypatch, fake_flashinfer(rec, trtllm_lse=False))
    with pytest.raises(KernelUnsupported, match="returns no LSE"):
        run_wrapper(trtllm_mla_decode, inputs(page_size=64))
    spec, reason = library_kernel_for("trtllm_mla", "sm100")
    assert spec is None and "returns no LSE" in reason


# --------------------------------------------------------------------------------------------
# What the libraries cannot do
# --------------------------------------------------------------------------------------------

WRAPPERS = {"flashmla": flash_mla_decode, "flashinfer": flashinfer_mla_decode, "trtllm_mla": trtllm_mla_decode}


def _unsupported_calls():
    chain = dict(seqlens=(4, 9), s_q=4)
    return {
        "tree-mask": (dict(seqlens=(5, 9), s_q=5, spec_topk=2, spec_steps=2), {}, "tree mask"),
        "fp32": (dict(dtype="fp32"), {}, "compute in fp32"),
        "fp8-cache": (dict(kv_dtype="fp8_e4m3"), {}, "kv_scale"),
        "dcp-positions": (chain, dict(dcp_rank=1, dcp_world_size=2, global_seqlens=torch.tensor([8, 18],
                                                                                                 dtype=torch.int32)),
                          "DCP global positions"),
        "shifted-queries": (chain, dict(global_seqlens=torch.tensor([5, 9], dtype=torch.int32)), "global_seqlens"),
    }


UNSUPPORTED = [(backend, name) for backend in WRAPPERS for name in _unsupported_calls()]


@pytest.mark.parametrize("backend,what", UNSUPPORTED, ids=[f"{b}-{w}" for b, w in UNSUPPORTED])
def test_unsupported_features_raise_before_any_call(monkeypatch, rec, backend, what):
    install(monkeypatch, {"flash_mla": fake_flash_mla(rec), **fake_flashinfer(rec)})
    gen_kw, call_kw, message = _unsupported_calls()[what]
    x = inputs(**{"page_size": 64, **gen_kw})
    with pytest.raises(KernelUnsupported, match=message) as info:
        run_wrapper(WRAPPERS[backend], x, tree_mask=x.tree_mask, **call_kw)
    assert isinstance(info.value, ValueError) and str(info.value).startswith(f"{backend}: ")
    assert not rec  # refused before the library saw anything


def test_gqa_and_other_head_dims_are_refused(monkeypatch, rec):
    install(monkeypatch, {"flash_mla": fake_flash_mla(rec)})
    gqa = gen_decode_inputs([3], s_q=1, h_q=4, h_kv=2, d_qk=D_V, d_v=D_V, mla=False, page_size=64)
    with pytest.raises(KernelUnsupported, match="GQA"):
        flash_mla_decode(gqa.q, gqa.kv_cache, gqa.block_table, gqa.cache_seqlens, D_V, v_cache=gqa.v_cache)
    small = gen_decode_inputs([3], s_q=1, h_q=4, d_qk=80, d_v=64, page_size=64)
    with pytest.raises(KernelUnsupported, match="head dims d_qk=80"):
        flash_mla_decode(small.q, small.kv_cache, small.block_table, small.cache_seqlens, 64)


def test_trtllm_refuses_non_causal_multi_query(monkeypatch, rec):
    install(monkeypatch, fake_flashinfer(rec))
    x = inputs((4, 9), s_q=4)
    with pytest.raises(KernelUnsupported, match="without the causal mask"):
        trtllm_mla_decode(x.q, x.kv_cache, x.block_table, x.cache_seqlens, D_V, causal=False)


def test_return_lse_false_gives_out_only(monkeypatch, rec):
    install(monkeypatch, {"flash_mla": fake_flash_mla(rec)})
    x = inputs()
    out = flash_mla_decode(x.q, x.kv_cache, x.block_table, x.cache_seqlens, D_V, x.softmax_scale, return_lse=False)
    assert isinstance(out, torch.Tensor) and out.shape == (4, 1, 4, D_V)


def test_repage_keeps_every_token_and_poisons_the_rest():
    x = inputs((1, 70, 0, 5), page_size=16)
    cache, table = libraries._repage(x.kv_cache, x.block_table, x.cache_seqlens, 64, width_multiple=4)
    assert cache.shape[1] == 64 and table.shape[1] % 4 == 0
    for i, n in enumerate(x.cache_seqlens.tolist()):
        old = x.kv_cache[x.block_table[i, : -(-n // 16)].long()].reshape(-1, 1, D_QK)[:n]
        new_rows = cache[table[i, : -(-n // 64)].long()].reshape(-1, 1, D_QK)
        assert torch.equal(new_rows[:n], old) and new_rows[n:].isnan().all()


# --------------------------------------------------------------------------------------------
# Availability on this host, the engine hook, light imports
# --------------------------------------------------------------------------------------------


def _installed(module):
    import importlib.util

    return module in sys.modules or importlib.util.find_spec(module) is not None


@pytest.mark.parametrize("host", ["cpu", "interpreter"])
def test_nothing_runs_on_a_cpu_host_with_clear_reasons(host):
    found = available_library_kernels(host)
    assert set(found) == {"flashmla", "flashinfer", "trtllm_mla"}
    for backend, (spec, reason) in found.items():
        lib = LIBRARY_KERNELS[backend]
        assert spec is None and reason.startswith(f"{backend}: ")
        assert f"needs {'/'.join(lib.archs)}, host is {host}" in reason
        if not _installed(lib.module):
            assert f"{lib.module} not installed" in reason


def test_wrong_gpu_arch_is_a_reason_even_when_installed(monkeypatch, rec):
    install(monkeypatch, {"flash_mla": fake_flash_mla(rec), **fake_flashinfer(rec)})
    assert available_library_kernels("sm100")["flashmla"] == (None, "flashmla: FlashMLA (flash_mla.flash_mla_with_kvcache) needs sm90, host is sm100")
    assert "needs sm100/sm103, host is sm90" in available_library_kernels("sm90")["trtllm_mla"][1]


def test_hook_gives_specs_on_a_matching_host(monkeypatch, rec):
    install(monkeypatch, {"flash_mla": fake_flash_mla(rec), **fake_flashinfer(rec)})
    spec, reason = library_kernel_for("flashmla", "sm90")
    assert reason is None and spec.target == "pytest_mla.kernels.libraries:flash_mla_decode"
    assert (spec.name, spec.returns_lse, spec.dcp_positions, spec.tree_mask) == ("flashmla", True, False, False)
    assert library_kernel_for("flashinfer", "sm90a")[0].target.endswith(":flashinfer_mla_decode")
    assert library_kernel_for("trtllm_mla", "sm100")[0].name == "trtllm_mla"
    assert library_kernel_for("triton", "sm90") == (None, None)  # not a library backend: keep the engine's reason


def test_hook_turns_configurations_the_wrapper_cannot_compute_into_reasons(monkeypatch, rec):
    install(monkeypatch, {"flash_mla": fake_flash_mla(rec), **fake_flashinfer(rec)})
    v3, gqa = BUILTIN_MODELS["deepseek-v3"], next(m for m in BUILTIN_MODELS.values() if not m.mla)
    assert library_kernel_for("flashmla", "sm90", model=v3, spec=parse_spec("none"), dcp=4)[1] is None
    assert "MLA models only" in library_kernel_for("flashinfer", "sm90", model=gqa)[1]
    assert "tree mask" in library_kernel_for("flashinfer", "sm90", model=v3, spec=parse_spec("eagle-2x2"))[1]
    assert "DCP with 4 query tokens" in library_kernel_for("flashmla", "sm90", model=v3,
                                                           spec=parse_spec("eagle-1x3"), dcp=2)[1]
    assert "fp8_e4m3" in library_kernel_for("trtllm_mla", "sm100", kv_cache_dtype="fp8_e4m3")[1]


def test_importing_the_hook_imports_neither_torch_nor_a_library():
    code = ("import sys, pytest_mla.kernels.library_hook as h; h.library_kernel_for('flashmla', 'cpu'); "
            "bad = [m for m in ('torch', 'triton', 'flash_mla', 'flashinfer') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_capability_table_is_plain():
    for backend, lib in LIBRARY_KERNELS.items():
        d = lib.describe()
        assert d["backend"] == backend and isinstance(d["archs"], list)
        assert d["page_sizes"] == "any" or all(isinstance(p, int) for p in d["page_sizes"])


def test_bench_skips_cleanly_without_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the benchmark would run")
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[2] / "benchmarks" / "libraries.py"
    spec = importlib.util.spec_from_file_location("bench_libraries", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.bench_library_kernels([(1, 1, 16, 256)]) == []
    assert "skipped, no CUDA GPU" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------
# GPU: the real libraries against the reference
# --------------------------------------------------------------------------------------------

GPU_CASES = [(backend, dcp, spec) for backend in LIBRARY_KERNELS for dcp, spec in ((1, "none"), (1, "eagle-1x3"),
                                                                                   (2, "none"))]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU to run FlashMLA / FlashInfer / TRT-LLM MLA")
@pytest.mark.parametrize("backend,dcp,spec", GPU_CASES, ids=[f"{b}-dcp{d}-{s}" for b, d, s in GPU_CASES])
def test_real_library_matches_reference(backend, dcp, spec):
    from pytest_mla.kernels._mode import ensure_triton_mode

    arch = ensure_triton_mode()
    kernel, reason = library_kernel_for(backend, arch, model=BUILTIN_MODELS["deepseek-v3"], spec=parse_spec(spec),
                                        dcp=dcp)
    if kernel is None:
        pytest.skip(reason)
    page_size = (LIBRARY_KERNELS[backend].page_sizes or (16,))[-1]
    case = case_for({"model": "deepseek-v3", "backend": backend, "dcp": dcp, "spec": spec, "arch": arch, "tp": 8,
                     "page_size": page_size}, BUILTIN_MODELS["deepseek-v3"], seed=11)
    result = run_kernel_check(case, kernel.target, where=arch, merge=ref_merge)
    assert result["status"] == "verified", (result["message"], result["errors"])
