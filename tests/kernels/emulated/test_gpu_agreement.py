"""Each emulation beside the real library kernel on the same inputs: the agreement that makes ``emulated`` trustworthy.

Skipped unless CUDA is available and the library imports; trtllm-gen,
cute-dsl and CUTLASS MLA need an SM100 GPU. ``benchmarks/gpu.sh`` runs these
(``-m gpu_emulation``). Inputs include an empty request and a multi-token
causal (verify) batch, so the conventions the libraries' tests leave open —
FlashInfer's LSE for an empty request, FA3's for a row that sees nothing,
merge_state_v2 with both sides empty — are settled by the kernel itself.
"""

from __future__ import annotations

import importlib
import inspect
import math

import pytest
import torch

from pytest_mla.kernels.compare import TOLERANCES, check_close
from pytest_mla.kernels.emulated import cutlass_mla, flash_attn, flashinfer, flashmla, tokenspeed

from .cases import make_case

pytestmark = pytest.mark.gpu_emulation
OUT_TOL = TOLERANCES["bf16"].out
LSE_TOL = TOLERANCES["bf16"].lse


def real(module: str, *, arch: int = 90):
    """The real library module on a CUDA device of compute capability ``arch``+, or skip saying why."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    major, minor = torch.cuda.get_device_capability()
    if major * 10 + minor < arch or (arch == 100 and major != 10):
        pytest.skip(f"needs sm{arch} (this GPU is sm{major}{minor})")
    try:
        return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import failure means "not installed here"
        pytest.skip(f"{module} does not import here: {type(exc).__name__}: {exc}")


def agree(name, ans, emu, tol):
    """The real kernel's result against the emulation's; special values (NaN, ±inf) must sit at the same places."""
    result = check_close(name, ans.cpu(), emu.cpu(), tol)
    assert result.ok, result.message


CASES = [([0, 1, 70, 129], 1), ([2, 4, 64, 130], 2)]


@pytest.mark.parametrize("seqlens,s_q", CASES)
def test_flashmla_dense_decode(seqlens, s_q):
    flash_mla = real("flash_mla")
    case = make_case(seqlens, s_q=s_q, page_size=64, seed=90 + s_q)
    gpu = case.to("cuda")
    legacy = {"use_legacy": True} if "use_legacy" in inspect.signature(flash_mla.flash_mla_with_kvcache).parameters else {}
    sched, splits = flash_mla.get_mla_metadata(gpu.cache_seqlens, s_q * 16, 1)
    out, lse = flash_mla.flash_mla_with_kvcache(gpu.q, gpu.kv_cache, gpu.block_table, gpu.cache_seqlens, 512, sched,
                                                splits, softmax_scale=case.softmax_scale, causal=True, **legacy)
    emu_out, emu_lse, _, _ = flashmla.dense_decode_fwd(case.q, case.kv_cache, 512, case.cache_seqlens,
                                                       case.block_table, case.softmax_scale, True)
    agree("out", out, emu_out, OUT_TOL)
    agree("lse", lse, emu_lse, LSE_TOL)


@pytest.mark.parametrize("seqlens,s_q", CASES)
def test_sgl_kernel_flash_mla_tensor_metadata(seqlens, s_q):
    """sglang-kernel's flash_mla module (SGLang 0.5.22's FlashMLA): tensor schedule, the legacy bf16 op."""
    sgl_flash_mla = real("sgl_kernel.flash_mla")
    case = make_case(seqlens, s_q=s_q, page_size=64, seed=92 + s_q)
    gpu = case.to("cuda")
    results = []
    for module, c in ((sgl_flash_mla, gpu), (None, case)):
        get = module.get_mla_metadata if module else flashmla.sgl_kernel_get_mla_metadata
        run = module.flash_mla_with_kvcache if module else flashmla.sgl_kernel_flash_mla_with_kvcache
        sched, splits = get(c.cache_seqlens, s_q * 16, 1)
        results.append(run(c.q, c.kv_cache, c.block_table, c.cache_seqlens, 512, sched, splits,
                           softmax_scale=case.softmax_scale, causal=True))
    (out, lse), (emu_out, emu_lse) = results
    agree("out", out, emu_out, OUT_TOL)
    agree("lse", lse, emu_lse, LSE_TOL)


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
@pytest.mark.parametrize("seqlens,s_q,causal", [([0, 1, 70, 129], 1, False), ([4, 9, 70], 4, True)])
def test_flashinfer_mla_wrapper(backend, seqlens, s_q, causal):
    fi_mla = real("flashinfer.mla")
    from .test_flashinfer import csr, split

    case = make_case(seqlens, s_q=s_q, page_size=16, seed=95)
    results = []
    for cls, dev in ((fi_mla.BatchMLAPagedAttentionWrapper, "cuda"), (flashinfer.BatchMLAPagedAttentionWrapper, "cpu")):
        c = case.to(dev)
        w = cls(torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=dev), backend=backend)
        w.plan(*(x.to(dev) for x in csr(c)), 16, 512, 64, 16, causal, case.softmax_scale, c.q.dtype, c.kv_cache.dtype)
        results.append(w.run(*split(c), return_lse=True))
    (out, lse), (emu_out, emu_lse) = results
    agree("out", out, emu_out, OUT_TOL)
    agree("lse (base 2, empty requests included)", lse, emu_lse, LSE_TOL)


@pytest.mark.parametrize("seqlens,s_q", CASES)
def test_fa3_with_kvcache_mla_split_and_merge(seqlens, s_q):
    sk_fa = real("sgl_kernel.flash_attn")
    sk = real("sgl_kernel")
    case = make_case(seqlens, s_q=s_q, page_size=16, seed=97)
    results = []
    for fn, c in ((sk_fa.flash_attn_with_kvcache, case.to("cuda")), (flash_attn.flash_attn_with_kvcache, case)):
        results.append(fn(c.q[..., 512:], c.kv_cache[..., 512:], c.kv_cache[..., :512], qv=c.q[..., :512],
                          page_table=c.block_table, cache_seqlens=c.cache_seqlens, softmax_scale=case.softmax_scale,
                          causal=True, return_softmax_lse=True)[:2])
    (out, lse), (emu_out, emu_lse) = results
    agree("out", out, emu_out, OUT_TOL)
    agree("lse (natural, rows that see nothing included)", lse, emu_lse, LSE_TOL)
    sa = torch.tensor([[1.0, math.inf], [-math.inf, 0.5], [-math.inf, 2.0]])
    sb = torch.tensor([[0.0, 0.3], [1.5, math.inf], [-math.inf, -1.0]])
    va, vb = emu_out[0, :1].expand(3, 2, 512).contiguous(), emu_out[-1, :1].expand(3, 2, 512).contiguous()
    v, s = sk.merge_state_v2(va.cuda(), sa.cuda(), vb.cuda(), sb.cuda())
    ev, es = flash_attn.merge_state_v2(va, sa, vb, sb)
    agree("merged v (both-empty row included)", v, ev, OUT_TOL)
    agree("merged lse", s, es, LSE_TOL)


def test_vllm_flash_attn_varlen_mla_decode():
    vfa = real("vllm.vllm_flash_attn")
    case = make_case([1, 5, 70, 130], s_q=2, page_size=16, seed=99)
    cu = torch.arange(5, dtype=torch.int32) * 2
    results = []
    for fn, c, dev in ((vfa.flash_attn_varlen_func, case.to("cuda"), "cuda"),
                       (flash_attn.flash_attn_varlen_func, case, "cpu")):
        results.append(fn(q=c.q[..., 512:].reshape(8, 16, 64), k=c.kv_cache[..., 512:], v=c.kv_cache[..., :512],
                          q_v=c.q[..., :512].reshape(8, 16, 512), max_seqlen_q=2, cu_seqlens_q=cu.to(dev),
                          max_seqlen_k=130, seqused_k=c.cache_seqlens, block_table=c.block_table,
                          softmax_scale=case.softmax_scale, causal=True, return_softmax_lse=True, fa_version=3))
    (out, lse), (emu_out, emu_lse) = results
    agree("out", out, emu_out, OUT_TOL)
    agree("lse", lse, emu_lse, LSE_TOL)


@pytest.mark.parametrize("backend", ["trtllm-gen", "cute-dsl"])
def test_trtllm_batch_decode_mla(backend):
    decode = real("flashinfer.decode", arch=100)
    case = make_case([0, 9, 70, 129] if backend == "cute-dsl" else [2, 9, 70, 129], s_q=2, page_size=64, seed=101)
    from .test_flashinfer import aligned

    results = []
    for fn, c in ((decode.trtllm_batch_decode_with_kv_cache_mla, case.to("cuda")),
                  (flashinfer.trtllm_batch_decode_with_kv_cache_mla, case)):
        ws = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device=c.q.device)
        results.append(fn(query=c.q, kv_cache=c.kv_cache.squeeze(2).unsqueeze(1), workspace_buffer=ws,
                          qk_nope_head_dim=128, kv_lora_rank=512, qk_rope_head_dim=64,
                          block_tables=aligned(c.block_table, 64), seq_lens=c.cache_seqlens, max_seq_len=129,
                          bmm1_scale=case.softmax_scale, backend=backend, return_lse=True))
    (out, lse), (emu_out, emu_lse) = results
    agree("out", out, emu_out, OUT_TOL)
    agree("lse", lse, emu_lse, LSE_TOL)


def test_cutlass_mla_decode():
    ops = real("vllm._custom_ops", arch=100)
    case = make_case([0, 9, 70, 129], page_size=128, seed=103)
    results = []
    for fn, c in ((ops.sm100_cutlass_mla_decode, case.to("cuda")), (cutlass_mla.sm100_cutlass_mla_decode, case)):
        dev = c.q.device
        out = torch.zeros(4, 128, 512, dtype=torch.bfloat16, device=dev)
        lse = torch.zeros(4, 128, dtype=torch.float32, device=dev)
        ws = torch.zeros(64 * 1024 * 1024, dtype=torch.uint8, device=dev)
        q = c.q[:, 0]
        fn(out, lse, q[..., :512].contiguous(), q[..., 512:].contiguous(), c.kv_cache.squeeze(2), c.cache_seqlens,
           c.block_table, ws, case.softmax_scale, 1)
        results.append((out[:, :16], lse[:, :16]))
    (out, lse), (emu_out, emu_lse) = results
    agree("out", out, emu_out, OUT_TOL)
    agree("lse", lse, emu_lse, LSE_TOL)


@pytest.mark.parametrize("seqlens,s_q", CASES)
def test_tokenspeed_mla_decode(seqlens, s_q):
    """TokenSpeed's CuTe DSL decode (SM100) and its emulation: output and the base-2 LSE."""
    ts = real("tokenspeed_mla", arch=100)
    case = make_case(seqlens, s_q=s_q, page_size=64, seed=99 + s_q)
    results = []
    for decode, c in ((ts.tokenspeed_mla_decode, case.to("cuda")), (tokenspeed.tokenspeed_mla_decode, case)):
        workspace = torch.zeros(256 * 1024 * 1024, dtype=torch.int8, device=c.q.device)
        results.append(decode(query=c.q, kv_cache=c.kv_cache.squeeze(2), workspace_buffer=workspace,
                              kv_lora_rank=512, qk_rope_head_dim=64, block_tables=c.block_table,
                              seq_lens=c.cache_seqlens, max_seq_len=max(seqlens), softmax_scale=case.softmax_scale,
                              return_lse=True))
    (out, lse), (emu_out, emu_lse) = results
    agree("out", out, emu_out, OUT_TOL)
    agree("lse", lse, emu_lse, LSE_TOL)


@pytest.mark.parametrize("backend,arch", [("xqa", 90), ("trtllm-gen", 100)])
@pytest.mark.parametrize("seqlens,s_q,kv_dtype", [([0, 1, 70, 129], 1, "auto"), ([4, 9, 70], 4, "auto"),
                                                  ([5, 64, 130], 1, "fp8_e4m3")])
def test_trtllm_batch_decode_gqa(backend, arch, seqlens, s_q, kv_dtype):
    """FlashInfer's TRT-LLM GQA decode (SGLang's trtllm_mha): HND pages, a verify batch with XQA's causal
    mask, an fp8 cache scaled through bmm1/bmm2; rows of an empty request stay as the poisoned out left them."""
    decode = real("flashinfer.decode", arch=arch)
    from pytest_mla.kernels.emulated import flashinfer_trtllm_mha
    from pytest_mla.kernels.inputs import gen_decode_inputs

    from .test_flashinfer_trtllm_mha import packed_mask

    hq, hk, d = 16, 2, 128
    case = gen_decode_inputs(seqlens, s_q=s_q, h_q=hq, h_kv=hk, d_qk=d, d_v=d, mla=False, page_size=64,
                             kv_dtype=kv_dtype, seed=110 + s_q)
    scale = case.kv_scale or 1.0
    b = len(seqlens)
    mask = packed_mask(torch.tril(torch.ones(s_q, s_q, dtype=torch.bool)).expand(b, s_q, s_q)) if s_q > 1 else None
    results = []
    for fn, dev in ((decode.trtllm_batch_decode_with_kv_cache, "cuda"),
                    (flashinfer_trtllm_mha.trtllm_batch_decode_with_kv_cache, "cpu")):
        q = case.q.reshape(b * s_q, hq, d).to(dev)
        kv = (case.kv_cache.transpose(1, 2).contiguous().to(dev), case.v_cache.transpose(1, 2).contiguous().to(dev))
        ws = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device=dev)
        out = torch.full(q.shape, math.nan, dtype=torch.bfloat16, device=dev)
        results.append(fn(q, kv, ws, case.block_table.to(dev), case.cache_seqlens.to(dev), max(seqlens),
                          bmm1_scale=case.softmax_scale * scale, bmm2_scale=scale, out=out, backend=backend,
                          q_len_per_req=s_q, mask=None if mask is None or backend != "xqa" else mask.to(dev)))
    agree("out", results[0], results[1], OUT_TOL)
