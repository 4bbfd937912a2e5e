"""The result document of one matrix: its cells in matrix order and the run's metadata.

``build_document`` is a pure function of what the controller gathered
(records by node id, user-test outcomes, the engine's facts, the session's
settings); ``versions`` and ``git_commit`` read the environment once. The
document is what ``results.write_results`` writes and every renderer reads.
"""

from __future__ import annotations

import datetime as _dt
import platform
import subprocess
from collections import Counter
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Mapping

from .. import __version__
from ..core.matrix import Matrix
from ..core.records import CellRecord, kernel_of
from ..core.verdicts import VERDICTS

__all__ = ["build_document", "git_commit", "now", "versions"]


def build_document(matrix: Matrix, records: Iterable[CellRecord], *, engine: Mapping[str, Any],
                   user_tests: Mapping[tuple[str, str], Mapping[str, str]], host: Mapping[str, Any],
                   environment: Mapping[str, Any], interrupted: bool) -> dict[str, Any]:
    """``{"run": ..., "cells": [...]}`` for ``matrix``.

    ``records``: finished records of any matrix (those of others are left
    out); ``engine``: name, version, described_versions, metadata,
    unavailable; ``environment``: versions, git_commit, started, finished,
    seed, dcp_mode, args.
    """
    by_id = {r["id"]: r for r in records if r.get("matrix") == matrix.name}
    cells: list[CellRecord] = []
    for cell in matrix.cells():
        record = by_id.get(cell.id)
        if record is None:
            continue
        user = user_tests.get((matrix.name, cell.id))
        cells.append(CellRecord(record, user_tests=dict(sorted(user.items()))) if user else record)
    counts = Counter(r["verdict"] for r in cells)
    wheres = sorted({kernel_of(r).get("where") for r in cells} - {None})
    run = {
        "matrix": matrix.name,
        "matrix_file": matrix.path,
        "title": matrix.title,
        "engine": dict(engine),
        "host": dict(host),
        "versions": environment["versions"],
        "triton_mode": wheres[0] if len(wheres) == 1 else (wheres or None),
        "git_commit": environment["git_commit"],
        "started": environment["started"],
        "finished": environment["finished"],
        "seed": environment["seed"] if environment["seed"] is not None else matrix.seed,
        "kernel_dtype": matrix.kernel_dtype,
        "dcp_mode": environment["dcp_mode"],
        "args": list(environment["args"]),
        "complete": not interrupted and len(cells) == matrix.size,
        "interrupted": interrupted,
        "cells_total": matrix.size,
        "cells_reported": len(cells),
        "counts": {v: counts.get(v, 0) for v in VERDICTS},
        "axes": {k: list(v) for k, v in matrix.axes.items()},
        "probes": {k: list(v) for k, v in matrix.probes.items()},
        "models": {name: matrix.models[name].as_dict() for name in matrix.axes["model"]},
    }
    return {"run": run, "cells": cells}


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version(), "pytest_mla": __version__}
    for dist in ("pytest", "pytest-xdist", "torch", "triton", "packaging"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def git_commit(root: Path) -> str | None:
    try:
        res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() or None if res.returncode == 0 else None
