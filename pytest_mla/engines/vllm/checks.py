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
import copy
import math
import os
import re
import threading
from typing import Any, Iterator, Mapping

PACKAGE = "vllm"
RUNNER = "pytest_mla.engines.vllm.startup:run_triton_mla"  # the adapter module: it makes the process's engine first
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
_lock = threading.RLock()


#: An ``AttributeError`` naming one of this module's stand-ins: vLLM read something the stand-in
#: lacks, the adapter's fault (``AdapterError``), never the engine's.
_STAND_IN = re.compile(r"'(\w+View|SimpleNamespace|_StandInConfig|_Group|_ThreadGroup|_NoCollectives)' object has no "
                       r"attribute")


@contextlib.contextmanager
def stand_in_guard() -> Iterator[None]:
    """Turn a stand-in's missing attribute into the adapter's error (see ``_STAND_IN``)."""
    from ...core.errors import AdapterError

    try:
        yield
    except AttributeError as exc:
        if _STAND_IN.search(str(exc)):
            raise AdapterError(f"vllm adapter: vLLM read an attribute its stand-in lacks: {exc}") from exc
        raise


# ---- process set-up ---------------------------------------------------------------------------


def prepare_environment() -> None:
    """Before vLLM is imported: keep Triton on a GPU-less host, decide the interpreter.

    ``vllm.triton_utils`` disables Triton when no GPU driver is active unless
    ``CUDA_VISIBLE_DEVICES`` is set and empty (its "distributed environment"
    exception); without it every ``@triton.jit`` in vLLM is a placeholder.
    """
    from ...kernels._mode import ensure_triton_mode

    where = ensure_triton_mode()
    if where in ("interpreter", "cpu") and "CUDA_VISIBLE_DEVICES" not in os.environ:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def adopt(engine: Any) -> None:
    """Use the adapter's engine already made in this process (its faked platform is the current one)."""
    with _lock:
        _state.setdefault("engine", engine)


def adopt_factory(factory: Any) -> None:
    """How to make the adapter's engine in a process that has none yet (a distributed DCP rank)."""
    with _lock:
        _state.setdefault("factory", factory)


def prepare_process() -> Any:
    """The adapter's engine (stubs, faked platform) in this process, made once."""
    with _lock:
        engine = _state.get("engine")
        if engine is None:
            factory = _state.get("factory")
            if factory is None:
                raise RuntimeError("vllm_backend: no engine in this process; run through pytest_mla.engines.vllm.startup")
            prepare_environment()
            engine = _state["engine"] = factory()
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

    from ...core.models import ModelConfig
    from ...kernels.inputs import DTYPES
    _StandInConfig = engine.stand_in_config_cls  # the adapter's (no import of the adapter module here)

    model = ModelConfig(options["model"], True, options["num_heads"], 1, options["kv_lora_rank"],
                        options["qk_rope_head_dim"], options["qk_nope_head_dim"], options["v_head_dim"])
    model_config = copy.copy(engine._model_view(model))  # the adapter's cached view stays as it is
    model_config.max_model_len = MAX_MODEL_LEN
    model_config.dtype = DTYPES[options.get("dtype", "bf16")]
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


def _rank_slots(inputs: Any, block: int, rank: int, world: int, interleave: int) -> tuple[Any, Any]:
    """``(block_table, slots)``: the rank's block table and the slot of every cached token.

    Slots are what the V2 model runner's ``_compute_slot_mappings_kernel``
    computes for this rank (``PAD_SLOT_ID`` for other ranks' tokens), for all
    tokens of all requests in order. The block table is the harness's
    shuffled one, cut to the blocks of one rank (a block holds ``block`` local
    tokens of ``block * N`` positions).
    """
    import torch
    from vllm.v1.attention.backends.utils import PAD_SLOT_ID
    from vllm.v1.worker.gpu.block_table import _compute_slot_mappings_kernel

    device = inputs.q.device
    seqlens = [int(n) for n in inputs.cache_seqlens.tolist()]
    b = len(seqlens)
    blocks = [-(-n // (block * world)) for n in seqlens]
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
    return table, slots[0, :total]


def _nan_cache(shape: tuple[int, ...], spec_dtype: Any, value_dtype: Any, device: Any) -> Any:
    """A cache of vLLM's storage dtype (bytes for fp8), every value NaN."""
    import torch

    cache = torch.empty(shape, dtype=spec_dtype, device=device)
    (cache.view(value_dtype) if spec_dtype == torch.uint8 else cache).fill_(math.nan)
    return cache


def _rank_cache(inputs: Any, config: Any, rank: int, world: int, interleave: int,
                spec: Any) -> tuple[Any, Any, Any]:
    """``(kv_cache [blocks, block, d], block_table, dcp_local_seq_lens)`` of this rank (MLA).

    Every token is written at the slot vLLM's model runner gives it on this
    rank (``_rank_slots``); the rest of the cache is NaN. Local lengths come
    from the runner's ``prepare_dcp_local_seq_lens``.
    """
    import torch

    device = inputs.q.device
    block = config.cache_config.block_size
    table, slots = _rank_slots(inputs, block, rank, world, interleave)
    seqlens = [int(n) for n in inputs.cache_seqlens.tolist()]
    cache = _nan_cache((inputs.kv_cache.shape[0], block, inputs.kv_cache.shape[-1]), spec.dtype,
                       inputs.kv_cache.dtype, device)
    if slots.numel():
        rows = torch.cat([_dense_rows(inputs.kv_cache, inputs.block_table, i, n) for i, n in enumerate(seqlens)])
        _write(cache.view(-1, cache.shape[-1]), slots, rows.reshape(slots.numel(), -1))
    local = None
    if world > 1:
        from vllm.v1.worker.gpu.cp_utils import prepare_dcp_local_seq_lens

        b = len(seqlens)
        buffer = torch.zeros(b, dtype=torch.int32, device=device)
        local = prepare_dcp_local_seq_lens(buffer, inputs.cache_seqlens.to(device), b, world, rank, interleave,
                                           num_reqs_padded=b)
    return cache, table, local


def _write(flat: Any, slots: Any, rows: Any) -> None:
    """``flat[slot] = row`` for this rank's tokens (``PAD_SLOT_ID`` marks the others'); fp8 rows as bytes."""
    import torch
    from vllm.v1.attention.backends.utils import PAD_SLOT_ID

    mine = slots != PAD_SLOT_ID
    rows = rows[mine]
    flat[slots[mine]] = rows.view(torch.uint8) if flat.dtype == torch.uint8 else rows.to(flat.dtype)


def _dense_rows(cache: Any, block_table: Any, i: int, n: int) -> Any:
    """Request ``i``'s ``n`` cached rows in position order ``[n, ...]`` (the harness's paged cache)."""
    page = cache.shape[1]
    pages = block_table[i, : -(-n // page)].long()
    return cache[pages].reshape(-1, *cache.shape[2:])[:n]


# ---- the runner ---------------------------------------------------------------------------------


def run_triton_mla(inputs: Any, ctx: Any, options: Mapping[str, Any]) -> Any:
    """One DCP rank of vLLM's TRITON_MLA decode / chain verify; its heads after vLLM's merge."""
    # The engine (its faked platform) first: vLLM's backend modules bind ``current_platform``
    # when imported, and a distributed rank process imports them here for the first time.
    engine = prepare_process()
    import torch
    from vllm.model_executor.layers.attention.mla_attention import QueryLenSupport
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends.mla.triton_mla import TritonMLAMetadataBuilder
    from vllm.v1.attention.backends.utils import split_decodes_and_prefills

    from ...kernels.engine_runner import EngineCannotRun, RankResult

    world, rank = ctx.world, ctx.rank
    device = inputs.q.device
    b, s_q, h, d_qk = inputs.q.shape
    if options["num_heads"] // options["tp"] * world != h:
        raise ValueError(f"vllm runner: {h} query heads in the DCP group, expected "
                         f"{options['num_heads']} // tp {options['tp']} * dcp {world}")
    config = _vllm_config(engine, options)
    config.model_config.dtype = inputs.q.dtype  # the check's dtype is the model's
    group = _Group(ctx.collectives, device) if world > 1 else None
    # (the harness applies kernels.interpreter.interpreter_fixes around every interpreted engine check)
    with stand_in_guard(), _vllm_context(engine, config, options.get("capability", DEFAULT_CAPABILITY), group):
        layer = _build_layer(options, inputs.softmax_scale, device)
        if inputs.kv_scale is not None:
            layer._k_scale.fill_(inputs.kv_scale)
            layer._k_scale_float = float(inputs.kv_scale)
        spec = layer.get_kv_cache_spec(config)
        builder = TritonMLAMetadataBuilder(spec, [LAYER_NAME], config, device)
        cache, table, local = _rank_cache(inputs, config, rank, world, ctx.interleave, spec)
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


# ---- what configure() declares --------------------------------------------------------------------

#: vLLM MLA backends whose decode kernels are CUDA-only here: the compiled module or library each needs.
GPU_BACKENDS = {
    "FLASHMLA": "vllm._flashmla_C (FlashMLA)",
    "FLASHINFER_MLA": "flashinfer (trtllm-gen MLA)",
    "CUTLASS_MLA": "vllm._C's cutlass_mla_decode",
    "FLASH_ATTN_MLA": "vllm.vllm_flash_attn._vllm_fa3_C (FlashAttention 3)",
    "TOKENSPEED_MLA": "tokenspeed_mla",
}


def backend_name(path: str) -> str:
    """The ``AttentionBackendEnum`` name of the backend class vLLM selected (``path``: its qualified name)."""
    import importlib

    module, _, qualname = path.rpartition(".")
    return getattr(importlib.import_module(module), qualname).get_name()


#: vLLM's CPU MLA backends and the op each decodes with (registered by a CPU build of vllm._C).
CPU_OPS = {"CPU_MLA": "mla_decode_kvcache", "AMX_MLA": "decode_attention_cpu"}
#: vLLM's ROCm MLA backends and the kernel callable each decodes with (no emulation of it yet).
ROCM_KERNELS = {
    "ROCM_AITER_MLA": "aiter.mla.mla_decode_fwd",
    "ROCM_AITER_TRITON_MLA": "aiter.mla.mla_decode_fwd",
    "ROCM_AITER_MLA_SPARSE": "ROCMAiterMLASparseImpl._forward_mla_aiter (aiter's sparse MLA decode)",
}


def kernel_for(engine: Any, cell: Any, model: Any, path: str, tp: int) -> tuple[Any, str | None]:
    """``(KernelSpec, None)`` when vLLM's own backend for this cell can run here, else ``(None, why)``."""
    from ...core.cells import platform_of
    from ...kernels._mode import ensure_triton_mode

    name = backend_name(path)
    platform = platform_of(cell.arch)
    if platform != "cuda":
        return None, other_platform_reason(name, cell.arch, platform)
    where = ensure_triton_mode()
    if name == "TRITON_MLA":
        return _triton_mla_spec(engine, cell, model, tp, where), None
    if name == "TRITON_ATTN" and not model.mla:
        return _triton_attn_spec(engine, cell, model, tp), None
    if name in GPU_BACKENDS:
        return gpu_backend_spec(name, cell, model, tp, where)
    return None, f"no engine check for vLLM's {name} backend on this host"


def other_platform_reason(name: str, arch: str, platform: str | None) -> str:
    """Why an accepted cell of a non-CUDA platform runs no check here, naming what it would need."""
    if name in CPU_OPS:
        import torch

        op = CPU_OPS[name]
        if not hasattr(torch.ops._C, op):
            return (f"vLLM's {name} decodes with torch.ops._C.{op}, which this host does not have "
                    "(the installed vllm._C is not a CPU build)")
        return f"vLLM's {name} decodes with torch.ops._C.{op}; its engine check is not written yet"
    if name in ROCM_KERNELS:
        return f"vLLM's {name} decodes with {ROCM_KERNELS[name]}, which has no emulation yet"
    return (f"vLLM's {name} on the {platform} platform ({arch}): the engine checks drive vLLM's CUDA-platform "
            "layers only")


def _spec_tokens(cell: Any) -> tuple[int, str | None]:
    from ...core.spec import parse_spec

    spec = parse_spec(str(cell.spec))
    return (spec.s_q - 1, spec.algorithm) if spec.enabled else (0, None)


def _mla_options(cell: Any, model: Any, tp: int) -> dict[str, Any]:
    tokens, method = _spec_tokens(cell)
    return {"model": model.name, "num_heads": model.num_heads, "kv_lora_rank": model.kv_lora_rank,
            "qk_rope_head_dim": model.qk_rope_head_dim, "qk_nope_head_dim": model.qk_nope_head_dim,
            "v_head_dim": model.v_head_dim, "tp": tp, "dcp": max(cell.dcp, 1), "block_size": int(cell.page_size),
            "cache_dtype": str(cell.kv_dtype or "auto"), "num_speculative_tokens": tokens,
            "spec_method": method}


def _triton_mla_spec(engine: Any, cell: Any, model: Any, tp: int, where: str) -> Any:
    """The engine check of a TRITON_MLA cell.

    The layer is first built (no kernel runs) under the cell's arch: if vLLM's
    construction raises there (``TritonMLAImpl.__init__`` refuses FP8 KV
    below SM89, say), the spec carries the arch so that the check raises the
    same and records it; otherwise the check is the same numeric case for
    every arch (vLLM's decode path reads no capability) and is shared.
    """
    from ...core.kernelspec import KernelSpec
    from ...kernels.harness import _KV_DTYPES

    options = _mla_options(cell, model, tp)
    capability = _capability_of(cell.arch)
    if _construction_raises(engine, options, capability):
        options["capability"] = capability
    dcp = options["dcp"]
    case = (("h_q", model.num_heads // tp * dcp), ("page_size", options["block_size"]),
            ("kv_dtype", _KV_DTYPES.get(options["cache_dtype"], options["cache_dtype"])), ("min_seqlen", 1))
    return KernelSpec(name="TRITON_MLA", target=RUNNER, protocol="engine", level="backend",
                      function=TRITON_MLA_FUNCTION, package=PACKAGE, returns_lse=False, tree_mask=False,
                      options=tuple(sorted(options.items())), case=case)


def _triton_attn_spec(engine: Any, cell: Any, model: Any, tp: int) -> Any:
    """The engine check of a TRITON_ATTN cell of a GQA model (no DCP: its impl has no DCP support)."""
    from ...core.kernelspec import KernelSpec
    from ...kernels.harness import _KV_DTYPES

    tokens, method = _spec_tokens(cell)
    options = {"model": model.name, "num_heads": model.num_heads, "num_kv_heads": model.num_kv_heads,
               "head_dim": model.head_dim, "tp": tp, "block_size": int(cell.page_size),
               "cache_dtype": str(cell.kv_dtype or "auto"), "num_speculative_tokens": tokens, "spec_method": method}
    capability = _capability_of(cell.arch)
    if _attn_construction_raises(engine, options, capability):
        options["capability"] = capability
    case = (("h_q", model.num_heads // tp), ("page_size", options["block_size"]),
            ("kv_dtype", _KV_DTYPES.get(options["cache_dtype"], options["cache_dtype"])), ("min_seqlen", 1))
    return KernelSpec(name="TRITON_ATTN", target=ATTN_RUNNER, protocol="engine", level="backend",
                      function=TRITON_ATTN_FUNCTION, package=PACKAGE, returns_lse=False, tree_mask=False,
                      dcp_positions=False, options=tuple(sorted(options.items())), case=case)


def _attn_construction_raises(engine: Any, options: Mapping[str, Any], capability: str) -> bool:
    """Whether vLLM raises building the TRITON_ATTN layer under ``capability`` (cached; no kernel runs)."""
    from ...core.errors import AdapterError

    key = ("attn", capability, tuple(sorted(options.items())))
    if key not in _probes:
        from vllm.model_executor.layers.attention.attention import Attention
        from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

        config = _gqa_config(engine, options)
        heads = options["num_heads"] // options["tp"]
        kv_heads = max(1, options["num_kv_heads"] // options["tp"])
        try:
            with stand_in_guard(), _vllm_context(engine, config, capability, None):
                Attention(num_heads=heads, head_size=options["head_dim"], scale=1.0, num_kv_heads=kv_heads,
                          cache_config=config.cache_config, prefix=LAYER_NAME, attn_backend=TritonAttentionBackend)
            _probes[key] = False
        except AdapterError:
            raise
        except Exception as exc:  # noqa: BLE001 - whether vLLM's own code refused is all we keep
            from ...kernels.engine_runner import engine_function_of

            _probes[key] = engine_function_of(exc, PACKAGE) is not None
    return _probes[key]


def _capability_of(arch: str) -> str:
    from ...core.cells import arch_number

    sm = arch_number(arch)
    return f"{sm // 10}.{sm % 10}"


class _NoCollectives:
    """The DCP group's size for building a layer; nothing is exchanged at construction."""

    process_group = None

    def __init__(self, world: int) -> None:
        self.rank, self.world = 0, world

    def all_gather(self, tensor: Any) -> Any:
        raise RuntimeError("no collectives while building the layer")

    all_reduce = all_gather


_probes: dict[tuple[Any, ...], bool] = {}


def _construction_raises(engine: Any, options: Mapping[str, Any], capability: str) -> bool:
    """Whether vLLM raises building this layer under ``capability`` (cached; no kernel runs)."""
    import torch

    from ...core.errors import AdapterError

    key = (capability, tuple(sorted(options.items())))
    if key not in _probes:
        config = _vllm_config(engine, options)
        world = options["dcp"]
        group = _Group(_NoCollectives(world), torch.device("cpu")) if world > 1 else None
        try:
            with stand_in_guard(), _vllm_context(engine, config, capability, group):
                _build_layer(options, 1.0, torch.device("cpu"))
            _probes[key] = False
        except AdapterError:
            raise
        except Exception as exc:  # noqa: BLE001 - whether vLLM's own code refused is all we keep
            from ...kernels.engine_runner import engine_function_of

            _probes[key] = engine_function_of(exc, PACKAGE) is not None
    return _probes[key]


def gpu_backend_spec(name: str, cell: Any, model: Any, tp: int, where: str) -> tuple[Any, str | None]:
    """vLLM's CUDA-only MLA backends: on a GPU host of the cell's arch a check of the real backend."""
    if where in ("interpreter", "cpu"):
        return None, (f"vLLM's {name} backend runs CUDA kernels ({GPU_BACKENDS[name]}): needs an {cell.arch} "
                      f"GPU; this host has none (Triton {where})")
    return None, (f"vLLM's {name} backend on {where}: its engine check is not written yet "
                  f"(see docs/engines.md, Kernel checks)")


# ---- TRITON_ATTN (GQA models) -------------------------------------------------------------------

TRITON_ATTN_FUNCTION = "vllm.v1.attention.backends.triton_attn:TritonAttentionImpl.forward"
ATTN_RUNNER = "pytest_mla.engines.vllm.startup:run_triton_attn"


def _gqa_config(engine: Any, options: Mapping[str, Any]) -> Any:
    from vllm.config import (AttentionConfig, CacheConfig, CompilationConfig, KernelConfig, ParallelConfig,
                             SchedulerConfig, SpeculativeConfig, VllmConfig)

    from ...core.models import ModelConfig
    _StandInConfig = engine.stand_in_config_cls  # the adapter's (no import of the adapter module here)

    model = ModelConfig(options["model"], False, options["num_heads"], options["num_kv_heads"],
                        head_dim=options["head_dim"])
    model_config = copy.copy(engine._model_view(model))
    model_config.max_model_len = MAX_MODEL_LEN
    model_config.rswa_window = None  # no reduced sliding window: a plain text model
    model_config.is_mm_prefix_lm = False
    parallel = ParallelConfig(tensor_parallel_size=options["tp"], decode_context_parallel_size=1)
    cache = CacheConfig(block_size=options["block_size"], cache_dtype=options["cache_dtype"])
    compilation = CompilationConfig()
    compilation.custom_ops.append("none")
    speculative = None
    if options["num_speculative_tokens"]:
        speculative = _view_of(SpeculativeConfig)()
        speculative.method = options["spec_method"]
        speculative.num_speculative_tokens = options["num_speculative_tokens"]
    return _view_of(VllmConfig, _StandInConfig)(
        model_config=model_config, parallel_config=parallel, cache_config=cache,
        scheduler_config=SchedulerConfig(max_model_len=MAX_MODEL_LEN, is_encoder_decoder=False),
        compilation_config=compilation, attention_config=AttentionConfig(), kernel_config=KernelConfig(),
        speculative_config=speculative)


def run_triton_attn(inputs: Any, ctx: Any, options: Mapping[str, Any]) -> Any:
    """vLLM's TRITON_ATTN (``TritonAttentionImpl.forward``: ``unified_attention``) for a GQA model, no DCP."""
    engine = prepare_process()  # before vLLM's modules bind ``current_platform`` (see run_triton_mla)
    import torch
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend, TritonAttentionMetadataBuilder

    from ...kernels.engine_runner import RankResult

    if ctx.world != 1:
        raise ValueError("vllm runner: TRITON_ATTN has no DCP (its impl has supports_dcp = False)")
    device = inputs.q.device
    b, s_q, h, d = inputs.q.shape
    h_kv = inputs.kv_cache.shape[2]
    config = _gqa_config(engine, options)
    config.model_config.dtype = inputs.q.dtype
    with stand_in_guard(), _vllm_context(engine, config, options.get("capability", DEFAULT_CAPABILITY), None):
        layer = Attention(num_heads=h, head_size=d, scale=inputs.softmax_scale, num_kv_heads=h_kv,
                          cache_config=config.cache_config, prefix=LAYER_NAME, attn_backend=TritonAttentionBackend)
        if inputs.kv_scale is not None:
            for scale in (layer._k_scale, layer._v_scale):
                scale.fill_(inputs.kv_scale)
        spec = layer.get_kv_cache_spec(config)
        builder = TritonAttentionMetadataBuilder(spec, [LAYER_NAME], config, device)
        block = config.cache_config.block_size
        table, slots = _rank_slots(inputs, block, 0, 1, 1)
        # TritonAttentionImpl.forward reads [num_blocks, num_kv_heads, block_size, 2 * head_size].
        cache = _nan_cache((inputs.kv_cache.shape[0], h_kv, block, 2 * d), spec.dtype, inputs.kv_cache.dtype, device)
        if slots.numel():
            seqlens = [int(n) for n in inputs.cache_seqlens.tolist()]
            k = torch.cat([_dense_rows(inputs.kv_cache, inputs.block_table, i, n) for i, n in enumerate(seqlens)])
            v = torch.cat([_dense_rows(inputs.v_cache, inputs.block_table, i, n) for i, n in enumerate(seqlens)])
            _write_tokens(cache, slots, torch.cat([k, v], dim=-1), block)
        seq_lens = inputs.cache_seqlens.to(device=device, dtype=torch.int32)
        qsl = torch.arange(0, (b + 1) * s_q, s_q, dtype=torch.int32)
        common = CommonAttentionMetadata(
            query_start_loc=qsl.to(device), query_start_loc_cpu=qsl, seq_lens=seq_lens,
            seq_lens_cpu_upper_bound=seq_lens.cpu(), max_seq_len=int(seq_lens.max()), num_reqs=b,
            num_actual_tokens=b * s_q, max_query_len=s_q, block_table_tensor=table,
            slot_mapping=torch.full((b * s_q,), -1, dtype=torch.int64, device=device), causal=True)
        metadata = builder.build(0, common)
        q = inputs.q.reshape(b * s_q, h, d).contiguous()
        kv = torch.zeros(b * s_q, h_kv, d, dtype=q.dtype, device=device)  # the new tokens are cached already
        # Attention.forward hands the impl its output as [tokens, heads, head_size].
        output = torch.full((b * s_q, h, d), math.nan, dtype=q.dtype, device=device)
        layer.impl.forward(layer, q, kv, kv, cache, metadata, output)
    functions = (TRITON_ATTN_FUNCTION, "vllm.v1.attention.ops.triton_unified_attention:unified_attention")
    return RankResult(output.view(b, s_q, h, d), None, None, functions)


def _write_tokens(cache: Any, slots: Any, rows: Any, block: int) -> None:
    """Token ``t`` at slot ``s``: ``cache[s // block, :, s % block] = rows[t]`` (this layout's heads-first blocks)."""
    import torch
    from vllm.v1.attention.backends.utils import PAD_SLOT_ID

    mine = slots != PAD_SLOT_ID
    slots, rows = slots[mine], rows[mine]
    values = rows.view(torch.uint8) if cache.dtype == torch.uint8 else rows.to(cache.dtype)
    cache[slots // block, :, slots % block] = values
