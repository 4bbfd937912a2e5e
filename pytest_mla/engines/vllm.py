"""The real vLLM engine: its attention-backend selection with a faked device capability.

Per cell, in vLLM's order:

1. **Config layer**: ``ModelConfig.verify_with_parallel_config`` (what
   ``VllmConfig.__post_init__`` runs before any layer exists) with a real
   ``ParallelConfig`` (``tp`` = the ``tp`` axis, else the DCP size): it
   refuses DCP for GQA models unless tp exceeds their KV heads.
2. **Selection**: vLLM's ``AttentionSelectorConfig`` (head size
   ``kv_lora_rank + qk_rope_head_dim`` for MLA models, ``head_dim``
   otherwise; bf16; KV dtype and block size from the ``kv_dtype`` /
   ``page_size`` axes; ``use_dcp`` = DCP size > 1) and
   ``current_platform.get_attn_backend_cls(AttentionBackendEnum[NAME], ...)``,
   which runs the backend class's ``validate_configuration`` and raises
   ``ValueError: Selected backend AttentionBackendEnum.NAME is not valid for
   this configuration. Reason: [...]`` unchanged. A backend value ``auto``
   passes ``None``: the platform's priority walk (``No valid attention backend
   found ...`` when nothing is valid).
3. **DCP cells**: the model runner's ``check_attention_cp_compatibility``
   (``v1/worker/cp_utils.py``) on an impl of the selected backend allocated
   by vLLM's ``AttentionImplBase.__new__`` inside a DCP group of the cell's
   size (the softmax-LSE requirement).

How it runs on a CPU-only machine (see docs/engines.md):

* **The arch is faked by a platform**: a subclass of vLLM's
  ``NonNvmlCudaPlatform`` whose ``get_device_capability`` answers the cell's
  arch, installed as ``vllm.platforms.current_platform`` *before* any vLLM
  module that binds it is imported (several rules ask the global platform,
  not the capability handed to the selector).
* **Compiled-extension checks are isolated from the rules.** Whether the local
  wheel's extensions load is a fact of this machine, not a rule: the checks
  are plain import attempts (``vllm._flashmla_C``,
  ``vllm._flashmla_extension_C``, ``vllm.vllm_flash_attn._vllm_fa2_C`` /
  ``_vllm_fa3_C``, ``flashinfer``, ``tokenspeed_mla``). Those modules are
  import stubs here, so every backend answers as on a GPU host with
  everything compiled, and reasons such as ``vllm._flashmla_C is not
  available`` never reach a verdict. ``vllm._C`` and
  ``vllm._C_stable_libtorch`` (CUDA-linked) are stubbed for the import.
* **Import-time side effects** neutralised without touching a rule: CUTLASS
  MLA allocates a CUDA workspace when its module loads; that allocation is
  redirected to the ``meta`` device for the import.
* **The current vLLM config** is a stand-in with the sections the checks
  read: a model-config view whose methods are ``vllm.config.ModelConfig``'s
  own (a real ``ModelConfig`` inspects the model class in a subprocess that
  imports CUDA ops), the real ``ParallelConfig``, a default
  ``AttentionConfig`` and the cell's cache dtype / block size. The model's
  Hugging Face config (read by FLASHINFER_MLA and TOKENSPEED_MLA for the MLA
  dims) is the weightless ``config.json`` under ``model_configs/``. The faked
  node has ``GPUS_PER_NODE`` GPUs (``ParallelConfig`` checks the world size).

What the selector cannot see: vLLM has no selector field for EAGLE/MTP, so
``spec`` does not change a vLLM cell.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import json
import logging
import types
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping

from ..core.cells import Cell, arch_number
from ..core.models import ModelConfig
from . import _quiet
from .protocol import Configured

if importlib.util.find_spec("vllm") is None:  # the registry turns this into "unavailable"
    raise ImportError("vllm is not installed in this environment", name="vllm")

MODEL_CONFIGS = Path(__file__).with_name("model_configs")

#: CUDA-linked modules stubbed so that vLLM imports on CPU torch.
IMPORT_STUBS = ("vllm._C", "vllm._C_stable_libtorch")
#: Compiled kernels whose presence vLLM checks by importing them: stubbed, so the
#: rules answer as on a GPU host with everything compiled.
COMPILED_STUBS = (
    "vllm._flashmla_C",
    "vllm._flashmla_extension_C",
    "vllm.vllm_flash_attn._vllm_fa2_C",
    "vllm.vllm_flash_attn._vllm_fa3_C",
    "flashinfer",
    "tokenspeed_mla",
)
#: Backend value meaning "no backend forced": the platform walks its priority list.
AUTO = "auto"
#: ``vllm.config.ModelConfig`` members the model-config view borrows (pure over
#: ``model_arch_config`` / the HF config).
MODEL_CONFIG_METHODS = ("verify_with_parallel_config", "get_head_size", "get_total_num_kv_heads",
                        "get_num_kv_heads", "get_num_attention_heads", "is_diffusion")
#: GPUs the faked node has (``ParallelConfig`` refuses a world size above it).
GPUS_PER_NODE = 8
#: Backend modules with import-time CUDA allocations (redirected to ``meta``).
CUDA_AT_IMPORT = ("vllm.v1.attention.backends.mla.cutlass_mla",)


class VLLMEngine:
    """Adapter for an installed ``vllm`` (``[engine] name = "vllm"``)."""

    name = "vllm"
    #: vLLM refuses a forced backend with ``ValueError`` (selector) and asserts known KV dtypes.
    refusal_errors: tuple[type[BaseException], ...] = (ValueError, AssertionError)

    def __init__(self) -> None:
        from ._import_stubs import install_stubs

        self.stubs = install_stubs(IMPORT_STUBS + COMPILED_STUBS, force=True)
        logging.getLogger("vllm").setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import vllm.platforms as platforms
            from vllm.platforms.cuda import NonNvmlCudaPlatform
            from vllm.platforms.interface import DeviceCapability

            class FakeCudaPlatform(NonNvmlCudaPlatform):
                """vLLM's CUDA platform answering the cell's arch (set per cell)."""

                capability = DeviceCapability(9, 0)

                @classmethod
                def get_device_capability(cls, device_id: int = 0) -> Any:
                    return cls.capability

                @classmethod
                def num_compute_units(cls, device_id: int = 0) -> int:
                    return 132  # read by CUTLASS MLA's import-time workspace sizing only

                @classmethod
                def get_device_name(cls, device_id: int = 0) -> str:
                    return f"fake sm{cls.capability.major}{cls.capability.minor}"

                @classmethod
                def device_count(cls) -> int:
                    return GPUS_PER_NODE  # ParallelConfig's "world size > GPUs in this node" check

            platforms.current_platform = FakeCudaPlatform()  # before anything binds it
            self._platform = platforms.current_platform
            self._platform_cls = FakeCudaPlatform
            self._capability = DeviceCapability
            with _cuda_allocations_on_meta():
                for module in CUDA_AT_IMPORT:
                    importlib.import_module(module)
            import torch
            import vllm.distributed.parallel_state as parallel_state
            from vllm.config import ModelConfig as VllmModelConfig
            from vllm.config import AttentionConfig, ParallelConfig, set_current_vllm_config
            from vllm.v1.attention.backends.registry import AttentionBackendEnum
            from vllm.v1.attention.selector import AttentionSelectorConfig
            from vllm.v1.worker.cp_utils import check_attention_cp_compatibility
        self._torch = torch
        self._parallel_state = parallel_state
        # A model-config view that answers with vLLM's own ModelConfig methods.
        self._model_view_cls = type("ModelConfigView", (_ModelConfigView,),
                                    {name: VllmModelConfig.__dict__[name] for name in MODEL_CONFIG_METHODS})
        self._model_views: dict[str, Any] = {}
        self._parallel_config_cls = ParallelConfig
        self._parallel_configs: dict[tuple[int, int], Any] = {}
        self._check_cp = check_attention_cp_compatibility
        self._attention_config = AttentionConfig()  # the defaults: no backend, no FA version forced
        self._enum = AttentionBackendEnum
        self._selector_config = AttentionSelectorConfig
        self._set_config = set_current_vllm_config
        self.version = importlib.metadata.version("vllm")

    def configure(self, cell: Cell, model: ModelConfig) -> Configured:
        sm = arch_number(cell.arch)
        if sm is None:
            raise LookupError(f"vllm adapter: only NVIDIA archs (smNN) can be faked, got {cell.arch!r}")
        config = self._selector_config(
            head_size=model.d_qk,
            dtype=self._torch.bfloat16,
            kv_cache_dtype=cell.kv_dtype or "auto",
            block_size=cell.page_size,
            use_mla=model.mla,
            use_dcp=cell.dcp > 1,
        )
        backend = None if cell.backend == AUTO else self._enum[cell.backend]
        self._platform_cls.capability = self._capability(*divmod(sm, 10))
        tp = cell.tp if cell.tp is not None else max(cell.dcp, 1)
        with _quiet.quiet():
            parallel = self._parallel_config(tp, cell.dcp)
            model_config = self._model_view(model)
            # VllmConfig.__post_init__ runs this before any layer (or backend) exists.
            model_config.verify_with_parallel_config(parallel)
            cache_config = types.SimpleNamespace(cache_dtype=cell.kv_dtype or "auto", block_size=cell.page_size)
            vllm_config = _StandInConfig(model_config=model_config, parallel_config=parallel,
                                         cache_config=cache_config, attention_config=self._attention_config)
            with self._set_config(vllm_config):
                path = self._platform.get_attn_backend_cls(backend, attn_selector_config=config,
                                                            num_heads=model.num_heads)
            if cell.dcp > 1:
                self._check_dcp_impl(str(path), vllm_config, parallel)
        label = str(path).rsplit(".", 1)[-1]
        return Configured(backends={"decode": label, "prefill": label},
                          kernel_reason="vLLM's kernels need a GPU and its compiled extensions")

    def metadata(self) -> Mapping[str, Any]:
        return {
            "engine": "vllm",
            "version": self.version,
            "stubs": list(self.stubs),
            "faked": "vllm.platforms.current_platform = NonNvmlCudaPlatform subclass (get_device_capability)",
            "cuda_at_import_on_meta": list(CUDA_AT_IMPORT),
            "config_checks": "ModelConfig.verify_with_parallel_config (model view) with a real ParallelConfig",
            "dcp_check": "v1.worker.cp_utils.check_attention_cp_compatibility on the selected impl",
        }

    def _parallel_config(self, tp: int, dcp: int) -> Any:
        """vLLM's own ``ParallelConfig`` (its validators run; the node has ``GPUS_PER_NODE`` GPUs)."""
        key = (tp, dcp)
        if key not in self._parallel_configs:
            self._parallel_configs[key] = self._parallel_config_cls(
                tensor_parallel_size=tp, decode_context_parallel_size=dcp)
        return self._parallel_configs[key]

    def _check_dcp_impl(self, path: str, vllm_config: Any, parallel: Any) -> None:
        """The model runner's DCP check on an impl of the selected backend.

        ``check_attention_cp_compatibility`` reads each attention layer's
        ``impl.need_to_return_lse_for_decode``, which vLLM's
        ``AttentionImplBase.__new__`` derives from the DCP group's world size
        and the impl's ``can_return_lse_for_decode``. The impl is allocated with
        that ``__new__`` only (its ``__init__`` needs the model's weights and a
        GPU), inside a DCP group of the cell's size.
        """
        module, _, qualname = path.rpartition(".")
        impl_cls = getattr(importlib.import_module(module), qualname).get_impl_cls()
        state = self._parallel_state
        saved = state._DCP
        state._DCP = types.SimpleNamespace(world_size=parallel.decode_context_parallel_size, rank_in_group=0)
        try:
            with self._set_config(vllm_config):
                impl = impl_cls.__new__(impl_cls)
        finally:
            state._DCP = saved
        layers = {"model.layers.0.self_attn.attn": types.SimpleNamespace(impl=impl)}
        runner_config = types.SimpleNamespace(
            parallel_config=parallel, speculative_config=None,
            compilation_config=types.SimpleNamespace(static_forward_context=layers))
        self._check_cp(runner_config)

    def _model_view(self, model: ModelConfig) -> Any:
        """The model's ``ModelConfig`` as the checks read it (see ``_ModelConfigView``).

        A catalogue model's HF config comes from its shipped ``config.json``; a
        model declared only in a matrix's ``[models]`` table gets one built from
        its attention fields (the names Hugging Face configs use).
        """
        if model.name not in self._model_views:
            path = MODEL_CONFIGS / model.name / "config.json"
            if path.is_file():
                fields = json.loads(path.read_text())
            else:
                fields = {"num_attention_heads": model.num_heads, "num_key_value_heads": model.num_kv_heads}
                if model.mla:
                    fields.update(kv_lora_rank=model.kv_lora_rank, qk_rope_head_dim=model.qk_rope_head_dim,
                                  qk_nope_head_dim=model.qk_nope_head_dim, v_head_dim=model.v_head_dim)
                else:
                    fields.update(head_dim=model.head_dim)
            self._model_views[model.name] = self._model_view_cls(model, types.SimpleNamespace(**fields),
                                                                 self._torch.bfloat16)
        return self._model_views[model.name]



class _StandInConfig:
    """The sections of a ``VllmConfig`` the checks read (given as keywords); any other is ``None``."""

    def __init__(self, **sections: Any) -> None:
        self.__dict__.update(sections)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return None


class _ModelConfigView:
    """A ``vllm.config.ModelConfig`` reduced to what the checks read; its methods are vLLM's.

    A real ``ModelConfig`` inspects the model class in a subprocess (importing
    the model's modules against CUDA ops), so it cannot be built here. The
    checks only read ``model_arch_config`` (total attention heads, total KV
    heads, head size), ``use_mla``, ``dtype`` and the HF config, through
    ``ModelConfig``'s own methods (``MODEL_CONFIG_METHODS``, copied onto a
    subclass by the adapter), e.g. ``verify_with_parallel_config``. The values
    are the catalogue's (the published ``config.json`` dims). ``enable_hc_sp``,
    expert and pipeline parallelism are off, so ``registry`` is never asked.
    """

    multimodal_config = None

    def __init__(self, model: ModelConfig, hf_config: Any, dtype: Any) -> None:
        self.use_mla = model.mla
        self.dtype = dtype
        self.hf_config = self.hf_text_config = hf_config
        self.model_arch_config = types.SimpleNamespace(
            total_num_attention_heads=model.num_heads,
            total_num_kv_heads=model.num_kv_heads,
            head_size=model.d_qk,  # kv_lora_rank + qk_rope_head_dim for MLA, as vLLM's convertor
        )


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



