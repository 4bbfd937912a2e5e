"""Benchmark the installed MLA decode libraries through their wrappers (prints numbers; not a test).

On a GPU: each wrapper this host can run (FlashMLA on sm90, FlashInfer MLA on
sm80+, TRT-LLM MLA on sm100) and the project's Triton kernel, on FlashMLA's
roofline shapes, timed with ``triton.testing.do_bench`` (metadata built once,
only the launch timed); ms, GB/s and TFLOP/s per (kernel, shape). On CPU it
says why nothing ran and exits 0.

    python benchmarks/libraries.py [--quick] [--dtype bf16|fp16]
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pytest_mla.kernels.libraries import prepare_launch  # noqa: E402
from pytest_mla.kernels.library_probe import LIBRARY_KERNELS, available_library_kernels  # noqa: E402


#: FlashMLA's roofline shapes: (b, s_q, h_q, s_k).
BENCH_SHAPES: tuple[tuple[int, int, int, int], ...] = (
    (128, 1, 16, 4096), (128, 1, 128, 4096), (128, 2, 128, 4096), (128, 1, 128, 8192),
)


def _bench_inputs(b, s_q, h_q, s_k, page_size, dtype, device, d_qk=576):
    import torch

    pages = -(-s_k // page_size)
    q = (torch.randn(b, s_q, h_q, d_qk, device=device) / 10).to(dtype)  # [b, s_q, h_q, 576]
    kv = (torch.randn(b * pages, page_size, 1, d_qk, device=device) / 10).to(dtype)  # [pages, page_size, 1, 576]
    table = torch.randperm(b * pages, device=device).to(torch.int32).view(b, pages)  # [b, pages]
    lens = torch.full((b,), s_k, dtype=torch.int32, device=device)
    return q, kv, table, lens


def bench_library_kernels(shapes: Sequence[tuple[int, int, int, int]] | None = None, *, host_arch: str | None = None,
                          dtype: str = "bf16", include_triton: bool = True,
                          print_fn: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Time each runnable wrapper (and the project's Triton kernel) with ``triton.testing.do_bench``.

    ``shapes`` are ``(b, s_q, h_q, s_k)``; each library gets its native page size,
    so only its launch is timed (metadata is built once, as an engine does).
    Prints one line per (kernel, shape) with ms, GB/s and TFLOP/s (FlashMLA's
    roofline formulas) and returns the rows. Without a CUDA GPU it prints why
    and returns ``[]``.
    """
    import torch

    if not torch.cuda.is_available():
        print_fn("bench_library_kernels: skipped, no CUDA GPU here (library kernels need sm80+)")
        return []
    from pytest_mla.kernels._mode import ensure_triton_mode

    arch = host_arch or ensure_triton_mode()
    import triton.testing

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    kernels: list[tuple[str, int, Callable]] = []
    for backend, (spec, reason) in available_library_kernels(arch).items():
        if spec is None:
            print_fn(f"{backend:<11} skipped: {reason}")
            continue
        lib = LIBRARY_KERNELS[backend]
        if dtype not in lib.dtypes:
            print_fn(f"{backend:<11} skipped: {dtype} not supported")
            continue
        kernels.append((backend, (lib.page_sizes or (64,))[-1], _launcher(backend)))
    if include_triton:
        from pytest_mla.kernels.triton_mla import mla_decode

        kernels.append(("triton", 64, lambda q, kv, t, lens, scale: (lambda: mla_decode(q, kv, t, lens, 512, scale))))
    rows = []
    for b, s_q, h_q, s_k in shapes or BENCH_SHAPES:
        nbytes = b * (s_k * 576 * 2 + s_q * h_q * 576 * 2 + s_q * h_q * 512 * 2)
        flops = 2 * b * s_q * h_q * s_k * (576 + 512)
        for name, page_size, make in kernels:
            q, kv, table, lens = _bench_inputs(b, s_q, h_q, s_k, page_size, torch_dtype, "cuda")
            try:
                launch = make(q, kv, table, lens, 576 ** -0.5)
                ms = triton.testing.do_bench(launch)
            except Exception as exc:  # one library failing must not hide the others
                print_fn(f"{name:<11} b={b} s_q={s_q} h_q={h_q} s_k={s_k}: failed: {type(exc).__name__}: {exc}")
                continue
            row = {"kernel": name, "b": b, "s_q": s_q, "h_q": h_q, "s_k": s_k, "page_size": page_size,
                   "dtype": dtype, "ms": ms, "gb_s": nbytes / ms / 1e6, "tflop_s": flops / ms / 1e9}
            rows.append(row)
            print_fn(f"{name:<11} b={b:<4} s_q={s_q} h_q={h_q:<4} s_k={s_k:<6} {ms * 1e3:9.1f} us "
                     f"{row['gb_s']:8.0f} GB/s {row['tflop_s']:7.1f} TFLOP/s")
    return rows


def _launcher(backend: str) -> Callable:
    """``make(q, kv, table, lens, scale) -> launch``: metadata built once, the launch timed alone."""
    def make(q, kv, table, lens, scale):
        return prepare_launch(backend, q, kv, table, lens, 512, scale)

    return make


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small shape")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    parser.add_argument("--no-triton", action="store_true", help="leave out the project's Triton kernel")
    args = parser.parse_args(argv)
    shapes = [(32, 1, 128, 2048)] if args.quick else list(BENCH_SHAPES)
    bench_library_kernels(shapes, dtype=args.dtype, include_triton=not args.no_triton)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
