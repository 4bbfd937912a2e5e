"""``pytest-mla repro``: a finding as a standalone reproducer and a bug report an engine team can act on.

Reads only the result document (the finding cell, its run) and, for what a
record does not hold, the model catalogue and the weightless ``config.json``
the engines are handed (package data); never imports an engine or the kernel
checks. ``templates.py`` picks the script kind; ``bugreport.py`` writes the
Markdown; ``runs.py`` runs a script in other environments (``--engines``).
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, Mapping

from ...core.cells import Cell, CellIdError
from ...core.models import BUILTIN_MODELS, ModelConfig, ModelConfigError
from ..findings import Finding, finding_facts, group_findings, not_a_finding
from .registry import template_for
from .templates import Context

__all__ = ["ReproError", "NotAFinding", "find_cell", "context_for", "template_for", "MODEL_CONFIGS"]

#: The weightless config.json of each catalogue model, as the engine adapters hand them to the engines
#: (package data of ``pytest_mla.engines``; read as files, never imported).
MODEL_CONFIGS = Path(__file__).resolve().parents[2] / "engines" / "model_configs"


class ReproError(Exception):
    """Input ``repro`` cannot use (an unknown cell id, a record it cannot read): one line."""


class NotAFinding(ReproError):
    """The cell exists but is not a finding: one line saying what it is instead."""


def find_cell(document: Mapping[str, Any], text: str) -> Mapping[str, Any]:
    """The record ``text`` names: a canonical id (``model/backend/dcpN/...``), the name pytest prints
    (``model-backend-dcpN-...``) or a whole node id; ``ReproError`` with the nearest ids otherwise."""
    cells = list(document.get("cells") or [])
    by_id = {str(c.get("id")): c for c in cells}
    if text in by_id:
        return by_id[text]
    name = text.rpartition("::")[2].strip()
    by_name = {str(c.get("nodeid", "")).rpartition("::")[2]: c for c in cells if c.get("nodeid")}
    if name in by_id:
        return by_id[name]
    if name in by_name:
        return by_name[name]
    axes = (document.get("run") or {}).get("axes") or {}
    if "/" not in name and axes:
        try:
            cell = Cell.from_name(name, axes)
        except (CellIdError, ValueError, KeyError, TypeError):
            cell = None
        if cell is not None and cell.id in by_id:
            return by_id[cell.id]
    form = by_id if "/" in name else (by_name or by_id)
    close = difflib.get_close_matches(name, list(form), n=3, cutoff=0.5)
    ids = [str(form[c].get("id")) for c in close]
    hint = f"; nearest: {', '.join(ids)}" if ids else ""
    raise ReproError(f"no cell {text!r} in the result file ({len(cells)} cells){hint}")


def model_of(run: Mapping[str, Any], name: str) -> ModelConfig:
    """The model's catalogue entry as the run recorded it (``run.models``), else the built-in one."""
    entry = (run.get("models") or {}).get(name)
    if isinstance(entry, Mapping):
        data = {k: v for k, v in entry.items() if k != "name"}
        try:
            return ModelConfig.from_mapping(name, data)
        except (ModelConfigError, TypeError):
            pass
    if name in BUILTIN_MODELS:
        return BUILTIN_MODELS[name]
    raise ReproError(f"model {name!r}: the result file has no catalogue entry for it (run.models)")


def config_json(name: str) -> dict[str, Any] | None:
    path = MODEL_CONFIGS / name / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def context_for(document: Mapping[str, Any], record: Mapping[str, Any], *, result_file: str) -> Context:
    """The template context of a finding cell; ``NotAFinding`` when the cell is none."""
    run = document.get("run") or {}
    engine = str((run.get("engine") or {}).get("name") or "")
    if finding_facts(record, engine) is None:
        raise NotAFinding(f"cell {record.get('id')} is not a finding: {not_a_finding(record)}")
    findings = group_findings(document.get("cells") or [], engine)
    finding: Finding = next(f for f in findings if any(r is record for r in f.records))
    model = model_of(run, str((record.get("coords") or {}).get("model")))
    return Context(record, run, model, config_json(model.name), result_file, finding)
