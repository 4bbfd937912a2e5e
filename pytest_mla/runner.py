"""Per-process state of a matrix run: matrices, engines, kernel results, the cell runner.

One ``MatrixRun`` lives in ``config.stash[run_key]`` in every process (the
controller and each xdist worker). ``run_cell`` turns one cell into a
``CellRecord`` of plain values; nothing here writes report files.

PYTEST_DONT_REWRITE: its ``assert`` statements raise as plain Python's do, so a message
that reaches a report never changes with pytest's ``-v`` or ``$CI``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
import traceback
from pathlib import Path
from typing import Any, Sequence

import pytest

from .core.cells import Cell, arch_number, expand_cells
from .core.deadline import CellTimeout, Deadline
from .core.errors import STEP_FAILURES, MatrixError, Problem, describe_failure
from .core.host import kernel_dependencies_missing
from .core.matrix import Matrix, load_matrix
from .core.models import ModelConfig, ModelConfigError
from .core.records import CellRecord, KernelResult, new_record, not_run, stable_measures
from .core.rules import Expectation
from .core.sample import covering_sample
from .core.verdicts import ACCEPTED, CRASHED, ERROR, FAIL, KERNEL_FAILED, PASS, SKIP, Outcome, judge
from .engines.protocol import (AdapterError, Configured, Engine, KernelSpec, NotServedError, UnreachableError,
                               optional_step)
from .engines.registry import EngineNotFoundError, EngineUnavailableError, check_adapter, load_engine
from .options import Settings, selected_axes
from .report.results import write_json_atomic

#: Key of ``workerinput`` naming the folder where workers share kernel results.
KERNEL_CACHE_INPUT = "mla_kernel_cache"


#: The kernel reason of an accepted cell a quick run validated only.
QUICK_TIER_REASON = ("quick tier: validated only, outside the covering sample (its numeric check runs in the "
                     "full tier, --mla-tier=full)")


@dataclasses.dataclass
class LoadedMatrix:
    matrix: Matrix
    engine: Engine | None
    skip_reason: str | None  # every cell skips (the engine is not installed here)
    assumed_version: str | None = None  # --mla-assume-version for this engine
    coverage: dict[str, Any] | None = None  # see ``coverage_of``
    #: ``--mla-tier=quick``: the ids of the cells whose numeric checks run (None: every cell's).
    sample: frozenset[str] | None = None

    @property
    def rules_version(self) -> str | None:
        """The engine version the matrix's rules are evaluated for."""
        if self.assumed_version is not None:
            return self.assumed_version
        return str(self.engine.version) if self.engine is not None else None


class MatrixRun:
    def __init__(self, config: pytest.Config, settings: Settings, files: list[Path], *,
                 named: set[Path] | frozenset[Path] = frozenset()) -> None:
        self.config = config
        self.settings = settings
        self.files = files
        self.named = named  # files named one by one with --mla-matrix=FILE: their engine must be here
        self._loaded: dict[Path, LoadedMatrix] = {}
        self._engines: dict[str, Engine | Exception] = {}
        self._kernel_results: dict[tuple[Any, ...], KernelResult] = {}
        self._host_kernel_target: str | None = None  # "interpreter" or an arch, once known
        self._kernels_missing: tuple[str] | None = None
        self._extra_models: dict[str, ModelConfig] | None = None
        self.baseline: dict[str, Any] | None = None  # the --mla-baseline document (controller only)

    # -- loading ---------------------------------------------------------------------
    def display_path(self, path: Path) -> str:
        try:
            return os.fspath(path.relative_to(self.config.rootpath))
        except ValueError:
            return os.fspath(path)

    def extra_models(self) -> dict[str, ModelConfig]:
        if self._extra_models is None:
            self._extra_models = hook_models(self.config)
        return self._extra_models

    def load(self, path: Path) -> LoadedMatrix:
        """Load (once per process) a matrix file and its engine; ``MatrixError`` if broken."""
        known = self._loaded.get(path)  # every cell asks: skip resolve() (a syscall per part) when we can
        if known is not None:
            return known
        given, path = path, path.resolve()
        if path not in self._loaded:
            shown = self.display_path(path)
            matrix = load_matrix(path, extra_models=self.extra_models(), display_path=shown,
                                 max_cells=self.settings.max_cells)
            engine, reason = self.engine(matrix)
            if engine is None and path in self.named:
                # A nightly that lost its engine must not be green: a file named on the command
                # line runs or stops the session; one found through mla_matrix_files may skip.
                raise MatrixError(shown, [Problem("engine.name", f"{reason}; a matrix file named with --mla-matrix "
                                                                 "must run (files found through mla_matrix_files "
                                                                 "or a folder skip instead)")])
            loaded = LoadedMatrix(matrix, engine, reason, self.settings.assumed_version(matrix.engine_name))
            if engine is not None:
                check_described(loaded, shown)
                check_known_archs(matrix, engine, shown)
                loaded.coverage = coverage_of(matrix, engine)
            self._loaded[path] = loaded
        self._loaded[given] = self._loaded[path]
        return self._loaded[path]

    def engine(self, matrix: Matrix) -> tuple[Engine | None, str | None]:
        name = matrix.engine_name
        if name not in self._engines:
            try:
                made = self._hooked_engine(name)
                if made is None:
                    extra: dict[str, Any] = {}
                    for result in self.config.hook.pytest_mla_engines(config=self.config):
                        extra.update(result or {})
                    made = load_engine(name, extra)
                self._engines[name] = made
            except EngineUnavailableError as exc:
                self._engines[name] = exc
            except EngineNotFoundError as exc:
                hint = self._path_hint(name) if exc.module_missing else ""
                raise MatrixError(matrix.path, [Problem("engine.name", str(exc) + hint)]) from None
        engine = self._engines[name]
        if isinstance(engine, Exception):
            return None, str(engine)
        return engine, None

    def quick_sample(self, loaded: LoadedMatrix,
                     cells: Sequence[tuple[Cell, Expectation]] | None = None) -> frozenset[str] | None:
        """A quick run's covering sample of ``loaded``'s selected cells (``core/sample.py``), computed once
        per process (None: a full run). ``cells``: the (cell, expectation) pairs, when already built."""
        if self.settings.tier != "quick":
            return None
        if loaded.sample is None:
            if cells is None:
                version = loaded.rules_version
                cells = [(cell, loaded.matrix.expectation(cell, version))
                         for cell in expand_cells(selected_axes(loaded.matrix.axes, self.settings))]
            loaded.sample = frozenset(covering_sample(cells, loaded.matrix.models))
        return loaded.sample

    def _hooked_engine(self, name: str) -> Engine | None:
        """The engine a ``pytest_mla_make_engine`` hook makes (None: no hook makes one), held to the
        protocol as a loaded adapter is."""
        try:
            made = self.config.hook.pytest_mla_make_engine(config=self.config, name=name)
        except STEP_FAILURES as exc:
            raise EngineNotFoundError(f"engine {name!r}: the pytest_mla_make_engine hook raised "
                                      f"{describe_failure(exc)}") from None
        if made is not None:
            check_adapter(made, f"engine {name!r} (made by a pytest_mla_make_engine hook)")
        return made

    def _path_hint(self, name: str) -> str:
        """Why a ``module:attr`` in the rootdir does not import: the ``pytest`` command (unlike
        ``python -m pytest``) does not put the rootdir on ``sys.path``."""
        import sys

        module = name.partition(":")[0].split(".")[0]
        root = self.config.rootpath
        if ":" not in name or not module.isidentifier() or module in sys.modules:
            return ""
        if not ((root / f"{module}.py").is_file() or (root / module / "__init__.py").is_file()):
            return ""
        return (f" ({module} is in the rootdir {root}, which the pytest command does not put on sys.path: run "
                "python -m pytest, or set pythonpath = . in the pytest ini)")

    # -- running one cell ----------------------------------------------------------------
    def run_cell(self, loaded: LoadedMatrix, cell: Cell, expect: Expectation) -> CellRecord:
        start = time.perf_counter()
        record = new_record(loaded.matrix.name, cell, expect)
        if loaded.skip_reason or loaded.engine is None:
            record.update(verdict=SKIP, reason=loaded.skip_reason)
            return _timed(record, start)
        if expect.kind == SKIP:  # a `skip = "reason"` rule: the configuration does not apply; never ask the engine
            record.update(verdict=SKIP, reason=expect.reason)
            return _timed(record, start)
        deadline = Deadline(self.settings.cell_timeout)
        try:
            with deadline:
                self._run_engine_and_kernel(loaded, cell, expect, record, deadline)
        except CellTimeout as exc:
            record.update(verdict=ERROR, reason=f"{exc} (--mla-cell-timeout)")
            if record.get("outcome") is None:
                record["outcome"] = Outcome.from_exception(exc, crashed=True).as_dict()
        return _timed(record, start)

    def _run_engine_and_kernel(self, loaded: LoadedMatrix, cell: Cell, expect: Expectation,
                               record: CellRecord, deadline: Deadline) -> None:
        engine = loaded.engine
        assert engine is not None
        model = loaded.matrix.model(cell)
        configured: Configured | None = None
        try:
            configured = engine.configure(cell, model)
            outcome = protocol_outcome(engine, configured) or Outcome(ACCEPTED, backends=dict(configured.backends))
            if outcome.kind != ACCEPTED:
                configured = None
        except NotServedError as exc:  # the engine serves the model with other attention: no backend sees it
            record.update(outcome=Outcome.from_exception(exc, crashed=True).as_dict(), verdict=SKIP,
                          reason=f"not served: {exc}")
            return
        except UnreachableError as exc:  # the engine's code needs another platform's library: not checkable here
            record.update(outcome=Outcome.from_exception(exc, crashed=True).as_dict(), verdict=SKIP,
                          reason=f"unreachable on this host: {exc}")
            return
        except AdapterError as exc:  # the adapter's own failure: never reported as the engine's refusal
            outcome = Outcome.from_exception(exc, crashed=True)
            record["traceback"] = portable_traceback(exc)
        except getattr(engine, "refusal_errors", ()) as exc:  # an adapter may leave it out (registry.check_adapter)
            outcome = Outcome.from_exception(exc)
        except STEP_FAILURES as exc:  # SystemExit too: a crash of this cell, never the end of the run
            outcome = Outcome.from_exception(exc, crashed=True)
            if isinstance(exc, SystemExit):
                outcome = dataclasses.replace(outcome, message=f"{outcome.message} in {type(engine).__name__}"
                                                               f".configure()")
            record["traceback"] = portable_traceback(exc)
        verdict, reason = judge(expect, outcome)
        record["outcome"] = outcome.as_dict()
        if configured is not None and configured.notes:
            record["notes"] = list(configured.notes)
        if configured is not None:
            deadline.phase = "the kernel check"
            kernel = self.kernel_check(loaded.matrix, cell, model, configured, run=verdict == PASS,
                                       engine=engine, sampled=self._sampled(loaded, cell))
            record["kernel"] = kernel
            if kernel["status"] == KERNEL_FAILED:
                verdict = ERROR if kernel.get("crashed") else FAIL
                reason = kernel.get("message") or "kernel out of tolerance"
        record.update(verdict=verdict, reason=reason)

    def _sampled(self, loaded: LoadedMatrix, cell: Cell) -> bool:
        sample = self.quick_sample(loaded)
        return sample is None or cell.id in sample

    # -- kernels -------------------------------------------------------------------------
    def kernel_check(self, matrix: Matrix, cell: Cell, model: ModelConfig, configured: Configured,
                     *, run: bool, engine: Engine | None = None, sampled: bool = True) -> KernelResult:
        if not run:
            return not_run("the engine's answer did not match the expectation")
        if self.settings.kernel == "off":
            return not_run("kernel checks disabled (--mla-kernel=off)")
        if not sampled:
            return not_run(QUICK_TIER_REASON)
        missing = self.kernels_missing()
        if missing:  # no kernel of any kind can run here
            return not_run(missing)
        spec: KernelSpec | None = self.config.hook.pytest_mla_kernel(
            config=self.config, cell=cell, spec=configured.kernel) or configured.kernel
        if spec is None:
            return not_run(configured.kernel_reason or "the engine declares no decode kernel for this backend")
        where = self.kernel_target()
        if where != "interpreter" and where != cell.arch:
            return not_run(f"needs an {cell.arch} GPU; this host is {where}")
        from .kernels import harness  # torch and triton load here, not at plugin import

        seed = self.settings.seed if self.settings.seed is not None else matrix.seed
        try:
            case = harness.case_for(cell.coords, model, seed=seed, dtype=matrix.kernel_dtype,
                                    overrides=dict(spec.case))
        except harness.CaseTooLarge as exc:
            return not_run(str(exc))
        except (ValueError, TypeError) as exc:  # coordinates no check can be built for (tp not dividing the heads)
            return KernelResult(status=KERNEL_FAILED, where=where, crashed=True,
                                message=f"cannot build a kernel check for this cell: {exc}")
        key = (case, spec, where, self.settings.dcp_mode)
        cached = self._kernel_results.get(key) or self._shared_result(key)
        if cached is not None:
            self._kernel_results[key] = cached
            return {**cached, "reused": True}
        elsewhere = optional_step(engine, "run_check")  # the engine runs it where it configured (None: here)
        try:
            result = elsewhere(case, spec, where=where, dcp_mode=self.settings.dcp_mode,
                               timeout_s=self.settings.dcp_timeout)
        except STEP_FAILURES as exc:  # the adapter's own failure: never the kernel's numbers
            return KernelResult(status=KERNEL_FAILED, where=where, crashed=True,
                                message=str(AdapterError("run_check", describe_failure(exc),
                                                         engine=engine.name, version=engine.version)))
        if result is None:
            result = run_check(case, spec, where=where, dcp_mode=self.settings.dcp_mode,
                               timeout_s=self.settings.dcp_timeout)
        result = stable_measures({**result, "kernel": spec.name, "reused": False})
        self._kernel_results[key] = result
        self._share_result(key, result)
        return result

    # Under xdist each worker is its own process: a folder made by the controller
    # (``workerinput["mla_kernel_cache"]``) lets a result computed for one arch's
    # cell on one worker serve the other archs' cells on the others.
    def _shared_path(self, key: tuple[Any, ...]) -> Path | None:
        folder = getattr(self.config, "workerinput", {}).get(KERNEL_CACHE_INPUT)
        if not folder:
            return None
        return Path(folder) / (hashlib.sha256(repr(key).encode()).hexdigest()[:32] + ".json")

    def _shared_result(self, key: tuple[Any, ...]) -> KernelResult | None:
        path = self._shared_path(key)
        if path is None or not path.exists():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # a half-written or vanished file: compute it again

    def _share_result(self, key: tuple[Any, ...], result: KernelResult) -> None:
        path = self._shared_path(key)
        if path is not None:
            try:
                write_json_atomic(path, result)
            except (OSError, TypeError, ValueError):
                pass  # sharing is an optimisation only

    def kernels_missing(self) -> str | None:
        """``kernel_dependencies_missing()``, looked up once per process (not once per cell)."""
        if self._kernels_missing is None:
            self._kernels_missing = (kernel_dependencies_missing() or "",)
        return self._kernels_missing[0] or None

    def kernel_target(self) -> str:
        if self._host_kernel_target is None:
            from .kernels import _mode  # decides TRITON_INTERPRET before any kernel module loads

            self._host_kernel_target = _mode.ensure_triton_mode()
        return self._host_kernel_target


def protocol_outcome(engine: Engine, configured: Any) -> Outcome | None:
    """The adapter error of a ``configure()`` that broke the protocol (None: it kept it)."""
    if isinstance(configured, Configured):
        broken = configured_problem(configured)
        if broken is None:
            return None
        message = f"{type(engine).__name__}.configure() returned a Configured whose {broken}"
    else:
        message = (f"{type(engine).__name__}.configure() must return pytest_mla.engines.protocol.Configured "
                   f"(or raise the engine's refusal), got {type(configured).__name__}")
    return Outcome(CRASHED, "AdapterError", message)


def configured_problem(configured: Configured) -> str | None:
    """What breaks the protocol in an accepted configuration's fields (None: nothing)."""
    from collections.abc import Mapping

    backends = configured.backends
    if not isinstance(backends, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in backends.items()):
        return f"backends is not a mapping of role to backend name: {backends!r:.80}"
    if configured.kernel is not None and not isinstance(configured.kernel, KernelSpec):
        return f"kernel is not a KernelSpec or None: {type(configured.kernel).__name__}"
    if configured.kernel_reason is not None and not isinstance(configured.kernel_reason, str):
        return f"kernel_reason is not text or None: {type(configured.kernel_reason).__name__}"
    if isinstance(configured.notes, (str, bytes)) or not all(isinstance(n, str) for n in configured.notes or ()):
        return f"notes is not a sequence of text: {configured.notes!r:.80}"
    return None


def run_check(case: Any, spec: KernelSpec, *, where: str, dcp_mode: str, timeout_s: float) -> KernelResult:
    """One numeric check in this process (``kernels.run.run_check``; torch loads here, not at plugin import)."""
    from .kernels.run import run_check as run_here

    return run_here(case, spec, where=where, dcp_mode=dcp_mode, timeout_s=timeout_s)


def hook_models(config: pytest.Config) -> dict[str, ModelConfig]:
    """Catalogue entries registered through ``pytest_mla_models``."""
    models: dict[str, ModelConfig] = {}
    for result in config.hook.pytest_mla_models(config=config):
        for name, entry in (result or {}).items():
            if isinstance(entry, ModelConfig):
                models[name] = entry
                continue
            try:
                models[name] = ModelConfig.from_mapping(name, entry)
            except ModelConfigError as exc:
                raise MatrixError("pytest_mla_models", [Problem(f"{name}.{exc.key}", exc.message)]) from None
    return models


def check_described(loaded: LoadedMatrix, shown: str) -> None:
    """A matrix that does not describe the version its rules are evaluated for stops the session (never all-skip)."""
    matrix, version = loaded.matrix, loaded.rules_version
    if matrix.describes(version):
        return
    installed = loaded.engine.version if loaded.engine is not None else None
    if loaded.assumed_version is not None:
        message = (f"describes {matrix.engine_name} {matrix.engine_versions}, but --mla-assume-version asks for "
                   f"{version} ({installed} is installed)")
    else:
        message = (f"describes {matrix.engine_name} {matrix.engine_versions}, but {matrix.engine_name} {installed} "
                   f"is installed (--mla-assume-version=V evaluates its rules as if V were installed)")
    raise MatrixError(shown, [Problem("engine.version", message)])


def check_known_archs(matrix: Matrix, engine: Engine, shown: str) -> None:
    """An arch value the installed release has no platform for is an error of the file (never a cell error).

    Asked of every adapter (``Engine.known_archs``: the arch values the installed
    release can fake; ``"smNN"`` stands for every NVIDIA arch). An adapter that
    cannot say (None, the default) or cannot answer (``AdapterError``: its setup
    failed) refuses no arch: its cells report why.
    """
    known_archs = optional_step(engine, "known_archs")
    try:
        answer = known_archs()
        if answer is None:
            return
        known = tuple(str(a) for a in answer)
    except AdapterError:
        return
    except STEP_FAILURES as exc:
        raise MatrixError(shown, [Problem("engine.name", f"adapter step 'known_archs' failed on {engine.name} "
                                                         f"{engine.version}: {describe_failure(exc)}")]) from None
    problems = []
    for arch in matrix.axes.get("arch", ()):
        if arch in known or (arch_number(arch) is not None and "smNN" in known):
            continue
        problems.append(Problem("axes.arch", f"{engine.name} {engine.version} has no platform for arch {arch!r} "
                                             f"(known: {', '.join(known)})", matrix.value_lines.get(("arch", arch))))
    if problems:
        raise MatrixError(shown, problems)


def coverage_of(matrix: Matrix, engine: Engine) -> dict[str, Any] | None:
    """The MLA-capable backends the engine registers and the matrix does not list (None: the adapter cannot say).

    A backend value ``P+D`` covers both halves.
    """
    registered = optional_step(engine, "registered_backends")
    try:
        answer = registered()
        if answer is None:
            return None
        backends = {str(k): bool(v) for k, v in dict(answer).items()}
    except STEP_FAILURES as exc:  # the listing is advisory: say why it is missing, never fail the cells for it
        return {"error": f"registered_backends() failed: {describe_failure(exc)}"}
    listed = {part for value in matrix.axes.get("backend", ()) for part in str(value).split("+")}
    mla = sorted(name for name, capable in backends.items() if capable)
    return {"registered": sorted(backends), "mla_capable": mla,
            "uncovered_mla": [name for name in mla if name not in listed]}


def _timed(record: CellRecord, start: float) -> CellRecord:
    record["duration_s"] = round(time.perf_counter() - start, 6)
    return record


#: The run object of this process (controller or worker), beside the class it holds.
run_key = pytest.StashKey[MatrixRun]()


def portable_traceback(exc: BaseException, limit: int = -8) -> str:
    """The last ``limit`` frames of ``exc``'s traceback, with the interpreter's library folders shown as
    ``<site-packages>/`` / ``<prefix>/`` and the working directory dropped: a result file records what
    happened, not where this checkout or its venv lives (the same run elsewhere writes the same file)."""
    import sys
    import sysconfig

    text = "".join(traceback.format_exception(exc, limit=limit))
    prefixes = {sysconfig.get_paths()[k]: "<site-packages>" for k in ("purelib", "platlib")}
    prefixes.update({sys.prefix: "<prefix>", sys.base_prefix: "<prefix>", os.getcwd(): ""})
    for path in sorted(prefixes, key=len, reverse=True):  # the longest (most specific) first
        name = prefixes[path]
        text = text.replace(path.rstrip(os.sep) + os.sep, f"{name}/" if name else "")
    return text
