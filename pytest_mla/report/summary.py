"""The terminal summary of a matrix run, built as lines (the controller writes them).

``build_summary`` is a pure function of the records, the documents and
what the gate found, like pytest's ``build_summary_stats_line``: it
returns ``(text, markup)`` pairs and writes nothing.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Mapping, Sequence

from ..core.records import CellRecord, kernel_of
from ..core.verdicts import ERROR, FAIL, KERNEL_FAILED, VERIFIED
from .model import kernel_counts_text, power_counts, reason_line, tier_line, verdict_counts, verified_state
from .symbols import EMULATED

__all__ = ["build_summary", "worst_kernel_errors"]

Line = tuple[str, dict[str, bool]]

#: Failing cells listed without -v.
LIST_LIMIT = 20


def build_summary(records: Sequence[CellRecord], documents: Iterable[Mapping[str, Any]], *, verbosity: int,
                  baseline: str | None, regressions: Sequence[tuple[str, Any]],
                  written: Sequence[str], interrupted: bool = False,
                  models: Mapping[int, Any] | None = None) -> list[Line]:
    """The lines under ``== mla matrix ==`` (empty when no cell ran). ``models``: ``id(document)`` →
    its ``ReportModel``, made for the reports already (the sketch shares its work)."""
    if not records:
        return []
    documents = list(documents)
    lines: list[Line] = []
    counts = Counter(r["verdict"] for r in records)
    kernels = Counter(verified_state(r) if kernel_of(r).get("status") == VERIFIED else kernel_of(r).get("status")
                      for r in records)
    lines.append((f"{len(records)} cells: " + ", ".join(verdict_counts(counts)), {}))
    for tier in dict.fromkeys(filter(None, (tier_line(d.get("run") or {}) for d in documents))):
        lines.append((tier, {"yellow": True}))
    if interrupted:
        total = sum(int((d.get("run") or {}).get("cells_total") or 0) for d in documents)
        of = f" of {total}" if total else ""
        lines.append((f"INTERRUPTED after {len(records)}{of} cells: the report is incomplete "
                      f"(run.complete false, run.interrupted true)", {"red": True, "bold": True}))
    if kernels.get(VERIFIED) or kernels.get(EMULATED) or kernels.get(KERNEL_FAILED):
        reused = sum(1 for r in records if kernel_of(r).get("reused"))
        lines.append((f"kernels: {kernel_counts_text(kernels, reused)}", {}))
        worst = worst_kernel_errors(records)
        if worst:
            lines.append(("  worst of the verified: " + worst, {}))
        power = power_counts(records)
        if power:
            lines.append(("  " + power, {}))
    bad = [r for r in records if r["verdict"] in (FAIL, ERROR)]
    limit = None if verbosity > 0 else LIST_LIMIT
    for r in bad[:limit]:
        # the whole reason on one line: the expectation and the engine's text, not a line ending at a colon
        lines.append((f"  {r['verdict'].upper():5} {r['id']}: {reason_line(r.get('reason'))}", {}))
    if limit is not None and len(bad) > limit:
        lines.append((f"  ... and {len(bad) - limit} more (-v lists all)", {}))
    if verbosity >= -1:  # -q (make matrix) keeps the sketch: it is the run's answer; -qq drops it
        from .terminal import render_terminal

        models = models or {}
        texts = [render_terminal(doc, model=models.get(id(doc))) for doc in documents if doc["cells"]]
        if texts:
            lines.append(("\n".join(texts), {}))
    if baseline is not None:
        if regressions:
            lines.append((f"{len(regressions)} regression(s) against {baseline}:", {"red": True}))
            for matrix, change in regressions:
                lines.append((f"  REGRESSION {matrix}: {change.id}: {change.old} -> {change.new}"
                              + (f" ({change.reason})" if change.reason else ""), {}))
        else:
            lines.append((f"no regressions against {baseline}", {}))
    lines += [(f"mla report: {path}", {}) for path in written]
    return lines


def worst_kernel_errors(records: Iterable[CellRecord]) -> str:
    """The largest errors over the verified kernel checks, and the kernel time spent."""
    runs = [kernel_of(r) for r in records if kernel_of(r).get("status") == VERIFIED]
    out = [(k.get("errors") or {}).get("out") or {} for k in runs]
    lse = [(k.get("errors") or {}).get("lse") or {} for k in runs]
    if not out:
        return ""

    def top(rows: list[dict[str, Any]], key: str) -> float:
        return max((float(r[key]) for r in rows if isinstance(r.get(key), (int, float))), default=0.0)

    spent = sum(float(k.get("time_s") or 0) for k in runs if not k.get("reused"))
    # (max_rel_err alone misleads: near-zero elements pass by the absolute bound.)
    return (f"out max abs {top(out, 'max_abs_err'):.2e}, outside abs-or-rel {top(out, 'fail_frac'):.0%}, "
            f"cos diff {top(out, 'cos_diff'):.2e}; lse max abs {top(lse, 'max_abs_err'):.2e}; "
            f"kernel time {spent:.1f} s")
