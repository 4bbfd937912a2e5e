"""The result document of one matrix: its cells in matrix order and the run's metadata.

``run_head`` (facts known before the first cell, written at the top of the
result file as the run starts), ``run_end`` (counts, completeness) and
``build_document`` are pure functions of what the controller gathered;
``versions``, ``git_commit`` and ``now`` read the environment. The document
is what ``results.write_results`` writes and every renderer reads.
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

__all__ = ["build_document", "run_head", "run_end", "git_commit", "now", "versions"]


def run_head(matrix: Matrix, *, engine: Mapping[str, Any], host: Mapping[str, Any],
             environment: Mapping[str, Any], cells_selected: int | None = None) -> dict[str, Any]:
    """The run facts known before the first cell: what ran where, and the matrix.

    ``engine``: name, version, described_versions, metadata, unavailable;
    ``environment``: versions, seed, dcp_mode, tier, sample (quick tier). Nothing here changes between
    two runs of the same inputs (timestamps, the commit and the command line
    are kept in the run-facts side file).
    """
    run = {
        "matrix": matrix.name,
        "matrix_file": matrix.path,
        "title": matrix.title,
        "engine": dict(engine),
        "host": dict(host),
        "versions": environment["versions"],
        "seed": environment["seed"] if environment["seed"] is not None else matrix.seed,
        "kernel_dtype": matrix.kernel_dtype,
        "dcp_mode": environment["dcp_mode"],
        "tier": environment.get("tier") or "full",
        "cells_total": matrix.size,
        "axes": {k: list(v) for k, v in matrix.axes.items()},
        "probes": {k: list(v) for k, v in matrix.probes.items()},
        "models": {name: matrix.models[name].as_dict() for name in matrix.axes["model"]},
    }
    if cells_selected is not None:
        run["cells_selected"] = cells_selected
    if environment.get("sample") is not None:  # the quick tier's covering sample, named cell by cell
        run["sample"] = {"rule": SAMPLE_RULE, "cells": sorted(environment["sample"])}
    return run


#: What a quick run's sample is, in the words a report shows.
SAMPLE_RULE = ("numeric checks on a covering sample: every backend in every feature column (arch, spec kind, DCP, "
               "DCP + spec, KV dtype, page size) of every model family (dense MLA, sparse MLA, GQA) at least once, "
               "among the cells the matrix expects accepted; every cell validated")


def run_end(matrix: Matrix, cells: list[CellRecord], *, interrupted: bool) -> dict[str, Any]:
    """The run facts known when it ends."""
    counts = Counter(r["verdict"] for r in cells)
    wheres = sorted({kernel_of(r).get("where") for r in cells} - {None})
    return {
        "triton_mode": wheres[0] if len(wheres) == 1 else (wheres or None),
        "complete": not interrupted and len(cells) == matrix.size,
        "interrupted": interrupted,
        "cells_reported": len(cells),
        "counts": {v: counts.get(v, 0) for v in VERDICTS},
    }


def matrix_cells(matrix: Matrix, records: Iterable[CellRecord],
                 user_tests: Mapping[tuple[str, str], Mapping[str, str]]) -> list[CellRecord]:
    """The finished records of ``matrix`` (those of others are left out), in matrix order, with
    their user-test outcomes."""
    by_id = {r["id"]: r for r in records if r.get("matrix") == matrix.name}
    cells: list[CellRecord] = []
    for cell_id in matrix.cell_ids():
        record = by_id.get(cell_id)
        if record is None:
            continue
        user = user_tests.get((matrix.name, cell_id)) if user_tests else None
        cells.append(CellRecord(record, user_tests=dict(sorted(user.items()))) if user else record)
    return cells


def build_document(matrix: Matrix, records: Iterable[CellRecord], *, head: Mapping[str, Any],
                   user_tests: Mapping[tuple[str, str], Mapping[str, str]], interrupted: bool) -> dict[str, Any]:
    """``{"run": ..., "cells": [...]}`` for ``matrix``: ``head`` (``run_head``) and ``run_end`` of its cells."""
    cells = matrix_cells(matrix, records, user_tests)
    return {"run": {**head, **run_end(matrix, cells, interrupted=interrupted)}, "cells": cells}


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
