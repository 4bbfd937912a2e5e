"""Option values: ``parse_*`` turn text into values and raise ``pytest.UsageError`` naming the option."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from .core.cells import AXES, INT_AXES, is_arch

KERNEL_MODES = ("auto", "off")
DCP_MODES = ("in-process", "distributed")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything the ``--mla-*`` options decide, parsed once."""

    matrix_paths: tuple[str, ...]  # explicit paths from --mla-matrix=..., empty: use mla_matrix_files
    select: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    report_dir: str | None = "reports"
    formats: tuple[str, ...] = ("json", "md", "html")
    kernel: str = "auto"
    dcp_mode: str = "in-process"
    seed: int | None = None
    shard: tuple[int, int] | None = None  # (index from 1, count)
    arch: str = "auto"
    baseline: str | None = None
    dcp_timeout: float = 120.0
    report_name: str = "{matrix}"


def parse_select(values: list[str], option: str = "--mla-select") -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """``AXIS=V1,V2`` (repeatable) → ((axis, (v1, v2)), ...); ints for dcp/page_size/tp."""
    out = []
    for text in values:
        axis, sep, rest = text.partition("=")
        axis = axis.strip()
        if not sep or not rest.strip():
            raise pytest.UsageError(f"{option}: expected AXIS=V1,V2 such as backend=triton,fa3, got {text!r}")
        if axis not in AXES:
            raise pytest.UsageError(f"{option}: unknown axis {axis!r} in {text!r} (known: {', '.join(AXES)})")
        vals: list[Any] = []
        for v in (p.strip() for p in rest.split(",")):
            if axis in INT_AXES:
                try:
                    vals.append(int(v))
                except ValueError:
                    raise pytest.UsageError(f"{option}: axis {axis} takes integers, got {v!r} in {text!r}") from None
            else:
                vals.append(v)
        out.append((axis, tuple(vals)))
    return tuple(out)


def parse_shard(text: str | None, option: str = "--mla-shard") -> tuple[int, int] | None:
    if not text:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or not (1 <= int(m.group(1)) <= int(m.group(2))):
        raise pytest.UsageError(f"{option}: expected I/N with 1 <= I <= N, such as 2/3, got {text!r}")
    return int(m.group(1)), int(m.group(2))


def parse_choice(text: str, choices: tuple[str, ...], option: str) -> str:
    if text not in choices:
        raise pytest.UsageError(f"{option}: expected one of {', '.join(choices)}, got {text!r}")
    return text


def parse_arch(text: str, option: str = "--mla-arch") -> str:
    if text != "auto" and not is_arch(text):
        raise pytest.UsageError(f"{option}: expected 'auto' or an arch such as sm90, got {text!r}")
    return text


def parse_seed(text: str | None, option: str = "--mla-seed") -> int | None:
    if text in (None, ""):
        return None
    try:
        seed = int(str(text))
    except ValueError:
        raise pytest.UsageError(f"{option}: expected a non-negative integer, got {text!r}") from None
    if seed < 0:
        raise pytest.UsageError(f"{option}: expected a non-negative integer, got {text!r}")
    return seed


def parse_formats(text: str, option: str = "--mla-report-format") -> tuple[str, ...]:
    known = ("json", "md", "html")
    items = tuple(p.strip() for p in text.split(",") if p.strip())
    for item in items:
        if item not in known:
            raise pytest.UsageError(f"{option}: unknown format {item!r} (known: {', '.join(known)})")
    if "json" not in items:
        items = ("json",) + items  # the JSON file is the primary artifact
    return items


def parse_timeout(text: str, option: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise pytest.UsageError(f"{option}: expected seconds, got {text!r}") from None
    if value <= 0:
        raise pytest.UsageError(f"{option}: expected a positive number of seconds, got {text!r}")
    return value


REPORT_NAME_FIELDS = ("matrix", "engine", "version")


def parse_report_name(text: str, option: str = "--mla-report-name") -> str:
    """A file-stem template with {matrix}, {engine} and {version} placeholders."""
    import string

    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
    except ValueError as exc:
        raise pytest.UsageError(f"{option}: bad template {text!r}: {exc}") from None
    for field in fields:
        if field not in REPORT_NAME_FIELDS:
            raise pytest.UsageError(
                f"{option}: unknown placeholder {{{field}}} in {text!r} (known: {', '.join(REPORT_NAME_FIELDS)})"
            )
    if not text.strip() or "/" in text or "\\" in text:
        raise pytest.UsageError(f"{option}: expected a file name stem such as '{{engine}}-{{version}}', got {text!r}")
    return text
