"""DCP: sharded, per-rank kernel calls merged by LSE equal the float64 reference on the unsharded cache.

Runs the Triton ``mla_decode`` (interpreter on CPU) when it imports, else the
float64 stand-in ``ref_kernel`` (the sharding/merge plumbing is still tested).
"""

from __future__ import annotations

import os
import time

import pytest
import torch

from pytest_mla.kernels.compare import TOLERANCES, check_close
from pytest_mla.kernels.dcp import dcp_owner, gen_dcp_shards, run_dcp
from pytest_mla.kernels.distributed import DcpRankError, DcpTimeoutError, run_distributed
from pytest_mla.kernels.inputs import gen_decode_inputs
from pytest_mla.kernels.reference import ref_global_positions, ref_kernel, ref_merge, ref_mla_decode

TOL = TOLERANCES["bf16"]
SPECS = {"none": (1, 0, 1), "chain": (1, 3, 4), "tree": (2, 2, 5)}  # topk, steps, s_q


def _load_kernel():
    try:
        from pytest_mla.kernels._mode import ensure_triton_mode

        ensure_triton_mode()
        from pytest_mla.kernels.triton_mla import mla_decode, merge_attention_states
    except ImportError:
        return "ref", ref_kernel, ref_merge
    return "triton", mla_decode, merge_attention_states


KERNEL_NAME, KERNEL, MERGE = _load_kernel()


def _device() -> str:
    """Where the kernel runs: a GPU when Triton compiles for one, else the CPU (interpreter or reference)."""
    if KERNEL_NAME != "triton":
        return "cpu"
    from pytest_mla.kernels import triton_mla

    return "cpu" if triton_mla.TRITON_MODE in ("interpreter", "cpu") else "cuda"


DEVICE = _device()
KERNEL_STRING = (
    "pytest_mla.kernels.triton_mla:mla_decode" if KERNEL_NAME == "triton" else "pytest_mla.kernels.reference:ref_kernel"
)
MERGE_STRING = None if KERNEL_NAME == "triton" else "pytest_mla.kernels.reference:ref_merge"


def dcp_lengths(world: int, interleave: int, s_q: int) -> list[int]:
    """Lengths below, at and past N (and N·I), not multiples of N; 0 (empty); all >= s_q as the kernel needs."""
    block = world * interleave
    wanted = [0, 1, world - 1, world, block + 1, 2 * block + 3, s_q, s_q + 1]
    return sorted({n for n in wanted if n == 0 or n >= s_q})


def gen_case(world, interleave, spec, *, mla=True, seed=0, **dims):
    topk, steps, s_q = SPECS[spec]
    dims = {"h_q": 4, "d_qk": 80, "d_v": 64, "page_size": 4, **dims}  # d 64 + 16
    return gen_decode_inputs(dcp_lengths(world, interleave, s_q), s_q=s_q, h_kv=1 if mla else 2, mla=mla,
                             spec_topk=topk, spec_steps=steps, seed=seed, **dims).to(DEVICE)


def check_against_ref(x, out, lse, tol=TOL):
    ref_out, ref_lse = ref_mla_decode(**x.ref_args())
    return check_close("out", out, ref_out, tol.out), check_close("lse", lse, ref_lse, tol.lse)


SWEEP = [
    (world, interleave, spec)
    for world in (1, 2, 3, 4, 8)
    for interleave in (1, 3)
    for spec in SPECS
    if world > 1 or interleave == 1
]


@pytest.mark.parametrize("world,interleave,spec", SWEEP, ids=[f"dcp{w}-i{i}-{s}" for w, i, s in SWEEP])
def test_dcp_merge_matches_unsharded_reference(world, interleave, spec):
    x = gen_case(world, interleave, spec, seed=world * 100 + interleave * 10 + len(spec))
    shards = gen_dcp_shards(x, world, interleave, seed=1)
    if any(0 < n <= (world - 1) * interleave for n in x.cache_seqlens.tolist()):  # some rank must be empty
        locals_ = torch.stack([s.inputs.cache_seqlens for s in shards])  # [N, b]
        assert ((locals_ == 0) & (x.cache_seqlens > 0)).any()
    out, lse = run_dcp(KERNEL, x, world, interleave, merge=MERGE, seed=1)
    res_out, res_lse = check_against_ref(x, out, lse)
    assert res_out.ok, res_out.message
    assert res_lse.ok, res_lse.message


@pytest.mark.parametrize("mla,kv_dtype", [(False, "auto"), (True, "fp8_e4m3"), (False, "fp8_e4m3")])
def test_dcp_gqa_and_fp8(mla, kv_dtype):
    x = gen_case(4, 2, "tree", mla=mla, kv_dtype=kv_dtype, seed=5)
    out, lse = run_dcp(KERNEL, x, 4, 2, merge=MERGE)
    res_out, res_lse = check_against_ref(x, out, lse, TOLERANCES["fp8_e4m3" if kv_dtype != "auto" else "bf16"])
    assert res_out.ok and res_lse.ok, (res_out.message, res_lse.message)


@pytest.mark.parametrize("world,spec", [(2, "tree"), (8, "chain")])
def test_dcp_real_deepseek_dims(world, spec):
    x = gen_case(world, 1, spec, h_q=16, d_qk=576, d_v=512, page_size=16, seed=9)
    out, lse = run_dcp(KERNEL, x, world, 1, merge=MERGE)
    res_out, res_lse = check_against_ref(x, out, lse)
    assert res_out.ok and res_lse.ok, (res_out.message, res_lse.message)


@pytest.mark.parametrize("world,interleave", [(1, 1), (3, 1), (4, 3)])
def test_shards_partition_the_cache(world, interleave):
    x = gen_case(world, interleave, "none", seed=2)
    shards = gen_dcp_shards(x, world, interleave, seed=3)
    for r, n in enumerate(x.cache_seqlens.tolist()):
        dense = torch.full((n, x.kv_cache.shape[-1]), float("nan"), device=x.kv_cache.device)
        for s in shards:
            local_n = int(s.inputs.cache_seqlens[r])
            pos = ref_global_positions(local_n, s.rank, world, interleave)
            assert (dcp_owner(pos, world, interleave) == s.rank).all()
            for j, g in enumerate(pos.tolist()):
                page = int(s.inputs.block_table[r, j // 4])
                dense[g] = s.inputs.kv_cache[page, j % 4, 0].float()
            if world > 1:  # past the local length the rank's pages are NaN
                last = -(-local_n // 4)
                if local_n % 4:
                    page = int(s.inputs.block_table[r, last - 1])
                    assert s.inputs.kv_cache[page, local_n % 4 :].float().isnan().all()
        assert not dense.isnan().any()  # every token on exactly one rank, at its global position
        for t in range(n):
            page = int(x.block_table[r, t // 4])
            assert torch.equal(dense[t], x.kv_cache[page, t % 4, 0].float())


@pytest.mark.parametrize("world,interleave,spec", [(2, 1, "chain"), (4, 1, "tree"), (4, 2, "chain")])
def test_local_positions_under_dcp_and_spec_fail(world, interleave, spec):
    """Masking by each rank's local token index (no global positions) must break tolerance.

    Every rank holds at least ``s_q`` tokens of every request, so a kernel run as
    if alone accepts the call (it refuses ``0 < S < s_q``) and computes wrong masks.
    """
    topk, steps, s_q = SPECS[spec]
    block = world * interleave
    x = gen_decode_inputs([block * s_q + 3, 2 * block * s_q + 1], s_q=s_q, h_q=4, d_qk=80, d_v=64, page_size=4,
                          spec_topk=topk, spec_steps=steps, seed=13).to(DEVICE)
    out, lse = run_dcp(KERNEL, x, world, interleave, merge=MERGE, pass_positions=False)
    res_out, res_lse = check_against_ref(x, out, lse)
    assert not res_out.ok and not res_lse.ok
    out, lse = run_dcp(KERNEL, x, world, interleave, merge=MERGE)  # the same with global positions passes
    assert all(r.ok for r in check_against_ref(x, out, lse))


def _merge_average(outs, lses):
    return torch.stack([o.float() for o in outs]).mean(0), torch.stack(lses).logsumexp(0)


def _merge_sum(outs, lses):
    return torch.stack([o.float() for o in outs]).sum(0), torch.stack(lses).logsumexp(0)


@pytest.mark.parametrize("merge", [_merge_average, _merge_sum], ids=["average", "sum"])
def test_merge_without_lse_weights_fails(merge):
    x = gen_case(4, 1, "chain", seed=17)
    out, lse = run_dcp(KERNEL, x, 4, 1, merge=merge)
    res_out, _ = check_against_ref(x, out, lse)
    assert not res_out.ok


# ---- distributed --------------------------------------------------------------------------------


def live_rank_processes() -> list[int]:
    """Our children still in the process table (zombies included) that run a DCP rank."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == me and b"pytest_mla.kernels.distributed" in cmdline:
            found.append(int(entry))
    return found


def hang_on_rank1(*args, dcp_rank=0, **kwargs):
    """A kernel whose rank 1 never returns (children import this module by name)."""
    if dcp_rank == 1:
        time.sleep(3600)
    return ref_kernel(*args, dcp_rank=dcp_rank, **kwargs)


def crash_on_rank1(*args, dcp_rank=0, **kwargs):
    if dcp_rank == 1:
        raise RuntimeError("planted rank failure")
    return ref_kernel(*args, dcp_rank=dcp_rank, **kwargs)


@pytest.mark.parametrize("world", [2, 4])
def test_distributed_matches_reference_and_cleans_up(world):
    x = gen_case(world, 1, "tree", seed=21)
    out, lse = run_distributed(KERNEL_STRING, x, world, 1, merge=MERGE_STRING, timeout_s=240)
    res_out, res_lse = check_against_ref(x, out, lse)
    assert res_out.ok and res_lse.ok, (res_out.message, res_lse.message)
    assert live_rank_processes() == []


def test_hung_rank_times_out_and_leaves_nothing():
    x = gen_case(2, 1, "none", seed=23)
    timeout = 12.0
    start = time.monotonic()
    # Under load rank 0 may still be starting up when the time is up: it is then "in the kernel"
    # too. Rank 1 always is, and every rank is killed.
    with pytest.raises(DcpTimeoutError, match=r"did not finish within 12 s \(still in the kernel: \[(0, )?1\]\); killed"):
        run_distributed(f"{__name__}:hang_on_rank1", x, 2, 1, merge="pytest_mla.kernels.reference:ref_merge",
                        timeout_s=timeout)
    assert time.monotonic() - start < timeout + 60  # the bound holds (not a speed check: rank 1 sleeps an hour)
    assert live_rank_processes() == []


def test_failing_rank_raises_with_its_traceback():
    x = gen_case(2, 1, "none", seed=29)
    with pytest.raises(DcpRankError, match="planted rank failure"):
        run_distributed(f"{__name__}:crash_on_rank1", x, 2, 1, merge="pytest_mla.kernels.reference:ref_merge",
                        timeout_s=60)
    assert live_rank_processes() == []
