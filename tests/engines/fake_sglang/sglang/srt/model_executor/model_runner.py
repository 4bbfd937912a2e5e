import torch

from sglang.srt.runtime_context import get_model, get_spec


def resolve_draft_attention_backend(*, draft_attention_backend, is_draft_worker):
    if not is_draft_worker:
        return None
    return draft_attention_backend or get_spec().speculative_draft_attention_backend


class ModelRunner:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("loads weights on the GPU")

    def configure_kv_cache_dtype(self):
        self.kv_cache_dtype = {"auto": self.dtype, "fp8_e4m3": torch.float8_e4m3fn,
                               "fp8_e5m2": torch.float8_e5m2}[get_model().kv_cache_dtype]
