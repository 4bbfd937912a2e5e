"""Run a generated reproducer in other Python environments (``pytest-mla repro --engines``).

Each environment is a virtual environment folder (its ``bin/python``) or a
Python executable. The script runs there isolated (``python -I``: no
``PYTHONPATH``, no user site, not its own folder on the path) in a scratch
folder, and reports its outcome on its last line (``PYTEST_MLA_REPRO
{json}``): reproduced (exit 1), fixed (exit 0), or could not build the
engine's objects (exit 2). A run that prints no such line (no torch, no
engine, a crash, a timeout) is ``could not run``, with the last line it
printed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

__all__ = ["EngineRun", "RESULT_TAG", "discover", "python_of", "run_script"]

RESULT_TAG = "PYTEST_MLA_REPRO"


@dataclasses.dataclass(frozen=True)
class EngineRun:
    """One run of a reproducer in one environment."""

    environment: str  # as given to --engines
    python: str
    status: str  # "reproduced", "fixed", "cannot-build", "could not run"
    exit_code: int | None
    seconds: float
    version: str | None = None  # the engine's version the script found there
    engine: str | None = None  # the engine's name, as the script reports it
    error: str | None = None  # the exception's class name, or "mismatch"
    message: str | None = None
    frames: tuple[str, ...] = ()
    same: bool | None = None  # the error the matrix run saw (type and innermost engine function)

    @property
    def reproduces(self) -> bool:
        return self.status == "reproduced"

    def summary(self) -> str:
        """``sglang 0.5.22 (.venv-sglang-0.5.22): reproduced, AssertionError, exit 1, 17.3 s``."""
        name = {"sglang": "SGLang", "vllm": "vLLM"}.get(self.engine or "", self.engine or "")
        where = f"{name + ' ' if name else ''}{self.version or 'unknown version'} ({self.environment})"
        if self.status == "reproduced":
            what = "reproduced" + (f", {self.error}" if self.error else "")
            if self.same is False:
                what += " (not the error the matrix run saw)"
        elif self.status == "fixed":
            what = "does not reproduce: the engine computed the cell within tolerance"
        elif self.status == "cannot-build":
            what = f"could not build the engine's objects: {self.message}"
        else:
            what = f"could not run: {self.message}"
        code = f", exit {self.exit_code}" if self.exit_code is not None else ""
        return f"{where}: {what}{code}, {self.seconds:.1f} s"


def discover(engine: str, folder: str | os.PathLike[str] = ".") -> list[str]:
    """``--engines auto``: the engine's environments as ``make conformance`` lays them out in ``folder``
    (``.venv-ENGINE``, ``.venv-ENGINE-VERSION``), each with a ``bin/python``, in name order."""
    root = Path(folder)
    found = [p for p in sorted(root.glob(f".venv-{engine}*"))
             if (p.name == f".venv-{engine}" or p.name.startswith(f".venv-{engine}-")) and (p / "bin" / "python").exists()]
    return [os.fspath(p) if os.fspath(folder) != "." else p.name for p in found]


def python_of(environment: str) -> Path:
    """The interpreter of a virtual environment folder, or the executable itself; ValueError when neither."""
    path = Path(os.path.abspath(environment))  # absolute, symlinks kept: a venv's python is a link to its base
    if path.is_dir():
        for candidate in (path / "bin" / "python", path / "Scripts" / "python.exe"):
            if candidate.exists():
                return candidate
        raise ValueError(f"{environment}: a folder without bin/python (not a virtual environment)")
    if path.is_file() and os.access(path, os.X_OK):
        return path
    raise ValueError(f"{environment}: neither a virtual environment folder nor a Python executable")


def run_script(script: str | os.PathLike[str], environment: str, *, timeout_s: float = 600.0,
               extra_env: dict[str, str] | None = None) -> EngineRun:
    """Run ``script`` with the environment's Python, isolated, in a scratch folder; parse its outcome."""
    python = python_of(environment)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYTEST"))}
    env.update(extra_env or {})
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mla-repro-run-") as cwd:
        try:
            proc = subprocess.run([os.fspath(python), "-I", os.fspath(Path(script).resolve())], cwd=cwd, env=env,
                                  capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return EngineRun(environment, os.fspath(python), "could not run", None, time.perf_counter() - start,
                             message=f"no outcome within {timeout_s:g} s")
    seconds = time.perf_counter() - start
    result = parse_outcome(proc.stdout)
    if result is None:
        tail = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
        return EngineRun(environment, os.fspath(python), "could not run", proc.returncode, seconds,
                         message=tail[-1].strip() if tail else f"exit {proc.returncode}, no output")
    return EngineRun(environment, os.fspath(python), str(result.get("status")), proc.returncode, seconds,
                     version=result.get("version"), engine=result.get("engine"), error=result.get("error"),
                     message=result.get("message"),
                     frames=tuple(result.get("frames") or ()), same=result.get("same"))


def parse_outcome(stdout: str) -> dict[str, Any] | None:
    """The JSON of the script's ``PYTEST_MLA_REPRO`` line (its last), or None."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_TAG + " "):
            try:
                value = json.loads(line[len(RESULT_TAG) + 1:])
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


def run_all(script: str | os.PathLike[str], environments: Sequence[str], *, timeout_s: float = 600.0,
            echo: bool = True) -> list[EngineRun]:
    runs = []
    for environment in environments:
        run = run_script(script, environment, timeout_s=timeout_s)
        if echo:
            print(f"pytest-mla repro: {run.summary()}", file=sys.stderr)
        runs.append(run)
    return runs
