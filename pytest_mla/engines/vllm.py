"""The real vLLM engine: its attention-backend selection with a faked device capability.

For a cell the adapter builds vLLM's ``AttentionSelectorConfig`` (head size
``kv_lora_rank + qk_rope_head_dim`` for MLA models, ``head_dim`` otherwise;
bf16; KV dtype and block size from the ``kv_dtype`` / ``page_size`` axes;
``use_dcp`` = DCP size > 1) and asks the current platform for the forced
backend: ``current_platform.get_attn_backend_cls(AttentionBackendEnum[NAME],
...)``, which runs the backend class's ``validate_configuration`` and raises
``ValueError: Selected backend AttentionBackendEnum.NAME is not valid for this
configuration. Reason: [...]`` unchanged. A backend value ``auto`` runs the
platform's priority walk instead (``No valid attention backend found ...``).

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
* **The current vLLM config** (read by TOKENSPEED_MLA for the model's MLA
  dims) is a minimal stand-in carrying the model's Hugging Face config, loaded
  from the weightless ``config.json`` under ``model_configs/``.

What the selector cannot see: vLLM has no selector field for EAGLE/MTP, so
``spec`` does not change a vLLM cell; DCP's refusal of GQA models lives in
vLLM's config layer (``VllmConfig``), which this adapter does not build.
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

            platforms.current_platform = FakeCudaPlatform()  # before anything binds it
            self._platform = platforms.current_platform
            self._platform_cls = FakeCudaPlatform
            self._capability = DeviceCapability
            with _cuda_allocations_on_meta():
                for module in CUDA_AT_IMPORT:
                    importlib.import_module(module)
            import torch
            from vllm.config import set_current_vllm_config
            from vllm.v1.attention.backends.registry import AttentionBackendEnum
            from vllm.v1.attention.selector import AttentionSelectorConfig
        self._torch = torch
        self._enum = AttentionBackendEnum
        self._selector_config = AttentionSelectorConfig
        self._set_config = set_current_vllm_config
        self._hf_configs: dict[str, Any] = {}
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
        backend = None if cell.backend == "auto" else self._enum[cell.backend]
        self._platform_cls.capability = self._capability(*divmod(sm, 10))
        with self._quiet(), self._set_config(self._vllm_config(model)):
            path = self._platform.get_attn_backend_cls(backend, attn_selector_config=config,
                                                        num_heads=model.num_heads)
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
        }

    def _vllm_config(self, model: ModelConfig) -> Any:
        """The slice of ``VllmConfig`` backend checks read: the model's HF config.

        A catalogue model's config comes from its shipped ``config.json``; a model
        declared only in a matrix's ``[models]`` table gets one built from its
        attention fields (the names Hugging Face configs use).
        """
        if model.name not in self._hf_configs:
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
            self._hf_configs[model.name] = types.SimpleNamespace(**fields)
        hf = self._hf_configs[model.name]
        return _StandInConfig(types.SimpleNamespace(hf_text_config=hf, hf_config=hf))

    @contextlib.contextmanager
    def _quiet(self) -> Iterator[None]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            previous = logging.root.manager.disable
            logging.disable(logging.WARNING)
            try:
                yield
            finally:
                logging.disable(previous)


class _StandInConfig:
    """Answers ``model_config``; any other section is absent (``None``)."""

    def __init__(self, model_config: Any) -> None:
        self.model_config = model_config

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return None


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



