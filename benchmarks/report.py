"""Render times of the report for synthetic result documents of 1k, 10k and 100k cells.

    .venv/bin/python benchmarks/report.py [--sizes 1000,10000,100000]

Each size builds a document with many models and backends (accepted,
verified, rejected with a handful of messages, a few failures), then times
Markdown (``md``: what a run writes, the backends view then the grid;
``grid``: the grid alone, what ``md`` was before the backends view), HTML,
terminal, a merge of the document split by arch into two "hosts", and a
diff against a copy with planted regressions.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import random
import time
from typing import Any

from pytest_mla.core.cells import Cell
from pytest_mla.report.diff import diff_documents
from pytest_mla.report.html import render_html
from pytest_mla.report.markdown import render_markdown
from pytest_mla.report.merge import merge_documents
from pytest_mla.report.terminal import render_terminal

MESSAGES = [f"backend{i} cannot serve this configuration (reason {i})." for i in range(12)]


def synthetic(n_cells: int, seed: int = 0) -> dict[str, Any]:
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
        kernel = None if reject else ({"status": "verified", "where": a, "seed": 1, "time_s": 0.01,
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
            "kernel": kernel, "duration_s": 0.001})
    run = {"matrix": "bench", "matrix_file": "matrix/bench.toml", "title": "bench",
           "engine": {"name": "synthetic", "version": "1.0"}, "host": {"arch": "sm90", "hostname": "h"},
           "axes": axes, "cells_total": len(cells), "kernel_dtype": "bf16", "seed": 0}
    return {"schema": "pytest-mla/result", "schema_version": 1, "run": run, "cells": cells}


def timed(fn) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    args = parser.parse_args()
    print(f"{'cells':>8} {'md':>7} {'grid':>7} {'html':>7} {'term':>7} {'merge':>7} {'diff':>7}   (seconds; html MB)")
    for size in (int(s) for s in args.sizes.split(",")):
        doc = synthetic(size)
        t_md, _ = timed(lambda: render_markdown(doc))
        t_grid, _ = timed(lambda: render_markdown(doc, view="grid"))
        t_html, page = timed(lambda: render_html(doc))
        t_term, _ = timed(lambda: render_terminal(doc))
        a = {**doc, "cells": [c for c in doc["cells"] if c["coords"]["arch"] != "sm100"]}
        b = {**doc, "run": {**doc["run"], "host": {"arch": "sm100", "hostname": "b"}},
             "cells": [c for c in doc["cells"] if c["coords"]["arch"] == "sm100"]}
        t_merge, _ = timed(lambda: merge_documents([a, b]))
        new = copy.deepcopy(doc)
        for c in new["cells"][::97]:
            c["verdict"] = "error"
        t_diff, _ = timed(lambda: diff_documents(doc, new))
        print(f"{len(doc['cells']):>8} {t_md:7.2f} {t_grid:7.2f} {t_html:7.2f} {t_term:7.2f} {t_merge:7.2f} {t_diff:7.2f}"
              f"   {len(page.encode()) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
