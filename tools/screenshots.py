"""Screenshots of the published tables for docs/: the HTML backends view, and the Markdown as GitHub shows it.

    .venv-sglang/bin/python tools/screenshots.py [RESULT.json]     # default: reports/sglang-0.5.23.json

Needs a headless Chromium (``apt-get install -y chromium``; ``.ci/run`` does
that), an emoji font for the Markdown's ✅ ❌ (``apt-get install -y
fonts-noto-color-emoji``; without one they are empty boxes) and, for the
Markdown, ``markdown-it-py`` (a CommonMark parser with GitHub's table
extension; the engine venvs have it, the project does not depend on it). Nothing is fetched: the Markdown is turned into HTML here and
styled with a small GitHub-like stylesheet (GitHub's column is 1012 px wide
and scrolls wide tables sideways; so does this page). Writes:

- ``docs/backends-view-html.png``: ``pytest-mla render RESULT --view backends -f html``;
- ``docs/backends-view-github.png``: the backends view's Markdown, rendered like GitHub;
- ``docs/report-screenshot.png``: the full HTML page (backends view above the interactive matrix);
- ``docs/docs-page-sglang.png``, ``docs/docs-page-vllm.png``: the docs pages (``--view docs``) of the
  committed SGLang and vLLM reports, rendered like GitHub (``--docs-only``: these two alone).
"""

from __future__ import annotations

import argparse
import html
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_mla.report.html import render_html  # noqa: E402
from pytest_mla.report.markdown import render_markdown  # noqa: E402
from pytest_mla.report.results import read_results  # noqa: E402

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--virtual-time-budget=5000"]

# The parts of github-markdown-css a generated table uses (light theme).
GITHUB_CSS = """
body{margin:0;background:#fff}
.markdown-body{box-sizing:border-box;max-width:1012px;margin:0 auto;padding:32px;color:#1f2328;
  font:16px/1.5 -apple-system,BlinkMacSystemFont,"Segoe UI","Noto Sans",Helvetica,Arial,sans-serif,
  "Apple Color Emoji","Segoe UI Emoji","Noto Color Emoji";word-wrap:break-word}
.markdown-body h1,.markdown-body h2{padding-bottom:.3em;border-bottom:1px solid #d1d9e0b3}
.markdown-body h1{font-size:2em;margin:.67em 0}
.markdown-body h2{font-size:1.5em;margin:24px 0 16px}
.markdown-body h3{font-size:1.25em;margin:24px 0 16px}
.markdown-body p,.markdown-body ul,.markdown-body ol,.markdown-body table,.markdown-body blockquote{margin:0 0 16px}
.markdown-body blockquote{padding:0 1em;color:#59636e;border-left:.25em solid #d1d9e0}
.markdown-body code{padding:.2em .4em;font-size:85%;background:#818b981f;border-radius:6px;
  font-family:ui-monospace,SFMono-Regular,"SF Mono",Menlo,Consolas,monospace}
.markdown-body table{display:block;width:max-content;max-width:100%;overflow:auto;border-spacing:0;border-collapse:collapse}
.markdown-body table th{font-weight:600}
.markdown-body table th,.markdown-body table td{padding:6px 13px;border:1px solid #d1d9e0}
.markdown-body table tr{background:#fff;border-top:1px solid #d1d9e0b3}
.markdown-body table tr:nth-child(2n){background:#f6f8fa}
.markdown-body ol,.markdown-body ul{padding-left:2em}
"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("tools/screenshots.py: no chromium (apt-get install -y chromium)")


def shoot(browser: str, page: Path, out: Path, size: str) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={size}",
                        f"--screenshot={out}", page.as_uri()], capture_output=True, text=True, timeout=120,
                       check=True)
    print(f"wrote {out.relative_to(ROOT)}")


def github_page(markdown: str, title: str) -> str:
    try:
        from markdown_it import MarkdownIt
    except ImportError:
        sys.exit("tools/screenshots.py: needs markdown-it-py (run it with .venv-sglang/bin/python)")
    body = MarkdownIt("commonmark", {"html": True}).enable("table").render(markdown)
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{GITHUB_CSS}</style></head><body><article class=\"markdown-body\">{body}</article></body></html>")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", nargs="?", default=str(ROOT / "reports" / "sglang-0.5.23.json"))
    parser.add_argument("--out", default=str(ROOT / "docs"))
    parser.add_argument("--docs-only", action="store_true", help="only the docs pages of the committed reports")
    args = parser.parse_args()
    browser = chromium()
    out = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        tmp_dir = Path(tmp)
        for engine, name in (("sglang", "sglang-0.5.23"), ("vllm", "vllm-0.34.0")):
            page = tmp_dir / f"{name}.docs.html"
            docs = render_markdown(read_results(ROOT / "reports" / f"{name}.json"), view="docs",
                                   evidence=f"{name}.html")
            page.write_text(github_page(docs, f"{name} docs page"), encoding="utf-8")
            shoot(browser, page, out / f"docs-page-{engine}.png", "1300,3400")
        if args.docs_only:
            return
        document = read_results(args.result)
        page = tmp_dir / "backends.html"
        page.write_text(render_html(document, view="backends"), encoding="utf-8")
        shoot(browser, page, out / "backends-view-html.png", "1400,1500")
        md = tmp_dir / "github.html"
        md.write_text(github_page(render_markdown(document, view="backends"), "backends view"), encoding="utf-8")
        shoot(browser, md, out / "backends-view-github.png", "1100,2600")
        full = tmp_dir / "report.html"
        full.write_text(render_html(document), encoding="utf-8")
        shoot(browser, full, out / "report-screenshot.png", "1400,1100")


if __name__ == "__main__":
    main()
