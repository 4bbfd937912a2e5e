"""Run pytest-mla inside an engine's own virtual environment (helpers for the engine tests)."""

from __future__ import annotations

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
