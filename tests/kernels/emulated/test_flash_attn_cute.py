"""FlashAttention-4's CuTe interface (SGLang's vendored copy), emulated: layouts, the qv LSE layout, the asserts kept."""

from __future__ import annotations

import math

import pytest
import torch

from pytest_mla.kernels.emulated import flash_attn_cute as fa4
from pytest_mla.kernels.emulated.glue import OutOfContractError, OutOfRangeRead
from pytest_mla.kernels.inputs import gen_generator, gen_uniform_values
from pytest_mla.kernels.reference import ref_attend

from .cases import LSE_TOL, TOL, assert_close, make_case, natural_with, poisoned, reference


@pytest.fixture
def arch(monkeypatch):
    """The stated GPU, as the interface's ``_get_device_arch`` reads it (``FLASH_ATTENTION_ARCH``)."""
    def stated(value):
        monkeypatch.setenv("FLASH_ATTENTION_ARCH", value)
    stated("sm_100")
    return stated


def mla_split(case):
    return (case.q[..., 512:], case.q[..., :512], case.kv_cache[..., 512:], case.kv_cache[..., :512])


@pytest.mark.parametrize("page_size", [1, 64])
@pytest.mark.parametrize("seqlens,s_q", [([0, 1, 70, 129], 1), ([2, 4, 70], 4)])
def test_mla_paged_varlen_decode_and_its_token_major_lse(arch, page_size, seqlens, s_q):
    """q = q_rope, k = the rope cache, v = the latent cache, qv = q_nope; with qv the LSE is (total_q, H)."""
    case = make_case(seqlens, s_q=s_q, page_size=page_size, seed=70 + s_q)
    b = len(seqlens)
    q_rope, q_nope, k_rope, c_kv = mla_split(case)
    cu = torch.arange(b + 1, dtype=torch.int32) * s_q
    out = poisoned((b * s_q, 16, 512), torch.bfloat16)
    o, lse = fa4.flash_attn_varlen_func(q_rope.reshape(b * s_q, 16, 64), k_rope, c_kv,
                                        qv=q_nope.reshape(b * s_q, 16, 512), cu_seqlens_q=cu,
                                        seqused_k=case.cache_seqlens, page_table=case.block_table,
                                        softmax_scale=case.softmax_scale, causal=True, return_lse=True, out=out)
    assert o is out
    ref_out, ref_lse = reference(case)
    assert_close("out", o, ref_out.reshape(b * s_q, 16, 512), TOL)
    assert lse.shape == (b * s_q, 16)  # token-major with qv, natural log, -inf where nothing is seen
    assert_close("lse", lse, ref_lse.permute(0, 2, 1).reshape(-1, 16), LSE_TOL)


def test_batched_layout_default_scale_and_no_lse_unless_asked(arch):
    case = make_case([9, 70], s_q=2, page_size=16, seed=75)
    q_rope, q_nope, k_rope, c_kv = mla_split(case)
    o, lse = fa4.flash_attn_varlen_func(q_rope, k_rope, c_kv, qv=q_nope, seqused_k=case.cache_seqlens,
                                        page_table=case.block_table, causal=True)
    assert lse is None and o.shape == (2, 2, 16, 512)
    assert_close("out", o, reference(case)[0], TOL)  # the case's scale is (64 + 512) ** -0.5, the default with qv
    _, lse = fa4.flash_attn_varlen_func(q_rope, k_rope, c_kv, qv=q_nope, seqused_k=case.cache_seqlens,
                                        page_table=case.block_table, causal=True, return_lse=True)
    assert lse.shape == (2, 2, 16)  # (b, s_q, H) with qv
    assert_close("lse", lse, reference(case)[1].transpose(1, 2), LSE_TOL)


def test_one_tensor_for_k_and_v_drops_q_the_scores_are_qv_times_v(arch):
    """``k is v`` with dv 512: FlashAttnVarlenFunc.forward sets q = k = None (qv = q when qv is missing)."""
    case = make_case([5, 33], page_size=16, seed=76)
    c_kv = case.kv_cache[..., :512].contiguous()
    q_nope = case.q[..., :512].contiguous()
    o, lse = fa4.flash_attn_varlen_func(q_nope, c_kv, c_kv, seqused_k=case.cache_seqlens,
                                        page_table=case.block_table, softmax_scale=0.05, return_lse=True)
    for i, n in enumerate(case.cache_seqlens.tolist()):
        rows = case.kv_cache[case.block_table[i, : -(-n // 16)].long()].reshape(-1, 1, 576)[:n, :, :512]
        ro, rl = ref_attend(q_nope[i].double(), rows.double(), rows.double(), torch.arange(n), n, 0.05, False)
        assert_close(f"out[{i}]", o[i], ro, TOL)
        assert_close(f"lse[{i}]", lse[i], rl.transpose(0, 1), LSE_TOL)  # (b, s_q, H): qv is set


def test_gqa_varlen_unpaged_causal_head_major_lse(arch):
    """Without qv: GQA grouping, bottom-right causal on unpaged varlen k/v, LSE (H, total_q)."""
    g = gen_generator(77)
    q_lens, k_lens = [3, 1, 5], [3, 7, 9]
    q = gen_uniform_values((sum(q_lens), 8, 128), g).bfloat16()
    k = gen_uniform_values((sum(k_lens), 2, 128), g).bfloat16()
    v = gen_uniform_values((sum(k_lens), 2, 128), g).bfloat16()
    cu_q = torch.tensor([0, 3, 4, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 3, 10, 19], dtype=torch.int32)
    o, lse = fa4.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, softmax_scale=0.3,
                                        causal=True, return_lse=True)
    assert lse.shape == (8, 9)
    for i in range(3):
        rq, rk = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        n = k_lens[i]
        kk, vv = (t[rk].double().repeat_interleave(4, dim=1) for t in (k, v))
        ro, rl = ref_attend(q[rq].double(), kk, vv, torch.arange(n), n, 0.3, True)
        assert_close(f"out[{i}]", o[rq], ro, TOL)
        assert_close(f"lse[{i}]", lse[:, rq], natural_with(rl, -math.inf), LSE_TOL)


def test_fp8_descales_on_sm100_only(arch):
    """fp8 q/k/v read as x · descale per (request, KV head), bf16 out; other archs refused as the interface does."""
    g = gen_generator(78)
    q = (gen_uniform_values((2, 1, 8, 128), g) * 4).to(torch.float8_e4m3fn)
    k = (gen_uniform_values((2, 20, 2, 128), g) * 4).to(torch.float8_e4m3fn)
    v = (gen_uniform_values((2, 20, 2, 128), g) * 4).to(torch.float8_e4m3fn)
    qd, kd, vd = (torch.tensor([[0.5, 0.25], [2.0, 1.0]]) * s for s in (1.0, 0.5, 0.25))
    lens = torch.tensor([20, 11], dtype=torch.int32)
    o, _ = fa4.flash_attn_varlen_func(q, k, v, seqused_k=lens, softmax_scale=0.1, q_descale=qd, k_descale=kd,
                                      v_descale=vd)
    assert o.dtype == torch.bfloat16
    for i, n in enumerate(lens.tolist()):
        group = lambda t: t.repeat_interleave(4)[None, :, None]  # noqa: E731  (per KV head -> per query head)
        qq = q[i].double() * group(qd[i])
        kk = k[i, :n].double().repeat_interleave(4, dim=1) * group(kd[i])
        vv = v[i, :n].double().repeat_interleave(4, dim=1) * group(vd[i])
        ro, _ = ref_attend(qq, kk, vv, torch.arange(n), n, 0.1, False)
        assert_close(f"out[{i}]", o[i], ro, TOL)
    arch("sm_90")
    with pytest.raises(AssertionError, match="FP8 is only supported on SM100"):
        fa4.flash_attn_varlen_func(q, k, v, seqused_k=lens, q_descale=qd, k_descale=kd, v_descale=vd)


@pytest.mark.parametrize("stated,message", [
    ("sm_90", r"\(head_dim, head_dim_v\)=\(64, 512\) is not supported on SM90"),  # head dims are checked first
    ("sm_80", "only support Blackwell arch with qv")])
def test_mla_with_qv_is_blackwell_only(arch, stated, message):
    case = make_case([9], page_size=16, seed=79)
    q_rope, q_nope, k_rope, c_kv = mla_split(case)
    arch(stated)
    with pytest.raises(AssertionError, match=message):
        fa4.flash_attn_varlen_func(q_rope, k_rope, c_kv, qv=q_nope, seqused_k=case.cache_seqlens,
                                   page_table=case.block_table, causal=True)


def test_the_interfaces_other_asserts_are_kept(arch):
    case = make_case([9], page_size=16, seed=80)
    q_rope, q_nope, k_rope, c_kv = mla_split(case)
    kw = dict(seqused_k=case.cache_seqlens, page_table=case.block_table)
    fp8 = lambda t: t.to(torch.float8_e4m3fn)  # noqa: E731
    with pytest.raises(AssertionError, match="not yet supported with qv"):
        fa4.flash_attn_varlen_func(fp8(q_rope), fp8(k_rope), fp8(c_kv), qv=fp8(q_nope),
                                   k_descale=torch.ones(1, 1), **kw)
    with pytest.raises(AssertionError, match="page_table must be int32"):
        fa4.flash_attn_varlen_func(q_rope, k_rope, c_kv, qv=q_nope, seqused_k=case.cache_seqlens,
                                   page_table=case.block_table.long())
    with pytest.raises(AssertionError, match="only supported for FP8 inputs"):
        fa4.flash_attn_varlen_func(q_rope, k_rope, c_kv, qv=q_nope, q_descale=torch.ones(1, 1), **kw)
    with pytest.raises(AssertionError, match="local not yet supported with qv"):
        fa4.flash_attn_varlen_func(q_rope, k_rope, c_kv, qv=q_nope, window_size=(4, 0), **kw)
    with pytest.raises(AssertionError, match=r"\(head_dim, head_dim_v\)=\(576, 512\) is not supported on SM100"):
        fa4.flash_attn_varlen_func(case.q, case.kv_cache, c_kv, **kw)
    # A bare assert of the library (the paged K shape) raises with no message, as it does on a GPU:
    # never pytest's rewritten explanation, which changes with -v and $CI (a report must not).
    with pytest.raises(AssertionError) as raised:
        fa4.flash_attn_varlen_func(q_rope, k_rope[..., :32], c_kv, qv=q_nope, **kw)
    assert str(raised.value) == ""


@pytest.mark.parametrize("flag", ["learnable_sink", "score_mod", "mask_mod", "gather_kv_indices", "sfq", "seqused_q"])
def test_unmodelled_flags_raise_naming_the_flag(arch, flag):
    case = make_case([9], page_size=16, seed=81)
    q_rope, q_nope, k_rope, c_kv = mla_split(case)
    with pytest.raises(OutOfContractError, match=f"^{flag}: not modelled"):
        fa4.flash_attn_varlen_func(q_rope, k_rope, c_kv, qv=q_nope, seqused_k=case.cache_seqlens,
                                   page_table=case.block_table, **{flag: object()})


def test_out_of_range_page_raises(arch):
    case = make_case([40], page_size=16, seed=82)
    q_rope, q_nope, k_rope, c_kv = mla_split(case)
    table = case.block_table.clone()
    table[0, 1] = k_rope.shape[0]  # one past the cache
    with pytest.raises(OutOfRangeRead, match="page_table"):
        fa4.flash_attn_varlen_func(q_rope, k_rope, c_kv, qv=q_nope, seqused_k=case.cache_seqlens, page_table=table)
