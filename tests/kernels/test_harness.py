"""case_for derives check shapes from real models; run_kernel_check returns plain records."""

from __future__ import annotations

import json
import math
import re

import pytest

from pytest_mla.core.models import BUILTIN_MODELS
from pytest_mla.kernels.harness import KernelCase, case_for, run_kernel_check
from pytest_mla.kernels.reference import ref_kernel

RECORD_KEYS = {"status", "where", "seed", "case", "errors", "tolerance", "time_s", "message", "kv_scale", "power"}


def needs_triton():
    """Skip without Triton; the mode first (Triton reads TRITON_INTERPRET when it decorates, its own
    ``triton.language`` helpers included, so importing it first would fix the wrong mode)."""
    from pytest_mla.kernels._mode import ensure_triton_mode

    ensure_triton_mode()
    pytest.importorskip("triton")


def coords(model="deepseek-v3", dcp=1, spec="none", arch="sm90", backend="triton", **extra):
    return {"model": model, "backend": backend, "dcp": dcp, "spec": spec, "arch": arch, **extra}


def case(model="deepseek-v3", **kw):
    return case_for(coords(model, **kw), BUILTIN_MODELS[model], seed=0)


def test_deepseek_case_has_real_dims_and_heads_per_rank():
    c = case("deepseek-v3")
    assert (c.mla, c.d_qk, c.d_v, c.h_q, c.h_kv, c.s_q) == (True, 576, 512, 128, 1, 1)
    # DeepSeek-V3's YaRN (factor 40, mscale_all_dim 1) multiplies 1/sqrt(128 + 64) by mscale^2
    assert c.softmax_scale == pytest.approx(192**-0.5 * (0.1 * 1.0 * math.log(40) + 1) ** 2)
    assert case("deepseek-v3", tp=8).h_q == 16


def test_gqa_case_splits_kv_heads_with_tp():
    assert (case("llama-3.1-8b").h_q, case("llama-3.1-8b").h_kv) == (32, 8)
    c = case("llama-3.1-8b", tp=16)
    assert (c.mla, c.h_q, c.h_kv, c.d_qk, c.d_v) == (False, 2, 1, 128, 128)
    with pytest.raises(ValueError, match="tp=3"):
        case("llama-3.1-8b", tp=3)


@pytest.mark.parametrize("dcp", [1, 2, 4, 8])
@pytest.mark.parametrize("spec", ["none", "eagle-1x3", "eagle-4x3"])
def test_lengths_are_short_mixed_and_cover_every_rank(dcp, spec):
    c = case(dcp=dcp, spec=spec)
    assert c.batch == len(c.seqlens) in (2, 3)
    if c.s_q == 1:
        assert {0, 1} <= set(c.seqlens)
    else:
        assert min(c.seqlens) == c.s_q
    assert max(c.seqlens) > dcp * c.page_size  # every rank holds more than a page
    assert max(c.seqlens) < 200  # interpreter budget
    assert c.s_q == {"none": 1, "eagle-1x3": 4, "eagle-4x3": 13}[spec]
    assert (c.spec_topk > 1) == (spec == "eagle-4x3")


def test_seed_is_stable_and_ignores_arch_backend_and_model_name():
    base = case(dcp=4, spec="eagle-1x3")
    assert base == case(dcp=4, spec="eagle-1x3", arch="sm100", backend="flashmla")
    assert base == case("deepseek-r1", dcp=4, spec="eagle-1x3")  # same dims: one result serves both
    assert base.seed != case(dcp=2, spec="eagle-1x3").seed
    assert base.seed != case_for(coords(dcp=4, spec="eagle-1x3"), BUILTIN_MODELS["deepseek-v3"], seed=1).seed
    assert hash(base) == hash(case(dcp=4, spec="eagle-1x3"))


def test_seed_is_the_same_in_another_process():
    import os
    import subprocess
    import sys

    code = ("from pytest_mla.core.models import BUILTIN_MODELS; from pytest_mla.kernels.harness import case_for; "
            "print(case_for({'model': 'deepseek-v3', 'backend': 'x', 'dcp': 4, 'spec': 'eagle-1x3', 'arch': 'sm80'}, "
            "BUILTIN_MODELS['deepseek-v3'], seed=0).seed)")
    env = {**os.environ, "PYTHONHASHSEED": "123", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    seed = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert int(seed) == case(dcp=4, spec="eagle-1x3").seed


def test_optional_coords(assert_plain):
    c = case(page_size=64, kv_dtype="fp8_e4m3")
    assert (c.page_size, c.kv_dtype) == (64, "fp8_e4m3")
    assert case(kv_dtype="auto").kv_dtype == "auto"
    with pytest.raises(ValueError, match="kv_dtype"):
        case(kv_dtype="int4")
    assert_plain(c.as_dict())


def _small_case(**kw) -> KernelCase:
    return case("deepseek-v2-lite", tp=4, **kw)  # 4 heads, real 576/512 dims


def test_record_of_a_verified_run_is_plain(assert_plain):
    c = _small_case(dcp=2, spec="eagle-2x2")
    rec = run_kernel_check(c, ref_kernel, merge="pytest_mla.kernels.reference:ref_merge", where="interpreter")
    assert set(rec) == RECORD_KEYS
    assert rec["status"] == "verified" and rec["message"] is None, rec["message"]
    from pytest_mla.kernels._mode import ensure_triton_mode

    # the record says where kernels actually ran: the interpreter here, the GPU's arch on one
    assert rec["seed"] == c.seed and rec["case"] == c.as_dict() and rec["where"] == ensure_triton_mode()
    assert set(rec["errors"]) == {"out", "lse"} and rec["errors"]["out"]["ok"]
    assert {"max_abs_err", "max_rel_err", "cos_diff", "fail_frac", "worst_pos", "nan_mismatch"} <= set(rec["errors"]["out"])
    assert set(rec["tolerance"]) == {"out", "lse"} and rec["time_s"] >= 0
    assert rec["power"]["undetected"] == [] and {"scale_x1.05", "misread_token", "mask_dropped",
                                                  "merge_equal_weights", "lse_base_swapped"} == set(rec["power"]["faults"])
    assert_plain(rec)
    json.dumps(rec, allow_nan=False)


def biased_kernel(*args, **kwargs):
    out, lse = ref_kernel(*args, **kwargs)
    return out * 1.05, lse


def nan_tail_kernel(*args, **kwargs):
    """Forgets to write the last head: the poisoned output shows through."""
    out = kwargs["out"]
    o, lse = ref_kernel(*args, **{**kwargs, "out": None})
    out[..., :-1, :] = o[..., :-1, :]
    return out, lse


@pytest.mark.parametrize("kernel,needle", [(biased_kernel, "beyond"), (nan_tail_kernel, "NaN")])
def test_record_of_a_failed_run_says_why(kernel, needle, assert_plain):
    rec = run_kernel_check(_small_case(), kernel)
    assert rec["status"] == "failed" and needle in rec["message"]
    assert_plain(rec)


def test_real_kernel_verifies_a_model_case():
    needs_triton()
    rec = run_kernel_check(_small_case(dcp=2, spec="eagle-2x2"), "pytest_mla.kernels.triton_mla:mla_decode")
    assert rec["status"] == "verified", rec["message"]


def test_real_kernel_fp8_and_gqa_cases():
    needs_triton()
    for c in (_small_case(kv_dtype="fp8_e4m3", spec="eagle-1x3"), case("llama-3.1-8b", tp=8, dcp=2)):
        rec = run_kernel_check(c, "pytest_mla.kernels.triton_mla:mla_decode")
        assert rec["status"] == "verified", rec["message"]


def test_distributed_mode_through_the_harness():
    c = _small_case(dcp=2, spec="eagle-1x3")
    rec = run_kernel_check(c, "pytest_mla.kernels.reference:ref_kernel", dcp_mode="distributed",
                           merge="pytest_mla.kernels.reference:ref_merge", timeout_s=120)
    assert rec["status"] == "verified", rec["message"]
    with pytest.raises(ValueError, match="dcp_mode"):
        run_kernel_check(c, ref_kernel, dcp_mode="threads")


def empty_rank_nan_kernel(*args, **kwargs):
    """Right wherever a rank holds tokens of a request; NaN out and LSE where it holds none
    (the bug the DCP rule "empty ranks contribute nothing and produce no NaN" is about)."""
    out, lse = ref_kernel(*args, **kwargs)
    empty = args[3] == 0  # cache_seqlens: this rank's tokens per request
    out[empty] = float("nan")
    lse[empty] = float("nan")
    return out, lse


@pytest.mark.parametrize("dcp", [1, 2, 4])
@pytest.mark.parametrize("merge", [None, "pytest_mla.kernels.reference:ref_merge"], ids=["triton-merge", "ref-merge"])
def test_nan_from_an_empty_dcp_rank_fails_at_every_dcp_size(dcp, merge):
    c = _small_case(dcp=dcp)
    rec = run_kernel_check(c, empty_rank_nan_kernel, merge=merge)
    assert rec["status"] == "failed"
    if dcp == 1:
        assert "NaN position(s) differ" in rec["message"]  # the request with no tokens at all
    else:
        assert rec["message"].startswith(f"DCP rank 0 of {dcp} returned NaN out and lse for request 2, which has no "
                                         "tokens on that rank: a rank with nothing to attend must give out 0 and "
                                         "lse -inf, never NaN")
    assert run_kernel_check(c, ref_kernel, merge=merge)["status"] == "verified"  # the check can pass


def test_nan_from_an_empty_dcp_rank_fails_in_distributed_mode_too():
    rec = run_kernel_check(_small_case(dcp=2), f"{__name__}:empty_rank_nan_kernel", dcp_mode="distributed",
                           merge="pytest_mla.kernels.reference:ref_merge", timeout_s=120)
    assert rec["status"] == "failed"
    assert rec["message"].startswith("DCP rank 0 of 2 returned NaN out and lse for request 2, which has no tokens "
                                     "on that rank")


def test_kernel_crash_propagates():
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_kernel_check(_small_case(), broken)


def scale_blind_kernel(*args, **kwargs):
    """Dequantises an fp8 cache as if its scale were 1 (the write or the read ignores k_scale)."""
    args = list(args)
    args[7] = None  # kv_scale
    return ref_kernel(*args, **kwargs)


def test_fp8_cases_run_with_k_scale_one_and_a_calibrated_scale():
    c = _small_case(kv_dtype="fp8_e4m3")
    rec = run_kernel_check(c, ref_kernel, where="interpreter")
    assert rec["status"] == "verified", rec["message"]
    scales = [v["kv_scale"] for v in rec["variants"]]
    assert scales[0] == 1.0 and not math.log2(scales[1]).is_integer()  # a calibrated scale, not a power of two
    assert all(v["status"] == "verified" for v in rec["variants"])


def exponent_only_kernel(*args, **kwargs):
    """Dequantises an fp8 cache with its scale's power of two only (a kernel that shifts instead of multiplying)."""
    args = list(args)
    if args[7] is not None:
        args[7] = 2.0 ** math.floor(math.log2(args[7]))
    return ref_kernel(*args, **kwargs)


def test_a_kernel_that_keeps_only_the_scales_exponent_fails_on_the_calibrated_scale():
    rec = run_kernel_check(_small_case(kv_dtype="fp8_e4m3"), exponent_only_kernel, where="interpreter")
    assert [v["status"] for v in rec["variants"]] == ["verified", "failed"]


def test_a_kernel_that_ignores_k_scale_fails_only_where_the_scale_is_not_one():
    rec = run_kernel_check(_small_case(kv_dtype="fp8_e4m3"), scale_blind_kernel, where="interpreter")
    assert rec["status"] == "failed"
    assert [v["status"] for v in rec["variants"]] == ["verified", "failed"]
    assert rec["kv_scale"] != 1.0  # the record shows the failing run


def test_a_case_whose_tolerance_sees_nothing_is_never_verified():
    from pytest_mla.kernels.compare import Tolerance
    from pytest_mla.kernels.harness import gen_checked_inputs
    from pytest_mla.kernels.power import WeakCheck

    with pytest.raises(WeakCheck, match="cannot detect scale_x1.05"):
        gen_checked_inputs(_small_case(), Tolerance(abs=10.0, rel=10.0, cos=1.0))


@pytest.mark.parametrize("extra, says", [
    ({"dcp": 100_000}, "a kernel check simulates at most 256 DCP ranks, not 100000"),
    ({"page_size": 2 ** 40}, "a kernel check for DCP 1 with page size 1099511627776 would need "),
    # 64 ranks x 4096 + 4096 // 2 + 3 (every rank over more than one page)
    ({"dcp": 64, "page_size": 4096}, "would need 264,195 tokens per request (at most 65,536 here)"),
])
def test_an_absurdly_large_check_is_refused_before_anything_is_allocated(extra, says):
    from pytest_mla.kernels.harness import CaseTooLarge

    with pytest.raises(CaseTooLarge, match=re.escape(says)):
        case(**extra)


@pytest.mark.parametrize("env, expect", [
    ({"PYTEST_XDIST_WORKER_COUNT": "2"}, "share"),
    ({"PYTEST_XDIST_WORKER_COUNT": "2", "OMP_NUM_THREADS": "3"}, "all"),  # the user's word stands
    ({}, "all"),
])
def test_xdist_workers_share_the_cores_for_torch_threads(env, expect):
    import os
    import subprocess
    import sys

    code = ("import os, torch; before = torch.get_num_threads(); from pytest_mla.kernels._mode import "
            "share_cpu_threads; share_cpu_threads(); print(before, torch.get_num_threads(), os.cpu_count())")
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTEST_XDIST_WORKER_COUNT", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                         check=True).stdout.split()
    before, after, cpus = map(int, out)
    if expect == "share":
        assert after == max(1, min(before, cpus // 2))
    else:
        assert after == before


def test_checked_inputs_are_generated_once_per_case_and_every_caller_gets_its_own_copy(monkeypatch):
    """One case's inputs serve every arch and backend: generated once per process, the same bits as a fresh
    generation, and a caller that writes into its tensors or its power record leaves the next one's intact."""
    import torch

    from pytest_mla.kernels import harness
    from pytest_mla.kernels.compare import tolerance_for

    c = _small_case(kv_dtype="fp8_e4m3")
    tol = tolerance_for(c.dtype, c.kv_dtype).out
    harness._INPUTS_CACHE.clear()
    made = []
    real = harness._generate_checked_inputs
    monkeypatch.setattr(harness, "_generate_checked_inputs", lambda *a: made.append(a) or real(*a))
    first, power, _ = harness._checked_inputs(c, tol, 1.0)
    first.q.fill_(math.nan)
    first.kv_cache.view(torch.uint8).fill_(0)
    power["undetected"].append("planted by a caller")
    again, power_again, _ = harness._checked_inputs(c, tol, 1.0)
    assert len(made) == 1  # the second call generated nothing
    fresh, fresh_power, _ = real(c, tol, 1.0)
    assert torch.equal(again.q, fresh.q) and torch.equal(again.kv_cache.view(torch.uint8),
                                                          fresh.kv_cache.view(torch.uint8))
    assert power_again == fresh_power and "planted by a caller" not in power_again["undetected"]
    harness._checked_inputs(c, tol, "pow2")  # another scale is another case
    assert len(made) == 2


def split_blind_kernel(*args, num_splits=None, **kwargs):
    """Right with its own split count, wrong whenever it is handed more than one (a broken split merge)."""
    out, lse = ref_kernel(*args, **kwargs)
    return (out * 0.9, lse) if num_splits and num_splits > 1 else (out, lse)


def test_a_kernel_given_its_split_count_runs_once_more_split_and_a_broken_merge_fails():
    c = _small_case()
    plain = run_kernel_check(c, split_blind_kernel, where="interpreter")
    assert plain["status"] == "verified" and "schedule" not in plain  # one run, its own split count
    split = run_kernel_check(c, split_blind_kernel, where="interpreter", num_splits=2, split_from=129)
    assert [v["status"] for v in split["variants"]] == ["failed", "verified"]  # the split run first
    assert split["status"] == "failed" and split["schedule"] == {"num_kv_splits": [2]}
    # the split run is the schedule case: a request longer than 129 tokens, whose split_dropped power it measures
    assert split["schedule_case"] and max(split["case"]["seqlens"]) > 129 and split["case"]["split_from"] == 129
    assert split["power"]["faults"]["split_dropped"]["detected"]


def test_the_projects_kernel_verifies_split_in_two():
    rec = run_kernel_check(_small_case(dcp=2), "pytest_mla.kernels.triton_mla:mla_decode", where="interpreter",
                           num_splits=2, split_from=129)
    assert rec["status"] == "verified", rec["message"]
    assert [v["status"] for v in rec["variants"]] == ["verified", "verified"]
    assert rec["variants"][0]["schedule"] == {"num_kv_splits": [2]} and max(rec["variants"][0]["seqlens"]) > 2 * 129
