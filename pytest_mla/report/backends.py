"""The backends view: the table engine docs publish, built from verified outcomes.

One table per model family (MLA models, non-MLA models), one row per backend,
one column per feature the matrix has an axis for:

- one column per GPU arch: the backend's *plain* configuration on that arch
  (no speculation, no DCP, the default KV dtype; every model of the family
  and every page size); where the archs span several platforms, each title
  names its platform (``CUDA sm90``, ``ROCm gfx942``, ``CPU cpu_amx``);
- ``spec chain`` / ``spec tree``: speculative decoding with topk 1 / topk > 1;
- ``DCP`` / ``DCP + spec``: decode context parallelism (size > 1) without /
  with speculative decoding;
- one column per KV dtype besides the default, one per page size;
- ``verified on``: where the decode kernel was verified, in how many of the
  accepted configurations.

Each entry summarises the cells its column selects; every axis the column
does not fix (the family's models, the arch, the page size, tp, ...) is
summarised inside it, and a note names the exceptions in words.

**Which cells count.** A feature column asks: where the backend serves the
plain configuration, does it serve it *with* the feature? A cell of a feature
column counts when the engine accepted it, when it went wrong (fail, error,
xfail), or when its *plain twins* were accepted: the same cell with each of
the column's axes reset (spec ``none``, DCP 1, the default KV dtype; for a
page size, any other page size). A refusal whose twin was refused too is the
plain configuration's refusal: the arch columns show it, the feature columns
do not repeat it. Where no cell counts, every cell does.

**Entries.** The symbols are those of every view (``symbols.py``). ✅ every
counted cell accepted and its decode kernel verified wherever it ran; 🧪
accepted, and where it ran the engine's backend code ran around emulated
kernels (never shown as ✅); ☑️ accepted, kernel not run here; ⛔ refused by
the engine, as documented (the notes quote the engine; each refusal text is
quoted once, in a note of its own, which other notes cite); ◐ accepted under
a condition, which the note names ("not on sm80", "only with page size 64"),
found from the cells: a few products of axis values that hold the refused
cells and none of the accepted ones (or the other way round); ❌ a cell failed
(mismatch with the matrix, kernel out of tolerance, crash); ⚠️ a known bug
(xfail, xpass); ➖ not applicable (a ``skip`` rule, or skipped). The engine's
own remarks on accepted cells (``notes``: "page size 1 resolved to 64")
become notes on the backend's name, each saying where it holds ("every
accepted configuration", "with KV fp8_e5m2"). "verified on" counts real
and emulated kernels apart, and says ``not run here: needs a GPU`` where no
kernel ran.

Probe cells (``run.probes``) are left out of every entry and listed in an
"Input validation" section: each probe value with the engine's answers.

Pure Python, no I/O; ``markdown.py`` and ``html.py`` render the result.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import operator
import re
from typing import Any, Callable, Mapping, Sequence

from ..core.cells import AXES, PLATFORM_LABELS, platform_of
from ..core.records import is_construction_stop
from ..core.spec import SpecError, parse_spec
from ..core.verdicts import ACCEPTED, KERNEL_FAILED, VERIFIED
from .model import (
    BAD, MISSING, REJECTED, SKIPPED, XFAIL, Notes, ReportModel, cell_state, format_value, one_line, reason_line,
    rejection_text, verified_state,
)
from .symbols import EMULATED, PARTIAL, SYMBOLS, legend

# Entry states and symbols: those of every view (``symbols.py``); a refusal is ⛔, never the ❌ of a failure.
SYMBOL = {state: symbol.emoji for state, symbol in SYMBOLS.items()}
#: The entry states a legend of this view lists (the words are those of every view).
LEGEND = tuple(legend((VERIFIED, EMULATED, ACCEPTED, REJECTED, PARTIAL, XFAIL, BAD, SKIPPED)))

#: The axes a column's test reads.
_SELECT_AXES = ("arch", "spec", "dcp", "kv_dtype", "page_size")
#: Axes whose plain value is "any other value" (a page size has no default).
_ANY_AXES = ("arch", "page_size")
#: Conditions give up beyond this many products of axis values, or of constrained axes in one.
MAX_CLAUSES, MAX_CLAUSE_AXES = 3, 3
_FAMILY_TITLES = {True: "MLA models", False: "Non-MLA models", None: "Models"}
COUNTING = ("A feature column counts a refusal only where the same configuration without the feature is accepted "
            "(the arch columns show the others).")
#: Said once under the columns when the view leaves construction-stop notes out of its rows.
CONSTRUCTION_STOPS = ("The engine's start-up code (backend constructors, the draft worker) ran on the test host up to "
                      "its first GPU step; where each stopped is in the notes of each cell (HTML report, JSON).")


@dataclasses.dataclass(frozen=True)
class Column:
    title: str
    kind: str  # arch / chain / tree / dcp / dcp+spec / kv_dtype / page_size
    test: Callable[[Mapping[str, Any]], bool]  # does a cell's coords belong to this column
    reset: tuple[str, ...]  # the axes its twins reset
    explains: str  # which configurations, in words


@dataclasses.dataclass(frozen=True)
class Entry:
    state: str  # a SYMBOL key
    refs: tuple[int, ...] = ()

    @property
    def symbol(self) -> str:
        return SYMBOL[self.state]

    @property
    def text(self) -> str:
        return self.symbol + "".join(f" [{n}]" for n in self.refs)


@dataclasses.dataclass(frozen=True)
class Row:
    backend: str
    refs: tuple[int, ...]  # engine notes shared by every accepted configuration
    entries: tuple[Entry, ...]
    verified: str  # the "verified on" text
    verified_refs: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Refused:
    """A backend the engine refused in every configuration of the family."""

    backend: str
    refs: tuple[int, ...]  # its refusals of the plain configurations


@dataclasses.dataclass(frozen=True)
class Family:
    mla: bool | None
    models: tuple[str, ...]
    rows: tuple[Row, ...]
    refused: tuple[Refused, ...]

    @property
    def title(self) -> str:
        return _FAMILY_TITLES[self.mla]


@dataclasses.dataclass(frozen=True)
class ProbeAnswer:
    """One answer of the engine to one probe value (a probe may get several, each with its condition)."""

    axis: str
    value: Any
    first: bool  # the first answer of this probe value
    cells: int
    condition: str  # "" (every cell of the probe) or e.g. "with DCP 0"
    state: str  # a SYMBOL key
    text: str  # the engine's refusal, "accepted", or what went wrong

    @property
    def symbol(self) -> str:
        return SYMBOL[self.state]


@dataclasses.dataclass
class BackendsView:
    columns: list[Column]
    families: list[Family]
    probes: list[ProbeAnswer]
    notes: Notes
    plain: dict[str, Any]  # axis → the plain value the columns hold fixed
    construction_stops: bool = False  # rows left out notes on where start-up code stopped (CONSTRUCTION_STOPS)

    def explain_columns(self) -> list[tuple[str, str]]:
        """(column titles, what they hold) for the line under the legend; see ``COUNTING`` for the rest."""
        out = []
        arch = [c.title for c in self.columns if c.kind == "arch"]
        if arch:
            plain = self.describe_plain() or "every configuration"
            out.append((", ".join(arch), f"{plain} on that arch, with every model of the family and every other setting"))
        out += [(c.title, c.explains) for c in self.columns if c.kind != "arch"]
        out.append(("verified on", "where the decode kernel was verified, in how many of the accepted configurations"))
        return out

    def describe_plain(self) -> str:
        """What the arch columns hold fixed: ``no speculative decoding, DCP 1``."""
        parts = []
        if "spec" in self.plain:
            parts.append("no speculative decoding")
        if "dcp" in self.plain:
            parts.append(f"DCP {self.plain['dcp']}")
        return ", ".join(parts)


# -- building the view ------------------------------------------------------------------
def build_backends_view(model: ReportModel) -> BackendsView:
    """The backends view of one result document (built once per ``ReportModel``: the Markdown and
    the HTML a run writes share it; renderers only read it)."""
    cached = model.cache.get("backends_view")
    if cached is None:
        cached = model.cache["backends_view"] = _build_backends_view(model)
    return cached


def _build_backends_view(model: ReportModel) -> BackendsView:
    notes = Notes()
    plain = plain_values(model.feature_axes)
    columns = _columns(model, plain)
    families = []
    kinds = {m: model.is_mla(m) for m in model.feature_axes.get("model", [])}
    for mla in (True, False, None):
        models = [m for m, kind in kinds.items() if kind is mla]
        if not models:
            continue
        wanted, keys, axes = set(models), model.keys, list(model.axes)
        at_model = axes.index("model") if "model" in axes else None
        at_backend = axes.index("backend") if "backend" in axes else None
        by_backend: dict[Any, list[Mapping[str, Any]]] = {}
        for c in model.feature_cells:
            key = keys[id(c)]
            if at_model is not None and key[at_model] in wanted:
                by_backend.setdefault(key[at_backend] if at_backend is not None else None, []).append(c)
        backends = [b for b in model.feature_axes.get("backend", []) if b in by_backend]
        states = model.states
        served = [b for b in backends if any(states[id(c)] != REJECTED for c in by_backend[b])]
        rows = [_row(model, b, by_backend[b], columns, plain, notes) for b in served]
        refused = [_refused(model, b, by_backend[b], plain, notes) for b in backends if b not in served]
        if rows or refused:
            families.append(Family(mla, tuple(models), tuple(rows), tuple(refused)))
    notes_values = {id(n): n for n in map(operator.methodcaller("get", "notes"), model.feature_cells) if n}
    stops = any(is_construction_stop(str(n)) for notes_value in notes_values.values() for n in notes_value)
    return BackendsView(columns, families, build_probe_answers(model), notes, plain, stops)


def plain_values(axes: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
    """axis → its plain value, the one feature columns compare against: spec ``none``, DCP 1, the
    default KV dtype (``auto``, else the first), where the matrix has it."""
    plain: dict[str, Any] = {}
    if "none" in axes.get("spec", []):
        plain["spec"] = "none"
    if 1 in axes.get("dcp", []):
        plain["dcp"] = 1
    if axes.get("kv_dtype"):
        plain["kv_dtype"] = "auto" if "auto" in axes["kv_dtype"] else axes["kv_dtype"][0]
    return plain


def spec_kind(value: Any) -> str | None:
    """``chain`` (topk 1), ``tree`` (topk > 1), or None (no speculative decoding, or not a spec value)."""
    try:
        s = parse_spec(str(value))
    except SpecError:
        return None
    if not s.enabled:
        return None
    return "tree" if s.is_tree else "chain"


def _columns(model: ReportModel, plain: Mapping[str, Any]) -> list[Column]:
    axes = model.feature_axes

    def fixed(*names: str) -> Callable[[Mapping[str, Any]], bool]:
        pinned = [(a, plain[a]) for a in names if a in plain]
        return lambda coords: all(coords.get(a) == v for a, v in pinned)

    def words(values: Sequence[Any]) -> str:
        return _join([str(v) for v in values], "or")

    columns: list[Column] = []
    base = fixed("spec", "dcp")
    archs = list(axes.get("arch", []))
    several = len({platform_of(str(a)) for a in archs}) > 1  # then each arch column names its platform
    for arch in archs:
        label = PLATFORM_LABELS.get(platform_of(str(arch)) or "", "")
        title = f"{label} {arch}" if several and label else str(arch)
        columns.append(Column(title, "arch", lambda c, a=arch: c.get("arch") == a and base(c), (),
                              f"the plain configuration on {arch}"))
    kinds = {s: spec_kind(s) for s in axes.get("spec", [])}
    chains = [s for s, k in kinds.items() if k == "chain"]
    trees = [s for s, k in kinds.items() if k == "tree"]
    no_dcp = fixed("dcp")
    if chains:
        columns.append(Column("spec chain", "chain", lambda c: c.get("spec") in chains and no_dcp(c), ("spec",),
                              f"speculative decoding with topk 1 ({words(chains)})"))
    if trees:
        columns.append(Column("spec tree", "tree", lambda c: c.get("spec") in trees and no_dcp(c), ("spec",),
                              f"speculative decoding with a draft tree, topk > 1 ({words(trees)})"))
    dcps = [d for d in axes.get("dcp", []) if isinstance(d, int) and d > 1]
    if dcps and "dcp" in plain:
        no_spec = fixed("spec")
        columns.append(Column("DCP", "dcp", lambda c: c.get("dcp") in dcps and no_spec(c), ("dcp",),
                              f"decode context parallelism, size {words(dcps)}"))
        if (chains or trees) and "spec" in plain:
            enabled = chains + trees
            columns.append(Column("DCP + spec", "dcp+spec", lambda c: c.get("dcp") in dcps and c.get("spec") in enabled,
                                  ("dcp", "spec"), f"DCP {words(dcps)} with {words(enabled)}"))
    for kv in axes.get("kv_dtype", []):
        if kv != plain.get("kv_dtype"):
            columns.append(Column(f"KV {kv}", "kv_dtype", lambda c, k=kv: c.get("kv_dtype") == k and base(c),
                                  ("kv_dtype",), f"KV cache dtype {kv} (instead of {plain['kv_dtype']})"))
    pages = axes.get("page_size", [])
    if len(pages) > 1:
        for page in pages:
            columns.append(Column(f"page {page}", "page_size", lambda c, p=page: c.get("page_size") == p and base(c),
                                  ("page_size",), f"page size {page}"))
    return columns


class _RowTables:
    """A ``ReportModel`` whose per-record tables (``keys``, ``states``, ``accepted_ids``,
    ``signatures``) hold one row's cells only: a row looks each cell up about ten times, and a table
    of a row's cells stays in the processor's cache where the document's million entries do not
    (a lookup there costs several times as much). Everything else is the model's."""

    def __init__(self, model: ReportModel, cells: Sequence[Mapping[str, Any]]) -> None:
        self._model = model
        ids = list(map(id, cells))
        self.keys = dict(zip(ids, map(model.keys.__getitem__, ids)))
        self.states = dict(zip(ids, map(model.states.__getitem__, ids)))
        self.signatures = dict(zip(ids, map(model.signatures.__getitem__, ids)))
        self.accepted_ids = set(itertools.compress(ids, map(model.accepted_ids.__contains__, ids)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


class _Twins:
    """Which configurations of one row the engine accepted, for the plain-twin lookups."""

    def __init__(self, model: ReportModel, cells: Sequence[Mapping[str, Any]]) -> None:
        self.axes = list(model.axes)
        self.index = {a: i for i, a in enumerate(self.axes)}
        self.keys = model.keys  # the same axes, in the same order
        accepted_ids = model.accepted_ids
        self.accepted: set[tuple[Any, ...]] = set(map(self.keys.__getitem__,
                                                      filter(accepted_ids.__contains__, map(id, cells))))
        #: axis of ``_ANY_AXES`` → the accepted keys without that axis → the values it takes there;
        #: made when a column first asks (arch columns reset nothing).
        self.accepted_any: dict[str, dict[tuple[Any, ...], set[Any]]] = {}

    def _any_index(self, axis: str) -> dict[tuple[Any, ...], set[Any]]:
        index = self.accepted_any.get(axis)
        if index is None:
            index = self.accepted_any[axis] = {}
            i = self.index[axis]
            for key in self.accepted:
                index.setdefault(key[:i] + key[i + 1:], set()).add(key[i])
        return index

    def plain_accepted(self, key: tuple[Any, ...], axis: str, plain: Mapping[str, Any]) -> bool:
        """Whether the twin of the cell ``key`` with ``axis`` reset was accepted (no plain value: yes)."""
        i = self.index[axis]
        if axis in _ANY_AXES:
            others = self._any_index(axis).get(key[:i] + key[i + 1:], ())
            return any(v != key[i] for v in others)
        if axis not in plain:
            return True
        return key[:i] + (plain[axis],) + key[i + 1:] in self.accepted


_ACCEPTED_STATES = frozenset({VERIFIED, EMULATED, ACCEPTED})


def _row(model: ReportModel, backend: Any, cells: list[Mapping[str, Any]], columns: Sequence[Column],
         plain: Mapping[str, Any], notes: Notes) -> Row:
    model = _RowTables(model, cells)  # type: ignore[assignment]  # the model, its tables cut to the row
    twins = _Twins(model, cells)
    states = model.states
    accepted = list(itertools.compress(cells, map(_ACCEPTED_STATES.__contains__,
                                                   map(states.__getitem__, map(id, cells)))))
    row_refs = tuple(_engine_note_refs(model, accepted, notes))  # numbered first: the name comes first
    # Columns select by a few axes: test each distinct combination of them once, then sort
    # the cells into their columns in one pass (a cell is in one to three columns).
    present = [a for a in _SELECT_AXES if a in twins.index]
    pick = operator.itemgetter(*[twins.index[a] for a in present]) if present else (lambda key: ())
    keys = list(map(pick, map(twins.keys.__getitem__, map(id, cells))))
    if len(present) == 1:
        keys = [(k,) for k in keys]
    members: dict[tuple[Any, ...], list[int]] = {}
    for k in set(keys):
        coords = dict(zip(present, k))
        members[k] = [i for i, column in enumerate(columns) if column.test(coords)]
    chosen: list[list[Mapping[str, Any]]] = [[] for _ in columns]
    for c, k in zip(cells, keys):
        for i in members[k]:
            chosen[i].append(c)
    entries = [_entry(model, chosen[i], column, twins, plain, notes) for i, column in enumerate(columns)]
    verified, verified_refs = _verified_on(model, cells, notes)
    return Row(backend, row_refs, tuple(entries), verified, verified_refs)


def _engine_note_refs(model: ReportModel, accepted: Sequence[Mapping[str, Any]], notes: Notes) -> list[int]:
    """The engine's remarks on the accepted configurations of a row, each with where it holds.

    Construction-stop notes are left out: they say how far the adapter got on the
    test host, the same for every backend that needs a GPU, not what the engine said.
    """
    texts: dict[str, list[Mapping[str, Any]]] = {}
    for c in accepted:
        for n in c.get("notes") or []:
            if not is_construction_stop(str(n)):
                texts.setdefault(str(n), []).append(c)
    everywhere = [t for t, members in texts.items() if len(members) == len(accepted)]
    refs = []
    if everywhere:
        quoted = ", ".join(f"“{one_line(t)}”" for t in everywhere)
        refs.append(notes.ref(f"every accepted configuration: the engine noted {quoted}"))
    space = _Space(model, accepted)
    for text, members in texts.items():
        if text not in everywhere:
            where = space.where(members, _others(accepted, members))
            refs.append(notes.ref(f"{where}: the engine noted “{one_line(text)}”"))
    return refs


def _refused(model: ReportModel, backend: Any, cells: list[Mapping[str, Any]], plain: Mapping[str, Any],
             notes: Notes) -> Refused:
    pinned = [(a, plain[a]) for a in ("spec", "dcp") if a in plain]
    plain_cells = [c for c in cells if all(c["coords"].get(a) == v for a, v in pinned)] or cells
    return Refused(backend, tuple(_refusal_refs(_Space(model, plain_cells), plain_cells, notes)))


def _entry(model: ReportModel, cells: list[Mapping[str, Any]], column: Column, twins: _Twins,
           plain: Mapping[str, Any], notes: Notes) -> Entry:
    if not cells:
        return Entry(MISSING)
    all_states = model.states
    if column.reset:
        keys, reset, plain_accepted = twins.keys, column.reset, twins.plain_accepted
        accepted_ids = model.accepted_ids
        if len(reset) == 1:
            (axis,) = reset
            counted = [c for c in cells
                       if id(c) in accepted_ids or all_states[id(c)] in (BAD, XFAIL)
                       or plain_accepted(keys[id(c)], axis, plain)] or cells
        else:
            counted = [c for c in cells
                       if id(c) in accepted_ids or all_states[id(c)] in (BAD, XFAIL)
                       or all(plain_accepted(keys[id(c)], axis, plain) for axis in reset)] or cells
    else:  # an arch column: every cell counts
        counted = cells
    space = _Space(model, counted)
    states = list(map(all_states.__getitem__, map(id, counted)))
    kinds = set(states)
    bugs: list[Mapping[str, Any]] = []
    ok: list[Mapping[str, Any]] = []
    refused: list[Mapping[str, Any]] = []
    na: list[Mapping[str, Any]] = []
    bucket = {BAD: bugs, XFAIL: bugs, VERIFIED: ok, EMULATED: ok, ACCEPTED: ok, REJECTED: refused, SKIPPED: na}
    for c, s in zip(counted, states):  # each list in the cells' order
        bucket[s].append(c)
    if bugs:  # a failure outranks a known bug; the notes say which cell is which
        worst = BAD if BAD in kinds else XFAIL
        return Entry(worst, tuple(_grouped_notes(space, bugs, counted, lambda c: _bug_text(c, model), notes)))
    refs: list[int] = []
    if not ok and not refused:
        return Entry(SKIPPED, tuple(_grouped_notes(space, na, counted, _na_text, notes)))
    if ok and not refused:  # the strongest promise any counted cell keeps: a real kernel, then emulated ones
        state = VERIFIED if VERIFIED in kinds else EMULATED if EMULATED in kinds else ACCEPTED
    elif refused and not ok:
        state = REJECTED
        refs += _refusal_refs(space, refused, notes)
    else:
        state = PARTIAL
        refs.append(_condition_note(space, ok, refused, notes))
    if na:
        refs += _grouped_notes(space, na, counted, _na_text, notes)
    return Entry(state, tuple(dict.fromkeys(refs)))


#: A ❌ cites up to this many refusals itself; more go into one note that cites them all.
MAX_INLINE_REFUSALS = 2
_AXIS_NAMES = {"model": "the model", "dcp": "the DCP size", "spec": "the speculative setting", "arch": "the arch",
               "kv_dtype": "the KV dtype", "page_size": "the page size", "tp": "TP", "backend": "the backend"}


def _refusal_refs(space: "_Space", refused: Sequence[Mapping[str, Any]], notes: Notes) -> list[int]:
    """The notes quoting these refusals (each text once); many texts are cited from one note that says why."""
    numbers = list(dict.fromkeys(notes.ref(rejection_text(c)) for c in refused))
    if len(numbers) <= MAX_INLINE_REFUSALS:
        return numbers
    axes = space.deciding_axes(refused, rejection_text)
    words = _join([_AXIS_NAMES.get(a, a) for a in axes], "and") or "the configuration"
    return [notes.ref(f"refused; the engine's message depends on {words}: {_cite(numbers)}", links=numbers)]


def _cite(numbers: Sequence[int]) -> str:
    return " ".join(f"[{n}]" for n in numbers)


def _condition_note(space: "_Space", ok: Sequence[Mapping[str, Any]], refused: Sequence[Mapping[str, Any]],
                    notes: Notes) -> int:
    """The ◐ note: where the engine refuses (or the only place it accepts), citing the refusals."""
    by_text: dict[str, list[Mapping[str, Any]]] = {}
    for c in refused:
        by_text.setdefault(rejection_text(c), []).append(c)
    refusal_numbers = {text: notes.ref(text) for text in by_text}
    not_clauses = space.cover(refused, ok)
    only_clauses = space.cover(ok, refused)
    use_only = only_clauses is not None and len(only_clauses) == 1 and (
        not_clauses is None or len(not_clauses) > 1
        or space.weight(only_clauses[0]) < space.weight(not_clauses[0]))
    if use_only:
        cited = list(refusal_numbers.values())
        text = f"only {space.phrase(only_clauses[0])}; refused otherwise: {_cite(cited)}"
    elif not_clauses is not None:
        parts, cited, seen = [], [], set()
        for clause in not_clauses:
            fresh = [c for c in refused if space.inside(c, clause) and id(c) not in seen]
            seen.update(id(c) for c in fresh)
            numbers = list(dict.fromkeys(refusal_numbers[rejection_text(c)] for c in fresh))
            cited += numbers
            parts.append(f"not {space.phrase(clause)} (refused: {_cite(numbers)})")
        text = "; ".join(parts)
    else:
        cited = list(refusal_numbers.values())
        shown = ", ".join(space.label(c) for c in ok[:6]) + (f" and {len(ok) - 6} more" if len(ok) > 6 else "")
        text = f"accepted in {len(ok)} of {len(ok) + len(refused)} configurations ({shown}); refused otherwise: {_cite(cited)}"
    return notes.ref(text, links=tuple(dict.fromkeys(cited)))


def _bug_text(cell: Mapping[str, Any], model: ReportModel | None = None) -> str:
    """A ⚠️/❌ note: a finding's cell cites the finding (its text is in the Findings section once)."""
    verdict = cell.get("verdict") or "error"
    finding = model.finding_of(cell) if model is not None else None
    if cell_state(cell) == XFAIL:
        if finding is not None:
            return f"known bug ({verdict}): {finding.note()}"
        reason = (cell.get("expectation") or {}).get("xfail") or cell.get("reason")
        return f"known bug ({verdict}): {one_line(reason)}" if reason else f"known bug ({verdict})"
    if finding is not None:
        return f"{verdict}: {finding.note()}"
    return f"{verdict}: {reason_line(cell.get('reason')) or 'no result'}"


def _na_text(cell: Mapping[str, Any]) -> str:
    reason = cell.get("reason") or (cell.get("expectation") or {}).get("reason")
    return f"not applicable: {one_line(reason)}" if reason else "not applicable"


def _grouped_notes(space: "_Space", chosen: Sequence[Mapping[str, Any]], universe: Sequence[Mapping[str, Any]],
                   text_of: Callable[[Mapping[str, Any]], str], notes: Notes) -> list[int]:
    """One note per distinct text, each naming where it holds (nothing when it holds in every counted cell)."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for c in chosen:
        groups.setdefault(text_of(c), []).append(c)
    refs = []
    for text, members in groups.items():
        where = space.where(members, _others(universe, members))
        refs.append(notes.ref(f"{where}: {text}" if where else text))
    return refs


def _others(cells: Sequence[Mapping[str, Any]], chosen: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    ids = {id(c) for c in chosen}
    return [c for c in cells if id(c) not in ids]


def _kernel_runs(cell: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    runs = cell.get("kernel_runs")
    if runs:
        return [r for r in runs if isinstance(r, dict)]
    kernel = cell.get("kernel")
    return [kernel] if isinstance(kernel, dict) else []


def _verified_on(model: ReportModel, cells: Sequence[Mapping[str, Any]], notes: Notes) -> tuple[str, tuple[int, ...]]:
    """``interpreter · 12 of 36``: where kernels were verified, in how many accepted configurations;
    ``· 4 with emulated kernels`` where the engine's code ran around emulated ones; ``not run here:
    needs a GPU`` where none ran (never "0 of 72", which reads like 72 failures)."""
    accepted_ids = model.accepted_ids
    accepted = list(itertools.compress(cells, map(accepted_ids.__contains__, map(id, cells))))
    if not accepted:
        return "—", ()
    # Records of one signature have the same kernel values: count them per signature (in C), in the
    # order their first record comes (the order the texts below list what they found first).
    signatures, records = model.signatures, model.signature_records
    per_signature = collections.Counter(map(signatures.__getitem__, map(id, accepted)))
    wheres: list[str] = []
    how: list[str] = []
    verified = emulated = failed = 0
    reasons: list[str] = []
    seen = model.cache.setdefault("kernel_facts", {})  # the identity of a record's kernel values → facts
    by_fields = model.cache.setdefault("kernel_facts_by_fields", {})  # _KERNEL_FACT_FIELDS of one kernel → facts
    for signature, count in per_signature.items():
        c = records[signature]
        kernel, runs = c.get("kernel"), c.get("kernel_runs")
        facts = None
        if not runs and type(kernel) is dict and kernel:  # one kernel: its facts are those of a few fields
            fields = tuple(map(kernel.get, _KERNEL_FACT_FIELDS))  # (its numbers differ from cell to cell)
            try:
                facts = by_fields.get(fields)
                if facts is None:
                    facts = by_fields[fields] = _kernel_facts(c)
            except TypeError:  # a field that is a list or an object
                pass
        if facts is None:
            facts = seen.get((id(kernel), id(runs)))
            if facts is None:
                facts = seen[(id(kernel), id(runs))] = _kernel_facts(c)
        cell_failed, cell_emulated, cell_wheres, cell_how, cell_reasons = facts
        failed += cell_failed * count
        if cell_wheres is not None:  # verified runs
            if cell_emulated:
                emulated += count
            else:
                verified += count
            wheres += cell_wheres
            how += cell_how
        else:
            reasons += cell_reasons
    refs: tuple[int, ...] = ()
    if how:
        refs = (notes.ref("verified through " + "; ".join(dict.fromkeys(how))),)
    if not (verified or emulated or failed):
        return _not_run_text(reasons, notes)
    places = sorted(set(wheres), key=lambda w: (w != "interpreter", _arch_order(w), w))
    counted = [f"{verified} of {len(accepted)}"] if verified else []
    if emulated:  # a weaker promise, counted apart: the engine's code ran, its kernels were emulated
        counted.append(f"{emulated}{'' if verified else f' of {len(accepted)}'} with emulated kernels")
    text = " · ".join(([", ".join(places)] if places else []) + (counted or [f"0 of {len(accepted)}"]))
    if failed:
        text += f" · {failed} failed"
    return text, refs


def _not_run_text(reasons: Sequence[str], notes: Notes) -> tuple[str, tuple[int, ...]]:
    """``not run here: needs a GPU``, or ``not run here`` citing a note with the reasons."""
    distinct = list(dict.fromkeys(one_line(r) for r in reasons))
    if distinct and all(_NEEDS_GPU.search(r) for r in distinct):
        return "not run here: needs a GPU", ()
    if not distinct:
        return "not run here", ()
    shown = "; ".join(distinct[:3]) + (f"; and {len(distinct) - 3} more reasons" if len(distinct) > 3 else "")
    return "not run here", (notes.ref(f"kernel not run here: {shown}"),)


#: A not-run reason that says the kernel needs a GPU this host does not have.
_NEEDS_GPU = re.compile(r"\bGPU\b.*\bthis host (has no GPU|has none|is cpu|is interpreter)|needs an? \w+ GPU")


#: Every field of a kernel result that ``_kernel_facts`` (and ``verified_state``) reads.
_KERNEL_FACT_FIELDS = ("status", "level", "where", "function", "reason")


def _kernel_facts(cell: Mapping[str, Any]) -> tuple[bool, bool, tuple[str, ...] | None, tuple[str, ...], list[str]]:
    """(a kernel run failed, the verified runs all emulated, where they ran (None: none verified),
    how they ran, why none ran): what "verified on" reads of one record's kernel values."""
    runs = _kernel_runs(cell)
    good = [r for r in runs if r.get("status") == VERIFIED]
    how = tuple(f"{r.get('function') or 'the decode kernel'}" + (f" at the {r['level']} level" if r.get("level") else "")
                for r in good if r.get("function") or r.get("level"))
    reasons = [] if good else [str(r["reason"]) for r in runs if r.get("status") == "not-run" and r.get("reason")]
    return (any(r.get("status") == KERNEL_FAILED for r in runs), bool(good) and verified_state(cell) == EMULATED,
            tuple(str(r["where"]) for r in good if r.get("where")) if good else None, how, reasons)


def _arch_order(where: str) -> int:
    digits = "".join(ch for ch in where if ch.isdigit())
    return int(digits) if digits else 0


# -- input validation -------------------------------------------------------------------
def build_probe_answers(model: ReportModel) -> list[ProbeAnswer]:
    """The "Input validation" section alone: each probe value with the engine's answers."""
    out: list[ProbeAnswer] = []
    for axis in [a for a in AXES if a in model.probes] + [a for a in model.probes if a not in AXES]:
        for value in model.probes[axis]:
            cells = [c for c in model.cells if (c.get("coords") or {}).get(axis) == value]
            if not cells:
                continue
            space = _Space(model, cells, skip=(axis,))
            groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
            for c in cells:
                groups.setdefault(_answer(c, model), []).append(c)
            for i, ((state, text), members) in enumerate(groups.items()):
                where = space.where(members, _others(cells, members)) if len(groups) > 1 else ""
                out.append(ProbeAnswer(axis, value, i == 0, len(members), where, state, text))
    return out


def _answer(cell: Mapping[str, Any], model: ReportModel | None = None) -> tuple[str, str]:
    state = cell_state(cell)
    if state == REJECTED:
        return REJECTED, rejection_text(cell)
    if state in (VERIFIED, EMULATED, ACCEPTED):
        return state, "accepted"
    if state in (BAD, XFAIL):
        return state, _bug_text(cell, model)
    return SKIPPED, _na_text(cell)


# -- conditions in words ----------------------------------------------------------------
class _Space:
    """The cells of one entry as points over the axes that vary among them, for conditions in words.

    A *clause* is a product of axis values (axis → set of values; an axis not
    named is free). ``cover`` finds a few clauses that together hold every
    target cell and no forbidden one; ``phrase`` says a clause in words.
    """

    def __init__(self, model: ReportModel, cells: Sequence[Mapping[str, Any]], skip: Sequence[str] = ()) -> None:
        self.model = model
        self.cells = cells
        self.skip = skip

    @functools.cached_property
    def values(self) -> dict[str, list[Any]]:
        """axis → the values it takes among the cells, for the axes that vary (computed when first needed)."""
        out = {}
        keys = self._keys_of(self.cells)
        for i, a in enumerate(self.model.axes):
            if a in self.skip:
                continue
            seen = set(map(operator.itemgetter(i), keys))
            if len(seen) > 1:
                out[a] = sorted(seen, key=lambda v, a=a: self.model.order[a].get(v, 1 << 30))
        return out

    def _key(self, cell: Mapping[str, Any]) -> tuple[Any, ...]:
        key = self._keys.get(id(cell))
        return key if key is not None else tuple(map((cell.get("coords") or {}).get, self.model.axes))

    def _keys_of(self, cells: Sequence[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
        """``_key`` of each cell (the model's keys, looked up in C, where every cell has one)."""
        keys = list(map(self._keys.get, map(id, cells)))
        return keys if None not in keys else [self._key(c) for c in cells]

    def points(self, cells: Sequence[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
        """``point`` of each cell."""
        return list(map(self._pick, self._keys_of(cells)))

    @functools.cached_property
    def _keys(self) -> dict[int, tuple[Any, ...]]:
        return self.model.keys

    @functools.cached_property
    def _pick(self) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
        return self.model.picker(self.axes)

    @functools.cached_property
    def axes(self) -> list[str]:
        return list(self.values)

    def point(self, cell: Mapping[str, Any]) -> tuple[Any, ...]:
        return self._pick(self._key(cell))

    def inside(self, cell: Mapping[str, Any], clause: Mapping[str, set[Any]]) -> bool:
        coords = cell.get("coords") or {}
        return all(coords.get(a) in values for a, values in clause.items())

    def label(self, cell: Mapping[str, Any]) -> str:
        return "/".join(format_value(a, v) for a, v in zip(self.axes, self.point(cell))) or "all"

    def weight(self, clause: Mapping[str, set[Any]]) -> int:
        return sum(len(v) for v in clause.values())

    def cover(self, targets: Sequence[Mapping[str, Any]], forbidden: Sequence[Mapping[str, Any]]
              ) -> list[dict[str, set[Any]]] | None:
        """Few clauses covering every target and no forbidden cell (None: no short description)."""
        n = len(self.axes)
        t_points = self.points(targets)
        f_points = self.points(forbidden)
        # Bit sets: for each axis and value, the targets / forbidden cells with that value.
        t_bits = [{v: 0 for v in self.values[a]} for a in self.axes]
        f_bits = [{v: 0 for v in self.values[a]} for a in self.axes]
        for j, p in enumerate(t_points):
            for i in range(n):
                t_bits[i][p[i]] |= 1 << j
        for j, p in enumerate(f_points):
            for i in range(n):
                f_bits[i][p[i]] |= 1 << j
        all_f = (1 << len(f_points)) - 1

        def members(bits: list[dict[Any, int]], clause: dict[int, set[Any]], everything: int) -> int:
            m = everything
            for i, values in clause.items():
                any_of = 0
                for v in values:
                    any_of |= bits[i][v]
                m &= any_of
            return m

        uncovered = (1 << len(t_points)) - 1
        clauses: list[dict[int, set[Any]]] = []
        while uncovered:
            if len(clauses) == MAX_CLAUSES:
                return None
            first = (uncovered & -uncovered).bit_length() - 1
            seed = t_points[first]
            best: tuple[int, int, dict[int, set[Any]]] | None = None
            for k in range(min(n, MAX_CLAUSE_AXES) + 1):
                for subset in itertools.combinations(range(n), k):
                    clause = {i: {seed[i]} for i in subset}
                    if members(f_bits, clause, all_f):
                        continue
                    for i in subset:  # widen each named axis while no forbidden cell comes in
                        for v in self.values[self.axes[i]]:
                            if v in clause[i] or not t_bits[i][v] & uncovered:
                                continue
                            clause[i].add(v)
                            gained = members(t_bits, clause, uncovered) & t_bits[i][v]
                            if not gained or members(f_bits, clause, all_f):
                                clause[i].discard(v)
                    score = bin(members(t_bits, clause, uncovered)).count("1")
                    weight = sum(len(v) for v in clause.values())
                    if best is None or (score, -weight) > (best[0], -best[1]):
                        best = (score, weight, clause)
                if best is not None:
                    break
            if best is None:
                return None
            clause = best[2]
            clauses.append(clause)
            uncovered &= ~members(t_bits, clause, uncovered)
        out = []
        for clause in clauses:
            named = {self.axes[i]: values for i, values in sorted(clause.items())
                     if len(values) < len(self.values[self.axes[i]])}
            out.append(named)
        return out

    def deciding_axes(self, cells: Sequence[Mapping[str, Any]], text_of: Callable[[Mapping[str, Any]], str]) -> list[str]:
        """The axes along which ``text_of`` changes between cells that differ in that axis alone."""
        out = []
        points = [(self.point(c), text_of(c)) for c in cells]
        for i, axis in enumerate(self.axes):
            texts: dict[tuple[Any, ...], set[str]] = {}
            for p, text in points:
                texts.setdefault(p[:i] + p[i + 1:], set()).add(text)
            if any(len(t) > 1 for t in texts.values()):
                out.append(axis)
        return out or list(self.axes)

    def where(self, chosen: Sequence[Mapping[str, Any]], others: Sequence[Mapping[str, Any]]) -> str:
        """Where ``chosen`` (and none of ``others``) lie, in words; "" when they are all there is."""
        if not others:
            return ""
        clauses = self.cover(chosen, others)
        if clauses is None:
            shown = ", ".join(self.label(c) for c in chosen[:4]) + (f" and {len(chosen) - 4} more" if len(chosen) > 4 else "")
            return f"in {len(chosen)} of {len(chosen) + len(others)} ({shown})"
        return "; ".join(self.phrase(c) for c in clauses)

    def phrase(self, clause: Mapping[str, set[Any]]) -> str:
        """``on sm80 or sm90, with page size 16``: a clause in words, axes in matrix order."""
        parts = []
        for axis in self.axes:
            if axis in clause:
                values = sorted(clause[axis], key=lambda v, a=axis: self.model.order[a].get(v, 1 << 30))
                left_out = [v for v in self.values[axis] if v not in clause[axis]]
                if axis == "model" and len(values) > 1 and len(left_out) == 1:
                    parts.append(f"for every model but {left_out[0]}")
                else:
                    parts.append(_axis_words(axis, values))
        return ", ".join(parts) if parts else "anywhere"


def _join(items: Sequence[str], word: str) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + f" {word} " + items[-1]


def _axis_words(axis: str, values: Sequence[Any]) -> str:
    text = _join([str(v) for v in values], "or")
    if axis == "model":
        return f"for {text}"
    if axis == "arch":
        return f"on {text}"
    if axis == "spec":
        return "without speculative decoding" if list(values) == ["none"] else f"with spec {text}"
    if axis == "dcp":
        return "without DCP" if list(values) == [1] else f"with DCP {text}"
    if axis == "kv_dtype":
        return f"with KV {text}"
    if axis == "page_size":
        return f"with page size {text}"
    if axis == "tp":
        return f"with TP {text}"
    if axis == "backend":
        return f"with {text}"
    return f"with {axis} {text}"


__all__ = ["build_backends_view", "build_probe_answers", "plain_values", "spec_kind", "CONSTRUCTION_STOPS", "COUNTING", "BackendsView", "Column",
           "Entry", "Family", "ProbeAnswer", "Refused", "Row", "LEGEND", "SYMBOL"]
