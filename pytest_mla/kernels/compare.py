"""Compare a kernel result with the float64 reference, like FlashMLA's kernelkit.

``check_close`` checks, in order: shape; NaN / +inf / -inf positions (must
match the reference exactly); elementwise abs-or-rel error over the positions
finite in both; cosine difference ``1 - 2Σxy / Σ(x² + y²)`` over the same
positions. It returns every measurement (a ``CloseResult``) instead of raising,
so a test can assert ``.ok`` and a report can show ``.as_dict()``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

__all__ = ["FP8_DOT_TOLERANCES", "TOLERANCES", "CloseResult", "DtypeTolerance", "Tolerance", "check_close", "merged_bound", "tolerance_for", "tolerance_record"]


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """An element passes if ``|a - r| <= abs`` **or** ``|a - r| <= rel · |r|``; the tensor also needs ``cos_diff <= cos``."""

    abs: float
    rel: float = 0.0
    cos: float | None = None  # None: cosine difference measured but not checked (e.g. LSE)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class DtypeTolerance:
    out: Tolerance  # attention output, in the query dtype
    lse: Tolerance  # fp32 log-sum-exp (natural log)

    def as_dict(self) -> dict[str, Any]:
        return {"out": self.out.as_dict(), "lse": self.lse.as_dict()}


#: One table, keyed by compute dtype; ``fp8_e4m3`` is for an fp8 KV cache (compared
#: against the reference on the dequantised cache; the kernel may compute in bf16).
#: bf16: ≈ 2 ulp relative (2.01/128) or 1e-3 absolute, FlashMLA's cosine bound.
TOLERANCES: dict[str, DtypeTolerance] = {
    "fp32": DtypeTolerance(out=Tolerance(abs=1e-5, rel=1e-4, cos=1e-9), lse=Tolerance(abs=1e-5)),
    "fp16": DtypeTolerance(out=Tolerance(abs=2e-4, rel=2.01 / 1024, cos=1e-6), lse=Tolerance(abs=1e-4)),
    "bf16": DtypeTolerance(out=Tolerance(abs=1e-3, rel=2.01 / 128, cos=1e-5), lse=Tolerance(abs=1e-4)),
    "fp8_e4m3": DtypeTolerance(out=Tolerance(abs=1e-3, rel=2.01 / 128, cos=1e-5), lse=Tolerance(abs=1e-4)),
}


#: For a kernel that rounds its dot operands to the fp8 cache dtype too (``KernelSpec.fp8_dots``):
#: q for Q·Kᵀ and the softmax weights P for P·V, as an FP8 MMA takes them (SGLang's Triton
#: decode and extend kernels: ``q.to(K_Buffer.dtype.element_ty)``, ``p.to(v.dtype)``). One
#: rounding of P costs half an fp8 ulp relative: 2⁻⁴ for e4m3, 2⁻³ for e5m2.
#:
#: The elementwise bound follows from the format: with q exact in the cache's fp8 format (the
#: check's queries are, see ``inputs``), only P is rounded, so an output element is off by at
#: most half an fp8 ulp of the weights times the largest |V| (< 0.5 for the check's values):
#: 2⁻⁴·0.5 ≈ 3e-2 for e4m3, 2⁻³·0.5 ≈ 6e-2 for e5m2 — still tighter than FlashInfer's fp8-KV
#: tests (1e-1). Measured on the discriminating inputs (SGLang 0.5.23, DeepSeek-V3 and V2-Lite,
#: decode and chain verify): out max abs 1.8e-2 / cos 3.5e-5 (e4m3), 1.6e-2 / 4.0e-5 (e5m2). The
#: cosine bound, which is what sees a 5% scale error (docs/check-power.md), is 1e-4 for both.
FP8_DOT_TOLERANCES: dict[str, DtypeTolerance] = {
    "fp8_e4m3": DtypeTolerance(out=Tolerance(abs=3e-2, rel=2.0**-3, cos=1e-4), lse=Tolerance(abs=1e-3)),
    "fp8_e5m2": DtypeTolerance(out=Tolerance(abs=6e-2, rel=2.0**-2, cos=1e-4), lse=Tolerance(abs=2e-3)),
}


def tolerance_for(dtype: str, kv_dtype: str = "auto", *, fp8_dots: bool = False) -> DtypeTolerance:
    """The table entry for a case: the fp8 row for an fp8 cache (e4m3 or e5m2), else the compute dtype's row.

    ``fp8_dots``: the kernel also rounds q and P to the cache's fp8 dtype (``FP8_DOT_TOLERANCES``).
    """
    if fp8_dots and kv_dtype in FP8_DOT_TOLERANCES:
        return FP8_DOT_TOLERANCES[kv_dtype]
    return TOLERANCES["fp8_e4m3" if kv_dtype.startswith("fp8") else dtype]


def _pos(flat_index: int, shape: tuple[int, ...]) -> list[int]:
    pos = []
    for size in reversed(shape):
        pos.append(flat_index % size)
        flat_index //= size
    return pos[::-1]


@dataclasses.dataclass
class CloseResult:
    name: str
    ok: bool
    shape: list[int]  # of the answer
    ref_shape: list[int]
    dtype: str  # of the answer
    nan_mismatch: int = 0  # positions NaN in one tensor and not the other
    posinf_mismatch: int = 0
    neginf_mismatch: int = 0
    first_mismatch: list[int] | None = None  # first position of any special-value mismatch
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    worst_pos: list[int] | None = None  # element furthest out of tolerance (or with the largest error)
    worst_ans: float | None = None
    worst_ref: float | None = None
    fail_frac: float = 0.0  # elements failing abs-or-rel or a special-value match, over all elements
    cos_diff: float = 0.0
    tol: Tolerance | None = None
    message: str | None = None  # why it failed; None when ok

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["tol"] = self.tol.as_dict() if self.tol is not None else None
        return d


def merged_bound(tol: Tolerance, magnitude: torch.Tensor, dtype: torch.dtype, exchange: bool = False) -> torch.Tensor:
    """The relative part of an element's bound: ``rel`` on the size of the terms the output sums
    (``magnitude`` = ``max(|o|, Σ_j p_j·|v_j|)``); a DCP merge (``exchange``) adds its own two roundings in
    the output dtype (each rank's weighted partial and the sum; unit roundoff ``u``)."""
    u = torch.finfo(dtype).eps / 2 if dtype.is_floating_point and exchange else 0.0
    return (tol.rel + 2 * u) * magnitude


def check_close(name: str, ans: torch.Tensor, ref: torch.Tensor, tol: Tolerance,
                magnitude: torch.Tensor | None = None, exchange: bool = False) -> CloseResult:
    """Measure ``ans`` against ``ref`` (any float dtypes; compared in float64).

    ``magnitude`` (the shape of ``ref``, each element ``>= 0``) is the size of the terms
    each output element sums, ``Σ_j p_j·|v_j|`` (``power.output_magnitude``): the relative
    bound applies to ``max(|ref|, magnitude)``, since a kernel's rounding error scales with
    the terms, not with their (possibly cancelling) sum; ``exchange`` (a DCP merge of partials
    exchanged in the output dtype) adds the exchange's two roundings (``merged_bound``).
    """
    result = CloseResult(name=name, ok=False, shape=list(ans.shape), ref_shape=list(ref.shape),
                         dtype=str(ans.dtype).replace("torch.", ""), tol=tol)
    if tuple(ans.shape) != tuple(ref.shape):
        result.message = f"{name}: shape {list(ans.shape)} != reference {list(ref.shape)}"
        return result
    a = ans.detach().to("cpu", torch.float64).flatten()
    r = ref.detach().to("cpu", torch.float64).flatten()
    shape = tuple(ans.shape)
    problems = []

    special_bad = torch.zeros_like(a, dtype=torch.bool)
    for label, probe in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)):
        bad = probe(a) != probe(r)
        count = int(bad.sum())
        setattr(result, {"NaN": "nan_mismatch", "+inf": "posinf_mismatch", "-inf": "neginf_mismatch"}[label], count)
        if count:
            first = _pos(int(bad.nonzero()[0, 0]), shape)
            problems.append(f"{count} {label} position(s) differ (first at {first})")
            special_bad |= bad
    if special_bad.any():
        result.first_mismatch = _pos(int(special_bad.nonzero()[0, 0]), shape)

    finite = torch.isfinite(a) & torch.isfinite(r)
    err = torch.where(finite, (a - r).abs(), 0.0)
    if magnitude is None:
        scale = r.abs()
        elem_bad = finite & (err > tol.abs) & (err > tol.rel * scale)
    else:
        scale = torch.maximum(r.abs(), magnitude.detach().to("cpu", torch.float64).flatten())
        elem_bad = finite & (err > tol.abs) & (err > merged_bound(tol, scale, ans.dtype, exchange))
    rel = err / scale.clamp(min=1e-30)
    if finite.any():
        result.max_abs_err = float(err.max())
        result.max_rel_err = float(torch.where(finite, rel, 0.0).max())
        # Worst = furthest out of tolerance: the smaller of the two ratios decides pass/fail.
        ratio = torch.minimum(err / tol.abs if tol.abs > 0 else err * float("inf"),
                              rel / tol.rel if tol.rel > 0 else rel * float("inf"))
        ratio = torch.where(finite, torch.nan_to_num(ratio, nan=0.0), -1.0)
        worst = int(ratio.argmax())
        result.worst_pos = _pos(worst, shape)
        result.worst_ans, result.worst_ref = float(a[worst]), float(r[worst])
        af, rf = a[finite], r[finite]
        denom = float((af * af + rf * rf).sum())
        result.cos_diff = 1.0 - 2.0 * float((af * rf).sum()) / denom if denom > 0 else 0.0
    n_bad = int((elem_bad | special_bad).sum())
    result.fail_frac = n_bad / max(a.numel(), 1)
    if elem_bad.any():
        problems.append(
            f"{int(elem_bad.sum())} element(s) beyond abs {tol.abs:g} and rel {tol.rel:g} "
            f"(max abs {result.max_abs_err:.3g}, max rel {result.max_rel_err:.3g}; worst at {result.worst_pos}: "
            f"{result.worst_ans:.6g} vs {result.worst_ref:.6g})"
        )
    if tol.cos is not None and result.cos_diff > tol.cos:
        problems.append(f"cos diff {result.cos_diff:.3g} > {tol.cos:g}")
    result.ok = not problems
    result.message = f"{name}: " + "; ".join(problems) if problems else None
    return result


def tolerance_record(tol: Any, magnitude: bool, exchange: bool = False) -> dict[str, Any]:
    """The tolerance as the record states it, with what its relative bound applies to."""
    d = tol.as_dict()
    if magnitude:
        d["out"]["rel_to"] = "max(|ref|, sum_j p_j |v_j|)" + (
            " + 2 unit roundoffs of the output dtype (DCP exchange)" if exchange else "")
    return d
