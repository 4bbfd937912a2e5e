"""Line numbers for key paths of a TOML document.

``tomllib`` returns plain dicts without positions; this small scanner maps
key paths (``("rule", 3, "when", "arch")``) to the line that defines them, so a
problem found after parsing can still name its line. It understands what
matrix files use: ``[table]``, ``[[array]]``, ``key = value`` with bare,
quoted and dotted keys, and one-line inline tables. It is only ever asked for
lines of a document ``tomllib`` already accepted.
"""

from __future__ import annotations

import re
from typing import Hashable, Sequence

_KEY = r'(?:"(?:[^"\\]|\\.)*"|\'[^\']*\'|[A-Za-z0-9_-]+)'
_DOTTED_KEY = rf"{_KEY}(?:\s*\.\s*{_KEY})*"
_HEADER = re.compile(rf"^\s*(\[\[|\[)\s*({_DOTTED_KEY})\s*\]\]?")
_ASSIGN = re.compile(rf"^\s*({_DOTTED_KEY})\s*=")
_INLINE_KEY = re.compile(rf"(?:\{{|,)\s*({_DOTTED_KEY})\s*=")

Path = tuple[Hashable, ...]


def _split_key(text: str) -> list[str]:
    return [k.strip().strip('"').strip("'") for k in re.findall(_KEY, text)]


class LineIndex:
    def __init__(self, text: str) -> None:
        self._text = text.splitlines()
        self._lines: dict[Path, int] = {}
        array_counts: dict[Path, int] = {}
        table: Path = ()
        for lineno, raw in enumerate(text.splitlines(), start=1):
            line = raw.split("#", 1)[0] if '"' not in raw and "'" not in raw else raw
            if m := _HEADER.match(line):
                keys = tuple(_split_key(m.group(2)))
                if m.group(1) == "[[":
                    index = array_counts.get(keys, 0)
                    array_counts[keys] = index + 1
                    table = keys + (index,)
                else:
                    table = keys
                self._lines.setdefault(table, lineno)
                continue
            if m := _ASSIGN.match(line):
                key_path = table + tuple(_split_key(m.group(1)))
                self._lines.setdefault(key_path, lineno)
                rest = line[m.end() :]
                if "{" in rest:
                    for sub in _INLINE_KEY.finditer(rest):
                        self._lines.setdefault(key_path + tuple(_split_key(sub.group(1))), lineno)

    def line(self, path: Sequence[Hashable]) -> int | None:
        """Line of the longest known prefix of ``path`` (None if nothing matches)."""
        path = tuple(path)
        while path:
            if path in self._lines:
                return self._lines[path]
            path = path[:-1]
        return None

    def value_line(self, path: Sequence[Hashable], token: str) -> int | None:
        """Line of ``token`` (a value's TOML text, ``"npu"``) in the value of the key at ``path``.

        The value may span lines (a list over several lines): the search runs
        from the key's line until the next key or table header. Falls back to
        the key's own line.
        """
        first = self.line(path)
        if first is None:
            return None
        for lineno in range(first, len(self._text) + 1):
            raw = self._text[lineno - 1]
            if lineno > first and (_HEADER.match(raw) or _ASSIGN.match(raw)):
                break
            if token in raw.split("#", 1)[0]:
                return lineno
        return first
