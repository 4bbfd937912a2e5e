"""vLLM's CPU MLA decode op (``torch.ops._C.mla_decode_kvcache`` of a CPU build), emulated, against ``ref_mla_decode``.

The case is what vLLM's ``tests/kernels/attention/test_mla_decode_cpu.py``
feeds the op (576-wide latent rows, 512-wide values, 16-token blocks, NaN
past each length, varied lengths), with a shuffled block table; the
expectation is the float64 reference on the same paged cache.
"""

from __future__ import annotations

import pytest
import torch

from pytest_mla.kernels.emulated import EMULATIONS, vllm_cpu
from pytest_mla.kernels.emulated.glue import OutOfContractError, OutOfRangeRead

from .cases import assert_close, make_case, poisoned, reference


def _call(case, out=None, **changes):
    args = {"out": out if out is not None else poisoned((case.q.shape[0], case.q.shape[2], 512), case.q.dtype),
            "query": case.q[:, 0].contiguous(), "kv_cache": case.kv_cache[:, :, 0].contiguous(),
            "scale": case.softmax_scale, "block_tables": case.block_table,
            "seq_lens": case.cache_seqlens.to(torch.int32)}
    args.update(changes)
    vllm_cpu.mla_decode_kvcache(**args)
    return args["out"]


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_decode_matches_the_reference_over_a_shuffled_paged_cache(dtype):
    case = make_case([1, 17, 100, 256], page_size=16, dtype=dtype, seed=90)
    out = _call(case)
    ref_out, _ = reference(case)
    assert_close("out", out, ref_out[:, 0])


def test_an_empty_sequence_gives_zeros_and_reads_no_block():
    case = make_case([0, 33], page_size=16, seed=91)
    table = case.block_table.clone()
    table[0] = -7  # never followed: the sequence has no token
    out = _call(case, block_tables=table)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert_close("out", out[1:], reference(case)[0][1:, 0])


def test_the_scale_is_the_softmax_scale_no_log2_folding():
    case = make_case([40, 80], page_size=16, seed=92)
    wrong = _call(case, scale=case.softmax_scale * 1.05)
    assert not torch.allclose(wrong.float(), reference(case)[0][:, 0].float(), atol=1e-3, rtol=1.5e-2)


def test_a_block_id_outside_the_cache_raises_naming_the_flag():
    case = make_case([40], page_size=16, seed=93)
    table = case.block_table.clone()
    table[0, 1] = case.kv_cache.shape[0]  # the second of the 3 blocks the 40 tokens need
    with pytest.raises(OutOfRangeRead, match=r"^block_tables: index \d+ at 1 is outside"):
        _call(case, block_tables=table)


def test_a_shape_the_kernel_is_not_compiled_for_fails_as_the_library_does():
    """csrc/cpu/mla_decode.cpp compiles (576, 512, 16) only and TORCH_CHECKs anything else: a page of 64 and a
    320-wide latent (Mistral Small 4) both fail as on a CPU build of vLLM."""
    case = make_case([20], page_size=16, seed=95)
    page64 = make_case([20], page_size=64, seed=95)
    with pytest.raises(RuntimeError, match="^Unsupported block size$"):
        _call(case, kv_cache=page64.kv_cache[:, :, 0].contiguous(), block_tables=page64.block_table)
    with pytest.raises(RuntimeError, match="^Unsupported block size$"):
        _call(case, query=case.q[:, 0, :, :320].contiguous(), kv_cache=case.kv_cache[:, :, 0, :320].contiguous(),
              out=poisoned((1, case.q.shape[2], 256), case.q.dtype))


@pytest.mark.parametrize("change, flag", [
    ({"seq_lens": "int64"}, "seq_lens"),
    ({"query": "fp32"}, "kv_cache"),
])
def test_what_the_kernel_is_not_compiled_for_raises_one_line_naming_the_flag(change, flag):
    case = make_case([20], page_size=16, seed=94)
    args = {}
    if change.get("kv_cache") == "page64":
        args["kv_cache"] = make_case([20], page_size=64, seed=94).kv_cache[:, :, 0].contiguous()
        args["block_tables"] = make_case([20], page_size=64, seed=94).block_table
    if change.get("seq_lens") == "int64":
        args["seq_lens"] = case.cache_seqlens.to(torch.int64)
    if change.get("query") == "fp32":
        args["query"] = case.q[:, 0].float().contiguous()
        args["out"] = poisoned((1, case.q.shape[2], 512), torch.float32)
    with pytest.raises(OutOfContractError) as info:
        _call(case, **args)
    assert str(info.value).startswith(f"{flag}: ") and "\n" not in str(info.value)


def test_registered_under_the_op_vllm_calls():
    assert EMULATIONS["torch.ops._C:mla_decode_kvcache"] is vllm_cpu.mla_decode_kvcache
