"""The controller side: gathers cell records from reports and writes the result files.

Registered only with ``--mla-matrix`` and only in the controlling process
(never on an xdist worker). Workers put each cell's record on its test report
(``report.mla_cell``, plain values); this plugin reads them in
``pytest_runtest_logreport``. A report without a record for a cell — a
crashed worker, a harness bug — still becomes that cell's ``error`` record,
recovered from its node id.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shutil
import subprocess
import tempfile
from collections import Counter
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from . import __version__
from .collect import RECORD_ATTR
from .user_cells import USER_RECORD_ATTR
from .core.cells import Cell, CellIdError, nodeid_name
from .core.errors import MatrixError
from .core.verdicts import ERROR, FAIL, VERDICTS, VERIFIED
from .host import probe_host
from .report.results import write_results, write_text_atomic
from .runner import KERNEL_CACHE_INPUT, MatrixRun, crash_record


class ResultCollector:
    def __init__(self, config: pytest.Config, run: MatrixRun) -> None:
        self.config = config
        self.run = run
        self.records: dict[str, dict[str, Any]] = {}  # node id → record
        self.started = _now()
        self.written: list[Path] = []
        self.interrupted = False
        self.collection_errors: list[str] = []
        self.documents: dict[Path, dict[str, Any]] = {}  # built once in sessionfinish, reused by the summary
        self.regressions: list[tuple[str, Any]] = []  # (matrix, Change) against --mla-baseline
        self.kernel_cache: str | None = None  # shared by xdist workers, made on first use
        self.user_tests: dict[tuple[str, str], dict[str, str]] = {}  # (matrix, cell id) → {test: outcome}

    # -- xdist -----------------------------------------------------------------------
    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """Hand every xdist worker the folder where kernel results are shared."""
        if self.kernel_cache is None:
            self.kernel_cache = tempfile.mkdtemp(prefix="pytest-mla-kernels-")
        node.workerinput[KERNEL_CACHE_INPUT] = self.kernel_cache

    def pytest_unconfigure(self) -> None:
        if self.kernel_cache is not None:
            shutil.rmtree(self.kernel_cache, ignore_errors=True)

    # -- events ----------------------------------------------------------------------
    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        user = getattr(report, USER_RECORD_ATTR, None)
        if user is not None:
            self.user_tests.setdefault((user["matrix"], user["cell"]), {})[user["test"]] = user["outcome"]
            return
        record = getattr(report, RECORD_ATTR, None)
        if record is not None:
            self.records[report.nodeid] = {**record, "nodeid": report.nodeid}
            return
        if report.failed and report.nodeid not in self.records:
            recovered = self.recover(report.nodeid, _longrepr_line(report))
            if recovered is not None:
                self.records[report.nodeid] = recovered

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.collection_errors.append(str(report.longrepr))

    def pytest_keyboard_interrupt(self) -> None:
        self.interrupted = True

    def recover(self, nodeid: str, message: str) -> dict[str, Any] | None:
        """The error record of a cell known only by its node id (e.g. its worker crashed)."""
        try:
            path, name = nodeid_name(nodeid)
        except CellIdError:
            return None
        file = (self.config.rootpath / path).resolve()
        if file not in {f.resolve() for f in self.run.files}:
            return None
        try:
            loaded = self.run.load(file)
            cell = Cell.from_name(name, loaded.matrix.axes)
        except (MatrixError, CellIdError):
            return None
        version = loaded.engine.version if loaded.engine is not None else None
        expect = loaded.matrix.expectation(cell, version)
        return {**crash_record(loaded.matrix, cell, expect, message), "nodeid": nodeid}

    # -- writing ---------------------------------------------------------------------
    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if exitstatus == pytest.ExitCode.INTERRUPTED:
            self.interrupted = True
        report_dir = self.run.settings.report_dir
        if not report_dir:
            return
        out = Path(report_dir)
        if not out.is_absolute():
            out = self.config.rootpath / out
        for file in self.run.files:
            try:
                loaded = self.run.load(file)
            except MatrixError:
                continue  # already reported as a collection error
            document = self.documents[file] = self.document(loaded)
            if not document["cells"] and not self.records:
                continue
            engine = document["run"]["engine"]
            stem = out / self.run.settings.report_name.format(
                matrix=loaded.matrix.name, engine=engine["name"], version=engine["version"] or "unavailable")
            self.written.append(write_results(_with_ext(stem, "json"), document["run"], document["cells"]))
            self.written += render_files(document, stem, self.run.settings.formats)
            self.gate(session, document)

    def gate(self, session: pytest.Session, document: dict[str, Any]) -> None:
        """``--mla-baseline``: regressions fail the session; both go to GitHub's step summary."""
        from .report.baseline import append_step_summary, check_baseline
        from .report.markdown import render_markdown

        summary = render_markdown(document)
        old = self.run.baseline
        if old is not None and old["run"].get("matrix") == document["run"]["matrix"]:
            regressions, diff_md = check_baseline(old, document, old_name=os.fspath(self.run.settings.baseline))
            self.regressions += [(document["run"]["matrix"], c) for c in regressions]
            summary += "\n" + diff_md
            if regressions and session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
        append_step_summary(summary)

    def document(self, loaded: Any) -> dict[str, Any]:
        matrix = loaded.matrix
        by_id = {r["id"]: r for r in self.records.values() if r.get("matrix") == matrix.name}
        cells = [by_id[c.id] for c in matrix.cells() if c.id in by_id]
        for i, record in enumerate(cells):
            user = self.user_tests.get((matrix.name, record["id"]))
            if user:
                cells[i] = {**record, "user_tests": dict(sorted(user.items()))}
        engine = loaded.engine
        counts = Counter(r["verdict"] for r in cells)
        host = probe_host()
        wheres = sorted({(r.get("kernel") or {}).get("where") for r in cells} - {None})
        run = {
            "matrix": matrix.name,
            "matrix_file": matrix.path,
            "title": matrix.title,
            "engine": {
                "name": matrix.engine_name,
                "version": str(engine.version) if engine is not None else None,
                "described_versions": str(matrix.engine_versions) if matrix.engine_versions else "*",
                "metadata": dict(engine.metadata()) if engine is not None and hasattr(engine, "metadata") else {},
                "unavailable": loaded.skip_reason,
            },
            "host": host,
            "versions": _versions(),
            "triton_mode": wheres[0] if len(wheres) == 1 else (wheres or None),
            "git_commit": _git_commit(self.config.rootpath),
            "started": self.started,
            "finished": _now(),
            "seed": self.run.settings.seed if self.run.settings.seed is not None else matrix.seed,
            "kernel_dtype": matrix.kernel_dtype,
            "dcp_mode": self.run.settings.dcp_mode,
            "args": list(self.config.invocation_params.args),
            "complete": not self.interrupted and len(cells) == matrix.size,
            "interrupted": self.interrupted,
            "cells_total": matrix.size,
            "cells_reported": len(cells),
            "counts": {v: counts.get(v, 0) for v in VERDICTS},
            "axes": {k: list(v) for k, v in matrix.axes.items()},
        }
        return {"run": run, "cells": cells}

    # -- terminal --------------------------------------------------------------------
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        if not self.records:
            return
        verbosity = self.config.get_verbosity()
        tr.write_sep("=", "mla matrix")
        counts = Counter(r["verdict"] for r in self.records.values())
        kernels = Counter((r.get("kernel") or {}).get("status") for r in self.records.values())
        parts = [f"{counts[v]} {v}" for v in VERDICTS if counts.get(v)]
        tr.write_line(f"{len(self.records)} cells: " + ", ".join(parts))
        if kernels.get(VERIFIED) or kernels.get("failed"):
            reused = sum(1 for r in self.records.values() if (r.get("kernel") or {}).get("reused"))
            tr.write_line(f"kernels: {kernels.get(VERIFIED, 0)} verified ({reused} reused), "
                          f"{kernels.get('failed', 0)} failed, {kernels.get('not-run', 0)} not run")
            worst = worst_kernel_errors(self.records.values())
            if worst:
                tr.write_line("  worst of the verified: " + worst)
        bad = [r for r in self.records.values() if r["verdict"] in (FAIL, ERROR)]
        limit = None if verbosity > 0 else 20
        for r in bad[:limit]:
            first = (r.get("reason") or "").splitlines()[0] if r.get("reason") else ""
            tr.write_line(f"  {r['verdict'].upper():5} {r['id']}: {first}")
        if limit is not None and len(bad) > limit:
            tr.write_line(f"  ... and {len(bad) - limit} more (-v lists all)")
        if verbosity >= 0:
            summary = _matrix_summary(self)
            if summary:
                tr.write_line(summary)
        if self.run.baseline is not None:
            if self.regressions:
                tr.write_line(f"{len(self.regressions)} regression(s) against {self.run.settings.baseline}:", red=True)
                for matrix, change in self.regressions:
                    tr.write_line(f"  REGRESSION {matrix}: {change.id}: {change.old} -> {change.new}"
                                  + (f" ({change.reason})" if change.reason else ""))
            else:
                tr.write_line(f"no regressions against {self.run.settings.baseline}")
        for path in self.written:
            tr.write_line(f"mla report: {_shown(path)}")


def worst_kernel_errors(records: Any) -> str:
    """The largest errors over the verified kernel checks, and the kernel time spent."""
    runs = [r["kernel"] for r in records if (r.get("kernel") or {}).get("status") == VERIFIED]
    out = [k.get("errors", {}).get("out", {}) for k in runs]
    lse = [k.get("errors", {}).get("lse", {}) for k in runs]
    if not out:
        return ""

    def top(rows: list[dict[str, Any]], key: str) -> float:
        return max((float(r[key]) for r in rows if isinstance(r.get(key), (int, float))), default=0.0)

    spent = sum(float(k.get("time_s") or 0) for k in runs if not k.get("reused"))
    # (max_rel_err alone misleads: near-zero elements pass by the absolute bound.)
    return (f"out max abs {top(out, 'max_abs_err'):.2e}, outside abs-or-rel {top(out, 'fail_frac'):.0%}, "
            f"cos diff {top(out, 'cos_diff'):.2e}; lse max abs {top(lse, 'max_abs_err'):.2e}; "
            f"kernel time {spent:.1f} s")


def render_files(document: dict[str, Any], stem: Path, formats: tuple[str, ...]) -> list[Path]:
    """Markdown and HTML next to the JSON, from the same document."""
    written = []
    if "md" in formats:
        from .report.markdown import render_markdown

        written.append(write_text_atomic(_with_ext(stem, "md"), render_markdown(document)))
    if "html" in formats:
        from .report.html import render_html

        written.append(write_text_atomic(_with_ext(stem, "html"), render_html(document)))
    return written


def _with_ext(stem: Path, ext: str) -> Path:
    """``stem.ext`` even when the stem has dots of its own (``sglang-0.5.23``)."""
    return stem.parent / f"{stem.name}.{ext}"


def _matrix_summary(collector: ResultCollector) -> str:
    from .report.terminal import render_terminal

    texts = []
    for file in collector.run.files:
        doc = collector.documents.get(file)
        if doc is None:  # no report files written (--mla-report-dir=none)
            try:
                doc = collector.document(collector.run.load(file))
            except MatrixError:
                continue
        if doc["cells"]:
            texts.append(render_terminal(doc))
    return "\n".join(texts)


def _longrepr_line(report: pytest.TestReport) -> str:
    text = str(report.longrepr or "").strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    crash = next((ln for ln in lines if "crashed" in ln), None)
    return crash or (lines[-1] if lines else f"no result for this cell ({report.when})")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _shown(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return os.fspath(path)


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version(), "pytest_mla": __version__}
    for dist in ("pytest", "pytest-xdist", "torch", "triton", "packaging"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _git_commit(root: Path) -> str | None:
    try:
        res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() or None if res.returncode == 0 else None

