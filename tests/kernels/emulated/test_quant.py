"""sgl-kernel's fp8 quantization kernels, emulated from their CUDA sources' contract."""

import pytest
import torch

from pytest_mla.kernels.emulated.glue import OutOfContractError
from pytest_mla.kernels.emulated.quant import sgl_per_tensor_quant_fp8, sgl_per_token_quant_fp8


def test_dynamic_per_tensor_writes_amax_over_448_and_quantizes_with_it():
    x = torch.tensor([[0.5, -2.0], [1.0, 0.25]], dtype=torch.bfloat16)
    q, s = torch.empty(2, 2, dtype=torch.float8_e4m3fn), torch.zeros(1)
    sgl_per_tensor_quant_fp8(x, q, s, is_static=False)
    assert s.item() == pytest.approx(2.0 / 448)
    assert q.float().tolist() == [[112.0, -448.0], [224.0, 56.0]]  # x / (2/448), exact in e4m3


def test_static_per_tensor_uses_the_given_scale_and_clamps():
    x = torch.tensor([[1.0, -1000.0]])
    q = torch.empty(1, 2, dtype=torch.float8_e4m3fn)
    sgl_per_tensor_quant_fp8(x, q, torch.tensor([0.5]), is_static=True)
    assert q.float().tolist() == [[2.0, -448.0]]


def test_per_token_scales_each_row():
    x = torch.tensor([[4.0, 1.0], [0.5, -0.25]])
    q, s = torch.empty(2, 2, dtype=torch.float8_e4m3fn), torch.empty(2, 1)
    sgl_per_token_quant_fp8(x, q, s)
    assert s.flatten().tolist() == pytest.approx([4.0 / 448, 0.5 / 448])
    assert q.float().tolist() == [[448.0, 112.0], [448.0, -224.0]]


def test_outside_the_contract_raises():
    with pytest.raises(OutOfContractError, match="output_q"):
        sgl_per_tensor_quant_fp8(torch.ones(1, 1), torch.empty(1, 1, dtype=torch.float8_e5m2), torch.zeros(1), False)
    with pytest.raises(OutOfContractError, match="amax"):
        sgl_per_tensor_quant_fp8(torch.zeros(1, 2), torch.empty(1, 2, dtype=torch.float8_e4m3fn), torch.zeros(1),
                                 False)
