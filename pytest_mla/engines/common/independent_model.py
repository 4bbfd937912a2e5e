"""The independent model of the model level: HF transformers' own class for a family, at a small size.

An engine's model path (its DeepSeek-V2/V3 class, its weight loader and the
post-load steps that absorb ``w_kc``/``w_vc``) is checked against a model it
did not write: transformers' implementation of the same family, randomly
initialised from the cell's seed, saved as a checkpoint the engine loads,
and run in float64 on the same token ids (teacher-forced logits).

The small config keeps what shapes attention in the real checkpoint
(``kv_lora_rank``, ``qk_rope_head_dim``, ``qk_nope_head_dim``, ``v_head_dim``,
``q_lora_rank``, the rope scaling with its YaRN ``mscale``, rope theta, the
sparse indexer's fields) and cuts the cost everywhere else: two layers (the
first dense, the second a small MoE), a small hidden size, vocabulary and
MLP, and the query heads one rank holds.

transformers (and safetensors) are dependencies of the engine environments
only: nothing here is imported by the plugin, and each function imports them
when called.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from . import MODEL_CONFIGS

__all__ = ["ATTENTION_FIELDS", "SCALE_SUFFIX", "SMALL", "reference_logits", "small_config", "write_checkpoint"]

#: ``config.json`` fields that decide the attention computation: kept from the real checkpoint.
ATTENTION_FIELDS = ("model_type", "architectures", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                    "v_head_dim", "q_lora_rank", "rope_scaling", "rope_theta", "rms_norm_eps",
                    "max_position_embeddings", "index_topk", "index_n_heads", "index_head_dim")

#: What the small model changes, for cost: every field here is outside the attention geometry.
SMALL: Mapping[str, Any] = {
    "num_hidden_layers": 2,
    "first_k_dense_replace": 1,  # layer 0 dense, layer 1 MoE: both MLP kinds the engine loads
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 64,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "vocab_size": 512,
    "num_nextn_predict_layers": 0,
    "tie_word_embeddings": False,
}


def small_config(model: str, *, heads: int, quantized: bool = False,
                 configs: Path = MODEL_CONFIGS) -> dict[str, Any]:
    """The ``config.json`` of ``model``'s small stand-in: the real checkpoint's (``configs/model``) with
    ``SMALL`` applied and ``heads`` query heads (the heads one rank of the cell holds).

    ``quantized``: keep the checkpoint's ``quantization_config`` (its FP8 block-quantized weights);
    otherwise the small model is a bf16 checkpoint. A model without MLA fields is an error: this
    model level is for MLA families.
    """
    path = configs / model / "config.json"
    try:
        real = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{model!r}: no checkpoint config at {path}") from None
    if "kv_lora_rank" not in real:
        raise ValueError(f"{model!r}: {path} has no kv_lora_rank: not an MLA checkpoint")
    if not isinstance(heads, int) or isinstance(heads, bool) or heads < 1:
        raise ValueError(f"heads must be a positive integer, got {heads!r}")
    if real["num_attention_heads"] % heads:
        raise ValueError(f"{model!r}: {real['num_attention_heads']} heads do not split into ranks of {heads}")
    config = dict(real)
    config.update(SMALL)
    config.update(num_attention_heads=heads, num_key_value_heads=heads)
    if not quantized:
        config.pop("quantization_config", None)
    return config


def write_checkpoint(config: Mapping[str, Any], folder: str | os.PathLike[str], *, seed: int,
                     dtype: str = "bfloat16") -> Path:
    """transformers' model for ``config``, randomly initialised from ``seed``, saved to ``folder`` as a
    checkpoint: ``model.safetensors`` under the family's real tensor names, and ``config``
    itself as ``config.json`` (the real checkpoint's spelling, not transformers' re-serialisation).
    The same ``config`` and ``seed`` write the same tensors.

    A ``config`` with DeepSeek's ``quantization_config`` (fp8, 128x128 blocks) gets the released
    checkpoint's layout: each quantized linear weight in ``float8_e4m3fn`` with its block scales as
    ``weight_scale_inv`` (``SCALE_SUFFIX``)."""
    block = _fp8_block(config)  # a format it cannot write is refused before any work

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    _write_config(folder, _unquantized(config))  # transformers' CPU build has no fp8 model to initialise
    hf_config = AutoConfig.from_pretrained(folder)
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(hf_config, dtype=getattr(torch, dtype))
    finally:
        torch.random.set_rng_state(state)
    model.save_pretrained(folder)  # transformers writes the checkpoint's own tensor names back
    _as_released(folder / "model.safetensors", getattr(torch, dtype), block)
    _write_config(folder, config)
    (folder / "generation_config.json").unlink(missing_ok=True)
    return folder


def _write_config(folder: Path, config: Mapping[str, Any]) -> None:
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def _unquantized(config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k != "quantization_config"}


def _fp8_block(config: Mapping[str, Any]) -> tuple[int, int] | None:
    """The weight block of an fp8 block-quantized ``config``; None when unquantized. Another
    ``quantization_config`` is an error: no other format is written yet."""
    quant = config.get("quantization_config")
    if quant is None:
        return None
    block = quant.get("weight_block_size")
    if quant.get("quant_method") != "fp8" or quant.get("fmt", "e4m3") != "e4m3" or not block:
        raise ValueError(f"quantization_config {quant!r}: only DeepSeek's fp8 e4m3 block format is written")
    return int(block[0]), int(block[1])


#: Tensors a released checkpoint keeps in float32 (DeepSeek's MoE router bias); transformers also keeps
#: the router's weight in float32, which the released checkpoints store like every other weight.
FLOAT32_TENSORS = ("e_score_correction_bias",)
#: The suffix of a quantized weight's block scales: ``X.weight`` is stored with ``X.weight_scale_inv``.
SCALE_SUFFIX = "weight_scale_inv"
#: Linear weights an fp8 DeepSeek checkpoint leaves unquantized: the embeddings, the LM head and the
#: MoE router (the engines build it without a quantization config); every other ``*.weight`` of two
#: dimensions is a quantized linear layer's.
_NOT_QUANTIZED = ("model.embed_tokens.weight", "lm_head.weight", ".mlp.gate.weight")


def _as_released(path: Path, dtype: Any, block: tuple[int, int] | None) -> None:
    """Every floating tensor of ``path`` in ``dtype`` but ``FLOAT32_TENSORS``, as in the released files;
    with ``block``, the linear weights block-quantized to fp8."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    for name, tensor in list(tensors.items()):
        if tensor.is_floating_point() and tensor.dtype != dtype and not name.endswith(FLOAT32_TENSORS):
            tensors[name] = tensor.to(dtype)
        if block and tensor.dim() == 2 and name.endswith(".weight") and not name.endswith(_NOT_QUANTIZED):
            tensors[name], tensors[name.removesuffix("weight") + SCALE_SUFFIX] = _quantize_blocks(tensor, block)
    save_file(tensors, path, metadata={"format": "pt"})


def _quantize_blocks(weight: Any, block: tuple[int, int]) -> tuple[Any, Any]:
    """``weight`` ``[out, in]`` as fp8 e4m3 values and float32 scales ``[ceil(out/b0), ceil(in/b1)]``, one
    per block: the block's largest magnitude maps to e4m3's largest finite value (448)."""
    import torch

    out_dim, in_dim = weight.shape
    rows, cols = -(-out_dim // block[0]), -(-in_dim // block[1])
    w = weight.to(torch.float32)
    padded = torch.zeros(rows * block[0], cols * block[1], dtype=torch.float32)
    padded[:out_dim, :in_dim] = w
    tiles = padded.view(rows, block[0], cols, block[1])
    amax = tiles.abs().amax(dim=(1, 3)).clamp(min=1e-12)  # [rows, cols]
    scale = amax / torch.finfo(torch.float8_e4m3fn).max
    values = (tiles / scale[:, None, :, None]).view_as(padded)[:out_dim, :in_dim].to(torch.float8_e4m3fn)
    return values, scale


def _dequantized(tensors: dict[str, Any]) -> dict[str, Any]:
    """``tensors`` in float64 with every fp8 weight times its block scale (exact: e4m3 x float32 fits)."""
    import torch

    out = {}
    for name, tensor in tensors.items():
        if name.endswith(SCALE_SUFFIX):
            continue
        value = tensor.to(torch.float64)
        scale = tensors.get(name.removesuffix("weight") + SCALE_SUFFIX)
        if scale is not None:
            rows = -(-value.shape[0] // scale.shape[0])
            cols = -(-value.shape[1] // scale.shape[1])
            full = scale.to(torch.float64).repeat_interleave(rows, 0).repeat_interleave(cols, 1)
            value = value * full[: value.shape[0], : value.shape[1]]
        out[name] = value
    return out


def reference_logits(folder: str | os.PathLike[str], token_ids: Sequence[int]) -> Any:
    """transformers' forward of the checkpoint in ``folder``, in float64, on one request's
    ``token_ids``: the teacher-forced logits ``[len(token_ids), vocab]`` of every position.

    An fp8 checkpoint's weights are dequantized (value x block scale) first: the reference computes
    with exactly the weights the engine loads. The eager paths (attention and MoE experts): the
    fused ones take no float64. transformers computes the rotary cos/sin in float32, so the logits
    are float64 up to about 1e-7 relative."""
    import tempfile

    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory(prefix="mla-reference-") as plain:
        if "quantization_config" in config:  # transformers' loader maps the tensor names; it gets float64 ones
            _write_config(Path(plain), _unquantized(config))
            save_file(_dequantized(load_file(folder / "model.safetensors")), Path(plain) / "model.safetensors",
                      metadata={"format": "pt"})
            folder = Path(plain)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64, attn_implementation="eager",
                                                     experts_implementation="eager")
    model.eval()
    ids = torch.tensor([list(token_ids)], dtype=torch.long)
    with torch.no_grad():
        return model(ids).logits[0]
