"""The model catalogue: attention configurations of real models.

Dims are the published ones (each model's ``config.json``). Only attention
matters here: an MLA model caches one latent row of ``kv_lora_rank +
qk_rope_head_dim`` values per token, shared by all heads; a GQA model caches
``num_kv_heads`` K and V rows of ``head_dim`` values.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

_INT_FIELDS = (
    "num_heads",
    "num_kv_heads",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "head_dim",
    "index_topk",
    "index_n_heads",
    "index_head_dim",
)
#: DeepSeek sparse attention (DSA): the lightning indexer's fields, as the checkpoint's
#: ``config.json`` names them. All three or none; a model with them is a sparse MLA model.
INDEXER_FIELDS = ("index_topk", "index_n_heads", "index_head_dim")
MODEL_FIELDS = ("mla", *_INT_FIELDS)


class ModelConfigError(ValueError):
    """A model entry is inconsistent; ``key`` names the offending field."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.message = message


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    name: str
    mla: bool
    num_heads: int  # query heads of the whole model (before tensor parallelism)
    num_kv_heads: int = 1  # MLA: 1 latent "head" shared by every query head
    kv_lora_rank: int = 0  # MLA only: width of the compressed KV latent
    qk_rope_head_dim: int = 0  # MLA only: decoupled RoPE part of q/k
    qk_nope_head_dim: int = 0  # MLA only: non-RoPE part of q/k per head
    v_head_dim: int = 0  # MLA only: per-head V width before up-projection
    head_dim: int = 0  # GQA only: per-head q/k/v width
    index_topk: int = 0  # sparse MLA only: KV tokens the indexer keeps per query token (0: dense)
    index_n_heads: int = 0  # sparse MLA only: the indexer's query heads
    index_head_dim: int = 0  # sparse MLA only: the indexer's head width

    def __post_init__(self) -> None:
        for key in _INT_FIELDS:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ModelConfigError(key, f"{key} must be a non-negative integer, got {value!r}")
        if not isinstance(self.mla, bool):
            raise ModelConfigError("mla", f"mla must be true or false, got {self.mla!r}")
        if self.num_heads < 1:
            raise ModelConfigError("num_heads", f"num_heads must be >= 1, got {self.num_heads}")
        if self.mla:
            for key in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
                if getattr(self, key) < 1:
                    raise ModelConfigError(key, f"an MLA model needs {key} >= 1")
            if self.num_kv_heads != 1:
                raise ModelConfigError("num_kv_heads", "an MLA model caches one latent head: num_kv_heads must be 1")
        given = [key for key in INDEXER_FIELDS if getattr(self, key)]
        if given and not self.mla:
            raise ModelConfigError(given[0], f"{given[0]}: only an MLA model has a sparse-attention indexer")
        if given and len(given) != len(INDEXER_FIELDS):
            missing = next(key for key in INDEXER_FIELDS if key not in given)
            raise ModelConfigError(missing, f"a sparse MLA model needs all of {', '.join(INDEXER_FIELDS)} >= 1 "
                                            f"({missing} is missing)")
        if not self.mla:
            if self.head_dim < 1:
                raise ModelConfigError("head_dim", "a non-MLA model needs head_dim >= 1")
            if self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads:
                raise ModelConfigError(
                    "num_kv_heads",
                    f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})",
                )

    # Absorbed-MLA kernel dims (see shared/reference/kernels.md).
    @property
    def d_qk(self) -> int:
        """Width of a cached key row: 576 for DeepSeek-V3; head_dim for GQA."""
        return self.kv_lora_rank + self.qk_rope_head_dim if self.mla else self.head_dim

    @property
    def d_v(self) -> int:
        """Width of the kernel's output row: kv_lora_rank for MLA; head_dim for GQA."""
        return self.kv_lora_rank if self.mla else self.head_dim

    @property
    def sparse(self) -> bool:
        """A DeepSeek sparse-attention (DSA) model: attention reads the indexer's top-k tokens only."""
        return self.index_topk > 0

    @property
    def softmax_scale(self) -> float:
        """The model's scale: 1/sqrt(qk_nope + qk_rope) for MLA (no YaRN factor)."""
        width = self.qk_nope_head_dim + self.qk_rope_head_dim if self.mla else self.head_dim
        return 1.0 / math.sqrt(width)

    def field(self, key: str) -> Any:
        """Value of a catalogue field by name, as rules see it (``model.<key>``)."""
        if key not in MODEL_FIELDS:
            raise KeyError(key)
        return getattr(self, key)

    def as_dict(self) -> dict[str, Any]:
        """The fields as plain values; a dense model's (zero) indexer fields are left out."""
        data = dataclasses.asdict(self)
        if not self.sparse:
            for key in INDEXER_FIELDS:
                data.pop(key)
        return data

    @classmethod
    def from_mapping(cls, name: str, data: Mapping[str, Any]) -> "ModelConfig":
        unknown = sorted(set(data) - set(MODEL_FIELDS))
        if unknown:
            raise ModelConfigError(
                unknown[0], f"unknown model field {unknown[0]!r} (known: {', '.join(MODEL_FIELDS)})"
            )
        if "mla" not in data:
            raise ModelConfigError("mla", "missing required field 'mla'")
        if "num_heads" not in data:
            raise ModelConfigError("num_heads", "missing required field 'num_heads'")
        return cls(name=name, **dict(data))


def _mla(name: str, num_heads: int, kv_lora_rank: int = 512, qk_rope_head_dim: int = 64,
         qk_nope_head_dim: int = 128, v_head_dim: int = 128, **indexer: int) -> ModelConfig:
    return ModelConfig(name, True, num_heads, 1, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim,
                       **indexer)


def _gqa(name: str, num_heads: int, num_kv_heads: int, head_dim: int) -> ModelConfig:
    return ModelConfig(name, False, num_heads, num_kv_heads, head_dim=head_dim)


#: Built-in catalogue, by the names matrix files use. Published dims:
#: DeepSeek-V3/R1 and Kimi-K2 share the V3 attention (512/64/128/128) with
#: 128 and 64 heads; DeepSeek-V2-Lite has 16 heads of the same shape.
#: DeepSeek-V3.2 (deepseek-ai/DeepSeek-V3.2, as V3.2-Exp) is V3's attention
#: plus the lightning indexer of DeepSeek sparse attention (top 2048 tokens,
#: 64 indexer heads of 128).
BUILTIN_MODELS: Mapping[str, ModelConfig] = {
    m.name: m
    for m in (
        _mla("deepseek-v3", 128),
        _mla("deepseek-v3.2", 128, index_topk=2048, index_n_heads=64, index_head_dim=128),
        _mla("deepseek-r1", 128),
        _mla("deepseek-v2", 128),
        _mla("deepseek-v2-lite", 16),
        _mla("kimi-k2", 64),
        _gqa("llama-3.1-8b", 32, 8, 128),
        _gqa("llama-3.1-70b", 64, 8, 128),
        _gqa("qwen2.5-7b", 28, 4, 128),
    )
}
