"""Merge result documents of one matrix from several hosts (one nightly job per GPU type).

The merged document is an ordinary result document (same schema) whose
cells are the union of the inputs' cells:

- a cell reported by one input is copied as is, plus ``kernel_runs``;
- a cell reported by several inputs keeps every kernel result in
  ``kernel_runs`` (each with ``host`` and ``source``), its ``kernel`` is the
  most telling of them (failed > verified > not-run), its verdict the worst;
- ``skip`` records give way to records that ran;
- ``run.probes`` and ``run.models`` are the union of the inputs';
- the same cell with contradictory *validation* results (the engine
  accepted on one host and rejected on another, different errors or
  messages, different expectations, or different verdicts that no kernel
  result explains) is a conflict. Conflicts raise ``MergeConflictError``
  unless allowed; allowed conflicts are listed in ``run.conflicts`` and the
  cell becomes an ``error`` whose reason names the hosts.

``run.merged_from`` lists each input's file, host, versions, settings and counts.
Inputs that ran different ``SETTINGS`` (engine, kernel dtype, seed, tier)
raise ``MergeMixedError`` unless allowed; an allowed mix joins the values in
the header (``seed: "0 / 1"``, as versions are) and names the settings in
``run.mixed_settings``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, Sequence

from ..core.cells import AXES
from ..core.records import kernel_of
from ..core.verdicts import ERROR, FAIL, KERNEL_FAILED, NOT_RUN, PASS, SKIP, VERDICTS, VERIFIED, XFAIL, XPASS
from .results import SCHEMA, SCHEMA_VERSION

#: What ran, as a run records it: inputs that disagree on one of these do not merge unless
#: ``allow_mixed`` (the header would claim one input's setting for all cells). Setting → its key
#: path in ``run``; a run without the key has none (a setting none of the inputs has is left out).
#: The engine's version is not here: runs of several versions merge, their versions joined.
SETTINGS = {
    "engine": ("engine", "name"),
    "kernel_dtype": ("kernel_dtype",),
    "seed": ("seed",),
    "tier": ("tier",),
}
#: Worst first: the verdict a cell reported by several inputs keeps.
VERDICT_ORDER = (ERROR, FAIL, XPASS, XFAIL, PASS, SKIP)
#: Most telling first: the kernel result a merged cell shows.
KERNEL_ORDER = (KERNEL_FAILED, VERIFIED, NOT_RUN)


class MergeError(ValueError):
    """Inputs that cannot be merged (different matrices); prints as one line."""


class MergeMixedError(MergeError):
    """Inputs that ran different settings (``SETTINGS``); prints as one line."""


class MergeConflictError(MergeError):
    def __init__(self, conflicts: list[dict[str, Any]], merged: dict[str, Any]) -> None:
        self.conflicts = conflicts
        self.merged = merged
        ids = ", ".join(c["id"] for c in conflicts[:5]) + (" ..." if len(conflicts) > 5 else "")
        super().__init__(f"{len(conflicts)} conflicting cell(s): {ids}")


def host_label(run: Mapping[str, Any]) -> str:
    host = run.get("host") or {}
    arch = host.get("arch") or "?"
    extra = ", ".join(str(x) for x in (host.get("gpu"), host.get("hostname")) if x)
    return f"{arch} ({extra})" if extra else str(arch)


def validation_key(record: Mapping[str, Any]) -> tuple[Any, ...]:
    """What must agree between hosts: the expectation and what the engine did."""
    e = record.get("expectation") or {}
    o = record.get("outcome") or {}
    return (e.get("kind"), e.get("error"), e.get("message"), e.get("match"), e.get("xfail"),
            o.get("kind"), o.get("error"), o.get("message"))


def _kernel_failed(record: Mapping[str, Any]) -> bool:
    return kernel_of(record).get("status") == KERNEL_FAILED


def _describe(record: Mapping[str, Any]) -> str:
    o = record.get("outcome") or {}
    what = o.get("kind") or "no outcome"
    if o.get("kind") in ("rejected", "crashed"):
        what += f" {o.get('error')}: {o.get('message')}"
    return f"{record.get('verdict')} ({what})"


#: What a run that does not record a setting ran: files from before tiers were full runs.
SETTING_DEFAULTS = {"tier": "full"}


def settings_of(run: Mapping[str, Any]) -> dict[str, Any]:
    """``SETTINGS`` as ``run`` records them (None: the run does not say)."""
    out = {}
    for name, keys in SETTINGS.items():
        value: Any = run
        for key in keys:
            value = value.get(key) if isinstance(value, Mapping) else None
        out[name] = SETTING_DEFAULTS.get(name) if value is None else value
    return out


def mixed_settings(runs: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Setting → its distinct values (first-seen order), for the settings the runs disagree on."""
    mixed = {}
    for name in SETTINGS:
        values: list[Any] = []
        for run in runs:
            value = settings_of(run)[name]
            if value not in values:
                values.append(value)
        if len(values) > 1:
            mixed[name] = values
    return mixed


def merge_documents(documents: Sequence[Mapping[str, Any]], *, names: Sequence[str] | None = None,
                    allow_conflicts: bool = False, allow_mixed: bool = False) -> dict[str, Any]:
    """One result document from several; raises ``MergeConflictError`` (holding the merge) on conflicts,
    ``MergeMixedError`` when the inputs ran different ``SETTINGS`` unless ``allow_mixed``."""
    if not documents:
        raise MergeError("nothing to merge")
    names = list(names) if names is not None else [f"input {i + 1}" for i in range(len(documents))]
    matrices = sorted({str(d["run"].get("matrix")) for d in documents})
    if len(matrices) > 1:
        raise MergeError(f"cannot merge results of different matrices: {', '.join(matrices)}")
    mixed = mixed_settings([d["run"] for d in documents])
    if mixed and not allow_mixed:
        first = settings_of(documents[0]["run"])
        other = next(i for i, d in enumerate(documents) if any(settings_of(d["run"])[k] != first[k] for k in mixed))
        theirs = settings_of(documents[other]["run"])
        differ = ", ".join(f"{k} {_shown(first[k])} vs {_shown(theirs[k])}" for k in mixed if first[k] != theirs[k])
        raise MergeMixedError(f"{names[0]} and {names[other]} ran different settings ({differ}): one merged "
                              "header cannot describe both; --allow-mixed merges them, recording each input's")

    # Axes: union, in first-seen order.
    axes: dict[str, list[Any]] = {}
    for d in documents:
        for a, values in (d["run"].get("axes") or {}).items():
            known = axes.setdefault(a, [])
            known.extend(v for v in values if v not in known)

    seen: dict[str, list[tuple[int, Mapping[str, Any]]]] = {}
    for i, d in enumerate(documents):
        for cell in d["cells"]:
            seen.setdefault(cell["id"], []).append((i, cell))
            for a, v in (cell.get("coords") or {}).items():
                known = axes.setdefault(a, [])
                if v not in known:
                    known.append(v)

    labels = [host_label(d["run"]) for d in documents]
    conflicts: list[dict[str, Any]] = []
    merged_cells: list[dict[str, Any]] = []
    kernel_runs: dict[tuple[int, int], dict[str, Any]] = {}  # (id(kernel), input) → its kernel_runs entry
    for cell_id, entries in seen.items():
        merged, conflict = _merge_cell(cell_id, entries, labels, names, kernel_runs)
        if conflict:
            conflicts.append(conflict)
        merged_cells.append(merged)

    axis_names = [a for a in AXES if a in axes] + [a for a in axes if a not in AXES]
    # value → position on each axis (a cell without the axis first): one C-level lookup per coordinate
    orders = [{**{v: i for i, v in enumerate(axes[a])}, None: -1} for a in axis_names]
    merged_cells.sort(key=lambda c: tuple(map(dict.__getitem__, orders, map((c.get("coords") or {}).get, axis_names))))

    runs = [d["run"] for d in documents]
    first = runs[0]
    total = 1
    for a in axis_names:
        total *= len(axes[a])
    counts = Counter(c["verdict"] for c in merged_cells)
    hosts = [r.get("host") or {} for r in runs]
    archs = sorted({str(h.get("arch")) for h in hosts if h.get("arch")})
    engine_versions = sorted({str((r.get("engine") or {}).get("version")) for r in runs})
    engine = dict(first.get("engine") or {})
    if len(engine_versions) > 1:
        engine["version"] = " / ".join(engine_versions)
    wheres = sorted({str(kernel_of(c).get("where")) for c in merged_cells
                     if kernel_of(c).get("where")})
    run: dict[str, Any] = {
        **{k: v for k, v in first.items() if k not in ("counts", "axes", "cells_selected")},
        "engine": engine,
        "host": {"arch": "+".join(archs) or None, "gpu": ", ".join(sorted({str(h["gpu"]) for h in hosts if h.get("gpu")})) or None,
                 "gpus": sum(int(h.get("gpus") or 0) for h in hosts), "machine": first.get("host", {}).get("machine"),
                 "system": first.get("host", {}).get("system"),
                 "hostname": ", ".join(dict.fromkeys(str(h["hostname"]) for h in hosts if h.get("hostname")))
                 or None},
        "triton_mode": wheres[0] if len(wheres) == 1 else (wheres or None),
        # Shards and per-arch jobs are partial by design: the merge is complete when it holds every cell.
        "complete": not any(r.get("interrupted") for r in runs) and len(merged_cells) == total,
        "interrupted": any(r.get("interrupted") for r in runs),
        "cells_total": total,
        "cells_reported": len(merged_cells),
        "counts": {v: counts.get(v, 0) for v in VERDICTS},
        "axes": {a: axes[a] for a in axis_names},
        "probes": _union_lists(r.get("probes") for r in runs),
        "models": {name: entry for r in runs for name, entry in (r.get("models") or {}).items()},
        "merged_from": [
            {"file": names[i], "host": r.get("host"), "versions": r.get("versions"),
             "engine_version": (r.get("engine") or {}).get("version"),
             **{name: value for name, value in settings_of(r).items() if value is not None},
             # timestamps and commits: only inputs of schema version 1 hold them (see results.py)
             **{k: r[k] for k in ("git_commit", "started", "finished") if r.get(k) is not None},
             "cells_reported": len(documents[i]["cells"]), "counts": r.get("counts")}
            for i, r in enumerate(runs)
        ],
    }
    for key, pick in (("started", min), ("finished", max)):
        times = [r[key] for r in runs if r.get(key)]
        if times:
            run[key] = pick(times)
        else:
            run.pop(key, None)
    if conflicts:
        run["conflicts"] = conflicts
    for name, values in mixed.items():  # allowed: the header names them all, as it does versions
        _set_path(run, SETTINGS[name], " / ".join(_shown(v, quote=False) for v in values))
    if mixed:
        run["mixed_settings"] = list(mixed)
    doc = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "run": run, "cells": merged_cells}
    if conflicts and not allow_conflicts:
        raise MergeConflictError(conflicts, doc)
    return doc


def _set_path(run: dict[str, Any], keys: Sequence[str], value: Any) -> None:
    """``run[k1][k2]... = value``, copying each object on the way (the inputs' values are shared)."""
    table = run
    for key in keys[:-1]:
        inner = table.get(key)
        table[key] = dict(inner) if isinstance(inner, Mapping) else {}
        table = table[key]
    table[keys[-1]] = value


def _shown(value: Any, quote: bool = True) -> str:
    if value is None:
        return "(none)"
    return repr(value) if quote and isinstance(value, str) else str(value)


def _union_lists(tables: Any) -> dict[str, list[Any]]:
    """axis → values, the union of several ``run.probes`` tables in first-seen order."""
    out: dict[str, list[Any]] = {}
    for table in tables:
        for axis, values in (table or {}).items():
            known = out.setdefault(axis, [])
            known.extend(v for v in values if v not in known)
    return out


def _merge_cell(cell_id: str, entries: list[tuple[int, Mapping[str, Any]]], labels: Sequence[str],
                names: Sequence[str], made: dict[tuple[int, int], dict[str, Any]]
                ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    ran = [(i, r) for i, r in entries if r.get("verdict") != SKIP] or entries
    base_i, base = ran[0]
    merged = dict(base)
    runs = []
    for i, r in entries:
        if r.get("kernel_runs"):
            runs.extend(r["kernel_runs"])
        elif r.get("kernel"):
            kernel = r["kernel"]  # one entry per kernel value and input: records read from a file share them
            run = made.get((id(kernel), i))
            if run is None:
                run = made[(id(kernel), i)] = {**kernel, "host": labels[i], "source": i}
            runs.append(run)
    if len(entries) == 1 and runs and not entries[0][1].get("kernel_runs"):  # one input: its kernel as it was
        merged["kernel_runs"] = runs
    elif runs:
        merged["kernel_runs"] = runs
        merged["kernel"] = min(runs, key=lambda k: KERNEL_ORDER.index(k.get("status"))
                               if k.get("status") in KERNEL_ORDER else len(KERNEL_ORDER))
        merged["kernel"] = {k: v for k, v in merged["kernel"].items() if k not in ("host", "source")}
    if len(ran) > 1:
        worst = min(ran, key=lambda e: VERDICT_ORDER.index(e[1].get("verdict"))
                    if e[1].get("verdict") in VERDICT_ORDER else -1)
        if worst[1] is not base:
            merged.update(verdict=worst[1].get("verdict"), reason=worst[1].get("reason"))
    keys = {validation_key(r) for _, r in ran}
    verdicts = {r.get("verdict") for _, r in ran if not _kernel_failed(r)}
    if len(keys) > 1 or len(verdicts) > 1:
        conflict = {"id": cell_id, "records": [
            {"source": names[i], "host": labels[i], "verdict": r.get("verdict"),
             "outcome": r.get("outcome"), "expectation": r.get("expectation"), "summary": _describe(r)}
            for i, r in ran]}
        merged.update(verdict="error", conflict=True, reason="conflicting results across hosts: " + "; ".join(
            f"{labels[i]}: {_describe(r)}" for i, r in ran))
        return merged, conflict
    return merged, None


__all__ = ["merge_documents", "MergeError", "MergeConflictError", "MergeMixedError", "host_label", "SETTINGS",
           "settings_of"]
