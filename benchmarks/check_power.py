"""What the discriminating inputs and the power measurement cost a kernel check (numbers, not a test).

    python benchmarks/check_power.py            # the default cases, best of 3
    python benchmarks/check_power.py --repeat 5 --no-kernel
    python benchmarks/check_power.py --threads 1 --cpu-time   # on a machine other jobs load

For each case (DeepSeek-V3's MLA at its YaRN scale: decode, DCP 4, an EAGLE
chain, a draft tree, an FP8 cache) it times, best of ``--repeat``:

- **flat**: the old inputs (``clamp(randn / 10)`` queries: ``logits=None``)
  and the float64 reference — what a check did before issue 20;
- **checked**: ``harness.gen_checked_inputs`` as a check runs it (the planted logit profile and
  ``power.measure_power`` on it, fallback profiles only if a fault slips
  through, with the output magnitude the relative bound needs computed on the
  way) and the reference — what a check does now before the kernel runs;
- **check**: one whole ``harness.run_kernel_check`` of this repository's
  Triton kernel (interpreted without a GPU), which includes *checked*.

Both time a case seen for the first time: the harness keeps a case's checked
inputs per process (one case serves every arch and backend of a cell's
model, DCP size, speculative setting and cache dtype), so *checked* calls the
uncached generator and each *check* repeat starts with that cache empty.

The last column is the ratio of a whole check now to the same check with the
flat inputs: ``check / (check - checked + flat)``; the target is at most 1.2.
An FP8 case runs twice by design (``k_scale = 1`` and a calibrated-style
power of two, ``harness.kv_scale_variants``); its times are for one run.

The interpreted kernel's share depends on torch's thread count (one thread, as
each xdist worker of a 2-core run gets, interprets it several times faster
than two), so ``--threads`` sets it; on a machine other jobs load,
``--cpu-time`` times this process's CPU time rather than the wall clock (with
one thread the two agree on an idle machine).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("TRITON_INTERPRET", "1")

CASES = (
    ("decode", {"dcp": 1, "spec": "none", "kv_dtype": "auto"}),
    ("dcp4", {"dcp": 4, "spec": "none", "kv_dtype": "auto"}),
    ("eagle-1x3", {"dcp": 1, "spec": "eagle-1x3", "kv_dtype": "auto"}),
    ("eagle-4x3 tree", {"dcp": 1, "spec": "eagle-4x3", "kv_dtype": "auto"}),
    ("fp8_e4m3", {"dcp": 1, "spec": "none", "kv_dtype": "fp8_e4m3"}),
)


def best_of(repeat: int, fn, clock=time.perf_counter) -> float:
    times = []
    for _ in range(repeat):
        start = clock()
        fn()
        times.append(clock() - start)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="best of N (default 3)")
    parser.add_argument("--no-kernel", action="store_true", help="inputs only: skip the whole-check column")
    parser.add_argument("--model", default="deepseek-v3")
    parser.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default: torch's own)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time this process's CPU time, not the wall clock (use with --threads 1 on a busy machine)")
    args = parser.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.process_time if args.cpu_time else time.perf_counter

    from pytest_mla.core.models import BUILTIN_MODELS
    from pytest_mla.kernels.compare import tolerance_for
    from pytest_mla.kernels import harness
    from pytest_mla.kernels.harness import case_for, run_kernel_check
    from pytest_mla.kernels.inputs import gen_decode_inputs
    from pytest_mla.kernels.reference import ref_mla_decode

    model = BUILTIN_MODELS[args.model]
    load = " ".join(open("/proc/loadavg").read().split()[:3]) if Path("/proc/loadavg").exists() else "?"
    print(f"# {args.model}: softmax scale {model.softmax_scale:.5f}, best of {args.repeat}; "
          f"{'CPU' if args.cpu_time else 'wall'} seconds, {torch.get_num_threads()} thread(s), load {load}")
    print(f"{'case':16} {'flat':>8} {'checked':>8} {'x':>6} {'check':>8} {'check ratio':>12}")
    worst = 0.0
    for label, coords in CASES:
        case = case_for({"model": args.model, "backend": "triton", "arch": "sm90", "page_size": 64, **coords},
                        model, seed=1234)
        tol = tolerance_for(case.dtype, case.kv_dtype)
        variant = case.kv_scales[-1] if case.kv_scales else None

        def flat():
            x = gen_decode_inputs(
                case.seqlens, s_q=case.s_q, h_q=case.h_q, h_kv=case.h_kv, d_qk=case.d_qk, d_v=case.d_v,
                mla=case.mla, page_size=case.page_size, dtype=case.dtype, kv_dtype=case.kv_dtype,
                softmax_scale=case.softmax_scale, spec_topk=case.spec_topk, spec_steps=case.spec_steps,
                seed=case.seed, logits=None, dcp=(case.dcp, case.dcp_interleave), kv_scale=variant)
            ref_mla_decode(**x.ref_args())

        def checked():
            # uncached (harness keeps a case's inputs per process): the cost a case pays the first time
            x, _, _ = harness._generate_checked_inputs(case, tol.out, variant)  # the magnitude comes with the power
            ref_mla_decode(**x.ref_args())

        t_flat, t_checked = best_of(args.repeat, flat, clock), best_of(args.repeat, checked, clock)
        line = f"{label:16} {t_flat:8.3f} {t_checked:8.3f} {t_checked / t_flat:6.1f}"
        if not args.no_kernel:
            runs = max(len(case.kv_scales), 1)
            def cold_check():
                harness._INPUTS_CACHE.clear()  # every repeat a case seen for the first time
                return run_kernel_check(case, "pytest_mla.kernels.triton_mla:mla_decode")

            t_check = best_of(args.repeat, cold_check, clock) / runs
            ratio = t_check / max(t_check - t_checked + t_flat, 1e-9)
            worst = max(worst, ratio)
            line += f" {t_check:8.3f} {ratio:12.2f}"
        print(line)
    if not args.no_kernel:
        print(f"worst whole-check ratio (checked inputs / flat inputs): {worst:.2f} (target <= 1.2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
