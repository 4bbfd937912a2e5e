"""Hook specifications of pytest-mla (added from ``pytest_addhooks``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import pytest

if TYPE_CHECKING:
    from .core.cells import Cell
    from .core.models import ModelConfig
    from .engines.protocol import Engine, KernelSpec


@pytest.hookspec(firstresult=True)
def pytest_mla_make_engine(config: pytest.Config, name: str) -> "Engine | None":
    """Build the engine adapter a matrix file names in ``[engine] name``.

    :param config: The pytest config.
    :param name: The engine name from the matrix file.

    Stops at first non-None result. Return None to leave the name to other
    implementations and finally to the built-in lookup (``reference``,
    ``sglang``, ``vllm`` or ``module:attr``).
    """


@pytest.hookspec
def pytest_mla_engines(config: pytest.Config) -> "Mapping[str, Any] | None":
    """Register engine adapters by name: return ``{name: Engine class or factory}``.

    :param config: The pytest config.
    """


@pytest.hookspec
def pytest_mla_models(config: pytest.Config) -> "Mapping[str, ModelConfig | Mapping[str, Any]] | None":
    """Add entries to the model catalogue: return ``{name: ModelConfig or field mapping}``.

    :param config: The pytest config.
    """


@pytest.hookspec(firstresult=True)
def pytest_mla_kernel(config: pytest.Config, cell: "Cell", spec: "KernelSpec | None") -> "KernelSpec | None":
    """Provide or override the decode kernel checked for an accepted cell.

    :param config: The pytest config.
    :param cell: The cell being run.
    :param spec: The kernel the engine declared (None when it has none).

    Stops at first non-None result. Return a ``KernelSpec`` whose ``target``
    is an importable ``module:attr`` with the ``mla_decode`` signature.
    """


@pytest.hookspec
def pytest_mla_cell_record(config: pytest.Config, cell: "Cell", record: dict[str, Any]) -> None:
    """Amend a cell's record (plain values only) before it leaves the worker.

    :param config: The pytest config.
    :param cell: The cell.
    :param record: The record; add keys under ``record["notes"]`` or ``record["extra"]``.
    """
