"""Cost of result files and reports as the cell count grows.

    .venv/bin/python benchmarks/report.py [--sizes 1000,10000,100000]
    .venv/bin/python benchmarks/report.py --cli 1000000      # pytest-mla render, md and html
    .venv/bin/python benchmarks/report.py --merge 16x10000   # pytest-mla merge of 16 shards

Each size builds a synthetic result document with many models and backends
(accepted, verified, rejected with a handful of messages, a few failures),
writes it as a result file and reads it back (so records share their values,
as they do when read from a file), then times, in this process: writing
(``write``), reading (``read``), Markdown (``md``: the backends view then the
grid; ``grid``: the grid alone), HTML, terminal, a merge of the document
split by arch into two "hosts" and a diff against a copy with planted
regressions.

``--cli N`` writes an N-cell file and runs ``pytest-mla render`` on it as a
user does, once for Markdown, once for HTML, and once for both (``-o x.md -o
x.html``: one read), printing each command's wall time and peak memory
(target for 1,000,000 cells: Markdown and HTML in <= 30 s, <= 2 GB). ``--merge SxN`` writes S shards of N cells each (the cells of
one matrix, dealt round-robin by kernel group as ``--mla-shard`` does) and
runs ``pytest-mla merge`` on them (target for 16x10,000: <= 10 s).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pytest_mla.core.cells import Cell
from pytest_mla.report.diff import diff_documents
from pytest_mla.report.html import render_html
from pytest_mla.report.markdown import render_markdown
from pytest_mla.report.merge import merge_documents
from pytest_mla.report.results import read_results, write_results
from pytest_mla.report.terminal import render_terminal

MESSAGES = [f"backend{i} cannot serve this configuration (reason {i})." for i in range(12)]


def synthetic(n_cells: int, seed: int = 0, host: str = "sm90") -> dict[str, Any]:
    """About ``n_cells`` cells: models × backends × dcp (4) × spec (3) × arch (3) × page size (3)."""
    rng = random.Random(seed)
    dcp, spec, arch = [1, 2, 4, 8], ["none", "eagle-1x3", "eagle-4x3"], ["sm80", "sm90", "sm100"]
    page = [1, 16, 64]
    per_model_backend = len(dcp) * len(spec) * len(arch) * len(page)  # 108
    pairs = max(1, n_cells // per_model_backend)
    n_backends = min(24, max(2, int(pairs ** 0.5)))
    n_models = max(1, pairs // n_backends)
    axes = {"model": [f"model-{i}" for i in range(n_models)], "backend": [f"be{i}" for i in range(n_backends)],
            "dcp": dcp, "spec": spec, "arch": arch, "page_size": page}
    cells = []
    for m, b, d, s, a, p in itertools.product(*axes.values()):
        cell = Cell(m, b, d, s, a, page_size=p)
        r = rng.random()
        reject = MESSAGES[(int(b[2:]) * 3 + len(a)) % len(MESSAGES)] if r < 0.45 else None
        verdict = "fail" if r > 0.998 else "pass"
        kernel = None if reject else ({"status": "verified", "where": a, "seed": 1,
                                       "errors": {"out": {"max_abs_err": rng.random() * 1e-3, "cos_diff": 1e-8}}}
                                      if r > 0.8 else {"status": "not-run", "where": None, "reason": f"needs {a}"})
        cells.append({
            "id": cell.id, "matrix": "bench", "coords": cell.coords,
            "expectation": {"kind": "reject" if reject else "accept", "error": "ValueError" if reject else None,
                            "message": reject, "match": None, "xfail": None, "rule": 1 if reject else None,
                            "rule_line": 9 if reject else None},
            "outcome": ({"kind": "rejected", "error": "ValueError", "message": reject} if reject
                        else {"kind": "accepted", "error": None, "message": None}),
            "verdict": verdict, "reason": "expected accept, but ..." if verdict == "fail" else None,
            "kernel": kernel, "nodeid": f"matrix/bench.toml::{cell.name}"})
    run = {"matrix": "bench", "matrix_file": "matrix/bench.toml", "title": "bench",
           "engine": {"name": "synthetic", "version": "1.0"}, "host": {"arch": host, "hostname": "h"},
           "axes": axes, "cells_total": len(cells), "kernel_dtype": "bf16", "seed": 0,
           "complete": True, "interrupted": False, "cells_reported": len(cells)}
    return {"schema": "pytest-mla/result", "schema_version": 2, "run": run, "cells": cells}


def timed(fn) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def in_process(sizes: list[int]) -> None:
    print(f"{'cells':>8} {'write':>6} {'read':>6} {'md':>6} {'grid':>6} {'html':>6} {'term':>6} {'merge':>6} "
          f"{'diff':>6}   (seconds)   B/cell  html MB")
    for size in sizes:
        built = synthetic(size)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "r.json"
            t_write, _ = timed(lambda: write_results(path, built["run"], built["cells"]))
            per_cell = path.stat().st_size / len(built["cells"])
            del built
            t_read, doc = timed(lambda: read_results(path))
        t_md, _ = timed(lambda: render_markdown(doc))
        t_grid, _ = timed(lambda: render_markdown(doc, view="grid"))
        t_html, page = timed(lambda: render_html(doc))
        t_term, _ = timed(lambda: render_terminal(doc))
        a = {**doc, "cells": [c for c in doc["cells"] if c["coords"]["arch"] != "sm100"]}
        b = {**doc, "run": {**doc["run"], "host": {"arch": "sm100", "hostname": "b"}},
             "cells": [c for c in doc["cells"] if c["coords"]["arch"] == "sm100"]}
        t_merge, _ = timed(lambda: merge_documents([a, b]))
        new = {**doc, "cells": [dict(c) for c in doc["cells"]]}
        for c in new["cells"][::97]:
            c["verdict"] = "error"
        t_diff, _ = timed(lambda: diff_documents(doc, new))
        print(f"{len(doc['cells']):>8} {t_write:6.2f} {t_read:6.2f} {t_md:6.2f} {t_grid:6.2f} {t_html:6.2f} "
              f"{t_term:6.2f} {t_merge:6.2f} {t_diff:6.2f}   {' ' * 11}{per_cell:6.0f}  {len(page.encode()) / 1e6:6.1f}")


PEAK = Path(__file__).resolve().parent / "peak.py"


def cpu_of_children() -> float:
    """User + system CPU seconds of the children waited for so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_measured(argv: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in MB, stderr tail) of one ``python -m MODULE ...`` command;
    ``run_measured.cpu_s``: its CPU seconds (user + system: less swayed by a loaded machine).

    The peak is the command's own (``peak.py``: ``VmHWM`` at its exit), not ``ru_maxrss`` from
    ``wait4``, which starts from this process's own peak (the synthetic documents it built)."""
    python, dash_m, module, *args = argv
    assert dash_m == "-m", argv
    with tempfile.NamedTemporaryFile(prefix="pytest-mla-peak-", suffix=".txt", delete=False) as peak_file:
        peak_path = Path(peak_file.name)
    try:
        start, cpu = time.perf_counter(), cpu_of_children()
        proc = subprocess.run([python, str(PEAK), str(peak_path), module, *args], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - start
        run_measured.cpu_s = cpu_of_children() - cpu  # type: ignore[attr-defined]
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr[-500:]}")
        peak_kb = int(peak_path.read_text() or 0)
    finally:
        peak_path.unlink(missing_ok=True)
    return wall, peak_kb / 1024, proc.stderr.strip()[-200:]


def render_cli(size: int) -> dict[str, Any]:
    """Write a ``size``-cell result file; time ``pytest-mla render`` to Markdown and to HTML."""
    cli_cmd = [sys.executable, "-m", "pytest_mla.cli"]
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.json"
        doc = synthetic(size)
        out["write_s"], _ = timed(lambda: write_results(path, doc["run"], doc["cells"]))
        out["cells"] = n = len(doc["cells"])
        del doc
        out["json_mb"] = path.stat().st_size / 1e6
        out["bytes_per_cell"] = path.stat().st_size / n
        for fmt in ("md", "html"):
            page = Path(tmp) / f"big.{fmt}"
            wall, rss, _ = run_measured(cli_cmd + ["render", str(path), "-o", str(page)])
            out[f"{fmt}_s"], out[f"{fmt}_rss_mb"], out[f"{fmt}_mb"] = wall, rss, page.stat().st_size / 1e6
            out[f"{fmt}_cpu_s"] = run_measured.cpu_s  # type: ignore[attr-defined]
        wall, rss, _ = run_measured(cli_cmd + ["render", str(path), "-o", str(Path(tmp) / "both.md"),
                                               "-o", str(Path(tmp) / "both.html")])
        out["both_s"], out["both_rss_mb"], out["both_cpu_s"] = wall, rss, run_measured.cpu_s  # type: ignore[attr-defined]
    return out


def cli(size: int) -> None:
    r = render_cli(size)
    print(f"{r['cells']} cells: result file {r['json_mb']:.1f} MB ({r['bytes_per_cell']:.0f} B/cell), "
          f"written in {r['write_s']:.1f} s")
    for fmt in ("md", "html"):
        print(f"pytest-mla render -o big.{fmt}: {r[fmt + '_s']:6.1f} s ({r[fmt + '_cpu_s']:.1f} s CPU), "
              f"peak {r[fmt + '_rss_mb']:6.0f} MB, {r[fmt + '_mb']:.1f} MB written")
    print(f"pytest-mla render -o big.md -o big.html: {r['both_s']:6.1f} s ({r['both_cpu_s']:.1f} s CPU), "
          f"peak {r['both_rss_mb']:6.0f} MB")
    print(f"md + html: {r['md_s'] + r['html_s']:.1f} s in two commands, {r['both_s']:.1f} s in one "
          f"(target <= 30 s, <= 2048 MB)")


def merge_cli(shards: int, per_shard: int) -> dict[str, Any]:
    """Write ``shards`` result files of about ``per_shard`` cells; time ``pytest-mla merge`` of them."""
    cli_cmd = [sys.executable, "-m", "pytest_mla.cli"]
    doc = synthetic(shards * per_shard)
    groups: dict[str, int] = {}
    parts: list[list[dict[str, Any]]] = [[] for _ in range(shards)]
    for c in doc["cells"]:  # cells that differ only by arch share a shard, as --mla-shard deals them
        key = "/".join(str(v) for k, v in c["coords"].items() if k != "arch")
        parts[groups.setdefault(key, len(groups)) % shards].append(c)
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i, cells in enumerate(parts):
            run = {**doc["run"], "host": {"arch": "sm90", "hostname": f"host-{i}"}, "cells_reported": len(cells)}
            files.append(str(write_results(Path(tmp) / f"shard-{i}.json", run, cells)))
        out = Path(tmp) / "merged.json"
        wall, rss, _ = run_measured(cli_cmd + ["merge", *files, "-o", str(out)])
    return {"shards": shards, "per_shard": len(parts[0]), "cells": len(doc["cells"]), "merge_s": wall, "rss_mb": rss,
            "merge_cpu_s": run_measured.cpu_s}  # type: ignore[attr-defined]


def merge(shards: int, per_shard: int) -> None:
    r = merge_cli(shards, per_shard)
    print(f"pytest-mla merge of {r['shards']} shards x {r['per_shard']} cells ({r['cells']} cells): "
          f"{r['merge_s']:.1f} s ({r['merge_cpu_s']:.1f} s CPU), peak {r['rss_mb']:.0f} MB (target <= 10 s for 16 x 10,000)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--cli", type=int, metavar="N", help="time `pytest-mla render` on an N-cell file")
    parser.add_argument("--merge", metavar="SxN", help="time `pytest-mla merge` of S shards of N cells")
    args = parser.parse_args()
    print(f"(load average {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs)")
    if args.cli:
        cli(args.cli)
    elif args.merge:
        shards, per_shard = (int(x) for x in args.merge.lower().split("x"))
        merge(shards, per_shard)
    else:
        in_process([int(s) for s in args.sizes.split(",")])


if __name__ == "__main__":
    main()
