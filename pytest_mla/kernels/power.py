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

from .compare import Tolerance, check_close
from .inputs import DecodeInputs
from .reference import ref_attend, ref_gather

__all__ = ["MARGIN", "PLANTED_FAULTS", "WeakCheck", "measure_power"]

#: A fault counts as detected only if the check would fail it with every bound this many times looser.
MARGIN = 2.0
SCALE_ERROR = 1.05
PLANTED_FAULTS = ("scale_x1.05", "misread_token", "mask_dropped", "merge_equal_weights", "lse_base_swapped")


class WeakCheck(Exception):
    """A case whose inputs cannot reveal a planted fault even at the strongest profile tried."""


@dataclasses.dataclass
class _Request:
    q: torch.Tensor  # [s_q, h_q, d_qk] float64
    k: torch.Tensor  # [n, h_kv, d_qk] float64 (dequantised)
    v: torch.Tensor  # [n, h_kv, d_v]
    mask: torch.Tensor | None  # [s_q, s_q] tree mask


def _requests(x: DecodeInputs) -> list[_Request]:
    out = []
    scale = x.kv_scale
    for i, n in enumerate(x.cache_seqlens.tolist()):
        k = ref_gather(x.kv_cache.cpu(), x.block_table[i].cpu(), n).to(torch.float64)
        v = ref_gather(x.v_cache.cpu(), x.block_table[i].cpu(), n).to(torch.float64) if x.v_cache is not None \
            else k[..., : x.head_dim_v]
        if scale is not None:
            k, v = k * scale, v * scale
        out.append(_Request(x.q[i].cpu().to(torch.float64), k, v,
                            x.tree_mask[i].cpu() if x.tree_mask is not None else None))
    return out


def _attend(x: DecodeInputs, reqs: list[_Request], *, scale: float | None = None, causal: bool | None = None,
            drop_mask: bool = False, keep: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
            rows: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None):
    """Float64 attention of every request: ``(out [b, s_q, h_q, d_v], lse [b, h_q, s_q])``."""
    b, s_q, h_q, _ = x.q.shape
    out = torch.zeros(b, s_q, h_q, x.head_dim_v, dtype=torch.float64)
    lse = torch.full((b, h_q, s_q), -math.inf, dtype=torch.float64)
    for i, r in enumerate(reqs):
        n = r.k.shape[0]
        k, v = rows.get(i, (r.k, r.v)) if rows else (r.k, r.v)
        pos = torch.arange(n, dtype=torch.int64)
        if keep is not None:
            chosen = keep(i, pos)
            k, v, pos = k[chosen], v[chosen], pos[chosen]
        if n == 0 or pos.numel() == 0:
            continue
        out[i], lse[i] = ref_attend(
            r.q, k, v, pos, n, scale if scale is not None else x.softmax_scale,
            causal=(x.causal if causal is None else causal) and not drop_mask,
            tree_mask=None if drop_mask else r.mask,
        )
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
    """Merge ``outs [N, b, s_q, h, d_v]`` by ``lses [N, b, h, s_q]``: ``"lse"``, ``"equal"`` or ``"base2_as_e"``."""
    lse = lses.permute(0, 1, 3, 2)[..., None]  # [N, b, s_q, h, 1]
    present = torch.isfinite(lse)
    if weights == "equal":
        w = present.to(torch.float64)
    else:
        logits = lse / math.log(2.0) if weights == "base2_as_e" else lse
        w = torch.softmax(torch.where(present, logits, -math.inf), dim=0)
    w = torch.nan_to_num(w / w.sum(0, keepdim=True).clamp(min=1e-300), nan=0.0)
    return (w * torch.where(present, outs, 0.0)).sum(0)


def _effect(perturbed: torch.Tensor, ref: torch.Tensor, tol: Tolerance, margin: float) -> dict[str, Any]:
    loose = Tolerance(abs=tol.abs * margin, rel=tol.rel * margin, cos=None if tol.cos is None else tol.cos * margin)
    result = check_close("out", perturbed, ref, loose)
    return {"detected": not result.ok, "max_abs": round(result.max_abs_err, 6), "cos_diff": float(f"{result.cos_diff:.3g}")}


def measure_power(x: DecodeInputs, tol: Tolerance, *, dcp: tuple[int, int] = (1, 1),
                  margin: float = MARGIN) -> dict[str, Any]:
    """Which ``PLANTED_FAULTS`` the check of ``x`` (output compared with ``tol``) would catch.

    Returns ``{"margin", "faults": {name: {"detected", "max_abs", "cos_diff", ...}},
    "undetected": [names]}``; faults that cannot occur in the case (no mask
    without speculative verify, no merge without DCP, no neighbour in a
    one-token request) are left out.
    """
    reqs = _requests(x)
    ref_out, _ = _attend(x, reqs)
    faults: dict[str, dict[str, Any]] = {}

    scaled, _ = _attend(x, reqs, scale=x.softmax_scale * SCALE_ERROR)
    faults["scale_x1.05"] = _effect(scaled, ref_out, tol, margin)

    page_size = x.kv_cache.shape[1]
    per_kind: dict[str, list[dict[str, Any]]] = {}
    for i, r in enumerate(reqs):
        for kind, (p, src) in _misread_positions(r.k.shape[0], page_size).items():
            k, v = r.k.clone(), r.v.clone()
            k[p], v[p] = r.k[src], r.v[src]
            misread, _ = _attend(x, reqs, rows={i: (k, v)})
            per_kind.setdefault(kind, []).append(_effect(misread, ref_out, tol, margin))
    if per_kind:
        missed = sorted(kind for kind, effects in per_kind.items() if not all(e["detected"] for e in effects))
        weakest = min((e for effects in per_kind.values() for e in effects), key=lambda e: e["cos_diff"])
        faults["misread_token"] = {"detected": not missed, "max_abs": weakest["max_abs"],
                                   "cos_diff": weakest["cos_diff"], "positions": sorted(per_kind),
                                   **({"missed": missed} if missed else {})}

    s_q = x.q.shape[1]
    if s_q > 1 and (x.causal or x.tree_mask is not None):
        unmasked, _ = _attend(x, reqs, drop_mask=True)
        faults["mask_dropped"] = _effect(unmasked, ref_out, tol, margin)

    world, interleave = dcp
    if world > 1:
        parts = [_attend(x, reqs, keep=lambda i, pos, r=r: (pos // interleave) % world == r) for r in range(world)]
        outs = torch.stack([o for o, _ in parts])
        lses = torch.stack([lse for _, lse in parts])
        faults["merge_equal_weights"] = _effect(_merge(outs, lses, "equal"), ref_out, tol, margin)
        faults["lse_base_swapped"] = _effect(_merge(outs, lses, "base2_as_e"), ref_out, tol, margin)

    return {"margin": margin, "faults": faults,
            "undetected": [name for name in PLANTED_FAULTS if name in faults and not faults[name]["detected"]]}
