"""The vLLM adapter.

* ``startup``: start-up validation — vLLM's config objects, its attention
  selector, backend and metadata-builder construction, KV-cache spec and
  CUDA-graph resolution — with the cell's GPU faked (``VLLMEngine``), and the
  kernel-check targets (``run_mla``, ``run_attn``) that make the
  process's adapter engine before running a check.
* ``platforms``: vLLM's own platform classes answering for the cell's device.
* ``checks``: which numeric check an accepted cell runs and the engine runners
  that drive vLLM's own attention layers per DCP rank; ``kernel_source``: the
  real kernel libraries on a GPU, their float64 emulations elsewhere.
"""

from typing import Any

__all__ = ["VLLMEngine"]


def __getattr__(name: str) -> Any:
    # Lazy: ``startup`` imports vllm itself (ImportError where it is not installed), while
    # ``checks`` and its helpers must stay importable without it.
    if name == "VLLMEngine":
        from .startup import VLLMEngine

        return VLLMEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
