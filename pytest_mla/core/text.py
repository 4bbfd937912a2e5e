"""Text a reader cannot see, and regexes that cannot fail or cannot finish.

Matrix files are written by people who copy engine messages from web pages
and terminals: a no-break space, a zero-width space or a right-to-left
override looks like nothing, and a message compared with it fails with two
texts that look the same. ``invisible`` finds such characters;
``visible`` writes them as escapes wherever engine or matrix text is shown
(the terminal, Markdown, HTML), so a reader sees what is there.

``regex_problem`` says why a ``match`` regex cannot do its job: it matches
every message (the check could never fail), or it nests an unbounded
repetition inside another (catastrophic backtracking: Python's regex engine
cannot be interrupted, so one such regex hangs the run on a message it
does not match).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any, Iterator

__all__ = ["invisible", "visible", "describe_char", "regex_problem", "first_invisible"]

#: Categories whose characters show as nothing (or as something else): controls, format
#: characters (zero-width space, bidi overrides, BOM, soft hyphen), line/paragraph
#: separators, private use, surrogates and unassigned code points.
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Co", "Cs", "Cn"})
#: Letters and symbols that render blank in common fonts (Hangul fillers, braille blank).
_BLANK_LOOKING = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def invisible(ch: str, *, allow: str = "") -> bool:
    """Whether ``ch`` is a character a reader cannot see or tell from a plain space."""
    if ch in allow or ch == " ":
        return False
    category = unicodedata.category(ch)
    return category in _INVISIBLE_CATEGORIES or category == "Zs" or ch in _BLANK_LOOKING


def first_invisible(text: str, *, allow: str = "") -> tuple[int, str] | None:
    """``(index, char)`` of the first invisible character of ``text`` (None: there is none)."""
    for i, ch in enumerate(text):
        if invisible(ch, allow=allow):
            return i, ch
    return None


def describe_char(ch: str) -> str:
    """``U+200B ZERO WIDTH SPACE``: a character by code point and name."""
    name = unicodedata.name(ch, "") or {"Cc": "control character", "Cs": "lone surrogate"}.get(
        unicodedata.category(ch), "unnamed character")
    return f"U+{ord(ch):04X} {name}"


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def visible(text: Any, *, allow: str = "\n\t") -> str:
    """``text`` with every invisible character written as an escape (``\\u200b``, ``\\x1b``).

    Newlines and tabs stay by default (callers that want one line fold them);
    terminal escape sequences lose their ESC and so cannot move the cursor.
    """
    text = "" if text is None else str(text)
    if text.isascii() and text.isprintable():
        return text
    # Only characters outside printable ASCII can be invisible: look at those alone (a long
    # kernel description with a few newlines is one pass in C, not a Python call per character).
    return _NOT_PRINTABLE_ASCII.sub(lambda m: _visible_char(m.group(), allow), text)


_NOT_PRINTABLE_ASCII = re.compile(r"[^\x20-\x7e]")


def _visible_char(ch: str, allow: str) -> str:
    return _escape(ch) if invisible(ch, allow=allow) else ch


# -- regexes --------------------------------------------------------------------------------
#: Texts no engine message resembles: a regex that finds a match in all of them matches anything.
_ANY_PROBES = ("", "\x00", "~ Z9\n")


def regex_problem(pattern: str) -> str | None:
    """Why ``pattern`` (already compiled once, so valid) cannot serve as a ``match``; None if it can."""
    compiled = re.compile(pattern)
    if all(compiled.search(probe) for probe in _ANY_PROBES):
        return (f"regex {pattern!r} matches every message (it matches the empty text), so the check "
                "could never fail: write the part of the engine's message that must be there")
    nested = _nested_repeat(pattern)
    if nested:
        return (f"regex {pattern!r} repeats {nested}, which can take exponential time on a message it "
                "does not match (catastrophic backtracking): drop one of the repetitions, or make the outer "
                "one possessive ('(...)++', '(...)*+') so it cannot backtrack")
    return None


def _nested_repeat(pattern: str) -> str | None:
    """The quoted text of an unbounded repetition nested inside another unbounded one, if any.

    Bounded outer repetitions (``(\\d+\\.){3}``) and possessive ones (``(a+)++``) are left alone."""
    try:
        from re import _constants, _parser  # type: ignore[attr-defined]  # Python 3.11+
    except ImportError:  # pragma: no cover - another interpreter: no check rather than a wrong one
        return None
    try:
        parsed = _parser.parse(pattern)
    except Exception:  # pragma: no cover - compiled above, so it parses
        return None
    repeats = {_constants.MAX_REPEAT, _constants.MIN_REPEAT}

    def walk(items: Any, inside: bool) -> Iterator[bool]:
        for op, arg in items:
            if op in repeats:
                low, high, sub = arg
                unbounded = high == _constants.MAXREPEAT
                if inside and unbounded:
                    yield True
                    return
                yield from walk(sub, inside or unbounded)
            elif op == _constants.SUBPATTERN:
                yield from walk(arg[-1], inside)
            elif op == _constants.BRANCH:
                for branch in arg[1]:
                    yield from walk(branch, inside)
            elif op in (_constants.ASSERT, _constants.ASSERT_NOT):
                yield from walk(arg[1], inside)
            elif op == getattr(_constants, "ATOMIC_GROUP", None):
                continue  # no backtracking into it
            elif op == getattr(_constants, "POSSESSIVE_REPEAT", None):
                continue

    if any(walk(parsed, False)):
        return _outer_repeat_text(pattern)
    return None


def _outer_repeat_text(pattern: str) -> str:
    """A short quote of the nested repetition for the message (the group before a quantifier)."""
    m = re.search(r"\((?:[^()\\]|\\.)*[+*}](?:[^()\\]|\\.)*\)[+*{]", pattern)
    return f"{m.group(0)!r}" if m else "a repetition inside another"
