"""One model of a result document, shared by every renderer.

A result document (``results.py``) is a flat list of cell records. Renderers
want it folded: pick *table* axes (one table per value), *row* axes and
*column* axes; every other axis is *hidden*, and each table cell summarises
the records that differ only in hidden axes. ``ReportModel.tables`` does the
folding; ``summarise`` turns one group of records into a symbol, a count and
the notes that explain it. Pure Python: no torch, no I/O.

States of one record (``cell_state``) and their symbols are those of
``symbols.py``, the one set every view uses: verified ✅, emulated 🧪,
accepted ☑️, rejected ⛔, xfail ⚠️, skipped ➖, bad ❌ (and ◐ for a group
accepted only in part).
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..core.cells import AXES, format_part
from ..core.models import BUILTIN_MODELS
from ..core.records import GRAPH_PADDED, kernel_of
from ..core.text import visible
from ..core.verdicts import ACCEPTED, ERROR, FAIL, KERNEL_FAILED, PASS, REJECTED, SKIP, VERDICTS, VERIFIED, XFAIL, XPASS
from .findings import Finding, group_findings
from .symbols import BAD, CELL_STATES, EMULATED, MISSING, SKIPPED
from .symbols import PARTIAL as PARTIAL_STATE
from .symbols import SYMBOLS as _SYMBOLS
from .symbols import legend

# Legend states (``symbols.py``). Four are the words of ``core/verdicts.py``: ``verified`` (kernel
# status), ``accepted`` / ``rejected`` (outcome kinds), ``xfail`` (verdict); the others exist only in reports.
STATES = CELL_STATES
#: state → its emoji, for the Markdown and terminal views.
SYMBOLS = {state: symbol.emoji for state, symbol in _SYMBOLS.items()}
PARTIAL = _SYMBOLS[PARTIAL_STATE].emoji
LEGEND = tuple(legend((VERIFIED, EMULATED, ACCEPTED, REJECTED, PARTIAL_STATE, XFAIL, SKIPPED, BAD)))
ACCEPTED_STATES = (VERIFIED, EMULATED, ACCEPTED)
#: Verdicts that count as good / bad when comparing runs.
GOOD_VERDICTS = (PASS, XFAIL)
BAD_VERDICTS = (FAIL, ERROR)


def cell_state(record: Mapping[str, Any]) -> str:
    """The legend state of one cell record."""
    verdict = record.get("verdict")
    if verdict in BAD_VERDICTS or verdict is None:
        return BAD
    if verdict in (XFAIL, XPASS):
        return XFAIL
    if verdict == SKIP:
        return SKIPPED
    outcome = record.get("outcome") or {}
    if outcome.get("kind") == REJECTED:
        return REJECTED
    status = kernel_of(record).get("status")
    if status == VERIFIED:
        return verified_state(record)
    if status == KERNEL_FAILED:
        return BAD
    return ACCEPTED


#: ``kernel.level`` of a check that ran the engine's backend code around emulated kernels.
EMULATED_LEVEL = "emulated"


def verified_state(record: Mapping[str, Any]) -> str:
    """``verified`` when a real kernel ran (on any host of a merge), ``emulated`` when every verified
    run emulated the kernels: the two promises differ and are never shown as one."""
    runs = record.get("kernel_runs") or [kernel_of(record)]
    levels = [r.get("level") for r in runs if isinstance(r, Mapping) and r.get("status") == VERIFIED]
    return EMULATED if levels and all(level == EMULATED_LEVEL for level in levels) else VERIFIED


def kernel_counts_text(counts: Mapping[str, int], reused: int | None = None) -> str:
    """``3 verified on a kernel, 2 with emulated kernels, 0 failed, 4 not run``: one wording in
    every view (``counts`` by kernel status, ``emulated`` split off as ``ReportModel.kernel_counts`` does)."""
    again = f" ({reused} reused)" if reused is not None else ""
    return (f"{counts.get(VERIFIED, 0)} verified on a kernel{again}, {counts.get(EMULATED, 0)} with emulated kernels, "
            f"{counts.get(KERNEL_FAILED, 0)} failed, {counts.get('not-run', 0)} not run")


def verdict_counts(counts: Mapping[str, int]) -> list[str]:
    """``["3 pass", "1 fail"]``: the non-zero verdicts, in the order of ``core/verdicts.py``."""
    return [f"{counts[v]} {v}" for v in VERDICTS if counts.get(v)]


def first_line(text: Any) -> str:
    if not text:
        return ""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return lines[0] if lines else ""


def one_line(text: Any) -> str:
    """A message on one line (engine messages may wrap), invisible characters as escapes."""
    return visible(" ".join(str(text).split())) if text else ""


def rejection_text(record: Mapping[str, Any]) -> str:
    """``ValueError: message`` as the engine raised it."""
    outcome = record.get("outcome") or {}
    error = outcome.get("error") or (record.get("expectation") or {}).get("error") or "error"
    return f"{error}: {one_line(outcome.get('message'))}"


def reason_line(text: Any) -> str:
    """A multi-line reason on one line, keeping what each line says.

    ``judge`` writes ``expected accept, but the engine rejected it:`` and the
    raised text on the next line; a summary that kept only the first line
    would end at the colon. The caret line of a text diff is dropped (its
    words stay: "first difference at character N").
    """
    if not text:
        return ""
    parts = []
    for line in visible(text).splitlines():
        line = " ".join(line.split())
        if line.startswith("^"):
            line = "(" + line.lstrip("^ ").strip() + ")"
        if line:
            parts.append(line)
    out = ""
    for part in parts:
        out += part if not out else ((" " if out.endswith(":") or part.startswith("(") else "; ") + part)
    return out


def state_note(record: Mapping[str, Any], state: str, finding: Finding | None = None) -> str | None:
    """The text a note quotes for a record in ``state`` (None: nothing to explain); a record of a
    ``finding`` cites it (the Findings section holds its text once)."""
    if state == REJECTED:
        return rejection_text(record)
    if state == XFAIL:
        label = "xpass" if record.get("verdict") == "xpass" else "xfail"
        if finding is not None:
            return f"{label}: {finding.note()}"
        reason = (record.get("expectation") or {}).get("xfail") or record.get("reason")
        return f"{label}: {one_line(reason)}" if reason else label
    if state == SKIPPED:
        return f"skipped: {one_line(record.get('reason'))}" if record.get("reason") else "skipped"
    if state == BAD:
        if finding is not None:
            return f"{record.get('verdict') or 'error'}: {finding.note()}"
        return f"{record.get('verdict') or 'error'}: {reason_line(record.get('reason')) or 'no result'}"
    return None


def format_value(axis: str, value: Any) -> str:
    return format_part(axis, value) if axis in AXES else str(value)


def format_key(axes: Sequence[str], key: Sequence[Any], sep: str = " · ") -> str:
    return sep.join(format_value(a, v) for a, v in zip(axes, key))


#: The fields of a cell record that everything but its coordinates and names is made of: records
#: whose values for them are the same objects (as records read from a file share them) have the
#: same state, note and details.
BODY_FIELDS = ("verdict", "expectation", "outcome", "reason", "kernel", "kernel_runs", "notes")


class Notes:
    """Numbered notes, deduplicated by text, numbered in order of first reference.

    A note may cite other notes (``links``: their numbers, written ``[n]`` in
    its text), which the HTML page turns into links.
    """

    def __init__(self, first: int = 1) -> None:
        self.first = first  # the number of the first note: a second list in one document goes on from the first
        self.numbers: dict[str, int] = {}
        self.links: dict[int, tuple[int, ...]] = {}

    def ref(self, text: str, links: Sequence[int] = ()) -> int:
        if text not in self.numbers:
            self.numbers[text] = len(self.numbers) + self.first
            if links:
                self.links[self.numbers[text]] = tuple(links)
        return self.numbers[text]

    def items(self) -> list[tuple[int, str]]:
        return [(n, t) for t, n in self.numbers.items()]

    def __len__(self) -> int:
        return len(self.numbers)


@dataclasses.dataclass
class Summary:
    """What one table cell shows for a group of records."""

    state: str  # a STATES value, "partial" or MISSING
    symbol: str
    accepted: int
    total: int
    refs: list[int]  # note numbers
    records: list[Mapping[str, Any]]

    @property
    def text(self) -> str:
        body = self.symbol
        if self.state == "partial":
            body = f"{PARTIAL} {self.accepted}/{self.total}"
        return body + "".join(f" [{n}]" for n in self.refs)


def describe_coords(hidden: Sequence[str], tuples: Iterable[tuple[Any, ...]],
                    universe: Sequence[tuple[Any, ...]], order: Mapping[str, Mapping[Any, int]]) -> str:
    """A short condition naming a set of hidden coordinates: ``dcp2, dcp4, dcp8 · eagle-4x3``.

    ``universe`` is every hidden tuple of the group; axes on which the set
    covers all the group's values are left out. Sets that are no product of
    per-axis values are listed (at most eight, then a count).
    """
    chosen = sorted(set(tuples), key=lambda t: tuple(order[a].get(v, 1 << 30) for a, v in zip(hidden, t)))
    if not hidden or len(chosen) == len(set(universe)):
        return "all"
    per_axis = [sorted({t[i] for t in chosen}, key=lambda v, a=a: order[a].get(v, 1 << 30))
                for i, a in enumerate(hidden)]
    product = 1
    for vals in per_axis:
        product *= len(vals)
    all_vals = [{t[i] for t in universe} for i in range(len(hidden))]
    if product == len(chosen):
        parts = [", ".join(format_value(a, v) for v in vals)
                 for a, vals, every in zip(hidden, per_axis, all_vals) if set(vals) != every]
        return " · ".join(parts) if parts else "all"
    shown = ["/".join(format_value(a, v) for a, v in zip(hidden, t)) for t in chosen[:8]]
    more = f" (+{len(chosen) - 8} more)" if len(chosen) > 8 else ""
    return ", ".join(shown) + more


@dataclasses.dataclass
class Table:
    key: tuple[Any, ...]  # values of the table axes
    row_keys: list[tuple[Any, ...]]
    col_keys: list[tuple[Any, ...]]
    groups: dict[tuple[tuple[Any, ...], tuple[Any, ...]], list[Mapping[str, Any]]]


class ReportModel:
    """A result document, indexed and ordered for rendering."""

    def __init__(self, document: Mapping[str, Any]) -> None:
        self.document = document
        self.run: Mapping[str, Any] = document.get("run") or {}
        self.cells: list[Mapping[str, Any]] = list(document.get("cells") or [])
        self._coord_tuples: tuple[tuple[str, ...], list[tuple[Any, ...]]] | None = None
        self.axes: dict[str, list[Any]] = self._axes()
        self.order: dict[str, dict[Any, int]] = {a: {v: i for i, v in enumerate(vals)}
                                                 for a, vals in self.axes.items()}
        #: ``run.probes``: axis → values that exercise the engine's input validation.
        self.probes: dict[str, list[Any]] = {a: list(v) for a, v in (self.run.get("probes") or {}).items()
                                             if a in self.axes and isinstance(v, list)}
        #: The cells of the feature tables: every cell without a probe value.
        self.feature_cells: list[Mapping[str, Any]] = (
            [c for c in self.cells if not self.is_probe(c)] if self.probes else list(self.cells))
        #: Axis values without the probes, in matrix order.
        self.feature_axes: dict[str, list[Any]] = {a: [v for v in vals if v not in self.probes.get(a, ())]
                                                   for a, vals in self.axes.items()}
        self._case_mla: dict[Any, bool] | None = None
        self._states: dict[int, str] = {}
        self._findings: list[Finding] | None = None
        self._finding_of: dict[int, Finding] = {}
        # Texts of records, by the identity of the values they are made of: records read from a
        # result file share equal values (codec.py), so each text is made once, not once per cell.
        self._rejections: dict[tuple[int, int], str] = {}
        self._notes: dict[tuple[Any, ...], str | None] = {}
        #: What is computed once per model (``state_notes``, ``keys``, ``build_backends_view``).
        self.cache: dict[str, Any] = {}

    @property
    def findings(self) -> list[Finding]:
        """The run's distinct findings (``findings.py``), numbered F1, F2, ... in matrix order."""
        if self._findings is None:
            self._findings = group_findings(self.cells, str((self.run.get("engine") or {}).get("name") or ""))
            self._finding_of = {id(r): f for f in self._findings for r in f.records}
        return self._findings

    def finding_of(self, record: Mapping[str, Any]) -> Finding | None:
        """The finding a cell belongs to (None: it is not one)."""
        if self._findings is None:
            self.findings
        return self._finding_of.get(id(record))

    @property
    def states(self) -> dict[int, str]:
        """``id(record)`` → ``cell_state(record)`` for every cell, computed once."""
        if len(self._states) != len(self.cells):
            state_notes = self.state_notes
            per_signature = [state_notes[id(c)][0] for c in self.signature_records]
            self._states = dict(zip(self.signatures, map(per_signature.__getitem__, self.signatures.values())))
        return self._states

    @property
    def signatures(self) -> dict[int, int]:
        """``id(record)`` → the index of its *signature* in ``signature_records``: records of one
        signature have the same values (the same objects) for ``BODY_FIELDS`` and the same finding,
        so the same state, note and details. A cell of a finding has a signature of its own (its
        details name it). Records read from a file share their values: a million cells have a few
        hundred thousand signatures at most, and one C-level pass a cell finds them."""
        cached = self.cache.get("signatures")
        if cached is None or len(cached) != len(self.cells):
            index: dict[tuple[Any, ...], int] = {}
            records: list[Mapping[str, Any]] = []
            cached = {}
            finding_of = self._finding_of if self.findings else None
            for c in self.cells:
                key = tuple(map(id, map(c.get, BODY_FIELDS)))
                if finding_of and id(c) in finding_of:
                    key += (id(c),)
                sig = index.get(key)
                if sig is None:
                    sig = index[key] = len(records)
                    records.append(c)
                cached[id(c)] = sig
            self.cache["signatures"] = cached
            self.cache["signature_records"] = records
        return cached

    @property
    def signature_records(self) -> list[Mapping[str, Any]]:
        """The first record of each signature (``signatures``)."""
        self.signatures
        return self.cache["signature_records"]

    @property
    def state_notes(self) -> dict[int, tuple[str, str | None]]:
        """``id(record)`` → ``(cell_state(record), state_note(record, state))`` for every cell,
        made once per signature (``signatures``)."""
        cached = self.cache.get("state_notes")
        if cached is None or len(cached) != len(self.cells):
            made: dict[tuple[Any, ...], tuple[str, str | None]] = {}  # equal ones are one tuple
            per_signature = []
            for c in self.signature_records:
                state = cell_state(c)
                sn = (state, state_note(c, state, self.finding_of(c)))
                per_signature.append(made.setdefault(sn, sn))
            cached = self.cache["state_notes"] = dict(zip(self.signatures, map(per_signature.__getitem__,
                                                                                self.signatures.values())))
        return cached

    @property
    def accepted_ids(self) -> set[int]:
        """``id(record)`` of every record whose engine accepted its configuration (``outcome.kind``)."""
        cached = self.cache.get("accepted_ids")
        if cached is None:
            per_signature = [isinstance(outcome, Mapping) and outcome.get("kind") == ACCEPTED
                             for outcome in map(operator.methodcaller("get", "outcome"), self.signature_records)]
            cached = self.cache["accepted_ids"] = set(itertools.compress(
                self.signatures, map(per_signature.__getitem__, self.signatures.values())))
        return cached

    @property
    def keys(self) -> dict[int, tuple[Any, ...]]:
        """``id(record)`` → its coordinates on ``self.axes``, in order (None where it has none)."""
        cached = self.cache.get("keys")
        if cached is None or len(cached) != len(self.cells):
            axes = list(self.axes)
            names, tuples = self._coord_tuples or ((), [])
            if len(tuples) == len(self.cells) and set(names) == set(axes):  # made by ``_axes``: reordered
                if list(names) != axes:
                    tuples = list(map(self.picker_of(names, axes), tuples))
                cached = self.cache["keys"] = dict(zip(map(id, self.cells), tuples))
            else:
                cached = self.cache["keys"] = {id(c): tuple(map((c.get("coords") or {}).get, axes))
                                               for c in self.cells}
        return cached

    def picker(self, axes: Sequence[str]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
        """A function from a record's ``keys`` entry to its coordinates on ``axes``."""
        return self.picker_of(list(self.axes), axes)

    @staticmethod
    def picker_of(index: Sequence[str], axes: Sequence[str]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
        """A function from coordinates on ``index`` to coordinates on ``axes``."""
        index = list(index)
        positions = [index.index(a) for a in axes]
        if len(positions) == 1:
            (only,) = positions
            return lambda key: (key[only],)
        if not positions:
            return lambda key: ()
        return operator.itemgetter(*positions)

    def state(self, record: Mapping[str, Any]) -> str:
        """``cell_state(record)``, computed once per record of this document."""
        state = self.states.get(id(record))
        return state if state is not None else cell_state(record)

    def rejection_text(self, record: Mapping[str, Any]) -> str:
        """``rejection_text(record)``, made once per distinct outcome and expectation."""
        key = (id(record.get("outcome")), id(record.get("expectation")))
        text = self._rejections.get(key)
        if text is None:
            text = self._rejections[key] = rejection_text(record)
        return text

    def note(self, record: Mapping[str, Any], state: str) -> str | None:
        """``state_note(record, state)``, made once per distinct set of the values it reads."""
        if state == REJECTED:
            return self.rejection_text(record)
        key = (state, id(record.get("expectation")), record.get("reason"), record.get("verdict"))
        try:
            return self._notes[key]
        except KeyError:
            text = self._notes[key] = state_note(record, state)
            return text
        except TypeError:  # a reason that is not a string
            return state_note(record, state)

    def uncovered(self) -> list[str]:
        """MLA-capable backends the engine registers that the matrix does not list (``engine.coverage``)."""
        coverage = (self.run.get("engine") or {}).get("coverage") or {}
        return [str(name) for name in coverage.get("uncovered_mla") or ()]

    def is_probe(self, record: Mapping[str, Any]) -> bool:
        """Whether a coordinate of ``record`` is a probe value."""
        if not self.probes:
            return False
        coords = record.get("coords") or {}
        return any(coords.get(a) in values for a, values in self.probes.items())

    def is_mla(self, model: str) -> bool | None:
        """Whether ``model`` uses MLA: from ``run.models``, else the built-in catalogue, else the kernel cases."""
        entry = (self.run.get("models") or {}).get(model)
        if isinstance(entry, Mapping) and isinstance(entry.get("mla"), bool):
            return entry["mla"]
        if model in BUILTIN_MODELS:
            return BUILTIN_MODELS[model].mla
        if self._case_mla is None:
            self._case_mla = {}
            seen: set[tuple[int, Any]] = set()  # (kernel value, model) already looked at (records share them)
            for c in self.cells:
                kernel = c.get("kernel")
                if not kernel:
                    continue
                case = kernel.get("case")  # most kernels have none: nothing more to look at
                if not isinstance(case, dict) or not isinstance(case.get("mla"), bool):
                    continue
                name = (c.get("coords") or {}).get("model")
                if (id(kernel), name) in seen:
                    continue
                seen.add((id(kernel), name))
                self._case_mla.setdefault(name, case["mla"])
        return self._case_mla.get(model)

    def _axes(self) -> dict[str, list[Any]]:
        declared = self.run.get("axes") or {}
        axes: dict[str, list[Any]] = {a: list(v) for a, v in declared.items()}
        coords = [c.get("coords") or {} for c in self.cells]
        names = list(coords[0]) if coords else []
        later = set().union(*coords) - set(names)
        for cs in coords if later else ():  # axes only later cells have, in order of first appearance
            names += [a for a in cs if a in later and a not in names]
        if names and not later and all(map(len(names).__eq__, map(len, coords))):
            # Every cell has every axis (a run's cells): their coordinates as tuples, in one C-level
            # pass, kept for ``keys``.
            pick = operator.itemgetter(*names)
            tuples = list(map(pick, coords)) if len(names) > 1 else [(v,) for v in map(pick, coords)]
            self._coord_tuples = (tuple(names), tuples)
            seen = {a: map(operator.itemgetter(i), tuples) for i, a in enumerate(names)}
        else:
            seen = {a: (cs[a] for cs in coords if a in cs) for a in names}
        for a in names:
            known = set(axes.get(a, ()))  # values in the cells the run did not declare, in first-seen order
            new = [v for v in dict.fromkeys(seen[a]) if v not in known]
            if new or a not in axes:
                axes.setdefault(a, []).extend(new)
        ordered = {a: axes[a] for a in AXES if a in axes}
        ordered.update({a: v for a, v in axes.items() if a not in ordered})
        return ordered

    # -- layout ----------------------------------------------------------------------
    def layout(self, rows: Sequence[str] | None = None, cols: Sequence[str] | None = None,
               tables: Sequence[str] | None = None) -> tuple[list[str], list[str], list[str], list[str]]:
        """(tables, rows, cols, hidden) axis names; raises ``ValueError`` on an unknown axis."""
        rows = list(rows) if rows else ["backend"]
        cols = list(cols) if cols else [a for a in ("arch", "spec") if a not in rows]
        for a in rows + cols + list(tables or []):
            if a not in self.axes:
                raise ValueError(f"unknown axis {a!r} (this report has: {', '.join(self.axes)})")
        if set(rows) & set(cols):
            raise ValueError(f"axis {sorted(set(rows) & set(cols))[0]!r} is both a row and a column axis")
        if tables is None:
            tables = [a for a in ("model",) if a not in rows and a not in cols]
        tables = [a for a in tables if a not in rows and a not in cols]
        hidden = [a for a in self.axes if a not in rows and a not in cols and a not in tables]
        return list(tables), rows, cols, hidden

    def sort_key(self, axes: Sequence[str]) -> Callable[[tuple[Any, ...]], tuple[int, ...]]:
        return lambda key: tuple(self.order[a].get(v, 1 << 30) for a, v in zip(axes, key))

    def tables(self, rows: Sequence[str] | None = None, cols: Sequence[str] | None = None,
               tables: Sequence[str] | None = None) -> tuple[list[Table], list[str], list[str], list[str], list[str]]:
        t_axes, r_axes, c_axes, hidden = self.layout(rows, cols, tables)
        by_table: dict[tuple[Any, ...], dict[tuple[Any, ...], dict[tuple[Any, ...], list]]] = {}
        keys, t_of, r_of, c_of = self.keys, self.picker(t_axes), self.picker(r_axes), self.picker(c_axes)
        for cell in self.feature_cells:  # probes are listed under "Input validation" instead
            key = keys[id(cell)]
            by_table.setdefault(t_of(key), {}).setdefault(r_of(key), {}).setdefault(c_of(key), []).append(cell)
        # Every row/column value of the axes shows, even where no cell was reported.
        all_rows = _product([self.feature_axes[a] for a in r_axes])
        all_cols = _product([self.feature_axes[a] for a in c_axes])
        out = []
        for tk in sorted(by_table, key=self.sort_key(t_axes)):
            groups = {(rk, ck): cells for rk, by_col in by_table[tk].items() for ck, cells in by_col.items()}
            out.append(Table(tk, all_rows, all_cols, groups))
        return out, t_axes, r_axes, c_axes, hidden

    # -- summaries -------------------------------------------------------------------
    def ranker(self, axes: Sequence[str]) -> Callable[[tuple[Any, ...]], tuple[int, ...]]:
        """``sort_key(axes)``, remembered per coordinate tuple (table cells repeat the same few)."""
        made = self.cache.setdefault(("ranks", tuple(axes)), {})
        sort_key = self.sort_key(axes)

        def rank(key: tuple[Any, ...]) -> tuple[int, ...]:
            found = made.get(key)
            if found is None:
                found = made[key] = sort_key(key)
            return found
        return rank

    def describe_coords(self, hidden: Sequence[str], tuples: Iterable[tuple[Any, ...]],
                        universe: frozenset[tuple[Any, ...]]) -> str:
        """``describe_coords`` with this model's order, made once per distinct set of coordinates."""
        memo = self.cache.setdefault("describe_coords", {})
        key = (tuple(hidden), frozenset(tuples), universe)
        text = memo.get(key)
        if text is None:
            text = memo[key] = describe_coords(hidden, key[1], universe, self.order)
        return text

    def summarise(self, records: Sequence[Mapping[str, Any]], hidden: Sequence[str], notes: Notes) -> Summary:
        if not records:
            return Summary(MISSING, SYMBOLS[MISSING], 0, 0, [], [])
        state_notes = self.state_notes
        distinct = set(map(state_notes.get, map(id, records)))
        if len(distinct) == 1 and None not in distinct:  # most table cells: one state, one note
            ((state, text),) = distinct
            refs = [notes.ref(text)] if text else []
            total = len(records)
            return Summary(state, SYMBOLS[state], total if state in ACCEPTED_STATES else 0, total, refs, records)
        parts: dict[tuple[str, str | None], list[tuple[Any, ...]]] = {}
        keys, hidden_of = self.keys, self.picker(hidden)
        ids = list(map(id, records))
        sns = list(map(state_notes.get, ids))
        points = list(map(keys.get, ids))
        if None in sns or None in points:  # records of another document
            for i, r in enumerate(records):
                if sns[i] is None:
                    state = cell_state(r)
                    sns[i] = (state, state_note(r, state, self.finding_of(r)))
                key = points[i]
                points[i] = hidden_of(key) if key is not None else tuple(map((r.get("coords") or {}).get, hidden))
        else:
            points = list(map(hidden_of, points))
        for sn, point in zip(sns, points):
            parts.setdefault(sn, []).append(point)
        total = len(records)
        if len(parts) == 1:  # most table cells: one state, one note
            ((state, text),) = parts
            refs = [notes.ref(text)] if text else []
            return Summary(state, SYMBOLS[state], total if state in ACCEPTED_STATES else 0, total, refs, records)
        universe = frozenset(points)
        rank = self.ranker(hidden)
        states: Counter = Counter()
        for (state, _), ts in parts.items():
            states[state] += len(ts)
        accepted = sum(states[s] for s in ACCEPTED_STATES)

        def entry(state: str, text: str | None, ts: list[tuple[Any, ...]]) -> str:
            where = self.describe_coords(hidden, ts, universe)
            if text and state in (XFAIL, SKIPPED):  # the note's text starts with its label (xfail, xpass, skipped)
                return f"{where}: {SYMBOLS[state]} {text}"
            label = f"{SYMBOLS[state]} {state}"
            ref = f" [{notes.ref(text)}]" if text and state == REJECTED else (f": {text}" if text else "")
            return f"{where}: {label}{ref}"

        def parts_where(pred: Callable[[str], bool]) -> list[str]:
            chosen = [(k, ts) for k, ts in parts.items() if pred(k[0])]
            chosen.sort(key=lambda kt: (STATES.index(kt[0][0]), min(map(rank, kt[1]))))
            return [entry(s, text, ts) for (s, text), ts in chosen]

        if states[BAD]:
            note = "; ".join(parts_where(lambda s: s == BAD))
            return Summary(BAD, SYMBOLS[BAD], accepted, total, [notes.ref(note)], list(records))
        if accepted and accepted < total:
            note = "; ".join(parts_where(lambda s: s not in ACCEPTED_STATES))
            return Summary("partial", PARTIAL, accepted, total, [notes.ref(note)], list(records))
        if accepted == total:  # verified, emulated and not-run mixed: the weakest shows, the note names the rest
            weakest = ACCEPTED if states[ACCEPTED] else EMULATED
            note = "; ".join(parts_where(lambda s: s != weakest))
            return Summary(weakest, SYMBOLS[weakest], accepted, total, [notes.ref(note)], list(records))
        top = max(states, key=lambda s: (states[s], -STATES.index(s)))
        note = "; ".join(parts_where(lambda s: True))
        return Summary(top, SYMBOLS[top], accepted, total, [notes.ref(note)], list(records))

    # -- facts -----------------------------------------------------------------------
    def counts(self) -> Counter:
        return Counter(c.get("verdict") for c in self.cells)

    def kernel_counts(self) -> Counter:
        """Kernel statuses of the cells that have one; ``verified`` split off as ``emulated`` where
        every verified run emulated the kernels (``verified_state``)."""
        counts: Counter = Counter()
        for c in self.cells:
            if c.get("kernel"):
                status = kernel_of(c).get("status")
                counts[verified_state(c) if status == VERIFIED else status] += 1
        return counts

    def kernel_wheres(self) -> list[str]:
        wheres: set[str] = set()
        for c in self.cells:
            runs = c.get("kernel_runs") or ([c["kernel"]] if c.get("kernel") else [])
            for k in runs:
                if k and k.get("status") in (VERIFIED, KERNEL_FAILED) and k.get("where"):
                    wheres.add(str(k["where"]))
        return sorted(wheres)

    def bad_cells(self) -> list[Mapping[str, Any]]:
        states = self.states
        return [c for c in self.cells if states[id(c)] == BAD]


def _product(lists: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = [()]
    for values in lists:
        out = [t + (v,) for t in out for v in values]
    return out


def tier_line(run: Mapping[str, Any]) -> str | None:
    """What a quick run's report must say before anything else (None: a full run, or a file from before tiers).
    A merged run names its inputs' tiers: a cell keeps the level of the input that checked it most."""
    tier = run.get("tier")
    if tier == "quick":
        sample = (run.get("sample") or {}).get("cells") or []
        return (f"quick tier: numeric checks on a covering sample of {len(sample)} cells (each backend in each "
                "feature column of each model family at least once); the other accepted cells are validated "
                "only, not a full report")
    if isinstance(tier, str) and "quick" in tier:  # a merge of several tiers joins them: "full / quick"
        return ("merged from quick- and full-tier runs: each cell shows the most telling check any input made "
                "(a cell only a quick run reported may be validated only)")
    return None


def _verified_schedules(records: Iterable[Mapping[str, Any]], key: str) -> dict[str, list[list[int]]]:
    """Per backend, the values ``kernel.schedule[key]`` holds in each verified check that recorded any."""
    per: dict[str, list[list[int]]] = {}
    for record in records:
        kernel = record.get("kernel") or {}
        values = (kernel.get("schedule") or {}).get(key) if kernel.get("status") == VERIFIED else None
        if values:
            name = str(kernel.get("kernel") or (record.get("coords") or {}).get("backend"))
            per.setdefault(name, []).append([int(v) for v in values])
    return per


def _joined(checks: list[list[int]]) -> str:
    return ", ".join(str(v) for v in sorted({v for values in checks for v in values}))


def schedule_counts(records: Iterable[Mapping[str, Any]]) -> str:
    """Which split-KV schedules verified checks ran, per backend (``kernel.schedule``: the split counts the
    engine handed its decode kernel), and how many of those checks split a request more than once."""
    per = _verified_schedules(records, "num_kv_splits")
    if not per:
        return ""
    parts = [f"{name} {_joined(checks)} ({sum(max(c) > 1 for c in checks)} of {len(checks)} checks split a request)"
             for name, checks in sorted(per.items())]
    return "split-KV schedules verified (the KV split counts the engine handed its decode kernel): " + "; ".join(parts)


def graph_padding_counts(records: Iterable[Mapping[str, Any]]) -> str:
    """Per backend, how many verified checks ran a batch padded as a FULL CUDA graph replays it
    (``kernel.schedule["graph_padded_to"]``: the request counts the engine's runner padded to)."""
    per = _verified_schedules(records, GRAPH_PADDED)
    if not per:
        return ""
    parts = [f"{name} {len(checks)} (padded to {_joined(checks)} requests)" for name, checks in sorted(per.items())]
    return ("CUDA-graph-padded batches verified (dummy requests after the real ones, as the engine's runner pads a "
            "batch for a FULL graph): " + "; ".join(parts))


def power_counts(records: Iterable[Mapping[str, Any]]) -> str:
    """How many verified checks would have caught each planted fault (``kernel.power``), and how many applied."""
    runs = [(r.get("kernel") or {}) for r in records if (r.get("kernel") or {}).get("status") == VERIFIED]
    measured = [k["power"] for k in runs if isinstance(k.get("power"), Mapping)]
    if not measured:
        return ""
    applied: Counter[str] = Counter()
    caught: Counter[str] = Counter()
    for power in measured:
        for name, fault in (power.get("faults") or {}).items():
            applied[name] += 1
            caught[name] += bool(fault.get("detected"))
    parts = [f"{name} {caught[name]}/{applied[name]}" for name in applied]
    unmeasured = len(runs) - len(measured)
    return ("power (verified checks that would catch each planted fault): " + ", ".join(parts)
            + (f"; {unmeasured} without a power record" if unmeasured else ""))
