import argparse
import dataclasses
from typing import Optional

BACKENDS = ["triton", "fake_mla", "cuda_probe", "mha_only"]


@dataclasses.dataclass
class ServerArgs:
    model_path: str
    device: str = "cuda"
    attention_backend: Optional[str] = None
    prefill_attention_backend: Optional[str] = None
    decode_attention_backend: Optional[str] = None
    tp_size: int = 1
    dcp_size: int = 1
    speculative_algorithm: Optional[str] = None
    speculative_eagle_topk: Optional[int] = None
    speculative_num_steps: Optional[int] = None
    speculative_num_draft_tokens: Optional[int] = None
    speculative_draft_model_path: Optional[str] = None
    speculative_draft_model_revision: Optional[str] = None
    speculative_draft_attention_backend: Optional[str] = None
    speculative_draft_kv_cache_dtype: Optional[str] = None
    kv_cache_dtype: str = "auto"
    page_size: int = 1
    log_level: str = "info"

    @staticmethod
    def add_cli_args(parser):
        for field in dataclasses.fields(ServerArgs):
            flag = "--" + field.name.replace("_", "-")
            kind = int if field.type in (int, Optional[int]) else str
            choices = BACKENDS if field.name.endswith("attention_backend") else None
            parser.add_argument(flag, type=kind, default=field.default if field.name != "model_path" else None,
                                choices=choices)

    def resolve_once(self):
        if self.dcp_size < 1:
            raise ValueError(f"dcp_size must be >= 1, got {self.dcp_size}")
        if self.speculative_algorithm is not None and self.speculative_draft_model_path is None:
            self.speculative_draft_model_path = self.model_path  # MTP: the model drafts itself


def prepare_server_args(argv):
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return ServerArgs(**vars(parser.parse_args(argv)))
