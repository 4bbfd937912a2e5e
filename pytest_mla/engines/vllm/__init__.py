"""The vLLM adapter, one module a job (the same module set as every engine package):

* ``adapter``: ``VLLMEngine``, the ``Engine`` the plugin drives, and the checks' runner targets;
* ``startup``: vLLM's own start-up per cell, on a faked GPU, up to its first GPU step;
* ``platforms``: vLLM's own platform classes answering for the cell's device;
* ``platform_check``: the kernel check of another platform's cell, in that platform's child process;
* ``backends``: what the project knows about each attention backend;
* ``emulation``: where a check's kernels come from (real libraries on a GPU, float64 emulations elsewhere);
* ``model``: the model's attention layer a check runs through, and its vLLM config;
* ``batch``: a check's requests as vLLM holds them (cache slots and contents, top-k, new tokens);
* ``rank``: one DCP rank of a check: vLLM's objects built and called;
* ``checks``: which kernels an accepted cell runs, whether it can run here, its ``KernelSpec``;
* ``support``: constants and helpers the others share, and the process's one engine.
"""

from typing import Any

__all__ = ["VLLMEngine"]


def __getattr__(name: str) -> Any:
    # Lazy: ``adapter`` imports vllm itself (ImportError where it is not installed), while
    # ``checks`` and its helpers must stay importable without it.
    if name == "VLLMEngine":
        from .adapter import VLLMEngine

        return VLLMEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
