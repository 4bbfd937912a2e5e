"""Collection: a matrix file is a pytest file, each cell a test item."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from .core.cells import Cell
from .core.errors import MatrixError
from .core.rules import Expectation
from .core.verdicts import ERROR, FAIL

#: Attribute of the test report that carries the cell record (plain values) to the controller.
RECORD_ATTR = "mla_cell"


class CellMismatch(AssertionError):
    """The engine or kernel did not do what the matrix says (verdict ``fail``)."""


class CellError(Exception):
    """The engine, kernel or harness crashed (verdict ``error``)."""


def kernel_group(cell: Cell) -> str:
    """Cells with the same numeric kernel configuration: the id without the arch."""
    return "/".join(p for a, p in zip(cell.coords, cell.parts) if a != "arch")


class MatrixFile(pytest.File):
    def collect(self) -> Iterator["CellItem"]:
        from .plugin import run_key  # one run object per process

        run = self.config.stash[run_key]
        loaded = run.load(self.path)
        version = loaded.engine.version if loaded.engine is not None else None
        grouped = self.config.pluginmanager.hasplugin("xdist")
        for cell in loaded.matrix.cells():
            expect = loaded.matrix.expectation(cell, version)
            item = CellItem.from_parent(self, name=cell.name, cell=cell, expectation=expect)
            if grouped:
                # With --dist loadgroup, cells that differ only by arch share a worker
                # and so one kernel check.
                item.add_marker(pytest.mark.xdist_group(kernel_group(cell)))
            if expect.xfail:
                item.add_marker(pytest.mark.xfail(reason=expect.xfail, raises=CellMismatch, strict=False))
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
        self.record: dict[str, Any] | None = None
        self.add_marker(pytest.mark.mla(**cell.coords))

    def runtest(self) -> None:
        from .plugin import run_key

        run = self.config.stash[run_key]
        loaded = run.load(self.path)
        record = run.run_cell(loaded, self.cell, self.expectation)
        self.config.hook.pytest_mla_cell_record(config=self.config, cell=self.cell, record=record)
        self.record = record
        if record["verdict"] == "skip":
            pytest.skip(record["reason"] or "skipped")
        if record["verdict"] == ERROR:
            raise CellError(record["reason"])
        if record["verdict"] == FAIL:
            raise CellMismatch(record["reason"])

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, (CellMismatch, CellError)):
            kind = "mismatch" if isinstance(excinfo.value, CellMismatch) else "error"
            rule = self.expectation.rule
            decided = (f"rule[{rule}] at line {self.expectation.rule_line}" if rule is not None
                       else "no rule (default: accept)")
            lines = [f"{self.cell.id}: {kind}", f"  expectation from {decided}: {self.expectation.describe()}"]
            lines += ["  " + ln for ln in str(excinfo.value).splitlines()]
            if self.record and self.record.get("traceback"):
                lines += ["", self.record["traceback"].rstrip()]
            return "\n".join(lines)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        line = self.expectation.rule_line
        return self.path, (line - 1 if line else None), f"mla cell {self.cell.id}"
