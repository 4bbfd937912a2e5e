"""The power of a numeric check: which planted faults its inputs and tolerance would catch.

A check passes a kernel whose output is within tolerance of the float64
reference; it is only worth the faults that would push the output outside.
``measure_power`` plants each fault into the *reference* (never into the code
under test), on the case's own inputs, and asks whether the comparison the
check makes would fail — with a margin, so that a fault only just outside the
tolerance does not count as seen:

* ``scale_x1.05``: the softmax scale 5% too large (a forgotten YaRN factor
  is 87%; a wrong head dim in the scale is 50% or more);
* ``misread_token``: one cached token read from its neighbour's slot — the
  newest token, the first, the first token of the second page (off-by-one
  writes and page-table mistakes); each position must be caught;
* ``mask_dropped`` (speculative verify): every draft token visible to every
  query (the causal or tree mask ignored);
* ``merge_equal_weights`` (DCP): the ranks' partial outputs averaged instead
  of weighted by their LSEs;
* ``lse_base_swapped`` (DCP): a base-2 LSE read as natural log in the merge
  (vLLM PR 47079's bug).

Only the output is judged (every check compares it; not every engine path
returns an LSE). See docs/check-power.md.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import torch

from .compare import Tolerance, merged_bound
from .inputs import DecodeInputs
from .reference import ref_gather

__all__ = ["MARGIN", "PLANTED_FAULTS", "WeakCheck", "measure_power", "output_magnitude"]

#: A fault counts as detected only if the check would fail it with every bound this many times looser.
MARGIN = 2.0
SCALE_ERROR = 1.05
PLANTED_FAULTS = ("scale_x1.05", "misread_token", "mask_dropped", "merge_equal_weights", "lse_base_swapped")


class WeakCheck(Exception):
    """A case whose inputs cannot reveal a planted fault even at the strongest profile tried."""


@dataclasses.dataclass
class _Request:
    """One request in float64, with its scaled scores computed once (every fault reuses them)."""

    scores: torch.Tensor  # [h_q, s_q, n] q·k · softmax_scale
    v: torch.Tensor  # [n, h_kv, d_v] (query head h reads KV head h // (h_q // h_kv))
    visible: torch.Tensor  # [s_q, n] bool: the mask the reference applies


def _requests(x: DecodeInputs) -> list[_Request]:
    out = []
    b, s_q, h_q, _ = x.q.shape
    for i, n in enumerate(x.cache_seqlens.tolist()):
        k = ref_gather(x.kv_cache.cpu(), x.block_table[i].cpu(), n).to(torch.float64)
        v = ref_gather(x.v_cache.cpu(), x.block_table[i].cpu(), n).to(torch.float64) if x.v_cache is not None \
            else k[..., : x.head_dim_v]
        if x.kv_scale is not None:
            k, v = k * x.kv_scale, v * x.kv_scale
        h_kv = k.shape[1]
        q = x.q[i].cpu().to(torch.float64).reshape(s_q, h_kv, h_q // h_kv, -1)  # [s_q, h_kv, group, d]
        scores = torch.einsum("ikgd,jkd->kgij", q, k).reshape(h_q, s_q, n) * x.softmax_scale
        pos = torch.arange(n)
        first = n - s_q
        if x.tree_mask is not None:
            draft = (pos - first).clamp(min=0, max=max(s_q - 1, 0))
            visible = (pos < first)[None, :] | x.tree_mask[i].cpu()[:, draft]
        elif x.causal:
            visible = pos[None, :] <= (first + torch.arange(s_q))[:, None]
        else:
            visible = torch.ones(s_q, n, dtype=torch.bool)
        out.append(_Request(scores, v, visible))
    return out


def _attend(r: _Request, visible: torch.Tensor, factor: float = 1.0, scores: torch.Tensor | None = None,
            v: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [s_q, h_q, d_v], lse [h_q, s_q])`` of one request under ``visible [s_q, n]``."""
    s = (r.scores if scores is None else scores) * factor
    s = s.masked_fill(~visible[None], -math.inf)
    lse = torch.logsumexp(s, -1)  # [h, s_q]
    probs = torch.exp(s - torch.where(torch.isneginf(lse), 0.0, lse)[..., None])
    v = r.v if v is None else v  # [n, h_kv, d_v]
    h_q, s_q, n = probs.shape
    h_kv = v.shape[1]
    out = torch.einsum("kgij,jkd->ikgd", probs.reshape(h_kv, h_q // h_kv, s_q, n), v)
    return out.reshape(s_q, h_q, v.shape[-1]), lse


def _batch(reqs: list[_Request], x: DecodeInputs, one: Callable[[int, _Request], tuple[torch.Tensor, torch.Tensor]],
           base: tuple[torch.Tensor, torch.Tensor] | None = None, only: int | None = None):
    """Every request's ``(out, lse)`` (``[b, s_q, h_q, d_v]``, ``[b, h_q, s_q]``), or ``base`` with request ``only`` redone."""
    if base is not None:
        out, lse = base[0].clone(), base[1].clone()
        out[only], lse[only] = one(only, reqs[only])
        return out, lse
    b, s_q, h_q, _ = x.q.shape
    out = torch.zeros(b, s_q, h_q, x.head_dim_v, dtype=torch.float64)
    lse = torch.full((b, h_q, s_q), -math.inf, dtype=torch.float64)
    for i, r in enumerate(reqs):
        if r.scores.shape[-1]:
            out[i], lse[i] = one(i, r)
    return out, lse


def _misread_positions(n: int, page_size: int) -> dict[str, tuple[int, int]]:
    """Positions whose row is read from a neighbour's slot: ``name -> (position, read instead)``."""
    found: dict[str, tuple[int, int]] = {}
    if n >= 2:
        found["newest"] = (n - 1, n - 2)
        found["first"] = (0, 1)
    if n > page_size >= 1:
        found["page_boundary"] = (page_size, page_size - 1)
    return found


def _merge(outs: torch.Tensor, lses: torch.Tensor, weights: str) -> torch.Tensor:
    """Merge ``outs [N, b, s_q, h, d_v]`` by ``lses [N, b, h, s_q]``: ``"equal"`` or ``"base2_as_e"``."""
    lse = lses.permute(0, 1, 3, 2)[..., None]  # [N, b, s_q, h, 1]
    present = torch.isfinite(lse)
    if weights == "equal":
        w = present.to(torch.float64)
    else:
        logits = lse / math.log(2.0) if weights == "base2_as_e" else lse
        w = torch.softmax(torch.where(present, logits, -math.inf), dim=0)
    w = torch.nan_to_num(w / w.sum(0, keepdim=True).clamp(min=1e-300), nan=0.0)
    return (w * torch.where(present, outs, 0.0)).sum(0)


def _effect(perturbed: torch.Tensor, ref: torch.Tensor, tol: Tolerance, margin: float,
            bound: torch.Tensor | None = None, ref_sq: float | None = None) -> dict[str, Any]:
    """Whether ``compare.check_close`` would fail ``perturbed`` with every bound ``margin`` times looser.

    The same rule as ``check_close`` (an element fails beyond abs **and** its
    relative bound ``bound``, default ``rel·|ref|``; the tensor fails on its cosine
    difference), computed lean: both tensors are finite float64 here (planted
    faults move values, they do not make NaN), and this runs a dozen times per
    case, so the bound (scaled by the margin) and ``Σ ref²`` come precomputed.
    ``tests/kernels/test_inputs_power.py`` holds the two together.
    """
    err = (perturbed - ref).abs_()
    if bound is None:
        bound = margin * tol.rel * ref.abs()
    beyond = (err > tol.abs * margin) & (err > bound)
    ref_sq = float((ref * ref).sum()) if ref_sq is None else ref_sq
    denom = float((perturbed * perturbed).sum()) + ref_sq
    cos = 1.0 - 2.0 * float((perturbed * ref).sum()) / denom if denom > 0 else 0.0
    detected = bool(beyond.any()) or (tol.cos is not None and cos > tol.cos * margin)
    return {"detected": detected, "max_abs": round(float(err.max()) if err.numel() else 0.0, 6),
            "cos_diff": float(f"{cos:.3g}")}


def _rank_parts(reqs: list[_Request], x: DecodeInputs, world: int, interleave: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each DCP rank's partial ``(outs [N, b, s_q, h, d_v], lses [N, b, h, s_q])`` over the tokens it owns."""
    def rank_part(rank: int):
        def one(i: int, r: _Request):
            n = r.scores.shape[-1]
            mine = (torch.arange(n) // interleave) % world == rank
            return _attend(r, r.visible & mine[None, :])
        return _batch(reqs, x, one)

    parts = [rank_part(rank) for rank in range(world)]
    return torch.stack([o for o, _ in parts]), torch.stack([lse for _, lse in parts])


def output_magnitude(x: DecodeInputs, reqs: list[_Request] | None = None) -> torch.Tensor:
    """``Σ_j p_j·|v_j|`` per output element (float64 ``[b, s_q, h_q, d_v]``): the size of the terms an
    attention output sums, what its relative bound applies to (``compare.check_close``'s ``magnitude``).

    A kernel rounds the weights ``p_j`` (or partial outputs) to the model dtype, so its error scales
    with this sum, not with ``|o|``: where the terms cancel, ``|o|`` is small and a correct kernel is
    many of its ulps off. Under DCP it bounds the ranks' weighted partials too (``Σ_r w_r·|o_r|``).
    """
    reqs = _requests(x) if reqs is None else reqs
    return _batch(reqs, x, lambda i, r: _attend(r, r.visible, v=r.v.abs()))[0]


def measure_power(x: DecodeInputs, tol: Tolerance, *, dcp: tuple[int, int] = (1, 1),
                  margin: float = MARGIN) -> dict[str, Any]:
    """Which ``PLANTED_FAULTS`` the check of ``x`` (output compared with ``tol``) would catch.

    Returns ``{"margin", "faults": {name: {"detected", "max_abs", "cos_diff", ...}},
    "undetected": [names]}``; faults that cannot occur in the case (no mask
    without speculative verify, no merge without DCP, no neighbour in a
    one-token request) are left out.
    """
    reqs = _requests(x)
    base = _batch(reqs, x, lambda i, r: _attend(r, r.visible))
    ref_out = base[0]
    faults: dict[str, dict[str, Any]] = {}
    world, interleave = dcp
    parts = _rank_parts(reqs, x, world, interleave) if world > 1 else None
    magnitude = output_magnitude(x, reqs)
    bound = margin * merged_bound(tol, torch.maximum(ref_out.abs(), magnitude), x.q.dtype, world > 1)
    ref_sq = float((ref_out * ref_out).sum())

    scaled, _ = _batch(reqs, x, lambda i, r: _attend(r, r.visible, SCALE_ERROR))
    faults["scale_x1.05"] = _effect(scaled, ref_out, tol, margin, bound, ref_sq)

    page_size = x.kv_cache.shape[1]
    per_kind: dict[str, list[dict[str, Any]]] = {}
    for i, r in enumerate(reqs):
        for kind, (p, src) in _misread_positions(r.scores.shape[-1], page_size).items():
            scores, v = r.scores.clone(), r.v.clone()
            scores[..., p], v[p] = r.scores[..., src], r.v[src]
            misread, _ = _batch(reqs, x, lambda j, rr: _attend(rr, rr.visible, scores=scores, v=v), base, only=i)
            per_kind.setdefault(kind, []).append(_effect(misread, ref_out, tol, margin, bound, ref_sq))
    if per_kind:
        missed = sorted(kind for kind, effects in per_kind.items() if not all(e["detected"] for e in effects))
        weakest = min((e for effects in per_kind.values() for e in effects), key=lambda e: e["cos_diff"])
        faults["misread_token"] = {"detected": not missed, "max_abs": weakest["max_abs"],
                                   "cos_diff": weakest["cos_diff"], "positions": sorted(per_kind),
                                   **({"missed": missed} if missed else {})}

    s_q = x.q.shape[1]
    if s_q > 1 and (x.causal or x.tree_mask is not None):
        unmasked, _ = _batch(reqs, x, lambda i, r: _attend(r, torch.ones_like(r.visible)))
        faults["mask_dropped"] = _effect(unmasked, ref_out, tol, margin, bound, ref_sq)

    if parts is not None:
        outs, lses = parts
        faults["merge_equal_weights"] = _effect(_merge(outs, lses, "equal"), ref_out, tol, margin, bound, ref_sq)
        faults["lse_base_swapped"] = _effect(_merge(outs, lses, "base2_as_e"), ref_out, tol, margin, bound, ref_sq)

    return {"margin": margin, "faults": faults,
            "undetected": [name for name in PLANTED_FAULTS if name in faults and not faults[name]["detected"]]}
