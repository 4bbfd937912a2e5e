"""HTML rendering: one self-contained file (inline CSS and JS, no network).

The page shows the full matrix: rows and columns are axes the reader picks
(default model · backend by arch · spec), every cell of the matrix is a chip
inside its table cell, filters per axis value and per state hide chips, and a
click on a chip opens its details (expectation, outcome, reason, kernel
numbers). Filters and layout live in the URL fragment
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

import html
import json
from typing import Any, Mapping

from .model import LEGEND, PARTIAL, STATES, ReportModel, cell_state, format_value, one_line


#: Chip glyphs: plain text symbols every font has (the page must not depend on an emoji font);
#: colour carries the same meaning as the Markdown legend's emoji.
GLYPHS = {"verified": "✔", "accepted": "✓", "rejected": "⊘", "xfail": "!", "skipped": "–", "bad": "✗"}


def esc(value: Any) -> str:
    """The one escaping helper for HTML text and (quoted) attribute values."""
    return html.escape("" if value is None else str(value), quote=True)


_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                              "\u2028": "\\u2028", "\u2029": "\\u2029"})


def script_json(value: Any) -> str:
    """JSON for inside a ``<script type="application/json">`` element."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).translate(_SCRIPT_SAFE)


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


def describe_kernel(k: Mapping[str, Any] | None, host: str | None = None) -> str:
    if not k:
        return ""
    prefix = f"[{host}] " if host else ""
    status = k.get("status")
    if status == "not-run":
        return f"{prefix}not run: {k.get('reason') or 'no reason given'}"
    head = f"{prefix}{status} on {k.get('where') or '?'}"
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
    case = k.get("case")
    if isinstance(case, Mapping):
        lines.append("  case: " + " ".join(f"{a}={b}" for a, b in case.items()))
    if k.get("message"):
        lines.append(f"  {k['message']}")
    return "\n".join(lines)


def build_data(model: ReportModel) -> dict[str, Any]:
    """The compact blob the page's script reads: axes, a string table and one array per cell."""
    axes = list(model.axes)
    strings: list[str] = []
    index: dict[str, int] = {}

    def s(text: Any) -> int:
        text = "" if text is None else str(text)
        if text not in index:
            index[text] = len(strings)
            strings.append(text)
        return index[text]

    s("")
    order = model.order
    cells = []
    for c in model.cells:
        coords = c.get("coords") or {}
        state = cell_state(c)
        runs = c.get("kernel_runs")
        if runs:
            kernel = "\n".join(describe_kernel(r, r.get("host")) for r in runs)
        else:
            kernel = describe_kernel(c.get("kernel"))
        notes = "\n".join(str(n) for n in (c.get("notes") or []))
        cells.append([order[a].get(coords.get(a), -1) for a in axes] + [
            STATES.index(state), s(c.get("verdict")), s(describe_expectation(c.get("expectation"))),
            s(describe_outcome(c.get("outcome"))), s(c.get("reason")), s(kernel), s(notes),
            s(one_line(_short(c, state))),
        ])
    return {
        "axes": [{"name": a, "values": [str(v) for v in model.axes[a]],
                  "labels": [format_value(a, v) for v in model.axes[a]]} for a in axes],
        "states": list(STATES),
        "symbols": [GLYPHS[st] for st in STATES],
        "strings": strings,
        "cells": cells,
    }


def _short(c: Mapping[str, Any], state: str) -> str:
    if state == "rejected":
        o = c.get("outcome") or {}
        return f"{o.get('error')}: {o.get('message')}"
    if c.get("reason"):
        return str(c["reason"]).strip().splitlines()[0]
    k = c.get("kernel") or {}
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
        ("run", f"{run.get('started') or '?'} → {run.get('finished') or '?'}"
                + (f", commit {run['git_commit'][:12]}" if run.get("git_commit") else "")
                + ("" if run.get("complete", True) else ", INCOMPLETE")),
    ]
    if run.get("merged_from"):
        facts.append(("merged from", "; ".join(
            f"{(m.get('host') or {}).get('arch')} ({(m.get('host') or {}).get('hostname')}, {m.get('cells_reported')} cells)"
            for m in run["merged_from"])))
    if run.get("conflicts"):
        facts.append(("conflicts", ", ".join(c.get("id", "?") for c in run["conflicts"])))
    return facts


def render_html(document: Mapping[str, Any]) -> str:
    """The whole report as one self-contained HTML page."""
    model = ReportModel(document)
    run = model.run
    title = run.get("title") or run.get("matrix") or "pytest-mla report"
    facts = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in _facts(model))
    legend = "".join(
        f'<span class="lg"><span class="chip s-{esc(st)}">{esc(GLYPHS.get(st, st))}</span>{esc(text)}</span>'
        for st, text in LEGEND if st != PARTIAL)
    state_boxes = "".join(
        f'<label><input type="checkbox" data-state="{i}" checked> <span class="chip s-{esc(st)}">{esc(GLYPHS[st])}</span> {esc(st)}</label>'
        for i, st in enumerate(STATES))
    data = script_json(build_data(model))
    return _PAGE.format(title=esc(title), matrix=esc(run.get("matrix") or ""), facts=facts, legend=legend,
                        state_boxes=state_boxes, data=data, css=_CSS, js=_JS)


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
<!-- Do not edit: generated by pytest-mla -->
<header>
<h1>{title}</h1>
<p class="banner">Generated by pytest-mla from the verified outcomes of matrix <code>{matrix}</code>. Do not edit.</p>
<dl class="facts">{facts}</dl>
<p class="legend">{legend}</p>
</header>
<main>
<section id="controls">
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

_CSS = """
:root{--ok:#1a7f37;--acc:#4c9a5f;--rej:#57606a;--xf:#9a6700;--sk:#8c959f;--bad:#cf222e;--bg:#fff;--fg:#1f2328;--line:#d0d7de;--soft:#f6f8fa}
*{box-sizing:border-box}
body{margin:0;font:13px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg)}
header{padding:14px 20px 6px;border-bottom:1px solid var(--line);background:var(--soft)}
h1{font-size:20px;margin:0 0 4px}
.banner{margin:0 0 8px;color:#57606a}
.facts{display:grid;grid-template-columns:max-content 1fr;gap:1px 12px;margin:0 0 6px;font-size:12px}
.facts dt{color:#57606a}.facts dd{margin:0;word-break:break-word}
.legend{margin:4px 0;display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px}
.lg{display:inline-flex;align-items:center;gap:5px}
main{padding:10px 20px}
#controls{display:flex;flex-direction:column;gap:6px;margin-bottom:10px}
.layout{display:flex;gap:8px;align-items:center;flex-wrap:wrap}
#shown{color:#57606a;margin-left:8px}
#filters{display:flex;flex-wrap:wrap;gap:6px}
fieldset{border:1px solid var(--line);border-radius:6px;padding:2px 8px 4px;margin:0}
legend{font-weight:600;font-size:12px;padding:0 4px}
fieldset label{margin-right:8px;white-space:nowrap;font-size:12px}
#wrap{display:flex;gap:14px;align-items:flex-start}
#matrix{overflow:auto;max-width:100%;flex:1 1 auto}
table{border-collapse:collapse;font-size:12px}
th,td{border:1px solid var(--line);padding:3px 5px;vertical-align:top}
thead th{background:var(--soft);position:sticky;top:0;white-space:nowrap}
tbody th{background:var(--soft);text-align:left;white-space:nowrap;font-weight:600}
th.sub{font-weight:normal}
td{min-width:48px;white-space:nowrap}
.chip{display:inline-flex;align-items:center;justify-content:center;min-width:22px;height:20px;margin:1px;padding:0 3px;border-radius:4px;border:1px solid transparent;cursor:pointer;font-size:12px;line-height:1;background:#eef1f4}
.chip small{font-size:9px;margin-left:2px;color:#57606a}
.chip:hover,.chip.sel{border-color:#0969da;box-shadow:0 0 0 1px #0969da}
.s-verified{background:var(--ok);color:#fff;font-weight:700}.s-verified small{color:#dafbe1}
.s-accepted{background:#dafbe1;color:var(--ok)}.s-rejected{background:#eef1f4;color:var(--rej)}
.s-xfail{background:#fff8c5;color:var(--xf);font-weight:700}.s-skipped{background:#f6f8fa;color:var(--sk)}
.s-bad{background:var(--bad);color:#fff;font-weight:700}.s-bad small{color:#ffebe9}
aside{flex:0 0 330px;position:sticky;top:8px;border:1px solid var(--line);border-radius:6px;padding:8px 12px;background:var(--soft);max-height:90vh;overflow:auto}
aside h2{font-size:14px;margin:0 0 6px;word-break:break-all}
aside dt{font-weight:600;margin-top:6px}
aside dd{margin:0}
aside pre{white-space:pre-wrap;word-break:break-word;margin:0;font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace}
.hint{color:#57606a}
"""

_JS = r"""
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("mla-data").textContent);
  var AX = D.axes, S = D.strings, CELLS = D.cells, NA = AX.length;
  var ST = D.states, SYM = D.symbols;
  var I_STATE = NA, I_VERDICT = NA + 1, I_EXP = NA + 2, I_OUT = NA + 3, I_REASON = NA + 4,
      I_KERNEL = NA + 5, I_NOTES = NA + 6, I_SHORT = NA + 7;
  var byName = {};
  AX.forEach(function (a, i) { byName[a.name] = i; });
  var DEFAULT_ROWS = ["model", "backend"].filter(function (n) { return n in byName; });
  var DEFAULT_COLS = ["arch", "spec"].filter(function (n) { return n in byName; });
  var view = {rows: [], cols: [], off: {}, states: {}};
  var selected = null;

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  function cellId(c) {
    var parts = [];
    for (var i = 0; i < NA; i++) if (c[i] >= 0) parts.push(AX[i].labels[c[i]]);
    return parts.join("/");
  }

  // -- URL fragment <-> view ------------------------------------------------------
  function readHash() {
    view = {rows: DEFAULT_ROWS.slice(), cols: DEFAULT_COLS.slice(), off: {}, states: {}};
    var h = decodeURIComponent(location.hash.replace(/^#/, ""));
    if (!h) return;
    h.split("&").forEach(function (kv) {
      var p = kv.split("="), k = p[0], vals = (p[1] || "").split(",").filter(Boolean);
      if (k === "cell") {
        view.cell = p.slice(1).join("=");
      } else if (k === "rows" || k === "cols") {
        var axes = vals.filter(function (v) { return v in byName; });
        if (axes.length) view[k] = axes.slice(0, 2);
      } else if (k === "state") {
        ST.forEach(function (s, i) { if (vals.indexOf(s) < 0) view.states[i] = true; });
      } else if (k in byName) {
        var ax = AX[byName[k]];
        ax.values.forEach(function (v, i) {
          if (vals.indexOf(v) < 0 && vals.indexOf(ax.labels[i]) < 0) view.off[k + "=" + i] = true;
        });
      }
    });
    view.cols = view.cols.filter(function (a) { return view.rows.indexOf(a) < 0; });
  }
  function writeHash() {
    var parts = [];
    if (view.rows.join() !== DEFAULT_ROWS.join()) parts.push("rows=" + view.rows.join(","));
    if (view.cols.join() !== DEFAULT_COLS.join()) parts.push("cols=" + view.cols.join(","));
    AX.forEach(function (a, ai) {
      var on = a.values.filter(function (v, i) { return !view.off[a.name + "=" + i]; });
      if (on.length !== a.values.length) parts.push(a.name + "=" + on.join(","));
    });
    var st = ST.filter(function (s, i) { return !view.states[i]; });
    if (st.length !== ST.length) parts.push("state=" + st.join(","));
    if (view.cell) parts.push("cell=" + view.cell);
    var h = parts.join("&");
    if (history.replaceState) history.replaceState(null, "", h ? "#" + h : location.pathname + location.search);
  }

  // -- controls ---------------------------------------------------------------------
  function fillSelect(sel, value, allowNone) {
    sel.textContent = "";
    if (allowNone) sel.appendChild(el("option", null, "—")).value = "";
    AX.forEach(function (a) {
      var o = el("option", null, a.name); o.value = a.name; sel.appendChild(o);
    });
    sel.value = value || "";
  }
  function buildControls() {
    fillSelect(document.getElementById("rows0"), view.rows[0], false);
    fillSelect(document.getElementById("rows1"), view.rows[1], true);
    fillSelect(document.getElementById("cols0"), view.cols[0], true);
    fillSelect(document.getElementById("cols1"), view.cols[1], true);
    var box = document.getElementById("filters");
    box.textContent = "";
    AX.forEach(function (a) {
      var fs = el("fieldset"); fs.setAttribute("data-axis", a.name);
      fs.appendChild(el("legend", null, a.name));
      a.values.forEach(function (v, i) {
        var lab = el("label"), cb = el("input");
        cb.type = "checkbox"; cb.checked = !view.off[a.name + "=" + i];
        cb.setAttribute("data-axis", a.name); cb.setAttribute("data-value", v);
        cb.addEventListener("change", function () {
          if (cb.checked) delete view.off[a.name + "=" + i]; else view.off[a.name + "=" + i] = true;
          update();
        });
        lab.appendChild(cb); lab.appendChild(document.createTextNode(" " + a.labels[i]));
        fs.appendChild(lab);
      });
      box.appendChild(fs);
    });
    Array.prototype.forEach.call(document.querySelectorAll("input[data-state]"), function (cb) {
      var i = +cb.getAttribute("data-state");
      cb.checked = !view.states[i];
      cb.onchange = function () { if (cb.checked) delete view.states[i]; else view.states[i] = true; update(); };
    });
  }
  function readLayout() {
    function pick(ids) {
      var out = [];
      ids.forEach(function (id) { var v = document.getElementById(id).value; if (v && out.indexOf(v) < 0) out.push(v); });
      return out;
    }
    view.rows = pick(["rows0", "rows1"]);
    view.cols = pick(["cols0", "cols1"]).filter(function (a) { return view.rows.indexOf(a) < 0; });
  }
  ["rows0", "rows1", "cols0", "cols1"].forEach(function (id) {
    document.getElementById(id).addEventListener("change", function () { readLayout(); update(); });
  });
  document.getElementById("reset").addEventListener("click", function () {
    location.hash = ""; readHash(); buildControls(); update();
  });

  // -- the matrix -------------------------------------------------------------------
  function visible(c) {
    if (view.states[c[I_STATE]]) return false;
    for (var i = 0; i < NA; i++) if (view.off[AX[i].name + "=" + c[i]]) return false;
    return true;
  }
  function keyOf(c, idx) { return idx.map(function (i) { return c[i]; }); }
  function cmp(a, b) { for (var i = 0; i < a.length; i++) if (a[i] !== b[i]) return a[i] - b[i]; return 0; }
  function label(idx, key) { return idx.map(function (ai, j) { return AX[ai].labels[key[j]]; }); }

  function render() {
    var rIdx = view.rows.map(function (n) { return byName[n]; });
    var cIdx = view.cols.map(function (n) { return byName[n]; });
    var hIdx = [];
    for (var i = 0; i < NA; i++) if (rIdx.indexOf(i) < 0 && cIdx.indexOf(i) < 0) hIdx.push(i);
    var rows = {}, cols = {}, groups = {}, n = 0;
    CELLS.forEach(function (c, ci) {
      if (!visible(c)) return;
      n++;
      var rk = keyOf(c, rIdx), ck = keyOf(c, cIdx), rs = rk.join(","), cs = ck.join(",");
      rows[rs] = rk; cols[cs] = ck;
      (groups[rs + "|" + cs] = groups[rs + "|" + cs] || []).push(ci);
    });
    var rKeys = Object.keys(rows).map(function (k) { return rows[k]; }).sort(cmp);
    var cKeys = Object.keys(cols).map(function (k) { return cols[k]; }).sort(cmp);
    var table = el("table"); table.id = "grid";
    var thead = el("thead");
    var levels = Math.max(cIdx.length, 1);
    for (var lv = 0; lv < levels; lv++) {
      var tr = el("tr");
      if (lv === 0) {
        var corner = el("th", null, view.rows.join(" · ") + (cIdx.length ? "  \\  " + view.cols.join(" · ") : ""));
        corner.rowSpan = levels; corner.colSpan = Math.max(rIdx.length, 1); tr.appendChild(corner);
      }
      var prev = null, th = null;
      cKeys.forEach(function (ck) {
        var text = cIdx.length ? AX[cIdx[lv]].labels[ck[lv]] : "cells";
        var parent = ck.slice(0, lv + 1).join(",");
        if (lv < levels - 1 && parent === prev) { th.colSpan += 1; return; }
        th = el("th", lv === levels - 1 && levels > 1 ? "sub" : null, text); th.colSpan = 1;
        tr.appendChild(th); prev = parent;
      });
      thead.appendChild(tr);
    }
    table.appendChild(thead);
    var tbody = el("tbody"), lastR = [];
    rKeys.forEach(function (rk) {
      var tr = el("tr"), rs = rk.join(",");
      var labels = label(rIdx, rk);
      if (!rIdx.length) labels = ["all"];
      labels.forEach(function (t, j) { tr.appendChild(el("th", j ? "sub" : null, (j === 0 && lastR[0] === t && labels.length > 1) ? "" : t)); });
      lastR = labels;
      cKeys.forEach(function (ck) {
        var td = el("td"), members = groups[rs + "|" + ck.join(",")] || [];
        members.forEach(function (ci) {
          var c = CELLS[ci], st = c[I_STATE];
          var chip = el("span", "chip s-" + ST[st], SYM[st]);
          var id = cellId(c), hidden = label(hIdx, keyOf(c, hIdx)).join(" ");
          if (hIdx.length === 1) chip.appendChild(el("small", null, AX[hIdx[0]].labels[c[hIdx[0]]].replace(/^dcp/, "")));
          chip.setAttribute("data-id", id);
          chip.setAttribute("data-state", ST[st]);
          chip.setAttribute("title", (hidden ? hidden + ": " : "") + ST[st] + " — " + S[c[I_SHORT]]);
          chip.tabIndex = 0;
          chip.addEventListener("click", function () { show(ci, chip); });
          chip.addEventListener("keydown", function (ev) { if (ev.key === "Enter") show(ci, chip); });
          td.appendChild(chip);
        });
        tr.appendChild(td);
      });
      tbody.appendChild(tr);
    });
    table.appendChild(tbody);
    var box = document.getElementById("matrix");
    box.textContent = "";
    box.appendChild(n ? table : el("p", "hint", "No cell matches the filters."));
    document.getElementById("shown").textContent = n + " of " + CELLS.length + " cells shown" +
      (hIdx.length ? "; chips: " + hIdx.map(function (i) { return AX[i].name; }).join(" · ") : "");
  }

  function show(ci, chip) {
    var c = CELLS[ci], aside = document.getElementById("details");
    if (view.cell !== cellId(c)) { view.cell = cellId(c); writeHash(); }
    if (selected) selected.classList.remove("sel");
    selected = chip; if (chip) chip.classList.add("sel");
    aside.textContent = "";
    aside.appendChild(el("h2", null, SYM[c[I_STATE]] + " " + cellId(c)));
    var dl = el("dl");
    function row(name, text, pre) {
      if (!text) return;
      dl.appendChild(el("dt", null, name));
      var dd = el("dd"); dd.appendChild(el(pre ? "pre" : "span", null, text)); dl.appendChild(dd);
    }
    row("verdict", S[c[I_VERDICT]] + " (" + ST[c[I_STATE]] + ")");
    row("expected", S[c[I_EXP]], true);
    row("engine did", S[c[I_OUT]], true);
    row("reason", S[c[I_REASON]], true);
    row("kernel", S[c[I_KERNEL]], true);
    row("notes", S[c[I_NOTES]], true);
    aside.appendChild(dl);
  }

  function showLinked() {
    if (!view.cell) return;
    var chips = document.querySelectorAll("#matrix .chip");
    for (var i = 0; i < chips.length; i++) {
      if (chips[i].getAttribute("data-id") === view.cell) { chips[i].click(); return; }
    }
  }
  function update() { writeHash(); render(); showLinked(); }
  function load() { readHash(); buildControls(); render(); showLinked(); }
  load();
  window.addEventListener("hashchange", load);
})();
"""

__all__ = ["render_html", "esc", "script_json", "build_data"]
