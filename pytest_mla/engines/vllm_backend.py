"""vLLM's own attention backend, run per DCP rank on this host (engine checks, issue 11).

``run_triton_mla`` is an engine runner (``kernels/engine_check.py``): for one
DCP rank it builds, with vLLM's own classes and the cell's configuration,

* the attention layer: a real ``MLAAttention`` with ``TritonMLABackend``
  (its ``TritonMLAImpl``, its ``MLADCPManager`` choosing the DCP merge, its
  KV-cache quantisation scales); the model's absorption weights are the
  identity (``W_UK_T``, ``W_UV``), so the layer's own query preparation and
  output projection pass the harness's latent query and the latent output
  through unchanged;
* the rank's shard of the KV cache: slots computed by the V2 model runner's
  ``_compute_slot_mappings_kernel`` (block table shared by the ranks, token
  ``p`` on rank ``(p // I) % N``), its ``prepare_dcp_local_seq_lens`` for
  the local lengths;
* the attention metadata: ``TritonMLAMetadataBuilder.build`` on a
  ``CommonAttentionMetadata`` as ``build_attn_metadata`` fills it;

then calls ``MLAAttention.forward_impl``: ``_prepare_mqa_query`` (the DCP
all-gather of the query heads), ``TritonMLAImpl.forward_mqa`` (vLLM's Triton
``decode_attention_fwd``), the DCP combine the manager selected
(``cp_lse_ag_out_rs``: all-gather of the LSEs, ``correct_attn_out``, reduce-
scatter of the heads) and ``_v_up_proj``. The rank returns its heads.

The DCP group is a stand-in for vLLM's ``GroupCoordinator`` (``world_size``,
``rank_in_group``, ``all_gather``, ``reduce_scatter``) over the harness's
collectives: ranks taking turns in this process, or real gloo processes.

Running here needs, before vLLM is imported: ``CUDA_VISIBLE_DEVICES=`` (empty)
so that ``vllm.triton_utils`` keeps Triton on a host without a GPU driver,
``TRITON_INTERPRET=1``, and the adapter's faked CUDA platform
(``VLLMEngine``). ``prepare_process`` does all three, idempotently, also in a
fresh DCP rank process.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import types
from typing import Any, Iterator, Mapping

PACKAGE = "vllm"
RUNNER = "pytest_mla.engines.vllm_backend:run_triton_mla"
#: The function that computes the attention (the kernel record names it).
TRITON_MLA_FUNCTION = "vllm.v1.attention.backends.mla.triton_mla:TritonMLAImpl.forward_mqa"
LAYER_NAME = "model.layers.0.self_attn.attn"
#: ``max_model_len`` of the checks' stand-in model config (sizes workspaces only).
MAX_MODEL_LEN = 4096
#: A capability every TRITON_MLA configuration of the matrices constructs on; the
#: decode path reads none (the cell's own arch is tried in ``kernel_for``).
DEFAULT_CAPABILITY = "9.0"

#: vLLM's switches for its direct symmetric-memory DCP paths (NVLS multicast on CUDA), off on a
#: CPU host: there it takes the path it takes on any GPU node without multicast memory
#: (``GroupCoordinator.all_gather`` of the query, AG + RS combine).
NO_SYMMETRIC_MEMORY = {"VLLM_USE_DIRECT_DCP_Q_GATHER": "0", "VLLM_USE_DIRECT_DCP_KV_GATHER": "0",
                       "VLLM_USE_DIRECT_DCP_A2A": "0"}

_state: dict[str, Any] = {}
_lock = threading.Lock()


# ---- process set-up ---------------------------------------------------------------------------


def prepare_environment() -> None:
    """Before vLLM is imported: keep Triton on a GPU-less host, decide the interpreter.

    ``vllm.triton_utils`` disables Triton when no GPU driver is active unless
    ``CUDA_VISIBLE_DEVICES`` is set and empty (its "distributed environment"
    exception); without it every ``@triton.jit`` in vLLM is a placeholder.
    """
    from ..kernels._mode import ensure_triton_mode

    where = ensure_triton_mode()
    if where in ("interpreter", "cpu") and "CUDA_VISIBLE_DEVICES" not in os.environ:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def prepare_process() -> Any:
    """The adapter's engine (stubs, faked platform) in this process, made once."""
    with _lock:
        engine = _state.get("engine")
        if engine is None:
            prepare_environment()
            from .vllm import VLLMEngine

            engine = _state["engine"] = VLLMEngine()
        return engine


# ---- the DCP group -----------------------------------------------------------------------------


class _Group:
    """What vLLM's MLA DCP path asks of a ``GroupCoordinator``, over the harness's collectives."""

    def __init__(self, collectives: Any, device: Any) -> None:
        self._c = collectives
        self.world_size = collectives.world
        self.rank_in_group = collectives.rank
        self.rank = collectives.rank
        self.ranks = list(range(collectives.world))
        self.device = device
        self.device_group = collectives.process_group
        self.cpu_group = collectives.process_group
        self.unique_name = "dcp:pytest-mla"

    def all_gather(self, input_: Any, dim: int = -1) -> Any:
        import torch

        if self.world_size == 1:
            return input_
        return torch.cat(self._c.all_gather(input_.contiguous()), dim=dim)

    def reduce_scatter(self, input_: Any, dim: int = -1) -> Any:
        if self.world_size == 1:
            return input_
        total = self._c.all_reduce(input_.contiguous())
        return total.chunk(self.world_size, dim=dim)[self.rank_in_group].contiguous()

    def all_reduce(self, input_: Any) -> Any:
        return input_ if self.world_size == 1 else self._c.all_reduce(input_.contiguous())


class _ThreadGroup:
    """``parallel_state._DCP`` while checks run: each rank thread sees its own group."""

    def __init__(self) -> None:
        self._local = threading.local()

    def bind(self, group: _Group | None) -> None:
        self._local.group = group

    def __getattr__(self, name: str) -> Any:
        group = getattr(self._local, "group", None)
        if group is None:
            raise AttributeError(name)
        return getattr(group, name)


# ---- vLLM's configuration for one check ---------------------------------------------------------


def _vllm_config(engine: Any, options: Mapping[str, Any]) -> Any:
    """The sections of a ``VllmConfig`` the layer, its impl and its builder read: vLLM's own classes."""
    from vllm.config import (AttentionConfig, CacheConfig, CompilationConfig, KernelConfig, SchedulerConfig,
                             ParallelConfig, SpeculativeConfig, VllmConfig)

    from ..core.models import ModelConfig
    from .vllm import _StandInConfig

    model = ModelConfig(options["model"], True, options["num_heads"], 1, options["kv_lora_rank"],
                        options["qk_rope_head_dim"], options["qk_nope_head_dim"], options["v_head_dim"])
    model_config = engine._model_view(model)
    model_config.max_model_len = MAX_MODEL_LEN
    parallel = ParallelConfig(tensor_parallel_size=options["tp"], decode_context_parallel_size=options["dcp"])
    parallel.set_dcp_defaults()  # what VllmConfig.__post_init__ does for models without a preference
    cache = CacheConfig(block_size=options["block_size"], cache_dtype=options["cache_dtype"])
    scheduler = SchedulerConfig(max_model_len=MAX_MODEL_LEN, is_encoder_decoder=False)
    compilation = CompilationConfig()
    # VllmConfig.__post_init__ resolves this for the default inductor compile mode.
    compilation.custom_ops.append("none")
    speculative = None
    if options["num_speculative_tokens"]:
        speculative = _view_of(SpeculativeConfig)()
        speculative.method = options["spec_method"]
        speculative.num_speculative_tokens = options["num_speculative_tokens"]
    return _view_of(VllmConfig, _StandInConfig)(
        model_config=model_config, parallel_config=parallel, cache_config=cache, scheduler_config=scheduler,
        compilation_config=compilation, attention_config=AttentionConfig(), kernel_config=KernelConfig(),
        speculative_config=speculative)


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


@contextlib.contextmanager
def _vllm_context(engine: Any, config: Any, capability: str, group: _Group | None) -> Iterator[None]:
    """vLLM's process-wide state for one rank: arch, DCP group, current config, model dtype."""
    import torch
    import vllm.distributed.parallel_state as parallel_state
    from vllm.config import set_current_vllm_config

    with _lock:
        holder = _state.get("dcp")
        if holder is None:
            holder = _state["dcp"] = _ThreadGroup()
    major, minor = (int(x) for x in capability.split("."))
    engine._platform_cls.capability = engine._capability(major, minor)
    saved_dcp, saved_dtype = parallel_state._DCP, torch.get_default_dtype()
    saved_env = {name: os.environ.get(name) for name in NO_SYMMETRIC_MEMORY}
    if group is not None and group.device.type == "cpu":
        os.environ.update(NO_SYMMETRIC_MEMORY)
    holder.bind(group)
    parallel_state._DCP = holder if group is not None else None
    torch.set_default_dtype(config.model_config.dtype)
    try:
        with set_current_vllm_config(config):
            yield
    finally:
        torch.set_default_dtype(saved_dtype)
        parallel_state._DCP = saved_dcp
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        holder.bind(None)


def _build_layer(options: Mapping[str, Any], scale: float, device: Any) -> Any:
    """vLLM's ``MLAAttention`` on ``TritonMLABackend``, absorption weights the identity.

    ``qk_nope_head_dim = v_head_dim = kv_lora_rank`` makes ``W_UK_T`` and
    ``W_UV`` square: set to the identity (what ``process_weights_after_loading``
    would derive from ``kv_b_proj``), ``_prepare_mqa_query`` turns the
    harness's latent query into itself and ``_v_up_proj`` returns the latent
    output. The decode path reads no other model dimension.
    """
    import torch
    from vllm.config import get_current_vllm_config
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    from vllm.v1.attention.backends.mla.triton_mla import TritonMLABackend

    config = get_current_vllm_config()
    rank = options["kv_lora_rank"]
    heads = options["num_heads"] // options["tp"]
    kv_b_proj = torch.nn.Linear(1, 1, device=device)  # only its device is read before weight loading
    layer = MLAAttention(num_heads=heads, scale=scale, qk_nope_head_dim=rank,
                         qk_rope_head_dim=options["qk_rope_head_dim"], v_head_dim=rank, q_lora_rank=None,
                         kv_lora_rank=rank, kv_b_proj=kv_b_proj, cache_config=config.cache_config,
                         prefix=LAYER_NAME, attn_backend=TritonMLABackend)
    eye = torch.eye(rank, dtype=config.model_config.dtype, device=device)
    layer.W_UK_T = eye.expand(heads, rank, rank).contiguous()
    layer.W_UV = eye.expand(heads, rank, rank).contiguous()
    return layer


# ---- the rank's shard, as vLLM's model runner lays it out ---------------------------------------


def _rank_cache(inputs: Any, layer: Any, config: Any, rank: int, world: int, interleave: int,
                spec: Any) -> tuple[Any, Any, Any]:
    """``(kv_cache, block_table, dcp_local_seq_lens)`` of this rank, filled at vLLM's slots.

    Every token of every request is written at the slot the V2 model runner's
    ``_compute_slot_mappings_kernel`` computes for this rank (tokens of other
    ranks get no slot); the cache is otherwise NaN. The block table is the
    harness's shuffled one, cut to the blocks of one rank (a block holds
    ``block_size`` local tokens of ``block_size * N`` positions).
    """
    import torch
    from vllm.v1.attention.backends.utils import PAD_SLOT_ID
    from vllm.v1.worker.gpu.block_table import _compute_slot_mappings_kernel

    device = inputs.q.device
    block = config.cache_config.block_size
    seqlens = [int(n) for n in inputs.cache_seqlens.tolist()]
    b = len(seqlens)
    virtual = block * world
    blocks = [-(-n // virtual) for n in seqlens]
    table = torch.zeros(b, max(max(blocks, default=0), 1), dtype=torch.int32, device=device)
    for i, n in enumerate(blocks):
        table[i, :n] = inputs.block_table[i, :n]
    positions = torch.cat([torch.arange(n, dtype=torch.int64) for n in seqlens]).to(device)
    starts = torch.tensor([0] + seqlens, dtype=torch.int32).cumsum(0).to(torch.int32).to(device)
    total = int(starts[-1])
    slots = torch.empty(1, max(total, 1), dtype=torch.int64, device=device)
    ptrs = torch.tensor([table.data_ptr()], dtype=torch.uint64, device=device)
    _compute_slot_mappings_kernel[(1, b + 1)](
        slots.shape[1], torch.arange(b, dtype=torch.int32, device=device), starts, positions,
        ptrs, torch.tensor([table.stride(0)], dtype=torch.int32, device=device),
        torch.tensor([block], dtype=torch.int32, device=device),
        torch.tensor([True], device=device), torch.tensor([True], device=device),
        slots, slots.stride(0), rank, CP_SIZE=world, CP_INTERLEAVE=interleave, PAD_ID=PAD_SLOT_ID,
        TRITON_BLOCK_SIZE=1024)
    slot = slots[0, :total]

    rows = torch.cat([_dense_rows(inputs, i, n) for i, n in enumerate(seqlens)]) if total else None
    num_blocks = inputs.kv_cache.shape[0]
    cache = torch.empty(num_blocks, block, inputs.kv_cache.shape[-1], dtype=spec.dtype, device=device)
    if spec.dtype == torch.uint8:  # an fp8 cache: vLLM allocates bytes and views them as fp8
        cache.view(inputs.kv_cache.dtype).fill_(math.nan)
    else:
        cache.fill_(math.nan)
    if rows is not None:
        mine = slot != PAD_SLOT_ID
        flat = cache.view(-1, cache.shape[-1])
        flat[slot[mine]] = rows[mine].view(spec.dtype) if spec.dtype == torch.uint8 else rows[mine].to(cache.dtype)

    local = None
    if world > 1:
        from vllm.v1.worker.gpu.cp_utils import prepare_dcp_local_seq_lens

        buffer = torch.zeros(b, dtype=torch.int32, device=device)
        local = prepare_dcp_local_seq_lens(buffer, inputs.cache_seqlens.to(device), b, world, rank, interleave,
                                           num_reqs_padded=b)
    return cache, table, local


def _dense_rows(inputs: Any, i: int, n: int) -> Any:
    """Request ``i``'s ``n`` cached rows in position order ``[n, d]`` (the unsharded cache's dtype)."""
    page = inputs.kv_cache.shape[1]
    pages = inputs.block_table[i, : -(-n // page)].long()
    return inputs.kv_cache[pages].reshape(-1, inputs.kv_cache.shape[-1])[:n]


# ---- the runner ---------------------------------------------------------------------------------


def run_triton_mla(inputs: Any, ctx: Any, options: Mapping[str, Any]) -> Any:
    """One DCP rank of vLLM's TRITON_MLA decode / chain verify; its heads after vLLM's merge."""
    import torch
    from vllm.model_executor.layers.attention.mla_attention import QueryLenSupport
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends.mla.triton_mla import TritonMLAMetadataBuilder
    from vllm.v1.attention.backends.utils import split_decodes_and_prefills

    from ..kernels.engine_runner import EngineCannotRun, RankResult

    engine = prepare_process()
    world, rank = ctx.world, ctx.rank
    device = inputs.q.device
    b, s_q, h, d_qk = inputs.q.shape
    if options["num_heads"] // options["tp"] * world != h:
        raise ValueError(f"vllm runner: {h} query heads in the DCP group, expected "
                         f"{options['num_heads']} // tp {options['tp']} * dcp {world}")
    config = _vllm_config(engine, options)
    config.model_config.dtype = inputs.q.dtype
    group = _Group(ctx.collectives, device) if world > 1 else None
    # (the harness applies kernels.interpreter.interpreter_fixes around every interpreted engine check)
    with _vllm_context(engine, config, options.get("capability", DEFAULT_CAPABILITY), group):
        layer = _build_layer(options, inputs.softmax_scale, device)
        if inputs.kv_scale is not None:
            layer._k_scale.fill_(inputs.kv_scale)
            layer._k_scale_float = float(inputs.kv_scale)
        spec = layer.get_kv_cache_spec(config)
        builder = TritonMLAMetadataBuilder(spec, [LAYER_NAME], config, device)
        cache, table, local = _rank_cache(inputs, layer, config, rank, world, ctx.interleave, spec)
        seq_lens = inputs.cache_seqlens.to(device=device, dtype=torch.int32)
        qsl = torch.arange(0, (b + 1) * s_q, s_q, dtype=torch.int32)
        common = CommonAttentionMetadata(
            query_start_loc=qsl.to(device), query_start_loc_cpu=qsl, seq_lens=seq_lens,
            seq_lens_cpu_upper_bound=seq_lens.cpu(), max_seq_len=int(seq_lens.max()), num_reqs=b,
            num_actual_tokens=b * s_q, max_query_len=s_q, block_table_tensor=table,
            slot_mapping=torch.full((b * s_q,), -1, dtype=torch.int64, device=device), causal=True,
            dcp_local_seq_lens=local, dcp_local_seq_lens_cpu_upper_bound=local.cpu() if local is not None else None,
            is_prefilling=torch.zeros(b, dtype=torch.bool, device=device))
        # The builder's own decode/prefill split, as its build() makes it: rows past its
        # reorder threshold go to the MHA prefill path (a CUDA kernel).
        decodes, prefills, _, _ = split_decodes_and_prefills(
            common, decode_threshold=builder.reorder_batch_threshold,
            require_uniform=builder.query_len_support != QueryLenSupport.VARLEN,
            treat_short_extends_as_decodes=not builder.use_pcp)
        if prefills:
            raise EngineCannotRun(_prefill_reason(layer, prefills, builder, s_q))
        metadata = builder.build(0, common)
        per = h // world
        heads = (rank * per, (rank + 1) * per)
        q = inputs.q.reshape(b * s_q, h, d_qk)[:, heads[0]:heads[1]].contiguous()
        rank_dim = options["kv_lora_rank"]
        k_c = torch.zeros(b * s_q, rank_dim, dtype=q.dtype, device=device)  # read by prefill rows only
        k_pe = torch.zeros(b * s_q, 1, d_qk - rank_dim, dtype=q.dtype, device=device)
        output = torch.full((b * s_q, per * rank_dim), math.nan, dtype=q.dtype, device=device)
        layer.forward_impl(q, k_c, k_pe, cache, metadata, output)
        functions = [TRITON_MLA_FUNCTION,
                     "vllm.model_executor.layers.attention.mla_attention:MLAAttention.forward_impl",
                     "vllm.v1.attention.ops.triton_decode_attention:decode_attention_fwd"]
        if world > 1:
            functions.append(_combine_name(layer.dcp_manager.combine))
    out = output.view(b, s_q, per, rank_dim)
    return RankResult(out, None, heads if world > 1 else None, tuple(functions))


def _combine_name(combine: Any) -> str:
    fn = getattr(combine, "func", combine)
    return f"{fn.__module__}:{fn.__qualname__}"


def _prefill_reason(layer: Any, prefills: int, builder: Any, s_q: int) -> str:
    prefill = type(layer.prefill_backend).__name__ if layer.prefill_backend is not None else "none"
    dcp = " (under DCP its threshold stays 1: no DCP support for multi-token decode rows)" \
        if builder.dcp_world_size > 1 else ""
    return (f"vLLM's TritonMLAMetadataBuilder classes the {prefills} verify requests of {s_q} query tokens "
            f"as prefills: reorder_batch_threshold {builder.reorder_batch_threshold}{dcp}; they run "
            f"MLAAttention.forward_mha on the MLA prefill backend {prefill}, a CUDA kernel that does not "
            f"run on this host")
