"""The built-in engine against SGLang's documented behaviour (shared/reference/sglang.md).

Expected texts are copied from the facts file by hand, not from the engine.
"""

import pytest

from pytest_mla.core.cells import Cell
from pytest_mla.core.models import BUILTIN_MODELS
from pytest_mla.engines.reference import TRITON_KERNEL, ReferenceEngine

ENGINE = ReferenceEngine()


def configure(cell_id):
    cell = Cell.from_id(cell_id)
    return ENGINE.configure(cell, BUILTIN_MODELS[cell.model])


@pytest.mark.parametrize("cell_id, error, message", [
    ("llama-3.1-8b/trtllm_mla/dcp1/none/sm100", ValueError,
     "trtllm_mla backend can only be used with MLA models."),
    ("llama-3.1-8b/cutedsl_mla/dcp1/none/sm100", ValueError,
     "cutedsl_mla backend can only be used with MLA models."),
    ("deepseek-v3/trtllm_mha/dcp1/none/sm100", ValueError,
     "trtllm_mha backend can only be used with non-MLA models."),
    ("deepseek-v3/trtllm_mla/dcp4/eagle-1x3/sm100", ValueError,
     "trtllm_mla cannot serve decode context parallelism with speculative decoding: it does not forward the "
     "cyclic DCP metadata to its decode kernel and returns no rank-local LSE for the cross-rank merge. "
     "Select cutedsl_mla."),
    ("deepseek-v3/trtllm_mla/dcp1/none/sm90", ValueError,
     "TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x). Please use a different backend."),
    ("deepseek-v3/cutedsl_mla/dcp1/none/sm90", ValueError,
     "CuteDSL MLA backend is only supported on Blackwell GPUs (SM100). Please use a different backend."),
    ("deepseek-v3/trtllm_mla/dcp1/none/sm100/kv-fp8_e5m2", ValueError,
     "TensorRT-LLM MLA backend only supports kv-cache-dtype of fp8_e4m3, bf16, or auto."),
    ("deepseek-v3/fa3/dcp1/none/sm100", AssertionError,
     "FlashAttention v3 Backend requires SM>=80 and SM<=90. Please use `--attention-backend flashinfer`."),
    ("deepseek-v3/fa3/dcp1/none/sm80", AssertionError,
     "FlashAttention v3 Backend requires SM>=80 and SM<=90. Please use `--attention-backend flashinfer`."),
    ("deepseek-v3/triton/dcp0/none/sm90", ValueError,
     "Decode context parallel size (--dcp-size / --decode-context-parallel-size) must be >= 1, "
     "but got dcp_size=0."),
    ("deepseek-v3/flashmla/dcp1/eagle-4x3/sm90", ValueError,
     "Currently FlashMLA only supports topk=1 for speculative decoding"),
    ("deepseek-v3/nosuch/dcp1/none/sm90", ValueError, "Invalid attention backend: nosuch"),
])
def test_documented_refusals(cell_id, error, message):
    with pytest.raises(error) as info:
        configure(cell_id)
    assert str(info.value) == message


@pytest.mark.parametrize("cell_id", [
    "deepseek-v3/trtllm_mla/dcp4/none/sm100",  # accepted in 0.5.23
    "deepseek-v3/tokenspeed_mla/dcp1/none/sm100",  # deprecated alias of cutedsl_mla
    "llama-3.1-8b/fa3/dcp1/none/sm80",  # fa3 on Ampere for non-MLA models
    "deepseek-v3/triton/dcp8/eagle-4x3/sm80",
])
def test_documented_acceptances(cell_id):
    assert configure(cell_id).backends


def test_tokenspeed_alias_becomes_cutedsl_with_fp8_kv():
    configured = configure("deepseek-v3/tokenspeed_mla/dcp1/none/sm100")
    assert configured.backends["decode"] == "cutedsl_mla"
    assert any("fp8_e4m3" in note for note in configured.notes)


def test_forced_page_size_is_a_note_not_an_error():
    configured = configure("deepseek-v3/flashmla/dcp1/none/sm90/page16")
    assert any("page size 16 → 64" in note for note in configured.notes)


def test_only_triton_declares_a_runnable_kernel():
    assert configure("deepseek-v3/triton/dcp2/eagle-1x3/sm90").kernel == TRITON_KERNEL
    assert configure("deepseek-v3/flashmla/dcp1/none/sm90").kernel is None
    assert "flash_mla" in configure("deepseek-v3/flashmla/dcp1/none/sm90").kernel_reason


def test_kernel_without_lse_is_refused_dcp_with_its_own_message():
    with pytest.raises(ValueError, match="returns no rank-local LSE for the cross-rank merge"):
        configure("deepseek-v3/cutlass_mla/dcp2/none/sm100")
    assert configure("deepseek-v3/cutlass_mla/dcp1/none/sm100").backends
