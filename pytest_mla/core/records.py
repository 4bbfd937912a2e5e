"""The cell record: what one cell did, as plain JSON values (the report's ``cells[]`` entries).

A record is built on the process that ran the cell (``new_record``, filled
by the runner), finished there once (``collect.finish_record``: a harness
crash or skip, xfail/xpass, the ``pytest_mla_cell_record`` hook), travels
to the controller as plain values on the test report (the xdist transport),
and gets its ``nodeid`` and ``user_tests`` when the result document is
built (``report/run_document.py``). Both types are ``TypedDict``s: the
record *is* its JSON form, so the hook, xdist and the report files all see
the same thing, and every reader goes through these names.
"""

from __future__ import annotations

import re
from typing import Any, TypedDict

from .cells import Cell
from .rules import Expectation
from .verdicts import ERROR, NOT_RUN


class KernelResult(TypedDict, total=False):
    """The numeric check of an accepted cell (``docs/report-schema.md``, ``kernel``)."""

    status: str  # verified / failed / not-run
    where: str | None  # "interpreter", "sm90", ...; None when it did not run
    reason: str  # why not run
    kernel: str  # the KernelSpec's name
    level: str  # "ours", "backend" (the engine's backend object), "kernel" (its entry point), "emulated"
    emulated: list[str]  # level "emulated": the kernel-library callables that ran as emulations, "module:qualname"
    function: str | None  # the engine function that computed attention, "module:qualname"
    functions: list[str]  # every engine function that ran (kernels, merge)
    seed: int
    case: dict[str, Any]  # the KernelCase
    errors: dict[str, Any]  # {"out": CloseResult, "lse": CloseResult | None}
    tolerance: dict[str, Any]
    kv_scale: float | None  # the fp8 cache's scale of the run shown (k_scale = v_scale)
    variants: list[dict[str, Any]]  # one entry per KV scale an fp8 case ran with (status, errors)
    power: dict[str, Any]  # planted faults the check would catch (kernels/power.py; docs/check-power.md)
    time_s: float
    message: str | None  # why it failed
    reused: bool  # the result of an identical numeric case (another arch, another worker)
    crashed: bool  # the kernel or harness raised (verdict error)
    finding: bool  # the engine's own code raised after accepting (verdict fail)
    raised: str  # a finding: the exception's class name
    raised_text: str  # a finding: str() of the exception
    frames: list[str]  # a finding: the engine's frames, outermost first, "module:qualname (line N)"
    step: str  # a finding raised before the step under test: that step (CACHE_WRITE_STEP); absent: decode/verify
    notes: list[str]


class CellRecord(TypedDict, total=False):
    """One cell of a result file (``docs/report-schema.md``, ``cells[]``)."""

    id: str
    matrix: str
    coords: dict[str, Any]
    expectation: dict[str, Any]
    outcome: dict[str, Any] | None  # Outcome.as_dict(): what the engine did
    verdict: str | None
    reason: str | None
    kernel: KernelResult | None
    duration_s: float | None
    notes: list[str]  # rewrites the engine made, hook notes
    traceback: str  # of an engine crash
    xfail_reason: str
    extra: dict[str, Any]  # added by pytest_mla_cell_record implementations
    nodeid: str  # set on the controller
    user_tests: dict[str, str]  # test name -> outcome of mla_matrix user tests, set on the controller


#: ``kernel.step`` of a finding the engine's code raised writing the check's cached tokens through its own
#: write path, before the decode or verify under test ran (``kernels.engine_runner.engine_step``).
CACHE_WRITE_STEP = "cache write"

#: ``kernel.schedule`` key of a batch run the way a FULL CUDA graph replays it: the request counts the
#: engine's runner padded it to with dummy requests (``KernelSpec`` option ``graph_padding``).
GRAPH_PADDED = "graph_padded_to"


def new_record(matrix_name: str, cell: Cell, expect: Expectation) -> CellRecord:
    return CellRecord(id=cell.id, matrix=matrix_name, coords=cell.coords, expectation=expect.as_dict(),
                      outcome=None, verdict=None, reason=None, kernel=None)


def crash_record(matrix_name: str, cell: Cell, expect: Expectation, message: str) -> CellRecord:
    """The record of a cell whose process died or whose harness raised (verdict ``error``)."""
    record = new_record(matrix_name, cell, expect)
    record.update(verdict=ERROR, reason=message, duration_s=None)
    return record


def not_run(reason: str) -> KernelResult:
    return KernelResult(status=NOT_RUN, where=None, reason=reason)


def kernel_of(record: CellRecord) -> KernelResult:
    """The cell's kernel result, empty when it has none (rejected cells, old files)."""
    return record.get("kernel") or KernelResult()


#: The note an adapter leaves where start-up code (a backend constructor) stopped at its first
#: GPU step: how far the adapter got on this host, not something the engine said.
CONSTRUCTION_STOP = "[{phase}] {unit} stopped at {step} ({where}) after its checks"
_CONSTRUCTION_STOP = re.compile(re.sub(r"\\\{\w+\\\}", ".+", re.escape(CONSTRUCTION_STOP)))  # the template, any fields


def construction_stop_note(phase: str, unit: str, step: str, where: str) -> str:
    """``CONSTRUCTION_STOP`` filled in."""
    return CONSTRUCTION_STOP.format(phase=phase, unit=unit, step=step, where=where)


def is_construction_stop(note: str) -> bool:
    """Whether ``note`` is a ``CONSTRUCTION_STOP`` note."""
    return _CONSTRUCTION_STOP.fullmatch(note) is not None


#: Significant digits a kernel record keeps of each measured number. The comparison against the
#: tolerance is made on the full values before this (its verdict is the record's ``ok``/``status``);
#: what the file keeps is what a reader compares, and a float64 reference's last bits, which differ
#: between CPUs (summation order, FMA), must not make two runs' files differ.
MEASURE_DIGITS = 4
#: Below this a measured number is float64 noise (a cos diff of 3.6e-15): stored as 0.
MEASURE_FLOOR = 1e-12
#: Parts of a kernel record that are inputs, not measurements: kept exactly (the softmax scale, the
#: tolerances a reader holds the errors to).
EXACT_KEYS = frozenset({"case", "tol", "tolerance", "seed", "kv_scale", "kv_scales", "profile", "margin"})


def stable_measures(value: Any, key: str | None = None) -> Any:
    """A kernel record with every measured float rounded to ``MEASURE_DIGITS`` significant digits
    (those below ``MEASURE_FLOOR`` to 0), so that the same check gives the same file on any machine."""
    if key in EXACT_KEYS:
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return value
        if abs(value) < MEASURE_FLOOR:
            return 0.0
        return float(f"{value:.{MEASURE_DIGITS}g}")
    if isinstance(value, dict):
        return {k: stable_measures(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [stable_measures(v) for v in value]
    if isinstance(value, tuple):
        return tuple(stable_measures(v) for v in value)
    return value
