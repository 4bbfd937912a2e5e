"""vLLM's AMX_MLA ops (the sgl-kernels of a CPU build of ``vllm._C``), emulated, against the reference.

The decode and extend cases are what ``AMXMLAImpl`` hands the ops: the paged
latent cache flattened to ``[slots, 1, 576]`` rows, the value the same rows'
first 512 entries, ``req_to_token`` the per-token row of each request
(``block_table * page + offset``), NaN past every length and a poisoned
output; the expectation is ``ref_mla_decode`` (causal bottom-right for the
new tokens of a verify step). The packing and the batched matmul are held
against plain float64 matrix products.
"""

from __future__ import annotations

import math

import pytest
import torch

from pytest_mla.kernels.emulated import EMULATIONS, vllm_cpu_amx as ops
from pytest_mla.kernels.emulated.glue import OutOfContractError, OutOfRangeRead

from .cases import assert_close, make_case, poisoned, reference

D_V = 512


def flat_rows(case):
    """``(k_buffer [slots, 1, 576], req_to_token [b, pages * page] int64)``: the cache as the AMX kernels address it."""
    pages, ps = case.kv_cache.shape[:2]
    buffer = case.kv_cache.reshape(pages * ps, 1, -1).contiguous()
    table = case.block_table.clamp(0, pages - 1).long()  # entries past the last page are never read
    req_to_token = (table[:, :, None] * ps + torch.arange(ps)).reshape(table.shape[0], -1)
    return buffer, req_to_token


def decode(case, **changes):
    b, _, h, _ = case.q.shape
    buffer, req_to_token = flat_rows(case)
    args = {"query": case.q[:, 0].contiguous(), "k_buffer": buffer, "v_buffer": buffer[..., :D_V],
            "output": poisoned((b, h, D_V), case.q.dtype), "key": None, "value": None, "loc": None,
            "attn_logits": torch.zeros(b, h, 4, D_V + 1), "req_to_token": req_to_token,
            "req_pool_indices": torch.arange(b), "seq_lens": case.cache_seqlens.long(),
            "sm_scale": case.softmax_scale, "logit_cap": 0.0, "is_cross_attn": False, "sliding_window_size": 0,
            "encoder_lens": None, "sinks": None}
    args.update(changes)
    ops.decode_attention_cpu(**args)
    return args["output"]


@pytest.mark.parametrize("page_size", [32, 64])
def test_decode_matches_the_reference_over_a_shuffled_paged_cache(page_size):
    case = make_case([1, 40, 100, 129], page_size=page_size, seed=80)
    assert_close("out", decode(case), reference(case)[0][:, 0])


def test_decode_scale_is_the_softmax_scale():
    case = make_case([60, 90], page_size=32, seed=81)
    wrong = decode(case, sm_scale=case.softmax_scale * 1.05)
    assert not torch.allclose(wrong.float(), reference(case)[0][:, 0].float(), atol=1e-3, rtol=1.5e-2)


def test_decode_reads_the_rows_req_to_token_names():
    case = make_case([70, 90], page_size=32, seed=82)
    buffer, req_to_token = flat_rows(case)
    out = decode(case, req_to_token=(req_to_token + 1) % buffer.shape[0])  # every token one row further
    assert not torch.allclose(torch.nan_to_num(out.float(), nan=1e3), reference(case)[0][:, 0].float(), atol=0.05)


def test_decode_rows_outside_the_buffer_fail_the_kernels_own_check_or_raise():
    case = make_case([40], page_size=32, seed=83)
    buffer, req_to_token = flat_rows(case)
    high = req_to_token.clone()
    high[0, 5] = buffer.shape[0]
    with pytest.raises(RuntimeError, match="token index out of scope!"):
        decode(case, req_to_token=high)
    low = req_to_token.clone()
    low[0, 5] = -1
    with pytest.raises(OutOfRangeRead, match=r"^req_to_token: index -1 at 5"):
        decode(case, req_to_token=low)


@pytest.mark.parametrize("change, flag", [
    ({"logit_cap": 30.0}, "logit_cap"),
    ({"sinks": torch.zeros(16)}, "sinks"),
    ({"sliding_window_size": 8}, "sliding_window_size"),
    ({"seq_lens": torch.tensor([0], dtype=torch.int64)}, "seq_lens"),
])
def test_decode_refuses_what_it_does_not_model_in_one_line(change, flag):
    case = make_case([20], page_size=32, seed=84)
    with pytest.raises(OutOfContractError) as info:
        decode(case, **change)
    assert str(info.value).startswith(f"{flag}: ") and "\n" not in str(info.value)


def test_decode_takes_only_the_mla_branch():
    case = make_case([20], page_size=32, seed=85)
    buffer, _ = flat_rows(case)
    with pytest.raises(OutOfContractError, match=r"^k_buffer: only the op's MLA branch"):
        decode(case, v_buffer=buffer[..., :D_V].clone())  # another buffer: the op's GQA branch


def extend(case, *, poison_new_in_cache=True, **changes):
    """The verify step of ``case``: the last ``s_q`` tokens of each request are new (k_extend), the rest cached."""
    b, s_q, h, d = case.q.shape
    buffer, req_to_token = flat_rows(case)
    buffer = buffer.clone()
    news = []
    for i, n in enumerate(int(x) for x in case.cache_seqlens):
        rows = req_to_token[i, n - s_q:n]
        news.append(buffer[rows].clone())
        if poison_new_in_cache:  # the kernel must take the new tokens from k_extend
            buffer[rows] = math.nan
    k_extend = torch.cat(news)
    args = {"q_extend": case.q.reshape(b * s_q, h, d), "k_extend": k_extend, "v_extend": k_extend[..., :D_V],
            "o_extend": poisoned((b * s_q, h, D_V), case.q.dtype), "k_buffer": buffer,
            "v_buffer": buffer[..., :D_V], "req_to_token": req_to_token, "req_pool_indices": torch.arange(b),
            "seq_lens": case.cache_seqlens.long(), "extend_seq_lens": torch.full((b,), s_q, dtype=torch.int64),
            "extend_start_loc": torch.arange(0, b * s_q, s_q), "max_len_extend": s_q,
            "sm_scale": case.softmax_scale, "logit_cap": 0.0, "is_cross_attn": False, "sliding_window_size": 0,
            "encoder_lens": None, "sinks": None, "tree_mask": None}
    args.update(changes)
    ops.extend_attention_cpu(**args)
    return args["o_extend"]


def test_extend_matches_the_reference_causal_over_the_new_tokens():
    case = make_case([4, 37, 100], s_q=4, page_size=32, seed=86)
    ref = reference(case)[0]
    assert_close("out", extend(case), ref.reshape(-1, *ref.shape[2:]))


def test_extend_is_causal_within_the_new_tokens():
    case = make_case([30, 50], s_q=4, page_size=32, seed=87)
    out = extend(case)
    ref = reference(case, causal=False)[0]
    assert not torch.allclose(out.float(), ref.reshape(-1, *ref.shape[2:]).float(), atol=1e-2)


def test_extend_with_fewer_tiled_rows_than_new_tokens_is_the_callers_bug():
    case = make_case([30], s_q=4, page_size=32, seed=88)
    with pytest.raises(OutOfRangeRead, match=r"^max_len_extend: "):
        extend(case, max_len_extend=3)


def test_extend_keeps_the_ops_prefix_check():
    case = make_case([30], s_q=4, page_size=32, seed=89)
    with pytest.raises(RuntimeError, match="prefix len < 0!"):
        extend(case, extend_seq_lens=torch.tensor([31]), max_len_extend=31)


def test_packing_puts_each_pair_where_the_kernel_reads_it():
    oc, ic = 48, 64  # one full block of 32 rows, one of 16
    weight = torch.zeros(oc, ic, dtype=torch.bfloat16)
    weight[35, 9] = 1.0  # row 35 = block 32 (16 rows), j = 3; column 9 = pair k 4, lane 1
    packed = ops.convert_weight_packed(weight)
    assert packed.shape == weight.shape and packed.dtype == weight.dtype
    assert packed.reshape(-1).nonzero().flatten().tolist() == [32 * ic + (4 * 16 + 3) * 2 + 1]


@pytest.mark.parametrize("vnni", [True, False])
def test_bmm_multiplies_by_the_transposed_weight(vnni):
    g = torch.Generator().manual_seed(90)
    mat1 = torch.randn(3, 5, 64, generator=g).to(torch.bfloat16)
    weight = torch.randn(3, 96, 64, generator=g).to(torch.bfloat16)
    out = poisoned((3, 5, 96), torch.bfloat16)
    ops.bmm_cpu(out, mat1, ops.convert_weight_packed(weight) if vnni else weight, vnni)
    expected = torch.einsum("bmk,bnk->bmn", mat1.double(), weight.double())
    assert_close("out", out, expected)


def test_bmm_of_a_packed_weight_read_as_plain_is_wrong():
    g = torch.Generator().manual_seed(91)
    mat1 = torch.randn(2, 4, 64, generator=g).to(torch.bfloat16)
    weight = torch.randn(2, 64, 64, generator=g).to(torch.bfloat16)
    out = poisoned((2, 4, 64), torch.bfloat16)
    ops.bmm_cpu(out, mat1, ops.convert_weight_packed(weight), False)
    assert not torch.allclose(out.double(), torch.einsum("bmk,bnk->bmn", mat1.double(), weight.double()), atol=0.1)


def test_bmm_keeps_the_ops_checks_and_refuses_fp8():
    mat1 = torch.zeros(1, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="tinygemm requires N to be 32x."):
        ops.bmm_cpu(torch.zeros(1, 2, 48, dtype=torch.bfloat16), mat1, torch.zeros(1, 48, 64, dtype=torch.bfloat16),
                    False)
    with pytest.raises(OutOfContractError, match=r"^scale: "):
        ops.bmm_cpu(torch.zeros(1, 2, 64, dtype=torch.bfloat16), mat1, torch.zeros(1, 64, 64, dtype=torch.bfloat16),
                    True, torch.tensor(1.0))


def test_registered_under_the_ops_vllm_calls():
    for name in ("convert_weight_packed", "bmm_cpu", "decode_attention_cpu", "extend_attention_cpu"):
        assert EMULATIONS[f"torch.ops._C:{name}"] is getattr(ops, name)
