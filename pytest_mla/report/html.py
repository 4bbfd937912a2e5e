"""HTML rendering: one self-contained file (inline CSS and JS, no network).

Views, as in Markdown: ``backends`` is a static page with the backends view
(``backends.py``) and the input validation; ``grid`` is the interactive
matrix below; ``all`` (the default, and what a run writes) is both on one
page. The stylesheet and the script are package data
(``static/report.css``, ``static/report.js``), read once and inlined.

The interactive matrix shows every cell: rows and columns are axes the reader picks
(default model · backend by arch · spec), every cell of the matrix is a chip
inside its table cell, filters per axis value and per state hide chips, and a
click on a chip opens its details (expectation, outcome, reason, kernel
numbers). At a hundred thousand cells the page stays usable: the embedded data
is a few integers per cell (its axis values and a shared *body*), rows are built
as they scroll into view, a table cell shows its first 60 chips and a button for
the rest, and one listener serves every chip. Filters and layout live in the URL fragment
(``#rows=backend&cols=arch,dcp&backend=triton,fa3&state=bad``), so a view can
be linked.

Escaping: every string from an engine or a matrix file reaches the page
either through ``esc`` (HTML text and attribute values) or inside the one
embedded JSON blob, written by ``script_json`` (``<``, ``>``, ``&``, U+2028
and U+2029 as ``\\uXXXX``, so no ``</script>`` can end the block). The script
builds the matrix with ``textContent`` and ``setAttribute`` only, never from
HTML strings.
"""

from __future__ import annotations

import functools
import html
import json
import operator
import re
from importlib import resources
from collections.abc import Callable, Mapping
from typing import Any

from ..core.records import GRAPH_PADDED, kernel_of
from ..core.text import visible
from .backends import LEGEND as BACKENDS_LEGEND
from .backends import CONSTRUCTION_STOPS, COUNTING, BackendsView, build_backends_view
from .findings import Finding, repro_command
from .docs import build_docs_view
from .docs import causes_line, configurations_of, finding_causes, rerouted_of
from .markdown import FINDINGS_INTRO, ROOT_CAUSE_INTRO, VIEWS, render_command, rerouted_text, root_cause_text

#: The docs view is a Markdown page; the HTML report is what its symbols link to.
HTML_VIEWS = tuple(v for v in VIEWS if v != "docs")
from .model import LEGEND, STATES, Notes, ReportModel, cell_state, format_value, one_line, reason_line, tier_line
from .symbols import PARTIAL, SYMBOLS


#: Chip and entry glyphs: the plain-text glyphs of ``symbols.py`` (the page must not depend on an
#: emoji font); colour carries the same meaning as the emoji of the Markdown views.
GLYPHS = {state: symbol.glyph for state, symbol in SYMBOLS.items()}
ENTRY_GLYPHS = GLYPHS


@functools.lru_cache(maxsize=None)
def static_text(name: str) -> str:
    """A file of ``pytest_mla/report/static`` (package data)."""
    return resources.files(__package__).joinpath("static", name).read_text(encoding="utf-8")


def esc(value: Any) -> str:
    """The one escaping helper for HTML text and (quoted) attribute values; characters a reader
    cannot see are written as escapes (``\\u200b``)."""
    return html.escape(visible(value), quote=True)


#: What a ``<script>`` element's text must not hold, and its JSON escape. No escape holds a character
#: of the list, so replacing one after the other is one translation (``str.replace`` runs in C; a
#: ``str.translate`` with a dict looks up every character of a page of a million cells).
_SCRIPT_SAFE = (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029"))


def script_json(value: Any) -> str:
    """JSON for inside a ``<script type="application/json">`` element."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for char, escape in _SCRIPT_SAFE:
        if char in text:
            text = text.replace(char, escape)
    return text


def _num(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


def describe_expectation(e: Mapping[str, Any] | None) -> str:
    if not e:
        return "unknown"
    if e.get("kind") == "reject":
        text = (f"reject with {e.get('error')}: {e.get('message')}" if e.get("message") is not None
                else f"reject with {e.get('error')} matching /{e.get('match')}/")
    else:
        text = "accept"
    if e.get("rule") is not None:
        line = f", line {e['rule_line']}" if e.get("rule_line") else ""
        text += f"  (rule[{e['rule']}]{line})"
    else:
        text += "  (no rule matched: default accept)"
    if e.get("xfail"):
        text += f"\nxfail: {e['xfail']}"
    return text


def describe_outcome(o: Mapping[str, Any] | None) -> str:
    if not o:
        return "no outcome recorded"
    if o.get("kind") == "accepted":
        backends = o.get("backends") or {}
        used = ", ".join(f"{k}: {v}" for k, v in backends.items())
        return "accepted" + (f" ({used})" if used else "")
    return f"{o.get('kind')}: {o.get('error')}: {o.get('message')}"


def power_line(power: Mapping[str, Any]) -> str:
    """``kernel.power`` in one line: each planted fault, caught or not, and how far it moved the output."""
    faults = power.get("faults") or {}
    parts = [f"{name} {'caught' if f.get('detected') else 'MISSED'} (cos {_num(f.get('cos_diff'))})"
             for name, f in faults.items() if isinstance(f, Mapping)]
    return (" · ".join(parts) or "no faults planted") + f"; margin {_num(power.get('margin'))}x the tolerance"


def describe_kernel(k: Mapping[str, Any] | None, host: str | None = None) -> str:
    if not k:
        return ""
    prefix = f"[{host}] " if host else ""
    status = k.get("status")
    if status == "not-run":
        return f"{prefix}not run: {k.get('reason') or 'no reason given'}"
    emulated = status == "verified" and k.get("level") == "emulated"
    head = f"{prefix}{'verified with emulated kernels' if emulated else status} on {k.get('where') or '?'}"
    extra = [f"kernel {k['kernel']}" if k.get("kernel") else None,
             f"{k['time_s']} s" if k.get("time_s") is not None else None,
             f"seed {k['seed']}" if k.get("seed") is not None else None,
             "reused result" if k.get("reused") else None]
    extra_s = ", ".join(x for x in extra if x)
    lines = [head + (f" ({extra_s})" if extra_s else "")]
    for name, err in (k.get("errors") or {}).items():
        if isinstance(err, Mapping):
            keys = ("max_abs_err", "max_rel_err", "cos_diff", "fail_frac", "nan_mismatch")
            nums = " · ".join(f"{key} {_num(err[key])}" for key in keys if err.get(key) is not None)
            lines.append(f"  {name}: {nums}")
    tol = k.get("tolerance")
    if isinstance(tol, Mapping):
        lines.append("  tolerance: " + "; ".join(
            f"{n} " + " ".join(f"{a}={_num(b)}" for a, b in (t or {}).items() if b is not None)
            for n, t in tol.items() if isinstance(t, Mapping)))
    power = k.get("power")
    if isinstance(power, Mapping):
        lines.append("  power: " + power_line(power))
    schedule = k.get("schedule")
    if isinstance(schedule, Mapping):
        lines.append("  schedule: " + "; ".join(f"{name} {', '.join(str(c) for c in counts)}"
                                               for name, counts in schedule.items() if isinstance(counts, list)))
    for variant in k.get("variants") or []:
        if isinstance(variant, Mapping):
            what = (f"schedule case (seqlens {', '.join(str(n) for n in variant['seqlens'])})"
                    if isinstance(variant.get("seqlens"), list) else
                    f"k_scale {_num(variant.get('kv_scale'))}" if variant.get("kv_scale") is not None else "run")
            taken = variant.get("schedule") if isinstance(variant.get("schedule"), Mapping) else {}
            splits, padded = taken.get("num_kv_splits"), taken.get(GRAPH_PADDED)
            lines.append(f"  {what}: {variant.get('status')}, out max_abs_err "
                         f"{_num(variant.get('out_max_abs'))} · cos_diff {_num(variant.get('out_cos_diff'))}"
                         + (f" · KV splits {', '.join(str(c) for c in splits)}" if splits else "")
                         + (f" · CUDA-graph batch padded to {', '.join(str(n) for n in padded)} requests"
                            if padded else ""))
    case = k.get("case")
    if isinstance(case, Mapping):
        lines.append("  case: " + " ".join(f"{a}={b}" for a, b in case.items()))
    if k.get("message"):
        lines.append(f"  {k['message']}")
    return "\n".join(lines)


def build_data(model: ReportModel) -> dict[str, Any]:
    """The compact blob the page's script reads: axes, a string table, the distinct cell *bodies*
    (state and the indexes of its texts) and one array per cell (its axis value indexes, then its
    body), so that a hundred thousand cells cost the page a few integers each."""
    axes = list(model.axes)
    strings: list[str] = []
    index: dict[str, int] = {}

    def s(text: Any) -> int:
        text = visible(text)
        if text not in index:
            index[text] = len(strings)
            strings.append(text)
        return index[text]

    s("")
    orders = [{**model.order[a], None: -1} for a in axes]  # a cell without the axis: -1
    keys = model.keys
    state_index = {st: i for i, st in enumerate(STATES)}
    # Records read from a result file share equal values (codec.py): each text is made once per
    # distinct value, found by its identity (the document keeps every value alive meanwhile).
    texts: dict[tuple[str, int], int] = {}
    bodies: list[list[int]] = []
    body_index: dict[tuple[int, ...], int] = {}  # a body's texts → its index: equal bodies are one

    def text_of(kind: str, value: Any, make: Callable[[Any], str]) -> int:
        key = (kind, id(value))
        found = texts.get(key)
        if found is None:
            found = texts[key] = s(make(value))
        return found

    states = model.states
    signature_bodies = []  # a body per signature (``ReportModel.signatures``): what its records show
    for c in model.signature_records:
        state = states[id(c)]
        finding = model.finding_of(c)
        reason = c.get("reason")
        runs = c.get("kernel_runs")
        kernel = (text_of("runs", runs, _describe_runs) if runs
                  else text_of("kernel", c.get("kernel"), describe_kernel))
        texts_of_body = (state_index[state], s(c.get("verdict")),
                         text_of("expect", c.get("expectation"), describe_expectation),
                         text_of("outcome", c.get("outcome"), describe_outcome), s(reason), kernel,
                         text_of("notes", c.get("notes"), _notes_text), s(one_line(_short(c, state))),
                         text_of("finding", finding, describe_finding),
                         s(repro_command(str(c.get("id"))) if finding is not None else ""))
        body = body_index.get(texts_of_body)
        if body is None:
            body = body_index[texts_of_body] = len(bodies)
            bodies.append(list(texts_of_body))
        signature_bodies.append(body)
    cells = []
    ids = list(map(id, model.cells))
    for c, body, key in zip(model.cells, map(signature_bodies.__getitem__, map(model.signatures.__getitem__, ids)),
                            map(keys.get, ids)):
        if key is not None:
            cells.append([*map(operator.getitem, orders, key), body])
        else:
            coords = c.get("coords") or {}
            cells.append([o.get(coords.get(a), -1) for a, o in zip(axes, orders)] + [body])
    return {
        "axes": [{"name": a, "values": [str(v) for v in model.axes[a]],
                  "labels": [format_value(a, v) for v in model.axes[a]]} for a in axes],
        "states": list(STATES),
        "symbols": [GLYPHS[st] for st in STATES],
        "strings": strings,
        "bodies": bodies,
        "cells": cells,
        # The docs page's link keys (``#g=KEY``) → the filters that show the cells under each symbol.
        "groups": {key: "&".join(f"{axis}={','.join(values)}" for axis, values in filters.items())
                   for key, filters in build_docs_view(model).links.items()},
    }


def describe_finding(finding: Finding | None) -> str:
    """A cell's finding for its details: which one, what was raised, and when a server meets it."""
    if finding is None:
        return ""
    facts = finding.facts
    lines = [f"{finding.label}: {facts.title} ({len(finding.records)} cells)", facts.statement,
             f"a server meets it {facts.phase.text}"]
    if facts.level == "emulated":
        lines.append("the kernel itself did not run: the engine's code ran around float64 emulations of "
                     + (", ".join(facts.emulated) or "its kernel library"))
    lines += [f"upstream: {link}" for link in finding.links]
    return "\n".join(lines)
def _describe_runs(runs: Any) -> str:
    return "\n".join(describe_kernel(r, r.get("host")) for r in runs)


def _notes_text(notes: Any) -> str:
    return "\n".join(str(n) for n in (notes or []))


def _short(c: Mapping[str, Any], state: str) -> str:
    if state == "rejected":
        o = c.get("outcome") or {}
        return f"{o.get('error')}: {o.get('message')}"
    if c.get("reason"):
        return reason_line(c["reason"])
    k = kernel_of(c)
    if k.get("status") == "not-run":
        return f"kernel not run: {k.get('reason')}"
    if k.get("status"):
        return f"kernel {k['status']} on {k.get('where')}"
    return state


def _facts(model: ReportModel) -> list[tuple[str, str]]:
    run = model.run
    engine = run.get("engine") or {}
    host = run.get("host") or {}
    versions = run.get("versions") or {}
    counts = model.counts()
    facts = [
        ("engine", f"{engine.get('name') or '?'} {engine.get('version') or ''} (matrix describes {engine.get('described_versions') or '*'})"),
        ("matrix", f"{run.get('matrix') or '?'} ({run.get('matrix_file') or '?'})"),
        ("cells", f"{len(model.cells)} of {run.get('cells_total', len(model.cells))}: "
                  + ", ".join(f"{n} {v}" for v, n in counts.items() if n)),
        ("host", f"{host.get('arch') or '?'}" + (f", {host.get('gpus')}× {host.get('gpu')}" if host.get("gpu") else "")
                 + (f", {host.get('hostname')}" if host.get("hostname") else "")),
        ("versions", ", ".join(f"{k} {v}" for k, v in versions.items() if v)),
        ("kernel", f"dtype {run.get('kernel_dtype')}, seed {run.get('seed')}, dcp mode {run.get('dcp_mode')}"),
    ]
    tier = tier_line(run)
    if tier:
        facts.append(("tier", tier))
    # Timestamps and the commit are in files of schema version 1 only (newer runs keep them in
    # the run-facts side file, so that a report changes only when an outcome does).
    when = (f"{run.get('started') or '?'} → {run.get('finished') or '?'}"
            if run.get("started") or run.get("finished") else "")
    when += f", commit {run['git_commit'][:12]}" if run.get("git_commit") else ""
    if when or not run.get("complete", True):
        facts.append(("run", when.lstrip(", ") + ("" if run.get("complete", True) else
                                                  (", " if when else "") + "INCOMPLETE")))
    uncovered = model.uncovered()
    if uncovered:
        facts.append(("not covered", f"{len(uncovered)} MLA-capable backends the engine registers: "
                                     + ", ".join(uncovered)))
    if run.get("merged_from"):
        facts.append(("merged from", "; ".join(
            f"{(m.get('host') or {}).get('arch')} ({(m.get('host') or {}).get('hostname')}, {m.get('cells_reported')} cells)"
            for m in run["merged_from"])))
    if run.get("conflicts"):
        facts.append(("conflicts", ", ".join(c.get("id", "?") for c in run["conflicts"])))
    return facts


def render_html(document: Mapping[str, Any], *, view: str = "all", model: ReportModel | None = None) -> str:
    """The report as one self-contained HTML page: ``all``, ``backends`` or ``grid`` (``model``: the
    ``ReportModel`` of ``document``, to share its work with other renderings)."""
    if view not in HTML_VIEWS:
        raise ValueError(f"unknown view {view!r} (known: {', '.join(HTML_VIEWS)})")
    model = model if model is not None else ReportModel(document)
    run = model.run
    title = run.get("title") or run.get("matrix") or "pytest-mla report"
    facts = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in _facts(model))
    css = "\n" + static_text("report.css")
    if view == "backends":
        backends = build_backends_view(model)
        body = (render_backends_html(backends, level=2) + _probes_html(backends) + findings_html(model)
                + _failures_html(model))
        return _STATIC_PAGE.format(title=esc(title), matrix=esc(run.get("matrix") or ""), facts=facts, css=css,
                                   command=esc(render_command(view, fmt="html")), body=body)
    legend = "".join(
        f'<span class="lg"><span class="chip s-{esc(st)}">{esc(GLYPHS.get(st, st))}</span>{esc(text)}</span>'
        for st, text in LEGEND if st != PARTIAL)
    state_boxes = "".join(
        f'<label><input type="checkbox" data-state="{i}" checked> <span class="chip s-{esc(st)}">{esc(GLYPHS[st])}</span> {esc(st)}</label>'
        for i, st in enumerate(STATES))
    data = script_json(build_data(model))
    if view == "grid":
        section = ""
    else:
        backends = build_backends_view(model)
        section = ('<section id="backends-view">\n<h2>Attention backends</h2>\n' + render_backends_html(backends, level=3)
                   + _probes_html(backends) + findings_html(model)
                   + '</section>\n<h2 class="grid-title">Full matrix</h2>\n')
    return _PAGE.format(title=esc(title), matrix=esc(run.get("matrix") or ""), facts=facts, legend=legend,
                        state_boxes=state_boxes, data=data, css=css, js="\n" + static_text("report.js"),
                        command=esc(render_command(view, fmt="html")), backends=section)


# -- the backends view ------------------------------------------------------------------------
_CITE = re.compile(r"\[(\d+)\]")


def _refs_html(refs: Any) -> str:
    return "".join(f' <a class="ref" href="#note-{n}">[{n}]</a>' for n in refs)


def _note_html(number: int, text: str, notes: Notes) -> str:
    """A note's text, escaped, with the notes it cites turned into links."""
    cited = set(notes.links.get(number, ()))
    out = esc(text)
    if cited:
        out = _CITE.sub(lambda m: f'<a class="ref" href="#note-{m.group(1)}">[{m.group(1)}]</a>'
                        if int(m.group(1)) in cited else m.group(0), out)
    return out


def render_backends_html(view: BackendsView, level: int = 2) -> str:
    """The backends view's tables and notes as an HTML fragment (no script)."""
    texts = {n: t for n, t in view.notes.items()}
    h = f"h{level}"
    out = ['<p class="legend">' + "".join(
        f'<span class="lg"><span class="entry e-{esc(st)}">{esc(ENTRY_GLYPHS[st])}</span>{esc(text)}</span>'
        for st, text in BACKENDS_LEGEND) + "</p>"]
    explain = "; ".join(f"<b>{esc(titles)}</b>: {esc(text)}" for titles, text in view.explain_columns())
    stops = " " + esc(CONSTRUCTION_STOPS) if view.construction_stops else ""
    out.append(f'<p class="columns">{explain}. {esc(COUNTING)}{stops}</p>')
    head = "".join(f"<th>{esc(c.title)}</th>" for c in view.columns)
    for family in view.families:
        out.append(f"<{h}>{esc(family.title)}: {esc(', '.join(family.models))}</{h}>")
        if family.rows:
            out.append(f'<table class="backends"><thead><tr><th>backend</th>{head}<th>verified on</th></tr></thead><tbody>')
            for row in family.rows:
                cells = []
                for e in row.entries:
                    tip = "; ".join(texts[n] for n in e.refs)
                    title = f' title="{esc(tip)}"' if tip else ""
                    cells.append(f'<td{title}><span class="entry e-{esc(e.state)}">'
                                 f'{esc(ENTRY_GLYPHS[e.state])}</span>{_refs_html(e.refs)}</td>')
                out.append(f"<tr><th>{esc(row.backend)}{_refs_html(row.refs)}</th>{''.join(cells)}"
                           f'<td class="verified">{esc(row.verified)}{_refs_html(row.verified_refs)}</td></tr>')
            out.append("</tbody></table>")
        if family.refused:
            listed = ", ".join(f"{esc(r.backend)}{_refs_html(r.refs)}" for r in family.refused)
            out.append(f'<p class="refused">Refused in every configuration: {listed}.</p>')
    if len(view.notes):
        out.append(f'<{h}>Notes</{h}><ol class="notes">')
        out += [f'<li id="note-{n}">{_note_html(n, t, view.notes)}</li>' for n, t in view.notes.items()]
        out.append("</ol>")
    return "\n".join(out) + "\n"


def _probes_html(view: BackendsView) -> str:
    if not view.probes:
        return ""
    rows = []
    for p in view.probes:
        label = esc(f"{p.axis} = {p.value}") if p.first else ""
        rows.append(f'<tr><th>{label}</th><td class="num">{p.cells}</td><td>{esc(p.condition)}</td>'
                    f'<td><span class="entry e-{esc(p.state)}">{esc(ENTRY_GLYPHS[p.state])}</span> {esc(p.text)}</td></tr>')
    return ('<h2 id="input-validation">Input validation</h2>\n<p>These axis values are probes of the engine\'s own '
            "input checks: their cells run and are judged like every other, and are left out of the tables above.</p>\n"
            '<table class="backends probes"><thead><tr><th>probe</th><th>cells</th><th>where</th>'
            "<th>the engine's answer</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>\n")


def findings_html(model: ReportModel) -> str:
    """The Findings section: each distinct finding once, with its cells and the reproducer command."""
    if not model.findings:
        return ""
    intro = esc(FINDINGS_INTRO).replace("`", "")
    counts = f"<b>{esc(causes_line(model))}.</b> {esc(ROOT_CAUSE_INTRO)}"
    out = [f'<h2 id="findings">Findings</h2>\n<p class="columns">{intro}</p>\n<p class="columns">{counts}</p>\n'
           '<div class="findings">']
    axes = list(model.axes)
    causes = finding_causes(model)
    for f in model.findings:
        facts = f.facts
        rows = [("root cause", root_cause_text(causes[f.number], f.number))] if f.number in causes else []
        rows += [("known bug" if f.xfail else "not declared", f.xfail or "no rule of the matrix declares it"),
                ("raised" if facts.kind == "raised" else "out of tolerance", facts.statement),
                ("in", (facts.function or "the engine's code") + (f" (level {facts.level})" if facts.level else ""))]
        if facts.frames:
            rows.append(("engine frames", " → ".join(facts.frames)))
        if facts.level == "emulated":
            rows.append(("kernel", "did not run: the engine's code ran around float64 emulations of "
                                   + (", ".join(facts.emulated) or "its kernel library")))
        rows += [("a server meets it", facts.phase.text),
                 ("cells", f"{len(f.records)}: {f.describe_cells(axes, model.order)}")]
        rows += [("rerouted", rerouted_text(built, asked, configurations_of(model, f.records)))
                 for built, asked in rerouted_of(model, f.records).items()]
        items = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in rows)
        links = "".join(f'<dd><a href="{esc(link)}">{esc(link)}</a></dd>' for link in f.links)
        links = f"<dt>upstream</dt>{links}" if links else ""
        command = f"<dt>reproduce</dt><dd><code>{esc(repro_command(f.ids[0]))}</code></dd>"
        out.append(f'<div class="finding" id="finding-{f.number}"><h3>{esc(f.label)}. {esc(facts.title)}</h3>'
                   f"<dl>{items}{links}{command}</dl></div>")
    out.append("</div>")
    return "\n".join(out) + "\n"


def _failures_html(model: ReportModel) -> str:
    bad = model.bad_cells()
    if not bad:
        return ""
    items = "".join(f"<li><code>{esc(c.get('id'))}</code> <b>{esc(c.get('verdict'))}</b>: "
                    f"{esc(reason_line(c.get('reason')))}</li>" for c in bad)
    return f'<h2 id="failures">Failures</h2>\n<ul class="failures">{items}</ul>\n'


_STATIC_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="pytest-mla">
<title>{title}</title>
<style>{css}</style>
</head>
<body>
<!-- Do not edit: generated by pytest-mla. Regenerate with `{command}`. -->
<header>
<h1>{title}</h1>
<p class="banner">Generated by pytest-mla from the verified outcomes of matrix <code>{matrix}</code>. Do not edit.</p>
<dl class="facts">{facts}</dl>
</header>
<main class="static">
{body}</main>
</body>
</html>
"""

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="pytest-mla">
<title>{title}</title>
<style>{css}</style>
</head>
<body>
<!-- Do not edit: generated by pytest-mla. Regenerate with `{command}`. -->
<header>
<h1>{title}</h1>
<p class="banner">Generated by pytest-mla from the verified outcomes of matrix <code>{matrix}</code>. Do not edit.</p>
<dl class="facts">{facts}</dl>
<p class="legend">{legend}</p>
</header>
<main>
{backends}<section id="controls">
<div class="layout">
<label>Rows <select id="rows0"></select></label> <select id="rows1"></select>
<label>Columns <select id="cols0"></select></label> <select id="cols1"></select>
<button type="button" id="reset">Reset</button>
<span id="shown"></span>
</div>
<div id="filters"></div>
<fieldset class="states"><legend>state</legend>{state_boxes}</fieldset>
</section>
<div id="wrap"><div id="matrix"><noscript>The matrix needs JavaScript; the same data is in the JSON result file.</noscript></div>
<aside id="details"><p class="hint">Click a cell for its details.</p></aside></div>
</main>
<script type="application/json" id="mla-data">{data}</script>
<script>{js}</script>
</body>
</html>
"""

__all__ = ["render_html", "render_backends_html", "esc", "script_json", "build_data", "findings_html", "static_text"]
