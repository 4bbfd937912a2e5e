"""FlashInfer's emulations (MLA paged wrapper, trtllm-gen / cute-dsl decode) against the float64 reference."""

from __future__ import annotations

import math

import pytest
import torch

from pytest_mla.kernels.compare import check_close
from pytest_mla.kernels.emulated import flashinfer
from pytest_mla.kernels.emulated.glue import OutOfContractError, OutOfRangeRead
from pytest_mla.kernels.reference import ref_merge

from .cases import LOG2E, LSE_TOL, TOL, assert_close, make_case, natural_with, poisoned, rank_cache, reference

WORKSPACE = torch.empty(16, dtype=torch.uint8)


# --------------------------------------------------------------------------------------------
# BatchMLAPagedAttentionWrapper
# --------------------------------------------------------------------------------------------


def csr(case):
    """FlashInfer's CSR page list from the case's block table: ``(qo_indptr, kv_indptr, kv_indices, kv_len_arr)``."""
    b, s_q = case.q.shape[:2]
    ps = case.kv_cache.shape[1]
    lens = case.cache_seqlens
    pages = [-(-int(n) // ps) for n in lens]
    kv_indptr = torch.tensor([0] + list(torch.tensor(pages).cumsum(0).tolist()), dtype=torch.int32)
    kv_indices = torch.cat([case.block_table[i, :p] for i, p in enumerate(pages)] + [torch.zeros(0, dtype=torch.int32)])
    qo_indptr = torch.arange(b + 1, dtype=torch.int32) * s_q
    return qo_indptr, kv_indptr, kv_indices.contiguous(), lens.clone()


def split(case):
    b, s_q, h, _ = case.q.shape
    q = case.q.reshape(b * s_q, h, 576)
    return q[..., :512].contiguous(), q[..., 512:].contiguous(), case.kv_cache[:, :, 0, :512], case.kv_cache[:, :, 0, 512:]


def planned(case, *, causal, wrapper=None, **kw):
    w = wrapper or flashinfer.BatchMLAPagedAttentionWrapper(WORKSPACE)
    kv_dtype = case.kv_cache.dtype
    w.plan(*csr(case), 16, 512, 64, case.kv_cache.shape[1], causal, case.softmax_scale, case.q.dtype, kv_dtype, **kw)
    return w


def flat(lse):
    """The reference's ``[b, h, s_q]`` LSE as FlashInfer lays it out: ``[b·s_q, h]``."""
    return lse.permute(0, 2, 1).reshape(-1, lse.shape[1])


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("seqlens,s_q,causal", [([0, 1, 70, 129], 1, False), ([4, 9, 70], 4, True),
                                                 ([5, 33], 3, False)])
def test_wrapper_matches_reference_with_a_base2_lse(page_size, seqlens, s_q, causal):
    case = make_case(seqlens, s_q=s_q, page_size=page_size, seed=page_size + s_q)
    q_nope, q_pe, ckv, kpe = split(case)
    out = poisoned(q_nope.shape, torch.bfloat16)
    lse = poisoned(q_nope.shape[:2], torch.float32)
    o, l = planned(case, causal=causal).run(q_nope, q_pe, ckv, kpe, out=out, lse=lse, return_lse=True)
    assert o is out and l is lse
    ref_out, ref_lse = reference(case, causal=causal)
    assert_close("out", o, ref_out.reshape(-1, 16, 512), TOL)
    assert_close("lse", l, flat(ref_lse) * LOG2E, LSE_TOL)  # base 2; -inf where nothing is attended


def test_wrapper_lse_in_natural_log_when_asked():
    case = make_case([3, 70], seed=21)
    o, l = planned(case, causal=False).run(*split(case), return_lse=True, return_lse_base_on_e=True)
    assert_close("lse", l, flat(reference(case)[1]), LSE_TOL)
    case2 = make_case([3, 70], seed=21)
    _, l2 = planned(case2, causal=False, lse_mode="basee").run(*split(case2), return_lse=True)
    assert torch.equal(l, l2)


def test_wrapper_fp8_cache_uses_both_scales():
    case = make_case([2, 3, 70, 129], s_q=2, page_size=16, kv_dtype="fp8_e4m3", kv_scale=0.25, seed=22)
    o, l = planned(case, causal=True).run(*split(case), return_lse=True, ckv_scale=case.kv_scale,
                                          kpe_scale=case.kv_scale)
    ref_out, ref_lse = reference(case)
    assert_close("out", o, ref_out.reshape(-1, 16, 512), TOL)
    assert_close("lse", l, flat(ref_lse) * LOG2E, LSE_TOL)
    with pytest.raises(ValueError, match="ckv_scale and kpe_scale are required"):
        planned(case, causal=True).run(*split(case))


def test_wrapper_fp8_with_the_scale_left_at_one_is_far_off():
    case = make_case([70, 129], page_size=16, kv_dtype="fp8_e4m3", kv_scale=0.25, seed=23)
    o = planned(case, causal=False).run(*split(case), ckv_scale=1.0, kpe_scale=1.0)
    assert not check_close("out", o, reference(case)[0].reshape(-1, 16, 512), TOL).ok


def test_wrapper_causal_with_more_queries_than_keys_raises():
    case = make_case([2, 70], s_q=4, page_size=16, seed=24)
    with pytest.raises(OutOfContractError, match="^causal: request 0 has qo_len 4 > kv_len 2"):
        planned(case, causal=True).run(*split(case))


def test_wrapper_reads_kv_indices_at_run_time_and_graph_buffers_when_captured():
    case = make_case([20, 40], page_size=16, seed=25)
    qo, kv, idx, lens = csr(case)
    w = flashinfer.BatchMLAPagedAttentionWrapper(WORKSPACE)
    w.plan(qo, kv, idx, lens, 16, 512, 64, 16, False, case.softmax_scale, torch.bfloat16, torch.bfloat16)
    good = w.run(*split(case))
    idx.copy_(idx.flip(0))  # the engine rewrites its page list after plan: the kernel follows it
    assert not torch.equal(w.run(*split(case)), good)
    bufs = dict(qo_indptr=torch.zeros(3, dtype=torch.int32), kv_indptr=torch.zeros(3, dtype=torch.int32),
                kv_indices=torch.zeros(64, dtype=torch.int32), kv_len_arr=torch.zeros(2, dtype=torch.int32))
    g = flashinfer.BatchMLAPagedAttentionWrapper(WORKSPACE, use_cuda_graph=True, **bufs)
    qo, kv, idx, lens = csr(case)
    g.plan(qo, kv, idx, lens, 16, 512, 64, 16, False, case.softmax_scale, torch.bfloat16, torch.bfloat16)
    assert torch.equal(bufs["kv_indices"][: idx.numel()], idx)
    idx.zero_()  # the plan copied it: the caller's tensor no longer matters
    assert torch.equal(g.run(*split(case)), good)


def test_wrapper_rejects_inconsistent_csr_like_the_library():
    case = make_case([20, 40], page_size=16, seed=26)
    qo, kv, idx, lens = csr(case)
    w = flashinfer.BatchMLAPagedAttentionWrapper(WORKSPACE)
    with pytest.raises(ValueError, match=r"page counts in kv_indptr must equal ceil\(kv_len_arr / page_size\)"):
        w.plan(qo, kv, idx, lens + 16, 16, 512, 64, 16, False, 0.04, torch.bfloat16, torch.bfloat16)
    with pytest.raises(RuntimeError, match="called before plan"):
        w.run(*split(case))


def test_wrapper_out_of_range_page_raises():
    case = make_case([20, 40], page_size=16, seed=27)
    qo, kv, idx, lens = csr(case)
    idx[-1] = case.kv_cache.shape[0] + 5
    w = flashinfer.BatchMLAPagedAttentionWrapper(WORKSPACE)
    w.plan(qo, kv, idx, lens, 16, 512, 64, 16, False, 0.04, torch.bfloat16, torch.bfloat16)
    with pytest.raises(OutOfRangeRead, match="^kv_indices: index"):
        w.run(*split(case))


@pytest.mark.parametrize("kwargs,flag", [(dict(backend="cutlass"), "backend")])
def test_wrapper_unmodelled_backend_raises(kwargs, flag):
    with pytest.raises(OutOfContractError, match=f"^{flag}: "):
        flashinfer.BatchMLAPagedAttentionWrapper(WORKSPACE, **kwargs)


def test_wrapper_unmodelled_run_flags_raise():
    case = make_case([20], page_size=16, seed=28)
    with pytest.raises(OutOfContractError, match="^sinks: not modelled"):
        planned(case, causal=False).run(*split(case), sinks=torch.zeros(16))


# --------------------------------------------------------------------------------------------
# trtllm_batch_decode_with_kv_cache_mla
# --------------------------------------------------------------------------------------------


def aligned(table, page_size):
    """cute-dsl wants the table width a multiple of 128 / page_size (entries past a sequence are never read)."""
    pad = -table.shape[1] % max(1, 128 // page_size)
    return torch.cat([table, table[:, -1:].expand(-1, pad)], dim=1)


def trtllm(case, *, backend="trtllm-gen", four_d=False, **kw):
    cache = case.kv_cache.squeeze(2)
    if four_d:
        cache = cache.unsqueeze(1)
    return flashinfer.trtllm_batch_decode_with_kv_cache_mla(
        query=case.q, kv_cache=cache, workspace_buffer=WORKSPACE, qk_nope_head_dim=128, kv_lora_rank=512,
        qk_rope_head_dim=64, block_tables=aligned(case.block_table, cache.shape[-2]), seq_lens=case.cache_seqlens,
        max_seq_len=int(case.cache_seqlens.max()), backend=backend, **kw)


@pytest.mark.parametrize("page_size", [32, 64])
@pytest.mark.parametrize("seqlens,s_q", [([1, 70, 129], 1), ([4, 40, 100], 4)])
def test_trtllm_gen_matches_reference_with_a_base2_lse(page_size, seqlens, s_q):
    case = make_case(seqlens, s_q=s_q, page_size=page_size, seed=30 + s_q)
    out = poisoned((len(seqlens), s_q, 16, 512), torch.bfloat16)
    o, l = trtllm(case, out=out, bmm1_scale=case.softmax_scale, return_lse=True, four_d=page_size == 64)
    assert o is out and l.shape == (len(seqlens) * s_q, 16) and l.dtype == torch.float32
    ref_out, ref_lse = reference(case)
    assert_close("out", o, ref_out, TOL)
    assert_close("lse", l, flat(ref_lse) * LOG2E, LSE_TOL)


def test_trtllm_fp8_folds_scales_into_bmm1_and_bmm2():
    case = make_case([2, 70, 129], s_q=2, page_size=64, kv_dtype="fp8_e4m3", kv_scale=0.5, seed=33)
    q_scale = 0.5
    q_fp8 = (case.q.double() / q_scale).to(torch.float8_e4m3fn)
    assert torch.equal(q_fp8.double() * q_scale, case.q.double())
    fp8_case = type(case)(**{**case.__dict__, "q": q_fp8})
    o = trtllm(fp8_case, bmm1_scale=case.softmax_scale * q_scale * case.kv_scale, bmm2_scale=case.kv_scale)
    assert o.dtype == torch.bfloat16
    assert_close("out", o, reference(case)[0], TOL)
    wrong = trtllm(fp8_case, bmm1_scale=case.softmax_scale * q_scale * case.kv_scale)  # v_scale forgotten
    assert not check_close("out", wrong, reference(case)[0], TOL).ok


def test_trtllm_gen_leaves_empty_rows_unwritten_cute_dsl_zeroes_them():
    case = make_case([0, 70], page_size=64, seed=34)
    o, l = trtllm(case, bmm1_scale=case.softmax_scale, return_lse=True)
    assert torch.isnan(o[0]).all() and torch.isnan(l[0]).all()
    assert_close("out", o[1], reference(case)[0][1], TOL)
    o, l = trtllm(case, backend="cute-dsl", bmm1_scale=case.softmax_scale, return_lse=True)
    assert torch.equal(o[0], torch.zeros_like(o[0])) and torch.isneginf(l[0]).all()
    assert_close("lse", l, flat(reference(case)[1]), LSE_TOL)  # cute-dsl: natural log


def test_trtllm_explicit_lse_base():
    case = make_case([9, 70], page_size=32, seed=35)
    _, l = trtllm(case, bmm1_scale=case.softmax_scale, return_lse=True, return_lse_base="basee")
    assert_close("lse", l, flat(reference(case)[1]), LSE_TOL)
    _, l = trtllm(case, backend="cute-dsl", bmm1_scale=case.softmax_scale, return_lse=True, return_lse_base="base2")
    assert_close("lse", l, flat(reference(case)[1]) * LOG2E, LSE_TOL)


def test_auto_backend_with_an_lse_and_no_base_is_out_of_contract():
    case = make_case([9, 70], page_size=64, seed=36)
    with pytest.raises(OutOfContractError, match="^return_lse_base: backend='auto' with return_lse"):
        trtllm(case, backend="auto", bmm1_scale=case.softmax_scale, return_lse=True)
    out = trtllm(case, backend="auto", bmm1_scale=case.softmax_scale)  # no LSE: either runner gives this
    assert_close("out", out, reference(case)[0], TOL)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("s_q", [1, 3])
def test_cute_dsl_dcp_ranks_merge_to_the_full_attention(world, s_q):
    case = make_case([1, 5, 70, 130], s_q=s_q, page_size=64, seed=40 + world)
    outs, lses = [], []
    for rank in range(world):
        cache, table, lens = rank_cache(case, rank, world, 64)
        table = aligned(table, 64)
        o, l = flashinfer.trtllm_batch_decode_with_kv_cache_mla(
            query=case.q, kv_cache=cache.squeeze(2), workspace_buffer=WORKSPACE, qk_nope_head_dim=128,
            kv_lora_rank=512, qk_rope_head_dim=64, block_tables=table, seq_lens=lens,
            max_seq_len=max(int(lens.max()), 1), bmm1_scale=case.softmax_scale, backend="cute-dsl",
            enable_dcp=True, cp_world=world, cp_rank=rank, causal_seqlens_kv_global=case.cache_seqlens,
            return_lse=True)
        outs.append(o.double())
        lses.append(l.reshape(4, s_q, 16).permute(0, 2, 1))  # natural log, [b, h, s_q]
    merged_out, merged_lse = ref_merge(outs, lses)
    ref_out, ref_lse = reference(case)
    assert_close("merged out", merged_out, ref_out, TOL)
    assert_close("merged lse", merged_lse, ref_lse, LSE_TOL)


def test_dcp_argument_checks_follow_the_library():
    case = make_case([9, 70], page_size=64, seed=44)
    with pytest.raises(ValueError, match="DCP arguments require enable_dcp=True; got cp_world=2"):
        trtllm(case, bmm1_scale=0.04, cp_world=2)
    with pytest.raises(ValueError, match="enable_dcp=True is only supported by backend='cute-dsl'"):
        trtllm(case, bmm1_scale=0.04, enable_dcp=True, cp_world=2, cp_rank=0,
               causal_seqlens_kv_global=case.cache_seqlens, return_lse=True)
    with pytest.raises(ValueError, match="requires return_lse=True"):
        trtllm(case, backend="cute-dsl", bmm1_scale=0.04, enable_dcp=True, cp_world=2, cp_rank=1,
               causal_seqlens_kv_global=case.cache_seqlens)


def test_trtllm_out_of_range_block_table_and_short_max_seq_len_raise():
    case = make_case([9, 70], page_size=32, seed=45)
    table = case.block_table.clone()
    table[1, 1] = 10_000
    with pytest.raises(OutOfRangeRead, match="^block_tables: index 10000"):
        flashinfer.trtllm_batch_decode_with_kv_cache_mla(case.q, case.kv_cache.squeeze(2), WORKSPACE, 128, 512, 64,
                                                         table, case.cache_seqlens, 70, backend="trtllm-gen")
    with pytest.raises(OutOfContractError, match="^max_seq_len: 64 is below"):
        flashinfer.trtllm_batch_decode_with_kv_cache_mla(case.q, case.kv_cache.squeeze(2), WORKSPACE, 128, 512, 64,
                                                         case.block_table, case.cache_seqlens, 64,
                                                         backend="trtllm-gen")


@pytest.mark.parametrize("kwargs,flag", [
    (dict(sinks=[torch.zeros(16)]), "sinks"),
    (dict(skip_softmax_threshold_scale_factor=1.0), "skip_softmax_threshold_scale_factor"),
    (dict(sparse_mla_top_k=64), "sparse_mla_top_k"),
    (dict(uses_shared_paged_kv_idx=False), "uses_shared_paged_kv_idx"),
    (dict(backend="xqa"), "backend"),
])
def test_trtllm_unmodelled_flags_raise_naming_the_flag(kwargs, flag):
    case = make_case([9], page_size=64, seed=46)
    with pytest.raises(OutOfContractError, match=f"^{flag}: "):
        trtllm(case, **{"backend": "trtllm-gen", **kwargs})


def test_sizing_helpers():
    assert flashinfer.get_trtllm_gen_multi_ctas_kv_counter_bytes(3, 16, 148) == 152 * 4  # max(48, 148) -> 152
    assert flashinfer.get_trtllm_gen_multi_ctas_kv_counter_bytes(64, 128, 148) == 8192 * 4
    case = make_case([9, 70], page_size=64, seed=47)
    small = torch.zeros(16, dtype=torch.uint8)
    with pytest.raises(ValueError, match="multi_ctas_kv_counter_buffer is too small"):
        trtllm(case, bmm1_scale=0.04, multi_ctas_kv_counter_buffer=small)
    enough = torch.zeros(flashinfer.get_trtllm_gen_multi_ctas_kv_counter_bytes(
        2, 16, flashinfer.get_device_sm_count(None)), dtype=torch.uint8)
    trtllm(case, bmm1_scale=case.softmax_scale, multi_ctas_kv_counter_buffer=enough)
    assert not math.isnan(flashinfer.get_device_sm_count(None))
