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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pytest_mla.kernels.libraries import BENCH_SHAPES, bench_library_kernels  # noqa: E402


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
