"""SGLang's fixup_zero_kv_rows JIT kernel, emulated from its CUDA source's contract."""

import math

import pytest
import torch

from pytest_mla.kernels.emulated.glue import OutOfContractError
from pytest_mla.kernels.emulated.sglang_jit import jit_fixup_module


def test_rows_of_sequences_without_kv_become_zero_and_minus_inf_and_nothing_else_moves():
    out = torch.randn(7, 2, 4).to(torch.bfloat16)
    lse = torch.randn(7, 2)
    before_out, before_lse = out.clone(), lse.clone()
    kv_lens = torch.tensor([3, 0, 5, 0], dtype=torch.int32)
    cum = torch.tensor([0, 2, 4, 6, 7], dtype=torch.int32)  # tokens: seq1 -> rows 2,3; seq3 -> row 6
    jit_fixup_module(torch.bfloat16).fixup_zero_kv_rows(out, lse, kv_lens, cum, 2)
    for row in range(7):
        empty = row in (2, 3, 6)
        assert torch.equal(out[row], torch.zeros_like(out[row]) if empty else before_out[row])
        assert torch.equal(lse[row], torch.full_like(lse[row], -math.inf) if empty else before_lse[row])


def test_only_max_seq_len_tokens_per_sequence_are_fixed_as_the_grid_covers():
    out, lse = torch.ones(3, 1, 2, dtype=torch.float16), torch.zeros(3, 1)
    jit_fixup_module(torch.float16).fixup_zero_kv_rows(out, lse, torch.tensor([0], dtype=torch.int32),
                                                       torch.tensor([0, 3], dtype=torch.int32), 2)
    assert out[:2].eq(0).all() and out[2].eq(1).all() and lse[2].eq(0).all()


def test_dtypes_outside_the_launchers_checks_raise():
    with pytest.raises(OutOfContractError, match="fixup_zero_kv.dtype"):
        jit_fixup_module(torch.float32)
    with pytest.raises(OutOfContractError, match="kv_lens"):
        jit_fixup_module(torch.bfloat16).fixup_zero_kv_rows(
            torch.zeros(1, 1, 1, dtype=torch.bfloat16), torch.zeros(1, 1), torch.tensor([0]),
            torch.tensor([0, 1], dtype=torch.int32), 1)
