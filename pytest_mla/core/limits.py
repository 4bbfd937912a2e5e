"""What a reader takes in, in one place: how big a file may be and how deeply it may nest.

Every file a user hands pytest-mla (a result file, a matrix file, a published
document for ``check``, standard input) is read with ``read_bounded``: at
most ``max_input_bytes()`` + 1 bytes, so ``/dev/zero`` or a pipe that never
ends is one line (``InputLimitError``), not a process that eats the memory.
The limit is ``DEFAULT_MAX_INPUT_BYTES`` (4 GiB: a result file of a million
cells is about 70 MB) unless ``$PYTEST_MLA_MAX_INPUT_BYTES`` says otherwise.

Arrays and objects (JSON), arrays and tables (TOML) may nest ``MAX_NESTING``
levels: files pytest-mla writes nest fewer than ten. ``too_deep`` finds the
first value past that in parsed data (its key path); ``deep_offset`` finds
where the text nests past it, for a parser that gave up with a
``RecursionError`` (Python's JSON and TOML parsers recurse once per level).
"""

from __future__ import annotations

import os
import re
import stat
from typing import IO, Any

#: The variable that sets the input limit: bytes, or a number with K, M, G (KiB, MiB, GiB).
MAX_INPUT_BYTES_ENV = "PYTEST_MLA_MAX_INPUT_BYTES"
DEFAULT_MAX_INPUT_BYTES = 4 * 1024**3
#: Levels of arrays and objects (tables) a JSON or TOML input may nest; the document itself is level 1.
MAX_NESTING = 100

_CHUNK = 1 << 20  # what one read of a pipe asks for
_SIZE = re.compile(r"^\s*(\d+)\s*(?:([KMG])(?:i?B)?|B)?\s*$", re.IGNORECASE)
_UNITS = {None: 1, "K": 1024, "M": 1024**2, "G": 1024**3}


class InputLimitError(ValueError):
    """An input over a limit, or a limit that is not a size; prints as one line."""


def max_input_bytes() -> int:
    """The most bytes a reader takes: ``$PYTEST_MLA_MAX_INPUT_BYTES``, else ``DEFAULT_MAX_INPUT_BYTES``."""
    text = os.environ.get(MAX_INPUT_BYTES_ENV)
    if text is None or not text.strip():
        return DEFAULT_MAX_INPUT_BYTES
    m = _SIZE.match(text)
    if not m:
        raise InputLimitError(f"{MAX_INPUT_BYTES_ENV}={text!r}: not a size (bytes, or a number with K, M or G)")
    return int(m.group(1)) * _UNITS[m.group(2).upper() if m.group(2) else None]


def format_size(n: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"


def read_bounded(source: str | os.PathLike[str] | IO[bytes], shown: str) -> bytes:
    """The bytes of a file (a path, or a binary stream such as ``sys.stdin.buffer``), at most the
    input limit: ``InputLimitError`` naming ``shown`` past it. ``OSError`` as ``open`` raises it."""
    limit = max_input_bytes()
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb", buffering=0) as f:
            return _read_at_most(f, shown, limit)
    return _read_at_most(source, shown, limit)


def _read_at_most(f: IO[bytes], shown: str, limit: int) -> bytes:
    try:
        st = os.fstat(f.fileno())
        size = st.st_size if stat.S_ISREG(st.st_mode) else 0
    except (OSError, AttributeError, ValueError):  # a stream without a file (io.BytesIO)
        size = 0
    if size > limit:
        raise InputLimitError(_too_big(shown, limit, f"is {format_size(size)}"))
    chunks = []
    total = 0
    want = size + 1 if size else _CHUNK  # a regular file: one read, and one more that finds its end
    while True:
        chunk = f.read(min(want, limit + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise InputLimitError(_too_big(shown, limit, "goes on"))
        want = _CHUNK
    if len(chunks) == 1:
        return chunks[0]
    return chunks[0][:0].join(chunks) if chunks else b""  # a text stream (a test's stdin) gives text


def _too_big(shown: str, limit: int, what: str) -> str:
    return (f"{shown}: {what} past the {format_size(limit)} input limit; not read "
            f"(set {MAX_INPUT_BYTES_ENV} to read larger files)")


# -- nesting -------------------------------------------------------------------------------
def too_deep(value: Any, limit: int = MAX_NESTING) -> tuple[Any, ...] | None:
    """The key path (keys and indexes) of the first array or object in ``value`` nested deeper than
    ``limit`` levels (``value`` itself is level 1), or None. Without recursion: any depth is fine."""
    level = [value] if type(value) is dict or type(value) is list else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return _path_down(value, limit)
        below = []
        for v in level:
            below.extend(c for c in (v.values() if type(v) is dict else v) if type(c) is dict or type(c) is list)
        level = below
    return None


def _path_down(value: Any, levels: int) -> tuple[Any, ...]:
    """The path from ``value`` down ``levels`` containers (one that exists: ``too_deep`` saw it)."""
    heights: dict[tuple[int, int], int] = {}

    def height(v: Any, room: int) -> int:  # levels of containers at and below v, counted up to room
        if room <= 0 or not (type(v) is dict or type(v) is list):
            return 0
        known = heights.get((id(v), room))
        if known is None:
            children = v.values() if type(v) is dict else v
            known = heights[(id(v), room)] = 1 + max((height(c, room - 1) for c in children), default=0)
        return known

    path: list[Any] = []
    for room in range(levels, 0, -1):
        items = value.items() if type(value) is dict else enumerate(value)
        key, value = next((k, c) for k, c in items if height(c, room) >= room)
        path.append(key)
    return tuple(path)


_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[{]|[\]}]', re.DOTALL)
_TOML_TOKEN = re.compile(r'"""[\s\S]*?(?:"""|$(?![\s\S]))|\'\'\'[\s\S]*?(?:\'\'\'|$(?![\s\S]))'
                         r'|"(?:[^"\\\n]|\\.)*"?|\'[^\'\n]*\'?|#[^\n]*|[\[{]|[\]}]')


def deep_offset(text: str, limit: int = MAX_NESTING, *, toml: bool = False) -> int | None:
    """Where ``text`` (JSON, or TOML with ``toml``) opens an array or object nested deeper than
    ``limit`` levels (strings and comments skipped), or None."""
    depth = 0
    for m in (_TOML_TOKEN if toml else _JSON_TOKEN).finditer(text):
        c = text[m.start()]
        if c == "[" or c == "{":
            depth += 1
            if depth > limit:
                return m.start()
        elif c == "]" or c == "}":
            depth -= 1
    return None


def line_column(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of ``offset`` in ``text``."""
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def nesting_message(limit: int = MAX_NESTING) -> str:
    return f"nested deeper than {limit} levels of arrays and objects"


def format_key_path(path: tuple[Any, ...], head: str = "", parts: int = 6) -> str:
    """``run.engine.metadata[0][0]…``: ``head`` and the first ``parts`` steps of ``path``."""
    out = head
    for part in path[:parts]:
        out += f"[{part}]" if type(part) is int else (f".{part}" if out else str(part))
    return out + ("…" if len(path) > parts else "")


__all__ = ["MAX_INPUT_BYTES_ENV", "DEFAULT_MAX_INPUT_BYTES", "MAX_NESTING", "InputLimitError", "max_input_bytes",
           "read_bounded", "too_deep", "deep_offset", "line_column", "nesting_message", "format_size",
           "format_key_path"]
