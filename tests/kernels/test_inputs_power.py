"""Inputs that make a check able to fail, and the power measurement that proves it.

The logit profile is checked on the logits it produces (computed here from q
and the cache, independently of the generator); the power measurement is
checked against faults planted by hand, and against the inputs' predecessor
(FlashMLA's flat ``randn / 10`` queries), which it must find blind.
"""

from __future__ import annotations

import math

import pytest
import torch

from pytest_mla.core.models import BUILTIN_MODELS
from pytest_mla.kernels.compare import FP8_DOT_TOLERANCES, TOLERANCES, Tolerance, check_close
from pytest_mla.kernels.inputs import DISCRIMINATING, gen_decode_inputs
from pytest_mla.kernels.power import PLANTED_FAULTS, measure_power, measure_power_and_magnitude, output_magnitude
from pytest_mla.kernels.reference import ref_gather, ref_merge, ref_mla_decode

V3 = BUILTIN_MODELS["deepseek-v3"]
BF16 = TOLERANCES["bf16"].out


def logits_of(x, request: int, query: int) -> torch.Tensor:
    """``[h_q, n]`` scaled logits of one query over the request's cached keys, in float64."""
    n = int(x.cache_seqlens[request])
    k = ref_gather(x.kv_cache, x.block_table[request], n).to(torch.float64) * (x.kv_scale or 1.0)
    q = x.q[request, query].to(torch.float64)  # [h_q, d]
    group = q.shape[0] // k.shape[1]
    return torch.einsum("hd,hnd->hn", q, k.permute(1, 0, 2).repeat_interleave(group, 0)) * x.softmax_scale


def mla(seqlens, s_q=1, h_q=16, page=16, **kw):
    return gen_decode_inputs(seqlens, s_q=s_q, h_q=h_q, d_qk=576, d_v=512, page_size=page,
                             softmax_scale=V3.softmax_scale, **kw)


def test_planted_target_holds_its_share_and_the_newest_first_and_page_tokens_dominate_some_head():
    x = mla([1, 90, 0], seed=3)
    probs = torch.softmax(logits_of(x, 1, 0), -1)  # [h, 90]
    top, where = probs.max(-1)
    assert (top > DISCRIMINATING.target_share - 0.05).all(), top
    assert (top < DISCRIMINATING.target_share + 0.05).all(), top
    assert {89, 0, 15, 16} <= set(where.tolist())  # newest, first, either side of the first page boundary
    ordinary = logits_of(x, 1, 0)
    ordinary = ordinary.masked_fill(torch.nn.functional.one_hot(where, 90).bool(), math.nan)
    spread = torch.nanmean((ordinary - torch.nanmean(ordinary, -1, keepdim=True)) ** 2, -1).sqrt()
    assert ((spread - DISCRIMINATING.spread).abs() < 0.3 * DISCRIMINATING.spread).all(), spread
    assert (logits_of(x, 1, 0).std(-1) > 1.0).all()  # realistic logits (std 1-3), not ~0.02
    assert probs[:, :].shape == (16, 90) and torch.equal(x.q[2].float(), x.q[2].float())


def test_heads_cycle_through_the_planted_positions_in_order_with_each_dcp_rank_s_first_token():
    # 40 tokens, pages of 8, DCP 3 with interleave 4 (rank (p // 4) % 3): the positions, in order,
    # are the newest (39), the first (0), either side of the first page boundary (7, 8), the middle
    # token (20) and each rank's first token not already named (rank 1: 4; ranks 0 and 2 start at 0
    # and 8). Heads 0-5 take them in turn, 6-11 random ones, 12-15 start over.
    x = mla([40], dcp=(3, 4), page=8, seed=5)
    dominant = logits_of(x, 0, 0).argmax(-1).tolist()  # [16]
    assert dominant[:6] == [39, 0, 7, 8, 20, 4], dominant
    assert dominant[12:] == [39, 0, 7, 8], dominant


def test_flat_queries_are_flat():
    x = mla([1, 90, 0], seed=3, logits=None)
    assert logits_of(x, 1, 0).std() < 0.05  # why the old checks were blind


def test_dcp_one_rank_holds_most_and_another_almost_nothing():
    world = 4
    x = mla([1, 150, 0], seed=4, dcp=(world, 1))
    probs = torch.softmax(logits_of(x, 1, 0), -1)  # [h, 150]
    owners = torch.arange(150) % world
    per_rank = torch.stack([probs[:, owners == r].sum(-1) for r in range(world)], -1)  # [h, world]
    assert (per_rank.max(-1).values > 0.65).all(), per_rank
    assert (per_rank[0::2].min(-1).values < 0.01).all(), per_rank  # even heads: one rank quiet
    assert (per_rank[1::2].min(-1).values > 0.01).any(), per_rank  # odd heads: every rank in play
    assert set(per_rank.argmax(-1).tolist()) == set(range(world))  # every rank dominates some head


@pytest.mark.parametrize("tree", [(1, 3), (4, 3)], ids=["chain", "tree"])
def test_a_hidden_token_would_dominate_if_the_mask_were_dropped(tree):
    topk, steps = tree
    s_q = 1 + topk * steps
    x = mla([s_q + 40], s_q=s_q, spec_topk=topk, spec_steps=steps, seed=5)
    n = s_q + 40
    for i in range(s_q - 1):  # the last chain query sees everything
        logits = logits_of(x, 0, i)
        visible = torch.arange(n) <= n - s_q + i if topk == 1 else torch.cat(
            [torch.ones(n - s_q, dtype=torch.bool), x.tree_mask[0, i]])
        if visible.all():
            continue
        unmasked = torch.softmax(logits, -1)
        assert (unmasked[:, ~visible].sum(-1) > 0.85).all()  # the mask decides the answer


def test_fp8_queries_are_exact_in_the_cache_format_and_scales_are_as_asked():
    x = mla([9], kv_dtype="fp8_e4m3", seed=6)
    assert torch.equal(x.q.to(torch.float8_e4m3fn).to(x.q.dtype), x.q)
    assert x.kv_scale != 1.0 and math.log2(x.kv_scale).is_integer()  # the default: "pow2"
    one = mla([9], kv_dtype="fp8_e4m3", seed=6, kv_scale=1.0)
    assert one.kv_scale == 1.0
    with pytest.raises(ValueError, match="kv_scale"):
        mla([9], kv_dtype="fp8_e4m3", kv_scale="sometimes")


@pytest.mark.parametrize("kind", ["fp8_e4m3", "fp8_e5m2"])
def test_a_calibrated_scale_is_no_power_of_two_covers_the_cache_and_keeps_every_code_exact(kind):
    fp8, fmax = {"fp8_e4m3": (torch.float8_e4m3fn, 448.0), "fp8_e5m2": (torch.float8_e5m2, 57344.0)}[kind]
    x = mla([40], kv_dtype=kind, seed=11, kv_scale="calibrated")
    amax = float((x.kv_cache.to(torch.float64)[torch.isfinite(x.kv_cache.to(torch.float64))]).abs().max())
    assert not math.log2(x.kv_scale).is_integer()
    assert amax <= fmax  # the codes fit the format, hence the values fit amax / fmax <= scale
    # every finite code of the format, times the scale, is exact in bf16 (and fp16 where fp16 has the range),
    # and the engine's own write
    # (x / k_scale, or x * (1 / k_scale), in fp32) stores back the same code
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fp8).to(torch.float64)
    codes = codes[torch.isfinite(codes)]
    for scale in (x.kv_scale, 1.25 * 2.0 ** -7, 1.75 * 2.0 ** -9, 1.5 * 2.0 ** 3):
        value = codes * scale
        assert torch.equal(value.to(torch.bfloat16).to(torch.float64), value), scale
        normal = value[(value.abs() >= 2.0 ** -14) & (value.abs() <= 65504)]  # fp16's normal range: its mantissa
        assert torch.equal(normal.to(torch.float16).to(torch.float64), normal), scale
        stored = value.to(torch.float32)
        assert torch.equal((stored / scale).to(fp8).to(torch.float64), codes)
        assert torch.equal((stored * (1.0 / torch.tensor(scale, dtype=torch.float32))).to(fp8).to(torch.float64),
                           codes)


def test_calibrated_scales_round_amax_up_by_less_than_half():
    from pytest_mla.kernels.inputs import calibrated_scale

    for least in (3e-5, 1 / 448, 0.0234, 1.0, 1.25, 1.26, 1.76, 1.999, 7.0):
        s = calibrated_scale(least)
        assert least <= s < least * 1.43 and not math.log2(s).is_integer()
        assert s / 2.0 ** math.floor(math.log2(s)) in (1.25, 1.5, 1.75)
    with pytest.raises(ValueError, match="calibrated scale"):
        calibrated_scale(0.0)


# ---- power -----------------------------------------------------------------------------------


def test_power_of_the_new_inputs_covers_every_planted_fault():
    x = mla([4, 150], s_q=4, spec_topk=1, spec_steps=3, seed=7, dcp=(4, 1))
    power = measure_power(x, BF16, dcp=(4, 1), split_from=32)  # 150 tokens over 4 ranks: each splits
    assert set(power["faults"]) == set(PLANTED_FAULTS)
    assert power["undetected"] == [], power


def test_flat_inputs_are_blind_to_a_scale_error_and_a_wrong_lse_base():
    x = mla([1, 150, 0], seed=8, dcp=(4, 1), logits=None)
    power = measure_power(x, BF16, dcp=(4, 1))
    assert {"scale_x1.05", "lse_base_swapped"} <= set(power["undetected"])


def test_power_agrees_with_a_fault_planted_by_hand():
    """The scale fault, planted into a float64 run by hand, fails the comparison exactly when power says so."""
    for logits in (None, DISCRIMINATING):
        x = mla([1, 120, 0], seed=9, logits=logits)
        ref, _ = ref_mla_decode(**x.ref_args())
        faulty, _ = ref_mla_decode(**{**x.ref_args(), "softmax_scale": x.softmax_scale * 1.05})
        loose = Tolerance(BF16.abs * 2, BF16.rel * 2, BF16.cos * 2)
        caught = not check_close("out", faulty, ref, loose).ok
        assert measure_power(x, BF16)["faults"]["scale_x1.05"]["detected"] == caught
        assert caught == (logits is not None)


def test_power_of_a_wrong_merge_matches_ref_merge_with_equal_weights():
    """merge_equal_weights: the fault is what ref_merge computes with every rank's LSE set equal."""
    world = 2
    x = mla([60], seed=10, dcp=(world, 1))
    ref, _ = ref_mla_decode(**x.ref_args())
    parts = []
    for r in range(world):
        keep = (torch.arange(60) % world) == r
        sub = x.kv_cache.clone()
        n = 60
        rows = ref_gather(sub, x.block_table[0], n)
        rows[~keep] = 0
        # a rank's partial: attend over its own tokens only (others masked by -inf scores)
        k = ref_gather(x.kv_cache, x.block_table[0], n).to(torch.float64)[keep]
        s = torch.einsum("hd,nd->hn", x.q[0, 0].double(), k[:, 0]) * x.softmax_scale
        lse = torch.logsumexp(s, -1)
        out = torch.einsum("hn,nd->hd", torch.softmax(s, -1), k[:, 0, :512])
        parts.append((out[None, None], lse[None, :, None]))
    equal, _ = ref_merge([o for o, _ in parts], [torch.zeros_like(lse) for _, lse in parts])
    loose = Tolerance(BF16.abs * 2, BF16.rel * 2, BF16.cos * 2)
    caught = not check_close("out", equal, ref, loose).ok
    assert caught and measure_power(x, BF16, dcp=(world, 1))["faults"]["merge_equal_weights"]["detected"]


@pytest.mark.parametrize("kv", ["auto", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("page,dcp,spec", [(1, 1, "none"), (64, 4, "none"), (1, 1, "tree"), (64, 4, "chain")])
def test_the_default_profile_detects_everything_at_model_scale(kv, page, dcp, spec):
    """The shapes the engine matrices check (V3 at its YaRN scale), with the tolerance each would use."""
    from pytest_mla.kernels.harness import _check_seqlens

    s_q, tree = {"none": (1, (1, 0)), "chain": (4, (1, 3)), "tree": (13, (4, 3))}[spec]
    seqlens = tuple(max(n, 1) for n in _check_seqlens(s_q, dcp, page, 1))  # min_seqlen 1, as SGLang's checks
    tol = (FP8_DOT_TOLERANCES[kv] if kv != "auto" else TOLERANCES["bf16"]).out
    x = mla(seqlens, s_q=s_q, page=page, spec_topk=tree[0], spec_steps=tree[1], kv_dtype=kv, dcp=(dcp, 1), seed=11)
    power = measure_power(x, tol, dcp=(dcp, 1))
    assert power["undetected"] == [], power  # the default profile, no fallback needed


def _bf16_exchange(x, world: int, base2: bool = False) -> torch.Tensor:
    """What a DCP decode that exchanges partials in bf16 returns (vLLM's cp_lse_ag_out_rs): each rank's
    partial rounded, weighted by exp(lse_r - lse) and rounded again, the ranks' terms summed in bf16."""
    n = int(x.cache_seqlens[0])
    k = ref_gather(x.kv_cache, x.block_table[0], n).to(torch.float64)
    s = torch.einsum("hd,nd->hn", x.q[0, 0].double(), k[:, 0]) * x.softmax_scale
    outs, lses = [], []
    for r in range(world):
        keep = (torch.arange(n) % world) == r
        lses.append(torch.logsumexp(s[:, keep], -1))
        outs.append((torch.softmax(s[:, keep], -1) @ k[keep, 0, :512]).to(torch.bfloat16))
    lse = torch.stack(lses)
    if base2:  # the rank LSEs read as base 2 (vLLM PR 47079)
        lse = lse / math.log(2.0)
    w = torch.softmax(lse, 0)
    total = torch.zeros_like(outs[0])
    for wr, o in zip(w, outs):
        total = total + (wr[:, None] * o.double()).to(torch.bfloat16)
    return total[None, None]


def test_a_bf16_exchange_passes_the_merge_bound_and_a_base2_lse_fails_it():
    """The DCP bound (check_close's magnitude and exchange) admits the roundings of an exchange in bf16
    and nothing a planted merge fault does: a base-2 LSE merged as natural log fails it on the same inputs."""
    world = 2
    for seed in range(6):
        x = mla([200], seed=seed, dcp=(world, 1))
        ref, _ = ref_mla_decode(**x.ref_args())
        magnitude = output_magnitude(x)
        assert magnitude.shape == ref.shape and bool((magnitude >= ref.abs() - 1e-12).all())
        good = check_close("out", _bf16_exchange(x, world), ref, BF16, magnitude, exchange=True)
        assert good.ok, good.message
        bad = check_close("out", _bf16_exchange(x, world, base2=True), ref, BF16, magnitude, exchange=True)
        assert not bad.ok


def test_the_magnitude_is_attention_over_the_absolute_values():
    """Σ_j p_j·|v_j|, computed independently from the logits: equal to |o| where V has one sign."""
    x = mla([90], seed=5)
    n = 90
    k = ref_gather(x.kv_cache, x.block_table[0], n).to(torch.float64)
    p = torch.softmax(logits_of(x, 0, 0), -1)  # [h, n]
    expect = p @ k[:, 0, :512].abs()
    assert torch.allclose(output_magnitude(x)[0, 0], expect, rtol=1e-9, atol=1e-12)


def test_a_seeded_case_draws_the_same_queries_every_time():
    """Under DCP a quiet rank's tokens are lowered by a least-norm solve; with more tokens on the rank than
    q has dimensions it is a least-squares one, which must give the same bits on every call (a seed names a
    case: reports, reruns and reproducers depend on it). LAPACK's lstsq did not, on this CPU."""
    from pytest_mla.kernels.inputs import _least_norm

    g = torch.Generator().manual_seed(0)
    for m, d in ((84, 64), (300, 64), (40, 128), (700, 128)):
        k = torch.randn(m, d, generator=g, dtype=torch.float64)
        solves = [_least_norm(k, -3.0) for _ in range(6)]
        assert all(torch.equal(solves[0], x) for x in solves[1:]), (m, d)
        want = -3.0 * torch.ones(m, dtype=torch.float64)
        if m <= d:  # exact: every row meets the value
            assert torch.allclose(k @ solves[0], want, atol=1e-9)
        else:  # least squares: the residual is orthogonal to k's columns
            assert torch.allclose(k.T @ (k @ solves[0] - want), torch.zeros(d, dtype=torch.float64), atol=1e-8)
    kwargs = dict(s_q=1, h_q=8, d_qk=64, d_v=64, h_kv=2, mla=False, page_size=16, dcp=(4, 1), dtype="fp32")
    draws = [gen_decode_inputs([700, 333], seed=1, **kwargs).q for _ in range(3)]
    assert all(torch.equal(draws[0], q) for q in draws[1:])


def test_the_power_measurement_hands_the_check_the_same_magnitude():
    """``measure_power_and_magnitude``: the power record of ``measure_power`` and the magnitude
    (attention over |V|, computed here from the logits; 0 for a request with no tokens), equal bit
    for bit to ``output_magnitude``'s under a tree and DCP, so the check's verdicts cannot move."""
    x = mla([90, 0], seed=5)
    power, magnitude = measure_power_and_magnitude(x, BF16)
    assert power == measure_power(x, BF16)
    k = ref_gather(x.kv_cache, x.block_table[0], 90).to(torch.float64)
    expect = torch.softmax(logits_of(x, 0, 0), -1) @ k[:, 0, :512].abs()
    assert torch.allclose(magnitude[0, 0], expect, rtol=1e-9, atol=1e-12)
    assert not magnitude[1].any()
    x = mla([13, 150], s_q=13, spec_topk=4, spec_steps=3, seed=6, dcp=(4, 1))
    power, magnitude = measure_power_and_magnitude(x, BF16, dcp=(4, 1))
    assert power == measure_power(x, BF16, dcp=(4, 1))
    assert torch.equal(magnitude, output_magnitude(x))
