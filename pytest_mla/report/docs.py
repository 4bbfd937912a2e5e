"""The docs page: the tables an engine pastes into its documentation, true at a glance and short.

The full report (``markdown.py``) is the evidence: every cell, every refusal
quoted. This page answers the questions users ask of each backend: one
table per family of models (dense MLA, sparse MLA: a model with
``index_topk``, GQA/MHA) and platform (CUDA, ROCm, CPU, XPU, NPU), one row
per backend as the engine names it, for the backends that serve the family
there:

- ``archs``: the platform's archs where the backend serves the plain
  configuration (no speculative decoding, DCP 1, the default KV dtype, any
  page size, every model of the family);
- ``spec chain`` / ``spec tree`` / ``DCP`` / ``DCP + spec`` / one column per
  non-default KV dtype: on those archs, does it serve it with the feature
  (a refused cell counts only where the same configuration without the
  feature was accepted, as in the backends view);
- ``page sizes``: the page sizes it serves in the plain configuration, among
  the archs and models it is served for.

**A symbol claims what every configuration under it does.** An entry is
built per arch first (a *unit*): the cells of one arch agree, or the unit is
◐ with its scope in a few words (``page 64 only``, ``not page 16, not
mla-64``). Where the archs of an entry agree, it is their symbol; where they
do not, it is ◐ followed by each state and its archs (``◐ ✅ sm90 sm100 ·
⛔ sm80``): a problem of one arch, model or dtype never becomes the
column's verdict. Accepted cells claim the weakest promise among them (✅
only where every one was verified on a kernel). ``↪`` marks configurations
where the engine built another class than the one the backend's name
declares (``backend_facts``); a backend the engine accepts on a platform
only by building another is not a row there but one line under the table.

**Notes are root causes**: findings that differ only by step (decode,
verify), by the method of one class that failed, or by numbers in the
message are one; other failed cells are one per declared known bug or
reason. Each is listed once under "Known broken combinations" with its
scope and the full report's findings. Every symbol links to the HTML
report, opened on the cells it summarises (``#g=KEY``: the link keys of this
view, which the HTML page carries as filters).

Pure Python, no I/O.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable, Mapping, Sequence

from ..core.cells import PLATFORM_LABELS, platform_of
from ..core.verdicts import ACCEPTED, VERIFIED
from .backends import plain_values, spec_kind
from .findings import finding_facts, short_function
from .model import BAD, MISSING, REJECTED, SKIPPED, XFAIL, ReportModel, one_line, reason_line
from .symbols import EMULATED, PARTIAL, SYMBOLS

__all__ = ["DocsView", "DocsFamily", "DocsTable", "DocsRow", "DocsEntry", "Rerouted", "RootCause", "build_docs_view",
           "model_family", "FAMILY_TITLES"]

FAMILY_TITLES = {"dense": "Dense MLA models", "sparse": "Sparse MLA models (DeepSeek sparse attention)",
                 "gqa": "GQA and MHA models", "other": "Other models"}
#: Short family names in link keys.
_FAMILY_KEYS = {"dense": "d", "sparse": "s", "gqa": "g", "other": "o"}
_OK = (VERIFIED, EMULATED, ACCEPTED)
_BUG = (BAD, XFAIL)
_BUG_SET = frozenset(_BUG)
#: A feature entry names at most this many archs per state before it says "elsewhere".
_MAX_NAMED = 3


def model_family(model: ReportModel, name: Any) -> str:
    """``dense`` / ``sparse`` (an MLA model with a sparse indexer: ``index_topk``) / ``gqa`` / ``other``."""
    mla = model.is_mla(name)
    if mla is None:
        return "other"
    if not mla:
        return "gqa"
    config = (model.run.get("models") or {}).get(name)
    sparse = isinstance(config, Mapping) and bool(config.get("index_topk"))
    return "sparse" if sparse else "dense"


@dataclasses.dataclass(frozen=True)
class DocsColumn:
    key: str  # what it is: archs, chain, tree, dcp, dcp-spec, kv-<dtype>, pages
    title: str
    kind: str  # platform / chain / tree / dcp / dcp+spec / kv / pages
    explains: str
    archs: tuple[Any, ...] = ()  # a platform column's archs


@dataclasses.dataclass(frozen=True)
class DocsEntry:
    text: str  # symbols and scope, without note numbers
    refs: tuple[int, ...] = ()  # root causes ([n] in the text)
    link: str | None = None  # the link key (None: nothing under it)
    states: tuple[str, ...] = ()  # the symbol states it shows, for tests and the HTML


@dataclasses.dataclass(frozen=True)
class DocsRow:
    backend: str
    entries: tuple[DocsEntry, ...]
    link: str


@dataclasses.dataclass(frozen=True)
class DocsTable:
    """One family of models on one platform."""

    family: str
    platform: str  # its title: CUDA, ROCm, CPU, XPU, NPU ("" where the matrix has no arch axis)
    archs: tuple[str, ...]
    columns: tuple[DocsColumn, ...]
    rows: tuple[DocsRow, ...]
    refused: tuple[str, ...]  # backends refused (or not applicable) here that serve the family on another platform
    rerouted: tuple["Rerouted", ...] = ()  # backends the engine never built itself where it accepted them


@dataclasses.dataclass(frozen=True)
class DocsFamily:
    family: str
    models: tuple[str, ...]
    tables: tuple[DocsTable, ...]  # the platforms where some backend serves the family
    nowhere: tuple[str, ...]  # platforms where none does (every backend refused, or not applicable)
    refused: tuple[str, ...]  # backends refused on every platform

    @property
    def title(self) -> str:
        return FAMILY_TITLES[self.family]


@dataclasses.dataclass(frozen=True)
class Rerouted:
    """A backend the engine accepted only by building another one (its platform reroutes)."""

    backend: str
    archs: tuple[str, ...]
    built: tuple[str, ...]


@dataclasses.dataclass
class RootCause:
    number: int
    state: str  # BAD or XFAIL (the worst of its cells)
    title: str  # what goes wrong, on one line
    statement: str  # the engine's words (exception or mismatch), on one line
    findings: list[int]  # the full report's finding numbers (empty: not a finding, e.g. a harness error)
    cells: list[Mapping[str, Any]]
    rerouted_to: tuple[str, ...] = ()

    @property
    def symbol(self) -> str:
        return SYMBOLS[self.state].emoji


@dataclasses.dataclass
class DocsView:
    families: list[DocsFamily]
    causes: list[RootCause]
    plain: dict[str, Any]
    links: dict[str, dict[str, list[str]]]  # link key → axis → the values it shows
    facts: dict[str, Mapping[str, Any]]  # backend → what the engine declares for it (run.engine.metadata)
    #: What the engine decides per device, as its adapter read it (``run.engine.metadata``; each may be absent):
    #: ``backend_facts_arch`` (the arch ``facts`` answer for), ``backend_facts_by_arch``, ``backend_priorities``,
    #: ``prefill_facts``, ``prefill_priorities`` (vLLM's: ``engines/vllm/adapter.VLLMEngine.decisions``).
    decisions: dict[str, Any] = dataclasses.field(default_factory=dict)


#: The engine metadata keys a docs view carries as ``decisions``.
DECISIONS = ("backend_facts_arch", "backend_facts_by_arch", "backend_priorities", "prefill_facts",
             "prefill_priorities")


def build_docs_view(model: ReportModel) -> DocsView:
    """The docs page of one result document (built once per ``ReportModel``)."""
    cached = model.cache.get("docs_view")
    if cached is None:
        cached = model.cache["docs_view"] = _Builder(model).build()
    return cached


def finding_causes(model: ReportModel) -> dict[int, RootCause]:
    """The full report's finding number → its root cause (numbered as on the docs page)."""
    return {n: cause for cause in build_docs_view(model).causes for n in cause.findings}


def causes_line(model: ReportModel) -> str:
    """``"49 findings from 17 root causes, over 310 cells (198 configurations ...)"``: what the findings count,
    apart (empty without any); the configurations count a rerouted cell once whatever backend was asked for."""
    findings = model.findings
    if not findings:
        return ""
    causes = {c.number for c in finding_causes(model).values()}
    cells = sum(len(f.records) for f in findings)
    line = (f"{len(findings)} finding{'s' if len(findings) != 1 else ''} from {len(causes)} root "
            f"cause{'s' if len(causes) != 1 else ''}, over {cells} cell{'s' if cells != 1 else ''}")
    configurations = sum(configurations_of(model, f.records) for f in findings)
    if configurations != cells:
        line += (f" ({configurations} configurations, counting once the cells that differ only by a backend "
                 "the engine rerouted to another)")
    return line


def rerouted_of(model: ReportModel, records: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """The class the engine built → the backends asked for whose cells among ``records`` it built that class for
    instead of the one each backend's name declares (``backend_facts[name].class``; empty without it)."""
    home = _home_classes(build_docs_view(model).facts)
    out: dict[str, list[str]] = {}
    for cell in records:
        backend = str((cell.get("coords") or {}).get("backend"))
        built = _decode_class(cell)
        if home.get(backend) and built and built != home[backend] and not built.startswith("not built"):
            names = out.setdefault(built, [])
            if backend not in names:
                names.append(backend)
    return out


def configurations_of(model: ReportModel, records: Sequence[Mapping[str, Any]]) -> int:
    """How many configurations ``records`` are once a rerouted cell's backend is set aside: cells that differ
    only by the backend asked for, where the engine built the same other class for each, are one."""
    home = _home_classes(build_docs_view(model).facts)
    seen = set()
    for cell in records:
        coords = cell.get("coords") or {}
        backend = str(coords.get("backend"))
        built = _decode_class(cell)
        rerouted = bool(home.get(backend) and built and built != home[backend] and not built.startswith("not built"))
        key = tuple(sorted((k, repr(v)) for k, v in coords.items() if k != "backend" or not rerouted))
        seen.add((key, built if rerouted else None))
    return len(seen)


class _Builder:
    def __init__(self, model: ReportModel) -> None:
        self.model = model
        self.axes = model.feature_axes
        self.plain = plain_values(self.axes)
        self.links: dict[str, dict[str, list[str]]] = {}
        self.causes: dict[tuple[Any, ...], RootCause] = {}
        metadata = (model.run.get("engine") or {}).get("metadata") or {}
        facts = metadata.get("backend_facts") if isinstance(metadata, Mapping) else None
        self.facts: dict[str, Mapping[str, Any]] = {str(k): v for k, v in facts.items() if isinstance(v, Mapping)} \
            if isinstance(facts, Mapping) else {}
        self.home = _home_classes(self.facts)
        self.decisions = {k: metadata[k] for k in DECISIONS
                          if isinstance(metadata, Mapping) and isinstance(metadata.get(k), (Mapping, str))}
        #: ``id(cell)`` → its root cause's number, for every failed or known-bug cell, in matrix order.
        self.cause_of: dict[int, int] = {}
        for c in model.feature_cells:
            if model.state(c) in _BUG:
                self.cause_of[id(c)] = self._cause(c, (c.get("coords") or {}).get("backend"))

    # -- the page --------------------------------------------------------------------
    def build(self) -> DocsView:
        families: dict[str, list[Any]] = {}
        for name in self.axes.get("model", []):
            families.setdefault(model_family(self.model, name), []).append(name)
        family_of = {m: f for f, ms in families.items() for m in ms}
        platforms: dict[str, list[Any]] = {}
        for arch in self.axes.get("arch", []):
            platforms.setdefault(platform_of(str(arch)) or str(arch), []).append(arch)
        if not platforms:
            platforms[""] = []
        platform_key = {a: p for p, archs in platforms.items() for a in archs}
        cells_of: dict[tuple[str, str, Any], list[Mapping[str, Any]]] = {}
        for c in self.model.feature_cells:
            coords = c.get("coords") or {}
            family = family_of.get(coords.get("model"))
            if family is not None:
                key = (family, platform_key.get(coords.get("arch"), ""), coords.get("backend"))
                cells_of.setdefault(key, []).append(c)
        out = []
        for family in ("dense", "sparse", "gqa", "other"):
            if family not in families:
                continue
            tables, nowhere, refused_somewhere = [], [], {}
            for number, (platform, archs) in enumerate(platforms.items()):
                table = self._table(family, platform, archs, cells_of, f"{_FAMILY_KEYS[family]}{number}")
                if table.rows or table.rerouted:
                    tables.append(table)
                else:
                    nowhere.append(PLATFORM_LABELS.get(platform, platform))
                for b in table.refused:
                    refused_somewhere[b] = refused_somewhere.get(b, 0) + 1
            everywhere = tuple(b for b, n in refused_somewhere.items() if n == len(platforms))
            # "Refused here" names the backends that have a row elsewhere: one refused everywhere is said once
            # for the family, one accepted only by rerouting is in the tables' ↪ lines
            with_rows = {r.backend for t in tables for r in t.rows}
            tables = [dataclasses.replace(t, refused=tuple(b for b in t.refused if b in with_rows)) for t in tables]
            out.append(DocsFamily(family, tuple(map(str, families[family])), tuple(tables), tuple(nowhere),
                                  everywhere))
        causes = sorted(self.causes.values(), key=lambda c: c.number)
        return DocsView(out, causes, self.plain, self.links, self.facts, self.decisions)

    def _table(self, family: str, platform: str, archs: Sequence[Any],
               cells_of: Mapping[tuple[str, str, Any], list[Mapping[str, Any]]], key: str) -> DocsTable:
        """The table of ``family`` on ``platform``; ``key`` (``d0``: the family's letter and the platform's
        number) starts the link keys of its rows (``d0.3``) and entries (``d0.3.5``): short, as a page
        holds hundreds of links, and made with the HTML page that reads them from the same document."""
        title = PLATFORM_LABELS.get(platform, platform)
        columns = [DocsColumn("archs", "archs", "platform", f"the archs of {title or 'the run'} where the backend "
                              "serves the plain configuration", tuple(archs))] + self._feature_columns()
        rows, refused, rerouted = [], [], []
        for backend in self.axes.get("backend", [None]):
            cells = cells_of.get((family, platform, backend))
            if not cells:
                continue
            served = [c for c in cells if self.model.state(c) not in (REJECTED, SKIPPED)]
            if not served:
                refused.append(str(backend))
            elif all(self._rerouted(c, backend) for c in served):
                built = sorted({self._rerouted(c, backend) for c in served})
                rerouted.append(Rerouted(str(backend), tuple(_strs(_values(served, "arch"))), tuple(built)))
            else:
                rows.append(self._row(f"{key}.{len(rows)}", backend, cells, columns))
        return DocsTable(family, title, tuple(map(str, archs)), tuple(columns), tuple(rows), tuple(refused),
                         tuple(rerouted))

    def _feature_columns(self) -> list[DocsColumn]:
        axes, plain = self.axes, self.plain
        columns = []
        specs = {s: spec_kind(s) for s in axes.get("spec", [])}
        chains = [s for s, k in specs.items() if k == "chain"]
        trees = [s for s, k in specs.items() if k == "tree"]
        dcps = [d for d in axes.get("dcp", []) if isinstance(d, int) and d > 1 and "dcp" in plain]
        if chains:
            columns.append(DocsColumn("chain", "spec chain", "chain", f"speculative decoding, topk 1 ({_or(chains)})"))
        if trees:
            columns.append(DocsColumn("tree", "spec tree", "tree", f"speculative decoding, a draft tree ({_or(trees)})"))
        if dcps:
            columns.append(DocsColumn("dcp", "DCP", "dcp", f"decode context parallelism, size {_or(dcps)}"))
            if (chains or trees) and "spec" in plain:
                columns.append(DocsColumn("dcp-spec", "DCP + spec", "dcp+spec",
                                          f"DCP {_or(dcps)} with {_or(chains + trees)}"))
        for kv in axes.get("kv_dtype", []):
            if kv != plain.get("kv_dtype"):
                columns.append(DocsColumn(f"kv-{kv}", f"KV {kv}", "kv",
                                          f"KV cache dtype {kv} (instead of {plain.get('kv_dtype')})"))
        if len(axes.get("page_size", [])) > 1:
            columns.append(DocsColumn("pages", "page sizes", "pages",
                                      "the page sizes served in the plain configuration, on the archs where it is served"))
        return columns

    # -- one row ---------------------------------------------------------------------
    def _row(self, row_key: str, backend: Any, cells: list[Mapping[str, Any]],
             columns: Sequence[DocsColumn]) -> DocsRow:
        model = self.model
        accepted = {_key(c) for c in cells if id(c) in model.accepted_ids}
        self.links[row_key] = _filter(cells, self.axes)
        entries = []
        for number, column in enumerate(columns):
            chosen = [c for c in cells if self._in_column(c, column)]
            if column.kind not in ("platform", "pages"):
                reset = {"chain": ("spec",), "tree": ("spec",), "dcp": ("dcp",), "dcp+spec": ("dcp", "spec"),
                         "kv": ("kv_dtype",)}[column.kind]
                chosen = [c for c in chosen if id(c) in model.accepted_ids or model.state(c) in _BUG
                          or _key(c, {a: self.plain[a] for a in reset if a in self.plain}) in accepted]
            entries.append(self._entry(f"{row_key}.{number}", backend, chosen, column))
        return DocsRow(str(backend), tuple(entries), row_key)

    def _in_column(self, cell: Mapping[str, Any], column: DocsColumn) -> bool:
        coords = cell.get("coords") or {}
        plain = self.plain

        def at_plain(*axes: str) -> bool:
            return all(coords.get(a) == plain[a] for a in axes if a in plain)

        kind_of_spec = spec_kind(coords.get("spec")) if "spec" in coords else None
        dcp = coords.get("dcp")
        more_dcp = isinstance(dcp, int) and dcp > 1
        kind = column.kind
        if kind == "platform":
            return (not column.archs or coords.get("arch") in column.archs) and at_plain("spec", "dcp", "kv_dtype")
        if kind == "pages":
            return at_plain("spec", "dcp", "kv_dtype")
        if kind in ("chain", "tree"):
            return kind_of_spec == kind and at_plain("dcp", "kv_dtype")
        if kind == "dcp":
            return more_dcp and at_plain("spec", "kv_dtype")
        if kind == "dcp+spec":
            return more_dcp and kind_of_spec is not None and at_plain("kv_dtype")
        if kind == "kv":
            return f"kv-{coords.get('kv_dtype')}" == column.key and at_plain("spec", "dcp")
        return False

    def _entry(self, link: str, backend: Any, cells: list[Mapping[str, Any]], column: DocsColumn) -> DocsEntry:
        if not cells:
            return DocsEntry(SYMBOLS[MISSING].emoji)
        self.links[link] = _filter(cells, self.axes)
        if column.kind == "pages":
            return self._pages_entry(link, backend, cells)
        units: dict[Any, list[Mapping[str, Any]]] = {}
        for c in cells:
            units.setdefault((c.get("coords") or {}).get("arch"), []).append(c)
        summaries = {u: self._unit(backend, members) for u, members in units.items()}
        refs = tuple(dict.fromkeys(r for s in summaries.values() for r in s.refs))
        groups: dict[tuple[str, str, str], list[Any]] = {}
        for unit, s in summaries.items():
            groups.setdefault((s.state, s.scope, s.rerouted), []).append(unit)
        states = tuple(dict.fromkeys([state for state, _, _ in groups] + [s.bug for s in summaries.values() if s.bug]))
        named = column.kind == "platform"  # a platform column says on which archs; a feature column where it differs
        if len(groups) == 1:
            ((state, scope, rerouted), archs), = groups.items()
            archs = archs if named and state not in (REJECTED, SKIPPED) else []
            return DocsEntry(_part(state, scope, rerouted, archs), refs, link, states)
        ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), _STATE_ORDER.index(item[0][0])))
        parts = []
        for i, ((state, scope, rerouted), archs) in enumerate(ordered):
            elsewhere = i == 0 and not named and len(archs) > _MAX_NAMED
            parts.append(_part(state, scope, rerouted, ["elsewhere"] if elsewhere else archs))
        lead = "" if ordered[0][0][0] == PARTIAL else f"{SYMBOLS[PARTIAL].emoji} "  # the first part's own ◐ leads
        return DocsEntry(lead + " · ".join(parts), refs, link, tuple(dict.fromkeys((PARTIAL,) + states)))

    def _pages_entry(self, link: str, backend: Any, cells: Sequence[Mapping[str, Any]]) -> DocsEntry:
        """The page sizes served in the plain configuration, among the archs and models it is served for at
        all (``16 · 64 (not sm80)``), then the page sizes where it fails (``⚠️ 16 64``)."""
        model = self.model
        served = {(_coord(c, "arch"), _coord(c, "model")) for c in cells if model.state(c) in _BUG_SET.union(_OK)}
        by_page: dict[Any, list[Mapping[str, Any]]] = {}
        for c in cells:
            if not served or (_coord(c, "arch"), _coord(c, "model")) in served:
                by_page.setdefault(_coord(c, "page_size"), []).append(c)
        parts, broken, refs, states = [], {}, [], []
        for page, members in by_page.items():
            ok = [c for c in members if model.state(c) in _OK]
            bugs = [c for c in members if model.state(c) in _BUG]
            refs += [self.cause_of[id(c)] for c in bugs if id(c) in self.cause_of]
            if bugs:
                worst = BAD if any(model.state(c) == BAD for c in bugs) else XFAIL
                states.append(worst)
                broken.setdefault(worst, []).append(str(page))
            elif ok:
                rest = [c for c in members if model.state(c) not in _OK]
                states.append(PARTIAL if rest else VERIFIED)
                parts.append(f"{page}" + (f" ({_scope(ok, rest, ('arch', 'model'))})" if rest else ""))
        parts += [f"{SYMBOLS[state].emoji} {' '.join(pages)}" for state, pages in broken.items()]
        if not parts:
            state = REJECTED if any(model.state(c) == REJECTED for c in cells) else SKIPPED
            return DocsEntry(SYMBOLS[state].emoji, (), link, (state,))
        return DocsEntry(" · ".join(parts), tuple(dict.fromkeys(refs)), link, tuple(dict.fromkeys(states)))

    # -- one arch (or page size) of one entry -----------------------------------------
    def _unit(self, backend: Any, cells: Sequence[Mapping[str, Any]]) -> "_Unit":
        model = self.model
        ok = [c for c in cells if model.state(c) in _OK]
        bugs = [c for c in cells if model.state(c) in _BUG]
        refused = [c for c in cells if model.state(c) == REJECTED]
        refs = tuple(dict.fromkeys(self.cause_of[id(c)] for c in bugs if id(c) in self.cause_of))
        built = ok + bugs  # the configurations the engine accepted and built a backend for
        reroute = "↪" if built and all(self._rerouted(c, backend) for c in built) else ""
        if bugs:
            worst = BAD if any(model.state(c) == BAD for c in bugs) else XFAIL
            if not ok:
                return _Unit(worst, "", reroute, refs)
            return _Unit(PARTIAL, _scope(ok, bugs, prefix=SYMBOLS[worst].emoji), reroute, refs, worst)
        if ok and refused:
            return _Unit(PARTIAL, _scope(ok, refused), reroute, refs)
        if ok:
            kinds = {model.state(c) for c in ok}
            state = ACCEPTED if ACCEPTED in kinds else EMULATED if EMULATED in kinds else VERIFIED
            return _Unit(state, "", reroute, refs)
        if refused:
            return _Unit(REJECTED, "", "", refs)
        return _Unit(SKIPPED, "", "", refs)

    def _rerouted(self, cell: Mapping[str, Any], backend: Any) -> str:
        """The backend the engine built instead of ``backend`` ("" where it built its own, or nobody knows)."""
        home = self.home.get(str(backend))
        built = _decode_class(cell)
        return built if home and built and built != home and not built.startswith("not built") else ""

    def _cause(self, cell: Mapping[str, Any], backend: Any) -> int:
        """The number of the root cause of a failed or known-bug cell. Findings are one cause when they
        differ only by the step (decode, verify), the method of one class that failed (``forward_decode``,
        ``forward_extend``) or the numbers in the engine's message; other cells when the matrix declares
        the same known bug for them, else when they fail for the same reason."""
        facts = finding_facts(cell)
        finding = self.model.finding_of(cell)
        declared = one_line((cell.get("expectation") or {}).get("xfail"))
        if facts is not None:
            text = re.sub(r"\d+", "N", facts.text) if facts.kind == "raised" else ""
            owner = (facts.function or "").rpartition(".")[0] or facts.function  # the class, where a method failed
            key: tuple[Any, ...] = ("finding", facts.kind, owner, facts.error, text, facts.hardening)
            title = (f"indexes outside the cache in {short_function(facts.function)}" if facts.out_of_range
                     else f"raises {facts.error} in {short_function(facts.function)}" if facts.kind == "raised"
                     else f"hardening: a NaN in a free KV slot reaches the output of {short_function(facts.function)}"
                     if facts.hardening else f"out of tolerance in {short_function(facts.function)}")
            statement = facts.statement
        else:
            reason = reason_line(cell.get("reason")) or declared
            key = ("cell", cell.get("verdict"), re.sub(r"\d+", "N", reason))
            title = _short(f"{cell.get('verdict') or 'error'}: {reason or 'no result'}", 120)
            statement = declared if declared != reason else ""
        if facts is None and declared:
            key = ("declared", declared)
        cause = self.causes.get(key)
        if cause is None:
            cause = self.causes[key] = RootCause(len(self.causes) + 1, XFAIL, title, statement, [], [])
        if id(cell) not in {id(c) for c in cause.cells[-1:]}:
            cause.cells.append(cell)
        if self.model.state(cell) == BAD:
            cause.state = BAD
        if finding is not None and finding.number not in cause.findings:
            cause.findings.append(finding.number)
        built = self._rerouted(cell, backend)
        if built and built not in cause.rerouted_to:
            cause.rerouted_to += (built,)
        return cause.number


@dataclasses.dataclass(frozen=True)
class _Unit:
    state: str
    scope: str  # a PARTIAL unit: where it holds, in a few words
    rerouted: str  # "↪" where every accepted configuration ran another backend than asked
    refs: tuple[int, ...]
    bug: str = ""  # a PARTIAL unit's failed or known-bug state (its scope names where)


_STATE_ORDER = (VERIFIED, EMULATED, ACCEPTED, PARTIAL, REJECTED, XFAIL, BAD, SKIPPED, MISSING)


def _part(state: str, scope: str, rerouted: str, archs: Sequence[Any]) -> str:
    """``✅ sm90 sm100``, ``◐ sm90 (page 64 only)``, ``🧪 ↪ cpu``: one state of an entry."""
    words = [SYMBOLS[state].emoji] + ([rerouted] if rerouted else []) + [str(a) for a in archs]
    return " ".join(words) + (f" ({scope})" if scope else "")


#: The axes a scope may name, in the order it names them.
_SCOPE_AXES = ("page_size", "kv_dtype", "model", "spec", "dcp", "arch", "tp")
_SCOPE_WORDS = {"page_size": "page {}", "kv_dtype": "KV {}", "model": "{}", "spec": "{}", "dcp": "DCP {}",
                "arch": "{}", "tp": "TP {}"}


def _scope(ok: Sequence[Mapping[str, Any]], others: Sequence[Mapping[str, Any]],
           axes: Sequence[str] = _SCOPE_AXES, prefix: str = "") -> str:
    """Where ``ok`` holds and ``others`` do not, in a few words: ``page 64 only``, ``not page 16``,
    ``not mla-64 · page 16`` (one or two axes), ``⚠️ kimi-k2`` (``prefix``: the others' symbol, named
    where they are), else ``k of n configurations``."""
    for axis in axes:
        good, bad = _values(ok, axis), _values(others, axis)
        if not good or not bad or set(good) & set(bad):
            continue
        if prefix:
            return f"{prefix} {_words(axis, bad)}"
        return f"{_words(axis, good)} only" if len(good) <= len(bad) else f"not {_words(axis, bad)}"
    for i, a in enumerate(axes):  # two axes: the cells of one product of values, and none of the others
        for b in axes[i + 1:]:
            for inside, outside in ((ok, others), (others, ok)):
                va, vb = set(_values(inside, a)), set(_values(inside, b))
                if not va or not vb or not _values(outside, a) or not _values(outside, b):
                    continue
                if any(_coord(c, a) in va and _coord(c, b) in vb for c in outside):
                    continue
                if inside is ok and not prefix:  # accepted just there: each axis said the shorter way
                    every = {x: _values([*ok, *others], x) for x in (a, b)}
                    return ", ".join(_only_or_not(x, [v for v in every[x] if v in vs], every[x])
                                     for x, vs in ((a, va), (b, vb)))
                if inside is others:
                    words = f"{_words(a, _values(others, a))} · {_words(b, _values(others, b))}"
                    return f"{prefix} {words}" if prefix else f"not {words}"
    return f"{len(ok)} of {len(ok) + len(others)} configurations"


def _only_or_not(axis: str, chosen: Sequence[Any], every: Sequence[Any]) -> str:
    """``page 64/128`` or ``not mla-64``: the values chosen among ``every``, said the shorter way."""
    left = [v for v in every if v not in chosen]
    return _words(axis, chosen) if len(chosen) <= len(left) or not left else f"not {_words(axis, left)}"


def _words(axis: str, values: Sequence[Any]) -> str:
    """``page 64/128``, ``KV fp8``, ``sm90/sm100``: an axis's values, its word said once."""
    # numbers stay tight (page 64/128); names get spaces, so a renderer can wrap a long list in a narrow cell
    joiner = "/" if all(isinstance(v, int) for v in values) else " / "
    return _SCOPE_WORDS[axis].format(joiner.join(map(str, values)))


def _coord(cell: Mapping[str, Any], axis: str) -> Any:
    return _hashable((cell.get("coords") or {}).get(axis))


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _values(cells: Iterable[Mapping[str, Any]], axis: str) -> list[Any]:
    seen: dict[Any, None] = {}
    for c in cells:
        v = (c.get("coords") or {}).get(axis)
        if v is not None:
            seen.setdefault(_hashable(v), None)
    return list(seen)


def _hashable(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


def _strs(values: Iterable[Any]) -> list[str]:
    return [str(v) for v in values]


def _filter(cells: Sequence[Mapping[str, Any]], axes: Mapping[str, Sequence[Any]]) -> dict[str, list[str]]:
    """The HTML report's filters that show ``cells`` (and what else shares their axis values)."""
    out = {}
    for axis, values in axes.items():
        present = _values(cells, axis)
        if present and len(present) < len(values):
            order = {_hashable(v): i for i, v in enumerate(values)}
            out[axis] = _strs(sorted(present, key=lambda v: order.get(v, 1 << 30)))
    return out


def _key(cell: Mapping[str, Any], replace: Mapping[str, Any] | None = None) -> tuple[Any, ...]:
    coords = dict(cell.get("coords") or {})
    if replace:
        coords.update(replace)
    return tuple(sorted((k, _hashable(v)) for k, v in coords.items()))


def _decode_class(cell: Mapping[str, Any]) -> str:
    backends = (cell.get("outcome") or {}).get("backends")
    if isinstance(backends, Mapping):
        return str(backends.get("decode") or "")
    return ""


def _home_classes(facts: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """backend → the class name the engine declares for it (``backend_facts[name]["class"]``,
    ``module:Qualname``): a cell that built another class was rerouted. Without the engine's
    declaration nothing is marked rerouted (a guess from the cells would take a platform's
    fallback, built for every name, for the backend's own class)."""
    home = {}
    for backend, entry in facts.items():
        declared = entry.get("class")
        if isinstance(declared, str) and declared:
            home[backend] = declared.rpartition(":")[2].rpartition(".")[2]
    return home


def _or(values: Sequence[Any]) -> str:
    items = [str(v) for v in values]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]
