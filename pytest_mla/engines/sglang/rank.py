"""One DCP rank of a kernel check: SGLang's own server args, pools, backend and batch built, its path run.

See ``checks`` for what is built and why. Everything version-specific
is detected here, by feature (a module, a function, a parameter), never by
version number: SGLang 0.5.20 to 0.5.23 move these pieces between releases.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import inspect
import logging
import os
import threading
import types
import warnings
from typing import Any, Callable, Iterator, Mapping

import torch

from ...core.errors import AdapterError
from ...core.records import CACHE_WRITE_STEP
from ...kernels.engine_runner import engine_step
from ...kernels.inputs import free_slot_value
from ..common import MODEL_CONFIGS
from ..common.process_group import DcpGroup, torch_collectives_in_process
from ..common.schedule import recorded_splits
from ..common.shared_scope import SharedScope
from .backends import backend
from .batch import poison, write_loc
from .support import STUBS, adapter_error, construct, make_dataclass

__all__ = ["Engine", "RankSetup", "adapter_error", "load_engine"]

_TORCH_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
#: Free slots the pools keep beyond a check's tokens (holes between requests, the dummy slot).
_SPARE_PAGES = 4

_lock = threading.Lock()


_engine: "Engine | None" = None


# ---- the engine, once per process --------------------------------------------------------------


@dataclasses.dataclass
class Engine:
    """SGLang's modules this runner uses, imported once per process after the Triton mode is decided."""

    version: str
    rc: Any  # sglang.srt.runtime_context
    prepare_server_args: Callable[[list[str]], Any]
    model_config_of: Callable[[Any], Any]
    registry: Any  # attention_registry
    memory_pool: Any
    allocators: dict[str, type]
    translator_cls: type
    radix_attention_cls: type
    forward_batch_cls: type
    forward_mode: Any
    forward_context: Any  # module sglang.srt.model_executor.forward_context
    kv_cache_dtype: Any  # module sglang.srt.mem_cache.kv_cache_dtype
    spec_algorithm: Any  # SpeculativeAlgorithm
    model_runner_cls: type


def load_engine() -> Engine:
    """Import SGLang for a check (idempotent; safe in a fresh ``pytest_mla.kernels.distributed`` child)."""
    global _engine
    with _lock:
        if _engine is None:
            _engine = _import_engine()
        return _engine


def _import_engine() -> Engine:
    from ...kernels._mode import ensure_triton_mode
    from ..common.import_stubs import install_stubs

    ensure_triton_mode()  # before any SGLang module with @triton.jit kernels is imported
    for root, attrs in STUBS.items():
        install_stubs([root], attrs)
    logging.getLogger("sglang").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sglang.srt import runtime_context as rc
        from sglang.srt.layers.attention import attention_registry
        from sglang.srt.layers.radix_attention import RadixAttention
        from sglang.srt.mem_cache import kv_cache_dtype, memory_pool
        from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
        from sglang.srt.model_executor import forward_context
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
        from sglang.srt.model_executor.model_runner import ModelRunner
        from sglang.srt.server_args import prepare_server_args
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        allocators = {}
        for module, name in (("sglang.srt.mem_cache.allocator.token", "TokenToKVPoolAllocator"),
                             ("sglang.srt.mem_cache.allocator.paged", "PagedTokenToKVPoolAllocator"),
                             ("sglang.srt.mem_cache.allocator", "TokenToKVPoolAllocator"),
                             ("sglang.srt.mem_cache.allocator", "PagedTokenToKVPoolAllocator")):
            if name not in allocators:
                try:
                    allocators[name] = getattr(importlib.import_module(module), name)
                except (ImportError, AttributeError):
                    pass
        model_config_of = _model_config_getter()
    return Engine(
        version=importlib.metadata.version("sglang"), rc=rc, prepare_server_args=prepare_server_args,
        model_config_of=model_config_of, registry=attention_registry, memory_pool=memory_pool,
        allocators=allocators, translator_cls=KVIndexTranslator, radix_attention_cls=RadixAttention,
        forward_batch_cls=ForwardBatch, forward_mode=ForwardMode, forward_context=forward_context,
        kv_cache_dtype=kv_cache_dtype, spec_algorithm=SpeculativeAlgorithm, model_runner_cls=ModelRunner,
    )


def _model_config_getter() -> Callable[[Any], Any]:
    try:
        from sglang.srt.arg_groups.overrides import model_config_of

        return model_config_of
    except ImportError:
        from sglang.srt.configs.model_config import ModelConfig

        return ModelConfig.from_server_args


# ---- server arguments, published once per check configuration -----------------------------------


@dataclasses.dataclass
class Published:
    key: tuple
    server_args: Any
    model_config: Any


_published: Published | None = None


def server_argv(options: Mapping[str, Any], dtype: torch.dtype, device: torch.device) -> list[str]:
    """``sglang serve`` arguments of a check (the cell's resolved settings, on the check's device)."""
    model_path = MODEL_CONFIGS / options["model"]
    if not (model_path / "config.json").is_file():
        raise adapter_error("kernel check", f"no weightless config.json for model {options['model']!r} under {MODEL_CONFIGS}")
    argv = ["--model-path", os.fspath(model_path), "--device", device.type,
            "--attention-backend", options["backend"], "--dtype", _TORCH_DTYPES[dtype],
            "--tp-size", str(options["tp"]), "--dcp-size", str(options["dcp"]),
            "--page-size", str(options["page_size"]), "--kv-cache-dtype", options["kv_cache_dtype"],
            "--triton-attention-num-kv-splits", str(options["num_kv_splits"])]
    speculative = options.get("speculative")
    if speculative:
        algorithm, topk, steps, draft = speculative
        argv += ["--speculative-algorithm", {"eagle": "EAGLE", "eagle3": "EAGLE3"}.get(algorithm, "NEXTN"),
                 "--speculative-eagle-topk", str(topk), "--speculative-num-steps", str(steps),
                 "--speculative-num-draft-tokens", str(draft)]
        if not options["mla"]:
            argv += ["--speculative-draft-model-path", os.fspath(model_path)]
    return argv


def publish(engine: Engine, options: Mapping[str, Any], dtype: torch.dtype, device: torch.device) -> Published:
    """Publish the check's server args (once per configuration; again if anything else published since)."""
    global _published
    key = (tuple(sorted((k, repr(v)) for k, v in options.items())), str(dtype), device.type)
    with _lock:
        current = _published
        if current is not None and current.key == key and _is_published(engine, current.server_args):
            return current
        server_args = engine.prepare_server_args(server_argv(options, dtype, device))
        server_args.resolve_once()
        engine.rc.publish(server_args, role="test")
        for field, want in (("page_size", options["page_size"]), ("kv_cache_dtype", options["kv_cache_dtype"]),
                            ("attention_backend", options["backend"])):
            got = getattr(server_args, field, want)
            if str(got) != str(want):
                raise adapter_error("kernel check", f"on {device.type} SGLang resolved {field}={got!r}, "
                                   f"the cell resolved {want!r}")
        _published = Published(key, server_args, engine.model_config_of(server_args))
        return _published


def _is_published(engine: Engine, server_args: Any) -> bool:
    try:
        return engine.rc.get_server_args() is server_args
    except Exception:
        return False


# ---- the DCP group -----------------------------------------------------------------------------


def sglang_group(collectives: Any) -> Any:
    """SGLang's own ``GroupCoordinator`` over a real (gloo) process group (``--mla-dcp-mode=distributed``)."""
    from sglang.srt.distributed import parallel_state

    kwargs = {"use_pynccl": False, "use_custom_allreduce": False, "use_message_queue_broadcaster": False,
              "group_name": "dcp", "use_mscclpp": False, "use_torch_symm_mem_allreduce": False}
    accepted = inspect.signature(parallel_state.init_model_parallel_group).parameters
    kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    return parallel_state.init_model_parallel_group([list(range(collectives.world))], collectives.rank, "gloo",
                                                   **kwargs)


def _rocm_kv_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The KV-cache dtype SGLang's ``configure_kv_cache_dtype`` resolves on ROCm for the active arch.

    ROCm stores ``fp8_e4m3`` and ``fp8_e5m2`` alike in the platform's fp8 type (``fp8_dtype if
    _is_hip``): ``float8_e4m3fnuz`` on gfx942, ``float8_e4m3fn`` on gfx950 (``fp8_kernel.is_fp8_fnuz``,
    derived again for the check's arch by ``platform_check.derived_constants``). An e4m3fnuz value is
    half the e4m3fn value of the same bits, so SGLang doubles a checkpoint's KV scales there
    (``BaseKVCacheMethod.process_weights_after_loading``, quantization/kv_cache.py: ``k_scale *= 2``
    under ``is_fp8_fnuz()``) and its writes store ``K / (2 k_scale)``. The check's e4m3fn cache is
    copied so: each value halved, which e4m3fnuz holds exactly (every e4m3fn value up to 448, halved,
    is an e4m3fnuz value). Without checkpoint scales (k_scale 1.0, not doubled) values are copied as
    they are (the check's are at most 1 there).
    """
    from sglang.srt.mem_cache.kv_cache_dtype import configure_kv_cache_dtype

    _, dtype = construct(configure_kv_cache_dtype, server_args_kv_cache_dtype=kv_cache_dtype, model=None,
                         model_dtype=model_dtype, is_draft_worker=False, is_dflash=False,
                         speculative_draft_attention_backend=None)
    return dtype


# The ranks of one in-process check share SGLang's ParallelContext: the scoped overrides it had
# before the first rank started are put back when the last one ends.
_parallel_overrides = SharedScope("SGLang's ParallelContext")


@contextlib.contextmanager
def _overrides_restored(parallel: Any) -> Iterator[dict[str, Any]]:
    baseline = dict(getattr(parallel, "_overrides", {}))
    try:
        yield baseline
    finally:
        parallel._overrides = dict(baseline)


# ---- one rank ----------------------------------------------------------------------------------


class RankSetup:
    """SGLang's model runner pieces for one DCP rank, filled from a check's inputs; ``compute`` runs the path."""

    @classmethod
    def build(cls, engine: Engine, inputs: Any, ctx: Any, options: Mapping[str, Any]) -> "RankSetup":
        self = cls()
        self.engine, self.inputs, self.ctx, self.options = engine, inputs, ctx, dict(options)
        self.device = ctx.device
        self.dtype = inputs.q.dtype
        self.world, self.rank = ctx.world, ctx.rank
        if self.world != options["dcp"]:
            raise adapter_error("kernel check", f"{self.world} ranks for dcp={options['dcp']}")
        self.published = publish(engine, options, self.dtype, self.device)
        self.model_config = self.published.model_config
        self._parallel = engine.rc.get_parallel()
        self._scopes = contextlib.ExitStack()  # what the ranks share, left in reverse order by close()
        self._baseline = self._scopes.enter_context(
            _parallel_overrides.enter(id(self._parallel), lambda: _overrides_restored(self._parallel)))
        self._notes: list[str] = []
        self._fi_a2a: Any = None  # the module holding SGLang's per-process fi_a2a state, when in use
        self._fi_a2a_state: Any = None  # this rank's
        try:
            self.group = self._make_group()
            self.activate()
            self._pre_initialize_dcp_exchange()
            self.spec = options.get("speculative")
            self._build_pools()
            self._build_backend()
            self._fill()
            self._build_batch()
        except BaseException:
            self.close()
            raise
        return self

    # -- the rank's place -------------------------------------------------------------------------
    def _make_group(self) -> Any:
        if self.world == 1:
            return None
        from ...kernels.collectives import TorchCollectives

        collectives = self.ctx.collectives
        if isinstance(collectives, TorchCollectives):  # one process per rank: SGLang's own group
            self._notes.append("DCP group: SGLang's init_model_parallel_group over gloo")
            return sglang_group(collectives)
        self._scopes.enter_context(torch_collectives_in_process())
        return DcpGroup(collectives, after=self.activate, name="pytest-mla:dcp", cpu_group=False)

    def _pre_initialize_dcp_exchange(self) -> None:
        """What the model runner does before graph capture for ``--dcp-comm-backend fi_a2a`` (SGLang's
        default on a single-node Blackwell DCP group): FlashInfer's MNNVL all-to-all workspace."""
        parallel = self._parallel
        if self.group is None or getattr(parallel, "dcp_comm_backend", None) != "fi_a2a":
            return
        try:
            from sglang.srt.layers.dcp import init_fi_a2a_workspace
        except ImportError:
            return  # a release without it
        # SGLang keeps the workspace in a per-process global (comm._FI_A2A_STATE): one per check, and with
        # in-process ranks one per rank, stated by ``activate`` as the rank's ForwardContext is
        self._fi_a2a = importlib.import_module("sglang.srt.layers.dcp.comm")
        self.activate()
        from ...kernels.emulated.glue import OutOfContractError, OutOfRangeRead

        try:
            init_fi_a2a_workspace(self.group)
        except (AdapterError, OutOfContractError, OutOfRangeRead):
            raise
        except Exception as exc:
            if not _raised_in_adapter(exc):
                exc.mla_engine_raised = True  # SGLang's start-up (or a library check it tripped) raised: a finding
            raise
        self._fi_a2a_state = self._fi_a2a._FI_A2A_STATE
        self._notes.append("DCP exchange: --dcp-comm-backend fi_a2a (FlashInfer's MNNVL all-to-all), "
                           "its workspace initialised as the model runner does")

    def rank_fields(self) -> dict[str, Any]:
        r = self.rank
        fields: dict[str, Any] = {"tp_rank": r, "attn_tp_rank": r, "dcp_rank": r, "attn_dcp_rank": r,
                                  "pp_rank": 0, "attn_dp_rank": 0, "attn_cp_rank": 0, "moe_ep_rank": 0}
        if self.group is not None:
            fields["dcp_group"] = self.group
        return fields

    def activate(self) -> None:
        """State this rank's place on SGLang's ``ParallelContext`` (its scoped overrides) and, while it
        computes, its own ``ForwardContext``: SGLang keeps the active one in a module global, and the
        in-process ranks take turns in one process (each would otherwise read the last rank's)."""
        self._parallel._overrides = {**self._baseline, **self.rank_fields()}
        if self._fi_a2a is not None:
            self._fi_a2a._FI_A2A_STATE = self._fi_a2a_state
        forward = getattr(self, "_forward", None)
        if forward is not None:
            self.engine.forward_context.set_forward_context(forward)

    def close(self) -> None:
        if self._fi_a2a is not None:
            self._fi_a2a._FI_A2A_STATE = None
        self._scopes.close()

    # -- pools -----------------------------------------------------------------------------------
    def _kv_torch_dtype(self) -> torch.dtype:
        options = self.options
        if options["kv_cache_dtype"] == "auto":
            return self.dtype
        if options.get("platform") == "rocm":  # the platform's own fp8 type, as SGLang resolves it for the arch
            return _rocm_kv_dtype(options["kv_cache_dtype"], self.dtype)
        return {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[options["kv_cache_dtype"]]

    def _fnuz_halves(self) -> bool:
        """Whether the cache holds each scaled token at half its e4m3fn value (see ``_rocm_kv_dtype``)."""
        return self.kv_dtype == torch.float8_e4m3fnuz and self.inputs.kv_scale not in (None, 1.0)

    def _build_pools(self) -> None:
        engine, inputs, mc = self.engine, self.inputs, self.model_config
        page, world = self.options["page_size"], self.world
        seqlens = [int(n) for n in inputs.cache_seqlens.tolist()]
        self.seqlens = seqlens
        alloc_page = page * world  # the widened allocator pages under DCP
        tokens = sum(-(-n // alloc_page) * alloc_page for n in seqlens) + (len(seqlens) + _SPARE_PAGES) * alloc_page
        rows = -(-tokens // world)  # per-rank rows
        self.kv_dtype = self._kv_torch_dtype()
        fnuz_copy = self.kv_dtype == torch.float8_e4m3fnuz and inputs.kv_cache.dtype == torch.float8_e4m3fn
        if inputs.kv_cache.dtype != self.kv_dtype and not fnuz_copy:
            raise adapter_error("kernel check", f"the check's cache is {inputs.kv_cache.dtype}, SGLang's pool {self.kv_dtype}")
        max_len = max(seqlens) + 8
        self.req_to_token_pool = construct(engine.memory_pool.ReqToTokenPool, size=len(seqlens) + 3,
                                           max_context_len=max_len, device=str(self.device), enable_memory_saver=False)
        if self.options.get("dsa"):
            self.pool = self._dsa_pool(rows)
            self.buffers = [self.pool.kv_buffer[0]]
        elif self.options["mla"]:
            self.pool = construct(engine.memory_pool.MLATokenToKVPool, rows, page_size=page, dtype=self.kv_dtype,
                                  kv_lora_rank=mc.kv_lora_rank, qk_rope_head_dim=mc.qk_rope_head_dim, layer_num=1,
                                  device=str(self.device), enable_memory_saver=False, start_layer=0, end_layer=0)
            self.buffers = [self.pool.kv_buffer[0]]
        else:
            head_num = inputs.kv_cache.shape[2]
            self.pool = construct(engine.memory_pool.MHATokenToKVPool, rows, page_size=page, dtype=self.kv_dtype,
                                  head_num=head_num, head_dim=inputs.kv_cache.shape[3], layer_num=1,
                                  device=str(self.device), enable_memory_saver=False,
                                  v_head_dim=inputs.head_dim_v, start_layer=0, end_layer=0,
                                  enable_alt_stream=False, enable_kv_cache_copy=False)
            self.buffers = [self.pool.k_buffer[0], self.pool.v_buffer[0]]
        for buffer in self.buffers:
            poison(buffer, self.kv_dtype)
        if page == 1 and world == 1:
            self.allocator = construct(engine.allocators["TokenToKVPoolAllocator"], rows, dtype=self.kv_dtype,
                                       device=str(self.device), kvcache=self.pool, need_sort=False)
        else:  # the KV-cache configurator's branch for page_size > 1 or DCP: pages widened by the DCP size
            self.allocator = construct(engine.allocators["PagedTokenToKVPoolAllocator"], rows * world,
                                       page_size=alloc_page, dtype=self.kv_dtype, device=str(self.device),
                                       kvcache=self.pool, need_sort=False)
        self.translator = construct(engine.translator_cls, req_to_token=self.req_to_token_pool.req_to_token,
                                    token_to_kv_pool_allocator=self.allocator, token_to_kv_pool=self.pool,
                                    page_size=page, device=str(self.device), is_draft_worker=False)

    def _dsa_pool(self, rows: int) -> Any:
        """SGLang's DSA KV pool, as its KV-cache configurator builds it for a DSA checkpoint on any MLA
        backend (kv_cache_configurator.py ``_build_dsa_kv_pool``: ``use_mla_backend and is_dsa_model``):
        the latent rows in the layout ``calculate_mla_kv_cache_dim`` resolves for the platform and the
        DSA backends SGLang resolved (an e4m3 cache may be FP8 NoPE with per-128 scales and a bf16 RoPE
        tail), and the indexer's key cache beside them (left NaN: nothing in a dense backend's decode
        reads it)."""
        from sglang.srt.configs import model_config as mcfg
        from sglang.srt.mem_cache.kv_cache_configurator import calculate_mla_kv_cache_dim

        mc = self.model_config
        hf = mc.hf_config
        dim = calculate_mla_kv_cache_dim(model_config=mc, kv_cache_dtype=self.kv_dtype)
        optional = {}
        for name, getter in (("index_kpool", "get_dsa_index_kpool"),
                             ("index_kpool_compress", "get_dsa_index_kpool_compress")):
            if hasattr(mcfg, getter):
                optional[name] = getattr(mcfg, getter)(hf)
        pool = construct(self.engine.memory_pool.DSATokenToKVPool, rows, page_size=self.options["page_size"],
                         kv_lora_rank=mc.kv_lora_rank, dtype=self.kv_dtype, qk_rope_head_dim=mc.qk_rope_head_dim,
                         layer_num=1, device=str(self.device), index_head_dim=mcfg.get_dsa_index_head_dim(hf),
                         enable_memory_saver=False, kv_cache_dim=dim, start_layer=0, end_layer=0,
                         max_running_requests=self.req_to_token_pool.size, **optional)
        index = getattr(pool, "index_k_with_scale_buffer", None)
        for buffer in index if isinstance(index, (list, tuple)) else ():
            if buffer.is_floating_point():
                buffer.fill_(free_slot_value())
            else:
                buffer.fill_(0xFF)
        layout = ("FP8 NoPE with per-128 scales and a bf16 RoPE tail" if getattr(pool, "dsa_kv_cache_store_fp8", False)
                  else f"{str(self.kv_dtype).removeprefix('torch.')} rows")
        self._notes.append(f"SGLang's DSATokenToKVPool, as its KV-cache configurator builds it for "
                           f"{self.options['model']} on any MLA backend: latent rows of {pool.kv_cache_dim} "
                           f"({layout}; calculate_mla_kv_cache_dim) and the indexer's key cache")
        return pool

    # -- the backend, through SGLang's factory ------------------------------------------------------
    def _runner(self) -> Any:
        engine = self.engine
        algorithm = engine.spec_algorithm.from_string(
            {"eagle": "EAGLE", "eagle3": "EAGLE3"}.get(self.spec[0], "NEXTN") if self.spec else "NONE")
        runner = types.SimpleNamespace(
            server_args=self.published.server_args, model_config=self.model_config,
            req_to_token_pool=self.req_to_token_pool, token_to_kv_pool=self.pool,
            token_to_kv_pool_allocator=self.allocator, kv_index_translator=self.translator,
            sliding_window_size=None, page_size=self.options["page_size"], is_draft_worker=False,
            spec_algorithm=algorithm, kv_cache_dtype=self.kv_dtype, kv_cache_dtype_str=self.options["kv_cache_dtype"],
            dtype=self.dtype, device=str(self.device),
            gpu_id=self.device.index or 0, use_mla_backend=self.options["mla"], init_new_workspace=False,
            is_hybrid_swa=False, attention_chunk_size=None, mambaish_config=None,
            max_running_requests=self.req_to_token_pool.size,
            decode_attention_backend_str=self.options["backend"],
            # the model's modules, as trtllm_mha scans them for ENCODER_ONLY attention layers: the check's
            # models have none (Llama's and Mllama's RadixAttention layers are decoder / cross attention)
            model=torch.nn.Module(),
            prefill_attention_backend_str=getattr(self.published.server_args, "prefill_attention_backend", None)
            or self.options["backend"],
        )
        runner.decode_num_tokens_per_req = types.MethodType(engine.model_runner_cls.decode_num_tokens_per_req, runner)
        return runner

    def _build_backend(self) -> None:
        engine = self.engine
        self.runner = self._runner()
        factory = engine.registry.ATTENTION_BACKENDS[self.options["backend"]]
        try:
            self.backend = factory(self.runner)
        except AttributeError as exc:
            missing_on = getattr(exc, "obj", None)
            if missing_on is self.runner:  # a field our model-runner stand-in lacks: ours
                raise adapter_error("kernel check", f"SGLang's {self.options['backend']} backend reads "
                                                    f"model_runner.{exc.name}, which the check's model-runner "
                                                    "stand-in does not have") from None
            if type(missing_on).__module__.startswith("pytest_mla"):  # one of our host or library stand-ins
                raise adapter_error("kernel check", f"SGLang's {self.options['backend']} backend reads "
                                                    f"{type(missing_on).__name__}.{exc.name}, which pytest-mla's "
                                                    "stand-in does not have") from None
            exc.mla_engine_raised = True  # SGLang's constructor itself raised: at start-up, a finding
            raise
        except Exception as exc:
            exc.mla_engine_raised = True
            raise
        inputs = self.inputs
        heads_local = inputs.q.shape[2] // self.world
        self.heads = (self.rank * heads_local, (self.rank + 1) * heads_local)
        d_qk, d_v = inputs.q.shape[3], inputs.head_dim_v
        kv_heads = inputs.kv_cache.shape[2]
        scale = self._layer_scale()
        quant_config = self._quant_config()
        prefix = "model.layers.0.self_attn." + ("attn_mqa" if self.options["mla"] else "attn")

        def layer(heads: int) -> Any:  # as the model builds its attention layer: its scale, its quant config
            return construct(engine.radix_attention_cls, heads, d_qk, scale, num_kv_heads=kv_heads, layer_id=0,
                             v_head_dim=d_v, quant_config=quant_config, prefix=prefix)

        self.layer = layer(heads_local)
        self.layer_gathered = None
        if self.options["mla"] and self.world > 1:  # the model's second layer object for the gathered heads
            self.layer_gathered = layer(heads_local * self.world)
        for built in filter(None, (self.layer, self.layer_gathered)):
            self._load_kv_scales(built)

    def _layer_scale(self) -> float:
        """The softmax scale the model gives its attention layer: SGLang's ``model_config.scaling``
        (an MLA model's, YaRN mscale² included), else the check's (GQA: 1/sqrt(head_dim))."""
        scale = getattr(self.model_config, "scaling", None) if self.options["mla"] else None
        if scale is None:
            return float(self.inputs.softmax_scale)
        self._notes.append(f"layer scale {float(scale):.6g}: SGLang's model_config.scaling; the reference "
                           f"uses the catalogue's {self.inputs.softmax_scale:.6g}")
        return float(scale)

    def _quant_config(self) -> Any:
        """The checkpoint's quantization config as SGLang's loader builds it (None: unquantized)."""
        method = getattr(self.model_config, "quantization", None)
        if not method:
            return None
        try:
            from sglang.srt.configs.load_config import LoadConfig
            from sglang.srt.model_loader.weight_utils import get_quant_config
        except ImportError as exc:
            raise adapter_error("kernel check", f"cannot build the {method} quantization config: {exc}") from None
        config = construct(get_quant_config, self.model_config, LoadConfig(), {})
        self._notes.append(f"attention layers built with the checkpoint's {method} quantization config "
                           f"({type(config).__name__}), as a served checkpoint builds them")
        return config

    def _load_kv_scales(self, layer: Any) -> None:
        """The KV scales a checkpoint leaves on the layer: its quant method's defaults (k_scale 1.0
        when the checkpoint has none) or the case's calibrated scale, then the method's
        ``process_weights_after_loading`` as SGLang's loader calls it."""
        scale = self.inputs.kv_scale
        method = getattr(layer, "quant_method", None)
        if method is None or not hasattr(method, "process_weights_after_loading"):
            if scale not in (None, 1.0):
                raise adapter_error("kernel check", f"k_scale {scale}: this checkpoint has no quantization config "
                                                    "to load KV scales through")
            return
        if scale not in (None, 1.0) and getattr(layer, "k_scale", None) is not None:
            with torch.no_grad():
                layer.k_scale.fill_(float(scale))
                layer.v_scale.fill_(float(scale))
        method.process_weights_after_loading(layer)

    # -- the cache, written the engine's way ---------------------------------------------------------
    def _dense_rows(self, i: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Request ``i``'s cached rows ``[n, h_kv, d]`` (and V rows), in the cache's dtype."""
        inputs = self.inputs
        n = self.seqlens[i]
        page = inputs.kv_cache.shape[1]
        pages = inputs.block_table[i, : -(-n // page)].long()
        k = inputs.kv_cache[pages].reshape(-1, *inputs.kv_cache.shape[2:])[:n]
        v = None
        if inputs.v_cache is not None:
            v = inputs.v_cache[pages].reshape(-1, *inputs.v_cache.shape[2:])[:n]
        return k, v

    def _fill(self) -> None:
        """Slots from SGLang's allocator (requests in a seeded order, a hole after each); cached tokens written."""
        inputs = self.inputs
        generator = torch.Generator().manual_seed(int(self.ctx.case.seed))
        b = len(self.seqlens)
        rows = torch.randperm(self.req_to_token_pool.req_to_token.shape[0], generator=generator)[:b]
        self.req_pool_indices = rows.to(torch.int64)
        alloc_page = self.options["page_size"] * self.world
        self.slots: list[torch.Tensor] = [None] * b  # type: ignore[list-item]
        for i in torch.randperm(b, generator=generator).tolist():
            n = self.seqlens[i]
            need = -(-n // alloc_page) * alloc_page if alloc_page > 1 else n
            got = self.allocator.alloc(need) if need else torch.empty(0, dtype=torch.int64)
            hole = self.allocator.alloc(alloc_page)
            if got is None or hole is None:
                raise adapter_error("kernel check", "the check's pool is too small")
            self.slots[i] = got[:n].to(self.device)
            self.req_to_token_pool.req_to_token[int(rows[i]), :n] = self.slots[i].to(
                self.req_to_token_pool.req_to_token.dtype)
        s_new = inputs.q.shape[1]  # tokens the forward writes itself: the decoded token, or the draft tokens
        self.prefix_lens = [max(n - s_new, 0) for n in self.seqlens]
        with engine_step(CACHE_WRITE_STEP):  # the engine's write path failing here is not its decode failing
            for i, n in enumerate(self.seqlens):
                p = self.prefix_lens[i]
                if p:
                    k, v = self._dense_rows(i)
                    self._write(self.slots[i][:p], torch.arange(p, device=self.device), k[:p],
                                None if v is None else v[:p])

    def _write(self, loc: torch.Tensor, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None) -> None:
        """Write cached tokens through the pool's own write path (under DCP: the rank's share, SGLang's rule)."""
        if self.options["mla"]:
            self._write_mla(loc, k)
            return
        # GQA: the backend's own KV write (``_set_kv_buffer``: loc // dcp and the owner mask under DCP)
        scale = self.inputs.kv_scale
        k_in = (k.to(self.dtype) * scale if scale is not None else k.to(self.dtype))
        v_in = (v.to(self.dtype) * scale if scale is not None else v.to(self.dtype))
        batch = types.SimpleNamespace(out_cache_loc=loc, out_cache_loc_is_physical=False, positions=positions,
                                      dcp_kv_mask=None)
        loc_info = write_loc(loc)
        if hasattr(self.backend, "_set_kv_buffer"):
            self.backend._set_kv_buffer(batch, self.layer, loc_info, k_in, v_in, self.layer.k_scale,
                                        self.layer.v_scale)
        elif self.world == 1:  # the pool's own door, as a backend without a write helper of its own uses it
            self.pool.set_kv_buffer(self.layer, loc_info, k_in, v_in, self.layer.k_scale, self.layer.v_scale)
        else:
            # A backend without a DCP-aware write of its own: the cached tokens as SGLang's DCP layout
            # holds them (TritonAttnBackend._set_kv_buffer: each rank stores the tokens whose position
            # % dcp is its rank, at loc // dcp), through the pool's masked door.
            rank_loc = write_loc(loc // self.world)
            mask = positions % self.world == self.rank
            self.pool.set_kv_buffer(self.layer, rank_loc, k_in, v_in, self.layer.k_scale, self.layer.v_scale,
                                    dcp_kv_mask=mask)
            self._notes.append("cached tokens written as SGLang's DCP layout holds them (loc // dcp, position % dcp "
                               "== rank; TritonAttnBackend._set_kv_buffer's rule): the backend has no DCP-aware "
                               "write of its own")

    def _write_mla(self, loc: torch.Tensor, k: torch.Tensor) -> None:
        """MLA rows: the backend's own door without DCP; under DCP ``set_mla_kv_buffer``, which applies the owner rule."""
        kv_lora = self.inputs.head_dim_v
        scale = self.inputs.kv_scale
        if scale is not None and self.options.get("kv_convention") == "raw":
            k = k.to(self.dtype) * scale  # the token itself: the door casts it to the cache dtype
        elif self._fnuz_halves():
            k = k.to(torch.float32) / 2  # K / (2 k_scale), exact in e4m3fnuz: the door casts it
        if getattr(self.pool, "dsa_kv_cache_store_fp8", False):
            # the DSA pool's FP8 layout has one door, set_mla_kv_buffer (set_kv_buffer asserts it is not
            # that layout): it quantises the token (per-128 scales), so it takes the token itself
            token = k.to(self.dtype) * scale if scale is not None else k.to(self.dtype)
            with self._guarded_rows():
                self.pool.set_mla_kv_buffer(self.layer, write_loc(loc), token[..., :kv_lora].contiguous(),
                                            token[..., kv_lora:].contiguous())
            return
        if self.world == 1:
            self.pool.set_kv_buffer(self.layer, write_loc(loc), k, k[..., :kv_lora])
            return
        try:
            with self._guarded_rows():
                self.pool.set_mla_kv_buffer(self.layer, loc, k[..., :kv_lora].contiguous(),
                                            k[..., kv_lora:].contiguous())
        except Exception as exc:
            from triton.runtime.errors import InterpreterError

            if not isinstance(exc, InterpreterError):
                raise
            # 0.5.20/0.5.21: the write kernel has no torch path and Triton's interpreter cannot run it
            from sglang.srt.layers.dcp.layout import filter_dcp_local_kv_indices

            owned = filter_dcp_local_kv_indices(loc)
            keep = torch.isin(loc, owned)
            rows = owned // self.world
            self.buffers[0][rows] = k[keep].to(self.kv_dtype).view(self.buffers[0].dtype)
            self._notes.append("cached MLA rows written at filter_dcp_local_kv_indices(loc) // dcp_size "
                               "(set_mla_kv_buffer's Triton kernel does not run under the interpreter here)")

    @contextlib.contextmanager
    def _guarded_rows(self) -> Iterator[None]:
        """Under DCP, a DSA pool's write door runs on its buffer extended by ``dcp - 1`` guard buffers.

        The door takes the widened DCP loc (``set_mla_kv_buffer``: up to
        ``dcp`` times the rank's rows) and must keep each token the rank owns
        at ``loc // dcp``. A write past the rank's rows would land in foreign
        memory on a GPU (under Triton's interpreter: this process's heap): the
        guard rows, NaN-poisoned, take it instead, and a guard row written
        afterwards is SGLang's out-of-range write (``OutOfRangeRead``, a write: a finding).
        """
        pool = self.pool
        if self.world == 1 or not self.options.get("dsa"):
            yield
            return
        buffer = pool.kv_buffer[0]
        rows = buffer.shape[0]
        guarded = torch.empty((rows * self.world, *buffer.shape[1:]), dtype=buffer.dtype, device=buffer.device)
        poison(guarded, self.kv_dtype)
        guarded[:rows] = buffer
        tail_before = guarded[rows:].clone()
        pool.kv_buffer[0] = guarded
        try:
            yield
        finally:
            pool.kv_buffer[0] = buffer
        buffer.copy_(guarded[:rows])
        changed = (guarded[rows:].view(torch.uint8) != tail_before.view(torch.uint8)).reshape(rows * (self.world - 1), -1)
        written = changed.any(dim=1).nonzero().flatten()
        if written.numel():
            from ...kernels.emulated.glue import OutOfRangeRead

            raise OutOfRangeRead(
                "loc", f"sglang.srt.mem_cache.memory_pool:{type(pool).__name__}.set_mla_kv_buffer under DCP "
                f"{self.world} wrote {written.numel()} row(s) past the rank's {rows} (first: row "
                f"{rows + int(written[0])}): the widened DCP loc reached the buffer without the owner rule "
                "(loc // dcp), an out-of-range write on a GPU")

    # -- the forward batch ------------------------------------------------------------------------
    def _build_batch(self) -> None:
        engine, inputs = self.engine, self.inputs
        b, s_q = inputs.q.shape[:2]
        self.order = torch.arange(s_q).repeat(b, 1)  # SGLang's token j of request i is the check's query order[i, j]
        spec_info = None
        if self.spec:
            from .batch import verify_input

            spec_info, self.order, positions = verify_input(self, engine)
            mode = engine.forward_mode.TARGET_VERIFY
            seq_lens = torch.tensor(self.prefix_lens, dtype=torch.int64)
            out_slots = []
            for i in range(b):  # draft token j of request i lives at req_to_token[i, prefix + j]
                out_slots.append(self.slots[i][self.prefix_lens[i]:])
            out_cache_loc = torch.cat(out_slots)
        else:
            mode = engine.forward_mode.DECODE
            seq_lens = torch.tensor(self.seqlens, dtype=torch.int64)
            out_cache_loc = torch.stack([self.slots[i][-1] for i in range(b)])
            positions = seq_lens - 1
        device = self.device
        seq_lens = seq_lens.to(device)
        values = dict(
            forward_mode=mode, batch_size=b, input_ids=torch.zeros(b * s_q, dtype=torch.int64, device=device),
            req_pool_indices=self.req_pool_indices.to(device), seq_lens=seq_lens,
            out_cache_loc=out_cache_loc.to(device), seq_lens_sum=int(seq_lens.sum()), seq_lens_cpu=seq_lens.cpu(),
            positions=positions.to(device), spec_info=spec_info, spec_algorithm=self.runner.spec_algorithm,
        )
        if getattr(self.runner.model_config, "is_encoder_decoder", False):
            # SGLang's scheduler gives an encoder-decoder model's batches their encoder lengths
            # (ScheduleBatch.prepare_encoder_info_extend): 0 for a request without an image, as here
            values.update(encoder_lens=torch.zeros(b, dtype=torch.int64, device=device), encoder_lens_cpu=[0] * b,
                          encoder_cached=[True] * b)
        self.forward_batch = make_dataclass(engine.forward_batch_cls, **values)
        own_plan = getattr(self.translator, "own_plan", None)
        if own_plan is not None:  # 0.5.22+: a ForwardBatch is bound to the translator's plan
            own_plan(self.forward_batch).bind(self.forward_batch, self.translator)

    # -- running SGLang's path ------------------------------------------------------------------------
    def compute(self) -> Any:
        from ...kernels.engine_runner import RankResult

        engine, inputs = self.engine, self.inputs
        b, s_q, _, d_qk = inputs.q.shape
        h0, h1 = self.heads
        order = self.order.to(inputs.q.device)
        q = torch.stack([inputs.q[i, order[i], h0:h1] for i in range(b)]).reshape(b * s_q, h1 - h0, d_qk)
        k_new, v_new = self._new_kv(order)
        fctx = engine.forward_context
        self._forward = fctx.ForwardContext(attn_backend=self.backend)
        context = fctx.forward_context(self._forward)
        self.activate()
        try:
            with context, recorded_splits(backend(self.options["backend"]).schedule, owner=self.backend) as splits:
                self.backend.init_forward_metadata(self.forward_batch)
                if self.options["mla"]:
                    from .model import deepseek_attention

                    out, functions = deepseek_attention(self, q, k_new)
                else:
                    out = self.layer(q.reshape(b * s_q, -1), k_new.reshape(b * s_q, -1),
                                     v_new.reshape(b * s_q, -1), self.forward_batch)
                    functions = ("sglang.srt.layers.radix_attention:RadixAttention.forward",)
        finally:
            self._forward = None
        out = out.reshape(b, s_q, h1 - h0, inputs.head_dim_v)
        result = torch.empty_like(out)
        for i in range(b):
            result[i, order[i]] = out[i]
        if self.world > 1:
            merge = ("sglang.srt.models.deepseek_common.attention_forward_methods.forward_mla:"
                     "DeepseekMLAForwardMixin.forward_absorb_core") if self.options["mla"] else \
                "sglang.srt.layers.dcp.comm:cp_lse_ag_out_rs_mha"
            functions = tuple(functions) + (merge,)
        return RankResult(out=result, lse=None, heads=self.heads if self.world > 1 else None,
                          functions=tuple(functions), notes=tuple(self.notes()),
                          schedule={backend(self.options["backend"]).schedule.argument: tuple(splits)} if splits else {})

    def _new_kv(self, order: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """K (and V) of the tokens this forward writes, in SGLang's token order, in the query dtype."""
        inputs = self.inputs
        b, s_q = inputs.q.shape[:2]
        scale = inputs.kv_scale
        ks, vs = [], []
        for i in range(b):
            k, v = self._dense_rows(i)
            p = self.prefix_lens[i]
            k_i = k[p:][order[i]].to(self.dtype)
            ks.append(k_i * scale if scale is not None else k_i)
            if v is not None:
                v_i = v[p:][order[i]].to(self.dtype)
                vs.append(v_i * scale if scale is not None else v_i)
        k_new = torch.cat(ks)
        return k_new, (torch.cat(vs) if vs else None)

    def notes(self) -> list[str]:
        built = f"sglang {self.engine.version}: {type(self.backend).__name__} built by SGLang's factory"
        if backend(self.options["backend"]).reads_num_kv_splits:
            built += f" with --triton-attention-num-kv-splits {self.options['num_kv_splits']}"
        if self.options.get("emulate"):
            built += f", on a CPU host stated to SGLang as an {self.options['arch']} GPU (runtime_context platform facts)"
        notes = [built]
        notes += self._notes
        if self.inputs.kv_scale is not None:
            k_scale = getattr(self.layer, "k_scale_float", None)
            notes.append(f"fp8 KV cache with k_scale = v_scale = {self.inputs.kv_scale:g} "
                         + ("(a checkpoint without KV scales)" if k_scale is None or k_scale == 1.0 else
                            "(a checkpoint with calibrated KV scales)"))
        if self.kv_dtype != self.inputs.kv_cache.dtype:
            notes.append(f"KV cache stored as {str(self.kv_dtype).removeprefix('torch.')} (SGLang's fp8 type on "
                         f"{self.options.get('arch')}): "
                         + ("the check's e4m3fn tokens halved into it, as SGLang's doubled checkpoint scale stores "
                            "them (exact)" if self._fnuz_halves() else "the check's e4m3fn tokens copied (exact)"))
        return notes


def _raised_in_adapter(exc: BaseException) -> bool:
    """Whether ``exc`` was raised in this adapter's own code (its stand-ins, the ranks' collectives),
    not SGLang's or a library's."""
    import traceback

    from ...kernels.collectives import CollectiveError

    if isinstance(exc, CollectiveError):  # another rank failed or the ranks did not meet: not this call
        return True
    frames = traceback.extract_tb(exc.__traceback__)
    adapter = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # pytest_mla/engines
    return bool(frames) and os.path.abspath(frames[-1].filename).startswith(adapter + os.sep)

