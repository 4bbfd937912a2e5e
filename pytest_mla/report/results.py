"""The JSON result file: the one primary artifact every rendering is built from.

Schema (version 1), documented in ``docs/report-schema.md``::

    {"schema": "pytest-mla/result", "schema_version": 1,
     "run": {...run metadata...}, "cells": [{...one record per cell...}]}

Fields added by ``pytest-mla merge`` (``merge.py``): ``run.merged_from``,
``run.conflicts``, and per cell ``kernel_runs`` and ``conflict``. Readers
ignore fields they do not know; adding a field keeps version 1, renaming or
removing one (or changing its meaning) bumps ``SCHEMA_VERSION``.

Written atomically: a temporary file in the same folder, then ``os.replace``,
so a killed run never leaves half a file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

SCHEMA = "pytest-mla/result"
SCHEMA_VERSION = 1


class ResultFileError(ValueError):
    """A file that is not a readable pytest-mla result; prints as one line."""


def build_document(run: Mapping[str, Any], cells: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "run": dict(run), "cells": list(cells)}


def write_json_atomic(path: str | os.PathLike[str], document: Any) -> Path:
    """Serialise first (a value that is not plain JSON fails before any file is touched), then write."""
    text = json.dumps(document, indent=1, ensure_ascii=False, allow_nan=False, default=_plain) + "\n"
    return write_text_atomic(path, text)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a report is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def write_results(path: str | os.PathLike[str], run: Mapping[str, Any],
                  cells: Sequence[Mapping[str, Any]]) -> Path:
    return write_json_atomic(path, build_document(run, cells))


def read_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load and check a result file; raise ``ResultFileError`` with a one-line reason."""
    shown = os.fspath(path)
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # a byte-order mark is not JSON
    except IsADirectoryError:
        raise ResultFileError(f"{shown}: is a directory, not a result file") from None
    except OSError as exc:
        raise ResultFileError(f"{shown}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ResultFileError(f"{shown}: not a pytest-mla result file (not UTF-8 text)") from None
    return parse_results(text, shown)


def parse_results(text: str, shown: str = "<result>") -> dict[str, Any]:
    """A result document from its text (``read_results`` without the file); ``shown`` names it in errors."""
    text = text.removeprefix("\ufeff")
    if not text.lstrip().startswith("{"):
        what = "empty file" if not text.strip() else "not JSON"
        raise ResultFileError(f"{shown}: not a pytest-mla result file ({what})")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        truncated = exc.pos >= len(text.rstrip()) - 1 or exc.msg.startswith("Unterminated string")
        hint = " (truncated?)" if truncated else ""
        raise ResultFileError(f"{shown}:{exc.lineno}: invalid JSON{hint}: {exc.msg}") from None
    return check_document(doc, shown)


def check_document(doc: Any, shown: str = "<result>") -> dict[str, Any]:
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ResultFileError(f"{shown}: not a pytest-mla result file (no \"schema\": \"{SCHEMA}\")")
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ResultFileError(
            f"{shown}: schema version {version!r} is not supported (this pytest-mla reads version {SCHEMA_VERSION})"
        )
    if not isinstance(doc.get("run"), dict) or not isinstance(doc.get("cells"), list):
        raise ResultFileError(f"{shown}: malformed result file: needs a \"run\" object and a \"cells\" list")
    run = doc["run"]
    for key in ("axes", "probes", "models"):
        value = run.get(key)
        if value is not None and (not isinstance(value, dict)
                                  or key != "models" and not all(isinstance(v, list) for v in value.values())):
            raise ResultFileError(f"{shown}: malformed run.{key}: needs an object"
                                  + (" of lists" if key != "models" else ""))
    first: dict[str, int] = {}
    for i, cell in enumerate(doc["cells"]):
        if not isinstance(cell, dict) or not isinstance(cell.get("id"), str) or "verdict" not in cell:
            raise ResultFileError(f"{shown}: malformed cell record at cells[{i}]: needs \"id\" and \"verdict\"")
        if first.setdefault(cell["id"], i) != i:
            raise ResultFileError(f"{shown}: cells[{i}] repeats cell {cell['id']!r} of cells[{first[cell['id']]}]")
        if cell["verdict"] is not None and not isinstance(cell["verdict"], str):
            raise ResultFileError(f"{shown}: malformed cell record at cells[{i}]: \"verdict\" must be a string")
        for key in ("coords", "expectation", "outcome", "kernel"):
            if cell.get(key) is not None and not isinstance(cell[key], dict):
                raise ResultFileError(f"{shown}: malformed cell record at cells[{i}]: \"{key}\" must be an object")
        if cell.get("kernel_runs") is not None and not (
                isinstance(cell["kernel_runs"], list) and all(isinstance(k, dict) for k in cell["kernel_runs"])):
            raise ResultFileError(f"{shown}: malformed cell record at cells[{i}]: \"kernel_runs\" must be a list of objects")
        if cell.get("notes") is not None and not isinstance(cell["notes"], list):
            raise ResultFileError(f"{shown}: malformed cell record at cells[{i}]: \"notes\" must be a list")
    return doc


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _plain(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"not a plain JSON value: {type(value).__name__}")
