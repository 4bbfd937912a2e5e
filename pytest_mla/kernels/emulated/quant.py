"""sgl-kernel's fp8 quantization kernels (SGLang's backends quantize q for an fp8 KV cache with them).

The contract comes from sgl-kernel's ``csrc/gemm/per_tensor_quant_fp8.cu`` and
``per_token_quant_fp8.cu`` (sglang-kernel 0.4.10 and earlier; the same rule as
vLLM's ``scaled_fp8_quant``). These kernels compute no attention and return no
LSE; their one convention is the scale, and where each writes it:

* ``sgl_per_tensor_quant_fp8(input, output_q, output_s, is_static)``:
  ``is_static`` — ``output_s`` holds the scale; otherwise the kernel writes
  ``output_s = max|input| / FP8_E4M3_MAX`` (one fp32 value) first. Then
  ``output_q = fp8(clamp(input * (1 / output_s), -448, 448))``, e4m3fn, round to
  nearest even. ``output_s`` of one element and contiguous 2-D tensors only.
* ``sgl_per_token_quant_fp8(input, output_q, output_s)``: the dynamic rule per
  row, ``output_s [rows, 1]``.

Anything else (another fp8 format, a zero amax the kernels would divide by)
raises ``OutOfContractError``.
"""

from __future__ import annotations

import torch

from .glue import OutOfContractError, check_dtype

__all__ = ["EMULATIONS", "sgl_per_tensor_quant_fp8", "sgl_per_token_quant_fp8"]

FP8_E4M3_MAX = 448.0


def _quantize(x: torch.Tensor, inverse_scale: torch.Tensor, out: torch.Tensor) -> None:
    y = (x.to(torch.float32) * inverse_scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    out.copy_(y.to(torch.float8_e4m3fn))


def sgl_per_tensor_quant_fp8(input: torch.Tensor, output_q: torch.Tensor, output_s: torch.Tensor,
                             is_static: bool) -> None:
    """``sgl_kernel.sgl_per_tensor_quant_fp8``: one scale for the whole tensor."""
    check_dtype("sgl_per_tensor_quant_fp8.output_q", output_q, (torch.float8_e4m3fn,))
    check_dtype("sgl_per_tensor_quant_fp8.output_s", output_s, (torch.float32,))
    if output_s.numel() != 1 or input.shape != output_q.shape:
        raise OutOfContractError("sgl_per_tensor_quant_fp8.shapes", f"input {list(input.shape)}, output_q "
                                 f"{list(output_q.shape)}, output_s {list(output_s.shape)}")
    if not is_static:
        amax = input.detach().to(torch.float32).abs().max() if input.numel() else torch.tensor(0.0)
        if float(amax) == 0.0:
            raise OutOfContractError("sgl_per_tensor_quant_fp8.amax", "an all-zero input: the kernel divides by 0")
        output_s.fill_(float(amax) / FP8_E4M3_MAX)
    _quantize(input, 1.0 / output_s.reshape(()).to(torch.float32), output_q)


def sgl_per_token_quant_fp8(input: torch.Tensor, output_q: torch.Tensor, output_s: torch.Tensor) -> None:
    """``sgl_kernel.sgl_per_token_quant_fp8``: one dynamic scale per row."""
    check_dtype("sgl_per_token_quant_fp8.output_q", output_q, (torch.float8_e4m3fn,))
    check_dtype("sgl_per_token_quant_fp8.output_s", output_s, (torch.float32,))
    if input.dim() != 2 or output_s.numel() != input.shape[0]:
        raise OutOfContractError("sgl_per_token_quant_fp8.shapes", f"input {list(input.shape)}, output_s "
                                 f"{list(output_s.shape)}")
    amax = input.detach().to(torch.float32).abs().amax(-1, keepdim=True)
    if bool((amax == 0).any()):
        raise OutOfContractError("sgl_per_token_quant_fp8.amax", "an all-zero row: the kernel divides by 0")
    scale = amax / FP8_E4M3_MAX
    output_s.copy_(scale.reshape(output_s.shape))
    _quantize(input, 1.0 / scale, output_q)


EMULATIONS = {
    "sgl_kernel:sgl_per_tensor_quant_fp8": sgl_per_tensor_quant_fp8,
    "sgl_kernel:sgl_per_token_quant_fp8": sgl_per_token_quant_fp8,
}
