"""Constants and helpers the vLLM package's modules share, and the process's one engine (imports none of them).

A check runs on the adapter's faked platform: ``prepare_process`` makes (or
adopts) the process's ``VLLMEngine`` before any vLLM module binds
``current_platform``, also in a fresh DCP rank or platform process.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from typing import Any, Iterator

PACKAGE = "vllm"
#: The function that computes the attention (the kernel record names it).
LAYER_NAME = "model.layers.0.self_attn.attn"
#: ``max_model_len`` of the checks' stand-in model config (sizes workspaces only).
MAX_MODEL_LEN = 4096
#: A capability every TRITON_MLA configuration of the matrices constructs on; the
#: decode path reads none (the cell's own arch is tried in ``kernel_for``).
DEFAULT_CAPABILITY = "9.0"

#: The process's engine (``adopt``) or how to make it (``adopt_factory``).
_state: dict[str, Any] = {}
_lock = threading.RLock()


#: An ``AttributeError`` naming one of the package's stand-ins: vLLM read something the stand-in
#: lacks, the adapter's fault (``AdapterError``), never the engine's.
_STAND_IN = re.compile(r"'(\w+View|SimpleNamespace|StandInConfig|DcpGroup|InProcessGroup|ThreadBound|_NoCollectives)' object has no "
                       r"attribute")


@contextlib.contextmanager
def stand_in_guard() -> Iterator[None]:
    """Turn a stand-in's missing attribute into the adapter's error (see ``_STAND_IN``)."""
    from ...core.errors import AdapterError

    try:
        yield
    except AttributeError as exc:
        if _STAND_IN.search(str(exc)):
            raise AdapterError(f"vllm adapter: vLLM read an attribute its stand-in lacks: {exc}") from exc
        raise


def prepare_environment() -> None:
    """Before vLLM is imported: keep Triton on a GPU-less host, decide the interpreter.

    ``vllm.triton_utils`` disables Triton when no GPU driver is active unless
    ``CUDA_VISIBLE_DEVICES`` is set and empty (its "distributed environment"
    exception); without it every ``@triton.jit`` in vLLM is a placeholder.
    """
    from ...kernels._mode import ensure_triton_mode

    where = ensure_triton_mode()
    if where in ("interpreter", "cpu") and "CUDA_VISIBLE_DEVICES" not in os.environ:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def adopt(engine: Any) -> None:
    """Use the adapter's engine already made in this process (its faked platform is the current one)."""
    with _lock:
        _state.setdefault("engine", engine)


def adopt_factory(factory: Any) -> None:
    """How to make the adapter's engine in a process that has none yet (a distributed DCP rank)."""
    with _lock:
        _state.setdefault("factory", factory)


def prepare_process() -> Any:
    """The adapter's engine (stubs, faked platform) in this process, made once."""
    with _lock:
        engine = _state.get("engine")
        if engine is None:
            factory = _state.get("factory")
            if factory is None:
                raise RuntimeError("pytest_mla.engines.vllm: no engine in this process; run through pytest_mla.engines.vllm.adapter")
            prepare_environment()
            engine = _state["engine"] = factory()
        return engine


def current_platform_fp8() -> Any:
    """The fp8 format of the platform answering for the check (e4m3fnuz on gfx942)."""
    from vllm.platforms import current_platform

    return current_platform.fp8_dtype()

