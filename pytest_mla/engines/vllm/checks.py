"""vLLM's own attention backends, run per DCP rank on this host (engine checks, issues 11 and 21).

``run_mla`` is an engine runner (``kernels/engine_check.py``): for one DCP
rank it builds, with vLLM's own classes and the cell's configuration,

* the attention layer: a real ``MLAAttention`` on the backend vLLM selected
  (TRITON_MLA, FLASHMLA, FLASH_ATTN_MLA, FLASHINFER_MLA, CUTLASS_MLA: its
  impl, its ``MLADCPManager`` choosing the DCP merge, its MLA prefill
  backend, its KV-cache scales); the model's absorption weights are the
  identity (``W_UK_T``, ``W_UV``, ``kv_b_proj``), so the layer's own query
  preparation, output projection and MHA up-projection pass the harness's
  latent query and the latent output through unchanged;
* the rank's shard of the KV cache: slots computed by the V2 model runner's
  ``_compute_slot_mappings_kernel`` (block table shared by the ranks, token
  ``p`` on rank ``(p // I) % N``), its ``prepare_dcp_local_seq_lens`` for
  the local lengths;
* the attention metadata: vLLM's ``AttentionGroup`` (kernel block size,
  block table in kernel blocks) and the backend's builder on a
  ``CommonAttentionMetadata`` as ``build_attn_metadata`` fills it;

then calls ``MLAAttention.forward_impl``: the decode path (``_prepare_mqa_query``
with the DCP all-gather of the query heads, the impl's ``forward_mqa``, the
DCP combine the manager selected, ``_v_up_proj``) or, for the verify rows the
builder classes as prefills, ``forward_mha`` (vLLM's MLA prefill: new-token
and context attention, the DCP context gather, the state merge). The rank
returns its heads. ``run_attn`` does the same for GQA models with vLLM's
``Attention`` layer (TRITON_ATTN, FLASH_ATTN). Which compiled calls are real
and which are float64 emulations is ``kernel_source``'s business.

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
import types
from typing import Any, Iterator, Mapping

from ..common.shared_scope import SharedScope

PACKAGE = "vllm"
RUNNER = "pytest_mla.engines.vllm.startup:run_mla"  # the adapter module: it makes the process's engine first
#: The function that computes the attention (the kernel record names it).
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
_STAND_IN = re.compile(r"'(\w+View|SimpleNamespace|_StandInConfig|_Group|_InProcessGroup|_ThreadGroup|_NoCollectives)' object has no "
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
        group = collectives.process_group
        self.device_group = group if group is not None or collectives.world == 1 else _InProcessGroup(collectives)
        self.cpu_group = self.device_group
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


class _InProcessGroup:
    """The ``device_group`` of in-process ranks: what ``torch.distributed`` calls name as ``group=``.

    vLLM's MLA prefill gathers the DCP ranks' context with
    ``torch.distributed.all_gather_into_tensor(out, local, group=dcp.device_group)``
    (``MLADCPManager.init_kv_gather``); ``torch_collectives_in_process`` routes
    such a call to the harness's collectives, as NCCL would route it to the ranks.
    """

    def __init__(self, collectives: Any) -> None:
        self.collectives = collectives


_torch_patch = {"count": 0, "original": None}


@contextlib.contextmanager
def torch_collectives_in_process() -> Iterator[None]:
    """``torch.distributed.all_gather_into_tensor`` on an ``_InProcessGroup`` runs on its collectives (refcounted)."""
    import torch
    import torch.distributed as dist

    def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, group: Any = None, async_op: bool = False) -> Any:
        if not isinstance(group, _InProcessGroup):
            return _torch_patch["original"](output_tensor, input_tensor, group=group, async_op=async_op)
        output_tensor.copy_(torch.cat(group.collectives.all_gather(input_tensor.contiguous()), dim=0))
        return None

    with _lock:
        if _torch_patch["count"] == 0:
            _torch_patch["original"] = dist.all_gather_into_tensor
            dist.all_gather_into_tensor = all_gather_into_tensor
        _torch_patch["count"] += 1
    try:
        yield
    finally:
        with _lock:
            _torch_patch["count"] -= 1
            if _torch_patch["count"] == 0:
                dist.all_gather_into_tensor = _torch_patch["original"]


class _ThreadWorkspaces:
    """``vllm.v1.worker.workspace._manager`` while checks run: one ``WorkspaceManager`` per rank thread.

    vLLM makes one per worker process (``init_workspace_manager``, called by
    the GPU worker); in-process ranks taking turns would otherwise share its
    scratch buffers across a collective (FLASH_ATTN's DCP context output).
    """

    def __init__(self, device: Any) -> None:
        self._device = device
        self._local = threading.local()

    def __getattr__(self, name: str) -> Any:
        manager = getattr(self._local, "manager", None)
        if manager is None:
            from vllm.v1.worker.workspace import WorkspaceManager

            manager = self._local.manager = WorkspaceManager(self._device)
        return getattr(manager, name)


_workspaces = {"count": 0, "saved": None}


@contextlib.contextmanager
def rank_workspaces(device: Any) -> Iterator[None]:
    """Each rank thread has its own vLLM ``WorkspaceManager`` on ``device`` (refcounted over the ranks)."""
    import vllm.v1.worker.workspace as workspace

    with _lock:
        if _workspaces["count"] == 0:
            _workspaces["saved"] = workspace._manager
            workspace._manager = _ThreadWorkspaces(device)
        _workspaces["count"] += 1
    try:
        yield
    finally:
        with _lock:
            _workspaces["count"] -= 1
            if _workspaces["count"] == 0:
                workspace._manager = _workspaces["saved"]


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
    compilation = _compilation_config(options)
    speculative = None
    if options["num_speculative_tokens"]:
        speculative = _view_of(SpeculativeConfig)()
        speculative.method = options["spec_method"]
        speculative.num_speculative_tokens = options["num_speculative_tokens"]
    attention = AttentionConfig()
    # the stand-in config skips VllmConfig.__post_init__, which fills this default from the max model length
    if attention.sparse_mla_prefill_workspace_factor is None:
        attention.sparse_mla_prefill_workspace_factor = 5 if MAX_MODEL_LEN <= 256 * 1024 else 2
    return _view_of(VllmConfig, _StandInConfig)(
        model_config=model_config, parallel_config=parallel, cache_config=cache, scheduler_config=scheduler,
        compilation_config=compilation, attention_config=attention, kernel_config=KernelConfig(),
        speculative_config=speculative)


def _compilation_config(options: Mapping[str, Any]) -> Any:
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


def _startup_compilation(options: dict[str, Any], startup: Any) -> None:
    """The start-up's resolved CUDA-graph settings into the check's options (see ``_compilation_config``)."""
    if startup is not None:
        compilation = startup.vllm_config.compilation_config
        options["cudagraph_mode"] = compilation.cudagraph_mode.name
        options["max_cudagraph_capture_size"] = compilation.max_cudagraph_capture_size


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
def _vllm_context(engine: Any, config: Any, capability: str, group: _Group | None,
                  arch: str | None = None) -> Iterator[None]:
    """vLLM's process-wide state for one rank: arch, DCP group, current config, model dtype.

    ``arch`` (a cell of another platform, in its child process): the platform
    answers for it for the duration; else the faked CUDA GPU answers ``capability``.
    """
    import torch
    import vllm.distributed.parallel_state as parallel_state
    from vllm.config import set_current_vllm_config

    with _lock:
        holder = _state.get("dcp")
        if holder is None:
            holder = _state["dcp"] = _ThreadGroup()
    platforms = engine._platforms
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
    holder.bind(group)
    parallel_state._DCP = holder if group is not None else None
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
        holder.bind(None)


#: One ``platforms.on(arch)`` for all rank threads of a check (refcounted): a rank leaving must not put the
#: module flags back (ROCm's ``_GCN_ARCH``) under a rank still running.
_arch_holder = SharedScope("vllm checks")


def _platform_on(platforms: Any, arch: str) -> Any:
    return _arch_holder.enter(arch, lambda: platforms.on(arch))


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


def _build_layer(options: Mapping[str, Any], scale: float, device: Any) -> Any:
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


def _fill_topk(layer: Any, topk_indices: Any, num_tokens: int) -> Any:
    """The harness's selection into the layer's top-k buffer, as the indexer leaves it for a decode batch.

    ``SparseAttnIndexer`` sets the batch's rows to -1 (``topk_indices_buffer[:num_tokens] = -1``,
    sparse_attn_indexer.py) and writes each token's top-k, request-relative positions, into the
    first ``index_topk`` columns; a token with fewer candidates keeps -1 after them. The selection is
    ``[b, s_q, K]`` with ``K`` at most the buffer's width; the rest of each row stays -1.
    """
    from ...core.errors import AdapterError

    buffer = layer.impl.topk_indices_buffer
    if buffer is None:
        raise AdapterError("kernel check", f"vLLM's {type(layer.impl).__name__} has no top-k buffer")
    selection = topk_indices.reshape(num_tokens, -1).to(device=buffer.device, dtype=buffer.dtype)
    if selection.shape[1] > buffer.shape[1]:
        raise AdapterError("kernel check", f"a selection of {selection.shape[1]} tokens does not fit vLLM's top-k "
                                           f"buffer of width {buffer.shape[1]}")
    buffer[:num_tokens] = -1
    buffer[:num_tokens, : selection.shape[1]] = selection
    return buffer


def _loaded_kv_scale(kv_scale: float | None) -> float | None:
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


def _load_latent_kv_b_proj(layer: Any, options: Mapping[str, Any], device: Any) -> None:
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


def _set_kv_scales(layer: Any, kv_scale: float | None) -> None:
    """The layer's KV-cache scales as a checkpoint that stores them sets them (``BaseKVCacheMethod``).

    ``process_weights_after_loading`` copies the checkpoint's ``k_scale`` /
    ``v_scale`` into ``_k_scale`` / ``_v_scale`` and their floats (doubled on
    an e4m3fnuz platform: ``_loaded_kv_scale``); a checkpoint without them
    leaves 1.0. The query scale stays 1.0, as vLLM leaves it for a checkpoint
    without ``q_scale``: ``process_weights_after_loading`` first copies
    ``k_scale`` into ``_q_scale`` (kv_cache.py 0.34.0:140-147), then sets it
    from ``q_scale``, 1.0 when the checkpoint has none (:183-190).
    """
    kv_scale = _loaded_kv_scale(kv_scale)
    if kv_scale is None:
        return
    for name in ("_k_scale", "_v_scale"):
        getattr(layer, name).fill_(float(kv_scale))
    layer._k_scale_float = float(kv_scale)
    layer._v_scale_float = float(kv_scale)
    for name in ("_k_scale_cpu", "_v_scale_cpu"):
        if hasattr(layer, name):
            setattr(layer, name, getattr(layer, name[:-4]).detach().to("cpu"))


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


def _nan_cache(shape: tuple[int, ...], spec_dtype: Any, device: Any) -> Any:
    """A cache of vLLM's storage dtype (bytes of the platform's fp8 format for fp8), every value NaN."""
    import torch

    cache = torch.empty(shape, dtype=spec_dtype, device=device)
    (cache.view(current_platform_fp8()) if spec_dtype == torch.uint8 else cache).fill_(math.nan)
    return cache


def _stored(rows: Any, cache_dtype: Any, kv_scale: float | None = None) -> Any:
    """``rows`` as the cache holds them: fp8 values as the bytes of the platform's own fp8 format.

    The check's fp8 values are e4m3fn of ``x / kv_scale``; ROCm on gfx942
    stores and reads e4m3fnuz (``current_platform.fp8_dtype()``) of ``x /``
    the loaded scale (doubled there: ``_loaded_kv_scale``), as its cache-write
    op would have written them. Every value must convert exactly (else the
    adapter's error: the check would compare other numbers than it wrote).
    """
    import torch

    from ...core.errors import AdapterError

    if cache_dtype != torch.uint8:
        return rows.to(cache_dtype)
    fp8 = current_platform_fp8()
    if rows.dtype != fp8:
        ratio = 1.0 if kv_scale is None else float(kv_scale) / float(_loaded_kv_scale(kv_scale))
        converted = (rows.to(torch.float32) * ratio).to(fp8)
        if not torch.equal(converted.to(torch.float32), rows.to(torch.float32) * ratio):
            raise AdapterError("kernel check", f"the check's {rows.dtype} cache values do not convert exactly to "
                                               f"the platform's {fp8}")
        rows = converted
    return rows.view(torch.uint8)


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
    ds_mla = getattr(spec, "cache_dtype_str", None) == "fp8_ds_mla"
    width = DS_MLA_BYTES if ds_mla else inputs.kv_cache.shape[-1]
    cache = _nan_cache((inputs.kv_cache.shape[0], block, width), spec.dtype, device)
    if slots.numel():
        rows = torch.cat([_dense_rows(inputs.kv_cache, inputs.block_table, i, n) for i, n in enumerate(seqlens)])
        rows = rows.reshape(slots.numel(), -1)
        if ds_mla:
            from vllm.v1.attention.backends.utils import PAD_SLOT_ID

            mine = slots != PAD_SLOT_ID
            cache.view(-1, width)[slots[mine]] = _ds_mla_rows(rows[mine], inputs.kv_scale)
        else:
            _write(cache.view(-1, cache.shape[-1]), slots, rows, inputs.kv_scale)
    local = None
    if world > 1:
        from vllm.v1.worker.gpu.cp_utils import prepare_dcp_local_seq_lens

        b = len(seqlens)
        buffer = torch.zeros(b, dtype=torch.int32, device=device)
        local = prepare_dcp_local_seq_lens(buffer, inputs.cache_seqlens.to(device), b, world, rank, interleave,
                                           num_reqs_padded=b)
    return cache, table, local


#: Bytes per token of vLLM's ``fp8_ds_mla`` cache (DeepSeek-V3.2 on FLASHMLA_SPARSE, flashmla_sparse.py's
#: layout note): 512 e4m3 NoPE values, 4 float32 scales (one per 128 of them), 64 bf16 RoPE values.
DS_MLA_BYTES = 656


def _ds_mla_rows(rows: Any, kv_scale: float | None) -> Any:
    """The check's e4m3 rows (value ``raw · kv_scale``) as ``fp8_ds_mla`` records ``[n, 656]`` uint8, exactly.

    The NoPE bytes are the check's own e4m3 bytes with ``kv_scale`` as each tile's
    scale; the RoPE tail is ``raw · kv_scale`` in bf16 (exact: a power-of-two scale
    of an e4m3 value). vLLM's own writer of this format (``concat_and_cache_mla``
    with ``fp8_ds_mla``, per-tile amax scales) is the model runner's step, not run here.
    """
    import torch

    from ...core.errors import AdapterError

    scale = 1.0 if kv_scale is None else float(kv_scale)
    if rows.dtype != torch.float8_e4m3fn or rows.shape[-1] != 576:
        raise AdapterError("kernel check", f"fp8_ds_mla records need e4m3fn rows of 576, got {rows.dtype} "
                                           f"{tuple(rows.shape)}")
    out = torch.empty(rows.shape[0], DS_MLA_BYTES, dtype=torch.uint8, device=rows.device)
    out[:, :512] = rows[:, :512].contiguous().view(torch.uint8)
    out[:, 512:528] = torch.full((rows.shape[0], 4), scale, dtype=torch.float32, device=rows.device).view(torch.uint8)
    rope = rows[:, 512:].to(torch.float64) * scale
    if not torch.equal(rope.to(torch.bfloat16).to(torch.float64), rope):
        raise AdapterError("kernel check", "the check's RoPE values do not convert exactly to bf16")
    out[:, 528:] = rope.to(torch.bfloat16).contiguous().view(torch.uint8)
    return out


def _write(flat: Any, slots: Any, rows: Any, kv_scale: float | None = None) -> None:
    """``flat[slot] = row`` for this rank's tokens (``PAD_SLOT_ID`` marks the others'); fp8 rows as bytes."""
    import torch
    from vllm.v1.attention.backends.utils import PAD_SLOT_ID

    mine = slots != PAD_SLOT_ID
    flat[slots[mine]] = _stored(rows[mine], flat.dtype, kv_scale)


def _dense_rows(cache: Any, block_table: Any, i: int, n: int) -> Any:
    """Request ``i``'s ``n`` cached rows in position order ``[n, ...]`` (the harness's paged cache)."""
    page = cache.shape[1]
    pages = block_table[i, : -(-n // page)].long()
    return cache[pages].reshape(-1, *cache.shape[2:])[:n]


# ---- the runner ---------------------------------------------------------------------------------


def _new_tokens(inputs: Any, s_q: int, kv_scale: float | None) -> tuple[Any, Any]:
    """``(k_c_normed [b*s_q, kv_lora_rank], k_pe [b*s_q, 1, rope])``: each request's last ``s_q`` cached rows.

    What the model computed for the tokens being verified (the cache holds them
    too, written before attention runs); an fp8 cache's rows dequantised, the
    values the model had before the write quantised them.
    """
    import torch

    d_v = inputs.head_dim_v
    rows = []
    for i, n in enumerate(int(x) for x in inputs.cache_seqlens.tolist()):
        dense = _dense_rows(inputs.kv_cache, inputs.block_table, i, n)[n - s_q:, 0]  # [s_q, d_qk]
        value = dense.to(torch.float64) * (kv_scale if kv_scale is not None else 1.0)
        rows.append(value.to(inputs.q.dtype))
    latent = torch.cat(rows)
    return latent[:, :d_v].contiguous(), latent[:, None, d_v:].contiguous()


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
    ``options["level"]`` the kernel source (``kernel_source``): ``backend``
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
    from ...kernels.engine_runner import RankResult
    from . import kernel_source

    world, rank = ctx.world, ctx.rank
    device = inputs.q.device
    b, s_q, h, d_qk = inputs.q.shape
    backend = options.get("backend", "TRITON_MLA")
    level = options.get("level", "backend")
    if options["num_heads"] // options["tp"] * world != h:
        raise ValueError(f"vllm runner: {h} query heads in the DCP group, expected "
                         f"{options['num_heads']} // tp {options['tp']} * dcp {world}")
    config = _vllm_config(engine, options)
    config.model_config.dtype = inputs.q.dtype  # the check's dtype is the model's
    group = _Group(ctx.collectives, device) if world > 1 else None
    path = options.get("path", "decode")
    names = kernel_source.calls_of(backend, path, options.get("platform"))
    # (the harness applies kernels.interpreter.interpreter_fixes around every interpreted engine check)
    with stand_in_guard(), _vllm_context(engine, config, options.get("capability", DEFAULT_CAPABILITY), group,
                                        options.get("arch")), \
            rank_workspaces(device), \
            kernel_source.kernel_source(level, names) as log, kernel_source.host_buffers(device) as host:
        layer = _build_layer(options, inputs.softmax_scale, device)
        if getattr(layer, "is_amx_bmm_enabled", False):
            _load_latent_kv_b_proj(layer, options, device)
        _set_kv_scales(layer, inputs.kv_scale)
        spec = layer.get_kv_cache_spec(config)
        attn_group, kernel_block = _attention_group(layer.attn_backend, spec, config, device)
        builder = attn_group.get_metadata_builder()
        cache, table, local = _rank_cache(inputs, config, rank, world, ctx.interleave, spec)
        cache = cache.view(-1, kernel_block, cache.shape[-1])  # kernel blocks: the same memory
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
        metadata = attn_group.build_metadata(common)
        per = h // world
        heads = (rank * per, (rank + 1) * per)
        q = inputs.q.reshape(b * s_q, h, d_qk)[:, heads[0]:heads[1]].contiguous()
        rank_dim = options["kv_lora_rank"]
        if prefills:
            k_c, k_pe = _new_tokens(inputs, s_q, inputs.kv_scale)
        else:  # read by prefill rows only
            k_c = torch.zeros(b * s_q, rank_dim, dtype=q.dtype, device=device)
            k_pe = torch.zeros(b * s_q, 1, d_qk - rank_dim, dtype=q.dtype, device=device)
        output = torch.full((b * s_q, per * rank_dim), math.nan, dtype=q.dtype, device=device)
        if options.get("index_topk"):
            if inputs.topk_indices is None:
                raise AdapterError("kernel check", "a sparse model's check needs the harness's top-k selection")
            _fill_topk(layer, inputs.topk_indices, b * s_q)
        layer.forward_impl(q, k_c.to(device), k_pe.to(device), cache, metadata, output)
        functions = ["vllm.model_executor.layers.attention.mla_attention:MLAAttention.forward_impl"]
        if prefills:
            function = kernel_source.prefill_function(backend, options.get("platform"))
            functions.append(function)
            if function == kernel_source.PREFILL_FUNCTION and getattr(layer, "prefill_backend", None) is not None:
                functions.append(f"{type(layer.prefill_backend).__module__}:"
                                 f"{type(layer.prefill_backend).__qualname__}")
        else:
            functions.append(kernel_source.DECODE_FUNCTIONS[backend])
            if backend == "TRITON_MLA":
                functions.append("vllm.v1.attention.ops.triton_decode_attention:decode_attention_fwd")
            functions.extend(SPARSE_DCP_DECODE_KERNELS.get(backend, ()) if world > 1
                             else SPARSE_DECODE_KERNELS.get(backend, ()))
            if world > 1:
                functions.append(_combine_name(layer.dcp_manager.combine))
        emulated = tuple(log.called) if log is not None else ()
        notes = tuple(host) + _platform_notes(options)
    out = output.view(b, s_q, per, rank_dim)
    return RankResult(out, None, heads if world > 1 else None, tuple(functions), notes=notes, emulated=emulated)


def _combine_name(combine: Any) -> str:
    fn = getattr(combine, "func", combine)
    return f"{fn.__module__}:{fn.__qualname__}"


# ---- what configure() declares --------------------------------------------------------------------

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
#: What a sparse backend's ``forward_mqa`` runs over the indexer's top-k (Triton: interpreted here), for the
#: record: the conversion of request-relative positions to cache rows, the sparse decode.
SPARSE_DECODE_KERNELS = {
    "XPU_MLA_SPARSE": ("vllm.v1.attention.backends.mla.sparse_utils:triton_convert_req_index_to_global_index",
                       "vllm.v1.attention.ops.xpu_mla_sparse:triton_bf16_mla_sparse_interface"),
    # the conversion (the index group's, index_group.py, or forward_mqa's own); the attention is FlashMLA's
    # (emulated: the record's ``emulated`` names which of its ops ran)
    "FLASHMLA_SPARSE": ("vllm.v1.attention.backends.mla.sparse_utils:triton_convert_req_index_to_global_index",),
}
#: The same under DCP: the global positions filtered to this rank's and converted (flashmla_sparse.py
#: ``_forward_bf16_kv``, ``_forward_fp8_kv_mixed_batch``).
SPARSE_DCP_DECODE_KERNELS = {
    "FLASHMLA_SPARSE": ("vllm.v1.attention.backends.mla.sparse_utils:triton_filter_and_convert_dcp_index",),
}


def kernel_for(engine: Any, cell: Any, model: Any, path: str, tp: int,
               startup: Any = None) -> tuple[Any, str | None]:
    """``(KernelSpec, None)`` when vLLM's own backend for this cell can run here, else ``(None, why)``.

    ``startup`` (the adapter's ``Startup``) holds the metadata builder vLLM
    constructed for the cell: its reorder threshold decides whether the
    cell's query rows take the decode path or the MLA prefill path.
    """
    from ...core.cells import platform_of
    from ...kernels._mode import ensure_triton_mode
    from .kernel_source import DECODE_FUNCTIONS

    name = backend_name(path)
    platform = platform_of(cell.arch)
    if platform != "cuda":
        if platform != getattr(engine, "platform", "cuda") or name not in PLATFORM_CHECKS.get(platform, ()):
            return None, other_platform_reason(name, cell.arch, platform)
        return _platform_spec(engine, cell, model, tp, name, platform, startup)
    if name in CPU_OPS:  # a CPU backend forced on a CUDA arch: its ops exist in a CPU build of vllm._C only
        return None, (f"vLLM's {name} on a CUDA arch ({cell.arch}) calls torch.ops._C.{CPU_OPS[name]} (and, for "
                      "AMX_MLA, convert_weight_packed when its weights load), which only a CPU build of vllm._C "
                      "registers: not checked here (a CUDA build would raise AttributeError; a candidate finding)")
    where = ensure_triton_mode()
    if name in ATTN_FUNCTIONS and not model.mla:
        return _attn_spec(engine, cell, model, tp, where, name, startup), None
    if name in DECODE_FUNCTIONS and model.mla:
        return _mla_spec(engine, cell, model, tp, where, name, startup), None
    return None, f"no engine check for vLLM's {name} backend on this host"


def _path_of(cell: Any, startup: Any) -> str:
    """"prefill" when vLLM's builder classes the cell's query rows as prefills, else "decode".

    vLLM's ``split_decodes_and_prefills`` sends rows longer than the builder's
    ``reorder_batch_threshold`` to ``forward_mha``: speculative verify on a
    backend whose decode takes one token (CUTLASS_MLA) or, under DCP, on one
    without DCP support for multi-token decode (TRITON_MLA, FLASHMLA).
    """
    from ...core.spec import parse_spec

    s_q = parse_spec(str(cell.spec)).s_q
    if startup is None or s_q == 1 or startup.builder.reorder_batch_threshold is None:
        # no threshold: the builder splits nothing (XPUMLASparseMetadataBuilder decodes every token)
        return "decode"
    return "prefill" if s_q > startup.builder.reorder_batch_threshold else "decode"
#: Backends of another platform whose check runs in that platform's child process (the
#: child imported vLLM on it: ``engines/common/platform_process.py``), on the cell's arch.
#: XPU's TRITON_ATTN loads its KV tiles through Triton tensor descriptors (``use_td``, on by default
#: there), which the interpreter runs as masked loads (``interpreter.int1_mask_fix`` passes them through).
PLATFORM_CHECKS = {"rocm": ("TRITON_MLA", "TRITON_ATTN", "ROCM_ATTN", "XPU_MLA_SPARSE", "FLASHMLA_SPARSE"),
                   "xpu": ("TRITON_MLA", "TRITON_ATTN", "XPU_MLA_SPARSE"),
                   "cpu": ("CPU_MLA", "AMX_MLA", "CPU_ATTN")}


def _platform_spec(engine: Any, cell: Any, model: Any, tp: int, name: str, platform: str,
                   startup: Any) -> tuple[Any, str | None]:
    """The check of a ROCm / XPU cell on a Triton backend: vLLM's layer on the child's platform, the cell's arch.

    The same runners as the CUDA cells (``run_mla``, ``run_attn``); the spec
    names the platform (the parent sends the check to that child) and the arch
    (the platform answers for it while the check runs: ROCm's ``_GCN_ARCH``,
    its fp8 format). Only paths whose compiled calls are all Triton run here.
    """
    from ...kernels._mode import ensure_triton_mode
    from . import kernel_source

    where = ensure_triton_mode()
    extra = {"platform": platform, "arch": str(cell.arch)}
    if name in ATTN_FUNCTIONS and not model.mla:
        return _attn_spec(engine, cell, model, tp, where, name, startup, extra=extra), None
    path = _path_of(cell, startup)
    if kernel_source.calls_of(name, path, platform) and path != "decode" \
            and (platform, name) not in kernel_source.PLATFORM_PREFILL:
        return None, (f"vLLM's {name} on the {platform} platform ({cell.arch}) sends these rows to its MLA "
                      f"{path} path ({kernel_source.PREFILL_FUNCTION if path == 'prefill' else path}), "
                      + kernel_source.platform_prefill_reason(platform))
    return _mla_spec(engine, cell, model, tp, where, name, startup, extra=extra), None


def _platform_notes(options: Mapping[str, Any]) -> tuple[str, ...]:
    """Where a check of another platform's cell ran (``_platform_spec``)."""
    from .platforms import PLATFORM_LABELS

    platform = options.get("platform")
    if platform is None:
        return ()
    return (f"ran in a process that imported vLLM on its {PLATFORM_LABELS.get(platform, platform)} platform, "
            f"answering for {options['arch']}",)


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
    return f"vLLM's {name} on the {platform} platform ({arch}): no engine check drives this backend yet"


def _spec_tokens(cell: Any) -> tuple[int, str | None]:
    from ...core.spec import parse_spec

    spec = parse_spec(str(cell.spec))
    return (spec.s_q - 1, spec.algorithm) if spec.enabled else (0, None)


#: MLA backends whose builder reads nothing of the compilation config (CUDA-graph mode, capture size):
#: TRITON_MLA's; XPUMLASparseMetadataBuilder (CUDA graphs NEVER; its ``__init__`` reads the scheduler's
#: and model's config only). Their checks are one numeric case for every arch whose start-up resolved
#: other CUDA-graph settings (SM100's larger capture size).
COMPILATION_BLIND = ("TRITON_MLA", "XPU_MLA_SPARSE")


def _mla_options(cell: Any, model: Any, tp: int) -> dict[str, Any]:
    tokens, method = _spec_tokens(cell)
    options = {"model": model.name, "num_heads": model.num_heads, "kv_lora_rank": model.kv_lora_rank,
               "qk_rope_head_dim": model.qk_rope_head_dim, "qk_nope_head_dim": model.qk_nope_head_dim,
               "v_head_dim": model.v_head_dim, "tp": tp, "dcp": max(cell.dcp, 1), "block_size": int(cell.page_size),
               "cache_dtype": str(cell.kv_dtype or "auto"), "num_speculative_tokens": tokens,
               "spec_method": method}
    if getattr(model, "index_topk", 0):  # a sparse model: the layer gets the indexer's top-k buffer
        options["index_topk"] = model.index_topk
    return options


def _mla_spec(engine: Any, cell: Any, model: Any, tp: int, where: str, name: str, startup: Any,
              extra: Mapping[str, Any] | None = None) -> Any:
    """The engine check of an MLA cell on ``name`` (``run_mla``), at the level this host allows.

    The kernel source: the real kernels where ``kernel_source.real_kernels_missing``
    finds them (level ``backend``), else the emulations of the path's compiled
    calls (level ``emulated``); TRITON_MLA's decode needs none (Triton runs
    here). TRITON_MLA's decode layer is first built (no kernel runs) under the
    cell's arch: if vLLM's construction raises there (``TritonMLAImpl.__init__``
    refuses FP8 KV below SM89, say), the spec carries the arch so that the
    check raises the same and records it; otherwise that check is the same
    numeric case for every arch and is shared. Every other check runs under
    the cell's arch (the MLA prefill backend and the flash-attention version
    follow it).
    """
    from ...core.kernelspec import KernelSpec
    from ...kernels.harness import _KV_DTYPES
    from . import kernel_source

    options = _mla_options(cell, model, tp)
    path = _path_of(cell, startup)
    options["backend"] = name
    options["path"] = path
    if name not in COMPILATION_BLIND:
        _startup_compilation(options, startup)
    calls = kernel_source.calls_of(name, path, (extra or {}).get("platform"))
    if extra:  # another platform's cell: it runs under its own arch (``_platform_spec``)
        options.update(extra)
        level = "emulated" if calls else "backend"  # a CPU build's ops are not in the installed vllm._C
    elif not calls:
        capability = _capability_of(cell.arch)
        level = "backend"
        if _construction_raises(engine, options, capability):
            options["capability"] = capability
    else:
        capability = _capability_of(cell.arch)
        level = "backend" if kernel_source.real_kernels_missing(name, path, where, capability) is None else "emulated"
        if path == "prefill":  # see kernel_source.PREFILL_CALLS: no real kernel takes the check's 576-wide heads
            level = "emulated"
        options["capability"] = capability
    options["level"] = level
    function = kernel_source.prefill_function(name, options.get("platform")) if path == "prefill" \
        else kernel_source.DECODE_FUNCTIONS[name]
    dcp = options["dcp"]
    case = (("h_q", model.num_heads // tp * dcp), ("page_size", options["block_size"]),
            ("kv_dtype", _KV_DTYPES.get(options["cache_dtype"], options["cache_dtype"])), ("min_seqlen", 1))
    if options.get("index_topk"):  # the selection the stand-in indexer hands the layer (harness.SPARSE_CHECK_TOPK)
        from ...kernels.harness import SPARSE_CHECK_TOPK

        case += (("sparse_topk", min(SPARSE_CHECK_TOPK, options["index_topk"])),)
    return KernelSpec(name=name, target=RUNNER, protocol="engine", level=level, function=function,
                      package=PACKAGE, returns_lse=False, tree_mask=False,
                      options=tuple(sorted(options.items())), case=case)


def _attn_spec(engine: Any, cell: Any, model: Any, tp: int, where: str, name: str, startup: Any,
               extra: Mapping[str, Any] | None = None) -> Any:
    """The engine check of a GQA cell on TRITON_ATTN, FLASH_ATTN, CPU_ATTN or ROCM_ATTN (``run_attn``).

    TRITON_ATTN runs its Triton kernel here (level ``backend``, shared over
    archs unless the construction raises under the cell's); FLASH_ATTN runs
    under the cell's arch (FA2 on SM80, FA3 on SM90) with flash-attention's
    varlen kernel real on a GPU with it, else emulated. CPU_ATTN (the CPU
    platform's child, ``_platform_spec``) runs with its ``torch.ops._C`` ops
    emulated (a CUDA build of ``vllm._C`` has none of them); ROCM_ATTN (the
    ROCm child) runs its Triton kernels at level ``backend``.
    """
    from ...core.kernelspec import KernelSpec
    from ...kernels.harness import _KV_DTYPES
    from . import kernel_source

    tokens, method = _spec_tokens(cell)
    options = {"model": model.name, "num_heads": model.num_heads, "num_kv_heads": model.num_kv_heads,
               "head_dim": model.head_dim, "tp": tp, "block_size": int(cell.page_size),
               "cache_dtype": str(cell.kv_dtype or "auto"), "num_speculative_tokens": tokens, "spec_method": method,
               "backend": name, "dcp": max(cell.dcp, 1)}
    level = "backend"
    if extra:  # another platform's cell: it runs under its own arch (``_platform_spec``)
        options.update(extra)
        if kernel_source.calls_of(name, "decode", extra["platform"]):  # a CPU build's ops: not in this vllm._C
            level = "emulated"
    elif name == "TRITON_ATTN":
        capability = _capability_of(cell.arch)
        if _attn_construction_raises(engine, options, capability):
            options["capability"] = capability
    else:
        capability = options["capability"] = _capability_of(cell.arch)
        _startup_compilation(options, startup)
        level = "backend" if kernel_source.real_kernels_missing(name, "decode", where, capability) is None \
            else "emulated"
    options["level"] = level
    case = (("h_q", model.num_heads // tp * options["dcp"]), ("page_size", options["block_size"]),
            ("kv_dtype", _KV_DTYPES.get(options["cache_dtype"], options["cache_dtype"])), ("min_seqlen", 1))
    return KernelSpec(name=name, target=ATTN_RUNNER, protocol="engine", level=level,
                      function=ATTN_FUNCTIONS[name], package=PACKAGE, returns_lse=False, tree_mask=False,
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


# ---- TRITON_ATTN (GQA models) -------------------------------------------------------------------

TRITON_ATTN_FUNCTION = "vllm.v1.attention.backends.triton_attn:TritonAttentionImpl.forward"
ATTN_FUNCTIONS = {"TRITON_ATTN": TRITON_ATTN_FUNCTION,
                  "FLASH_ATTN": "vllm.v1.attention.backends.flash_attn:FlashAttentionImpl.forward",
                  "CPU_ATTN": "vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.forward",
                  "ROCM_ATTN": "vllm.v1.attention.backends.rocm_attn:RocmAttentionImpl.forward"}
_ATTN_OPS = "vllm.v1.attention.ops"


def _attn_kernels(backend: str, s_q: int) -> tuple[str, ...]:
    """What a GQA impl's ``forward`` runs besides itself on rows of ``s_q`` query tokens (the record's ``functions``).

    ROCM_ATTN: ``chunked_prefill_paged_decode`` sends rows of more than one
    query token to the Triton ``context_attention_fwd`` (prefix_prefill.py)
    and decodes single-token rows with its Triton ``kernel_paged_attention_2d``,
    unless ``use_rocm_custom_paged_attention`` picks the compiled
    ``ops.paged_attention_rocm`` (HIP; CDNA, 64/128-wide heads, blocks of
    16/32, at most 16 query heads per KV head): that op is not in this host's
    vLLM build, and such a cell is ``not-run`` naming it (``_platform_ops_missing``).
    """
    if backend == "TRITON_ATTN":
        return (f"{_ATTN_OPS}.triton_unified_attention:unified_attention",)
    if backend == "ROCM_ATTN":
        return (f"{_ATTN_OPS}.chunked_prefill_paged_decode:chunked_prefill_paged_decode",
                f"{_ATTN_OPS}.chunked_prefill_paged_decode:kernel_paged_attention_2d") + (
            (f"{_ATTN_OPS}.prefix_prefill:context_attention_fwd",) if s_q > 1 else ())
    return ()


#: GQA impls whose cache is vLLM's paged-attention layout: K and V as two head groups
#: (``PagedAttention.split_kv_cache``), K ``[blocks, kv_heads, head_size // x, block, x]`` with
#: ``x = 16 // element size``, V ``[blocks, kv_heads, head_size, block]``; the impl reads the new tokens'
#: K / V of rows with more than one query token from its ``key`` / ``value`` arguments (prefix_prefill).
SPLIT_KV_IMPLS = ("ROCM_ATTN",)
ATTN_RUNNER = "pytest_mla.engines.vllm.startup:run_attn"


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
    parallel = ParallelConfig(tensor_parallel_size=options["tp"], decode_context_parallel_size=options.get("dcp", 1))
    parallel.set_dcp_defaults()
    cache = CacheConfig(block_size=options["block_size"], cache_dtype=options["cache_dtype"])
    compilation = _compilation_config(options)
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


def run_attn(inputs: Any, ctx: Any, options: Mapping[str, Any]) -> Any:
    """vLLM's ``Attention`` layer for a GQA model on ``options["backend"]`` (TRITON_ATTN, FLASH_ATTN, CPU_ATTN).

    ``TritonAttentionImpl.forward`` runs ``unified_attention`` (Triton);
    ``FlashAttentionImpl.forward`` calls flash-attention's varlen kernel,
    emulated at level ``emulated`` (``kernel_source``); CPU_ATTN's cache is
    written by its own ``do_kv_cache_update`` (``CACHE_WRITING_IMPLS``), its
    builder schedules and ``CPUAttentionBackendImpl.forward`` attends, the
    three ``torch.ops._C`` ops emulated; ``RocmAttentionImpl.forward`` (ROCm's
    child) reads a split K/V cache (``SPLIT_KV_IMPLS``) through
    ``chunked_prefill_paged_decode`` (``_attn_kernels``).
    """
    engine = prepare_process()  # before vLLM's modules bind ``current_platform`` (see run_mla)
    import torch
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.v1.attention.backend import CommonAttentionMetadata

    from ...core.errors import AdapterError
    from ...kernels.engine_runner import RankResult
    from . import kernel_source

    backend = options.get("backend", "TRITON_ATTN")
    world, rank = ctx.world, ctx.rank
    device = inputs.q.device
    b, s_q, h_group, d = inputs.q.shape
    h = h_group // world  # this rank's query heads (the case holds the DCP group's)
    h_kv = inputs.kv_cache.shape[2]
    config = _gqa_config(engine, options)
    config.model_config.dtype = inputs.q.dtype
    level = options.get("level", "backend")
    group = _Group(ctx.collectives, device) if world > 1 else None
    with stand_in_guard(), _vllm_context(engine, config, options.get("capability", DEFAULT_CAPABILITY), group,
                                        options.get("arch")), \
            rank_workspaces(device), \
            kernel_source.kernel_source(level, kernel_source.calls_of(backend, "decode")) as log, \
            kernel_source.host_buffers(device) as host:
        layer = Attention(num_heads=h, head_size=d, scale=inputs.softmax_scale, num_kv_heads=h_kv,
                          cache_config=config.cache_config, prefix=LAYER_NAME, attn_backend=backend_class(backend))
        _set_kv_scales(layer, inputs.kv_scale)
        spec = layer.get_kv_cache_spec(config)
        attn_group, kernel_block = _attention_group(layer.attn_backend, spec, config, device)
        block = config.cache_config.block_size
        table, slots = _rank_slots(inputs, block, rank, world, ctx.interleave)
        # TRITON_ATTN, FLASH_ATTN read [num_blocks, num_kv_heads, block_size, 2 * head_size] (K and V side by side).
        split = backend in SPLIT_KV_IMPLS
        if split:
            if kernel_block != block:
                raise AdapterError("kernel check", f"vLLM's {backend} splits the cell's blocks of {block} into kernel "
                                                   f"blocks of {kernel_block}; its split K/V cache is not re-laid-out")
            cache = _nan_cache((2, inputs.kv_cache.shape[0], block, h_kv * d), spec.dtype, device)
        else:
            cache = _nan_cache((inputs.kv_cache.shape[0], h_kv, block, 2 * d), spec.dtype, device)
        if slots.numel():
            seqlens = [int(n) for n in inputs.cache_seqlens.tolist()]
            k = torch.cat([_dense_rows(inputs.kv_cache, inputs.block_table, i, n) for i, n in enumerate(seqlens)])
            v = torch.cat([_dense_rows(inputs.v_cache, inputs.block_table, i, n) for i, n in enumerate(seqlens)])
            if backend in CACHE_WRITING_IMPLS:
                _impl_writes_tokens(layer, cache, slots, k, v, inputs, kernel_block != block)
            elif split:
                _write_split_tokens(cache, slots, k, v, block, inputs.kv_scale)
            else:
                _write_tokens(cache, slots, torch.cat([k, v], dim=-1), block, inputs.kv_scale)
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
            k_new = torch.cat([_dense_rows(inputs.kv_cache, inputs.block_table, i, n)[n - s_q:]
                               for i, n in enumerate(seqlens)])
            v_new = torch.cat([_dense_rows(inputs.v_cache, inputs.block_table, i, n)[n - s_q:]
                               for i, n in enumerate(seqlens)])
            scale = inputs.kv_scale if inputs.kv_scale is not None else 1.0
            key = (k_new.to(torch.float64) * scale).to(q.dtype)
            value = (v_new.to(torch.float64) * scale).to(q.dtype)
        else:  # the new tokens are cached already
            key = value = torch.zeros(b * s_q, h_kv, d, dtype=q.dtype, device=device)
        # Attention.forward hands the impl its output as [tokens, heads, head_size], in the model's dtype.
        output = torch.full((b * s_q, h, d), math.nan, dtype=q.dtype, device=device)
        # Attention.forward's first step (model_executor/layers/attention/attention.py, 0.34.0:537-552):
        # an FP8 cache's query is quantised by the layer when the impl takes quantised queries. Not for
        # TRITON_ATTN here: Triton's interpreter cannot multiply fp8 operands (the query is exact in
        # the cache's format, so its values are those a quantised query has).
        if backend != "TRITON_ATTN" and layer.query_quant is not None and layer.impl.supports_quant_query_input \
                and q.dtype != current_platform_fp8():
            q, _ = layer.query_quant(q, layer._q_scale)
        with _platform_ops_missing(options):
            layer.impl.forward(layer, q, key, value, cache, metadata, output)
        emulated = tuple(log.called) if log is not None else ()
        notes = tuple(host) + _platform_notes(options)
    functions = (ATTN_FUNCTIONS[backend],) + _attn_kernels(backend, s_q) + CACHE_WRITING_IMPLS.get(backend, ())
    if world > 1:
        functions += ("vllm.v1.attention.backends.flash_attn:FlashAttentionImpl._forward_with_dcp",)
    return RankResult(output.view(b, s_q, h, d), None, heads if world > 1 else None, functions, notes=notes,
                      emulated=emulated)


@contextlib.contextmanager
def _platform_ops_missing(options: Mapping[str, Any]) -> Iterator[None]:
    """Another platform's cell whose path calls a ``torch.ops`` op this host lacks: ``EngineCannotRun`` naming it.

    vLLM's own code picked the op for the cell (ROCM_ATTN's ``chunked_prefill_paged_decode``
    calls ``ops.paged_attention_rocm``, ``torch.ops._rocm_C.paged_attention``, where
    ``use_rocm_custom_paged_attention`` says so); a CUDA build of vLLM has no such op, so the
    check cannot run that kernel here. Nothing stands in for it.
    """
    from ...kernels.engine_runner import EngineCannotRun, engine_function_of

    try:
        yield
    except AttributeError as exc:
        found = re.search(r"'_OpNamespace' '(\w+)' object has no attribute '(\w+)'", str(exc))
        if options.get("platform") is None or found is None:
            raise
        caller = engine_function_of(exc, PACKAGE) or "vLLM"
        raise EngineCannotRun(f"vLLM's {options['backend']} on the {options['platform']} platform ({options['arch']}) "
                              f"calls torch.ops.{found.group(1)}.{found.group(2)} (from {caller}), a compiled "
                              "kernel this host's vLLM build does not have") from None


def _write_split_tokens(cache: Any, slots: Any, k: Any, v: Any, block: int, kv_scale: float | None) -> None:
    """Token ``t`` at slot ``s`` into a split K/V cache ``[2, blocks, block, kv_heads * head_size]`` (``SPLIT_KV_IMPLS``).

    Where ``PagedAttention.split_kv_cache`` reads it: K ``[s // block, h, :, s % block, :]`` of the
    ``[blocks, kv_heads, head_size // x, block, x]`` view, V ``[s // block, h, :, s % block]`` of
    ``[blocks, kv_heads, head_size, block]``.
    """
    from vllm.v1.attention.backends.utils import PAD_SLOT_ID

    mine = slots != PAD_SLOT_ID
    slots, k, v = slots[mine], k[mine], v[mine]
    n, h_kv, d = k.shape
    x = 16 // cache.element_size()
    blocks = cache.shape[1]
    key_cache = cache[0].view(blocks, h_kv, d // x, block, x)
    value_cache = cache[1].view(blocks, h_kv, d, block)
    key_cache[slots // block, :, :, slots % block, :] = _stored(k, cache.dtype, kv_scale).view(n, h_kv, d // x, x)
    value_cache[slots // block, :, :, slots % block] = _stored(v, cache.dtype, kv_scale)


def current_platform_fp8() -> Any:
    from vllm.platforms import current_platform

    return current_platform.fp8_dtype()


#: GQA backends whose cache layout is the kernel library's own (packed tiles per ISA): the check writes every
#: cached token through the impl's ``do_kv_cache_update``, as the model runner did when each token was new.
CACHE_WRITING_IMPLS = {"CPU_ATTN": ("vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.do_kv_cache_update",
                                     "vllm.v1.attention.backends.cpu_attn:CPUAttentionMetadataBuilder.build")}


def _impl_writes_tokens(layer: Any, cache: Any, slots: Any, k: Any, v: Any, inputs: Any, split: bool) -> None:
    """Every cached token through vLLM's ``do_kv_cache_update`` (``CPU_ATTN``: ``cpu_attn_reshape_and_cache``).

    The keys and values are the model's (an fp8 cache's rows dequantised with
    the check's ``kv_scale``, which the layer holds as its ``_k_scale``); the
    impl quantises and packs them as its kernel reads them.
    """
    import torch

    from ...core.errors import AdapterError

    if split:
        raise AdapterError("kernel check", f"vLLM's {type(layer.impl).__name__} splits the cell's blocks into "
                                           "kernel blocks; its packed tiles are not re-laid-out here")
    scale = inputs.kv_scale if inputs.kv_scale is not None else 1.0
    dtype = inputs.q.dtype
    key = (k.to(torch.float64) * scale).to(dtype).to(cache.device)
    value = (v.to(torch.float64) * scale).to(dtype).to(cache.device)
    layer.impl.do_kv_cache_update(layer, key, value, cache, slots)


def _write_tokens(cache: Any, slots: Any, rows: Any, block: int, kv_scale: float | None = None) -> None:
    """Token ``t`` at slot ``s``: ``cache[s // block, :, s % block] = rows[t]`` (this layout's heads-first blocks)."""
    import torch
    from vllm.v1.attention.backends.utils import PAD_SLOT_ID

    mine = slots != PAD_SLOT_ID
    slots, rows = slots[mine], rows[mine]
    cache[slots // block, :, slots % block] = _stored(rows, cache.dtype, kv_scale)
