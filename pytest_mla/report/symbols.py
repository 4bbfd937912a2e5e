"""The one symbol set of every view: the Markdown tables, the backends view, the terminal sketch, HTML.

One state, one symbol, one meaning, everywhere. A documented refusal (the
engine said "no" as the matrix says it does: the table working) never shares
a symbol with a failure (the engine or its kernel did not do what the matrix
says). Verification levels are never shown as one: a kernel that ran is
``verified``; the engine's backend code run around *emulated* kernels
(``kernel.level == "emulated"``: its plumbing checked, not the kernel's
numerics) is ``emulated``.

Each state has an emoji (Markdown, the terminal) and a glyph (the HTML page,
which must not depend on an emoji font; colour carries the same meaning).
"""

from __future__ import annotations

import dataclasses

__all__ = ["Symbol", "SYMBOLS", "VERIFIED", "EMULATED", "ACCEPTED", "REJECTED", "XFAIL", "BAD", "SKIPPED",
           "PARTIAL", "MISSING", "CELL_STATES", "emoji", "glyph", "legend"]

VERIFIED, EMULATED, ACCEPTED, REJECTED = "verified", "emulated", "accepted", "rejected"
XFAIL, BAD, SKIPPED, PARTIAL, MISSING = "xfail", "bad", "skipped", "partial", "missing"


@dataclasses.dataclass(frozen=True)
class Symbol:
    state: str
    emoji: str  # Markdown and the terminal
    glyph: str  # the HTML page (plain text every font has)
    legend: str  # what it means, in the words of every legend


SYMBOLS: dict[str, Symbol] = {s.state: s for s in (
    Symbol(VERIFIED, "✅", "✔", "accepted; the decode kernel ran and matched the float64 reference"),
    Symbol(EMULATED, "🧪", "≈", "accepted; the engine's backend code ran around emulated kernels and matched "
                               "(its plumbing is checked, not the kernel's numerics)"),
    Symbol(ACCEPTED, "☑️", "✓", "accepted; kernel not run here"),
    Symbol(REJECTED, "⛔", "⊘", "refused by the engine, as documented"),
    Symbol(PARTIAL, "◐", "◐", "accepted only in some of the configurations summarised (k/n: in k of n); "
                              "the note names where"),
    Symbol(XFAIL, "⚠️", "!", "known bug (xfail, or xpass: a known bug that now passes)"),
    Symbol(BAD, "❌", "✗", "failure: mismatch with the matrix, kernel out of tolerance, or crash"),
    Symbol(SKIPPED, "➖", "–", "not applicable or skipped"),
    Symbol(MISSING, "·", "·", "no cell reported"),
)}

#: The states of one cell, in legend order (``model.cell_state``); the HTML filters use this order.
CELL_STATES = (VERIFIED, EMULATED, ACCEPTED, REJECTED, XFAIL, SKIPPED, BAD)
#: The states a legend lists, in order (``missing`` needs no legend).
LEGEND_STATES = (VERIFIED, EMULATED, ACCEPTED, REJECTED, PARTIAL, XFAIL, BAD, SKIPPED)


def emoji(state: str) -> str:
    return SYMBOLS[state].emoji


def glyph(state: str) -> str:
    return SYMBOLS[state].glyph


def legend(states: tuple[str, ...] = LEGEND_STATES) -> list[tuple[str, str]]:
    """``(state, words)`` for each state a legend lists."""
    return [(s, SYMBOLS[s].legend) for s in states]
