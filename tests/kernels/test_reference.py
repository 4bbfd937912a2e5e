"""The float64 reference against an independent naive loop, the merge, and the input builders."""

from __future__ import annotations

import math

import pytest
import torch

from pytest_mla.kernels.inputs import (
    UNUSED_PAGE,
    gen_decode_inputs,
    gen_generator,
    gen_poisoned_out,
    gen_tree_mask,
)
from pytest_mla.kernels.reference import ref_attend, ref_merge, ref_mla_decode


def naive_decode(x, causal=True):
    """Per request, query, head: read each token through the block table, score, softmax — plain Python.

    Written independently of ``ref_mla_decode``: explicit page/slot arithmetic,
    a Python loop over keys, max-subtracted exp by hand.
    """
    b, s_q, h_q, d_qk = x.q.shape
    page_size, h_kv = x.kv_cache.shape[1], x.kv_cache.shape[2]
    scale_kv = x.kv_scale if x.kv_scale is not None else 1.0
    out = torch.zeros(b, s_q, h_q, x.head_dim_v, dtype=torch.float64)
    lse = torch.full((b, h_q, s_q), -math.inf, dtype=torch.float64)
    for r in range(b):
        n = int(x.cache_seqlens[r])
        for i in range(s_q):
            me = n - s_q + i
            visible = []
            for t in range(n):
                if x.tree_mask is not None:
                    ok = t < n - s_q or bool(x.tree_mask[r, i, t - (n - s_q)])
                else:
                    ok = (t <= me) if causal else True
                if ok:
                    visible.append(t)
            for h in range(h_q):
                kvh = h // (h_q // h_kv)
                qv = x.q[r, i, h].double()
                keys, vals = [], []
                for t in visible:
                    page = int(x.block_table[r, t // page_size])
                    row = x.kv_cache[page, t % page_size, kvh].double() * scale_kv
                    keys.append(float((qv * row).sum()) * x.softmax_scale)
                    if x.v_cache is None:
                        vals.append(row[: x.head_dim_v])
                    else:
                        vals.append(x.v_cache[page, t % page_size, kvh].double() * scale_kv)
                if not keys:
                    continue
                m = max(keys)
                weights = [math.exp(s - m) for s in keys]
                total = sum(weights)
                lse[r, h, i] = m + math.log(total)
                out[r, i, h] = sum(w * v for w, v in zip(weights, vals)) / total
    return out, lse


NAIVE_CASES = [
    # (name, seqlens, s_q, mla, kv_dtype, topk, steps, causal)
    ("mla-decode", [0, 1, 9], 1, True, "auto", 1, 0, True),
    ("mla-chain", [4, 11], 4, True, "auto", 1, 3, True),
    ("mla-tree", [5, 13], 5, True, "auto", 2, 2, True),
    ("gqa-tree-fp8", [7, 12], 7, False, "fp8_e4m3", 3, 2, True),
    ("gqa-noncausal", [3, 6], 2, False, "auto", 1, 1, False),
    ("mla-short-window", [2], 4, True, "auto", 1, 3, True),  # S < s_q: early queries see nothing
]


@pytest.mark.parametrize("case", NAIVE_CASES, ids=[c[0] for c in NAIVE_CASES])
def test_ref_matches_naive_loop(case):
    _, seqlens, s_q, mla, kv_dtype, topk, steps, causal = case
    x = gen_decode_inputs(seqlens, s_q=s_q, h_q=4, h_kv=1 if mla else 2, d_qk=24, d_v=16, mla=mla, page_size=4,
                          dtype="fp32", kv_dtype=kv_dtype, spec_topk=topk, spec_steps=steps, seed=11)
    x.causal = causal
    out, lse = ref_mla_decode(**x.ref_args())
    want_out, want_lse = naive_decode(x, causal=causal)
    assert not out.isnan().any() and not lse.isnan().any()
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)


def test_nothing_to_attend_is_zero_and_neg_inf():
    x = gen_decode_inputs([0, 0], s_q=3, h_q=2, d_qk=8, d_v=8, page_size=4, seed=1)
    out, lse = ref_mla_decode(**x.ref_args())
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.isneginf(lse).all()


def test_merge_of_key_splits_equals_full_attention():
    g = gen_generator(3)
    q = torch.randn(3, 4, 16, generator=g, dtype=torch.float64)  # [s_q, h_q, d]
    k = torch.randn(20, 1, 16, generator=g, dtype=torch.float64)  # [s_k, 1, d]
    pos = torch.arange(20)
    full = ref_attend(q, k, k[..., :8], pos, 20, 0.25)
    parts = [ref_attend(q, k[sel], k[sel][..., :8], pos[sel], 20, 0.25) for sel in (pos % 3 == 0, pos % 3 != 0)]
    out, lse = ref_merge([p[0][None] for p in parts], [p[1][None] for p in parts])
    torch.testing.assert_close(out[0], full[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse[0], full[1], rtol=1e-12, atol=1e-12)


def test_merge_ignores_empty_partials_even_if_nan():
    out_a = torch.randn(1, 2, 3, 4, dtype=torch.float64)  # [b, s_q, h_q, d_v]
    lse_a = torch.randn(1, 3, 2, dtype=torch.float64)  # [b, h_q, s_q]
    lse_a[0, 1, 0] = -math.inf
    out_a[0, 0, 1] = math.nan  # masked by the -inf above
    out_b = torch.full_like(out_a, math.nan)
    lse_b = torch.full_like(lse_a, -math.inf)
    out, lse = ref_merge([out_a, out_b], [lse_a, lse_b])
    assert not out.isnan().any()
    assert torch.equal(out[0, 0, 1], torch.zeros(4, dtype=torch.float64))
    assert torch.isneginf(lse[0, 1, 0])
    keep = ~torch.isneginf(lse_a).permute(0, 2, 1)[..., None].expand_as(out_a)
    torch.testing.assert_close(out[keep], out_a[keep])


@pytest.mark.parametrize("topk,steps", [(1, 3), (2, 2), (4, 3), (3, 1)])
def test_tree_mask_is_a_tree(topk, steps):
    masks = gen_tree_mask(topk, steps, gen_generator(topk * 10 + steps), batch=4)
    s_q = 1 + topk * steps
    assert masks.shape == (4, s_q, s_q) and masks.dtype == torch.bool
    for m in masks:
        assert m.diagonal().all() and m[:, 0].all()  # self and root visible
        assert not m.triu(1).any()  # ancestors come earlier
        children = [0] * s_q
        for i in range(1, s_q):
            ancestors = m[i].nonzero().flatten().tolist()[:-1]
            parent = ancestors[-1]
            assert m[i, :i].tolist() == (m[parent, :i] | (torch.arange(i) == parent)).tolist()
            children[parent] += 1
            assert len(ancestors) <= steps  # depth
        assert max(children) <= topk
    if topk == 1:
        assert torch.equal(masks[0], torch.ones(s_q, s_q, dtype=torch.bool).tril())


def test_inputs_poison_and_block_table():
    x = gen_decode_inputs([0, 5, 17], s_q=1, h_q=2, d_qk=8, d_v=8, page_size=4, seed=5)
    pages = x.block_table[x.block_table != UNUSED_PAGE].tolist()
    assert sorted(pages) == sorted(set(pages)) and len(pages) == 0 + 2 + 5
    assert (x.block_table[:, -1] == UNUSED_PAGE).all() and (x.block_table[0] == UNUSED_PAGE).all()
    used = torch.zeros(x.kv_cache.shape[:2], dtype=torch.bool)
    for r, n in enumerate(x.cache_seqlens.tolist()):
        for t in range(n):
            used[int(x.block_table[r, t // 4]), t % 4] = True
    nan_rows = x.kv_cache.float().isnan().all(-1).all(-1)
    assert torch.equal(nan_rows, ~used)  # NaN exactly past lengths and in spare pages
    assert gen_poisoned_out(2, 1, 2, 8, torch.bfloat16).isnan().all()
    flat = gen_decode_inputs([0, 5, 17], s_q=1, h_q=2, d_qk=8, d_v=8, page_size=4, seed=5, logits=None)
    assert flat.q.abs().max() <= 1.0  # logits=None: FlashMLA's randn / 10, clamped


def test_fp8_scale_is_a_power_of_two_and_dequantises():
    x = gen_decode_inputs([9], s_q=1, h_q=2, d_qk=8, d_v=8, page_size=4, kv_dtype="fp8_e4m3", seed=5)
    assert x.kv_cache.dtype == torch.float8_e4m3fn
    assert math.log2(x.kv_scale) == int(math.log2(x.kv_scale))
    assert x.kv_cache.float().nan_to_num().abs().max() * x.kv_scale <= 1.0
