"""The ```toml examples of README.md and docs/: complete matrices run green on the engine they
name (the count a page claims, "N passed", included); fragments are valid TOML."""

import re
import tomllib
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def toml_blocks():
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        start = None
        for i, line in enumerate(lines):
            if start is None and line.strip() == "```toml":
                start = i + 1
            elif start is not None and line.strip() == "```":
                before = "\n".join(lines[max(0, start - 6):start - 1])
                yield pytest.param(page, start + 1, "\n".join(lines[start:i]) + "\n", before,
                                   id=f"{page.relative_to(ROOT)}:{start + 1}")
                start = None


BLOCKS = list(toml_blocks())


def test_the_pages_have_examples():
    assert len(BLOCKS) >= 8


@pytest.mark.parametrize("page, line, text, before", BLOCKS)
def test_example(pytester, page, line, text, before):
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        pytest.fail(f"{page.name}:{line}: the example is not valid TOML: {exc}")
    if "axes" not in data or "engine" not in data:
        return  # a fragment: valid TOML is all it claims
    engine = data["engine"]["name"]
    if engine != "reference":
        pytest.importorskip(engine, reason=f"{page.name}:{line} runs on {engine}")
    pytester.makefile(".toml", example=text)
    result = pytester.runpytest("--mla-matrix=example.toml", "--mla-kernel=off", "-p", "no:xdist")
    failed = [ln for ln in result.stdout.lines if ln.startswith(("  FAIL", "  ERROR"))]
    assert result.ret == 0, f"{page.name}:{line}: the example does not pass on {engine}:\n" + "\n".join(failed[:10])
    claimed = re.search(r"(\d+) passed", before)
    if claimed:
        result.assert_outcomes(passed=int(claimed.group(1)))
