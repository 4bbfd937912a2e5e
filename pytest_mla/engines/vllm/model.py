"""The model's attention layer a vLLM check runs through, and the vLLM config it is built under.

The layer is vLLM's own (``MLAAttention`` on the cell's backend, ``Attention``
for GQA models) with weights that make it pass the harness's latent query
and output through unchanged; its config is vLLM's own config classes in
the adapter's stand-in, without the validators that need a checkpoint.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

from .startup import StandInConfig
from .support import LAYER_NAME, MAX_MODEL_LEN

# ---- vLLM's configuration for one check ---------------------------------------------------------


def mla_config(engine: Any, options: Mapping[str, Any]) -> Any:
    """The sections of a ``VllmConfig`` the layer, its impl and its builder read: vLLM's own classes."""
    from vllm.config import AttentionConfig, CacheConfig, KernelConfig, ParallelConfig, SchedulerConfig, VllmConfig

    from ...core.models import ModelConfig
    from ...kernels.inputs import DTYPES

    model = ModelConfig(options["model"], True, options["num_heads"], 1, options["kv_lora_rank"],
                        options["qk_rope_head_dim"], options["qk_nope_head_dim"], options["v_head_dim"])
    model_config = copy.copy(engine.vllm.model_view(model))  # the adapter's cached view stays as it is
    model_config.max_model_len = MAX_MODEL_LEN
    model_config.dtype = DTYPES[options.get("dtype", "bf16")]
    parallel = ParallelConfig(tensor_parallel_size=options["tp"], decode_context_parallel_size=options["dcp"])
    parallel.set_dcp_defaults()  # what VllmConfig.__post_init__ does for models without a preference
    cache = CacheConfig(block_size=options["block_size"], cache_dtype=options["cache_dtype"])
    scheduler = SchedulerConfig(max_model_len=MAX_MODEL_LEN, is_encoder_decoder=False)
    compilation = compilation_config(options)
    speculative = _speculative_config(options)
    attention = AttentionConfig()
    # the stand-in config skips VllmConfig.__post_init__, which fills this default from the max model length
    if attention.sparse_mla_prefill_workspace_factor is None:
        attention.sparse_mla_prefill_workspace_factor = 5 if MAX_MODEL_LEN <= 256 * 1024 else 2
    return _view_of(VllmConfig, StandInConfig)(
        model_config=model_config, parallel_config=parallel, cache_config=cache, scheduler_config=scheduler,
        compilation_config=compilation, attention_config=attention, kernel_config=KernelConfig(),
        speculative_config=speculative)


def _speculative_config(options: Mapping[str, Any]) -> Any:
    """The cell's speculative method and token count in a ``SpeculativeConfig`` view (None without speculation)."""
    if not options["num_speculative_tokens"]:
        return None
    from vllm.config import SpeculativeConfig

    speculative = _view_of(SpeculativeConfig)()
    speculative.method = options["spec_method"]
    speculative.num_speculative_tokens = options["num_speculative_tokens"]
    return speculative


def compilation_config(options: Mapping[str, Any]) -> Any:
    """vLLM's ``CompilationConfig``, with the CUDA-graph mode and capture size the start-up resolved for the cell.

    Builders size their persistent buffers and split counts by them
    (``options["cudagraph_mode"]``, ``max_cudagraph_capture_size``; absent:
    the class default, which the Triton builders do not read).
    """
    from vllm.config import CompilationConfig

    compilation = CompilationConfig()
    # VllmConfig.__post_init__ resolves this for the default inductor compile mode.
    compilation.custom_ops.append("none")
    if options.get("cudagraph_mode"):
        from vllm.config.compilation import CUDAGraphMode

        compilation.cudagraph_mode = CUDAGraphMode[options["cudagraph_mode"]]
        compilation.max_cudagraph_capture_size = options.get("max_cudagraph_capture_size")
    return compilation



_views: dict[type, type] = {}


def _view_of(cls: type, base: type = object) -> type:
    """A class with ``cls``'s methods and properties and its fields' defaults, without its validators.

    vLLM's ``VllmConfig`` and ``SpeculativeConfig`` validate a whole engine
    (a model checkpoint, a draft model) when built; the checks read only a
    few fields and derive the rest through the classes' own properties
    (``num_speculative_tokens``, ``max_num_new_slots_for_drafting``, ...),
    which the view keeps. Fields without a plain default start as ``None``.
    """
    import dataclasses

    key = (cls, base)
    if key not in _views:
        attrs: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            attrs[field.name] = field.default if field.default is not dataclasses.MISSING else None
        for name, value in vars(cls).items():
            if name.startswith("__") or name in attrs or name.startswith("_abc"):
                continue
            if callable(value) or isinstance(value, (property, staticmethod, classmethod)):
                attrs[name] = value
        if base is not object:  # the stand-in's sections are instance attributes
            attrs = {k: v for k, v in attrs.items() if not k.endswith("_config") and k != "instance_id"}
        _views[key] = type(f"{cls.__name__}View", (base,), attrs)
    return _views[key]



def backend_class(name: str) -> Any:
    """The class vLLM registers for the ``AttentionBackendEnum`` member ``name``."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return AttentionBackendEnum[name].get_class()


def _latent_kv_b_proj(heads: int, dtype: Any, device: Any) -> Any:
    """``kv_b_proj`` of a model whose per-head K_nope and V are the latent itself (identity blocks).

    vLLM's MHA (prefill) path up-projects the cached latent ``c`` with
    ``kv_b_proj(c)[0].view(-1, heads, qk_nope_head_dim + v_head_dim)``; with
    ``qk_nope_head_dim = v_head_dim = kv_lora_rank`` and identity blocks each
    head gets ``(k_nope, v) = (c, c)``, so the MHA computes the same attention
    as the absorbed MQA decode (``W_UK_T`` = ``W_UV`` = identity). Called as a
    ``ColumnParallelLinear`` is (returns ``(output, bias)``); its (empty)
    ``weight`` carries the dtype and device vLLM reads from it.
    """
    import torch

    class LatentKvBProj(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(0, dtype=dtype, device=device), requires_grad=False)
            self.params_dtype = dtype
            self.quant_method = None  # an unquantized checkpoint (vLLM's get_and_maybe_dequant_weights reads it)

        def forward(self, latent: Any) -> tuple[Any, None]:
            return latent.repeat(*([1] * (latent.dim() - 1)), 2 * heads), None

    return LatentKvBProj()


def build_mla_layer(options: Mapping[str, Any], scale: float, device: Any) -> Any:
    """vLLM's ``MLAAttention`` on the cell's backend, absorption weights the identity.

    ``qk_nope_head_dim = v_head_dim = kv_lora_rank`` makes ``W_UK_T`` and
    ``W_UV`` square: set to the identity (what ``process_weights_after_loading``
    would derive from ``kv_b_proj``, here ``_latent_kv_b_proj``),
    ``_prepare_mqa_query`` turns the harness's latent query into itself and
    ``_v_up_proj`` returns the latent output; the MHA prefill path sees the
    latent as K_nope and V. The MLA prefill backend is the one vLLM selects for
    the model's own dimensions (its selector reads the model config).
    """
    import torch
    from vllm.config import get_current_vllm_config
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention

    config = get_current_vllm_config()
    rank = options["kv_lora_rank"]
    heads = options["num_heads"] // options["tp"]
    kv_b_proj = _latent_kv_b_proj(heads, config.model_config.dtype, device)
    sparse = {}
    if options.get("index_topk"):  # a sparse model: the buffer its indexer fills (deepseek_v2.py DeepseekV2Model)
        sparse = {"use_sparse": True, "topk_indices_buffer": _topk_indices_buffer(config, options, device)}
    layer = MLAAttention(num_heads=heads, scale=scale, qk_nope_head_dim=rank,
                         qk_rope_head_dim=options["qk_rope_head_dim"], v_head_dim=rank, q_lora_rank=None,
                         kv_lora_rank=rank, kv_b_proj=kv_b_proj, cache_config=config.cache_config,
                         prefix=LAYER_NAME, attn_backend=backend_class(options.get("backend", "TRITON_MLA")), **sparse)
    eye = torch.eye(rank, dtype=config.model_config.dtype, device=device)
    layer.W_UK_T = eye.expand(heads, rank, rank).contiguous()
    layer.W_UV = eye.expand(heads, rank, rank).contiguous()
    return layer


#: What a row of the shared top-k buffer holds past the tokens of the batch: the model allocates it with
#: ``torch.empty`` (deepseek_v2.py, DeepseekV2Model.__init__); an index no request holds, so that a read
#: of a row the indexer did not write shows (the conversion maps it to -1 or the kernel reads NaN).
TOPK_POISON = 2**30


def _topk_indices_buffer(config: Any, options: Mapping[str, Any], device: Any) -> Any:
    """The shared top-k buffer as ``DeepseekV2Model`` allocates it: ``[max_num_batched_tokens, index_topk]`` int32."""
    import torch

    rows = config.scheduler_config.max_num_batched_tokens
    return torch.full((rows, int(options["index_topk"])), TOPK_POISON, dtype=torch.int32, device=device)



def loaded_kv_scale(kv_scale: float | None) -> float | None:
    """The layer's KV scale once vLLM has loaded a checkpoint's (``BaseKVCacheMethod``).

    ``kv_scale`` 1.0 is a checkpoint without KV scales (the loader's default,
    1.0 on every platform); another value is the checkpoint's, which
    ``process_weights_after_loading`` doubles where the platform's fp8 is
    e4m3fnuz (``current_platform.is_fp8_fnuz()``, kv_cache.py 0.34.0:113-117:
    fnuz's largest value is half of e4m3fn's).
    """
    if kv_scale is None or float(kv_scale) == 1.0:
        return kv_scale
    from vllm.platforms import current_platform

    fnuz = getattr(current_platform, "is_fp8_fnuz", None)
    return float(kv_scale) * (2.0 if fnuz is not None and fnuz() else 1.0)


def load_latent_kv_b_proj(layer: Any, options: Mapping[str, Any], device: Any) -> None:
    """AMX_MLA: the identity ``kv_b_proj`` as a checkpoint's weight, then vLLM's ``process_weights_after_loading``.

    ``AMXMLAImpl`` reads neither ``W_UK_T`` nor ``W_UV``: its
    ``process_weights_after_loading`` splits ``kv_b_proj.weight``
    (``[heads · (nope + v), kv_lora_rank]``) and VNNI-packs the halves for
    ``bmm_cpu``, which ``MLAAttention`` then absorbs and de-absorbs with. The
    weight is ``_latent_kv_b_proj``'s map written out: an identity block for
    each head's K_nope and V.
    """
    import torch

    rank = options["kv_lora_rank"]
    heads = options["num_heads"] // options["tp"]
    proj = layer.kv_b_proj
    proj.weight = torch.nn.Parameter(torch.eye(rank, dtype=proj.params_dtype, device=device).repeat(2 * heads, 1),
                                     requires_grad=False)
    layer.process_weights_after_loading()


def set_kv_scales(layer: Any, kv_scale: float | None) -> None:
    """The layer's KV-cache scales as a checkpoint that stores them sets them (``BaseKVCacheMethod``).

    ``process_weights_after_loading`` copies the checkpoint's ``k_scale`` /
    ``v_scale`` into ``_k_scale`` / ``_v_scale`` and their floats (doubled on
    an e4m3fnuz platform: ``loaded_kv_scale``); a checkpoint without them
    leaves 1.0. The query scale stays 1.0, as vLLM leaves it for a checkpoint
    without ``q_scale``: ``process_weights_after_loading`` first copies
    ``k_scale`` into ``_q_scale`` (kv_cache.py 0.34.0:140-147), then sets it
    from ``q_scale``, 1.0 when the checkpoint has none (:183-190).
    """
    kv_scale = loaded_kv_scale(kv_scale)
    if kv_scale is None:
        return
    for name in ("_k_scale", "_v_scale"):
        getattr(layer, name).fill_(float(kv_scale))
    layer._k_scale_float = float(kv_scale)
    layer._v_scale_float = float(kv_scale)
    for name in ("_k_scale_cpu", "_v_scale_cpu"):
        if hasattr(layer, name):
            setattr(layer, name, getattr(layer, name[:-4]).detach().to("cpu"))



def gqa_config(engine: Any, options: Mapping[str, Any]) -> Any:
    from vllm.config import AttentionConfig, CacheConfig, KernelConfig, ParallelConfig, SchedulerConfig, VllmConfig

    from ...core.models import ModelConfig

    model = ModelConfig(options["model"], False, options["num_heads"], options["num_kv_heads"],
                        head_dim=options["head_dim"])
    model_config = copy.copy(engine.vllm.model_view(model))
    model_config.max_model_len = MAX_MODEL_LEN
    model_config.rswa_window = None  # no reduced sliding window: a plain text model
    model_config.is_mm_prefix_lm = False
    parallel = ParallelConfig(tensor_parallel_size=options["tp"], decode_context_parallel_size=options.get("dcp", 1))
    parallel.set_dcp_defaults()
    cache = CacheConfig(block_size=options["block_size"], cache_dtype=options["cache_dtype"])
    compilation = compilation_config(options)
    speculative = _speculative_config(options)
    return _view_of(VllmConfig, StandInConfig)(
        model_config=model_config, parallel_config=parallel, cache_config=cache,
        scheduler_config=SchedulerConfig(max_model_len=MAX_MODEL_LEN, is_encoder_decoder=False),
        compilation_config=compilation, attention_config=AttentionConfig(), kernel_config=KernelConfig(),
        speculative_config=speculative)

