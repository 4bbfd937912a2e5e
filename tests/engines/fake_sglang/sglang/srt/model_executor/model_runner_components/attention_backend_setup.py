import dataclasses

from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
from sglang.srt.runtime_context import attention_backends


@dataclasses.dataclass(frozen=True)
class ResolvedAttentionBackendStr:
    prefill: str
    decode: str
    is_draft_override: bool = False


def resolve_attention_backend_strs(*, model_runner):
    if model_runner.is_draft_worker and model_runner.draft_attention_backend:
        b = model_runner.draft_attention_backend
        return ResolvedAttentionBackendStr(prefill=b, decode=b, is_draft_override=True)
    prefill, decode = attention_backends()
    return ResolvedAttentionBackendStr(prefill=prefill, decode=decode)


def _build_resolved_backend(*, model_runner, resolved, init_new_workspace):
    return _build_full_attention_backend_from_str(model_runner=model_runner, backend_str=resolved.decode)


def _build_full_attention_backend_from_str(*, model_runner, backend_str):
    if backend_str not in ATTENTION_BACKENDS:
        raise ValueError(f"Invalid attention backend: {backend_str}")
    return ATTENTION_BACKENDS[backend_str](model_runner)
