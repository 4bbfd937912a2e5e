"""``power.measure_power`` against a plain float64 computation of every planted fault.

``measure_power`` computes each fault as the difference it makes, only where it
reaches (rank-one updates, hidden columns, one request at a time). Here every
perturbed output is computed the slow, obvious way, written from the fault
table in docs/check-power.md and the masking rule in ``reference``'s docstring:
the cache read token by token through the block table, one softmax per
(request, query) with the fault applied to its logits or values, the DCP
partials merged by hand; and judged with the check's rule with every bound
twice as loose (an element fails beyond abs and beyond ``(rel + 2u·[DCP]) ·
max(|ref|, Σ p|v|)``; the output fails on its cosine difference). Small random
cases: MLA and GQA, decode, chain and tree verify, DCP with interleave, an fp8
cache with a scale, empty and one-token requests, flat and planted queries,
tolerances from tight to loose and one without a cosine bound (only the
elements can fail), and a token holding all but 1e-15 of a row's mass.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from pytest_mla.kernels.compare import Tolerance
from pytest_mla.kernels.inputs import DISCRIMINATING, FALLBACK_PROFILES, gen_decode_inputs
from pytest_mla.kernels.power import measure_power

MARGIN = 2.0


def dense_rows(cache: torch.Tensor, table: torch.Tensor, n: int, scale: float | None) -> torch.Tensor:
    """``[n, h_kv, d]`` float64: token ``t`` lives in page ``table[t // page_size]``, slot ``t % page_size``."""
    page_size = cache.shape[1]
    rows = [cache[int(table[t // page_size]), t % page_size].to(torch.float64) for t in range(n)]
    out = torch.stack(rows) if rows else torch.zeros(0, *cache.shape[2:], dtype=torch.float64)
    return out * scale if scale is not None else out


def visible_keys(x, i: int, n: int, qi: int, unmasked: bool) -> list[bool]:
    """Query ``qi`` sits at position ``n - s_q + qi``; causal: keys up to it; tree: the prefix and its tree row."""
    s_q = x.q.shape[1]
    first = n - s_q
    if unmasked:
        return [True] * n
    if x.tree_mask is not None:
        return [j < first or bool(x.tree_mask[i, qi, j - first]) for j in range(n)]
    if x.causal:
        return [j <= first + qi for j in range(n)]
    return [True] * n


def attend(logits: torch.Tensor, visible: list[bool], values: torch.Tensor) -> tuple[torch.Tensor, float]:
    """One head: softmax of ``logits [n]`` over the visible keys, times ``values [n, d]``; nothing visible:
    ``(0, -inf)``."""
    keep = [j for j, seen in enumerate(visible) if seen]
    if not keep:
        return torch.zeros(values.shape[-1], dtype=torch.float64), -math.inf
    chosen = logits[keep]
    top = chosen.max()
    e = torch.exp(chosen - top)
    return (e[:, None] * values[keep]).sum(0) / e.sum(), float(top + torch.log(e.sum()))


def outputs(x, *, factor: float = 1.0, misread: tuple[int, int, int] | None = None, unmasked: bool = False,
            rank: tuple[int, int, int] | None = None, absolute: bool = False, dropped=None):
    """``(out [b, s_q, h_q, d_v], lse [b, h_q, s_q])`` with one fault applied.

    ``misread = (request, position, source)``: that request's token ``position`` reads ``source``'s
    key and value. ``rank = (rank, world, interleave)``: only the tokens that rank owns.
    ``absolute``: attention over ``|V|`` (the magnitude).
    """
    b, s_q, h_q, _ = x.q.shape
    d_v = x.head_dim_v
    out = torch.zeros(b, s_q, h_q, d_v, dtype=torch.float64)
    lse = torch.full((b, h_q, s_q), -math.inf, dtype=torch.float64)
    for i in range(b):
        n = int(x.cache_seqlens[i])
        k = dense_rows(x.kv_cache, x.block_table[i], n, x.kv_scale)
        v = dense_rows(x.v_cache, x.block_table[i], n, x.kv_scale) if x.v_cache is not None else k[..., :d_v]
        if misread is not None and misread[0] == i:
            k, v = k.clone(), v.clone()
            k[misread[1]], v[misread[1]] = k[misread[2]], v[misread[2]]
        if absolute:
            v = v.abs()
        h_kv = k.shape[1]
        for qi in range(s_q):
            seen = visible_keys(x, i, n, qi, unmasked)
            if rank is not None:
                r, world, interleave = rank
                seen = [s and (j // interleave) % world == r for j, s in enumerate(seen)]
            if dropped is not None:
                seen = [s and j not in dropped[i] for j, s in enumerate(seen)]
            for h in range(h_q):
                kv = h // (h_q // h_kv)
                logits = (k[:, kv] @ x.q[i, qi, h].to(torch.float64)) * x.softmax_scale * factor
                out[i, qi, h], lse[i, h, qi] = attend(logits, seen, v[:, kv])
    return out, lse


def merged(x, world: int, interleave: int, how: str, dropped=None) -> torch.Tensor:
    """The ranks' partials merged with equal weights (``"equal"``), with each LSE divided by ln 2 (``"base2"``:
    base 2 read as e), or by their true LSEs (``"lse"``); ``dropped``: the tokens each request leaves out."""
    parts = [outputs(x, rank=(r, world, interleave), dropped=dropped) for r in range(world)]
    b, s_q, h_q, d_v = parts[0][0].shape
    out = torch.zeros(b, s_q, h_q, d_v, dtype=torch.float64)
    for i in range(b):
        for qi in range(s_q):
            for h in range(h_q):
                present = [(o[i, qi, h], float(lse[i, h, qi])) for o, lse in parts if lse[i, h, qi] > -math.inf]
                if not present:
                    continue
                if how == "equal":
                    weights = [1.0 / len(present)] * len(present)
                else:
                    scaled = [lse_r / (math.log(2.0) if how == "base2" else 1.0) for _, lse_r in present]
                    top = max(scaled)
                    e = [math.exp(s - top) for s in scaled]
                    weights = [w / sum(e) for w in e]
                out[i, qi, h] = sum(w * o for w, (o, _) in zip(weights, present))
    return out


def split_dropped(x, split_from: int, world: int, interleave: int) -> torch.Tensor | None:
    """Each rank that holds at least ``split_from`` of a request's tokens splits them in two (its first
    ceil(half) and the rest) and its merge drops the second; the ranks merged by their true LSEs."""
    dropped = []
    for n in x.cache_seqlens.tolist():
        gone = set()
        for r in range(world):
            mine = [j for j in range(n) if (j // interleave) % world == r]
            if len(mine) >= split_from:
                gone |= set(mine[(len(mine) + 1) // 2:])
        dropped.append(gone)
    return merged(x, world, interleave, "lse", dropped) if any(dropped) else None


def verdict(faulty: torch.Tensor, ref: torch.Tensor, magnitude: torch.Tensor, tol: Tolerance, dtype: torch.dtype,
            dcp: bool) -> tuple[bool, float, float]:
    """``(fails at margin 2, max abs difference, cosine difference)`` by the check's rule, every bound doubled."""
    err = (faulty - ref).abs()
    u = torch.finfo(dtype).eps / 2 if dcp else 0.0
    relative = MARGIN * (tol.rel + 2 * u) * torch.maximum(ref.abs(), magnitude)
    beyond = bool(((err > MARGIN * tol.abs) & (err > relative)).any())
    denom = float((faulty * faulty).sum() + (ref * ref).sum())
    cos = 1.0 - 2.0 * float((faulty * ref).sum()) / denom if denom > 0 else 0.0
    return beyond or (tol.cos is not None and cos > MARGIN * tol.cos), float(err.max()), cos


def expected_power(x, tol: Tolerance, world: int, interleave: int, split_from: int = 0) -> dict:
    """Every fault's verdict, as ``measure_power`` reports it, from the slow outputs."""
    ref, _ = outputs(x)
    magnitude, _ = outputs(x, absolute=True)
    dtype, dcp = x.q.dtype, world > 1

    def judge(faulty):
        return verdict(faulty, ref, magnitude, tol, dtype, dcp)

    faults = {"scale_x1.05": judge(outputs(x, factor=1.05)[0])}
    page_size = x.kv_cache.shape[1]
    misreads = []
    for i, n in enumerate(x.cache_seqlens.tolist()):
        where = {}
        if n >= 2:
            where["newest"], where["first"] = (n - 1, n - 2), (0, 1)
        if n > page_size:
            where["page_boundary"] = (page_size, page_size - 1)
        for kind, (p, src) in where.items():
            misreads.append((kind, judge(outputs(x, misread=(i, p, src))[0])))
    if misreads:
        faults["misread_token"] = misreads
    if x.q.shape[1] > 1 and (x.causal or x.tree_mask is not None):
        faults["mask_dropped"] = judge(outputs(x, unmasked=True)[0])
    if world > 1:
        faults["merge_equal_weights"] = judge(merged(x, world, interleave, "equal"))
        faults["lse_base_swapped"] = judge(merged(x, world, interleave, "base2"))
    if split_from:
        faulty = split_dropped(x, split_from, world, interleave)
        if faulty is not None:
            faults["split_dropped"] = judge(faulty)
    return faults


def assert_same(got: dict, want: tuple[bool, float, float], label: str) -> None:
    detected, max_abs, cos = want
    assert got["detected"] == detected, (label, got, want)
    assert abs(got["max_abs"] - max_abs) <= 5.1e-7, (label, got, want)
    assert math.isclose(got["cos_diff"], cos, rel_tol=6e-3, abs_tol=1e-15), (label, got, want)


def assert_power_matches(x, tol: Tolerance, world: int = 1, interleave: int = 1, split_from: int = 0) -> dict:
    power = measure_power(x, tol, dcp=(world, interleave), split_from=split_from)
    want = expected_power(x, tol, world, interleave, split_from)
    assert set(power["faults"]) == set(want), (power, want)
    for name, expect in want.items():
        got = power["faults"][name]
        if name != "misread_token":
            assert_same(got, expect, name)
            continue
        kinds = sorted({kind for kind, _ in expect})
        missed = sorted({kind for kind, (caught, _, _) in expect if not caught})
        assert got["positions"] == kinds and got["detected"] == (not missed), (got, expect)
        assert got.get("missed", []) == missed, (got, expect)
        weakest = min((v for _, v in expect), key=lambda v: v[2])
        assert_same({"detected": weakest[0], **{k: got[k] for k in ("max_abs", "cos_diff")}}, weakest, name)
    assert power["undetected"] == [n for n in power["faults"] if not power["faults"][n]["detected"]]
    return power


TIGHT = Tolerance(abs=1e-5, rel=1e-4, cos=1e-9)
BF16 = Tolerance(abs=1e-3, rel=2.01 / 128, cos=1e-5)
NO_COSINE = Tolerance(abs=2e-3, rel=2.0**-4, cos=None)
LOOSE = Tolerance(abs=0.2, rel=0.5, cos=0.05)
BLIND = Tolerance(abs=1.0, rel=1.0, cos=1.0)  # values within [-1, 1]: no fault can fail it at margin 2

CASES = [  # (seqlens, generator keywords, dcp (world, interleave))
    ([1, 37, 0], {}, (1, 1)),
    ([9, 40], {"s_q": 4, "spec_steps": 3}, (1, 1)),
    ([7, 30, 12], {"s_q": 7, "spec_topk": 2, "spec_steps": 3}, (1, 1)),
    ([2, 45], {}, (4, 1)),
    ([13, 33], {"s_q": 4, "spec_steps": 3}, (2, 2)),
    ([7, 26], {"s_q": 7, "spec_topk": 3, "spec_steps": 2}, (4, 2)),
    ([3, 40], {"kv_dtype": "fp8_e4m3", "kv_scale": "pow2"}, (1, 1)),
    ([5, 31], {"mla": False, "h_kv": 2, "s_q": 3, "spec_steps": 2}, (2, 1)),
]


def small(seqlens, profile, seed, **kw):
    mla, s_q = kw.pop("mla", True), kw.pop("s_q", 1)
    d_qk, d_v = (24, 16) if mla else (16, 12)
    return gen_decode_inputs(seqlens, s_q=s_q, h_q=4, d_qk=d_qk, d_v=d_v, mla=mla, page_size=8, softmax_scale=0.3,
                             seed=seed, logits=profile, dcp=kw.pop("dcp"), **kw)


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("profile", [None, DISCRIMINATING, FALLBACK_PROFILES[1]], ids=["flat", "planted", "fallback"])
def test_measured_power_equals_the_slow_computation(case, profile):
    seqlens, kw, (world, interleave) = CASES[case]
    x = small(seqlens, profile, seed=100 + case, dcp=(world, interleave), **kw)
    verdicts = set()
    for tol in (TIGHT, BF16, NO_COSINE, LOOSE):
        power = assert_power_matches(x, tol, world, interleave)
        verdicts |= {f["detected"] for f in power["faults"].values()}
    assert verdicts == {True, False}  # the tolerances span caught and missed faults on every case


@pytest.mark.parametrize("seqlens, kw, dcp, split_from", [
    ([1, 60, 9, 16], {}, (1, 1), 40),
    ([4, 61, 9, 16], {"s_q": 4, "spec_steps": 3}, (1, 1), 40),
    ([1, 70, 9, 16], {}, (2, 1), 30),
    ([1, 70, 9, 16], {}, (2, 4), 30),
    ([1, 20, 9, 16], {}, (1, 1), 40),  # no request reaches the threshold: no split fault
])
def test_a_split_merge_that_drops_the_last_split_is_measured_exactly(seqlens, kw, dcp, split_from):
    x = small(seqlens, DISCRIMINATING, seed=11, dcp=dcp, **kw)
    for tol in (TIGHT, BF16, LOOSE):
        power = assert_power_matches(x, tol, *dcp, split_from=split_from)
        assert ("split_dropped" in power["faults"]) == (max(seqlens) // dcp[0] >= split_from)
    if max(seqlens) // dcp[0] >= split_from:
        assert assert_power_matches(x, BF16, *dcp, split_from=split_from)["faults"]["split_dropped"]["detected"]


def test_a_non_causal_multi_query_case_has_no_mask_fault_and_the_rest_match():
    x = dataclasses.replace(small([6, 30], DISCRIMINATING, seed=7, dcp=(1, 1), s_q=3, spec_steps=2), causal=False)
    assert "mask_dropped" not in assert_power_matches(x, BF16)["faults"]


def test_a_token_holding_nearly_all_the_mass_is_misread_exactly():
    """Rows where the first token holds all but ~1e-15 of the mass and its neighbour nearly nothing: an
    update of the output that subtracts the first token's term cancels to noise there; the measured
    difference must still be the true one."""
    x = small([40], DISCRIMINATING, seed=3, dcp=(1, 1))
    k = dense_rows(x.kv_cache, x.block_table[0], 40, x.kv_scale)[:, 0]  # [n, d_qk]
    q = x.q.clone().to(torch.float64)
    for head, logit in ((0, 120.0), (1, 90.0)):  # along k_0: token 0 at this logit, the others far below
        q[0, 0, head] = k[0] * (logit / x.softmax_scale / float(k[0] @ k[0]))
    x = dataclasses.replace(x, q=q.to(x.q.dtype))
    logits = (k @ x.q[0, 0, 0].to(torch.float64)) * x.softmax_scale
    share = torch.softmax(logits, 0)
    assert share[0] > 1 - 1e-12 and share[1] < 1e-25  # the case this test is about
    for tol in (TIGHT, NO_COSINE, LOOSE, BLIND):
        assert_power_matches(x, tol)
    assert measure_power(x, BLIND)["faults"]["misread_token"]["missed"] == ["first", "newest", "page_boundary"]
