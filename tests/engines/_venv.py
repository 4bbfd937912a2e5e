"""Run pytest-mla inside an engine's own virtual environment (helpers for the engine tests)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def venv_python(name: str) -> Path:
    """``ROOT/<name>/bin/python``, or skip with the reason when the venv is absent."""
    python = ROOT / name / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{name}/bin/python not found: run tools/conformance.sh --install-only to create {name}")
    return python


def run_matrix(python: Path, matrix: Path, report_dir: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``python -m pytest --mla-matrix=MATRIX`` in that venv, from the repository root."""
    cmd = [
        os.fspath(python), "-m", "pytest", "-p", "no:cacheprovider", "-q", "--no-header",
        "-c", os.fspath(ROOT / "tools" / "engine-pytest.ini"), "--rootdir", os.fspath(ROOT),
        f"--mla-matrix={matrix}", "--mla-kernel=off", f"--mla-report-dir={report_dir}",
        "--mla-report-name={engine}-{version}", *args,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    sys.stdout.write(result.stdout[-4000:])
    return result


def drive_faults(driver: Path, venv: str, *scenarios: str, dcp_mode: str = "in-process",
                 timeout: float = 900) -> dict[str, dict]:
    """Run an engine's fault driver (``tests/engines/*_faults.py``) on ``scenarios`` in ``venv``: each
    ``fault:case`` scenario's JSON row, by scenario (skips without the venv)."""
    import json

    python = venv_python(venv)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    result = subprocess.run([os.fspath(python), os.fspath(driver), *scenarios, "--dcp-mode", dcp_mode],
                            cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return {row["scenario"]: row for row in rows}


@functools.lru_cache(maxsize=None)
def _committed(report: str) -> dict:
    from pytest_mla.report.results import read_results

    return read_results(ROOT / "reports" / f"{report}.json")


def committed_slice(report: str, *select: str) -> tuple[dict, dict[str, dict]]:
    """The document ``reports/REPORT.json`` and those of its cells that ``--mla-select`` arguments pick.

    A test of what an engine release does in a slice of its matrix reads it here instead of running the
    slice again: CI recomputes every committed report and fails on any difference (``.ci/run``), so
    these are the cells a fresh run of the slice gives, at the cost of reading a file (once per
    process; callers only read it). As a green run of the slice would, it asserts that none of them
    failed, errored or passed unexpectedly.
    """
    from pytest_mla.core.verdicts import PASS, SKIP, XFAIL
    from pytest_mla.options import parse_select

    document = _committed(report)
    wanted = parse_select([arg.removeprefix("--mla-select=") for arg in select])
    cells = {c["id"]: c for c in document["cells"]
             if all(c["coords"][axis] in values for axis, values in wanted)}
    assert cells, f"no cell of reports/{report}.json is in {select}"
    broken = {cell_id: c["verdict"] for cell_id, c in cells.items() if c["verdict"] not in (PASS, SKIP, XFAIL)}
    assert not broken, broken
    return document, cells
