"""``visible``: what a reader cannot see is written as an escape, everything else stays as it is."""

from __future__ import annotations

import pytest

from pytest_mla.core.text import visible


@pytest.mark.parametrize("text, shown", [
    ("plain ascii: 0-9 a-z ~!", "plain ascii: 0-9 a-z ~!"),
    ("two\nlines\tand a tab", "two\nlines\tand a tab"),  # kept by default
    ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),  # a terminal escape loses its ESC
    ("nul\x00 del\x7f", "nul\\x00 del\\x7f"),
    ("zero\u200bwidth", "zero\\u200bwidth"),
    ("bidi \u202eevil", "bidi \\u202eevil"),
    ("ideographic\u3000space, nbsp\u00a0", "ideographic\\u3000space, nbsp\\xa0"),
    ("hangul filler \u3164", "hangul filler \\u3164"),
    ("✅ verified — dcp·2 ≤ 1e-3 😀", "✅ verified — dcp·2 ≤ 1e-3 😀"),  # visible non-ASCII stays
    ("lone \ud800 surrogate", "lone \\ud800 surrogate"),
    ("private \U000f0000", "private \\U000f0000"),
    (None, ""),
    (42, "42"),
])
def test_visible_escapes_only_what_cannot_be_seen(text, shown):
    assert visible(text) == shown


def test_allow_empty_escapes_newlines_and_tabs_too():
    assert visible("a\nb\tc\r", allow="") == "a\\x0ab\\x09c\\x0d"
    assert visible("a\nb\tc\r") == "a\nb\tc\\x0d"


def test_a_long_text_with_a_few_escapes_keeps_every_other_character():
    text = ("kernel verified on sm90\n  out: max_abs_err 1e-3 · cos_diff 1e-8\u200b\n" * 2000)
    assert visible(text) == text.replace("\u200b", "\\u200b")
