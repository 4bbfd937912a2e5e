(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("mla-data").textContent);
  var AX = D.axes, S = D.strings, CELLS = D.cells, NA = AX.length;
  var ST = D.states, SYM = D.symbols;
  var I_STATE = NA, I_VERDICT = NA + 1, I_EXP = NA + 2, I_OUT = NA + 3, I_REASON = NA + 4,
      I_KERNEL = NA + 5, I_NOTES = NA + 6, I_SHORT = NA + 7, I_FINDING = NA + 8, I_REPRO = NA + 9;
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
    row("finding", S[c[I_FINDING]], true);
    row("reproduce", S[c[I_REPRO]], true);
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
