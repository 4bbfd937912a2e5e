"""An engine adapter loaded on another platform, in a child process of its own.

An engine decides much of what it does when its modules load: vLLM's
``_flashmla_C_AVAILABLE = current_platform.is_cuda() and ...``, SGLang's
``_is_hip = is_hip()``. A process that imported the engine on a faked CUDA GPU
answers as a CUDA host for the rest of its life, whatever platform a later
cell fakes. So the cells of another platform (ROCm, CPU, XPU, NPU) go to a
child process that imported the engine with that platform faked from the
start: one child per platform, started on the first such cell and kept for
the run (each xdist worker has its own).

The child builds the adapter with ``cls(platform=...)`` and answers
``configure(cell, model)`` and ``run_check(case, spec, ...)`` (an accepted
cell's numeric check, run on the child's platform: the kernel record, whatever
happened in the check). ``configure`` answers the ``Configured`` record, or
the exception it raised, which the parent raises again with the same type name and text (the
engine's refusal types and pytest-mla's ``AdapterError`` /
``UnreachableError`` / ``NotServedError`` as themselves; any other type as a class of that name,
so a crash reads as it would have in the parent). A child that dies, or a
cell that times out while the child works, ends that child; the next cell of
its platform starts a fresh one. A check whose child dies is a crashed kernel
record naming the child's log.

PYTEST_DONT_REWRITE: its ``assert`` statements raise as plain Python's do, so a message
that reaches a report never changes with pytest's ``-v`` or ``$CI``.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import importlib
import os
import pickle
import subprocess
import sys
import traceback
from typing import Any, BinaryIO

from ...core.errors import AdapterError, NotServedError, UnreachableError

__all__ = ["PlatformProcess", "main"]

#: The environment variable a child reads its platform from (also what the adapter's
#: constructor is given).
PLATFORM_ENV = "PYTEST_MLA_IMPORT_PLATFORM"


class PlatformProcess:
    """``configure`` of adapter ``target`` (``"module:Class"``) built for ``platform``, in a child process."""

    def __init__(self, target: str, platform: str, *, engine: str, version: str) -> None:
        self.target = target
        self.platform = platform
        self.engine = engine
        self.version = version
        self._child: subprocess.Popen[bytes] | None = None
        self._log = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"pytest-mla-{engine}-{platform}-{os.getpid()}.log")
        atexit.register(self.close)

    def configure(self, cell: Any, model: Any) -> Any:
        return _answer(self._ask(("configure", cell, model)))

    def run_check(self, case: Any, spec: Any, *, where: str, dcp_mode: str, timeout_s: float) -> dict[str, Any]:
        """The kernel record of ``spec``'s check on ``case``, run in the child (``kernels.run.run_check``).

        The check runs on the platform the child imported the engine on. A
        child that dies meanwhile makes the record a crashed one naming its
        log; a timeout (``CellTimeout``) ends the child and propagates.
        """
        from ...core.verdicts import KERNEL_FAILED

        try:
            reply = self._ask(("run_check", case, spec, {"where": where, "dcp_mode": dcp_mode,
                                                         "timeout_s": timeout_s}))
        except AdapterError as exc:  # the child ended: this cell's check crashed, the next starts a fresh one
            return {"status": KERNEL_FAILED, "where": where, "level": spec.level, "case": case.as_dict(),
                    "crashed": True, "message": f"kernel crashed: {exc}"}
        if reply[0] == "result":
            return reply[1]
        return _answer(reply)  # raises what the child raised outside the check's own handling

    def _ask(self, request: tuple[Any, ...]) -> tuple[Any, ...]:
        child = self._start()
        try:
            assert child.stdin is not None and child.stdout is not None
            pickle.dump(request, child.stdin)
            child.stdin.flush()
            return pickle.load(child.stdout)
        except BaseException as exc:  # a timeout (CellTimeout) or a dead child: this child is done
            self.close()
            if isinstance(exc, (EOFError, BrokenPipeError, pickle.UnpicklingError)):
                raise AdapterError("platform", f"the {self.engine} {self.platform} child process ended "
                                   f"({type(exc).__name__}; its log: {self._log})",
                                   engine=self.engine, version=self.version) from None
            raise

    def close(self) -> None:
        child, self._child = self._child, None
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        with contextlib.suppress(OSError):  # a log the child wrote nothing to says nothing: not left behind
            if os.path.getsize(self._log) == 0:
                os.remove(self._log)

    def _start(self) -> subprocess.Popen[bytes]:
        if self._child is not None and self._child.poll() is None:
            return self._child
        env = {**os.environ, PLATFORM_ENV: self.platform}
        # the parent's import path (its checkout, a test's engine runner module), as a DCP rank process gets it
        env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        with open(self._log, "ab") as log:
            self._child = subprocess.Popen(
                [sys.executable, "-m", __name__, self.target, self.platform],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env)
        return self._child


def _answer(reply: tuple[Any, ...]) -> Any:
    kind = reply[0]
    if kind == "configured":
        return reply[1]
    _, type_name, text, adapter = reply
    if adapter is not None:  # pytest-mla's own: rebuilt with its step, engine and version
        cls = {"UnreachableError": UnreachableError, "NotServedError": NotServedError}.get(type_name, AdapterError)
        exc = cls.__new__(cls)
        Exception.__init__(exc, text)
        exc.step, exc.engine, exc.version = adapter
        raise exc
    builtin = getattr(builtins, type_name, None)
    if isinstance(builtin, type) and issubclass(builtin, BaseException):
        raise builtin(text)
    raise type(type_name, (Exception,), {})(text)


def _serve(target: str, platform: str, requests: BinaryIO, replies: BinaryIO) -> None:
    module_name, _, attr = target.partition(":")
    adapter = getattr(importlib.import_module(module_name), attr)(platform=platform)
    while True:
        try:
            request = pickle.load(requests)
        except EOFError:
            return
        try:
            reply: tuple[Any, ...] = _handle(adapter, request)
        except BaseException as exc:  # noqa: BLE001 - every outcome goes back to the parent
            adapter_fields = (exc.step, exc.engine, exc.version) if isinstance(exc, AdapterError) else None
            text = str(exc)
            if adapter_fields is None and not isinstance(exc, (ValueError, AssertionError, NotImplementedError)):
                text = text or "".join(traceback.format_exception_only(type(exc), exc)).strip()
            reply = ("raised", type(exc).__name__, text, adapter_fields)
        pickle.dump(reply, replies)
        replies.flush()


def _handle(adapter: Any, request: tuple[Any, ...]) -> tuple[Any, ...]:
    kind = request[0]
    if kind == "configure":
        return ("configured", adapter.configure(request[1], request[2]))
    if kind == "run_check":
        from ...kernels.run import run_check

        _, case, spec, kwargs = request
        return ("result", run_check(case, spec, **kwargs))
    raise AdapterError("platform", f"unknown request {kind!r} to a platform child process")


def main(argv: list[str]) -> int:
    """The child: requests on stdin, replies on the original stdout; everything printed goes to stderr."""
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _serve(argv[0], argv[1], sys.stdin.buffer, replies)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
