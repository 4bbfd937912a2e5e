"""FlashMLA's sparse attention emulation (vLLM's ``sparse_prefill_fwd`` / ``sparse_decode_fwd`` ops).

Every expectation is computed here, in float64, from the library's stated
contract (tests/ref.py's definitions; tests/quant.py's V3.2 quantisation),
never through the emulation's own helpers. Caches carry NaN in every row no
valid index selects, outputs start NaN-poisoned.
"""

from __future__ import annotations

import math

import pytest
import torch

from pytest_mla.kernels.emulated import emulation_for, flashmla_sparse
from pytest_mla.kernels.emulated.glue import OutOfContractError, OutOfRangeRead

from .cases import LSE_TOL, TOL, assert_close, poisoned

D_QK, D_V = 576, 512
INVALID = [-1, -2147483648, -123456]  # prefill: any negative, or any value >= s_kv, is invalid


def expected(q, keys_per_row, scale, sink=None):
    """Float64 attention of each query row over its own selected keys (tests/ref.py's conventions).

    ``q [rows, h, d]`` float64, ``keys_per_row``: a list of ``[n_i, d]`` float64. Returns
    ``(out [rows, h, 512], max_logits [rows, h], lse [rows, h])``; a row with no key: out 0,
    max_logits -inf, lse +inf.
    """
    rows, h, _ = q.shape
    out = torch.zeros(rows, h, D_V, dtype=torch.float64)
    mx = torch.full((rows, h), -math.inf, dtype=torch.float64)
    lse = torch.full((rows, h), math.inf, dtype=torch.float64)
    for r, keys in enumerate(keys_per_row):
        if keys.shape[0] == 0:
            continue
        logits = torch.einsum("hd,nd->hn", q[r], keys) * scale
        probs = torch.softmax(logits, dim=-1)
        o = probs @ keys[:, :D_V]
        lse[r] = torch.log(torch.exp(logits - logits.max(-1, keepdim=True).values).sum(-1)) + logits.max(-1).values
        mx[r] = logits.max(-1).values
        if sink is not None:
            o = o * (torch.exp(lse[r]) / (torch.exp(lse[r]) + torch.exp(sink)))[:, None]
        out[r] = o
    return out, mx, lse


# --------------------------------------------------------------------------------------------
# Prefill (flat bf16 KV)
# --------------------------------------------------------------------------------------------


def prefill_case(s_q=6, s_kv=50, h_q=64, topk=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(s_q, h_q, D_QK, generator=g).to(torch.bfloat16)
    kv = torch.randn(s_kv, 1, D_QK, generator=g).to(torch.bfloat16)
    idx = torch.empty(s_q, topk, dtype=torch.int64)
    for i in range(s_q):
        n_valid = int(torch.randint(1, topk, (1,), generator=g))
        valid = torch.randperm(s_kv, generator=g)[:n_valid]
        bad = torch.tensor([INVALID[j % 3] if j % 2 else s_kv + j for j in range(topk - n_valid)], dtype=torch.int64)
        row = torch.cat([valid, bad])
        idx[i] = row[torch.randperm(topk, generator=g)]
    idx[s_q - 1] = -1  # one query selects nothing
    used = torch.zeros(s_kv, dtype=torch.bool)
    sel = idx[(idx >= 0) & (idx < s_kv)]
    used[sel] = True
    kv[~used] = math.nan  # rows nobody selects are poison
    return q, kv, idx.to(torch.int32).view(s_q, 1, topk)


def prefill_expected(q, kv, indices, scale, topk_length=None, sink=None):
    q64, kv64 = q.double(), kv.double()[:, 0]
    keys = []
    for i in range(q.shape[0]):
        row = indices[i, 0].long()
        n = row.numel() if topk_length is None else int(topk_length[i])
        row = row[:n]
        keys.append(kv64[row[(row >= 0) & (row < kv.shape[0])]])
    return expected(q64, keys, scale, sink)


@pytest.mark.parametrize("h_q", [64, 128, 16])
def test_prefill_matches_float64_and_treats_negative_and_past_end_as_invalid(h_q):
    q, kv, indices = prefill_case(h_q=h_q, seed=h_q)
    scale = 0.0625 * 1.3
    out_buf = poisoned((q.shape[0], h_q, D_V), torch.bfloat16)
    out, max_logits, lse = flashmla_sparse.sparse_prefill_fwd(q, kv, indices, scale, 512, None, None, out_buf)
    ref_out, ref_mx, ref_lse = prefill_expected(q, kv, indices, scale)
    assert out is out_buf and out.dtype == torch.bfloat16 and lse.dtype == max_logits.dtype == torch.float32
    assert lse.shape == max_logits.shape == (q.shape[0], h_q)
    assert_close("out", out, ref_out, TOL)
    assert_close("lse", lse, ref_lse, LSE_TOL)  # natural log
    assert_close("max_logits", max_logits, ref_mx, LSE_TOL)
    # the query that selects nothing: out 0, lse +inf, max_logits -inf
    assert torch.equal(out[-1].float(), torch.zeros(h_q, D_V))
    assert torch.isposinf(lse[-1]).all() and torch.isneginf(max_logits[-1]).all()


def test_prefill_lse_is_natural_not_base_2():
    """One key: lse equals its scaled score (natural); the README's base-2 form would be score·log2(e)."""
    q, kv, _ = prefill_case(s_q=1, s_kv=4, seed=5)
    kv = torch.randn(4, 1, D_QK).to(torch.bfloat16)
    indices = torch.tensor([[[2, -1, -1]]], dtype=torch.int32)
    _, mx, lse = flashmla_sparse.sparse_prefill_fwd(q, kv, indices, 0.1)
    score = (q[0].double() @ kv[2, 0].double()) * 0.1
    assert torch.allclose(lse[0].double(), score, rtol=1e-5, atol=1e-4)
    assert torch.allclose(mx[0].double(), score, rtol=1e-5, atol=1e-4)


def test_prefill_topk_length_and_attn_sink():
    q, kv, indices = prefill_case(s_q=5, seed=9)
    g = torch.Generator().manual_seed(3)
    topk_length = torch.randint(0, indices.shape[-1] + 1, (5,), generator=g, dtype=torch.int32)
    topk_length[0] = 0
    # a valid index past topk_length must not be read: point it at a NaN row
    nan_row = int(torch.isnan(kv[:, 0, 0]).nonzero()[0])
    indices[1, 0, int(topk_length[1]):] = nan_row
    sink = torch.randn(q.shape[1], generator=g, dtype=torch.float32)
    sink[0], sink[1] = math.inf, -math.inf
    out, mx, lse = flashmla_sparse.sparse_prefill_fwd(q, kv, indices, 0.07, 512, sink, topk_length)
    ref_out, ref_mx, ref_lse = prefill_expected(q, kv, indices, 0.07, topk_length, sink.double())
    assert_close("out", out, ref_out, TOL)
    assert_close("lse", lse, ref_lse, LSE_TOL)  # the sink leaves lse and max_logits alone
    assert_close("max_logits", mx, ref_mx, LSE_TOL)
    assert torch.isposinf(lse[0]).all() and (out[:, 0] == 0).all()  # +inf sink zeroes head 0


def test_prefill_library_checks_kept():
    q, kv, indices = prefill_case(h_q=64)
    with pytest.raises(RuntimeError, match="Unsupported h_q: 48"):
        flashmla_sparse.sparse_prefill_fwd(q[:, :48], kv, indices, 0.1)
    with pytest.raises(RuntimeError, match="int32"):
        flashmla_sparse.sparse_prefill_fwd(q, kv, indices.long(), 0.1)
    with pytest.raises(RuntimeError, match="Invalid d_v"):
        flashmla_sparse.sparse_prefill_fwd(q, kv, indices, 0.1, 448)
    with pytest.raises(OutOfContractError, match="^out: "):
        flashmla_sparse.sparse_prefill_fwd(q, kv, indices, 0.1, out=poisoned((1, 64, 512), torch.bfloat16))


# --------------------------------------------------------------------------------------------
# The 656-byte FP8 format, quantised as FlashMLA's tests/quant.py does
# --------------------------------------------------------------------------------------------


def quantize_v32(k):
    """tests/quant.py ``quantize_k_cache`` (V32_FP8Sparse): ``[blocks, ps, 576]`` -> ``[blocks, ps, 656]`` bytes."""
    blocks, ps, _ = k.shape
    res = torch.empty(blocks, ps, 656, dtype=torch.uint8)
    res[..., 528:] = k[..., 512:].to(torch.bfloat16).contiguous().view(torch.uint8)
    scales = torch.empty(blocks, ps, 4, dtype=torch.float32)
    for t in range(4):
        tile = k[..., 128 * t:128 * (t + 1)].float()
        inv = tile.abs().max(dim=-1).values / 448.0
        inv = torch.pow(2, torch.clamp_min(inv, 1e-4).log2().ceil())  # ue8m0
        scales[..., t] = inv
        res[..., 128 * t:128 * (t + 1)] = (tile / inv[..., None]).to(torch.float8_e4m3fn).view(torch.uint8)
    res[..., 512:528] = scales.view(torch.uint8)
    return res


def dequantize_here(b):
    """The bytes back to float64 as tests/quant.py ``dequantize_k_cache`` defines them (without its bf16 rounding)."""
    shape = b.shape[:-1]
    b = b.reshape(-1, 656)
    nope = b[:, :512].contiguous().view(torch.float8_e4m3fn).double()
    scales = b[:, 512:528].contiguous().view(torch.float32).double()
    rope = b[:, 528:].contiguous().view(torch.bfloat16).double()
    nope = nope * scales.repeat_interleave(128, dim=1)
    return torch.cat([nope, rope], dim=1).reshape(*shape, 576)


def test_v32_format_round_trip():
    g = torch.Generator().manual_seed(11)
    k = (torch.randn(3, 64, 576, generator=g) * torch.tensor([0.01, 1.0, 30.0, 3.0]).repeat_interleave(144)).to(
        torch.bfloat16)
    packed = quantize_v32(k)
    assert packed.shape[-1] == flashmla_sparse.V32_BYTES_PER_TOKEN == 656
    got = flashmla_sparse.dequantize_v32(packed.view(-1, 656))
    assert torch.equal(got, dequantize_here(packed).view(-1, 576))
    assert torch.equal(got[:, 512:], k.view(-1, 576)[:, 512:].double())  # the RoPE tail is bf16, unscaled
    rel = (got[:, :512] - k.view(-1, 576)[:, :512].double()).abs() / k.view(-1, 576)[:, :512].double().abs().clamp_min(
        1e-2)
    assert float(rel.median()) < 0.07  # e4m3: 3 mantissa bits


# --------------------------------------------------------------------------------------------
# Decode (paged FP8 cache, flat token-row indices)
# --------------------------------------------------------------------------------------------


def decode_case(b=3, s_q=2, h_q=64, topk=40, blocks=6, ps=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s_q, h_q, D_QK, generator=g).to(torch.bfloat16)
    k = torch.randn(blocks, ps, D_QK, generator=g).to(torch.bfloat16)
    packed = quantize_v32(k)
    total = blocks * ps
    idx = torch.full((b, s_q, topk), -1, dtype=torch.int64)
    for i in range(b):
        for s in range(s_q):
            n = int(torch.randint(1, topk + 1, (1,), generator=g))
            idx[i, s, :n] = torch.randperm(total, generator=g)[:n]
            idx[i, s] = idx[i, s][torch.randperm(topk, generator=g)]
    idx[0, 1] = -1  # a query that selects nothing
    used = torch.zeros(total, dtype=torch.bool)
    used[idx[idx >= 0]] = True
    flat = packed.view(total, 656)
    flat[~used] = 0x7F  # e4m3 NaN bytes, NaN scales, NaN rope
    # the cache as vLLM hands it: [blocks, ps, 1, 656] bytes, a page-strided view (FlashMLA's tests pad each block)
    padded = torch.zeros(blocks, ps + 1, 656, dtype=torch.uint8)
    padded[:, :ps] = flat.view(blocks, ps, 656)
    cache = padded[:, :ps].unsqueeze(2)
    return q, cache, idx.to(torch.int32)


def decode_expected(q, cache, indices, scale, topk_length=None, sink=None):
    b, s_q, h_q, _ = q.shape
    rows = dequantize_here(cache[:, :, 0].reshape(-1, 656))
    keys = []
    for i in range(b):
        for s in range(s_q):
            row = indices[i, s].long()
            if topk_length is not None:
                row = row[:int(topk_length[i])]
            keys.append(rows[row[row != -1]])
    out, _, lse = expected(q.double().view(b * s_q, h_q, D_QK), keys, scale, sink)
    return out.view(b, s_q, h_q, D_V), lse.view(b, s_q, h_q).transpose(1, 2)


@pytest.mark.parametrize("h_q", [64, 128])
def test_decode_matches_float64_over_the_fp8_format(h_q):
    q, cache, indices = decode_case(h_q=h_q, seed=h_q)
    scale = 576 ** -0.5
    out_buf = poisoned((3, 2, h_q, D_V), torch.bfloat16)
    out, lse, tsm, splits = flashmla_sparse.sparse_decode_fwd(q, cache, indices, None, None, None, None, None, None,
                                                              None, 512, scale, out_buf, False)
    ref_out, ref_lse = decode_expected(q, cache, indices, scale)
    assert out is out_buf and lse.shape == (3, h_q, 2) and lse.dtype == torch.float32
    assert_close("out", out, ref_out, TOL)
    assert_close("lse", lse, ref_lse, LSE_TOL)  # natural log, [b, h_q, s_q]
    assert torch.equal(out[0, 1].float(), torch.zeros(h_q, D_V)) and torch.isposinf(lse[0, :, 1]).all()
    assert tsm.dtype == splits.dtype == torch.int32 and splits.shape == (4,)


def test_decode_topk_length_sink_and_schedule_reuse():
    q, cache, indices = decode_case(seed=4)
    topk_length = torch.tensor([7, 0, 40], dtype=torch.int32)
    indices[0, :, 7:] = 10 ** 9  # past topk_length: never read, so never out of range
    sink = torch.randn(64, dtype=torch.float32)
    out, lse, tsm, splits = flashmla_sparse.sparse_decode_fwd(q, cache, indices, topk_length, sink, None, None,
                                                              None, None, None, 512, 0.05, None, False)
    ref_out, ref_lse = decode_expected(q, cache, indices, 0.05, topk_length, sink.double())
    assert_close("out", out, ref_out, TOL)
    assert_close("lse", lse, ref_lse, LSE_TOL)
    assert torch.isposinf(lse[1]).all()
    again = flashmla_sparse.sparse_decode_fwd(q, cache, indices, topk_length, sink, tsm, splits, None, None, None,
                                              512, 0.05, None, False)
    assert torch.equal(again[0], out)
    with pytest.raises(OutOfContractError, match="^tile_scheduler_metadata: built for other"):
        flashmla_sparse.sparse_decode_fwd(q, cache, indices, topk_length + 1, sink, tsm, splits, None, None, None,
                                          512, 0.05, None, False)


@pytest.mark.parametrize("bad", [-2, 6 * 64, 2 ** 31 - 1])
def test_decode_index_other_than_minus_one_outside_the_cache_raises(bad):
    q, cache, indices = decode_case(seed=7)
    indices[2, 0, 3] = bad
    with pytest.raises(OutOfRangeRead, match="^indices: index"):
        flashmla_sparse.sparse_decode_fwd(q, cache, indices, None, None, None, None, None, None, None, 512, 0.1,
                                          None, False)


def test_decode_out_of_contract_and_library_checks():
    q, cache, indices = decode_case(seed=8)
    call = flashmla_sparse.sparse_decode_fwd
    with pytest.raises(OutOfContractError, match="^extra_k_cache: "):
        call(q, cache, indices, None, None, None, None, cache, indices, None, 512, 0.1, None, False)
    with pytest.raises(OutOfContractError, match="^enable_batch_invariant: "):
        call(q, cache, indices, None, None, None, None, None, None, None, 512, 0.1, None, True)
    v4 = torch.zeros(6, 64, 1, 584, dtype=torch.uint8)
    with pytest.raises(OutOfContractError, match="^kv_format: .*584"):
        call(q, v4, indices, None, None, None, None, None, None, None, 512, 0.1, None, False)
    with pytest.raises(RuntimeError, match="Unsupported h_q: 16"):
        call(q[:, :, :16], cache, indices, None, None, None, None, None, None, None, 512, 0.1, None, False)
    with pytest.raises(RuntimeError, match="fp8_e4m3fn, int8 or uint8"):
        call(q, cache.to(torch.bfloat16), indices, None, None, None, None, None, None, None, 512, 0.1, None, False)


def test_registered_for_vllm_ops_and_flashmla_api():
    assert emulation_for("torch.ops._flashmla_C:sparse_prefill_fwd") is flashmla_sparse.sparse_prefill_fwd
    assert emulation_for("torch.ops._flashmla_C:sparse_decode_fwd") is flashmla_sparse.sparse_decode_fwd
    assert emulation_for("flash_mla:flash_mla_sparse_fwd") is flashmla_sparse.flash_mla_sparse_fwd
