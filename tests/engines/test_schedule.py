"""``engines.common.schedule.recorded_splits``: the split counts an engine hands its kernel, recorded in passing."""

from __future__ import annotations

import sys
import threading
import types

import torch

from pytest_mla.engines.common.schedule import SplitSchedule, recorded_splits


def kernel(q, num_kv_splits, scale=1.0):
    return q * scale


def test_records_int_and_tensor_counts_and_puts_the_call_back():
    module = types.ModuleType("fake_kernels_for_schedule")
    module.kernel = kernel
    sys.modules[module.__name__] = module
    try:
        schedule = SplitSchedule(f"{module.__name__}:kernel", "num_kv_splits")
        with recorded_splits(schedule) as seen:
            assert module.kernel is not kernel
            assert module.kernel(2.0, 4, scale=3.0) == 6.0  # calls through unchanged
            module.kernel(1.0, num_kv_splits=torch.tensor([1, 8, 8]))
        assert seen == [4, 1, 8]
        assert module.kernel is kernel
    finally:
        del sys.modules[module.__name__]


def test_an_owner_attribute_and_ranks_in_threads():
    """DCP ranks record at once in one process: every recorder sees the counts, the last one restores."""
    owner = types.SimpleNamespace(decode=kernel)
    schedule = SplitSchedule(":decode", "num_kv_splits")
    barrier, seen = threading.Barrier(2), {}

    def rank(r: int) -> None:
        with recorded_splits(schedule, owner=owner) as mine:
            barrier.wait()
            owner.decode(1.0, r + 2)
            barrier.wait()
        seen[r] = sorted(mine)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {0: [2, 3], 1: [2, 3]}
    assert owner.decode is kernel


def test_no_schedule_records_nothing():
    with recorded_splits(None) as seen:
        pass
    assert seen == []
