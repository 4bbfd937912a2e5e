"""``pytest-mla suggest``: the rule edits that would make a matrix describe what the engine did.

For a person to review, never applied and never an expectation: the cells
that failed because the engine answered differently from the matrix are
grouped by what the engine did (accepted, or refused with one exact error
and message), each group is covered by the fewest ``when`` tables (the
values of each axis its cells take, an axis left out when they take all of
its values, split where a table would also cover cells that did something
else), and each table becomes a ``[[rule]]`` inserted just before the rule
that decides those cells today (first match wins), or at the end of the
file for cells no rule decides.
"""

from __future__ import annotations

import difflib
import itertools
import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from ..core.verdicts import ACCEPTED, FAIL, PASS, REJECTED, XFAIL, XPASS

__all__ = ["Suggestion", "suggest", "as_patch", "as_text"]

Coords = tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Suggestion:
    """One ``[[rule]]`` to insert before ``before_line`` (None: at the end of the file)."""

    when: dict[str, list[Any]]  # axis -> values; a missing axis matches every value
    outcome: dict[str, Any]  # {"kind": "accepted"} or {"kind": "rejected", "error": .., "message": ..}
    cells: list[str]  # the cell ids it covers
    before_line: int | None
    replaces: str  # what the matrix says of these cells now
    #: The rule at ``before_line`` decides exactly these cells: give it the new outcome instead
    #: (a rule inserted before it would leave it deciding nothing).
    replace_rule: bool = False

    def comment(self) -> str:
        ids = self.cells if len(self.cells) <= 3 else self.cells[:2] + [f"... {len(self.cells) - 2} more"]
        return (f"# suggested by pytest-mla suggest ({len(self.cells)} cell(s): {', '.join(ids)});\n"
                f"# the matrix says {self.replaces}\n")

    def outcome_line(self) -> str:
        if self.outcome["kind"] == ACCEPTED:
            return "accept = true\n"
        return (f"reject = {{ error = {json.dumps(self.outcome['error'])}, "
                f"message = {json.dumps(_literal(self.outcome['message']), ensure_ascii=False)} }}\n")

    def toml(self) -> str:
        when = ", ".join(f"{_key(axis)} = {_value(values)}" for axis, values in self.when.items())
        return self.comment() + "[[rule]]\n" + f"when = {{ {when} }}\n" + self.outcome_line()


def _key(axis: str) -> str:
    return axis if axis.replace("_", "").isalnum() else json.dumps(axis)


def _value(values: list[Any]) -> str:
    shown = [json.dumps(v, ensure_ascii=False) for v in values]
    return shown[0] if len(shown) == 1 else "[" + ", ".join(shown) + "]"


def _literal(message: str | None) -> str:
    """A message as a rule's ``message`` template: its braces are literal."""
    return (message or "").replace("{", "{{").replace("}", "}}")


def _behaviour(cell: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """What the engine did with a cell it was asked about (None: skipped, crashed, not asked)."""
    outcome = cell.get("outcome") or {}
    if cell.get("verdict") not in (FAIL, PASS, XFAIL, XPASS):
        return None
    if outcome.get("kind") == ACCEPTED:
        return (ACCEPTED,)
    if outcome.get("kind") == REJECTED:
        return (REJECTED, outcome.get("error"), outcome.get("message"))
    return None


def _did(cell: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """What the engine did, when that is why the cell failed (None: not a matter of the rules)."""
    if cell.get("verdict") != FAIL:
        return None
    expect = (cell.get("expectation") or {}).get("kind")
    did = _behaviour(cell)
    if did == (ACCEPTED,) and expect != "reject":
        return None  # accepted as expected: a failed kernel check, not a rule to edit
    return did


def _rectangles(group: set[Coords], others: set[Coords], axes: Sequence[str]) -> list[dict[str, set[Any]]]:
    """Few products of per-axis value sets that cover ``group`` and none of ``others``."""

    def covers(box: dict[str, set[Any]], coords: Coords) -> bool:
        return all(value in box[axis] for axis, value in coords)

    def split(cells: set[Coords]) -> list[dict[str, set[Any]]]:
        box = _box_of(cells, axes)
        if not any(covers(box, o) for o in others):
            return [box]
        axis = max((a for a in axes if len(box[a]) > 1), key=lambda a: len(box[a]), default=None)
        if axis is None:
            return [box]  # one cell; it cannot cover another
        parts: dict[Any, set[Coords]] = {}
        for coords in cells:
            parts.setdefault(dict(coords)[axis], set()).add(coords)
        return [b for part in parts.values() for b in split(part)]

    boxes = split(group)
    merged = True
    while merged:  # join boxes equal but on one axis, while the join still covers none of the others
        merged = False
        for i, j in itertools.combinations(range(len(boxes)), 2):
            a, b = boxes[i], boxes[j]
            differ = [axis for axis in axes if a[axis] != b[axis]]
            if len(differ) == 1:
                joined = {**a, differ[0]: a[differ[0]] | b[differ[0]]}
                if not any(covers(joined, o) for o in others):
                    boxes[i] = joined
                    del boxes[j]
                    merged = True
                    break
    return boxes


def suggest(document: Mapping[str, Any]) -> list[Suggestion]:
    """The rule edits for the failing cells of a result document, in matrix order."""
    axes_values: dict[str, list[Any]] = {a: list(v) for a, v in (document["run"].get("axes") or {}).items()}
    cells = document["cells"]
    if not axes_values:
        for cell in cells:
            for axis, value in cell["coords"].items():
                axes_values.setdefault(axis, [])
                if value not in axes_values[axis]:
                    axes_values[axis].append(value)
    axes = list(axes_values)

    def coords_of(cell: Mapping[str, Any]) -> Coords:
        return tuple((a, cell["coords"].get(a)) for a in axes)

    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for cell in cells:
        did = _did(cell)
        if did is not None:
            # Cells decided by different rules need their edits at different places.
            where = (cell.get("expectation") or {}).get("rule_line")
            groups.setdefault((did, where), []).append(cell)
    out: list[Suggestion] = []
    every = {coords_of(c): c for c in cells}
    for (did, line), members in groups.items():
        group = {coords_of(c) for c in members}
        # The new rule goes before rule `line` (or last): cells an earlier rule decides never
        # reach it, so it may cover them. Of the rest it may cover cells that did the same
        # (their expectation stays true), never one that did something else, was skipped or crashed.
        others = {k for k, c in every.items()
                  if k not in group and _behaviour(c) != did and _reaches(c, line)}
        decided_here = [c for c in cells if (c.get("expectation") or {}).get("rule_line") == line]
        replace = line is not None and all(coords_of(c) in group for c in decided_here)
        boxes = [_box_of(group, axes)] if replace else [_widen(b, others, axes_values)
                                                         for b in _rectangles(group, others, axes)]
        for box in boxes:
            covered = [every[k]["id"] for k in every if k in group and all(v in box[a] for a, v in k)]
            when = {a: [v for v in axes_values[a] if v in box[a]] for a in axes
                    if set(box[a]) != set(axes_values[a])}
            if not when:  # every cell of the matrix: the first axis, in full, keeps the rule readable
                when = {axes[0]: list(axes_values[axes[0]])}
            outcome = {"kind": ACCEPTED} if did[0] == ACCEPTED else {"kind": REJECTED, "error": did[1],
                                                                      "message": did[2]}
            first = next(c for c in members if c["id"] == covered[0])
            out.append(Suggestion(when, outcome, covered, line, _says(first), replace))
            if replace:
                break  # one new outcome for the rule's every cell
    order = {c["id"]: i for i, c in enumerate(cells)}
    out.sort(key=lambda s: order[s.cells[0]])
    return out


def _reaches(cell: Mapping[str, Any], line: int | None) -> bool:
    """Whether a rule inserted before rule ``line`` (None: last) would be consulted for the cell."""
    decided = (cell.get("expectation") or {}).get("rule_line")
    if decided is None:
        return True  # no rule decides it: any new rule reaches it
    return line is not None and decided >= line


def _widen(box: dict[str, set[Any]], others: set[Coords], axes_values: Mapping[str, list[Any]]) -> dict[str, set[Any]]:
    """Leave out each axis the box need not name: every value, while it still covers none of ``others``."""
    for axis, values in axes_values.items():
        wider = {**box, axis: set(values)}
        if not any(all(v in wider[a] for a, v in coords) for coords in others):
            box = wider
    return box


def _box_of(cells: Iterable[Coords], axes: Sequence[str]) -> dict[str, set[Any]]:
    box: dict[str, set[Any]] = {a: set() for a in axes}
    for coords in cells:
        for axis, value in coords:
            box[axis].add(value)
    return box


def _says(cell: Mapping[str, Any]) -> str:
    expect = cell.get("expectation") or {}
    rule = f"rule at line {expect['rule_line']}" if expect.get("rule_line") else "no rule (default accept)"
    if expect.get("kind") == "reject":
        what = expect.get("message") or f"/{expect.get('match')}/"
        return f"reject with {expect.get('error')}: {what} ({rule})"
    return f"accept ({rule})"


def as_text(suggestions: Sequence[Suggestion]) -> str:
    """The rules alone, each with where it goes."""
    parts = []
    for s in suggestions:
        if s.replace_rule:
            parts.append(f"# in the rule at line {s.before_line}, replace its outcome with:\n{s.comment()}"
                         f"{s.outcome_line()}")
            continue
        where = f"insert before line {s.before_line}" if s.before_line else "append at the end of the file"
        parts.append(f"# {where}\n{s.toml()}")
    return "\n".join(parts)


def as_patch(suggestions: Sequence[Suggestion], matrix_text: str, path: str) -> str:
    """A unified diff of the matrix file with the rules inserted (for review; nothing is written)."""
    lines = matrix_text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    inserts: dict[int, list[str]] = {}
    replaced: dict[int, str] = {}  # line index -> its new text ("" drops it)
    for s in suggestions:
        at = (s.before_line - 1) if s.before_line else len(lines)
        if s.replace_rule and at < len(lines):
            outcome = _outcome_lines(lines, _rule_header(lines, at))
            if outcome:
                replaced[outcome[0]] = s.outcome_line()
                replaced.update({i: "" for i in outcome[1:]})
                inserts.setdefault(_rule_start(lines, at), []).append(s.comment())
                continue
        at = _rule_start(lines, at)
        inserts.setdefault(at, []).append(s.toml() + "\n")
    lines = [replaced.get(i, line) for i, line in enumerate(lines)]
    old_lines = matrix_text.splitlines(keepends=True)
    new: list[str] = []
    for i in range(len(lines) + 1):
        for block in inserts.get(i, []):
            if i == len(lines) and new and new[-1].strip():
                new.append("\n")
            new.extend(block.splitlines(keepends=True))
        if i < len(lines):
            new.append(lines[i])
    diff = difflib.unified_diff(old_lines, new, fromfile=f"a/{path}", tofile=f"b/{path}")
    # A last line without its newline, marked as diff and git mark it (patch(1) reads the marker).
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in diff)


def _outcome_lines(lines: list[str], start: int) -> list[int]:
    """The lines of the outcome keys (``reject``, ``accept``, ``skip``) of the rule at ``start``."""
    found = []
    for i in range(start + 1, len(lines)):
        text = lines[i].strip()
        if text.startswith("[[") or text.startswith("["):
            break
        if text.split("=", 1)[0].strip() in ("reject", "accept", "skip"):
            found.append(i)
    return found


def _rule_header(lines: list[str], at: int) -> int:
    """The ``[[rule]]`` line of the rule holding line ``at``."""
    i = min(at, len(lines) - 1)
    while i > 0 and lines[i].strip() != "[[rule]]":
        i -= 1
    return i


def _rule_start(lines: list[str], at: int) -> int:
    """Where the rule holding line ``at`` begins, with the comments just above it."""
    if at >= len(lines):
        return len(lines)
    i = _rule_header(lines, at)
    while i > 0 and lines[i - 1].lstrip().startswith("#"):
        i -= 1
    return i
