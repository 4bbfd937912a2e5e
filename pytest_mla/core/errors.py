"""Errors that say where: file, line, key path, message."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Problem:
    """One problem found in a matrix file; ``path`` is a key path like ``rules[3].when.arch``."""

    path: str
    message: str
    line: int | None = None


class MatrixError(Exception):
    """A broken matrix file. Prints as ``FILE:LINE: PATH: MESSAGE``, one line per problem."""

    def __init__(self, file: str, problems: list[Problem]) -> None:
        self.file = file
        self.problems = problems
        super().__init__(self.format())

    @property
    def line(self) -> int | None:
        return self.problems[0].line if self.problems else None

    def format(self) -> str:
        return "\n".join(_format_one(self.file, p) for p in self.problems)


def _format_one(file: str, p: Problem) -> str:
    where = f"{file}:{p.line}" if p.line else file
    return f"{where}: {p.path}: {p.message}" if p.path else f"{where}: {p.message}"


class AdapterError(Exception):
    """The adapter itself could not drive the installed engine (never the engine's refusal).

    Raised for an unknown platform fact, a hook or module that moved in this
    release, an import the adapter needs: the cell's verdict is ``error`` with
    this message, which names the adapter step and the engine version.
    """

    def __init__(self, step: str, message: str, *, engine: str | None = None, version: str | None = None) -> None:
        self.step = step
        self.engine = engine
        self.version = version
        where = f"{engine} {version}" if engine and version else (engine or "engine")
        super().__init__(f"adapter step {step!r} failed on {where}: {message}")


class UnreachableError(AdapterError):
    """The engine's code for this cell cannot run on this host at all: it imports a library that exists
    only for another platform (AMD's ``aiter``, Ascend's ``torch_npu``, ...).

    Never the engine's refusal, and not a failure of the adapter either: the
    cell's verdict is ``skip``, its reason this message, which names the
    import and the engine code that made it. The checks the engine runs
    before that import have run (a refusal there is still the engine's).
    """


class NotServedError(AdapterError):
    """The engine serves the cell's model without the attention the matrix covers: its own model code
    decides (vLLM's ``ModelConfig.use_mla`` is False for MiniCPM3, whose model class builds standard
    ``Attention`` layers), so none of the matrix's MLA backends ever sees the model.

    Not a refusal (no backend was asked) and not the adapter's failure: the cell's verdict is ``skip``,
    its reason this message, naming the engine's decision and where it is made.
    """

    def __init__(self, model: str, message: str, *, engine: str | None = None, version: str | None = None) -> None:
        self.model, self.reason = model, message
        where = f"{engine} {version}" if engine and version else (engine or "the engine")
        Exception.__init__(self, f"{where} does not serve {model} with MLA: {message}")
        self.step, self.engine, self.version = "config", engine, version


class StubCalled(Exception):
    """The engine called a function of a library this host lacks, which pytest-mla answered with an
    import stub (``engines.common.import_stubs``): nothing ran in its place. A kernel check that meets
    one is ``not-run`` naming the function (``engine_check``), never the engine's finding."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"{name} is an import stub (pytest-mla): the engine called a function of a library "
                         "this host lacks, and nothing emulates it")


#: What an adapter or engine may raise at any protocol step (import, construction, ``configure``,
#: the optional methods) that ends that step and not the session: any error, and ``SystemExit`` (a
#: library calling ``sys.exit()`` at import or in a step must not end the run green or unreported).
#: A user's Ctrl-C, pytest's own outcomes and the cell deadline (``CellTimeout``) still go through.
STEP_FAILURES: tuple[type[BaseException], ...] = (Exception, SystemExit)


def failure_message(exc: BaseException) -> str:
    """``exc``'s message; a ``SystemExit``'s says that ``sys.exit(code)`` was called (its ``str`` is
    the bare code)."""
    return f"sys.exit({exc.code!r}) was called" if isinstance(exc, SystemExit) else str(exc)


def describe_failure(exc: BaseException) -> str:
    """``Type: message`` on one line."""
    text = " ".join(failure_message(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
