"""Differences between two result documents (last night's and tonight's).

``diff_documents(old, new)`` pairs cells by id and sorts each change into one
kind:

- ``regression``: was good (pass / xfail) and is now bad (fail / error), or
  its kernel went from ``verified`` to ``failed``;
- ``fix``: was bad and is now good;
- ``changed``: both good but the cell means something else now (accepted ↔
  rejected, another error or message, another state such as verified →
  not-run, pass ↔ xfail);
- ``new`` / ``gone``: only in the new / only in the old document;
- ``unreported``: only in the old document, when the new one is incomplete
  (``run.complete`` false: an interrupted run, a shard, a selection): the
  cell did not run, which says nothing about whether it is gone.

Beside the cells, the *findings* (``findings.py``: accepted configurations
whose engine code failed, one entry per distinct bug) are compared in their
own section: a finding that ``appeared``, one that ``disappeared`` from cells
that still ran (fixed upstream: its known-bug rule may go), and cells whose
finding ``changed`` (another exception, another engine function: the bug
moved). Cells an incomplete new run lacks count for none of them.

An interrupted new run (``run.interrupted``) fails the gate like a
regression: a nightly whose run died must not pass it (``Diff.gate_fails``).

``Diff.markdown()`` is a PR comment; ``Diff.text()`` is for a terminal.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Mapping

from ..core.records import kernel_of
from ..core.verdicts import KERNEL_FAILED, VERIFIED
from .findings import group_findings
from .markdown import md_text
from .model import BAD_VERDICTS, GOOD_VERDICTS, SYMBOLS, cell_state, reason_line


@dataclasses.dataclass(frozen=True)
class Change:
    id: str
    kind: str  # regression / fix / changed / new / gone
    old: str | None  # "pass (verified)", None for new cells
    new: str | None
    reason: str | None = None  # why the new side is bad, for regressions

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class FindingChange:
    """A finding that appeared, disappeared or changed between the two runs, and the cells concerned."""

    kind: str  # appeared / disappeared / changed
    title: str  # the finding: ``decode raises AssertionError in MLATokenToKVPool.set_kv_buffer``
    before: str | None  # what the old run's cells raised (None: they were no finding)
    after: str | None  # what the new run's cells raised, or what they are now
    cells: tuple[str, ...]
    note: str | None = None  # "still a finding in 3 other cells", "already a finding in 2 other cells"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Diff:
    old_name: str
    new_name: str
    regressions: list[Change]
    fixes: list[Change]
    changed: list[Change]
    new: list[Change]
    gone: list[Change]
    unchanged: int
    unreported: list[Change] = dataclasses.field(default_factory=list)
    old_incomplete: str | None = None  # why the old document is incomplete ("interrupted: 38 of 76 cells")
    new_incomplete: str | None = None
    new_interrupted: bool = False
    findings: list[FindingChange] = dataclasses.field(default_factory=list)

    @property
    def has_regressions(self) -> bool:
        return bool(self.regressions)

    @property
    def gate_fails(self) -> bool:
        """Regressions, or a new run that was interrupted (its missing cells could be anything)."""
        return self.has_regressions or self.new_interrupted

    def warnings(self) -> list[str]:
        """One line per incomplete side, saying what it means for the comparison."""
        out = []
        if self.new_incomplete:
            verdict = ("the gate fails: a run that did not finish cannot pass it" if self.new_interrupted
                       else "its other cells are not compared")
            out.append(f"{self.new_name} is incomplete ({self.new_incomplete}): {verdict}")
        if self.old_incomplete:
            out.append(f"{self.old_name} is incomplete ({self.old_incomplete}): cells it lacks show as new")
        return out

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def summary_line(self) -> str:
        unreported = f", {len(self.unreported)} not reported" if self.unreported else ""
        line = (f"{len(self.regressions)} regression(s), {len(self.fixes)} fix(es), {len(self.changed)} changed, "
                f"{len(self.new)} new, {len(self.gone)} gone{unreported}, {self.unchanged} unchanged")
        if self.findings:
            counts = {k: sum(1 for f in self.findings if f.kind == k) for k in FINDING_KINDS}
            line += "; findings: " + ", ".join(f"{n} {k}" for k, n in counts.items() if n)
        return line

    def findings_text(self) -> list[str]:
        lines = []
        for kind, title in FINDING_TITLES.items():
            for f in (f for f in self.findings if f.kind == kind):
                lines.append(f"  FINDING {kind.upper()}: {f.title} ({len(f.cells)} cell(s): {_first(f.cells)})")
                if f.before is not None or f.after is not None:
                    lines.append(f"      {f.before or '—'} → {f.after or '—'}")
                if f.note:
                    lines.append(f"      {f.note}")
        return lines

    def findings_markdown(self) -> list[str]:
        if not self.findings:
            return []
        lines = [f"#### Findings ({len(self.findings)})", "",
                 "Accepted configurations whose engine code failed, compared as distinct bugs.", ""]
        for kind, title in FINDING_TITLES.items():
            chosen = [f for f in self.findings if f.kind == kind]
            if not chosen:
                continue
            lines += [f"**{title}**", "", "| finding | cells | before | after |", "|---|---|---|---|"]
            for f in chosen:
                note = f" ({md_text(f.note)})" if f.note else ""
                lines.append(f"| {md_text(f.title)}{note} | {len(f.cells)}: `{_code(_first(f.cells))}` | "
                             f"{md_text(f.before or '—')} | {md_text(f.after or '—')} |")
            lines.append("")
        return lines

    def text(self, limit: int = 50) -> str:
        lines = [f"{self.old_name} → {self.new_name}: {self.summary_line()}"]
        lines += [f"  INCOMPLETE {w}" for w in self.warnings()]
        for title, items in (("REGRESSION", self.regressions), ("FIX", self.fixes), ("CHANGED", self.changed),
                             ("NEW", self.new), ("GONE", self.gone), ("UNREPORTED", self.unreported)):
            for c in items[:limit]:
                arrow = f"{c.old or '—'} → {c.new or '—'}"
                why = f": {c.reason}" if c.reason else ""
                lines.append(f"  {title:10} {c.id}: {arrow}{why}")
            if len(items) > limit:
                lines.append(f"  {title:10} ... and {len(items) - limit} more")
        lines += self.findings_text()
        return "\n".join(lines)

    def markdown(self, limit: int = 200) -> str:
        head = "❌" if self.gate_fails else "✅"
        lines = [f"### {head} pytest-mla: {md_text(self.summary_line())}", "",
                 f"`{_code(self.old_name)}` → `{_code(self.new_name)}`", ""]
        lines += [f"> ⚠️ {md_text(w)}" for w in self.warnings()] + ([""] if self.warnings() else [])
        for title, items in (("Regressions", self.regressions), ("Fixes", self.fixes), ("Changed", self.changed),
                             ("New cells", self.new), ("Gone cells", self.gone),
                             ("Not reported (the new run is incomplete)", self.unreported)):
            if not items:
                continue
            lines += [f"#### {title} ({len(items)})", "", "| cell | before | after | why |", "|---|---|---|---|"]
            for c in items[:limit]:
                lines.append(f"| `{_code(c.id)}` | {md_text(c.old or '—')} | {md_text(c.new or '—')} | {md_text(c.reason or '')} |")
            if len(items) > limit:
                lines.append(f"| … | {len(items) - limit} more | | |")
            lines.append("")
        lines += self.findings_markdown()
        return "\n".join(lines).rstrip() + "\n"


FINDING_KINDS = ("appeared", "disappeared", "changed")
FINDING_TITLES = {"appeared": "Appeared", "disappeared": "Disappeared (fixed upstream?)",
                  "changed": "Changed error (the same cells fail otherwise)"}


def _first(cells: tuple[str, ...]) -> str:
    return cells[0] + (f" and {len(cells) - 1} more" if len(cells) > 1 else "")


def _code(text: Any) -> str:
    return str(text).replace("`", "'").replace("\n", " ").replace("|", "\\|")


def describe_cell(record: Mapping[str, Any]) -> str:
    """``pass ✅ verified``: the verdict and the legend state."""
    state = cell_state(record)
    return f"{record.get('verdict')} {SYMBOLS[state]} {state}"


def _meaning(record: Mapping[str, Any]) -> tuple[Any, ...]:
    o = record.get("outcome") or {}
    return (record.get("verdict"), cell_state(record), o.get("kind"), o.get("error"), o.get("message"))


def diff_documents(old: Mapping[str, Any], new: Mapping[str, Any], *, old_name: str = "old",
                   new_name: str = "new") -> Diff:
    old_cells = {c["id"]: c for c in old["cells"]}
    new_cells = {c["id"]: c for c in new["cells"]}
    out = Diff(old_name, new_name, [], [], [], [], [], 0)
    for cid, n in new_cells.items():
        o = old_cells.get(cid)
        if o is None:
            out.new.append(Change(cid, "new", None, describe_cell(n), _why(n)))
            continue
        ov, nv = o.get("verdict"), n.get("verdict")
        ok_old = kernel_of(o).get("status")
        ok_new = kernel_of(n).get("status")
        before, after = describe_cell(o), describe_cell(n)
        if (ov in GOOD_VERDICTS and nv in BAD_VERDICTS) or (ok_old == VERIFIED and ok_new == KERNEL_FAILED):
            out.regressions.append(Change(cid, "regression", before, after, _why(n)))
        elif ov in BAD_VERDICTS and nv in GOOD_VERDICTS:
            out.fixes.append(Change(cid, "fix", before, after))
        elif _meaning(o) != _meaning(n):
            out.changed.append(Change(cid, "changed", before, after, _why(n) if nv in BAD_VERDICTS else None))
        else:
            out.unchanged += 1
    out.old_incomplete, out.new_incomplete = incompleteness(old), incompleteness(new)
    out.new_interrupted = bool((new.get("run") or {}).get("interrupted"))
    for cid, o in old_cells.items():
        if cid not in new_cells:
            if out.new_incomplete:
                out.unreported.append(Change(cid, "unreported", describe_cell(o), None))
            else:
                out.gone.append(Change(cid, "gone", describe_cell(o), None))
    out.findings = diff_findings(old, new)
    return out


def diff_findings(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[FindingChange]:
    """Findings that appeared, disappeared (their cells ran and are no finding now) or changed, cell by cell."""
    engine = str(((new.get("run") or {}).get("engine") or {}).get("name") or "")
    old_found = group_findings(old["cells"], engine)
    new_found = group_findings(new["cells"], engine)
    old_of = {r["id"]: f for f in old_found for r in f.records}
    new_of = {r["id"]: f for f in new_found for r in f.records}
    new_cells = {c["id"]: c for c in new["cells"]}
    old_keys = {f.facts.key for f in old_found}
    new_keys = {f.facts.key: f for f in new_found}
    out: list[FindingChange] = []
    for f in old_found:
        moved: dict[int, list[str]] = {}
        fixed: list[str] = []
        for cid in f.ids:
            if cid not in new_cells:
                continue  # not reported, or gone: it says nothing about the bug
            now = new_of.get(cid)
            if now is None:
                fixed.append(cid)
            elif now.facts.key != f.facts.key:
                moved.setdefault(now.number, []).append(cid)
        if fixed:
            states = Counter(describe_cell(new_cells[cid]) for cid in fixed)
            after = "now " + ", ".join(f"{n}× {s}" if len(states) > 1 else s for s, n in states.items())
            remains = new_keys.get(f.facts.key)
            note = f"still a finding in {len(remains.records)} other cell(s)" if remains is not None else None
            out.append(FindingChange("disappeared", f.facts.title, f.facts.statement, after, tuple(fixed), note))
        for number, cids in moved.items():
            now = next(n for n in new_found if n.number == number)
            out.append(FindingChange("changed", f"{f.facts.title} → {now.facts.title}", f.facts.statement,
                                     now.facts.statement, tuple(cids)))
    for f in new_found:
        fresh = [cid for cid in f.ids if cid not in old_of]
        if not fresh:
            continue
        note = "already a finding in other cells of the old run" if f.facts.key in old_keys else None
        out.append(FindingChange("appeared", f.facts.title, None, f.facts.statement, tuple(fresh), note))
    return out


def incompleteness(document: Mapping[str, Any]) -> str | None:
    """Why a result document does not hold every cell of its matrix (None: it does)."""
    run = document.get("run") or {}
    total, reported = run.get("cells_total"), run.get("cells_reported", len(document.get("cells") or []))
    if run.get("complete", True) and not run.get("interrupted"):
        return None
    counts = f"{reported} of {total} cells reported" if total is not None else f"{reported} cells reported"
    return f"interrupted: {counts}" if run.get("interrupted") else counts


def _why(record: Mapping[str, Any]) -> str | None:
    """Why a cell is bad, on one line: the expectation and the engine's text, not just the first line."""
    if record.get("verdict") in BAD_VERDICTS or kernel_of(record).get("status") == KERNEL_FAILED:
        k = kernel_of(record)
        return reason_line(record.get("reason")) or reason_line(k.get("message")) or None
    return None


__all__ = ["Change", "Diff", "FindingChange", "diff_documents", "diff_findings", "describe_cell"]
