"""Findings: configurations the engine accepted whose own code then failed, one entry per distinct bug.

A cell is a *finding* when the engine accepted it and its kernel check then
failed in the engine's own code: the engine raised (``kernel.finding``), or
its output was out of tolerance of the float64 reference (``kernel.status``
``failed``, not a crash of the harness). The matrix may declare it a known
bug (verdict ``xfail``) or not (verdict ``fail``).

Cells that fail the same way are one finding: the same engine, step (decode
or speculative verify), level, engine function, and exception class and text
(digits aside: a shape in a message does not split a finding), or, for a
mismatch, the same computing function. Findings are numbered ``F1``, ``F2``,
... in matrix order, which the reports' notes cite instead of repeating the
text per cell.

Pure functions of the result document (core only), shared by the renderers,
``diff`` and ``pytest-mla repro``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable, Mapping, Sequence

from ..core.records import kernel_of
from ..core.text import visible
from ..core.verdicts import ACCEPTED, KERNEL_FAILED
from .serving import ServerPhase, server_phase, step_of

__all__ = ["Finding", "FindingFacts", "finding_facts", "group_findings", "not_a_finding", "repro_command",
           "short_function"]

#: ``run_check``'s message for an engine that raised after accepting (records without ``raised``).
_RAISED = re.compile(r"^engine accepted this configuration, but its backend raised "
                     r"(?P<error>[A-Za-z_][\w.]*): (?P<text>.*?)(?: in (?P<function>\S+))?$", re.DOTALL)
EMULATED_LEVEL = "emulated"


def short_function(function: str | None) -> str:
    """``MLATokenToKVPool.set_kv_buffer`` for ``sglang.srt.mem_cache.memory_pool:MLATokenToKVPool.set_kv_buffer``."""
    if not function:
        return "the engine's code"
    return function.rpartition(":")[2] or function


def _one_line(text: Any) -> str:
    return visible(" ".join(str(text).split())) if text else ""


#: The exception an emulated kernel (``kernels/emulated/glue.OutOfRangeRead``) or a runner's guard raises where the
#: engine handed it an index outside the cache: its name, read here without importing the kernels (torch).
OUT_OF_RANGE = "OutOfRangeRead"


@dataclasses.dataclass(frozen=True)
class FindingFacts:
    """What one cell's finding is."""

    engine: str
    kind: str  # "raised" or "mismatch"
    step: str  # "decode" or "verify"; "cache write": raised writing the cached tokens, before the decode or verify
    level: str | None  # kernel.level: "backend", "kernel", "emulated", ...
    function: str | None  # raised: the innermost engine function; mismatch: the engine function that computed
    error: str  # the exception's class name; "mismatch" for an output out of tolerance
    text: str  # the exception's text, or the check's message
    frames: tuple[str, ...] = ()  # raised: the engine's frames, outermost first (when the record has them)
    emulated: tuple[str, ...] = ()  # level emulated: the library callables that ran as emulations
    #: A mismatch only with NaN-poisoned free cache slots: with them zero-filled (the engines' own caches
    #: start so) the output matched (``kernel.free_slot_only``): a hardening gap, not a wrong output.
    hardening: bool = False

    @property
    def key(self) -> tuple[Any, ...]:
        """Cells with equal keys are one finding."""
        text = re.sub(r"\d+", "N", self.text) if self.kind == "raised" else ""
        return (self.engine, self.kind, self.step, self.level, self.function, self.error, text, self.hardening)

    @property
    def out_of_range(self) -> bool:
        """Raised by the check's own guard, not by the engine: the engine handed a kernel (or its write path) an
        index outside the cache (``OutOfRangeRead``), which the real kernel follows without raising."""
        return self.kind == "raised" and self.error == OUT_OF_RANGE

    @property
    def title(self) -> str:
        """``decode raises AssertionError in MLATokenToKVPool.set_kv_buffer``."""
        if self.out_of_range:
            return f"{self.step} indexes outside the cache in {short_function(self.function)}"
        if self.kind == "raised":
            return f"{self.step} raises {self.error} in {short_function(self.function)}"
        if self.hardening:
            return f"{self.step}: a NaN in a free cache slot reaches the output of {short_function(self.function)}"
        return f"{self.step} out of tolerance in {short_function(self.function)}"

    @property
    def phase(self) -> ServerPhase:
        kind = "hardening" if self.hardening else "out-of-range" if self.out_of_range else self.kind
        return server_phase(self.engine, self.step, kind, self.function)

    @property
    def statement(self) -> str:
        """``AssertionError: ...`` or the mismatch message, on one line."""
        return f"{self.error}: {_one_line(self.text)}" if self.kind == "raised" else _one_line(self.text)


def finding_facts(record: Mapping[str, Any], engine: str = "") -> FindingFacts | None:
    """The finding of a cell record, or None when the cell is not one (see ``not_a_finding``)."""
    outcome = record.get("outcome") or {}
    k = kernel_of(record)
    if outcome.get("kind") != ACCEPTED or k.get("status") != KERNEL_FAILED or k.get("crashed"):
        return None
    # the check's step the engine's code raised in: one before the step under test (a cached token written
    # through the engine's own write path: "cache write") says so, else the cell's decode or verify
    step = str(k.get("step") or step_of(record.get("coords") or {}))
    level = k.get("level")
    emulated = tuple(k.get("emulated") or ())
    if k.get("finding"):
        message = str(k.get("message") or "")
        parsed = _RAISED.match(message)
        error = k.get("raised") or (parsed.group("error") if parsed else "Exception")
        text = k.get("raised_text") if k.get("raised") else (parsed.group("text") if parsed else message)
        return FindingFacts(engine, "raised", step, level, k.get("function"), str(error), str(text or ""),
                            tuple(k.get("frames") or ()), emulated)
    return FindingFacts(engine, "mismatch", step, level, k.get("function"), "mismatch",
                        str(k.get("message") or "out of tolerance"), (), emulated, bool(k.get("free_slot_only")))


def not_a_finding(record: Mapping[str, Any]) -> str:
    """Why a cell is not a finding, in one clause (for ``pytest-mla repro`` on such a cell)."""
    outcome = record.get("outcome") or {}
    k = kernel_of(record)
    verdict = record.get("verdict")
    if verdict == "skip":
        return f"it was skipped ({_one_line(record.get('reason')) or 'no reason given'})"
    if outcome.get("kind") == "rejected":
        said = f"{outcome.get('error')}: {_one_line(outcome.get('message'))}"
        if verdict in ("pass", "xfail"):
            return f"the engine refused it, as the matrix says ({said})"
        return f"the engine refused it ({said}): a validation mismatch, not a failure of the engine's code after accepting"
    if outcome.get("kind") in (None, "crashed") or verdict == "error":
        return f"it did not run to a result ({_one_line(record.get('reason')) or verdict or 'no verdict'})"
    if k.get("crashed"):
        return f"its check crashed in the harness, not in the engine ({_one_line(k.get('message'))})"
    status = k.get("status")
    if status == "verified":
        return f"it passed: the engine accepted it and its kernel was verified ({verdict})"
    if status == "not-run":
        return f"it passed validation but its kernel did not run here ({_one_line(k.get('reason'))})"
    if verdict == "fail":
        return f"its failure is a validation mismatch, not the engine's code: {_one_line(record.get('reason'))}"
    return f"it passed ({verdict}); the engine accepted it and no kernel check failed"


@dataclasses.dataclass
class Finding:
    """One distinct finding and the cells it covers (in matrix order)."""

    number: int
    facts: FindingFacts  # of its first cell
    records: list[Mapping[str, Any]]

    @property
    def label(self) -> str:
        return f"F{self.number}"

    @property
    def ids(self) -> list[str]:
        return [str(r.get("id")) for r in self.records]

    @property
    def xfail(self) -> str | None:
        """The matrix's known-bug text of its first declared cell (None: not declared)."""
        for r in self.records:
            text = (r.get("expectation") or {}).get("xfail")
            if text:
                return str(text)
        return None

    @property
    def links(self) -> tuple[str, ...]:
        """The upstream reports the matrix names for it (every cell's ``expectation.links``, once each)."""
        seen: dict[str, None] = {}
        for r in self.records:
            for link in (r.get("expectation") or {}).get("links") or ():
                seen.setdefault(str(link), None)
        return tuple(seen)

    @property
    def verdicts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.records:
            out[str(r.get("verdict"))] = out.get(str(r.get("verdict")), 0) + 1
        return out

    def note(self) -> str:
        """What a table note says of it: ``F1, decode raises ... ; a server fails at start-up``."""
        return f"{self.label}, {self.facts.title}; {self.facts.phase.short} (see Findings)"

    def coverage(self, axes: Sequence[str], order: Mapping[str, Mapping[Any, int]] | None = None
                 ) -> list[tuple[str, list[Any]]]:
        """Per axis, the values its cells take, in matrix order."""
        return _coverage(self.records, axes, order)

    def describe_cells(self, axes: Sequence[str], order: Mapping[str, Mapping[Any, int]] | None = None) -> str:
        """``model a, b · dcp 4 · ...; backend triton with kv_dtype auto, fp8_e4m3; backend fa3 with kv_dtype
        fp8_e5m2``: the axes every backend shares once, then what each backend adds."""
        def words(pairs: Sequence[tuple[str, list[Any]]]) -> str:
            return " · ".join(f"{axis} {', '.join(str(v) for v in values)}" for axis, values in pairs)

        by_backend: dict[Any, list[Mapping[str, Any]]] = {}
        for r in self.records:
            by_backend.setdefault((r.get("coords") or {}).get("backend"), []).append(r)
        rest = [a for a in axes if a != "backend"]
        per = {b: dict(_coverage(rs, rest, order)) for b, rs in by_backend.items()}
        if len(per) < 2:
            return words(_coverage(self.records, axes, order))
        shared = [a for a in rest if all(p.get(a) == next(iter(per.values())).get(a) for p in per.values())]
        head = words([(a, next(iter(per.values()))[a]) for a in shared if a in next(iter(per.values()))])
        tails = []
        for backend, cover in per.items():
            own = [(a, cover[a]) for a in rest if a not in shared and a in cover]
            tails.append(f"backend {backend}" + (f" with {words(own)}" if own else ""))
        return (head + "; " if head else "") + "; ".join(tails)


def _coverage(records: Sequence[Mapping[str, Any]], axes: Sequence[str],
              order: Mapping[str, Mapping[Any, int]] | None) -> list[tuple[str, list[Any]]]:
    out = []
    for axis in axes:
        values: list[Any] = []
        for r in records:
            v = (r.get("coords") or {}).get(axis)
            if v is not None and v not in values:
                values.append(v)
        if order and axis in order:
            values.sort(key=lambda v, a=axis: order[a].get(v, 1 << 30))
        if values:
            out.append((axis, values))
    return out


def group_findings(records: Iterable[Mapping[str, Any]], engine: str = "") -> list[Finding]:
    """Every finding among ``records``, numbered in the order their first cells come."""
    by_key: dict[tuple[Any, ...], Finding] = {}
    for record in records:
        facts = finding_facts(record, engine)
        if facts is None:
            continue
        found = by_key.get(facts.key)
        if found is None:
            by_key[facts.key] = Finding(len(by_key) + 1, facts, [record])
        else:
            found.records.append(record)
    return list(by_key.values())


def repro_command(cell_id: str, result: str = "RESULT.json") -> str:
    """The command that writes a cell's reproducer and bug report."""
    return f"pytest-mla repro {result} {cell_id} -o repro.py --report bug.md"
