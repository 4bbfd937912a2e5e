"""pytest-mla's pytest wiring: options, hooks and registration, and nothing else.

Loaded in every pytest run where pytest-mla is installed (entry point
``pytest11: mla``), so it imports pytest and light modules only (the core,
the collection and run state); torch and triton load inside the kernel
check, when a matrix run needs one. Without ``--mla-matrix`` it adds its
options and markers and nothing else. The work is done by ``options``
(settings), ``collect`` (files, items, selection, records), ``runner``
(engines and cells) and ``controller`` (results and report files).
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any, Generator

import pytest

from . import collect, user_cells
from .collect import RECORD_ATTR, CellItem, MatrixFile
from .core.errors import MatrixError
from .core.host import environment_problems, kernel_dependencies_missing, probe_host, worker_gpu
from .options import MATRIX_OPTION, add_options, read_settings
from .runner import MatrixRun, run_key


#: Whether this session froze the garbage collector's view of the collected objects.
gc_frozen_key = pytest.StashKey[bool]()


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from . import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def is_controller(config: pytest.Config) -> bool:
    """True in the process that writes reports: plain pytest, or the xdist controller."""
    return not hasattr(config, "workerinput")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "mla(**coords): a cell of an MLA compatibility matrix (set by pytest-mla)")
    config.addinivalue_line("markers", "mla_matrix(path, select=None): run a test over the cells of a matrix file")
    if config.getoption(MATRIX_OPTION) is None:
        return
    problems = environment_problems()
    if problems:
        raise pytest.UsageError("\n".join(problems))
    config.add_cleanup(lambda: unfreeze(config))
    settings = read_settings(config)
    pin_worker_gpu(config)
    files, named = collect.find_matrix_files(config, settings)
    if is_controller(config):
        collect.check_test_paths(config, files, settings)
    collect.add_collection_args(config, files)
    run = MatrixRun(config, settings, files, named=named)
    config.stash[run_key] = run
    if is_controller(config):
        from .controller import ResultCollector, check_report_folder

        collect.check_selection(run)
        check_report_folder(config, settings.report_dir)
        if settings.baseline:
            run.baseline = read_baseline(run, settings.baseline)
        collector = ResultCollector(config, run)
        config.pluginmanager.register(collector, "mla-results")
        stop_on_sigterm(config, collector)
        finish_on_second_interrupt(config, collector)


def read_baseline(run: MatrixRun, path: str) -> dict[str, Any]:
    """The ``--mla-baseline`` document; it must be a result of one of this run's matrices."""
    from .report.results import ResultFileError, read_results

    try:
        baseline = read_results(path)
    except ResultFileError as exc:
        raise pytest.UsageError(f"--mla-baseline: {exc}") from None
    names = []
    for file in run.files:
        try:
            names.append(run.load(file).matrix.name)
        except MatrixError:
            continue  # reported at collection
    old = baseline["run"].get("matrix")
    if names and old not in names:
        raise pytest.UsageError(f"--mla-baseline: {path} is a result of matrix {old!r}, not of "
                                f"{' or '.join(repr(n) for n in names)}: compare runs of the same matrix")
    return baseline


def stop_on_sigterm(config: pytest.Config, collector: Any) -> None:
    """SIGTERM (a cancelled CI job, a polite OOM killer) ends the session like Ctrl-C: the
    finished cells are written with ``complete: false``. A handler someone else installed stays."""
    import signal
    import threading

    if not hasattr(signal, "SIGTERM") or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def interrupt(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM kills at once
        collector.interrupted = True  # known here, whatever happens to the exception on its way
        raise KeyboardInterrupt(f"SIGTERM (signal {signum})")

    signal.signal(signal.SIGTERM, interrupt)
    config.add_cleanup(lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)
                       if signal.getsignal(signal.SIGTERM) is interrupt else None)


#: Ctrl-C presses ignored after the first before one gets through (a teardown that hangs).
PATIENCE = 3


def finish_on_second_interrupt(config: pytest.Config, collector: Any) -> None:
    """The first Ctrl-C interrupts the run as always, and marks it interrupted at once; the next
    few, while pytest winds down and the finished cells are written, are ignored with a line.

    An impatient second press used to land inside pytest's own handling of the first (formatting
    its traceback): the report then said ``interrupted: false`` and the terminal ended in a
    traceback. The fourth press after the first gets through, for a teardown that hangs.
    A handler someone else installed stays."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGINT)
    if current is not signal.default_int_handler and not getattr(current, "mla_exiting", False):
        return
    presses = []

    def interrupt(signum: int, frame: Any) -> None:
        __tracebackhide__ = True  # pytest shows where the run was, not this handler
        presses.append(signum)
        if len(presses) == 1 or len(presses) > PATIENCE + 1:
            collector.interrupted = True
            signal.default_int_handler(signum, frame)  # raises KeyboardInterrupt where the run was
        left = PATIENCE + 2 - len(presses)
        os.write(2, (f"\nmla: interrupted; writing the finished cells first (Ctrl-C {left} more "
                     f"time{'s' if left > 1 else ''} to abort without them)\n").encode())

    def exiting(signum: int, frame: Any) -> None:
        presses.append(signum)
        if len(presses) > PATIENCE + 1:
            signal.default_int_handler(signum, frame)

    exiting.mla_exiting = True  # type: ignore[attr-defined]  # a later session in this process replaces it

    def restore() -> None:
        if signal.getsignal(signal.SIGINT) is not interrupt:
            return
        # An interrupted run has written its report and is on its way out: a press now lands in the
        # interpreter's shutdown (threading._shutdown) and would end the terminal in a traceback.
        signal.signal(signal.SIGINT, exiting if presses else signal.default_int_handler)

    signal.signal(signal.SIGINT, interrupt)
    config.add_cleanup(restore)


def pin_worker_gpu(config: pytest.Config) -> None:
    """One GPU per xdist worker when the host has several (before any kernel imports torch)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or "CUDA_VISIBLE_DEVICES" in os.environ:
        return
    gpu = worker_gpu(str(workerinput.get("workerid", "")), probe_host().get("gpus", 0))
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> MatrixFile | None:
    run = parent.config.stash.get(run_key, None)
    if run is not None and file_path.suffix == ".toml" and file_path.resolve() in run.files:
        nodeid = collect.matrix_nodeid(parent.config, file_path.resolve())
        if nodeid is not None:
            return MatrixFile.from_parent(parent, path=file_path, nodeid=nodeid)
        return MatrixFile.from_parent(parent, path=file_path)
    return None


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_collection(session: pytest.Session) -> Generator[None, Any, Any]:
    """Collection makes tens of objects per cell that live for the whole session (items, markers,
    cells, expectations). The cyclic garbage collector can free none of them, yet it walked all of
    them again and again: with the walks during the run, the largest cost of a validation-only
    matrix run (perf: gc_collect_main and the visits it calls). So a matrix session collects with
    the collector paused, then freezes what it collected: later collections leave it out, until
    ``unfreeze`` gives it back. Not done when someone else froze objects already."""
    pause = (session.config.stash.get(run_key, None) is not None and gc.isenabled()
             and gc.get_freeze_count() == 0)
    if pause:
        gc.disable()
    try:
        return (yield)
    finally:
        if pause:
            gc.enable()
            gc.freeze()
            session.config.stash[gc_frozen_key] = True


def unfreeze(config: pytest.Config) -> None:
    """Give the objects ``pytest_collection`` froze back to the garbage collector (a pytest run
    inside a longer process must not keep its session forever). A config cleanup registered
    first, so it runs last: after pytest's own collections at the end of the session, which then
    need not walk the frozen objects either."""
    if config.stash.get(gc_frozen_key, False):
        gc.unfreeze()
        config.stash[gc_frozen_key] = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run = config.stash.get(run_key, None)
    if run is None:
        return
    keep, dropped = collect.select_items(items, run.settings)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    if not is_controller(config):
        collect.order_for_workers(items)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    user_cells.generate(metafunc)


@pytest.fixture
def mla_cell(request: pytest.FixtureRequest) -> user_cells.MlaCell:
    """The matrix cell of a test marked ``@pytest.mark.mla_matrix(path, select=..., expect=...)``."""
    raise pytest.UsageError(f"{request.node.nodeid}: mla_cell needs @pytest.mark.mla_matrix(\"matrix/x.toml\")")


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outside skipping's wrapper: sees xfail applied
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    if not isinstance(item, CellItem):
        if report.when == "call" or not report.passed:
            user = user_cells.user_record(item, report)
            if user is not None:
                setattr(report, user_cells.USER_RECORD_ATTR, user)
        return report
    if report.when == "call" or (report.when == "setup" and not report.passed):
        setattr(report, RECORD_ATTR, collect.finish_record(item, report, call))
    return report


@pytest.hookimpl(wrapper=True)
def pytest_report_to_serializable(config: pytest.Config, report: Any) -> Generator[None, Any, Any]:
    """A cell's record leaves an xdist worker as one JSON text (one string for execnet to carry,
    not a tree of small objects)."""
    data = yield
    if isinstance(data, dict) and isinstance(data.get(RECORD_ATTR), dict):
        data[RECORD_ATTR] = collect.record_text(data[RECORD_ATTR])
    return data


@pytest.hookimpl(tryfirst=True)
def pytest_report_from_serializable(config: pytest.Config, data: Any) -> None:
    """... and is a record again on the controller, before pytest rebuilds the report."""
    if isinstance(data, dict) and isinstance(data.get(RECORD_ATTR), str):
        data[RECORD_ATTR] = collect.record_from_text(data[RECORD_ATTR])


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    run = config.stash.get(run_key, None)
    if run is None:
        return None
    host = probe_host()
    gpu = f" ({host['gpu']})" if host.get("gpu") else ""
    mode = "interpreter (TRITON_INTERPRET=1)" if host["arch"] == "cpu" or os.environ.get("TRITON_INTERPRET") == "1" \
        else "compiled"
    missing = kernel_dependencies_missing() if run.settings.kernel != "off" else None
    kernels = f"unavailable: {missing}" if missing else run.settings.kernel
    if not missing and run.settings.kernel != "off" and run.settings.tier == "quick":
        kernels += " (quick tier: on a covering sample)"
    triton = "" if missing else f"triton {mode}; "
    lines = [f"mla: host {host['arch']}{gpu}; {triton}kernel checks {kernels}; dcp mode {run.settings.dcp_mode}"]
    for file in run.files:
        try:
            loaded = run.load(file)
        except MatrixError as exc:
            lines += [f"mla: {line}" for line in exc.format().splitlines()[:3]]
            continue
        except Exception as exc:
            lines.append(f"mla: {run.display_path(file)}: cannot be loaded ({type(exc).__name__}; see errors)")
            continue
        eng = loaded.engine
        engine = f"{getattr(eng, 'name', None) or loaded.matrix.engine_name} {eng.version}" if eng is not None else \
            f"{loaded.matrix.engine_name} (unavailable)"
        if loaded.assumed_version is not None:
            engine += f" (rules of {loaded.assumed_version})"
        lines.append(f"mla: {run.display_path(file)}: engine {engine}, {loaded.matrix.size} cells")
        coverage = loaded.coverage or {}
        if coverage.get("error"):
            lines.append(f"mla: {run.display_path(file)}: backend coverage unknown: {coverage['error']}")
        elif coverage.get("uncovered_mla"):
            lines.append(f"mla: {run.display_path(file)}: not covered: {len(coverage['uncovered_mla'])} MLA-capable "
                         f"backends the engine registers: {', '.join(coverage['uncovered_mla'])}")
        elif coverage:
            lines.append(f"mla: {run.display_path(file)}: covers every MLA-capable backend the engine registers "
                         f"({len(coverage['mla_capable'])})")
    return lines
