"""The registry of emulations and the package's import-time promise (no torch until used)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pytest_mla.kernels import emulated


def test_registry_names_each_real_callable_once_as_module_colon_qualname():
    registry = emulated.EMULATIONS
    assert len(registry) >= 16
    for key, value in registry.items():
        module, _, qualname = key.partition(":")
        assert module and qualname and " " not in key, key
        assert callable(value), key
    for name in ("flashinfer.mla:BatchMLAPagedAttentionWrapper", "flashinfer.decode:trtllm_batch_decode_with_kv_cache_mla",
                 "flash_mla:flash_mla_with_kvcache", "torch.ops._flashmla_C:dense_decode_fwd",
                 "sgl_kernel.flash_attn:flash_attn_with_kvcache", "sgl_kernel:merge_state_v2",
                 "vllm.vllm_flash_attn:flash_attn_varlen_func", "vllm._custom_ops:sm100_cutlass_mla_decode"):
        assert emulated.emulation_for(name) is registry[name]


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(KeyError, match="no emulation of 'flashinfer:nope' \\(emulated: .*flash_mla:"):
        emulated.emulation_for("flashinfer:nope")


def test_every_module_states_its_contract():
    for name in emulated.LIBRARY_MODULES:
        doc = getattr(emulated, name).__doc__
        assert "contract" in doc and "LSE" in doc.replace("lse", "LSE") and "raise" in doc, name


def test_out_of_contract_error_is_one_line_naming_the_flag():
    err = emulated.OutOfContractError("page_size", "16:\n  not modelled")
    assert str(err) == "page_size: 16: not modelled" and err.flag == "page_size"
    assert not isinstance(err, (ValueError, RuntimeError))  # an engine's own except clauses do not swallow it


def test_importing_the_package_imports_no_torch():
    code = "import sys, pytest_mla.kernels.emulated as e; assert 'torch' not in sys.modules; print(e.LIBRARY_MODULES)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
