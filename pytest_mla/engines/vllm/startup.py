"""The real vLLM engine: its start-up, from the config layer to the metadata builders, on a faked GPU.

Per cell, in the order a vLLM 0.33 / 0.34 server starts (the V2 GPU model
runner, ``vllm/v1/worker/gpu/model_runner.py``, which both releases use by
default for EAGLE and MTP):

1. **Config layer** (``VllmConfig.__post_init__``):
   ``ModelConfig.verify_with_parallel_config`` with a real ``ParallelConfig``
   (``tp`` = the ``tp`` axis, else the DCP size), then ``POST_INIT_STEPS``:
   the scheduler budget with the speculative slots, the CUDA-graph capture
   sizes, the model runner's feature check.
2. **Worker and runner**: ``check_if_supports_dtype`` (``Worker.init_device``);
   for spec cells ``init_speculator`` (``GPUModelRunner.__init__``).
3. **Model construction** (``Worker.load_model``): the target model's
   attention layer, built by vLLM's own layer class (``MLAAttention`` for MLA
   models, ``Attention`` otherwise) with the per-rank head counts the model
   code passes. Its constructor runs, in vLLM's order, the attention selector
   (``get_attn_backend``: the forced backend's ``validate_configuration``, or
   for ``auto`` the platform's priority walk), the impl class's constructor
   (e.g. ``TritonMLAImpl``'s FP8-below-SM89 refusal), and for MLA the MLA
   prefill backend selection and its constructor. Spec cells then build the
   drafter's first layer the same way (``load_eagle_model`` uses the target's
   config; the draft overrides are unset), marked as a draft layer as
   ``DraftModelSpeculator.load_model`` marks it. The draft is not a
   checkpoint: it has the target's attention shape (DeepSeek's MTP layer and
   the EAGLE heads of these models do).
4. **Block size** (executor, after loading): ``update_block_size_for_backend``.
5. **KV cache and metadata builders** (``GPUModelRunner.initialize_kv_cache``):
   ``get_kv_cache_spec``, ``get_kv_cache_groups``, ``init_attn_backend``
   (kernel block sizes, every group's metadata builder constructed on the
   ``meta`` device: the builders' own checks, e.g. the reorder threshold that
   depends on ``num_speculative_tokens``), the CUDA-graph mode
   (``resolve_cudagraph_mode_and_sizes`` with the verify length), then
   ``check_attention_cp_compatibility``, then for spec cells the drafter's
   ``init_attn_backend`` on the draft layers (``DraftModelSpeculator.set_attn``).

Nothing past that runs: weights, the profiling forward pass, KV-cache
allocation and CUDA-graph capture need a GPU. docs/engines.md lists every
start-up check reached and not reached.

How it runs on a CPU-only machine (see docs/engines.md):

* **The arch is faked by a platform**: a subclass of vLLM's
  ``NonNvmlCudaPlatform`` whose ``get_device_capability`` answers the cell's
  arch, installed as ``vllm.platforms.current_platform`` *before* any vLLM
  module that binds it is imported.
* **Compiled-extension checks are isolated from the rules**: the checks are
  plain import attempts (``vllm._flashmla_C``, ``vllm._flashmla_extension_C``,
  ``vllm.vllm_flash_attn._vllm_fa2_C`` / ``_vllm_fa3_C``, ``flashinfer``,
  ``tokenspeed_mla``); those modules are import stubs, so every backend
  answers as on a GPU host with everything compiled. ``vllm._C`` and
  ``vllm._C_stable_libtorch`` (CUDA-linked) are stubbed for the import.
* **Import-time side effects** neutralised without touching a rule: CUTLASS
  MLA's CUDA workspace goes to the ``meta`` device; the CUTLASS GEMM
  capability queries some modules make when they load answer False
  (``QUERIES_AT_IMPORT``); ``HOST_FACTS`` (Triton has a GPU backend).
* **GPU steps after every check** of the constructor they sit in (DCP
  symmetric-memory workspaces, a FlashInfer CUDA buffer) are recorders while
  a cell starts (``GPU_STEPS``); the cell's notes name those reached.
* **The current vLLM config** is a stand-in whose sections are vLLM's own
  config classes (``ParallelConfig``, ``CacheConfig``, ``AttentionConfig``,
  ``SchedulerConfig``, ``CompilationConfig``, ``KernelConfig``) and whose
  ``VllmConfig`` properties and methods are vLLM's; the model config is a
  view with ``vllm.config.ModelConfig``'s own methods and properties over the
  model's Hugging Face config (read by vLLM's ``get_config``) and its
  ``model_arch_config`` (vLLM's convertor): a real ``ModelConfig`` inspects
  the model class in a subprocess, about 20 s per architecture.
* **Spec cells** carry a ``SpeculativeConfig`` whose fields are set without
  running its validators (which build the draft checkpoint's ``ModelConfig``);
  its properties are vLLM's own.

Anything the adapter cannot do on the installed release (a module, class,
field or signature it relies on is missing, or vLLM reads something the
stand-ins lack) raises ``AdapterError`` naming the step and the version:
verdict ``error``, never the engine's refusal.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import logging
import os
import sys
import types
import warnings
from typing import Any, Callable, Iterator

from ...core.cells import Cell
from ...core.errors import AdapterError, NotServedError, UnreachableError
from ...core.models import ModelConfig
from ...core.spec import parse_spec
from ..common import quiet as _quiet
from ..common.gpu_steps import GpuStep, cuda_absent, engine_frame, kernel_library_stubs, missing_libraries
from .platforms import PLATFORM_LIBRARIES, PLATFORM_LIBRARY_STUBS, FakePlatforms

from ..common import MODEL_CONFIGS

#: CUDA-linked modules stubbed so that vLLM imports on CPU torch.
IMPORT_STUBS = ("vllm._C", "vllm._C_stable_libtorch")
#: Compiled kernels whose presence vLLM checks by importing them: stubbed, so the
#: rules answer as on a GPU host with everything compiled.
COMPILED_STUBS = (
    "vllm._flashmla_C",
    "vllm._flashmla_extension_C",
    "vllm.vllm_flash_attn._vllm_fa2_C",
    "vllm.vllm_flash_attn._vllm_fa3_C",
    "vllm.vllm_flash_attn.cute",  # FA4's cute-DSL entry point (FLASH_ATTN_MLA_SPARSE_FA4 imports it to check)
    "flashinfer",
    "tokenspeed_mla",
)
#: Feature probes of compiled libraries the sparse MLA backends ask (``module:function`` → the answer
#: of a CUDA host with everything compiled), answered while a cell starts, in every vLLM module that
#: imported them by name: DeepGEMM (the DeepSeek-V3.2 indexer's kernels), FlashInfer >= 0.6.18's
#: SM90 NoPE MLA (``ckv_scale_arr``) and its SM120 sparse MLA.
CUDA_FEATURE_ANSWERS = (
    ("vllm.utils.import_utils", "has_deep_gemm", True),
    ("vllm.utils.flashinfer", "has_flashinfer_sm90_nope_mla", True),
    ("vllm.utils.flashinfer", "has_flashinfer_sparse_mla_sm120", True),
)
#: Ops of compiled extensions whose presence vLLM checks with ``hasattr(torch.ops.NS, op)``
#: (FlashMLA's mega-attention ops, DeepSeek-V4.1): registered (schemas only, never called).
CUDA_COMPILED_OPS = {
    "_flashmla_C": ("fused_norm_rope_attn_rope_cast_decode(Tensor x) -> Tensor",
                    "permute_q_b_proj(Tensor x) -> Tensor"),
}
#: Backend value meaning "no backend forced": the platform walks its priority list.
AUTO = "auto"
#: Backend modules with import-time CUDA allocations (redirected to ``meta``).
CUDA_AT_IMPORT = ("vllm.v1.attention.backends.mla.cutlass_mla",)
#: Compiled-op questions vLLM asks when some modules load (``w8a8_utils``, imported by the model
#: runner's attention utilities; the online-FP8 ``lm_head`` the EAGLE / MTP speculators import):
#: (wrapper module, wrapper, answer while the adapter runs vLLM). They pick CUTLASS GEMM kernels;
#: no attention rule, selector or start-up check asks them.
QUERIES_AT_IMPORT = (
    ("vllm._custom_ops", "cutlass_scaled_mm_supports_block_fp8", False),
    ("vllm._custom_ops", "cutlass_scaled_mm_supports_fp8", False),
)
#: The faked CUDA platform answers SM80 while vLLM's modules load (before any cell; see
#: ``platforms.FakePlatforms``). A module that branches on it when it loads decides nothing per
#: cell; 0.33's Mamba kernels (imported by the model runner's utilities) filter Triton configs
#: for SM90 at import, which fails without a Triton GPU backend, so the imports see SM80.
#: Modules whose cached functions answer per configuration, not per device (cleared per cell).
CACHED_BY_CONFIG = (
    "vllm.v1.attention.selector",
    "vllm.v1.attention.backends.mla.prefill.selector",
    "vllm.model_executor.layers.attention.mla_attention",
    "vllm.v1.attention.backends.fa_utils",
    "vllm.platforms.cuda",
    "vllm.platforms.interface",
)
#: Spec-setting algorithm → ``SpeculativeConfig.method``.
SPEC_METHODS = {"eagle": "eagle", "eagle3": "eagle3", "mtp": "mtp", "nextn": "mtp"}
#: The layer name vLLM gives the first decoder layer's attention (``model.layers.0.self_attn.attn``).
TARGET_LAYER = "model.layers.{index}.self_attn.attn"
#: KV-cache blocks of the stand-in ``KVCacheConfig`` (only Mamba models compare against it).
NUM_BLOCKS = 4096
#: The metadata builders' device: their buffers are shapes only.
BUILDER_DEVICE = "meta"
#: ``VllmConfig.__post_init__`` steps run on the stand-in after ``verify_with_parallel_config``,
#: in its order; each entry names a method per release (the first this release has runs): the
#: scheduler's token budget with the speculative slots (it refuses a budget that leaves no token
#: to schedule), the CUDA-graph capture sizes the builders read, and the model runner's feature
#: check (0.34 ``_validate_model_runner``; 0.33 ``_validate_v2_model_runner``, the branch a GPU
#: host takes: ``use_v2_model_runner`` is true for these settings).
POST_INIT_STEPS = (("_set_max_num_scheduled_tokens",), ("_set_cudagraph_sizes",),
                   ("_validate_model_runner", "_validate_v2_model_runner"))
#: Module-level facts of the host that vLLM reads while it starts: (module, name, value on a GPU
#: host). Triton has a GPU backend there (0.33 picks its model runner by it).
HOST_FACTS = (("vllm.config.vllm", "HAS_TRITON", True),)
#: Steps of the start-up that allocate on the GPU or talk to other ranks, after every check of
#: the constructor they sit in: replaced by a recorder while a cell starts, listed in its notes.
#: ``module:name`` → what it is. A name this release lacks is left out.
#: A recorder returns ``None``: for the DCP workspaces that is vLLM's "no symmetric memory"
#: answer (it then gathers with NCCL).
GPU_STEPS = {
    "vllm.v1.attention.ops.dcp:get_direct_dcp_q_gather_workspace":
        "DCP symmetric-memory query-gather workspace not allocated (NCCL all-gather path)",
    "vllm.v1.attention.ops.dcp:get_direct_dcp_kv_gather_workspace":
        "DCP symmetric-memory KV-gather workspace not allocated (NCCL all-gather path)",
    "vllm.v1.attention.backends.flashinfer:_get_multi_ctas_kv_counter_buffer":
        "FlashInfer's trtllm-gen multi-CTA counter buffer (CUDA) not allocated",
}
#: Packages whose modules are all imported at setup, on the import-time CUDA platform (see
#: ``platforms.FakePlatforms.preload``): the attention backends, their ops and the layers.
PRELOADED_PACKAGES = ("vllm.v1.attention", "vllm.model_executor.layers.attention")
#: Config sections (``VllmConfig`` field, ``vllm.config`` class) the stand-in carries at their
#: defaults, for the platforms' own config passes (``check_and_update_config``).
DEFAULT_SECTIONS = (("device_config", "DeviceConfig"), ("profiler_config", "ProfilerConfig"),
                    ("offload_config", "OffloadConfig"))
#: ``_ModelInfo`` fields the start-up reads, as the registry answers them for decoder-only text
#: transformers (DeepSeek-V2/V3, Kimi-K2, Llama, Qwen2): see ``VLLMStartup._model_info``.
MODEL_INFO = {"is_hybrid": False}


@dataclasses.dataclass
class Startup:
    """What vLLM built for a cell, up to the first step that needs a GPU.

    The facts a kernel check of the accepted configuration needs
    (``checks``): the selected backend class, the target
    layer (its ``impl`` is the constructed impl), the stand-in vLLM config
    the layer and builders saw, the KV-cache spec, the block sizes and the KV
    dtype, the target's metadata builder (on the ``meta`` device) and the
    decode query length of a verify step.
    """

    backend_cls: type
    layer: Any
    vllm_config: Any
    kv_cache_spec: Any
    block_size: int
    kernel_block_size: int
    kv_cache_dtype: str
    builder: Any
    decode_query_len: int
    draft_layer: Any = None
    draft_builder: Any = None
    notes: tuple[str, ...] = ()

    @property
    def backend_name(self) -> str:
        return self.backend_cls.__name__


class VLLMStartup:
    """The installed vLLM imported on a faked platform (``setup``), and its start-up run per cell (``startup``).

    One per process, owned by the adapter (``adapter.VLLMEngine.vllm``); the
    kernel checks read the faked platforms (``platforms``) and the model
    views (``model_view``) from it.
    """

    def __init__(self, platform: str, version: str) -> None:
        self.platform = platform
        self.version = version
        self.stubs: list[str] = []
        self._lifetime = contextlib.ExitStack()

    # -- setup: find what this release provides --------------------------------------------
    def fail(self, step: str, message: str) -> AdapterError:
        """The adapter's own failure at ``step`` on this release (verdict ``error``, never a refusal)."""
        return AdapterError(step, message, engine="vllm", version=self.version)

    def _find(self, step: str, what: str, candidates: tuple[str, ...]) -> Any:
        """The first ``module:attr`` of ``candidates`` this release has, else ``AdapterError``."""
        tried = []
        for candidate in candidates:
            module_name, _, attr = candidate.partition(":")
            try:
                module = importlib.import_module(module_name)
            except Exception as exc:  # any failure to load what the adapter needs is the adapter's
                tried.append(f"{module_name} ({type(exc).__name__}: {exc})")
                continue
            if not attr:
                return module
            if hasattr(module, attr):
                return getattr(module, attr)
            tried.append(f"{candidate} (no attribute {attr!r})")
        raise self.fail(step, f"{what} not found; tried {'; '.join(tried)}")

    def setup(self) -> None:
        """Stub what this host lacks, fake the platform, import vLLM; ``AdapterError`` naming what is missing."""
        from ..common.import_stubs import install_stubs

        import torch

        # A ROCm, CPU or XPU process answers "not compiled" for CUDA's compiled kernels, as that
        # build of vLLM would. In the CUDA process, without CUDA the compiled extensions cannot load
        # against this torch: stub them all; with CUDA, those that load are left real (the kernel
        # checks call them: level "backend").
        if self.platform == "cuda":
            self.stubs = install_stubs(IMPORT_STUBS + COMPILED_STUBS, force=not torch.cuda.is_available())
        else:
            self.stubs = install_stubs(IMPORT_STUBS, force=True)
        libraries = missing_libraries(PLATFORM_LIBRARY_STUBS.get(self.platform, ()))
        if libraries:  # for the life of this process (a child for that platform)
            self._lifetime.enter_context(kernel_library_stubs(libraries))
            self.stubs += libraries
        logging.getLogger("vllm").setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._setup_platform()
            with _cuda_allocations_on_meta():
                for module in CUDA_AT_IMPORT if self.platform == "cuda" else ():
                    self._find("import", "CUTLASS MLA backend module", (module,))
            with self._import_time_answers():
                self._setup_imports()
                self._op_libraries: list[Any] = []
                if self.platform == "cuda":
                    self._register_compiled_ops()
                with _cuda_allocations_on_meta():
                    self._preload_failures = self.platforms.preload(PRELOADED_PACKAGES)

    @contextlib.contextmanager
    def _feature_answers(self) -> Iterator[None]:
        """``CUDA_FEATURE_ANSWERS`` for the duration, wherever vLLM bound those functions (CUDA process only)."""
        if self.platform != "cuda":
            yield
            return
        saved = []
        for module, key, real, answer in self._feature_bindings():
            saved.append((module, key, real))
            setattr(module, key, functools.partial(_answer, answer))
        try:
            yield
        finally:
            for module, key, value in saved:
                setattr(module, key, value)

    def _feature_bindings(self) -> list[tuple[Any, str, Any, Any]]:
        """``(module, name, function, answer)`` for every vLLM module bound to a ``CUDA_FEATURE_ANSWERS`` function
        (found again only when modules were imported since)."""
        if getattr(self, "_bindings_at", None) == len(sys.modules):
            return self._bindings
        bindings = []
        for module_name, name, answer in CUDA_FEATURE_ANSWERS:
            real = getattr(sys.modules.get(module_name), name, None)
            if real is None:  # this release does not ask it
                continue
            for module in [m for n, m in list(sys.modules.items()) if m is not None and n.startswith("vllm")]:
                for key, value in list(vars(module).items()):
                    if value is real:
                        bindings.append((module, key, real, answer))
        self._bindings, self._bindings_at = bindings, len(sys.modules)
        return bindings

    def _register_compiled_ops(self) -> None:
        """``CUDA_COMPILED_OPS`` become ops torch knows (schemas only), as a full build registers them."""
        for namespace, schemas in CUDA_COMPILED_OPS.items():
            missing = [sch for sch in schemas if not hasattr(getattr(self._torch.ops, namespace), sch.split("(", 1)[0])]
            if missing:
                library = self._torch.library.Library(namespace, "FRAGMENT")
                self._op_libraries.append(library)  # kept alive: dropping it unregisters the schemas
                for schema in missing:
                    library.define(schema)

    @contextlib.contextmanager
    def _import_time_answers(self) -> Iterator[None]:
        """``QUERIES_AT_IMPORT`` answered for the duration."""
        with contextlib.ExitStack() as stack:
            for owner, name, answer in QUERIES_AT_IMPORT:
                stack.enter_context(_answering(self._find("import", owner, (owner,)), name, answer))
            yield

    def _setup_platform(self) -> None:
        platforms = self._find("platform", "vllm.platforms", ("vllm.platforms",))
        capability = self._find("platform", "DeviceCapability", ("vllm.platforms.interface:DeviceCapability",))
        # before anything binds current_platform:
        self.platforms = FakePlatforms(platforms, capability, self.fail, self._find, self.platform)
        self._platform = self.platforms.instance
        self._platform_cls = self.platforms.cls
        self._capability = capability

    def _setup_imports(self) -> None:
        find = self._find
        import torch

        self._torch = torch
        self._package_dir = os.path.dirname(os.path.abspath(self._find("import", "vllm", ("vllm",)).__file__))
        config = "vllm.config"
        self._config_classes = {
            name: find("import", f"vllm.config.{name}", (f"{config}:{name}",))
            for name in ("ModelConfig", "ParallelConfig", "CacheConfig", "AttentionConfig", "SchedulerConfig",
                         "CompilationConfig", "KernelConfig", "SpeculativeConfig", "VllmConfig")
        }
        # Sections the platforms' own config passes read (CPU: profiler, device; XPU/CUDA: offload);
        # defaults, as for a server started without those flags. A release without one leaves it unset.
        config_module = importlib.import_module(config)
        self._default_sections = {section: getattr(config_module, cls_name) for section, cls_name in DEFAULT_SECTIONS
                                  if hasattr(config_module, cls_name)}
        self._set_config = find("import", "set_current_vllm_config", (f"{config}:set_current_vllm_config",))
        self.enum = find("import", "the attention backend enum",
                          ("vllm.v1.attention.backends.registry:AttentionBackendEnum",
                           "vllm.attention.backends.registry:AttentionBackendEnum"))
        find("import", "the attention selector module", ("vllm.v1.attention.selector",))
        self._cache_owners = [importlib.import_module(m) for m in CACHED_BY_CONFIG
                              if importlib.util.find_spec(m) is not None]
        self._mla_layer = find("import", "the MLA attention layer",
                               ("vllm.model_executor.layers.attention.mla_attention:MLAAttention",
                                "vllm.model_executor.layers.attention:MLAAttention",
                                "vllm.attention.layer:MLAAttention"))
        self._attention_layer = find("import", "the attention layer",
                                     ("vllm.model_executor.layers.attention.attention:Attention",
                                      "vllm.model_executor.layers.attention:Attention",
                                      "vllm.attention.layer:Attention"))
        self._get_kv_cache_spec = find("import", "get_kv_cache_spec",
                                       ("vllm.v1.worker.gpu.attn_utils:get_kv_cache_spec",))
        self._init_attn_backend = find("import", "init_attn_backend",
                                       ("vllm.v1.worker.gpu.attn_utils:init_attn_backend",))
        self._get_kv_cache_groups = find("import", "get_kv_cache_groups",
                                         ("vllm.v1.core.kv_cache_planning:get_kv_cache_groups",
                                          "vllm.v1.core.kv_cache_utils:get_kv_cache_groups"))
        self._kv_cache_config_cls = find("import", "KVCacheConfig", ("vllm.v1.kv_cache_interface:KVCacheConfig",))
        self._check_cp = find("import", "check_attention_cp_compatibility",
                              ("vllm.v1.worker.cp_utils:check_attention_cp_compatibility",))
        self._draft_speculator = find("import", "DraftModelSpeculator",
                                      ("vllm.v1.worker.gpu.spec_decode.speculator:DraftModelSpeculator",))
        self._init_speculator = find("import", "init_speculator",
                                     ("vllm.v1.worker.gpu.spec_decode:init_speculator",))
        self._get_hf_config = find("import", "vLLM's Hugging Face config loader",
                                   ("vllm.transformers_utils.config:get_config",))
        workspace = importlib.util.find_spec("vllm.v1.worker.workspace")
        self._init_workspace = getattr(importlib.import_module("vllm.v1.worker.workspace"), "init_workspace_manager",
                                       None) if workspace is not None else None
        self._parallel_state = find("import", "vllm.distributed.parallel_state",
                                    ("vllm.distributed.parallel_state",))
        if not hasattr(self._parallel_state, "_DCP"):
            raise self.fail("import", "vllm.distributed.parallel_state has no _DCP group")
        self._require_signature("import", self._check_cp, ("vllm_config", "target_layer_names"))
        self._require_signature("import", self._init_attn_backend,
                                ("kv_cache_config", "vllm_config", "device", "active_layer_names",
                                 "draft_layer_names"))
        model_config_cls = self._config_classes["ModelConfig"]
        for method in ("verify_with_parallel_config", "get_model_arch_config", "get_head_size"):
            if not callable(getattr(model_config_cls, method, None)):
                raise self.fail("import", f"vllm.config.ModelConfig has no {method}()")
        self._post_init_steps = []
        for names in POST_INIT_STEPS:
            present = [n for n in names if callable(getattr(self._config_classes["VllmConfig"], n, None))]
            if not present:
                raise self.fail("import", f"vllm.config.VllmConfig has none of {', '.join(names)}()")
            self._post_init_steps.append(present[0])
        self._compilation_defaults = self._find_compilation_defaults()
        self._gpu_steps = self._find_gpu_steps()
        self._model_view_cls = type("ModelConfigView", (_ModelConfigView,), {"vllm_cls": model_config_cls})
        self._config_view_cls = type("VllmConfigView", (StandInConfig,),
                                     {"vllm_cls": self._config_classes["VllmConfig"]})
        self._model_views: dict[str, Any] = {}

    def _find_compilation_defaults(self) -> dict[str, Any]:
        """What ``VllmConfig`` resolves for the compilation config of a default (-O2) server.

        The compilation mode (``VLLM_COMPILE`` above -O0) and the optimization
        level's ``cudagraph_mode``, read from vLLM's ``OPTIMIZATION_LEVEL_TO_CONFIG``
        at ``VllmConfig``'s default ``optimization_level``; custom ops ``none``
        (what ``VllmConfig`` appends for inductor + ``VLLM_COMPILE``).
        """
        vllm_module = self._find("import", "vllm.config.vllm", ("vllm.config.vllm",))
        levels = getattr(vllm_module, "OPTIMIZATION_LEVEL_TO_CONFIG", None)
        level = _field_default_of(self._config_classes["VllmConfig"], "optimization_level")
        mode = self._find("import", "CompilationMode", ("vllm.config.compilation:CompilationMode",))
        if levels is None or level is _NO_MEMBER or level not in levels:
            raise self.fail("import", "vllm.config.vllm has no OPTIMIZATION_LEVEL_TO_CONFIG for the default "
                                       "optimization_level")
        cudagraph_mode = levels[level].get("compilation_config", {}).get("cudagraph_mode")
        if cudagraph_mode is None:
            raise self.fail("import", f"optimization level {level!r} sets no cudagraph_mode")
        return {"mode": mode.VLLM_COMPILE, "cudagraph_mode": cudagraph_mode, "custom_ops": ["none"]}

    def _find_gpu_steps(self) -> list[tuple[Any, str, str]]:
        steps = []
        for target, what in GPU_STEPS.items():
            module_name, _, name = target.partition(":")
            try:
                module = importlib.import_module(module_name)
            except ImportError:  # this release has no such module: it runs no such step
                continue
            if hasattr(module, name):
                steps.append((module, name, what))
        return steps

    @contextlib.contextmanager
    def _gpu_steps_recorded(self, reached: list[str]) -> Iterator[None]:
        """Each ``GPU_STEPS`` entry is a recorder for the duration; ``reached`` names those called."""
        saved = [(module, name, getattr(module, name)) for module, name, _ in self._gpu_steps]
        for module, name, what in self._gpu_steps:
            setattr(module, name, _GpuStepRecorder(what, reached))
        try:
            yield
        finally:
            for module, name, real in saved:
                setattr(module, name, real)

    def _require_signature(self, step: str, function: Callable[..., Any], names: tuple[str, ...]) -> None:
        parameters = inspect.signature(function).parameters
        missing = [n for n in names if n not in parameters]
        if missing:
            raise self.fail(step, f"{function.__module__}.{function.__qualname__} takes no {', '.join(missing)} "
                                   f"(parameters: {', '.join(parameters)})")


    def startup(self, cell: Cell, model: ModelConfig) -> Startup:
        """vLLM's start-up for the cell, in its order; raises the engine's own error to refuse."""
        spec = parse_spec(cell.spec)
        if spec.enabled and spec.topk > 1:
            raise self.fail("spec", f"{cell.spec!r}: vLLM's SpeculativeConfig has no draft tree (topk); "
                                     "only chains (eagle-1xK, mtp-K) can be configured")
        with self.platforms.on(cell.arch), _environ_restored():
            return self._startup(cell, model, spec)

    def _startup(self, cell: Cell, model: ModelConfig, spec: Any) -> Startup:
        tp = cell.tp if cell.tp is not None else max(cell.dcp, 1)
        with _quiet.quiet(), self._stand_ins_report("config"):
            parallel = self._parallel_config(tp, cell.dcp)
            model_config = self.model_view(model)
            vllm_config = self._vllm_config(cell, model_config, parallel,
                                            num_speculative_tokens=spec.steps if spec.enabled else None,
                                            method=SPEC_METHODS[spec.algorithm] if spec.enabled else None)
        reached: list[str] = []
        with _quiet.quiet(), self._stand_in_group("_DCP", cell.dcp), self._stand_in_group("_TP", tp), self._gpu_steps_recorded(reached), \
                self._import_time_answers(), _host_facts(), self._feature_answers(), _device_answers(), \
                self._set_config(vllm_config):
            # 1. VllmConfig.__post_init__, before any layer (or backend) exists.
            with self._stand_ins_report("config layer"):
                model_config.verify_with_parallel_config(parallel)
                self._platform_step("apply_config_platform_defaults", vllm_config)
                for step in self._post_init_steps:  # later in VllmConfig.__post_init__, in this order
                    if step.startswith("_validate"):  # the platform's own pass comes just before
                        self._platform_step("check_and_update_config", vllm_config)
                    if step != "_set_cudagraph_sizes" or self._platform.support_static_graph_mode():
                        getattr(vllm_config, step)()
            # 2. Worker.init_device: the model dtype on this GPU (the GPU and XPU workers; the CPU
            #    worker's init_device has no such check).
            with self._stand_ins_report("worker"):
                if not self._platform.is_cpu():
                    self._platform.check_if_supports_dtype(model_config.dtype)
                    #  then its workspace manager (reservations on `meta`: shapes only); the CPU worker has none.
                    if self._init_workspace is not None:
                        self._init_workspace(self._torch.device(BUILDER_DEVICE), 1)
            #    GPUModelRunner.__init__: the speculator of the configured method.
            if spec.enabled:
                with self._stand_ins_report("speculator"):
                    self._init_speculator(vllm_config, self._torch.device(BUILDER_DEVICE),
                                                       req_states=None)
            # 3. Worker.load_model: the target's attention layer, then the drafter's.
            with self._stand_ins_report("attention layer"), self._default_dtype(model_config.dtype):
                self._clear_config_caches()
                num_layers = model_config.get_total_num_hidden_layers()
                layer = self._build_layer(model, model_config, parallel, vllm_config, TARGET_LAYER.format(index=0))
                draft_layer = None
                if spec.enabled:  # the draft model's first layer follows the target's layers
                    draft_layer = self._build_layer(model, model_config, parallel, vllm_config,
                                                    TARGET_LAYER.format(index=num_layers))
                    draft_layer.is_draft_layer = True  # as DraftModelSpeculator.load_model marks it
            # 4. The executor, after loading: a block size every backend takes.
            with self._stand_ins_report("block size"):
                self._platform.update_block_size_for_backend(vllm_config)
            # 5. GPUModelRunner.initialize_kv_cache.
            with self._stand_ins_report("metadata builders"):
                startup = self._initialize_kv_cache(vllm_config, layer, draft_layer, spec.steps if spec.enabled else 0)
        startup.notes = (*startup.notes, *dict.fromkeys(reached))
        return startup

    def _platform_step(self, name: str, vllm_config: Any) -> None:
        """``current_platform.<name>(vllm_config)`` where this release has it (``VllmConfig.__post_init__``
        calls both: the platform's defaults after the parallel check, its own config pass before the model
        runner's feature check). The CPU platform forces an MLA model's block size there, for one."""
        method = getattr(self._platform, name, None)
        if method is not None:
            method(vllm_config)

    def _initialize_kv_cache(self, vllm_config: Any, layer: Any, draft_layer: Any, num_spec: int) -> Startup:
        kv_cache_spec = self._get_kv_cache_spec(vllm_config)
        groups = self._get_kv_cache_groups(vllm_config, kv_cache_spec)
        kv_cache_config = self._kv_cache_config_cls(num_blocks=NUM_BLOCKS, kv_cache_tensors=[],
                                                     kv_cache_groups=groups)
        draft_names = {draft_layer.layer_name} if draft_layer is not None else None
        target_names = set(kv_cache_spec) - (draft_names or set())
        device = self._torch.device(BUILDER_DEVICE)
        attn_groups, cg_support, kernel_block_sizes = self._init_attn_backend(
            kv_cache_config, vllm_config, device, draft_layer_names=draft_names)
        notes = self._resolve_cudagraphs(vllm_config, cg_support, 1 + num_spec, kv_cache_config)
        self._check_cp(vllm_config, target_names if draft_names else None)
        draft_builder = None
        if draft_layer is not None:  # DraftModelSpeculator.set_attn
            speculator = types.SimpleNamespace(vllm_config=vllm_config,
                                               speculative_config=vllm_config.speculative_config)
            attn_vllm_config = self._draft_speculator.attn_vllm_config.fget(speculator)
            draft_groups, _, _ = self._init_attn_backend(kv_cache_config, attn_vllm_config, device,
                                                         active_layer_names=draft_names)
            draft_builder = _builder_of(draft_groups, draft_layer.layer_name)
        group_index = next(i for i, g in enumerate(groups) if layer.layer_name in g.layer_names)
        return Startup(
            backend_cls=layer.attn_backend, layer=layer, vllm_config=vllm_config,
            kv_cache_spec=kv_cache_spec[layer.layer_name], block_size=vllm_config.cache_config.block_size,
            kernel_block_size=kernel_block_sizes[group_index], kv_cache_dtype=layer.kv_cache_dtype,
            builder=_builder_of(attn_groups, layer.layer_name), decode_query_len=1 + num_spec,
            draft_layer=draft_layer, draft_builder=draft_builder, notes=tuple(notes))

    def _resolve_cudagraphs(self, vllm_config: Any, cg_support: Any, decode_query_len: int,
                            kv_cache_config: Any) -> list[str]:
        """``CompilationConfig.resolve_cudagraph_mode_and_sizes`` as the model runner calls it.

        It raises for a backend without CUDA-graph support and otherwise may
        lower the mode (e.g. spec decode on a backend whose graphs take one
        query token only); a lowered mode is a note.
        """
        compilation = vllm_config.compilation_config
        requested = compilation.cudagraph_mode
        resolve = compilation.resolve_cudagraph_mode_and_sizes
        options = dict(kv_cache_config=kv_cache_config, max_num_reqs=vllm_config.scheduler_config.max_num_seqs,
                       is_profiling=False, piecewise_capture_available=True)
        if "use_v2_model_runner" in inspect.signature(resolve).parameters:
            options["use_v2_model_runner"] = True  # 0.33: the V2 runner passes it (no V1 size rounding)
        resolved = resolve(cg_support.min_cg_support, cg_support.min_cg_attn_backend, decode_query_len, **options)
        if resolved == requested:
            return []
        return [f"cudagraph_mode {requested.name} lowered to {resolved.name}: {cg_support.min_cg_attn_backend} "
                f"supports {cg_support.min_cg_support.name} (decode query length {decode_query_len})"]

    def _build_layer(self, model: ModelConfig, model_config: Any, parallel: Any, vllm_config: Any,
                     prefix: str) -> Any:
        """The model's attention layer as the model code builds it (per-rank heads)."""
        tp = parallel.tensor_parallel_size
        hf = model_config.hf_text_config
        cache_config = vllm_config.cache_config
        if model_config.use_mla:
            kv_b_proj = self._torch.nn.Linear(1, 1, bias=False)  # read for its device only
            qk_head_dim = hf.qk_nope_head_dim + hf.qk_rope_head_dim
            sparse = self._sparse_parts(hf, vllm_config, prefix) if getattr(hf, "index_topk", None) else {}
            return self._mla_layer(
                num_heads=hf.num_attention_heads // tp, scale=qk_head_dim ** -0.5,
                qk_nope_head_dim=hf.qk_nope_head_dim, qk_rope_head_dim=hf.qk_rope_head_dim,
                v_head_dim=hf.v_head_dim, q_lora_rank=getattr(hf, "q_lora_rank", None),
                kv_lora_rank=hf.kv_lora_rank, kv_b_proj=kv_b_proj, cache_config=cache_config,
                quant_config=None, prefix=prefix, **sparse)
        head_size = model_config.get_head_size()
        return self._attention_layer(
            num_heads=hf.num_attention_heads // tp, head_size=head_size, scale=head_size ** -0.5,
            num_kv_heads=max(1, model_config.get_total_num_kv_heads() // tp), cache_config=cache_config,
            quant_config=None, prefix=prefix)

    def _sparse_parts(self, hf: Any, vllm_config: Any, prefix: str) -> dict[str, Any]:
        """What DeepSeek-V3.2's attention hands its ``MLAAttention`` (``deepseek_v2.DeepseekV2MLAAttention``).

        A sparse (DSA) model's layer gets ``use_sparse=True``, the lightning
        indexer (vLLM's ``Indexer``, built as the model builds it, with its own
        KV-cache layer ``DeepseekV32IndexerCache``), the model's top-k index
        buffer (``max_num_batched_tokens x index_topk``, on ``meta``: a shape)
        and the index-group builder over it.
        """
        model = self._find("attention layer", "vLLM's DeepSeek-V2/V3.2 model code",
                           ("vllm.model_executor.models.deepseek_v2",))
        indexer_cls = getattr(model, "Indexer", None)
        if indexer_cls is None:
            raise self.fail("attention layer", "vllm.model_executor.models.deepseek_v2 has no Indexer")
        torch = self._torch
        with torch.device(BUILDER_DEVICE):  # weights and buffers as shapes
            buffer = torch.empty(vllm_config.scheduler_config.max_num_batched_tokens, hf.index_topk,
                                 dtype=torch.int32)
            indexer = indexer_cls(vllm_config, hf, hf.hidden_size, hf.q_lora_rank, None, vllm_config.cache_config,
                                  buffer, prefix.rsplit(".", 1)[0] + ".indexer")
        parts: dict[str, Any] = dict(use_sparse=True, indexer=indexer, topk_indices_buffer=buffer)
        builder_cls = getattr(model, "SparseMLAIndexGroupBuilder", None)
        max_rows = getattr(model, "get_sparse_mla_index_group_max_rows", None)
        if builder_cls is not None and max_rows is not None:
            parts["index_group_builder"] = builder_cls(buffer, max_rows(vllm_config))
        return parts

    # -- stand-ins --------------------------------------------------------------------------
    def _vllm_config(self, cell: Cell, model_config: Any, parallel: Any, *,
                     num_speculative_tokens: int | None, method: str | None) -> Any:
        c = self._config_classes
        backend = None if cell.backend == AUTO else cell.backend
        compilation = c["CompilationConfig"](**self._compilation_defaults)  # fresh: layers register in it
        compilation.set_splitting_ops_for_v1(all2all_backend=parallel.all2all_backend,
                                             data_parallel_size=parallel.data_parallel_size)
        sections: dict[str, Any] = dict(
            model_config=model_config,
            parallel_config=parallel,
            cache_config=c["CacheConfig"](block_size=cell.page_size, cache_dtype=cell.kv_dtype or "auto"),
            attention_config=self._attention_config(backend, model_config),
            scheduler_config=c["SchedulerConfig"](max_model_len=model_config.max_model_len,
                                                  is_encoder_decoder=False),
            compilation_config=compilation,
            kernel_config=c["KernelConfig"](),
            speculative_config=None,
            **{section: cls() for section, cls in self._default_sections.items()},
        )
        if num_speculative_tokens is not None:
            sections["speculative_config"] = self._speculative_config(
                model_config, parallel, num_speculative_tokens, method)
        return self._config_view_cls(**sections)

    def _attention_config(self, backend: Any, model_config: Any) -> Any:
        """``AttentionConfig(backend=B)``, with what ``VllmConfig.__post_init__`` resolves in it.

        ``sparse_mla_prefill_workspace_factor`` (0.34): unset, it becomes 5 for a
        ``max_model_len`` up to 256 Ki tokens, else 2 (vllm/config/vllm.py); the
        sparse indexer sizes its prefill buffer by it.
        """
        config = self._config_classes["AttentionConfig"](backend=backend)
        if getattr(config, "sparse_mla_prefill_workspace_factor", 0) is None:
            config.sparse_mla_prefill_workspace_factor = 5 if model_config.max_model_len <= 256 * 1024 else 2
        return config

    def _speculative_config(self, model_config: Any, parallel: Any, num_speculative_tokens: int,
                            method: str | None) -> Any:
        """A ``SpeculativeConfig`` with the fields a validated one would have, its validators not run."""
        cls = self._config_classes["SpeculativeConfig"]
        spec = cls.__new__(cls)
        names = {f.name for f in dataclasses.fields(cls)}
        for f in dataclasses.fields(cls):
            value = _field_default(f)
            if value is not _NO_MEMBER:
                object.__setattr__(spec, f.name, value)
        required = dict(method=method, num_speculative_tokens=num_speculative_tokens,
                        target_model_config=model_config, draft_model_config=model_config,
                        target_parallel_config=parallel, draft_parallel_config=parallel)
        # What SpeculatorConfig.configure resolves for a draft with the target's parallelism
        # (fields of the releases that have them: 0.33 has no draft DCP size).
        resolved = dict(draft_tensor_parallel_size=parallel.tensor_parallel_size,
                        draft_decode_context_parallel_size=parallel.decode_context_parallel_size)
        for name, value in required.items():
            if name not in names:
                raise self.fail("config", f"SpeculativeConfig has no field {name!r}")
            object.__setattr__(spec, name, value)
        for name, value in resolved.items():
            if name in names:
                object.__setattr__(spec, name, value)
        return spec

    def _parallel_config(self, tp: int, dcp: int) -> Any:
        """vLLM's own ``ParallelConfig``, fresh per cell (its validators run; the node has ``GPUS_PER_NODE`` GPUs)."""
        return self._config_classes["ParallelConfig"](tensor_parallel_size=tp, decode_context_parallel_size=dcp)

    def model_view(self, model: ModelConfig) -> Any:
        """The model's ``ModelConfig`` as vLLM's code reads it (see ``_ModelConfigView``)."""
        if model.name not in self._model_views:
            hf_config = self._hf_config(model)
            view = self._model_view_cls(hf_config, self._torch.bfloat16, self._model_info(hf_config))
            if view.use_mla != model.mla and model.mla:  # vLLM's own model code serves it otherwise
                self._model_views[model.name] = NotServedError(
                    model.name, f"vLLM's ModelConfig.use_mla is False for its {hf_config.model_type!r} config "
                                f"({hf_config.architectures[0]}): vLLM serves it with standard attention, so no MLA "
                                "backend sees it (config/model.py, is_deepseek_mla)", engine="vllm", version=self.version)
            elif view.use_mla != model.mla:
                raise self.fail("config", f"model {model.name!r}: the catalogue says mla={model.mla}, "
                                           f"vLLM's ModelConfig.use_mla says {view.use_mla}")
            else:
                self._model_views[model.name] = view
        view = self._model_views[model.name]
        if isinstance(view, NotServedError):  # a fresh one per cell: a raised exception keeps its traceback
            raise NotServedError(view.model, view.reason, engine="vllm", version=self.version)
        return copy.copy(view)  # what vLLM sets on it stays with the cell

    def _hf_config(self, model: ModelConfig) -> Any:
        """The shipped ``config.json`` through vLLM's loader; a ``[models]`` entry gets one from its fields.

        A matrix-only model becomes a DeepSeek-V3 config (MLA) or a Llama config
        (otherwise) with the entry's attention fields, the names Hugging Face uses.
        """
        path = MODEL_CONFIGS / model.name / "config.json"
        if path.is_file():
            return self._get_hf_config(str(path.parent), trust_remote_code=False)
        import transformers

        if model.mla:
            return transformers.DeepseekV3Config(
                num_attention_heads=model.num_heads, num_key_value_heads=model.num_heads,
                kv_lora_rank=model.kv_lora_rank, qk_rope_head_dim=model.qk_rope_head_dim,
                qk_nope_head_dim=model.qk_nope_head_dim, v_head_dim=model.v_head_dim,
                architectures=["DeepseekV3ForCausalLM"], num_nextn_predict_layers=1)
        return transformers.LlamaConfig(
            num_attention_heads=model.num_heads, num_key_value_heads=model.num_kv_heads,
            head_dim=model.head_dim, hidden_size=model.num_heads * model.head_dim,
            architectures=["LlamaForCausalLM"])

    def _model_info(self, hf_config: Any) -> Any:
        """The registry's answer for the architecture, as far as the start-up reads it.

        vLLM's ``_ModelInfo`` comes from importing the model class in a
        subprocess. The start-up reads ``architecture`` (the registered class
        name, from vLLM's registry table) and the ``MODEL_INFO`` fields, whose
        values are those of every model here (decoder-only text transformers:
        no Mamba layers, no multimodal inputs). Any other field raises
        ``_StandInMissing``.
        """
        arch = hf_config.architectures[0]
        registry = self._find("config", "vLLM's model registry",
                              ("vllm.model_executor.models.registry:ModelRegistry",))
        registered = registry.models.get(arch)
        if registered is None:
            raise self.fail("config", f"vLLM's registry has no architecture {arch!r}")
        return _ModelInfoView(architecture=getattr(registered, "class_name", arch), **MODEL_INFO)

    @contextlib.contextmanager
    def _stand_ins_report(self, step: str) -> Iterator[None]:
        """vLLM reading something the stand-ins lack is the adapter's failure, not a refusal.

        vLLM importing a library that exists only for another platform
        (``PLATFORM_LIBRARIES``: AMD's ``aiter``, ...) ends the start-up there:
        ``UnreachableError`` naming the import and the vLLM code that made it.
        """
        try:
            yield
        except _StandInMissing as exc:
            raise self.fail(step, str(exc)) from exc
        except ModuleNotFoundError as exc:
            library = (exc.name or "").split(".", 1)[0]
            if library not in PLATFORM_LIBRARIES:
                raise
            raise self._unreachable(step, exc, f"imports {exc.name!r}", library) from exc
        except (AssertionError, RuntimeError) as exc:
            if not cuda_absent(exc):
                raise
            # the host's torch saying it has no GPU: a device query the adapter does not answer, never a refusal
            raise self.fail(step, f"vLLM asked this host's torch for a GPU: {type(exc).__name__}: {exc}") from exc
        except GpuStep as exc:  # a name of a stubbed platform library was used
            library = exc.what.split("(", 1)[0].split(".", 1)[0]
            if library not in PLATFORM_LIBRARIES:
                raise self.fail(step, f"a GPU step escaped: {exc.what}") from exc
            raise self._unreachable(step, exc, f"uses {exc.what.split(' (kernel library', 1)[0]}", library) from exc

    def _unreachable(self, step: str, exc: BaseException, what: str, library: str) -> UnreachableError:
        where = engine_frame(exc.__traceback__, self._package_dir)
        at = f"{where[0]} ({where[1]})" if where else "vLLM"
        return UnreachableError(step, f"{at} {what} ({PLATFORM_LIBRARIES[library]}), which does not exist for "
                                      "this host: vLLM's checks after that point did not run",
                                engine="vllm", version=self.version)

    @contextlib.contextmanager
    def _stand_in_group(self, name: str, size: int) -> Iterator[None]:
        """``parallel_state.<name>`` (``_DCP``, ``_TP``) is a group of ``size``, rank 0, no process group.

        The model code's linear layers (a sparse model's indexer) and the attention
        layer read their rank and the group's size from it when they are built.
        """
        state = self._parallel_state
        saved = getattr(state, name, None)
        setattr(state, name, types.SimpleNamespace(world_size=size, rank_in_group=0, device_group=None))
        try:
            yield
        finally:
            setattr(state, name, saved)

    @contextlib.contextmanager
    def _default_dtype(self, dtype: Any) -> Iterator[None]:
        """Model construction runs with the model dtype as torch's default (vLLM's ``set_default_torch_dtype``)."""
        saved = self._torch.get_default_dtype()
        self._torch.set_default_dtype(dtype)
        try:
            yield
        finally:
            self._torch.set_default_dtype(saved)

    def _clear_config_caches(self) -> None:
        """Empty the caches vLLM keys by config alone: the device capability changes per cell here.

        On a GPU host the capability never changes, so the attention selector
        (``_cached_get_attn_backend``), the MLA prefill selector
        (``_auto_select_mla_prefill_backend``) and the platform's cached
        classmethods may key by configuration alone; every cached function of
        ``CACHED_BY_CONFIG`` and of the platform classes is cleared per cell.
        """
        namespaces = [vars(m) for m in self._cache_owners] + [vars(k) for k in self._platform_cls.__mro__]
        for namespace in namespaces:
            for value in namespace.values():
                function = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
                if isinstance(function, functools._lru_cache_wrapper):
                    function.cache_clear()


class _GpuStepRecorder:
    """Stands for a ``GPU_STEPS`` callable: records that the start-up reached it, builds nothing."""

    def __init__(self, what: str, reached: list[str]) -> None:
        self.what = what
        self.reached = reached

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.reached.append(self.what)
        return None


class _StandInMissing(AttributeError):
    """vLLM read a field the adapter's stand-in does not carry."""


class StandInConfig:
    """A ``VllmConfig``'s sections (given as keywords) with ``VllmConfig``'s own properties and methods.

    A section not given is ``None`` (as an unset optional section of a real
    ``VllmConfig``); ``vllm_cls`` is set on the subclass the adapter builds.
    """

    vllm_cls: type = object

    def __init__(self, **sections: Any) -> None:
        self.__dict__.update(sections)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        member = _vllm_member(self, name)
        if member is not _NO_MEMBER:
            return member
        default = _field_default_of(type(self).vllm_cls, name) if dataclasses.is_dataclass(type(self).vllm_cls) \
            else _NO_MEMBER
        return None if default is _NO_MEMBER or name.endswith("_config") else default


class _ModelConfigView:
    """``vllm.config.ModelConfig`` without its constructor: its methods and properties over the model's configs.

    A real ``ModelConfig`` inspects the model class in a subprocess (importing
    the model's modules, about 20 s per architecture). The view carries what
    that constructor would set for a bf16 model served with defaults: the
    Hugging Face config (``hf_config``, ``hf_text_config``), the
    ``model_arch_config`` vLLM's own ``get_model_arch_config`` derives from
    it, ``dtype`` and ``max_model_len``; every other member is
    ``ModelConfig``'s (``use_mla``, ``get_head_size``,
    ``verify_with_parallel_config``, ...). A plain field it lacks raises
    ``_StandInMissing`` (the adapter's failure).
    """

    vllm_cls: type = object
    multimodal_config = None
    quantization = None
    pooler_config = None
    enforce_eager = False
    trust_remote_code = False
    model_impl = "auto"
    hf_overrides: dict[str, Any] = {}
    runner_type = "generate"
    convert_type = "none"
    logits_processors = None
    enable_prompt_embeds = False
    disable_cascade_attn = False
    use_fp64_gumbel = False

    def __init__(self, hf_config: Any, dtype: Any, model_info: Any) -> None:
        self.hf_config = self.hf_text_config = hf_config
        self.dtype = dtype
        self.model = getattr(hf_config, "name_or_path", "") or ""
        self._model_info = model_info
        self._architecture = model_info.architecture
        self.model_arch_config = self.get_model_arch_config()
        self.max_model_len = int(self.model_arch_config.derived_max_model_len_and_key[0])

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        member = _vllm_member(self, name)
        if member is not _NO_MEMBER:
            return member
        default = _field_default_of(type(self).vllm_cls, name)
        if default is not _NO_MEMBER:
            return default
        raise _StandInMissing(f"vLLM read ModelConfig.{name}, which the adapter's model-config view does not carry")


class _ModelInfoView:
    """The fields of the registry's ``_ModelInfo`` the start-up reads; any other raises ``_StandInMissing``."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise _StandInMissing(f"vLLM read _ModelInfo.{name}, which the adapter does not carry")


def _vllm_member(owner: Any, name: str) -> Any:
    """``owner``'s stand-in for ``vllm_cls.name``: a property's value, a bound method, else ``_NO_MEMBER``."""
    cls = type(owner).vllm_cls
    for klass in cls.__mro__:
        if name in klass.__dict__:
            member = klass.__dict__[name]
            if isinstance(member, property):
                return member.fget(owner)
            if isinstance(member, functools.cached_property):
                value = owner.__dict__[name] = member.func(owner)
                return value
            if isinstance(member, (classmethod, staticmethod)):
                return member.__get__(owner, cls)
            if inspect.isfunction(member):
                return member.__get__(owner)
            return _NO_MEMBER
    return _NO_MEMBER


#: ``_vllm_member``'s answer for a name that is no property or method of the vLLM class.
_NO_MEMBER = object()


def _field_default_of(cls: type, name: str) -> Any:
    for f in dataclasses.fields(cls):
        if f.name == name:
            return _field_default(f)
    return _NO_MEMBER


def _field_default(f: dataclasses.Field) -> Any:
    """A (pydantic) dataclass field's default, or ``_NO_MEMBER`` when it has none."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    value = f.default
    if value is dataclasses.MISSING:
        return _NO_MEMBER
    if type(value).__name__ == "FieldInfo":  # pydantic's Field(default=..., ...)
        if value.default_factory is not None:
            return value.default_factory()
        return _NO_MEMBER if type(value.default).__name__ == "PydanticUndefinedType" else value.default
    return value


def _builder_of(attn_groups: list[list[Any]], layer_name: str) -> Any:
    for groups in attn_groups:
        for group in groups:
            if layer_name in group.layer_names:
                return group.get_metadata_builder(0)
    return None


@contextlib.contextmanager
def _environ_restored() -> Iterator[None]:
    """The process environment as it was (the CPU platform's config pass sets LD_PRELOAD, thread counts, ...)."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        if dict(os.environ) != saved:
            os.environ.clear()
            os.environ.update(saved)


def _answer(value: Any, *args: Any, **kwargs: Any) -> Any:
    return value


@contextlib.contextmanager
def _device_answers() -> Iterator[None]:
    """What a GPU host's torch answers while the constructors run, where this host's cannot.

    The sparse MLA impls ask for the current device's index (to size their
    split counts) and empty the allocator's cache when their workspace grows,
    and their metadata builders allocate pinned host buffers; here torch has
    no accelerator, so the index is 0 (the rank's one GPU), emptying a cache
    does nothing, and pinned memory is plain host memory. None of it decides
    anything a rule checks.
    """
    import torch
    from torch.overrides import TorchFunctionMode

    class _Unpinned(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            kwargs = kwargs or {}
            if kwargs.get("pin_memory"):
                kwargs = {**kwargs, "pin_memory": False}
            if getattr(func, "__name__", "") == "pin_memory" and args and isinstance(args[0], torch.Tensor):
                return args[0]
            return func(*args, **kwargs)

    accelerator = getattr(torch, "accelerator", None)
    answers = {"current_device_index": lambda: 0, "empty_cache": lambda: None, "synchronize": lambda *a: None}
    saved = {name: getattr(accelerator, name) for name in answers if hasattr(accelerator, name)}
    for name in saved:
        setattr(accelerator, name, answers[name])
    try:
        with _Unpinned():
            yield
    finally:
        for name, real in saved.items():
            setattr(accelerator, name, real)


@contextlib.contextmanager
def _host_facts() -> Iterator[None]:
    """``HOST_FACTS`` set for the duration, where this release has them."""
    saved = []
    for module_name, name, value in HOST_FACTS:
        module = importlib.import_module(module_name)
        if hasattr(module, name):
            saved.append((module, name, getattr(module, name)))
            setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, real in saved:
            setattr(module, name, real)


@contextlib.contextmanager
def _answering(owner: Any, name: str, answer: Any) -> Iterator[None]:
    """``owner.name(...)`` returns ``answer`` for the duration (left alone if this release lacks it)."""
    if not hasattr(owner, name):
        yield
        return
    real = getattr(owner, name)
    setattr(owner, name, lambda *args, **kwargs: answer)
    try:
        yield
    finally:
        setattr(owner, name, real)


@contextlib.contextmanager
def _cuda_allocations_on_meta() -> Iterator[None]:
    """``torch.empty(..., device="cuda")`` at module import lands on ``meta``."""
    import torch

    real = torch.empty

    def empty(*args: Any, **kwargs: Any) -> Any:
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "meta"
        return real(*args, **kwargs)

    torch.empty = empty  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.empty = real  # type: ignore[assignment]
