"""Sparse attention's selection (``DecodeInputs.topk_indices``): the reference attends exactly the chosen
tokens, a selection of every visible token is the dense reference, and the planted faults stay visible."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from pytest_mla.core.models import BUILTIN_MODELS
from pytest_mla.kernels.compare import tolerance_for
from pytest_mla.kernels.harness import SPARSE_CHECK_TOPK, case_for, gen_case_inputs, gen_checked_inputs
from pytest_mla.kernels.inputs import _visible, gen_decode_inputs, gen_generator, gen_topk_indices
from pytest_mla.kernels.power import measure_power
from pytest_mla.kernels.reference import ref_mla_decode

SHAPE = dict(h_q=16, d_qk=576, d_v=512, page_size=64)


def direct_sparse(x):
    """Per request, query and head: gather each selected token through the block table, softmax — float64."""
    b, s_q, h_q, _ = x.q.shape
    page = x.kv_cache.shape[1]
    out = torch.zeros(b, s_q, h_q, x.head_dim_v, dtype=torch.float64)
    for r in range(b):
        for i in range(s_q):
            chosen = [int(p) for p in x.topk_indices[r, i] if int(p) >= 0]
            if not chosen:
                continue
            rows = torch.stack([x.kv_cache[int(x.block_table[r, p // page]), p % page, 0].double() for p in chosen])
            for h in range(h_q):
                s = rows @ x.q[r, i, h].double() * x.softmax_scale
                w = torch.softmax(s, 0)
                out[r, i, h] = w @ rows[:, : x.head_dim_v]
    return out


@pytest.mark.parametrize("s_q", [1, 4])
def test_reference_attends_the_selection(s_q):
    x = gen_decode_inputs([s_q, 99, 70], s_q=s_q, seed=3, sparse_topk=20, **SHAPE)
    out, lse = ref_mla_decode(**x.ref_args())
    torch.testing.assert_close(out, direct_sparse(x), rtol=1e-12, atol=1e-12)
    dense, _ = ref_mla_decode(**{**x.ref_args(), "topk_indices": None})
    assert (out - dense).abs().max() > 1e-2  # the selection changes the answer


def test_selection_is_a_strict_subset_of_the_visible_tokens():
    g = gen_generator(0)
    seqlens, s_q, k = [99, 3, 0, 40], 4, 32
    sel = gen_topk_indices(seqlens, s_q, k, g, page_size=64)
    assert sel.shape == (4, s_q, k) and sel.dtype == torch.int32
    for r, n in enumerate(seqlens):
        for i in range(s_q):
            row = sel[r, i]
            valid = row[row >= 0]
            assert (row[len(valid):] == -1).all()  # padding at the end
            vis = _visible(n, s_q, i, None, True).nonzero().flatten()
            assert set(valid.tolist()) <= set(vis.tolist()) and len(set(valid.tolist())) == len(valid)
            assert len(valid) == min(k, len(vis))
            if len(vis) > k:  # strict subset, holding the positions power misreads
                assert {int(vis[-1]), int(vis[0]), 63, 64} & set(vis.tolist()) <= set(valid.tolist())
                assert valid.tolist() != sorted(valid.tolist())  # not sorted


def test_selecting_everything_visible_is_the_dense_reference():
    x = gen_decode_inputs([4, 99, 70], s_q=4, seed=5, spec_topk=1, **SHAPE)
    everything = gen_topk_indices([4, 99, 70], 4, 2048, gen_generator(9), page_size=64)
    dense = ref_mla_decode(**x.ref_args())
    sparse = ref_mla_decode(**{**x.ref_args(), "topk_indices": everything})
    assert torch.equal(dense[0], sparse[0]) and torch.equal(dense[1], sparse[1])


def test_out_of_range_selection_raises():
    x = gen_decode_inputs([1, 99], s_q=1, seed=1, sparse_topk=8, **SHAPE)
    bad = x.topk_indices.clone()
    bad[1, 0, 0] = 99
    with pytest.raises(ValueError, match="out of range"):
        ref_mla_decode(**{**x.ref_args(), "topk_indices": bad})


def _target_logits_share(x, r, i):
    """Per head: the largest softmax share any selected token takes (the planted target)."""
    page = x.kv_cache.shape[1]
    chosen = [int(p) for p in x.topk_indices[r, i] if int(p) >= 0]
    rows = torch.stack([x.kv_cache[int(x.block_table[r, p // page]), p % page, 0].double() for p in chosen])
    s = torch.einsum("hd,nd->hn", x.q[r, i].double(), rows) * x.softmax_scale
    return torch.softmax(s, -1).max(-1).values


@pytest.mark.parametrize("spec", ["none", "eagle-1x3"])
@pytest.mark.parametrize("kv_dtype", ["auto", "fp8"])
def test_power_faults_are_detected_on_sparse_inputs(spec, kv_dtype):
    model = BUILTIN_MODELS["deepseek-v3.2"]
    coords = {"model": "deepseek-v3.2", "backend": "X", "dcp": 1, "spec": spec, "arch": "xpu", "page_size": 64,
              "kv_dtype": kv_dtype}
    case = case_for(coords, model, seed=0, overrides={"sparse_topk": SPARSE_CHECK_TOPK, "min_seqlen": 1})
    assert case.sparse_topk == SPARSE_CHECK_TOPK and max(case.seqlens) - case.s_q >= SPARSE_CHECK_TOPK
    tol = tolerance_for(case.dtype, case.kv_dtype)
    x, power = gen_checked_inputs(case, tol.out, kv_scale=(case.kv_scales or (None,))[0])
    assert x.topk_indices is not None and not power["undetected"]
    faults = power["faults"]
    assert faults["misread_token"]["detected"] and faults["scale_x1.05"]["detected"]
    assert faults["mask_dropped"]["detected"]  # the selection ignored
    # the planted target is a selected token holding most of the mass
    long = max(range(case.batch), key=lambda r: case.seqlens[r])
    assert float(_target_logits_share(x, long, 0).min()) > 0.5


def test_dense_cases_are_unchanged():
    coords = {"model": "deepseek-v3.2", "backend": "X", "dcp": 1, "spec": "none", "arch": "sm90", "page_size": 64}
    case = case_for(coords, BUILTIN_MODELS["deepseek-v3.2"], seed=0)
    assert case.sparse_topk == 0 and "sparse_topk" not in case.as_dict()
    assert gen_case_inputs(case).topk_indices is None
    sparse = dataclasses.replace(case, sparse_topk=16)
    assert torch.equal(gen_case_inputs(case).kv_cache.nan_to_num(), gen_case_inputs(sparse).kv_cache.nan_to_num())
