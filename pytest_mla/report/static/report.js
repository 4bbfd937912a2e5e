(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("mla-data").textContent);
  var AX = D.axes, S = D.strings, CELLS = D.cells, BODIES = D.bodies, NA = AX.length;
  var ST = D.states, SYM = D.symbols;
  // A cell is its axis value indexes, then its body; a body is the state and its texts.
  var B_STATE = 0, B_VERDICT = 1, B_EXP = 2, B_OUT = 3, B_REASON = 4, B_KERNEL = 5, B_NOTES = 6, B_SHORT = 7,
      B_FINDING = 8, B_REPRO = 9;
  // Big matrices: rows are built as they scroll into view, a table cell shows its first chips
  // and a button for the rest, and one listener serves every chip.
  var ROWS_PER_BATCH = 40, CHIPS_PER_BATCH = 3000, CHIPS_PER_TD = 60;
  function body(c) { return BODIES[c[NA]]; }
  var byName = {};
  AX.forEach(function (a, i) { byName[a.name] = i; });
  var DEFAULT_ROWS = ["model", "backend"].filter(function (n) { return n in byName; });
  var DEFAULT_COLS = ["arch", "spec"].filter(function (n) { return n in byName; });
  var view = {rows: [], cols: [], off: {}, states: {}};
  var selected = null;
  var lazy = null;  // the rows of the current table not built yet, and how to build them

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
    // A docs page's link (#g=KEY) opens on the cells under its symbol.
    if (h.indexOf("g=") === 0 && D.groups && Object.prototype.hasOwnProperty.call(D.groups, h.slice(2))) {
      h = D.groups[h.slice(2)];
    }
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
  var offNow = null;  // per axis, per value index: filtered out (made from view.off by render)
  function visible(c) {
    if (view.states[body(c)[B_STATE]]) return false;
    for (var i = 0; i < NA; i++) if (offNow[i][c[i]]) return false;
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
    offNow = AX.map(function (a) { return a.values.map(function (v, vi) { return !!view.off[a.name + "=" + vi]; }); });
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
    var tbody = el("tbody");
    table.appendChild(tbody);
    var box = document.getElementById("matrix");
    box.textContent = "";
    if (!n) {
      lazy = null;
      box.appendChild(el("p", "hint", "No cell matches the filters."));
    } else {
      box.appendChild(table);
      var more = el("p", "hint more-rows");
      box.appendChild(more);
      lazy = {rKeys: rKeys, cKeys: cKeys, rIdx: rIdx, cIdx: cIdx, hIdx: hIdx, groups: groups, tbody: tbody,
              next: 0, lastR: [], more: more, rowOf: {}};
      rKeys.forEach(function (rk, i) { lazy.rowOf[rk.join(",")] = i; });
      buildRows(false);
      watch();
    }
    document.getElementById("shown").textContent = n + " of " + CELLS.length + " cells shown" +
      (hIdx.length ? "; chips: " + hIdx.map(function (i) { return AX[i].name; }).join(" · ") : "");
  }

  function chip(ci) {
    var c = CELLS[ci], b = body(c), st = b[B_STATE], L = lazy;
    var e = el("span", "chip s-" + ST[st], SYM[st]);
    var hidden = label(L.hIdx, keyOf(c, L.hIdx)).join(" ");
    if (L.hIdx.length === 1) e.appendChild(el("small", null, AX[L.hIdx[0]].labels[c[L.hIdx[0]]].replace(/^dcp/, "")));
    e.setAttribute("data-id", cellId(c));
    e.setAttribute("data-state", ST[st]);
    e.setAttribute("data-ci", ci);
    e.setAttribute("title", (hidden ? hidden + ": " : "") + ST[st] + " — " + S[b[B_SHORT]]);
    e.tabIndex = 0;
    return e;
  }
  function fillTd(td, members, from, to) {
    for (var i = from; i < to; i++) td.appendChild(chip(members[i]));
    if (to < members.length) {
      var rest = el("button", "more", "+" + (members.length - to) + " more");
      rest.type = "button";
      rest.setAttribute("data-more", to);
      td.appendChild(rest);
    }
  }
  // Builds the next rows (a batch, or every row up to `until`); returns how many chips it made.
  function buildRows(all, until) {
    var L = lazy, chips = 0, made = 0;
    while (L.next < L.rKeys.length && (all || (until !== undefined ? L.next <= until :
           made < ROWS_PER_BATCH && chips < CHIPS_PER_BATCH))) {
      var rk = L.rKeys[L.next++], tr = el("tr"), rs = rk.join(",");
      var labels = label(L.rIdx, rk);
      if (!L.rIdx.length) labels = ["all"];
      labels.forEach(function (t, j) {
        tr.appendChild(el("th", j ? "sub" : null, (j === 0 && L.lastR[0] === t && labels.length > 1) ? "" : t));
      });
      L.lastR = labels;
      L.cKeys.forEach(function (ck) {
        var td = el("td"), members = L.groups[rs + "|" + ck.join(",")] || [];
        td.setAttribute("data-group", rs + "|" + ck.join(","));
        fillTd(td, members, 0, Math.min(members.length, CHIPS_PER_TD));
        chips += Math.min(members.length, CHIPS_PER_TD);
        tr.appendChild(td);
      });
      L.tbody.appendChild(tr);
      made++;
    }
    var left = L.rKeys.length - L.next;
    L.more.textContent = left ? left + " more rows load as you scroll." : "";
    return chips;
  }
  var observer = null;
  function watch() {
    if (!lazy || lazy.next >= lazy.rKeys.length) return;
    if (!("IntersectionObserver" in window)) { buildRows(true); return; }
    if (!observer) {
      observer = new IntersectionObserver(function (entries) {
        if (entries.some(function (e) { return e.isIntersecting; }) && lazy) {
          buildRows(false);
          if (lazy.next >= lazy.rKeys.length) observer.disconnect();
        }
      }, {rootMargin: "600px"});
    }
    observer.disconnect();
    observer.observe(lazy.more);
  }
  function expand(button) {
    var td = button.parentNode, members = lazy.groups[td.getAttribute("data-group")] || [];
    var from = +button.getAttribute("data-more");
    td.removeChild(button);
    fillTd(td, members, from, members.length);
  }
  var box = document.getElementById("matrix");
  box.addEventListener("click", function (ev) {
    var t = ev.target.closest ? ev.target.closest("[data-ci],[data-more]") : null;
    if (!t) return;
    if (t.hasAttribute("data-more")) expand(t); else show(+t.getAttribute("data-ci"), t);
  });
  box.addEventListener("keydown", function (ev) {
    var t = ev.target;
    if (ev.key === "Enter" && t.hasAttribute && t.hasAttribute("data-ci")) show(+t.getAttribute("data-ci"), t);
  });

  function show(ci, chip) {
    var c = CELLS[ci], aside = document.getElementById("details");
    if (view.cell !== cellId(c)) { view.cell = cellId(c); writeHash(); }
    if (selected) selected.classList.remove("sel");
    selected = chip; if (chip) chip.classList.add("sel");
    aside.textContent = "";
    var b = body(c);
    aside.appendChild(el("h2", null, SYM[b[B_STATE]] + " " + cellId(c)));
    var dl = el("dl");
    function row(name, text, pre) {
      if (!text) return;
      dl.appendChild(el("dt", null, name));
      var dd = el("dd"); dd.appendChild(el(pre ? "pre" : "span", null, text)); dl.appendChild(dd);
    }
    row("verdict", S[b[B_VERDICT]] + " (" + ST[b[B_STATE]] + ")");
    row("expected", S[b[B_EXP]], true);
    row("engine did", S[b[B_OUT]], true);
    row("reason", S[b[B_REASON]], true);
    row("kernel", S[b[B_KERNEL]], true);
    row("notes", S[b[B_NOTES]], true);
    row("finding", S[b[B_FINDING]], true);
    row("reproduce", S[b[B_REPRO]], true);
    aside.appendChild(dl);
  }

  function showLinked() {
    if (!view.cell || !lazy) return;
    var ci = -1;
    for (var i = 0; i < CELLS.length; i++) if (cellId(CELLS[i]) === view.cell) { ci = i; break; }
    if (ci < 0 || !visible(CELLS[ci])) return;
    var c = CELLS[ci], rs = keyOf(c, lazy.rIdx).join(","), row = lazy.rowOf[rs];
    if (row >= lazy.next) buildRows(false, row);  // the rows above it, then it
    var td = lazy.tbody.querySelector('td[data-group="' + rs + "|" + keyOf(c, lazy.cIdx).join(",") + '"]');
    var found = td && td.querySelector('[data-ci="' + ci + '"]');
    if (!found && td) {
      var button = td.querySelector("[data-more]");
      if (button) expand(button);
      found = td.querySelector('[data-ci="' + ci + '"]');
    }
    if (found) { show(ci, found); watch(); }
  }
  function update() { writeHash(); render(); showLinked(); }
  function load() { readHash(); buildControls(); render(); showLinked(); }
  load();
  window.addEventListener("hashchange", load);
})();
