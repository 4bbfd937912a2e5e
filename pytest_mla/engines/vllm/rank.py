"""One DCP rank of a vLLM kernel check: vLLM's layer, metadata and cache for the rank, and the call.

``run_mla`` is an engine runner (``kernels/engine_check.py``): for one DCP
rank it builds, with vLLM's own classes and the cell's configuration, the
attention layer (``model``), the rank's shard of the KV cache as the V2
model runner lays it out (``batch``) and the attention metadata (vLLM's
``AttentionGroup`` and the backend's builder on a ``CommonAttentionMetadata``),
then calls ``MLAAttention.forward_impl``: the decode path (``forward_mqa``,
the DCP query gather and combine) or, for the verify rows the builder
classes as prefills, ``forward_mha``. The rank returns its heads. ``run_attn``
does the same for GQA models with vLLM's ``Attention`` layer. Which compiled
calls are real and which are float64 emulations is ``emulation``'s business.

The DCP group is the engines' one stand-in for a ``GroupCoordinator``
(``engines/common/process_group.py``) over the harness's collectives: ranks
taking turns in this process, or real gloo processes.
"""

from __future__ import annotations

import contextlib
import math
import os
import types
from typing import Any, Iterator, Mapping

from ..common.process_group import DcpGroup, PerThread, ThreadBound, torch_collectives_in_process
from ..common.schedule import recorded_splits
from ..common.shared_scope import SharedScope
from . import backends, emulation
from .batch import (dense_rows, fill_topk, free_null_block, graph_padded_size, impl_writes_tokens, nan_cache,
                    new_tokens, pad_for_graph, rank_cache, rank_slots, write_split_tokens, write_tokens)
from .model import backend_class, build_mla_layer, gqa_config, load_latent_kv_b_proj, mla_config, set_kv_scales
from .platform_check import platform_notes, platform_ops_missing
from .support import DEFAULT_CAPABILITY, LAYER_NAME, current_platform_fp8, prepare_process, stand_in_guard

#: vLLM's switches for its direct symmetric-memory DCP paths (NVLS multicast on CUDA), off on a
#: CPU host: there it takes the path it takes on any GPU node without multicast memory
#: (``GroupCoordinator.all_gather`` of the query, AG + RS combine).
NO_SYMMETRIC_MEMORY = {"VLLM_USE_DIRECT_DCP_Q_GATHER": "0", "VLLM_USE_DIRECT_DCP_KV_GATHER": "0",
                       "VLLM_USE_DIRECT_DCP_A2A": "0"}


#: ``parallel_state._DCP`` while checks run: each rank thread sees its own DCP group.
_rank_dcp_group = ThreadBound()
#: Each rank thread's own vLLM ``WorkspaceManager`` while checks run (``rank_workspaces``).
_workspaces = SharedScope("vllm checks")


@contextlib.contextmanager
def rank_workspaces(device: Any) -> Iterator[None]:
    """``vllm.v1.worker.workspace._manager`` while checks run: one ``WorkspaceManager`` on ``device`` per rank thread.

    vLLM makes one per worker process (``init_workspace_manager``, called by
    the GPU worker); in-process ranks taking turns would otherwise share its
    scratch buffers across a collective (FLASH_ATTN's DCP context output).
    Shared by the ranks of a check: the first installs it, the last puts
    vLLM's back.
    """
    with _workspaces.enter("workspaces", lambda: _per_thread_workspaces(device)):
        yield


@contextlib.contextmanager
def _per_thread_workspaces(device: Any) -> Iterator[None]:
    import vllm.v1.worker.workspace as workspace

    saved = workspace._manager
    workspace._manager = PerThread(lambda: workspace.WorkspaceManager(device))
    try:
        yield
    finally:
        workspace._manager = saved


@contextlib.contextmanager
def vllm_context(engine: Any, config: Any, capability: str, group: DcpGroup | None,
                 arch: str | None = None) -> Iterator[None]:
    """vLLM's process-wide state for one rank: arch, DCP group, current config, model dtype.

    ``arch`` (a cell of another platform, in its child process): the platform
    answers for it for the duration; else the faked CUDA GPU answers ``capability``.
    """
    import torch
    import vllm.distributed.parallel_state as parallel_state
    from vllm.config import set_current_vllm_config

    platforms = engine.vllm.platforms
    on_arch = _platform_on(platforms, arch) if arch is not None else contextlib.nullcontext()
    if arch is None:
        major, minor = (int(x) for x in capability.split("."))
        if platforms.cuda_capability != platforms._capability(major, minor):  # the faked GPU answers the check's arch
            with platforms.on(f"sm{major}{minor}"):  # sets it, emptying the caches vLLM filled for another arch
                pass
    saved_dcp, saved_dtype = parallel_state._DCP, torch.get_default_dtype()
    saved_tp = getattr(parallel_state, "_TP", None)
    saved_env = {name: os.environ.get(name) for name in NO_SYMMETRIC_MEMORY}
    if group is not None and group.device.type == "cpu":
        os.environ.update(NO_SYMMETRIC_MEMORY)
    _rank_dcp_group.bind(group)
    parallel_state._DCP = _rank_dcp_group if group is not None else None
    if saved_tp is None:  # a sparse impl's __init__ (SparseMLACommonImpl) asks the TP group its size: no TP group here
        parallel_state._TP = types.SimpleNamespace(world_size=config.parallel_config.tensor_parallel_size,
                                                   rank_in_group=0, device_group=None)
    torch.set_default_dtype(config.model_config.dtype)
    try:
        with on_arch, set_current_vllm_config(config), torch_collectives_in_process():
            yield
    finally:
        torch.set_default_dtype(saved_dtype)
        parallel_state._DCP = saved_dcp
        parallel_state._TP = saved_tp
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _rank_dcp_group.bind(None)


#: One ``platforms.on(arch)`` for all rank threads of a check (refcounted): a rank leaving must not put the
#: module flags back (ROCm's ``_GCN_ARCH``) under a rank still running.
_arch_holder = SharedScope("vllm checks")


def _platform_on(platforms: Any, arch: str) -> Any:
    return _arch_holder.enter(arch, lambda: platforms.on(arch))


def _attention_group(backend_cls: Any, spec: Any, config: Any, device: Any) -> Any:
    """vLLM's ``AttentionGroup`` of the layer with its metadata builder, as ``init_attn_backend`` makes it.

    The kernel block size is ``select_common_block_size`` of the cell's block
    size (what ``prepare_kernel_block_sizes`` picks for an unpacked cache);
    when it is smaller, the group maps the block table to kernel blocks
    (``AttentionGroup.build_metadata``) and the cache is viewed in kernel blocks.
    """
    from vllm.v1.worker.utils import AttentionGroup, select_common_block_size

    group = AttentionGroup(backend_cls, [LAYER_NAME], spec, 0)
    kernel_block_size = select_common_block_size(spec.block_size, [backend_cls], [spec])
    group.create_metadata_builders(config, device, kernel_block_size=kernel_block_size)
    return group, kernel_block_size


def run_mla(inputs: Any, ctx: Any, options: Mapping[str, Any]) -> Any:
    """One DCP rank of vLLM's MLA layer on the cell's backend (decode or chain verify); its heads after vLLM's merge.

    ``options["backend"]`` names the ``AttentionBackendEnum`` member,
    ``options["level"]`` the kernel source (``emulation``): ``backend``
    calls what vLLM binds, ``emulated`` replaces the compiled calls of the path
    vLLM's builder chose with float64 emulations and reports those that ran.
    """
    # The engine (its faked platform) first: vLLM's backend modules bind ``current_platform``
    # when imported, and a distributed rank process imports them here for the first time.
    engine = prepare_process()
    import torch
    from vllm.model_executor.layers.attention.mla_attention import QueryLenSupport
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends.utils import split_decodes_and_prefills

    from ...core.errors import AdapterError
    from ...core.records import GRAPH_PADDED
    from ...kernels.engine_runner import RankResult

    world, rank = ctx.world, ctx.rank
    device = inputs.q.device
    b, s_q, h, d_qk = inputs.q.shape
    backend = options.get("backend", "TRITON_MLA")
    level = options.get("level", "backend")
    if options["num_heads"] // options["tp"] * world != h:
        raise ValueError(f"vllm runner: {h} query heads in the DCP group, expected "
                         f"{options['num_heads']} // tp {options['tp']} * dcp {world}")
    config = mla_config(engine, options)
    config.model_config.dtype = inputs.q.dtype  # the check's dtype is the model's
    group = DcpGroup(ctx.collectives, device) if world > 1 else None
    path = options.get("path", "decode")
    names = emulation.calls_of(backend, path, options.get("platform"))
    # (the harness applies kernels.interpreter.interpreter_fixes around every interpreted engine check)
    with stand_in_guard(), vllm_context(engine, config, options.get("capability", DEFAULT_CAPABILITY), group,
                                        options.get("arch")), \
            rank_workspaces(device), \
            emulation.emulated_kernels(level, names) as log, emulation.host_buffers(device) as host:
        layer = build_mla_layer(options, inputs.softmax_scale, device)
        if getattr(layer, "is_amx_bmm_enabled", False):
            load_latent_kv_b_proj(layer, options, device)
        set_kv_scales(layer, inputs.kv_scale)
        spec = layer.get_kv_cache_spec(config)
        attn_group, kernel_block = _attention_group(layer.attn_backend, spec, config, device)
        builder = attn_group.get_metadata_builder()
        cache, table, local = rank_cache(inputs, config, rank, world, ctx.interleave, spec)
        seq_lens = inputs.cache_seqlens.to(device=device, dtype=torch.int32)

        def metadata_of(n: int, qsl: Any, seq_lens: Any, table: Any, local: Any) -> Any:
            """The runner's ``CommonAttentionMetadata`` for ``n`` requests (``b`` of them real)."""
            return CommonAttentionMetadata(
                query_start_loc=qsl.to(device), query_start_loc_cpu=qsl, seq_lens=seq_lens,
                seq_lens_cpu_upper_bound=seq_lens.cpu(), max_seq_len=int(seq_lens.max()), num_reqs=n,
                num_actual_tokens=n * s_q, max_query_len=s_q, block_table_tensor=table,
                slot_mapping=torch.full((n * s_q,), -1, dtype=torch.int64, device=device), causal=True,
                dcp_local_seq_lens=local,
                dcp_local_seq_lens_cpu_upper_bound=local.cpu() if local is not None else None,
                is_prefilling=torch.zeros(n, dtype=torch.bool, device=device))

        common = metadata_of(b, torch.arange(0, (b + 1) * s_q, s_q, dtype=torch.int32), seq_lens, table, local)
        # The builder's own decode/prefill split, as its build() makes it: rows past its
        # reorder threshold go to the MHA prefill path. A builder without a threshold
        # (XPUMLASparseMetadataBuilder) makes its own: every token a decode token.
        if builder.reorder_batch_threshold is None:
            built = attn_group.build_metadata(common)
            prefills = getattr(built, "num_prefills", 0)
        else:
            # split as the builder's own build() does: a sparse builder (SparseMLACommonMetadataBuilder)
            # asks its class's require_uniform_decodes, a dense one its query_len_support
            uniform = (builder.require_uniform_decodes if hasattr(builder, "require_uniform_decodes")
                       else builder.query_len_support != QueryLenSupport.VARLEN)
            decodes, prefills, _, _ = split_decodes_and_prefills(
                common, decode_threshold=builder.reorder_batch_threshold, require_uniform=uniform,
                treat_short_extends_as_decodes=not builder.use_pcp)
        taken = "prefill" if prefills else "decode"
        if taken != path:
            raise AdapterError("kernel check", f"vLLM's {type(builder).__name__} sends the {b} requests of {s_q} "
                                               f"query tokens to the {taken} path (reorder_batch_threshold "
                                               f"{builder.reorder_batch_threshold}); the check was declared for {path}")
        # A FULL CUDA graph's batch (the harness asks for it on one run of a check): the runner's dummy
        # requests after the real ones, their q rows finite (a padded token's hidden state), their output
        # rows discarded; block 0 is the null block they point at.
        padded = graph_padded_size(options, b, s_q, builder, config, spec) \
            if options.get("graph_padded") and not prefills else None
        rows = (padded or b) * s_q
        if padded:
            free_null_block(cache, table, [int(n) for n in inputs.cache_seqlens.tolist()],
                            config.cache_config.block_size, world)
            common = metadata_of(padded, *pad_for_graph(b, s_q, padded, seq_lens, table, local))
        cache = cache.view(-1, kernel_block, cache.shape[-1])  # kernel blocks: the same memory
        metadata = attn_group.build_metadata(common)
        per = h // world
        heads = (rank * per, (rank + 1) * per)
        q = inputs.q.reshape(b * s_q, h, d_qk)[:, heads[0]:heads[1]]
        if padded:
            dummy = torch.randn(rows - b * s_q, *q.shape[1:], generator=torch.Generator().manual_seed(
                int(ctx.case.seed) + 1), dtype=torch.float32).clamp(-1, 1).to(device=device, dtype=q.dtype)
            q = torch.cat([q, dummy])
        q = q.contiguous()
        rank_dim = options["kv_lora_rank"]
        if prefills:
            k_c, k_pe = new_tokens(inputs, s_q, inputs.kv_scale)
        else:  # read by prefill rows only
            k_c = torch.zeros(rows, rank_dim, dtype=q.dtype, device=device)
            k_pe = torch.zeros(rows, 1, d_qk - rank_dim, dtype=q.dtype, device=device)
        output = torch.full((rows, per * rank_dim), math.nan, dtype=q.dtype, device=device)
        if options.get("index_topk"):
            if inputs.topk_indices is None:
                raise AdapterError("kernel check", "a sparse model's check needs the harness's top-k selection")
            fill_topk(layer, inputs.topk_indices, b * s_q)
            if padded:  # the indexer selects nothing for a dummy token (no cached tokens)
                layer.impl.topk_indices_buffer[b * s_q:rows] = -1
        with recorded_splits(backends.backend(backend).schedule if not prefills else None) as splits:
            layer.forward_impl(q, k_c.to(device), k_pe.to(device), cache, metadata, output)
        output = output[: b * s_q]  # the real requests' rows: the dummies' are discarded, as the runner does
        functions = ["vllm.model_executor.layers.attention.mla_attention:MLAAttention.forward_impl"]
        if prefills:
            function = emulation.prefill_function(backend, options.get("platform"))
            functions.append(function)
            if function == emulation.PREFILL_FUNCTION and getattr(layer, "prefill_backend", None) is not None:
                functions.append(f"{type(layer.prefill_backend).__module__}:"
                                 f"{type(layer.prefill_backend).__qualname__}")
        else:
            record = backends.backend(backend)
            functions.append(record.function)
            functions.extend(record.decode_kernels(dcp=world > 1))
            if world > 1:
                functions.append(_combine_name(layer.dcp_manager.combine))
        emulated = tuple(log.called) if log is not None else ()
        notes = tuple(host) + platform_notes(options)
    out = output.view(b, s_q, per, rank_dim)
    schedule = {backends.backend(backend).schedule.argument: tuple(splits)} if splits else {}
    if padded:
        schedule[GRAPH_PADDED] = (padded,)
    return RankResult(out, None, heads if world > 1 else None, tuple(functions), notes=notes, emulated=emulated,
                      schedule=schedule)


def _combine_name(combine: Any) -> str:
    fn = getattr(combine, "func", combine)
    return f"{fn.__module__}:{fn.__qualname__}"


def run_attn(inputs: Any, ctx: Any, options: Mapping[str, Any]) -> Any:
    """vLLM's ``Attention`` layer for a GQA model on ``options["backend"]`` (TRITON_ATTN, FLASH_ATTN, CPU_ATTN).

    ``TritonAttentionImpl.forward`` runs ``unified_attention`` (Triton);
    ``FlashAttentionImpl.forward`` calls flash-attention's varlen kernel,
    emulated at level ``emulated`` (``emulation``); CPU_ATTN's cache is
    written by its own ``do_kv_cache_update`` (``Backend.cache_writers``), its
    builder schedules and ``CPUAttentionBackendImpl.forward`` attends, the
    three ``torch.ops._C`` ops emulated; ``RocmAttentionImpl.forward`` (ROCm's
    child) reads a split K/V cache (``Backend.split_kv_cache``) through
    ``chunked_prefill_paged_decode`` (``Backend.attn_kernels``).
    """
    engine = prepare_process()  # before vLLM's modules bind ``current_platform`` (see run_mla)
    import torch
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.v1.attention.backend import CommonAttentionMetadata

    from ...core.errors import AdapterError
    from ...kernels.engine_runner import RankResult

    backend = options.get("backend", "TRITON_ATTN")
    world, rank = ctx.world, ctx.rank
    device = inputs.q.device
    b, s_q, h_group, d = inputs.q.shape
    h = h_group // world  # this rank's query heads (the case holds the DCP group's)
    h_kv = inputs.kv_cache.shape[2]
    config = gqa_config(engine, options)
    config.model_config.dtype = inputs.q.dtype
    level = options.get("level", "backend")
    group = DcpGroup(ctx.collectives, device) if world > 1 else None
    with stand_in_guard(), vllm_context(engine, config, options.get("capability", DEFAULT_CAPABILITY), group,
                                        options.get("arch")), \
            rank_workspaces(device), \
            emulation.emulated_kernels(level, emulation.calls_of(backend, "decode")) as log, \
            emulation.host_buffers(device) as host:
        layer = Attention(num_heads=h, head_size=d, scale=inputs.softmax_scale, num_kv_heads=h_kv,
                          cache_config=config.cache_config, prefix=LAYER_NAME, attn_backend=backend_class(backend))
        set_kv_scales(layer, inputs.kv_scale)
        spec = layer.get_kv_cache_spec(config)
        attn_group, kernel_block = _attention_group(layer.attn_backend, spec, config, device)
        block = config.cache_config.block_size
        table, slots = rank_slots(inputs, block, rank, world, ctx.interleave)
        # TRITON_ATTN, FLASH_ATTN read [num_blocks, num_kv_heads, block_size, 2 * head_size] (K and V side by side).
        record = backends.backend(backend)
        split = record.split_kv_cache
        if split:
            if kernel_block != block:
                raise AdapterError("kernel check", f"vLLM's {backend} splits the cell's blocks of {block} into kernel "
                                                   f"blocks of {kernel_block}; its split K/V cache is not re-laid-out")
            cache = nan_cache((2, inputs.kv_cache.shape[0], block, h_kv * d), spec.dtype, device)
        else:
            cache = nan_cache((inputs.kv_cache.shape[0], h_kv, block, 2 * d), spec.dtype, device)
        if slots.numel():
            seqlens = [int(n) for n in inputs.cache_seqlens.tolist()]
            k = torch.cat([dense_rows(inputs.kv_cache, inputs.block_table, i, n) for i, n in enumerate(seqlens)])
            v = torch.cat([dense_rows(inputs.v_cache, inputs.block_table, i, n) for i, n in enumerate(seqlens)])
            if record.cache_writers:
                impl_writes_tokens(layer, cache, slots, k, v, inputs, kernel_block != block)
            elif split:
                write_split_tokens(cache, slots, k, v, block, inputs.kv_scale)
            else:
                write_tokens(cache, slots, torch.cat([k, v], dim=-1), block, inputs.kv_scale)
        if split:  # the impl's view: logical [num_blocks, 2, block_size, kv_heads * head_size] (rocm_attn.py)
            cache = cache.transpose(0, 1)
        elif kernel_block != block:  # kernel blocks: [blocks * r, heads, kernel_block, 2d] over the same tokens
            r = block // kernel_block
            cache = cache.view(-1, h_kv, r, kernel_block, 2 * d).transpose(1, 2).reshape(-1, h_kv, kernel_block, 2 * d)
        seq_lens = inputs.cache_seqlens.to(device=device, dtype=torch.int32)
        qsl = torch.arange(0, (b + 1) * s_q, s_q, dtype=torch.int32)
        local = None
        if world > 1:
            from vllm.v1.worker.gpu.cp_utils import prepare_dcp_local_seq_lens

            local = prepare_dcp_local_seq_lens(torch.zeros(b, dtype=torch.int32, device=device), seq_lens, b, world,
                                               rank, ctx.interleave, num_reqs_padded=b)
        common = CommonAttentionMetadata(
            query_start_loc=qsl.to(device), query_start_loc_cpu=qsl, seq_lens=seq_lens,
            seq_lens_cpu_upper_bound=seq_lens.cpu(), max_seq_len=int(seq_lens.max()), num_reqs=b,
            num_actual_tokens=b * s_q, max_query_len=s_q, block_table_tensor=table,
            slot_mapping=torch.full((b * s_q,), -1, dtype=torch.int64, device=device), causal=True,
            dcp_local_seq_lens=local, dcp_local_seq_lens_cpu_upper_bound=local.cpu() if local is not None else None)
        metadata = attn_group.build_metadata(common)
        heads = (rank * h, (rank + 1) * h)
        q = inputs.q.reshape(b * s_q, h_group, d)[:, heads[0]:heads[1]].contiguous()
        if world > 1 or split:  # the new tokens from the step's own K / V (DCP: the cache holds the context)
            seqlens = [int(n) for n in inputs.cache_seqlens.tolist()]
            k_new = torch.cat([dense_rows(inputs.kv_cache, inputs.block_table, i, n)[n - s_q:]
                               for i, n in enumerate(seqlens)])
            v_new = torch.cat([dense_rows(inputs.v_cache, inputs.block_table, i, n)[n - s_q:]
                               for i, n in enumerate(seqlens)])
            scale = inputs.kv_scale if inputs.kv_scale is not None else 1.0
            key = (k_new.to(torch.float64) * scale).to(q.dtype)
            value = (v_new.to(torch.float64) * scale).to(q.dtype)
        else:  # the new tokens are cached already
            key = value = torch.zeros(b * s_q, h_kv, d, dtype=q.dtype, device=device)
        # Attention.forward hands the impl its output as [tokens, heads, head_size], in the model's dtype.
        output = torch.full((b * s_q, h, d), math.nan, dtype=q.dtype, device=device)
        # Attention.forward's first step (model_executor/layers/attention/attention.py, 0.34.0:537-552):
        # an FP8 cache's query is quantised by the layer when the impl takes quantised queries (not where
        # the check cannot run that: ``Backend.unquantised_query``).
        if not record.unquantised_query and layer.query_quant is not None and layer.impl.supports_quant_query_input \
                and q.dtype != current_platform_fp8():
            q, _ = layer.query_quant(q, layer._q_scale)
        with platform_ops_missing(options):
            layer.impl.forward(layer, q, key, value, cache, metadata, output)
        emulated = tuple(log.called) if log is not None else ()
        notes = tuple(host) + platform_notes(options)
    functions = (record.function,) + record.attn_kernels(s_q) + record.cache_writers
    if world > 1:
        functions += ("vllm.v1.attention.backends.flash_attn:FlashAttentionImpl._forward_with_dcp",)
    return RankResult(output.view(b, s_q, h, d), None, heads if world > 1 else None, functions, notes=notes,
                      emulated=emulated)

