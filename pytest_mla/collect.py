"""Collection: matrix files found and collected, each cell a test item; selection; the worker-side record.

``find_matrix_files`` turns ``--mla-matrix`` (or the ``mla_matrix_files``
ini globs) into files; ``MatrixFile`` collects one file's cells as
``CellItem``s (only those ``--mla-select`` and ``--mla-arch`` keep: ``selected_axes``);
``select_items`` applies the selection and ``--mla-shard`` (a pure function of the items and
the settings);
``finish_record`` turns a cell's test report into its finished
``CellRecord``, in the process that ran the cell.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import pytest

from .core.cells import Cell, expand_cells
from .core.errors import MatrixError
from .core.plain import json_safe
from .core.records import CellRecord, crash_record, kernel_of
from .core.rules import Expectation
from .core.text import visible
from .core.verdicts import ACCEPTED, ERROR, FAIL, KERNEL_FAILED, PASS, SKIP, VERIFIED, XFAIL, XPASS
from .options import MATRIX_OPTION, Settings, selected_axes, selection
from .runner import run_key

#: Attribute of the test report that carries the cell record (plain values) to the controller.
RECORD_ATTR = "mla_cell"


def record_text(record: CellRecord) -> str:
    """A record as the JSON text xdist carries: ASCII (a lone surrogate travels as an escape), and
    a hook's object, a NaN or a set made plain first (``json_safe``) when the record holds one."""
    try:
        return json.dumps(record, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        return json.dumps(json_safe(record), separators=(",", ":"), allow_nan=False)


def record_from_text(text: str) -> CellRecord:
    return json.loads(text)


class CellMismatch(AssertionError):
    """The engine or kernel did not do what the matrix says (verdict ``fail``)."""


class CellError(Exception):
    """The engine, kernel or harness crashed (verdict ``error``)."""


class EngineCrash(CellError):
    """The engine itself raised what is no refusal (verdict ``error``): a known bug an ``xfail`` rule may mark.

    Adapter errors and timeouts are never this: an ``xfail`` cannot hide them.
    """


def kernel_group(cell: Cell) -> str:
    """Cells with the same numeric kernel configuration: the id without the arch."""
    return "/".join(p for a, p in zip(cell.coords, cell.parts) if a != "arch")


class MatrixFile(pytest.File):
    def collect(self) -> Iterator["CellItem"]:
        run = self.config.stash[run_key]
        loaded = run.load(self.path)
        version = loaded.rules_version
        grouped = self.config.pluginmanager.hasplugin("xdist")
        cells = [(cell, loaded.matrix.expectation(cell, version))
                 for cell in expand_cells(selected_axes(loaded.matrix.axes, run.settings))]
        run.quick_sample(loaded, cells)  # a quick run's covering sample, from the cells just expanded
        for cell, expect in cells:
            item = CellItem.from_parent(self, name=cell.name, cell=cell, expectation=expect)
            if grouped:
                # With --dist loadgroup, cells that differ only by arch share a worker
                # and so one kernel check.
                item.add_marker(pytest.mark.xdist_group(kernel_group(cell)))
            if expect.xfail:
                item.add_marker(pytest.mark.xfail(reason=expect.xfail, raises=(CellMismatch, EngineCrash),
                                                  strict=False))
            yield item

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, MatrixError):
            return excinfo.value.format()
        return super().repr_failure(excinfo)


class CellItem(pytest.Item):
    def __init__(self, *, cell: Cell, expectation: Expectation, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cell = cell
        self.expectation = expectation
        self.record: CellRecord | None = None
        self.add_marker(pytest.mark.mla(**cell.coords))

    def runtest(self) -> None:
        run = self.config.stash[run_key]
        loaded = run.load(self.path)
        record = run.run_cell(loaded, self.cell, self.expectation)
        amend = self.config.hook.pytest_mla_cell_record
        if amend.get_hookimpls():  # most sessions have none: skip the call
            amend(config=self.config, cell=self.cell, record=record)
        self.record = record
        if record["verdict"] == "skip":
            pytest.skip(record["reason"] or "skipped")
        if record["verdict"] == ERROR:
            outcome = record.get("outcome") or {}
            if str(record.get("reason") or "").startswith("engine crashed:") and outcome.get("kind") == "crashed":
                raise EngineCrash(record["reason"])
            raise CellError(record["reason"])
        if record["verdict"] == FAIL:
            raise CellMismatch(record["reason"])

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, (CellMismatch, CellError)):
            kind = "mismatch" if isinstance(excinfo.value, CellMismatch) else "error"
            kernel = kernel_of(self.record) if self.record else {}
            if kernel.get("status") == KERNEL_FAILED:  # the engine did as expected; its kernel did not
                kind = ("kernel crashed" if kernel.get("crashed") else "the engine's backend raised after accepting"
                        if kernel.get("finding") else "kernel out of tolerance")
            rule = self.expectation.rule
            decided = (f"rule[{rule}] at line {self.expectation.rule_line}" if rule is not None
                       else "no rule (default: accept)")
            lines = [f"{self.cell.id}: {kind}", f"  expectation from {decided}: {self.expectation.describe()}"]
            lines += ["  " + visible(ln) for ln in str(excinfo.value).splitlines()]
            if self.record and self.record.get("traceback"):
                lines += ["", self.record["traceback"].rstrip()]
            return "\n".join(lines)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        line = self.expectation.rule_line
        return self.path, (line - 1 if line else None), f"mla cell {self.cell.id}"


# ---- finding and selecting -------------------------------------------------------------------

def find_matrix_files(config: pytest.Config, settings: Settings) -> tuple[list[Path], set[Path]]:
    """The matrix files of this session, resolved, in order, each once, and those of them named
    one by one with ``--mla-matrix=FILE`` (which must run: their engine must be here).
    ``pytest.UsageError`` if there are none."""
    invocation = config.invocation_params.dir
    files: list[Path] = []
    named: set[Path] = set()
    if settings.matrix_paths:
        for text in settings.matrix_paths:
            path = (invocation / text).resolve()
            if path.is_dir():
                found = sorted(p for p in path.glob("*.toml") if p.is_file())
                if not found:
                    raise pytest.UsageError(f"{MATRIX_OPTION}: no *.toml matrix files in {text}"
                                            + swallowed_hint(text, settings))
                files += found
            elif path.is_file():
                if path.suffix != ".toml":
                    raise pytest.UsageError(f"{MATRIX_OPTION}: {text} is not a .toml matrix file"
                                            + swallowed_hint(text, settings))
                files.append(path)
                named.add(path)
            else:
                raise pytest.UsageError(f"{MATRIX_OPTION}: matrix file not found: {text}"
                                        + swallowed_hint(text, settings))
    else:
        patterns = config.getini("mla_matrix_files")
        for pattern in patterns:
            files += sorted(Path(p).resolve() for p in glob.glob(os.path.join(config.rootpath, pattern)))
        if not files:
            raise pytest.UsageError(
                f"{MATRIX_OPTION}: no matrix files match {', '.join(patterns)} under {config.rootpath} "
                "(give paths: --mla-matrix=matrix/x.toml, or set mla_matrix_files)"
            )
    unique: list[Path] = []
    for f in files:
        if f not in unique:
            unique.append(f)
    return unique, named


def swallowed_hint(text: str, settings: Settings) -> str:
    """What happened when ``text`` came from ``--mla-matrix WORD`` (no '='), and the fix."""
    if text not in settings.swallowed:
        return ""
    return (f" ({MATRIX_OPTION} written without '=' takes the next word, {text!r}, as its matrix files: write "
            f"{MATRIX_OPTION}=PATH, repeated for more files, and give test paths before the option: "
            f"pytest {text} {MATRIX_OPTION})")


def check_test_paths(config: pytest.Config, files: list[Path], settings: Settings) -> None:
    """A ``.toml`` given as a test path is never collected as a matrix (``pytest --mla-matrix a.toml
    b.toml`` runs only ``a.toml``): say so rather than run without it."""
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        return
    for arg in config.args:
        path = (config.invocation_params.dir / arg.split("::")[0]).resolve()
        if path.suffix == ".toml" and path not in files:
            given = " ".join(f"{MATRIX_OPTION}={t}" for t in (*settings.matrix_paths, arg)) if settings.matrix_paths \
                else f"{MATRIX_OPTION}={arg}"
            raise pytest.UsageError(
                f"{arg}: a .toml file given as a test path is not run as a matrix ({MATRIX_OPTION} takes one "
                f"value, written with '='): to run it, write {given}")


def matrix_nodeid(config: pytest.Config, path: Path) -> str | None:
    """The node id of a matrix file outside the rootdir: its absolute path. pytest would give every
    such file the empty id, and the cells of two of them the same ids (``::cell``)."""
    try:
        path.relative_to(config.rootpath)
    except ValueError:
        return path.as_posix()
    return None


def add_collection_args(config: pytest.Config, files: list[Path]) -> None:
    """Collect the matrix files: alone when no paths were given, else besides them."""
    explicit = config.args_source == pytest.Config.ArgsSource.ARGS
    if not explicit:
        config.args[:] = [os.fspath(f) for f in files]
        return
    given = [(config.invocation_params.dir / a.split("::")[0]).resolve() for a in config.args]
    for f in files:
        if not any(f == g or g in f.parents for g in given):
            config.args.append(os.fspath(f))


def select_items(items: Sequence[pytest.Item], settings: Settings) -> tuple[list[pytest.Item], list[pytest.Item]]:
    """``(keep, dropped)``: the cells ``--mla-select``, ``--mla-arch`` and ``--mla-shard`` leave; other items stay."""
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    groups: dict[tuple[Any, ...], int] = {}
    for item in items:
        if not isinstance(item, CellItem):
            keep.append(item)
            continue
        cell = item.cell
        ok = all(getattr(cell, axis) in values for axis, values in settings.select)
        if ok and settings.arch != "auto":
            ok = cell.arch == settings.arch
        if ok and settings.shard is not None:
            # Cells that differ only by arch share one kernel check: keep them on one shard.
            group = (item.path, kernel_group(cell))
            index = groups.setdefault(group, len(groups))
            ok = index % settings.shard[1] == settings.shard[0] - 1
        (keep if ok else dropped).append(item)
    return keep, dropped


def check_selection(run: Any) -> None:
    """``--mla-select`` values and ``--mla-arch`` must name values of the matrices' axes: a typo
    selects nothing and would pass as an empty run. Matrices that do not load are left to
    collection, which reports them."""
    settings = run.settings
    if not settings.select and settings.arch == "auto":
        return
    known: dict[str, list[Any]] = {}
    defaults = {f.name: f.default for f in dataclasses.fields(Cell) if f.default is not dataclasses.MISSING}
    for file in run.files:
        try:
            axes = run.load(file).matrix.axes
        except MatrixError:
            continue
        for axis in {axis for axis, _ in settings.select} | {"arch"}:
            values = axes.get(axis, (defaults[axis],) if axis in defaults else ())
            known.setdefault(axis, []).extend(v for v in values if v not in known.get(axis, []))
    if not known:
        return
    wanted = selection(settings)
    for axis, values in wanted:
        option = ("--mla-arch" if axis == "arch" and settings.arch != "auto" and (axis, values) == wanted[-1]
                  else f"--mla-select {axis}={','.join(str(v) for v in values)}")
        present = [v for v in known.get(axis, []) if v is not None]
        which = "any of the matrices" if len(run.files) > 1 else "the matrix"
        if not present:
            raise pytest.UsageError(f"{option}: {which} has no {axis} axis")
        missing = [v for v in values if v not in present]
        if missing:
            article = "an" if axis[0] in "aeiou" else "a"
            raise pytest.UsageError(f"{option}: {', '.join(repr(v) for v in missing)} is not {article} {axis} of "
                                    f"{which} (known: {', '.join(str(v) for v in present)})")


def order_for_workers(items: list[pytest.Item]) -> None:
    """Arch outermost (stable): xdist workers take cells in chunks, and the other archs' cells
    then come after their kernel result is shared (the same order on every worker)."""
    order: list[str] = []
    for item in items:
        if isinstance(item, CellItem) and item.cell.arch not in order:
            order.append(item.cell.arch)
    rank = {arch: i for i, arch in enumerate(order)}
    items.sort(key=lambda it: rank.get(it.cell.arch, -1) if isinstance(it, CellItem) else -1)


# ---- the finished record ---------------------------------------------------------------------


def known_bug_unchecked(record: CellRecord) -> bool:
    """An accepted cell whose known bug lies after acceptance (an xfail-only rule) and whose
    kernel check did not run: nothing that could show the bug was computed."""
    accepted = (record.get("outcome") or {}).get("kind") == ACCEPTED
    return (record.get("verdict") == PASS and bool(record["expectation"].get("xfail_after_accept")) and accepted
            and kernel_of(record).get("status") not in (VERIFIED, KERNEL_FAILED))


def finish_record(item: CellItem, report: pytest.TestReport, call: pytest.CallInfo[None]) -> CellRecord:
    """The cell's record as it leaves this process: the runner's, or one made here when the
    harness raised or setup failed or skipped; xfail/xpass applied."""
    record = item.record
    if record is None:
        loaded = item.config.stash[run_key].load(item.path)
        if report.skipped and not hasattr(report, "wasxfail"):
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            record = crash_record(loaded.matrix.name, item.cell, item.expectation, reason)
            record["verdict"] = SKIP
        else:
            message = call.excinfo.exconly() if call.excinfo else "no result"
            record = crash_record(loaded.matrix.name, item.cell, item.expectation, f"harness error: {message}")
    # Not made plain here (a walk of every record): what xdist carries is made plain when it is
    # serialised (``record_text``), what the result file takes when it is written (the controller).
    record = CellRecord(record)
    if hasattr(report, "wasxfail") and report.passed and known_bug_unchecked(record):
        # The known bug is one only the kernel check can show, and it did not run: an xpass
        # here would claim a fix nobody saw. The cell passes; its note says what was not checked.
        del report.wasxfail
        record.setdefault("notes", []).append(
            f"known bug not checked ({kernel_of(record).get('reason') or 'no kernel check'}): "
            f"{item.expectation.xfail}")
    if hasattr(report, "wasxfail"):
        record["verdict"] = XFAIL if report.skipped else XPASS
        record["xfail_reason"] = report.wasxfail
    return record
