"""FlashInfer MLA, emulated in float64: ``BatchMLAPagedAttentionWrapper`` (FA2/FA3) and the trtllm-gen / cute-dsl decode.

Read from flashinfer-python 0.7.2.post1 (``flashinfer/mla/_batch_mla/_wrapper.py``,
``_planning.py``, ``_contracts.py``, ``flashinfer/mla/_core.py``,
``flashinfer/utils.py``) and FlashInfer's tests (``tests/attention/test_deepseek_mla.py``,
``test_trtllm_gen_mla.py``, ``test_cute_dsl_mla_dcp.py``). The contract, all in one place:

``BatchMLAPagedAttentionWrapper`` (legacy flat CSR ``plan``, the form the engines use)

* ``plan(qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv,
  head_dim_kpe, page_size, causal, sm_scale, q_data_type, kv_data_type, ...)``:
  int32 rank-1 contiguous CSR metadata; ``qo_indptr`` / ``kv_indptr`` start at 0
  and do not decrease; ``kv_indptr[i+1] - kv_indptr[i] == ceil(kv_len_arr[i] /
  page_size)``; ``kv_indices`` holds at least ``kv_indptr[-1]`` page ids — all
  ``ValueError`` as the library raises them [_planning.py _validate_csr_metadata].
  ``qo_indptr``, ``kv_indptr`` and ``kv_len_arr`` are read at plan time (the
  schedule is built from them); ``kv_indices`` is read at run time — from the
  tensor passed to ``plan``, or with ``use_cuda_graph=True`` from the buffer
  given to the constructor, into which ``plan`` copies it [_wrapper.py __init__].
* ``run(q_nope [tq, H, ckv], q_pe [tq, H, kpe], ckv_cache [P, ps, ckv],
  kpe_cache [P, ps, kpe], out=None, lse=None, return_lse=False,
  return_lse_base_on_e=False, ...)``: scores ``sm_scale · (q_nope·ckv + q_pe·kpe)``;
  ``out [tq, H, ckv]`` in q's dtype; ``lse [tq, H]`` float32.
* LSE base: **base 2** unless ``return_lse_base_on_e`` (a legacy flat plan with
  ``lse_mode="none"`` decides at run time); a plan with ``lse_mode="base2"`` /
  ``"basee"`` fixes it [_wrapper.py run, _contracts.py validate_run_options;
  test_deepseek_mla.py attention_ref returns ``lse · log2(e)``].
* Causal: aligned bottom-right per request (``arange(kv_len - qo_len, kv_len)[:, None]
  >= arange(kv_len)``) [test_deepseek_mla.py attention_ref]; a causal request
  with ``qo_len > kv_len`` is not supported (the tests skip it) → raises.
* Empty ``kv_len``: ``out = 0`` (the tests compare it with an empty softmax);
  the LSE is not specified by the tests, the emulation writes ``-inf`` (the GPU
  test holds it against the real kernel).
* fp8 KV (``kv_data_type = float8_e4m3fn``): q must be bf16; ``run`` takes
  ``ckv_scale`` (or ``ckv_scale_arr``) and ``kpe_scale``; values are
  ``ckv·ckv_scale``, ``kpe·kpe_scale`` [_contracts.py; test_batch_mla_fp8_kv_matches_bf16_reference].
* Not modelled (raise): ``metadata=`` / dense plan forms, ``backend`` other than
  auto/fa2/fa3, sinks, skip-softmax, bmm / output scales, ``ckv_scale_arr``,
  profiler buffers.

``trtllm_batch_decode_with_kv_cache_mla`` (``backend`` trtllm-gen, cute-dsl, auto)

* ``query [b, q_len, H, D]`` (or ``[total_q, H, D]`` with ``cum_seq_lens_q``),
  ``D = kv_lora_rank + qk_rope_head_dim`` (512 + 64 or 256 + 64);
  ``kv_cache [P, ps, D]`` or ``[P, 1, ps, D]``; V is the first ``kv_lora_rank``
  columns; ``block_tables [b, max_pages]`` (shared K/V index); ``seq_lens [b]``.
* Scores ``bmm1_scale · q·k`` on the values as stored (fp8 stays raw: q_scale,
  k_scale and the softmax scale are folded into ``bmm1_scale``); output
  ``bmm2_scale · softmax · v`` (``v_scale · o_scale``) [_core.py docstring Note].
* Multi-token queries are causal, bottom-right (the tests compare with FA2
  ``causal=True``) [test_trtllm_gen_mla.py].
* ``out`` is **bf16** ``query.shape[:-1] + (kv_lora_rank,)``; ``lse`` float32
  ``[b·q_len, H]`` (a caller's 3-D ``[b, q_len, H]`` buffer is filled and returned).
* LSE base (``return_lse_base=None``): **base 2 for trtllm-gen, natural log for
  monolithic cute-dsl** [_core.py return_lse_base doc, _cute_dsl_monolithic_log_scale].
  With ``backend="auto"`` the autotuner may pick either runner, so
  ``return_lse=True`` without an explicit ``return_lse_base`` is refused
  ("Select an explicit base for stable units under backend='auto'").
* DCP (``enable_dcp=True``, cute-dsl only, ``return_lse`` required): rank
  ``cp_rank`` holds global positions ``cp_world·k + cp_rank``; ``seq_lens`` are
  rank-local lengths; ``causal_seqlens_kv_global`` is the exclusive bound of the
  newest query, query ``i`` of ``q_len`` sees global positions
  ``< bound - (q_len - 1) + i`` [test_cute_dsl_mla_dcp.py _reference_attention].
* A query that sees no key: cute-dsl writes ``out = 0``, ``lse = -inf``
  [test_cute_dsl_mla_dcp.py]; trtllm-gen does not write those rows (``seq_lens``
  of 0 are outside its tests; this project's GPU wrapper found them unwritten),
  so the emulation fills them with NaN: a caller that uses them shows.
* ``max_seq_len`` must bound every ``seq_lens`` entry (it sizes the schedule).
* Not modelled (raise): sparse MLA, sinks, skip-softmax, ``use_fp16_softmax``,
  separate K/V page indices, the xqa / cake backends, ``cum_seq_lens_q`` with DCP.

Sizing helpers: ``flashinfer.utils.get_trtllm_gen_multi_ctas_kv_counter_bytes``
is the library's formula (``round_up(max(b·H, sm_count), 8) · 4``);
``flashinfer.utils.get_device_sm_count`` answers ``EMULATED_SM_COUNT`` (148, a
B200) since no device is queried.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .glue import (
    OutOfContractError,
    as_float64,
    attend,
    bottom_right_visible,
    check_dtype,
    check_index_range,
    gather_pages,
    to_base2,
    write_out,
)

__all__ = [
    "EMULATED_SM_COUNT",
    "EMULATIONS",
    "BatchMLAPagedAttentionWrapper",
    "get_device_sm_count",
    "get_trtllm_gen_multi_ctas_kv_counter_bytes",
    "trtllm_batch_decode_with_kv_cache_mla",
]

EMULATED_SM_COUNT = 148
_FP8 = (torch.float8_e4m3fn,)
_MLA_DIMS = {(512, 64), (256, 64)}  # (kv_lora_rank, qk_rope_head_dim) of the dense kernels


# --------------------------------------------------------------------------------------------
# BatchMLAPagedAttentionWrapper
# --------------------------------------------------------------------------------------------


def _csr_tensor(name: str, tensor) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} metadata must be a torch.Tensor.")
    if tensor.ndim != 1:
        raise ValueError(f"{name} metadata must be rank-1, got shape {tuple(tensor.shape)}.")
    if tensor.dtype != torch.int32:
        raise ValueError(f"{name} metadata must have dtype torch.int32, got {tensor.dtype}.")
    if not tensor.is_contiguous():
        raise ValueError(f"{name} metadata must be contiguous.")
    return tensor


def _indptr(name: str, tensor: torch.Tensor) -> torch.Tensor:
    values = tensor.to("cpu", torch.int64)
    if values.numel() == 0:
        raise ValueError(f"{name} metadata must contain at least one element.")
    if int(values[0]) != 0:
        raise ValueError(f"{name} metadata must start at zero.")
    if bool((values[1:] < values[:-1]).any()):
        raise ValueError(f"{name} metadata must be nondecreasing.")
    return values


class BatchMLAPagedAttentionWrapper:
    """``flashinfer.mla.BatchMLAPagedAttentionWrapper`` (FA2/FA3 backends, legacy flat CSR plan), in float64."""

    def __init__(self, float_workspace_buffer: torch.Tensor, use_cuda_graph: bool = False,
                 qo_indptr: Optional[torch.Tensor] = None, kv_indptr: Optional[torch.Tensor] = None,
                 kv_indices: Optional[torch.Tensor] = None, kv_len_arr: Optional[torch.Tensor] = None,
                 backend: str = "auto") -> None:
        if backend not in ("auto", "fa2", "fa3"):
            raise OutOfContractError("backend", f"{backend!r}: only the FA2/FA3 paged MLA kernels are modelled")
        self._float_workspace_buffer = float_workspace_buffer
        self.device = float_workspace_buffer.device
        self._use_cuda_graph = use_cuda_graph
        self._qo_indptr_buf = qo_indptr
        self._kv_indptr_buf = kv_indptr
        self._kv_indices_buf = kv_indices
        self._kv_len_arr_buf = kv_len_arr
        self._backend = backend
        self._plan: Optional[dict] = None

    def plan(self, qo_indptr=None, kv_indptr=None, kv_indices=None, kv_len_arr=None, num_heads=None,
             head_dim_ckv=None, head_dim_kpe=None, page_size=None, causal=None, sm_scale=None,
             q_data_type=None, kv_data_type=None, use_profiler: bool = False, *, metadata=None,
             cum_seq_lens_q=None, block_tables=None, seq_lens=None, max_q_len=None, query_layout=None,
             kv_cache_layout=None, lse_mode: str = "none", output_dtype=None, output_scale: str = "none",
             scale_mode: str = "default", skip_softmax: bool = False, enable_pdl=None,
             use_sinks: bool = False) -> None:
        for flag, value in (("metadata", metadata), ("cum_seq_lens_q", cum_seq_lens_q),
                            ("block_tables", block_tables), ("seq_lens", seq_lens), ("max_q_len", max_q_len)):
            if value is not None:
                raise OutOfContractError(flag, "only the legacy flat CSR plan form is modelled")
        for flag, value, default in (("use_profiler", use_profiler, False), ("output_scale", output_scale, "none"),
                                     ("skip_softmax", skip_softmax, False), ("use_sinks", use_sinks, False),
                                     ("query_layout", query_layout or "split", "split"),
                                     ("kv_cache_layout", kv_cache_layout or "split", "split")):
            if value != default:
                raise OutOfContractError(flag, f"{value!r} is not modelled")
        if scale_mode not in ("default", "kv-per-tensor"):
            raise OutOfContractError("scale_mode", f"{scale_mode!r} is not modelled")
        if lse_mode not in ("none", "base2", "basee"):
            raise ValueError(f"lse_mode must be 'none', 'base2' or 'basee', got {lse_mode!r}")
        missing = [n for n, v in (("num_heads", num_heads), ("head_dim_ckv", head_dim_ckv),
                                  ("head_dim_kpe", head_dim_kpe), ("page_size", page_size), ("causal", causal),
                                  ("sm_scale", sm_scale), ("q_data_type", q_data_type),
                                  ("kv_data_type", kv_data_type)) if v is None]
        if missing:
            raise TypeError("plan() missing required arguments: " + ", ".join(missing))
        if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size <= 0:
            raise ValueError(f"page_size must be a positive int, got {page_size!r}.")
        if not math.isfinite(float(sm_scale)):
            raise ValueError("sm_scale must be finite.")
        qo = _indptr("qo_indptr", _csr_tensor("qo_indptr", qo_indptr))
        kv = _indptr("kv_indptr", _csr_tensor("kv_indptr", kv_indptr))
        _csr_tensor("kv_indices", kv_indices)
        lens = _csr_tensor("kv_len_arr", kv_len_arr).to("cpu", torch.int64)
        batch = qo.numel() - 1
        if kv.numel() != batch + 1 or lens.numel() != batch:
            raise ValueError(f"CSR metadata batch dimensions must agree: qo_indptr describes {batch}, kv_indptr "
                             f"describes {kv.numel() - 1}, and kv_len_arr has {lens.numel()} entries.")
        if int(kv[-1]) > kv_indices.numel():
            raise ValueError(f"kv_indices metadata has {kv_indices.numel()} entries but kv_indptr[-1] is {int(kv[-1])}.")
        if bool((lens < 0).any()):
            raise ValueError("kv_len_arr metadata must be nonnegative.")
        if not torch.equal((lens + page_size - 1) // page_size, kv[1:] - kv[:-1]):
            raise ValueError("CSR metadata page counts in kv_indptr must equal ceil(kv_len_arr / page_size).")
        if kv_data_type in _FP8 and q_data_type != torch.bfloat16:
            raise ValueError(f"FP8 KV MLA requires bfloat16 queries, got {q_data_type}.")
        if kv_data_type not in _FP8 and kv_data_type != q_data_type:
            raise OutOfContractError("kv_data_type", f"{kv_data_type} with {q_data_type} queries is not modelled")
        check_dtype("q_data_type", torch.empty(0, dtype=q_data_type), (torch.bfloat16, torch.float16))
        if self._use_cuda_graph:  # plan copies the metadata into the caller's buffers; run reads the buffers
            for name, src, buf in (("kv_indices", kv_indices, self._kv_indices_buf),
                                   ("kv_indptr", kv_indptr, self._kv_indptr_buf),
                                   ("qo_indptr", qo_indptr, self._qo_indptr_buf),
                                   ("kv_len_arr", kv_len_arr, self._kv_len_arr_buf)):
                if buf is None or buf.numel() < src.numel():
                    raise ValueError(f"use_cuda_graph=True needs a {name} buffer of at least {src.numel()} entries")
                buf[: src.numel()].copy_(src)
            kv_indices_source = self._kv_indices_buf
        else:
            kv_indices_source = kv_indices
        self._plan = dict(qo=qo, kv=kv, lens=lens, kv_indices=kv_indices_source, num_heads=int(num_heads),
                          ckv=int(head_dim_ckv), kpe=int(head_dim_kpe), page_size=page_size, causal=bool(causal),
                          sm_scale=float(sm_scale), q_dtype=q_data_type, kv_dtype=kv_data_type, lse_mode=lse_mode,
                          output_dtype=output_dtype or q_data_type)

    def run(self, q_nope=None, q_pe=None, ckv_cache=None, kpe_cache=None, out=None, lse=None,
            return_lse: bool = False, profiler_buffer=None, kv_len=None, page_table=None,
            return_lse_base_on_e: bool = False, o_scale=None, *, query=None, kv_cache=None, ckv_scale=None,
            ckv_scale_arr=None, kpe_scale=None, sinks=None, skip_softmax_threshold_scale_factor=None,
            bmm1_scale=None, bmm2_scale=None):
        """``out`` or ``(out, lse)``; see the module docstring for the contract."""
        p = self._plan
        if p is None:
            raise RuntimeError("BatchMLAPagedAttentionWrapper.run() called before plan().")
        if query is not None:
            if not (isinstance(query, tuple) and len(query) == 2):
                raise OutOfContractError("query", "only the split (q_nope, q_pe) form is modelled")
            q_nope, q_pe = query
        if kv_cache is not None:
            if not (isinstance(kv_cache, tuple) and len(kv_cache) == 2):
                raise OutOfContractError("kv_cache", "only the split (ckv_cache, kpe_cache) form is modelled")
            ckv_cache, kpe_cache = kv_cache
        for flag, value in (("profiler_buffer", profiler_buffer), ("kv_len", kv_len), ("page_table", page_table),
                            ("o_scale", o_scale), ("ckv_scale_arr", ckv_scale_arr), ("sinks", sinks),
                            ("skip_softmax_threshold_scale_factor", skip_softmax_threshold_scale_factor),
                            ("bmm1_scale", bmm1_scale), ("bmm2_scale", bmm2_scale)):
            if value is not None:
                raise OutOfContractError(flag, "not modelled")
        base = p["lse_mode"]
        if base == "none":  # a legacy flat CSR plan: the run decides, base 2 unless asked for e
            base = "basee" if return_lse_base_on_e else "base2"
        elif return_lse_base_on_e and base != "basee":
            raise ValueError(f"LSE mode mismatch: planned {base!r}, run asks for 'basee'")
        fp8 = p["kv_dtype"] in _FP8
        if fp8:
            if ckv_scale is None or kpe_scale is None:
                raise ValueError("ckv_scale and kpe_scale are required when kv_data_type is FP8.")
        elif ckv_scale is not None or kpe_scale is not None:
            raise ValueError("ckv_scale / ckv_scale_arr / kpe_scale are only valid when kv_data_type is FP8.")
        if q_nope.dtype != p["q_dtype"] or q_pe.dtype != p["q_dtype"]:
            raise ValueError(f"query dtype {q_nope.dtype} differs from the planned q_data_type {p['q_dtype']}")
        if ckv_cache.dtype != p["kv_dtype"] or kpe_cache.dtype != p["kv_dtype"]:
            raise ValueError(f"KV cache dtype {ckv_cache.dtype} differs from the planned kv_data_type {p['kv_dtype']}")
        ckv_c = ckv_cache.squeeze(2) if ckv_cache.dim() == 4 else ckv_cache  # [P, ps, ckv]
        kpe_c = kpe_cache.squeeze(2) if kpe_cache.dim() == 4 else kpe_cache  # [P, ps, kpe]
        total_q, heads = q_nope.shape[:2]
        if heads != p["num_heads"] or q_nope.shape[-1] != p["ckv"] or q_pe.shape[-1] != p["kpe"]:
            raise ValueError(f"query shapes {tuple(q_nope.shape)} / {tuple(q_pe.shape)} disagree with the plan "
                             f"(num_heads {p['num_heads']}, ckv {p['ckv']}, kpe {p['kpe']})")
        if ckv_c.shape[1] != p["page_size"] or ckv_c.shape[-1] != p["ckv"] or kpe_c.shape[-1] != p["kpe"]:
            raise ValueError(f"KV cache shapes {tuple(ckv_cache.shape)} / {tuple(kpe_cache.shape)} disagree with the "
                             f"plan (page_size {p['page_size']})")
        if int(p["qo"][-1]) != total_q:
            raise OutOfContractError("qo_indptr", f"plans {int(p['qo'][-1])} query rows, the query has {total_q}")
        res = torch.zeros(total_q, heads, p["ckv"], dtype=torch.float64)
        lse_e = torch.full((total_q, heads), -math.inf, dtype=torch.float64)
        pages_all = p["kv_indices"].to("cpu", torch.int64)
        for i in range(p["qo"].numel() - 1):
            q0, q1 = int(p["qo"][i]), int(p["qo"][i + 1])
            n = int(p["lens"][i])
            q_len = q1 - q0
            if q_len == 0:
                continue
            if p["causal"] and q_len > n:
                raise OutOfContractError("causal", f"request {i} has qo_len {q_len} > kv_len {n}, which FlashInfer's "
                                                   "causal MLA does not support")
            if n == 0:
                continue
            pages = pages_all[int(p["kv"][i]): int(p["kv"][i + 1])]
            check_index_range("kv_indices", pages, ckv_c.shape[0])
            k_c = as_float64(gather_pages(ckv_c, pages, n, flag="kv_indices"), ckv_scale if fp8 else None)  # [n, ckv]
            k_p = as_float64(gather_pages(kpe_c, pages, n, flag="kv_indices"), kpe_scale if fp8 else None)  # [n, kpe]
            scores = (torch.einsum("qhd,nd->hqn", as_float64(q_nope[q0:q1]), k_c)
                      + torch.einsum("qhd,nd->hqn", as_float64(q_pe[q0:q1]), k_p)) * p["sm_scale"]
            visible = bottom_right_visible(q_len, torch.arange(n), n, causal=p["causal"])
            o, l = attend(scores, k_c[:, None, :].expand(n, heads, p["ckv"]), visible)
            res[q0:q1] = o
            lse_e[q0:q1] = l.T
        o = write_out(res, out, p["output_dtype"], q_nope.device)
        if not (return_lse or lse is not None):
            return o
        value = to_base2(lse_e) if base == "base2" else lse_e
        lse_t = write_out(value, lse, torch.float32, q_nope.device)
        return o, lse_t


# --------------------------------------------------------------------------------------------
# trtllm_batch_decode_with_kv_cache_mla
# --------------------------------------------------------------------------------------------


def get_device_sm_count(device=None) -> int:
    """``flashinfer.utils.get_device_sm_count``: no device is queried; the emulated B200's 148 SMs."""
    return EMULATED_SM_COUNT


def get_trtllm_gen_multi_ctas_kv_counter_bytes(batch_size: int, num_qo_heads: int, sm_count: int) -> int:
    """``flashinfer.utils.get_trtllm_gen_multi_ctas_kv_counter_bytes``: the library's formula."""
    num_semaphores = -(-max(batch_size * num_qo_heads, sm_count) // 8) * 8
    return num_semaphores * 4


def _scalar(name: str, value) -> float:
    if isinstance(value, torch.Tensor):
        if value.dtype != torch.float32:
            raise TypeError(f"{name} tensor must have dtype torch.float32")
        if value.numel() != 1:
            raise OutOfContractError(name, f"a tensor of {value.numel()} elements: only one scale is modelled")
        return float(value.item())
    return float(value)


def trtllm_batch_decode_with_kv_cache_mla(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    workspace_buffer: torch.Tensor,
    qk_nope_head_dim: int,
    kv_lora_rank: int,
    qk_rope_head_dim: int,
    block_tables: torch.Tensor,
    seq_lens: Optional[torch.Tensor],
    max_seq_len: int,
    sparse_mla_top_k: int = 0,
    out: Optional[torch.Tensor] = None,
    bmm1_scale=1.0,
    bmm2_scale=1.0,
    sinks=None,
    skip_softmax_threshold_scale_factor: Optional[float] = None,
    enable_pdl: Optional[bool] = None,
    backend: str = "auto",
    is_var_seq: bool = True,
    uses_shared_paged_kv_idx: bool = True,
    lse: Optional[torch.Tensor] = None,
    return_lse: bool = False,
    cute_dsl_impl: str = "auto",
    kv_scale_format: str = "auto",
    cum_seq_lens_q: Optional[torch.Tensor] = None,
    max_q_len: Optional[int] = None,
    multi_ctas_kv_counter_buffer: Optional[torch.Tensor] = None,
    sparse_mla_top_k_lens: Optional[torch.Tensor] = None,
    enable_dcp: bool = False,
    cp_world: int = 1,
    cp_rank: int = 0,
    causal_seqlens_kv_global: Optional[torch.Tensor] = None,
    use_fp16_softmax: Optional[bool] = None,
    return_lse_base: Optional[str] = None,
):
    """``flashinfer.decode.trtllm_batch_decode_with_kv_cache_mla`` (dense, trtllm-gen / cute-dsl); ``out`` or ``(out, lse)``."""
    if return_lse_base is not None and return_lse_base not in ("basee", "base2"):
        raise ValueError(f"return_lse_base must be 'basee', 'base2', or None; got {return_lse_base!r}")
    b1 = _scalar("bmm1_scale", bmm1_scale)
    b2 = _scalar("bmm2_scale", bmm2_scale)
    if max_q_len is not None and cum_seq_lens_q is None:
        raise ValueError("max_q_len is only supported when cum_seq_lens_q is provided")
    for flag, value in (("sinks", sinks), ("skip_softmax_threshold_scale_factor", skip_softmax_threshold_scale_factor),
                        ("sparse_mla_top_k_lens", sparse_mla_top_k_lens)):
        if value is not None:
            raise OutOfContractError(flag, "not modelled")
    if sparse_mla_top_k:
        raise OutOfContractError("sparse_mla_top_k", "sparse MLA is not modelled")
    if use_fp16_softmax:
        raise OutOfContractError("use_fp16_softmax", "the fp16-softmax cubins are not modelled")
    if not uses_shared_paged_kv_idx:
        raise OutOfContractError("uses_shared_paged_kv_idx", "separate K/V page tables are not modelled")
    if backend not in ("auto", "trtllm-gen", "cute-dsl"):
        raise OutOfContractError("backend", f"{backend!r}: only trtllm-gen and cute-dsl are modelled")
    if seq_lens is None:
        raise ValueError("seq_lens is required for trtllm-gen and cute-dsl MLA backends")
    # DCP arguments (_core.py _validate_mla_dcp_args)
    if not enable_dcp:
        extra = [f"cp_world={cp_world}" if cp_world != 1 else "", f"cp_rank={cp_rank}" if cp_rank != 0 else "",
                 "causal_seqlens_kv_global" if causal_seqlens_kv_global is not None else ""]
        if any(extra):
            raise ValueError("DCP arguments require enable_dcp=True; got " + ", ".join(e for e in extra if e))
    else:
        if not 0 <= cp_rank < cp_world:
            raise ValueError(f"cp_rank must satisfy 0 <= cp_rank < cp_world, got cp_rank={cp_rank}, cp_world={cp_world}")
        if backend not in ("auto", "cute-dsl"):
            raise ValueError(f"enable_dcp=True is only supported by backend='cute-dsl', got backend={backend!r}")
        if not return_lse:
            raise ValueError("enable_dcp=True requires return_lse=True so rank-local attention states can be merged")
        if causal_seqlens_kv_global is None:
            raise ValueError("causal_seqlens_kv_global is required when enable_dcp=True")
        if causal_seqlens_kv_global.dtype != torch.int32:
            raise ValueError(f"causal_seqlens_kv_global must have dtype torch.int32, got {causal_seqlens_kv_global.dtype}")
        if cum_seq_lens_q is not None:
            raise OutOfContractError("cum_seq_lens_q", "compact variable-length queries under DCP are not modelled")
        backend = "cute-dsl"
    if (kv_lora_rank, qk_rope_head_dim) not in _MLA_DIMS:
        raise OutOfContractError("kv_lora_rank", f"{kv_lora_rank} + {qk_rope_head_dim}: the dense kernels model "
                                                 "512 + 64 and 256 + 64")
    check_dtype("query", query, (torch.bfloat16, torch.float16, torch.float8_e4m3fn))
    check_dtype("kv_cache", kv_cache, (torch.bfloat16, torch.float16, torch.float8_e4m3fn))
    check_dtype("block_tables", block_tables, (torch.int32,))
    check_dtype("seq_lens", seq_lens, (torch.int32,))
    cache = kv_cache.squeeze(1) if kv_cache.dim() == 4 else kv_cache  # [P, ps, D]
    if kv_cache.dim() == 4 and kv_cache.shape[1] != 1 or cache.dim() != 3:
        raise ValueError(f"Expected kv_cache [num_pages, page_size, D] or [num_pages, 1, page_size, D], got "
                         f"{tuple(kv_cache.shape)}")
    d = kv_lora_rank + qk_rope_head_dim
    if query.shape[-1] != d or cache.shape[-1] != d:
        raise ValueError(f"Expected head dim {d} for query and kv_cache, got {query.shape[-1]} and {cache.shape[-1]}")
    page_size = cache.shape[1]
    heads = query.shape[-2]

    # Query rows per request: (start row in the flattened query, q_len).
    if cum_seq_lens_q is not None:
        if query.dim() != 3:
            raise ValueError("query must have shape [total_q, num_heads, head_dim_qk] when cum_seq_lens_q is provided")
        cu = _indptr("cum_seq_lens_q", cum_seq_lens_q)
        if int(cu[-1]) != query.shape[0]:
            raise ValueError("cum_seq_lens_q[-1] must match the flattened query length")
        batch = cu.numel() - 1
        segments = [(int(cu[i]), int(cu[i + 1] - cu[i])) for i in range(batch)]
        if return_lse or lse is not None:
            if backend == "trtllm-gen":
                raise NotImplementedError("trtllm-gen MLA does not support return_lse/lse with cum_seq_lens_q")
            backend = "cute-dsl"
        q_flat = query
    else:
        if query.dim() != 4:
            raise ValueError(f"Expected query.ndim == 4 without cum_seq_lens_q, got {query.dim()}")
        batch, q_len = query.shape[:2]
        segments = [(i * q_len, q_len) for i in range(batch)]
        q_flat = query.reshape(batch * q_len, heads, d)
    if block_tables.dim() != 2 or block_tables.shape[0] != batch or seq_lens.shape[0] != batch:
        raise ValueError(f"Expected block_tables [{batch}, max_pages] and seq_lens [{batch}], got "
                         f"{tuple(block_tables.shape)} and {tuple(seq_lens.shape)}")

    trtllm_reason = None
    if 64 < heads < 128:
        trtllm_reason = f"trtllm-gen MLA decode does not support 64 < num_heads_q < 128; got num_heads_q={heads}."
    elif page_size not in (32, 64):
        trtllm_reason = f"trtllm-gen requires block_size in (32, 64), got {page_size}"
    if backend == "trtllm-gen" and trtllm_reason:
        raise ValueError(trtllm_reason)
    if backend == "auto":
        if (return_lse or lse is not None) and return_lse_base is None:
            raise OutOfContractError("return_lse_base", "backend='auto' with return_lse and no return_lse_base: the "
                                                        "LSE is base 2 if the autotuner picks trtllm-gen and natural "
                                                        "log if it picks cute-dsl")
        backend = "trtllm-gen" if trtllm_reason is None else "cute-dsl"
    if backend == "cute-dsl" and block_tables.shape[1] % (128 // page_size if page_size <= 128 else 1):
        raise ValueError(f"Expected block_num % (128 / block_size) == 0, got block_num={block_tables.shape[1]} "
                         f"and block_size={page_size}")
    if backend == "cute-dsl" and multi_ctas_kv_counter_buffer is not None:
        raise ValueError("multi_ctas_kv_counter_buffer is only supported when a trtllm-gen runner is selected")
    if multi_ctas_kv_counter_buffer is not None:
        need = get_trtllm_gen_multi_ctas_kv_counter_bytes(batch, heads, get_device_sm_count())
        have = multi_ctas_kv_counter_buffer.numel() * multi_ctas_kv_counter_buffer.element_size()
        if have < need:
            raise ValueError(f"multi_ctas_kv_counter_buffer is too small: got {have} bytes, need {need} bytes")
    lens = seq_lens.to("cpu", torch.int64)
    if bool((lens < 0).any()):
        raise OutOfContractError("seq_lens", f"negative length in {lens.tolist()}")
    if batch and int(lens.max()) > int(max_seq_len):
        raise OutOfContractError("max_seq_len", f"{max_seq_len} is below the longest seq_lens entry {int(lens.max())}: "
                                                "the kernel schedules only max_seq_len tokens")
    if enable_dcp:
        bounds = causal_seqlens_kv_global.to("cpu", torch.int64)
        if bounds.shape != (batch,):
            raise ValueError(f"causal_seqlens_kv_global must have shape ({batch},), got {tuple(bounds.shape)}")

    total_q = q_flat.shape[0]
    empty_out = 0.0 if backend == "cute-dsl" else math.nan
    empty_lse = -math.inf if backend == "cute-dsl" else math.nan
    res = torch.full((total_q, heads, kv_lora_rank), empty_out, dtype=torch.float64)
    lse_e = torch.full((total_q, heads), empty_lse, dtype=torch.float64)
    for i, (row0, q_len) in enumerate(segments):
        n = int(lens[i])
        if q_len == 0 or n == 0:
            continue
        rows = as_float64(gather_pages(cache, block_tables[i], n, flag="block_tables"))  # [n, D] raw values
        scores = torch.einsum("qhd,nd->hqn", as_float64(q_flat[row0:row0 + q_len]), rows) * b1
        if enable_dcp:
            key_pos = torch.arange(n, dtype=torch.int64) * cp_world + cp_rank  # global positions on this rank
            visible = bottom_right_visible(q_len, key_pos, int(bounds[i]), causal=True)
        else:
            visible = bottom_right_visible(q_len, torch.arange(n), n, causal=True)
        o, l = attend(scores, rows[:, None, :kv_lora_rank].expand(n, heads, kv_lora_rank), visible)
        seen = ~torch.isneginf(l).T  # [q_len, heads]
        res[row0:row0 + q_len] = torch.where(seen[..., None], o * b2, res[row0:row0 + q_len])
        lse_e[row0:row0 + q_len] = torch.where(seen, l.T, lse_e[row0:row0 + q_len])
    out_shape = tuple(query.shape[:-1]) + (kv_lora_rank,)
    o = write_out(res.reshape(out_shape), out, torch.bfloat16, query.device)
    if not return_lse:
        return o
    base2 = (return_lse_base == "base2") if return_lse_base is not None else backend == "trtllm-gen"
    value = to_base2(lse_e) if base2 else lse_e
    if lse is not None and lse.dim() == 3:
        value = value.reshape(lse.shape)
    return o, write_out(value, lse, torch.float32, query.device)


#: The real callable each emulation stands in for ("module:qualname") -> the emulation.
EMULATIONS = {
    "flashinfer.mla:BatchMLAPagedAttentionWrapper": BatchMLAPagedAttentionWrapper,
    "flashinfer.decode:trtllm_batch_decode_with_kv_cache_mla": trtllm_batch_decode_with_kv_cache_mla,
    "flashinfer.utils:get_device_sm_count": get_device_sm_count,
    "flashinfer.utils:get_trtllm_gen_multi_ctas_kv_counter_bytes": get_trtllm_gen_multi_ctas_kv_counter_bytes,
}
