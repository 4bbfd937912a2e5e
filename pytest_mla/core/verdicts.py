"""Outcomes and verdicts: what the engine did, compared with what the matrix says.

Verdict values are the lowercase strings the report prints.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from .errors import failure_message
from .rules import Expectation
from .text import describe_char, invisible, visible

PASS, FAIL, ERROR, SKIP, XFAIL, XPASS = "pass", "fail", "error", "skip", "xfail", "xpass"
VERDICTS = (PASS, FAIL, ERROR, SKIP, XFAIL, XPASS)

ACCEPTED, REJECTED, CRASHED = "accepted", "rejected", "crashed"

VERIFIED, KERNEL_FAILED, NOT_RUN = "verified", "failed", "not-run"
KERNEL_STATUSES = (VERIFIED, KERNEL_FAILED, NOT_RUN)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What the engine did with a cell's configuration."""

    kind: str  # accepted / rejected / crashed
    error: str | None = None  # exception class name
    message: str | None = None
    error_mro: tuple[str, ...] = ()  # class names along the MRO, to match base classes
    backends: dict[str, str] | None = None  # e.g. {"decode": "TritonMLABackend"}

    @classmethod
    def from_exception(cls, exc: BaseException, *, crashed: bool = False) -> "Outcome":
        mro = tuple(c.__name__ for c in type(exc).__mro__ if c not in (BaseException, object))
        qual = tuple(f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__)
        return cls(CRASHED if crashed else REJECTED, type(exc).__name__, failure_message(exc), mro + qual)

    def describe(self) -> str:
        if self.kind == ACCEPTED:
            return "accepted"
        return f"{self.kind}: {self.error}: {self.message}"

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "error": self.error, "message": self.message}
        if self.backends:
            d["backends"] = dict(self.backends)
        return d


def judge(expect: Expectation, outcome: Outcome) -> tuple[str, str | None]:
    """(verdict, reason) for the validation part of a cell; reason says exactly what differed."""
    if outcome.kind == CRASHED:
        if outcome.error == "AdapterError":
            return ERROR, f"adapter error: {outcome.message}"
        return ERROR, f"engine crashed: {outcome.error}: {outcome.message}"
    if expect.kind == "accept":
        if outcome.kind == ACCEPTED:
            return PASS, None
        return FAIL, f"expected accept, but the engine rejected it:\n  raised:   {outcome.error}: {outcome.message}"
    expected = expect.describe().removeprefix("reject with ")
    if outcome.kind == ACCEPTED:
        return FAIL, f"expected a rejection, but the engine accepted it:\n  expected: {expected}"
    if expect.error not in outcome.error_mro:
        return FAIL, (
            f"wrong error type: expected {expect.error}, raised {outcome.error}\n"
            f"  expected: {expected}\n  raised:   {outcome.error}: {outcome.message}"
        )
    message = outcome.message or ""
    if expect.message is not None and message != expect.message:
        return FAIL, "wrong message:\n" + describe_text_diff(expect.message, message)
    if expect.match is not None and not re.search(expect.match, message):
        return FAIL, f"message does not match /{expect.match}/:\n  raised:   {message}"
    return PASS, None


def describe_text_diff(expected: str, actual: str) -> str:
    """Both texts, and a caret under the first character where they differ.

    Characters a reader cannot see are shown as escapes (``\\u00a0``), and where the first
    difference is one that looks like another (a no-break space, a zero-width space, a
    non-ASCII look-alike), both characters are named."""
    i = next((k for k, (a, b) in enumerate(zip(expected, actual)) if a != b), min(len(expected), len(actual)))
    shown_e, shown_a = visible(expected[:i]), visible(actual[:i])
    column = len(shown_e) if shown_e == shown_a else i
    named = ""
    pair = [text[i] if i < len(text) else "" for text in (expected, actual)]
    if any(ch and (invisible(ch) or not ch.isascii()) for ch in pair):
        e, a = (describe_char(ch) if ch else "the end of the text" for ch in pair)
        named = f" (expected {e}, raised {a})"
    return (
        f"  expected: {visible(expected)}\n"
        f"  raised:   {visible(actual)}\n"
        f"            {' ' * column}^ first difference at character {i}{named}"
    )
