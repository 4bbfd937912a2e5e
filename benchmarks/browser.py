"""A 100,000-cell HTML report in Chromium: how long it takes to open, and whether it works.

    .venv/bin/python benchmarks/browser.py [--cells 100000] [--browser /usr/bin/chromium]

Renders ``report.py``'s synthetic result document (many models and backends; accepted,
verified, rejected with a dozen messages, a few failures) with ``pytest-mla render`` to
HTML, then loads it in headless Chromium (``--dump-dom``) three ways and checks the DOM
each time:

- as opened: the cell count says every cell is shown, only the first rows are built (a
  few thousand chips, not one per cell) and the rest wait ("N more rows load as you scroll");
- ``#cell=<the last cell>``: a cell far down the page is built on demand and its details shown;
- ``#rows=model&cols=arch``: thousands of cells per table cell show 60 chips and a "+N more" button.

Prints the page size, the time to load each (Chromium's wall time, less that of an empty
page: its own start-up), the DOM's size and every check's result; exits 1 when a check fails.
Chromium's virtual time (``--virtual-time-budget``) lets the page's timers run without waiting.
No timed test: the numbers are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import report  # noqa: E402


def find_browser(given: str | None) -> str | None:
    if given:
        return given
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def dump_dom(browser: str, url: str, timeout: float = 300) -> tuple[float, str]:
    """(wall seconds, the DOM after load) of one headless Chromium run."""
    with tempfile.TemporaryDirectory() as profile:
        argv = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                f"--user-data-dir={profile}", "--virtual-time-budget=10000", "--dump-dom", url]
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{browser} exited {proc.returncode} on {url}: {proc.stderr[-1000:]}")
    return wall, proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=100_000)
    parser.add_argument("--browser", default=None, help="Chromium's executable (default: found on PATH)")
    opts = parser.parse_args()
    browser = find_browser(opts.browser)
    if browser is None:
        raise SystemExit("no Chromium found (apt-get install -y chromium, or give --browser)")
    print(f"(load average {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs; {browser})", flush=True)
    failures = []

    def check(ok: bool, what: str) -> None:
        print(f"  {'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        doc = report.synthetic(opts.cells)
        cells, last = len(doc["cells"]), doc["cells"][-1]["id"]
        result = Path(tmp) / "big.json"
        report.write_results(result, doc["run"], doc["cells"])
        del doc
        page = Path(tmp) / "big.html"
        render_s, rss_mb, _ = report.run_measured([sys.executable, "-m", "pytest_mla.cli", "render", str(result),
                                                   "-o", str(page)])
        print(f"{cells} cells: pytest-mla render -o big.html {render_s:.1f} s (peak {rss_mb:.0f} MB), "
              f"page {page.stat().st_size / 1e6:.1f} MB")
        empty = Path(tmp) / "empty.html"
        empty.write_text("<!doctype html><title>empty</title><p>empty</p>", encoding="utf-8")
        startup, _ = dump_dom(browser, empty.as_uri())

        def load(fragment: str) -> str:
            wall, dom = dump_dom(browser, page.as_uri() + fragment)
            elements = len(re.findall(r"<[a-zA-Z]", dom))
            print(f"load {fragment or '(as opened)'}: {wall - startup:.1f} s beyond Chromium's start-up "
                  f"({wall:.1f} s in all, start-up {startup:.1f} s); DOM {len(dom) / 1e6:.1f} MB, {elements} elements")
            return dom

        dom = load("")
        chips = len(re.findall(r'<span class="chip ', dom))
        check(f"{cells} of {cells} cells shown" in dom, f'"{cells} of {cells} cells shown"')
        check(0 < chips <= 5000, f"the first rows only are built ({chips} chips)")
        check(re.search(r"\d+ more rows load as you scroll\.", dom) is not None, '"N more rows load as you scroll."')

        linked = load("#cell=" + last)
        check(f'data-id="{last}"' in linked and f"{last}</h2>" in linked,
              f"#cell={last}: its row is built and its details shown")

        wide = load("#rows=model&cols=arch")
        buttons = re.findall(r'<button class="more" type="button" data-more="60">\+(\d+) more</button>', wide)
        check(bool(buttons), f'#rows=model&cols=arch: 60 chips and a "+N more" button per table cell '
                             f"({len(buttons)} buttons)")
    print("all checks passed" if not failures else f"{len(failures)} checks FAILED")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
