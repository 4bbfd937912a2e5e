"""FlashInfer's paged GQA wrappers (batch decode, batch prefill) against the float64 reference."""

from __future__ import annotations

import pytest
import torch

from pytest_mla.kernels.emulated import flashinfer_gqa
from pytest_mla.kernels.emulated.glue import OutOfContractError, OutOfRangeRead
from pytest_mla.kernels.emulated.install import emulations_installed
from pytest_mla.kernels.inputs import gen_decode_inputs

from .cases import LOG2E, LSE_TOL, TOL, assert_close, poisoned

WORKSPACE = torch.empty(16, dtype=torch.uint8)
H_Q, H_KV, D = 8, 2, 64


def gqa_case(seqlens, *, s_q=1, page_size=16, kv_dtype="auto", spec_topk=1, spec_steps=0, seed=0):
    """Seeded GQA inputs: NaN past every length, shuffled block table, separate V cache."""
    return gen_decode_inputs(seqlens, s_q=s_q, h_q=H_Q, h_kv=H_KV, d_qk=D, d_v=D, mla=False, page_size=page_size,
                             kv_dtype=kv_dtype, spec_topk=spec_topk, spec_steps=spec_steps, seed=seed)


def reference(case, *, causal=True, tree=False):
    """``(out [b·s_q, H, D], lse [b·s_q, H])`` from ``ref_mla_decode``, LSE natural log."""
    from pytest_mla.kernels.reference import ref_mla_decode

    args = case.ref_args()
    args["causal"] = causal
    if not tree:
        args["tree_mask"] = None
    out, lse = ref_mla_decode(**args)
    b, s_q = case.q.shape[:2]
    return out.reshape(b * s_q, H_Q, D), lse.permute(0, 2, 1).reshape(b * s_q, H_Q)


def csr(case):
    """FlashInfer's page list from the case's block table: ``(kv_indptr, kv_indices, last_page_len)``."""
    ps = case.kv_cache.shape[1]
    lens = [int(n) for n in case.cache_seqlens]
    pages = [-(-n // ps) for n in lens]
    indptr = torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=torch.int32)
    indices = torch.cat([case.block_table[i, :p] for i, p in enumerate(pages)]).to(torch.int32)
    last = torch.tensor([n - (p - 1) * ps if p else 0 for n, p in zip(lens, pages)], dtype=torch.int32)
    return indptr, indices.contiguous(), last


def flat_q(case):
    b, s_q = case.q.shape[:2]
    return case.q.reshape(b * s_q, H_Q, D)


def decode(case, *, layout="NHD", cache=None, **run_kwargs):
    w = flashinfer_gqa.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE, layout)
    w.plan(*csr(case), H_Q, H_KV, D, case.kv_cache.shape[1], q_data_type=case.q.dtype,
           kv_data_type=case.kv_cache.dtype, sm_scale=case.softmax_scale)
    return w, w.run(flat_q(case), cache if cache is not None else (case.kv_cache, case.v_cache), **run_kwargs)


@pytest.mark.parametrize("page_size", [1, 16])
def test_decode_matches_reference_with_a_base2_lse(page_size):
    case = gqa_case([0, 1, 37, 130], page_size=page_size, seed=page_size)
    ref_out, ref_lse = reference(case)
    out = poisoned((4, H_Q, D), torch.bfloat16)
    lse = poisoned((4, H_Q), torch.float32)
    _, (o, l) = decode(case, out=out, lse=lse, return_lse=True)
    assert o is out and l is lse
    assert_close("out", o, ref_out, TOL)
    assert torch.all(torch.isneginf(l[0])) and not o[0].isnan().any()  # an empty request: out 0, LSE -inf
    assert_close("lse", l[1:], ref_lse[1:] * LOG2E, LSE_TOL)


@pytest.mark.parametrize("layout", ["HND", "single"])
def test_decode_reads_the_hnd_and_the_single_tensor_layouts(layout):
    case = gqa_case([5, 40], page_size=16, seed=3)
    ref_out, _ = reference(case)
    if layout == "HND":
        cache, kv_layout = (case.kv_cache.transpose(1, 2).contiguous(), case.v_cache.transpose(1, 2).contiguous()), "HND"
    else:
        cache, kv_layout = torch.stack([case.kv_cache, case.v_cache], dim=1), "NHD"  # [P, 2, ps, Hk, D]
    _, o = decode(case, layout=kv_layout, cache=cache)
    assert_close("out", o, ref_out, TOL)


def test_decode_applies_k_scale_to_the_scores_and_v_scale_to_the_output():
    case = gqa_case([9, 50], page_size=16, kv_dtype="fp8_e4m3", seed=4)
    ref_out, _ = reference(case)  # dequantises with the case's kv_scale
    scale = float(case.kv_scale)
    w = flashinfer_gqa.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE, "NHD")
    w.plan(*csr(case), H_Q, H_KV, D, 16, q_data_type=case.q.dtype, kv_data_type=torch.float8_e4m3fn,
           sm_scale=case.softmax_scale)
    o = w.run(flat_q(case), (case.kv_cache, case.v_cache), k_scale=scale, v_scale=scale)
    assert_close("out", o, ref_out, TOL)
    wrong = w.run(flat_q(case), (case.kv_cache, case.v_cache), k_scale=scale)  # v_scale forgotten
    assert not check_ok(wrong, ref_out)


def check_ok(ans, ref):
    from pytest_mla.kernels.compare import check_close

    return check_close("out", ans, ref, TOL).ok


def test_forward_takes_its_sm_scale_over_the_plans():
    case = gqa_case([12, 30], seed=5)
    ref_out, _ = reference(case)
    w = flashinfer_gqa.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE, "NHD")
    w.begin_forward(*csr(case), H_Q, H_KV, D, 16, q_data_type=case.q.dtype, sm_scale=99.0)
    assert_close("out", w.forward(flat_q(case), (case.kv_cache, case.v_cache), sm_scale=case.softmax_scale),
                 ref_out, TOL)


def test_decode_refuses_a_page_id_outside_the_cache_and_a_dtype_other_than_planned():
    case = gqa_case([20], seed=6)
    indptr, indices, last = csr(case)
    indices[0] = case.kv_cache.shape[0]
    w = flashinfer_gqa.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE, "NHD")
    w.plan(indptr, indices, last, H_Q, H_KV, D, 16, q_data_type=case.q.dtype)
    with pytest.raises(OutOfRangeRead, match="paged_kv_indices"):
        w.run(flat_q(case), (case.kv_cache, case.v_cache))
    w.plan(*csr(case), H_Q, H_KV, D, 16, q_data_type=torch.float16)
    with pytest.raises(ValueError, match="q_data_type"):
        w.run(flat_q(case), (case.kv_cache, case.v_cache))
    w.plan(*csr(case), H_Q, H_KV, D, 16, q_data_type=case.q.dtype, logits_soft_cap=30.0)
    with pytest.raises(OutOfContractError, match="logits_soft_cap"):
        w.run(flat_q(case), (case.kv_cache, case.v_cache))


def prefill(case, *, causal, custom_mask=None, packed_custom_mask=None):
    b, s_q = case.q.shape[:2]
    w = flashinfer_gqa.BatchPrefillWithPagedKVCacheWrapper(WORKSPACE, "NHD")
    qo_indptr = torch.arange(b + 1, dtype=torch.int32) * s_q
    w.plan(qo_indptr, *csr(case), H_Q, H_KV, D, case.kv_cache.shape[1], custom_mask=custom_mask,
           packed_custom_mask=packed_custom_mask, q_data_type=case.q.dtype)
    return w.forward(flat_q(case), (case.kv_cache, case.v_cache), causal=causal, sm_scale=case.softmax_scale)


@pytest.mark.parametrize("causal", [True, False])
def test_prefill_aligns_the_causal_mask_bottom_right(causal):
    case = gqa_case([4, 19, 70], s_q=4, seed=7)
    ref_out, _ = reference(case, causal=causal)
    assert_close("out", prefill(case, causal=causal), ref_out, TOL)


def tree_custom_mask(case):
    """FlashInfer's flat custom mask: per request ``[s_q, kv_len]`` row-major, prefix visible, drafts by the tree."""
    rows = []
    s_q = case.q.shape[1]
    for i, n in enumerate(case.cache_seqlens.tolist()):
        mask = torch.ones(s_q, n, dtype=torch.bool)
        mask[:, n - s_q:] = case.tree_mask[i].to(torch.bool)
        rows.append(mask.reshape(-1))
    return torch.cat(rows)


def test_prefill_custom_mask_replaces_causal_and_packed_masks_read_the_same():
    case = gqa_case([9, 30], s_q=7, spec_topk=2, spec_steps=3, seed=8)
    assert case.tree_mask is not None
    ref_out, _ = reference(case, tree=True)
    mask = tree_custom_mask(case)
    assert_close("out", prefill(case, causal=True, custom_mask=mask), ref_out, TOL)
    packed = []
    at = 0
    for n in case.cache_seqlens.tolist():  # segment_packbits, little bit order, each request padded to a byte
        seg = mask[at: at + 7 * n]
        at += 7 * n
        seg = torch.cat([seg, torch.zeros(-len(seg) % 8, dtype=torch.bool)]).reshape(-1, 8).to(torch.int64)
        packed.append((seg << torch.arange(8)).sum(1).to(torch.uint8))
    assert_close("out", prefill(case, causal=True, packed_custom_mask=torch.cat(packed)), ref_out, TOL)


def test_stand_in_decode_module_lacks_the_grouped_size_helper_of_flashinfer_0_1():
    """flashinfer-python 0.7.2 has no ``_grouped_size_compiled_for_decode_kernels``: the import fails as it does there."""
    import importlib
    import importlib.util

    if importlib.util.find_spec("flashinfer") is not None:
        pytest.skip("the real flashinfer is installed: no stand-in")
    with emulations_installed(["flashinfer.decode:BatchDecodeWithPagedKVCacheWrapper"]):
        with pytest.raises(ImportError):
            exec("from flashinfer.decode import _grouped_size_compiled_for_decode_kernels", {})
        from flashinfer import BatchDecodeWithPagedKVCacheWrapper  # the re-export, as the library's __init__

        assert BatchDecodeWithPagedKVCacheWrapper.__name__ == "BatchDecodeWithPagedKVCacheWrapper"
        assert callable(importlib.import_module("flashinfer.decode").BatchDecodeWithPagedKVCacheWrapper)

