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
``configure(cell, model)``: the ``Configured`` record, or the exception it
raised, which the parent raises again with the same type name and text (the
engine's refusal types and pytest-mla's ``AdapterError`` /
``UnreachableError`` as themselves; any other type as a class of that name,
so a crash reads as it would have in the parent). A child that dies, or a
cell that times out while the child works, ends that child; the next cell of
its platform starts a fresh one.
"""

from __future__ import annotations

import atexit
import builtins
import importlib
import os
import pickle
import subprocess
import sys
import traceback
from typing import Any, BinaryIO

from ...core.errors import AdapterError, UnreachableError

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
        child = self._start()
        try:
            assert child.stdin is not None and child.stdout is not None
            pickle.dump(("configure", cell, model), child.stdin)
            child.stdin.flush()
            reply = pickle.load(child.stdout)
        except BaseException as exc:  # a timeout (CellTimeout) or a dead child: this child is done
            self.close()
            if isinstance(exc, (EOFError, BrokenPipeError, pickle.UnpicklingError)):
                raise AdapterError("platform", f"the {self.engine} {self.platform} child process ended "
                                   f"({type(exc).__name__}; its log: {self._log})",
                                   engine=self.engine, version=self.version) from None
            raise
        return _answer(reply)

    def close(self) -> None:
        child, self._child = self._child, None
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()

    def _start(self) -> subprocess.Popen[bytes]:
        if self._child is not None and self._child.poll() is None:
            return self._child
        env = {**os.environ, PLATFORM_ENV: self.platform}
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
        cls = UnreachableError if type_name == "UnreachableError" else AdapterError
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
        _, cell, model = request
        try:
            reply: tuple[Any, ...] = ("configured", adapter.configure(cell, model))
        except BaseException as exc:  # noqa: BLE001 - every outcome goes back to the parent
            adapter_fields = (exc.step, exc.engine, exc.version) if isinstance(exc, AdapterError) else None
            text = str(exc)
            if adapter_fields is None and not isinstance(exc, (ValueError, AssertionError, NotImplementedError)):
                text = text or "".join(traceback.format_exception_only(type(exc), exc)).strip()
            reply = ("raised", type(exc).__name__, text, adapter_fields)
        pickle.dump(reply, replies)
        replies.flush()


def main(argv: list[str]) -> int:
    """The child: requests on stdin, replies on the original stdout; everything printed goes to stderr."""
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _serve(argv[0], argv[1], sys.stdin.buffer, replies)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
