"""Benchmark the project's Triton MLA decode kernel (prints numbers and ratios; not a test).

On a GPU: FlashMLA's roofline shapes (b=128, h_q 16/128, s_q 1/2, s_k 4096/8192,
bf16 and fp8 KV) timed with ``triton.testing.do_bench``; GB/s, TFLOP/s and the
fraction of a measured device-to-device copy bandwidth; FlashMLA / FlashInfer
on the same inputs when they are importable.

On CPU (``TRITON_INTERPRET=1``): seconds per call for the shapes the kernel
cells of the CI matrix use, so cells can be sized for 2 CPU cores.

    python benchmarks/kernel.py [--quick]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pytest_mla.kernels import _mode  # noqa: E402

MODE = _mode.ensure_triton_mode()  # before anything imports triton kernels

import torch  # noqa: E402
import triton  # noqa: E402

from pytest_mla.kernels.triton_mla import default_num_splits, mla_decode  # noqa: E402

D_QK, D_V = 576, 512  # DeepSeek-V3: kv_lora_rank 512 + rope 64


def roofline(b: int, s_q: int, h_q: int, s_k: int, kv_bytes: int = 2) -> tuple[float, float]:
    """(bytes, flops) of one call, FlashMLA's formulas (KV read once, q and out once)."""
    nbytes = b * (s_k * D_QK * kv_bytes + s_q * h_q * D_QK * 2 + s_q * h_q * D_V * 2)
    flops = 2 * b * s_q * h_q * s_k * (D_QK + D_V)
    return nbytes, flops


def make_inputs(b, s_q, h_q, s_k, page_size, dtype, fp8, device, d_qk=D_QK, d_v=D_V):
    """Uniform-length requests on a shuffled paged cache (no NaN poisoning: timing only)."""
    pages = triton.cdiv(s_k, page_size)
    q = (torch.randn(b, s_q, h_q, d_qk, device=device) / 10).to(dtype)  # [b, s_q, h_q, d_qk]
    kv = torch.randn(b * pages, page_size, 1, d_qk, device=device) / 10  # [num_pages, page_size, 1, d_qk]
    kv_scale = None
    if fp8:
        kv_scale = 1.0 / 256
        kv = (kv / kv_scale).to(torch.float8_e4m3fn)
    else:
        kv = kv.to(dtype)
    block_table = torch.randperm(b * pages, device=device).to(torch.int32).view(b, pages)  # [b, pages]
    seqlens = torch.full((b,), s_k, dtype=torch.int32, device=device)  # [b]
    return q, kv, block_table, seqlens, kv_scale


def copy_bandwidth(device) -> float:
    """Bytes/s of a large device-to-device copy (read + write)."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x))
    return 2 * x.numel() / (ms * 1e-3)


def _other_kernels(q, kv, block_table, seqlens, softmax_scale):
    """Callables of FlashMLA / FlashInfer on the same inputs, where importable."""
    found = {}
    try:
        import flash_mla  # type: ignore

        meta, splits = flash_mla.get_mla_metadata(seqlens, q.shape[1] * q.shape[2], 1)
        found["flash_mla"] = lambda: flash_mla.flash_mla_with_kvcache(
            q, kv, block_table, seqlens, D_V, meta, splits, softmax_scale=softmax_scale, causal=True)
    except Exception as exc:  # noqa: BLE001 - report and go on
        print(f"  flash_mla unavailable: {type(exc).__name__}: {exc}")
    return found


def bench_gpu(quick: bool) -> None:
    device = torch.device("cuda")
    bw = copy_bandwidth(device)
    print(f"device: {torch.cuda.get_device_name()} ({MODE}); measured copy bandwidth {bw / 1e9:.0f} GB/s")
    shapes = [(128, s_q, h_q, s_k, fp8) for fp8 in (False, True) for h_q in (16, 128) for s_q in (1, 2)
              for s_k in (4096, 8192)]
    if quick:
        shapes = shapes[:4]
    print(f"{'kv':>5} {'b':>4} {'s_q':>3} {'h_q':>4} {'s_k':>5} {'splits':>6} {'us':>8} {'GB/s':>7} "
          f"{'TFLOP/s':>8} {'of copy':>7}")
    for b, s_q, h_q, s_k, fp8 in shapes:
        q, kv, block_table, seqlens, kv_scale = make_inputs(b, s_q, h_q, s_k, 64, torch.bfloat16, fp8, device)
        scale = 1 / math.sqrt(D_QK)
        splits = default_num_splits(b, h_q, s_k, s_q=s_q, d_v=D_V,
                                    num_sms=torch.cuda.get_device_properties(device).multi_processor_count)
        out = torch.empty(b, s_q, h_q, D_V, dtype=torch.bfloat16, device=device)

        def run():
            return mla_decode(q, kv, block_table, seqlens, D_V, scale, True, kv_scale, splits, out=out,
                              check_inputs=False)

        ms = triton.testing.do_bench(run)
        nbytes, flops = roofline(b, s_q, h_q, s_k, kv_bytes=1 if fp8 else 2)
        gbs = nbytes / (ms * 1e-3) / 1e9
        print(f"{'fp8' if fp8 else 'bf16':>5} {b:>4} {s_q:>3} {h_q:>4} {s_k:>5} {splits:>6} {ms * 1e3:>8.1f} "
              f"{gbs:>7.0f} {flops / (ms * 1e-3) / 1e12:>8.1f} {gbs * 1e9 / bw:>7.0%}")
        if not fp8:
            for name, fn in _other_kernels(q, kv, block_table, seqlens, scale).items():
                other = triton.testing.do_bench(fn)
                print(f"{'':>5} {name:>28} {other * 1e3:>8.1f} {nbytes / (other * 1e-3) / 1e9:>7.0f} "
                      f"ours/theirs time {ms / other:.2f}x")


def bench_interpreter(quick: bool) -> None:
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))  # CI runs on 2 cores
    print(f"mode: {MODE} (torch threads {torch.get_num_threads()}); seconds per call, best of 3")
    print("known bar (kernels.md): B=2 H=16 ~300 tokens fp32 0.3-0.45 s; B=2 H=128 512 tokens ~2.8 s")
    cases = [  # (label, b, s_q, h_q, lengths, dtype, fp8, page_size, d_qk, d_v, splits)
        ("bar: B=2 H=16 ~300 tok", 2, 1, 16, (300, 257), torch.float32, False, 64, D_QK, D_V, None),
        ("bar: B=2 H=128 512 tok", 2, 1, 128, (512, 512), torch.float32, False, 64, D_QK, D_V, None),
        ("ci: b2 h16 sq1 bf16", 2, 1, 16, (64, 33), torch.bfloat16, False, 64, D_QK, D_V, None),
        ("ci: b3 h16 sq4 bf16", 3, 4, 16, (64, 17, 40), torch.bfloat16, False, 64, D_QK, D_V, None),
        ("ci: b2 h128 sq1 bf16", 2, 1, 128, (64, 48), torch.bfloat16, False, 64, D_QK, D_V, None),
        ("ci: b2 h128 sq4 bf16", 2, 4, 128, (64, 48), torch.bfloat16, False, 64, D_QK, D_V, None),
        ("ci: b2 h64 sq13 bf16 (tree)", 2, 13, 64, (64, 30), torch.bfloat16, False, 64, D_QK, D_V, None),
        ("ci: b2 h16 sq1 fp8 kv", 2, 1, 16, (64, 33), torch.bfloat16, True, 64, D_QK, D_V, None),
        ("ci: b2 h16 sq1 page1", 2, 1, 16, (64, 33), torch.bfloat16, False, 1, D_QK, D_V, None),
        ("ci: b2 h16 sq1 4 splits", 2, 1, 16, (64, 33), torch.bfloat16, False, 64, D_QK, D_V, 4),
        ("test sweep: b5 h16 80/64", 5, 2, 16, (0, 2, 15, 17, 35), torch.bfloat16, False, 16, 80, 64, None),
    ]
    if quick:
        cases = cases[:3]
    print(f"{'case':<30} {'s/call':>7} {'tokens':>7}")
    for label, b, s_q, h_q, lens, dtype, fp8, page, d_qk, d_v, splits in cases:
        q, kv, block_table, _, kv_scale = make_inputs(b, s_q, h_q, max(lens), page, dtype, fp8, "cpu",
                                                      d_qk=d_qk, d_v=d_v)
        seqlens = torch.tensor(lens, dtype=torch.int32)
        mla_decode(q, kv, block_table, seqlens, d_v, None, True, kv_scale, splits)  # warm-up
        best = math.inf
        for _ in range(3):
            start = time.perf_counter()
            mla_decode(q, kv, block_table, seqlens, d_v, None, True, kv_scale, splits)
            best = min(best, time.perf_counter() - start)
        print(f"{label:<30} {best:>7.3f} {sum(lens):>7}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few shapes only")
    args = parser.parse_args()
    if MODE == "interpreter":
        bench_interpreter(args.quick)
    elif MODE == "cpu":
        print("no GPU and TRITON_INTERPRET=0: nothing to run")
    else:
        bench_gpu(args.quick)


if __name__ == "__main__":
    main()
