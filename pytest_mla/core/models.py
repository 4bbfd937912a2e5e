"""The model catalogue: attention configurations of real models, as their checkpoints declare them.

Dims are the published ones (each model's ``config.json``). Only attention
matters here: an MLA model caches one latent row of ``kv_lora_rank +
qk_rope_head_dim`` values per token, shared by all heads; a GQA model caches
``num_kv_heads`` K and V rows of ``head_dim`` values.

Beside the dims, an entry carries what the checkpoint's ``config.json``
carries that changes attention: ``rope_scaling`` (DeepSeek's YaRN multiplies
the softmax scale by ``mscale²``), ``quantization`` (the checkpoint's
``quantization_config``: an FP8 checkpoint gives every attention layer KV
scales in the engines) and ``mtp_layers`` (``num_nextn_predict_layers``, the
draft layers MTP speculative decoding uses). ``q_lora_rank`` (the query's
low-rank compression; 0: a dense query projection, ``config.json``'s null) is
recorded for the entries whose source gives it and absent (None) elsewhere.
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
#: Fields a rule can test (``model.<field>``); ``quantization`` reads as the method name or "none";
#: ``head_size`` is derived: the head size the attention layer is built with and a backend's head-size check
#: reads (an MLA layer's cached row, ``kv_lora_rank + qk_rope_head_dim``: 576 for DeepSeek; ``head_dim`` otherwise).
MODEL_FIELDS = ("mla", *_INT_FIELDS, "head_size", "quantization", "mtp_layers")
#: Keys of a ``[models.NAME]`` table.
ENTRY_FIELDS = ("mla", *_INT_FIELDS, "rope_scaling", "quantization", "mtp_layers", "q_lora_rank")

#: rope_scaling types the engines know (``type`` or ``rope_type``); YaRN ones need factor and original length.
ROPE_TYPES = ("yarn", "deepseek_yarn", "llama3", "linear", "dynamic", "default", "longrope", "mrope")
YARN_TYPES = ("yarn", "deepseek_yarn")
#: ``attention_factor`` is transformers' YaRN magnitude factor (Mistral Large 4: 1.0), ``llama_4_scaling_beta``
#: the position-dependent query scaling Mistral's MLA models add (Mistral Small 4: 0.1), ``partial_rotary_factor``
#: the rotary share of a q/k head (Mistral Small 4: qk_rope / (qk_nope + qk_rope) = 0.5).
ROPE_KEYS = ("type", "rope_type", "factor", "mscale", "mscale_all_dim", "original_max_position_embeddings",
             "beta_fast", "beta_slow", "low_freq_factor", "high_freq_factor", "mrope_section", "rope_theta",
             "attention_factor", "llama_4_scaling_beta", "partial_rotary_factor")
#: quantization_config methods the engines read for attention layers (the KV-cache scales an FP8 checkpoint gives).
QUANT_METHODS = ("fp8", "modelopt", "modelopt_fp4", "compressed-tensors", "w8a8_fp8")


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
    rope_scaling: tuple[tuple[str, Any], ...] | None = None  # config.json's rope_scaling, as sorted pairs
    quantization: tuple[tuple[str, Any], ...] | None = None  # config.json's quantization_config, as sorted pairs
    mtp_layers: int = 0  # num_nextn_predict_layers: the checkpoint's MTP draft layers
    index_topk: int = 0  # sparse MLA only: KV tokens the indexer keeps per query token (0: dense)
    index_n_heads: int = 0  # sparse MLA only: the indexer's query heads
    index_head_dim: int = 0  # sparse MLA only: the indexer's head width
    q_lora_rank: int | None = None  # MLA only: query compression rank; 0: dense q projection; None: not recorded

    def __post_init__(self) -> None:
        object.__setattr__(self, "rope_scaling", _frozen(self.rope_scaling))
        object.__setattr__(self, "quantization", _frozen(self.quantization))
        if isinstance(self.mtp_layers, bool) or not isinstance(self.mtp_layers, int) or self.mtp_layers < 0:
            raise ModelConfigError("mtp_layers", f"mtp_layers must be a non-negative integer, got {self.mtp_layers!r}")
        if self.rope_scaling is not None:
            _check_rope_scaling(dict(self.rope_scaling))
        if self.quantization is not None:
            _check_quantization(dict(self.quantization))
        for key in _INT_FIELDS:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ModelConfigError(key, f"{key} must be a non-negative integer, got {value!r}")
        if not isinstance(self.mla, bool):
            raise ModelConfigError("mla", f"mla must be true or false, got {self.mla!r}")
        if self.q_lora_rank is not None:
            if isinstance(self.q_lora_rank, bool) or not isinstance(self.q_lora_rank, int) or self.q_lora_rank < 0:
                raise ModelConfigError("q_lora_rank", "q_lora_rank must be a non-negative integer (0: a dense query "
                                                      f"projection), got {self.q_lora_rank!r}")
            if not self.mla:
                raise ModelConfigError("q_lora_rank", "q_lora_rank: only an MLA model compresses its queries")
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
    def yarn_mscale(self) -> float:
        """DeepSeek's YaRN attention factor ``0.1 · mscale_all_dim · ln(factor) + 1`` (1 without YaRN).

        The MLA models' attention (DeepseekV2AttentionMLA in SGLang and vLLM, and
        SGLang's ``model_config.scaling``) multiplies the softmax scale by its square;
        ``mscale_all_dim`` absent counts as 0, a factor <= 1 gives 1.
        """
        if not self.mla or self.rope_scaling is None:
            return 1.0
        rope = dict(self.rope_scaling)
        factor = float(rope.get("factor", 1.0))
        if (rope.get("type") or rope.get("rope_type")) == "default" or factor <= 1.0:
            return 1.0
        return 0.1 * float(rope.get("mscale_all_dim", 0.0)) * math.log(factor) + 1.0

    @property
    def sparse(self) -> bool:
        """A DeepSeek sparse-attention (DSA) model: attention reads the indexer's top-k tokens only."""
        return self.index_topk > 0

    @property
    def softmax_scale(self) -> float:
        """The model's scale: ``mscale² / sqrt(qk_nope + qk_rope)`` for MLA (YaRN included), ``1/sqrt(head_dim)`` for GQA."""
        if self.mla:
            return self.yarn_mscale ** 2 / math.sqrt(self.qk_nope_head_dim + self.qk_rope_head_dim)
        return 1.0 / math.sqrt(self.head_dim)

    @property
    def quant_method(self) -> str:
        """The checkpoint's quantization method, "none" for an unquantized checkpoint."""
        return str(dict(self.quantization)["quant_method"]) if self.quantization is not None else "none"

    def field(self, key: str) -> Any:
        """Value of a catalogue field by name, as rules see it (``model.<key>``)."""
        if key not in MODEL_FIELDS:
            raise KeyError(key)
        if key == "quantization":
            return self.quant_method
        if key == "head_size":
            return self.d_qk
        return getattr(self, key)

    def config_json(self) -> dict[str, Any]:
        """The entry's fields in ``config.json`` spelling (``rope_scaling``, ``quantization_config``, ...)."""
        out: dict[str, Any] = {}
        if self.rope_scaling is not None:
            out["rope_scaling"] = _thawed(self.rope_scaling)
        if self.quantization is not None:
            out["quantization_config"] = _thawed(self.quantization)
        out["num_nextn_predict_layers"] = self.mtp_layers
        if self.q_lora_rank is not None:
            out["q_lora_rank"] = self.q_lora_rank or None
        return out

    def as_dict(self) -> dict[str, Any]:
        """The fields as plain values; a dense model's (zero) indexer fields and an unrecorded q_lora_rank are left out."""
        data = dataclasses.asdict(self)
        if self.q_lora_rank is None:
            data.pop("q_lora_rank")
        data["rope_scaling"] = _thawed(self.rope_scaling)
        data["quantization"] = _thawed(self.quantization)
        if not self.sparse:
            for key in INDEXER_FIELDS:
                data.pop(key)
        return data

    @classmethod
    def from_mapping(cls, name: str, data: Mapping[str, Any]) -> "ModelConfig":
        unknown = sorted(set(data) - set(ENTRY_FIELDS))
        if unknown:
            raise ModelConfigError(
                unknown[0], f"unknown model field {unknown[0]!r} (known: {', '.join(ENTRY_FIELDS)})"
            )
        for key in ("rope_scaling", "quantization"):
            if key in data and not isinstance(data[key], Mapping):
                raise ModelConfigError(key, f"{key} must be a table, got {data[key]!r}")
        if "mla" not in data:
            raise ModelConfigError("mla", "missing required field 'mla'")
        if "num_heads" not in data:
            raise ModelConfigError("num_heads", "missing required field 'num_heads'")
        return cls(name=name, **dict(data))


def _frozen(value: Any) -> Any:
    """A mapping as sorted ``(key, value)`` pairs, lists as tuples (hashable, comparable)."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, tuple) and all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) for p in value):
        return tuple(sorted((k, _frozen(v)) for k, v in value))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def _thawed(value: Any) -> Any:
    """``_frozen``'s inverse, for JSON."""
    if value is None:
        return None
    if isinstance(value, tuple) and all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) for p in value) \
            and value:
        return {k: _thawed(v) for k, v in value}
    if isinstance(value, tuple):
        return [_thawed(v) for v in value]
    return value


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_rope_scaling(rope: dict[str, Any]) -> None:
    unknown = sorted(set(rope) - set(ROPE_KEYS))
    if unknown:
        raise ModelConfigError(f"rope_scaling.{unknown[0]}",
                               f"unknown rope_scaling key {unknown[0]!r} (known: {', '.join(ROPE_KEYS)})")
    kind = rope.get("type", rope.get("rope_type"))
    if kind is None:
        raise ModelConfigError("rope_scaling", "rope_scaling needs a type (or rope_type)")
    if kind not in ROPE_TYPES:
        key = "rope_scaling.type" if "type" in rope else "rope_scaling.rope_type"
        raise ModelConfigError(key, f"unknown rope_scaling type {kind!r} (known: {', '.join(ROPE_TYPES)})")
    for key in ("factor", "mscale", "mscale_all_dim", "beta_fast", "beta_slow", "attention_factor",
                "llama_4_scaling_beta"):
        if key in rope and (not _number(rope[key]) or rope[key] < 0):
            raise ModelConfigError(f"rope_scaling.{key}", f"rope_scaling.{key} must be a non-negative number, "
                                                         f"got {rope[key]!r}")
    partial = rope.get("partial_rotary_factor")
    if partial is not None and (not _number(partial) or not 0 < partial <= 1):
        raise ModelConfigError("rope_scaling.partial_rotary_factor", "rope_scaling.partial_rotary_factor must be a "
                                                                     f"number in (0, 1], got {partial!r}")
    if kind in YARN_TYPES:
        if "factor" not in rope:
            raise ModelConfigError("rope_scaling", f"a {kind} rope_scaling needs a factor")
        original = rope.get("original_max_position_embeddings")
        if original is None:
            raise ModelConfigError("rope_scaling.factor", f"a YaRN factor ({rope['factor']}) needs "
                                                          "original_max_position_embeddings")
        if isinstance(original, bool) or not isinstance(original, int) or original < 1:
            raise ModelConfigError("rope_scaling.original_max_position_embeddings",
                                   f"original_max_position_embeddings must be a positive integer, got {original!r}")


def _check_quantization(quant: dict[str, Any]) -> None:
    method = quant.get("quant_method")
    if method is None:
        raise ModelConfigError("quantization", "quantization needs a quant_method")
    if method not in QUANT_METHODS:
        raise ModelConfigError("quantization.quant_method", f"unknown quantization method {method!r} "
                                                           f"(known: {', '.join(QUANT_METHODS)})")
    if method == "fp8":
        if quant.get("fmt", "e4m3") not in ("e4m3", "e5m2"):
            raise ModelConfigError("quantization.fmt", f"fp8 fmt must be e4m3 or e5m2, got {quant['fmt']!r}")
        if quant.get("activation_scheme", "dynamic") not in ("dynamic", "static"):
            raise ModelConfigError("quantization.activation_scheme", "activation_scheme must be dynamic or static, "
                                                                     f"got {quant['activation_scheme']!r}")
        block = quant.get("weight_block_size")
        if block is not None and (not isinstance(block, (list, tuple)) or len(block) != 2
                                  or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
            raise ModelConfigError("quantization.weight_block_size",
                                   f"weight_block_size must be two positive integers, got {block!r}")


#: DeepSeek-V3 / R1 and Kimi-K2 ship FP8 block-quantized weights (their config.json's quantization_config).
FP8_BLOCK = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}


def _yarn(factor: float, mscale: float, mscale_all_dim: float, beta_fast: float = 32, beta_slow: float = 1,
          original: int = 4096) -> dict[str, Any]:
    return {"type": "yarn", "factor": factor, "mscale": mscale, "mscale_all_dim": mscale_all_dim,
            "beta_fast": beta_fast, "beta_slow": beta_slow, "original_max_position_embeddings": original}


def _mla(name: str, num_heads: int, kv_lora_rank: int = 512, qk_rope_head_dim: int = 64,
         qk_nope_head_dim: int = 128, v_head_dim: int = 128, *, rope: Mapping[str, Any] | None = None,
         quant: Mapping[str, Any] | None = None, mtp: int = 0, q_lora: int | None = None,
         **indexer: int) -> ModelConfig:
    return ModelConfig(name, True, num_heads, 1, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim,
                       rope_scaling=rope, quantization=quant, mtp_layers=mtp, q_lora_rank=q_lora, **indexer)


def _gqa(name: str, num_heads: int, num_kv_heads: int, head_dim: int, *,
         rope: Mapping[str, Any] | None = None) -> ModelConfig:
    return ModelConfig(name, False, num_heads, num_kv_heads, head_dim=head_dim, rope_scaling=rope)


#: Llama 3.1's rope_scaling (it changes the rotary frequencies, not the softmax scale).
LLAMA3_ROPE = {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
               "original_max_position_embeddings": 8192, "rope_type": "llama3"}

#: Mistral Small 4's rope: transformers' Mistral4Config.__post_init__ default (transformers 5.24,
#: models/mistral4/configuration_mistral4.py), less ``rope_theta`` (10000.0) and ``max_position_embeddings``
#: (1048576), which the weightless config.json carries at the top level as the other entries do. YaRN with
#: mscale_all_dim 1 and factor 128: the softmax scale ×(1 + 0.1·ln 128)² = ×2.206 in the engines' DeepSeek
#: attention. ``llama_4_scaling_beta`` is a per-position query scaling (q × (1 + β·ln(1 + ⌊pos / 8192⌋)), 1 below
#: position 8192) the catalogue's scale does not model; the engines' DeepSeek attention reads it from a top-level
#: ``llama_4_scaling`` ({original_max_position_embeddings, beta}), which the config.json carries too.
MISTRAL4_ROPE = {"type": "yarn", "factor": 128.0, "original_max_position_embeddings": 8192, "beta_fast": 32.0,
                 "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1,
                 "partial_rotary_factor": 0.5}
#: Mistral Large 4's rope: MistralLarge4TextConfig.__post_init__ default (transformers 5.24,
#: models/mistral_large4/configuration_mistral_large4.py), less ``rope_theta`` (10000.0): YaRN over a
#: 512-token window with no magnitude scaling (attention_factor 1.0, no mscale_all_dim: softmax scale ×1).
MISTRAL_LARGE4_ROPE = {"rope_type": "yarn", "factor": 2048.0, "original_max_position_embeddings": 512,
                       "beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": 1.0}


#: Built-in catalogue, by the names matrix files use, with the published checkpoints' fields
#: (each also in ``engines/model_configs/NAME/config.json``, which the engines read; a test
#: holds the two together): DeepSeek-V3/R1 and Kimi-K2 share the V3 attention
#: (512/64/128/128) with 128 and 64 heads, FP8 block-quantized weights and YaRN (factor 40
#: and 32, mscale_all_dim 1: softmax scale ×1.874 and ×1.812); DeepSeek-V2 and V2-Lite are
#: bf16 checkpoints with YaRN factor 40, mscale_all_dim 0.707 (×1.590). DeepSeek-V3.2
#: (deepseek-ai/DeepSeek-V3.2, as V3.2-Exp) is V3's attention and checkpoint plus the
#: lightning indexer of DeepSeek sparse attention (top 2048 tokens, 64 indexer heads of 128).
#:
#: The other MLA families (issue 39) come from the configuration classes transformers 5.24 ships
#: (``transformers/models/<type>/configuration_<type>.py``: class defaults, which its comments or
#: ``auto_docstring(checkpoint=...)`` tie to the checkpoint). The checkpoints' own config.json files could
#: not be downloaded here (no network): where they differ from the class defaults, the entry is the class's.
#: None of these classes carries ``num_nextn_predict_layers`` or a ``quantization_config``, so the entries
#: have no MTP layers and no quantization (bf16) by that source; they record ``q_lora_rank``, the
#: DeepSeek-V2/V3 ones (recorded before the field existed) do not.
#:
#: - minicpm3-4b (MiniCPM3Config, ``auto_docstring(checkpoint="openbmb/MiniCPM3-4B")``, "Defaults match the
#:   openbmb/MiniCPM3-4B checkpoint"): 40 heads (num_key_value_heads 40), kv_lora_rank 256, q_lora_rank 768,
#:   qk_nope 64, qk_rope 32, v_head_dim None → hidden_size // heads = 2560 // 40 = 64; rope_parameters None
#:   (the class has no rope scaling; the published config.json is said to carry a longrope rope_scaling
#:   with per-dim factor lists, which could not be checked offline and is left out).
#: - mistral-small-4 (Mistral4Config, ``auto_docstring(checkpoint="mistralai/Mistral-Small-4-119B-2603")``):
#:   32 heads (num_key_value_heads 32), kv_lora_rank 256, q_lora_rank 1024, qk_nope 64, qk_rope 64,
#:   v_head_dim 128, MISTRAL4_ROPE.
#: - mistral-large-4 (MistralLarge4TextConfig, ``auto_docstring(checkpoint="mistralai/Mistral-Large-4-1T-A52B")``):
#:   64 heads (num_key_value_heads 64), kv_lora_rank 512, no q_lora_rank field (a dense q projection: 0),
#:   qk_nope 64, qk_rope 64, v_head_dim 128, MISTRAL_LARGE4_ROPE, and DSA: index_topk 2048, index_n_heads
#:   32, index_head_dim 128. Not modelled: every 4th layer is NoPE (no_rope_layers), "shared" indexer
#:   layers reuse the previous full layer's top-k, and layers may share another layer's latent KV
#:   (kv_source_layers; none by default). Its config.json spells the type as vLLM's Mistral-format loader
#:   does (``mistral_large_4``), which is what vLLM's MLA test (is_deepseek_mla) and model code expect, but
#:   no config class is registered under it: vLLM builds this model only from a Mistral-format params.json,
#:   and loading the weightless config.json through AutoConfig fails. transformers has no class for Mistral Large 3 (no
#:   ``mistral_large3`` type): its engines serve it as DeepSeek-V3 (MistralLarge3ForCausalLM), so it has no entry.
#: - glm-4.7-flash (Glm4MoeLiteConfig; its ``auto_docstring`` names "zai-org/GLM-4.5", but the defaults are
#:   the GLM-4.7-Flash geometry: 47 layers, hidden 2048): 20 heads (num_key_value_heads 20),
#:   kv_lora_rank 512, q_lora_rank 768, qk_nope 192, qk_rope 64, v_head_dim 256; no rope scaling.
#: - glm-5 (GlmMoeDsaConfig, ``auto_docstring(checkpoint="zai-org/GLM-5")``): 64 heads (num_key_value_heads
#:   64), kv_lora_rank 512, q_lora_rank 2048, qk_nope 192, qk_rope 64, v_head_dim 256, no rope scaling, and
#:   DSA: index_topk 2048, index_n_heads 32, index_head_dim 128.
#: - Kimi-K2.5 has no entry: Kimi_K25Config (``model_type = "kimi_k25"``) defines no attention field of its
#:   own; its text_config is a deepseek_v3 config (a hub ``"kimi_k2"`` text model_type is remapped to
#:   ``deepseek_v3``), i.e. Kimi-K2's attention (kimi-k2 above) as far as transformers says.
BUILTIN_MODELS: Mapping[str, ModelConfig] = {
    m.name: m
    for m in (
        _mla("deepseek-v3", 128, rope=_yarn(40, 1.0, 1.0), quant=FP8_BLOCK, mtp=1),
        _mla("deepseek-v3.2", 128, rope=_yarn(40, 1.0, 1.0), quant=FP8_BLOCK, mtp=1,
             index_topk=2048, index_n_heads=64, index_head_dim=128),
        _mla("deepseek-r1", 128, rope=_yarn(40, 1.0, 1.0), quant=FP8_BLOCK, mtp=1),
        _mla("deepseek-v2", 128, rope=_yarn(40, 0.707, 0.707)),
        _mla("deepseek-v2-lite", 16, rope=_yarn(40, 0.707, 0.707)),
        _mla("kimi-k2", 64, rope=_yarn(32.0, 1.0, 1.0, beta_fast=1.0, beta_slow=1.0), quant=FP8_BLOCK),
        _mla("minicpm3-4b", 40, 256, 32, 64, 64, q_lora=768),
        _mla("mistral-small-4", 32, 256, 64, 64, 128, rope=MISTRAL4_ROPE, q_lora=1024),
        _mla("mistral-large-4", 64, 512, 64, 64, 128, rope=MISTRAL_LARGE4_ROPE, q_lora=0,
             index_topk=2048, index_n_heads=32, index_head_dim=128),
        _mla("glm-4.7-flash", 20, 512, 64, 192, 256, q_lora=768),
        _mla("glm-5", 64, 512, 64, 192, 256, q_lora=2048, index_topk=2048, index_n_heads=32, index_head_dim=128),
        _gqa("llama-3.1-8b", 32, 8, 128, rope=LLAMA3_ROPE),
        _gqa("llama-3.1-70b", 64, 8, 128, rope=LLAMA3_ROPE),
        _gqa("qwen2.5-7b", 28, 4, 128),
    )
}
