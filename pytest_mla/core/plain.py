"""Plain JSON values from whatever an engine, an adapter or a hook hands over.

A result file is written from values pytest-mla does not control: an
adapter's ``metadata()``, the notes and messages of an engine, a hook's
``record["extra"]``, the command line (whose bytes Python decodes with
``surrogateescape``). ``json_safe`` turns them into what JSON, xdist's
transport and a UTF-8 file all take, so that one odd value never costs
the finished cells: anything else becomes its ``repr``, a NaN or an
infinity its name, a lone surrogate a ``\\udcff`` escape.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["json_safe", "utf8_safe"]

#: Deeper than any record; beyond it a value is shown by its repr.
MAX_DEPTH = 20


def utf8_safe(text: str) -> str:
    """``text`` unchanged, or with each lone surrogate written as an escape (UTF-8 cannot hold it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def json_safe(value: Any, depth: int = 0) -> Any:
    """``value`` as plain JSON (dicts with string keys, lists, strings, finite numbers, bools, None)."""
    if depth > MAX_DEPTH:
        return utf8_safe(repr(value))
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, str):
        return utf8_safe(value)
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else repr(value)
    if isinstance(value, dict):
        return {utf8_safe(str(k)): json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((json_safe(v, depth + 1) for v in value), key=repr)
    if isinstance(value, os.PathLike):
        return utf8_safe(os.fspath(value))
    try:
        return utf8_safe(repr(value))
    except Exception as exc:  # a repr that raises
        return f"<{type(value).__name__} object (repr raised {type(exc).__name__})>"
