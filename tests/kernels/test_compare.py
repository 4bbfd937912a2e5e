"""check_close catches what it must (planted NaN, off-by-one mask, 1e-2 error) and passes honest rounding."""

from __future__ import annotations

import json
import math

import pytest
import torch

from pytest_mla.kernels.compare import TOLERANCES, Tolerance, check_close, tolerance_for
from pytest_mla.kernels.inputs import gen_decode_inputs
from pytest_mla.kernels.reference import ref_mla_decode

BF16 = TOLERANCES["bf16"]


@pytest.fixture(scope="module")
def ref_pair():
    x = gen_decode_inputs([1, 9, 20], s_q=2, h_q=4, d_qk=24, d_v=16, page_size=4, seed=7)
    return x, *ref_mla_decode(**x.ref_args())


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_rounded_reference_is_within_its_dtype_tolerance(ref_pair, dtype):
    from pytest_mla.kernels.inputs import DTYPES

    _, out, lse = ref_pair
    res = check_close("out", out.to(DTYPES[dtype]), out, TOLERANCES[dtype].out)
    assert res.ok, res.message
    assert check_close("lse", lse.float(), lse, TOLERANCES[dtype].lse).ok


def test_identical_is_exact_and_plain(ref_pair, assert_plain):
    _, out, lse = ref_pair
    res = check_close("out", out, out, BF16.out)
    assert res.ok and res.max_abs_err == 0 and res.fail_frac == 0 and res.message is None
    assert abs(res.cos_diff) < 1e-15
    d = res.as_dict()
    assert_plain(d)
    json.dumps(d, allow_nan=False)
    lse_res = check_close("lse", lse, lse, BF16.lse)  # -inf positions match
    assert lse_res.ok and lse_res.neginf_mismatch == 0


def test_planted_nan_is_caught_with_position(ref_pair):
    _, out, _ = ref_pair
    bad = out.clone()
    bad[1, 0, 2, 5] = math.nan
    res = check_close("out", bad.bfloat16(), out, BF16.out)
    assert not res.ok and res.nan_mismatch == 1 and res.first_mismatch == [1, 0, 2, 5]
    assert "NaN" in res.message and res.fail_frac == pytest.approx(1 / out.numel())


def test_planted_error_of_1e_2_is_caught_at_its_position(ref_pair):
    _, out, _ = ref_pair
    bad = out.clone()
    bad[2, 1, 3, 7] += 1e-2
    res = check_close("out", bad, out, BF16.out)
    assert not res.ok and res.worst_pos == [2, 1, 3, 7]
    assert res.max_abs_err == pytest.approx(1e-2, rel=1e-6)
    assert "beyond" in res.message


def test_planted_off_by_one_mask_is_caught(ref_pair):
    x, out, lse = ref_pair
    # Each query also sees the next draft token: the causal diagonal shifted by one.
    off_by_one = torch.ones(2, 2, dtype=torch.bool).tril(diagonal=1).expand(3, 2, 2)
    shifted = ref_mla_decode(**{**x.ref_args(), "tree_mask": off_by_one})
    res_out = check_close("out", shifted[0].bfloat16(), out, BF16.out)
    res_lse = check_close("lse", shifted[1].float(), lse, BF16.lse)
    assert not res_out.ok and not res_lse.ok


def test_lse_neg_inf_positions_must_match(ref_pair):
    _, _, lse = ref_pair
    bad = lse.clone()
    bad[torch.isneginf(lse)] = 0.0  # claims a value where nothing was visible
    res = check_close("lse", bad, lse, BF16.lse)
    assert not res.ok and res.neginf_mismatch == int(torch.isneginf(lse).sum()) > 0


def test_shape_mismatch_fails():
    res = check_close("out", torch.zeros(2, 3), torch.zeros(3, 2), Tolerance(abs=1e-3))
    assert not res.ok and "shape" in res.message


def test_cosine_bound_catches_a_bias_within_elementwise_tolerance(ref_pair):
    _, out, _ = ref_pair
    res = check_close("out", out * 1.012, out, BF16.out)  # < 2.01/128 relative everywhere
    assert res.fail_frac == 0 and not res.ok and "cos diff" in res.message


def test_fp8_row_is_used_for_fp8_cache():
    assert tolerance_for("bf16", "fp8_e4m3") is TOLERANCES["fp8_e4m3"]
    assert tolerance_for("fp16") is TOLERANCES["fp16"]
