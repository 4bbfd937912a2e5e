"""The controller side: gathers cell records from test reports and writes the result files.

Registered only with ``--mla-matrix`` and only in the controlling process
(never on an xdist worker). Workers put each cell's finished record on its
test report (``report.mla_cell``, plain values); this plugin reads them in
``pytest_runtest_logreport``. A report without a record for a cell — a
crashed worker, a harness bug — still becomes that cell's ``error`` record,
recovered from its node id. Building the documents and the summary is
``report/``'s job; this module feeds it and writes.

PYTEST_DONT_REWRITE: its ``assert`` statements raise as plain Python's do, so a message
that reaches a report never changes with pytest's ``-v`` or ``$CI``.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from .collect import RECORD_ATTR
from .core.cells import Cell, CellIdError, nodeid_name
from .core.errors import STEP_FAILURES, MatrixError, describe_failure
from .core.host import probe_host
from .core.plain import json_safe
from .core.records import CellRecord, crash_record
from .engines.protocol import optional_step
from .options import safe_stem_part
from .report import run_document
from .report.output import FolderBusyError, FolderLock, OutputError, check_output, remove_file
from .report.results import (
    ResultStream, run_facts_path, split_run, split_volatile, with_volatile, write_results, write_run_facts,
    write_text_atomic,
)
from .report.summary import build_summary
from .runner import KERNEL_CACHE_INPUT, LoadedMatrix, MatrixRun
from .user_cells import USER_RECORD_ATTR


class ResultCollector:
    def __init__(self, config: pytest.Config, run: MatrixRun) -> None:
        self.config = config
        self.run = run
        self.records: dict[str, CellRecord] = {}  # node id → record
        self._files_by_path: dict[str, Path] = {}  # node id path → matrix file
        self.started = run_document.now()
        self.written: list[Path] = []
        self.interrupted = False
        self.collection_errors: list[str] = []
        self.documents: dict[Path, dict[str, Any]] = {}  # built once in sessionfinish, reused by the summary
        self.models: dict[int, Any] = {}  # id(document) → its ReportModel: the reports and the summary share it
        self.write_failures: list[str] = []  # shown in red by the terminal summary; any fails the session
        self.regressions: list[tuple[str, Any]] = []  # (matrix, Change) against --mla-baseline
        self.kernel_cache: str | None = None  # shared by xdist workers, made on first use
        self.user_tests: dict[tuple[str, str], dict[str, str]] = {}  # (matrix, cell id) → {test: outcome}
        # Writing as the run goes: one stream per matrix file, opened by its first cell.
        self.out = report_folder(config, run.settings.report_dir)
        self.streams: dict[Path, ResultStream | None] = {}  # None: the file could not be opened
        self.heads: dict[Path, dict[str, Any]] = {}  # matrix file → run_head, computed once
        self.selected: dict[Path, int] = {}  # matrix file → its cells in this session (when known)
        # node id → the record's volatile facts: its duration alone (most cells), or a dict of them
        # (a float is not an object the garbage collector must walk; a dict per cell would be)
        self.volatile: dict[str, Any] = {}
        if self.out is not None:
            lock_report_folder(config, self.out)  # held until the session is unconfigured
            self.check_outputs()

    def inputs(self) -> list[Path]:
        """What this run reads that it must never write over: its matrix files and the baseline."""
        found = list(self.run.files)
        if self.run.settings.baseline:
            found.append(Path(self.run.settings.baseline))
        return found

    def outputs(self, json_path: Path) -> list[Path]:
        """Every file written for one matrix: the result file, its run facts, its renderings."""
        stem = json_path.parent / json_path.name[:-len(".json")]
        return [json_path, run_facts_path(json_path)] + [_with_ext(stem, ext) for ext in ("md", "html")
                                                          if ext in self.run.settings.formats]

    def check_outputs(self) -> None:
        """Before the first cell: each file this run will write must be absent or a regular file,
        and none of its inputs (``report.output.check_output``); a usage error naming it otherwise.
        A matrix that does not load is left to collection, which reports it; its files are checked
        again when they are written."""
        inputs = self.inputs()
        for file in self.run.files:
            try:
                path = self.result_path(file, self.run.load(file))
            except Exception:  # noqa: BLE001 - reported at collection, with its cells
                continue
            for output in self.outputs(path):
                try:
                    check_output(output, inputs)
                except OutputError as exc:
                    raise pytest.UsageError(f"--mla-report-dir: {exc}") from None

    # -- xdist -----------------------------------------------------------------------
    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """Hand every xdist worker the folder where kernel results are shared."""
        if self.kernel_cache is None:
            try:
                self.kernel_cache = tempfile.mkdtemp(prefix="pytest-mla-kernels-")
            except OSError:  # no writable temporary folder: each worker checks its own kernels
                self.kernel_cache = ""
        if self.kernel_cache:
            node.workerinput[KERNEL_CACHE_INPUT] = self.kernel_cache

    def pytest_unconfigure(self) -> None:
        if self.kernel_cache:
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
            # The report (pytest keeps every one) holds the record as written from now on: the
            # worker's copy and its values go at once, not after living through the whole session.
            setattr(report, RECORD_ATTR, self.keep(report.nodeid, record))
            return
        if report.failed and report.nodeid not in self.records:
            recovered = self.recover(report.nodeid, _longrepr_line(report))
            if recovered is not None:
                self.keep(report.nodeid, recovered)

    def keep(self, nodeid: str, record: CellRecord) -> CellRecord:
        """Hold a finished record and write it to its matrix's result file now; its volatile
        facts (durations) go to the run-facts side file instead."""
        kept, facts = split_volatile(record)
        kept["nodeid"] = nodeid
        if facts:
            self.volatile[nodeid] = facts["duration_s"] if facts.keys() == {"duration_s"} else facts
        stream = self.stream(nodeid)
        if stream is not None:
            try:
                try:
                    kept = stream.add(kept)
                except (TypeError, ValueError):  # a hook put a set, a path or a NaN in the record
                    kept = stream.add(json_safe(kept))
            except OSError as exc:  # a full disk: keep the cells in memory, write them at the end
                self.drop_stream(stream, exc)
        self.records[nodeid] = kept  # type: ignore[assignment]  # the record as written
        return kept  # type: ignore[return-value]

    def facts(self, nodeid: str) -> dict[str, Any] | None:
        """The volatile facts ``keep`` set aside for a cell's record."""
        if nodeid not in self.volatile:
            return None
        facts = self.volatile[nodeid]
        return facts if isinstance(facts, dict) else {"duration_s": facts}

    def stream(self, nodeid: str) -> ResultStream | None:
        """The open result file of the matrix this node id belongs to (opened by its first cell)."""
        if self.out is None:
            return None
        file = self.file_of(nodeid)
        if file not in self.streams:
            if file not in self.run.files:
                return None
            self.streams[file] = self.open_stream(file)
        return self.streams[file]

    def open_stream(self, file: Path) -> ResultStream | None:
        try:
            loaded = self.run.load(file)
        except MatrixError:
            return None
        path = self.result_path(file, loaded)
        head = self.head(file, loaded)
        try:
            return ResultStream(path, head)
        except OSError as exc:
            reasons = []
            for folder in (None, os.getcwd()):  # the temporary folder, else the folder pytest started in
                try:
                    fd, fallback = tempfile.mkstemp(prefix=f"pytest-mla-{path.stem[:40]}-", suffix=".json",
                                                    dir=folder)
                    os.close(fd)
                    stream = ResultStream(fallback, head, in_place=True)
                except OSError as again:
                    reasons.append(f"{folder or tempfile.gettempdir()}: {again.strerror or again}")
                    continue
                self.write_failures.append(f"cannot write {path}: {exc.strerror or exc}; "
                                           f"the results are in {fallback}")
                stream.fallback = True
                return stream
            self.write_failures.append(f"cannot write {path}: {exc.strerror or exc}; nor anywhere else "
                                       f"({'; '.join(reasons)}): the results are kept for the end")
            return None

    def drop_stream(self, stream: ResultStream, exc: OSError) -> None:
        stream.discard()  # its cells are kept in memory; a full disk gets back what it held
        for file, open_stream in self.streams.items():
            if open_stream is stream:
                self.streams[file] = None
        self.write_failures.append(f"cannot write {stream.path} as the run goes: {exc.strerror or exc}; "
                                   "writing it at the end")

    def result_path(self, file: Path, loaded: LoadedMatrix) -> Path:
        assert self.out is not None
        engine = loaded.engine  # its name and version as engine_info gives them (without asking its metadata)
        name = str(getattr(engine, "name", None) or loaded.matrix.engine_name)
        version = str(engine.version) if engine is not None else None
        stem = self.out / report_stem(self.run.settings.report_name, report_stems(self.run)[file], name,
                                      version or "unavailable")
        return _with_ext(stem, "json")

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """How many cells of each matrix this session runs (the result file says so, so that a
        file cut short can say how many it lost)."""
        self._count_selected(item.nodeid for item in session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        if not self.selected:
            self._count_selected(ids)

    def _count_selected(self, nodeids: Any) -> None:
        counts: dict[str, int] = {}
        for nodeid in nodeids:
            prefix = nodeid.split("::", 1)[0]
            counts[prefix] = counts.get(prefix, 0) + 1
        for prefix, n in counts.items():
            file = self.file_of(prefix + "::")
            if file in self.run.files:
                self.selected[file] = n

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.collection_errors.append(str(report.longrepr))

    def pytest_keyboard_interrupt(self) -> None:
        self.interrupted = True

    def recover(self, nodeid: str, message: str) -> CellRecord | None:
        """The error record of a cell known only by its node id (e.g. its worker crashed)."""
        try:
            path, name = nodeid_name(nodeid)
        except CellIdError:
            return None
        file = self.file_of(nodeid)
        if file not in {f.resolve() for f in self.run.files}:
            return None
        try:
            loaded = self.run.load(file)
            cell = Cell.from_name(name, loaded.matrix.axes)
        except (MatrixError, CellIdError):
            return None
        expect = loaded.matrix.expectation(cell, loaded.rules_version)
        return CellRecord(crash_record(loaded.matrix.name, cell, expect, message), nodeid=nodeid)

    # -- writing ---------------------------------------------------------------------
    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        # Building and rendering the documents makes many short-lived objects and no garbage
        # cycles: the cyclic collector, paused, does not walk the whole session for them.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            self.finish(session, exitstatus)
        finally:
            if was_enabled:
                gc.enable()

    def finish(self, session: pytest.Session, exitstatus: int) -> None:
        if exitstatus == pytest.ExitCode.INTERRUPTED:
            self.interrupted = True
        strict = self.run.settings.strict_coverage
        if strict and (self.uncovered() or self.coverage_unknown()) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        for file in self.run.files:
            try:
                loaded = self.run.load(file)
            except MatrixError:
                continue  # already reported as a collection error
            document = self.documents[file] = self.document(file)
            markdown = None
            stream = self.streams.get(file)
            if self.out is not None and (document["cells"] or self.records or stream is not None):
                markdown = self.write(document, self.result_path(file, loaded), stream)
            self.gate(session, document, markdown)
        if self.write_failures and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED,
                                                        pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = WRITE_FAILED

    def write(self, document: dict[str, Any], path: Path, stream: ResultStream | None) -> str | None:
        """The result files of one matrix. The JSON was streamed to a side file as the cells
        finished; it is closed here and replaces the report, or the report is written again in
        matrix order when the cells came in another order (xdist) or changed since (user-test
        outcomes). If it cannot be written there, the previous report stays as it was, the results
        go to a temporary file (the finished cells are never lost), the summary says where, and the
        session fails. Once the new JSON is in place, its run facts and renderings are written, and
        a rendering of the previous run that is not (not asked for, or failed) is removed."""
        run, cells = document["run"], document["cells"]
        fallback = stream is not None and stream.fallback
        inputs = self.inputs()
        try:
            if stream is not None and _same_records(stream.records, cells):
                self.written.append(stream.finish(split_run(run)[1], inputs))
            else:
                if stream is not None:
                    stream.discard()
                    path = stream.path  # a fallback file stays the fallback
                try:
                    self.written.append(write_results(path, run, cells, inputs))
                except (TypeError, ValueError):  # a value no stream took (an engine's odd metadata)
                    document = json_safe(document)
                    run, cells = document["run"], document["cells"]
                    self.written.append(write_results(path, run, cells, inputs))
        except OSError as exc:
            if stream is not None:
                stream.discard()  # cut short, or whole but not in place: the results go to one file below
            fallback, why = write_fallback(document, path.parent / path.name[:-len(".json")])
            where = f"the results are in {fallback}" if fallback else f"nor anywhere else ({why}): the results are lost"
            self.lost(f"cannot write {path}: {exc.strerror or exc}; {where}")
            return None
        path = self.written[-1]
        if fallback:
            self.written.pop()  # not a report: the summary names it among the failures
            return None
        try:
            self.write_run_facts(path, cells)
        except OSError as exc:
            self.lost(f"cannot write {run_facts_path(path)}: {exc.strerror or exc}")
            self.remove_stale([run_facts_path(path)])
        stem = path.parent / path.name[:-len(".json")] if path.name.endswith(".json") else path
        first = len(self.written)
        try:
            return render_files(document, stem, self.run.settings.formats, self.written, self.model(document),
                                inputs=inputs)
        except OSError as exc:
            self.lost(f"cannot write the reports next to {path}: "
                      f"{exc.strerror or exc} (render them with: pytest-mla render {path})")
            return None
        except Exception as exc:  # a renderer's bug must not take the written results with it
            self.lost(f"cannot render the reports of {path}: "
                      f"{type(exc).__name__}: {exc} (the results are written; render them "
                      f"with: pytest-mla render {path})")
            return None
        finally:  # renderings of the previous run do not stay beside a JSON they do not describe
            self.remove_stale([p for p in (_with_ext(stem, "md"), _with_ext(stem, "docs.md"), _with_ext(stem, "html"))
                               if p not in self.written[first:]])

    def lost(self, text: str) -> None:
        """A file this run was to write is not written: one red line, and the session fails."""
        self.write_failures.append(text)

    def remove_stale(self, paths: list[Path]) -> None:
        """Remove files of the previous run that the new result file does not match."""
        for stale in paths:
            try:
                remove_file(stale)
            except OSError as exc:
                self.lost(f"cannot remove {stale} (it describes the previous run): {exc.strerror or exc}")

    def model(self, document: dict[str, Any]) -> Any:
        """The ``ReportModel`` of one of ``self.documents`` (made once), or a new one of another document."""
        from .report.model import ReportModel

        if not any(d is document for d in self.documents.values()):
            return ReportModel(document)
        if id(document) not in self.models:
            self.models[id(document)] = ReportModel(document)
        return self.models[id(document)]

    def write_run_facts(self, path: Path, cells: list[CellRecord]) -> None:
        """``x.run.json`` beside ``x.json``: the facts that differ on every run (kept out of ``x.json``
        so that a committed report changes only when an outcome does)."""
        facts = json_safe({"started": self.started, "finished": run_document.now(),  # an argv byte: escaped
                           "git_commit": run_document.git_commit(self.config.rootpath),
                           "args": list(self.config.invocation_params.args)})
        per_cell = {c["id"]: self.facts(c["nodeid"]) for c in cells if c.get("nodeid") in self.volatile}
        write_run_facts(run_facts_path(path), path, facts, per_cell)

    def coverage_unknown(self) -> dict[str, str]:
        """Matrix file → why its engine's backends cannot be listed (``--mla-strict-coverage``
        cannot be kept there: it fails rather than pass having checked nothing)."""
        found = {}
        for file in self.run.files:
            try:
                loaded = self.run.load(file)
            except MatrixError:
                continue
            if loaded.engine is None:
                continue  # skipped: the engine is not here (said once per file)
            coverage = loaded.coverage
            if coverage is None:
                name = getattr(loaded.engine, "name", None) or loaded.matrix.engine_name
                found[self.run.display_path(file)] = f"its adapter {name!r} has no registered_backends()"
            elif coverage.get("error"):
                found[self.run.display_path(file)] = str(coverage["error"])
        return found

    def uncovered(self) -> dict[str, list[str]]:
        """Matrix file → the MLA-capable backends its engine registers that it does not list."""
        found = {}
        for file in self.run.files:
            try:
                coverage = self.run.load(file).coverage
            except MatrixError:
                continue
            if coverage and coverage.get("uncovered_mla"):
                found[self.run.display_path(file)] = coverage["uncovered_mla"]
        return found

    def gate(self, session: pytest.Session, document: dict[str, Any], markdown: str | None) -> None:
        """``--mla-baseline``: regressions fail the session; both go to GitHub's step summary."""
        from .report.baseline import append_step_summary, check_baseline

        summary = markdown
        old = self.run.baseline
        if old is not None and old["run"].get("matrix") == document["run"]["matrix"]:
            regressions, diff_md = check_baseline(old, document, old_name=os.fspath(self.run.settings.baseline))
            self.regressions += [(document["run"]["matrix"], c) for c in regressions]
            summary = (summary or "") + "\n" + diff_md
            if regressions and session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if os.environ.get("GITHUB_STEP_SUMMARY"):
            if summary is None:
                from .report.markdown import render_markdown

                summary = render_markdown(document)
            try:
                append_step_summary(summary)
            except OSError as exc:  # checked writable at the start; a full disk or a moved file since
                self.lost(f"cannot append to GITHUB_STEP_SUMMARY "
                                           f"({os.environ['GITHUB_STEP_SUMMARY']}): {exc.strerror or exc}")

    def file_of(self, nodeid: str) -> Path:
        """The matrix file of a cell's node id (relative to the rootdir, or absolute outside it)."""
        path = nodeid.split("::", 1)[0]
        known = self._files_by_path.get(path)
        if known is None:
            known = self._files_by_path[path] = (self.config.rootpath / path).resolve()
        return known

    def engine_info(self, loaded: LoadedMatrix) -> dict[str, Any]:
        engine = loaded.engine
        info = {
            # The adapter's own name; "adapter" keeps what the matrix wrote when that differs
            # (a "module:attr" string).
            "name": str(getattr(engine, "name", None) or loaded.matrix.engine_name),
            "version": str(engine.version) if engine is not None else None,
            "described_versions": str(loaded.matrix.engine_versions) if loaded.matrix.engine_versions else "*",
            "metadata": engine_metadata(engine),
            "unavailable": loaded.skip_reason,
            "assumed_version": loaded.assumed_version,
            "coverage": loaded.coverage,
        }
        if info["name"] != loaded.matrix.engine_name:
            info["adapter"] = loaded.matrix.engine_name
        return info

    def head(self, file: Path, loaded: LoadedMatrix) -> dict[str, Any]:
        """The run facts of a matrix known before its first cell (computed once: the result file
        starts with them, and a file written again at the end must start the same)."""
        if file not in self.heads:
            settings = self.run.settings
            environment = {"versions": run_document.versions(), "seed": settings.seed,
                           "dcp_mode": settings.dcp_mode, "tier": settings.tier,
                           "sample": self.run.quick_sample(loaded) if loaded.engine is not None else None}
            self.heads[file] = run_document.run_head(loaded.matrix, engine=self.engine_info(loaded),
                                                     host=probe_host(), environment=environment,
                                                     cells_selected=self.selected.get(file))
        return self.heads[file]

    def document(self, file: Path, loaded: LoadedMatrix | None = None) -> dict[str, Any]:
        loaded = loaded if loaded is not None else self.run.load(file)
        # This file's cells only: two files may share a matrix name (a/x.toml, b/x.toml).
        records = [r for nodeid, r in self.records.items() if self.file_of(nodeid) == file]
        return run_document.build_document(loaded.matrix, records, head=self.head(file, loaded),
                                           user_tests=self.user_tests, interrupted=self.interrupted)

    # -- terminal --------------------------------------------------------------------
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.records:
            return
        documents = [self._document_for_summary(file) for file in self.run.files]
        # A duration alone (most cells) is not read by the summary: those records are not copied.
        records = [r if type(self.volatile.get(nodeid, 0.0)) is float else with_volatile(r, self.facts(nodeid))
                   for nodeid, r in self.records.items()]
        lines = build_summary(records, [d for d in documents if d is not None], models=self.models,
                              verbosity=self.config.get_verbosity(),
                              baseline=self.run.settings.baseline if self.run.baseline is not None else None,
                              regressions=self.regressions, written=[_shown(p) for p in self.written],
                              interrupted=self.interrupted)
        terminalreporter.write_sep("=", "mla matrix")
        for text, markup in lines:
            terminalreporter.write_line(text, **markup)
        for file in self.run.files:
            try:
                loaded = self.run.load(file)
            except MatrixError:
                continue
            if loaded.skip_reason:
                terminalreporter.write_line(f"mla: {self.run.display_path(file)}: every cell skipped: "
                                            f"{loaded.skip_reason}", yellow=True)
        for text in self.write_failures:
            terminalreporter.write_line(f"mla report: {text}", red=True, bold=True)
        if self.run.settings.strict_coverage:
            for shown, names in self.uncovered().items():
                terminalreporter.write_line(f"--mla-strict-coverage: {shown} does not cover the MLA-capable "
                                            f"backends {', '.join(names)}", red=True)
            for shown, why in self.coverage_unknown().items():
                terminalreporter.write_line(f"--mla-strict-coverage: cannot check {shown}: {why}", red=True)

    def _document_for_summary(self, file: Path) -> dict[str, Any] | None:
        if file in self.documents:
            return self.documents[file]
        try:  # no report files written (--mla-report-dir=none)
            return self.document(file, self.run.load(file))
        except MatrixError:
            return None


#: The session's exit status after a report file could not be written (whatever the verdicts).
WRITE_FAILED = pytest.ExitCode.INTERNAL_ERROR


def lock_report_folder(config: pytest.Config, out: Path) -> None:
    """Hold the report folder's lock for the session (``report.output.FolderLock``): a second run
    into the same folder stops before its first cell, naming the run that has it."""
    lock = FolderLock(out)
    try:
        lock.acquire()
    except FolderBusyError as exc:
        who = f"pid {exc.pid}" if exc.pid else "its pid not yet written"
        raise pytest.UsageError(f"--mla-report-dir: {out} is being written by another pytest-mla run ({who}); "
                                "wait for it to end, or give this run another --mla-report-dir") from None
    except OSError as exc:
        raise pytest.UsageError(f"--mla-report-dir: cannot lock {lock.path}: {exc.strerror or exc}") from None
    config.add_cleanup(lock.release)


def report_folder(config: pytest.Config, report_dir: str | None) -> Path | None:
    if not report_dir:
        return None
    out = Path(report_dir)
    return out if out.is_absolute() else config.rootpath / out


def check_report_folder(config: pytest.Config, report_dir: str | None) -> None:
    """Before the first cell: a report folder that cannot be made or written to is a usage
    error naming it, not a traceback after every cell has run."""
    out = report_folder(config, report_dir)
    if out is None:
        return
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".pytest-mla-probe-", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if out.exists() and not out.is_dir():
            reason = "it is a file, not a folder"
        raise pytest.UsageError(f"--mla-report-dir: cannot write reports to {out}: {reason}") from None


def write_fallback(document: dict[str, Any], stem: Path) -> tuple[str | None, str]:
    """Where the results go when their folder cannot take them: the temporary folder, else the
    folder pytest was started in. ``(path, "")``, or ``(None, why)`` when neither takes them."""
    reasons = []
    for folder in (None, os.getcwd()):
        try:
            fd, fallback = tempfile.mkstemp(prefix=f"pytest-mla-{stem.name[:40]}-", suffix=".json", dir=folder)
            os.close(fd)
            write_results(fallback, document["run"], document["cells"])
            return fallback, ""
        except OSError as exc:
            reasons.append(f"{folder or tempfile.gettempdir()}: {exc.strerror or exc}")
    return None, "; ".join(reasons)


#: Longest report file stem, in bytes (a file system takes 255 per name, with the extension and a temporary suffix).
MAX_STEM_BYTES = 200


def report_stem(template: str, matrix: str, engine: Any, version: Any) -> str:
    """The file stem of a matrix's reports: ``--mla-report-name`` filled in. The engine's name and
    version are the adapter's values, so they are made safe for a file name (no ``/``, nothing
    invisible); a stem too long for a file system is cut, with a hash of the whole to keep it apart."""
    import hashlib

    stem = template.format(matrix=safe_stem_part(matrix, 120), engine=safe_stem_part(engine),
                           version=safe_stem_part(version))
    data = stem.encode("utf-8")
    if len(data) <= MAX_STEM_BYTES:
        return stem
    digest = hashlib.sha256(data).hexdigest()[:12]
    return data[:MAX_STEM_BYTES - 13].decode("utf-8", "ignore") + "-" + digest


def report_stems(run: MatrixRun) -> dict[Path, str]:
    """The ``{matrix}`` of each file's report names: its matrix name, or, where two files share
    a name (``a/x.toml``, ``b/x.toml``), its path with ``-`` for ``/`` (``a-x``, ``b-x``)."""
    names: dict[Path, str] = {}
    for file in run.files:
        try:
            names[file] = run.load(file).matrix.name
        except MatrixError:
            names[file] = file.stem
    stems = {}
    for file, name in names.items():
        if list(names.values()).count(name) > 1:
            shown = Path(run.display_path(file)).with_suffix("")
            stems[file] = "-".join(part for part in shown.parts if part not in ("/", "..", "."))
        else:
            stems[file] = name
    return stems


def engine_metadata(engine: Any) -> dict[str, Any]:
    """The adapter's ``metadata()`` as plain JSON values (anything else becomes its ``repr``):
    a value the JSON encoder cannot take must not lose the finished cells."""
    if engine is None:
        return {}
    try:
        data = optional_step(engine, "metadata")()
    except STEP_FAILURES as exc:
        return {"error": f"metadata() raised {describe_failure(exc)}"}
    plain = json_safe(data)
    return plain if isinstance(plain, dict) else {"value": plain}


def render_files(document: dict[str, Any], stem: Path, formats: tuple[str, ...], written: list[Path],
                 model: Any = None, inputs: Any = ()) -> str | None:
    """Markdown (the full report and the docs page, ``NAME.docs.md``) and HTML next to the JSON, from the
    same document; returns the full Markdown report (None if not asked)."""
    from .report.model import ReportModel

    markdown = None
    model = model if model is not None else ReportModel(document)  # one model, one backends view, for both pages
    if "md" in formats:
        from .report.markdown import render_markdown

        markdown = render_markdown(document, model=model)
        written.append(write_text_atomic(_with_ext(stem, "md"), markdown, inputs=inputs))
        evidence = _with_ext(stem, "html").name if "html" in formats else None  # the page's links, beside it
        docs = render_markdown(document, model=model, view="docs", evidence=evidence)
        written.append(write_text_atomic(_with_ext(stem, "docs.md"), docs, inputs=inputs))
    if "html" in formats:
        from .report.html import render_html

        written.append(write_text_atomic(_with_ext(stem, "html"), render_html(document, model=model), inputs=inputs))
    return markdown


def _with_ext(stem: Path, ext: str) -> Path:
    """``stem.ext`` even when the stem has dots of its own (``sglang-0.5.23``)."""
    return stem.parent / f"{stem.name}.{ext}"


def _same_records(written: list[Any], cells: list[Any]) -> bool:
    """Whether the stream holds exactly these records, in this order (the very objects)."""
    return len(written) == len(cells) and all(a is b for a, b in zip(written, cells))


def _longrepr_line(report: pytest.TestReport) -> str:
    text = str(report.longrepr or "").strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    crash = next((ln for ln in lines if "crashed" in ln), None)
    return crash or (lines[-1] if lines else f"no result for this cell ({report.when})")


def _shown(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return os.fspath(path)
