"""User tests over the cells of a matrix: the ``mla_matrix`` marker and ``mla_cell`` fixture.

An engine repo writes its own tests (an end-to-end generation test, a
throughput smoke test) over exactly the cells of a matrix file::

    @pytest.mark.mla_matrix("matrix/sglang.toml", select={"backend": ["triton", "fa3"]}, expect="accept")
    def test_generates(mla_cell):
        server = launch(mla_cell.cell.backend, dcp=mla_cell.cell.dcp, ...)

Each such test is parametrized with one ``MlaCell`` per selected cell (ids are
the cell names). With ``--mla-matrix`` their outcomes join the matrix report:
the cell's record lists them under ``user_tests``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Mapping

import pytest

from .core.cells import AXES, Cell
from .core.matrix import Matrix, load_matrix
from .core.models import ModelConfig
from .core.rules import Expectation

USER_RECORD_ATTR = "mla_user_test"
EXPECT_CHOICES = (None, "accept", "reject")


@dataclasses.dataclass(frozen=True)
class MlaCell:
    """One cell handed to a user test."""

    cell: Cell
    model: ModelConfig
    expectation: Expectation
    matrix: str  # the matrix name

    @property
    def id(self) -> str:
        return self.cell.id


def _select(select: Any, where: str) -> dict[str, tuple[Any, ...]]:
    if select is None:
        return {}
    if not isinstance(select, Mapping):
        raise pytest.UsageError(f"{where}: select must be a dict such as {{'backend': ['triton']}}, got {select!r}")
    out = {}
    for axis, values in select.items():
        if axis not in AXES:
            raise pytest.UsageError(f"{where}: select: unknown axis {axis!r} (known: {', '.join(AXES)})")
        out[axis] = tuple(values) if isinstance(values, (list, tuple)) else (values,)
    return out


def generate(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("mla_matrix")
    if marker is None:
        return
    where = f"{metafunc.definition.nodeid}: @pytest.mark.mla_matrix"
    if "mla_cell" not in metafunc.fixturenames:
        raise pytest.UsageError(f"{where}: the test must take the mla_cell argument")
    if len(marker.args) != 1:
        raise pytest.UsageError(f"{where}: expected one matrix path, got {marker.args!r}")
    unknown = set(marker.kwargs) - {"select", "expect"}
    if unknown:
        raise pytest.UsageError(f"{where}: unknown argument {sorted(unknown)[0]!r} (known: select, expect)")
    expect = marker.kwargs.get("expect")
    if expect not in EXPECT_CHOICES:
        raise pytest.UsageError(f"{where}: expect must be 'accept', 'reject' or None, got {expect!r}")
    select = _select(marker.kwargs.get("select"), where)
    config = metafunc.config
    path = Path(marker.args[0])
    if not path.is_absolute():
        path = config.rootpath / path
    matrix = _load(config, path)
    version = _engine_version(config, path)
    params, ids = [], []
    for cell in matrix.cells():
        if not all(getattr(cell, axis) in values for axis, values in select.items()):
            continue
        expectation = matrix.expectation(cell, version)
        if expect is not None and expectation.kind != expect:
            continue
        params.append(MlaCell(cell, matrix.model(cell), expectation, matrix.name))
        ids.append(cell.name)
    metafunc.parametrize("mla_cell", params, ids=ids)


def _load(config: pytest.Config, path: Path) -> Matrix:
    from .runner import hook_models, run_key

    run = config.stash.get(run_key, None)
    if run is not None:
        return run.load(path).matrix
    return load_matrix(path, extra_models=hook_models(config), display_path=os.path.relpath(path, config.rootpath))


def _engine_version(config: pytest.Config, path: Path) -> str | None:
    from .runner import run_key

    run = config.stash.get(run_key, None)
    if run is None:
        return None  # without --mla-matrix no engine is loaded: ungated rules only
    return run.load(path).rules_version


def user_record(item: pytest.Item, report: pytest.TestReport) -> dict[str, Any] | None:
    callspec = getattr(item, "callspec", None)
    value = callspec.params.get("mla_cell") if callspec is not None else None
    if not isinstance(value, MlaCell):
        return None
    return {"matrix": value.matrix, "cell": value.id, "test": getattr(item, "originalname", item.name),
            "nodeid": report.nodeid, "outcome": report.outcome}
