"""flash-attention's emulations (sgl-kernel FA3 with_kvcache, vLLM varlen FA2/FA3) and sgl-kernel's merge."""

from __future__ import annotations

import math

import pytest
import torch

from pytest_mla.kernels.emulated import flash_attn
from pytest_mla.kernels.emulated.glue import OutOfContractError, OutOfRangeRead
from pytest_mla.kernels.inputs import gen_generator, gen_uniform_values
from pytest_mla.kernels.reference import ref_attend, ref_merge

from .cases import LSE_TOL, TOL, assert_close, make_case, natural_with, poisoned, rank_cache, reference


def mla_split(case):
    """The MLA call's split: q = q_rope, qv = q_nope, k_cache = the rope cache, v_cache = the latent cache."""
    return (case.q[..., 512:], case.q[..., :512], case.kv_cache[..., 512:], case.kv_cache[..., :512])


@pytest.mark.parametrize("page_size", [1, 64])
@pytest.mark.parametrize("seqlens,s_q", [([0, 1, 70, 129], 1), ([2, 4, 70], 4)])
def test_with_kvcache_mla_split_varlen(page_size, seqlens, s_q):
    case = make_case(seqlens, s_q=s_q, page_size=page_size, seed=50 + s_q)
    b = len(seqlens)
    q_rope, q_nope, k_rope, c_kv = mla_split(case)
    cu = torch.arange(b + 1, dtype=torch.int32) * s_q
    out = poisoned((b * s_q, 16, 512), torch.bfloat16)
    o, lse = flash_attn.flash_attn_with_kvcache(
        q=q_rope.reshape(b * s_q, 16, 64), k_cache=k_rope, v_cache=c_kv, qv=q_nope.reshape(b * s_q, 16, 512),
        page_table=case.block_table, cache_seqlens=case.cache_seqlens, cu_seqlens_q=cu,
        cu_seqlens_k_new=cu, max_seqlen_q=s_q, softmax_scale=case.softmax_scale, causal=True,
        return_softmax_lse=True, out=out)
    assert o is out
    ref_out, ref_lse = reference(case)
    assert_close("out", o, ref_out.reshape(b * s_q, 16, 512), TOL)
    assert lse.shape == (16, b * s_q)  # [H, total_q], natural log, -inf where nothing is seen
    assert_close("lse", lse, ref_lse.permute(1, 0, 2).reshape(16, -1), LSE_TOL)


def test_with_kvcache_batched_layout_and_default_scale():
    case = make_case([9, 70], s_q=2, page_size=16, seed=55)
    q_rope, q_nope, k_rope, c_kv = mla_split(case)
    o, lse = flash_attn.flash_attn_with_kvcache(q_rope, k_rope, c_kv, qv=q_nope, page_table=case.block_table,
                                                cache_seqlens=case.cache_seqlens, causal=True,
                                                return_softmax_lse=True)
    ref_out, ref_lse = reference(case)  # the case's scale is 576 ** -0.5 = (64 + 512) ** -0.5, FA3's default with qv
    assert o.shape == (2, 2, 16, 512) and lse.shape == (2, 16, 2)
    assert_close("out", o, ref_out, TOL)
    assert_close("lse", lse, ref_lse, LSE_TOL)


def test_with_kvcache_fp8_descales():
    case = make_case([2, 70, 129], s_q=2, page_size=16, kv_dtype="fp8_e4m3", kv_scale=0.25, seed=56)
    q_rope, q_nope, k_rope, c_kv = mla_split(case)
    descale = torch.full((3, 1), case.kv_scale)
    o = flash_attn.flash_attn_with_kvcache(q_rope.to(torch.float8_e4m3fn), k_rope, c_kv,
                                           qv=q_nope.to(torch.float8_e4m3fn), page_table=case.block_table,
                                           cache_seqlens=case.cache_seqlens, softmax_scale=case.softmax_scale,
                                           causal=True, k_descale=descale, v_descale=descale)
    assert o.dtype == torch.bfloat16
    assert_close("out", o, reference(case)[0], TOL)


def test_cascade_split_merges_to_the_full_attention():
    """Prefix and suffix pages attended separately, merged by merge_state_v2 (SGLang's cascade path)."""
    case = make_case([40, 129], page_size=16, seed=57)
    q_rope, q_nope, k_rope, c_kv = mla_split(case)
    cut = torch.tensor([16, 64], dtype=torch.int32)  # whole pages of the prefix
    o1, l1 = flash_attn.flash_attn_with_kvcache(q_rope, k_rope, c_kv, qv=q_nope, page_table=case.block_table,
                                                cache_seqlens=cut, softmax_scale=case.softmax_scale,
                                                return_softmax_lse=True)
    rest = case.cache_seqlens - cut
    table2 = torch.stack([torch.cat([case.block_table[0, 1:], case.block_table[0, :1]]),
                          torch.cat([case.block_table[1, 4:], case.block_table[1, :4]])])
    o2, l2 = flash_attn.flash_attn_with_kvcache(q_rope, k_rope, c_kv, qv=q_nope, page_table=table2,
                                                cache_seqlens=rest, softmax_scale=case.softmax_scale,
                                                return_softmax_lse=True)
    o, s = flash_attn.merge_state_v2(o1[:, 0], l1[:, :, 0].contiguous(), o2[:, 0], l2[:, :, 0].contiguous())
    ref_out, ref_lse = reference(case)
    assert_close("out", o, ref_out[:, 0], TOL)
    assert_close("lse", s, ref_lse[:, :, 0], LSE_TOL)


def test_merge_treats_any_infinite_lse_as_empty_and_both_empty_as_nan():
    g = gen_generator(58)
    va, vb = gen_uniform_values((3, 2, 8), g).bfloat16(), gen_uniform_values((3, 2, 8), g).bfloat16()
    sa = torch.tensor([[1.0, math.inf], [-math.inf, 0.5], [-math.inf, 2.0]])
    sb = torch.tensor([[0.0, 0.3], [1.5, math.inf], [-math.inf, -1.0]])
    v, s = flash_attn.merge_state_v2(va, sa, vb, sb)
    expected_v, expected_s = ref_merge([va[:, None].double(), vb[:, None].double()],
                                       [torch.where(torch.isinf(x), -math.inf, x)[:, :, None] for x in (sa, sb)])
    both_empty = torch.isinf(sa) & torch.isinf(sb)
    assert torch.isnan(v[2, 0]).all() and torch.isnan(s[2, 0])  # the kernel computes -inf - -inf
    keep = ~both_empty
    assert_close("v", v[keep], expected_v[:, 0][keep], TOL)
    assert_close("s", s[keep], expected_s[:, :, 0][keep], LSE_TOL)
    assert v.dtype == torch.bfloat16 and s.dtype == torch.float32


def test_merge_keeps_the_ops_shape_checks_an_lse_in_head_major_layout_raises():
    """merge_attn_states.cu checks CHECK_EQ(v_a.size(0), s_a.size(0)): an LSE passed as [heads, tokens] is refused."""
    g = gen_generator(61)
    va, vb = gen_uniform_values((5, 2, 8), g).bfloat16(), gen_uniform_values((5, 2, 8), g).bfloat16()
    sa, sb = gen_uniform_values((5, 2), g), gen_uniform_values((5, 2), g)
    with pytest.raises(RuntimeError, match=r"CHECK_EQ\(v_a.size\(0\), s_a.size\(0\)\) failed. 5 vs 2"):
        flash_attn.merge_state_v2(va, sa.T.contiguous(), vb, sb.T.contiguous())
    with pytest.raises(RuntimeError, match="s_a must be a 2D tensor"):
        flash_attn.merge_state_v2(va, sa[..., None], vb, sb[..., None])
    with pytest.raises(RuntimeError, match="CHECK_SHAPE failed"):
        flash_attn.merge_state_v2(va, sa, vb, sb[:4])


def test_varlen_prefill_matches_reference_with_bottom_right_causal():
    """vLLM's MLA prefill: unpaged varlen q/k/v with cu_seqlens, d_qk 192 and d_v 128, causal bottom-right."""
    g = gen_generator(59)
    q_lens, k_lens = [3, 1, 5], [3, 7, 9]  # request 1 and 2: queries at the end of longer contexts
    q = gen_uniform_values((sum(q_lens), 8, 192), g).bfloat16()
    k = gen_uniform_values((sum(k_lens), 2, 192), g).bfloat16()
    v = gen_uniform_values((sum(k_lens), 2, 128), g).bfloat16()
    cu_q = torch.tensor([0, 3, 4, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 3, 10, 19], dtype=torch.int32)
    for fa_version, empty in ((3, -math.inf), (2, math.inf)):
        o, lse = flash_attn.flash_attn_varlen_func(q, k, v, max_seqlen_q=5, cu_seqlens_q=cu_q, max_seqlen_k=9,
                                                   cu_seqlens_k=cu_k, softmax_scale=0.3, causal=True,
                                                   return_softmax_lse=True, fa_version=fa_version)
        for i in range(3):
            rq, rk = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
            n = k_lens[i]
            ro, rl = ref_attend(q[rq].double(), k[rk].double(), v[rk].double(), torch.arange(n), n, 0.3, True)
            assert_close(f"out[{i}]", o[rq], ro, TOL)
            assert_close(f"lse[{i}]", lse[:, rq], natural_with(rl, empty), LSE_TOL)


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("s_q", [1, 3])
def test_varlen_paged_mla_decode_with_context_parallelism(world, s_q):
    """vLLM's FLASH_ATTN_MLA decode: q = q_pe, k = rope cache, v = latent, q_v = q_nope; DCP via cp_* arguments."""
    case = make_case([1, 5, 70, 130], s_q=s_q, page_size=16, seed=60 + world)
    b = 4
    cu = torch.arange(b + 1, dtype=torch.int32) * s_q
    outs, lses = [], []
    for rank in range(world):
        cache, table, lens = rank_cache(case, rank, world, 16) if world > 1 else (
            case.kv_cache, case.block_table, case.cache_seqlens)
        kw = dict(cp_world_size=world, cp_rank=rank, cp_tot_seqused_k=case.cache_seqlens) if world > 1 else {}
        o, lse = flash_attn.flash_attn_varlen_func(
            q=case.q[..., 512:].reshape(b * s_q, 16, 64), k=cache[..., 512:], v=cache[..., :512],
            q_v=case.q[..., :512].reshape(b * s_q, 16, 512), max_seqlen_q=s_q, cu_seqlens_q=cu,
            max_seqlen_k=int(lens.max()), seqused_k=lens, block_table=table, softmax_scale=case.softmax_scale,
            causal=True, return_softmax_lse=True, fa_version=3, **kw)
        outs.append(o.double().reshape(b, s_q, 16, 512))
        lses.append(lse.reshape(16, b, s_q).permute(1, 0, 2))
    merged_out, merged_lse = ref_merge(outs, lses)
    ref_out, ref_lse = reference(case)
    assert_close("out", merged_out, ref_out, TOL)
    assert_close("lse", merged_lse, ref_lse, LSE_TOL)


def test_out_of_range_page_raises():
    case = make_case([20, 40], page_size=16, seed=64)
    table = case.block_table.clone()
    table[0, 1] = 999
    q_rope, q_nope, k_rope, c_kv = mla_split(case)
    with pytest.raises(OutOfRangeRead, match="^page_table: index 999"):
        flash_attn.flash_attn_with_kvcache(q_rope, k_rope, c_kv, qv=q_nope, page_table=table,
                                           cache_seqlens=case.cache_seqlens)


@pytest.mark.parametrize("kwargs,flag", [
    (dict(softcap=30.0), "softcap"),
    (dict(k=torch.zeros(1)), "k"),
    (dict(rotary_cos=torch.zeros(1)), "rotary_cos"),
    (dict(ver=4), "ver"),
    (dict(page_table=None), "page_table"),
])
def test_with_kvcache_unmodelled_flags_raise_naming_the_flag(kwargs, flag):
    case = make_case([20], page_size=16, seed=65)
    q_rope, q_nope, k_rope, c_kv = mla_split(case)
    args = dict(q=q_rope, k_cache=k_rope, v_cache=c_kv, qv=q_nope, page_table=case.block_table,
                cache_seqlens=case.cache_seqlens)
    args.update(kwargs)
    with pytest.raises(OutOfContractError, match=f"^{flag}: "):
        flash_attn.flash_attn_with_kvcache(**args)


def test_varlen_library_assertions_and_fa2_limits():
    q = torch.zeros(2, 4, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(AssertionError, match="cu_seqlens_k or seqused_k must be provided"):
        flash_attn.flash_attn_varlen_func(q, q, q, 2, cu, 2)
    with pytest.raises(OutOfContractError, match="^fa_version: FA2 takes no q_v"):
        flash_attn.flash_attn_varlen_func(q, q, q, 2, cu, 2, cu_seqlens_k=cu, q_v=q, fa_version=2)
    with pytest.raises(RuntimeError, match="cp_tot_seqused_k_ must be provided"):
        flash_attn.flash_attn_varlen_func(q, q, q, 2, cu, 2, cu_seqlens_k=cu, cp_world_size=2, cp_rank=1)
