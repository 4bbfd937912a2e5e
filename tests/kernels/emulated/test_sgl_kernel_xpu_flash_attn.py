"""sgl-kernel-xpu's ``flash_attn_with_kvcache`` (GQA, paged), emulated, against the float64 reference.

Fresh seeded GQA inputs from ``kernels/inputs.py`` (NaN past every length and
in spare pages, a foreign page id past each request's last page), NaN-poisoned
``out`` buffers, and every expectation from ``reference.ref_mla_decode``; the
op's refusals (page sizes, head dims, an fp8 q, per-tensor descales) as
sgl-kernel-xpu's ``TORCH_CHECK`` messages state them.
"""

from __future__ import annotations

import pytest
import torch

from pytest_mla.kernels import emulated
from pytest_mla.kernels.emulated import flash_attn as cuda_fa3
from pytest_mla.kernels.emulated import sgl_kernel_xpu_flash_attn as xpu
from pytest_mla.kernels.emulated.glue import OutOfContractError, OutOfRangeRead
from pytest_mla.kernels.inputs import gen_decode_inputs
from pytest_mla.kernels.reference import ref_mla_decode

from .cases import TOL, assert_close, poisoned

H_Q, H_KV, D = 8, 2, 128  # Llama-3.1-8B's 4 query heads per KV head, its head dim


def gqa_case(seqlens, *, s_q=1, page_size=128, kv_dtype="auto", seed=0, kv_scale=None):
    return gen_decode_inputs(seqlens, s_q=s_q, h_q=H_Q, h_kv=H_KV, d_qk=D, d_v=D, mla=False, page_size=page_size,
                             kv_dtype=kv_dtype, seed=seed, kv_scale=kv_scale)


def reference(case, *, causal=True):
    """``out [b·s_q, H, D]`` float64, bottom-right causal (a single query sees its whole cache either way)."""
    args = case.ref_args()
    args["causal"], args["tree_mask"] = causal, None
    out, _ = ref_mla_decode(**args)
    return out.reshape(-1, H_Q, D)


def ragged(case):
    b, s_q = case.q.shape[:2]
    return case.q.reshape(b * s_q, H_Q, D), torch.arange(0, (b + 1) * s_q, s_q, dtype=torch.int32), s_q


def call(case, **kwargs):
    q, cu, s_q = ragged(case)
    args = dict(q=q, k_cache=case.kv_cache, v_cache=case.v_cache, page_table=case.block_table,
                cache_seqlens=case.cache_seqlens, cu_seqlens_q=cu, max_seqlen_q=s_q, softmax_scale=case.softmax_scale,
                causal=True)
    args.update(kwargs)
    return xpu.flash_attn_with_kvcache(**args)


def test_registered_for_the_xpu_platform_only():
    name = "sgl_kernel.flash_attn:flash_attn_with_kvcache"
    assert emulated.EMULATIONS[name] is cuda_fa3.flash_attn_with_kvcache
    assert emulated.platform_registry("xpu")[name] is xpu.flash_attn_with_kvcache
    assert emulated.platform_registry("cpu")[name] is cuda_fa3.flash_attn_with_kvcache


@pytest.mark.parametrize("page_size", [64, 128])
def test_decode_matches_the_reference_into_a_poisoned_out(page_size):
    case = gqa_case([1, 63, 64, 65, 300], page_size=page_size, seed=page_size)
    out = poisoned((5, H_Q, D), case.q.dtype)
    got = call(case, out=out)
    assert got is out and got.dtype == case.q.dtype
    assert_close("out", got, reference(case), TOL)


def test_batched_q_comes_back_ragged_with_the_default_scale():
    case = gqa_case([10, 200], seed=3)
    got = xpu.flash_attn_with_kvcache(case.q, case.kv_cache, case.v_cache, cache_seqlens=case.cache_seqlens,
                                      page_table=case.block_table, causal=True)
    assert got.shape == (2, H_Q, D)  # [total_q, H, dv], not FA3's [b, s_q, H, dv]
    args = case.ref_args()
    args["softmax_scale"], args["tree_mask"] = D ** -0.5, None
    assert_close("out", got, ref_mla_decode(**args)[0].reshape(-1, H_Q, D), TOL)


@pytest.mark.parametrize("batch", [[150], [150, 9, 300]])
def test_prefill_and_chunkprefill_are_causal_bottom_right(batch):
    case = gqa_case(batch, s_q=4, seed=len(batch))
    assert_close("out", call(case), reference(case), TOL)
    if len(batch) > 1:  # chunkprefill hands back empty LSE placeholders
        out, lse, *_ = call(case, return_softmax_lse=True)
        assert lse.shape == (0,) and lse.dtype == torch.float32
        assert_close("out", out, reference(case), TOL)
    with pytest.raises(OutOfContractError, match="window_size"):
        call(case, causal=False, window_size=(-1, 0))


def test_single_request_prefill_lse_is_not_modelled():
    case = gqa_case([150], s_q=4, seed=2)
    with pytest.raises(OutOfContractError, match="return_softmax_lse"):
        call(case, return_softmax_lse=True)


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_cache_with_per_tensor_descales_and_a_bf16_query(kv_dtype):
    case = gqa_case([70, 260], kv_dtype=kv_dtype, kv_scale="pow2", seed=7)
    scale = torch.tensor(case.kv_scale, dtype=torch.float32)
    per_head = scale.expand(2, H_KV)  # SGLang's k_scale.expand(batch, H_k): one value, stride 0
    assert_close("out", call(case, k_descale=per_head, v_descale=per_head), reference(case), TOL)
    with pytest.raises(RuntimeError, match="^fp8 KV cache decode requires k_descale and v_descale$"):
        call(case)
    with pytest.raises(RuntimeError, match="per-tensor descale"):
        call(case, k_descale=torch.rand(2, H_KV), v_descale=per_head)
    with pytest.raises(RuntimeError, match="^mha_fwd only supports Half and BFloat16, gotFloat8"):
        call(case, q=ragged(case)[0].to(case.kv_cache.dtype), k_descale=per_head, v_descale=per_head)
    with pytest.raises(RuntimeError, match="^fp8 KV cache decode only supports a bf16 query$"):
        call(case, q=ragged(case)[0].to(torch.float16), k_descale=per_head, v_descale=per_head)


def test_the_ops_refusals_name_the_value():
    case = gqa_case([40], page_size=32, seed=4)
    with pytest.raises(RuntimeError, match="^Unsupported page_size for decode attention: 32$"):
        call(case)
    odd = gqa_case([40], seed=5)
    q = ragged(odd)[0][..., :80].contiguous()
    with pytest.raises(RuntimeError, match="^Unsupported head size for paged decode attention: 80$"):
        call(odd, q=q, k_cache=odd.kv_cache[..., :80].contiguous())
    wide = torch.randn(1, 17 * H_KV, D).to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="^Unsupported q_group_size for decode attention: 17$"):
        call(odd, q=wide)
    with pytest.raises(AssertionError):  # the wrapper widens an int length to one entry per page
        call(odd, cache_seqlens=40)


def test_out_of_range_page_and_length_raise():
    case = gqa_case([100, 30], seed=6)
    table = case.block_table.clone()
    table[1, 0] = case.kv_cache.shape[0]
    with pytest.raises(OutOfRangeRead, match="page_table"):
        call(case, page_table=table)
    too_long = case.cache_seqlens.clone()
    too_long[0] = table.shape[1] * 128 + 1
    with pytest.raises(OutOfRangeRead, match="^cache_seqlens: request 0: "):
        call(case, cache_seqlens=too_long)


@pytest.mark.parametrize("kwargs, flag", [({"softcap": 30.0}, "softcap"), ({"sinks": torch.zeros(H_Q)}, "sinks"),
                                          ({"bidirectional_block_ids": torch.zeros(2, dtype=torch.int32)},
                                           "bidirectional_block_ids"),
                                          ({"q_descale": torch.ones(2, H_KV)}, "q_descale"),
                                          ({"window_size": (16, 0)}, "window_size")])
def test_unmodelled_arguments_raise_naming_the_flag(kwargs, flag):
    with pytest.raises(OutOfContractError, match=f"^{flag}"):
        call(gqa_case([100, 30], seed=8), **kwargs)


def test_a_planted_fault_is_seen(monkeypatch):
    """The check these tests make fails on an emulation whose GQA reads the wrong KV head (h % H_k)."""
    case = gqa_case([70, 129], seed=9)
    right = xpu._attend_request

    def wrong_head(q, qv, k, v, **kw):
        return right(q, qv, k.flip(1), v.flip(1), **kw)

    monkeypatch.setattr(xpu, "_attend_request", wrong_head)
    with pytest.raises(AssertionError, match="out"):
        assert_close("out", call(case), reference(case), TOL)
