"""pytest glue: options, collection of matrix files, per-cell records, the controller.

Loaded in every pytest run where pytest-mla is installed (entry point
``pytest11: mla``), so it imports pytest and the pure-Python core only; torch
and triton load inside the kernel check, when a matrix run needs one.
Without ``--mla-matrix`` it adds its options and markers and nothing else.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any, Generator

import pytest

from .collect import RECORD_ATTR, CellItem, MatrixFile, kernel_group
from .core.verdicts import XFAIL, XPASS
from . import user_cells
from .host import probe_host
from .options import (
    DCP_MODES, KERNEL_MODES, Settings, parse_arch, parse_choice, parse_formats, parse_report_name, parse_seed,
    parse_select, parse_shard, parse_timeout,
)
from .runner import MatrixRun, crash_record

MATRIX_OPTION = "--mla-matrix"
DEFAULT_MATRIX_GLOB = "matrix/*.toml"
run_key = pytest.StashKey[MatrixRun]()


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from . import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mla", "pytest-mla: MLA attention-backend compatibility matrix")
    group.addoption(
        MATRIX_OPTION, nargs="?", const="", default=None, metavar="PATHS",
        help="run compatibility matrices: the comma-separated TOML files given, or those of the "
             f"mla_matrix_files ini setting (default {DEFAULT_MATRIX_GLOB}). Off by default.",
    )
    group.addoption("--mla-select", action="append", default=[], metavar="AXIS=V1,V2",
                    help="run only cells whose AXIS is one of the values (repeatable; combine with -k).")
    group.addoption("--mla-shard", default=None, metavar="I/N",
                    help="run the I-th of N deterministic shards of the cells (for parallel CI jobs).")
    group.addoption("--mla-arch", default=None, metavar="ARCH",
                    help="'auto' (default): validate every arch, run kernels for the host's arch; "
                         "or one arch such as sm90 to run only its cells.")
    group.addoption("--mla-kernel", default=None, choices=KERNEL_MODES,
                    help="'auto' (default): check the decode kernel of accepted cells; 'off': validation only.")
    group.addoption("--mla-dcp-mode", default=None, choices=DCP_MODES,
                    help="how DCP ranks run in kernel checks: 'in-process' (default) or 'distributed' "
                         "(one torch.distributed process per rank).")
    group.addoption("--mla-dcp-timeout", default=None, metavar="SECONDS",
                    help="bound on a distributed DCP kernel check before its ranks are killed (default 120).")
    group.addoption("--mla-seed", default=None, metavar="N",
                    help="seed of the kernel checks' random inputs (default: the matrix's [kernel] seed, 0).")
    group.addoption("--mla-report-dir", default=None, metavar="DIR",
                    help="where result files go (default 'reports' under the rootdir); 'none' writes nothing.")
    group.addoption("--mla-report-name", default=None, metavar="TEMPLATE",
                    help="file stem of the result files, with {matrix}, {engine}, {version} "
                         "(default '{matrix}': reports/<matrix>.json).")
    group.addoption("--mla-report-format", default=None, metavar="FORMATS",
                    help="comma-separated formats besides JSON: md, html (default json,md,html).")
    group.addoption("--mla-baseline", default=None, metavar="OLD.json",
                    help="compare with an earlier result file and fail the session on regressions.")
    parser.addini("mla_matrix_files", type="linelist", default=[DEFAULT_MATRIX_GLOB],
                  help="glob patterns (relative to the rootdir) of matrix files run by --mla-matrix")
    parser.addini("mla_report_dir", default="reports", help="default of --mla-report-dir")
    parser.addini("mla_report_name", default="{matrix}", help="default of --mla-report-name")
    parser.addini("mla_report_format", default="json,md,html", help="default of --mla-report-format")
    parser.addini("mla_kernel", default="auto", help="default of --mla-kernel")
    parser.addini("mla_dcp_mode", default="in-process", help="default of --mla-dcp-mode")
    parser.addini("mla_arch", default="auto", help="default of --mla-arch")


def is_controller(config: pytest.Config) -> bool:
    """True in the process that writes reports: plain pytest, or the xdist controller."""
    return not hasattr(config, "workerinput")


def _opt(config: pytest.Config, name: str, ini: str | None = None) -> Any:
    value = config.getoption(name)
    if value is None and ini is not None:
        value = config.getini(ini)
    return value


def read_settings(config: pytest.Config) -> Settings:
    text = config.getoption(MATRIX_OPTION) or ""
    report_dir = _opt(config, "--mla-report-dir", "mla_report_dir")
    timeout = config.getoption("--mla-dcp-timeout")
    return Settings(
        matrix_paths=tuple(p.strip() for p in text.split(",") if p.strip()),
        select=parse_select(config.getoption("--mla-select")),
        report_dir=None if report_dir in ("", "none") else report_dir,
        formats=parse_formats(_opt(config, "--mla-report-format", "mla_report_format")),
        kernel=parse_choice(_opt(config, "--mla-kernel", "mla_kernel"), KERNEL_MODES, "--mla-kernel"),
        dcp_mode=parse_choice(_opt(config, "--mla-dcp-mode", "mla_dcp_mode"), DCP_MODES, "--mla-dcp-mode"),
        seed=parse_seed(config.getoption("--mla-seed")),
        shard=parse_shard(config.getoption("--mla-shard")),
        arch=parse_arch(_opt(config, "--mla-arch", "mla_arch")),
        baseline=config.getoption("--mla-baseline"),
        dcp_timeout=parse_timeout(timeout, "--mla-dcp-timeout") if timeout else 120.0,
        report_name=parse_report_name(_opt(config, "--mla-report-name", "mla_report_name")),
    )


def find_matrix_files(config: pytest.Config, settings: Settings) -> list[Path]:
    invocation = config.invocation_params.dir
    files: list[Path] = []
    if settings.matrix_paths:
        for text in settings.matrix_paths:
            path = (invocation / text).resolve()
            if path.is_dir():
                found = sorted(path.glob("*.toml"))
                if not found:
                    raise pytest.UsageError(f"{MATRIX_OPTION}: no *.toml matrix files in {text}")
                files += found
            elif path.is_file():
                files.append(path)
            else:
                raise pytest.UsageError(f"{MATRIX_OPTION}: matrix file not found: {text}")
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
    return unique


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "mla(**coords): a cell of an MLA compatibility matrix (set by pytest-mla)")
    config.addinivalue_line("markers", "mla_matrix(path, select=None): run a test over the cells of a matrix file")
    if config.getoption(MATRIX_OPTION) is None:
        return
    settings = read_settings(config)
    pin_worker_gpu(config)
    files = find_matrix_files(config, settings)
    _add_collection_args(config, files)
    run = MatrixRun(config, settings, files)
    config.stash[run_key] = run
    if is_controller(config):
        from .controller import ResultCollector

        if settings.baseline:
            from .report.results import ResultFileError, read_results

            try:
                run.baseline = read_results(settings.baseline)
            except ResultFileError as exc:
                raise pytest.UsageError(f"--mla-baseline: {exc}") from None

        config.pluginmanager.register(ResultCollector(config, run), "mla-results")


def pin_worker_gpu(config: pytest.Config) -> None:
    """One GPU per xdist worker when the host has several (before any kernel imports torch)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or "CUDA_VISIBLE_DEVICES" in os.environ:
        return
    gpus = probe_host().get("gpus", 0)
    worker = str(workerinput.get("workerid", ""))
    if gpus > 1 and worker.startswith("gw") and worker[2:].isdigit():
        os.environ["CUDA_VISIBLE_DEVICES"] = str(int(worker[2:]) % gpus)


def _add_collection_args(config: pytest.Config, files: list[Path]) -> None:
    """Collect the matrix files: alone when no paths were given, else besides them."""
    explicit = config.args_source == pytest.Config.ArgsSource.ARGS
    if not explicit:
        config.args[:] = [os.fspath(f) for f in files]
        return
    given = [(config.invocation_params.dir / a.split("::")[0]).resolve() for a in config.args]
    for f in files:
        if not any(f == g or g in f.parents for g in given):
            config.args.append(os.fspath(f))


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> MatrixFile | None:
    run = parent.config.stash.get(run_key, None)
    if run is not None and file_path.suffix == ".toml" and file_path.resolve() in run.files:
        return MatrixFile.from_parent(parent, path=file_path)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run = config.stash.get(run_key, None)
    if run is None:
        return
    settings = run.settings
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
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    if hasattr(config, "workerinput"):
        # Workers take cells in chunks: with the arch outermost, the other archs'
        # cells come after their kernel result is shared (same order on every worker).
        arch_rank = {arch: i for i, arch in enumerate(_arch_order(items))}
        items.sort(key=lambda it: arch_rank.get(it.cell.arch, -1) if isinstance(it, CellItem) else -1)


def _arch_order(items: list[pytest.Item]) -> list[str]:
    order: list[str] = []
    for item in items:
        if isinstance(item, CellItem) and item.cell.arch not in order:
            order.append(item.cell.arch)
    return order


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    user_cells.generate(metafunc)


@pytest.fixture
def mla_cell(request: pytest.FixtureRequest) -> user_cells.MlaCell:
    """The matrix cell of a test marked ``@pytest.mark.mla_matrix(path, select=..., expect=...)``."""
    raise pytest.UsageError(f"{request.node.nodeid}: mla_cell needs @pytest.mark.mla_matrix(\"matrix/x.toml\")")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    if not isinstance(item, CellItem):
        if report.when == "call" or not report.passed:
            user = user_cells.user_record(item, report)
            if user is not None:
                setattr(report, user_cells.USER_RECORD_ATTR, user)
        return report
    if report.when == "call" or (report.when == "setup" and not report.passed):
        record = item.record
        if record is None:  # the harness itself raised, or setup failed/skipped
            run = item.config.stash[run_key]
            loaded = run.load(item.path)
            if report.skipped and not hasattr(report, "wasxfail"):
                reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
                record = crash_record(loaded.matrix, item.cell, item.expectation, reason)
                record["verdict"] = "skip"
            else:
                message = call.excinfo.exconly() if call.excinfo else "no result"
                record = crash_record(loaded.matrix, item.cell, item.expectation, f"harness error: {message}")
        record = dict(record)
        if hasattr(report, "wasxfail"):
            record["verdict"] = XFAIL if report.skipped else XPASS
            record["xfail_reason"] = report.wasxfail
        setattr(report, RECORD_ATTR, record)
    return report


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    run = config.stash.get(run_key, None)
    if run is None:
        return None
    host = probe_host()
    gpu = f" ({host['gpu']})" if host.get("gpu") else ""
    mode = "interpreter (TRITON_INTERPRET=1)" if host["arch"] == "cpu" or os.environ.get("TRITON_INTERPRET") == "1" \
        else "compiled"
    lines = [f"mla: host {host['arch']}{gpu}; triton {mode}; kernel checks {run.settings.kernel}; "
             f"dcp mode {run.settings.dcp_mode}"]
    for file in run.files:
        try:
            loaded = run.load(file)
        except Exception as exc:
            lines.append(f"mla: {run.display_path(file)}: cannot be loaded ({type(exc).__name__}; see errors)")
            continue
        eng = loaded.engine
        engine = f"{loaded.matrix.engine_name} {eng.version}" if eng is not None else \
            f"{loaded.matrix.engine_name} (unavailable)"
        lines.append(f"mla: {run.display_path(file)}: engine {engine}, {loaded.matrix.size} cells")
    return lines
