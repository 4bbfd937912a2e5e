import enum
import json
import os

import torch


class AttentionArch(enum.Enum):
    MLA = enum.auto()
    MHA = enum.auto()


class ModelConfig:
    def __init__(self, model_path, *, is_draft_model=False, context_length=None):
        with open(os.path.join(model_path, "config.json")) as f:
            hf = json.load(f)
        self.model_path = model_path
        self.is_draft_model = is_draft_model
        self.attention_arch = AttentionArch.MLA if "kv_lora_rank" in hf else AttentionArch.MHA
        self.context_len = context_length or 4096
        self.is_generation = True
        self.is_multimodal = False
        self.dtype = torch.bfloat16

    @staticmethod
    def from_server_args(server_args, model_path=None, model_revision=None, is_draft_model=False,
                         context_length=None):
        return ModelConfig(model_path or server_args.model_path, is_draft_model=is_draft_model,
                           context_length=context_length)
