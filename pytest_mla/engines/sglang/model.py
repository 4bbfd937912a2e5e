"""The DeepSeek model's absorbed-MLA attention path, run on a stand-in attention module.

A DeepSeek-style MLA model (DeepSeek-V2/V3, Kimi-K2: ``DeepseekV2AttentionMLA``)
never hands its decode to the backend directly. ``forward_absorb_prepare``
projects q and, under DCP, all-gathers it over the DCP group
(``all_gather_q_for_mla_decode``); ``forward_absorb_core`` then calls the
backend through the layer's ``RadixAttention`` (``attn_mqa``, or
``attn_mqa_for_dcp_decode`` for the absorb-core backends), merges the DCP
ranks with ``cp_lse_ag_out_rs_mla`` where its branch returns an LSE, and
up-projects with ``w_vc`` and ``o_proj``.

``deepseek_attention`` runs SGLang's own ``forward_absorb_core`` on a
stand-in module that has exactly the attributes it reads, with ``w_vc`` and
``o_proj`` identities (so its output is the attention output, exactly), after
the DCP q gather ``forward_absorb_prepare`` performs under the same
condition. The projections before the gather need weights and are left out:
the check's q and k are already the absorbed ``[q_nope_out, q_pe]`` and
``[k_nope, k_pe]``.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

__all__ = ["deepseek_attention"]

_FORWARD_MLA = "sglang.srt.models.deepseek_common.attention_forward_methods.forward_mla"


def _stand_in(setup: Any, fm: Any) -> Any:
    """A ``DeepseekMLAForwardMixin`` with the attributes ``forward_absorb_core`` reads."""
    mixin = fm.DeepseekMLAForwardMixin
    stand_in_cls = type("DeepseekAttentionStandIn", (mixin,), {})
    attn = stand_in_cls.__new__(stand_in_cls)
    heads = setup.heads[1] - setup.heads[0]
    kv_lora = setup.inputs.head_dim_v
    values = {
        "current_attention_backend": setup.options["backend"],
        "dcp_size": setup.world,
        "use_dsa": False,
        "num_local_heads": heads,
        "kv_lora_rank": kv_lora,
        "qk_rope_head_dim": setup.inputs.q.shape[-1] - kv_lora,
        "v_head_dim": kv_lora,  # with w_vc the identity, the up-projection keeps the latent width
        "attn_mqa": setup.layer,
        "rotary_emb": None,  # rope is already applied to the check's q_pe and k_pe
        "use_deep_gemm_bmm": False,
        "w_vc": torch.eye(kv_lora, dtype=setup.dtype, device=setup.device).expand(heads, kv_lora, kv_lora).contiguous(),
        "w_scale": 1.0,
        "o_proj": lambda x: (x, None),
        "next_skip_topk": None,
        "learnable_sink_param": None,
        "w_kc_qrep": None,
    }
    if setup.layer_gathered is not None:
        values["attn_mqa_for_dcp_decode"] = setup.layer_gathered
    for name, value in values.items():
        setattr(attn, name, value)
    return attn


def _dcp_decode_phase(attn: Any, fm: Any, forward_batch: Any) -> bool:
    method = getattr(attn, "is_dcp_mla_decode_phase", None)
    if method is not None:
        return bool(method(forward_batch))
    return bool(fm.is_dcp_mla_decode_phase(forward_batch))  # 0.5.20: a module function


def _q_replicate(attn: Any, forward_batch: Any) -> bool:
    method = getattr(attn, "is_dcp_q_replicate_phase", None)
    return bool(method(forward_batch)) and attn.w_kc_qrep is not None if method is not None else False


def deepseek_attention(setup: Any, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, tuple[str, ...]]:
    """``forward_absorb_core`` on the rank's ``q`` ``[T, h, 576]`` and new ``k`` ``[T, 1, 576]``: ``[T, h * 512]``."""
    import importlib

    fm = importlib.import_module(_FORWARD_MLA)
    attn = _stand_in(setup, fm)
    fb = setup.forward_batch
    kv_lora = setup.inputs.head_dim_v
    q_nope_out, q_pe = q[..., :kv_lora], q[..., kv_lora:]
    k_nope, k_pe = k[..., :kv_lora], k[..., kv_lora:]
    functions = [f"{_FORWARD_MLA}:DeepseekMLAForwardMixin.forward_absorb_core"]
    if setup.world > 1 and _dcp_decode_phase(attn, fm, fb) and not _q_replicate(attn, fb):
        q_nope_out, q_pe = fm.all_gather_q_for_mla_decode(q_nope_out=q_nope_out, q_pe=q_pe)
        functions.append("sglang.srt.layers.dcp.comm:all_gather_q_for_mla_decode")
    from sglang.srt.utils import BumpAllocator

    arguments = {
        "q_pe": q_pe, "k_pe": k_pe, "q_nope_out": q_nope_out, "k_nope": k_nope, "forward_batch": fb,
        "zero_allocator": BumpAllocator(buffer_size=16, dtype=torch.float32, device=setup.device),
        "positions": fb.positions, "topk_indices": None, "llama_4_scaling": None,
    }
    params = inspect.signature(fm.DeepseekMLAForwardMixin.forward_absorb_core).parameters
    out = attn.forward_absorb_core(**{k: v for k, v in arguments.items() if k in params})
    if isinstance(out, tuple):
        out = out[0]
    return out, tuple(functions)
