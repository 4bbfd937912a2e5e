"""Per-case times of a matrix run's kernel checks, from its JSON report (numbers, not a test).

    python benchmarks/engine_checks.py reports/sglang-0.5.23.json [more.json ...]

Prints one row per numeric check that ran (results reused by other cells are
counted once): model, spec, DCP, KV dtype, query heads of the DCP group,
status and seconds; then the total per file. Run the matrix with
``--mla-kernel=auto`` first (``pytest --mla-matrix=matrix/sglang.toml
--mla-kernel=auto --mla-report-dir=DIR``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_mla.report.results import read_results  # noqa: E402


def rows_of(report: dict) -> list[tuple]:
    rows = []
    for cell in report["cells"]:
        kernel = cell.get("kernel") or {}
        if kernel.get("status") not in ("verified", "failed") or kernel.get("reused"):
            continue
        coords, case = cell["coords"], kernel.get("case") or {}
        seconds = kernel.get("time_s") if kernel.get("time_s") is not None else cell.get("duration_s")
        rows.append((coords["model"], coords["spec"], coords["dcp"], coords.get("kv_dtype", "auto"),
                     case.get("h_q"), kernel["status"] + (" (finding)" if kernel.get("finding") else ""),
                     round(float(seconds or 0.0), 2)))
    return sorted(rows)


def main(paths: list[str]) -> int:
    for path in paths:
        report = read_results(path)
        rows = rows_of(report)
        engine = report.get("engine") or {}
        print(f"# {path}: {engine.get('name', '?')} {engine.get('version', '')}")
        print(f"{'model':18} {'spec':10} {'dcp':>3} {'kv':9} {'h_q':>4} {'status':20} {'s':>7}")
        for model, spec, dcp, kv, h_q, status, seconds in rows:
            print(f"{model:18} {spec:10} {dcp:>3} {kv:9} {h_q!s:>4} {status:20} {seconds:7.2f}")
        print(f"{len(rows)} checks, {sum(r[-1] for r in rows):.1f} s\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
