"""The engine-check plumbing: the engine shards and merges, the harness compares with the reference.

``fake_engine`` plays a real engine with its own layout and merge; its
faults (a merge that ignores the LSE, local positions under DCP + spec, an
exception in its code) must be caught, its correct path verified, in
process (ranks taking turns) and over real gloo ranks.
"""

from __future__ import annotations

import threading

import pytest
import torch

from pytest_mla.core.kernelspec import KernelSpec
from pytest_mla.core.models import BUILTIN_MODELS
from pytest_mla.kernels.collectives import CollectiveError, run_ranks_in_process
from pytest_mla.kernels.engine_check import BackendRaised, run_engine_check
from pytest_mla.kernels.harness import case_for

from . import fake_engine


def spec(**options):
    return KernelSpec("fake", "tests.kernels.fake_engine:run", protocol="engine", level="backend",
                      package=fake_engine.PACKAGE, options=tuple(sorted(options.items())))


def case(dcp=1, spec_setting="none", model="deepseek-v2-lite", dtype="fp32", **coords):
    c = {"model": model, "backend": "x", "dcp": dcp, "spec": spec_setting, "arch": "sm90", **coords}
    return case_for(c, BUILTIN_MODELS[model], seed=7, dtype=dtype)


@pytest.mark.parametrize("dcp", [1, 2, 4])
@pytest.mark.parametrize("spec_setting", ["none", "eagle-1x3", "eagle-2x2"])
def test_correct_engine_verifies_in_process(dcp, spec_setting):
    rec = run_engine_check(case(dcp, spec_setting), spec())
    assert rec["status"] == "verified", rec["message"]
    assert rec["level"] == "backend"
    assert "tests.kernels.fake_engine:decode_rank" in rec["functions"]
    assert ("tests.kernels.fake_engine:merge" in rec["functions"]) == (dcp > 1)
    assert rec["errors"]["out"]["max_abs_err"] < 1e-5 and rec["errors"]["lse"]["max_abs_err"] < 1e-5


def test_fp8_caches_verify():
    for kv in ("fp8_e4m3", "fp8_e5m2"):
        rec = run_engine_check(case(2, kv_dtype=kv, dtype="bf16"), spec())
        assert rec["status"] == "verified", (kv, rec["message"])
        assert rec["case"]["kv_dtype"] == kv


def test_merge_that_ignores_lse_is_caught():
    rec = run_engine_check(case(2), spec(merge="average"))
    assert rec["status"] == "failed"
    assert "out:" in rec["message"]


@pytest.mark.parametrize("dcp", [1, 2])
def test_a_split_merge_fault_fails_the_schedule_case_the_short_case_cannot_see(dcp):
    """A backend that splits from 600 tokens: the check adds the schedule case (a request past the threshold,
    one a token into a fresh page, one on a page boundary), runs it first and records the split counts."""
    short = case(dcp, dtype="bf16")  # fp32's LSE bound (1e-5 absolute) is tighter than a 1,219-token LSE of 72 rounds to
    assert max(short.seqlens) < 600
    rec = run_engine_check(short, spec(splits_from=600, split_from=600))  # both per rank
    assert rec["status"] == "verified", rec["message"]
    assert rec["schedule"] == {"num_kv_splits": [1, 2]}
    long_run, short_run = rec["variants"]
    assert max(long_run["seqlens"]) >= 600 * dcp and long_run["schedule"] == {"num_kv_splits": [1, 2]}
    page = short.page_size
    assert page + 1 in long_run["seqlens"] and 2 * page in long_run["seqlens"]
    assert short_run["schedule"] == {"num_kv_splits": [1]} and "seqlens" not in short_run
    assert rec["case"]["seqlens"] == list(short.seqlens)  # the record leads with the short case when all pass
    assert rec["power"]["faults"]["split_dropped"]["detected"]  # measured on the schedule case, kept in the record
    # the fault only a split shows: invisible without the schedule case, caught with it
    assert run_engine_check(short, spec(splits_from=600, split_merge="drop_last"))["status"] == "verified"
    faulty = run_engine_check(short, spec(splits_from=600, split_from=600, split_merge="drop_last"))
    assert faulty["status"] == "failed" and faulty["message"].startswith("out:"), faulty
    assert max(faulty["case"]["seqlens"]) >= 600  # the failing run leads the record
    assert [v["status"] for v in faulty["variants"]] == ["failed", "verified"]


def test_schedule_case_lengths_and_seed():
    from pytest_mla.kernels.harness import CaseTooLarge, schedule_case

    short = case(1)
    long = schedule_case(short, 1024)
    assert long.seqlens == (1, 1024 + short.page_size + 3, short.page_size + 1, 2 * short.page_size)
    assert long.split_from == 1024 and max(schedule_case(case(2), 1024).seqlens) >= 2 * 1024  # per rank
    assert long.batch == 4 and long.seed != short.seed
    assert schedule_case(short, 1024) == long  # a pure function of the case
    verify = schedule_case(case(1, "eagle-1x3"), 1024)
    assert min(verify.seqlens) == verify.s_q  # a verify request holds at least its query tokens
    with pytest.raises(CaseTooLarge, match="at most"):
        schedule_case(short, 10**6)


def test_local_positions_under_dcp_and_spec_are_caught():
    assert run_engine_check(case(1, "eagle-1x3"), spec(positions="local"))["status"] == "verified"
    rec = run_engine_check(case(2, "eagle-1x3"), spec(positions="local"))
    assert rec["status"] == "failed", "masking by local positions must show under DCP + spec"


@pytest.mark.parametrize("dcp", [1, 2])
def test_exception_in_engine_code_is_a_finding_naming_the_function(dcp):
    with pytest.raises(BackendRaised) as info:
        run_engine_check(case(dcp), spec(raise_in="decode"))
    assert info.value.function == "tests.kernels.fake_engine:decode_rank"
    assert info.value.error == "ValueError" and "too many values" in info.value.text
    # the engine's frames, outermost first, each with its line: what a bug report quotes
    assert [f.split(" (line ")[0] for f in info.value.frames] == ["tests.kernels.fake_engine:run",
                                                                    "tests.kernels.fake_engine:decode_rank"]
    assert all(f.endswith(")") and f.split(" (line ")[1][:-1].isdigit() for f in info.value.frames)


@pytest.mark.parametrize("dcp_mode", ["in-process", "distributed"])
def test_a_raise_in_the_engines_cache_write_names_that_step_not_the_decode(dcp_mode):
    """The runner writes the cached tokens through the engine's own write path before the decode: a raise
    there is the engine's, and its record says it came from that step (issue 41: F44/F45 said decode)."""
    from pytest_mla.kernels.run import run_check

    with pytest.raises(BackendRaised) as info:
        run_engine_check(case(2), spec(raise_in="cache-write"), dcp_mode=dcp_mode, timeout_s=120)
    assert info.value.step == "cache write" and info.value.function == "tests.kernels.fake_engine:write_cache"
    record = run_check(case(2), spec(raise_in="cache-write"), where="interpreter", dcp_mode=dcp_mode, timeout_s=120)
    assert (record["finding"], record["step"], record["raised"]) == (True, "cache write", "IndexError")
    # a raise in the decode itself carries no step: the step under test
    decode = run_check(case(1), spec(raise_in="decode"), where="interpreter", dcp_mode="in-process", timeout_s=120)
    assert decode["finding"] and "step" not in decode


@pytest.mark.parametrize("dcp_mode", ["in-process", "distributed"])
def test_emulation_out_of_contract_is_not_run_never_a_finding(dcp_mode):
    """An emulated kernel asked for what it does not model: the cell is not-run with that one line (issue 21)."""
    from pytest_mla.kernels.engine_runner import EngineCannotRun

    with pytest.raises(EngineCannotRun, match="^emulated kernel out of contract: page_size: 16: the kernel supports "
                                              "pages of 64 tokens only$"):
        run_engine_check(case(2), spec(raise_in="emulation"), dcp_mode=dcp_mode, timeout_s=120)


@pytest.mark.parametrize("dcp_mode", ["in-process", "distributed"])
def test_a_call_into_an_import_stub_is_not_run_never_a_finding(dcp_mode):
    """The engine calls a function of a library this host lacks (vLLM's sm100 MLA prefill for GLM's dims calls
    FlashInfer's trtllm_ragged_attention_deepseek): not-run naming it, not the TypeError a placeholder object
    would have caused later in the engine's code."""
    from pytest_mla.kernels.engine_runner import EngineCannotRun

    with pytest.raises(EngineCannotRun, match=r"^flashinfer_stand_in\.trtllm_ragged_attention_deepseek is an import "
                                              r"stub \(pytest-mla\): the engine called a function"):
        run_engine_check(case(2), spec(raise_in="stub"), dcp_mode=dcp_mode, timeout_s=120)


@pytest.mark.parametrize("dcp_mode", ["in-process", "distributed"])
def test_out_of_range_index_the_engine_hands_an_emulation_is_its_finding(dcp_mode):
    with pytest.raises(BackendRaised) as info:
        run_engine_check(case(2), spec(raise_in="out-of-range"), dcp_mode=dcp_mode, timeout_s=120)
    assert info.value.error == "OutOfRangeRead" and info.value.function == "tests.kernels.fake_engine:decode_rank"


def test_exception_outside_the_engine_package_is_not_a_finding():
    bad = KernelSpec("fake", "tests.kernels.fake_engine:run", protocol="engine", level="backend",
                     package="not_this_package", options=(("raise_in", "decode"),))
    with pytest.raises(ValueError, match="too many values"):
        run_engine_check(case(1), bad)


def test_distributed_mode_gives_the_same_numbers():
    c = case(2, "eagle-1x3")
    here = run_engine_check(c, spec())
    there = run_engine_check(c, spec(), dcp_mode="distributed", timeout_s=120)
    assert there["status"] == "verified", there["message"]
    assert there["errors"]["out"]["max_abs_err"] == pytest.approx(here["errors"]["out"]["max_abs_err"], abs=1e-6)
    with pytest.raises(BackendRaised) as info:
        run_engine_check(c, spec(raise_in="decode"), dcp_mode="distributed", timeout_s=120)
    assert info.value.function == "tests.kernels.fake_engine:decode_rank"
    assert info.value.frames and info.value.frames[-1].startswith("tests.kernels.fake_engine:decode_rank (line ")


# ---- the in-process collectives ------------------------------------------------------------


def test_ranks_take_turns_and_meet_at_collectives():
    active, order = [], []
    lock = threading.Lock()

    def segment(rank):
        """Between collectives exactly one rank runs, in rank order."""
        with lock:
            active.append(rank)
            order.append(rank)
        threading.Event().wait(0.01)  # give another thread the chance to run, if it (wrongly) could
        with lock:
            assert active == [rank], f"two ranks ran at once: {active}"
            active.remove(rank)

    def body(c):
        segment(c.rank)
        got = [int(x) for x in c.all_gather(torch.tensor([c.rank * 10]))]
        segment(c.rank)
        total = c.all_reduce(torch.tensor([float(c.rank + 1)]))
        segment(c.rank)
        return got, float(total)

    results = run_ranks_in_process(body, 3)
    assert results == [([0, 10, 20], 6.0)] * 3
    assert order == [0, 1, 2] * 3


def test_rank_returning_early_is_reported_not_hung():
    def body(c):
        if c.rank == 1:
            return "early"
        return c.all_gather(torch.zeros(1))

    with pytest.raises(CollectiveError, match="rank 1 returned while other ranks wait"):
        run_ranks_in_process(body, 2, timeout_s=30)


def test_first_own_exception_wins():
    def body(c):
        if c.rank == 1:
            raise KeyError("boom on rank 1")
        c.barrier()

    with pytest.raises(KeyError, match="boom on rank 1"):
        run_ranks_in_process(body, 3, timeout_s=30)


def test_mismatched_collectives_are_reported():
    def body(c):
        if c.rank == 0:
            c.barrier()
        else:
            c.all_gather(torch.zeros(1))

    with pytest.raises(CollectiveError, match="called"):
        run_ranks_in_process(body, 2, timeout_s=30)


@pytest.mark.parametrize("dcp_mode", ["in-process", "distributed"])
def test_engine_reading_memory_it_never_wrote_fails_the_same_on_every_host(dcp_mode):
    """Memory an engine allocates uninitialised holds NaN while its check runs (``kernels.scratch``): a
    partial output it never wrote, combined with weight 0, is NaN on every host, not zeros on one and
    stale values on another."""
    rec = run_engine_check(case(2), spec(scratch="unwritten"), dcp_mode=dcp_mode)
    assert rec["status"] == "failed" and "NaN position(s) differ" in rec["message"], rec["message"]
    assert run_engine_check(case(2), spec(), dcp_mode=dcp_mode)["status"] == "verified"


def test_a_read_of_free_slots_that_only_nan_poisoning_shows_is_told_apart_as_hardening():
    """The engine reads its last page's free slots with probability 0: NaN there makes the output NaN, a zeroed
    cache (what SGLang and vLLM allocate) leaves it right. The check still fails (poisoned caches are how a
    missing mask is found) and says it is a hardening gap, not a wrong output on the engine's own cache."""
    from pytest_mla.kernels.engine_check import FREE_SLOT_NOTE
    from pytest_mla.kernels.inputs import free_slot_value

    rec = run_engine_check(case(1), spec(tail="unmasked"))
    assert rec["status"] == "failed" and rec["errors"]["out"]["nan_mismatch"] > 0
    assert rec["free_slot_only"] is True and FREE_SLOT_NOTE in rec["notes"]
    assert free_slot_value() != free_slot_value()  # NaN again after the rerun
    # NaN on the poisoned cache and wrong on a zeroed one too: a plain failure
    wrong = run_engine_check(case(1), spec(tail="weighted"))
    assert wrong["status"] == "failed" and wrong["errors"]["out"]["nan_mismatch"] > 0
    assert "free_slot_only" not in wrong and FREE_SLOT_NOTE not in (wrong.get("notes") or [])
    assert run_engine_check(case(1), spec())["status"] == "verified"
