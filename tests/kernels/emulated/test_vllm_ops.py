"""vLLM's MLA-prefill helper ops (context gathers, state merge) and FA3's scheduler, emulated, against plain references.

The gathers are held to what vLLM's own ``test_cp_gather_cache_mla`` /
``test_gather_and_maybe_dequant_cache_mla`` build by hand (rows read through
the block table, fp8 dequantised as ``raw · scale``); the merge to
``reference.ref_merge`` (float64 LSE merge) and the varlen attention to
``ref_mla_decode`` on a case split into a context and new tokens.
"""

from __future__ import annotations

import math

import pytest
import torch

from pytest_mla.kernels.emulated import flash_attn, vllm_ops
from pytest_mla.kernels.emulated.glue import OutOfContractError, OutOfRangeRead
from pytest_mla.kernels.reference import ref_merge

from .cases import TOL, assert_close, dense_rows, make_case, poisoned, reference


def _cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


@pytest.mark.parametrize("page_size", [16, 64])
def test_cp_gather_cache_copies_each_requests_rows_through_the_block_table(page_size):
    case = make_case([0, 5, 70, 129], page_size=page_size, seed=80)
    cache = case.kv_cache.squeeze(2)  # [pages, page_size, 576], NaN past every length
    lens = [0, 5, 70, 129]
    dst = poisoned((sum(lens) + 3, 576), cache.dtype)
    vllm_ops.cp_gather_cache(cache, dst, case.block_table, _cu(lens), len(lens))
    expected = torch.cat([dense_rows(case, i).squeeze(1) for i in range(4)])
    assert torch.equal(dst[:sum(lens)], expected)
    assert torch.isnan(dst[sum(lens):]).all()  # rows past cu_seq_lens[-1] untouched


def test_cp_gather_cache_starts_each_request_at_its_seq_start():
    case = make_case([70, 129], page_size=16, seed=81)
    cache = case.kv_cache.squeeze(2)
    starts = torch.tensor([3, 40], dtype=torch.int32)  # not multiples of the block size
    lens = [60, 50]
    dst = poisoned((sum(lens), 576), cache.dtype)
    vllm_ops.cp_gather_cache(cache, dst, case.block_table, _cu(lens), 2, seq_starts=starts)
    expected = torch.cat([dense_rows(case, 0).squeeze(1)[3:63], dense_rows(case, 1).squeeze(1)[40:90]])
    assert torch.equal(dst, expected)


def test_gather_and_maybe_dequant_cache_dequantises_fp8_by_the_scale():
    case = make_case([5, 70], page_size=16, kv_dtype="fp8_e4m3", kv_scale=0.25, seed=82)
    cache = case.kv_cache.squeeze(2).view(torch.uint8)  # vLLM stores fp8 caches as bytes
    lens = [5, 70]
    dst = poisoned((75, 576), torch.bfloat16)
    token_to_seq = torch.repeat_interleave(torch.arange(2, dtype=torch.int32), torch.tensor(lens))
    vllm_ops.gather_and_maybe_dequant_cache(cache, dst, case.block_table, _cu(lens), token_to_seq, 75, "fp8",
                                            torch.tensor([0.25]))
    raw = torch.cat([dense_rows(case, i).squeeze(1) for i in range(2)])
    assert torch.equal(dst, (raw.to(torch.float64) * 0.25).to(torch.bfloat16))
    with pytest.raises(OutOfContractError, match="^token_to_seq: disagrees"):
        vllm_ops.gather_and_maybe_dequant_cache(cache, dst, case.block_table, _cu(lens), token_to_seq.flip(0), 75,
                                                "fp8", torch.tensor([0.25]))


def test_gathers_refuse_a_block_id_outside_the_cache():
    case = make_case([70], page_size=16, seed=83)
    table = case.block_table.clone()
    table[0, 2] = 10_000
    dst = poisoned((70, 576), case.kv_cache.dtype)
    with pytest.raises(OutOfRangeRead, match="^block_table: index 10000"):
        vllm_ops.cp_gather_cache(case.kv_cache.squeeze(2), dst, table, _cu([70]), 1)


def test_merge_attn_states_is_the_lse_merge_and_counts_plus_inf_as_empty():
    gen = torch.Generator().manual_seed(5)
    outs = [torch.randn(2, 1, 16, 512, generator=gen, dtype=torch.float64) for _ in range(2)]
    lses = [torch.randn(2, 16, 1, generator=gen, dtype=torch.float64) * 3 for _ in range(2)]
    lses[0][0, 3] = -math.inf  # request 0, head 3: the prefix saw nothing
    def tokens(o):  # [b, 1, h, d] -> [tokens, heads, d]
        return o[:, 0].to(torch.bfloat16)

    def heads_first(x):  # [b, h, 1] -> [heads, tokens]
        return x[:, :, 0].T.to(torch.float32)

    _, ref_lse = ref_merge(outs, lses)
    prefix_lse = heads_first(lses[0]).clone()
    prefix_lse[3, 0] = math.inf  # FA2 writes +inf for "nothing attended"; the merge reads it as empty
    out = poisoned((2, 16, 512), torch.bfloat16)
    out_lse = poisoned((16, 2), torch.float32)
    vllm_ops.merge_attn_states(out, tokens(outs[0]), prefix_lse, tokens(outs[1]), heads_first(lses[1]), out_lse)
    expected = ref_merge([tokens(o).to(torch.float64)[:, None] for o in outs], lses)[0][:, 0]
    assert_close("out", out, expected, TOL)
    assert torch.allclose(out_lse.double(), ref_lse[:, :, 0].T, atol=1e-5)


def test_merge_attn_states_copies_the_suffix_past_the_tokens_with_context_and_refuses_two_empty_states():
    suffix = torch.randn(3, 4, 64).to(torch.bfloat16)
    prefix = torch.randn(3, 4, 64).to(torch.bfloat16)
    lse = torch.zeros(4, 3)
    out = poisoned((3, 4, 64), torch.bfloat16)
    vllm_ops.merge_attn_states(out, prefix, lse, suffix, lse, prefill_tokens_with_context=1)
    assert torch.equal(out[1:], suffix[1:])
    empty = torch.full((4, 3), -math.inf)
    with pytest.raises(OutOfContractError, match="^prefix_lse: token 0, head 0: both states are empty"):
        vllm_ops.merge_attn_states(out, prefix, empty, suffix, empty)


def test_varlen_prefill_split_into_context_and_new_tokens_merges_to_full_attention():
    """How vLLM's MLA prefill uses the emulations: causal attention of the new tokens, the context unmasked, merged."""
    s_q = 4
    case = make_case([s_q, 70], s_q=s_q, page_size=16, seed=85)
    ref_out, _ = reference(case)
    rows = [dense_rows(case, i).squeeze(1).to(torch.float64) for i in range(2)]  # [n, 576]
    q = case.q.reshape(2 * s_q, 16, 576)
    new = torch.cat([r[-s_q:] for r in rows]).to(torch.bfloat16)[:, None].expand(-1, 16, -1)
    context = [r[:-s_q] for r in rows]
    ctx = torch.cat(context).to(torch.bfloat16)[:, None].expand(-1, 16, -1)
    cu_q = _cu([s_q, s_q])
    o_new, l_new = flash_attn.flash_attn_varlen_func(q, new, new[..., :512], s_q, cu_q, s_q, cu_seqlens_k=cu_q,
                                                     softmax_scale=case.softmax_scale, causal=True,
                                                     return_softmax_lse=True, fa_version=4)
    o_ctx, l_ctx = flash_attn.flash_attn_varlen_func(q, ctx, ctx[..., :512], s_q, cu_q, 66,
                                                     cu_seqlens_k=_cu([c.shape[0] for c in context]),
                                                     softmax_scale=case.softmax_scale, causal=False,
                                                     return_softmax_lse=True, fa_version=3)
    assert torch.isneginf(l_ctx[:, :s_q]).all()  # request 0 has no context: FA3's empty row
    out = poisoned((2 * s_q, 16, 512), torch.bfloat16)
    vllm_ops.merge_attn_states(out, o_ctx, l_ctx, o_new, l_new)
    assert_close("out", out, ref_out.reshape(2 * s_q, 16, 512), TOL)


def test_varlen_fa4_refuses_context_parallelism_and_fp8():
    q = torch.zeros(2, 4, 64, dtype=torch.bfloat16)
    cu = _cu([2])
    with pytest.raises(OutOfContractError, match="^fa_version: FA4 with context parallelism or fp8"):
        flash_attn.flash_attn_varlen_func(q, q, q, 2, cu, 2, cu_seqlens_k=cu, fa_version=4, cp_world_size=2,
                                          cp_tot_seqused_k=torch.tensor([4], dtype=torch.int32), causal=True)
    with pytest.raises(OutOfContractError, match="^fa_version: 5"):
        flash_attn.flash_attn_varlen_func(q, q, q, 2, cu, 2, cu_seqlens_k=cu, fa_version=5)


def test_get_scheduler_metadata_has_fa3s_size():
    lens = torch.tensor([3, 70, 9], dtype=torch.int32)
    meta = flash_attn.get_scheduler_metadata(3, 1, 70, 16, 1, 64, lens, headdim_v=512, page_size=16, causal=True)
    assert meta.dtype == torch.int32 and meta.numel() == 1 + 4 * 4  # 1 + round_up(3, 4) * 4
    with pytest.raises(OutOfContractError, match="^cache_seqlens: 3 lengths for batch_size 2"):
        flash_attn.get_scheduler_metadata(2, 1, 70, 16, 1, 64, lens)


def test_varlen_fa2_drops_descales_as_vllms_wrapper_does():
    """vLLM's wrapper passes no descales to FA2's varlen_fwd; all three with a schedule raise its NotImplementedError."""
    case = make_case([9, 70], page_size=16, seed=86)
    q = case.q.reshape(2, 16, 576)
    cu_q = _cu([1, 1])
    k, v = case.kv_cache, case.kv_cache[..., :512]
    kwargs = dict(seqused_k=case.cache_seqlens, block_table=case.block_table, softmax_scale=case.softmax_scale,
                  causal=True, fa_version=2)
    plain = flash_attn.flash_attn_varlen_func(q, k, v, 1, cu_q, 70, **kwargs)
    ones = torch.full((2, 1), 2.0)  # would double the scores if it were applied
    dropped = flash_attn.flash_attn_varlen_func(q, k, v, 1, cu_q, 70, q_descale=ones, k_descale=ones,
                                                v_descale=ones, **kwargs)
    assert torch.equal(plain, dropped)
    assert_close("out", plain, reference(case)[0].reshape(2, 16, 512), TOL)
    with pytest.raises(NotImplementedError, match="FA2 does not support scheduler_metadata"):
        flash_attn.flash_attn_varlen_func(q, k, v, 1, cu_q, 70, q_descale=ones, k_descale=ones, v_descale=ones,
                                          scheduler_metadata=torch.zeros(9, dtype=torch.int32), **kwargs)


def test_concat_mla_q_packs_nope_then_rope_into_a_wider_strided_buffer():
    """vLLM's tests/kernels/test_concat_mla_q.py: ``out[..., :512] == ql_nope``, ``out[..., 512:] == q_pe``."""
    g = torch.Generator().manual_seed(21)
    ql_nope = torch.randn(5, 16, 512, generator=g).to(torch.bfloat16)
    q_pe = torch.randn(5, 16, 64, generator=g).to(torch.bfloat16)
    buf = torch.full((8, 64, 576), float("nan"), dtype=torch.bfloat16)  # padded heads, more rows
    out = buf[:5]
    vllm_ops.concat_mla_q(ql_nope, q_pe, out)
    assert torch.equal(out[:, :16, :512], ql_nope) and torch.equal(out[:, :16, 512:], q_pe)
    assert torch.isnan(buf[:, 16:]).all() and torch.isnan(buf[5:]).all()  # the rest untouched
    with pytest.raises(OutOfContractError, match="^ql_nope: "):
        vllm_ops.concat_mla_q(ql_nope[..., :448], q_pe, out)
    with pytest.raises(OutOfContractError, match="^q_out: "):
        vllm_ops.concat_mla_q(ql_nope, q_pe, out.to(torch.float16))
