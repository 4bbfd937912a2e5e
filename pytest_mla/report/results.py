"""The JSON result file: the one primary artifact every rendering is built from.

Schema version 2 (``docs/report-schema.md``) is one JSON document, written
as the run goes and read back line by line when its writer was killed::

    {"schema":"pytest-mla/result","schema_version":2,
    "run":{...what is known when the run starts...},
    "cells":[
    {"values":[...]},            table entries, defined before their first use
    [shape, slot, slot, ...],    one cell (codec.py)
    ...
    ],
    "end":{...what is known when the run ends: counts, complete, ...}}

``read_results`` returns the plain document ``{"schema", "schema_version",
"run", "cells"}`` (``end`` folded into ``run``) for both versions: version 1
files (one plain record per cell) keep working everywhere. A version-2 file
cut short is read up to its last complete cell and says how many it lost
(``document["warnings"]``).

Committed outputs must not change when nothing changed, so the facts of a
run that differ every time (``VOLATILE_RUN_KEYS``, ``VOLATILE_CELL_KEYS``,
``VOLATILE_KERNEL_KEYS``: timestamps, commit, command line, durations) are
not written into the result file; the controller keeps them in a side file
(``run_facts.py``).

Readers ignore fields they do not know; adding a field keeps the version;
renaming or removing one, or changing the file's layout, bumps it.

PYTEST_DONT_REWRITE: its ``assert`` statements raise as plain Python's do, so a message
that reaches a report never changes with pytest's ``-v`` or ``$CI``.
"""

from __future__ import annotations

import gc
import json
import os
import re
from pathlib import Path
from typing import IO, Any, Iterable, Mapping, Sequence

from ..core.limits import (
    MAX_NESTING, InputLimitError, deep_offset, format_key_path, line_column, nesting_message, read_bounded, too_deep,
)
from .codec import CodecError, Decoder, Encoder
from .output import open_fresh, replace_file, write_text_atomic

SCHEMA = "pytest-mla/result"
SCHEMA_VERSION = 2
#: Versions ``read_results`` reads.
READABLE_VERSIONS = (1, 2)

#: Run facts known only when the run ends: written under ``end``.
END_KEYS = ("triton_mode", "complete", "interrupted", "cells_reported", "counts")
#: Facts that differ on every run of the same inputs: kept out of result files.
VOLATILE_RUN_KEYS = ("started", "finished", "git_commit", "args")
VOLATILE_CELL_KEYS = ("duration_s",)
#: ``reused``: under xdist, which of two cells sharing a kernel check computes it depends on timing.
VOLATILE_KERNEL_KEYS = ("time_s", "reused")

_HEAD = f'{{"schema":"{SCHEMA}","schema_version":{SCHEMA_VERSION},\n'
_VERSION = re.compile(r'^\s*\{\s*"schema"\s*:\s*"([^"]*)"\s*,\s*"schema_version"\s*:\s*(-?\d+)')


class ResultFileError(ValueError):
    """A file that is not a readable pytest-mla result; prints as one line."""


# -- writing ---------------------------------------------------------------------------
def build_document(run: Mapping[str, Any], cells: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "run": dict(run), "cells": list(cells)}


def split_run(run: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(head, end)``: the run facts written before the cells and those written after them."""
    head = {k: v for k, v in run.items() if k not in END_KEYS}
    end = {k: run[k] for k in END_KEYS if k in run}
    return head, end


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=1, ensure_ascii=False, allow_nan=False, default=_plain)


def partial_path(path: str | os.PathLike[str]) -> Path:
    """``reports/x.json.partial`` for ``reports/x.json``: where a run streams its cells."""
    path = Path(path)
    return path.parent / f"{path.name}.partial"


class ResultStream:
    """A result file written cell by cell: header first, each cell as it finishes, ``end`` last.

    The cells go to a side file in the same folder (``partial``: ``x.json.partial``, or ``path``
    itself for a temporary file standing in for one that could not be written), each with one
    unbuffered ``write``: a killed run leaves every cell it had finished there, readable
    (``read_results`` stops at the last whole cell), and ``path`` — the previous complete report —
    as it was. ``finish`` closes the document and only then replaces ``path`` with it. ``add``
    returns the record made of shared values (see ``codec.Encoder``).
    """

    def __init__(self, path: str | os.PathLike[str], run_head: Mapping[str, Any], *,
                 in_place: bool = False) -> None:
        self.path = Path(path)
        self.partial = self.path if in_place else partial_path(self.path)
        self.fallback = False  # a temporary file standing in for one that could not be written
        self.encoder = Encoder()
        self.records: list[Mapping[str, Any]] = []  # what was written, in order
        self.path.parent.mkdir(parents=True, exist_ok=True)
        head = _HEAD + '"run":' + _pretty(dict(run_head)) + ',\n"cells":[\n'
        self._file: IO[bytes] | None = open_fresh(self.partial)
        self._pos = 0  # bytes written so far
        self._comma_at = -1  # file offset of the comma after the last entry
        try:
            self._write(head.encode("utf-8"))
        except BaseException:
            self.discard()
            raise

    def add(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """Write one cell; returns it rebuilt from the table's shared values."""
        line, canonical = self.encoder.cell(record)
        values = self.encoder.take_values()
        text = (values + ",\n" + line + ",\n") if values is not None else (line + ",\n")
        self._write(text.encode("utf-8"))
        self._comma_at = self._pos - 2
        self.records.append(canonical)
        return canonical

    def _write(self, data: bytes) -> None:
        assert self._file is not None, "the stream is finished"
        view = memoryview(data)
        while view:
            written = self._file.write(view)
            view = view[written:]
        self._pos += len(data)

    def finish(self, run_end: Mapping[str, Any], inputs: Iterable[str | os.PathLike[str]] = ()) -> Path:
        """Close the cells and write ``end``; the file is complete, and replaces ``path`` (which
        must be a regular file, and none of ``inputs``: ``output.check_output``). On an error the
        previous ``path`` is left as it was, and so is the side file."""
        assert self._file is not None, "the stream is finished"
        try:
            if self._comma_at >= 0:  # the last entry takes no comma
                self._file.seek(self._comma_at)
                self._file.truncate()
                self._pos = self._comma_at
                self._write(b"\n")
            self._write(('],\n"end":' + _pretty(dict(run_end)) + "}\n").encode("utf-8"))
            os.fsync(self._file.fileno())  # on disk before it replaces the report: a crash leaves one or the other
        finally:
            self.close()
        if self.partial != self.path:
            replace_file(self.partial, self.path, inputs)
        return self.path

    def close(self) -> None:
        """Stop writing, leaving the side file as it is (a cut-short result)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def discard(self) -> None:
        """Stop writing and remove the side file (its cells are written elsewhere; a temporary file
        standing in for the report stays: it may be all there is)."""
        self.close()
        if self.partial != self.path:
            try:
                os.unlink(self.partial)
            except OSError:
                pass


def results_text(run: Mapping[str, Any], cells: Iterable[Mapping[str, Any]]) -> str:
    """The text of a result file (the same bytes a ``ResultStream`` writes for these cells)."""
    head, end = split_run(run)
    encoder = Encoder(by_identity=True)  # the cells do not change while they are written
    parts = [_HEAD, '"run":', _pretty(head), ',\n"cells":[\n']
    lines = []
    for record in cells:
        line, _ = encoder.cell(record)
        values = encoder.take_values()
        if values is not None:
            lines.append(values)
        lines.append(line)
    parts.append(",\n".join(lines))
    parts.append(("\n" if lines else "") + '],\n"end":' + _pretty(end) + "}\n")
    return "".join(parts)


def write_results(path: str | os.PathLike[str], run: Mapping[str, Any],
                  cells: Sequence[Mapping[str, Any]], inputs: Iterable[str | os.PathLike[str]] = ()) -> Path:
    """A whole result file, atomically (serialised first: a value that is not JSON touches no file);
    ``path`` must be a regular file and none of ``inputs`` (``output.check_output``)."""
    return write_text_atomic(path, results_text(run, cells), inputs=inputs)


def write_json_atomic(path: str | os.PathLike[str], document: Any) -> Path:
    """Plain JSON (not a result file: e.g. a shared kernel result), atomically."""
    text = json.dumps(document, indent=1, ensure_ascii=False, allow_nan=False, default=_plain) + "\n"
    return write_text_atomic(path, text)


# -- reading ---------------------------------------------------------------------------
def read_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load and check a result file; raise ``ResultFileError`` with a one-line reason."""
    shown = os.fspath(path)
    try:
        data = read_bounded(path, shown)  # at most the input limit: /dev/zero is one line, not all the memory
    except IsADirectoryError:
        raise ResultFileError(f"{shown}: is a directory, not a result file") from None
    except OSError as exc:
        raise ResultFileError(f"{shown}: cannot read: {exc.strerror or exc}") from None
    except InputLimitError as exc:
        raise ResultFileError(str(exc)) from None
    return parse_results(decode_text(data, shown), shown)


def decode_text(data: bytes, shown: str) -> str:
    """The text of a result file's bytes (a byte-order mark is not JSON); ``ResultFileError`` if not UTF-8."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ResultFileError(f"{shown}: not a pytest-mla result file (not UTF-8 text: "
                              f"byte {exc.start})") from None


def parse_results(text: str, shown: str = "<result>") -> dict[str, Any]:
    """A result document from its text (``read_results`` without the file); ``shown`` names it in errors."""
    # Reading makes a few objects per cell and no garbage cycles: the cyclic collector, paused,
    # does not walk the growing document again and again.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _parse_results(text, shown)
    except RecursionError:  # the JSON parser recurses once per level: nested past Python's stack
        raise ResultFileError(_too_deep_text(text, shown)) from None
    finally:
        if was_enabled:
            gc.enable()


def _too_deep_text(text: str, shown: str) -> str:
    at = deep_offset(text)
    if at is None:
        return f"{shown}: {nesting_message()}"
    line, col = line_column(text, at)
    return f"{shown}:{line}: {nesting_message()} (column {col})"


def _check_nesting(value: Any, shown: str, where: str) -> None:
    path = too_deep(value, MAX_NESTING - 2)  # the document and its "run" (or "cells") are two levels
    if path is not None:
        raise ResultFileError(f"{shown}: {format_key_path(path, where)}: {nesting_message()}")


def _parse_results(text: str, shown: str) -> dict[str, Any]:
    text = text.removeprefix("\ufeff")
    if not text.lstrip().startswith("{"):
        what = "empty file" if not text.strip() else "not JSON"
        raise ResultFileError(f"{shown}: not a pytest-mla result file ({what})")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":  # a whole document, then more: two files joined, or garbage appended
            raise ResultFileError(_extra(text, exc.pos, shown)) from None
        head = _VERSION.match(text)
        if head and head.group(1) == SCHEMA:
            version = int(head.group(2))
            _check_version(version, shown)
            if version >= 2:
                return check_document(_recover(text, shown), shown)
        truncated = exc.pos >= len(text.rstrip()) - 1 or exc.msg.startswith("Unterminated string")
        hint = " (truncated?)" if truncated else ""
        raise ResultFileError(f"{shown}:{exc.lineno}: invalid JSON{hint}: {exc.msg}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ResultFileError(f"{shown}: not a pytest-mla result file (no \"schema\": \"{SCHEMA}\")")
    _check_version(doc.get("schema_version"), shown)
    if doc["schema_version"] >= 2:
        doc = _decode(doc, shown)
    else:  # version 1: plain records, walked once
        _check_nesting(doc.get("run"), shown, "run")
        cells = doc.get("cells")
        if type(cells) is list:
            for i, cell in enumerate(cells):
                _check_nesting(cell, shown, f"cells[{i}]")
    return check_document(doc, shown)


def _check_version(version: Any, shown: str) -> None:
    if version in READABLE_VERSIONS:
        return
    readable = " and ".join(str(v) for v in READABLE_VERSIONS)
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise ResultFileError(f"{shown}: schema version {version} is newer than this pytest-mla reads "
                              f"(versions {readable}); upgrade pytest-mla to read it")
    raise ResultFileError(f"{shown}: schema version {version!r} is not supported "
                          f"(this pytest-mla reads versions {readable})")


def _decode(doc: Mapping[str, Any], shown: str) -> dict[str, Any]:
    """The plain document of a parsed version-2 file."""
    run, entries, end = doc.get("run"), doc.get("cells"), doc.get("end", {})
    if not isinstance(run, dict) or not isinstance(entries, list) or not isinstance(end, dict):
        raise ResultFileError(f"{shown}: malformed result file: needs a \"run\" object and a \"cells\" list")
    _check_nesting(run, shown, "run")
    _check_nesting(end, shown, "end")
    decoder = Decoder()
    cells = []
    add_values, cell = decoder.add_values, decoder.cell
    i = 0
    try:
        for i, entry in enumerate(entries):
            if type(entry) is list:
                cells.append(cell(entry))
            elif type(entry) is dict and len(entry) == 1 and "values" in entry:
                if not isinstance(entry["values"], list):
                    raise CodecError("\"values\" must be a list")
                add_values(entry["values"])
            else:  # a plain record, as read_results returns it (a document dumped again with json.dumps)
                _check_nesting(entry, shown, f"cells[{i}]")
                cells.append(entry)
    except CodecError as exc:
        raise ResultFileError(f"{shown}: malformed cells[{i}]: {exc}") from None
    return {"schema": SCHEMA, "schema_version": doc["schema_version"], "run": {**run, **end}, "cells": cells}


def _recover(text: str, shown: str) -> dict[str, Any]:
    """A version-2 file cut short (its writer was killed): every whole cell, and a warning saying
    how many were lost."""
    decoder = json.JSONDecoder()
    pos = _VERSION.match(text).end()  # type: ignore[union-attr]  # checked by the caller
    ws = re.compile(r"[\s,]*")

    def expect(token: str, at: int) -> int:
        at = ws.match(text, at).end()  # type: ignore[union-attr]
        if not text.startswith(token, at):
            raise ResultFileError(f"{shown}: cut short before its cells (no {token!r} where expected); "
                                  "nothing to read")
        return at + len(token)

    pos = expect('"run"', pos)
    pos = expect(":", pos)
    try:
        run, pos = decoder.raw_decode(text, ws.match(text, pos).end())  # type: ignore[union-attr]
    except json.JSONDecodeError:
        raise ResultFileError(f"{shown}: cut short in its run facts; no cell to read") from None
    pos = expect('"cells"', pos)
    pos = expect(":", pos)
    pos = expect("[", pos)
    entries = []
    while True:
        pos = ws.match(text, pos).end()  # type: ignore[union-attr]
        if pos >= len(text) or text[pos] == "]":
            break
        try:
            entry, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            _cut_or_refuse(text, exc, shown, pos)  # an entry is one line: cut, it runs to the end
            break
        entries.append(entry)
    if isinstance(run, dict) and text[pos:pos + 1] == "]":  # whole cells, then broken after them
        tail = text[pos + 1:]
        m = re.match(r'\s*,\s*"end"\s*:\s*', tail)
        if m:
            try:
                end, at = decoder.raw_decode(text, pos + 1 + m.end())
            except json.JSONDecodeError as exc:
                _cut_or_refuse(text, exc, shown)
            else:
                rest = len(text) - len(text[at:].lstrip())
                if rest < len(text):  # "end", then not the closing brace
                    raise ResultFileError(_extra(text, rest, shown))
                if isinstance(end, dict):  # only the closing brace is missing
                    return _decode({"schema_version": SCHEMA_VERSION, "run": run, "cells": entries,
                                    "end": end}, shown)
        elif not ',"end":'.startswith(re.sub(r"\s", "", tail)):  # not cut inside ',"end":'
            raise ResultFileError(_extra(text, len(text) - len(tail.lstrip()), shown))
    if not isinstance(run, dict):
        raise ResultFileError(f"{shown}: malformed result file: \"run\" must be an object")
    # Entries are whole up to the first that does not parse; a values line without its cell is harmless.
    doc = _decode({"schema_version": SCHEMA_VERSION, "run": run, "cells": entries, "end": {}}, shown)
    read = len(doc["cells"])
    expected = run.get("cells_selected", run.get("cells_total"))
    doc["run"].update(complete=False, interrupted=True, cells_reported=read)
    doc["run"].setdefault("counts", _counts(doc["cells"]))
    lost = (f"{expected - read} of the {expected} cells it was to report are missing"
            if isinstance(expected, int) and expected >= read else "the cells after them are missing")
    doc["warnings"] = [f"{shown}: cut short (its writer stopped): read the {read} whole cell(s) before the cut; "
                       f"{lost}"]
    return doc


def _cut_or_refuse(text: str, exc: json.JSONDecodeError, shown: str, start: int | None = None) -> None:
    """A version-2 file that does not parse at ``exc.pos``: a writer killed there leaves its last
    line unfinished, so an error on the last line (a value begun at ``start`` and on the last line)
    is a cut (return); one before it is damage or data that does not belong (``ResultFileError``)."""
    if "\n" in text[exc.pos if start is None else start:].rstrip():
        where = f"{exc.lineno}: invalid JSON: {exc.msg} (column {exc.colno})"
        if start is not None and exc.lineno != line_column(text, start)[0]:
            where = f"{line_column(text, start)[0]}: invalid JSON: an entry that does not end on its line " \
                    f"({exc.msg} at line {exc.lineno})"
        raise ResultFileError(f"{shown}:{where}; not a file cut short by its writer") from None


def _extra(text: str, at: int, shown: str) -> str:
    line, col = line_column(text, at)
    return f"{shown}:{line}: data after the end of the result document (column {col}); one file holds one document"


def _counts(cells: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    from ..core.verdicts import VERDICTS

    counts = {v: 0 for v in VERDICTS}
    for c in cells:
        if c.get("verdict") in counts:
            counts[c["verdict"]] += 1
    return counts


def check_document(doc: Any, shown: str = "<result>") -> dict[str, Any]:
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ResultFileError(f"{shown}: not a pytest-mla result file (no \"schema\": \"{SCHEMA}\")")
    _check_version(doc.get("schema_version"), shown)
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
        if type(cell) is not dict:
            raise ResultFileError(f"{shown}: malformed cell record at cells[{i}]: needs \"id\" and \"verdict\"")
        cell_id = cell.get("id")
        if type(cell_id) is not str or "verdict" not in cell:
            raise ResultFileError(f"{shown}: malformed cell record at cells[{i}]: needs \"id\" and \"verdict\"")
        if first.setdefault(cell_id, i) != i:
            raise ResultFileError(f"{shown}: cells[{i}] repeats cell {cell_id!r} of cells[{first[cell_id]}]")
        verdict = cell["verdict"]
        if verdict is not None and type(verdict) is not str:
            raise ResultFileError(f"{shown}: malformed cell record at cells[{i}]: \"verdict\" must be a string")
        for key in ("coords", "expectation", "outcome", "kernel"):
            value = cell.get(key)
            if value is not None and type(value) is not dict:
                raise ResultFileError(f"{shown}: malformed cell record at cells[{i}]: \"{key}\" must be an object")
        runs = cell.get("kernel_runs")
        if runs is not None and not (isinstance(runs, list) and all(isinstance(k, dict) for k in runs)):
            raise ResultFileError(f"{shown}: malformed cell record at cells[{i}]: \"kernel_runs\" must be a list of objects")
        notes = cell.get("notes")
        if notes is not None and type(notes) is not list:
            raise ResultFileError(f"{shown}: malformed cell record at cells[{i}]: \"notes\" must be a list")
    return doc


def split_volatile(record: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(record, facts)``: the record without the facts that differ on every run, and those facts."""
    kept = dict(record)
    facts = {k: kept.pop(k) for k in VOLATILE_CELL_KEYS if k in kept}
    kernel = kept.get("kernel")
    if isinstance(kernel, dict) and any(k in kernel for k in VOLATILE_KERNEL_KEYS):
        kernel = dict(kernel)
        facts["kernel"] = {k: kernel.pop(k) for k in VOLATILE_KERNEL_KEYS if k in kernel}
        kept["kernel"] = kernel
    return kept, facts


def with_volatile(record: Mapping[str, Any], facts: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``record`` with the facts ``split_volatile`` took out of it put back (for the terminal summary)."""
    if not facts:
        return record
    whole = {**record, **{k: v for k, v in facts.items() if k != "kernel"}}
    if isinstance(facts.get("kernel"), dict) and isinstance(record.get("kernel"), dict):
        whole["kernel"] = {**record["kernel"], **facts["kernel"]}
    return whole


def _plain(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"not a plain JSON value: {type(value).__name__}")


# -- the side file of volatile run facts --------------------------------------------------
RUN_FACTS_SCHEMA = "pytest-mla/run-facts"


def run_facts_path(result: str | os.PathLike[str]) -> Path:
    """``reports/x.run.json`` for ``reports/x.json``."""
    result = Path(result)
    stem = result.name[:-5] if result.name.endswith(".json") else result.name
    return result.parent / f"{stem}.run.json"


def write_run_facts(path: str | os.PathLike[str], result: str | os.PathLike[str], run: Mapping[str, Any],
                    cells: Mapping[str, Mapping[str, Any]]) -> Path:
    """The facts of one run that are kept out of its result file: ``run`` (timestamps, commit,
    command line) and, per cell id, its volatile fields (``duration_s``, ``kernel.time_s``)."""
    document = {"schema": RUN_FACTS_SCHEMA, "schema_version": 1, "results": Path(result).name,
                **dict(run), "cells": dict(cells)}
    text = json.dumps(document, ensure_ascii=False, allow_nan=False, default=_plain, separators=(",", ":"))
    return write_text_atomic(path, text + "\n")
